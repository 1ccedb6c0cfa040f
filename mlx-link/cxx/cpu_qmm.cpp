// Grove's quantized matmul for MLX's CPU backend, as an MLX primitive.
//
// `grove_cpu_qmm` (C, called from Rust beside mlx-c) builds an array whose
// primitive is `GroveQuantizedMatmul`, so the product stays in MLX's lazy
// graph like any other op: it is evaluated on the CPU stream's thread, in
// order with the ops around it, and its buffers are MLX's. Its `eval_cpu`
// splits the output rows over Grove's CPU threads (pool.h); the kernel itself is qmm_kernel.h, built for AVX2+FMA,
// AVX-512 and the baseline, picked at first use (see pick_rows).
//
// Covered: MLX affine quantization, 4 or 8 bits, groups of 32/64/128, a
// float32 x, float32/float16/bfloat16 scales and biases, `x @ W^T` with W 2-D.
// Anything else makes `grove_cpu_qmm` return 1 and the caller uses MLX's op.
#include <algorithm>
#include <vector>

#include "mlx/array.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"
#include "mlx/primitives.h"
#include "arrays.h"
#include "isa.h"
#include "pool.h"
#include "qmm.h"

namespace {

using namespace mlx::core;
using grove_qmm::Args;

// ---- 1. The kernel build this CPU runs, and its threads-----------------------------------

typedef void (*RowsFn)(const Args&, int, int, float*);

RowsFn pick_rows() {
  switch (grove_cpu::cpu_isa()) {
#if defined(__x86_64__)
    case grove_cpu::Isa::Avx512: return grove_qmm::avx512::rows;
    case grove_cpu::Isa::Avx2: return grove_qmm::avx2::rows;
#endif
    default: return grove_qmm::base::rows;  // SSE2 on x86-64, NEON on arm64
  }
}

RowsFn kernel_rows() {
  static const RowsFn chosen = pick_rows();
  return chosen;
}

// Splits the output rows into chunks that the pool's threads take as they
// free up: aligned to the kernel's 16-row blocks, about 8 per thread (so a
// thread the OS runs late leaves little to wait for), and none for products
// too small to pay for waking a thread.
void compute(const Args& a) {
  const int64_t macs = (int64_t)a.M * a.N * a.K;
  const int threads = macs < (1 << 16) ? 1 : grove_cpu::pool_size();
  int rows = a.N;
  if (threads > 1) {
    const int want = (a.N + threads * 8 - 1) / (threads * 8);
    rows = std::min(a.N, std::max(16, (want + 15) / 16 * 16));
    rows = std::max(rows, (a.N + 65534) / 65535);
  }
  const int n = (a.N + rows - 1) / rows;
  const RowsFn fn = kernel_rows();
  const long scratch = a.M >= 4 ? grove_qmm::scratch_floats(a) : 0;
  std::vector<float> buf(scratch * grove_cpu::pool_size());
  auto part = [&](int c, int thread) {
    const int n0 = c * rows, n1 = std::min(a.N, n0 + rows);
    fn(a, n0, n1, buf.data() + scratch * thread);
  };
  if (threads == 1) {
    for (int c = 0; c < n; c++) part(c, 0);
  } else {
    grove_cpu::chunks(n, part);
  }
}

// ---- 2. Reading MLX's arrays --------------------------------------------------

// Scales or biases as stored (a row-major copy only when strided).
const void* scale_data(const array& a, std::vector<float>& f32, std::vector<uint16_t>& f16) {
  if (a.dtype() == float32) return grove_cpu::row_major<float>(a, f32);
  return grove_cpu::row_major<uint16_t>(a, f16);
}

int scale_type(Dtype d) {
  return d == float32 ? grove_qmm::F32 : d == float16 ? grove_qmm::F16 : grove_qmm::BF16;
}

// ---- 3. The primitive -----------------------------------------------------------

class GroveQuantizedMatmul : public UnaryPrimitive {
 public:
  GroveQuantizedMatmul(Stream s, int group_size, int bits)
      : UnaryPrimitive(s), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    grove_cpu::dispatch(stream(), inputs, out, [gs = group_size_, bits = bits_](
                                                   const std::vector<array>& in,
                                                   std::vector<array>& out) {
      const array &x = in[0], &w = in[1];
      std::vector<float> xt, st, bt;
      std::vector<uint16_t> sh, bh;
      std::vector<uint32_t> wt;
      Args a;
      a.K = x.shape(-1);
      a.M = x.size() / std::max(a.K, 1);
      a.N = w.shape(0);
      a.bits = bits;
      a.group_size = gs;
      a.x = grove_cpu::row_major<float>(x, xt);
      a.w = reinterpret_cast<const uint8_t*>(grove_cpu::row_major<uint32_t>(w, wt));
      a.scales = scale_data(in[2], st, sh);
      a.biases = scale_data(in[3], bt, bh);
      a.scale_type = scale_type(in[2].dtype());
      a.out = out[0].data<float>();
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
