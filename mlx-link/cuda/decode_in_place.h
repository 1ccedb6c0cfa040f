// Which KV buffers Grove's CUDA decode step (decode.cu) may write in place:
// those no other array holds. The count of a buffer's holders includes MLX's
// own reference to the previous step's outputs while that step runs (MLX
// keeps a step's inputs and outputs as temporaries until it completes), and
// the engine always dispatches the next step before the previous finishes:
// without telling that reference apart, every step copied its caches (H200,
// Llama-8B bf16: 230.2 tok/s with this against 214.4; at 16 rows and 384
// slots the copies took 9.3 ms a step). An event recorded after each step
// tells whether the step that made a buffer still runs.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "decode_launch.cuh"
#include "mlx/array.h"

namespace grove_fd {

class KvInPlace {
 public:
  using Data = mlx::core::array::Data;
  KvInPlace() = default;
  KvInPlace(const KvInPlace&) = delete;
  KvInPlace& operator=(const KvInPlace&) = delete;
  ~KvInPlace() {
    for (cudaEvent_t e : done_)
      if (e) cudaEventDestroy(e);
  }
  void init() {
    for (cudaEvent_t& e : done_) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
  }

  // Whether no array but the caller's holds `in`'s memory. One more holder
  // is MLX's while the step that made `in` still runs: MLX holds a step's
  // outputs, one reference each, but for the output it evaluated the step
  // for, which is the logits (the engine evaluates the sampled token). The
  // count is read first: the step still running after it, MLX's reference
  // was there when it was read, and any other holder would make it 3.
  bool alone(const mlx::core::array& in) const {
    const long holders = in.data_shared_ptr().use_count();
    return holders == 1 || (holders == 2 && made_in_flight(in));
  }

  // The Data that owns `in`'s memory: its own, or the allocation an earlier
  // step's in-place output stood on (checked to be the same buffer).
  std::shared_ptr<Data> root_of(const mlx::core::array& in) {
    auto it = made_.find(in.data_shared_ptr().get());
    if (it != made_.end()) {
      std::shared_ptr<Data> r = it->second.root.lock();
      made_.erase(it);
      if (r && r->buffer.ptr() == in.buffer().ptr()) return r;
    }
    return in.data_shared_ptr();
  }

  // A cache output of the step being dispatched, over `root`'s allocation.
  void record(const mlx::core::array& out, std::shared_ptr<Data> root) {
    if (made_.size() > 4096)
      for (auto i = made_.begin(); i != made_.end();) i = i->second.root.expired() ? made_.erase(i) : std::next(i);
    made_[out.data_shared_ptr().get()] = Made{root, steps_};
  }

  // The step's kernels are on `s`: its event, after them.
  void dispatched(cudaStream_t s) {
    check(cudaEventRecord(done_[steps_ % kRing], s), "event");
    steps_++;
  }

 private:
  struct Made {
    std::weak_ptr<Data> root;
    uint64_t step;
  };
  static constexpr uint64_t kRing = 8;  // the last steps' events (step % kRing)

  // Whether the step that made `in` (one of this plan's outputs) still runs.
  bool made_in_flight(const mlx::core::array& in) const {
    auto it = made_.find(in.data_shared_ptr().get());
    if (it == made_.end() || steps_ - it->second.step >= kRing) return false;
    return cudaEventQuery(done_[it->second.step % kRing]) == cudaErrorNotReady;
  }

  std::unordered_map<const void*, Made> made_;  // cache outputs' Data -> root, step
  cudaEvent_t done_[kRing] = {};
  uint64_t steps_ = 0;  // steps dispatched
};

}  // namespace grove_fd
