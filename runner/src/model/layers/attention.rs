//! Grouped-query self-attention with rotary positions, optional q/k/v biases
//! (Qwen2) and optional per-head q/k RMS norms (Qwen3).
use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::fast;

use super::linear::Linear;
use super::norm::RmsNorm;
use super::rope::Rope;
use crate::cache::{AttentionMask, LayerCache};
use crate::error::Result;
use crate::model::config::Quantization;
use crate::model::weights::Weights;

/// The shape of one attention block.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub hidden: i32,
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    /// Biases on q, k and v (not o).
    pub qkv_bias: bool,
    /// Biases on o too (Llama's `attention_bias`).
    pub o_bias: bool,
    /// RMS norms over each q and k head before the rotation, with this epsilon.
    pub qk_norm_eps: Option<f32>,
}

/// One self-attention block.
pub struct Attention {
    shape: AttentionShape,
    scale: f32,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    rope: Rope,
}

impl Attention {
    /// Loads `{prefix}.{q,k,v,o}_proj` (and `q_norm`/`k_norm`).
    pub fn load(
        w: &mut Weights,
        quant: &Quantization,
        prefix: &str,
        s: AttentionShape,
        rope: Rope,
    ) -> Result<Self> {
        let (q_out, kv_out) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let qk_norm = match s.qk_norm_eps {
            Some(eps) => Some((
                RmsNorm::load(w, &format!("{prefix}.q_norm"), s.head_dim, eps)?,
                RmsNorm::load(w, &format!("{prefix}.k_norm"), s.head_dim, eps)?,
            )),
            None => None,
        };
        Ok(Self {
            shape: s,
            scale: (s.head_dim as f32).powf(-0.5),
            q: Linear::load(
                w,
                quant,
                &format!("{prefix}.q_proj"),
                s.hidden,
                q_out,
                s.qkv_bias,
            )?,
            k: Linear::load(
                w,
                quant,
                &format!("{prefix}.k_proj"),
                s.hidden,
                kv_out,
                s.qkv_bias,
            )?,
            v: Linear::load(
                w,
                quant,
                &format!("{prefix}.v_proj"),
                s.hidden,
                kv_out,
                s.qkv_bias,
            )?,
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
        let q = self.q.forward(x)?.reshape(&[b, l, s.heads, -1])?;
        let k = self.k.forward(x)?.reshape(&[b, l, s.kv_heads, -1])?;
        let v = self.v.forward(x)?.reshape(&[b, l, s.kv_heads, -1])?;
        // 2. Per-head norms (Qwen3), then heads first: [B, H, L, D].
        let (q, k) = match &self.qk_norm {
            Some((qn, kn)) => (qn.forward(&q)?, kn.forward(&k)?),
            None => (q, k),
        };
        let q = q.transpose_axes(&[0, 2, 1, 3])?;
        let k = k.transpose_axes(&[0, 2, 1, 3])?;
        let v = v.transpose_axes(&[0, 2, 1, 3])?;
        // 3. Rotate at the cache's positions and append to the cache.
        let positions = cache.positions()?;
        let q = self.rope.forward_at(&q, &positions)?;
        let k = self.rope.forward_at(&k, &positions)?;
        let (k, v) = cache.update_and_fetch(&k, &v)?;
        // 4. Attention under the mask (causal within a chunk, padding hidden in a batch).
        let out = fast::scaled_dot_product_attention(&q, &k, &v, self.scale, mask.as_sdpa(), None)?;
        // 5. Merge heads and project out.
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        self.o.forward(&out)
    }
}

impl Attention {
    /// The arrays this block holds.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out: Vec<&Array> = [&self.q, &self.k, &self.v, &self.o]
            .into_iter()
            .flat_map(Linear::parameters)
            .collect();
        if let Some((qn, kn)) = &self.qk_norm {
            out.extend(qn.parameters());
            out.extend(kn.parameters());
        }
        out
    }
}
