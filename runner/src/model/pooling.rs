//! Sentence embeddings from a model's last hidden states: how the tokens'
//! states become one vector (the mean over the real tokens, the first
//! token's, or the last one's) and whether it is L2-normalized. A model's
//! sentence-transformers files say it (`modules.json` and its Pooling
//! module's `config.json`); without them an encoder mean-pools (as
//! mlx-embeddings' `text_embeds`) and a decoder takes its last token (as
//! Qwen3-Embedding and llama.cpp's `last` pooling), both normalized.
use std::path::Path;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};
use serde_json::Value;

use super::config::config_error;
use crate::error::Result;

/// How the tokens' states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the real (unpadded) tokens.
    Mean,
    /// The first token's (BERT's `[CLS]`).
    Cls,
    /// The last real token's.
    LastToken,
}

impl Pooling {
    pub fn name(self) -> &'static str {
        match self {
            Self::Mean => "mean",
            Self::Cls => "cls",
            Self::LastToken => "last",
        }
    }
}

/// How a model's embeddings are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbedSpec {
    pub pooling: Pooling,
    pub normalize: bool,
}

impl EmbedSpec {
    /// Reads the sentence-transformers files of the model directory `dir`
    /// (none for a GGUF file), else the family's default.
    pub fn read(dir: Option<&Path>, encoder: bool) -> Result<Self> {
        let default = Self {
            pooling: if encoder {
                Pooling::Mean
            } else {
                Pooling::LastToken
            },
            normalize: true,
        };
        let Some(dir) = dir else { return Ok(default) };
        let modules_path = dir.join("modules.json");
        let Some(modules) = read_json(&modules_path)? else {
            return Ok(default);
        };
        let Some(modules) = modules.as_array() else {
            return Err(config_error(
                &modules_path,
                "expected a list of modules".into(),
            ));
        };
        let mut spec = Self {
            normalize: false,
            ..default
        };
        for m in modules {
            let kind = m.get("type").and_then(Value::as_str).unwrap_or("");
            let sub = m.get("path").and_then(Value::as_str).unwrap_or("");
            match kind.rsplit('.').next().unwrap_or("") {
                "Transformer" => {}
                "Normalize" => spec.normalize = true,
                "Pooling" => {
                    let path = dir.join(sub).join("config.json");
                    let config = read_json(&path)?.unwrap_or(Value::Null);
                    spec.pooling = pooling_of(&path, &config)?;
                }
                _ => {
                    return Err(config_error(
                        &modules_path,
                        format!("module {kind:?} changes the embedding and is not supported"),
                    ));
                }
            }
        }
        Ok(spec)
    }
}

/// The one pooling mode a Pooling module's config asks for.
fn pooling_of(path: &Path, config: &Value) -> Result<Pooling> {
    if let Some(mode) = config.get("pooling_mode").and_then(Value::as_str) {
        return match mode {
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "lasttoken" => Ok(Pooling::LastToken),
            other => Err(config_error(
                path,
                format!("pooling mode {other:?} is not supported"),
            )),
        };
    }
    let on = |key: &str| config.get(key).and_then(Value::as_bool).unwrap_or(false);
    let modes = [
        ("pooling_mode_mean_tokens", Some(Pooling::Mean)),
        ("pooling_mode_cls_token", Some(Pooling::Cls)),
        ("pooling_mode_lasttoken", Some(Pooling::LastToken)),
        ("pooling_mode_max_tokens", None),
        ("pooling_mode_mean_sqrt_len_tokens", None),
        ("pooling_mode_weightedmean_tokens", None),
    ];
    let chosen: Vec<_> = modes.iter().filter(|(k, _)| on(k)).collect();
    match chosen.as_slice() {
        [(_, Some(p))] => Ok(*p),
        [(key, None)] => Err(config_error(path, format!("{key} is not supported"))),
        [] => Err(config_error(path, "no pooling mode is on".into())),
        _ => Err(config_error(
            path,
            "several pooling modes at once (concatenated) are not supported".into(),
        )),
    }
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    super::config::read_optional_json(path, config_error)
}

/// Pools `hidden` (`[B, L, H]`) over the real tokens marked by `mask`
/// (`[B, L]` 1/0, right-padded; `lengths` the real counts), in float32,
/// keeps the first `dims` values, and normalizes if `spec` says so: `[B, dims]`.
pub fn pool(
    spec: EmbedSpec,
    hidden: &Array,
    mask: &Array,
    lengths: &[i32],
    dims: i32,
) -> Result<Array, Exception> {
    let hidden = hidden.as_dtype(Dtype::Float32)?;
    let b = hidden.dim(0);
    let pooled = match spec.pooling {
        Pooling::Mean => {
            let m = mask.as_dtype(Dtype::Float32)?.expand_dims(-1)?;
            let sum = hidden.multiply(&m)?.sum_axis(1, false)?;
            let count = mlx_rs::ops::maximum(m.sum_axis(1, false)?, Array::from_f32(1e-9))?;
            sum.divide(&count)?
        }
        Pooling::Cls => hidden.take_axis(Array::from_int(0), 1)?,
        Pooling::LastToken => {
            let last: Vec<i32> = lengths.iter().map(|n| (n - 1).max(0)).collect();
            let idx = Array::from_slice(&last, &[b, 1, 1]);
            mlx_rs::ops::indexing::take_along_axis(&hidden, &idx, 1)?.squeeze_axes(&[1])?
        }
    };
    let pooled = if dims < pooled.dim(1) {
        let keep: Vec<i32> = (0..dims).collect();
        pooled.take_axis(Array::from_slice(&keep, &[dims]), 1)?
    } else {
        pooled
    };
    if !spec.normalize {
        return Ok(pooled);
    }
    let norm = pooled.square()?.sum_axis(-1, true)?.sqrt()?;
    pooled.divide(mlx_rs::ops::maximum(&norm, Array::from_f32(1e-9))?)
}
