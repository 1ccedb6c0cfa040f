// The kernels of Grove's CUDA decode step (decode.cu): one step of a
// pre-norm decoder (Llama, Mistral, Qwen3) for B rows, in five kernels per
// layer instead of MLX's ~20 operations.
//
//   1. gemv<NORM, STORE>   RMS norm of h fused into the q/k/v products
//   2. attend              q/k norms, RoPE, the KV write and attention
//   3. gemv<RESIDUAL>      o projection added into h
//   4. gemv<NORM, GLU>     RMS norm fused into gate/up and SiLU(gate) * up
//   5. gemv<RESIDUAL>      down projection added into h
//
// Batches of dense weights run the products on tensor cores instead
// (decode_pipe.cuh's gemm_pipe, pipelined through shared memory, or
// decode_mma.cuh's gemm_tc), each norm first in its own kernel (norm_rows);
// batches of grouped-query models share each key among a group's heads in
// attention (decode_attend_gqa.cuh). Layers of routed experts (Qwen3-MoE)
// replace 4 and 5 with decode_moe.cuh's router, picks, experts'
// products and their weighted sum.
//
// Every value MLX's step rounds to the model's dtype (each op's output) is
// rounded here at the same place; sums run in float32 as in MLX's kernels,
// in another order. The products take dense weights in T or MLX's affine 4-
// and 8-bit ones (Q).
#pragma once
#include "decode_common.cuh"
#include "decode_gemv.cuh"

namespace grove_fd {

// The step's changing inputs into device memory (first, in stream order).
__global__ void set_params(const StepParams p, StepParams* dst) {
  const int* src = reinterpret_cast<const int*>(&p);
  int* out = reinterpret_cast<int*>(dst);
  for (int i = threadIdx.x; i < static_cast<int>(sizeof(StepParams) / 4); i += blockDim.x) out[i] = src[i];
}

// ---- 2. Attention of the new token ---------------------------------------------

struct AttnArgs {
  const void* qkv;       // [B, (heads + 2 kv_heads) * D] in T
  int64_t qkv_stride;
  const void* q_norm;    // per-head RMS norm weights [D], or null (Qwen3)
  const void* k_norm;
  float qk_eps;
  const float* freqs;    // RoPE frequencies [D / 2], or null: base
  float log2_base;
  float rope_scale;      // positions are multiplied by it
  const StepParams* sp;  // caches, capacity, idx, left padding
  int layer;
  int heads, kv_heads;
  float scale;
  float* part;           // [B, heads, kSplits, D + 2]: each split's o, m, l
  int* arrived;          // [B, heads] splits done (zero between steps)
  void* out;             // [B, heads * D] in T
  int64_t out_stride;
};

// What preparing one head needs that no kernel of the step writes, read
// before the step's wait: the lane's norm weights and RoPE angles.
template <class T, int D>
struct HeadPrep {
  static constexpr int PER = D / 32, HALF = D / 2, HP = (HALF + 31) / 32;
  float nw[PER];
  float c[HP], s[HP];
  bool norm;
  __device__ void init(const T* w, const AttnArgs& a, int pos, int lane) {
    norm = w != nullptr;
#pragma unroll
    for (int e = 0; e < PER; e++) nw[e] = norm ? Num<T>::to(w[lane + 32 * e]) : 0.f;
    // RoPE over pairs (i, i + D/2), as MLX's rope kernel computes them.
    const float L = a.rope_scale * static_cast<float>(pos);
#pragma unroll
    for (int e = 0; e < HP; e++) {
      const int i = lane + 32 * e;
      c[e] = 1.f;
      s[e] = 0.f;
      if (i < HALF) {
        const float inv_freq =
            a.freqs != nullptr
                ? static_cast<float>(1.0 / static_cast<double>(a.freqs[i]))
                : exp2f(-(static_cast<float>(i) / static_cast<float>(HALF)) * a.log2_base);
        const float theta = L * inv_freq;
        c[e] = cosf(theta);
        s[e] = sinf(theta);
      }
    }
  }
};

// Normalises (optionally) and rotates one head of D values at `src` into
// `dst` (shared, values rounded to T), with one warp.
template <class T, int D>
__device__ void prepare_head(const T* src, const HeadPrep<T, D>& hp, float eps, float* dst, int lane) {
  constexpr int PER = D / 32, HALF = D / 2, HP = HeadPrep<T, D>::HP;
  float v[PER];
#pragma unroll
  for (int e = 0; e < PER; e++) v[e] = Num<T>::to(src[lane + 32 * e]);
  if (hp.norm) {
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < PER; e++) ss += v[e] * v[e];
    const float inv = rsqrtf(warp_sum(ss) / D + eps);
#pragma unroll
    for (int e = 0; e < PER; e++) v[e] = rt<T>(hp.nw[e] * rt<T>(v[e] * inv));
  }
#pragma unroll
  for (int e = 0; e < PER; e++) dst[lane + 32 * e] = v[e];
  __syncwarp();
  float r1[HP], r2[HP];
#pragma unroll
  for (int e = 0; e < HP; e++) {
    const int i = lane + 32 * e;
    if (i < HALF) {
      const float x1 = dst[i], x2 = dst[i + HALF];
      r1[e] = rt<T>(x1 * hp.c[e] - x2 * hp.s[e]);
      r2[e] = rt<T>(x1 * hp.s[e] + x2 * hp.c[e]);
    }
  }
  __syncwarp();
#pragma unroll
  for (int e = 0; e < HP; e++) {
    const int i = lane + 32 * e;
    if (i < HALF) {
      dst[i] = r1[e];
      dst[i + HALF] = r2[e];
    }
  }
}

// One key into a lane group's online softmax (scores in base 2, q in qv
// scaled by scale * log2(e)): the lane's 16 values of the key and the value
// (k0 k1 v0 v1 in kv) where the key is in the cache, the new token's (kn,
// vn: this lane's part) where it is not, nothing past the range (!live).
template <class T, int LPK>
__device__ __forceinline__ void score_key(const uint4 (&kv)[4], bool cached, bool live, const float* kn,
                                          const float* vn, const float (&qv)[16], float& m, float& l,
                                          float (&o)[16]) {
  float kf[16], vf[16];
  if (live && cached) {
    unpack8<T>(kv[0], kf);
    unpack8<T>(kv[1], kf + 8);
    unpack8<T>(kv[2], vf);
    unpack8<T>(kv[3], vf + 8);
  } else {
#pragma unroll
    for (int i = 0; i < 16; i++) {
      kf[i] = live ? kn[i] : 0.f;
      vf[i] = live ? vn[i] : 0.f;
    }
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 16; i++) s = fmaf(qv[i], kf[i], s);
#pragma unroll
  for (int off = LPK / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (live) {
    const float nm = fmaxf(m, s);
    const float f = exp2f(m - nm), p = exp2f(s - nm);
    l = l * f + p;
#pragma unroll
    for (int i = 0; i < 16; i++) o[i] = fmaf(o[i], f, p * vf[i]);
    m = nm;
  }
}

// What one attention block of row b and KV head kvh works on: the step's
// new slot idx, the token's position, its keys [lo, hi) (range `split` of
// `splits` over [first, idx], first past the row's left padding), the row's
// q/k/v and the KV head's caches.
template <class T, int D>
struct AttnBlock {
  int idx, pos, lo, hi;
  const T* row;
  T* kc;
  T* vc;
  __device__ AttnBlock(const AttnArgs& a, int b, int kvh, int split, int splits) {
    const StepParams& sp = *a.sp;
    idx = sp.idx;
    const int left = sp.left[b], first = max(left, 0);
    pos = idx - left;
    const int n = idx + 1 - first, chunk = (n + splits - 1) / splits;
    lo = first + split * chunk;
    hi = min(lo + chunk, idx + 1);
    row = static_cast<const T*>(a.qkv) + b * a.qkv_stride;
    const int64_t off = (static_cast<int64_t>(b) * a.kv_heads + kvh) * sp.cap * D;
    kc = static_cast<T*>(sp.kc[a.layer]) + off;
    vc = static_cast<T*>(sp.vc[a.layer]) + off;
  }
};

// One block per (query head, row, key range): flash-decoding's split of the
// keys, so that short and long caches alike keep every SM busy. Warp 0
// prepares q, warp 1 the new key, warp 2 the new value; the first block of
// each group writes them into slot idx. Then every warp scores its range's
// keys: G = 32 / (D / 16) keys at a time, D / 16 lanes per key (16 values
// each); an online softmax per lane group, merged in the block, then the
// last block of a head to finish merges the splits.
// (Measured and not kept, tests/bench/README.md at stop 49: the splits
// merged in a thread block cluster, 16 splits, and releasing the o product
// before the scores.)
template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32) attend(const AttnArgs a) {
  constexpr int LPK = D / 16;        // lanes per key
  constexpr int G = 32 / LPK;        // keys per warp at a time
  const int h = blockIdx.x, b = blockIdx.y, split = blockIdx.z, splits = gridDim.z;  // splits <= kSplits
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = a.heads / a.kv_heads, kvh = h / group;
  const AttnBlock<T, D> blk(a, b, kvh, split, splits);
  const int idx = blk.idx, pos = blk.pos, lo = blk.lo, hi = blk.hi;
  __shared__ float q[D], kn[D], vn[D];
  __shared__ float gm[kWarps], gl[kWarps];
  __shared__ float go[kWarps][D + 1];
  const T* row = blk.row;
  T* kc = blk.kc;
  T* vc = blk.vc;
  const bool writer = h % group == 0 && split == 0;
  // 0. Before the wait, what does not depend on q/k/v: this warp's first
  //    two rounds of keys and values from the cache (each round of the key
  //    loop below then asks for the one two ahead while it scores this
  //    one), and the RoPE angles and norm weights of the heads it prepares.
  const int sub = lane / LPK, part = lane % LPK;
  constexpr int STEP = kWarps * G;  // keys a block scores per round
  uint4 b0[4] = {}, b1[4] = {};
  auto fetch = [&](int t0, uint4 (&into)[4]) {
    const int t = t0 + sub;
    if (t < hi && t < idx) {
      const uint4* kp = reinterpret_cast<const uint4*>(kc + static_cast<int64_t>(t) * D + part * 16);
      const uint4* vp = reinterpret_cast<const uint4*>(vc + static_cast<int64_t>(t) * D + part * 16);
      into[0] = kp[0];
      into[1] = kp[1];
      into[2] = vp[0];
      into[3] = vp[1];
    }
  };
  const int t_first = lo + warp * G;
  fetch(t_first, b0);
  fetch(t_first + STEP, b1);
  HeadPrep<T, D> hp;
  if (warp < 2) hp.init(static_cast<const T*>(warp == 0 ? a.q_norm : a.k_norm), a, pos, lane);
  wait_prior();  // qkv is the last kernel's output
  // 1. q, the new key and value.
  if (warp == 0) {
    prepare_head<T, D>(row + h * D, hp, a.qk_eps, q, lane);
  } else if (warp == 1) {
    prepare_head<T, D>(row + (a.heads + kvh) * D, hp, a.qk_eps, kn, lane);
    __syncwarp();
    if (writer)
      for (int j = lane; j < D; j += 32) kc[static_cast<int64_t>(idx) * D + j] = Num<T>::from(kn[j]);
  } else if (warp == 2) {
    const T* v = row + (a.heads + a.kv_heads + kvh) * D;
    for (int j = lane; j < D; j += 32) {
      vn[j] = Num<T>::to(v[j]);
      if (writer) vc[static_cast<int64_t>(idx) * D + j] = v[j];
    }
  }
  __syncthreads();
  // 2. Scores in base 2 (q scaled by scale * log2(e)), an online softmax.
  const float qs = a.scale * 1.4426950408889634f;
  float qv[16], o[16];
#pragma unroll
  for (int i = 0; i < 16; i++) {
    qv[i] = qs * q[part * 16 + i];
    o[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  auto score = [&](int t0, const uint4 (&buf)[4]) {
    const int t = t0 + sub;
    score_key<T, LPK>(buf, t < idx, t < hi, kn + part * 16, vn + part * 16, qv, m, l, o);
  };
  // (Two rounds per turn, so that each buffer stays in registers.)
  for (int t0 = t_first; t0 < hi; t0 += 2 * STEP) {
    score(t0, b0);
    fetch(t0 + 2 * STEP, b0);
    if (t0 + STEP < hi) {
      score(t0 + STEP, b1);
      fetch(t0 + 3 * STEP, b1);
    }
  }
  // The o product may start now (not earlier: with many rows this grid
  // takes several waves, and its blocks would hold SMs the later waves need).
  release_next();
  // 3. Merge the lane groups' partial softmaxes into this split's (o, m, l):
  //    first the warp's groups, pairwise by shuffles (a group without keys
  //    has l = 0 and weighs nothing), then the block's warps, one partial a
  //    warp in shared memory.
#pragma unroll
  for (int off = LPK; off < 32; off <<= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off), l2 = __shfl_xor_sync(0xffffffffu, l, off);
    const float mm = fmaxf(m, m2);
    const float f1 = l > 0.f ? exp2f(m - mm) : 0.f, f2 = l2 > 0.f ? exp2f(m2 - mm) : 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++) o[i] = o[i] * f1 + __shfl_xor_sync(0xffffffffu, o[i], off) * f2;
    l = l * f1 + l2 * f2;
    m = mm;
  }
  if (lane == 0) {
    gm[warp] = m;
    gl[warp] = l;
  }
  if (sub == 0) {
#pragma unroll
    for (int i = 0; i < 16; i++) go[warp][part * 16 + i] = o[i];
  }
  __syncthreads();
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; w++)
    if (gl[w] > 0.f) M = fmaxf(M, gm[w]);
  // Each warp's weight exp2(m - M), once (0 for a warp without keys).
  __shared__ float gw[kWarps];
  if (threadIdx.x < kWarps) gw[threadIdx.x] = gl[threadIdx.x] > 0.f ? exp2f(gm[threadIdx.x] - M) : 0.f;
  __syncthreads();
  float* mine = a.part + ((static_cast<int64_t>(b) * a.heads + h) * kSplits + split) * (D + 2);
  for (int j = threadIdx.x; j < D + 2; j += blockDim.x) {
    float v = 0.f;
    if (j < D) {
#pragma unroll
      for (int w = 0; w < kWarps; w++)
        if (gl[w] > 0.f) v += go[w][j] * gw[w];
    } else if (j == D) {
      v = M;
    } else {
#pragma unroll
      for (int w = 0; w < kWarps; w++)
        if (gl[w] > 0.f) v += gl[w] * gw[w];
    }
    mine[j] = v;
  }
  // 4. The last split of this (row, head) to finish merges them all.
  int* arrived = a.arrived + b * a.heads + h;
  if (!last_to_arrive(arrived, splits)) return;
  const float* all = a.part + (static_cast<int64_t>(b) * a.heads + h) * kSplits * (D + 2);
  T* out = static_cast<T*>(a.out) + b * a.out_stride + h * D;
  __shared__ float fin[kSplits][D + 2];
  for (int i = threadIdx.x; i < splits * (D + 2); i += blockDim.x) (&fin[0][0])[i] = __ldcg(all + i);
  __syncthreads();
  float MM = -INFINITY;
#pragma unroll
  for (int s2 = 0; s2 < kSplits; s2++)
    if (s2 < splits && fin[s2][D + 1] > 0.f) MM = fmaxf(MM, fin[s2][D]);
  float L = 0.f, f[kSplits];
#pragma unroll
  for (int s2 = 0; s2 < kSplits; s2++) {
    f[s2] = s2 < splits && fin[s2][D + 1] > 0.f ? exp2f(fin[s2][D] - MM) : 0.f;
    if (s2 < splits) L += fin[s2][D + 1] * f[s2];
  }
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    float acc = 0.f;
#pragma unroll
    for (int s2 = 0; s2 < kSplits; s2++)
      if (s2 < splits) acc += fin[s2][j] * f[s2];
    out[j] = Num<T>::from(acc / L);
  }
  if (threadIdx.x == 0) *arrived = 0;
}

// ---- 3. Embedding rows ---------------------------------------------------------

// h[b] = table[token[b]] (a token past the table reads row 0).
template <class T>
__global__ void embed(const StepParams* sp, const T* table, int vocab, int hidden, T* h) {
  const int b = blockIdx.x;
  release_next();
  wait_prior();
  uint32_t t = sp->tokens[b];
  if (t >= static_cast<uint32_t>(vocab)) t = 0;
  const uint4* src = reinterpret_cast<const uint4*>(table + static_cast<int64_t>(t) * hidden);
  uint4* dst = reinterpret_cast<uint4*>(h + static_cast<int64_t>(b) * hidden);
  for (int i = threadIdx.x; i < hidden / 8; i += blockDim.x) dst[i] = src[i];
}

// The same from a Q-bit table: MLX's dequantize, q * scale + bias in T
// (each operation rounded to T).
template <class T, int Q>
__global__ void embed_q(const StepParams* sp, const uint32_t* table, const T* scales, const T* biases,
                        int vocab, int hidden, int gs, T* h) {
  constexpr int PER_WORD = 32 / Q;
  const int b = blockIdx.x;
  release_next();
  wait_prior();
  uint32_t t = sp->tokens[b];
  if (t >= static_cast<uint32_t>(vocab)) t = 0;
  const uint32_t* src = table + static_cast<int64_t>(t) * (hidden / PER_WORD);
  const T* s = scales + static_cast<int64_t>(t) * (hidden / gs);
  const T* z = biases + static_cast<int64_t>(t) * (hidden / gs);
  T* dst = h + static_cast<int64_t>(b) * hidden;
  for (int i = threadIdx.x; i < hidden / PER_WORD; i += blockDim.x) {
    const uint32_t word = src[i];
    const int g = i * PER_WORD / gs;
    const float sc = Num<T>::to(s[g]), bi = Num<T>::to(z[g]);
#pragma unroll
    for (int e = 0; e < PER_WORD; e++) {
      const float q = static_cast<float>((word >> (e * Q)) & ((1u << Q) - 1u));
      dst[i * PER_WORD + e] = Num<T>::from(rt<T>(q * sc) + bi);
    }
  }
}

}  // namespace grove_fd
