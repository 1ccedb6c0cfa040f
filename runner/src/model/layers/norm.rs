//! RMS normalisation (`mx.fast.rms_norm`), with the weight as stored or, as
//! Gemma's norms use it, offset by one (`1 + weight`).
use mlx_rs::Array;
use mlx_rs::error::Exception;

use crate::error::Result;
use crate::model::weights::Weights;

/// `x / rms(x) * weight`.
pub struct RmsNorm {
    weight: Array,
    eps: f32,
}

impl RmsNorm {
    /// Loads `{prefix}.weight` of length `dim`.
    pub fn load(w: &mut Weights, prefix: &str, dim: i32, eps: f32) -> Result<Self> {
        Ok(Self {
            weight: w.take_float(&format!("{prefix}.weight"), &[dim])?,
            eps,
        })
    }

    /// Loads `{prefix}.weight` and uses `offset + weight` (Gemma: 1), added in
    /// the weight's dtype as mlx-lm adds it on every call.
    pub fn load_offset(
        w: &mut Weights,
        prefix: &str,
        dim: i32,
        eps: f32,
        offset: f32,
    ) -> Result<Self> {
        let mut norm = Self::load(w, prefix, dim, eps)?;
        if offset != 0.0 {
            let shift = Array::from_f32(offset)
                .as_dtype(norm.weight.dtype())
                .map_err(|e| crate::error::RunnerError::Weights(format!("{prefix}: {e}")))?;
            norm.weight = norm
                .weight
                .add(&shift)
                .map_err(|e| crate::error::RunnerError::Weights(format!("{prefix}: {e}")))?;
        }
        Ok(norm)
    }

    /// Normalises over the last axis.
    pub fn forward(&self, x: &Array) -> Result<Array, Exception> {
        super::cpu_fast::rms_norm(x, Some(&self.weight), self.eps)
    }
}

impl RmsNorm {
    /// The weight (offset included) and epsilon.
    pub(crate) fn weight_eps(&self) -> (&Array, f32) {
        (&self.weight, self.eps)
    }

    /// The arrays this norm holds.
    pub fn parameters(&self) -> Vec<&Array> {
        vec![&self.weight]
    }
}

/// `(x - mean(x)) / sqrt(var(x) + eps) * weight + bias` (`mx.fast.layer_norm`;
/// BERT's `LayerNorm`).
pub struct LayerNorm {
    weight: Array,
    bias: Array,
    eps: f32,
}

impl LayerNorm {
    /// Loads `{prefix}.weight` and `{prefix}.bias` of length `dim`.
    pub fn load(w: &mut Weights, prefix: &str, dim: i32, eps: f32) -> Result<Self> {
        Ok(Self {
            weight: w.take_float(&format!("{prefix}.weight"), &[dim])?,
            bias: w.take_float(&format!("{prefix}.bias"), &[dim])?,
            eps,
        })
    }

    /// Normalises over the last axis.
    pub fn forward(&self, x: &Array) -> Result<Array, Exception> {
        mlx_rs::fast::layer_norm(x, &self.weight, &self.bias, self.eps)
    }

    /// The arrays this norm holds.
    pub fn parameters(&self) -> Vec<&Array> {
        vec![&self.weight, &self.bias]
    }
}
