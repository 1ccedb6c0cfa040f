// The kernels of Grove's greedy pick (pick.cu): per row of logits x [B, n],
// argmax(x - logsumexp(x)), as mlx-lm's greedy sampler asks of MLX: its
// logsumexp kernel (a float32 max and a sum of __expf(x - max), log(sum) +
// max rounded to T), its Subtract in T and its ArgMax (the first index of
// the largest value; NaN never wins, and a row of -inf or NaN gives 0).
// MLX reads each row with one block per kernel (H200, Llama-1B's 128256
// logits: 14.5 + 5.5 + 17.5 us under ncu); here two kernels spread it over
// blocks of kChunk values:
//
//   1. lse_parts   each block's max and sum of __expf(x - max)
//   2. argmax_row  a programmatic dependent of 1: each block reads its
//                  values, waits for 1, merges the row's parts into
//                  c = logsumexp(x) (the same c in every block: the same
//                  order) and finds its first largest x - c; the row's last
//                  block to finish takes the first largest of them all
//
// The sum runs in another order than MLX's one block, so c can differ from
// MLX's in its last float bits and, rounded to T, rarely by one unit.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "decode_common.cuh"

namespace grove_pick {

constexpr int kThreads = 256;
constexpr int kPer = 16;                 // values a thread reads
constexpr int kChunk = kThreads * kPer;  // values a block reads

using grove_fd::Num;

// A running max and the sum of __expf(x - max) under it.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}
__device__ __forceinline__ MaxSum shfl_xor(MaxSum v, int off) {
  return {__shfl_xor_sync(0xffffffffu, v.m, off), __shfl_xor_sync(0xffffffffu, v.s, off)};
}

// The best value so far and its index: larger wins, then the lower index.
struct Best {
  float v;
  uint32_t i;
};
__device__ __forceinline__ Best better(Best a, Best b) {
  return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}
__device__ __forceinline__ Best shfl_xor(Best v, int off) {
  return {__shfl_xor_sync(0xffffffffu, v.v, off), __shfl_xor_sync(0xffffffffu, v.i, off)};
}

// Reduces one value per thread of a kThreads block with `op` (`none`: its
// identity), in a fixed order; thread 0 gets the result.
template <class V, class Op>
__device__ __forceinline__ V block_reduce(V v, V none, Op op) {
  __shared__ V warps[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = op(v, shfl_xor(v, off));
  if (lane == 0) warps[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? warps[lane] : none;
#pragma unroll
    for (int off = (kThreads / 32) / 2; off > 0; off >>= 1) v = op(v, shfl_xor(v, off));
  }
  return v;
}

// 1. parts[b, blockIdx.x]: the max of the block's values (-FLT_MAX where it
//    has none, as MLX starts) and the sum of __expf(x - max).
template <class T>
__global__ void __launch_bounds__(kThreads) lse_parts(const T* x, int n, MaxSum* parts) {
  grove_fd::release_next();  // argmax_row's blocks may read x meanwhile
  const int b = blockIdx.y;
  const T* row = x + static_cast<int64_t>(b) * n;
  const int base = blockIdx.x * kChunk + threadIdx.x;
  float v[kPer];
  float m = -FLT_MAX;
#pragma unroll
  for (int j = 0; j < kPer; j++) {
    const int i = base + j * kThreads;
    v[j] = i < n ? Num<T>::to(row[i]) : -INFINITY;
    m = fmaxf(m, v[j]);
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kPer; j++) s += __expf(v[j] - m);
  const MaxSum r = block_reduce(MaxSum{m, s}, MaxSum{-FLT_MAX, 0.f}, [](MaxSum a, MaxSum c) { return merge(a, c); });
  if (threadIdx.x == 0) parts[b * gridDim.x + blockIdx.x] = r;
}

// 2. out[b]: the row's first largest x - c, in T. best[b, block] holds each
//    block's; arrived[b] counts the row's blocks done (0 between picks: the
//    last block resets it).
template <class T>
__global__ void __launch_bounds__(kThreads) argmax_row(const T* x, int n, const MaxSum* parts, Best* best,
                                                        int* arrived, uint32_t* out) {
  const int b = blockIdx.y, nparts = gridDim.x;
  const T* row = x + static_cast<int64_t>(b) * n;
  const int base = blockIdx.x * kChunk + threadIdx.x;
  // x is complete before lse_parts starts (the kernel before it on the
  // stream), so it is read before the wait.
  T v[kPer];
#pragma unroll
  for (int j = 0; j < kPer; j++) {
    const int i = base + j * kThreads;
    v[j] = i < n ? row[i] : T{};
  }
  grove_fd::wait_prior();
  __shared__ T c;
  if (threadIdx.x < 32) {
    MaxSum r{-FLT_MAX, 0.f};
    for (int p = threadIdx.x; p < nparts; p += 32) r = merge(r, parts[b * nparts + p]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) r = merge(r, shfl_xor(r, off));
    if (threadIdx.x == 0) c = Num<T>::from(isinf(r.m) ? r.m : logf(r.s) + r.m);
  }
  __syncthreads();
  const T lse = c;
  Best mine{-INFINITY, 0};
#pragma unroll
  for (int j = 0; j < kPer; j++) {
    const int i = base + j * kThreads;
    if (i < n) {
      const float d = Num<T>::to(static_cast<T>(v[j] - lse));
      if (d > mine.v) mine = {d, static_cast<uint32_t>(i)};
    }
  }
  const Best none{-INFINITY, 0};
  const Best r = block_reduce(mine, none, [](Best a, Best o) { return better(a, o); });
  if (threadIdx.x == 0) best[b * nparts + blockIdx.x] = r;
  if (!grove_fd::last_to_arrive(arrived + b, nparts)) return;
  if (threadIdx.x < 32) {
    Best all = none;
    for (int p = threadIdx.x; p < nparts; p += 32) {
      const Best* q = best + b * nparts + p;
      all = better(all, Best{__ldcg(&q->v), __ldcg(&q->i)});
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) all = better(all, shfl_xor(all, off));
    if (threadIdx.x == 0) {
      out[b] = all.i;
      arrived[b] = 0;
    }
  }
}

}  // namespace grove_pick
