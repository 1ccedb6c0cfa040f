// The matrix-vector products of Grove's CUDA decode step on Hopper, with
// the weights brought into shared memory by bulk copies (cp.async.bulk)
// instead of into registers: gemv's arithmetic (decode_gemv.cuh's stage_x,
// consume and finish) over pieces of kPieceBytes per weight row, as many in
// flight per warp as the block's shared memory holds (a.stages). The copies
// hold no registers, so a block asks for its first pieces before the step's
// wait (for the short products: all of its weights) and keeps HBM busy
// while x is staged, normalized and split, where gemv's loads stop at what
// its registers hold.
#pragma once
#include "decode_gemv.cuh"

namespace grove_fd {

constexpr int kPieceBytes = 2048;  // bytes of one weight row a piece holds
constexpr int kMaxStages = 8;      // pieces in flight per warp, at most

// Values of a row one piece holds: four 16-byte loads per lane.
template <class T, int Q>
__host__ __device__ constexpr int piece_vals() {
  return kPieceBytes * 8 / (Q == 0 ? 8 * static_cast<int>(sizeof(T)) : Q);
}

// Bytes of one row of a piece in shared memory: its weights, then for Q
// the piece's scales and biases.
__host__ __device__ constexpr int piece_row_bytes(int q, int piece_vals, int gs, int t_bytes) {
  return kPieceBytes + (q == 0 ? 0 : 2 * (piece_vals / gs) * t_bytes);
}

__host__ __device__ constexpr size_t align128(size_t n) { return (n + 127) / 128 * 128; }

// The launch's dynamic shared memory: x as gemv stages it, then per warp
// `stages` pieces of NR rows.
__host__ __device__ constexpr size_t bulk_smem(int q, int rows, int k, int t_bytes, int nr, int piece_vals, int gs,
                                               int stages) {
  return align128(gemv_smem(q, rows, k, t_bytes)) +
         static_cast<size_t>(kGemvWarps) * stages * nr * piece_row_bytes(q, piece_vals, gs, t_bytes);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void bar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
}
// The barrier's one arrival, which also says how many bytes its copies bring.
__device__ __forceinline__ void bar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t phase) {
  uint32_t done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(phase)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
#endif

// Each warp takes its groups of R columns (kGlu: R of gate and R of up), as
// gemv does, piece by piece along K: lane 0 copies a piece's NR rows (and
// their scales and biases) into one of the warp's a.stages slots, the warp
// waits on the slot's barrier, each lane reads its four 16-byte vectors of
// each row there into consume, and the slot takes the piece a.stages on.
template <class T, int B, int R, int MODE, bool NORM, int Q>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_bulk(const GemvArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int NR = MODE == kGlu ? 2 * R : R;
  constexpr int V = Span<Q>::kVals, PV = piece_vals<T, Q>(), U = PV / (32 * V);
  constexpr int BITS = Q == 0 ? 8 * sizeof(T) : Q;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint64_t bars[kGemvWarps][kMaxStages];
  const XView x = XView::at<Q>(reinterpret_cast<uint4*>(smem), a);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint64_t* bar = bars[warp];
  const int stages = a.stages;
  const int groups = Q == 0 ? 0 : PV >> a.gs_log2;  // scales of a piece's row
  const int row_stride = piece_row_bytes(Q, PV, Q == 0 ? 1 : a.gs, sizeof(T));
  char* slots = reinterpret_cast<char*>(smem) + align128(gemv_smem(Q, a.rows, a.k, sizeof(T))) +
                static_cast<size_t>(warp) * stages * NR * row_stride;
  const int per_col = (a.k + PV - 1) / PV;
  const int first = (blockIdx.x * kGemvWarps + warp) * R, stride = gridDim.x * kGemvWarps * R;
  const int pieces = first < a.n ? (a.n - first + stride - 1) / stride * per_col : 0;
  // 0. The slots' barriers, and this warp's first pieces, asked for before
  //    x is staged: they do not depend on it.
  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < stages; s++) bar_init(&bar[s]);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncwarp();
  auto issue = [&](int p) {
    const int t = p / per_col, k0 = (p - t * per_col) * PV;
    const int vals = min(PV, a.k - k0);
    const Rows<T, R, NR, MODE, Q> w(a, first + t * stride);
    char* slot = slots + (p % stages) * NR * row_stride;
    const uint32_t wb = vals * BITS / 8, sb = Q == 0 ? 0 : (vals >> a.gs_log2) * sizeof(T);
    uint64_t* b = &bar[p % stages];
    bar_expect(b, NR * (wb + 2 * sb));
#pragma unroll
    for (int r = 0; r < NR; r++) {
      char* row = slot + r * row_stride;
      bulk_copy(row, w.w[r] + static_cast<int64_t>(k0) * BITS / 8, wb, b);
      if constexpr (Q != 0) {
        bulk_copy(row + kPieceBytes, w.s[r] + (k0 >> a.gs_log2), sb, b);
        bulk_copy(row + kPieceBytes + groups * sizeof(T), w.b[r] + (k0 >> a.gs_log2), sb, b);
      }
    }
  };
  const int pre = min(a.pre, pieces);
  if (lane == 0)
    for (int p = 0; p < pre; p++) issue(p);
  // The next kernel may start as this one's blocks leave; x is the last
  // kernel's output.
  release_next();
  wait_prior();
  if (lane == 0)
    for (int p = pre; p < min(stages, pieces); p++) issue(p);
  stage_x<T, B, NORM, Q>(a, x);
  // 2. The pieces in order, a column group's sums stored after its last.
  float acc[NR][B];
#pragma unroll
  for (int r = 0; r < NR; r++)
#pragma unroll
    for (int b = 0; b < B; b++) acc[r][b] = 0.f;
  for (int p = 0; p < pieces; p++) {
    const int t = p / per_col, c = p - t * per_col, k0 = c * PV;
    const int vals = min(PV, a.k - k0);
    bar_wait(&bar[p % stages], (p / stages) & 1);
    const char* slot = slots + (p % stages) * NR * row_stride;
    uint4 wv[U][NR];
    T sv[U][NR], bv[U][NR];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int kk = u * 32 * V + lane * V;
#pragma unroll
      for (int r = 0; r < NR; r++) {
        const char* row = slot + r * row_stride;
        wv[u][r] = *reinterpret_cast<const uint4*>(row + kk * BITS / 8);
        if constexpr (Q != 0) {
          const T* sc = reinterpret_cast<const T*>(row + kPieceBytes);
          sv[u][r] = sc[kk >> a.gs_log2];
          bv[u][r] = sc[groups + (kk >> a.gs_log2)];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int kk = u * 32 * V + lane * V;
      if (kk < vals) consume<T, B, NR, Q>(acc, wv[u], sv[u], bv[u], k0 + kk, x);
    }
    // Every lane has read the slot: it takes the piece `stages` on.
    __syncwarp();
    if (lane == 0 && p + stages < pieces) issue(p + stages);
    if (c == per_col - 1) {
      finish<T, B, R, NR, MODE>(acc, a, first + t * stride, lane);
#pragma unroll
      for (int r = 0; r < NR; r++)
#pragma unroll
        for (int b = 0; b < B; b++) acc[r][b] = 0.f;
    }
  }
#endif
}

}  // namespace grove_fd
