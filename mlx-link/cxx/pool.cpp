// Grove's CPU threads (pool.h): workers 1..n-1 beside the calling thread.
#include "pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace {

int thread_count() {
  if (const char* v = std::getenv("GROVE_CPU_THREADS")) {
    const int n = std::atoi(v);
    if (n >= 1) return std::min(n, 256);
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n >= 1) return n;
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n >= 1 ? static_cast<int>(n) : 1;
}

inline void relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Workers 1..n-1 beside the calling thread (thread 0). A job is a number of
// chunks that any thread takes one at a time (a compare-and-swap on one word
// holding the job's generation, its chunk count and the next chunk), so a
// worker the OS has not scheduled yet holds nothing up: the caller takes the
// chunks left and waits only for those already taken. Idle workers spin for
// SPIN_US after their last chunk, then sleep on the condition variable. The
// pool lives as long as the process (see pool()).
class Pool {
 public:
  explicit Pool(int n) : n_(n) {
    for (int i = 1; i < n_; i++) std::thread([this, i] { work(i); }).detach();
  }
  int size() const { return n_; }

  // Runs fn(ctx, c, thread) for every chunk c in [0, chunks) and returns
  // when all ran. Nothing is allocated per job (a decode step runs hundreds).
  void run(int chunks, grove_cpu::ChunkFn fn, void* ctx) {
    if (chunks <= 0) return;
    if (chunks == 1 || n_ == 1 || chunks > 0xffff) {
      for (int c = 0; c < chunks; c++) fn(ctx, c, 0);
      return;
    }
    std::lock_guard<std::mutex> one_job(run_m_);
    fn_ = fn;
    ctx_ = ctx;
    done_.store(0, std::memory_order_relaxed);
    const uint64_t gen = ++gens_ & 0xffffffffu;
    job_.store(gen << 32 | (uint64_t)chunks << 16, std::memory_order_release);
    if (sleeping_.load() > 0) {
      { std::lock_guard<std::mutex> lk(m_); }
      cv_.notify_all();
    }
    take(gen, 0);
    while (done_.load(std::memory_order_acquire) != chunks) relax();
  }

 private:
  static constexpr int SPIN_US = 300;

  // Runs chunks of job `gen` while it has any left.
  void take(uint64_t gen, int thread) {
    uint64_t v = job_.load(std::memory_order_acquire);
    for (;;) {
      if (v >> 32 != gen) return;
      const uint64_t chunks = v >> 16 & 0xffff, next = v & 0xffff;
      if (next >= chunks) return;
      if (job_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) {
        // The job cannot finish (and its fields change) before this chunk
        // is counted done.
        fn_(ctx_, static_cast<int>(next), thread);
        done_.fetch_add(1, std::memory_order_release);
        v = job_.load(std::memory_order_acquire);
      }
    }
  }

  void work(int index) {
    // The generation the pool was built with, not the job word's when this
    // thread first runs: a job may already have been published by then.
    uint64_t seen = 0;
    auto current = [this] { return job_.load(std::memory_order_acquire) >> 32; };
    for (;;) {
      auto since = std::chrono::steady_clock::now();
      int spins = 0;
      while (current() == seen) {
        relax();
        if (++spins % 256 == 0 &&
            std::chrono::steady_clock::now() - since > std::chrono::microseconds(SPIN_US)) {
          std::unique_lock<std::mutex> lk(m_);
          sleeping_.fetch_add(1);
          cv_.wait(lk, [&] { return current() != seen; });
          sleeping_.fetch_sub(1);
        }
      }
      seen = current();
      take(seen, index);
    }
  }

  int n_;
  std::mutex m_;
  std::mutex run_m_;  // one job at a time (several CPU streams may call)
  std::condition_variable cv_;
  // generation << 32 | chunks << 16 | next chunk
  std::atomic<uint64_t> job_{0};
  std::atomic<int> done_{0};
  std::atomic<int> sleeping_{0};
  uint64_t gens_ = 0;
  grove_cpu::ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
};

Pool& pool() {
  // Never destroyed (its threads are detached): MLX's stream threads may
  // still run a product while static destructors run at exit.
  static Pool* p = new Pool(thread_count());
  return *p;
}

}  // namespace

namespace grove_cpu {

int pool_size() {
  return pool().size();
}

void chunks(int n, ChunkFn fn, void* ctx) {
  pool().run(n, fn, ctx);
}

}  // namespace grove_cpu
