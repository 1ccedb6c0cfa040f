//! Llama (1, 2, 3.x): the plain pre-norm decoder with grouped-query attention,
//! SwiGLU and rotary positions (incl. Llama 3's frequency scaling).
use std::path::Path;

use serde::Deserialize;

use super::config::config_error;
use super::layers::attention::AttentionShape;
use super::layers::decoder::DecoderSpec;
use super::layers::rope::RopeScalingConfig;
use crate::error::Result;

/// `config.json` of a `LlamaForCausalLM`, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub max_position_embeddings: Option<u32>,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<RopeScalingConfig>,
    /// Absent means: tied unless the checkpoint has its own `lm_head`.
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
}

fn default_theta() -> f64 {
    10_000.0
}

impl Config {
    /// The decoder this config describes. `has_lm_head` says whether the
    /// checkpoint carries `lm_head.weight`.
    pub fn spec(&self, path: &Path, has_lm_head: bool) -> Result<DecoderSpec> {
        if self.mlp_bias {
            return Err(config_error(
                path,
                "mlp_bias = true is not supported".into(),
            ));
        }
        if let Some(types) = &self.layer_types
            && let Some(other) = types.iter().find(|t| t.as_str() != "full_attention")
        {
            return Err(config_error(
                path,
                format!("layer type {other:?} is not supported yet"),
            ));
        }
        let heads = self.num_attention_heads;
        Ok(DecoderSpec {
            vocab: self.vocab_size,
            layers: self.num_hidden_layers,
            intermediate: self.intermediate_size,
            rms_eps: self.rms_norm_eps,
            attention: AttentionShape {
                hidden: self.hidden_size,
                heads,
                kv_heads: self.num_key_value_heads.unwrap_or(heads),
                head_dim: self.head_dim.unwrap_or(if heads > 0 {
                    self.hidden_size / heads
                } else {
                    0
                }),
                qkv_bias: self.attention_bias,
                o_bias: self.attention_bias,
                qk_norm_eps: None,
            },
            rope_theta: self.rope_theta,
            rope_traditional: self.rope_traditional,
            rope_scaling: self.rope_scaling.clone(),
            tie_embeddings: self.tie_word_embeddings.unwrap_or(!has_lm_head),
        })
    }
}
