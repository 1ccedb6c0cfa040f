// Attention of the new token for grouped-query models (GQ query heads per
// KV head, GQ = 2 or 4): decode_kernels.cuh's `attend` with one block per
// (KV head, row, key range) instead of per query head, so that each key and
// value is read from memory once for the GQ heads that share it rather than
// once per head (at 32 rows of Llama-8B, 4x the bytes through L2).
//
// The block copies its range's keys and values into shared memory in stages
// of kGqaKeys (cp.async, the next stage in flight while this one is scored;
// the first two asked for before the wait for q/k/v, as they are earlier
// slots of the cache). Warps 0..GQ-1 prepare the heads' q, warp GQ the new
// key (the first block of the group writes it), warp GQ + 1 the new value.
// Then kWarps / GQ warps per head score the stage's keys as `attend` does
// (D / 16 lanes a key, an online softmax per lane group), the lane groups
// of a head are merged in the block, and the last block of a (row, KV head)
// to finish merges its splits for all GQ heads. Same float32 sums as
// `attend`, in another order.
#pragma once
#include "decode_kernels.cuh"
#include "decode_pipe.cuh"

namespace grove_fd {

constexpr int kGqaSplits = 16;  // key ranges per (row, KV head) at most
constexpr int kGqaKeys = 32;    // keys per stage
constexpr int kGqaStages = 2;

// Dynamic shared memory: the stages, reused for the merges after them.
__host__ __device__ constexpr size_t gqa_smem(int d, int gq, int t_bytes) {
  const size_t stages = static_cast<size_t>(kGqaStages) * 2 * kGqaKeys * d * t_bytes;
  const size_t groups = static_cast<size_t>(kWarps / gq) * (32 / (d / 16));  // lane groups a head
  const size_t merge = gq * groups * (d + 1) * 4, fin = static_cast<size_t>(gq) * kGqaSplits * (d + 2) * 4;
  return stages > merge ? (stages > fin ? stages : fin) : (merge > fin ? merge : fin);
}

template <class T, int D, int GQ>
__global__ void __launch_bounds__(kWarps * 32) attend_gqa(const AttnArgs a) {
  static_assert(GQ == 2 || GQ == 4, "GQ query heads per KV head: 2 or 4");
  constexpr int LPK = D / 16;       // lanes per key
  constexpr int G = 32 / LPK;       // keys per warp at a time
  constexpr int WPH = kWarps / GQ;  // warps per head
  constexpr int LG = WPH * G;       // lane groups per head
  constexpr int KPW = kGqaKeys / WPH;  // a warp's keys of a stage
  constexpr int kStageBytes = 2 * kGqaKeys * D * sizeof(T);
  static_assert(KPW % G == 0, "a warp's keys come in rounds of G");
  extern __shared__ __align__(128) unsigned char smem[];
  const int kvh = blockIdx.x, b = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const AttnBlock<T, D> blk(a, b, kvh, split, splits);
  const int idx = blk.idx, pos = blk.pos, lo = blk.lo, hi = blk.hi;
  const int nst = hi > lo ? (hi - lo + kGqaKeys - 1) / kGqaKeys : 0;
  __shared__ float q[GQ][D], kn[D], vn[D];
  __shared__ float gm[GQ][LG], gl[GQ][LG], gw[GQ][LG];
  const T* row = blk.row;
  T* kc = blk.kc;
  T* vc = blk.vc;
  const bool writer = split == 0;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // One stage: keys [t0, t0 + kGqaKeys) of the cache (those before idx and
  // hi; the others zero, not read) into slot `slot`, keys then values.
  auto load = [&](int slot, int t0) {
    constexpr int kChunks = kGqaKeys * D / 8;  // 16-byte pieces of keys (and of values)
    for (int c = threadIdx.x; c < 2 * kChunks; c += blockDim.x) {
      const bool is_v = c >= kChunks;
      const int cc = is_v ? c - kChunks : c, t = t0 + cc / (D / 8);
      const bool live = t < hi && t < idx;
      const T* src = (is_v ? vc : kc) + static_cast<int64_t>(live ? t : 0) * D + (cc % (D / 8)) * 8;
      cp16(base + slot * kStageBytes + c * 16, src, live ? 16 : 0);
    }
  };
  // 0. Before the wait: the first stages, the RoPE angles and norm weights.
#pragma unroll
  for (int s = 0; s < kGqaStages - 1; s++) {
    if (s < nst) load(s, lo + s * kGqaKeys);
    cp_commit();
  }
  HeadPrep<T, D> hp;
  if (warp <= GQ) hp.init(static_cast<const T*>(warp < GQ ? a.q_norm : a.k_norm), a, pos, lane);
  wait_prior();  // qkv is the last kernel's output
  // 1. The GQ heads' q, the new key and value.
  if (warp < GQ) {
    prepare_head<T, D>(row + (kvh * GQ + warp) * D, hp, a.qk_eps, q[warp], lane);
  } else if (warp == GQ) {
    prepare_head<T, D>(row + (a.heads + kvh) * D, hp, a.qk_eps, kn, lane);
    __syncwarp();
    if (writer)
      for (int j = lane; j < D; j += 32) kc[static_cast<int64_t>(idx) * D + j] = Num<T>::from(kn[j]);
  } else if (warp == GQ + 1) {
    const T* v = row + (a.heads + a.kv_heads + kvh) * D;
    for (int j = lane; j < D; j += 32) {
      vn[j] = Num<T>::to(v[j]);
      if (writer) vc[static_cast<int64_t>(idx) * D + j] = v[j];
    }
  }
  __syncthreads();
  // 2. This warp's head and keys; scores in base 2, an online softmax.
  const int hq = warp / WPH, pw = warp % WPH;
  const int sub = lane / LPK, part = lane % LPK;
  const float qs = a.scale * 1.4426950408889634f;
  float qv[16], o[16];
#pragma unroll
  for (int i = 0; i < 16; i++) {
    qv[i] = qs * q[hq][part * 16 + i];
    o[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int i = 0; i < nst; i++) {
    cp_wait<kGqaStages - 2>();
    __syncthreads();
    const int ahead = i + kGqaStages - 1;
    if (ahead < nst) load(ahead % kGqaStages, lo + ahead * kGqaKeys);
    cp_commit();
    const T* ks = reinterpret_cast<const T*>(smem + (i % kGqaStages) * kStageBytes);
    const T* vs = ks + kGqaKeys * D;
#pragma unroll
    for (int r = 0; r < KPW / G; r++) {
      const int kk = pw * KPW + r * G + sub, t = lo + i * kGqaKeys + kk;
      uint4 kv[4] = {};
      if (t < hi && t < idx) {
        const uint4* kp = reinterpret_cast<const uint4*>(ks + kk * D + part * 16);
        const uint4* vp = reinterpret_cast<const uint4*>(vs + kk * D + part * 16);
        kv[0] = kp[0];
        kv[1] = kp[1];
        kv[2] = vp[0];
        kv[3] = vp[1];
      }
      score_key<T, LPK>(kv, t < idx, t < hi, kn + part * 16, vn + part * 16, qv, m, l, o);
    }
  }
  cp_wait<0>();
  release_next();
  // 3. Per head, its lane groups' partial softmaxes into this split's (o, m,
  //    l), in the stage memory (every warp is done with it).
  __syncthreads();
  float* go = reinterpret_cast<float*>(smem);  // [GQ][LG][D + 1]
  const int gi = pw * G + sub;
  if (part == 0) {
    gm[hq][gi] = m;
    gl[hq][gi] = l;
  }
#pragma unroll
  for (int e = 0; e < 16; e++) go[(hq * LG + gi) * (D + 1) + part * 16 + e] = o[e];
  __syncthreads();
  if (threadIdx.x < GQ * LG) {
    const int h2 = threadIdx.x / LG;
    float M = -INFINITY;
#pragma unroll
    for (int g = 0; g < LG; g++)
      if (gl[h2][g] > 0.f) M = fmaxf(M, gm[h2][g]);
    const int g = threadIdx.x % LG;
    gw[h2][g] = gl[h2][g] > 0.f ? exp2f(gm[h2][g] - M) : 0.f;
  }
  __syncthreads();
  for (int j = threadIdx.x; j < GQ * (D + 2); j += blockDim.x) {
    const int h2 = j / (D + 2), jj = j % (D + 2);
    float v = 0.f;
    if (jj < D) {
#pragma unroll 8
      for (int g = 0; g < LG; g++)
        if (gl[h2][g] > 0.f) v += go[(h2 * LG + g) * (D + 1) + jj] * gw[h2][g];
    } else if (jj == D) {
      v = -INFINITY;
      for (int g = 0; g < LG; g++)
        if (gl[h2][g] > 0.f) v = fmaxf(v, gm[h2][g]);
    } else {
      for (int g = 0; g < LG; g++)
        if (gl[h2][g] > 0.f) v += gl[h2][g] * gw[h2][g];
    }
    a.part[((static_cast<int64_t>(b) * a.heads + kvh * GQ + h2) * kGqaSplits + split) * (D + 2) + jj] = v;
  }
  // 4. The last split of this (row, KV head) to finish merges them all.
  int* arrived = a.arrived + b * a.heads + kvh;
  if (!last_to_arrive(arrived, splits)) return;
  float* fin = reinterpret_cast<float*>(smem);  // [GQ][kGqaSplits][D + 2]
  for (int i = threadIdx.x; i < GQ * splits * (D + 2); i += blockDim.x) {
    const int h2 = i / (splits * (D + 2)), r = i % (splits * (D + 2));
    fin[h2 * kGqaSplits * (D + 2) + r] =
        __ldcg(a.part + (static_cast<int64_t>(b) * a.heads + kvh * GQ + h2) * kGqaSplits * (D + 2) + r);
  }
  __syncthreads();
  for (int j = threadIdx.x; j < GQ * D; j += blockDim.x) {
    const int h2 = j / D, jj = j % D;
    const float* f0 = fin + h2 * kGqaSplits * (D + 2);
    float MM = -INFINITY;
    for (int s2 = 0; s2 < splits; s2++)
      if (f0[s2 * (D + 2) + D + 1] > 0.f) MM = fmaxf(MM, f0[s2 * (D + 2) + D]);
    float L = 0.f, acc = 0.f;
    for (int s2 = 0; s2 < splits; s2++) {
      const float* fs = f0 + s2 * (D + 2);
      const float w = fs[D + 1] > 0.f ? exp2f(fs[D] - MM) : 0.f;
      L += fs[D + 1] * w;
      acc += fs[jj] * w;
    }
    T* out = static_cast<T*>(a.out) + b * a.out_stride + (kvh * GQ + h2) * D;
    out[jj] = Num<T>::from(acc / L);
  }
  if (threadIdx.x == 0) *arrived = 0;
}

}  // namespace grove_fd
