//! Expert layers over stacked weights, as mlx-lm's `switch_layers.py`: each
//! token runs through the experts its router picked, by MLX's gather matmuls
//! (`gather_mm` for float weights, `gather_qmm` for quantized ones). With many
//! (token, expert) pairs (64 or more, i.e. prefill) the pairs are sorted by
//! expert first so each expert's rows are read once, and unsorted after.
use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::ops::{argsort_axis, gather_mm, stack, unflatten};

use super::cuda_decode::DecodeMat;
use super::linear::Packed;
use super::mlp::{Activation, gated};
use super::quant_ops::gather_qmm;
use crate::error::{MlxPhase, Result, RunnerError};
use crate::model::config::Quantization;
use crate::model::weights::Weights;

/// mlx-lm sorts by expert when `indices.size >= 64`.
const SORT_THRESHOLD: usize = 64;

/// `num_experts` stacked `[out, in]` matrices: `y = x W[e]^T (+ b[e])` for
/// each pair.
pub struct SwitchLinear {
    matrix: Matrix,
    /// `[E, out]` (gpt-oss).
    bias: Option<Array>,
}

enum Matrix {
    Dense {
        /// `[E, in, out]`: stored `[E, out, in]`, transposed once here as
        /// mlx-lm's `weight.swapaxes(-1, -2)` does per call.
        weight_t: Array,
    },
    Quantized(Packed),
}

impl SwitchLinear {
    /// Loads `{prefix}.weight` (`[E, out, in]`, quantized when
    /// `{prefix}.scales` is there; `{prefix}.bias` `[E, out]` with `bias`),
    /// or, from a checkpoint in HF's per-expert layout,
    /// `{experts}.{e}.{name}.weight` for every expert, stacked.
    pub fn load(
        w: &mut Weights,
        quant: &Quantization,
        prefix: &str,
        per_expert: Option<(&str, &str)>,
        (experts, in_dim, out_dim): (i32, i32, i32),
        bias: bool,
    ) -> Result<Self> {
        if !w.contains(&format!("{prefix}.weight"))
            && let Some((base, name)) = per_expert
            && w.contains(&format!("{base}.0.{name}.weight"))
        {
            stack_experts(w, prefix, base, name, experts)?;
        }
        let bias = if bias {
            Some(w.take_float(&format!("{prefix}.bias"), &[experts, out_dim])?)
        } else {
            None
        };
        let params = quant.for_layer(prefix);
        if !w.contains(&format!("{prefix}.scales")) {
            let weight = w.take_float(&format!("{prefix}.weight"), &[experts, out_dim, in_dim])?;
            let weight_t = weight.swap_axes(-1, -2).phase("loading expert weights")?;
            return Ok(Self {
                matrix: Matrix::Dense { weight_t },
                bias,
            });
        }
        let Some(params) = params else {
            return Err(RunnerError::Weights(format!(
                "{prefix} has quantization scales but config.json gives no quantization for it"
            )));
        };
        if in_dim % params.group_size != 0 || (in_dim * params.bits) % 32 != 0 {
            return Err(RunnerError::Weights(format!(
                "{prefix}: input size {in_dim} does not pack into groups of {} at {} bits",
                params.group_size, params.bits
            )));
        }
        let groups = in_dim / params.group_size;
        let (scales, biases) = w.take_scales(prefix, &[experts, out_dim, groups], params.mode)?;
        Ok(Self {
            matrix: Matrix::Quantized(Packed {
                weight: w.take_packed(
                    &format!("{prefix}.weight"),
                    &[experts, out_dim, in_dim * params.bits / 32],
                )?,
                scales,
                biases,
                params,
            }),
            bias,
        })
    }

    /// `x` (`[..., 1, in]`, batch dims broadcast against `indices`) through
    /// the experts `indices` name.
    pub fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array, Exception> {
        let y = match &self.matrix {
            Matrix::Dense { weight_t } => gather_mm(x, weight_t, None, indices, sorted)?,
            Matrix::Quantized(p) => gather_qmm(x, &p.as_ref(), indices, sorted)?,
        };
        match &self.bias {
            Some(b) => y.add(b.take_axis(indices, 0)?.expand_dims(-2)?),
            None => Ok(y),
        }
    }

    /// The stacked matrices as Grove's CUDA decode step takes them: affine
    /// 4- or 8-bit, without biases (it covers only those).
    pub(crate) fn decode_matrix(&self) -> Option<DecodeMat<'_>> {
        match (&self.matrix, &self.bias) {
            (Matrix::Quantized(p), None) => p.decode_matrix(),
            _ => None,
        }
    }

    /// The arrays this layer holds.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out = match &self.matrix {
            Matrix::Dense { weight_t } => vec![weight_t],
            Matrix::Quantized(p) => p.parameters(),
        };
        out.extend(self.bias.iter());
        out
    }
}

/// Moves `{base}.{e}.{name}.{weight,scales,biases}` of every expert into
/// stacked `{prefix}.*` tensors (HF's layout into mlx-lm's, as its
/// `sanitize` does). Each expert's shape must match the first's.
fn stack_experts(
    w: &mut Weights,
    prefix: &str,
    base: &str,
    name: &str,
    experts: i32,
) -> Result<()> {
    for part in ["weight", "scales", "biases"] {
        let first = format!("{base}.0.{name}.{part}");
        if !w.contains(&first) {
            continue;
        }
        let shape = w.shape_of(&first).unwrap_or_default();
        // Grown expert by expert: the count is a claim until the tensors are found.
        let mut parts = Vec::new();
        for e in 0..experts {
            parts.push(w.take(&format!("{base}.{e}.{name}.{part}"), &shape)?);
        }
        let stacked = stack(&parts, 0).map_err(|e| {
            RunnerError::Weights(format!("stacking the experts of {prefix}.{part}: {e}"))
        })?;
        w.insert(format!("{prefix}.{part}"), stacked);
    }
    Ok(())
}

/// The shape of a [`SwitchGlu`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GluShape {
    pub experts: i32,
    pub hidden: i32,
    /// Each expert's intermediate size.
    pub intermediate: i32,
    /// Per-expert biases on the three projections (gpt-oss).
    pub bias: bool,
    pub activation: Activation,
}

/// mlx-lm's `SwitchGLU`: `down(act(gate(x)) * up(x))` per picked expert.
pub struct SwitchGlu {
    gate: SwitchLinear,
    up: SwitchLinear,
    down: SwitchLinear,
    activation: Activation,
}

impl SwitchGlu {
    /// Loads `{prefix}.{gate,up,down}_proj` (stacked), or HF's per-expert
    /// `{experts}.{e}.{gate,up,down}_proj`.
    pub fn load(
        w: &mut Weights,
        quant: &Quantization,
        prefix: &str,
        experts_prefix: &str,
        shape: GluShape,
    ) -> Result<Self> {
        let (experts, hidden, intermediate) = (shape.experts, shape.hidden, shape.intermediate);
        let mut one = |name: &str, i, o| {
            SwitchLinear::load(
                w,
                quant,
                &format!("{prefix}.{name}"),
                Some((experts_prefix, name)),
                (experts, i, o),
                shape.bias,
            )
        };
        Ok(Self {
            gate: one("gate_proj", hidden, intermediate)?,
            up: one("up_proj", hidden, intermediate)?,
            down: one("down_proj", intermediate, hidden)?,
            activation: shape.activation,
        })
    }

    /// `x` `[B, L, D]` through each token's `indices` `[B, L, k]` experts:
    /// `[B, L, k, D]`.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array, Exception> {
        // 1. x as [B, L, 1, 1, D], so its batch dims broadcast against the indices.
        let x = x.expand_dims_axes(&[-2, -3])?;
        // 2. Many pairs: sort them by expert (mlx-lm's `_gather_sort`).
        let sort = indices.size() >= SORT_THRESHOLD;
        let (x, idx, inv_order) = if sort {
            let shape = indices.shape();
            let m = *shape.last().unwrap_or(&1);
            let flat = indices.flatten(None, None)?;
            let order = argsort_axis(&flat, 0)?;
            let inv_order = argsort_axis(&order, 0)?;
            let rows = order.floor_divide(Array::from_int(m).as_dtype(order.dtype())?)?;
            let x = x.flatten(0, -3)?.take_axis(&rows, 0)?;
            (x, flat.take_axis(&order, 0)?, Some(inv_order))
        } else {
            (x, indices.clone(), None)
        };
        // 3. The gated block, expert by expert.
        let up = self.up.forward(&x, &idx, sort)?;
        let gate = self.gate.forward(&x, &idx, sort)?;
        let h = gated(self.activation, &gate, &up)?;
        let y = self.down.forward(&h, &idx, sort)?;
        // 4. Back into token order: [B, L, k, 1, D] -> [B, L, k, D].
        let y = match inv_order {
            Some(inv) => unflatten(y.take_axis(&inv, 0)?, 0, indices.shape())?,
            None => y,
        };
        y.squeeze_axes(&[-2])
    }

    /// Gate, up and down as Grove's CUDA decode step takes them, where it
    /// covers them (SiLU, quantized, no biases).
    pub(crate) fn decode_matrices(&self) -> Option<[DecodeMat<'_>; 3]> {
        if !matches!(self.activation, Activation::Silu) {
            return None;
        }
        Some([
            self.gate.decode_matrix()?,
            self.up.decode_matrix()?,
            self.down.decode_matrix()?,
        ])
    }

    /// The arrays this block holds.
    pub fn parameters(&self) -> Vec<&Array> {
        [&self.gate, &self.up, &self.down]
            .into_iter()
            .flat_map(SwitchLinear::parameters)
            .collect()
    }
}
