//! Phi-3 and Phi-4 (`Phi3ForCausalLM`): the shared pre-norm decoder with one
//! fused `qkv_proj` and one fused `gate_up_proj` per layer, rotary positions
//! over a `partial_rotary_factor` of each head, and su/longrope scaling as
//! mlx-lm's `SuScaledRoPE` computes it (the long factors, and the input scale
//! from the ratio of context lengths). As in mlx-lm's phi3, every layer
//! attends over the whole context (`sliding_window` is not used).
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::config::{config_error, layer_count};
use super::layers::attention::AttentionShape;
use super::layers::decoder::DecoderSpec;
use super::layers::mlp::{Activation, MlpShape};
use super::layers::rope::{Rope, RopeScalingConfig};
use crate::cache::CacheKind;
use crate::error::Result;

/// `config.json` of a `Phi3ForCausalLM`, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    /// `type` (su, longrope or linear) with `long_factor` (and `short_factor`,
    /// which mlx-lm does not use), or `factor` for linear.
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "default_partial")]
    pub partial_rotary_factor: f64,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: u32,
    #[serde(default = "default_original")]
    pub original_max_position_embeddings: u32,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_theta() -> f64 {
    10_000.0
}
fn default_partial() -> f64 {
    1.0
}
fn default_max_positions() -> u32 {
    131_072
}
fn default_original() -> u32 {
    4096
}

/// A number or a list of numbers, as `long_factor` may be written.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Factors {
    One(f32),
    Many(Vec<f32>),
}

impl Config {
    /// The rotation, as mlx-lm's phi3 picks it.
    fn rope(&self, path: &Path, rope_dim: i32) -> Result<Rope> {
        let Some(scaling) = self.rope_scaling.as_ref().filter(|v| !v.is_null()) else {
            return Rope::new(path, rope_dim, self.rope_theta, self.rope_traditional, None);
        };
        let kind = scaling.get("type").and_then(Value::as_str);
        let (Some(kind), Some(long)) = (kind, scaling.get("long_factor")) else {
            return Err(config_error(
                path,
                "rope_scaling must contain keys {long_factor, type}".into(),
            ));
        };
        match kind {
            "su" | "longrope" => {
                let long: Factors = serde_json::from_value(long.clone())
                    .map_err(|e| config_error(path, format!("rope_scaling.long_factor: {e}")))?;
                let half = (rope_dim / 2) as usize;
                let long = match long {
                    Factors::One(f) => vec![f; half],
                    Factors::Many(v) if v.len() == half => v,
                    Factors::Many(v) => {
                        return Err(config_error(
                            path,
                            format!(
                                "rope_scaling.long_factor has {} entries; the rotated \
                                 head half has {half}",
                                v.len()
                            ),
                        ));
                    }
                };
                let factor = self.max_position_embeddings as f64
                    / self.original_max_position_embeddings.max(1) as f64;
                let scale = if factor <= 1.0 {
                    1.0
                } else {
                    (1.0 + factor.ln() / (self.original_max_position_embeddings as f64).ln()).sqrt()
                };
                Rope::su_scaled(rope_dim, self.rope_theta, &long, scale as f32)
                    .map_err(|e| config_error(path, e.to_string()))
            }
            "linear" => {
                let linear: RopeScalingConfig = serde_json::from_value(scaling.clone())
                    .map_err(|e| config_error(path, format!("rope_scaling: {e}")))?;
                Rope::new(
                    path,
                    rope_dim,
                    self.rope_theta,
                    self.rope_traditional,
                    Some(&linear),
                )
            }
            // mlx-lm warns and runs without scaling.
            _ => Rope::new(path, rope_dim, self.rope_theta, self.rope_traditional, None),
        }
    }

    /// The decoder this config describes.
    pub fn spec(&self, path: &Path) -> Result<DecoderSpec> {
        let heads = self.num_attention_heads;
        let head_dim = if heads > 0 {
            self.hidden_size / heads
        } else {
            0
        };
        if !(self.partial_rotary_factor > 0.0 && self.partial_rotary_factor <= 1.0) {
            return Err(config_error(
                path,
                format!(
                    "partial_rotary_factor must be in (0, 1], not {}",
                    self.partial_rotary_factor
                ),
            ));
        }
        let rope_dim = (head_dim as f64 * self.partial_rotary_factor) as i32;
        if rope_dim % 2 != 0 || rope_dim < 2 {
            return Err(config_error(
                path,
                format!("the rotated part of each head ({rope_dim}) must be even and positive"),
            ));
        }
        Ok(DecoderSpec {
            vocab: self.vocab_size,
            rms_eps: self.rms_norm_eps,
            attention: AttentionShape {
                fused_qkv: true,
                ..AttentionShape::plain(
                    self.hidden_size,
                    heads,
                    self.num_key_value_heads.unwrap_or(heads),
                    head_dim,
                )
            },
            mlp: MlpShape {
                hidden: self.hidden_size,
                intermediate: self.intermediate_size,
                activation: Activation::Silu,
                bias: false,
                fused: true,
            },
            rope: self.rope(path, rope_dim)?,
            kinds: vec![CacheKind::Full; layer_count(path, self.num_hidden_layers)?],
            tie_embeddings: self.tie_word_embeddings,
            head_parts: 1,
            moe: None,
            delta: None,
        })
    }
}
