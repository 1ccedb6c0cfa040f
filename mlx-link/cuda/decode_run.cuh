// How Grove's CUDA decode step (decode.cu) runs a step's kernels in order
// on a stream, from a plan (decode_plan.h): the products' arguments, a layer
// of routed experts, and the whole step. Included by decode.cu only (its
// anonymous namespace is that file's).
#pragma once
#include <cuda_runtime.h>

#include <vector>

#include "decode_kernels.cuh"
#include "decode_launch.cuh"
#include "decode_moe.cuh"
#include "decode_plan.h"
#include "mlx/array.h"

namespace {

// ---- Launching ------------------------------------------------------------------

// The shared memory a product's block may take for its rows of x without
// asking for more (48 KiB): it bounds the rows a step takes (Plan::max_rows).
// Past it (Llama-8B at 8 rows: 235 tok/s against 685 for mlx-lm, measured
// on an H100), MLX's step is faster. With routed experts MLX's step is
// much slower (its gather products cost the host ~8 ms a step), so there
// the rows may take 96 KiB: Qwen3-30B-A3B 4-bit, 8 streams (H100,
// gpu_batched.sh, one run): 505.8 tok/s against 307.2 at 48 KiB, whose 5
// rows left 8-row batches to MLX's step (mlx-lm 261.0). GROVE_FD_X_KIB
// changes both.
constexpr size_t kXBytes = 48 * 1024;
constexpr size_t kXBytesExperts = 96 * 1024;

// x [rows, k] @ w^T -> out [rows, n], the rows packed (k and n apart); a
// fused RMS norm of x where `norm` is given. Stacked matrices (q/k/v) and
// the gate/up pair set w[1], w[2] (and their scales) and seg after.
GemvArgs product(const void* x, int k, const Mat& w, int n, void* out, const void* norm = nullptr,
                 float eps = 0.f) {
  GemvArgs g{};
  g.x = x;
  g.x_stride = k;
  g.k = k;
  g.norm = norm;
  g.eps = eps;
  g.seg[0] = g.seg[1] = n;
  g.n = n;
  g.out = out;
  g.out_stride = n;
  g.gs = w.gs;
  g.gs_log2 = w.gs == 0 ? 0 : __builtin_ctz(static_cast<unsigned>(w.gs));
  g.w[0] = ptr(w.w);
  if (w.bits != 0) {
    g.scales[0] = ptr(w.scales);
    g.biases[0] = ptr(w.biases);
  }
  return g;
}

// Adds matrix `w` as the i-th of a stacked product.
void stack(GemvArgs& g, int i, const Mat& w) {
  g.w[i] = ptr(w.w);
  if (w.bits != 0) {
    g.scales[i] = ptr(w.scales);
    g.biases[i] = ptr(w.biases);
  }
}

// Steps 4 and 5 of a layer of routed experts (decode_moe.cuh): each row's
// h += its top_k picked experts' SiLU MLPs of norm(h), weighted by their
// routing scores.
template <class T>
void moe_layer(const Plan& p, int rows, const std::vector<Mat>& w, const std::vector<array>& v, cudaStream_t s) {
  using namespace grove_fd;
  const Dims& d = p.d;
  const int pairs = rows * d.top_k;
  // 4a. the router's logits of norm(h)
  gemv_rows<T>(rows, kStore, true, w[kWr].bits, false, p.tcs,
               product(p.h, d.hidden, w[kWr], d.experts, p.rlog, ptr(v[kLn2]), d.rms_eps), s);
  // 4b. the picks and their scores
  launch(pdl, route<T>, dim3(rows), dim3(256), d.experts * sizeof(float), s, static_cast<const T*>(p.rlog),
         d.experts, d.top_k, d.moe_normalize, p.sel, p.score);
  p.prof.mark(s, Profile::kRoute);
  // 4c. act[pair] = silu(norm(h[row]) @ Wg[e]^T) * (norm(h[row]) @ Wu[e]^T)
  GemvArgs m = product(p.h, d.hidden, w[kWg], d.intermediate, p.act, ptr(v[kLn2]), d.rms_eps);
  stack(m, 1, w[kWu]);
  m.experts = p.sel;
  m.x_div = d.top_k;
  launch_experts<T>(kGlu, w[kWg].bits, m, pairs, s);
  p.prof.mark(s, Profile::kGlu);
  // 4d. ys[pair] = act[pair] @ Wd[e]^T
  GemvArgs dn = product(p.act, d.intermediate, w[kWd], d.hidden, p.ys);
  dn.experts = p.sel;
  dn.x_div = 1;
  launch_experts<T>(kStore, w[kWd].bits, dn, pairs, s);
  // 5. h += sum over the row's picks of score * ys[pair]
  launch(pdl, combine<T>, dim3((d.hidden + 255) / 256, rows), dim3(256), 0, s, static_cast<const T*>(p.ys),
         static_cast<const float*>(p.score), d.top_k, d.hidden, static_cast<T*>(p.h));
  p.prof.mark(s, Profile::kDown);
}

// The kernels of one step for `rows` rows: tokens -> logits, writing slot
// idx of the caches; everything that changes per step is read from
// p.params, so the launches can be captured once and replayed.
template <class T>
void run_step(const Plan& p, int rows, cudaStream_t s) {
  using namespace grove_fd;
  const Dims& d = p.d;
  if (p.embed.bits == 0)
    grove_fd::embed<T><<<rows, 256, 0, s>>>(p.params, static_cast<const T*>(ptr(p.embed.w)), d.vocab,
                                            d.hidden, static_cast<T*>(p.h));
  else if (p.embed.bits == 4)
    grove_fd::embed_q<T, 4><<<rows, 256, 0, s>>>(
        p.params, static_cast<const uint32_t*>(ptr(p.embed.w)), static_cast<const T*>(ptr(p.embed.scales)),
        static_cast<const T*>(ptr(p.embed.biases)), d.vocab, d.hidden, p.embed.gs, static_cast<T*>(p.h));
  else
    grove_fd::embed_q<T, 8><<<rows, 256, 0, s>>>(
        p.params, static_cast<const uint32_t*>(ptr(p.embed.w)), static_cast<const T*>(ptr(p.embed.scales)),
        static_cast<const T*>(ptr(p.embed.biases)), d.vocab, d.hidden, p.embed.gs, static_cast<T*>(p.h));
  p.prof.mark(s, Profile::kEmbed);
  const int q_rows = d.heads * d.head_dim, kv_rows = d.kv_heads * d.head_dim;
  const bool tc = rows >= p.tc_rows;  // the products on tensor cores
  for (int l = 0; l < d.layers; l++) {
    const std::vector<Mat>& w = p.mats[l];
    const std::vector<array>& v = p.vecs[l];
    // 1. q, k, v = norm(h) @ [Wq; Wk; Wv]^T
    GemvArgs g = product(p.h, d.hidden, w[kWq], p.qkv_width(), p.qkv, ptr(v[kLn1]), d.rms_eps);
    stack(g, 1, w[kWk]);
    stack(g, 2, w[kWv]);
    g.seg[0] = q_rows;
    g.seg[1] = q_rows + kv_rows;
    gemv_rows<T>(rows, kStore, true, w[kWq].bits, tc, p.tcs, g, s);
    p.prof.mark(s, Profile::kQkv);
    // 2. attention of the new token, written into slot idx
    AttnArgs a{};
    a.qkv = p.qkv;
    a.qkv_stride = p.qkv_width();
    a.q_norm = d.qk_norm ? ptr(v[kQn]) : nullptr;
    a.k_norm = d.qk_norm ? ptr(v[kKn]) : nullptr;
    a.qk_eps = d.qk_eps;
    a.freqs = d.has_freqs ? static_cast<const float*>(ptr(p.freqs)) : nullptr;
    a.log2_base = d.log2_base;
    a.rope_scale = d.rope_scale;
    a.sp = p.params;
    a.layer = l;
    a.heads = d.heads;
    a.kv_heads = d.kv_heads;
    a.scale = d.scale;
    a.part = p.part;
    a.arrived = p.arrived;
    a.out = p.att;
    a.out_stride = q_rows;
    launch_attend<T>(a, rows, d.head_dim, s);
    p.prof.mark(s, Profile::kAttend);
    // 3. h += att @ Wo^T
    gemv_rows<T>(rows, kResidual, false, w[kWo].bits, tc, p.tcs, product(p.att, q_rows, w[kWo], d.hidden, p.h),
                 s);
    p.prof.mark(s, Profile::kO);
    if (d.experts > 0) {
      moe_layer<T>(p, rows, w, v, s);
      continue;
    }
    // 4. act = silu(norm(h) @ Wg^T) * (norm(h) @ Wu^T)
    GemvArgs m = product(p.h, d.hidden, w[kWg], d.intermediate, p.act, ptr(v[kLn2]), d.rms_eps);
    stack(m, 1, w[kWu]);
    gemv_rows<T>(rows, kGlu, true, w[kWg].bits, tc, p.tcs, m, s);
    p.prof.mark(s, Profile::kGlu);
    // 5. h += act @ Wd^T
    gemv_rows<T>(rows, kResidual, false, w[kWd].bits, tc, p.tcs,
                 product(p.act, d.intermediate, w[kWd], d.hidden, p.h), s);
    p.prof.mark(s, Profile::kDown);
  }
  // logits = norm(h) @ head^T, into the step's logits array
  const Mat& head = d.tied ? p.embed : p.head;
  GemvArgs hd = product(p.h, d.hidden, head, d.vocab, nullptr, ptr(p.final_norm), d.rms_eps);
  hd.out_ref = &p.params->logits;
  gemv_rows<T>(rows, kStore, true, head.bits, tc, p.tcs, hd, s);
  p.prof.mark(s, Profile::kHead);
  check(cudaGetLastError(), "launch");
}

}  // namespace
