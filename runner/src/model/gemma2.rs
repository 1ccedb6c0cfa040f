//! Gemma 2: Gemma's sandwich-norm blocks with GELU, tanh soft-capping of the
//! attention scores and of the final logits, `query_pre_attn_scalar`
//! scaling, embeddings scaled by sqrt(hidden) and always tied. As in mlx-lm's
//! gemma2, every layer attends over the whole context (the config's
//! `sliding_window` is not used there either).
use std::path::Path;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use super::Dims;
use super::config::{Quantization, check_eps, config_error, layer_count};
use super::layers::attention::{AttentionShape, softcap};
use super::layers::embedding::Embedding;
use super::layers::masks::Masks;
use super::layers::mlp::{Activation, MlpShape};
use super::layers::norm::RmsNorm;
use super::layers::rope::Rope;
use super::layers::sandwich::SandwichBlock;
use super::weights::Weights;
use crate::cache::{CacheKind, LayerCache};
use crate::error::Result;

/// `config.json` of a `Gemma2ForCausalLM`, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub head_dim: i32,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default = "default_attn_cap")]
    pub attn_logit_softcapping: f32,
    #[serde(default = "default_final_cap")]
    pub final_logit_softcapping: f32,
    #[serde(default = "default_scalar")]
    pub query_pre_attn_scalar: f64,
    #[serde(default)]
    pub max_position_embeddings: Option<u32>,
}

fn default_theta() -> f64 {
    10_000.0
}
fn default_attn_cap() -> f32 {
    50.0
}
fn default_final_cap() -> f32 {
    30.0
}
fn default_scalar() -> f64 {
    144.0
}

/// A loaded Gemma 2 model.
pub struct Gemma2 {
    dims: Dims,
    embed: Embedding,
    blocks: Vec<SandwichBlock>,
    norm: RmsNorm,
    final_cap: f32,
}

impl Gemma2 {
    /// Builds the model from HF-named weights.
    pub fn load(path: &Path, w: &mut Weights, quant: &Quantization, c: &Config) -> Result<Self> {
        let dims = Dims {
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            kinds: vec![CacheKind::Full; layer_count(path, c.num_hidden_layers)?],
            kv_widths: None,
            recurrent_elements: None,
        };
        dims.validate(path)?;
        check_eps(path, c.rms_norm_eps)?;
        let positive = [
            ("attn_logit_softcapping", c.attn_logit_softcapping as f64),
            ("final_logit_softcapping", c.final_logit_softcapping as f64),
            ("query_pre_attn_scalar", c.query_pre_attn_scalar),
        ];
        for (name, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(config_error(
                    path,
                    format!("{name} must be positive, not {v}"),
                ));
            }
        }
        let attention = AttentionShape {
            scale: Some((1.0 / c.query_pre_attn_scalar.sqrt()) as f32),
            softcap: Some(c.attn_logit_softcapping),
            ..AttentionShape::plain(
                c.hidden_size,
                c.num_attention_heads,
                c.num_key_value_heads,
                c.head_dim,
            )
        };
        let mlp = MlpShape::plain(c.hidden_size, c.intermediate_size, Activation::GeluApprox);
        let rope = Rope::new(path, c.head_dim, c.rope_theta, c.rope_traditional, None)?;
        let embed = Embedding::load(w, quant, "model.embed_tokens", c.vocab_size, c.hidden_size)?;
        let mut blocks = Vec::new();
        for i in 0..dims.kinds.len() {
            blocks.push(SandwichBlock::load(
                w,
                quant,
                &format!("model.layers.{i}"),
                c.rms_norm_eps,
                attention,
                rope.clone(),
                mlp,
            )?);
        }
        let norm = RmsNorm::load_offset(w, "model.norm", c.hidden_size, c.rms_norm_eps, 1.0)?;
        // The head is always the embeddings.
        w.discard(|name| name.starts_with("lm_head."));
        Ok(Self {
            dims,
            embed,
            blocks,
            norm,
            final_cap: c.final_logit_softcapping,
        })
    }

    /// The model's sizes and layer kinds.
    pub fn dims(&self) -> &Dims {
        &self.dims
    }

    /// Runs `tokens` (`[B, L]`) through every block, appending to `caches`.
    pub fn forward<C: LayerCache>(
        &self,
        tokens: &Array,
        caches: &mut [C],
    ) -> Result<Array, Exception> {
        // 1. Embed the tokens and scale them by sqrt(hidden).
        let h = self.embed.forward(tokens)?;
        let scale = Array::from_f32((self.dims.hidden as f64).sqrt() as f32).as_dtype(h.dtype())?;
        let mut h = h.multiply(&scale)?;
        // 2. One causal mask for every layer.
        let masks = Masks::new(&self.dims.kinds, caches, tokens.dim(1))?;
        // 3. Each block.
        for (block, cache) in self.blocks.iter().zip(caches.iter_mut()) {
            h = block.forward(&h, cache, masks.of(CacheKind::Full), false)?;
        }
        // 4. Final norm.
        self.norm.forward(&h)
    }

    /// Tied logits, soft-capped: `tanh(x / c) * c`.
    pub fn logits(&self, hidden: &Array) -> Result<Array, Exception> {
        softcap(&self.embed.as_linear(hidden)?, self.final_cap)
    }

    /// Every weight array.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out = self.embed.parameters();
        for b in &self.blocks {
            out.extend(b.parameters());
        }
        out.extend(self.norm.parameters());
        out
    }

    /// The dtype activations are computed in.
    pub fn compute_dtype(&self) -> Dtype {
        self.norm.parameters()[0].dtype()
    }
}
