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
#include <vector>

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

  // For each of ins[first..]: whether no array but the caller's holds its
  // memory. One more holder is MLX's while the step that made it still
  // runs: MLX holds the inputs of a step's join node (decode.cu), which are
  // its cache nodes' outputs, one reference each, until the step completes.
  // Every count is read before any event is queried: a step
  // still running at the query ran when its outputs were counted, so MLX's
  // reference was among them and any other holder would make 3. Each step's
  // event is queried once (a step's inputs mostly come from one step).
  std::vector<char> alone(const std::vector<mlx::core::array>& ins, size_t first) const {
    std::vector<long> holders(ins.size(), 0);
    for (size_t i = first; i < ins.size(); i++) holders[i] = ins[i].data_shared_ptr().use_count();
    std::vector<char> out(ins.size(), 0);
    int running[kRing];  // per ring slot: -1 not asked yet, else the answer
    for (int& r : running) r = -1;
    for (size_t i = first; i < ins.size(); i++) {
      out[i] = holders[i] == 1;
      if (holders[i] != 2) continue;
      auto it = made_.find(ins[i].data_shared_ptr().get());
      if (it == made_.end() || steps_ - it->second.step >= kRing) continue;
      int& r = running[it->second.step % kRing];
      if (r < 0) r = cudaEventQuery(done_[it->second.step % kRing]) == cudaErrorNotReady;
      out[i] = static_cast<char>(r);
    }
    return out;
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

  // The number the step being dispatched gets (its event's ring slot).
  uint64_t steps() const { return steps_; }

  // A cache written by step number `step` (steps()), over `root`'s allocation.
  void record(const mlx::core::array& out, std::shared_ptr<Data> root, uint64_t step) {
    if (made_.size() > 4096)
      for (auto i = made_.begin(); i != made_.end();) i = i->second.root.expired() ? made_.erase(i) : std::next(i);
    made_[out.data_shared_ptr().get()] = Made{root, step};
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

  std::unordered_map<const void*, Made> made_;  // cache outputs' Data -> root, step
  cudaEvent_t done_[kRing] = {};
  uint64_t steps_ = 0;  // steps dispatched
};

}  // namespace grove_fd
