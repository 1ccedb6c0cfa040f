//! Qwen3-MoE (`Qwen3MoeForCausalLM`, e.g. Qwen3-30B-A3B): Qwen3's decoder
//! whose MLPs are sparse mixtures of experts, on every `decoder_sparse_step`-th
//! layer except `mlp_only_layers`. As mlx-lm's `qwen3_moe`: softmax routing,
//! the top `num_experts_per_tok` experts renormalised when `norm_topk_prob`,
//! no shared expert, and plain rotary positions (`rope_scaling` is not read).
use std::path::Path;

use serde::Deserialize;

use super::config::config_error;
use super::layers::decoder::{DecoderSpec, MoeLayers};
use super::layers::moe::MoeShape;
use super::qwen3;
use crate::error::Result;

/// `config.json` of a `Qwen3MoeForCausalLM`.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub qwen3: qwen3::Config,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub moe_intermediate_size: i32,
    #[serde(default = "one")]
    pub decoder_sparse_step: i32,
    #[serde(default)]
    pub mlp_only_layers: Vec<i32>,
    #[serde(default)]
    pub norm_topk_prob: bool,
}

fn one() -> i32 {
    1
}

impl Config {
    /// The decoder this config describes.
    pub fn spec(&self, path: &Path) -> Result<DecoderSpec> {
        let mut base = self.qwen3.clone();
        // mlx-lm's qwen3_moe builds a plain `nn.RoPE`.
        base.base.rope_scaling = None;
        base.base.rope_traditional = false;
        let mut spec = base.spec(path)?;
        if self.decoder_sparse_step < 1 {
            return Err(config_error(
                path,
                format!(
                    "decoder_sparse_step must be positive, not {}",
                    self.decoder_sparse_step
                ),
            ));
        }
        let shape = MoeShape {
            hidden: spec.attention.hidden,
            experts: self.num_experts,
            top_k: self.num_experts_per_tok,
            intermediate: self.moe_intermediate_size,
            normalize: self.norm_topk_prob,
            shared_intermediate: None,
        };
        // mlx-lm: sparse unless listed in mlp_only_layers, when there are
        // experts and (i + 1) is a multiple of decoder_sparse_step.
        let sparse: Vec<bool> = (0..spec.kinds.len() as i32)
            .map(|i| {
                !self.mlp_only_layers.contains(&i)
                    && self.num_experts > 0
                    && (i + 1) % self.decoder_sparse_step == 0
            })
            .collect();
        if sparse.iter().any(|&s| s) {
            shape.check().map_err(|m| config_error(path, m))?;
            spec.moe = Some(MoeLayers { shape, sparse });
        }
        Ok(spec)
    }
}
