//! Gemma's block: every sub-layer between two norms (`h += post(attn(pre(h)))`,
//! likewise the MLP), all norms `1 + weight`. Gemma 3 clips the residual sum
//! to float16's range when it computes in float16 (mlx-lm's `clip_residual`).
use mlx_rs::error::Exception;
use mlx_rs::ops::clip;
use mlx_rs::{Array, Dtype};

use super::attention::{Attention, AttentionShape};
use super::mlp::{Mlp, MlpShape};
use super::norm::RmsNorm;
use super::rope::Rope;
use crate::cache::{AttentionMask, LayerCache};
use crate::error::Result;
use crate::model::config::Quantization;
use crate::model::weights::Weights;

/// One sandwich-norm block.
pub struct SandwichBlock {
    input_norm: RmsNorm,
    attention: Attention,
    post_attention_norm: RmsNorm,
    pre_feedforward_norm: RmsNorm,
    mlp: Mlp,
    post_feedforward_norm: RmsNorm,
}

/// `x + y`; with `clip`, in float32 and clipped to float16's range when `x`
/// is float16.
fn residual(x: &Array, y: &Array, clip_f16: bool) -> Result<Array, Exception> {
    if !clip_f16 || x.dtype() != Dtype::Float16 {
        return x.add(y);
    }
    let bound = 65504.0f32;
    let sum = x
        .as_dtype(Dtype::Float32)?
        .add(y.as_dtype(Dtype::Float32)?)?;
    clip(&sum, (-bound, bound))?.as_dtype(Dtype::Float16)
}

impl SandwichBlock {
    /// Loads `{prefix}.{input_layernorm, self_attn, post_attention_layernorm,
    /// pre_feedforward_layernorm, mlp, post_feedforward_layernorm}`.
    pub fn load(
        w: &mut Weights,
        quant: &Quantization,
        prefix: &str,
        eps: f32,
        attention: AttentionShape,
        rope: Rope,
        mlp: MlpShape,
    ) -> Result<Self> {
        let hidden = attention.hidden;
        let norm = |w: &mut Weights, name: &str| {
            RmsNorm::load_offset(w, &format!("{prefix}.{name}"), hidden, eps, 1.0)
        };
        Ok(Self {
            input_norm: norm(w, "input_layernorm")?,
            attention: Attention::load(w, quant, &format!("{prefix}.self_attn"), attention, rope)?,
            post_attention_norm: norm(w, "post_attention_layernorm")?,
            pre_feedforward_norm: norm(w, "pre_feedforward_layernorm")?,
            mlp: Mlp::load(w, quant, &format!("{prefix}.mlp"), mlp)?,
            post_feedforward_norm: norm(w, "post_feedforward_layernorm")?,
        })
    }

    /// The block on `x` (`[B, L, hidden]`).
    pub fn forward(
        &self,
        x: &Array,
        cache: &mut impl LayerCache,
        mask: &AttentionMask,
        clip_f16: bool,
    ) -> Result<Array, Exception> {
        let r = self
            .attention
            .forward(&self.input_norm.forward(x)?, cache, mask)?;
        let h = residual(x, &self.post_attention_norm.forward(&r)?, clip_f16)?;
        let r = self.mlp.forward(&self.pre_feedforward_norm.forward(&h)?)?;
        residual(&h, &self.post_feedforward_norm.forward(&r)?, clip_f16)
    }

    /// The arrays this block holds.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out = self.input_norm.parameters();
        out.extend(self.attention.parameters());
        out.extend(self.post_attention_norm.parameters());
        out.extend(self.pre_feedforward_norm.parameters());
        out.extend(self.mlp.parameters());
        out.extend(self.post_feedforward_norm.parameters());
        out
    }
}
