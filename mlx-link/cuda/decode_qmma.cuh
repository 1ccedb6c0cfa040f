// The 4-bit products of Grove's CUDA decode step for one row, on integer
// tensor cores: the same GemvArgs and modes as decode_gemv.cuh's gemv, for
// MLX's affine 4-bit weights in groups of 64 and K a multiple of 512.
// GROVE_FD_QMMA=1 turns it on; off by default, as it measured slower.
//
// Why it was tried: gemv's 4-bit path spends about 45 instructions per lane
// on each 32 weights (x's four 16-byte shared-memory reads, the nibble
// masks, four dp4a per word, the span's scale and sum), and stop 38's
// profile had its schedulers busy in half their slots. Here one
// mma.m16n8k32 (u8 weights times s8 x, int32 sums) takes 16 W rows by 32
// values: per lane about a third of the instructions per weight.
// Measured (H100, Llama-8B 4-bit, GPU time a step with GROVE_FD_PROFILE=1,
// this kernel / gemv): q/k/v 502 / 455 us, o 391 / 341, gate/up 1072 / 1030,
// down 871 / 709. Greedy tokens equal MLX's step's 32 of 32 on the three
// small 4-bit models (logits 3.8-5.1% of their spread off, as gemv's).
// Fewer instructions did not make the products faster.
//
// x is turned into integers once per block: each chunk of kQChunk values
// into v = round(x / s) (s = the chunk's max |x| / kQMax), split into two
// signed bytes v = 256 hi + lo. The mma's B operand has 8 columns: for each
// group of the chunk its hi and lo bytes, zero outside the group, so one
// mma gives both groups' sum(x q) of 16 W rows apart. A group's dot
// product is then scale * s * sum(x q) + bias * sum(x) in float32, as gemv
// computes it (x rounded to 2^-15 of its chunk's largest |x|).
//
// A lane (g = lane / 4, t = lane % 4) loads 16 bytes (32 values) of W rows
// g and g + 8 of the tile at values 32 t of the chunk; word j of them holds
// the mma's slots j: even nibbles (masked) as A's slots 4t..4t+3, odd ones
// (shifted, masked) as 16 + 4t... B's slots are laid out the same way (x's
// even and odd values of each word apart), so the reduction's order of
// values is permuted alike on both sides.
#pragma once
#include "decode_gemv.cuh"

namespace grove_fd {

constexpr int kQmmaWarps = 8;     // warps per block, each a share of the chunks
constexpr int kQChunk = 128;      // values of K per mma chunk (64 bytes a W row)
constexpr int kQmmaU = 4;         // chunks a warp has in flight
constexpr float kQMax = 32512.f;  // 127 * 256: hi stays within a signed byte

// d += a * b, m16n8k32, a unsigned bytes, b signed bytes, int32 sums.
__device__ __forceinline__ void mma_u8s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Shared memory: x's bytes (uint2 [chunks][4 words][4 lane quarters][hi,
// lo]: 2 bytes a value, where x itself is staged first), each chunk's
// scale, each group's sum; for NORM the norm's weights (staged with x).
__host__ __device__ constexpr size_t qmma_smem(int k, int gs, bool norm) {
  return static_cast<size_t>(k) * (norm ? 4 : 2) + static_cast<size_t>(k / kQChunk) * 4 +
         static_cast<size_t>(k / gs) * 4;
}

template <class T, int MODE, bool NORM>
__global__ void __launch_bounds__(kQmmaWarps * 32) gemv_qmma(const GemvArgs a) {
  extern __shared__ uint4 xs[];
  __shared__ uint2 zero;
  __shared__ float red[2][kQmmaWarps][16];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int chunks = a.k / kQChunk;
  uint2* xq = reinterpret_cast<uint2*>(xs);
  uint4* nw = xs + a.k / 8;  // NORM: the norm's weights
  float* xscale = reinterpret_cast<float*>(xs + (NORM ? a.k / 4 : a.k / 8));
  float* xsum = xscale + chunks;
  const int64_t row_bytes = a.k / 2;
  const int groups = a.k >> a.gs_log2;
  constexpr int kCols = MODE == kGlu ? 8 : 16;  // output columns a tile
  const int tiles = (a.n + kCols - 1) / kCols;
  // 0. The block's work as steps: per tile (16 output columns; kGlu: 8,
  //    gate rows 0-7 and up rows 8-15 of the tile) `rounds` steps, in each
  //    of which warp w takes kQmmaU consecutive chunks from (round *
  //    kQmmaWarps + w) * kQmmaU. A step's loads: lane (g, t) 16 bytes of
  //    tile rows g and g + 8 in each chunk; and each lane 16 bytes of
  //    scales (even lanes) or biases (odd) of tile row lane / 2 for the
  //    warp's 8 groups (gs 64; the lanes using them get them by shuffle).
  const int per_round = kQmmaWarps * kQmmaU, rounds = (chunks + per_round - 1) / per_round;
  const int my_tiles = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int steps = my_tiles * rounds;
  auto tile_of = [&](int st) { return blockIdx.x + (st / rounds) * gridDim.x; };
  auto first_chunk = [&](int st) { return ((st % rounds) * kQmmaWarps + warp) * kQmmaU; };
  // Tile row r's matrix and row in it.
  auto row_of = [&](int tile, int r, int& m) {
    int c;
    if constexpr (MODE == kGlu) {
      c = min(tile * 8 + (r & 7), a.n - 1);
      m = r >> 3;
    } else {
      c = min(tile * 16 + r, a.n - 1);
      m = stacked(a, c);
    }
    return c;
  };
  struct Buf {
    uint4 w[kQmmaU][2];
    uint4 sb;
  };
  auto issue = [&](int st, Buf& buf) {
    const int tile = tile_of(st), c0 = first_chunk(st);
    if (c0 >= chunks) return;
#pragma unroll
    for (int i = 0; i < 2; i++) {
      int m;
      const int c = row_of(tile, g + 8 * i, m);
      const char* w = static_cast<const char*>(a.w[m]) + c * row_bytes + t * 16 + c0 * 64;
#pragma unroll
      for (int u = 0; u < kQmmaU; u++) buf.w[u][i] = load_stream(w + u * 64);
    }
    int m;
    const int c = row_of(tile, lane >> 1, m);
    const T* sb = static_cast<const T*>(lane & 1 ? a.biases[m] : a.scales[m]);
    buf.sb = load_stream(sb + static_cast<int64_t>(c) * groups + c0 * 2);
  };
  Buf A, B;
  if (steps > 0) issue(0, A);
  release_next();
  wait_prior();
  // 1. x (and the norm's weights) into shared memory, all loads at once;
  //    for NORM the sum of squares on the way.
  const T* x = static_cast<const T*>(a.x);
  float ss = 0.f;
  for (int i = threadIdx.x; i < a.k / 8; i += blockDim.x) {
    const uint4 v = *reinterpret_cast<const uint4*>(x + i * 8);
    xs[i] = v;
    if constexpr (NORM) {
      nw[i] = *reinterpret_cast<const uint4*>(static_cast<const T*>(a.norm) + i * 8);
      float f[8];
      unpack8<T>(v, f);
#pragma unroll
      for (int e = 0; e < 8; e++) ss += f[e] * f[e];
    }
  }
  if (threadIdx.x == 0) zero = make_uint2(0, 0);
  float inv = 1.f;
  if constexpr (NORM) {
    __shared__ float part[kQmmaWarps];
    ss = warp_sum(ss);
    if (lane == 0) part[warp] = ss;
    __syncthreads();
    float tot = 0.f;
#pragma unroll
    for (int w = 0; w < kQmmaWarps; w++) tot += part[w];
    inv = rsqrtf(tot / a.k + a.eps);
  } else {
    __syncthreads();
  }
  // 2. Each chunk (a warp a chunk, 4 values a lane) normalized (each value
  //    rounded to T as MLX's rms_norm leaves it) and into integers, in
  //    place: a chunk's bytes take the room of its values.
  for (int ch = warp; ch < chunks; ch += kQmmaWarps) {
    const int i = ch * (kQChunk / 4) + lane;  // the lane's uint2 of x
    float v[4];
    {
      const uint2 raw = xq[i];
      const uint32_t w2[2] = {raw.x, raw.y};
#pragma unroll
      for (int h = 0; h < 2; h++) {
        if constexpr (std::is_same_v<T, __nv_bfloat16>) {
          v[2 * h] = __uint_as_float(w2[h] << 16);
          v[2 * h + 1] = __uint_as_float(w2[h] & 0xffff0000u);
        } else {
          __half2 hv;
          memcpy(&hv, &w2[h], 4);
          const float2 f = __half22float2(hv);
          v[2 * h] = f.x;
          v[2 * h + 1] = f.y;
        }
      }
    }
    if constexpr (NORM) {
      const uint2 graw = reinterpret_cast<const uint2*>(nw)[i];
      const T* gw = reinterpret_cast<const T*>(&graw);
#pragma unroll
      for (int e = 0; e < 4; e++) v[e] = rt<T>(Num<T>::to(gw[e]) * rt<T>(v[e] * inv));
    }
    float m = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float is = m > 0.f ? kQMax / m : 0.f;
    // Each value's hi and lo bytes: even values (0, 2) and odd (1, 3) of
    // the lane's four, 16 bits each.
    uint32_t hi_e = 0, hi_o = 0, lo_e = 0, lo_o = 0;
    float sum = 0.f;
#pragma unroll
    for (int e = 0; e < 4; e++) {
      sum += v[e];
      const int q = max(-32512, min(32512, __float2int_rn(v[e] * is)));
      const int lo = static_cast<int8_t>(q & 0xff), hi = (q - lo) >> 8;
      const int sh = 8 * (e >> 1);
      if (e & 1) {
        hi_o |= (static_cast<uint32_t>(hi) & 0xffu) << sh;
        lo_o |= (static_cast<uint32_t>(lo) & 0xffu) << sh;
      } else {
        hi_e |= (static_cast<uint32_t>(hi) & 0xffu) << sh;
        lo_e |= (static_cast<uint32_t>(lo) & 0xffu) << sh;
      }
    }
    // Lane pairs make whole words: the even lane hi's, the odd lane lo's
    // (its values are the word's second half).
    const bool odd = lane & 1;
    const uint32_t send = odd ? (hi_e | hi_o << 16) : (lo_e | lo_o << 16);
    const uint32_t got = __shfl_xor_sync(0xffffffffu, send, 1);
    uint2 word;
    if (odd) {
      word = make_uint2((got & 0xffffu) | lo_e << 16, (got >> 16) | lo_o << 16);
    } else {
      word = make_uint2(hi_e | (got & 0xffffu) << 16, hi_o | (got >> 16) << 16);
    }
    // Group sums (groups of 32, 64 or 128 values: 8, 16 or 32 lanes).
    for (int o = 1; o < (a.gs >> 2); o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    __syncwarp();  // every lane has read the chunk's values
    // Value 4 lane of the chunk: lane quarter lane / 8, word (lane / 2) % 4.
    xq[((ch * 4 + (lane >> 1) % 4) * 4 + (lane >> 3)) * 2 + (odd ? 1 : 0)] = word;
    if (((lane * 4) & (a.gs - 1)) == 0) xsum[(ch * kQChunk + lane * 4) >> a.gs_log2] = sum;
    if (lane == 0) xscale[ch] = m / kQMax;
  }
  __syncthreads();
  // This lane's B column (g): group g / 2's hi (even g) or lo bytes, where
  // its slots (values 32 t of the chunk) lie in that group; else zeros.
  const bool bon = g < 4 && (g >> 1) == (t >> 1);
  const uint2* bsrc = bon ? xq + t * 2 + (g & 1) : &zero;
  const int bstep = bon ? 8 : 0;  // uint2s from one (chunk, word) to the next
  // 3. The steps, each next one's loads asked for before this one's sums.
  float acc[2] = {0.f, 0.f};
  auto consume = [&](int st, const Buf& buf) {
    const int c0 = first_chunk(st);
    if (c0 >= chunks) return;
#pragma unroll
    for (int u = 0; u < kQmmaU; u++) {
      const int ch = c0 + u;
      int c[4] = {0, 0, 0, 0};
      const uint32_t w0[4] = {buf.w[u][0].x, buf.w[u][0].y, buf.w[u][0].z, buf.w[u][0].w};
      const uint32_t w1[4] = {buf.w[u][1].x, buf.w[u][1].y, buf.w[u][1].z, buf.w[u][1].w};
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const uint32_t af[4] = {w0[j] & 0x0f0f0f0fu, w1[j] & 0x0f0f0f0fu, (w0[j] >> 4) & 0x0f0f0f0fu,
                                (w1[j] >> 4) & 0x0f0f0f0fu};
        const uint2 b = bsrc[(ch * 4 + j) * bstep];
        mma_u8s8(c, af, b.x, b.y);
      }
      // Chunk u's two groups' scales (biases) of rows g and g + 8: word u
      // of lanes 2g (2g + 1) and 2g + 16 (2g + 17); this lane's group t.
      const uint32_t word = u == 0 ? buf.sb.x : u == 1 ? buf.sb.y : u == 2 ? buf.sb.z : buf.sb.w;
      const uint32_t sg[4] = {__shfl_sync(0xffffffffu, word, 2 * g), __shfl_sync(0xffffffffu, word, 2 * g + 1),
                              __shfl_sync(0xffffffffu, word, 2 * g + 16),
                              __shfl_sync(0xffffffffu, word, 2 * g + 17)};
      if (t < 2) {
        float f[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
          T v;
          const uint16_t bits = static_cast<uint16_t>(t ? sg[e] >> 16 : sg[e] & 0xffffu);
          memcpy(&v, &bits, 2);
          f[e] = Num<T>::to(v);
        }
        const float xsc = xscale[ch], xt = xsum[ch * 2 + t];
        const float d0 = static_cast<float>(c[0] * 256 + c[1]) * xsc;
        const float d1 = static_cast<float>(c[2] * 256 + c[3]) * xsc;
        acc[0] = fmaf(f[0], d0, fmaf(f[1], xt, acc[0]));
        acc[1] = fmaf(f[2], d1, fmaf(f[3], xt, acc[1]));
      }
    }
  };
  // 4. After a tile's last step: sum the lane quarters, then the warps in
  //    warp order; store as MODE says (tile row i: column tile * 16 + i;
  //    kGlu: gate i, up i + 8 of column tile * 8 + i). Two buffers of sums:
  //    one barrier a tile.
  int buf = 0;
  auto finish = [&](int st) {
    if (st % rounds != rounds - 1) return;
    const int tile = tile_of(st);
#pragma unroll
    for (int i = 0; i < 2; i++) {
      acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 1);
      acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 2);
    }
    if (t == 0) {
      red[buf][warp][g] = acc[0];
      red[buf][warp][g + 8] = acc[1];
    }
    acc[0] = acc[1] = 0.f;
    __syncthreads();
    if (threadIdx.x < kCols) {
      const int i = threadIdx.x, col = tile * kCols + i;
      auto total = [&](int row) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < kQmmaWarps; w++) s += red[buf][w][row];
        return s;
      };
      T* out = static_cast<T*>(a.out_ref != nullptr ? *a.out_ref : a.out);
      if (col < a.n) {
        T* o = out + col;
        if constexpr (MODE == kStore) {
          *o = Num<T>::from(total(i));
        } else if constexpr (MODE == kResidual) {
          *o = Num<T>::from(Num<T>::to(*o) + rt<T>(total(i)));
        } else {
          const float gate = rt<T>(total(i)), up = rt<T>(total(i + 8));
          *o = Num<T>::from(rt<T>(gate * sigmoid_t<T>(gate)) * up);
        }
      }
    }
    buf ^= 1;
  };
  for (int st = 0; st < steps; st += 2) {
    if (st + 1 < steps) issue(st + 1, B);
    consume(st, A);
    finish(st);
    if (st + 1 < steps) {
      if (st + 2 < steps) issue(st + 2, A);
      consume(st + 1, B);
      finish(st + 1);
    }
  }
}

}  // namespace grove_fd
