// Grove's quantized matmul for MLX's CPU backend, as an MLX primitive.
//
// `grove_cpu_qmm` (C, called from Rust beside mlx-c) builds an array whose
// primitive is `GroveQuantizedMatmul`, so the product stays in MLX's lazy
// graph like any other op: it is evaluated on the CPU stream's thread, in
// order with the ops around it, and its buffers are MLX's. Its `eval_cpu`
// splits the output rows over a small pool of threads that spin briefly
// between products (a decode step is hundreds of small products back to
// back) and then sleep; the kernel itself is qmm_kernel.h, built for AVX2+FMA,
// AVX-512 and the baseline, picked at first use (see pick_rows).
//
// Covered: MLX affine quantization, 4 or 8 bits, groups of 32/64/128, a
// float32 x, float32/float16/bfloat16 scales and biases, `x @ W^T` with W 2-D.
// Anything else makes `grove_cpu_qmm` return 1 and the caller uses MLX's op.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"
#include "mlx/primitives.h"
#include "qmm.h"

namespace {

using namespace mlx::core;
using grove_qmm::Args;

// ---- 1. The kernel build this CPU runs --------------------------------------

typedef void (*RowsFn)(const Args&, int, int, float*);

RowsFn pick_rows() {
  const char* forced = std::getenv("GROVE_CPU_ISA");
  const std::string want = forced ? forced : "";
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  // AVX-512 only when asked for: on the Xeon this was measured on, its build
  // was slower than AVX2's on every path (decode from memory 8.2 vs 8.8
  // Gweights/s per thread, from L2 11 vs 13, prefill 65 vs 85 GFLOP/s).
  if (avx512 && want == "avx512") return grove_qmm::avx512::rows;
  if (avx2 && want != "sse2") return grove_qmm::avx2::rows;
#endif
  return grove_qmm::base::rows;  // SSE2 on x86-64, NEON on arm64
}

RowsFn kernel_rows() {
  static const RowsFn chosen = pick_rows();
  return chosen;
}

// ---- 2. Threads ---------------------------------------------------------------

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
  template <class F>
  void run(int parts, F& part) {
    if (parts <= 1) {
      part(0);
      return;
    }
    std::lock_guard<std::mutex> one_job(run_m_);
    fn_ = [](void* ctx, int i) { (*static_cast<F*>(ctx))(i); };
    ctx_ = &part;
    parts_ = parts;
    pending_.store(parts - 1);
    gen_.fetch_add(1);
    if (sleeping_.load() > 0) {
      { std::lock_guard<std::mutex> lk(m_); }
      cv_.notify_all();
    }
    part(0);
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

// Splits the output rows over the pool: aligned to the kernel's 16-row blocks
// where there are enough rows, and not at all for products too small to pay
// for waking a thread.
void compute(const Args& a) {
  const int64_t macs = (int64_t)a.M * a.N * a.K;
  int parts = std::min(pool().size(), std::max(1, a.N / 16));
  if (macs < (1 << 16)) parts = 1;
  const int align = a.N >= 16 * parts ? 16 : 4;
  const int per = ((a.N + parts - 1) / parts + align - 1) / align * align;
  const RowsFn rows = kernel_rows();
  const long scratch = a.M >= 4 ? grove_qmm::scratch_floats(a) : 0;
  std::vector<float> buf(scratch * parts);
  auto part = [&](int i) {
    const int n0 = std::min(a.N, i * per), n1 = std::min(a.N, (i + 1) * per);
    if (n0 < n1) rows(a, n0, n1, buf.data() + scratch * i);
  };
  pool().run(parts, part);
}

// ---- 3. Reading MLX's arrays --------------------------------------------------

// The elements of `a` in row-major order: its own buffer when row-contiguous,
// else gathered into `tmp` by its strides.
template <class T>
const T* row_major(const array& a, std::vector<T>& tmp) {
  if (a.flags().row_contiguous) return a.data<T>();
  tmp.resize(a.size());
  const T* src = a.data<T>();
  const int nd = a.ndim();
  std::vector<int> idx(nd, 0);
  for (size_t i = 0; i < a.size(); i++) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) off += (int64_t)idx[d] * a.strides()[d];
    tmp[i] = src[off];
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < a.shape(d)) break;
      idx[d] = 0;
    }
  }
  return tmp.data();
}

// Scales or biases as stored (a row-major copy only when strided).
const void* scale_data(const array& a, std::vector<float>& f32, std::vector<uint16_t>& f16) {
  if (a.dtype() == float32) return row_major<float>(a, f32);
  return row_major<uint16_t>(a, f16);
}

int scale_type(Dtype d) {
  return d == float32 ? grove_qmm::F32 : d == float16 ? grove_qmm::F16 : grove_qmm::BF16;
}

// ---- 4. The primitive -----------------------------------------------------------

class GroveQuantizedMatmul : public UnaryPrimitive {
 public:
  GroveQuantizedMatmul(Stream s, int group_size, int bits)
      : UnaryPrimitive(s), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& encoder = cpu::get_command_encoder(stream());
    out.set_data(allocator::malloc(out.nbytes()));
    for (auto& in : inputs) encoder.set_input_array(in);
    encoder.set_output_array(out);
    encoder.dispatch([out = array::unsafe_weak_copy(out),
                      x = array::unsafe_weak_copy(inputs[0]),
                      w = array::unsafe_weak_copy(inputs[1]),
                      scales = array::unsafe_weak_copy(inputs[2]),
                      biases = array::unsafe_weak_copy(inputs[3]),
                      gs = group_size_, bits = bits_]() mutable {
      std::vector<float> xt, st, bt;
      std::vector<uint16_t> sh, bh;
      std::vector<uint32_t> wt;
      Args a;
      a.K = x.shape(-1);
      a.M = x.size() / std::max(a.K, 1);
      a.N = w.shape(0);
      a.bits = bits;
      a.group_size = gs;
      a.x = row_major<float>(x, xt);
      a.w = reinterpret_cast<const uint8_t*>(row_major<uint32_t>(w, wt));
      a.scales = scale_data(scales, st, sh);
      a.biases = scale_data(biases, bt, bh);
      a.scale_type = scale_type(scales.dtype());
      a.out = out.data<float>();
      if (a.M > 0 && a.N > 0) compute(a);
    });
  }

  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("[GroveQuantizedMatmul] runs on the CPU only");
  }

  const char* name() const override { return "GroveQuantizedMatmul"; }

  bool is_equivalent(const Primitive& other) const override {
    auto* o = dynamic_cast<const GroveQuantizedMatmul*>(&other);
    return o && o->group_size_ == group_size_ && o->bits_ == bits_;
  }

  std::vector<Shape> output_shapes(const std::vector<array>& inputs) override {
    Shape s = inputs[0].shape();
    s.back() = inputs[1].shape(0);
    return {s};
  }

 private:
  int group_size_;
  int bits_;
};

bool float_type(Dtype d) {
  return d == float32 || d == float16 || d == bfloat16;
}

}  // namespace

extern "C" {

// `*res = x @ dequant(w, scales, biases)^T` through Grove's CPU kernel on the
// CPU stream `s`. Returns 0 on success, 1 when the product is not one the
// kernel covers (then `*res` is untouched and the caller uses MLX's op), 2 on
// an error building the graph.
int grove_cpu_qmm(
    mlx_array* res,
    mlx_array x,
    mlx_array w,
    mlx_array scales,
    mlx_array biases,
    int group_size,
    int bits,
    mlx_stream s) {
  try {
    const Stream& stream = mlx_stream_get_(s);
    if (stream.device.type != Device::DeviceType::cpu) return 1;
    const array& xa = mlx_array_get_(x);
    const array& wa = mlx_array_get_(w);
    const array& sa = mlx_array_get_(scales);
    const array& ba = mlx_array_get_(biases);
    if (bits != 4 && bits != 8) return 1;
    if (group_size != 32 && group_size != 64 && group_size != 128) return 1;
    if (xa.dtype() != float32 || xa.ndim() < 1) return 1;
    if (wa.dtype() != uint32 || wa.ndim() != 2) return 1;
    const int64_t k = (int64_t)wa.shape(1) * 32 / bits;
    const int n = wa.shape(0);
    if (xa.shape(-1) != k || k % group_size != 0 || k > (1 << 30)) return 1;
    const Shape groups{n, static_cast<int>(k / group_size)};
    for (const array* p : {&sa, &ba}) {
      if (!float_type(p->dtype()) || p->shape() != groups) return 1;
    }
    if (sa.dtype() != ba.dtype()) return 1;
    Shape out_shape = xa.shape();
    out_shape.back() = n;
    array out(
        std::move(out_shape),
        float32,
        std::make_shared<GroveQuantizedMatmul>(stream, group_size, bits),
        {xa, wa, sa, ba});
    mlx_array_set_(*res, std::move(out));
    return 0;
  } catch (...) {
    return 2;
  }
}

}  // extern "C"
