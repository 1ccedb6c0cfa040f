//! Gemma 4's `config.json` (or a `gemma4` checkpoint's `text_config`) with
//! mlx-lm's defaults: layer types and each type's rotation.
use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::Result;
use crate::model::config::{Architecture, config_error, layer_count, typed};
use crate::model::layers::rope::{Rope, RopeScalingConfig};

/// One layer type's rotation (`rope_parameters[type]`).
#[derive(Debug, Clone, Deserialize, Default)]
pub struct RopeParams {
    #[serde(default)]
    pub rope_type: Option<String>,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    #[serde(default)]
    pub factor: Option<f64>,
}

/// `config.json` of a Gemma 4 text model, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(default = "d::hidden")]
    pub hidden_size: i32,
    #[serde(default = "d::layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "d::intermediate")]
    pub intermediate_size: i32,
    #[serde(default = "d::heads")]
    pub num_attention_heads: i32,
    #[serde(default = "d::head_dim")]
    pub head_dim: i32,
    #[serde(default = "d::global_head_dim")]
    pub global_head_dim: i32,
    #[serde(default = "d::eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "d::vocab")]
    pub vocab_size: i32,
    #[serde(default = "d::vocab")]
    pub vocab_size_per_layer_input: i32,
    #[serde(default = "d::kv_heads")]
    pub num_key_value_heads: i32,
    #[serde(default)]
    pub num_global_key_value_heads: Option<i32>,
    #[serde(default = "d::shared")]
    pub num_kv_shared_layers: i32,
    #[serde(default = "d::per_layer")]
    pub hidden_size_per_layer_input: i32,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_parameters: Option<HashMap<String, RopeParams>>,
    #[serde(default = "d::window")]
    pub sliding_window: i32,
    #[serde(default = "d::pattern")]
    pub sliding_window_pattern: i32,
    #[serde(default = "d::max_positions")]
    pub max_position_embeddings: u32,
    #[serde(default)]
    pub attention_k_eq_v: bool,
    #[serde(default = "d::cap")]
    pub final_logit_softcapping: Option<f32>,
    #[serde(default = "d::yes")]
    pub use_double_wide_mlp: bool,
    #[serde(default)]
    pub enable_moe_block: bool,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default = "d::yes")]
    pub tie_word_embeddings: bool,
}

mod d {
    pub fn hidden() -> i32 {
        1536
    }
    pub fn layers() -> i32 {
        35
    }
    pub fn intermediate() -> i32 {
        6144
    }
    pub fn heads() -> i32 {
        8
    }
    pub fn head_dim() -> i32 {
        256
    }
    pub fn global_head_dim() -> i32 {
        512
    }
    pub fn eps() -> f32 {
        1e-6
    }
    pub fn vocab() -> i32 {
        262_144
    }
    pub fn kv_heads() -> i32 {
        1
    }
    pub fn shared() -> i32 {
        20
    }
    pub fn per_layer() -> i32 {
        256
    }
    pub fn window() -> i32 {
        512
    }
    pub fn pattern() -> i32 {
        5
    }
    pub fn max_positions() -> u32 {
        131_072
    }
    pub fn cap() -> Option<f32> {
        Some(30.0)
    }
    pub fn yes() -> bool {
        true
    }
}

impl Config {
    /// The text model's config: the file itself (`gemma4_text`) or its
    /// `text_config` (`gemma4`).
    pub fn parse(path: &Path, raw: &Value, arch: Architecture) -> Result<Self> {
        if arch != Architecture::Gemma4 {
            return typed(path, raw);
        }
        // mlx-lm's gemma4 ModelArgs: the outer vocab size, head defaults.
        let Some(Value::Object(text)) = raw.get("text_config") else {
            return Err(config_error(
                path,
                "gemma4 needs a text_config object".into(),
            ));
        };
        let mut text = text.clone();
        let vocab = raw
            .get("vocab_size")
            .cloned()
            .unwrap_or(Value::from(262_144));
        text.insert("vocab_size".into(), vocab);
        text.entry("num_attention_heads").or_insert(Value::from(8));
        text.entry("num_key_value_heads").or_insert(Value::from(1));
        typed(path, &Value::Object(text))
    }

    /// Whether each layer is global (else sliding): `layer_types`, or the
    /// pattern of `sliding_window_pattern - 1` sliding layers and a global one.
    pub(super) fn globals(&self, path: &Path) -> Result<Vec<bool>> {
        let n = layer_count(path, self.num_hidden_layers)?;
        match &self.layer_types {
            Some(types) if types.len() == n => types
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(true),
                    "sliding_attention" => Ok(false),
                    other => Err(config_error(
                        path,
                        format!("layer type {other:?} is not supported"),
                    )),
                })
                .collect(),
            Some(types) => Err(config_error(
                path,
                format!("layer_types has {} entries for {n} layers", types.len()),
            )),
            None => {
                let p = self.sliding_window_pattern.max(1) as usize;
                Ok((0..n).map(|i| i % p == p - 1).collect())
            }
        }
    }

    /// A layer type's rotation, as mlx-lm's `initialize_rope` reads
    /// `rope_parameters` (defaults: global proportional over a quarter of the
    /// head at base 1e6, sliding plain at base 1e4).
    pub(super) fn rope(&self, path: &Path, global: bool, dims: i32) -> Result<Rope> {
        let key = if global {
            "full_attention"
        } else {
            "sliding_attention"
        };
        let params = match &self.rope_parameters {
            Some(all) => all.get(key).cloned().unwrap_or_default(),
            None if global => RopeParams {
                rope_type: Some("proportional".into()),
                rope_theta: Some(1_000_000.0),
                partial_rotary_factor: Some(0.25),
                factor: None,
            },
            None => RopeParams {
                rope_type: Some("default".into()),
                rope_theta: Some(10_000.0),
                partial_rotary_factor: Some(1.0),
                factor: None,
            },
        };
        let base = params.rope_theta.unwrap_or(10_000.0);
        let traditional = self.rope_traditional;
        match params.rope_type.as_deref().unwrap_or("default") {
            "default" => Rope::new(path, dims, base, traditional, None),
            "linear" => {
                let scaling = RopeScalingConfig {
                    rope_type: Some("linear".into()),
                    kind: None,
                    factor: params.factor,
                    low_freq_factor: None,
                    high_freq_factor: None,
                    original_max_position_embeddings: None,
                    mscale_all_dim: None,
                };
                Rope::new(path, dims, base, traditional, Some(&scaling))
            }
            "proportional" => {
                let rotated = (dims as f64 * params.partial_rotary_factor.unwrap_or(1.0)) as i32;
                Rope::proportional(
                    path,
                    dims,
                    rotated,
                    traditional,
                    base,
                    params.factor.unwrap_or(1.0),
                )
            }
            other => Err(config_error(
                path,
                format!("unsupported {key} rope_type {other:?} (default, linear, proportional)"),
            )),
        }
    }
}
