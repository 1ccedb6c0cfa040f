// The 4-bit products of Grove's CUDA decode step on tensor cores
// (decode_kernels.cuh has the others): out[b, n] = sum_k x[b, k] * (q[n, k]
// * scale + bias), MLX's affine layout with groups of 64 or 128, for 1 to 8
// rows b of x.
//
// Why: on CUDA cores a 4-bit weight costs ~6 instructions (unpack, convert,
// multiply-add, x from shared memory) and the product is bound by issue, not
// by memory (Llama-8B 4-bit: 6.6 ms a step where its 4.2 GiB take 1.3 ms).
// Here one mma.sync m16n8k16 takes 16 weight columns x 16 values x 8 rows:
// a pair of 4-bit values becomes a pair of bfloat16 (or float16) numbers
// OFF + q with one bit operation ((w >> s) & 0x000f000f | OFF's bits, exact),
// x stays in T, and the tensor core multiplies exactly and sums in float32.
// Per step of 64 values, sum_k x (OFF + q) - OFF sum_k x = sum_k x q, then
// times the group's scale, plus its bias times sum_k x, in float32 (the
// values MLX's quantized_matmul gives, up to the order of float sums).
//
// Layout of one mma (PTX m16n8k16, lane = 4 g + t): A (weights) rows g and
// g + 8 of the tile's 16 columns; B (x) column g = row g of x; the k slots a
// lane holds, {2t, 2t+1, 2t+8, 2t+9}, are mapped onto 4 of the 16 values the
// lane loads (8 bytes of a weight row), so that A's pairs are nibbles (e,
// e + 4) of a 32-bit word. x is staged in shared memory in the same order
// (each 8 values as 0 4 1 5 2 6 3 7), so B's four values are one 8-byte
// load; rows of x are 8 bytes longer than k values, so that the 8 rows'
// loads fall in different banks.
#pragma once
#include "decode_gemv.cuh"

namespace grove_fd {

constexpr int kMmaStep = 64;  // values of k per step (4 lanes x 16)
constexpr int kMmaCols = 16;  // columns per tile

// OFF's bits twice (a pair), and OFF: 128 in bfloat16, 1024 in float16.
template <class T>
struct MmaType;
template <>
struct MmaType<__nv_bfloat16> {
  static constexpr uint32_t kPair = 0x43004300u;
  static constexpr float kOff = 128.f;
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct MmaType<__half> {
  static constexpr uint32_t kPair = 0x64006400u;
  static constexpr float kOff = 1024.f;
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// Nibbles e and e + 4 of `w` as the pair (OFF + q_e, OFF + q_{e+4}).
template <class T, int E>
__device__ __forceinline__ uint32_t pair(uint32_t w) {
  return ((w >> (4 * E)) & 0x000f000fu) | MmaType<T>::kPair;
}

// Each 8 values of T as 0 4 1 5 2 6 3 7.
__device__ __forceinline__ uint4 interleave(const uint4 v) {
  return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632), __byte_perm(v.y, v.w, 0x5410),
                    __byte_perm(v.y, v.w, 0x7632));
}

// Shared memory of a launch: x's rows (2 k + 8 bytes each), the steps' sums
// of x (float [rows][k / 64]), and the warps' partial tiles.
__host__ __device__ constexpr size_t mma_x_bytes(int rows, int k, int t_bytes) {
  return (static_cast<size_t>(rows) * (static_cast<size_t>(k) * t_bytes + 8) + 15) / 16 * 16;
}
__host__ __device__ constexpr size_t mma_smem(int rows, int k, int t_bytes) {
  return mma_x_bytes(rows, k, t_bytes) + static_cast<size_t>(rows) * (k / kMmaStep) * 4 +
         static_cast<size_t>(kWarps) * 2 * kMmaCols * 8 * 4;
}

// One block per tile of 16 columns at a time (kGlu: 16 of gate and 16 of
// up), its 8 warps splitting k; grid-stride over the tiles, x staged once.
// Needs k % 64 == 0 and groups of 64 or 128.
template <class T, int MODE, bool NORM>
__global__ void __launch_bounds__(kWarps * 32) gemv_mma(const GemvArgs a) {
  constexpr int NT = MODE == kGlu ? 2 : 1;  // tiles of weights per tile of output
  extern __shared__ uint4 smem[];
  char* xb = reinterpret_cast<char*>(smem);
  const int rows = a.rows, k = a.k, k8 = k / 8, steps = k / kMmaStep;
  const int64_t stride = static_cast<int64_t>(k) * sizeof(T) + 8;  // bytes per row of x
  float* xsum = reinterpret_cast<float*>(xb + mma_x_bytes(rows, k, sizeof(T)));
  float* red = xsum + rows * steps;  // [kWarps][NT][16][8]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const T* x = static_cast<const T*>(a.x);
  auto xvec = [&](int b, int c) -> uint2* { return reinterpret_cast<uint2*>(xb + b * stride + c * 16); };

  // 1. x into shared memory (normalized for NORM, as MLX's rms_norm gives
  //    it), interleaved; then each step's sum of x.
  __shared__ float inv[kMaxRows];
  if constexpr (NORM) {
    __shared__ float part[kWarps][kMaxRows];
    for (int b = 0; b < rows; b++) {
      float ss = 0.f;
      for (int c = threadIdx.x; c < k8; c += blockDim.x) {
        float v[8];
        unpack8<T>(*reinterpret_cast<const uint4*>(x + b * a.x_stride + c * 8), v);
#pragma unroll
        for (int i = 0; i < 8; i++) ss += v[i] * v[i];
      }
      ss = warp_sum(ss);
      if (lane == 0) part[warp][b] = ss;
    }
    __syncthreads();
    if (threadIdx.x < rows) {
      float tot = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; w++) tot += part[w][threadIdx.x];
      inv[threadIdx.x] = rsqrtf(tot / k + a.eps);
    }
    __syncthreads();
  }
  const T* nw = static_cast<const T*>(a.norm);
  for (int i = threadIdx.x; i < rows * k8; i += blockDim.x) {
    const int b = i / k8, c = i - b * k8;
    uint4 v = *reinterpret_cast<const uint4*>(x + b * a.x_stride + c * 8);
    if constexpr (NORM) {
      float f[8], gw[8];
      unpack8<T>(v, f);
      unpack8<T>(*reinterpret_cast<const uint4*>(nw + c * 8), gw);
#pragma unroll
      for (int j = 0; j < 8; j++) f[j] = gw[j] * rt<T>(f[j] * inv[b]);
      v = pack8<T>(f);
    }
    v = interleave(v);
    uint2* dst = xvec(b, c);
    dst[0] = make_uint2(v.x, v.y);
    dst[1] = make_uint2(v.z, v.w);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * steps; i += blockDim.x) {
    const int b = i / steps, st = i - b * steps;
    float tot = 0.f;
    for (int c = st * (kMmaStep / 8); c < (st + 1) * (kMmaStep / 8); c++) {
      const uint2* src = xvec(b, c);
      float f[8];
      unpack8<T>(make_uint4(src[0].x, src[0].y, src[1].x, src[1].y), f);
#pragma unroll
      for (int j = 0; j < 8; j++) tot += f[j];
    }
    xsum[i] = tot;
  }
  __syncthreads();

  // 2. Tiles of 16 columns; warp w takes steps w, w + 8, ...
  const int tiles = (a.n + kMmaCols - 1) / kMmaCols;
  const int groups = k / a.gs;
  const bool has_x = g < rows;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    // This lane's weight rows: columns g and g + 8 of the tile (past the
    // end: the last column, not stored), per weight tile.
    const uint2* wrow[NT][2];
    const T* srow[NT][2];
    const T* brow[NT][2];
#pragma unroll
    for (int m = 0; m < NT; m++) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        int c = min(tile * kMmaCols + g + 8 * h, a.n - 1);
        int mat = m;
        if constexpr (MODE != kGlu) {
          mat = c < a.seg[0] ? 0 : c < a.seg[1] ? 1 : 2;
          c -= mat == 0 ? 0 : a.seg[mat - 1];
        }
        wrow[m][h] = reinterpret_cast<const uint2*>(static_cast<const char*>(a.w[mat]) +
                                                     static_cast<int64_t>(c) * (k / 2)) +
                     t;
        srow[m][h] = static_cast<const T*>(a.scales[mat]) + static_cast<int64_t>(c) * groups;
        brow[m][h] = static_cast<const T*>(a.biases[mat]) + static_cast<int64_t>(c) * groups;
      }
    }
    float acc[NT][4];
#pragma unroll
    for (int m = 0; m < NT; m++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[m][i] = 0.f;
    // One step: 4 mma per weight tile over 64 values, then the group's
    // scale and bias.
    auto consume = [&](const uint2 (&w)[NT][2], const T (&sc)[NT][2], const T (&bi)[NT][2], int st) {
      const char* xr = xb + g * stride + st * (kMmaStep * sizeof(T)) + t * 16 * sizeof(T);
      uint2 xv[4];
#pragma unroll
      for (int j = 0; j < 4; j++)
        xv[j] = has_x ? *reinterpret_cast<const uint2*>(xr + (8 * (j / 2) + 4 * (j % 2)) * sizeof(T))
                      : make_uint2(0u, 0u);
      const float x0 = 2 * t < rows ? xsum[(2 * t) * steps + st] : 0.f;
      const float x1 = 2 * t + 1 < rows ? xsum[(2 * t + 1) * steps + st] : 0.f;
#pragma unroll
      for (int m = 0; m < NT; m++) {
        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < 4; j++) {
          const uint32_t lo = j < 2 ? w[m][0].x : w[m][0].y;  // column g
          const uint32_t hi = j < 2 ? w[m][1].x : w[m][1].y;  // column g + 8
          uint32_t ar[4];
          if (j % 2 == 0) {
            ar[0] = pair<T, 0>(lo);
            ar[1] = pair<T, 0>(hi);
            ar[2] = pair<T, 1>(lo);
            ar[3] = pair<T, 1>(hi);
          } else {
            ar[0] = pair<T, 2>(lo);
            ar[1] = pair<T, 2>(hi);
            ar[2] = pair<T, 3>(lo);
            ar[3] = pair<T, 3>(hi);
          }
          MmaType<T>::mma(d, ar, xv[j].x, xv[j].y);
        }
        constexpr float OFF = MmaType<T>::kOff;
        const float s0 = Num<T>::to(sc[m][0]), s1 = Num<T>::to(sc[m][1]);
        const float b0 = Num<T>::to(bi[m][0]), b1 = Num<T>::to(bi[m][1]);
        acc[m][0] = fmaf(s0, d[0] - OFF * x0, fmaf(b0, x0, acc[m][0]));
        acc[m][1] = fmaf(s0, d[1] - OFF * x1, fmaf(b0, x1, acc[m][1]));
        acc[m][2] = fmaf(s1, d[2] - OFF * x0, fmaf(b1, x0, acc[m][2]));
        acc[m][3] = fmaf(s1, d[3] - OFF * x1, fmaf(b1, x1, acc[m][3]));
      }
    };
    int st = warp;
    auto pass = [&]<int U>() {
      for (; st + (U - 1) * kWarps < steps; st += U * kWarps) {
        uint2 w[U][NT][2];
        T sc[U][NT][2], bi[U][NT][2];
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int s2 = st + u * kWarps;
          const int grp = (s2 * kMmaStep) >> a.gs_log2;
#pragma unroll
          for (int m = 0; m < NT; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
              w[u][m][h] = __ldg(wrow[m][h] + s2 * 4);
              sc[u][m][h] = srow[m][h][grp];
              bi[u][m][h] = brow[m][h][grp];
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) consume(w[u], sc[u], bi[u], st + u * kWarps);
      }
    };
    pass.template operator()<8>();
    pass.template operator()<4>();
    pass.template operator()<1>();
    // 3. The warps' sums through shared memory; thread (column, row) stores.
    //    Lane (g, t) holds columns g, g + 8 for rows 2t, 2t + 1.
#pragma unroll
    for (int m = 0; m < NT; m++) {
      float* r = red + (warp * NT + m) * kMmaCols * 8;
      r[g * 8 + 2 * t] = acc[m][0];
      r[g * 8 + 2 * t + 1] = acc[m][1];
      r[(g + 8) * 8 + 2 * t] = acc[m][2];
      r[(g + 8) * 8 + 2 * t + 1] = acc[m][3];
    }
    __syncthreads();
    if (threadIdx.x < kMmaCols * 8) {
      const int col = threadIdx.x / 8, b = threadIdx.x % 8, c = tile * kMmaCols + col;
      if (b < rows && c < a.n) {
        float v[NT];
#pragma unroll
        for (int m = 0; m < NT; m++) {
          v[m] = 0.f;
#pragma unroll
          for (int w = 0; w < kWarps; w++) v[m] += red[((w * NT + m) * kMmaCols + col) * 8 + b];
        }
        T* out = static_cast<T*>(a.out_ref != nullptr ? *a.out_ref : a.out) + b * a.out_stride + c;
        if constexpr (MODE == kStore) {
          *out = Num<T>::from(v[0]);
        } else if constexpr (MODE == kResidual) {
          *out = Num<T>::from(Num<T>::to(*out) + rt<T>(v[0]));
        } else {
          const float gate = rt<T>(v[0]), up = rt<T>(v[NT - 1]);
          *out = Num<T>::from(rt<T>(gate * sigmoid_t<T>(gate)) * up);
        }
      }
    }
    __syncthreads();
  }
}

}  // namespace grove_fd
