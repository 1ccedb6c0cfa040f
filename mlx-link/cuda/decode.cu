// Grove's CUDA decode step: an MLX primitive that runs a whole decode step
// of a pre-norm decoder (Llama, Mistral, Qwen3; float16/bfloat16 weights or
// MLX's affine 4/8-bit ones, full-precision KV) as 5 kernels per layer
// (decode_kernels.cuh; 8 with Qwen3-MoE's routed experts, decode_moe.cuh),
// run in order (decode_run.cuh) and launched (decode_launch.cuh) straight onto MLX's
// CUDA stream: captured once per batch size as a CUDA
// graph and replayed, the step's changing inputs (token, slot, left padding,
// KV buffers, logits) written first into device memory by one small kernel.
// On Hopper each kernel (but the largest products: decode_launch.cuh) is a
// programmatic dependent of the one before it: its blocks start, and issue
// their first weight loads, while the previous kernel's last blocks finish
// (H200, GROVE_FD_PDL=0 to compare: Llama-1B bf16 950.6 against 856.2
// tok/s, Llama-8B 4-bit 414.9 against 390.0, Qwen3-4B bf16 328.8 against
// 307.1).
//
// Why: MLX's CUDA backend spends 5-9 us of host time per operation and a
// decode step is 20 operations per layer, so at batch 1 the GPU waits for
// the host. Here the host cost of a step is 2 + 2 * layers graph nodes in
// MLX, of which one launches (the parameters, then the graph), and the other
// nodes only hand out its buffers ("The primitives" below).
//
// Built as its own library (libgrove_cuda.so, by nvcc, only for the CUDA
// build) and opened by the runner with dlopen: the runner itself links no
// CUDA. The C entry points at the end take and return `mlx::core::array*`
// (mlx-c's `mlx_array.ctx`).
//
// Ordering with MLX: MLX records its kernels into a CUDA graph that it
// launches later, so this primitive's launches go onto the stream before
// whatever MLX recorded earlier in the same evaluation and has not launched.
// The runner therefore evaluates every input first (tokens, caches: done in
// earlier evaluations, hence launched); everything after this primitive
// (its consumers) is launched by MLX after it, on the same stream.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_only.h"
#include "decode_in_place.h"
#include "decode_kernels.cuh"
#include "decode_launch.cuh"
#include "decode_plan.h"
#include "decode_profile.h"
#include "decode_run.cuh"
#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cuda/device.h"
#include "mlx/primitives.h"

namespace {

// ---- The primitives ------------------------------------------------------------
//
// A step is 2 + 2L nodes, not one node with 1 + 2L outputs: MLX gives each
// output of a node every other output as a sibling and every input, so a
// node with n outputs costs n^2 array references to make, detach and drop
// (measured alone against the CPU wheel's libmlx: 372 us a step for the 73
// outputs of Qwen3-4B, 714 us for the 97 of Qwen3-30B-A3B; 20 and 27 us as
// 2 + 2L nodes of one output each). The nodes:
//  - DecodeKernels (inputs: tokens, then the caches): runs the kernels and
//    writes each cache in place or into a copy (Written); output: the logits.
//  - DecodeCache, one per cache (inputs: that cache, the kernels' logits):
//    output: the cache as written, over Written's allocation. Not one per
//    layer with two outputs: MLX would hold one of the two (as the other's
//    sibling) once more than the other while the step runs, and
//    decode_in_place.h needs one count for all.
//  - DecodeJoin (inputs: the kernels' logits, then every DecodeCache):
//    output: the logits, sharing the kernels' buffer, so evaluating the
//    logits (as the engine does, through the sampled token) evaluates every
//    cache node in the same evaluation, and MLX holds each written cache
//    until the step completes, as it held the one node's outputs
//    (decode_in_place.h counts on that).
// None launches but DecodeKernels, whose launches go straight onto the
// stream: the greedy pick (pick.cu) knows the join by its name.

// Where one step's kernels wrote each cache: set by DecodeKernels, taken by
// the cache nodes (an allocation no node took is freed with this).
struct Written {
  std::vector<std::shared_ptr<array::Data>> roots;  // per cache: the allocation
  uint64_t step = 0;                                // KvInPlace's number of the step
};

// inputs: tokens [B] uint32, then each layer's keys and values buffers
// [B, kv_heads, cap, D]; output: logits [B, vocab]. Each buffer gets slot
// idx written: the input's own memory when nothing else shares it
// (decode_in_place.h), else a copy first, as MLX's own slice update does.
class DecodeKernels : public grove_fd::CudaOnly {
 public:
  DecodeKernels(Stream s, std::shared_ptr<Plan> plan, std::shared_ptr<Written> written, int idx,
                std::vector<int> left)
      : CudaOnly(s, "GroveDecodeKernels"),
        plan_(std::move(plan)),
        written_(std::move(written)),
        idx_(idx),
        left_(std::move(left)) {}

  void eval_gpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    auto& enc = cu::get_command_encoder(stream());
    cudaStream_t s = enc.stream();
    const Plan& p = *plan_;
    const int rows = inputs[0].shape(0);
    p.prof.begin(s);
    outputs[0].set_data(allocator::malloc(outputs[0].nbytes()));
    std::vector<void*> kc, vc;
    const std::vector<char> alone = p.kv.alone(inputs, 1);
    written_->roots.assign(inputs.size() - 1, nullptr);
    written_->step = p.kv.steps();
    for (size_t i = 1; i < inputs.size(); i++) {
      const array& in = inputs[i];
      // In place, the cache node's output gets its own Data over the same
      // buffer, keeping the allocation (its root) alive: sharing the input's
      // Data would make the previous step's in-flight inputs (which MLX
      // holds until that step completes) count as other holders, and every
      // step would copy.
      std::shared_ptr<array::Data> root;
      void* at = nullptr;
      if (p.in_place && alone[i] && in.flags().row_contiguous && in.offset() == 0) {
        root = p.kv.root_of(in);
        at = mut_ptr(const_cast<array&>(in));
      } else {
        array copy(allocator::malloc(in.nbytes()), in.shape(), in.dtype());
        at = mut_ptr(copy);
        check(cudaMemcpyAsync(at, ptr(in), in.nbytes(), cudaMemcpyDeviceToDevice, s), "cache copy");
        root = copy.data_shared_ptr();
        p.prof.copies++;
      }
      written_->roots[i - 1] = std::move(root);
      (i % 2 ? kc : vc).push_back(at);
    }
    p.prof.mark(s, Profile::kCopy);
    // The step's changing inputs, then its kernels: replayed from the graph
    // captured for this many rows (made now if this is the first).
    grove_fd::StepParams sp{};
    sp.tokens = static_cast<const uint32_t*>(ptr(inputs[0]));
    sp.logits = mut_ptr(outputs[0]);
    sp.cap = inputs[1].shape(2);
    sp.idx = idx_;
    for (int b = 0; b < rows; b++) sp.left[b] = left_[b];
    for (size_t l = 0; l < kc.size(); l++) {
      sp.kc[l] = kc[l];
      sp.vc[l] = vc[l];
    }
    grove_fd::set_params<<<1, 256, 0, s>>>(sp, p.params);
    auto kernels = [&](cudaStream_t on) {
      if (p.dtype == bfloat16)
        run_step<__nv_bfloat16>(p, rows, on);
      else
        run_step<__half>(p, rows, on);
    };
    if (p.prof.on) {
      kernels(s);
    } else {
      cudaGraphExec_t& g = p.graphs[rows];
      if (g == nullptr) {
        check(cudaStreamBeginCapture(p.capture, cudaStreamCaptureModeThreadLocal), "capture");
        cudaGraph_t graph = nullptr;
        try {
          kernels(p.capture);
        } catch (...) {
          cudaStreamEndCapture(p.capture, &graph);  // leaves capture mode
          if (graph) cudaGraphDestroy(graph);
          throw;
        }
        check(cudaStreamEndCapture(p.capture, &graph), "capture");
        check(cudaGraphInstantiate(&g, graph, 0), "graph");
        cudaGraphDestroy(graph);
      }
      check(cudaGraphLaunch(g, s), "graph launch");
      if (p.prof.sync) check(cudaStreamSynchronize(s), "sync");
    }
    p.kv.dispatched(s);
    p.prof.end();
  }

 private:
  std::shared_ptr<Plan> plan_;
  std::shared_ptr<Written> written_;
  int idx_;
  std::vector<int> left_;
};

// inputs: one cache as the step found it, the kernels' logits; output: the
// cache as DecodeKernels wrote it.
class DecodeCache : public grove_fd::CudaOnly {
 public:
  DecodeCache(Stream s, std::shared_ptr<Plan> plan, std::shared_ptr<Written> written, int i)
      : CudaOnly(s, "GroveDecodeCache"), plan_(std::move(plan)), written_(std::move(written)), i_(i) {}

  void eval_gpu(const std::vector<array>&, std::vector<array>& outputs) override {
    if (static_cast<size_t>(i_) >= written_->roots.size() || !written_->roots[i_])
      throw std::runtime_error("[GroveDecodeCache] the step's kernels did not run");
    std::shared_ptr<array::Data> root = std::move(written_->roots[i_]);
    outputs[0].set_data(root->buffer, [root](allocator::Buffer) {});
    plan_->kv.record(outputs[0], std::move(root), written_->step);
  }

 private:
  std::shared_ptr<Plan> plan_;
  std::shared_ptr<Written> written_;
  int i_;
};

// inputs: the kernels' logits, then every cache node; output: the logits.
// The greedy pick (pick.cu) takes logits made by this name as on the stream.
class DecodeJoin : public grove_fd::CudaOnly {
 public:
  explicit DecodeJoin(Stream s) : CudaOnly(s, "GroveDecodeStep") {}

  void eval_gpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    outputs[0].copy_shared_buffer(inputs[0]);
  }
};


thread_local std::string last_error;

int fail(const std::string& why) {
  last_error = why;
  return 1;
}

bool contiguous(const array& a) { return a.flags().row_contiguous && a.offset() == 0; }

// A tuning variable's integer, clamped to [lo, hi], into `out` where set.
void env_int(const char* name, int lo, int hi, int& out) {
  const char* v = std::getenv(name);
  if (v != nullptr) out = std::clamp(std::atoi(v), lo, hi);
}

// Computed in an earlier evaluation (so already on the stream), not only
// described in the graph.
bool scheduled(const array& a) { return a.status() != array::Status::unscheduled; }

// MLX allocates what the CPU writes (weights read from files) in managed
// memory, which moves to the GPU a page at a time at the first kernel that
// touches it. With routed experts, those no warm-up prompt picked moved
// during a user's first requests. Every weight of the plan moves now, when
// the plan is made (the warm-up's first decode step), and the call waits
// for it. H200, Qwen3-30B-A3B 4-bit, 127-token prompts, a process's first
// request after the warm-up: prefill 762-903 ms before, 205-210 ms after
// (later ones 128-147 ms either way); grove-batch-bench's first one-stream
// first token 389.2 ms before, 122.7 after. Where the GPU cannot take a
// prefetch (no concurrent managed access), pages move as before.
void prefetch_weights(const Plan& p) {
  int dev = 0, managed = 0;
  check(cudaGetDevice(&dev), "device");
  check(cudaDeviceGetAttribute(&managed, cudaDevAttrConcurrentManagedAccess, dev), "device");
  if (managed == 0) return;
  cudaMemLocation loc{};
  loc.type = cudaMemLocationTypeDevice;
  loc.id = dev;
  auto one = [&](const array& a) {
    if (!a.is_available()) return;
    const auto* b = static_cast<const mlx::core::cu::CudaBuffer*>(const_cast<array&>(a).buffer().ptr());
    if (b == nullptr || b->device != -1 || b->size < 4096) return;  // device memory, or a pool's scalar
    check(cudaMemPrefetchAsync(b->data, b->size, loc, 0, nullptr), "prefetching the weights");
  };
  auto mat = [&](const Mat& m) {
    one(m.w);
    if (m.bits != 0) {
      one(m.scales);
      one(m.biases);
    }
  };
  mat(p.embed);
  if (!p.d.tied) mat(p.head);
  for (const std::vector<Mat>& w : p.mats)
    for (const Mat& m : w) mat(m);
  one(p.final_norm);
  for (const std::vector<array>& vs : p.vecs)
    for (const array& v : vs) one(v);
  check(cudaStreamSynchronize(nullptr), "prefetching the weights");
}

}  // namespace

extern "C" {

// The reason the last call answered non-zero.
const char* grove_fd_error() { return last_error.c_str(); }

// Checks and keeps one matrix of [rows, cols] (logical).
// `experts` > 0: that many matrices stacked, [experts, rows, cols]
// (quantized only).
std::string take_mat(const grove_fd::MatIn& in, int rows, int cols, Dtype dtype, Mat& out, int experts = 0) {
  if (in.w == nullptr) return "a matrix is missing";
  const array& w = *static_cast<const array*>(in.w);
  const int lead = experts > 0 ? 1 : 0;
  auto stacked_as = [&](const array& a) { return lead == 0 || a.shape(0) == experts; };
  if (!w.is_available() || !contiguous(w) || w.ndim() != 2 + lead || !stacked_as(w) || w.shape(lead) != rows)
    return "a matrix is not evaluated, contiguous or of its shape";
  out.bits = in.bits;
  out.w = w;
  if (in.bits == 0) {
    if (lead) return "experts' dense matrices are not covered";
    if (w.dtype() != dtype || w.shape(1) != cols) return "a dense matrix is not in the model's dtype";
    return "";
  }
  if (in.bits != 4 && in.bits != 8) return "only 4- and 8-bit matrices are covered";
  if (in.group_size != 32 && in.group_size != 64 && in.group_size != 128) return "group size not 32, 64 or 128";
  if (in.scales == nullptr || in.biases == nullptr) return "a quantized matrix without scales or biases";
  if (cols % in.group_size) return "a quantized matrix's columns are not whole groups";
  if (w.dtype() != uint32 || static_cast<int64_t>(w.shape(lead + 1)) * 32 != static_cast<int64_t>(cols) * in.bits)
    return "a quantized matrix's words do not match its shape";
  out.gs = in.group_size;
  out.scales = *static_cast<const array*>(in.scales);
  out.biases = *static_cast<const array*>(in.biases);
  for (const array* a : {&out.scales, &out.biases})
    if (!a->is_available() || !contiguous(*a) || a->dtype() != dtype || a->ndim() != 2 + lead || !stacked_as(*a) ||
        a->shape(lead) != rows || a->shape(lead + 1) != cols / in.group_size)
      return "scales or biases not dense [rows, groups] in the model's dtype";
  return "";
}

// A plan over the model's weights. `mats`: embed, head (untied only), then
// per layer q, k, v, o, gate, up, down (routed experts: stacked, then the
// router). `vecs`: final norm, RoPE
// frequencies (has_freqs only), then per layer ln1, ln2, [q_norm, k_norm].
// 0: done.
int grove_fd_new(const Dims* dims, const grove_fd::MatIn* mats, int n_mats, void* const* vecs, int n_vecs,
                 void** plan_out) {
  try {
    auto p = std::make_shared<Plan>();
    p->d = *dims;
    const Dims& d = p->d;
    if (d.head_dim != 64 && d.head_dim != 128) return fail("head_dim must be 64 or 128");
    if (d.hidden % 8 || d.intermediate % 8 || (d.heads * d.head_dim) % 8)
      return fail("sizes must be multiples of 8");
    if (d.heads % d.kv_heads) return fail("heads must be a multiple of kv_heads");
    if (d.layers < 1 || d.layers > grove_fd::kMaxLayers) return fail("too many layers");
    const int per_vecs = d.qk_norm ? kVecs : kQn;
    const bool moe = d.experts > 0;
    const int per_mats = kMats + (moe ? 1 : 0);
    if (moe && (d.top_k < 1 || d.top_k > d.experts || d.experts > 4096))
      return fail("routed experts: top_k must be 1..experts, and experts at most 4096");
    if (n_mats != 1 + (d.tied ? 0 : 1) + d.layers * per_mats) return fail("wrong number of matrices");
    if (n_vecs != 1 + (d.has_freqs ? 1 : 0) + d.layers * per_vecs) return fail("wrong number of vectors");
    auto vec = [&](int i) -> const array& { return *static_cast<const array*>(vecs[i]); };
    int v = 0;
    p->final_norm = vec(v++);
    if (d.has_freqs) p->freqs = vec(v++);
    p->dtype = p->final_norm.dtype();
    if (p->dtype != bfloat16 && p->dtype != float16) return fail("activations must be float16 or bfloat16");
    const int q_rows = d.heads * d.head_dim, kv_rows = d.kv_heads * d.head_dim;
    int m = 0;
    std::string why = take_mat(mats[m++], d.vocab, d.hidden, p->dtype, p->embed);
    if (why.empty() && !d.tied) why = take_mat(mats[m++], d.vocab, d.hidden, p->dtype, p->head);
    if (!why.empty()) return fail("embedding or head: " + why);
    // The sizes of each layer's matrices, in kMats order: rows, cols.
    const int shape[kMats][2] = {{q_rows, d.hidden},       {kv_rows, d.hidden},      {kv_rows, d.hidden},
                                 {d.hidden, q_rows},       {d.intermediate, d.hidden}, {d.intermediate, d.hidden},
                                 {d.hidden, d.intermediate}};
    // Per row of x, the shared memory of the widest product.
    // The products' (matrix, reduction length): the most rows whose
    // shared memory fits every one.
    std::vector<std::pair<const Mat*, int>> products;
    products.emplace_back(d.tied ? &p->embed : &p->head, d.hidden);
    auto need = [&](const Mat& w, int k) { products.emplace_back(&w, k); };
    for (int l = 0; l < d.layers; l++) {
      std::vector<Mat> w(per_mats);
      for (int j = 0; j < kMats; j++) {
        why = take_mat(mats[m++], shape[j][0], shape[j][1], p->dtype, w[j], moe && j >= kWg ? d.experts : 0);
        if (!why.empty()) return fail("layer " + std::to_string(l) + ": " + why);
      }
      if (moe) {
        why = take_mat(mats[m++], d.experts, d.hidden, p->dtype, w[kWr]);
        if (!why.empty()) return fail("layer " + std::to_string(l) + " router: " + why);
      }
      // Stacked products take one kind of matrix.
      auto same = [&](int a, int b) { return w[a].bits == w[b].bits && w[a].gs == w[b].gs; };
      if (!same(kWq, kWk) || !same(kWq, kWv) || !same(kWg, kWu))
        return fail("q/k/v or gate/up quantized differently");
      std::vector<array> vs;
      for (int j = 0; j < per_vecs; j++) {
        const array& a = vec(v++);
        if (a.dtype() != p->dtype || !contiguous(a) || !a.is_available())
          return fail("a norm weight is not dense in the model's dtype");
        vs.push_back(a);
      }
      p->mats.push_back(std::move(w));
      p->vecs.push_back(std::move(vs));
    }
    for (const std::vector<Mat>& w : p->mats) {
      for (int j = 0; j < kMats; j++) need(w[j], shape[j][1]);
      if (moe) need(w[kWr], d.hidden);
    }
    for (const array* a : {&p->final_norm, &p->freqs})
      if (!a->is_available() || !contiguous(*a)) return fail("final norm or RoPE frequencies not evaluated");
    if (d.has_freqs && p->freqs.dtype() != float32) return fail("RoPE frequencies must be float32");
    prefetch_weights(*p);
    int x_kib = (moe ? kXBytesExperts : kXBytes) / 1024;
    env_int("GROVE_FD_X_KIB", 1, 200, x_kib);
    const size_t x_bytes = static_cast<size_t>(x_kib) * 1024;
    auto fits = [&](int rows) {
      for (const auto& [w, k] : products)
        if (grove_fd::gemv_smem(w->bits, rows, k, size_of(p->dtype)) > x_bytes) return false;
      return true;
    };
    p->max_rows = grove_fd::kGemvMaxRows;
    while (p->max_rows > 0 && !fits(p->max_rows)) p->max_rows--;
    if (p->max_rows < 1) return fail("a reduction is too long for the step");

    // Dense weights: every batch past what gemv fits (the rows it fits keep
    // gemv, as measured before gemm_tc; GROVE_FD_MMA_ROWS=N from N rows, 0:
    // never) on tensor cores, up to kMaxRows.
    bool dense = true;
    for (const auto& [w, k] : products) dense = dense && w->bits == 0;
    const char* mma_env = std::getenv("GROVE_FD_MMA_ROWS");
    const int mma_rows = mma_env == nullptr ? p->max_rows + 1 : std::atoi(mma_env);
    if (dense && !moe && mma_rows > 0 && d.hidden % 32 == 0 && d.intermediate % 32 == 0 && q_rows % 32 == 0) {
      p->tc_rows = std::min(mma_rows, p->max_rows + 1);
      p->max_rows = grove_fd::kMaxRows;
    }
    p->alloc();
    const char* prof = std::getenv("GROVE_FD_PROFILE");
    p->prof.on = prof != nullptr && std::strcmp(prof, "1") == 0;
    p->prof.counts = prof != nullptr && (std::strcmp(prof, "2") == 0 || std::strcmp(prof, "3") == 0);
    p->prof.sync = prof != nullptr && std::strcmp(prof, "3") == 0;
    const char* pdl_env = std::getenv("GROVE_FD_PDL");
    pdl = pdl_supported() && (pdl_env == nullptr || std::strcmp(pdl_env, "0") != 0);
    const char* max_mb = std::getenv("GROVE_FD_PDL_MAX_MB");
    if (max_mb != nullptr) pdl_max_bytes = static_cast<size_t>(std::strtoull(max_mb, nullptr, 10)) << 20;
    const char* gemv_max_mb = std::getenv("GROVE_FD_GEMV_PDL_MAX_MB");
    if (gemv_max_mb != nullptr)
      gemv_pdl_max_bytes = static_cast<size_t>(std::strtoull(gemv_max_mb, nullptr, 10)) << 20;
    env_int("GROVE_FD_TC_BLOCKS", 1, INT_MAX, grove_fd::tc_blocks);
    env_int("GROVE_FD_TC_SPLITS", 1, grove_fd::kTcMaxSplits, grove_fd::tc_splits);
    env_int("GROVE_FD_PIPE", 0, 2, grove_fd::pipe);
    env_int("GROVE_FD_GQA", 0, INT_MAX, grove_fd::gqa_rows);
    env_int("GROVE_FD_GQA_SPLITS", 1, grove_fd::kGqaSplits, grove_fd::gqa_splits);
    env_int("GROVE_FD_SPLITS", 1, grove_fd::kSplits, grove_fd::max_splits);
    env_int("GROVE_FD_SPLITS", 1, grove_fd::kSplits, grove_fd::one_row_splits);
    env_int("GROVE_FD_BALANCE", 0, 1, grove_fd::balance);
    const char* in_place = std::getenv("GROVE_FD_IN_PLACE");
    p->in_place = in_place == nullptr || std::strcmp(in_place, "0") != 0;
    *plan_out = new std::shared_ptr<Plan>(std::move(p));
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

void grove_fd_free(void* plan) { delete static_cast<std::shared_ptr<Plan>*>(plan); }

// One decode step on stream `stream` (an `mlx::core::Stream*`): `tokens`
// [B] uint32 (evaluated), `caches` 2 * layers buffers [B, kv_heads, cap, D]
// (evaluated; keys then values per layer) with room at slot `idx`; row b's
// keys start at `left[b]`. Writes 1 + 2 * layers new arrays into `outs`:
// logits [B, vocab] (the join node), then the caches (the cache nodes), as
// "The primitives" above. 0: done; 1: not covered (nothing made);
// 2: more rows than this model's step takes (nothing made; MLX's step);
// 3: an input is not evaluated yet (evaluate them, then call again).
int grove_fd_step(void* plan, void* stream, void* tokens, void* const* caches, int idx,
                  const int* left, void** outs) {
  try {
    const auto& p = *static_cast<std::shared_ptr<Plan>*>(plan);
    const Dims& d = p->d;
    const array& tok = *static_cast<const array*>(tokens);
    if (tok.ndim() != 1 || tok.dtype() != uint32 || !contiguous(tok)) return fail("tokens must be [B] uint32");
    if (!scheduled(tok)) return 3;
    const int rows = tok.shape(0);
    if (rows < 1) return fail("no rows");
    if (rows > p->max_rows) return 2;
    std::vector<array> inputs{tok};
    for (int i = 0; i < 2 * d.layers; i++) {
      const array& c = *static_cast<const array*>(caches[i]);
      if (c.ndim() != 4 || c.shape(0) != rows || c.shape(1) != d.kv_heads || c.shape(3) != d.head_dim ||
          c.dtype() != p->dtype || idx >= c.shape(2) || idx < 0 || c.shape(2) != static_cast<const array*>(caches[0])->shape(2))
        return fail("a cache buffer has the wrong shape");
      if (!scheduled(c)) return 3;
      inputs.push_back(c);
    }
    std::vector<int> lp(left, left + rows);
    for (int v : lp)
      if (v > idx) return fail("left padding past the write slot");
    const Stream& s = *static_cast<const Stream*>(stream);
    auto written = std::make_shared<Written>();
    array logits(Shape{rows, d.vocab}, p->dtype,
                 std::make_shared<DecodeKernels>(s, p, written, idx, std::move(lp)), inputs);
    std::vector<array> joined{logits};
    for (int i = 0; i < 2 * d.layers; i++) {
      const array& c = inputs[i + 1];
      joined.emplace_back(c.shape(), c.dtype(), std::make_shared<DecodeCache>(s, p, written, i),
                          std::vector<array>{c, logits});
    }
    array step(Shape{rows, d.vocab}, p->dtype, std::make_shared<DecodeJoin>(s), joined);
    outs[0] = new array(std::move(step));
    for (size_t i = 1; i < joined.size(); i++) outs[i] = new array(std::move(joined[i]));
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

}  // extern "C"
