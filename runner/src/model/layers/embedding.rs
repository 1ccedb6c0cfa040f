//! Token embeddings, dense or quantized, and their use as a tied output head.
use super::cuda_decode::DecodeMat;
use super::linear::Packed;
use super::quant_ops::dequantize;
use crate::error::Result;
use crate::model::config::Quantization;
use crate::model::weights::Weights;
use mlx_rs::Array;
use mlx_rs::error::Exception;

/// The `[vocab, hidden]` embedding table.
pub enum Embedding {
    Dense(Array),
    Quantized(Packed),
}

impl Embedding {
    /// Loads `{prefix}.weight` (and its scales and biases when quantized).
    pub fn load(
        w: &mut Weights,
        quant: &Quantization,
        prefix: &str,
        vocab: i32,
        hidden: i32,
    ) -> Result<Self> {
        match quant.for_layer(prefix) {
            Some(params) if w.contains(&format!("{prefix}.scales")) => Ok(Self::Quantized(
                Packed::take(w, prefix, vocab, hidden, params)?,
            )),
            _ => Ok(Self::Dense(
                w.take_float(&format!("{prefix}.weight"), &[vocab, hidden])?,
            )),
        }
    }

    /// Looks up the rows of `ids`.
    pub fn forward(&self, ids: &Array) -> Result<Array, Exception> {
        match self {
            Self::Dense(table) => table.take_axis(ids, 0),
            Self::Quantized(p) => dequantize(
                &p.weight.take_axis(ids, 0)?,
                &p.scales.take_axis(ids, 0)?,
                p.biases
                    .as_ref()
                    .map(|b| b.take_axis(ids, 0))
                    .transpose()?
                    .as_ref(),
                p.params,
            ),
        }
    }

    /// Uses the table as the output projection (tied embeddings): `x @ E^T`.
    pub fn as_linear(&self, x: &Array) -> Result<Array, Exception> {
        match self {
            Self::Dense(table) => x.matmul(table.t()),
            Self::Quantized(p) => p.matmul_t(x),
        }
    }
}

impl Embedding {
    /// The table as Grove's CUDA decode step takes it.
    pub(crate) fn decode_matrix(&self) -> Option<DecodeMat<'_>> {
        match self {
            Self::Dense(t) => Some(DecodeMat::Dense(t)),
            Self::Quantized(p) => p.decode_matrix(),
        }
    }

    /// The arrays this table holds.
    pub fn parameters(&self) -> Vec<&Array> {
        match self {
            Self::Dense(t) => vec![t],
            Self::Quantized(p) => p.parameters(),
        }
    }
}
