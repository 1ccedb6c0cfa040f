//! Linear layers, dense or MLX-quantized (affine or a microscaling float
//! mode), computed exactly as mlx's `nn.Linear` / `nn.QuantizedLinear` do so
//! results match mlx-lm bit for bit.
use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::ops::addmm;

use super::cuda_decode::DecodeMat;
use super::quant_ops::{QuantRef, quantized_matmul};
use crate::error::Result;
use crate::model::config::{QuantMode, QuantParams, Quantization};
use crate::model::weights::Weights;

/// A packed quantized matrix: `weight` (uint32), per-group `scales` (and
/// `biases`, affine mode only).
pub struct Packed {
    pub weight: Array,
    pub scales: Array,
    pub biases: Option<Array>,
    pub params: QuantParams,
}

impl Packed {
    /// Takes `{prefix}.weight/.scales/.biases` for a logical `[rows, cols]` matrix.
    pub fn take(
        w: &mut Weights,
        prefix: &str,
        rows: i32,
        cols: i32,
        params: QuantParams,
    ) -> Result<Self> {
        let packed_cols = cols * params.bits / 32;
        let groups = cols / params.group_size;
        let (scales, biases) = w.take_scales(prefix, &[rows, groups], params.mode)?;
        Ok(Self {
            weight: w.take_packed(&format!("{prefix}.weight"), &[rows, packed_cols])?,
            scales,
            biases,
            params,
        })
    }

    /// The matrix as the kernels take it.
    pub fn as_ref(&self) -> QuantRef<'_> {
        QuantRef {
            weight: &self.weight,
            scales: &self.scales,
            biases: self.biases.as_ref(),
            params: self.params,
        }
    }

    /// `x @ W.T` against the packed matrix.
    pub fn matmul_t(&self, x: &Array) -> Result<Array, Exception> {
        quantized_matmul(x, &self.as_ref())
    }
}

/// `y = x W^T (+ b)`.
pub enum Linear {
    Dense { weight: Array, bias: Option<Array> },
    Quantized { packed: Packed, bias: Option<Array> },
}

impl Linear {
    /// Loads the layer at module path `prefix` mapping `in_dim` -> `out_dim`.
    /// It is quantized when the checkpoint has `{prefix}.scales`.
    pub fn load(
        w: &mut Weights,
        quant: &Quantization,
        prefix: &str,
        in_dim: i32,
        out_dim: i32,
        bias: bool,
    ) -> Result<Self> {
        let bias = if bias {
            Some(w.take_float(&format!("{prefix}.bias"), &[out_dim])?)
        } else {
            None
        };
        let quantized = w.contains(&format!("{prefix}.scales"));
        match (quantized, quant.for_layer(prefix)) {
            (true, Some(params)) => Ok(Self::Quantized {
                packed: Packed::take(w, prefix, out_dim, in_dim, params)?,
                bias,
            }),
            (true, None) => Err(crate::error::RunnerError::Weights(format!(
                "{prefix} has quantization scales but config.json gives no quantization for it"
            ))),
            (false, _) => Ok(Self::Dense {
                weight: w.take_float(&format!("{prefix}.weight"), &[out_dim, in_dim])?,
                bias,
            }),
        }
    }

    /// Applies the layer to `x` (`[..., in_dim]`).
    pub fn forward(&self, x: &Array) -> Result<Array, Exception> {
        match self {
            Self::Dense {
                weight,
                bias: Some(b),
            } => addmm(b, x, weight.t(), None, None),
            Self::Dense { weight, bias: None } => x.matmul(weight.t()),
            Self::Quantized { packed, bias } => {
                let y = packed.matmul_t(x)?;
                match bias {
                    Some(b) => y.add(b),
                    None => Ok(y),
                }
            }
        }
    }
}

impl Packed {
    /// The matrix as Grove's CUDA decode step takes it (affine, 4 or 8 bits).
    pub(crate) fn decode_matrix(&self) -> Option<DecodeMat<'_>> {
        let p = self.params;
        if p.mode != QuantMode::Affine || !matches!(p.bits, 4 | 8) {
            return None;
        }
        Some(DecodeMat::Affine {
            weight: &self.weight,
            scales: &self.scales,
            biases: self.biases.as_ref()?,
            bits: p.bits,
            group_size: p.group_size,
        })
    }

    /// The arrays this matrix holds.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out = vec![&self.weight, &self.scales];
        out.extend(self.biases.iter());
        out
    }
}

impl Linear {
    /// The matrix as Grove's CUDA decode step takes it: dense or affine 4-
    /// or 8-bit, without a bias (the step covers only those).
    pub(crate) fn decode_matrix(&self) -> Option<DecodeMat<'_>> {
        match self {
            Self::Dense { weight, bias: None } => Some(DecodeMat::Dense(weight)),
            Self::Quantized { packed, bias: None } => packed.decode_matrix(),
            _ => None,
        }
    }

    /// The arrays this layer holds.
    pub fn parameters(&self) -> Vec<&Array> {
        let (mut out, bias) = match self {
            Self::Dense { weight, bias } => (vec![weight], bias),
            Self::Quantized { packed, bias } => (packed.parameters(), bias),
        };
        out.extend(bias.iter());
        out
    }
}
