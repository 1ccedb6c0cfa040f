//! Qwen3-Next (`Qwen3NextForCausalLM`): a hybrid of gated delta-net layers
//! (linear attention with a recurrent state) and, every
//! `full_attention_interval`-th layer, full attention whose `q_proj` also
//! yields an output gate, with q/k norms and partial rotary positions; the
//! MLPs are sparse experts with a sigmoid-gated shared expert (except
//! `mlp_only_layers`). As mlx-lm's `qwen3_next`.
use std::path::Path;

use serde::Deserialize;

use super::config::{config_error, layer_count};
use super::layers::attention::{AttentionShape, HeadNorm};
use super::layers::decoder::{DecoderSpec, MoeLayers};
use super::layers::gated_delta::DeltaShape;
use super::layers::mlp::{Activation, MlpShape};
use super::layers::moe::MoeShape;
use super::layers::rope::{Rope, RopeScalingConfig};
use super::weights::Weights;
use crate::cache::CacheKind;
use crate::error::Result;

/// `config.json` of a `Qwen3NextForCausalLM`, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub linear_num_value_heads: i32,
    pub linear_num_key_heads: i32,
    pub linear_key_head_dim: i32,
    pub linear_value_head_dim: i32,
    pub linear_conv_kernel_dim: i32,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub decoder_sparse_step: i32,
    pub shared_expert_intermediate_size: i32,
    #[serde(default)]
    pub mlp_only_layers: Vec<i32>,
    pub moe_intermediate_size: i32,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    pub rope_theta: f64,
    pub partial_rotary_factor: f32,
    pub max_position_embeddings: u32,
    #[serde(default)]
    pub norm_topk_prob: bool,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub rope_scaling: Option<RopeScalingConfig>,
    #[serde(default = "four")]
    pub full_attention_interval: i32,
}

fn four() -> i32 {
    4
}

impl Config {
    /// The decoder this config describes.
    pub fn spec(&self, path: &Path) -> Result<DecoderSpec> {
        self.hybrid_spec(path, false)
    }

    /// Shared with Qwen3.5, whose delta-nets have four input projections.
    pub(super) fn hybrid_spec(&self, path: &Path, split_projections: bool) -> Result<DecoderSpec> {
        for (name, v) in [
            ("full_attention_interval", self.full_attention_interval),
            ("decoder_sparse_step", self.decoder_sparse_step),
        ] {
            if v < 1 {
                return Err(config_error(
                    path,
                    format!("{name} must be positive, not {v}"),
                ));
            }
        }
        let n = layer_count(path, self.num_hidden_layers)?;
        let kinds: Vec<CacheKind> = (0..n as i32)
            .map(|i| {
                if (i + 1) % self.full_attention_interval != 0 {
                    CacheKind::Recurrent
                } else {
                    CacheKind::Full
                }
            })
            .collect();
        let rope_dims = (self.head_dim as f32 * self.partial_rotary_factor) as i32;
        if rope_dims < 2 || rope_dims > self.head_dim {
            return Err(config_error(
                path,
                format!(
                    "partial_rotary_factor {} of head_dim {} leaves no rotary dimensions",
                    self.partial_rotary_factor, self.head_dim
                ),
            ));
        }
        let delta = DeltaShape {
            hidden: self.hidden_size,
            key_heads: self.linear_num_key_heads,
            value_heads: self.linear_num_value_heads,
            key_dim: self.linear_key_head_dim,
            value_dim: self.linear_value_head_dim,
            conv_kernel: self.linear_conv_kernel_dim,
            eps: self.rms_norm_eps,
            split_projections,
        };
        delta.check().map_err(|m| config_error(path, m))?;
        let shape = MoeShape {
            hidden: self.hidden_size,
            experts: self.num_experts,
            top_k: self.num_experts_per_tok,
            intermediate: self.moe_intermediate_size,
            normalize: self.norm_topk_prob,
            shared_intermediate: Some(self.shared_expert_intermediate_size),
        };
        let sparse: Vec<bool> = (0..n as i32)
            .map(|i| {
                !self.mlp_only_layers.contains(&i)
                    && self.num_experts > 0
                    && (i + 1) % self.decoder_sparse_step == 0
            })
            .collect();
        let moe = if sparse.iter().any(|&s| s) {
            shape.check().map_err(|m| config_error(path, m))?;
            Some(MoeLayers { shape, sparse })
        } else {
            None
        };
        Ok(DecoderSpec {
            vocab: self.vocab_size,
            rms_eps: self.rms_norm_eps,
            attention: AttentionShape {
                qkv_bias: self.attention_bias,
                o_bias: self.attention_bias,
                qk_norm: Some(HeadNorm {
                    eps: self.rms_norm_eps,
                    offset: 0.0,
                }),
                output_gate: true,
                ..AttentionShape::plain(
                    self.hidden_size,
                    self.num_attention_heads,
                    self.num_key_value_heads,
                    self.head_dim,
                )
            },
            mlp: MlpShape::plain(self.hidden_size, self.intermediate_size, Activation::Silu),
            rope: Rope::new(
                path,
                rope_dims,
                self.rope_theta,
                false,
                self.rope_scaling.as_ref(),
            )?,
            kinds,
            tie_embeddings: self.tie_word_embeddings,
            head_parts: 1,
            moe,
            delta: Some(delta),
        })
    }
}

/// HF's checkpoints as mlx-lm's `sanitize` converts them (only those with
/// one matrix per expert: mlx-lm's own are converted already): the
/// multi-token-prediction head dropped, norm weights stored as offsets from
/// one made whole, and the convolution's `[channels, 1, kernel]` weights
/// turned to MLX's `[channels, kernel, 1]`.
pub fn sanitize(w: &mut Weights) -> Result<()> {
    if !w.any(|n| n.starts_with("model.layers.") && n.ends_with(".mlp.experts.0.up_proj.weight")) {
        return Ok(());
    }
    w.discard(|n| n.contains("mtp."));
    hf_norms_and_conv(w)
}

/// HF's norm weights (offsets from one) made whole and its convolution
/// weights turned to MLX's `[channels, kernel, 1]` (shared with Qwen3.5).
pub(super) fn hf_norms_and_conv(w: &mut Weights) -> Result<()> {
    let norms = [
        ".input_layernorm.weight",
        ".post_attention_layernorm.weight",
        "model.norm.weight",
        ".q_norm.weight",
        ".k_norm.weight",
    ];
    w.update(
        |n| norms.iter().any(|s| n.ends_with(s)),
        |a| {
            if a.ndim() == 1 {
                a.add(mlx_rs::Array::from_f32(1.0).as_dtype(a.dtype())?)
            } else {
                Ok(a.clone())
            }
        },
    )?;
    w.update(
        |n| n.contains("conv1d.weight"),
        |a| {
            if a.ndim() == 3 && a.dim(-1) != 1 {
                a.swap_axes(1, 2)
            } else {
                Ok(a.clone())
            }
        },
    )
}
