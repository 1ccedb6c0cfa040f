//! The gated feed-forward block: `down(silu(gate(x)) * up(x))`.
use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::ops::sigmoid;

use super::linear::Linear;
use crate::error::Result;
use crate::model::config::Quantization;
use crate::model::weights::Weights;

/// `silu(gate) * up`. (mlx-rs's `compile` of this, as mlx-lm fuses it, was
/// measured slower per step on the H200: 125-136 vs 188-198 tok/s on a
/// Llama-8B shape, so it stays three plain ops.)
fn swiglu(gate: &Array, up: &Array) -> Result<Array, Exception> {
    gate.multiply(sigmoid(gate)?)?.multiply(up)
}

/// SwiGLU MLP.
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    /// Loads `{prefix}.{gate,up,down}_proj`.
    pub fn load(
        w: &mut Weights,
        q: &Quantization,
        prefix: &str,
        hidden: i32,
        inter: i32,
    ) -> Result<Self> {
        Ok(Self {
            gate: Linear::load(w, q, &format!("{prefix}.gate_proj"), hidden, inter, false)?,
            up: Linear::load(w, q, &format!("{prefix}.up_proj"), hidden, inter, false)?,
            down: Linear::load(w, q, &format!("{prefix}.down_proj"), inter, hidden, false)?,
        })
    }

    /// Applies the block.
    pub fn forward(&self, x: &Array) -> Result<Array, Exception> {
        let gated = swiglu(&self.gate.forward(x)?, &self.up.forward(x)?)?;
        self.down.forward(&gated)
    }
}

impl Mlp {
    /// The arrays this block holds.
    pub fn parameters(&self) -> Vec<&Array> {
        [&self.gate, &self.up, &self.down]
            .into_iter()
            .flat_map(Linear::parameters)
            .collect()
    }
}
