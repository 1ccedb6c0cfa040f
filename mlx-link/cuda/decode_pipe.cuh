// The dense products of Grove's CUDA decode step for batches, pipelined
// (decode_mma.cuh's gemm_tc is the unpipelined one it replaces where K is a
// multiple of kPipeK): the same GemvArgs and modes.
//
// A block takes kPipeCols rows of W (output columns; kGlu: half gate, half
// up, the same columns) over its share of K, all rows of x (padded to 16 per
// m-tile). Its W and x come through shared memory in stages of kPipeK
// values, copied asynchronously (cp.async, no registers held) kPipeStages - 1
// stages ahead of the one its warps multiply: up to 36 KiB of W in flight
// per block, four blocks per SM. Each warp owns 16 of the block's W rows
// (two n-tiles) and multiplies them with ldmatrix and mma.m16n8k16, so no
// sums cross warps. Where the columns alone leave SMs idle, K is split over
// gridDim.y blocks; the last block of a column group to finish adds the
// splits' sums in split order (the same sums every step).
#pragma once
#include "decode_mma.cuh"

namespace grove_fd {

constexpr int kPipeWarps = 4;
constexpr int kPipeCols = 16 * kPipeWarps;  // W rows per block
constexpr int kPipeK = 64;                  // values of K per stage (128 bytes a row)
constexpr int kPipeStages = 4;

__host__ __device__ constexpr size_t pipe_stage_bytes(int mt) {
  return static_cast<size_t>(kPipeCols + 16 * mt) * kPipeK * 2;
}
__host__ __device__ constexpr size_t pipe_smem(int mt) { return kPipeStages * pipe_stage_bytes(mt); }

__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Byte offset of 16-byte chunk c (0-7) of row r in a stage's 128-byte rows,
// swizzled so that the 8 rows an ldmatrix reads sit in 8 bank groups.
__device__ __forceinline__ uint32_t swz128(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

template <class T, int MT, int MODE>
__global__ void __launch_bounds__(kPipeWarps * 32) gemm_pipe(const GemvArgs a) {
  constexpr int kThreads = kPipeWarps * 32;
  constexpr int kOutCols = MODE == kGlu ? kPipeCols / 2 : kPipeCols;
  constexpr uint32_t kStage = pipe_stage_bytes(MT), kXOff = kPipeCols * 128;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int col0 = blockIdx.x * kOutCols;
  // This block's stages of K: [kc0, kc1) of k / kPipeK.
  const int nkc = a.k / kPipeK;
  const int kc0 = blockIdx.y * nkc / gridDim.y, kc1 = (blockIdx.y + 1) * nkc / gridDim.y, nk = kc1 - kc0;
  // 0. The W rows this thread copies (4 a stage: 16-byte chunk tid % 8 of
  //    rows tid / 8 + 16 j) and where they land; block row r is output
  //    column col0 + r (kGlu: r < 32 gate, else up, of col0 + r % 32); past
  //    the end the last, not stored.
  const int64_t row_bytes = static_cast<int64_t>(a.k) * sizeof(T);
  const int ch = tid & 7;
  const char* wsrc[4];
  uint32_t wdst[4];
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int r = tid / 8 + 16 * j;
    int c, m;
    if constexpr (MODE == kGlu) {
      c = min(col0 + r % (kPipeCols / 2), a.n - 1);
      m = r / (kPipeCols / 2);
    } else {
      c = min(col0 + r, a.n - 1);
      m = stacked(a, c);
    }
    wsrc[j] = static_cast<const char*>(a.w[m]) + c * row_bytes + ch * 16;
    wdst[j] = swz128(r, ch);
  }
  auto load_w = [&](int slot, int kc) {
#pragma unroll
    for (int j = 0; j < 4; j++) cp16(base + slot * kStage + wdst[j], wsrc[j] + kc * 128, 16);
  };
  const T* x = static_cast<const T*>(a.x);
  auto load_x = [&](int slot, int kc) {
#pragma unroll
    for (int j = 0; j < MT; j++) {
      const int r = tid / 8 + 16 * j;
      const bool live = r < a.rows;
      const T* src = x + (live ? r : 0) * a.x_stride + kc * kPipeK + ch * 8;
      cp16(base + slot * kStage + kXOff + swz128(r, ch), src, live ? 16 : 0);
    }
  };
  // 1. The first stages' weights before the wait (they do not depend on the
  //    kernel before), their x after it; one copy group per stage (the
  //    first holds all of these weights).
#pragma unroll
  for (int s = 0; s < kPipeStages - 1; s++)
    if (s < nk) load_w(s, kc0 + s);
  release_next();
  wait_prior();
#pragma unroll
  for (int s = 0; s < kPipeStages - 1; s++) {
    if (s < nk) load_x(s, kc0 + s);
    cp_commit();
  }
  float acc[MT][2][4];
  auto zero = [&] {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.f;
  };
  zero();
  // This warp's W rows: n-tile 0 and 1 (kGlu: the gate and the up rows of
  // the same 8 columns). ldmatrix lane l reads row (l % 8) of matrix l / 8:
  // (tile 0, k 0-7), (tile 0, k 8-15), (tile 1, k 0-7), (tile 1, k 8-15) for
  // B; for A (x), rows l % 16 at k (l / 16) * 8.
  const int r0 = MODE == kGlu ? 8 * warp : 16 * warp, r1 = MODE == kGlu ? kPipeCols / 2 + 8 * warp : 16 * warp + 8;
  const int brow = ((lane >> 4) ? r1 : r0) + (lane & 7), bhalf = (lane >> 3) & 1;
  const int arow = lane & 15, ahalf = lane >> 4;
  // 2. Each stage: wait for its copies, ask for the one kPipeStages - 1
  //    ahead (into the slot every warp has finished with), multiply.
  for (int i = 0; i < nk; i++) {
    cp_wait<kPipeStages - 2>();
    __syncthreads();
    const int ahead = i + kPipeStages - 1;
    if (ahead < nk) {
      load_w(ahead % kPipeStages, kc0 + ahead);
      load_x(ahead % kPipeStages, kc0 + ahead);
    }
    cp_commit();
    const uint32_t st = base + (i % kPipeStages) * kStage;
#pragma unroll
    for (int s = 0; s < kPipeK / 16; s++) {
      uint32_t b[4];
      ldsm4(b, st + swz128(brow, 2 * s + bhalf));
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        uint32_t af[4];
        ldsm4(af, st + kXOff + swz128(mt * 16 + arow, 2 * s + ahalf));
        mma16816<T>(acc[mt][0], af, b[0], b[1]);
        mma16816<T>(acc[mt][1], af, b[2], b[3]);
      }
    }
  }
  cp_wait<0>();
  // 3. Split: each thread's sums into the scratch; the last block of this
  //    column group adds every split's, in split order.
  constexpr int kVals = MT * 8;
  if (gridDim.y > 1) {
    float* part = a.part + static_cast<int64_t>(blockIdx.x) * gridDim.y * kThreads * kVals;
    float4* mine = reinterpret_cast<float4*>(part + (static_cast<int64_t>(blockIdx.y) * kThreads + tid) * kVals);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int nt = 0; nt < 2; nt++)
        mine[mt * 2 + nt] = make_float4(acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]);
    if (!last_to_arrive(a.arrived + blockIdx.x, gridDim.y)) return;
    zero();
    for (int y = 0; y < static_cast<int>(gridDim.y); y++) {
      const float4* theirs =
          reinterpret_cast<const float4*>(part + (static_cast<int64_t>(y) * kThreads + tid) * kVals);
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
          const float4 v = __ldcg(theirs + mt * 2 + nt);
          acc[mt][nt][0] += v.x;
          acc[mt][nt][1] += v.y;
          acc[mt][nt][2] += v.z;
          acc[mt][nt][3] += v.w;
        }
    }
    if (tid == 0) a.arrived[blockIdx.x] = 0;
  }
  // 4. Store as MODE says. Value i of tile (mt, nt) in lane l: row mt * 16
  //    + l / 4 + 8 * (i / 2), tile column 2 * (l % 4) + i % 2.
  T* out = static_cast<T*>(a.out_ref != nullptr ? *a.out_ref : a.out);
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int b = mt * 16 + g + 8 * (i >> 1);
      if (b >= a.rows) continue;
      if constexpr (MODE == kGlu) {
        const int c = col0 + 8 * warp + 2 * t + (i & 1);
        if (c >= a.n) continue;
        store_out<T, MODE>(out + b * a.out_stride + c, acc[mt][0][i], acc[mt][1][i]);
      } else {
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
          const int c = col0 + 16 * warp + 8 * nt + 2 * t + (i & 1);
          if (c >= a.n) continue;
          store_out<T, MODE>(out + b * a.out_stride + c, acc[mt][nt][i]);
        }
      }
    }
}

}  // namespace grove_fd
