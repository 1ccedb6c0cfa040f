// Grove's greedy pick: one MLX primitive that takes logits [B, n] and gives
// each row's argmax(x - logsumexp(x)) as uint32 [B], what mlx-lm's greedy
// sampler computes with three MLX operations (logsumexp, subtract, argmax),
// in two kernels that spread each row over many blocks, the second a
// programmatic dependent of the first on Hopper (pick_kernels.cuh).
//
// Why: MLX's CUDA kernels for those operations read a row with one block
// each: on an H200, 37 us per step of Llama-1B's 128256 logits (ncu: 14.5 +
// 5.5 + 17.5 us), 4% of its whole decode step (863 us).
//
// Ordering with MLX: as the decode step's (decode.cu), these kernels go
// straight onto MLX's stream (libmlx.so does not export the calls that
// record kernels into its own graph), so they run before whatever MLX has
// recorded in the same evaluation and not yet launched. The pick therefore
// takes only logits already on the stream: the decode step's own (launched
// straight onto the stream when MLX evaluates that node, before this one) or
// logits evaluated earlier; for any other, the runner runs MLX's operations.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <stdexcept>
#include <vector>

#include "cuda_only.h"
#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cuda/device.h"
#include "mlx/primitives.h"
#include "mlx_ptr.h"
#include "launch_util.h"
#include "pick_kernels.cuh"

namespace {

using namespace mlx::core;
using grove_fd::mut_ptr;
using grove_fd::ptr;

constexpr int kMaxRows = 65535;  // rows a pick takes (the grid's y)

// Per stream, a counter per row for argmax_row's last block, zeroed once
// (each pick leaves them at 0); made on a stream's first pick.
int* row_counters(cudaStream_t s) {
  static std::mutex mu;
  static std::unordered_map<cudaStream_t, int*> made;
  std::lock_guard<std::mutex> lock(mu);
  int*& c = made[s];
  if (c == nullptr) {
    grove_fd::check(cudaMalloc(&c, sizeof(int) * kMaxRows), "pick counters");
    grove_fd::check(cudaMemset(c, 0, sizeof(int) * kMaxRows), "pick counters");
  }
  return c;
}

class GreedyPick : public grove_fd::CudaOnly {
 public:
  explicit GreedyPick(Stream s) : CudaOnly(s, "GroveGreedyPick") {}

  void eval_gpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    auto& enc = cu::get_command_encoder(stream());
    cudaStream_t s = enc.stream();
    const array& x = inputs[0];
    if (!x.flags().row_contiguous) throw std::runtime_error("[GroveGreedyPick] logits not contiguous");
    array& out = outputs[0];
    out.set_data(allocator::malloc(out.nbytes()));
    const int rows = x.shape(0), n = x.shape(1);
    const int nparts = (n + grove_pick::kChunk - 1) / grove_pick::kChunk;
    // Each block's partial results; freed once the stream has run them.
    auto scratch = [&](size_t bytes) {
      array a(Shape{static_cast<int>(bytes)}, uint8, nullptr, {});
      a.set_data(allocator::malloc(bytes));
      enc.add_temporary(a);
      return mut_ptr(a);
    };
    auto* parts = static_cast<grove_pick::MaxSum*>(scratch(sizeof(grove_pick::MaxSum) * rows * nparts));
    auto* best = static_cast<grove_pick::Best*>(scratch(sizeof(grove_pick::Best) * rows * nparts));
    int* arrived = row_counters(s);
    static const bool pdl = grove_fd::pdl_supported();
    const dim3 grid(nparts, rows), block(grove_pick::kThreads);
    auto run = [&](auto tag) {
      using T = decltype(tag);
      const T* xp = static_cast<const T*>(ptr(x));
      grove_fd::launch(false, grove_pick::lse_parts<T>, grid, block, 0, s, xp, n, parts);
      grove_fd::launch(pdl, grove_pick::argmax_row<T>, grid, block, 0, s, xp, n,
                       static_cast<const grove_pick::MaxSum*>(parts), best, arrived,
                       static_cast<uint32_t*>(mut_ptr(out)));
    };
    if (x.dtype() == bfloat16)
      run(__nv_bfloat16{});
    else if (x.dtype() == float16)
      run(__half{});
    else
      run(float{});
  }

  bool is_equivalent(const Primitive&) const override { return true; }
};

}  // namespace

extern "C" {

// Each row's argmax(x - logsumexp(x)) of `logits` (an `mlx::core::array*`,
// [B, n] in bfloat16, float16 or float32) on stream `stream` (an
// `mlx::core::Stream*`): a new uint32 [B] array into `out`. 0: done; 1: not
// covered (nothing made; the caller runs MLX's operations): other dtypes or
// shapes, logits evaluated but not contiguous, or logits not yet on the
// stream (see "Ordering with MLX" above).
int grove_fd_pick(void* stream, void* logits, void** out) {
  try {
    const array& x = *static_cast<const array*>(logits);
    const Dtype t = x.dtype();
    if (x.ndim() != 2 || x.shape(0) < 1 || x.shape(1) < 1 || x.shape(0) > kMaxRows) return 1;
    if (static_cast<int64_t>(x.shape(0)) * x.shape(1) > INT_MAX) return 1;
    if (t != bfloat16 && t != float16 && t != float32) return 1;
    // Already on the stream, or made by a node that launches straight onto it.
    const bool on_stream = x.status() != array::Status::unscheduled ||
                           (x.has_primitive() && std::strcmp(x.primitive().name(), "GroveDecodeStep") == 0);
    if (!on_stream) return 1;
    if (x.status() != array::Status::unscheduled && !x.flags().row_contiguous) return 1;
    const Stream& s = *static_cast<const Stream*>(stream);
    *out = new array(Shape{x.shape(0)}, uint32, std::make_shared<GreedyPick>(s), {x});
    return 0;
  } catch (const std::exception&) {
    return 1;
  }
}

}  // extern "C"
