// Grove's CPU gated activations (act.h), included after attn_kernel.h in each
// per-instruction-set build (it uses that build's vector type and vexp).
//
// All run on whole vectors with MLX's exp polynomial (the exact GELU with
// MLX's erf over it, ungated); MLX 0.32's CPU ops
// compute them one value at a time, in 3 (SiLU) or 9 (GELU) passes over the
// arrays. tanh is 1 - 2 / (exp(2y) + 1) here (MLX calls std::tanh): the two
// differ by float32 rounding (about 1e-7 absolute).
#include "act.h"

namespace grove_qmm {
namespace GROVE_QMM_NS {

static inline vf sigmoid(vf x) {
  const vf ax = x < splat(0.0f) ? -x : x;
  const vf y = splat(1.0f) / (splat(1.0f) + vexp(ax));
  return x < splat(0.0f) ? y : splat(1.0f) - y;
}

static inline vf vtanh(vf y) {
  return splat(1.0f) - splat(2.0f) / (vexp(y + y) + splat(1.0f));
}

// MLX's erf (mlx/backend/cpu/simd/math.h: Abramowitz and Stegun 7.1.26
// through its exp, as PyTorch's vectorized erf), on a whole vector.
static inline vf verf(vf v) {
  const vf av = v < splat(0.0f) ? -v : v;
  const vf t = splat(1.0f) / (splat(0.3275911f) * av + splat(1.0f));
  vf r = splat(1.061405429f) * t + splat(-1.453152027f);
  r = r * t + splat(1.421413741f);
  r = r * t + splat(-0.284496736f);
  r = r * t + splat(0.254829592f);
  const vf e = -vexp(-v * v);
  const vf y = e * t * r + splat(1.0f);
  return v > splat(0.0f) ? y : -y;
}

static inline vf act_vector(int act, vf g, vf u) {
  if (act == ACT_SILU) return g * sigmoid(g) * u;
  if (act == ACT_GELU) {
    return g * (splat(1.0f) + verf(g / splat(1.4142135623730951f))) / splat(2.0f);
  }
  const vf cube = g * g * g;
  const vf inner = g + splat(0.044715f) * cube;
  const vf t = vtanh(splat(0.7978845608028654f) * inner);
  return splat(0.5f) * g * (splat(1.0f) + t) * u;
}

void gated(int act, const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + VL <= n; i += VL) store(out + i, act_vector(act, load(gate + i), load(up + i)));
  if (i < n) {
    float g[VL] = {}, u[VL] = {}, o[VL];
    std::memcpy(g, gate + i, (n - i) * sizeof(float));
    std::memcpy(u, up + i, (n - i) * sizeof(float));
    store(o, act_vector(act, load(g), load(u)));
    std::memcpy(out + i, o, (n - i) * sizeof(float));
  }
}

}  // namespace GROVE_QMM_NS
}  // namespace grove_qmm
