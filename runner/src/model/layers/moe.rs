//! The sparse mixture-of-experts block of the Qwen MoE families (mlx-lm's
//! `Qwen3MoeSparseMoeBlock`, `Qwen3NextSparseMoeBlock`): a linear router,
//! softmax over the experts, the top k per token (their probabilities
//! renormalised where the config says), the picked experts' gated MLPs
//! weighted by those probabilities, and, where the architecture has one, a
//! shared expert gated by a sigmoid.
use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::{Ellipsis, TryIndexOp, take_along_axis};
use mlx_rs::ops::{argpartition_axis, sigmoid, softmax_axis};

use super::cuda_decode::FastExperts;
use super::linear::Linear;
use super::mlp::{Activation, Mlp, MlpShape};
use super::switch::{GluShape, SwitchGlu};
use crate::error::{Result, RunnerError};
use crate::model::config::Quantization;
use crate::model::weights::Weights;

/// The shape of a sparse block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeShape {
    pub hidden: i32,
    pub experts: i32,
    /// Experts per token.
    pub top_k: i32,
    /// Each expert's intermediate size.
    pub intermediate: i32,
    /// Renormalise the top-k probabilities to sum to one.
    pub normalize: bool,
    /// The intermediate size of a sigmoid-gated shared expert (Qwen3-Next).
    pub shared_intermediate: Option<i32>,
}

impl MoeShape {
    /// Rejects what cannot route: no experts, or more per token than there are.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.experts < 1 || self.top_k < 1 || self.top_k > self.experts {
            return Err(format!(
                "num_experts_per_tok {} must be between 1 and num_experts {}",
                self.top_k, self.experts
            ));
        }
        if self.intermediate < 1 || self.shared_intermediate.is_some_and(|s| s < 1) {
            return Err("expert intermediate sizes must be positive".into());
        }
        Ok(())
    }
}

struct Shared {
    mlp: Mlp,
    gate: Linear,
}

/// A loaded sparse block (`{prefix}.gate`, `{prefix}.switch_mlp`, and
/// `{prefix}.shared_expert{,_gate}` where there is one).
pub struct SparseMoe {
    router: Linear,
    experts: SwitchGlu,
    shape: MoeShape,
    shared: Option<Shared>,
}

impl SparseMoe {
    /// Loads the block at module path `prefix` (e.g. `model.layers.0.mlp`).
    pub fn load(w: &mut Weights, q: &Quantization, prefix: &str, s: MoeShape) -> Result<Self> {
        s.check()
            .map_err(|m| RunnerError::Weights(format!("{prefix}: {m}")))?;
        let router = Linear::load(w, q, &format!("{prefix}.gate"), s.hidden, s.experts, false)?;
        let experts = SwitchGlu::load(
            w,
            q,
            &format!("{prefix}.switch_mlp"),
            &format!("{prefix}.experts"),
            GluShape {
                experts: s.experts,
                hidden: s.hidden,
                intermediate: s.intermediate,
                bias: false,
                activation: Activation::Silu,
            },
        )?;
        let shared = match s.shared_intermediate {
            Some(i) => Some(Shared {
                mlp: Mlp::load(
                    w,
                    q,
                    &format!("{prefix}.shared_expert"),
                    MlpShape::plain(s.hidden, i, Activation::Silu),
                )?,
                gate: Linear::load(
                    w,
                    q,
                    &format!("{prefix}.shared_expert_gate"),
                    s.hidden,
                    1,
                    false,
                )?,
            }),
            None => None,
        };
        Ok(Self {
            router,
            experts,
            shape: s,
            shared,
        })
    }

    /// Applies the block to `x` (`[B, L, hidden]`).
    pub fn forward(&self, x: &Array) -> Result<Array, Exception> {
        // 1. Route: softmax (in float32 inside) over the experts.
        let probs = softmax_axis(self.router.forward(x)?, -1, true)?;
        // 2. The top k experts of each token and their probabilities.
        let k = self.shape.top_k;
        let indices =
            argpartition_axis(&probs, -k, -1)?.try_index((Ellipsis, (self.shape.experts - k)..))?;
        let mut scores = take_along_axis(&probs, &indices, -1)?;
        if self.shape.normalize {
            scores = scores.divide(scores.sum_axis(-1, true)?)?;
        }
        // 3. The picked experts, weighted and summed.
        let y = self.experts.forward(x, &indices)?;
        let y = y
            .multiply(scores.expand_dims(-1)?)?
            .sum_axis(-2, None)?
            .as_dtype(y.dtype())?;
        // 4. The shared expert, gated by a sigmoid.
        match &self.shared {
            Some(shared) => {
                let s = sigmoid(shared.gate.forward(x)?)?.multiply(shared.mlp.forward(x)?)?;
                y.add(s)
            }
            None => Ok(y),
        }
    }

    /// The arrays this block holds.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out = self.router.parameters();
        out.extend(self.experts.parameters());
        if let Some(s) = &self.shared {
            out.extend(s.mlp.parameters());
            out.extend(s.gate.parameters());
        }
        out
    }

    /// The arrays of the routed experts alone (of which a token uses
    /// `top_k / experts`).
    pub fn expert_parameters(&self) -> Vec<&Array> {
        self.experts.parameters()
    }

    /// The block as Grove's CUDA decode step takes it, where it covers it:
    /// no shared expert, a bias-free router, quantized SiLU experts.
    pub(crate) fn decode_parts(&self) -> Option<FastExperts<'_>> {
        if self.shared.is_some() {
            return None;
        }
        let [gate, up, down] = self.experts.decode_matrices()?;
        Some(FastExperts {
            router: self.router.decode_matrix()?,
            gate,
            up,
            down,
            shape: self.shape,
        })
    }

    /// The block's shape.
    pub fn shape(&self) -> MoeShape {
        self.shape
    }
}
