//! Grove's CUDA decode step: a whole decode step of a plain pre-norm decoder
//! (Llama, Mistral, Qwen3: float16/bfloat16 weights or MLX's affine 4- and
//! 8-bit quantization, without biases; SiLU MLPs, full attention with
//! full-precision keys and values; Qwen3-MoE's routed experts, quantized)
//! as one MLX
//! graph node that launches 5 kernels per layer (8 with routed experts:
//! `mlx-link/cuda/decode.cu`, `decode_moe.cuh`),
//! captured once per batch size as a CUDA graph and replayed, plus a node per
//! key or value buffer that hands out the buffer as written and a node that
//! joins them to the logits (one node with an output per buffer cost MLX
//! n^2 array references: decode.cu's "The primitives").
//!
//! Why: at batch 1 MLX's CUDA backend spends 5-9 us of host time per
//! operation, ~20 per layer, and the GPU waits for the host (the H200 table
//! in tests/bench/README.md). This step costs the host two launches (its
//! parameters, its graph) and the bookkeeping of 2 + 2 * layers nodes that
//! launch nothing.
//!
//! The kernels live in their own library, `libgrove_cuda.so`, which the CUDA
//! build makes with nvcc (`GROVE_BACKEND=cuda make build`) next to the binaries
//! and the `grove-llm-cuda` wheel puts in `site-packages/grove_llm_cuda/`; the
//! runner opens it when MLX's device is a CUDA GPU (`GROVE_CUDA_DECODE_LIB`
//! names another path). Batches of dense models take up to [`MAX_ROWS`] rows
//! (their products on tensor cores); quantized ones as many as fit its
//! products' shared memory (2 on Llama-1B 4-bit, 1 on Llama-8B 4-bit; with
//! routed experts twice as much, 8 rows on Qwen3-30B-A3B 4-bit).
//! Without it, with `GROVE_FAST_DECODE=0`, for a model or a batch it does not
//! cover (more rows than that; other quantization modes, quantized or
//! windowed caches, a model split over ranks), the step is MLX's, as
//! everywhere else.
use std::ffi::{c_int, c_void};

use mlx_rs::error::Exception;
use mlx_rs::transforms::async_eval;
use mlx_rs::{Array, Stream};

use super::attention::PlainAttention;
use super::cuda_lib::{Lib, lib};
use super::moe::MoeShape;
use crate::cache::DecodeSlots;

/// The model's sizes, as `Dims` in decode.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FastDims {
    pub layers: i32,
    pub hidden: i32,
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub intermediate: i32,
    pub vocab: i32,
    pub rms_eps: f32,
    pub qk_eps: f32,
    pub scale: f32,
    pub log2_base: f32,
    pub rope_scale: f32,
    pub qk_norm: i32,
    pub tied: i32,
    pub has_freqs: i32,
    /// Routed experts on every layer (0: dense MLPs); `intermediate` is
    /// then each expert's.
    pub experts: i32,
    pub top_k: i32,
    pub moe_normalize: i32,
}

/// One matrix as the step takes it.
#[derive(Clone, Copy)]
pub(crate) enum DecodeMat<'a> {
    /// `[rows, cols]` in the model's dtype.
    Dense(&'a Array),
    /// MLX's affine quantization: uint32 words, scales and biases per group.
    Affine {
        weight: &'a Array,
        scales: &'a Array,
        biases: &'a Array,
        bits: i32,
        group_size: i32,
    },
}

impl DecodeMat<'_> {
    /// Output rows.
    pub fn rows(&self) -> i32 {
        match self {
            Self::Dense(w) | Self::Affine { weight: w, .. } => w.dim(0),
        }
    }

    fn raw(&self) -> MatIn {
        match *self {
            Self::Dense(w) => MatIn {
                w: w.as_ptr().ctx,
                scales: std::ptr::null_mut(),
                biases: std::ptr::null_mut(),
                bits: 0,
                group_size: 0,
            },
            Self::Affine {
                weight,
                scales,
                biases,
                bits,
                group_size,
            } => MatIn {
                w: weight.as_ptr().ctx,
                scales: scales.as_ptr().ctx,
                biases: biases.as_ptr().ctx,
                bits,
                group_size,
            },
        }
    }
}

/// decode.cu's `MatIn`.
#[repr(C)]
pub(crate) struct MatIn {
    w: *mut c_void,
    scales: *mut c_void,
    biases: *mut c_void,
    bits: i32,
    group_size: i32,
}

/// Rows one step covers at most (decode.cu's `kMaxRows`: dense weights;
/// quantized ones take up to `kGemvMaxRows`, 8, as their products fit).
pub const MAX_ROWS: usize = 32;

/// A sparse block's parts (Qwen3-MoE: softmax routing, no shared expert):
/// the router and each projection's matrices stacked per expert.
pub(crate) struct FastExperts<'a> {
    pub router: DecodeMat<'a>,
    pub gate: DecodeMat<'a>,
    pub up: DecodeMat<'a>,
    pub down: DecodeMat<'a>,
    pub shape: MoeShape,
}

/// A layer's feed-forward part.
pub(crate) enum FastMlp<'a> {
    /// A SiLU MLP: gate, up, down.
    Dense(DecodeMat<'a>, DecodeMat<'a>, DecodeMat<'a>),
    /// Routed experts.
    Experts(FastExperts<'a>),
}

/// A decoder's weights as the step takes them (`head` `None`: tied).
pub(crate) struct FastParts<'a> {
    pub embed: DecodeMat<'a>,
    pub final_norm: (&'a Array, f32),
    pub head: Option<DecodeMat<'a>>,
    pub vocab: i32,
    pub layers: Vec<FastLayer<'a>>,
}

/// One layer's parts, as the decoder hands them over.
pub(crate) struct FastLayer<'a> {
    pub input_norm: (&'a Array, f32),
    pub attention: PlainAttention<'a>,
    pub post_norm: (&'a Array, f32),
    pub mlp: FastMlp<'a>,
}

/// A plan of the step over one model's weights.
pub struct FastDecode {
    plan: *mut c_void,
    lib: &'static Lib,
    layers: usize,
}

// SAFETY: the plan is immutable once made (weights, sizes, and scratch that
// only the stream's kernels touch, in stream order); steps are built from
// the engine thread.
unsafe impl Send for FastDecode {}
unsafe impl Sync for FastDecode {}

impl Drop for FastDecode {
    fn drop(&mut self) {
        // SAFETY: made by grove_fd_new, freed once.
        unsafe { (self.lib.free)(self.plan) }
    }
}

impl FastDecode {
    /// Makes the plan, or says (on stderr, once per model) why the model is
    /// not covered. Layers are all dense or all of routed experts, each of
    /// one shape.
    pub(crate) fn new(parts: &FastParts<'_>) -> Option<Self> {
        let FastParts {
            embed,
            final_norm,
            head,
            vocab,
            ref layers,
        } = *parts;
        let lib = lib()?;
        let first = layers.first()?;
        let a = &first.attention;
        let (intermediate, moe) = match &first.mlp {
            FastMlp::Dense(g, ..) => (g.rows(), None),
            FastMlp::Experts(e) => (e.shape.intermediate, Some(e.shape)),
        };
        let (dims, base, rope_scale, freqs) = a.rope.plain()?;
        if dims != a.shape.head_dim {
            return None;
        }
        let d = FastDims {
            layers: layers.len() as i32,
            hidden: a.shape.hidden,
            heads: a.shape.heads,
            kv_heads: a.shape.kv_heads,
            head_dim: a.shape.head_dim,
            intermediate,
            vocab,
            rms_eps: final_norm.1,
            qk_eps: a.qk_norm.map_or(0.0, |((_, e), _)| e),
            scale: a.scale,
            log2_base: base.map_or(0.0, f32::log2),
            rope_scale,
            qk_norm: a.qk_norm.is_some() as i32,
            tied: head.is_none() as i32,
            has_freqs: freqs.is_some() as i32,
            experts: moe.map_or(0, |s| s.experts),
            top_k: moe.map_or(0, |s| s.top_k),
            moe_normalize: moe.is_some_and(|s| s.normalize) as i32,
        };
        let mut mats: Vec<MatIn> = vec![embed.raw()];
        mats.extend(head.map(|h| h.raw()));
        let mut vecs: Vec<&Array> = vec![final_norm.0];
        vecs.extend(freqs);
        for l in layers {
            let at = &l.attention;
            let same_shape = at.shape.heads == a.shape.heads
                && at.shape.kv_heads == a.shape.kv_heads
                && at.shape.head_dim == a.shape.head_dim
                && at.qk_norm.is_some() == a.qk_norm.is_some();
            if !same_shape || l.input_norm.1 != d.rms_eps || l.post_norm.1 != d.rms_eps {
                return None;
            }
            mats.extend([at.q, at.k, at.v, at.o].map(|m| m.raw()));
            match &l.mlp {
                FastMlp::Dense(g, u, dn) if moe.is_none() => {
                    mats.extend([g, u, dn].map(|m| m.raw()));
                }
                FastMlp::Experts(e) if Some(e.shape) == moe => {
                    mats.extend([e.gate, e.up, e.down, e.router].map(|m| m.raw()));
                }
                _ => return None,
            }
            vecs.extend([l.input_norm.0, l.post_norm.0]);
            if let Some(((qn, qe), (kn, ke))) = at.qk_norm {
                if qe != d.qk_eps || ke != d.qk_eps {
                    return None;
                }
                vecs.extend([qn, kn]);
            }
        }
        let ptrs: Vec<*mut c_void> = vecs.iter().map(|a| a.as_ptr().ctx).collect();
        let mut plan = std::ptr::null_mut();
        // SAFETY: `d`, `mats` and `ptrs` (and the arrays they point at) live
        // across the call; the plan copies the arrays it keeps.
        let status = unsafe {
            (lib.new)(
                &d,
                mats.as_ptr(),
                mats.len() as c_int,
                ptrs.as_ptr(),
                ptrs.len() as c_int,
                &mut plan,
            )
        };
        if status != 0 {
            eprintln!(
                "grove-runner: CUDA decode step not used for this model: {}",
                lib.last_error()
            );
            return None;
        }
        eprintln!("grove-runner: decode steps by Grove's CUDA step");
        Some(Self {
            plan,
            lib,
            layers: layers.len(),
        })
    }

    /// One decode step of `tokens` (`[B]` uint32, B <= [`MAX_ROWS`]) over
    /// the batch's caches: the logits `[B, vocab]`, with every layer's slot
    /// `idx` written. `None` (nothing changed) when the batch is not one it
    /// covers.
    pub fn step<C: DecodeSlots>(
        &self,
        tokens: &Array,
        caches: &mut [C],
    ) -> Result<Option<Array>, Exception> {
        let rows = tokens.size();
        if caches.len() != self.layers || rows == 0 || rows > MAX_ROWS || tokens.ndim() != 1 {
            return Ok(None);
        }
        // 1. Every layer's buffers with room for the new token.
        let mut bufs = Vec::with_capacity(2 * self.layers);
        let mut at: Option<(i32, Vec<i32>)> = None;
        for c in caches.iter_mut() {
            let Some((k, v, idx, left)) = c.decode_buffers()? else {
                return Ok(None);
            };
            match &at {
                Some((i, l)) if *i != idx || l.as_slice() != left.as_slice() => return Ok(None),
                _ => at = Some((idx, left)),
            }
            bufs.push(k);
            bufs.push(v);
        }
        let Some((idx, left)) = at else {
            return Ok(None);
        };
        if left.len() != rows {
            return Ok(None);
        }
        // 2. The graph node (its inputs must be on the stream already: the
        //    kernels are launched before what MLX has recorded but not sent).
        let stream = Stream::thread_local_or_default();
        let mut outs = vec![std::ptr::null_mut::<c_void>(); 1 + bufs.len()];
        let mut status = self.call(&stream, tokens, &bufs, idx, &left, &mut outs);
        if status == 3 {
            async_eval(std::iter::once(tokens).chain(bufs.iter()))?;
            status = self.call(&stream, tokens, &bufs, idx, &left, &mut outs);
        }
        if status == 2 {
            // More rows than this model's step takes: MLX's step.
            return Ok(None);
        }
        if status != 0 {
            // Not covered after all (nothing was made or changed): MLX's
            // step, said once.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!(
                    "grove-runner: CUDA decode step declined a batch ({}); MLX's step instead",
                    self.lib.last_error()
                )
            });
            return Ok(None);
        }
        // SAFETY: on status 0 every slot holds a new `mlx::core::array*`,
        // owned from here on by the Arrays made of it.
        let mut made = outs
            .into_iter()
            .map(|p| unsafe { Array::from_ptr(mlx_sys::mlx_array { ctx: p }) });
        let logits = made.next().ok_or_else(|| Exception::custom("no logits"))?;
        drop(bufs);
        for c in caches.iter_mut() {
            let (Some(k), Some(v)) = (made.next(), made.next()) else {
                return Err(Exception::custom("missing cache outputs"));
            };
            c.decode_written(k, v);
        }
        Ok(Some(logits))
    }

    fn call(
        &self,
        stream: &Stream,
        tokens: &Array,
        bufs: &[Array],
        idx: i32,
        left: &[i32],
        outs: &mut [*mut c_void],
    ) -> c_int {
        let ptrs: Vec<*mut c_void> = bufs.iter().map(|a| a.as_ptr().ctx).collect();
        // SAFETY: every pointer is a live mlx::core::array / Stream for the
        // call; `outs` has room for 1 + 2 * layers results.
        unsafe {
            (self.lib.step)(
                self.plan,
                stream.as_ptr().ctx,
                tokens.as_ptr().ctx,
                ptrs.as_ptr(),
                idx,
                left.as_ptr(),
                outs.as_mut_ptr(),
            )
        }
    }
}
