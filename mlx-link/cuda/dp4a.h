// Integer dot products of four byte pairs (PTX dp4a), with no other
// dependency: the 4-bit products' sums (decode_gemv_args.cuh) and
// tests/bench/chain_ceiling.cu, which nvcc builds alone, share them.
#pragma once
#include <cstdint>

namespace grove_fd {

// Four byte pairs' products added to c: a's bytes unsigned, b's signed (us)
// or unsigned (uu).
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

}  // namespace grove_fd
