//! Multi-head latent attention (DeepSeek's, as GLM-4.7-Flash uses it;
//! mlx-lm's `Glm4MoeLiteAttention` and `mla.py`): keys and values are one
//! shared latent vector per token (`kv_lora_rank` wide, normalised) plus a
//! small rotated key part; the cache holds only those. Queries go through a
//! low-rank projection; per head, `embed_q` maps the latent to keys and
//! `unembed_out` to values. A single token (decode) is attended in the
//! latent space (its query absorbed into it), a chunk in head space, as
//! mlx-lm does. The rotated part's scores enter as the attention's additive
//! mask.
use mlx_rs::error::Exception;
use mlx_rs::ops::{select, split_at_indices};
use mlx_rs::{Array, fast};

use super::attention::dtype_min;
use super::linear::{Linear, Packed};
use super::norm::RmsNorm;
use super::quant_ops::quantized_matmul_with;
use super::rope::Rope;
use crate::cache::{AttentionMask, LayerCache};
use crate::error::Result;
use crate::model::config::Quantization;
use crate::model::weights::Weights;

/// The sizes of one latent attention block.
#[derive(Debug, Clone, Copy)]
pub struct MlaShape {
    pub hidden: i32,
    pub heads: i32,
    /// `None`: a plain `q_proj`.
    pub q_lora_rank: Option<i32>,
    pub kv_lora_rank: i32,
    pub rope_dim: i32,
    pub nope_dim: i32,
    pub v_dim: i32,
    pub bias: bool,
    pub eps: f32,
    pub scale: f32,
}

/// Per-head matrices `[heads, out, in]` (mlx-lm's `MultiLinear`).
enum MultiLinear {
    Dense(Array),
    Quantized(Packed),
}

impl MultiLinear {
    fn load(
        w: &mut Weights,
        q: &Quantization,
        prefix: &str,
        (heads, out, inp): (i32, i32, i32),
    ) -> Result<Self> {
        match q.for_layer(prefix) {
            Some(params) if w.contains(&format!("{prefix}.scales")) => {
                let groups = inp / params.group_size.max(1);
                let (scales, biases) = w.take_scales(prefix, &[heads, out, groups], params.mode)?;
                Ok(Self::Quantized(Packed {
                    weight: w.take_packed(
                        &format!("{prefix}.weight"),
                        &[heads, out, inp * params.bits / 32],
                    )?,
                    scales,
                    biases,
                    params,
                }))
            }
            _ => Ok(Self::Dense(
                w.take_float(&format!("{prefix}.weight"), &[heads, out, inp])?,
            )),
        }
    }

    /// `x @ W^T` (`transpose`) or `x @ W`, per head.
    fn forward(&self, x: &Array, transpose: bool) -> Result<Array, Exception> {
        match self {
            Self::Dense(w) if transpose => x.matmul(w.swap_axes(-1, -2)?),
            Self::Dense(w) => x.matmul(w),
            Self::Quantized(p) => quantized_matmul_with(x, &p.as_ref(), transpose),
        }
    }

    fn parameters(&self) -> Vec<&Array> {
        match self {
            Self::Dense(w) => vec![w],
            Self::Quantized(p) => p.parameters(),
        }
    }
}

enum QueryProj {
    Plain(Linear),
    LowRank { a: Linear, norm: RmsNorm, b: Linear },
}

/// One loaded latent attention block.
pub struct Mla {
    shape: MlaShape,
    q: QueryProj,
    kv_a: Linear,
    kv_norm: RmsNorm,
    embed_q: MultiLinear,
    unembed_out: MultiLinear,
    o: Linear,
    rope: Rope,
}

impl Mla {
    /// Loads `{prefix}.{q_a_proj,q_a_layernorm,q_b_proj | q_proj}`,
    /// `kv_a_proj_with_mqa`, `kv_a_layernorm`, `embed_q`, `unembed_out`,
    /// `o_proj`.
    pub fn load(
        w: &mut Weights,
        q: &Quantization,
        prefix: &str,
        s: MlaShape,
        rope: Rope,
    ) -> Result<Self> {
        let p = |n: &str| format!("{prefix}.{n}");
        if w.contains(&p("kv_b_proj.weight")) {
            return Err(crate::error::RunnerError::Weights(format!(
                "{prefix}.kv_b_proj: this checkpoint keeps the original fused key/value \
                 projection; convert it with mlx_lm.convert first"
            )));
        }
        let q_dim = s.nope_dim + s.rope_dim;
        let q_proj = match s.q_lora_rank {
            None => QueryProj::Plain(Linear::load(
                w,
                q,
                &p("q_proj"),
                s.hidden,
                s.heads * q_dim,
                false,
            )?),
            Some(r) => QueryProj::LowRank {
                a: Linear::load(w, q, &p("q_a_proj"), s.hidden, r, s.bias)?,
                norm: RmsNorm::load(w, &p("q_a_layernorm"), r, s.eps)?,
                b: Linear::load(w, q, &p("q_b_proj"), r, s.heads * q_dim, false)?,
            },
        };
        Ok(Self {
            q: q_proj,
            kv_a: Linear::load(
                w,
                q,
                &p("kv_a_proj_with_mqa"),
                s.hidden,
                s.kv_lora_rank + s.rope_dim,
                s.bias,
            )?,
            kv_norm: RmsNorm::load(w, &p("kv_a_layernorm"), s.kv_lora_rank, s.eps)?,
            embed_q: MultiLinear::load(w, q, &p("embed_q"), (s.heads, s.kv_lora_rank, s.nope_dim))?,
            unembed_out: MultiLinear::load(
                w,
                q,
                &p("unembed_out"),
                (s.heads, s.v_dim, s.kv_lora_rank),
            )?,
            o: Linear::load(w, q, &p("o_proj"), s.heads * s.v_dim, s.hidden, s.bias)?,
            rope,
            shape: s,
        })
    }

    /// Attends `x` (`[B, L, hidden]`) over the cache (latents as keys,
    /// rotated key parts as values) plus itself, under `mask`.
    pub fn forward(
        &self,
        x: &Array,
        cache: &mut impl LayerCache,
        mask: &AttentionMask,
    ) -> Result<Array, Exception> {
        let s = &self.shape;
        let (b, l) = (x.dim(0), x.dim(1));
        // 1. Queries, split into the plain and the rotated part per head.
        let q = match &self.q {
            QueryProj::Plain(p) => p.forward(x)?,
            QueryProj::LowRank { a, norm, b } => b.forward(&norm.forward(&a.forward(x)?)?)?,
        };
        let q = q
            .reshape(&[b, l, s.heads, s.nope_dim + s.rope_dim])?
            .transpose_axes(&[0, 2, 1, 3])?;
        let qs = split_at_indices(&q, &[s.nope_dim], -1)?;
        let (q_nope, q_pe) = (&qs[0], &qs[1]);
        // 2. The latent (normalised) and the rotated key part of each token.
        let kv = self.kv_a.forward(x)?;
        let kvs = split_at_indices(&kv, &[s.kv_lora_rank], -1)?;
        let k_pe = kvs[1]
            .reshape(&[b, l, 1, s.rope_dim])?
            .transpose_axes(&[0, 2, 1, 3])?;
        let latent = self.kv_norm.forward(&kvs[0])?;
        // 3. Rotate, then cache the latents (as keys) and rotated parts.
        let positions = cache.positions()?;
        let q_pe = self.rope.forward_at(q_pe, &positions)?;
        let k_pe = self.rope.forward_at(&k_pe, &positions)?;
        let (latent, k_pe) = cache.update_and_fetch(&latent.expand_dims(1)?, &k_pe)?;
        // 4. Scores of the rotated parts, masked: the attention's additive mask.
        let scale = Array::from_f32(s.scale).as_dtype(q_pe.dtype())?;
        let mut pe_scores = q_pe.multiply(&scale)?.matmul(k_pe.swap_axes(-1, -2)?)?;
        let keys = latent.dim(2);
        let allowed = match mask {
            AttentionMask::None => None,
            AttentionMask::Array(m) => Some(m.clone()),
            AttentionMask::Causal => {
                let queries = Array::arange::<_, i32>(keys - l, keys, None)?.reshape(&[-1, 1])?;
                let all = Array::arange::<_, i32>(None, keys, None)?.reshape(&[1, -1])?;
                Some(queries.ge(&all)?)
            }
        };
        if let Some(m) = allowed {
            let lowest =
                Array::from_f32(dtype_min(pe_scores.dtype())).as_dtype(pe_scores.dtype())?;
            pe_scores = select(&m, &pe_scores, &lowest)?;
        }
        // 5. One token: attend in latent space; a chunk: in head space.
        let sdpa_mask = fast::ScaledDotProductAttentionMask::Array(&pe_scores);
        let out = if l == 1 {
            let q_lat = self.embed_q.forward(q_nope, true)?;
            let out =
                super::cpu_fast::sdpa(&q_lat, &latent, &latent, s.scale, Some(sdpa_mask), None)?;
            self.unembed_out.forward(&out, true)?
        } else {
            let k = self.embed_q.forward(&latent, false)?;
            let v = self.unembed_out.forward(&latent, true)?;
            super::cpu_fast::sdpa(q_nope, &k, &v, s.scale, Some(sdpa_mask), None)?
        };
        // 6. Merge heads and project out.
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        self.o.forward(&out)
    }

    /// The arrays this block holds.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out = match &self.q {
            QueryProj::Plain(p) => p.parameters(),
            QueryProj::LowRank { a, norm, b } => {
                let mut v = a.parameters();
                v.extend(norm.parameters());
                v.extend(b.parameters());
                v
            }
        };
        out.extend(self.kv_a.parameters());
        out.extend(self.kv_norm.parameters());
        out.extend(self.embed_q.parameters());
        out.extend(self.unembed_out.parameters());
        out.extend(self.o.parameters());
        out
    }
}
