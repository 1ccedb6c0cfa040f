//! Llama (1, 2, 3.x): the plain pre-norm decoder with grouped-query attention,
//! SwiGLU and rotary positions (incl. Llama 3's frequency scaling); biases on
//! attention and MLP where the config says; sliding-window layers where
//! `layer_types` names them (as mlx-lm's llama reads it).
use std::path::Path;

use serde::Deserialize;

use super::config::{config_error, layer_count};
use super::layers::attention::AttentionShape;
use super::layers::decoder::DecoderSpec;
use super::layers::mlp::{Activation, MlpShape};
use super::layers::rope::{Rope, RopeScalingConfig};
use crate::cache::CacheKind;
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
    /// The window of `sliding_attention` layers.
    #[serde(default)]
    pub sliding_window: Option<i32>,
}

fn default_theta() -> f64 {
    10_000.0
}

impl Config {
    /// Each layer's kind: `layer_types` (full or sliding attention, as
    /// mlx-lm's llama reads them) or all full.
    pub fn kinds(&self, path: &Path) -> Result<Vec<CacheKind>> {
        let Some(types) = &self.layer_types else {
            return Ok(vec![
                CacheKind::Full;
                layer_count(path, self.num_hidden_layers)?
            ]);
        };
        if types.len() != layer_count(path, self.num_hidden_layers)? {
            return Err(config_error(
                path,
                format!(
                    "layer_types has {} entries for {} layers",
                    types.len(),
                    self.num_hidden_layers
                ),
            ));
        }
        types
            .iter()
            .map(|t| match t.as_str() {
                "full_attention" => Ok(CacheKind::Full),
                "sliding_attention" => match self.sliding_window {
                    Some(w) if w > 0 => Ok(CacheKind::Window(w)),
                    _ => Err(config_error(
                        path,
                        "sliding_attention layers need a positive sliding_window".into(),
                    )),
                },
                other => Err(config_error(
                    path,
                    format!("layer type {other:?} is not supported"),
                )),
            })
            .collect()
    }

    /// The decoder this config describes. `has_lm_head` says whether the
    /// checkpoint carries `lm_head.weight`.
    pub fn spec(&self, path: &Path, has_lm_head: bool) -> Result<DecoderSpec> {
        let heads = self.num_attention_heads;
        let head_dim = self.head_dim.unwrap_or(if heads > 0 {
            self.hidden_size / heads
        } else {
            0
        });
        let attention = AttentionShape {
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            ..AttentionShape::plain(
                self.hidden_size,
                heads,
                self.num_key_value_heads.unwrap_or(heads),
                head_dim,
            )
        };
        Ok(DecoderSpec {
            vocab: self.vocab_size,
            rms_eps: self.rms_norm_eps,
            attention,
            mlp: MlpShape {
                hidden: self.hidden_size,
                intermediate: self.intermediate_size,
                activation: Activation::Silu,
                bias: self.mlp_bias,
                fused: false,
            },
            rope: Rope::new(
                path,
                head_dim,
                self.rope_theta,
                self.rope_traditional,
                self.rope_scaling.as_ref(),
            )?,
            kinds: self.kinds(path)?,
            tie_embeddings: self.tie_word_embeddings.unwrap_or(!has_lm_head),
            head_parts: 1,
            moe: None,
            delta: None,
        })
    }
}
