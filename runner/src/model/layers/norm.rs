//! RMS normalisation (`mx.fast.rms_norm`).
use mlx_rs::error::Exception;
use mlx_rs::{Array, fast};

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

    /// Normalises over the last axis.
    pub fn forward(&self, x: &Array) -> Result<Array, Exception> {
        fast::rms_norm(x, Some(&self.weight), self.eps)
    }
}

impl RmsNorm {
    /// The arrays this norm holds.
    pub fn parameters(&self) -> Vec<&Array> {
        vec![&self.weight]
    }
}
