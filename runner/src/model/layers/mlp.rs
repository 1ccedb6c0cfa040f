//! The gated feed-forward block: `down(silu(gate(x)) * up(x))`.
use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::ops::sigmoid;

use super::linear::Linear;
use crate::error::Result;
use crate::model::config::Quantization;
use crate::model::weights::Weights;

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
        let gate = self.gate.forward(x)?;
        let silu = gate.multiply(sigmoid(&gate)?)?;
        self.down.forward(&silu.multiply(self.up.forward(x)?)?)
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
