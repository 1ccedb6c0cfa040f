// The matrix-vector products' arguments and parts (decode_gemv.cuh's
// kernel, decode_mma.cuh's and decode_moe.cuh's products share them): the
// launch's GemvArgs, the stores, x's spans as integers for dp4a and the
// layout of the products' shared memory.
#pragma once
#include "decode_common.cuh"
#include "dp4a.h"  // dp4a_us, dp4a_uu

namespace grove_fd {

// ---- 1. Matrix-vector products ------------------------------------------------

enum Mode { kStore = 0, kResidual = 1, kGlu = 2 };

struct GemvArgs {
  const void* x;         // [B, K] in T, rows x_stride apart
  int64_t x_stride;
  const void* norm;      // RMS norm weight [K] (NORM kernels)
  float eps;
  const void* w[3];      // row-major [rows, K] matrices, stacked (kStore,
  int seg[2];            // kResidual: rows < seg[0] in w[0], < seg[1] in
                         // w[1], else w[2]); kGlu: w[0] gate, w[1] up
  const void* scales[3]; // quantized (Q > 0): per matrix [rows, K / gs] in
  const void* biases[3]; // T, MLX's affine layout (w: uint32 words of
  int gs, gs_log2;       // 32 / Q values, lowest bits first; gs = 2^gs_log2)
  int n, k;              // output columns, reduction length
  void* out;             // [B, n] in T, rows out_stride apart
  void* const* out_ref;  // else: where the step's params hold `out`
  int64_t out_stride;
  int rows;              // B of this launch (<= the template's B)
  float* part;           // gemm_tc split over K: [blocks, splits, tile values]
  int* arrived;          // and per block column, the splits done (zero between)
  // Routed experts (gemv<..., EXP>, decode_moe.cuh): blockIdx.y is a
  // (row, pick) pair p of the launch; its n output columns (out + p * n)
  // are rows of expert experts[p] of each w, stacked [experts, n, K]
  // (scales and biases alike), times row p / x_div of x.
  const int* experts;
  int x_div;
};

// Which matrix of a stacked kStore / kResidual product holds output column
// c (rows < seg[0] in w[0], < seg[1] in w[1], else w[2]); c becomes its row
// there.
__device__ __forceinline__ int stacked(const GemvArgs& a, int& c) {
  if (c < a.seg[0]) return 0;
  if (c < a.seg[1]) {
    c -= a.seg[0];
    return 1;
  }
  c -= a.seg[1];
  return 2;
}

// A product's value for output o, stored as MODE says: kStore as it is,
// kResidual added into o (rounded to T first, as MLX's add of two T
// arrays), kGlu MLX's silu(gate) * up (v the gate's sum, up the up's):
// gate * sigmoid(gate), then * up, each in T.
template <class T, int MODE>
__device__ __forceinline__ void store_out(T* o, float v, float up = 0.f) {
  if constexpr (MODE == kStore) {
    *o = Num<T>::from(v);
  } else if constexpr (MODE == kResidual) {
    *o = Num<T>::from(Num<T>::to(*o) + rt<T>(v));
  } else {
    const float gate = rt<T>(v), u = rt<T>(up);
    *o = Num<T>::from(rt<T>(gate * sigmoid_t<T>(gate)) * u);
  }
}

template <class T>
__device__ __forceinline__ uint4 pack8(const float v[8]) {
  uint4 out;
  T* p = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int i = 0; i < 8; i++) p[i] = Num<T>::from(v[i]);
  return out;
}

// MLX's rms_norm of one 16-byte vector x of a row (w: the norm's weights
// there, inv: the row's 1 / rms): w * T(x * inv), each product rounded to
// T, into out (the caller stores it in T).
template <class T>
__device__ __forceinline__ void rms_norm8(const uint4 x, const uint4 w, float inv, float out[8]) {
  float g[8];
  unpack8<T>(x, out);
  unpack8<T>(w, g);
#pragma unroll
  for (int j = 0; j < 8; j++) out[j] = g[j] * rt<T>(out[j] * inv);
}

// A span of x (the values one lane's 16-byte load of Q-bit weights meets)
// as 16-bit integers v = round(x / s), s = max |x| / 32767, each split into
// a signed high byte and an unsigned low byte (v = 256 hi + lo), laid out
// as the weights' words are read: for Q = 4, per word of 8 values, the
// high bytes of values 0 2 4 6, of 1 3 5 7, then the low bytes of the same
// (a word's nibbles masked with 0x0f0f0f0f, then shifted by 4, line up with
// them); for Q = 8, per word of 4 values, the high bytes, then the low.
// The rounding is 2^-16 of the span's largest |x|, far below x's own bf16
// rounding; sum(x q) then costs one dp4a per 4 weights and byte half.
template <int Q>
__device__ __forceinline__ uint32_t byte4(const int v[8], int first, int step, bool high) {
  uint32_t out = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int x = v[first + i * step];
    const uint32_t byte = high ? static_cast<uint32_t>(x >> 8) & 0xffu : static_cast<uint32_t>(x) & 0xffu;
    out |= byte << (8 * i);
  }
  return out;
}
template <int Q>
__device__ __forceinline__ uint4 split8(const int v[8]) {
  if constexpr (Q == 4) {
    return make_uint4(byte4<Q>(v, 0, 2, true), byte4<Q>(v, 1, 2, true), byte4<Q>(v, 0, 2, false),
                      byte4<Q>(v, 1, 2, false));
  } else {
    return make_uint4(byte4<Q>(v, 0, 1, true), byte4<Q>(v, 0, 1, false), byte4<Q>(v, 4, 1, true),
                      byte4<Q>(v, 4, 1, false));
  }
}

// One 16-byte vector's part of its span's sum and largest |x| (t, m), the
// XV lanes of a span (adjacent) then adding theirs in pairs and taking their
// largest (every lane of the warp takes the shuffles), and the vector stored
// at `at` as split8's integers of the span's scale, with the span's sum and
// scale where the vector is its span's first (c: the vector's index in the
// row; sums and scales: the row's).
__device__ __forceinline__ void span_stats(const float v[8], float& t, float& m) {
#pragma unroll
  for (int e = 0; e < 8; e++) {
    t += v[e];
    m = fmaxf(m, fabsf(v[e]));
  }
}
template <int XV>
__device__ __forceinline__ void span_reduce(float& t, float& m) {
#pragma unroll
  for (int d = 1; d < XV; d *= 2) {
    t += __shfl_xor_sync(0xffffffffu, t, d);
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
  }
}
template <int Q, int XV>
__device__ __forceinline__ void split_store(const float v[8], float t, float m, uint4* at, float* sums, float* scales,
                                            int c) {
  const float to_int = m > 0.f ? 32767.f / m : 0.f;
  int q[8];
#pragma unroll
  for (int e = 0; e < 8; e++) q[e] = max(-32767, min(32767, __float2int_rn(v[e] * to_int)));
  *at = split8<Q>(q);
  if (c % XV == 0) {
    sums[c / XV] = t;
    scales[c / XV] = m / 32767.f;
  }
}

// A lane's 16-byte load of weights in T (Q = 0) or Q bits: the values it
// holds, and the 16-byte vectors of x they meet.
template <int Q>
struct Span {
  static constexpr int kVals = Q == 0 ? 8 : 128 / Q;  // values per 16-byte load
  static constexpr int kXVecs = Q == 0 ? 1 : kVals / 8;  // x's 16-byte vectors
};

// Where x's 16-byte vector i of a row sits in shared memory: for Q, the
// vectors of a lane's span rotated by the lane's position, so that the 8
// lanes of a shared-memory phase read 8 different bank groups.
template <int XV>
__device__ __forceinline__ int swz(int i) {
  if constexpr (XV == 1) {
    return i;
  } else {
    const int c = i / XV, j = i % XV;
    return c * XV + (j + c / (8 / XV)) % XV;
  }
}

// swz<XV>(c * XV + j), x's vector j (< XV) of span c, in unsigned
// arithmetic: gemv takes each lane's offsets from it once (its xo; signed
// division at every load had cost a dozen instructions an address, and
// this one at every load about a tenth of the product). (swz itself,
// signed, is left to the once-a-block staging: written through this one,
// the same values, it changed every quantized kernel's code; with a
// reordering of gemv's walk that changed them too, Llama-8B 4-bit lost
// 1.1% on an H200, 540.3-541.1 against 545.8-547.0 tok/s.)
template <int XV>
__device__ __forceinline__ unsigned swz_span(unsigned c, int j) {
  if constexpr (XV == 1) {
    return c;
  } else {
    return c * XV + (j + c / (8 / XV)) % XV;
  }
}

// Vectors of x a thread keeps in registers from its load to its split or
// normalized store (gemv, one row of quantized weights or of dense ones with
// a norm: K up to 4 * 8 * 512 values).
constexpr int kFuseVecs = 4;

__host__ __device__ constexpr size_t gemv_smem(int q, int rows, int k, int t_bytes) {
  return static_cast<size_t>(rows) * k * t_bytes + (q == 0 ? 0 : static_cast<size_t>(rows) * (k / (128 / q)) * 8);
}
// Past gemv_smem (16-byte aligned), NORM kernels keep the norm's weights
// [k] in T, copied in before the wait: read after it, they would add a
// round trip to memory (they leave L2 as the step streams its weights) to
// every block's start.
__host__ __device__ constexpr size_t gemv_norm_at(int q, int rows, int k, int t_bytes) {
  return (gemv_smem(q, rows, k, t_bytes) + 15) / 16 * 16;
}
// A warp's 16-byte loads of each of its nr rows in flight in a pass
// (eight in all), and in a half of one (gemv's HV = 1 and 2 walk K by
// halves: the launch takes them where K tiles by them).
__host__ __device__ constexpr int gemv_pass_loads(int nr) { return 8 / nr > 1 ? 8 / nr : 1; }
__host__ __device__ constexpr int gemv_half_loads(int nr) {
  return gemv_pass_loads(nr) / 2 > 1 ? gemv_pass_loads(nr) / 2 : 1;
}
// Dense products streamed through shared memory (gemv's HV = 2): past x
// (and the norm's weights), each warp's ring of kGemvStages stages, a stage
// hs 16-byte loads of each of its nr rows (512 bytes a load of the warp).
constexpr int kGemvStages = 4;
__host__ __device__ constexpr int gemv_stage_bytes(int nr, int hs) { return nr * hs * 512; }
__host__ __device__ constexpr size_t gemv_ring_at(bool norm, int rows, int k, int t_bytes) {
  return gemv_norm_at(0, rows, k, t_bytes) + (norm ? static_cast<size_t>(k) * t_bytes : 0);
}

// Where a warp is in its stream of column groups (gemv's HV = 1 and 2):
// col0, its group's first column, and kk, the group's loads of a row
// already taken. step() takes `per` more of the `loads` a group has, true
// where that ends the group; next_group() then moves `cols` columns on.
struct Walk {
  int col0, kk;
  __device__ __forceinline__ bool step(int per, int loads) {
    kk += per;
    return kk == loads;
  }
  __device__ __forceinline__ void next_group(int cols) {
    kk = 0;
    col0 += cols;
  }
};

}  // namespace grove_fd
