//! Qwen2 / Qwen2.5: Llama's decoder with biases on the q, k and v projections.
use std::path::Path;

use serde::Deserialize;

use super::config::layer_count;
use super::layers::attention::{AttentionShape, HeadNorm};
use super::layers::decoder::DecoderSpec;
use super::layers::mlp::{Activation, MlpShape};
use super::layers::rope::{Rope, RopeScalingConfig};
use crate::cache::CacheKind;
use crate::error::Result;

/// `config.json` of a `Qwen2ForCausalLM`, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: u32,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<RopeScalingConfig>,
    #[serde(default = "default_tie")]
    pub tie_word_embeddings: bool,
}

fn default_max_positions() -> u32 {
    32_768
}
fn default_theta() -> f64 {
    1_000_000.0
}
fn default_tie() -> bool {
    true
}

impl Config {
    /// The decoder this config describes.
    pub fn spec(&self, path: &Path) -> Result<DecoderSpec> {
        self.spec_with(path, None, true, None)
    }

    /// Shared with Qwen3, which changes the head size, the biases and adds q/k norms.
    pub(super) fn spec_with(
        &self,
        path: &Path,
        head_dim: Option<i32>,
        qkv_bias: bool,
        qk_norm_eps: Option<f32>,
    ) -> Result<DecoderSpec> {
        let heads = self.num_attention_heads;
        let head_dim = head_dim.unwrap_or(if heads > 0 {
            self.hidden_size / heads
        } else {
            0
        });
        Ok(DecoderSpec {
            vocab: self.vocab_size,
            rms_eps: self.rms_norm_eps,
            attention: AttentionShape {
                qkv_bias,
                qk_norm: qk_norm_eps.map(|eps| HeadNorm { eps, offset: 0.0 }),
                ..AttentionShape::plain(self.hidden_size, heads, self.num_key_value_heads, head_dim)
            },
            mlp: MlpShape::plain(self.hidden_size, self.intermediate_size, Activation::Silu),
            rope: Rope::new(
                path,
                head_dim,
                self.rope_theta,
                self.rope_traditional,
                self.rope_scaling.as_ref(),
            )?,
            kinds: vec![CacheKind::Full; layer_count(path, self.num_hidden_layers)?],
            tie_embeddings: self.tie_word_embeddings,
            head_parts: 1,
            moe: None,
            delta: None,
        })
    }
}
