//! gpt-oss (`GptOssForCausalLM`), as mlx-lm's `gpt_oss`: pre-norm blocks
//! whose attention has biases and a learned sink logit per head, on layers
//! that alternate between a sliding window and the whole context; every MLP
//! is a mixture of experts with biases, routed by a linear router with a
//! bias (top k of its logits, softmax over those k), and gpt-oss's clipped
//! SwiGLU. mlx-community's checkpoints keep the experts in MXFP4.
use std::path::Path;
use std::sync::Arc;

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::{Ellipsis, TryIndexOp, take_along_axis};
use mlx_rs::ops::{argpartition_axis, softmax_axis};
use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use super::Dims;
use super::config::{Quantization, check_eps, config_error, layer_count};
use super::layers::attention::{Attention, AttentionShape};
use super::layers::embedding::Embedding;
use super::layers::linear::Linear;
use super::layers::masks::Masks;
use super::layers::mlp::Activation;
use super::layers::norm::RmsNorm;
use super::layers::rope::{Rope, RopeScalingConfig};
use super::layers::switch::{GluShape, SwitchGlu};
use super::weights::Weights;
use crate::cache::{CacheKind, LayerCache};
use crate::error::{Result, RunnerError};
use crate::shard::Comm;

/// `config.json` of a `GptOssForCausalLM`, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(default = "d_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "d_experts")]
    pub num_local_experts: i32,
    #[serde(default = "d_top_k")]
    pub num_experts_per_tok: i32,
    #[serde(default = "d_vocab")]
    pub vocab_size: i32,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "d_hidden")]
    pub hidden_size: i32,
    #[serde(default = "d_hidden")]
    pub intermediate_size: i32,
    #[serde(default = "d_head_dim")]
    pub head_dim: i32,
    #[serde(default = "d_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "d_kv_heads")]
    pub num_key_value_heads: i32,
    #[serde(default = "d_window")]
    pub sliding_window: i32,
    #[serde(default = "d_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<RopeScalingConfig>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub max_position_embeddings: Option<u32>,
}

fn d_layers() -> i32 {
    36
}
fn d_experts() -> i32 {
    128
}
fn d_top_k() -> i32 {
    4
}
fn d_vocab() -> i32 {
    201_088
}
fn d_eps() -> f32 {
    1e-5
}
fn d_hidden() -> i32 {
    2880
}
fn d_head_dim() -> i32 {
    64
}
fn d_heads() -> i32 {
    64
}
fn d_kv_heads() -> i32 {
    8
}
fn d_window() -> i32 {
    128
}
fn d_theta() -> f64 {
    150_000.0
}

impl Config {
    /// Each layer's kind: `layer_types`, else sliding and full alternating.
    fn kinds(&self, path: &Path) -> Result<Vec<CacheKind>> {
        let n = layer_count(path, self.num_hidden_layers)?;
        let window = CacheKind::Window(self.sliding_window);
        let Some(types) = &self.layer_types else {
            return Ok((0..n)
                .map(|i| if i % 2 == 0 { window } else { CacheKind::Full })
                .collect());
        };
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
}

/// The routed experts of one block.
struct Experts {
    router: Linear,
    experts: SwitchGlu,
    top_k: i32,
    count: i32,
}

impl Experts {
    fn forward(&self, x: &Array) -> Result<Array, Exception> {
        // 1. The top k router logits of each token; softmax over those k.
        let logits = self.router.forward(x)?;
        let k = self.top_k;
        let indices =
            argpartition_axis(&logits, -k, -1)?.try_index((Ellipsis, (self.count - k)..))?;
        let weights = softmax_axis(take_along_axis(&logits, &indices, -1)?, -1, true)?;
        // 2. The picked experts, weighted and summed.
        let y = self.experts.forward(x, &indices)?;
        y.multiply(weights.expand_dims(-1)?)?.sum_axis(-2, None)
    }
}

struct Block {
    input_norm: RmsNorm,
    attention: Attention,
    post_norm: RmsNorm,
    mlp: Experts,
}

/// A loaded gpt-oss model.
pub struct GptOss {
    dims: Dims,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    /// The group its heads and experts' widths are split over.
    shard: Option<Arc<Comm>>,
}

impl GptOss {
    /// Builds the model from mlx-lm-named weights (mlx-community's layout;
    /// the original checkpoint's fused `gate_up_proj` blocks are refused).
    /// With `shard`, this rank's part of a model split over the group, as
    /// mlx-lm's `shard()` does: 1/N of the heads (and their sinks) and of
    /// every expert's width; the router whole.
    pub fn load(
        path: &Path,
        w: &mut Weights,
        quant: &Quantization,
        c: &Config,
        shard: Option<&Arc<Comm>>,
    ) -> Result<Self> {
        if w.any(|n| n.contains("gate_up_proj")) {
            return Err(RunnerError::Weights(
                "this gpt-oss checkpoint keeps its experts in the original fused \
                 gate_up_proj layout; convert it with mlx_lm.convert first"
                    .into(),
            ));
        }
        let dims = Dims {
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            kinds: c.kinds(path)?,
            kv_widths: None,
            recurrent_elements: None,
        };
        dims.validate(path)?;
        check_eps(path, c.rms_norm_eps)?;
        // A rank's share (the counts were checked to divide, from config.json).
        let n = shard.map_or(1, |s| s.size());
        let dims = Dims {
            heads: dims.heads / n,
            kv_heads: dims.kv_heads / n,
            intermediate: dims.intermediate / n,
            ..dims
        };
        let (experts, top_k) = (c.num_local_experts, c.num_experts_per_tok);
        if experts < 1 || top_k < 1 || top_k > experts {
            return Err(config_error(
                path,
                format!(
                    "num_experts_per_tok {top_k} must be between 1 and num_local_experts {experts}"
                ),
            ));
        }
        let attention = AttentionShape {
            qkv_bias: true,
            o_bias: true,
            sinks: true,
            ..AttentionShape::plain(c.hidden_size, dims.heads, dims.kv_heads, c.head_dim)
        };
        let rope = Rope::new(
            path,
            c.head_dim,
            c.rope_theta,
            false,
            c.rope_scaling.as_ref(),
        )?;
        let glu = GluShape {
            experts,
            hidden: c.hidden_size,
            intermediate: dims.intermediate,
            bias: true,
            activation: Activation::SwigluOai,
        };
        let eps = c.rms_norm_eps;
        let embed = Embedding::load(w, quant, "model.embed_tokens", c.vocab_size, c.hidden_size)?;
        let mut blocks = Vec::new();
        for i in 0..dims.kinds.len() {
            let p = format!("model.layers.{i}");
            blocks.push(Block {
                input_norm: RmsNorm::load(w, &format!("{p}.input_layernorm"), c.hidden_size, eps)?,
                attention: Attention::load(
                    w,
                    quant,
                    &format!("{p}.self_attn"),
                    attention,
                    rope.clone(),
                )?,
                post_norm: RmsNorm::load(
                    w,
                    &format!("{p}.post_attention_layernorm"),
                    c.hidden_size,
                    eps,
                )?,
                mlp: Experts {
                    router: Linear::load(
                        w,
                        quant,
                        &format!("{p}.mlp.router"),
                        c.hidden_size,
                        experts,
                        true,
                    )?,
                    experts: SwitchGlu::load(
                        w,
                        quant,
                        &format!("{p}.mlp.experts"),
                        &format!("{p}.mlp.experts"),
                        glu,
                    )?,
                    top_k,
                    count: experts,
                },
            });
        }
        let norm = RmsNorm::load(w, "model.norm", c.hidden_size, eps)?;
        let lm_head = Linear::load(w, quant, "lm_head", c.hidden_size, c.vocab_size, false)?;
        Ok(Self {
            dims,
            embed,
            blocks,
            norm,
            lm_head,
            shard: shard.cloned(),
        })
    }

    /// The group the model is split over, if any.
    pub fn shard(&self) -> Option<&Arc<Comm>> {
        self.shard.as_ref()
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
        // 1. Embed the tokens.
        let mut h = self.embed.forward(tokens)?;
        // 2. A full and a sliding-window mask.
        let masks = Masks::new(&self.dims.kinds, caches, tokens.dim(1))?;
        // 3. Each block: h += attention(norm(h)); h += experts(norm(h)).
        for ((block, cache), &kind) in self
            .blocks
            .iter()
            .zip(caches.iter_mut())
            .zip(&self.dims.kinds)
        {
            let r =
                block
                    .attention
                    .forward(&block.input_norm.forward(&h)?, cache, masks.of(kind))?;
            let h1 = h.add(&crate::shard::reduce(self.shard.as_ref(), r)?)?;
            let r = block.mlp.forward(&block.post_norm.forward(&h1)?)?;
            h = h1.add(&crate::shard::reduce(self.shard.as_ref(), r)?)?;
        }
        // 4. Final norm.
        self.norm.forward(&h)
    }

    /// Logits from the untied head.
    pub fn logits(&self, hidden: &Array) -> Result<Array, Exception> {
        self.lm_head.forward(hidden)
    }

    /// Every weight array.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out = self.embed.parameters();
        for b in &self.blocks {
            out.extend(b.input_norm.parameters());
            out.extend(b.attention.parameters());
            out.extend(b.post_norm.parameters());
            out.extend(b.mlp.router.parameters());
            out.extend(b.mlp.experts.parameters());
        }
        out.extend(self.norm.parameters());
        out.extend(self.lm_head.parameters());
        out
    }

    /// The routed experts' arrays and the share a token uses, per block.
    pub fn expert_parameters(&self) -> Vec<(Vec<&Array>, f64)> {
        self.blocks
            .iter()
            .map(|b| {
                (
                    b.mlp.experts.parameters(),
                    b.mlp.top_k as f64 / b.mlp.count as f64,
                )
            })
            .collect()
    }

    /// The dtype activations are computed in.
    pub fn compute_dtype(&self) -> Dtype {
        self.norm.parameters()[0].dtype()
    }
}
