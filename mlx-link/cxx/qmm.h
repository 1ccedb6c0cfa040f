// The shared description of one quantized product for Grove's CPU kernel
// (qmm_kernel.h) and the entry points of its per-instruction-set builds.
#pragma once
#include <cstdint>

namespace grove_qmm {

enum ScaleType { F32 = 0, F16 = 1, BF16 = 2 };

struct Args {
  const float* x;  // M x K, row-contiguous
  const uint8_t* w;  // N rows of K*bits/8 bytes
  // N x K/group_size each, of `scale_type`: read as they are stored (no
  // per-call conversion; float16 ones are half the bytes to read).
  const void* scales;
  const void* biases;
  int scale_type;  // ScaleType
  float* out;  // M x N
  int M, K, N, bits, group_size;
};

// Weight rows dequantized at a time when x has 4 rows or more, and the most
// values of a row at a time (a multiple of every group size).
constexpr int BLOCK_ROWS = 16;
constexpr int BLOCK_K = 1024;

// Values of a row dequantized at a time for this product.
inline int block_k(const Args& a) {
  return a.K < BLOCK_K ? a.K : BLOCK_K;
}

// Floats of scratch one call of `rows` needs.
inline long scratch_floats(const Args& a) {
  return (long)BLOCK_ROWS * block_k(a);
}

// out[:, n0:n1] for one build each; only those the CPU can run are called.
namespace avx512 { void rows(const Args& a, int n0, int n1, float* scratch); }
namespace avx2 { void rows(const Args& a, int n0, int n1, float* scratch); }
namespace base { void rows(const Args& a, int n0, int n1, float* scratch); }

}  // namespace grove_qmm
