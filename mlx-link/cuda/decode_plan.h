// The plan of Grove's CUDA decode step (decode.cu): the model's sizes and
// matrices as the runner hands them over, the weights a plan keeps, and the
// scratch its kernels write, allocated once per model. Included by
// decode.cu only (its anonymous namespace is that file's).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "decode_in_place.h"
#include "decode_launch.cuh"
#include "decode_profile.h"
#include "mlx_ptr.h"
#include "mlx/array.h"
#include "mlx/backend/cuda/device.h"

// The model's sizes; mirrored by `FastDims` in the runner. Outside the
// anonymous namespace: grove_fd_new takes it, and a function taking a type
// of internal linkage would not be exported.
namespace grove_fd {
struct Dims {
  int32_t layers, hidden, heads, kv_heads, head_dim, intermediate, vocab;
  float rms_eps, qk_eps, scale, log2_base, rope_scale;
  int32_t qk_norm, tied, has_freqs;
  // Routed experts on every layer where experts > 0 (Qwen3-MoE; then
  // `intermediate` is each expert's): top_k of them per token, their
  // probabilities renormalized where moe_normalize.
  int32_t experts, top_k, moe_normalize;
};
// One matrix as the runner hands it over (`mlx::core::array*`s): dense
// (bits 0, no scales or biases) or MLX's affine quantization.
struct MatIn {
  void* w;
  void* scales;
  void* biases;
  int32_t bits, group_size;
};
}  // namespace grove_fd

namespace {

using namespace mlx::core;
using grove_fd::Dims;
using grove_fd::AttnArgs;
using grove_fd::GemvArgs;
using grove_fd::Profile;

// Matrices and vectors per layer, in the order the runner passes them
// (layers of routed experts: gate, up and down stacked per expert, then
// the router, kWr).
enum { kWq, kWk, kWv, kWo, kWg, kWu, kWd, kMats, kWr = kMats };
enum { kLn1, kLn2, kQn, kKn, kVecs };

using grove_fd::check;
using grove_fd::pdl;
using grove_fd::pdl_max_bytes;
using grove_fd::gemv_pdl_max_bytes;
using grove_fd::pdl_supported;

using grove_fd::mut_ptr;
using grove_fd::ptr;

// A matrix the plan keeps: dense in the model's dtype (bits 0) or Q-bit
// affine with scales and biases in the model's dtype.
struct Mat {
  array w{0.f}, scales{0.f}, biases{0.f};
  int bits = 0, gs = 0;
};

struct Plan {
  Dims d{};
  Dtype dtype = bfloat16;
  Mat embed, head;
  array final_norm, freqs;
  std::vector<std::vector<Mat>> mats;    // kMats per layer
  std::vector<std::vector<array>> vecs;  // kVecs per layer (kLn2 + 1 without qk_norm)
  // Scratch for max_rows rows, on the device; one stream runs every step.
  void* h = nullptr;
  void* qkv = nullptr;
  void* att = nullptr;
  void* act = nullptr;
  void* rlog = nullptr;    // routed experts: the router's logits [rows, experts]
  int* sel = nullptr;      // each row's picked experts [rows, top_k]
  float* score = nullptr;  // and their scores
  void* ys = nullptr;      // each pick's down projection [rows * top_k, hidden]
  grove_fd::TcScratch tcs{};  // the tensor-core products' (where they run)
  grove_fd::StepParams* params = nullptr;  // the step's changing inputs
  float* part = nullptr;                   // attention's per-split results
  int* arrived = nullptr;                  // attention's split counters
  // One captured graph of the step's kernels per batch size, replayed on
  // MLX's stream; made the first time a step has that many rows.
  cudaStream_t capture = nullptr;
  mutable cudaGraphExec_t graphs[grove_fd::kMaxRows + 1] = {};
  mutable Profile prof;
  bool in_place = true;  // GROVE_FD_IN_PLACE=0: always copy (a diagnostic)
  int max_rows = 1;      // rows a step takes: gemv's (whose x fits kXBytes
                         // in every product), or kMaxRows with tc_rows
  int tc_rows = grove_fd::kMaxRows + 1;  // batches from this many rows use gemm_tc
  mutable grove_fd::KvInPlace kv;  // which cache buffers are written in place

  Plan() : final_norm(0.f), freqs(0.f) {}
  ~Plan() {
    for (void* p : {h, qkv, att, act, rlog, ys, static_cast<void*>(sel), static_cast<void*>(score), tcs.x,
                    static_cast<void*>(tcs.part), static_cast<void*>(tcs.arrived),
                    static_cast<void*>(params), static_cast<void*>(part), static_cast<void*>(arrived)})
      if (p) cudaFree(p);
    for (cudaGraphExec_t g : graphs)
      if (g) cudaGraphExecDestroy(g);
    if (capture) cudaStreamDestroy(capture);
  }
  int qkv_width() const { return (d.heads + 2 * d.kv_heads) * d.head_dim; }
  void alloc() {
    const size_t e = size_of(dtype), r = max_rows;
    check(cudaMalloc(&h, r * d.hidden * e), "scratch");
    check(cudaMalloc(&qkv, r * qkv_width() * e), "scratch");
    check(cudaMalloc(&att, r * d.heads * d.head_dim * e), "scratch");
    check(cudaMalloc(&act, r * d.intermediate * std::max(1, d.top_k) * e), "scratch");
    if (d.experts > 0) {
      check(cudaMalloc(&rlog, r * d.experts * e), "scratch");
      check(cudaMalloc(&sel, r * d.top_k * sizeof(int)), "scratch");
      check(cudaMalloc(&score, r * d.top_k * sizeof(float)), "scratch");
      check(cudaMalloc(&ys, r * d.top_k * d.hidden * e), "scratch");
    }
    if (tc_rows <= max_rows) {
      // x normalized, split sums ([blocks, splits, up to 1024 values]: a
      // product splits only while it has fewer blocks than tc_blocks per SM;
      // room for 4, and launch_tc splits less past it) and counters per
      // block column (at most one per 8 columns).
      const size_t widest = std::max({d.vocab, d.intermediate, qkv_width(), d.hidden});
      tcs.part_floats = size_t{4} * grove_fd::sm_count() * grove_fd::kTcMaxSplits * 1024;
      check(cudaMalloc(&tcs.x, r * d.hidden * e), "scratch");
      check(cudaMalloc(&tcs.part, tcs.part_floats * sizeof(float)), "scratch");
      check(cudaMalloc(&tcs.arrived, (widest / 8 + 1) * sizeof(int)), "scratch");
      check(cudaMemset(tcs.arrived, 0, (widest / 8 + 1) * sizeof(int)), "scratch");
    }
    check(cudaMalloc(&params, sizeof(grove_fd::StepParams)), "scratch");
    const size_t parts = r * d.heads * std::max(grove_fd::kSplits, grove_fd::kGqaSplits) * (d.head_dim + 2);
    check(cudaMalloc(&part, parts * sizeof(float)), "scratch");
    check(cudaMalloc(&arrived, r * d.heads * sizeof(int)), "scratch");
    check(cudaMemset(arrived, 0, r * d.heads * sizeof(int)), "scratch");
    check(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking), "capture stream");
    kv.init();
  }
};

}  // namespace
