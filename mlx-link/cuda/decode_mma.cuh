// The dense products of Grove's CUDA decode step for batches (past the rows
// gemv fits, up to kMaxRows) on tensor cores, unpipelined (decode_pipe.cuh's
// gemm_pipe takes those it is faster for): the same GemvArgs and modes as
// decode_gemv.cuh's gemv, without staging x whole in shared memory (which
// bounds gemv's rows: one row of Llama-8B's down product fills 28 of its 48
// KiB). x comes normalized where the product has a norm (norm_rows, once per
// product instead of once per block).
//
// Each block takes NT tiles of 8 output columns (kGlu: NT / 2 of gate and the
// same columns of up) for every row, its kMmaWarps warps each a share of K,
// and sums the warps' tiles at the end (in warp order: the same sums every
// step). A warp multiplies with mma.m16n8k16 (x as A, rows padded to 16 per
// m-tile; W's rows as B) and reads W straight from global memory: each
// lane loads 16 contiguous bytes of its W row (8 values), which serve two
// k16 steps; x's values at the same 8 positions, loaded the same way, make
// its A fragment. The reduction's positions are permuted the same way on
// both sides, so the sum is the product's (in another float32 order).
#pragma once
#include "decode_gemv.cuh"

namespace grove_fd {

constexpr int kMmaWarps = 8;  // warps per block, each a share of K

// d += a * b for one m16n8k16 tile of T (bf16 or f16) with float32 sums.
template <class T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

// MLX's rms_norm of each row of x [rows, k] (rows x_stride apart) into out
// [rows, k], in T: w * T(x * inv), each product rounded to T. One block a row.
template <class T>
__global__ void __launch_bounds__(kWarps * 32) norm_rows(const void* xv, int64_t x_stride, const void* normv,
                                                         float eps, int k, void* outv) {
  release_next();
  wait_prior();
  const T* x = static_cast<const T*>(xv) + blockIdx.x * x_stride;
  const T* nw = static_cast<const T*>(normv);
  T* out = static_cast<T*>(outv) + static_cast<int64_t>(blockIdx.x) * k;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float ss = 0.f;
  for (int c = threadIdx.x; c < k / 8; c += blockDim.x) {
    float v[8];
    unpack8<T>(*reinterpret_cast<const uint4*>(x + c * 8), v);
#pragma unroll
    for (int i = 0; i < 8; i++) ss += v[i] * v[i];
  }
  __shared__ float part[kWarps];
  ss = warp_sum(ss);
  if (lane == 0) part[warp] = ss;
  __syncthreads();
  float t = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; w++) t += part[w];
  const float inv = rsqrtf(t / k + eps);
  for (int c = threadIdx.x; c < k / 8; c += blockDim.x) {
    float v[8];
    rms_norm8<T>(*reinterpret_cast<const uint4*>(x + c * 8), *reinterpret_cast<const uint4*>(nw + c * 8), inv, v);
    *reinterpret_cast<uint4*>(out + c * 8) = pack8<T>(v);
  }
}

// Rows up to 16 * MT; NT tiles of 8 columns per block. U: 32-value chunks of
// K a warp has in flight per tile.
template <class T, int MT, int NT, int MODE>
__global__ void __launch_bounds__(kMmaWarps * 32) gemm_tc(const GemvArgs a) {
  static_assert(MODE != kGlu || NT % 2 == 0, "kGlu pairs gate and up tiles");
  constexpr int U = MT == 1 && NT <= 2 ? 4 : 2;
  constexpr int RG = 2 * MT;  // groups of 8 rows
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  constexpr int kTileCols = MODE == kGlu ? 8 * NT / 2 : 8 * NT;
  const int col0 = blockIdx.x * kTileCols;
  // This block's 32-value chunks of K: [lo, chunks) of k / 32, the
  // reduction split over gridDim.y blocks (the last to finish adds them up).
  const int lo = blockIdx.y * (a.k / 32) / gridDim.y, chunks = (blockIdx.y + 1) * (a.k / 32) / gridDim.y;
  const int64_t row_bytes = static_cast<int64_t>(a.k) * sizeof(T);
  // 0. This lane's W row in each tile (past the end: the last, not stored),
  //    at its 16 bytes of each 64-byte chunk; the first loads before x is
  //    ready (they do not depend on it).
  const char* wr[NT];
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
    int c = col0 + (MODE == kGlu ? (nt % (NT / 2)) * 8 : nt * 8) + g;
    c = min(c, a.n - 1);
    int m;
    if constexpr (MODE == kGlu) {
      m = nt / (NT / 2);
    } else if (c < a.seg[0]) {
      m = 0;
    } else if (c < a.seg[1]) {
      m = 1;
      c -= a.seg[0];
    } else {
      m = 2;
      c -= a.seg[1];
    }
    wr[nt] = static_cast<const char*>(a.w[m]) + c * row_bytes + t * 16;
  }
  uint4 pw[U][NT];
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int j = lo + warp + kMmaWarps * u;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) pw[u][nt] = j < chunks ? load_stream(wr[nt] + j * 64) : make_uint4(0, 0, 0, 0);
  }
  release_next();
  wait_prior();
  // 1. x's 16 bytes of row group rg at chunk j; zero past the rows.
  const T* x = static_cast<const T*>(a.x);
  auto load_x = [&](int rg, int j) -> uint4 {
    const int b = g + 8 * rg;
    if (b >= a.rows) return make_uint4(0, 0, 0, 0);
    return *reinterpret_cast<const uint4*>(x + b * a.x_stride + j * 32 + t * 8);
  };
  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.f;
  // One chunk's products: the lane's 8 values are two k16 steps (values
  // 0-3, then 4-7, as fragment slots 2t, 2t+1, 2t+8, 2t+9).
  auto consume = [&](const uint4 (&wv)[NT], const uint4 (&xv)[RG]) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        const uint4& lo = xv[2 * mt];
        const uint4& hi = xv[2 * mt + 1];
        const uint32_t af[4] = {h == 0 ? lo.x : lo.z, h == 0 ? hi.x : hi.z, h == 0 ? lo.y : lo.w,
                                h == 0 ? hi.y : hi.w};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
          mma16816<T>(acc[mt][nt], af, h == 0 ? wv[nt].x : wv[nt].z, h == 0 ? wv[nt].y : wv[nt].w);
      }
    }
  };
  // 2. This warp's chunks: warp, warp + kMmaWarps, ... U at a time, the
  //    first U already loaded.
  int j = lo + warp;
  {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int ju = j + kMmaWarps * u;
      if (ju < chunks) {
        uint4 xv[RG];
#pragma unroll
        for (int rg = 0; rg < RG; rg++) xv[rg] = load_x(rg, ju);
        consume(pw[u], xv);
      }
    }
    j += kMmaWarps * U;
  }
  for (; j + kMmaWarps * (U - 1) < chunks; j += kMmaWarps * U) {
    uint4 wv[U][NT], xv[U][RG];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
      for (int nt = 0; nt < NT; nt++) wv[u][nt] = load_stream(wr[nt] + (j + kMmaWarps * u) * 64);
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
      for (int rg = 0; rg < RG; rg++) xv[u][rg] = load_x(rg, j + kMmaWarps * u);
#pragma unroll
    for (int u = 0; u < U; u++) consume(wv[u], xv[u]);
  }
  for (; j < chunks; j += kMmaWarps) {
    uint4 wv[NT], xv[RG];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) wv[nt] = load_stream(wr[nt] + j * 64);
#pragma unroll
    for (int rg = 0; rg < RG; rg++) xv[rg] = load_x(rg, j);
    consume(wv, xv);
  }
  // 3. The warps' tiles summed in warp order (then, split, the blocks' in
  //    split order), stored as MODE says. A tile's value i of lane l: row
  //    8 * (i / 2) + l / 4, column 2 * (l % 4) + i % 2.
  constexpr int kVals = MT * NT * 128;
  __shared__ float red[kMmaWarps][kVals];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int i = 0; i < 4; i++) red[warp][((mt * NT + nt) * 32 + lane) * 4 + i] = acc[mt][nt][i];
  __syncthreads();
  for (int e = threadIdx.x; e < kVals; e += blockDim.x) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kMmaWarps; w++) s += red[w][e];
    red[0][e] = s;
  }
  if (gridDim.y > 1) {
    float* part = a.part + static_cast<int64_t>(blockIdx.x) * gridDim.y * kVals;
    for (int e = threadIdx.x; e < kVals; e += blockDim.x) part[blockIdx.y * kVals + e] = red[0][e];
    if (!last_to_arrive(a.arrived + blockIdx.x, gridDim.y)) return;
    for (int e = threadIdx.x; e < kVals; e += blockDim.x) {
      float s = 0.f;
      for (int y = 0; y < static_cast<int>(gridDim.y); y++) s += __ldcg(part + y * kVals + e);
      red[0][e] = s;
    }
    if (threadIdx.x == 0) a.arrived[blockIdx.x] = 0;
  }
  __syncthreads();
  T* out = static_cast<T*>(a.out_ref != nullptr ? *a.out_ref : a.out);
  constexpr int kOut = MODE == kGlu ? NT / 2 : NT;  // tiles stored
  for (int e = threadIdx.x; e < MT * kOut * 128; e += blockDim.x) {
    const int i = e & 3, l = (e >> 2) & 31, tile = e >> 7;  // tile = mt * kOut + nt
    const int mt = tile / kOut, nt = tile % kOut;
    const int b = mt * 16 + 8 * (i >> 1) + (l >> 2);
    const int c = col0 + nt * 8 + 2 * (l & 3) + (i & 1);
    if (b >= a.rows || c >= a.n) continue;
    auto sum = [&](int tnt) { return red[0][((mt * NT + tnt) * 32 + l) * 4 + i]; };
    store_out<T, MODE>(out + b * a.out_stride + c, sum(nt), MODE == kGlu ? sum(NT / 2 + nt) : 0.f);
  }
}

}  // namespace grove_fd
