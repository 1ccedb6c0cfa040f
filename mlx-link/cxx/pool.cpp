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

// Workers 1..n-1 (the caller is part 0). A job is published by bumping `gen`;
// each worker runs its part and decrements `pending`. Idle workers spin for
// SPIN_US after their last part, then sleep on the condition variable. The
// pool lives as long as the process (see pool()).
class Pool {
 public:
  explicit Pool(int n) : n_(n) {
    for (int i = 1; i < n_; i++) std::thread([this, i] { work(i); }).detach();
  }
  int size() const { return n_; }

  // Runs part(i) for i in [0, parts) with parts <= size(); returns when all
  // ran. The job is a plain function and context pointer: nothing is
  // allocated per product (a decode step runs hundreds).
  void run(int parts, void (*fn)(void*, int), void* ctx) {
    if (parts <= 1) {
      fn(ctx, 0);
      return;
    }
    std::lock_guard<std::mutex> one_job(run_m_);
    fn_ = fn;
    ctx_ = ctx;
    parts_ = parts;
    pending_.store(parts - 1);
    gen_.fetch_add(1);
    if (sleeping_.load() > 0) {
      { std::lock_guard<std::mutex> lk(m_); }
      cv_.notify_all();
    }
    fn(ctx, 0);
    while (pending_.load(std::memory_order_acquire) != 0) relax();
  }

 private:
  static constexpr int SPIN_US = 300;

  void work(int index) {
    // The generation the pool was built with, not gen_'s value when this
    // thread first runs: a job may already have been published by then.
    uint64_t seen = 0;
    for (;;) {
      auto since = std::chrono::steady_clock::now();
      int spins = 0;
      while (gen_.load(std::memory_order_acquire) == seen) {
        relax();
        if (++spins % 256 == 0 &&
            std::chrono::steady_clock::now() - since > std::chrono::microseconds(SPIN_US)) {
          std::unique_lock<std::mutex> lk(m_);
          sleeping_.fetch_add(1);
          cv_.wait(lk, [&] { return gen_.load() != seen; });
          sleeping_.fetch_sub(1);
        }
      }
      seen = gen_.load();
      if (index < parts_) {
        fn_(ctx_, index);
        pending_.fetch_sub(1, std::memory_order_release);
      }
    }
  }

  int n_;
  std::mutex m_;
  std::mutex run_m_;  // one job at a time (several CPU streams may call)
  std::condition_variable cv_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleeping_{0};
  void (*fn_)(void*, int) = nullptr;
  void* ctx_ = nullptr;
  int parts_ = 0;
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

void parallel(int parts, void (*fn)(void*, int), void* ctx) {
  pool().run(parts, fn, ctx);
}

}  // namespace grove_cpu
