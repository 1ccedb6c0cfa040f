// Grove's CPU attention kernel (attn.h), included after qmm_kernel.h in each
// per-instruction-set build (it uses that build's vector type and helpers).
//
// It computes what MLX's scaled_dot_product_attention computes on the CPU
// (scores of the scaled queries, the mask, a float32 softmax with the max
// subtracted and MLX's own exp polynomial, the weighted sum of values) with
// two differences of order only: the sums run in vector lanes, and the
// weighted sum is divided by the softmax's sum at the end instead of each
// weight first. It never computes what a causal mask hides, and the exp runs
// on whole vectors (MLX 0.32's CPU softmax calls it one value at a time).
//
// Two paths:
// - fewer than ROW_PATH_MAX query positions (decode): one query head at a
//   time (units enough to balance threads at batch 1), four keys scored per
//   load of the query and the weighted values summed in registers;
// - more (prompts): the unit's keys are transposed once into scratch, then
//   tiles of ATTN_TILE queries by 16 keys are scored in registers, and the
//   values are summed into tiles of ATTN_TILE queries by 4 vectors.
#include <cmath>
#include <cfloat>

#include "attn.h"

namespace grove_qmm {
namespace GROVE_QMM_NS {

typedef int32_t vi __attribute__((vector_size(VL * 4)));

static inline void store(float* p, vf v) {
  std::memcpy(p, &v, sizeof(v));
}

static inline vf vfloor(vf x) {
  const vf t = __builtin_convertvector(__builtin_convertvector(x, vi), vf);
  return t > x ? t - splat(1.0f) : t;
}

// MLX's exp (mlx/backend/cpu/simd/math.h: Cephes' polynomial for 2^f, the
// exponent by bit shifting), on a whole vector.
static inline vf vexp(vf x0) {
  // Clamped for the integer conversion only; the range is fixed below.
  vf xc = x0 < splat(-100.0f) ? splat(-100.0f) : x0;
  xc = xc > splat(100.0f) ? splat(100.0f) : xc;
  const vf x = xc * splat(1.442695f);
  const vf ip = vfloor(x + splat(0.5f));
  const vf f = x - ip;
  vf p = splat(1.535336188319500e-4f);
  p = p * f + splat(1.339887440266574e-3f);
  p = p * f + splat(9.618437357674640e-3f);
  p = p * f + splat(5.550332471162809e-2f);
  p = p * f + splat(2.402264791363012e-1f);
  p = p * f + splat(6.931472028550421e-1f);
  p = p * f + splat(1.0f);
  const vi e = (__builtin_convertvector(ip, vi) + 127) << 23;
  vf two;
  std::memcpy(&two, &e, sizeof(two));
  vf r = two * p;
  r = x0 > splat(88.0f) ? splat(INFINITY) : r;
  r = x0 < splat(-88.0f) ? splat(0.0f) : r;
  return r;
}

static inline float vmax_lanes(vf v) {
  float m = v[0];
  for (int i = 1; i < VL; i++) m = v[i] > m ? v[i] : m;
  return m;
}

// The mask's effect on scores s[0..n) (keys j0 + 0..n) of query i of head h
// in batch row b.
static inline void apply_mask(const AttnArgs& a, int b, int h, int i, float* s, int n,
                              int j0 = 0) {
  const int64_t base = b * a.ms[0] + h * a.ms[1] + i * a.ms[2] + j0 * a.ms[3];
  if (a.mask == MASK_BOOL) {
    const uint8_t* m = static_cast<const uint8_t*>(a.m) + base;
    for (int j = 0; j < n; j++)
      if (!m[j * a.ms[3]]) s[j] = -FLT_MAX;
  } else if (a.mask == MASK_ADD) {
    const float* m = static_cast<const float*>(a.m) + base;
    for (int j = 0; j < n; j++) s[j] += m[j * a.ms[3]];
  }
}

// Scores s[0..n) become exp(s - max) (max over them and the sink), s[n..end)
// zero, where end = pad(n, VL) <= the row's allocation; returns the sum.
static inline float softmax_row(float* s, int n, const float* sink) {
  const int end = (int)attn_pad(n, VL);
  for (int j = n; j < end; j++) s[j] = -INFINITY;
  vf mv = splat(-INFINITY);
  for (int j = 0; j < end; j += VL) {
    const vf x = load(s + j);
    mv = x > mv ? x : mv;
  }
  float m = vmax_lanes(mv);
  if (sink && *sink > m) m = *sink;
  vf sum = vf{};
  for (int j = 0; j < end; j += VL) {
    const vf e = vexp(load(s + j) - splat(m));
    store(s + j, e);
    sum += e;
  }
  float total = hsum(sum);
  if (sink) total += vexp(splat(*sink - m))[0];
  return total;
}

static inline float dot(const float* x, const float* y, int d) {
  vf s0 = vf{}, s1 = vf{};
  int k = 0;
  for (; k + 2 * VL <= d; k += 2 * VL) {
    s0 += load(x + k) * load(y + k);
    s1 += load(x + k + VL) * load(y + k + VL);
  }
  for (; k < d; k += VL) s0 += load(x + k) * load(y + k);
  return hsum(s0 + s1);
}

// Four keys' scores at once (keys k, k + ks, k + 2 ks, k + 3 ks): each
// load of q serves four products.
static inline void dot4(const float* q, const float* k, int64_t ks, int d, float* out) {
  vf s0 = vf{}, s1 = vf{}, s2 = vf{}, s3 = vf{};
  for (int x = 0; x < d; x += VL) {
    const vf qv = load(q + x);
    s0 += qv * load(k + x);
    s1 += qv * load(k + ks + x);
    s2 += qv * load(k + 2 * ks + x);
    s3 += qv * load(k + 3 * ks + x);
  }
  out[0] = hsum(s0);
  out[1] = hsum(s1);
  out[2] = hsum(s2);
  out[3] = hsum(s3);
}

// out[c0 .. c0 + NC*VL) = inv * sum_{j < n} p[j] * v[j][c0 ..), the sums in
// registers.
template <int NC>
static inline void weighted_values(const float* p, const float* v, int64_t vs, int n, int c0,
                                   float inv, float* out) {
  vf acc[NC];
  for (int c = 0; c < NC; c++) acc[c] = vf{};
  for (int j = 0; j < n; j++) {
    const vf pj = splat(p[j]);
    const float* vj = v + j * vs + c0;
    for (int c = 0; c < NC; c++) acc[c] += pj * load(vj + c * VL);
  }
  for (int c = 0; c < NC; c++) store(out + c0 + c * VL, acc[c] * splat(inv));
}

// Decode: query head h at its (fewer than ROW_PATH_MAX) positions.
static void row_path(const AttnArgs& a, int b, int h, float* scratch) {
  const int g = h / (a.Hq / a.Hkv), off = a.Lk - a.Lq;
  const int64_t lk = attn_pad(a.Lk, 16);
  float* s = scratch;  // lk
  float* Q = s + lk;   // D
  const float* kb = a.k + b * a.ks[0] + g * a.ks[1];
  const float* vb = a.v + b * a.vs[0] + g * a.vs[1];
  for (int i = 0; i < a.Lq; i++) {
    const float* q = a.q + b * a.qs[0] + h * a.qs[1] + i * a.qs[2];
    for (int d = 0; d < a.D; d++) Q[d] = q[d] * a.scale;
    const int lim = a.mask == MASK_CAUSAL ? i + off + 1 : a.Lk;
    int j = 0;
    for (; j + 4 <= lim; j += 4) dot4(Q, kb + j * a.ks[2], a.ks[2], a.D, s + j);
    for (; j < lim; j++) s[j] = dot(Q, kb + j * a.ks[2], a.D);
    apply_mask(a, b, h, i, s, lim);
    const float inv = 1.0f / softmax_row(s, lim, a.sinks ? a.sinks + h : nullptr);
    float* out = a.out + (((int64_t)b * a.Hq + h) * a.Lq + i) * a.Dv;
    for (int c0 = 0; c0 < a.Dv; c0 += 4 * VL) {
      switch ((a.Dv - c0) / VL < 4 ? (a.Dv - c0) / VL : 4) {
        case 4: weighted_values<4>(s, vb, a.vs[2], lim, c0, inv, out); break;
        case 3: weighted_values<3>(s, vb, a.vs[2], lim, c0, inv, out); break;
        case 2: weighted_values<2>(s, vb, a.vs[2], lim, c0, inv, out); break;
        default: weighted_values<1>(s, vb, a.vs[2], lim, c0, inv, out); break;
      }
    }
  }
}

// S[r][j0..j0+16) = Q[r] . Kt[:, j0..j0+16) for the tile's ATTN_TILE rows.
static inline void score_tile(const float* Q, const float* Kt, int64_t lk, int D, int j0,
                              float* S) {
  constexpr int NV = 16 / VL > 0 ? 16 / VL : 1;
  vf acc[ATTN_TILE][NV];
  for (int r = 0; r < ATTN_TILE; r++)
    for (int c = 0; c < NV; c++) acc[r][c] = vf{};
  for (int d = 0; d < D; d++) {
    vf kv[NV];
    for (int c = 0; c < NV; c++) kv[c] = load(Kt + d * lk + j0 + c * VL);
    for (int r = 0; r < ATTN_TILE; r++) {
      const vf qv = splat(Q[r * D + d]);
      for (int c = 0; c < NV; c++) acc[r][c] += qv * kv[c];
    }
  }
  for (int r = 0; r < ATTN_TILE; r++)
    for (int c = 0; c < NV; c++) store(S + r * lk + j0 + c * VL, acc[r][c]);
}

// O[r][c0..c0+NC*VL) = sum_j S[r][j] * V[j][c0..) for the tile's rows.
template <int NC>
static inline void value_tile(const float* S, int64_t lk, const float* vb, int64_t vstride,
                              int kt, int c0, vf (*acc)[4]) {
  for (int r = 0; r < ATTN_TILE; r++)
    for (int c = 0; c < NC; c++) acc[r][c] = vf{};
  for (int j = 0; j < kt; j++) {
    const float* vj = vb + j * vstride + c0;
    vf vv[NC];
    for (int c = 0; c < NC; c++) vv[c] = load(vj + c * VL);
    for (int r = 0; r < ATTN_TILE; r++) {
      const vf p = splat(S[r * lk + j]);
      for (int c = 0; c < NC; c++) acc[r][c] += p * vv[c];
    }
  }
}

// The keys a boolean mask lets the tile's rows (queries i0 .. i0 + nr of
// head h) see: [*jb, *je) from the 16-key block of the first allowed to the
// last allowed plus one; unchanged (all keys) when some row allows none.
static void bool_span(const AttnArgs& a, int b, int h, int i0, int nr, int* jb, int* je) {
  int lo = a.Lk, hi = 0;
  for (int r = 0; r < nr; r++) {
    const uint8_t* m = static_cast<const uint8_t*>(a.m) + b * a.ms[0] + h * a.ms[1] +
                       (i0 + r) * a.ms[2];
    int first = -1, last = -1;
    for (int j = 0; j < a.Lk; j++) {
      if (m[j * a.ms[3]]) {
        if (first < 0) first = j;
        last = j;
      }
    }
    if (first < 0) return;
    lo = first < lo ? first : lo;
    hi = last + 1 > hi ? last + 1 : hi;
  }
  *jb = lo / 16 * 16;
  *je = hi;
}

// Prompts: positions [q0, q1) of every head of group g.
static void tiled_path(const AttnArgs& a, int b, int g, int q0, int q1, float* scratch) {
  const int rep = a.Hq / a.Hkv, off = a.Lk - a.Lq;
  const bool causal = a.mask == MASK_CAUSAL;
  const int64_t lk = attn_pad(a.Lk, 16);
  const int kunit = causal ? q1 + off : a.Lk;  // keys any query of the unit sees
  float* Kt = scratch;             // D x lk
  float* S = Kt + a.D * lk;        // ATTN_TILE x lk
  float* Q = S + ATTN_TILE * lk;   // ATTN_TILE x D
  // 1. Keys transposed: Kt[d][j] = k[j][d], zero past the unit's keys.
  const float* kb = a.k + b * a.ks[0] + g * a.ks[1];
  const int kpad = (int)attn_pad(kunit, 16);
  for (int j = 0; j < kpad; j++) {
    const float* kj = kb + j * a.ks[2];
    for (int d = 0; d < a.D; d++) Kt[d * lk + j] = j < kunit ? kj[d] : 0.0f;
  }
  const float* vb = a.v + b * a.vs[0] + g * a.vs[1];
  for (int hr = 0; hr < rep; hr++) {
    const int h = g * rep + hr;
    for (int i0 = q0; i0 < q1; i0 += ATTN_TILE) {
      const int nr = q1 - i0 < ATTN_TILE ? q1 - i0 : ATTN_TILE;
      // 2. The tile's scaled queries (rows past the end repeat the last).
      int lim[ATTN_TILE];
      for (int r = 0; r < ATTN_TILE; r++) {
        const int i = i0 + (r < nr ? r : nr - 1);
        const float* q = a.q + b * a.qs[0] + h * a.qs[1] + i * a.qs[2];
        for (int d = 0; d < a.D; d++) Q[r * a.D + d] = q[d] * a.scale;
        lim[r] = causal ? i + off + 1 : a.Lk;
      }
      const int kt = lim[ATTN_TILE - 1];
      // Keys [jb, kt) are scored: all of them, but under a boolean mask only
      // from the block of the tile's first allowed key to its last (a
      // sliding window's mask hides most of a long prompt's keys). Keys a
      // boolean mask hides score float32's lowest value, whose weight is
      // exactly 0 beside any allowed key, so skipping them changes nothing;
      // a tile with a row that allows none is scored whole (MLX's softmax is
      // then uniform over all keys).
      int jb = 0, je = kt;
      if (a.mask == MASK_BOOL) bool_span(a, b, h, i0, nr, &jb, &je);
      if (a.mask == MASK_BOOL)
        for (int r = 0; r < ATTN_TILE; r++) lim[r] = je;
      // 3. Scores, masked; each row's softmax weights in place.
      for (int j0 = jb; j0 < je; j0 += 16) score_tile(Q, Kt, lk, a.D, j0, S);
      float inv[ATTN_TILE];
      for (int r = 0; r < ATTN_TILE; r++) {
        float* s = S + r * lk + jb;
        apply_mask(a, b, h, i0 + (r < nr ? r : nr - 1), s, lim[r] - jb, jb);
        inv[r] = 1.0f / softmax_row(s, lim[r] - jb, a.sinks ? a.sinks + h : nullptr);
        for (int j = (int)attn_pad(lim[r] - jb, VL); j < je - jb; j++) s[j] = 0.0f;
      }
      // 4. Weighted values, 4 vectors of features at a time.
      vf acc[ATTN_TILE][4];
      const float* vj = vb + jb * a.vs[2];
      for (int c0 = 0; c0 < a.Dv; c0 += 4 * VL) {
        const int nc = (a.Dv - c0) / VL < 4 ? (a.Dv - c0) / VL : 4;
        switch (nc) {
          case 4: value_tile<4>(S + jb, lk, vj, a.vs[2], je - jb, c0, acc); break;
          case 3: value_tile<3>(S + jb, lk, vj, a.vs[2], je - jb, c0, acc); break;
          case 2: value_tile<2>(S + jb, lk, vj, a.vs[2], je - jb, c0, acc); break;
          default: value_tile<1>(S + jb, lk, vj, a.vs[2], je - jb, c0, acc); break;
        }
        for (int r = 0; r < nr; r++) {
          float* out = a.out + (((int64_t)b * a.Hq + h) * a.Lq + i0 + r) * a.Dv + c0;
          for (int c = 0; c < nc; c++) store(out + c * VL, acc[r][c] * splat(inv[r]));
        }
      }
    }
  }
}

void attention_rows(const AttnArgs& a, int b, int h, float* scratch) {
  row_path(a, b, h, scratch);
}

void attention_tiles(const AttnArgs& a, int b, int g, int q0, int q1, float* scratch) {
  tiled_path(a, b, g, q0, q1, scratch);
}

}  // namespace GROVE_QMM_NS
}  // namespace grove_qmm
