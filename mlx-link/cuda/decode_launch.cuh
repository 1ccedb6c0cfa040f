// How Grove's CUDA decode step (decode.cu) launches its kernels
// (decode_kernels.cuh): the products' variants by rows, columns per warp,
// mode and weight format, their grids and shared memory, attention's grid,
// and programmatic dependent launches on Hopper.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "decode_kernels.cuh"
#include "decode_mma.cuh"
#include "decode_pipe.cuh"
#include "decode_attend_gqa.cuh"
#include "decode_moe.cuh"
#include "launch_util.h"

namespace grove_fd {

// Lets `kernel` take `bytes` of dynamic shared memory (with its static
// shared memory, a block may then pass the default 48 KiB). Only ever
// raised: a launch captured earlier keeps what it was captured with.
template <class K>
void allow_smem(K kernel, size_t bytes) {
  if (bytes <= 47 * 1024) return;  // within the default with its static part
  static std::unordered_map<const void*, size_t> allowed;
  size_t& have = allowed[reinterpret_cast<const void*>(kernel)];
  if (bytes <= have) return;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
        "shared memory");
  have = bytes;
}

// The GPU's multiprocessors.
inline int sm_count() {
  static const int sms = device_attr(cudaDevAttrMultiProcessorCount);
  return sms;
}

// The most dynamic shared memory a block may ask for.
inline size_t max_smem() {
  static const int bytes = device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  return static_cast<size_t>(bytes) - 1024;  // (the static part's room)
}

// Whether the step's kernels are launched as programmatic dependents of the
// kernel before them (decode_common.cuh's wait_prior): Hopper on, unless
// GROVE_FD_PDL=0 (to compare). Set when a plan is made.
inline bool pdl = false;
// The tensor-core and pipelined products (batches past gemv's rows) of
// more weight bytes than this (100 MiB; Qwen3-4B's gate/up 99.6 MB stays
// under) are launched without it: as dependents, Llama-8B bf16's gate/up
// (235 MB) and down (117 MB) made 32 streams slower (H200, 128 + 128
// tokens: 2977.5 tok/s with a 300 MiB bound against 3591.8, 8 streams
// 1348.7 against 1365.4). GROVE_FD_PDL_MAX_MB changes it.
inline size_t pdl_max_bytes = size_t{100} << 20;
// gemv's bound (GROVE_FD_GEMV_PDL_MAX_MB; none by default). Once gemv's
// dense products staged their first loads through a ring of shared memory
// (stop 51), a dependent launch of the large ones turned from a loss (stop
// 47: 214.1-219.6 tok/s against 230.1-232.6 on Llama-8B bf16) into a win:
// H200, two rounds, 512-token prompt, 256 tokens, Llama-8B bf16 257.0-258.8
// (every product dependent; 257.2-258.5 with a bound of 300 MiB) against
// 246.5-247.9 with 100 MiB, Llama-1B bf16 (its 525 MB head) 1267.8-1274.1
// against 1266.4-1269.1 (three rounds), Llama-8B 4-bit 568.8-569.5 against
// 567.9-568.4, Qwen3-4B 406.6-406.7 against 405.5-406.1; logits bit for bit.
inline size_t gemv_pdl_max_bytes = SIZE_MAX;

// Whether a product of `row_bytes` per output column (kGlu: per matrix)
// is launched as a programmatic dependent (pdl, at most `max_bytes`).
inline bool dependent(const GemvArgs& a, size_t row_bytes, int mode, size_t max_bytes = pdl_max_bytes) {
  return pdl && static_cast<size_t>(a.n) * row_bytes * (mode == kGlu ? 2 : 1) <= max_bytes;
}

// As many blocks as the GPU holds at once (each then takes tiles or column
// groups until none is left: x is staged, and normalized, once per block).
template <class K>
int grid_for(K kernel, size_t smem, int work, int threads = kWarps * 32) {
  const int sms = sm_count();
  int resident = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, smem), "occupancy");
  return std::max(1, std::min(work, resident * sms));
}

// A product's dynamic shared memory: x (and for NORM the norm's weights).
template <class T, bool NORM, int Q>
size_t gemv_launch_smem(const GemvArgs& a) {
  return NORM ? gemv_norm_at(Q, a.rows, a.k, sizeof(T)) + a.k * sizeof(T) : gemv_smem(Q, a.rows, a.k, sizeof(T));
}

// (EXP: `pairs` routed pairs, each its blocks' share of what the GPU
// holds at once.)
template <class T, int B, int R, int MODE, bool NORM, int Q, bool EXP = false>
void launch_gemv(const GemvArgs& a, cudaStream_t s, int pairs = 1) {
  const int cols_per_block = kGemvWarps * R;
  size_t smem = gemv_launch_smem<T, NORM, Q>(a);
  auto kernel = gemv<T, B, R, MODE, NORM, Q, EXP>;
  // Where a lane's loads tile K by halves of a pass (gemv's HV): quantized
  // weights by halves in registers, dense ones through each warp's ring of
  // stages in shared memory where it fits.
  if constexpr (!EXP) {
    constexpr int NR = MODE == kGlu ? 2 * R : R, H = gemv_half_loads(NR);
    constexpr int span = 32 * Span<Q>::kVals;
    if (a.k % span == 0 && (a.k / span) % H == 0) {
      if constexpr (Q != 0) {
        kernel = gemv<T, B, R, MODE, NORM, Q, false, 1>;
      } else {
        const size_t staged = gemv_ring_at(NORM, a.rows, a.k, sizeof(T)) +
                              static_cast<size_t>(kGemvWarps) * kGemvStages * gemv_stage_bytes(NR, H);
        if (staged <= max_smem()) {
          kernel = gemv<T, B, R, MODE, NORM, Q, false, 2>;
          smem = staged;
        }
      }
    }
  }
  allow_smem(kernel, smem);
  const int groups = (a.n + cols_per_block - 1) / cols_per_block;
  const size_t row_bytes = static_cast<size_t>(a.k) * (Q == 0 ? 8 * sizeof(T) : Q) / 8;
  int blocks = grid_for(kernel, smem, groups, kGemvWarps * 32);
  if constexpr (EXP) {
    const int resident = grid_for(kernel, smem, 1 << 30, kGemvWarps * 32);
    blocks = std::clamp(resident / pairs, 1, groups);  // (one wave: a block an SM)
  }
  // (`dependent` weighs the bytes of all pairs.)
  launch(dependent(a, row_bytes * pairs, MODE, gemv_pdl_max_bytes), kernel, dim3(blocks, pairs), kGemvWarps * 32,
         smem, s, a);
}

// One column per warp where the columns fit the warps the GPU holds at
// once (each warp then reads one row, and as many warps as columns stream),
// else two where that still gives every SM a block (each x value read from
// shared memory then serves two rows of W; but see `balance` below). The
// SiLU products read two rows (gate and up) with one column already. H200,
// Llama-8B bf16: 243.5 against 233.4 tok/s (its o and down products, 4096
// columns, now take one; every other product of the table's models is as
// before). One column wherever two would not give every warp two (q/k/v
// too): Llama-8B bf16 240.6, Qwen3-4B bf16 383.4 against 389.0, Llama-8B
// 4-bit 441.4 against 500.4.
// `balance` (GROVE_FD_BALANCE=0 to compare): one column all the same where
// two leave a short last round of the warps' column pairs, so that one
// column a warp gives each warp fewer than 4/5 of the columns that two give
// it: Llama-8B 4-bit's q/k/v (6144 columns, 2112 warps: three rounds of one
// column, three columns a warp, against two rounds of two, four). H200, two
// rounds: 572.2-572.4 tok/s against 568.8-569.1, logits bit for bit; no
// product of the table's bf16 models changes (Llama-1B, Qwen3-4B, Llama-8B
// bf16: even, one round).
inline int balance = 1;

template <class T, int B, int MODE, bool NORM, int Q>
void launch_cols(const GemvArgs& a, cudaStream_t s) {
  if constexpr (MODE != kGlu) {
    auto one = gemv<T, B, 1, MODE, NORM, Q>;
    const size_t smem = gemv_launch_smem<T, NORM, Q>(a);
    allow_smem(one, smem);
    const int warps = grid_for(one, smem, 1 << 30, kGemvWarps * 32) * kGemvWarps;
    if (a.n > warps && a.n / (2 * kGemvWarps) >= sm_count() * 9 / 10) {
      if (balance) {
        auto two = gemv<T, B, 2, MODE, NORM, Q>;
        allow_smem(two, smem);
        const int warps2 = grid_for(two, smem, 1 << 30, kGemvWarps * 32) * kGemvWarps;
        const int rounds1 = (a.n + warps - 1) / warps, rounds2 = ((a.n + 1) / 2 + warps2 - 1) / warps2;
        if (rounds1 * 5 < rounds2 * 2 * 4) return launch_gemv<T, B, 1, MODE, NORM, Q>(a, s);
      }
      return launch_gemv<T, B, 2, MODE, NORM, Q>(a, s);
    }
  }
  launch_gemv<T, B, 1, MODE, NORM, Q>(a, s);
}

template <class T, int MODE, bool NORM, int Q>
void launch_rows(const GemvArgs& a, cudaStream_t s) {
  switch (a.rows) {
    case 1: return launch_cols<T, 1, MODE, NORM, Q>(a, s);
    case 2: return launch_cols<T, 2, MODE, NORM, Q>(a, s);
    case 3: return launch_cols<T, 3, MODE, NORM, Q>(a, s);
    case 4: return launch_cols<T, 4, MODE, NORM, Q>(a, s);
    default: return launch_cols<T, 8, MODE, NORM, Q>(a, s);
  }
}

template <class T, int MODE, bool NORM>
void launch_bits(int bits, const GemvArgs& a, cudaStream_t s) {
  switch (bits) {
    case 0: return launch_rows<T, MODE, NORM, 0>(a, s);
    case 4: return launch_rows<T, MODE, NORM, 4>(a, s);
    case 8: return launch_rows<T, MODE, NORM, 8>(a, s);
    default: throw std::runtime_error("[grove decode] no product for these bits");
  }
}

// The routed experts' products (decode_moe.cuh) of `pairs` (row, pick)
// pairs, one x row per block: gate/up (norm, SiLU) or down (stored), one
// column per warp, from quantized weights.
template <class T>
void launch_experts(int mode, int bits, GemvArgs a, int pairs, cudaStream_t s) {
  a.rows = 1;
  if (mode == kGlu && bits == 4) return launch_gemv<T, 1, 1, kGlu, true, 4, true>(a, s, pairs);
  if (mode == kGlu && bits == 8) return launch_gemv<T, 1, 1, kGlu, true, 8, true>(a, s, pairs);
  if (mode == kStore && bits == 4) return launch_gemv<T, 1, 1, kStore, false, 4, true>(a, s, pairs);
  if (mode == kStore && bits == 8) return launch_gemv<T, 1, 1, kStore, false, 8, true>(a, s, pairs);
  throw std::runtime_error("[grove decode] no experts' product for these bits");
}

// Scratch of the tensor-core products: x normalized, split sums, counters.
struct TcScratch {
  void* x = nullptr;
  float* part = nullptr;
  size_t part_floats = 0;
  int* arrived = nullptr;
};

// Blocks of NT tiles of 8 columns for every row: as wide as still gives
// half the SMs a block (each block reads all of x, over its share of K:
// wider blocks read x fewer times), then the reduction split over up to
// tc_splits blocks (GROVE_FD_TC_SPLITS, 4) until tc_blocks blocks per SM
// (GROVE_FD_TC_BLOCKS, 1) run (the last of a column's blocks adds the
// splits up, in order). H200, Llama-8B bf16, 8 / 32 streams, one run:
// 1 block per SM 1199.7 / 3271.0 tok/s (again: 3288.5 at 32), 2: 1174.9 /
// 3089.4 (3087.9), 3: 1204.9 / 3185.3; no split 1127.5 / 3140.7.
constexpr int kTcMaxSplits = 4;
inline int tc_blocks = 1, tc_splits = kTcMaxSplits;

template <class T, int MT, int NT, int MODE>
void launch_tc(GemvArgs a, cudaStream_t s, const TcScratch& x) {
  constexpr int cols = MODE == kGlu ? 8 * NT / 2 : 8 * NT;
  const int blocks = (a.n + cols - 1) / cols, want = tc_blocks * sm_count();
  int splits = std::clamp((want + blocks - 1) / blocks, 1, tc_splits);
  while (splits > 1 && (a.k / 32 / splits < 2 * kMmaWarps ||
                        static_cast<size_t>(blocks) * splits * MT * NT * 128 > x.part_floats))
    splits--;
  a.part = x.part;
  a.arrived = x.arrived;
  launch(dependent(a, static_cast<size_t>(a.k) * sizeof(T), MODE), gemm_tc<T, MT, NT, MODE>, dim3(blocks, splits),
         dim3(kMmaWarps * 32), 0, s, a);
}

template <class T, int MT, int MODE>
void launch_tc_cols(const GemvArgs& a, cudaStream_t s, const TcScratch& x) {
  const int half = MODE == kGlu ? 2 : 1, enough = sm_count() / 2;
  if (a.n * half / 32 >= enough) return launch_tc<T, MT, 4, MODE>(a, s, x);
  if (MODE == kGlu || a.n / 16 >= enough) return launch_tc<T, MT, 2, MODE>(a, s, x);
  if constexpr (MODE != kGlu) launch_tc<T, MT, 1, MODE>(a, s, x);
}

// The pipelined products (decode_pipe.cuh): one block per 64 W rows (32
// columns of gate/up), K split over as many blocks as make one wave of the
// blocks the GPU holds at once (each split at least kPipeStages - 1 stages
// long, all splits' sums in the scratch). GROVE_FD_PIPE: 0 never (gemm_tc
// for all), 1 (the default) where K needs no split or the rows fit one
// m-tile (16), 2 always. Llama-8B bf16, GPU time a step (GROVE_FD_PROFILE=1),
// pipelined / gemm_tc: H200, 32 rows: gate/up 2334 / 3292 us, head 350 /
// 464 (no split); H100, 32 rows, split: q/k/v 1290 / 959, o 1007 / 845, down
// 1960 / 1827; H200, 8 rows, split (GROVE_FD_PIPE=2 / 1): q/k/v 773 / 782,
// o 573 / 589, down 1195 / 1316.
inline int pipe = 1;

// Launches the pipelined product unless `pipe` leaves this one to gemm_tc.
template <class T, int MT, int MODE>
bool launch_pipe(GemvArgs a, cudaStream_t s, const TcScratch& x) {
  constexpr int cols = MODE == kGlu ? kPipeCols / 2 : kPipeCols;
  auto kernel = gemm_pipe<T, MT, MODE>;
  const size_t smem = pipe_smem(MT);
  allow_smem(kernel, smem);
  const int tiles = (a.n + cols - 1) / cols;
  const int want = grid_for(kernel, smem, 1 << 30, kPipeWarps * 32);
  int splits = std::clamp(want / tiles, 1, std::max(1, a.k / kPipeK / (kPipeStages - 1)));
  while (splits > 1 && static_cast<size_t>(tiles) * splits * kPipeWarps * 32 * MT * 8 > x.part_floats) splits--;
  if (pipe == 1 && splits > 1 && MT > 1) return false;
  a.part = x.part;
  a.arrived = x.arrived;
  launch(dependent(a, static_cast<size_t>(a.k) * sizeof(T), MODE), kernel, dim3(tiles, splits),
         dim3(kPipeWarps * 32), smem, s, a);
  return true;
}

template <class T, int MODE>
void launch_tc_rows(const GemvArgs& a, cudaStream_t s, const TcScratch& x) {
  if (pipe > 0 && a.k % kPipeK == 0) {
    if (a.rows <= 16 ? launch_pipe<T, 1, MODE>(a, s, x) : launch_pipe<T, 2, MODE>(a, s, x)) return;
  }
  if (a.rows <= 16) return launch_tc_cols<T, 1, MODE>(a, s, x);
  launch_tc_cols<T, 2, MODE>(a, s, x);
}

// The products a step takes: q/k/v and the head (norm, store), o and down
// (residual), gate/up (norm, SiLU); on tensor cores (gemm_tc) where `tc`
// (dense weights only; x normalized into `xn.x` first, [rows, k]).
template <class T>
void gemv_rows(int rows, int mode, bool norm, int bits, bool tc, const TcScratch& xn, GemvArgs a, cudaStream_t s) {
  a.rows = rows;
  if (tc) {
    if (bits != 0) throw std::runtime_error("[grove decode] tensor-core products take dense weights");
    if (norm) {
      launch(pdl, norm_rows<T>, dim3(rows), dim3(kWarps * 32), 0, s, a.x, a.x_stride, a.norm, a.eps, a.k, xn.x);
      a.x = xn.x;
      a.x_stride = a.k;
      a.norm = nullptr;
    }
    if (mode == kStore) return launch_tc_rows<T, kStore>(a, s, xn);
    if (mode == kResidual && !norm) return launch_tc_rows<T, kResidual>(a, s, xn);
    if (mode == kGlu) return launch_tc_rows<T, kGlu>(a, s, xn);
    throw std::runtime_error("[grove decode] no such product");
  }
  if (mode == kStore && norm) return launch_bits<T, kStore, true>(bits, a, s);
  if (mode == kResidual && !norm) return launch_bits<T, kResidual, false>(bits, a, s);
  if (mode == kGlu && norm) return launch_bits<T, kGlu, true>(bits, a, s);
  throw std::runtime_error("[grove decode] no such product");
}

// Key ranges per (row, head): kSplits where heads and rows alone leave SMs
// idle, fewer as rows fill the GPU (about 8 blocks per SM in all), and
// one_row_splits for one row (GROVE_FD_SPLITS caps both). Six ranges for
// one row against eight (H200, two rounds, 512-token prompt, 256 tokens):
// Llama-1B bf16 1261.5-1271.1 tok/s against 1228.2-1255.0, Llama-8B 4-bit
// 567.6-567.9 against 564.6-564.8, Qwen3-4B bf16 406.1-406.2 against
// 405.0-405.2, Llama-8B bf16 247.8 against 246.4-247.7; four: Llama-8B
// 4-bit 563.6-564.2.
inline int max_splits = kSplits;
inline int one_row_splits = 6;

// Batches of grouped-query models (2 or 4 query heads per KV head) from
// gqa_rows rows (GROVE_FD_GQA=N; 0: never) take attend_gqa: as many key
// ranges per (row, KV head) as fill the blocks the GPU holds at once, up to
// gqa_splits (GROVE_FD_GQA_SPLITS, kGqaSplits). H200, Llama-8B bf16, GPU
// time a step (GROVE_FD_PROFILE=1), attend_gqa / attend: 1 row 637 / 367 us,
// 8 rows 590 / 864, 32 rows 952 / 1351; H100: 2 rows 669 / 522, 4 rows 574
// / 820 (so from 4 rows).
inline int gqa_rows = 4;
inline int gqa_splits = kGqaSplits;

template <class T, int D, int GQ>
void launch_gqa(const AttnArgs& a, int rows, cudaStream_t s) {
  auto kernel = attend_gqa<T, D, GQ>;
  const size_t smem = gqa_smem(D, GQ, sizeof(T));
  allow_smem(kernel, smem);
  const int resident = grid_for(kernel, smem, 1 << 30);
  const int splits = std::clamp(resident / (a.kv_heads * rows), 1, gqa_splits);
  launch(pdl, kernel, dim3(a.kv_heads, rows, splits), dim3(kWarps * 32), smem, s, a);
}

template <class T>
void launch_attend(const AttnArgs& a, int rows, int head_dim, cudaStream_t s) {
  const int group = a.heads / a.kv_heads;
  if (gqa_rows > 0 && rows >= gqa_rows && a.heads % a.kv_heads == 0 && (group == 2 || group == 4)) {
    if (head_dim == 64) return group == 2 ? launch_gqa<T, 64, 2>(a, rows, s) : launch_gqa<T, 64, 4>(a, rows, s);
    return group == 2 ? launch_gqa<T, 128, 2>(a, rows, s) : launch_gqa<T, 128, 4>(a, rows, s);
  }
  const int splits = std::clamp(8 * sm_count() / (a.heads * rows), 1, rows == 1 ? one_row_splits : max_splits);
  dim3 grid(a.heads, rows, splits), block(kWarps * 32);
  if (head_dim == 64)
    launch(pdl, attend<T, 64>, grid, block, 0, s, a);
  else
    launch(pdl, attend<T, 128>, grid, block, 0, s, a);
}

}  // namespace grove_fd
