// The routed experts of Grove's CUDA decode step (decode.cu), for B rows
// of a Qwen3-MoE layer, as mlx-lm's Qwen3MoeSparseMoeBlock computes it:
//
//   4a. gemv<NORM, STORE>         router logits of norm(h)       (T)
//   4b. route                     softmax, the top k, their scores
//   4c. gemv<NORM, GLU, experts>  SiLU(gate) * up of each picked expert
//   4d. gemv<STORE, experts>      each picked expert's down projection (T)
//   4e. combine                   h += sum over the picks of score * y
//
// 4c and 4d are decode_gemv.cuh's products over B * k (row, pick) pairs,
// a pair per blockIdx.y, their weight rows taken from the expert the route
// kernel wrote for the pair (GemvArgs::experts).
#pragma once
#include "decode_common.cuh"

namespace grove_fd {

// A block-wide reduction of one float per thread (max or sum), every
// thread getting the result. Up to 32 warps.
template <bool MAX>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = (blockDim.x + 31) >> 5;
  auto reduce = [](float x) { return MAX ? warp_max(x) : warp_sum(x); };
  v = reduce(v);
  __syncthreads();  // scratch free from an earlier call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return reduce(lane < warps ? scratch[lane] : (MAX ? -INFINITY : 0.f));
}

// 4b. Each row's routing (a block per row, `experts` floats of dynamic
// shared memory): MLX's precise softmax of the router's logits (float32 inside:
// exp(x - max) times 1 / sum, rounded to T); the k largest probabilities,
// ties going to the higher expert (the last k of a stable ascending sort,
// which mlx-lm's argpartition(...)[..., -k:] takes); with `normalize`, each
// divided by their sum (the sum in float32 rounded to T, each quotient
// rounded to T). Writes the row's k picks' experts and scores (sel and
// score [B, k]) in rank order.
template <class T>
__global__ void __launch_bounds__(256)
    route(const T* logits, int experts, int k, int normalize, int* sel, float* score) {
  extern __shared__ float prob[];
  __shared__ float red[32];
  logits += static_cast<int64_t>(blockIdx.x) * experts;
  sel += blockIdx.x * k;
  score += blockIdx.x * k;
  release_next();
  wait_prior();
  float m = -INFINITY;
  for (int i = threadIdx.x; i < experts; i += blockDim.x) {
    prob[i] = Num<T>::to(logits[i]);
    m = fmaxf(m, prob[i]);
  }
  m = block_reduce<true>(m, red);
  float sum = 0.f;
  for (int i = threadIdx.x; i < experts; i += blockDim.x) sum += __expf(prob[i] - m);
  const float inv = 1.f / block_reduce<false>(sum, red);
  __syncthreads();
  // (A NaN ranks as -inf: the ranks stay a permutation, so every pick is
  // written with an expert that exists, whatever the logits.)
  for (int i = threadIdx.x; i < experts; i += blockDim.x) {
    const float p = rt<T>(__expf(prob[i] - m) * inv);
    prob[i] = isnan(p) ? -INFINITY : p;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < experts; i += blockDim.x) {
    const float p = prob[i];
    int rank = 0;
    for (int j = 0; j < experts; j++) {
      const float q = prob[j];
      rank += q > p || (q == p && j > i);
    }
    if (rank < k) {
      sel[rank] = i;
      score[rank] = p;
    }
  }
  if (!normalize) return;
  __syncthreads();  // the picks' scores, written above, visible to thread 0
  if (threadIdx.x == 0) {
    float t = 0.f;
    for (int r = 0; r < k; r++) t += score[r];
    t = rt<T>(t);
    for (int r = 0; r < k; r++) score[r] = rt<T>(score[r] / t);
  }
}

// 4e. h[b][j] += sum over row b's k picks of y[pick][j] * score[pick]
// (y [B * k, hidden], a grid row per b): each product rounded to T (MLX
// multiplies two T arrays), summed in float32 and rounded to T (its sum
// over the picks), then added into h in T.
template <class T>
__global__ void __launch_bounds__(256)
    combine(const T* y, const float* score, int k, int hidden, T* h) {
  y += static_cast<int64_t>(blockIdx.y) * k * hidden;
  score += blockIdx.y * k;
  h += static_cast<int64_t>(blockIdx.y) * hidden;
  release_next();
  wait_prior();
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < hidden; j += gridDim.x * blockDim.x) {
    float acc = 0.f;
    for (int r = 0; r < k; r++) acc += rt<T>(Num<T>::to(y[static_cast<int64_t>(r) * hidden + j]) * score[r]);
    h[j] = Num<T>::from(Num<T>::to(h[j]) + rt<T>(acc));
  }
}

}  // namespace grove_fd
