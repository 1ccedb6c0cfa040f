// Gated activations for Grove's CPU kernel (act_kernel.h): out = act(gate) * up
// elementwise, as mlx-lm's MLPs compute them, with the entry points of the
// per-instruction-set builds.
#pragma once
#include <cstdint>

namespace grove_qmm {

enum Activation {
  // gate * sigmoid(gate), MLX's sigmoid: y = 1 / (1 + exp(|x|)), x < 0 ? y : 1 - y.
  ACT_SILU = 0,
  // mlx's nn.gelu_approx: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  ACT_GELU_APPROX = 1,
  // mlx's nn.gelu (exact, BERT's): x (1 + erf(x / sqrt(2))) / 2, with MLX's
  // erf; not gated: `up` is not read.
  ACT_GELU = 2,
};

namespace avx2 {
void gated(int act, const float* gate, const float* up, float* out, int64_t n);
}
namespace base {
void gated(int act, const float* gate, const float* up, float* out, int64_t n);
}

}  // namespace grove_qmm
