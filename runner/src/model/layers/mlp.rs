//! The gated feed-forward block: `down(act(gate(x)) * up(x))`, with SiLU
//! (Llama, Qwen, Phi-3) or tanh-approximated GELU (Gemma); gate and up as two
//! matrices or one fused `gate_up_proj` (Phi-3); biases where the config says.
use mlx_rs::error::Exception;
use mlx_rs::ops::{sigmoid, split_equal, tanh};
use mlx_rs::{Array, Dtype};

use super::cuda_decode::DecodeMat;
use super::linear::Linear;
use crate::error::Result;
use crate::model::config::Quantization;
use crate::model::weights::Weights;

/// The gate's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU).
    Silu,
    /// mlx's `nn.gelu_approx`: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    GeluApprox,
    /// gpt-oss's (mlx-lm's `swiglu_oai`, alpha 1.702, limit 7): the gate
    /// clipped from above, the linear part clipped both ways plus one,
    /// `(clip(up) + 1) * g * sigmoid(1.702 g)`.
    SwigluOai,
}

/// How the block's matrices are stored.
#[derive(Debug, Clone, Copy)]
pub struct MlpShape {
    pub hidden: i32,
    pub intermediate: i32,
    pub activation: Activation,
    /// Biases on gate, up and down (Llama's `mlp_bias`).
    pub bias: bool,
    /// One `gate_up_proj` of `2 * intermediate` rows, gate first (Phi-3).
    pub fused: bool,
}

impl MlpShape {
    /// Separate gate and up matrices without biases.
    pub fn plain(hidden: i32, intermediate: i32, activation: Activation) -> Self {
        Self {
            hidden,
            intermediate,
            activation,
            bias: false,
            fused: false,
        }
    }
}

/// A scalar in `x`'s dtype, as mlx turns a Python float into one.
fn scalar(v: f64, dtype: Dtype) -> Result<Array, Exception> {
    Array::from_f32(v as f32).as_dtype(dtype)
}

/// `act(gate) * up`: one primitive on the CPU backend (`cpu_fast::gated`).
/// (mlx-rs's `compile` of this, as mlx-lm fuses it, was
/// measured slower per step on the H200: 125-136 vs 188-198 tok/s on a
/// Llama-8B shape, so it stays plain ops.)
pub(crate) fn gated(act: Activation, gate: &Array, up: &Array) -> Result<Array, Exception> {
    if let Some(out) = super::cpu_fast::gated(act, gate, up) {
        return out;
    }
    match act {
        Activation::Silu => gate.multiply(sigmoid(gate)?)?.multiply(up),
        Activation::GeluApprox => gelu_approx(gate)?.multiply(up),
        Activation::SwigluOai => {
            let d = gate.dtype();
            let limit = scalar(7.0, d)?;
            let g = mlx_rs::ops::minimum(gate, &limit)?;
            let x = mlx_rs::ops::maximum(up, limit.negative()?)?;
            let x = mlx_rs::ops::minimum(&x, &limit)?;
            let act = g.multiply(sigmoid(scalar(1.702, d)?.multiply(&g)?)?)?;
            x.add(scalar(1.0, d)?)?.multiply(act)
        }
    }
}

/// mlx's `nn.gelu_approx`, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`,
/// with the constants in `x`'s dtype as Python scalars become.
pub fn gelu_approx(x: &Array) -> Result<Array, Exception> {
    let d = x.dtype();
    let cube = x.power(scalar(3.0, d)?)?;
    let inner = x.add(scalar(0.044715, d)?.multiply(&cube)?)?;
    let t = tanh(scalar((2.0 / std::f64::consts::PI).sqrt(), d)?.multiply(&inner)?)?;
    scalar(0.5, d)?
        .multiply(x)?
        .multiply(scalar(1.0, d)?.add(&t)?)
}

enum Projections {
    Separate { gate: Linear, up: Linear },
    Fused(Linear),
}

/// A gated MLP.
pub struct Mlp {
    projections: Projections,
    down: Linear,
    activation: Activation,
}

impl Mlp {
    /// Loads `{prefix}.{gate,up,down}_proj` (or `gate_up_proj` and `down_proj`).
    pub fn load(w: &mut Weights, q: &Quantization, prefix: &str, s: MlpShape) -> Result<Self> {
        let (h, i) = (s.hidden, s.intermediate);
        let projections = if s.fused {
            Projections::Fused(Linear::load(
                w,
                q,
                &format!("{prefix}.gate_up_proj"),
                h,
                2 * i,
                s.bias,
            )?)
        } else {
            Projections::Separate {
                gate: Linear::load(w, q, &format!("{prefix}.gate_proj"), h, i, s.bias)?,
                up: Linear::load(w, q, &format!("{prefix}.up_proj"), h, i, s.bias)?,
            }
        };
        Ok(Self {
            projections,
            down: Linear::load(w, q, &format!("{prefix}.down_proj"), i, h, s.bias)?,
            activation: s.activation,
        })
    }

    /// Applies the block.
    pub fn forward(&self, x: &Array) -> Result<Array, Exception> {
        let gated = match &self.projections {
            Projections::Separate { gate, up } => {
                gated(self.activation, &gate.forward(x)?, &up.forward(x)?)?
            }
            Projections::Fused(gate_up) => {
                let parts = split_equal(&gate_up.forward(x)?, 2, -1)?;
                gated(self.activation, &parts[0], &parts[1])?
            }
        };
        self.down.forward(&gated)
    }
}

impl Mlp {
    /// Gate, up and down of a SiLU block of three matrices without biases
    /// (what Grove's CUDA decode step covers).
    pub(crate) fn plain_silu(&self) -> Option<(DecodeMat<'_>, DecodeMat<'_>, DecodeMat<'_>)> {
        let Projections::Separate { gate, up } = &self.projections else {
            return None;
        };
        if !matches!(self.activation, Activation::Silu) {
            return None;
        }
        Some((
            gate.decode_matrix()?,
            up.decode_matrix()?,
            self.down.decode_matrix()?,
        ))
    }

    /// The arrays this block holds.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out = match &self.projections {
            Projections::Separate { gate, up } => [gate, up]
                .into_iter()
                .flat_map(Linear::parameters)
                .collect(),
            Projections::Fused(gate_up) => gate_up.parameters(),
        };
        out.extend(self.down.parameters());
        out
    }
}
