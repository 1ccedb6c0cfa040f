// chain_ceiling: the decode step's speed if every kernel of it only streamed
// its bytes, for the shapes of gpu_decode.sh's table (tests/bench/README.md,
// "The ceiling of a chain of kernels"). No model, no MLX: each product of a
// layer (q/k/v, o, gate/up, down), its attention (the keys and values of a
// 640-token cache) and the head become a kernel that reads as many bytes of
// a buffer as the real kernel reads weights, sums them and writes one value
// a block; the next kernel needs that value. The step's time for these
// kernels bounds what any kernels of the same structure reach:
//
//   one         one kernel reading all the step's bytes (the GPU's usable
//               bandwidth)
//   plain       a kernel a product, plain launches, replayed as a CUDA graph
//   pdl         the same, each a programmatic dependent that asks for its
//               first loads before it waits for the kernel before
//   persistent  one kernel, a block an SM, the products as phases with a
//               grid-wide barrier between them; each block asks for its
//               first loads of a phase before the barrier
//
// Blocks are 512 threads, each with U 16-byte loads in flight; `1/SM`
// rows take one block an SM (as Grove's 4-bit products do), `2/SM` two.
// The share is of the roofline as the table counts it (all the model's
// weight bytes over --gbs, 4800 GB/s for an H200).
//
// With `--arith`, the 4-bit shape's products also do the arithmetic of
// Grove's 4-bit products (decode_gemv.cuh's consume) on every weight load:
// two nibble masks and four dp4a a word against x split into 16-bit spans,
// each load's group scale and bias (2-byte loads, 4 bytes of the phase's
// bytes a 64 weights, as the roofline counts them) and the span's sum into a
// float: x from registers (`x regs`: no shared-memory reads, an upper bound
// that real K does not allow) or from shared memory, four 16-byte vectors a
// load at a lane's swizzled offsets (`x smem`, as gemv reads them), staged
// after the wait. No rows, no per-column sums: the bound of a chain with the
// products' arithmetic and no more (no norm, no split, attention only its
// bytes).
//
// Build (here): GROVE_BACKEND=cuda make chain-ceiling (target/chain_ceiling,
// the CUDA runtime linked in). Run (the GPU host): chain_ceiling [--gbs 4800]
// [--steps 50] [--arith]. Only reports; asserts nothing.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../../mlx-link/cuda/dp4a.h"  // grove_fd::dp4a_us / dp4a_uu, as gemv sums
#include "../../mlx-link/cuda/launch_util.h"  // grove_fd::launch, as the step launches

#define CK(e)                                                                               \
  do {                                                                                      \
    cudaError_t err_ = (e);                                                                 \
    if (err_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "chain_ceiling: %s: %s\n", #e, cudaGetErrorString(err_));        \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

constexpr int kThreads = 512;

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// The block's sum of `acc`, thread 0's return value.
__device__ __forceinline__ uint32_t block_xor(uint32_t acc) {
  __shared__ uint32_t part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
  __syncthreads();
  uint32_t all = 0;
  if (threadIdx.x == 0)
    for (int i = 0; i < kThreads / 32; i++) all ^= part[i];
  __syncthreads();
  return all;
}

// A thread's next U loads of vectors [0, n) of w, from i, stride apart.
template <int U>
__device__ __forceinline__ void ask(const uint4* w, size_t i, size_t stride, size_t n, uint4 (&r)[U]) {
#pragma unroll
  for (int u = 0; u < U; u++) r[u] = i + u * stride < n ? ld_stream(w + i + u * stride) : make_uint4(0, 0, 0, 0);
}

// The loads in r into acc, then the thread's rest of [0, n), U at a time.
template <int U>
__device__ __forceinline__ uint32_t drain(const uint4* w, size_t i, size_t stride, size_t n, uint4 (&r)[U],
                                          uint32_t acc) {
  for (;;) {
#pragma unroll
    for (int u = 0; u < U; u++) acc += fold(r[u]);
    i += U * stride;
    if (i >= n) return acc;
    ask<U>(w, i, stride, n, r);
  }
}

// One kernel of the chain: vectors [0, n) of w, grid-strided, U loads in
// flight a thread; `dep`: a programmatic dependent (first loads, then the
// wait). `prev` is the kernel before's output, read after the wait.
template <int U>
__global__ void __launch_bounds__(kThreads) stream(const uint4* w, size_t n, const uint32_t* prev,
                                                   uint32_t* out, int dep) {
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  const size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  uint4 r[U];
  ask<U>(w, i, stride, n, r);
  if (dep) asm volatile("griddepcontrol.wait;" ::: "memory");
  uint32_t acc = prev ? prev[blockIdx.x & 63] : 0u;
  if (dep) asm volatile("griddepcontrol.launch_dependents;" :::);
  acc = block_xor(drain<U>(w, i, stride, n, r, acc));
  if (threadIdx.x == 0) out[blockIdx.x & 63] = acc;
}

__device__ __forceinline__ uint16_t ld_u16(const uint16_t* p) {
  uint16_t v;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

constexpr int kXVecs = 512;  // x's split in shared memory: 4096 values as 16-bit spans (8 KiB)

// A 4-bit product's kernel of the chain: vectors [0, nw) of w are weights
// (32 4-bit values each), then nw / 2 bf16 scales and nw / 2 biases (one of
// each a 64 values). Each load is summed as gemv's consume sums it: XS = 0 x
// from registers, 1 from shared memory.
template <int U, int XS>
__global__ void __launch_bounds__(kThreads) q4_stream(const uint4* w, size_t n, const uint32_t* prev,
                                                      uint32_t* out, int dep) {
  const size_t nw = n / 9 * 8;
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(w + nw);
  const uint16_t* biases = scales + nw / 2;
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int lane = threadIdx.x & 31;
  __shared__ uint4 xs[XS ? kXVecs : 1];
  __shared__ float xf[XS ? 2 * kXVecs / 4 : 1];
  uint4 r[U];
  uint16_t sv[U], bv[U];
  auto ask4 = [&](size_t at) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const size_t j = at + u * stride;
      const bool in = j < nw;
      r[u] = in ? ld_stream(w + j) : make_uint4(0, 0, 0, 0);
      sv[u] = in ? ld_u16(scales + j / 2) : 0;
      bv[u] = in ? ld_u16(biases + j / 2) : 0;
    }
  };
  ask4(i);
  if (dep) asm volatile("griddepcontrol.wait;" ::: "memory");
  uint32_t acc = prev ? prev[blockIdx.x & 63] : 0u;
  if (dep) asm volatile("griddepcontrol.launch_dependents;" :::);
  // x: in registers (values of the thread), or staged into shared memory.
  uint4 xr[4];
  float xt_r = 0.f, xsc_r = 0.f;
#pragma unroll
  for (int j = 0; j < 4; j++) xr[j] = make_uint4(acc + threadIdx.x + j, acc * 3 + j, acc ^ (j * 77), acc + 5 * j);
  xt_r = __uint_as_float(0x3f800000u | (acc & 0xffu));
  xsc_r = __uint_as_float(0x37800000u | (threadIdx.x & 0xffu));
  if constexpr (XS) {
    for (int c = threadIdx.x; c < kXVecs; c += kThreads)
      xs[c] = make_uint4(acc + c, acc * 3 + c, acc ^ c, acc + 5 * c);
    for (int c = threadIdx.x; c < 2 * kXVecs / 4; c += kThreads) xf[c] = __uint_as_float(0x3f800000u | (c & 0xffu));
    __syncthreads();
  }
  float accf = 0.f;
  unsigned m = 0;  // (the lane's loads taken: which span of x it meets)
  for (;;) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      // A lane's load meets span c = lane + 32 m (4 vectors, rotated by
      // c / 2 mod 4 as swz_span does: no bank conflicts).
      const unsigned c = (lane + 32 * (m + u)) & (kXVecs / 4 - 1);
      uint4 xv[4];
      float xt = xt_r, xsc = xsc_r;
      if constexpr (XS) {
#pragma unroll
        for (int j = 0; j < 4; j++) xv[j] = xs[c * 4 + ((j + (c >> 1)) & 3)];
        xt = xf[c];
        xsc = xf[kXVecs / 4 + c];
      } else {
#pragma unroll
        for (int j = 0; j < 4; j++) xv[j] = xr[j];
      }
      const uint32_t words[4] = {r[u].x, r[u].y, r[u].z, r[u].w};
      int hi = 0, lo = 0;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const uint32_t even = words[j] & 0x0f0f0f0fu, odd = (words[j] >> 4) & 0x0f0f0f0fu;
        hi = grove_fd::dp4a_us(even, xv[j].x, hi);
        hi = grove_fd::dp4a_us(odd, xv[j].y, hi);
        lo = grove_fd::dp4a_uu(even, xv[j].z, lo);
        lo = grove_fd::dp4a_uu(odd, xv[j].w, lo);
      }
      const float xq = static_cast<float>(hi * 256 + lo) * xsc;
      const float s = __uint_as_float(static_cast<uint32_t>(sv[u]) << 16);
      const float b = __uint_as_float(static_cast<uint32_t>(bv[u]) << 16);
      accf = fmaf(s, xq, fmaf(b, xt, accf));
    }
    m += U;
    i += U * stride;
    if (i >= nw) break;
    ask4(i);
  }
  acc = block_xor(acc ^ __float_as_uint(accf));
  if (threadIdx.x == 0) out[blockIdx.x & 63] = acc;
}

struct Phase {
  const uint4* w;
  size_t n;
  bool q4 = false;  // a 4-bit product's weights, scales and biases
};

// The whole chain as one kernel: phase p's first loads, then a barrier on
// every block having finished phase p - 1, then the rest of phase p.
template <int U>
__global__ void __launch_bounds__(kThreads) persist(const Phase* phases, int count, unsigned* arrived,
                                                    uint32_t* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  uint32_t acc = 0;
  for (int p = 0; p < count; p++) {
    const uint4* w = phases[p].w;
    const size_t n = phases[p].n;
    const size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
    uint4 r[U];
    ask<U>(w, i, stride, n, r);
    if (p > 0) {
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(arrived, 1u);
        const unsigned want = static_cast<unsigned>(p) * gridDim.x;
        while (*reinterpret_cast<volatile unsigned*>(arrived) < want) {
        }
        __threadfence();
      }
      __syncthreads();
      acc += out[(blockIdx.x + 1) & 63];
    }
    acc = block_xor(drain<U>(w, i, stride, n, r, acc));
    if (threadIdx.x == 0) out[blockIdx.x & 63] = acc;
  }
}

struct Shape {
  const char* name;
  double roofline_bytes;              // the table's: all weights
  std::vector<double> layer;          // a layer's kernels' bytes, in order
  int layers;
  double head;                        // the LM head's bytes
  bool q4 = false;                    // 4-bit products
};

// Bytes of a [rows, k] matrix: bf16, or 4-bit with a bf16 scale and bias
// per 64 values.
double mat(double rows, double k, bool q4) { return rows * k * (q4 ? 0.5 + 4.0 / 64 : 2.0); }

Shape llama(const char* name, int hidden, int heads, int kv, int hd, int inter, int layers, bool tied,
            bool q4) {
  const double vocab = 128256, ctx = 640;
  Shape s{name, 0, {}, layers, 0, q4};
  s.layer = {mat(heads * hd + 2 * kv * hd, hidden, q4), ctx * kv * hd * 2 * 2, mat(hidden, heads * hd, q4),
             mat(2.0 * inter, hidden, q4), mat(hidden, inter, q4)};
  s.head = mat(vocab, hidden, q4);
  const double per_layer =
      mat(heads * hd + 2 * kv * hd, hidden, q4) + mat(hidden, heads * hd, q4) + mat(3.0 * inter, hidden, q4);
  // (norm weights and the like: under 0.1%, left out)
  s.roofline_bytes = per_layer * layers + s.head * (tied ? 1 : 2);
  return s;
}

struct Chain {
  std::vector<Phase> phases;
  double bytes = 0;
};

Chain chain_of(const Shape& s, const uint4* buf, size_t buf_vecs) {
  Chain c;
  size_t at = 0;
  auto add = [&](double bytes, bool q4) {
    const size_t n = static_cast<size_t>(bytes / 16);
    if (at + n > buf_vecs) at = 0;  // (only if the buffer is short: never for these shapes)
    c.phases.push_back({buf + at, n, q4});
    at += n;
    c.bytes += n * 16.0;
  };
  for (int l = 0; l < s.layers; l++)
    for (size_t k = 0; k < s.layer.size(); k++) add(s.layer[k], s.q4 && k != 1);  // (1: attention's keys)
  add(s.head, s.q4);
  return c;
}

// arith: -1 bytes only; 0 / 1 the 4-bit products' arithmetic with x from
// registers / shared memory (plain and pdl only).
template <int U>
float time_mode(const std::string& mode, const Chain& c, int blocks, int steps, cudaStream_t st,
                uint32_t* out, unsigned* arrived, Phase* dphases, int arith = -1) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  cudaGraphExec_t exec = nullptr;
  auto one_step = [&]() {
    if (mode == "one") {
      // One kernel over all the step's bytes (the phases are contiguous).
      size_t n = 0;
      for (const Phase& p : c.phases) n += p.n;
      stream<U><<<blocks, kThreads, 0, st>>>(c.phases[0].w, n, nullptr, out, 0);
    } else if (mode == "persistent") {
      CK(cudaMemsetAsync(arrived, 0, sizeof(unsigned), st));
      int count = static_cast<int>(c.phases.size());
      void* args[] = {&dphases, &count, &out, &arrived};
      CK(cudaLaunchCooperativeKernel((void*)persist<U>, dim3(blocks), dim3(kThreads), args, 0, st));
    } else {
      const bool dep = mode == "pdl";
      const uint32_t* prev = nullptr;
      for (const Phase& p : c.phases) {
        if (p.q4 && arith == 0)
          grove_fd::launch(dep, q4_stream<U, 0>, dim3(blocks), dim3(kThreads), 0, st, p.w, p.n, prev, out,
                           dep ? 1 : 0);
        else if (p.q4 && arith == 1)
          grove_fd::launch(dep, q4_stream<U, 1>, dim3(blocks), dim3(kThreads), 0, st, p.w, p.n, prev, out,
                           dep ? 1 : 0);
        else
          grove_fd::launch(dep, stream<U>, dim3(blocks), dim3(kThreads), 0, st, p.w, p.n, prev, out, dep ? 1 : 0);
        prev = out;
      }
    }
  };
  if (mode == "plain" || mode == "pdl") {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    one_step();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&exec, g, 0));
    CK(cudaGraphDestroy(g));
  }
  auto run = [&]() {
    if (exec)
      CK(cudaGraphLaunch(exec, st));
    else
      one_step();
  };
  for (int i = 0; i < 3; i++) run();
  CK(cudaEventRecord(a, st));
  for (int i = 0; i < steps; i++) run();
  CK(cudaEventRecord(b, st));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  if (exec) CK(cudaGraphExecDestroy(exec));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms / steps;
}

int main(int argc, char** argv) {
  double gbs = 4800;
  int steps = 50;
  bool arith = false;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--arith")) arith = true;
    else if (i + 1 < argc && !std::strcmp(argv[i], "--gbs")) gbs = std::atof(argv[++i]);
    else if (i + 1 < argc && !std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[++i]);
  }
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s, %d SMs; roofline at %.0f GB/s\n", prop.name, sms, gbs);

  const std::vector<Shape> shapes = {
      llama("llama-1b bf16", 2048, 32, 8, 64, 8192, 16, true, false),
      llama("llama-8b bf16", 4096, 32, 8, 128, 14336, 32, false, false),
      llama("llama-8b 4-bit", 4096, 32, 8, 128, 14336, 32, false, true),
  };
  size_t need = 0;
  for (const Shape& s : shapes) {
    double b = s.head;
    for (double x : s.layer) b += x * s.layers;
    need = std::max(need, static_cast<size_t>(b / 16) + 1024);
  }
  uint4* buf = nullptr;
  CK(cudaMalloc(&buf, need * 16));
  CK(cudaMemset(buf, 1, need * 16));
  uint32_t* out = nullptr;
  unsigned* arrived = nullptr;
  CK(cudaMalloc(&out, 64 * sizeof(uint32_t)));
  CK(cudaMalloc(&arrived, sizeof(unsigned)));
  CK(cudaMemset(out, 0, 64 * sizeof(uint32_t)));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  std::printf("| shape | mode | blocks | loads a thread | us a step | GB/s | tok/s | share of roofline |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    const Chain c = chain_of(s, buf, need);
    Phase* dphases = nullptr;
    CK(cudaMalloc(&dphases, c.phases.size() * sizeof(Phase)));
    CK(cudaMemcpy(dphases, c.phases.data(), c.phases.size() * sizeof(Phase), cudaMemcpyHostToDevice));
    for (const char* mode : {"one", "plain", "pdl", "persistent"}) {
      for (int per_sm : {1, 2}) {
        if (!std::strcmp(mode, "persistent") && per_sm == 2) continue;  // (a block an SM)
        for (int u : {4, 8}) {
          const int blocks = sms * per_sm;
          const float ms = u == 4 ? time_mode<4>(mode, c, blocks, steps, st, out, arrived, dphases)
                                  : time_mode<8>(mode, c, blocks, steps, st, out, arrived, dphases);
          const double tok = 1000.0 / ms;
          std::printf("| %s | %s | %d/SM | %d | %.1f | %.0f | %.1f | %.1f%% |\n", s.name, mode, per_sm, u,
                      ms * 1000, c.bytes / (ms * 1e6), tok, 100.0 * tok * s.roofline_bytes / (gbs * 1e9));
          std::fflush(stdout);
        }
      }
    }
    CK(cudaFree(dphases));
  }
  // The 4-bit shape's chain again, its products doing their arithmetic.
  if (arith) {
    const Shape& s = shapes[2];
    const Chain c = chain_of(s, buf, need);
    auto regs = [](const void* f) {
      cudaFuncAttributes fa;
      CK(cudaFuncGetAttributes(&fa, f));
      return fa.numRegs;
    };
    std::printf("registers a thread: bytes only %d / %d, x regs %d / %d, x smem %d / %d (4 / 8 loads)\n",
                regs((const void*)stream<4>), regs((const void*)stream<8>), regs((const void*)q4_stream<4, 0>),
                regs((const void*)q4_stream<8, 0>), regs((const void*)q4_stream<4, 1>),
                regs((const void*)q4_stream<8, 1>));
    // (Three rounds over all the variants, each round in the same order:
    // the fastest and slowest of each.)
    struct Row {
      int a, per_sm, u;
      const char* mode;
      float lo = 1e9f, hi = 0.f;
    };
    std::vector<Row> rows;
    for (int a : {-1, 0, 1})
      for (const char* mode : {"plain", "pdl"})
        for (int per_sm : {1, 2})
          for (int u : {4, 8}) rows.push_back({a, per_sm, u, mode});
    for (int round = 0; round < 3; round++)
      for (Row& r : rows) {
        const int blocks = sms * r.per_sm;
        const float ms = r.u == 4 ? time_mode<4>(r.mode, c, blocks, steps, st, out, arrived, nullptr, r.a)
                                  : time_mode<8>(r.mode, c, blocks, steps, st, out, arrived, nullptr, r.a);
        r.lo = std::min(r.lo, ms);
        r.hi = std::max(r.hi, ms);
      }
    std::printf("| shape | products | mode | blocks | loads a thread | us a step (3 rounds) | tok/s | share of roofline |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
    for (const Row& r : rows) {
      const double share = 100.0 * s.roofline_bytes / (gbs * 1e9) * 1000.0;
      std::printf("| %s | %s | %s | %d/SM | %d | %.1f-%.1f | %.1f-%.1f | %.1f-%.1f%% |\n", s.name,
                  r.a < 0 ? "bytes only" : r.a == 0 ? "x regs" : "x smem", r.mode, r.per_sm, r.u, r.lo * 1000,
                  r.hi * 1000, 1000.0 / r.hi, 1000.0 / r.lo, share / r.hi, share / r.lo);
    }
  }
  // The boundaries alone: the chains with no bytes (Llama-8B's 161 kernels).
  {
    Shape empty = shapes[2];
    for (double& b : empty.layer) b = 16 * 512;
    empty.head = 16 * 512;
    const Chain c = chain_of(empty, buf, need);
    Phase* dphases = nullptr;
    CK(cudaMalloc(&dphases, c.phases.size() * sizeof(Phase)));
    CK(cudaMemcpy(dphases, c.phases.data(), c.phases.size() * sizeof(Phase), cudaMemcpyHostToDevice));
    for (const char* mode : {"plain", "pdl", "persistent"}) {
      const float ms = time_mode<4>(mode, c, sms, steps, st, out, arrived, dphases);
      std::printf("boundaries alone, %s: %.2f us a kernel (%zu kernels, %.1f us a step)\n", mode,
                  ms * 1000 / c.phases.size(), c.phases.size(), ms * 1000);
    }
    CK(cudaFree(dphases));
  }
  return 0;
}
