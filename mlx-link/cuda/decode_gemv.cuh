// The matrix-vector products of Grove's CUDA decode step
// (decode_kernels.cuh lists the step's kernels): x [B, K] (normalized first
// for NORM) times a dense matrix in T or one in MLX's affine 4/8-bit layout,
// stored, added into the residual, or as SiLU(gate) * up.
#pragma once
#include "decode_gemv_args.cuh"

namespace grove_fd {

// Each warp computes R output columns (kGlu: R of gate and R of up) for all
// B rows, reading each weight once with 16-byte loads, eight in flight. The
// block first puts the rows of x (normalized, for NORM: the values MLX's
// rms_norm outputs, exact in T) into shared memory: `rows * k` values of T,
// then, for Q-bit weights (Q = 4 or 8; 0: dense T), turns each lane load's
// span of x into split8's integers in place and keeps the span's sum and
// scale: the launch's dynamic shared memory (gemv_smem).
//
// A quantized column's dot product is the sum over spans of
// scale * sum(x q) + bias * sum(x) in float32, sum(x q) summed exactly in
// integers (dp4a) and multiplied by the span's s (MLX's quantized_matmul on
// these rows gives the same values up to the order of its float sums and
// x's 2^-16 rounding).
//
// How a warp walks K (HV; the launch picks, where a lane's loads tile K):
//   0  passes of eight 16-byte loads a lane (then four, then one), each
//      consumed before the next pass is asked for: any K;
//   1  (quantized) halves of them in registers, one consumed while the
//      other is in flight, across the warp's column groups (H200, Llama-8B
//      4-bit: +2-3% tok/s);
//   2  (dense) a ring of kGemvStages stages in shared memory filled by
//      cp.async, which holds no registers while the warp computes
//      (Llama-1B bf16 +2-4%, Qwen3-4B +2%, Llama-8B bf16 even).
// (The same ring for quantized weights, their scales and biases staged
// too, lost 6%: tests/bench/README.md, stop 51.) Every
// way sums the same products in the same order: logits equal bit for bit.
template <class T, int B, int R, int MODE, bool NORM, int Q, bool EXP = false, int HV = 0>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv(const GemvArgs a) {
  static_assert(HV == 0 || (!EXP && (HV == 1 ? Q != 0 : HV == 2 && Q == 0)), "halves: quantized; stages: dense");
  constexpr int NR = MODE == kGlu ? 2 * R : R;
  constexpr int V = Span<Q>::kVals, XV = Span<Q>::kXVecs;
  extern __shared__ uint4 xs[];  // [rows][k / 8], then (Q) float [2][rows][k / V], then (NORM) gemv_norm_at
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const T* x = static_cast<const T*>(a.x) + (EXP ? blockIdx.y / a.x_div * a.x_stride : 0);
  const int k8 = a.k / 8, kv = a.k / V;
  float* xsum = reinterpret_cast<float*>(xs + a.rows * k8);
  float* xscale = xsum + a.rows * kv;
  // 0. The weight rows of the columns from col0 (past the end: the last
  //    row, not stored), and this warp's first loads of its first columns,
  //    asked for before x is staged: they do not depend on it.
  const int64_t row_bytes = static_cast<int64_t>(a.k) * (Q == 0 ? 8 * sizeof(T) : Q) / 8;
  const int groups = Q == 0 ? 0 : a.k / a.gs;
  auto rows_of = [&](int col0, const char* (&wr)[NR], const T* (&sr)[NR], const T* (&br)[NR]) {
#pragma unroll
    for (int r = 0; r < NR; r++) {
      int c = min(col0 + (r % R), a.n - 1);
      int m;
      if constexpr (MODE == kGlu) {
        m = r / R;
      } else {
        m = stacked(a, c);
      }
      // (The picks are the previous kernel's output: read after the wait.)
      if constexpr (EXP) c += a.experts[blockIdx.y] * a.n;
      wr[r] = static_cast<const char*>(a.w[m]) + c * row_bytes;
      if constexpr (Q != 0) {
        sr[r] = static_cast<const T*>(a.scales[m]) + static_cast<int64_t>(c) * groups;
        br[r] = static_cast<const T*>(a.biases[m]) + static_cast<int64_t>(c) * groups;
      }
    }
  };
  // One 16-byte load of each of a warp's rows at value ku (for Q, with its
  // group's scale and bias).
  auto load_at = [&](const char* (&wr)[NR], const T* (&sr)[NR], const T* (&br)[NR], int ku, uint4 (&wv)[NR],
                     T (&sv)[NR], T (&bv)[NR]) {
#pragma unroll
    for (int r = 0; r < NR; r++) {
      wv[r] = load_stream(wr[r] + static_cast<unsigned>(ku) * (Q == 0 ? 8 * sizeof(T) : Q) / 8);
      if constexpr (Q != 0) {
        sv[r] = sr[r][static_cast<unsigned>(ku) >> a.gs_log2];
        bv[r] = br[r][static_cast<unsigned>(ku) >> a.gs_log2];
      }
    }
  };
  const int first = (blockIdx.x * kGemvWarps + warp) * R;
  constexpr int P = gemv_pass_loads(NR);
  // (HV != 0: this warp's column groups, first then every step_cols, as
  // one stream of NW steps, H loads of each row a step, L / H steps a
  // group: halves in registers for HV = 1, stages in shared memory for
  // HV = 2. A Walk follows the stream twice: as it is asked for (ask, its
  // rows' pointers arw, ars and arb) and as it is consumed.)
  constexpr int H = gemv_half_loads(NR);
  const int L = a.k / (32 * V), step_cols = gridDim.x * kGemvWarps * R;
  const int NW = HV != 0 && first < a.n ? ((a.n - 1 - first) / step_cols + 1) * (L / H) : 0;
  const char* arw[NR];
  const T* ars[NR];
  const T* arb[NR];
  Walk ask{first, 0};
  auto ask_step = [&]() {
    if (ask.step(H, L)) {
      ask.next_group(step_cols);
      if (ask.col0 < a.n) rows_of(ask.col0, arw, ars, arb);
    }
  };
  // (HV = 1: two halves in flight, each asked for as the one before it is
  // consumed, so that the warp always has loads in flight.)
  uint4 hw[2][H][NR];
  T hs[2][H][NR], hb[2][H][NR];
  auto load_half = [&]<int I>() {
#pragma unroll
    for (int u = 0; u < H; u++)
      load_at(arw, ars, arb, lane * V + (ask.kk + u) * 32 * V, hw[I][u], hs[I][u], hb[I][u]);
    ask_step();
  };
  auto fill = [&]() {
    if (NW == 0) return;
    rows_of(first, arw, ars, arb);
    load_half.template operator()<0>();
    if (NW > 1) load_half.template operator()<1>();
  };
  if constexpr (HV == 1) fill();
  uint4 pw[P][NR];
  T ps[P][NR], pb[P][NR];
  if (!EXP && HV == 0 && first < a.n) {
    const char* wr[NR];
    const T* sr[NR];
    const T* br[NR];
    rows_of(first, wr, sr, br);
#pragma unroll
    for (int u = 0; u < P; u++) {
      const int ku = lane * V + u * 32 * V;
      if (ku < a.k) load_at(wr, sr, br, ku, pw[u], ps[u], pb[u]);
    }
  }
  const uint4* nws = reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(xs) +
                                                     gemv_norm_at(Q, a.rows, a.k, sizeof(T)));
  if constexpr (NORM) {
    const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(nws));
    const T* nw = static_cast<const T*>(a.norm);
    for (int c = threadIdx.x; c < k8; c += blockDim.x) cp16(at + c * 16, nw + c * 8, 16);
    cp_commit();
  }
  // (HV = 2: kGemvStages - 1 stages asked for before the wait, each a
  // cp.async group, empty ones past NW so that the count of groups in
  // flight is the same at every wait.)
  constexpr int st_bytes = gemv_stage_bytes(NR, H);
  char* ring = reinterpret_cast<char*>(xs) + gemv_ring_at(NORM, a.rows, a.k, sizeof(T)) +
               static_cast<size_t>(warp) * kGemvStages * st_bytes;
  auto issue_stage = [&](int slot) {
    char* stage = ring + slot * st_bytes;
    const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(stage));
#pragma unroll
    for (int u = 0; u < H; u++)
#pragma unroll
      for (int r = 0; r < NR; r++)
        cp16(at + (u * NR + r) * 512 + lane * 16,
             arw[r] + static_cast<unsigned>((ask.kk + u) * 32 * V + lane * V) * sizeof(T), 16);
    cp_commit();
    ask_step();
  };
  if constexpr (HV == 2) {
    if (NW > 0) rows_of(first, arw, ars, arb);
#pragma unroll
    for (int i = 0; i < kGemvStages - 1; i++) {
      if (i < NW)
        issue_stage(i);
      else
        cp_commit();
    }
  }
  // The next kernel may start as this one's blocks leave; x is the last
  // kernel's output.
  release_next();
  wait_prior();
  // 1. x into shared memory; for NORM each row's 1 / rms over all K, then
  //    the normalized values in place; for Q the spans' sums and integers
  //    (and there, for NORM, the normalized values).
  // (One row of quantized weights, or of dense ones with NORM, where x is at
  // most kFuseVecs vectors a thread: each thread keeps its vectors of x in
  // registers from the load through the norm to the split (dense: to the
  // normalized values' store), the same values in the same order as the
  // passes through shared memory below, with one barrier (two for NORM)
  // fewer and no pass reading x back (dense NORM: two of four, and two
  // passes). Quantized, H100, Llama-8B 4-bit, three rounds: 466.8-473.8
  // tok/s against 463.1-464.4; with the dense one too, H200, two rounds:
  // Llama-8B 4-bit 558.8-564.8 against 555.8-556.2, Qwen3-4B bf16
  // 404.8-405.0 against 402.8-402.9, Llama-1B bf16 1230.1-1255.1 against
  // 1229.5-1242.1, Llama-8B bf16 243.3-247.7 against 246.0-246.3. Logits
  // bit for bit equal on llama-small bf16, 4- and 8-bit, qwen3-small bf16
  // and 4-bit and qwen3-moe-small 4-bit.)
  bool fused = false;
  if constexpr ((Q != 0 || NORM) && B == 1) fused = k8 <= kFuseVecs * static_cast<int>(blockDim.x);
  __shared__ float inv[B];  // (NORM: each row's 1 / rms)
  if (fused) {
    if constexpr ((Q != 0 || NORM) && B == 1) {
      uint4 xr[kFuseVecs];
#pragma unroll
      for (int n = 0; n < kFuseVecs; n++) {
        const int c = threadIdx.x + n * blockDim.x;
        if (c < k8) xr[n] = *reinterpret_cast<const uint4*>(x + c * 8);
      }
      float inv1 = 0.f;
      if constexpr (NORM) {
        if constexpr (HV == 2)
          cp_wait<kGemvStages - 1>();  // (as below)
        else
          cp_wait<0>();
        __shared__ float fpart[kGemvWarps];
        float ss = 0.f;
#pragma unroll
        for (int n = 0; n < kFuseVecs; n++) {
          if (threadIdx.x + n * blockDim.x < k8) {
            float v[8];
            unpack8<T>(xr[n], v);
#pragma unroll
            for (int e = 0; e < 8; e++) ss += v[e] * v[e];
          }
        }
        const float t = warp_sum(ss);
        if (lane == 0) fpart[warp] = t;
        __syncthreads();
        float tot = 0.f;
#pragma unroll
        for (int w = 0; w < kGemvWarps; w++) tot += fpart[w];
        inv1 = rsqrtf(tot / a.k + a.eps);
      }
#pragma unroll
      for (int n = 0; n < kFuseVecs && Q == 0; n++) {
        const int c = threadIdx.x + n * blockDim.x;
        if (c < k8) {
          float v[8];
          rms_norm8<T>(xr[n], nws[c], inv1, v);
          xs[c] = pack8<T>(v);
        }
      }
#pragma unroll
      for (int n = 0; n < kFuseVecs && Q != 0; n++) {
        const int c0 = threadIdx.x - lane + n * blockDim.x;
        if (c0 >= k8) break;
        const int c = c0 + lane;
        const bool in = c < k8;
        float v[8];
        float t = 0.f, m = 0.f;
        if (in) {
          if constexpr (NORM) {
            rms_norm8<T>(xr[n], nws[c], inv1, v);
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = Num<T>::to(Num<T>::from(v[e]));
          } else {
            unpack8<T>(xr[n], v);
          }
          span_stats(v, t, m);
        }
        span_reduce<XV>(t, m);
        if (in) split_store<Q, XV>(v, t, m, xs + swz<XV>(c), xsum, xscale, c);
      }
      __syncthreads();
    }
  } else {
    for (int i = threadIdx.x; i < a.rows * k8; i += blockDim.x) {
      const int b = i / k8, c = i - b * k8;
      xs[b * k8 + swz<XV>(c)] = *reinterpret_cast<const uint4*>(x + b * a.x_stride + c * 8);
    }
    if constexpr (NORM) {
      if constexpr (HV == 2)
        cp_wait<kGemvStages - 1>();  // the norm's group, older than the stages'
      else
        cp_wait<0>();
    }
    __syncthreads();
    if constexpr (NORM) {
      __shared__ float part[kGemvWarps][B];
      float ss[B];
#pragma unroll
      for (int b = 0; b < B; b++) ss[b] = 0.f;
#pragma unroll
      for (int b = 0; b < B; b++) {
        if (b < a.rows) {
          for (int c = threadIdx.x; c < k8; c += blockDim.x) {
            float v[8];
            unpack8<T>(xs[b * k8 + c], v);
#pragma unroll
            for (int i = 0; i < 8; i++) ss[b] += v[i] * v[i];
          }
        }
      }
#pragma unroll
      for (int b = 0; b < B; b++) {
        float t = warp_sum(ss[b]);
        if (lane == 0) part[warp][b] = t;
      }
      __syncthreads();
      if (threadIdx.x < B) {
        float t = 0.f;
#pragma unroll
        for (int w = 0; w < kGemvWarps; w++) t += part[w][threadIdx.x];
        inv[threadIdx.x] = rsqrtf(t / a.k + a.eps);
      }
      __syncthreads();
      // (Q: normalized in the split's pass below.)
      if constexpr (Q == 0) {
        for (int i = threadIdx.x; i < a.rows * k8; i += blockDim.x) {
          const int b = i / k8, c = i - b * k8;
          float v[8];
          uint4& slot = xs[b * k8 + swz<XV>(c)];
          rms_norm8<T>(slot, nws[c], inv[b], v);
          slot = pack8<T>(v);
        }
        __syncthreads();
      }
    }
    if constexpr (Q != 0) {
      // Each span's sum and scale, and the span in place as split8's integers
      // (as many bytes as its values in T), for NORM normalized in the same
      // pass: a thread a 16-byte vector, the XV lanes of a span adding their
      // vectors' sums in pairs (shuffles) and taking their largest |x|. (The
      // loop is the warp's: every lane takes the shuffles, those past the end
      // with nothing.) H200, Llama-8B 4-bit, three rounds: 552.2-553.4 tok/s
      // against 550.4-551.3 with a pass for the norm and a thread a span
      // (550.4-551.1 with only the thread a vector); logits bit for bit equal
      // on llama-small 4-bit and qwen3-small 8-bit, though a span's sum in
      // pairs may differ from its sum in order in the last bit.
      const int nv = a.rows * k8;
      for (int i0 = threadIdx.x - lane; i0 < nv; i0 += blockDim.x) {
        const int i = i0 + lane;
        const bool in = i < nv;
        const int b = in ? i / k8 : 0, c = i - b * k8;
        float v[8];
        float t = 0.f, m = 0.f;
        if (in) {
          if constexpr (NORM) {
            rms_norm8<T>(xs[b * k8 + swz<XV>(c)], nws[c], inv[b], v);
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = Num<T>::to(Num<T>::from(v[e]));  // (in T, as stored above)
          } else {
            unpack8<T>(xs[b * k8 + swz<XV>(c)], v);
          }
          span_stats(v, t, m);
        }
        span_reduce<XV>(t, m);
        if (in) split_store<Q, XV>(v, t, m, xs + b * k8 + swz<XV>(c), xsum + b * kv, xscale + b * kv, c);
      }
      __syncthreads();
    }
  }
  // A column group's sums, zeroed.
  auto zero = [](float (&acc)[NR][B]) {
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
      for (int b = 0; b < B; b++) acc[r][b] = 0.f;
  };
  // x's vectors that a lane's loads meet: its load m (at value
  // lane * V + m * 32 * V) meets span c = lane + 32 m, whose vector j sits
  // at xo[j] + 32 m XV (swz_span's rotation, c / (8 / XV) mod XV, is the
  // lane's: 32 m / (8 / XV) is a multiple of XV). So a load's addresses
  // are the lane's offsets, plus the step's once a half, plus immediates.
  // (swz_span at each load was about a tenth of the 4-bit SiLU product's
  // instructions between two halves; H200, logits bit for bit equal:
  // Llama-8B 4-bit 552.1-553.0 tok/s against 547.8-548.2, Llama-1B bf16
  // 1236.5-1241.3 against 1227.4-1232.9.) The empty asm keeps the offsets
  // in registers: without it the compiler recomputed them at each load.
  unsigned xo[XV];
#pragma unroll
  for (int j = 0; j < XV; j++) {
    xo[j] = swz_span<XV>(static_cast<unsigned>(lane), j);
    asm volatile("" : "+r"(xo[j]));
  }
  // One 16-byte load of each row, the lane's load m = m0 + u (and, for Q,
  // its group's scale and bias) into the sums. (u, unrolled, is a constant:
  // the addresses of the loads u of one m0 differ by immediates.)
  auto consume = [&](float (&acc)[NR][B], const uint4 (&wv)[NR], const T (&sv)[NR], const T (&bv)[NR], int m0,
                     int u) {
    const uint4* xm = xs + static_cast<unsigned>(m0) * 32 * XV;
    const float* sm = xsum + lane + static_cast<unsigned>(m0) * 32;
    const float* cm = xscale + lane + static_cast<unsigned>(m0) * 32;
    if constexpr (Q == 0) {
      float wf[NR][8];
#pragma unroll
      for (int r = 0; r < NR; r++) unpack8<T>(wv[r], wf[r]);
#pragma unroll
      for (int b = 0; b < B; b++) {
        if (b < a.rows) {
          float v[8];
          unpack8<T>(xm[u * 32 * XV + b * k8 + xo[0]], v);
#pragma unroll
          for (int r = 0; r < NR; r++)
#pragma unroll
            for (int i = 0; i < 8; i++) acc[r][b] = fmaf(wf[r][i], v[i], acc[r][b]);
        }
      }
    } else {
#pragma unroll
      for (int b = 0; b < B; b++) {
        if (b < a.rows) {
          const float xt = sm[b * kv + u * 32], xs_scale = cm[b * kv + u * 32];
          int hi[NR], lo[NR];
#pragma unroll
          for (int r = 0; r < NR; r++) hi[r] = lo[r] = 0;
#pragma unroll
          for (int j = 0; j < XV; j++) {
            const uint4 xv = xm[u * 32 * XV + b * k8 + xo[j]];
#pragma unroll
            for (int r = 0; r < NR; r++) {
              const uint32_t words[4] = {wv[r].x, wv[r].y, wv[r].z, wv[r].w};
              if constexpr (Q == 4) {
                const uint32_t even = words[j] & 0x0f0f0f0fu, odd = (words[j] >> 4) & 0x0f0f0f0fu;
                hi[r] = dp4a_us(even, xv.x, hi[r]);
                hi[r] = dp4a_us(odd, xv.y, hi[r]);
                lo[r] = dp4a_uu(even, xv.z, lo[r]);
                lo[r] = dp4a_uu(odd, xv.w, lo[r]);
              } else {
                hi[r] = dp4a_us(words[2 * j], xv.x, hi[r]);
                lo[r] = dp4a_uu(words[2 * j], xv.y, lo[r]);
                hi[r] = dp4a_us(words[2 * j + 1], xv.z, hi[r]);
                lo[r] = dp4a_uu(words[2 * j + 1], xv.w, lo[r]);
              }
            }
          }
#pragma unroll
          for (int r = 0; r < NR; r++) {
            const float xq = static_cast<float>(hi[r] * 256 + lo[r]) * xs_scale;
            acc[r][b] = fmaf(Num<T>::to(sv[r]), xq, fmaf(Num<T>::to(bv[r]), xt, acc[r][b]));
          }
        }
      }
    }
  };
  // The lanes' sums of the column group from col0, stored as MODE says
  // (then zero again).
  auto finish = [&](float (&acc)[NR][B], int col0) {
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
      for (int b = 0; b < B; b++) acc[r][b] = warp_sum(acc[r][b]);
    if (lane == 0) {
      T* out = static_cast<T*>(a.out_ref != nullptr ? *a.out_ref : a.out) + (EXP ? blockIdx.y * a.n : 0);
#pragma unroll
      for (int r = 0; r < R; r++) {
        const int c = col0 + r;
        if (c >= a.n) break;
#pragma unroll
        for (int b = 0; b < B; b++) {
          if (b >= a.rows) break;
          store_out<T, MODE>(out + b * a.out_stride + c, acc[r][b], MODE == kGlu ? acc[(R + r) % NR][b] : 0.f);
        }
      }
    }
    zero(acc);
  };
  // 2. The stages: wait for the oldest, ask for the one kGemvStages - 1
  //    after it into the slot the last one left (all lanes past the
  //    wait: the warp's barrier), then consume it from shared memory.
  if constexpr (HV == 2) {
    if (NW == 0) return;
    float acc[NR][B];
    zero(acc);
    Walk use{first, 0};
    for (int e = 0; e < NW; e++) {
      cp_wait<kGemvStages - 2>();
      __syncwarp();
      const int next = e + kGemvStages - 1;
      if (next < NW)
        issue_stage(next % kGemvStages);
      else
        cp_commit();
      const char* stage = ring + (e % kGemvStages) * st_bytes;
#pragma unroll
      for (int u = 0; u < H; u++) {
        uint4 wv[NR];
        T sv[NR], bv[NR];
#pragma unroll
        for (int r = 0; r < NR; r++) wv[r] = *reinterpret_cast<const uint4*>(stage + (u * NR + r) * 512 + lane * 16);
        consume(acc, wv, sv, bv, use.kk, u);
      }
      if (use.step(H, L)) {
        finish(acc, use.col0);
        use.next_group(step_cols);
      }
    }
    return;
  }
  // 2. The halves: consume one while the other is in flight, then ask for
  //    the one after next in its registers.
  if constexpr (HV == 1) {
    if (NW == 0) return;
    float acc[NR][B];
    zero(acc);
    Walk use{first, 0};
    auto consume_half = [&]<int I>() {
#pragma unroll
      for (int u = 0; u < H; u++) consume(acc, hw[I][u], hs[I][u], hb[I][u], use.kk, u);
      if (use.step(H, L)) {
        finish(acc, use.col0);
        use.next_group(step_cols);
      }
    };
    for (int h = 0; h < NW; h += 2) {
      consume_half.template operator()<0>();
      if (h + 2 < NW) load_half.template operator()<0>();
      if (h + 1 < NW) {
        consume_half.template operator()<1>();
        if (h + 3 < NW) load_half.template operator()<1>();
      }
    }
    return;
  }
  if constexpr (HV == 0) {
    // 2. Each group of columns this block takes (a block stages x once for
    //    all of them).
    auto column = [&]<bool PRE>(int col0) {
      const char* wr[NR];
      const T* sr[NR];
      const T* br[NR];
      rows_of(col0, wr, sr, br);
      float acc[NR][B];
      zero(acc);
      // 3. Eight (then four, then one) 16-byte loads of every row in flight:
      //    enough bytes in flight per SM to keep HBM busy.
      //    (Bulk L2 prefetches of the rows ahead of them, or of the next
      //    column group, made every model slower: tests/bench/README.md.)
      int k = lane * V, m = 0;  // (m: the lane's loads taken, consume's index)
      auto pass = [&]<int U>() {
        for (; k + (U - 1) * 32 * V < a.k; k += U * 32 * V, m += U) {
          uint4 wv[U][NR];
          T sv[U][NR], bv[U][NR];
#pragma unroll
          for (int u = 0; u < U; u++) load_at(wr, sr, br, k + u * 32 * V, wv[u], sv[u], bv[u]);
#pragma unroll
          for (int u = 0; u < U; u++) consume(acc, wv[u], sv[u], bv[u], m, u);
        }
      };
      // The first columns' first loads, asked for in step 0.
      if constexpr (PRE) {
#pragma unroll
        for (int u = 0; u < P; u++)
          if (k + u * 32 * V < a.k) consume(acc, pw[u], ps[u], pb[u], 0, u);
        k += P * 32 * V;
        m += P;
      }
      // (Eight loads in flight in all: fewer per row where a warp reads
      // several rows, as many registers.)
      pass.template operator()<P>();
      if constexpr (NR < 4) pass.template operator()<H>();
      pass.template operator()<1>();
      finish(acc, col0);
    };
    // (The first column apart, so that its first loads' registers are free
    // for the others.)
    if (first < a.n) column.template operator()<!EXP>(first);
    for (int col0 = first + gridDim.x * kGemvWarps * R; col0 < a.n; col0 += gridDim.x * kGemvWarps * R)
      column.template operator()<false>(col0);
  }
}

}  // namespace grove_fd
