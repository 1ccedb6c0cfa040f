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
// - rows of x < 4 (decode): 4 rows of W at a time are dequantized in
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

// The sum of a vector's lanes by halving (log2(VL) adds, not VL in a chain).
static inline float hsum(vf v) {
#if GROVE_VL == 16
  typedef float v8 __attribute__((vector_size(32)));
  const v8 h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  const vf h = v;
#endif
  typedef float v4 __attribute__((vector_size(16)));
  const v4 q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
  const v4 p = q + __builtin_shufflevector(q, q, 2, 3, 0, 1);
  return p[0] + p[1];
}

// IEEE half to float, in software (the baseline build; x86 builds use F16C).
static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while (!(man & 0x400)) {
      man <<= 1;
      exp--;
    }
    bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

// Element i of a scales or biases array, as float.
static inline float scale_at(const void* p, int64_t i, int type) {
  if (type == F32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  if (type == F16) return half_to_float(h);
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
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

// Decode: out[m0..m0+MR, n..n+NR): NR rows of W at once share each load of
// x and give NR*MR independent sums.
template <int BITS, int MR, int NR>
static inline void matvec_rows(const Args& a, int m0, int n) {
  const int K = a.K, gs = a.group_size, groups = K / gs;
  const int row_bytes = K * BITS / 8;
  const float* x[MR];
  for (int r = 0; r < MR; r++) x[r] = a.x + (int64_t)(m0 + r) * K;
  const uint8_t* w[NR];
  for (int c = 0; c < NR; c++) w[c] = a.w + (int64_t)(n + c) * row_bytes;
  vf acc[MR][NR];
  for (int r = 0; r < MR; r++)
    for (int c = 0; c < NR; c++) acc[r][c] = vf{};
  for (int g = 0; g < groups; g++) {
    vf sv[NR], bv[NR];
    for (int c = 0; c < NR; c++) {
      const int64_t i = (int64_t)(n + c) * groups + g;
      sv[c] = splat(scale_at(a.scales, i, a.scale_type));
      bv[c] = splat(scale_at(a.biases, i, a.scale_type));
    }
    for (int k = g * gs; k < (g + 1) * gs; k += VL) {
      vf xv[MR];
      for (int r = 0; r < MR; r++) xv[r] = load(x[r] + k);
      for (int c = 0; c < NR; c++) {
        const vf wv = weights<BITS>(w[c], k) * sv[c] + bv[c];
        for (int r = 0; r < MR; r++) acc[r][c] += wv * xv[r];
      }
    }
  }
  for (int r = 0; r < MR; r++)
    for (int c = 0; c < NR; c++) a.out[(int64_t)(m0 + r) * a.N + n + c] = hsum(acc[r][c]);
}

template <int BITS, int MR>
static void matvec(const Args& a, int m0, int n0, int n1) {
  int n = n0;
  for (; n + 4 <= n1; n += 4) matvec_rows<BITS, MR, 4>(a, m0, n);
  for (; n < n1; n++) matvec_rows<BITS, MR, 1>(a, m0, n);
}

// Rows [n0, n0+rows) of W, values [k0, k0+kb), dequantized into buf (rows x kb).
template <int BITS>
static void dequant_block(const Args& a, int n0, int rows, int k0, int kb, float* buf) {
  const int groups = a.K / a.group_size;
  const int row_bytes = a.K * BITS / 8;
  for (int i = 0; i < rows; i++) {
    const int n = n0 + i;
    const uint8_t* w = a.w + (int64_t)n * row_bytes;
    const int64_t g0 = (int64_t)n * groups;
    float* dst = buf + (int64_t)i * kb;
    for (int k = k0; k < k0 + kb; k += VL) {
      const int g = k / a.group_size;
      const vf v = weights<BITS>(w, k) * splat(scale_at(a.scales, g0 + g, a.scale_type)) +
                   splat(scale_at(a.biases, g0 + g, a.scale_type));
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
