//! Qwen3.5 and Qwen3.6 (`Qwen3_5ForConditionalGeneration`,
//! `Qwen3_5MoeForConditionalGeneration`; model_type `qwen3_5`,
//! `qwen3_5_moe`): the text part, as mlx-lm's `qwen3_5`. Qwen3-Next's hybrid
//! of gated delta-nets and gated full attention, with the delta-net's four
//! input projections apart, every MLP dense or (MoE checkpoints) every one
//! sparse with a shared expert, and rotary settings in `rope_parameters`.
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::config::config_error;
use super::layers::decoder::DecoderSpec;
use super::layers::rope::RopeScalingConfig;
use super::qwen3_next;
use crate::error::Result;

/// The text model's `config.json` (`text_config` of a multimodal
/// checkpoint), with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(default = "d_hidden")]
    pub hidden_size: i32,
    #[serde(default = "d_intermediate")]
    pub intermediate_size: i32,
    #[serde(default = "d_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "d_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "d_vocab")]
    pub vocab_size: i32,
    #[serde(default = "d_kv_heads")]
    pub num_key_value_heads: i32,
    #[serde(default = "d_max_positions")]
    pub max_position_embeddings: u32,
    #[serde(default = "d_v_heads")]
    pub linear_num_value_heads: i32,
    #[serde(default = "d_k_heads")]
    pub linear_num_key_heads: i32,
    #[serde(default = "d_k_dim")]
    pub linear_key_head_dim: i32,
    #[serde(default = "d_v_dim")]
    pub linear_value_head_dim: i32,
    #[serde(default = "d_kernel")]
    pub linear_conv_kernel_dim: i32,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default = "d_interval")]
    pub full_attention_interval: i32,
    #[serde(default)]
    pub num_experts: i32,
    #[serde(default)]
    pub num_experts_per_tok: i32,
    #[serde(default)]
    pub shared_expert_intermediate_size: i32,
    #[serde(default)]
    pub moe_intermediate_size: i32,
    #[serde(default = "d_true")]
    pub norm_topk_prob: bool,
    #[serde(default)]
    pub rope_parameters: Option<Value>,
}

fn d_hidden() -> i32 {
    4096
}
fn d_intermediate() -> i32 {
    14336
}
fn d_layers() -> i32 {
    32
}
fn d_heads() -> i32 {
    32
}
fn d_eps() -> f32 {
    1e-6
}
fn d_vocab() -> i32 {
    151_936
}
fn d_kv_heads() -> i32 {
    8
}
fn d_max_positions() -> u32 {
    131_072
}
fn d_v_heads() -> i32 {
    64
}
fn d_k_heads() -> i32 {
    16
}
fn d_k_dim() -> i32 {
    192
}
fn d_v_dim() -> i32 {
    128
}
fn d_kernel() -> i32 {
    4
}
fn d_interval() -> i32 {
    4
}
fn d_true() -> bool {
    true
}

impl Config {
    /// Reads the text model's config: `text_config`, or the whole config.
    pub fn parse(path: &Path, raw: &Value) -> Result<Self> {
        let text = match raw.get("text_config") {
            Some(t @ Value::Object(_)) => t,
            Some(_) => return Err(config_error(path, "text_config must be an object".into())),
            None => raw,
        };
        serde_json::from_value(text.clone()).map_err(|e| config_error(path, e.to_string()))
    }

    /// The decoder this config describes.
    pub fn spec(&self, path: &Path) -> Result<DecoderSpec> {
        // mlx-lm: rope_theta and partial_rotary_factor from rope_parameters
        // (defaults 100000 and 0.25), the rest as its scaling.
        let params = self.rope_parameters.clone().unwrap_or_else(|| {
            serde_json::json!({"type": "default", "rope_theta": 100000.0,
                "partial_rotary_factor": 0.25})
        });
        let get = |k: &str| params.get(k).and_then(Value::as_f64);
        let scaling: RopeScalingConfig = serde_json::from_value(params.clone())
            .map_err(|e| config_error(path, format!("rope_parameters: {e}")))?;
        let heads = self.num_attention_heads;
        let head_dim = self.head_dim.unwrap_or(if heads > 0 {
            self.hidden_size / heads
        } else {
            0
        });
        let next = qwen3_next::Config {
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            num_attention_heads: heads,
            num_key_value_heads: self.num_key_value_heads,
            head_dim,
            linear_num_value_heads: self.linear_num_value_heads,
            linear_num_key_heads: self.linear_num_key_heads,
            linear_key_head_dim: self.linear_key_head_dim,
            linear_value_head_dim: self.linear_value_head_dim,
            linear_conv_kernel_dim: self.linear_conv_kernel_dim,
            num_experts: self.num_experts,
            num_experts_per_tok: self.num_experts_per_tok,
            // Every layer sparse when there are experts.
            decoder_sparse_step: 1,
            shared_expert_intermediate_size: self.shared_expert_intermediate_size,
            mlp_only_layers: Vec::new(),
            moe_intermediate_size: self.moe_intermediate_size,
            rms_norm_eps: self.rms_norm_eps,
            vocab_size: self.vocab_size,
            rope_theta: get("rope_theta").unwrap_or(100_000.0),
            partial_rotary_factor: get("partial_rotary_factor").unwrap_or(0.25) as f32,
            max_position_embeddings: self.max_position_embeddings,
            norm_topk_prob: self.norm_topk_prob,
            tie_word_embeddings: self.tie_word_embeddings,
            attention_bias: self.attention_bias,
            rope_scaling: Some(scaling),
            full_attention_interval: self.full_attention_interval,
        };
        next.hybrid_spec(path, true)
    }
}

/// HF's checkpoints as mlx-lm's `sanitize` converts them: the
/// multi-token-prediction head dropped; where the convolution is still in
/// HF's `[channels, 1, kernel]` layout, its weights turned to MLX's and the
/// norms (stored as offsets from one) made whole; fused expert projections
/// (`experts.gate_up_proj`, `experts.down_proj`) as the switch layer's.
pub fn sanitize(w: &mut super::weights::Weights) -> Result<()> {
    use crate::error::RunnerError;
    w.discard(|n| n.contains("mtp."));
    let hf_conv =
        w.any_array(|n, a| n.contains("conv1d.weight") && a.ndim() == 3 && a.dim(-1) != 1);
    if hf_conv {
        super::qwen3_next::hf_norms_and_conv(w)?;
    }
    let fused: Vec<String> = w.names(|n| n.ends_with(".mlp.experts.gate_up_proj"));
    for name in fused {
        let prefix = name.trim_end_matches(".experts.gate_up_proj").to_owned();
        let Some(gate_up) = w.pop(&name) else {
            continue;
        };
        let bad =
            |e: mlx_rs::error::Exception| RunnerError::Weights(format!("splitting {name}: {e}"));
        if gate_up.ndim() != 3 || gate_up.dim(-2) % 2 != 0 {
            return Err(RunnerError::Weights(format!(
                "{name} has shape {:?}; expected [experts, 2 x intermediate, hidden]",
                gate_up.shape()
            )));
        }
        let parts = mlx_rs::ops::split_equal(&gate_up, 2, -2).map_err(bad)?;
        w.insert(
            format!("{prefix}.switch_mlp.gate_proj.weight"),
            parts[0].clone(),
        );
        w.insert(
            format!("{prefix}.switch_mlp.up_proj.weight"),
            parts[1].clone(),
        );
        if let Some(down) = w.pop(&format!("{prefix}.experts.down_proj")) {
            w.insert(format!("{prefix}.switch_mlp.down_proj.weight"), down);
        }
    }
    Ok(())
}
