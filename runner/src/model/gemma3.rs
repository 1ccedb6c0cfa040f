//! Gemma 3 (`gemma3_text`, and the text part of `gemma3` checkpoints, whose
//! vision tower and projector are skipped): sandwich-norm blocks with GELU,
//! q/k norms, `query_pre_attn_scalar` scaling, embeddings scaled by
//! sqrt(hidden) rounded to bfloat16, and sliding-window layers (local rope
//! base) between global ones (every `sliding_window_pattern`-th layer, or as
//! `layer_types` says), as mlx-lm's gemma3_text.
use std::collections::HashMap;
use std::path::Path;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};
use serde::Deserialize;
use serde_json::Value;

use super::Dims;
use super::config::{Architecture, Quantization, check_eps, config_error, layer_count, typed};
use super::layers::attention::{AttentionShape, HeadNorm};
use super::layers::embedding::Embedding;
use super::layers::linear::Linear;
use super::layers::masks::Masks;
use super::layers::mlp::{Activation, MlpShape};
use super::layers::norm::RmsNorm;
use super::layers::rope::{Rope, RopeScalingConfig};
use super::layers::sandwich::SandwichBlock;
use super::weights::Weights;
use crate::cache::{CacheKind, LayerCache};
use crate::error::Result;

/// Where a `gemma3` checkpoint keeps its text model.
pub const TEXT_PREFIX: &str = "language_model.";

/// `config.json` of a Gemma 3 text model (a `gemma3` checkpoint's
/// `text_config`), with mlx-lm's defaults.
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
    #[serde(default = "d::eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "d::vocab")]
    pub vocab_size: i32,
    #[serde(default = "d::kv_heads")]
    pub num_key_value_heads: i32,
    #[serde(default = "d::theta")]
    pub rope_theta: f64,
    #[serde(default = "d::local_theta")]
    pub rope_local_base_freq: f64,
    #[serde(default = "d::scalar")]
    pub query_pre_attn_scalar: f64,
    #[serde(default = "d::window")]
    pub sliding_window: i32,
    #[serde(default = "d::pattern")]
    pub sliding_window_pattern: i32,
    #[serde(default = "d::max_positions")]
    pub max_position_embeddings: u32,
    #[serde(default)]
    pub rope_scaling: Option<RopeScalingConfig>,
    /// HF's per-layer types; when absent, the pattern decides.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
}

mod d {
    pub fn hidden() -> i32 {
        1152
    }
    pub fn layers() -> i32 {
        26
    }
    pub fn intermediate() -> i32 {
        6912
    }
    pub fn heads() -> i32 {
        4
    }
    pub fn head_dim() -> i32 {
        256
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
    pub fn theta() -> f64 {
        1_000_000.0
    }
    pub fn local_theta() -> f64 {
        10_000.0
    }
    pub fn scalar() -> f64 {
        256.0
    }
    pub fn window() -> i32 {
        512
    }
    pub fn pattern() -> i32 {
        6
    }
    pub fn max_positions() -> u32 {
        32_768
    }
}

impl Config {
    /// The text model's config: the file itself (`gemma3_text`) or its
    /// `text_config` (`gemma3`, with the outer `vocab_size` and mlx-lm's
    /// head-count defaults).
    pub fn parse(path: &Path, raw: &Value, arch: Architecture) -> Result<Self> {
        if arch != Architecture::Gemma3 {
            return typed(path, raw);
        }
        let Some(Value::Object(text)) = raw.get("text_config") else {
            return Err(config_error(
                path,
                "gemma3 needs a text_config object".into(),
            ));
        };
        let mut text = text.clone();
        let vocab = raw
            .get("vocab_size")
            .cloned()
            .unwrap_or(Value::from(262_208));
        text.insert("vocab_size".into(), vocab);
        text.entry("num_attention_heads").or_insert(Value::from(8));
        text.entry("num_key_value_heads").or_insert(Value::from(4));
        typed(path, &Value::Object(text))
    }

    /// Each layer's kind: `layer_types`, else every `sliding_window_pattern`-th
    /// layer global and the others windowed.
    fn kinds(&self, path: &Path) -> Result<Vec<CacheKind>> {
        let n = layer_count(path, self.num_hidden_layers)?;
        let window = CacheKind::Window(self.sliding_window);
        match &self.layer_types {
            Some(types) => {
                if types.len() != n {
                    return Err(config_error(
                        path,
                        format!("layer_types has {} entries for {n} layers", types.len()),
                    ));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        "full_attention" => Ok(CacheKind::Full),
                        "sliding_attention" => Ok(window),
                        other => Err(config_error(
                            path,
                            format!("layer type {other:?} is not supported"),
                        )),
                    })
                    .collect()
            }
            None => {
                let p = self.sliding_window_pattern;
                if p < 1 {
                    return Err(config_error(
                        path,
                        format!("sliding_window_pattern must be positive, not {p}"),
                    ));
                }
                Ok((0..n as i32)
                    .map(|i| {
                        if i % p == p - 1 {
                            CacheKind::Full
                        } else {
                            window
                        }
                    })
                    .collect())
            }
        }
    }
}

/// What a multimodal Gemma checkpoint holds besides its text model.
const SKIPPED: [&str; 7] = [
    "vision_tower.",
    "visual.",
    "multi_modal_projector.",
    "audio_tower.",
    "embed_audio.",
    "embed_vision.",
    "vision_embedder.",
];

/// Drops a multimodal checkpoint's vision (and audio) towers and projectors
/// (with a log line) and names its text model's weights as a text
/// checkpoint's (Gemma 3 and Gemma 4).
pub fn take_text_part(tensors: &mut HashMap<String, Array>) {
    let names: Vec<String> = tensors.keys().cloned().collect();
    let mut skipped = 0;
    for name in names {
        let Some(t) = tensors.remove(&name) else {
            continue;
        };
        let bare = name.strip_prefix("model.").unwrap_or(&name);
        if SKIPPED.iter().any(|p| bare.starts_with(p)) {
            skipped += 1;
        } else if let Some(rest) = name.strip_prefix("model.language_model.") {
            tensors.insert(format!("model.{rest}"), t);
        } else if let Some(rest) = name.strip_prefix(TEXT_PREFIX) {
            tensors.insert(rest.to_owned(), t);
        } else {
            tensors.insert(name, t);
        }
    }
    if skipped > 0 {
        eprintln!("grove-runner: skipped {skipped} vision/audio tensors (text only)");
    }
}

/// A loaded Gemma 3 text model.
pub struct Gemma3 {
    dims: Dims,
    embed: Embedding,
    blocks: Vec<SandwichBlock>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    /// sqrt(hidden) rounded to bfloat16, as mlx-lm scales the embeddings.
    embed_scale: f32,
}

impl Gemma3 {
    /// Builds the model from HF-named weights (`model.layers.N...`).
    pub fn load(
        path: &Path,
        w: &mut Weights,
        quant: &Quantization,
        c: &Config,
        has_lm_head: bool,
    ) -> Result<Self> {
        let kinds = c.kinds(path)?;
        let dims = Dims {
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            kinds,
            kv_widths: None,
            recurrent_elements: None,
        };
        dims.validate(path)?;
        check_eps(path, c.rms_norm_eps)?;
        if !(c.query_pre_attn_scalar.is_finite() && c.query_pre_attn_scalar > 0.0) {
            return Err(config_error(
                path,
                format!(
                    "query_pre_attn_scalar must be positive, not {}",
                    c.query_pre_attn_scalar
                ),
            ));
        }
        let attention = AttentionShape {
            qk_norm: Some(HeadNorm {
                eps: c.rms_norm_eps,
                offset: 1.0,
            }),
            scale: Some(c.query_pre_attn_scalar.powf(-0.5) as f32),
            ..AttentionShape::plain(
                c.hidden_size,
                c.num_attention_heads,
                c.num_key_value_heads,
                c.head_dim,
            )
        };
        let mlp = MlpShape::plain(c.hidden_size, c.intermediate_size, Activation::GeluApprox);
        let local = Rope::new(path, c.head_dim, c.rope_local_base_freq, false, None)?;
        let global = Rope::new(
            path,
            c.head_dim,
            c.rope_theta,
            false,
            c.rope_scaling.as_ref(),
        )?;
        let embed = Embedding::load(w, quant, "model.embed_tokens", c.vocab_size, c.hidden_size)?;
        let mut blocks = Vec::new();
        for (i, kind) in dims.kinds.iter().enumerate() {
            let rope = match kind {
                CacheKind::Full => global.clone(),
                CacheKind::Window(_) | CacheKind::Recurrent => local.clone(),
            };
            blocks.push(SandwichBlock::load(
                w,
                quant,
                &format!("model.layers.{i}"),
                c.rms_norm_eps,
                attention,
                rope,
                mlp,
            )?);
        }
        let norm = RmsNorm::load_offset(w, "model.norm", c.hidden_size, c.rms_norm_eps, 1.0)?;
        let lm_head = if has_lm_head {
            Some(Linear::load(
                w,
                quant,
                "lm_head",
                c.hidden_size,
                c.vocab_size,
                false,
            )?)
        } else {
            None
        };
        Ok(Self {
            embed_scale: bf16_round((c.hidden_size as f64).sqrt()),
            dims,
            embed,
            blocks,
            norm,
            lm_head,
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
        // 1. Embed the tokens and scale them by sqrt(hidden) (a bfloat16 value).
        let h = self.embed.forward(tokens)?;
        let scale = Array::from_f32(self.embed_scale).as_dtype(h.dtype())?;
        let mut h = h.multiply(&scale)?;
        // 2. The global layers' mask and the sliding layers' window mask.
        let masks = Masks::new(&self.dims.kinds, caches, tokens.dim(1))?;
        // 3. Each block, its residual sums clipped in float16.
        for ((block, cache), &kind) in self
            .blocks
            .iter()
            .zip(caches.iter_mut())
            .zip(&self.dims.kinds)
        {
            h = block.forward(&h, cache, masks.of(kind), true)?;
        }
        // 4. Final norm.
        self.norm.forward(&h)
    }

    /// Vocabulary logits (tied to the embeddings unless the checkpoint has a head).
    pub fn logits(&self, hidden: &Array) -> Result<Array, Exception> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => self.embed.as_linear(hidden),
        }
    }

    /// Every weight array.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out = self.embed.parameters();
        for b in &self.blocks {
            out.extend(b.parameters());
        }
        out.extend(self.norm.parameters());
        if let Some(head) = &self.lm_head {
            out.extend(head.parameters());
        }
        out
    }

    /// The dtype activations are computed in.
    pub fn compute_dtype(&self) -> Dtype {
        self.norm.parameters()[0].dtype()
    }
}

/// `x` as `mx.array(x, mx.bfloat16)` holds it, back in float32.
fn bf16_round(x: f64) -> f32 {
    Array::from_f32(x as f32)
        .as_dtype(Dtype::Bfloat16)
        .and_then(|a| a.as_dtype(Dtype::Float32))
        .and_then(|a| {
            a.try_item_exact::<f32>()
                .map_err(|e| mlx_rs::error::Exception::custom(e.to_string()))
        })
        .unwrap_or(x as f32)
}
