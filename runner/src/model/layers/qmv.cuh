// Grove's quantized matrix-vector product for decode on CUDA: out[m, n] =
// sum_k x[m, k] * (q[n, k] * scale[n, k / GS] + bias[n, k / GS]) for MLX's
// affine layout (uint32 words holding 32 / BITS values, lowest bits first;
// one scale and bias per GS values of a row), for a few rows M of x.
//
// It is the header of an MLX custom kernel (`mx.fast.cuda_kernel`); the
// kernel's body calls `grove_qmv<M, K, N, BITS, GS, R, CHUNK>(x, w, scales,
// biases, out)` with those names as compile-time constants. One warp owns R
// output rows. Each lane loads 16 bytes of each row per step (32 4-bit or 16
// 8-bit values, all in one group); up to CHUNK steps are loaded before any is
// used, so that many loads are in flight. x is read as 16-byte vectors (every
// warp reads the same x, from L1/L2) and converted once for the R rows.
// No integer-to-float conversion instruction is used (they issue at a quarter
// of the rate and bound the kernel at ~1.8 TB/s on an H200): a value q is put
// into the top mantissa bits of 1.0f, giving 1 + q / 2^BITS with one shift and
// one bit operation, so sum(x q) = 2^BITS * (sum(x (1 + q / 2^BITS)) -
// sum(x)); a row's dot product is scale * sum(x q) + bias * sum(x), all in
// float32, and the warp sums its lanes with shuffles. Launch: grid
// (32 * N / R, 1, 1) threads in blocks of 128.

template <typename T>
__device__ __forceinline__ float grove_to_float(T v) {
  return static_cast<float>(v);
}

template <int BITS, int E>
__device__ __forceinline__ float grove_unit(uint32_t word) {
  // Value E of the word moved to mantissa bits [23 - BITS, 23) of 1.0f.
  constexpr int SHIFT = (23 - BITS) - E * BITS;
  constexpr uint32_t FIELD = ((1u << BITS) - 1u) << (23 - BITS);
  const uint32_t moved = SHIFT >= 0 ? (word << (SHIFT >= 0 ? SHIFT : 0))
                                    : (word >> (SHIFT < 0 ? -SHIFT : 0));
  return __uint_as_float((moved & FIELD) | 0x3f800000u);
}

template <int M, int K, int N, int BITS, int GS, int R, int CHUNK, typename T, typename S>
__device__ __forceinline__ void grove_qmv(
    const T* x,
    const uint32_t* w,
    const S* scales,
    const S* biases,
    T* out) {
  constexpr int PER_WORD = 32 / BITS;
  constexpr int VALS = 4 * PER_WORD; // values per 16-byte load
  constexpr int STEPS = K / VALS; // 16-byte loads per row
  constexpr int GROUPS = K / GS;
  constexpr int ITERS = (STEPS + 31) / 32;
  constexpr int X_VECS = VALS * int(sizeof(T)) / 16;
  constexpr float UNIT = float(1 << BITS);
  static_assert(BITS == 4 || BITS == 8, "4- or 8-bit only");
  static_assert(K % VALS == 0, "K must be a multiple of one lane's values");
  static_assert(GS % VALS == 0, "a lane's values must lie in one group");
  static_assert(VALS * sizeof(T) % 16 == 0, "x is read in 16-byte vectors");
  static_assert(N % R == 0, "a warp's rows must lie in the matrix");

  const int lane = threadIdx.x & 31;
  const int row0 = int((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * R;
  if (row0 >= N) {
    return;
  }
  const uint4* wrow = reinterpret_cast<const uint4*>(w) + size_t(row0) * STEPS;
  const S* srow = scales + size_t(row0) * GROUPS;
  const S* brow = biases + size_t(row0) * GROUPS;

  float acc[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      acc[m][r] = 0.0f;
    }
  }

#pragma unroll
  for (int base = 0; base < ITERS; base += CHUNK) {
    uint4 q[CHUNK][R];
#pragma unroll
    for (int i = 0; i < CHUNK; ++i) {
      const int step = (base + i) * 32 + lane;
      if (base + i < ITERS && step < STEPS) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          q[i][r] = __ldg(wrow + size_t(r) * STEPS + step);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < CHUNK; ++i) {
      const int step = (base + i) * 32 + lane;
      if (base + i < ITERS && step < STEPS) {
        const int k0 = step * VALS;
        float s[R];
        float b[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          s[r] = grove_to_float(srow[r * GROUPS + k0 / GS]);
          b[r] = grove_to_float(brow[r * GROUPS + k0 / GS]);
        }
#pragma unroll
        for (int m = 0; m < M; ++m) {
          T xv[VALS];
          const uint4* xsrc = reinterpret_cast<const uint4*>(x + size_t(m) * K + k0);
#pragma unroll
          for (int v = 0; v < X_VECS; ++v) {
            reinterpret_cast<uint4*>(xv)[v] = __ldg(xsrc + v);
          }
          float xf[VALS];
          float xsum = 0.0f;
#pragma unroll
          for (int e = 0; e < VALS; ++e) {
            xf[e] = grove_to_float(xv[e]);
            xsum += xf[e];
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const uint32_t words[4] = {q[i][r].x, q[i][r].y, q[i][r].z, q[i][r].w};
            float dot = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              dot = fmaf(xf[j * PER_WORD + 0], grove_unit<BITS, 0>(words[j]), dot);
              dot = fmaf(xf[j * PER_WORD + 1], grove_unit<BITS, 1>(words[j]), dot);
              dot = fmaf(xf[j * PER_WORD + 2], grove_unit<BITS, 2>(words[j]), dot);
              dot = fmaf(xf[j * PER_WORD + 3], grove_unit<BITS, 3>(words[j]), dot);
              if constexpr (PER_WORD == 8) {
                dot = fmaf(xf[j * PER_WORD + 4], grove_unit<BITS, 4>(words[j]), dot);
                dot = fmaf(xf[j * PER_WORD + 5], grove_unit<BITS, 5>(words[j]), dot);
                dot = fmaf(xf[j * PER_WORD + 6], grove_unit<BITS, 6>(words[j]), dot);
                dot = fmaf(xf[j * PER_WORD + 7], grove_unit<BITS, 7>(words[j]), dot);
              }
            }
            const float xq = UNIT * (dot - xsum);
            acc[m][r] = fmaf(s[r], xq, fmaf(b[r], xsum, acc[m][r]));
          }
        }
      }
    }
  }

#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[m][r];
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
      }
      if (lane == 0) {
        out[size_t(m) * N + row0 + r] = static_cast<T>(v);
      }
    }
  }
}
