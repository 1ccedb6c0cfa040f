//! GLM-4.7-Flash (`Glm4MoeLiteForCausalLM`, model_type `glm4_moe_lite`), as
//! mlx-lm's `glm4_moe_lite`: pre-norm blocks of multi-head latent attention
//! (layers/mla.rs) and, after the first `first_k_dense_replace` dense
//! layers, experts routed by sigmoid scores with a correction bias (the
//! bias picks, the raw scores weigh, renormalised and scaled by
//! `routed_scaling_factor`), beside shared experts.
use std::path::Path;
use std::sync::Arc;

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::{Ellipsis, TryIndexOp, take_along_axis};
use mlx_rs::ops::{argpartition_axis, sigmoid};
use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use super::Dims;
use super::config::{Quantization, check_eps, config_error, layer_count};
use super::layers::embedding::Embedding;
use super::layers::linear::Linear;
use super::layers::masks::Masks;
use super::layers::mla::{Mla, MlaShape};
use super::layers::mlp::{Activation, Mlp, MlpShape};
use super::layers::norm::RmsNorm;
use super::layers::rope::{Rope, RopeScalingConfig};
use super::layers::switch::{GluShape, SwitchGlu};
use super::weights::Weights;
use crate::cache::{CacheKind, LayerCache};
use crate::error::Result;
use crate::shard::Comm;

/// `config.json` of a `Glm4MoeLiteForCausalLM`, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(default = "d_vocab")]
    pub vocab_size: i32,
    #[serde(default = "d_hidden")]
    pub hidden_size: i32,
    #[serde(default = "d_intermediate")]
    pub intermediate_size: i32,
    #[serde(default = "d_moe_intermediate")]
    pub moe_intermediate_size: i32,
    #[serde(default = "d_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "d_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "d_one")]
    pub n_shared_experts: Option<i32>,
    #[serde(default = "d_routed")]
    pub n_routed_experts: Option<i32>,
    #[serde(default = "d_scaling")]
    pub routed_scaling_factor: f32,
    #[serde(default = "d_kv_rank")]
    pub kv_lora_rank: i32,
    #[serde(default = "d_q_rank")]
    pub q_lora_rank: Option<i32>,
    #[serde(default = "d_rope_dim")]
    pub qk_rope_head_dim: i32,
    #[serde(default = "d_nope_dim")]
    pub qk_nope_head_dim: i32,
    #[serde(default = "d_v_dim")]
    pub v_head_dim: i32,
    #[serde(default = "d_topk_method")]
    pub topk_method: String,
    #[serde(default = "d_scoring")]
    pub scoring_func: String,
    #[serde(default = "d_true")]
    pub norm_topk_prob: bool,
    #[serde(default = "d_one_i")]
    pub n_group: i32,
    #[serde(default = "d_one_i")]
    pub topk_group: i32,
    #[serde(default = "d_top_k")]
    pub num_experts_per_tok: i32,
    #[serde(default = "d_one_i")]
    pub moe_layer_freq: i32,
    #[serde(default = "d_one_i")]
    pub first_k_dense_replace: i32,
    #[serde(default = "d_max_positions")]
    pub max_position_embeddings: u32,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "d_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<RopeScalingConfig>,
    #[serde(default)]
    pub attention_bias: bool,
}

fn d_vocab() -> i32 {
    154_880
}
fn d_hidden() -> i32 {
    2048
}
fn d_intermediate() -> i32 {
    10_240
}
fn d_moe_intermediate() -> i32 {
    1536
}
fn d_layers() -> i32 {
    47
}
fn d_heads() -> i32 {
    20
}
fn d_one() -> Option<i32> {
    Some(1)
}
fn d_routed() -> Option<i32> {
    Some(64)
}
fn d_scaling() -> f32 {
    1.8
}
fn d_kv_rank() -> i32 {
    512
}
fn d_q_rank() -> Option<i32> {
    Some(768)
}
fn d_rope_dim() -> i32 {
    64
}
fn d_nope_dim() -> i32 {
    192
}
fn d_v_dim() -> i32 {
    256
}
fn d_topk_method() -> String {
    "noaux_tc".into()
}
fn d_scoring() -> String {
    "sigmoid".into()
}
fn d_true() -> bool {
    true
}
fn d_one_i() -> i32 {
    1
}
fn d_top_k() -> i32 {
    4
}
fn d_max_positions() -> u32 {
    202_752
}
fn d_eps() -> f32 {
    1e-5
}
fn d_theta() -> f64 {
    1_000_000.0
}

/// Routed experts with sigmoid scoring (mlx-lm's `MoEGate` and
/// `group_expert_select` with one group).
struct Experts {
    gate: Array,
    correction: Array,
    experts: SwitchGlu,
    shared: Option<Mlp>,
    top_k: i32,
    normalize: bool,
    scaling: f32,
}

impl Experts {
    fn forward(&self, x: &Array) -> Result<Array, Exception> {
        // 1. Sigmoid scores (float32); the bias-corrected ones pick the top k.
        let scores = sigmoid(x.matmul(self.gate.t())?.as_dtype(Dtype::Float32)?)?;
        let picked = scores.add(&self.correction)?;
        let k = self.top_k;
        let indices =
            argpartition_axis(picked.negative()?, k - 1, -1)?.try_index((Ellipsis, ..k))?;
        // 2. The raw scores weigh them, renormalised and scaled.
        let mut weights = take_along_axis(&scores, &indices, -1)?;
        if k > 1 && self.normalize {
            let sum = weights.sum_axis(-1, true)?;
            weights = weights.divide(sum.add(Array::from_f32(1e-20))?)?;
        }
        weights = weights.multiply(Array::from_f32(self.scaling))?;
        // 3. The picked experts, weighted and summed; the shared ones added.
        let y = self.experts.forward(x, &indices)?;
        let y = y
            .multiply(weights.expand_dims(-1)?)?
            .sum_axis(-2, None)?
            .as_dtype(y.dtype())?;
        match &self.shared {
            Some(m) => y.add(m.forward(x)?),
            None => Ok(y),
        }
    }
}

enum FeedForward {
    Dense(Mlp),
    Sparse(Box<Experts>),
}

struct Block {
    input_norm: RmsNorm,
    attention: Mla,
    post_norm: RmsNorm,
    mlp: FeedForward,
}

/// A loaded GLM-4.7-Flash model.
pub struct Glm4MoeLite {
    dims: Dims,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    /// The group its heads and MLP widths are split over.
    shard: Option<Arc<Comm>>,
}

impl Glm4MoeLite {
    /// Builds the model from mlx-lm-named weights. With `shard`, this
    /// rank's part of a model split over the group, as mlx-lm's `shard()`
    /// does: 1/N of the heads (their query projection, `embed_q`,
    /// `unembed_out` and columns of `o_proj`) and of every MLP's and
    /// expert's width; the latent (and so the cache) and the router whole.
    pub fn load(
        path: &Path,
        w: &mut Weights,
        quant: &Quantization,
        c: &Config,
        shard: Option<&Arc<Comm>>,
    ) -> Result<Self> {
        if c.topk_method != "noaux_tc" || c.scoring_func != "sigmoid" {
            return Err(config_error(
                path,
                format!(
                    "routing {} with {} scores is not supported (noaux_tc, sigmoid)",
                    c.topk_method, c.scoring_func
                ),
            ));
        }
        if c.n_group != 1 || c.topk_group != 1 {
            return Err(config_error(
                path,
                format!(
                    "grouped routing (n_group {}, topk_group {}) is not supported; \
                     GLM-4.7-Flash routes in one group",
                    c.n_group, c.topk_group
                ),
            ));
        }
        let n = layer_count(path, c.num_hidden_layers)?;
        // Checkpoints carry the next-token-prediction layers after the last.
        let extra = format!("model.layers.{n}.");
        w.discard(|name| name.starts_with(&extra));
        let latent = c.kv_lora_rank + c.qk_rope_head_dim;
        let dims = Dims {
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            heads: c.num_attention_heads,
            kv_heads: 1,
            head_dim: c.qk_nope_head_dim + c.qk_rope_head_dim,
            kinds: vec![CacheKind::Full; n],
            // The cache holds one latent and one rotated key part per token:
            // `2 * width` values.
            kv_widths: Some(vec![(latent + 1) / 2; n]),
            recurrent_elements: None,
        };
        dims.validate(path)?;
        check_eps(path, c.rms_norm_eps)?;
        // A rank's share (the counts were checked to divide, from config.json).
        let ranks = shard.map_or(1, |s| s.size());
        let dims = Dims {
            heads: dims.heads / ranks,
            intermediate: dims.intermediate / ranks,
            ..dims
        };
        for (name, v) in [
            ("kv_lora_rank", c.kv_lora_rank),
            ("qk_rope_head_dim", c.qk_rope_head_dim),
            ("qk_nope_head_dim", c.qk_nope_head_dim),
            ("v_head_dim", c.v_head_dim),
            ("moe_layer_freq", c.moe_layer_freq),
        ] {
            if v < 1 {
                return Err(config_error(
                    path,
                    format!("{name} must be positive, not {v}"),
                ));
            }
        }
        let mut scale = ((c.qk_nope_head_dim + c.qk_rope_head_dim) as f32).powf(-0.5);
        if let Some(rs) = &c.rope_scaling
            && let (Some(m), Some(f)) = (rs.mscale_all_dim, rs.factor)
            && m != 0.0
            && f > 1.0
        {
            let s = (0.1 * m * f.ln() + 1.0) as f32;
            scale *= s * s;
        }
        let shape = MlaShape {
            hidden: c.hidden_size,
            heads: c.num_attention_heads / ranks,
            q_lora_rank: c.q_lora_rank,
            kv_lora_rank: c.kv_lora_rank,
            rope_dim: c.qk_rope_head_dim,
            nope_dim: c.qk_nope_head_dim,
            v_dim: c.v_head_dim,
            bias: c.attention_bias,
            eps: c.rms_norm_eps,
            scale,
        };
        let rope = Rope::new(
            path,
            c.qk_rope_head_dim,
            c.rope_theta,
            true,
            c.rope_scaling.as_ref(),
        )?;
        let eps = c.rms_norm_eps;
        let hidden = c.hidden_size;
        let embed = Embedding::load(w, quant, "model.embed_tokens", c.vocab_size, hidden)?;
        let mut blocks = Vec::new();
        for i in 0..n as i32 {
            let p = format!("model.layers.{i}");
            let sparse = c.n_routed_experts.is_some()
                && i >= c.first_k_dense_replace
                && i % c.moe_layer_freq == 0;
            let mlp = match (sparse, c.n_routed_experts) {
                (true, Some(experts)) => {
                    let top_k = c.num_experts_per_tok;
                    if experts < 1 || top_k < 1 || top_k > experts {
                        return Err(config_error(
                            path,
                            format!(
                                "num_experts_per_tok {top_k} must be between 1 and \
                                 n_routed_experts {experts}"
                            ),
                        ));
                    }
                    let shared = match c.n_shared_experts {
                        Some(s) if s > 0 => Some(Mlp::load(
                            w,
                            quant,
                            &format!("{p}.mlp.shared_experts"),
                            MlpShape::plain(
                                hidden,
                                c.moe_intermediate_size * s / ranks,
                                Activation::Silu,
                            ),
                        )?),
                        _ => None,
                    };
                    FeedForward::Sparse(Box::new(Experts {
                        gate: w.take_float(&format!("{p}.mlp.gate.weight"), &[experts, hidden])?,
                        correction: w.take_float(
                            &format!("{p}.mlp.gate.e_score_correction_bias"),
                            &[experts],
                        )?,
                        experts: SwitchGlu::load(
                            w,
                            quant,
                            &format!("{p}.mlp.switch_mlp"),
                            &format!("{p}.mlp.experts"),
                            GluShape {
                                experts,
                                hidden,
                                intermediate: c.moe_intermediate_size / ranks,
                                bias: false,
                                activation: Activation::Silu,
                            },
                        )?,
                        shared,
                        top_k,
                        normalize: c.norm_topk_prob,
                        scaling: c.routed_scaling_factor,
                    }))
                }
                _ => FeedForward::Dense(Mlp::load(
                    w,
                    quant,
                    &format!("{p}.mlp"),
                    MlpShape::plain(hidden, c.intermediate_size / ranks, Activation::Silu),
                )?),
            };
            blocks.push(Block {
                input_norm: RmsNorm::load(w, &format!("{p}.input_layernorm"), hidden, eps)?,
                attention: Mla::load(w, quant, &format!("{p}.self_attn"), shape, rope.clone())?,
                post_norm: RmsNorm::load(w, &format!("{p}.post_attention_layernorm"), hidden, eps)?,
                mlp,
            });
        }
        let norm = RmsNorm::load(w, "model.norm", hidden, eps)?;
        let lm_head = Linear::load(w, quant, "lm_head", hidden, c.vocab_size, false)?;
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
        // 2. One mask for every layer.
        let masks = Masks::new(&self.dims.kinds, caches, tokens.dim(1))?;
        let mask = masks.of(CacheKind::Full);
        // 3. Each block: h += attention(norm(h)); h += mlp(norm(h)); on a
        //    rank of a group, each partial output summed over the group first.
        for (block, cache) in self.blocks.iter().zip(caches.iter_mut()) {
            let r = block
                .attention
                .forward(&block.input_norm.forward(&h)?, cache, mask)?;
            let h1 = h.add(&crate::shard::reduce(self.shard.as_ref(), r)?)?;
            let x = block.post_norm.forward(&h1)?;
            let r = match &block.mlp {
                FeedForward::Dense(m) => m.forward(&x)?,
                FeedForward::Sparse(m) => m.forward(&x)?,
            };
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
            match &b.mlp {
                FeedForward::Dense(m) => out.extend(m.parameters()),
                FeedForward::Sparse(m) => {
                    out.extend([&m.gate, &m.correction]);
                    out.extend(m.experts.parameters());
                    if let Some(s) = &m.shared {
                        out.extend(s.parameters());
                    }
                }
            }
        }
        out.extend(self.norm.parameters());
        out.extend(self.lm_head.parameters());
        out
    }

    /// The routed experts' arrays and the share a token uses, per sparse block.
    pub fn expert_parameters(&self) -> Vec<(Vec<&Array>, f64)> {
        self.blocks
            .iter()
            .filter_map(|b| match &b.mlp {
                FeedForward::Sparse(m) => {
                    let count = m.gate.dim(0).max(1) as f64;
                    Some((m.experts.parameters(), m.top_k as f64 / count))
                }
                FeedForward::Dense(_) => None,
            })
            .collect()
    }

    /// The dtype activations are computed in.
    pub fn compute_dtype(&self) -> Dtype {
        self.norm.parameters()[0].dtype()
    }
}
