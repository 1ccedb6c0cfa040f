// Grove's CPU kernel for `x @ dequant(W)^T` over MLX's affine 4- and 8-bit
// layout, written once with GCC/Clang vector extensions and compiled once per
// instruction set (qmm_avx512.cpp, qmm_avx2.cpp, qmm_base.cpp: SSE2 on x86,
// NEON on arm64), each in its own namespace `GROVE_QMM_NS`.
//
// Layout (MLX's): W is N rows of K values, packed little-endian, value j of a
// row at bits [bits*j, bits*(j+1)) of the row's bytes; scales and biases are
// N x K/gs (converted to float32 by the caller); w = scale * q + bias.
//
// Two paths, both computing every product as (scale*q + bias) * x in float32,
// as MLX's kernel does (only the order of the sums differs):
// - rows of x < 4 (decode): each output row's weights are dequantized in
//   registers and used for every row of x at once; the matrix is read once.
// - more rows (prefill, batches): a block of weight rows is dequantized into a
//   float buffer (in cache) and multiplied by register tiles of 3 rows of x
//   by 4 rows of W, so dequantizing costs once per block, not once per row of x.
//
// Nothing here may instantiate an inline function shared with other builds
// (std::vector and the like): the linker keeps one copy of such a function,
// possibly built for an instruction set this CPU lacks. Helpers are static and
// the caller passes the scratch buffer.
#include <cstdint>
#include <cstring>

#include "qmm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#ifndef GROVE_QMM_NS
#error "define GROVE_QMM_NS before including qmm_kernel.h"
#endif
#ifndef GROVE_VL
#define GROVE_VL 8
#endif

namespace grove_qmm {
namespace GROVE_QMM_NS {

constexpr int VL = GROVE_VL;  // floats per vector
typedef float vf __attribute__((vector_size(VL * 4)));
typedef uint8_t vb __attribute__((vector_size(VL)));
typedef uint8_t vh __attribute__((vector_size(VL / 2)));

static inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

static inline vf splat(float s) {
  return vf{} + s;
}

static inline float hsum(vf v) {
  float s = 0.0f;
  for (int i = 0; i < VL; i++) s += v[i];
  return s;
}

// VL weights starting at value `k` of a packed row (k a multiple of VL).
// The x86 builds unpack with intrinsics: GCC turns the generic conversion
// below into one scalar conversion per value.
template <int BITS>
static inline vf weights(const uint8_t* row, int k) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && GROVE_VL == 16
  if constexpr (BITS == 8) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
  } else {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k / 2));
    const __m128i m = _mm_set1_epi8(15);
    const __m128i v = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
  }
#elif defined(__AVX2__) && GROVE_VL == 8
  if constexpr (BITS == 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
  } else {
    uint32_t word;
    std::memcpy(&word, row + k / 2, 4);
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i v = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shifts), _mm256_set1_epi32(15));
    return _mm256_cvtepi32_ps(v);
  }
#else
  if constexpr (BITS == 8) {
    vb b;
    std::memcpy(&b, row + k, sizeof(b));
    return __builtin_convertvector(b, vf);
  } else {
    vh b;
    std::memcpy(&b, row + k / 2, sizeof(b));
    vh lo = b & 15;
    vh hi = b >> 4;
#if GROVE_VL == 8
    vb v = __builtin_shufflevector(lo, hi, 0, 4, 1, 5, 2, 6, 3, 7);
#elif GROVE_VL == 16
    vb v = __builtin_shufflevector(
        lo, hi, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
#else
#error "GROVE_VL must be 8 or 16"
#endif
    return __builtin_convertvector(v, vf);
  }
#endif
}

// Decode: out[m, n] for MR rows of x and the rows [n0, n1) of W.
template <int BITS, int MR>
static void matvec(const Args& a, int m0, int n0, int n1) {
  const int K = a.K, gs = a.group_size, groups = K / gs;
  const int row_bytes = K * BITS / 8;
  const float* x[MR];
  for (int r = 0; r < MR; r++) x[r] = a.x + (int64_t)(m0 + r) * K;
  for (int n = n0; n < n1; n++) {
    const uint8_t* w = a.w + (int64_t)n * row_bytes;
    const float* s = a.scales + (int64_t)n * groups;
    const float* b = a.biases + (int64_t)n * groups;
    // U independent sums per row of x (one per vector of a 32-value chunk),
    // so the adds do not wait on each other's latency.
    constexpr int U = 32 / VL;
    vf acc[MR][U];
    for (int r = 0; r < MR; r++)
      for (int u = 0; u < U; u++) acc[r][u] = vf{};
    for (int g = 0; g < groups; g++) {
      const vf sv = splat(s[g]), bv = splat(b[g]);
      for (int k = g * gs; k < (g + 1) * gs; k += 32) {
        for (int u = 0; u < U; u++) {
          const vf wv = weights<BITS>(w, k + u * VL) * sv + bv;
          for (int r = 0; r < MR; r++) acc[r][u] += wv * load(x[r] + k + u * VL);
        }
      }
    }
    for (int r = 0; r < MR; r++) {
      vf t = acc[r][0];
      for (int u = 1; u < U; u++) t += acc[r][u];
      a.out[(int64_t)(m0 + r) * a.N + n] = hsum(t);
    }
  }
}

// Rows [n0, n0+rows) of W, values [k0, k0+kb), dequantized into buf (rows x kb).
template <int BITS>
static void dequant_block(const Args& a, int n0, int rows, int k0, int kb, float* buf) {
  const int groups = a.K / a.group_size;
  const int row_bytes = a.K * BITS / 8;
  for (int i = 0; i < rows; i++) {
    const int n = n0 + i;
    const uint8_t* w = a.w + (int64_t)n * row_bytes;
    const float* s = a.scales + (int64_t)n * groups;
    const float* b = a.biases + (int64_t)n * groups;
    float* dst = buf + (int64_t)i * kb;
    for (int k = k0; k < k0 + kb; k += VL) {
      const int g = k / a.group_size;
      const vf v = weights<BITS>(w, k) * splat(s[g]) + splat(b[g]);
      std::memcpy(dst + (k - k0), &v, sizeof(v));
    }
  }
}

// out[m0.., n0..] (+)= x[m0..m0+MR, k0..k0+kb] . buf[j, 0..kb] for NR rows j.
template <int MR, int NR>
static inline void tile(const Args& a, const float* buf, int kb, int m0, int j0,
                        int n0, int k0, bool first) {
  vf acc[MR][NR];
  for (int r = 0; r < MR; r++)
    for (int c = 0; c < NR; c++) acc[r][c] = vf{};
  const float* x[MR];
  for (int r = 0; r < MR; r++) x[r] = a.x + (int64_t)(m0 + r) * a.K + k0;
  const float* w[NR];
  for (int c = 0; c < NR; c++) w[c] = buf + (int64_t)(j0 + c) * kb;
  for (int k = 0; k < kb; k += VL) {
    vf wv[NR];
    for (int c = 0; c < NR; c++) wv[c] = load(w[c] + k);
    for (int r = 0; r < MR; r++) {
      const vf xv = load(x[r] + k);
      for (int c = 0; c < NR; c++) acc[r][c] += xv * wv[c];
    }
  }
  for (int r = 0; r < MR; r++) {
    float* o = a.out + (int64_t)(m0 + r) * a.N + n0 + j0;
    for (int c = 0; c < NR; c++) {
      const float v = hsum(acc[r][c]);
      o[c] = first ? v : o[c] + v;
    }
  }
}

template <int MR>
static inline void tiles_across(const Args& a, const float* buf, int kb, int m0,
                                int n0, int rows, int k0, bool first) {
  int j = 0;
  for (; j + 4 <= rows; j += 4) tile<MR, 4>(a, buf, kb, m0, j, n0, k0, first);
  for (; j < rows; j++) tile<MR, 1>(a, buf, kb, m0, j, n0, k0, first);
}

template <int BITS>
static void matmul(const Args& a, int n0, int n1, float* scratch) {
  const int kb_max = block_k(a);
  for (int nb = n0; nb < n1; nb += BLOCK_ROWS) {
    const int rows = n1 - nb < BLOCK_ROWS ? n1 - nb : BLOCK_ROWS;
    for (int k0 = 0; k0 < a.K; k0 += kb_max) {
      const int kb = a.K - k0 < kb_max ? a.K - k0 : kb_max;
      dequant_block<BITS>(a, nb, rows, k0, kb, scratch);
      int m = 0;
      for (; m + 3 <= a.M; m += 3)
        tiles_across<3>(a, scratch, kb, m, nb, rows, k0, k0 == 0);
      for (; m < a.M; m++)
        tiles_across<1>(a, scratch, kb, m, nb, rows, k0, k0 == 0);
    }
  }
}

template <int BITS>
static void run_bits(const Args& a, int n0, int n1, float* scratch) {
  if (a.M >= 4) {
    matmul<BITS>(a, n0, n1, scratch);
    return;
  }
  switch (a.M) {
    case 1: matvec<BITS, 1>(a, 0, n0, n1); break;
    case 2: matvec<BITS, 2>(a, 0, n0, n1); break;
    default: matvec<BITS, 3>(a, 0, n0, n1); break;
  }
}

void rows(const Args& a, int n0, int n1, float* scratch) {
  if (a.bits == 8) {
    run_bits<8>(a, n0, n1, scratch);
  } else {
    run_bits<4>(a, n0, n1, scratch);
  }
}

}  // namespace GROVE_QMM_NS
}  // namespace grove_qmm
