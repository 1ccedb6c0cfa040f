//! BERT (`BertModel`: all-MiniLM, bge, e5 and the other sentence-transformers
//! encoders) and RoBERTa / XLM-RoBERTa (bge-m3, multilingual-e5), as
//! mlx-embeddings' `models/bert.py` and `xlm_roberta.py` run them: word,
//! position and token-type embeddings and a LayerNorm; per layer,
//! bidirectional attention and a GELU MLP, each followed by a residual
//! LayerNorm (post-norm). RoBERTa's positions start after its padding id
//! (`pad_token_id + 1`). It embeds; it does not generate.
use std::path::Path;

use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::fast::ScaledDotProductAttentionMask;
use serde::Deserialize;

use super::Dims;
use super::config::{Quantization, config_error};
use super::layers::embedding::Embedding;
use super::layers::linear::Linear;
use super::layers::norm::LayerNorm;
use super::weights::Weights;
use crate::error::{Result, RunnerError};

/// `config.json` of a `BertModel`.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub intermediate_size: i32,
    pub max_position_embeddings: i32,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: i32,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f32,
    #[serde(default)]
    pub hidden_act: HiddenAct,
    #[serde(default)]
    pub position_embedding_type: PositionEmbedding,
    #[serde(default)]
    pub model_type: Option<String>,
    /// RoBERTa's padding id, its positions' offset (default 1).
    #[serde(default)]
    pub pad_token_id: Option<i32>,
}

impl Config {
    /// The first position row a sequence uses: 0 for BERT, `pad_token_id +
    /// 1` for RoBERTa and XLM-RoBERTa (HF's `create_position_ids_from_input_ids`).
    pub fn position_offset(&self) -> i32 {
        match self.model_type.as_deref() {
            Some("roberta" | "xlm-roberta") => self.pad_token_id.unwrap_or(1) + 1,
            _ => 0,
        }
    }
}

fn default_type_vocab() -> i32 {
    2
}

fn default_eps() -> f32 {
    1e-12
}

/// The MLP's activation: BERT's exact (erf) GELU.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum HiddenAct {
    #[default]
    Gelu,
}

/// Learned absolute positions (the relative kinds are not implemented).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PositionEmbedding {
    #[default]
    Absolute,
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

/// A loaded BERT encoder.
pub struct Bert {
    words: Embedding,
    positions: Array,
    token_types: Array,
    embed_norm: LayerNorm,
    layers: Vec<Layer>,
    heads: i32,
    head_dim: i32,
    /// The first position row (RoBERTa: after its padding id).
    position_offset: i32,
    max_positions: i32,
    dims: Dims,
}

/// Renames what HF checkpoints vary in: a `bert.` prefix (the task models'
/// encoder), TF-era `gamma`/`beta` norms; drops the pooler, the task heads and
/// the stored position ids, which an embedding does not use.
pub fn sanitize(w: &mut Weights) {
    let names = w.names(|_| true);
    for name in names {
        let Some(array) = w.pop(&name) else { continue };
        let bare = ["bert.", "roberta."]
            .iter()
            .find_map(|p| name.strip_prefix(p))
            .unwrap_or(&name);
        let mut new = bare.to_owned();
        if new.starts_with("pooler.") || new.starts_with("cls.") || new.ends_with("position_ids") {
            continue;
        }
        if let Some(stem) = new.strip_suffix("LayerNorm.gamma") {
            new = format!("{stem}LayerNorm.weight");
        } else if let Some(stem) = new.strip_suffix("LayerNorm.beta") {
            new = format!("{stem}LayerNorm.bias");
        }
        w.insert(new, array);
    }
}

impl Bert {
    /// Builds the encoder from `c`, taking its tensors out of `w`.
    pub fn load(path: &Path, w: &mut Weights, q: &Quantization, c: &Config) -> Result<Self> {
        let positive = [
            ("vocab_size", c.vocab_size),
            ("hidden_size", c.hidden_size),
            ("num_hidden_layers", c.num_hidden_layers),
            ("num_attention_heads", c.num_attention_heads),
            ("intermediate_size", c.intermediate_size),
            ("max_position_embeddings", c.max_position_embeddings),
            ("type_vocab_size", c.type_vocab_size),
        ];
        for (name, value) in positive {
            if value <= 0 {
                return Err(config_error(
                    path,
                    format!("{name} must be positive, not {value}"),
                ));
            }
        }
        let offset = c.position_offset();
        if offset < 0 || offset >= c.max_position_embeddings {
            return Err(config_error(
                path,
                format!(
                    "pad_token_id {:?} leaves no position of {}",
                    c.pad_token_id, c.max_position_embeddings
                ),
            ));
        }
        if c.hidden_size % c.num_attention_heads != 0 {
            return Err(config_error(
                path,
                format!(
                    "hidden_size {} is not a multiple of num_attention_heads {}",
                    c.hidden_size, c.num_attention_heads
                ),
            ));
        }
        sanitize(w);
        let (h, eps) = (c.hidden_size, c.layer_norm_eps);
        let linear =
            |w: &mut Weights, name: &str, i: i32, o: i32| Linear::load(w, q, name, i, o, true);
        let mut layers = Vec::with_capacity(c.num_hidden_layers as usize);
        for i in 0..c.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            layers.push(Layer {
                query: linear(w, &format!("{p}.attention.self.query"), h, h)?,
                key: linear(w, &format!("{p}.attention.self.key"), h, h)?,
                value: linear(w, &format!("{p}.attention.self.value"), h, h)?,
                attention_out: linear(w, &format!("{p}.attention.output.dense"), h, h)?,
                attention_norm: LayerNorm::load(
                    w,
                    &format!("{p}.attention.output.LayerNorm"),
                    h,
                    eps,
                )?,
                intermediate: linear(
                    w,
                    &format!("{p}.intermediate.dense"),
                    h,
                    c.intermediate_size,
                )?,
                output: linear(w, &format!("{p}.output.dense"), c.intermediate_size, h)?,
                output_norm: LayerNorm::load(w, &format!("{p}.output.LayerNorm"), h, eps)?,
            });
        }
        let head_dim = h / c.num_attention_heads;
        Ok(Self {
            words: Embedding::load(w, q, "embeddings.word_embeddings", c.vocab_size, h)?,
            positions: w.take_float(
                "embeddings.position_embeddings.weight",
                &[c.max_position_embeddings, h],
            )?,
            token_types: w.take_float(
                "embeddings.token_type_embeddings.weight",
                &[c.type_vocab_size, h],
            )?,
            embed_norm: LayerNorm::load(w, "embeddings.LayerNorm", h, eps)?,
            layers,
            heads: c.num_attention_heads,
            head_dim,
            position_offset: offset,
            max_positions: c.max_position_embeddings - offset,
            dims: Dims {
                vocab: c.vocab_size,
                hidden: h,
                intermediate: c.intermediate_size,
                heads: c.num_attention_heads,
                kv_heads: c.num_attention_heads,
                head_dim,
                kinds: Vec::new(),
                kv_widths: None,
                recurrent_elements: None,
            },
        })
    }

    /// The sizes budgets need (no KV caches: `kinds` is empty).
    pub fn dims(&self) -> &Dims {
        &self.dims
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Most tokens one input may have (its position table's rows past the
    /// offset).
    pub fn max_positions(&self) -> i32 {
        self.max_positions
    }

    /// Encodes `tokens` (`[B, L]` int32, right-padded) whose real tokens are
    /// marked by `mask` (`[B, L]`, 1 real, 0 padding): the last layer's
    /// hidden states `[B, L, hidden]`.
    pub fn forward(&self, tokens: &Array, mask: &Array) -> Result<Array, Exception> {
        let (b, l) = (tokens.dim(0), tokens.dim(1));
        if l > self.max_positions {
            return Err(Exception::custom(format!(
                "{l} tokens exceed the model's {} positions",
                self.max_positions
            )));
        }
        // 1. Embeddings: word + position + token type 0, then LayerNorm.
        let ids: Vec<i32> = (self.position_offset..self.position_offset + l).collect();
        let positions = self.positions.take_axis(Array::from_slice(&ids, &[l]), 0)?;
        let types = self.token_types.take_axis(Array::from_int(0), 0)?;
        let x = self.words.forward(tokens)?.add(&positions)?.add(&types)?;
        let mut h = self.embed_norm.forward(&x)?;
        // 2. Padding hidden from every query: (1 - mask) * -10000 added to
        //    the scores, as BERT's extended attention mask.
        let dtype = h.dtype();
        let additive = Array::from_f32(1.0)
            .subtract(mask.as_dtype(mlx_rs::Dtype::Float32)?)?
            .multiply(Array::from_f32(-10000.0))?
            .as_dtype(dtype)?
            .reshape(&[b, 1, 1, l])?;
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        let heads = |x: Array| -> Result<Array, Exception> {
            x.reshape(&[b, l, self.heads, self.head_dim])?
                .transpose_axes(&[0, 2, 1, 3])
        };
        // 3. Each layer: h = LN(h + out(attention(h))); h = LN(h + down(gelu(up(h)))).
        for layer in &self.layers {
            let q = heads(layer.query.forward(&h)?)?;
            let k = heads(layer.key.forward(&h)?)?;
            let v = heads(layer.value.forward(&h)?)?;
            let ctx = super::layers::cpu_fast::sdpa(
                &q,
                &k,
                &v,
                scale,
                Some(ScaledDotProductAttentionMask::Array(&additive)),
                None,
            )?
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[b, l, self.heads * self.head_dim])?;
            h = layer
                .attention_norm
                .forward(&layer.attention_out.forward(&ctx)?.add(&h)?)?;
            let m = layer
                .output
                .forward(&gelu(&layer.intermediate.forward(&h)?)?)?;
            h = layer.output_norm.forward(&m.add(&h)?)?;
        }
        Ok(h)
    }

    /// Every weight array.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out = self.words.parameters();
        out.extend([&self.positions, &self.token_types]);
        out.extend(self.embed_norm.parameters());
        for l in &self.layers {
            for linear in [
                &l.query,
                &l.key,
                &l.value,
                &l.attention_out,
                &l.intermediate,
                &l.output,
            ] {
                out.extend(linear.parameters());
            }
            out.extend(l.attention_norm.parameters());
            out.extend(l.output_norm.parameters());
        }
        out
    }

    /// The dtype activations are computed in.
    pub fn compute_dtype(&self) -> mlx_rs::Dtype {
        self.positions.dtype()
    }
}

/// mlx's `nn.gelu` (exact): `x (1 + erf(x / sqrt(2))) / 2` (on the CPU in
/// one pass of Grove's primitive).
fn gelu(x: &Array) -> Result<Array, Exception> {
    if let Some(out) = super::layers::cpu_fast::gelu(x) {
        return out;
    }
    let d = x.dtype();
    let s = |v: f32| Array::from_f32(v).as_dtype(d);
    x.multiply(s(1.0)?.add(mlx_rs::ops::erf(x.divide(s(std::f32::consts::SQRT_2)?)?)?)?)?
        .multiply(s(0.5)?)
}

/// Refuses what cannot be an encoder input here.
pub fn check_lengths(rows: &[Vec<u32>], max: i32) -> Result<()> {
    match rows.iter().find(|r| r.len() as i64 > max as i64) {
        Some(r) => Err(RunnerError::Request(format!(
            "an input of {} tokens exceeds the model's {max} positions",
            r.len()
        ))),
        None => Ok(()),
    }
}
