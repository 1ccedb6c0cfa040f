//! Grouped-query self-attention with rotary positions: q/k/v as three
//! matrices or one fused `qkv_proj` (Phi-3), optional biases (Qwen2, Llama's
//! `attention_bias`), optional per-head q/k RMS norms (Qwen3, Gemma 3), the
//! score scale (Gemma's `query_pre_attn_scalar`) and tanh soft-capping of the
//! scores (Gemma 2), which `scaled_dot_product_attention` cannot do, so such
//! a layer computes attention in plain ops as mlx-lm's gemma2 does; and an
//! output gate (Qwen3-Next: `q_proj` also yields a per-head gate, and the
//! attention output is multiplied by its sigmoid before `o_proj`).
use mlx_rs::error::Exception;
use mlx_rs::ops::{expand_dims, select, softmax_axis, split_at_indices, tanh};
use mlx_rs::{Array, Dtype};

use super::cuda_decode::DecodeMat;
use super::linear::Linear;
use super::norm::RmsNorm;
use super::rope::Rope;
use crate::cache::quantized::quantized_attention;
use crate::cache::{AttentionMask, Fetched, LayerCache};
use crate::error::Result;
use crate::model::config::Quantization;
use crate::model::weights::Weights;

/// A per-head q/k RMS norm: its epsilon and the weight's offset (Gemma: 1).
#[derive(Debug, Clone, Copy)]
pub struct HeadNorm {
    pub eps: f32,
    pub offset: f32,
}

/// The shape of one attention block.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub hidden: i32,
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    /// Biases on q, k and v.
    pub qkv_bias: bool,
    /// A bias on o.
    pub o_bias: bool,
    /// RMS norms over each q and k head before the rotation.
    pub qk_norm: Option<HeadNorm>,
    /// The score scale; `None`: `head_dim^-0.5`.
    pub scale: Option<f32>,
    /// `tanh(scores / c) * c` before the softmax.
    pub softcap: Option<f32>,
    /// One `qkv_proj` holding q, k and v's rows.
    pub fused_qkv: bool,
    /// `q_proj` yields `[query, gate]` per head; out = o(attn * sigmoid(gate)).
    pub output_gate: bool,
    /// A learned sink logit per head that takes part in the softmax
    /// (`{prefix}.sinks`, gpt-oss).
    pub sinks: bool,
}

impl AttentionShape {
    /// A plain block: separate projections, no biases, norms or capping.
    pub fn plain(hidden: i32, heads: i32, kv_heads: i32, head_dim: i32) -> Self {
        Self {
            hidden,
            heads,
            kv_heads,
            head_dim,
            qkv_bias: false,
            o_bias: false,
            qk_norm: None,
            scale: None,
            softcap: None,
            fused_qkv: false,
            output_gate: false,
            sinks: false,
        }
    }
}

/// A norm's weight and epsilon.
pub(crate) type NormParts<'a> = (&'a Array, f32);

/// A plain attention block's parts ([`Attention::plain_parts`]).
pub(crate) struct PlainAttention<'a> {
    pub shape: AttentionShape,
    pub scale: f32,
    pub q: DecodeMat<'a>,
    pub k: DecodeMat<'a>,
    pub v: DecodeMat<'a>,
    pub o: DecodeMat<'a>,
    /// The q and k norms' weights and epsilons.
    pub qk_norm: Option<(NormParts<'a>, NormParts<'a>)>,
    pub rope: &'a Rope,
}

enum Projections {
    Separate { q: Linear, k: Linear, v: Linear },
    Fused(Linear),
}

/// One self-attention block.
pub struct Attention {
    shape: AttentionShape,
    scale: f32,
    projections: Projections,
    o: Linear,
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    rope: Rope,
    sinks: Option<Array>,
}

impl Attention {
    /// Loads `{prefix}.{q,k,v,o}_proj` (or `qkv_proj`; and `q_norm`/`k_norm`).
    pub fn load(
        w: &mut Weights,
        quant: &Quantization,
        prefix: &str,
        s: AttentionShape,
        rope: Rope,
    ) -> Result<Self> {
        let (q_out, kv_out) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let q_rows = if s.output_gate { 2 * q_out } else { q_out };
        let qk_norm = match s.qk_norm {
            Some(n) => Some((
                RmsNorm::load_offset(w, &format!("{prefix}.q_norm"), s.head_dim, n.eps, n.offset)?,
                RmsNorm::load_offset(w, &format!("{prefix}.k_norm"), s.head_dim, n.eps, n.offset)?,
            )),
            None => None,
        };
        let linear = |w: &mut Weights, name: &str, out: i32| {
            Linear::load(
                w,
                quant,
                &format!("{prefix}.{name}"),
                s.hidden,
                out,
                s.qkv_bias,
            )
        };
        let projections = if s.fused_qkv {
            Projections::Fused(linear(w, "qkv_proj", q_out + 2 * kv_out)?)
        } else {
            Projections::Separate {
                q: linear(w, "q_proj", q_rows)?,
                k: linear(w, "k_proj", kv_out)?,
                v: linear(w, "v_proj", kv_out)?,
            }
        };
        Ok(Self {
            shape: s,
            scale: s.scale.unwrap_or((s.head_dim as f32).powf(-0.5)),
            projections,
            o: Linear::load(
                w,
                quant,
                &format!("{prefix}.o_proj"),
                q_out,
                s.hidden,
                s.o_bias,
            )?,
            qk_norm,
            rope,
            sinks: if s.sinks {
                Some(w.take_float(&format!("{prefix}.sinks"), &[s.heads])?)
            } else {
                None
            },
        })
    }

    /// What Grove's CUDA decode step needs of a plain block (three dense
    /// projections without biases, no gate, sinks or capping): its shape,
    /// score scale, q/k/v/o weights, per-head norms and rotation.
    pub(crate) fn plain_parts(&self) -> Option<PlainAttention<'_>> {
        let s = &self.shape;
        if s.o_bias || s.output_gate || s.softcap.is_some() || self.sinks.is_some() {
            return None;
        }
        let Projections::Separate { q, k, v } = &self.projections else {
            return None;
        };
        Some(PlainAttention {
            shape: *s,
            scale: self.scale,
            q: q.decode_matrix()?,
            k: k.decode_matrix()?,
            v: v.decode_matrix()?,
            o: self.o.decode_matrix()?,
            qk_norm: self
                .qk_norm
                .as_ref()
                .map(|(qn, kn)| (qn.weight_eps(), kn.weight_eps())),
            rope: &self.rope,
        })
    }

    /// Attends `x` (`[B, L, hidden]`) over the cache plus itself, under `mask`
    /// (taken from the cache before this forward pass).
    pub fn forward(
        &self,
        x: &Array,
        cache: &mut impl LayerCache,
        mask: &AttentionMask,
    ) -> Result<Array, Exception> {
        let (b, l) = (x.dim(0), x.dim(1));
        let s = &self.shape;
        // 1. Project and split into heads: [B, L, H, D].
        let (q, k, v) = match &self.projections {
            Projections::Separate { q, k, v } => (q.forward(x)?, k.forward(x)?, v.forward(x)?),
            Projections::Fused(qkv) => {
                let q_out = s.heads * s.head_dim;
                let parts = split_at_indices(
                    qkv.forward(x)?,
                    &[q_out, q_out + s.kv_heads * s.head_dim],
                    -1,
                )?;
                (parts[0].clone(), parts[1].clone(), parts[2].clone())
            }
        };
        //    One position (a decode step) is already heads first in memory:
        //    [B, 1, H * D] reshapes straight to [B, H, 1, D], which saves the
        //    three transposes (graph nodes, each costing host time per step).
        let single = l == 1;
        let heads = |t: &Array, h: i32| {
            if single {
                t.reshape(&[b, h, 1, -1])
            } else {
                t.reshape(&[b, l, h, -1])
            }
        };
        let (q, gate) = if s.output_gate {
            let parts = split_at_indices(&heads(&q, s.heads)?, &[s.head_dim], -1)?;
            (parts[0].clone(), Some(parts[1].reshape(&[b, l, -1])?))
        } else {
            (heads(&q, s.heads)?, None)
        };
        let k = heads(&k, s.kv_heads)?;
        let v = heads(&v, s.kv_heads)?;
        // 2. Per-head norms (over the last axis), then heads first: [B, H, L, D].
        let (q, k) = match &self.qk_norm {
            Some((qn, kn)) => (qn.forward(&q)?, kn.forward(&k)?),
            None => (q, k),
        };
        let (q, k, v) = if single {
            (q, k, v)
        } else {
            (
                q.transpose_axes(&[0, 2, 1, 3])?,
                k.transpose_axes(&[0, 2, 1, 3])?,
                v.transpose_axes(&[0, 2, 1, 3])?,
            )
        };
        // 3. Rotate at the cache's positions and append to the cache.
        let positions = cache.positions()?;
        let q = self.rope.forward_at(&q, &positions)?;
        let k = self.rope.forward_at(&k, &positions)?;
        let fetched = cache.update_and_fetch_kv(&k, &v)?;
        // 4. Attention under the mask (causal within a chunk, padding hidden
        //    in a batch), over quantized keys and values as they are held.
        let out = match (fetched, s.softcap) {
            (Fetched::Float(k, v), None) => {
                super::cpu_fast::sdpa(&q, &k, &v, self.scale, mask.as_sdpa(), self.sinks.as_ref())?
            }
            (Fetched::Float(k, v), Some(cap)) => self.capped(&q, &k, &v, mask, cap)?,
            (
                Fetched::Quantized {
                    keys,
                    values,
                    quant,
                },
                None,
            ) if self.sinks.is_none() => {
                let mask = mask_array(mask, keys.time(), q.dim(2))?;
                quantized_attention(&q, &keys, &values, quant, self.scale, mask.as_ref())?
            }
            (Fetched::Quantized { .. }, _) => {
                return Err(Exception::custom(
                    "quantized KV attention takes no soft-capping or attention sinks",
                ));
            }
        };
        // 5. Merge heads and project out (one position: a reshape alone).
        let out = if single {
            out.reshape(&[b, 1, -1])?
        } else {
            out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?
        };
        match gate {
            Some(g) => self.o.forward(&out.multiply(mlx_rs::ops::sigmoid(&g)?)?),
            None => self.o.forward(&out),
        }
    }

    /// Attention with soft-capped scores, in mlx-lm gemma2's ops.
    fn capped(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        mask: &AttentionMask,
        cap: f32,
    ) -> Result<Array, Exception> {
        let s = &self.shape;
        let (b, l, d) = (q.dim(0), q.dim(2), q.dim(3));
        let repeats = s.heads / s.kv_heads;
        let dtype = q.dtype();
        let scalar = |x: f32| Array::from_f32(x).as_dtype(dtype);
        let mut q = q.multiply(scalar(self.scale)?)?;
        let (mut k, mut v) = (k.clone(), v.clone());
        if repeats > 1 {
            q = q.reshape(&[b, s.kv_heads, repeats, l, d])?;
            k = expand_dims(&k, 2)?;
            v = expand_dims(&v, 2)?;
        }
        let scores = softcap(&q.matmul(k.swap_axes(-1, -2)?)?, cap)?;
        let scores = match mask_array(mask, k.dim(-2), l)? {
            None => scores,
            Some(m) => {
                // A batch's [B, 1, N, K] mask lines up with [B, kv, repeats, N, K].
                let m = if repeats > 1 && m.ndim() == 4 {
                    expand_dims(&m, -3)?
                } else {
                    m
                };
                let lowest = Array::from_f32(dtype_min(dtype)).as_dtype(dtype)?;
                select(&m, &scores, &lowest)?
            }
        };
        let weights = softmax_axis(&scores, -1, true)?;
        let out = weights.matmul(&v)?;
        if repeats > 1 {
            out.reshape(&[b, s.heads, l, d])
        } else {
            Ok(out)
        }
    }
}

/// The mask as a boolean array for `l` queries over `keys` keys (mlx-lm's
/// "causal" string made an array), or none.
fn mask_array(mask: &AttentionMask, keys: i32, l: i32) -> Result<Option<Array>, Exception> {
    Ok(match mask {
        AttentionMask::None => None,
        AttentionMask::Causal => {
            let queries = Array::arange::<_, i32>(keys - l, keys, None)?.reshape(&[-1, 1])?;
            let all = Array::arange::<_, i32>(None, keys, None)?.reshape(&[1, -1])?;
            Some(queries.ge(&all)?)
        }
        AttentionMask::Array(m) => Some(m.clone()),
    })
}

/// `tanh(x / cap) * cap`, the cap in `x`'s dtype (Gemma's soft-capping).
pub fn softcap(x: &Array, cap: f32) -> Result<Array, Exception> {
    let cap = Array::from_f32(cap).as_dtype(x.dtype())?;
    tanh(x.divide(&cap)?)?.multiply(&cap)
}

/// `mx.finfo(dtype).min` of the float dtypes.
pub(crate) fn dtype_min(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::Float16 => -65504.0,
        Dtype::Bfloat16 => -3.389_531_4e38,
        _ => f32::MIN,
    }
}

impl Attention {
    /// The arrays this block holds.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out: Vec<&Array> = match &self.projections {
            Projections::Separate { q, k, v } => {
                [q, k, v].into_iter().flat_map(Linear::parameters).collect()
            }
            Projections::Fused(qkv) => qkv.parameters(),
        };
        out.extend(self.o.parameters());
        if let Some((qn, kn)) = &self.qk_norm {
            out.extend(qn.parameters());
            out.extend(kn.parameters());
        }
        out.extend(self.sinks.iter());
        out
    }
}
