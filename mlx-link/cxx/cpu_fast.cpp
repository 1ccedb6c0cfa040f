// Grove's CPU primitives for MLX's `fast` ops (RMS norm, rotary embedding,
// scaled dot-product attention) and for the MLPs' gated activations.
//
// On the CPU, MLX 0.32.2 runs none of these as one kernel: each is its
// fallback, a chain of ordinary ops (rms_norm 6, rope about 20 with its sines
// and cosines recomputed per call, attention about 9 with a full square of
// scores under a causal mask and a softmax whose exp runs one value at a
// time). Every op costs host time in MLX's scheduler, and a decode step of a
// 30-layer model runs thousands. Each primitive here is one node in MLX's lazy
// graph like MLX's own, evaluated on the CPU stream's thread; the attention
// kernel is attn_kernel.h (per instruction set), split over pool.h's threads.
//
// The results are MLX's fallbacks' within float32 rounding: the same
// operations in float32, in a different order where sums run in vector lanes.
// `grove_cpu_*` answer 1 (not covered: the caller uses MLX's op) for anything
// else: other dtypes, shapes, or a device other than the CPU.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "act.h"
#include "arrays.h"
#include "attn.h"
#include "isa.h"
#include "mlx/array.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"
#include "mlx/primitives.h"
#include "pool.h"

namespace {

using namespace mlx::core;
using grove_qmm::AttnArgs;

// ---- 1. Shared -----------------------------------------------------------------

// A primitive of this file: CPU only, compared by its parameters.
class CpuOnly : public UnaryPrimitive {
 public:
  explicit CpuOnly(Stream s) : UnaryPrimitive(s) {}
  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error(std::string("[") + name() + "] runs on the CPU only");
  }
  std::vector<Shape> output_shapes(const std::vector<array>& inputs) override {
    return {inputs[0].shape()};
  }
};

// A float32 array of 4 axes whose last is contiguous: its data and the
// strides of the first three (gathered into `tmp` when the last is strided).
const float* view4(const array& a, std::vector<float>& tmp, int64_t st[3]) {
  const float* p;
  if (a.strides()[3] == 1 || a.shape(3) == 1) {
    p = a.data<float>();
    for (int i = 0; i < 3; i++) st[i] = a.strides()[i];
  } else {
    p = grove_cpu::row_major<float>(a, tmp);
    st[2] = a.shape(3);
    st[1] = st[2] * a.shape(2);
    st[0] = st[1] * a.shape(1);
  }
  // An axis of length one may carry any stride; zero keeps indexing in bounds.
  for (int i = 0; i < 3; i++)
    if (a.shape(i) == 1) st[i] = 0;
  return p;
}

// Runs unit(u, thread) for u in [0, units) on the pool's threads when `work`
// (multiply-adds) is worth waking them for; `thread` (< pool_size()) names
// the thread's scratch.
template <class F>
void for_units(int units, int64_t work, F&& unit) {
  if (work < (1 << 16) || units == 1) {
    for (int u = 0; u < units; u++) unit(u, 0);
    return;
  }
  grove_cpu::chunks(units, unit);
}

// The AVX2 build of a kernel function where it runs (isa.h), else the
// baseline's.
template <class F>
F avx2_or_base(F avx2, F base) {
  return grove_cpu::cpu_isa() != grove_cpu::Isa::Base ? avx2 : base;
}
#if defined(__x86_64__)
#define BUILDS(f) grove_qmm::avx2::f, grove_qmm::base::f
#else
#define BUILDS(f) grove_qmm::base::f, grove_qmm::base::f
#endif

// ---- 2. RMS norm -----------------------------------------------------------------

// x * rsqrt(mean(x^2) + eps) * weight over the last axis, as MLX's fallback:
// the mean as sum * (1 / n), the weight applied after the normalisation.
class GroveRmsNorm : public CpuOnly {
 public:
  GroveRmsNorm(Stream s, float eps) : CpuOnly(s), eps_(eps) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    grove_cpu::dispatch(stream(), inputs, out,
             [eps = eps_](const std::vector<array>& in, std::vector<array>& outs) {
               const array& x = in[0];
               std::vector<float> xt, wt;
               const int n = x.shape(-1);
               const int64_t rows = n ? x.size() / n : 0;
               const float* xp = grove_cpu::row_major<float>(x, xt);
               const float* wp = in.size() > 1 ? grove_cpu::row_major<float>(in[1], wt) : nullptr;
               float* op = outs[0].data<float>();
               const float inv_n = 1.0f / n;
               const int64_t per = 16;
               for_units((rows + per - 1) / per, rows * n, [&](int u, int) {
                 for (int64_t r = u * per; r < std::min(rows, (u + 1) * per); r++) {
                   const float* xr = xp + r * n;
                   float* o = op + r * n;
                   float s[8] = {};
                   int i = 0;
                   for (; i + 8 <= n; i += 8)
                     for (int l = 0; l < 8; l++) s[l] += xr[i + l] * xr[i + l];
                   for (; i < n; i++) s[0] += xr[i] * xr[i];
                   const float ss = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
                   const float inv = 1.0f / std::sqrt(ss * inv_n + eps);
                   if (wp) {
                     for (int j = 0; j < n; j++) o[j] = (xr[j] * inv) * wp[j];
                   } else {
                     for (int j = 0; j < n; j++) o[j] = xr[j] * inv;
                   }
                 }
               });
             });
  }

  const char* name() const override { return "GroveRmsNorm"; }
  bool is_equivalent(const Primitive& other) const override {
    auto* o = dynamic_cast<const GroveRmsNorm*>(&other);
    return o && o->eps_ == eps_;
  }

 private:
  float eps_;
};

// ---- 3. Rotary embedding ---------------------------------------------------------

// x: [B, H, L, D]; offset: int32, one or one per batch row; inv_freqs:
// dims/2 float32 (1 / frequency, as MLX's fallback computes them). The angle
// of feature pair i at position t is ((t + offset) * scale) * inv_freqs[i].
class GroveRope : public CpuOnly {
 public:
  GroveRope(Stream s, int dims, bool traditional, float scale)
      : CpuOnly(s), dims_(dims), traditional_(traditional), scale_(scale) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    grove_cpu::dispatch(stream(), inputs, out,
             [dims = dims_, trad = traditional_, scale = scale_](const std::vector<array>& in,
                                                                  std::vector<array>& outs) {
               const array &x = in[0], &offset = in[1];
               std::vector<float> xt, it;
               std::vector<int32_t> ot;
               int64_t xs[3];
               const float* xp = view4(x, xt, xs);
               const int32_t* op = grove_cpu::row_major<int32_t>(offset, ot);
               const float* ip = grove_cpu::row_major<float>(in[2], it);
               const int B = x.shape(0), H = x.shape(1), L = x.shape(2), D = x.shape(3);
               const int half = dims / 2;
               const bool per_row = offset.size() > 1;
               float* o = outs[0].data<float>();
               std::vector<float> cs((size_t)L * half * 2);
               for (int b = 0; b < B; b++) {
                 if (b == 0 || per_row) {
                   const float off = static_cast<float>(op[per_row ? b : 0]);
                   for (int t = 0; t < L; t++) {
                     const float pos = (static_cast<float>(t) + off) * scale;
                     for (int i = 0; i < half; i++) {
                       const float theta = pos * ip[i];
                       cs[((size_t)t * half + i) * 2] = std::cos(theta);
                       cs[((size_t)t * half + i) * 2 + 1] = std::sin(theta);
                     }
                   }
                 }
                 for (int h = 0; h < H; h++) {
                   for (int t = 0; t < L; t++) {
                     const float* xr = xp + b * xs[0] + h * xs[1] + t * xs[2];
                     float* orow = o + (((int64_t)b * H + h) * L + t) * D;
                     const float* c = cs.data() + (size_t)t * half * 2;
                     for (int i = 0; i < half; i++) {
                       const int i1 = trad ? 2 * i : i, i2 = trad ? 2 * i + 1 : i + half;
                       const float x1 = xr[i1], x2 = xr[i2], co = c[2 * i], si = c[2 * i + 1];
                       orow[i1] = x1 * co - x2 * si;
                       orow[i2] = x1 * si + x2 * co;
                     }
                     for (int d = dims; d < D; d++) orow[d] = xr[d];
                   }
                 }
               }
             });
  }

  const char* name() const override { return "GroveRope"; }
  bool is_equivalent(const Primitive& other) const override {
    auto* o = dynamic_cast<const GroveRope*>(&other);
    return o && o->dims_ == dims_ && o->traditional_ == traditional_ && o->scale_ == scale_;
  }

 private:
  int dims_;
  bool traditional_;
  float scale_;
};

// ---- 4. Attention ----------------------------------------------------------------

typedef void (*RowsFn)(const AttnArgs&, int, int, float*);
typedef void (*TilesFn)(const AttnArgs&, int, int, int, int, float*);

RowsFn attention_rows_fn() {
  static const RowsFn chosen = avx2_or_base(BUILDS(attention_rows));
  return chosen;
}

TilesFn attention_tiles_fn() {
  static const TilesFn chosen = avx2_or_base(BUILDS(attention_tiles));
  return chosen;
}

// q: [B, Hq, Lq, D], k: [B, Hkv, Lk, D], v: [B, Hkv, Lk, Dv]; then the mask
// array (MASK_BOOL, MASK_ADD; broadcast to [B, Hq, Lq, Lk]) and the sinks.
class GroveAttention : public CpuOnly {
 public:
  GroveAttention(Stream s, float scale, int mask, bool sinks)
      : CpuOnly(s), scale_(scale), mask_(mask), sinks_(sinks) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    grove_cpu::dispatch(stream(), inputs, out,
             [scale = scale_, mask = mask_, has_sinks = sinks_](const std::vector<array>& in,
                                                                 std::vector<array>& outs) {
               const array &q = in[0], &k = in[1], &v = in[2];
               std::vector<float> qt, kt, vt, st;
               AttnArgs a{};
               a.q = view4(q, qt, a.qs);
               a.k = view4(k, kt, a.ks);
               a.v = view4(v, vt, a.vs);
               a.B = q.shape(0), a.Hq = q.shape(1), a.Lq = q.shape(2), a.D = q.shape(3);
               a.Hkv = k.shape(1), a.Lk = k.shape(2), a.Dv = v.shape(3);
               a.scale = scale;
               a.mask = mask;
               if (mask == grove_qmm::MASK_BOOL || mask == grove_qmm::MASK_ADD) {
                 // Right-aligned broadcast strides; 0 along broadcast axes.
                 const array& m = in[3];
                 const int nd = m.ndim();
                 const int full[4] = {a.B, a.Hq, a.Lq, a.Lk};
                 for (int i = 0; i < 4; i++) {
                   const int ax = nd - 4 + i;
                   a.ms[i] = ax >= 0 && m.shape(ax) == full[i] && full[i] > 1 ? m.strides()[ax] : 0;
                 }
                 a.m = mask == grove_qmm::MASK_BOOL ? static_cast<const void*>(m.data<uint8_t>())
                                                    : static_cast<const void*>(m.data<float>());
               }
               a.sinks = has_sinks ? grove_cpu::row_major<float>(in.back(), st) : nullptr;
               a.out = outs[0].data<float>();
               const bool rows = a.Lq < grove_qmm::ROW_PATH_MAX;
               const int64_t scratch = grove_qmm::attn_scratch_floats(a);
               std::unique_ptr<float[]> buf(new float[scratch * grove_cpu::pool_size()]);
               const int64_t work = (int64_t)a.B * a.Hq * a.Lq * a.Lk * a.D;
               if (rows) {
                 // Decode: one unit per query head.
                 const RowsFn fn = attention_rows_fn();
                 for_units(a.B * a.Hq, work, [&](int u, int thread) {
                   fn(a, u / a.Hq, u % a.Hq, buf.get() + scratch * thread);
                 });
                 return;
               }
               // Prompts: one unit per key/value head and 64 query positions;
               // later blocks see more keys, so they are handed out first.
               const TilesFn fn = attention_tiles_fn();
               const int qblocks = (a.Lq + grove_qmm::ATTN_QB - 1) / grove_qmm::ATTN_QB;
               for_units(a.B * a.Hkv * qblocks, work, [&](int u, int thread) {
                 const int qb = qblocks - 1 - u % qblocks, bg = u / qblocks;
                 const int q0 = qb * grove_qmm::ATTN_QB;
                 const int q1 = std::min(a.Lq, q0 + grove_qmm::ATTN_QB);
                 fn(a, bg / a.Hkv, bg % a.Hkv, q0, q1, buf.get() + scratch * thread);
               });
             });
  }

  const char* name() const override { return "GroveAttention"; }
  bool is_equivalent(const Primitive& other) const override {
    auto* o = dynamic_cast<const GroveAttention*>(&other);
    return o && o->scale_ == scale_ && o->mask_ == mask_ && o->sinks_ == sinks_;
  }
  std::vector<Shape> output_shapes(const std::vector<array>& inputs) override {
    Shape s = inputs[0].shape();
    s.back() = inputs[2].shape(3);
    return {s};
  }

 private:
  float scale_;
  int mask_;
  bool sinks_;
};

// ---- 5. Gated activations -------------------------------------------------------

typedef void (*GatedFn)(int, const float*, const float*, float*, int64_t);

GatedFn gated_fn() {
  static const GatedFn chosen = avx2_or_base(BUILDS(gated));
  return chosen;
}

// act(gate) * up elementwise (act.h), gate and up of one shape.
class GroveGated : public CpuOnly {
 public:
  GroveGated(Stream s, int act) : CpuOnly(s), act_(act) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    grove_cpu::dispatch(stream(), inputs, out,
             [act = act_](const std::vector<array>& in, std::vector<array>& outs) {
               std::vector<float> gt, ut;
               const float* gp = grove_cpu::row_major<float>(in[0], gt);
               const float* up = grove_cpu::row_major<float>(in[1], ut);
               float* op = outs[0].data<float>();
               const int64_t n = outs[0].size(), per = 1 << 14;
               const GatedFn fn = gated_fn();
               for_units((n + per - 1) / per, n * 8, [&](int c, int) {
                 const int64_t i = c * per;
                 fn(act, gp + i, up + i, op + i, std::min(per, n - i));
               });
             });
  }

  const char* name() const override { return "GroveGated"; }
  bool is_equivalent(const Primitive& other) const override {
    auto* o = dynamic_cast<const GroveGated*>(&other);
    return o && o->act_ == act_;
  }

 private:
  int act_;
};

bool on_cpu(mlx_stream s) {
  return mlx_stream_get_(s).device.type == Device::DeviceType::cpu;
}

// Wraps the primitive's output in `*res`.
int emit(mlx_array* res, array out) {
  mlx_array_set_(*res, std::move(out));
  return 0;
}

}  // namespace

extern "C" {

// `*res = rms_norm(x, weight, eps)` (weight when has_weight) on the CPU
// stream `s`: 0 done, 1 not covered (`*res` untouched), 2 an error.
int grove_cpu_rms_norm(mlx_array* res, mlx_array x, int has_weight, mlx_array weight, float eps,
                       mlx_stream s) {
  try {
    if (!on_cpu(s)) return 1;
    const array& xa = mlx_array_get_(x);
    if (xa.dtype() != float32 || xa.ndim() < 1 || xa.shape(-1) < 1) return 1;
    std::vector<array> inputs{xa};
    if (has_weight) {
      const array& wa = mlx_array_get_(weight);
      if (wa.dtype() != float32 || wa.ndim() != 1 || wa.shape(0) != xa.shape(-1)) return 1;
      inputs.push_back(wa);
    }
    const Stream& stream = mlx_stream_get_(s);
    return emit(res, array(xa.shape(), float32, std::make_shared<GroveRmsNorm>(stream, eps),
                           std::move(inputs)));
  } catch (...) {
    return 2;
  }
}

// `*res = rope(x, dims, traditional, scale, offset)` with 1 / frequency given
// (`inv_freqs`, dims/2 float32) on the CPU stream `s`; x is [B, H, L, D] and
// offset one int32 or one per batch row.
int grove_cpu_rope(mlx_array* res, mlx_array x, int dims, int traditional, float scale,
                   mlx_array offset, mlx_array inv_freqs, mlx_stream s) {
  try {
    if (!on_cpu(s)) return 1;
    const array& xa = mlx_array_get_(x);
    const array& oa = mlx_array_get_(offset);
    const array& ia = mlx_array_get_(inv_freqs);
    if (xa.dtype() != float32 || xa.ndim() != 4) return 1;
    if (dims <= 0 || dims % 2 != 0 || dims > xa.shape(3)) return 1;
    if (oa.dtype() != int32 || oa.ndim() > 1 || (oa.size() != 1 && oa.size() != (size_t)xa.shape(0)))
      return 1;
    if (ia.dtype() != float32 || ia.ndim() != 1 || ia.shape(0) != dims / 2) return 1;
    const Stream& stream = mlx_stream_get_(s);
    return emit(res, array(xa.shape(), float32,
                           std::make_shared<GroveRope>(stream, dims, traditional != 0, scale),
                           {xa, oa, ia}));
  } catch (...) {
    return 2;
  }
}

// `*res = scaled_dot_product_attention(q, k, v, scale, mask, sinks)` on the
// CPU stream `s`. mask_kind: 0 none, 1 causal, 2 the array `mask` (bool or
// float32, broadcastable to [B, Hq, Lq, Lk]); sinks when has_sinks.
int grove_cpu_sdpa(mlx_array* res, mlx_array q, mlx_array k, mlx_array v, float scale,
                   int mask_kind, mlx_array mask, int has_sinks, mlx_array sinks, mlx_stream s) {
  try {
    if (!on_cpu(s)) return 1;
    const array& qa = mlx_array_get_(q);
    const array& ka = mlx_array_get_(k);
    const array& va = mlx_array_get_(v);
    for (const array* t : {&qa, &ka, &va})
      if (t->dtype() != float32 || t->ndim() != 4) return 1;
    const int B = qa.shape(0), Hq = qa.shape(1), Lq = qa.shape(2), D = qa.shape(3);
    const int Hkv = ka.shape(1), Lk = ka.shape(2), Dv = va.shape(3);
    if (ka.shape(0) != B || va.shape(0) != B || ka.shape(3) != D || va.shape(1) != Hkv ||
        va.shape(2) != Lk)
      return 1;
    if (Hkv < 1 || Hq % Hkv != 0 || D % 8 != 0 || Dv % 8 != 0 || Lk < 1) return 1;
    std::vector<array> inputs{qa, ka, va};
    int kind = grove_qmm::MASK_NONE;
    if (mask_kind == 1) {
      if (Lk < Lq) return 1;
      kind = grove_qmm::MASK_CAUSAL;
    } else if (mask_kind == 2) {
      const array& ma = mlx_array_get_(mask);
      if (ma.dtype() != bool_ && ma.dtype() != float32) return 1;
      if (ma.ndim() > 4) return 1;
      const int full[4] = {B, Hq, Lq, Lk};
      for (int i = 0; i < ma.ndim(); i++) {
        const int want = full[4 - ma.ndim() + i];
        if (ma.shape(i) != want && ma.shape(i) != 1) return 1;
      }
      kind = ma.dtype() == bool_ ? grove_qmm::MASK_BOOL : grove_qmm::MASK_ADD;
      inputs.push_back(ma);
    }
    if (has_sinks) {
      const array& sa = mlx_array_get_(sinks);
      if (sa.dtype() != float32 || sa.ndim() != 1 || sa.shape(0) != Hq) return 1;
      inputs.push_back(sa);
    }
    const Stream& stream = mlx_stream_get_(s);
    return emit(res, array(Shape{B, Hq, Lq, Dv}, float32,
                           std::make_shared<GroveAttention>(stream, scale, kind, has_sinks != 0),
                           std::move(inputs)));
  } catch (...) {
    return 2;
  }
}

// `*res = act(gate) * up` (act: grove_qmm::Activation) on the CPU stream `s`.
int grove_cpu_gated(mlx_array* res, int act, mlx_array gate, mlx_array up, mlx_stream s) {
  try {
    if (!on_cpu(s)) return 1;
    if (act != grove_qmm::ACT_SILU && act != grove_qmm::ACT_GELU_APPROX &&
        act != grove_qmm::ACT_GELU)
      return 1;
    const array& ga = mlx_array_get_(gate);
    const array& ua = mlx_array_get_(up);
    if (ga.dtype() != float32 || ua.dtype() != float32 || ga.shape() != ua.shape()) return 1;
    const Stream& stream = mlx_stream_get_(s);
    return emit(res, array(ga.shape(), float32, std::make_shared<GroveGated>(stream, act),
                           {ga, ua}));
  } catch (...) {
    return 2;
  }
}

}  // extern "C"
