// The matrix-vector products of Grove's CUDA decode step
// (decode_kernels.cuh lists the step's kernels): x [B, K] (normalized first
// for NORM) times a dense matrix in T or one in MLX's affine 4/8-bit layout,
// stored, added into the residual, or as SiLU(gate) * up.
#pragma once
#include "decode_common.cuh"

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
  int stages;            // gemv_bulk: pieces in flight per warp (<= kMaxStages)
  int pre;               // and of those, asked for before the step's wait
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

// Integer dot products of four byte pairs added to c (PTX dp4a): a's bytes
// unsigned, b's signed (us) or unsigned (uu).
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ int dp4a_uu(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
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

// Each warp computes R output columns (kGlu: R of gate and R of up) for all
// B rows, reading each weight once with 16-byte loads, eight in flight. The
// block first puts the rows of x (normalized, for NORM: the values MLX's
// rms_norm outputs, exact in T) into shared memory: `rows * k` values of T,
// then, for Q-bit weights (Q = 4 or 8; 0: dense T), turns each lane load's
// span of x into split8's integers in place and keeps the span's sum and
// scale: the launch's dynamic shared memory (gemv_smem).
//
// A quantized column's dot product is the sum over spans of
// scale * sum(x q) + bias * sum(x) in float32, sum(x q) summed exactly in
// integers (dp4a) and multiplied by the span's s (MLX's quantized_matmul on
// these rows gives the same values up to the order of its float sums and
// x's 2^-16 rounding).
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

__host__ __device__ constexpr size_t gemv_smem(int q, int rows, int k, int t_bytes) {
  return static_cast<size_t>(rows) * k * t_bytes + (q == 0 ? 0 : static_cast<size_t>(rows) * (k / (128 / q)) * 8);
}

// x in shared memory as the products read it (the launch's dynamic shared
// memory, gemv_smem): rows of k / 8 16-byte vectors, then for Q each span's
// sum and scale.
struct XView {
  uint4* xs;
  float* xsum;
  float* xscale;
  int k8, kv, rows;
  template <int Q>
  __device__ static XView at(uint4* smem, const GemvArgs& a) {
    XView v;
    v.xs = smem;
    v.k8 = a.k / 8;
    v.kv = a.k / Span<Q>::kVals;
    v.rows = a.rows;
    v.xsum = reinterpret_cast<float*>(smem + a.rows * v.k8);
    v.xscale = v.xsum + a.rows * v.kv;
    return v;
  }
};

// Where a warp's NR rows (kGlu: R of gate, R of up) of the columns from col0
// start (past the end: the last column, not stored): weights, and for Q
// their scales and biases.
template <class T, int R, int NR, int MODE, int Q>
struct Rows {
  const char* w[NR];
  const T* s[NR];
  const T* b[NR];
  __device__ __forceinline__ Rows(const GemvArgs& a, int col0) {
    const int64_t row_bytes = static_cast<int64_t>(a.k) * (Q == 0 ? 8 * sizeof(T) : Q) / 8;
    const int groups = Q == 0 ? 0 : a.k / a.gs;
#pragma unroll
    for (int r = 0; r < NR; r++) {
      int c = min(col0 + (r % R), a.n - 1);
      int m;
      if constexpr (MODE == kGlu) {
        m = r / R;
      } else {
        m = stacked(a, c);
      }
      w[r] = static_cast<const char*>(a.w[m]) + c * row_bytes;
      if constexpr (Q != 0) {
        s[r] = static_cast<const T*>(a.scales[m]) + static_cast<int64_t>(c) * groups;
        b[r] = static_cast<const T*>(a.biases[m]) + static_cast<int64_t>(c) * groups;
      }
    }
  }
};

// 1. x into shared memory (all threads of the block, after the step's
//    wait); for NORM each row's 1 / rms over all K, then the normalized
//    values in place (the values MLX's rms_norm outputs, exact in T); for Q
//    each span turned into split8's integers in place, with its sum and
//    scale.
template <class T, int B, bool NORM, int Q>
__device__ __forceinline__ void stage_x(const GemvArgs& a, const XView& xv) {
  constexpr int XV = Span<Q>::kXVecs;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const T* x = static_cast<const T*>(a.x);
  uint4* xs = xv.xs;
  const int k8 = xv.k8, kv = xv.kv;
  for (int i = threadIdx.x; i < a.rows * k8; i += blockDim.x) {
    const int b = i / k8, c = i - b * k8;
    xs[b * k8 + swz<XV>(c)] = *reinterpret_cast<const uint4*>(x + b * a.x_stride + c * 8);
  }
  __syncthreads();
  if constexpr (NORM) {
    __shared__ float part[kGemvWarps][B];
    __shared__ float inv[B];
    float ss[B];
#pragma unroll
    for (int b = 0; b < B; b++) ss[b] = 0.f;
#pragma unroll
    for (int b = 0; b < B; b++) {
      if (b < a.rows) {
        for (int c = threadIdx.x; c < k8; c += blockDim.x) {
          float v[8];
          unpack8<T>(xs[b * k8 + c], v);
#pragma unroll
          for (int i = 0; i < 8; i++) ss[b] += v[i] * v[i];
        }
      }
    }
#pragma unroll
    for (int b = 0; b < B; b++) {
      float t = warp_sum(ss[b]);
      if (lane == 0) part[warp][b] = t;
    }
    __syncthreads();
    if (threadIdx.x < B) {
      float t = 0.f;
#pragma unroll
      for (int w = 0; w < kGemvWarps; w++) t += part[w][threadIdx.x];
      inv[threadIdx.x] = rsqrtf(t / a.k + a.eps);
    }
    __syncthreads();
    const T* nw = static_cast<const T*>(a.norm);
    for (int i = threadIdx.x; i < a.rows * k8; i += blockDim.x) {
      const int b = i / k8, c = i - b * k8;
      float v[8], g[8];
      uint4& slot = xs[b * k8 + swz<XV>(c)];
      unpack8<T>(slot, v);
      unpack8<T>(*reinterpret_cast<const uint4*>(nw + c * 8), g);
      // MLX's rms_norm: w * T(x * inv), each product rounded to T.
#pragma unroll
      for (int j = 0; j < 8; j++) v[j] = g[j] * rt<T>(v[j] * inv[b]);
      slot = pack8<T>(v);
    }
    __syncthreads();
  }
  if constexpr (Q != 0) {
    // Each span's sum and scale, and the span in place as split8's integers
    // (as many bytes as its values in T).
    for (int i = threadIdx.x; i < a.rows * kv; i += blockDim.x) {
      const int b = i / kv, c = i - b * kv;
      float v[XV][8];
      float t = 0.f, m = 0.f;
#pragma unroll
      for (int j = 0; j < XV; j++) {
        unpack8<T>(xs[b * k8 + swz<XV>(c * XV + j)], v[j]);
#pragma unroll
        for (int e = 0; e < 8; e++) {
          t += v[j][e];
          m = fmaxf(m, fabsf(v[j][e]));
        }
      }
      const float inv = m > 0.f ? 32767.f / m : 0.f;
#pragma unroll
      for (int j = 0; j < XV; j++) {
        int q[8];
#pragma unroll
        for (int e = 0; e < 8; e++) q[e] = max(-32767, min(32767, __float2int_rn(v[j][e] * inv)));
        xs[b * k8 + swz<XV>(c * XV + j)] = split8<Q>(q);
      }
      xv.xsum[i] = t;
      xv.xscale[i] = m / 32767.f;
    }
    __syncthreads();
  }
}

// One 16-byte load of each of a warp's NR rows, at value k (and, for Q, its
// group's scale and bias), into the sums of every row of x.
template <class T, int B, int NR, int Q>
__device__ __forceinline__ void consume(float (&acc)[NR][B], const uint4 (&wv)[NR], const T (&sv)[NR],
                                        const T (&bv)[NR], int k, const XView& x) {
  constexpr int V = Span<Q>::kVals, XV = Span<Q>::kXVecs;
  const int k8 = x.k8, kv = x.kv;
  if constexpr (Q == 0) {
    float wf[NR][8];
#pragma unroll
    for (int r = 0; r < NR; r++) unpack8<T>(wv[r], wf[r]);
#pragma unroll
    for (int b = 0; b < B; b++) {
      if (b < x.rows) {
        float v[8];
        unpack8<T>(x.xs[b * k8 + k / 8], v);
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
          for (int i = 0; i < 8; i++) acc[r][b] = fmaf(wf[r][i], v[i], acc[r][b]);
      }
    }
  } else {
#pragma unroll
    for (int b = 0; b < B; b++) {
      if (b < x.rows) {
        const float xt = x.xsum[b * kv + k / V], xs_scale = x.xscale[b * kv + k / V];
        int hi[NR], lo[NR];
#pragma unroll
        for (int r = 0; r < NR; r++) hi[r] = lo[r] = 0;
#pragma unroll
        for (int j = 0; j < XV; j++) {
          const uint4 xq = x.xs[b * k8 + swz<XV>(k / 8 + j)];
#pragma unroll
          for (int r = 0; r < NR; r++) {
            const uint32_t words[4] = {wv[r].x, wv[r].y, wv[r].z, wv[r].w};
            if constexpr (Q == 4) {
              const uint32_t even = words[j] & 0x0f0f0f0fu, odd = (words[j] >> 4) & 0x0f0f0f0fu;
              hi[r] = dp4a_us(even, xq.x, hi[r]);
              hi[r] = dp4a_us(odd, xq.y, hi[r]);
              lo[r] = dp4a_uu(even, xq.z, lo[r]);
              lo[r] = dp4a_uu(odd, xq.w, lo[r]);
            } else {
              hi[r] = dp4a_us(words[2 * j], xq.x, hi[r]);
              lo[r] = dp4a_uu(words[2 * j], xq.y, lo[r]);
              hi[r] = dp4a_us(words[2 * j + 1], xq.z, hi[r]);
              lo[r] = dp4a_uu(words[2 * j + 1], xq.w, lo[r]);
            }
          }
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
          const float p = static_cast<float>(hi[r] * 256 + lo[r]) * xs_scale;
          acc[r][b] = fmaf(Num<T>::to(sv[r]), p, fmaf(Num<T>::to(bv[r]), xt, acc[r][b]));
        }
      }
    }
  }
}

// 4. A warp's sums over its lanes, stored as MODE says (lane 0) for its R
//    columns from col0.
template <class T, int B, int R, int NR, int MODE>
__device__ __forceinline__ void finish(float (&acc)[NR][B], const GemvArgs& a, int col0, int lane) {
#pragma unroll
  for (int r = 0; r < NR; r++)
#pragma unroll
    for (int b = 0; b < B; b++) acc[r][b] = warp_sum(acc[r][b]);
  if (lane != 0) return;
  T* out = static_cast<T*>(a.out_ref != nullptr ? *a.out_ref : a.out);
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int c = col0 + r;
    if (c >= a.n) break;
#pragma unroll
    for (int b = 0; b < B; b++) {
      if (b >= a.rows) break;
      store_out<T, MODE>(out + b * a.out_stride + c, acc[r][b], MODE == kGlu ? acc[(R + r) % NR][b] : 0.f);
    }
  }
}

template <class T, int B, int R, int MODE, bool NORM, int Q>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv(const GemvArgs a) {
  constexpr int NR = MODE == kGlu ? 2 * R : R;
  constexpr int V = Span<Q>::kVals;
  extern __shared__ __align__(128) unsigned char smem[];
  const XView x = XView::at<Q>(reinterpret_cast<uint4*>(smem), a);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // One 16-byte load of each of a warp's rows at value ku (for Q, with its
  // group's scale and bias).
  auto load_at = [&](const Rows<T, R, NR, MODE, Q>& w, int ku, uint4 (&wv)[NR], T (&sv)[NR], T (&bv)[NR]) {
#pragma unroll
    for (int r = 0; r < NR; r++) {
      wv[r] = load_stream(w.w[r] + static_cast<int64_t>(ku) * (Q == 0 ? 8 * sizeof(T) : Q) / 8);
      if constexpr (Q != 0) {
        sv[r] = w.s[r][ku >> a.gs_log2];
        bv[r] = w.b[r][ku >> a.gs_log2];
      }
    }
  };
  // 0. This warp's first loads of its first columns, asked for before x is
  //    staged: they do not depend on it.
  constexpr int P = 8 / NR > 1 ? 8 / NR : 1;
  const int first = (blockIdx.x * kGemvWarps + warp) * R;
  uint4 pw[P][NR];
  T ps[P][NR], pb[P][NR];
  if (first < a.n) {
    const Rows<T, R, NR, MODE, Q> w(a, first);
#pragma unroll
    for (int u = 0; u < P; u++) {
      const int ku = lane * V + u * 32 * V;
      if (ku < a.k) load_at(w, ku, pw[u], ps[u], pb[u]);
    }
  }
  // The next kernel may start as this one's blocks leave; x is the last
  // kernel's output.
  release_next();
  wait_prior();
  stage_x<T, B, NORM, Q>(a, x);
  // 2. Each group of columns this block takes (a block stages x once for
  //    all of them).
  auto column = [&]<bool PRE>(int col0) {
    const Rows<T, R, NR, MODE, Q> w(a, col0);
    float acc[NR][B];
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
      for (int b = 0; b < B; b++) acc[r][b] = 0.f;
    // 3. Eight (then four, then one) 16-byte loads of every row in flight:
    //    enough bytes in flight per SM to keep HBM busy.
    int k = lane * V;
    auto pass = [&]<int U>() {
      for (; k + (U - 1) * 32 * V < a.k; k += U * 32 * V) {
        uint4 wv[U][NR];
        T sv[U][NR], bv[U][NR];
#pragma unroll
        for (int u = 0; u < U; u++) load_at(w, k + u * 32 * V, wv[u], sv[u], bv[u]);
#pragma unroll
        for (int u = 0; u < U; u++) consume<T, B, NR, Q>(acc, wv[u], sv[u], bv[u], k + u * 32 * V, x);
      }
    };
    // The first columns' first loads, asked for in step 0.
    if constexpr (PRE) {
#pragma unroll
      for (int u = 0; u < P; u++)
        if (k + u * 32 * V < a.k) consume<T, B, NR, Q>(acc, pw[u], ps[u], pb[u], k + u * 32 * V, x);
      k += P * 32 * V;
    }
    // (Eight loads in flight in all: fewer per row where a warp reads
    // several rows, as many registers.)
    pass.template operator()<(8 / NR > 1 ? 8 / NR : 1)>();
    if constexpr (NR < 4) pass.template operator()<(4 / NR > 1 ? 4 / NR : 1)>();
    pass.template operator()<1>();
    finish<T, B, R, NR, MODE>(acc, a, col0, lane);
  };
  // (The first column apart, so that its first loads' registers are free
  // for the others.)
  if (first < a.n) column.template operator()<true>(first);
  for (int col0 = first + gridDim.x * kGemvWarps * R; col0 < a.n; col0 += gridDim.x * kGemvWarps * R)
    column.template operator()<false>(col0);
}

}  // namespace grove_fd
