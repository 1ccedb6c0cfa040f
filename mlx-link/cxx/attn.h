// The shared description of one attention for Grove's CPU kernel
// (attn_kernel.h) and the entry points of its per-instruction-set builds.
//
// out[b, h, i] = softmax_j(scale * q[b, h, i] . k[b, g, j] (+ mask)) @ v[b, g, j]
// with g = h / (Hq / Hkv) (grouped-query heads share their keys and values).
#pragma once
#include <cstdint>

namespace grove_qmm {

enum MaskKind { MASK_NONE = 0, MASK_CAUSAL = 1, MASK_BOOL = 2, MASK_ADD = 3 };

struct AttnArgs {
  // Strides in elements of the batch, head and position axes; the feature
  // axis is contiguous.
  const float* q;
  int64_t qs[3];
  const float* k;
  int64_t ks[3];
  const float* v;
  int64_t vs[3];
  // MASK_CAUSAL: query i sees keys j <= i + Lk - Lq. MASK_BOOL (uint8) and
  // MASK_ADD (float): an array read through `ms` (batch, head, query, key;
  // 0 where broadcast); a false entry makes the score float32's lowest value,
  // as MLX's `where` does.
  int mask;
  const void* m;
  int64_t ms[4];
  const float* sinks;  // Hq logits that take part in each softmax, or null
  float* out;  // B x Hq x Lq x Dv, row-contiguous
  int B, Hq, Hkv, Lq, Lk, D, Dv;
  float scale;
};

// Query positions one unit of the tiled path (Lq >= ROW_PATH_MAX) takes, and
// the rows of a register tile.
constexpr int ATTN_QB = 64;
constexpr int ATTN_TILE = 4;
// Fewer query positions than this take the row path (decode).
constexpr int ROW_PATH_MAX = 4;

inline int64_t attn_pad(int64_t n, int64_t to) {
  return (n + to - 1) / to * to;
}

// Floats of scratch one call of `attention_rows` or `attention_tiles` needs.
inline int64_t attn_scratch_floats(const AttnArgs& a) {
  const int64_t lk = attn_pad(a.Lk, 16);
  const int64_t row_path = lk + a.D;
  const int64_t tiled = a.D * lk + ATTN_TILE * (lk + a.D);
  return row_path > tiled ? row_path : tiled;
}

// One build each, only those the CPU runs are called:
// - attention_rows (Lq < ROW_PATH_MAX): query head h of batch row b, all
//   positions;
// - attention_tiles: every query head of key/value head g in batch row b,
//   for query positions [q0, q1).
namespace avx2 {
void attention_rows(const AttnArgs& a, int b, int h, float* scratch);
void attention_tiles(const AttnArgs& a, int b, int g, int q0, int q1, float* scratch);
}
namespace base {
void attention_rows(const AttnArgs& a, int b, int h, float* scratch);
void attention_tiles(const AttnArgs& a, int b, int g, int q0, int q1, float* scratch);
}

}  // namespace grove_qmm
