// What the kernels of Grove's CUDA decode step share: sizes, the step's
// changing inputs in device memory, and conversions between T and float
// (decode_kernels.cuh lists the kernels).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace grove_fd {

constexpr int kWarps = 8;       // warps per block of every kernel but the products
#ifndef GROVE_GEMV_WARPS
#define GROVE_GEMV_WARPS 16
#endif
// Warps per block of the matrix-vector products: each block stages (and
// normalizes, converts) x once for kGemvWarps * R columns. 16 measured on an
// H200 against 8 (two runs): Llama-8B 4-bit 386.5 / 387.1 vs 375.9 / 379.4
// tok/s, Llama-1B bf16 811.0 / 810.3 vs 809.5 / 805.2; 32: 340.7 / 735.6.
constexpr int kGemvWarps = GROVE_GEMV_WARPS;
constexpr int kMaxRows = 32;    // batch rows one step covers (dense weights)
constexpr int kGemvMaxRows = 8; // rows gemv covers (quantized weights' limit)
constexpr int kMaxLayers = 160; // layers one plan covers
#ifndef GROVE_ATTN_SPLITS
#define GROVE_ATTN_SPLITS 8
#endif
// Key ranges attention is split into (16: 353.6 / 760.0, 4: 385.6 / 817.3
// tok/s on the models above, with 16 product warps: no clear gain).
constexpr int kSplits = GROVE_ATTN_SPLITS;

// What changes from one step to the next, in device memory: the step's
// kernels read it there, so that one captured CUDA graph per batch size
// replays every step (`set_params` writes it first, in stream order).
struct StepParams {
  const uint32_t* tokens;  // [B]
  void* logits;            // [B, vocab]
  int64_t cap;             // the caches' capacity (slots)
  int idx;                 // the slot the new token is written to
  int left[kMaxRows];      // each row's first slot (its left padding)
  void* kc[kMaxLayers];    // per layer: keys [B, kv_heads, cap, D]
  void* vc[kMaxLayers];    // values, the same
};

template <class T>
struct Num;
template <>
struct Num<__nv_bfloat16> {
  static __device__ __forceinline__ float to(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from(float x) { return __float2bfloat16_rn(x); }
};
template <>
struct Num<__half> {
  static __device__ __forceinline__ float to(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from(float x) { return __float2half_rn(x); }
};
template <>
struct Num<float> {
  static __device__ __forceinline__ float to(float x) { return x; }
  static __device__ __forceinline__ float from(float x) { return x; }
};

// x rounded to T and back: what an MLX op that outputs T leaves.
template <class T>
__device__ __forceinline__ float rt(float x) {
  return Num<T>::to(Num<T>::from(x));
}

// Eight values of T in 16 bytes as floats, from the four 32-bit words (so
// that a vector in shared memory is read with one 16-byte load).
template <class T>
__device__ __forceinline__ void unpack8(const uint4 v, float out[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
      __half2 h;
      memcpy(&h, &w[i], 4);
      const float2 f = __half22float2(h);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
}

// A 16-byte asynchronous copy into shared memory; `bytes` 0 fills zeros.
__device__ __forceinline__ void cp16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Programmatic dependent launch (Hopper on): each kernel of the step is
// launched while the one before it still runs. Before `wait_prior` a
// kernel reads only what no kernel of the step writes (weights, the cache's
// earlier slots, the step's params), and writes nothing; `wait_prior`
// returns once the kernel before it has finished and its writes are
// visible. `release_next` lets the next kernel's blocks start (each then
// issues its weight loads and waits). Both are no-ops on older GPUs and
// for a launch without the attribute.
__device__ __forceinline__ void wait_prior() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void release_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Whether this block is the last of `n` to arrive at `counter`, once every
// thread of it has written its share (call from all threads). The last then
// reads every block's shares (through L2: __ldcg) and, the caller's part,
// sets the counter back to zero for the next launch.
// The block's barrier orders its threads' writes before thread 0's add,
// which releases them and acquires the other blocks' (acq_rel at GPU
// scope); the second barrier passes that on to the block's threads: CUTLASS's
// GenericBarrier, with the arrival and the wait in one atomic. (Before: a
// fence in every thread, the add, and a fence in the last block. H200,
// Llama-8B 4-bit, two rounds: 574.5-574.9 tok/s against 566.2-570.2;
// logits bit for bit equal on llama-small bf16 and 4-bit and
// qwen3-moe-small 4-bit.)
__device__ __forceinline__ bool last_to_arrive(int* counter, int n) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    int before;
    asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
    last = before == n - 1;
  }
  __syncthreads();
  return last;
}

__device__ __forceinline__ uint4 load_stream(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// MLX's sigmoid on T (unary_ops.cuh: 1 / (1 + exp(|x|)), mirrored for x > 0).
template <class T>
__device__ __forceinline__ float sigmoid_t(float x) {
  float e = rt<T>(expf(fabsf(x)));
  float y = rt<T>(1.f / (1.f + e));
  return x < 0 ? y : rt<T>(1.f - y);
}

}  // namespace grove_fd
