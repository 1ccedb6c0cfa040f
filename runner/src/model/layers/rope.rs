//! Rotary position embeddings (`mx.fast.rope`) with the scaling variants of HF
//! configs, computed as mlx-lm's `initialize_rope` does.
use std::path::Path;

use mlx_rs::error::Exception;
use mlx_rs::ops::{arange, concatenate, select, split_at_indices};
use mlx_rs::{Array, fast};
use serde::Deserialize;

use super::cpu_fast;
use crate::cache::Positions;
use crate::error::Result;
use crate::model::config::config_error;

/// `rope_scaling` as written in config.json. HF uses both `type` and `rope_type`.
#[derive(Debug, Clone, Deserialize)]
pub struct RopeScalingConfig {
    #[serde(default)]
    pub rope_type: Option<String>,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub factor: Option<f64>,
    #[serde(default)]
    pub low_freq_factor: Option<f64>,
    #[serde(default)]
    pub high_freq_factor: Option<f64>,
    #[serde(default)]
    pub original_max_position_embeddings: Option<f64>,
    /// DeepSeek/GLM's attention-scale correction under yarn.
    #[serde(default)]
    pub mscale_all_dim: Option<f64>,
}

/// The scaling variants the runner implements.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scaling {
    None,
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low: f64,
        high: f64,
        original: f64,
    },
}

impl Scaling {
    fn parse(path: &Path, cfg: Option<&RopeScalingConfig>) -> Result<Self> {
        let Some(cfg) = cfg else {
            return Ok(Self::None);
        };
        let name = cfg
            .kind
            .as_deref()
            .or(cfg.rope_type.as_deref())
            .unwrap_or("default");
        let factor = || {
            cfg.factor
                .filter(|f| f.is_finite() && *f > 0.0)
                .ok_or_else(|| {
                    config_error(path, format!("rope_scaling {name} needs a positive factor"))
                })
        };
        match name {
            // mlx-lm rotates text positions plainly under Qwen's
            // multimodal rope (its sections matter for image positions only).
            "default" | "mrope" => Ok(Self::None),
            "linear" => Ok(Self::Linear { factor: factor()? }),
            "llama3" => {
                let (low, high) = (
                    cfg.low_freq_factor.unwrap_or(1.0),
                    cfg.high_freq_factor.unwrap_or(4.0),
                );
                if high <= low {
                    return Err(config_error(
                        path,
                        "rope_scaling llama3 needs high_freq_factor > low_freq_factor".into(),
                    ));
                }
                Ok(Self::Llama3 {
                    factor: factor()?,
                    low,
                    high,
                    original: cfg.original_max_position_embeddings.unwrap_or(8192.0),
                })
            }
            other => Err(config_error(
                path,
                format!(
                    "unsupported rope_scaling type {other:?} (supported: default, linear, llama3)"
                ),
            )),
        }
    }
}

/// The largest head size a rotation is built for. Frequency tables are
/// computed from the config before any weight is read, so a config's claim
/// must not size an allocation (real heads are at most 512 wide).
const MAX_DIMS: i32 = 16_384;

/// Rejects a head size no rotation can have.
fn check_dims(path: &Path, dims: i32) -> Result<()> {
    if dims > 0 && dims <= MAX_DIMS && dims % 2 == 0 {
        Ok(())
    } else {
        Err(config_error(
            path,
            format!("a rotary head size of {dims} is not even, or not in 2..={MAX_DIMS}"),
        ))
    }
}

/// Rotates the first `dims` features of each head by position.
#[derive(Clone)]
pub struct Rope {
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    freqs: Option<Array>,
    /// Multiplies the rotated features first (Phi-3's su/longrope scale).
    pre_scale: Option<f32>,
    /// What MLX's CPU fallback multiplies positions by, for Grove's CPU
    /// rotation (`cpu_fast::rope`); computed at load where that runs.
    inv_freqs: Option<Array>,
}

impl Rope {
    /// Builds the rotation for heads of `dims` features.
    pub fn new(
        path: &Path,
        dims: i32,
        base: f64,
        traditional: bool,
        scaling: Option<&RopeScalingConfig>,
    ) -> Result<Self> {
        check_dims(path, dims)?;
        if !(base.is_finite() && base > 0.0) {
            return Err(config_error(
                path,
                format!("rope_theta must be positive, not {base}"),
            ));
        }
        let rope = match Scaling::parse(path, scaling)? {
            Scaling::None => Self {
                dims,
                traditional,
                base: Some(base as f32),
                scale: 1.0,
                freqs: None,
                pre_scale: None,
                inv_freqs: None,
            },
            Scaling::Linear { factor } => Self {
                dims,
                traditional,
                base: Some(base as f32),
                scale: (1.0 / factor) as f32,
                freqs: None,
                pre_scale: None,
                inv_freqs: None,
            },
            Scaling::Llama3 {
                factor,
                low,
                high,
                original,
            } => Self {
                dims,
                traditional,
                base: None,
                scale: 1.0,
                pre_scale: None,
                inv_freqs: None,
                freqs: Some(
                    llama3_freqs(dims, base, factor, low, high, original).map_err(|e| {
                        config_error(path, format!("computing llama3 rope frequencies: {e}"))
                    })?,
                ),
            },
        };
        rope.with_cpu_frequencies()
    }

    /// mlx-lm's `SuScaledRoPE` (Phi-3's su/longrope scaling): frequencies
    /// `long_factor * base^(2i/dims)`, the rotated features scaled by `scale`
    /// first.
    pub fn su_scaled(dims: i32, base: f64, long_factor: &[f32], scale: f32) -> Result<Self> {
        check_dims(Path::new("config.json"), dims)?;
        let make = || -> Result<Array, Exception> {
            let exponents = arange::<_, f32>(0, dims, 2)?.divide(Array::from_f32(dims as f32))?;
            let freqs = Array::from_f32(base as f32).power(&exponents)?;
            let factors = Array::from_slice(long_factor, &[long_factor.len() as i32]);
            let out = factors.multiply(&freqs)?;
            out.eval()?;
            Ok(out)
        };
        let freqs = make().map_err(|e| crate::error::RunnerError::Config {
            path: Default::default(),
            message: format!("rope_scaling long_factor: {e}"),
        })?;
        Self {
            dims,
            traditional: false,
            base: None,
            scale: 1.0,
            freqs: Some(freqs),
            pre_scale: Some(scale),
            inv_freqs: None,
        }
        .with_cpu_frequencies()
    }

    /// mlx-lm's `ProportionalRoPE` (Gemma 4's global layers): the first
    /// `rotated` of `dims` features get frequencies `factor * base^(2i/dims)`,
    /// the rest an infinite wavelength (left as they are).
    pub fn proportional(
        path: &std::path::Path,
        dims: i32,
        rotated: i32,
        traditional: bool,
        base: f64,
        factor: f64,
    ) -> Result<Self> {
        check_dims(path, dims)?;
        if rotated > dims || rotated < 0 || rotated % 2 != 0 {
            return Err(config_error(
                path,
                format!("{rotated} rotated features do not fit heads of {dims}"),
            ));
        }
        let make = || -> Result<Array, Exception> {
            let exponents =
                arange::<_, f32>(0, rotated, 2)?.divide(Array::from_f32(dims as f32))?;
            let freqs = Array::from_f32(base as f32)
                .power(&exponents)?
                .multiply(Array::from_f32(factor as f32))?;
            let rest = Array::full::<f32>(&[(dims - rotated) / 2], Array::from_f32(f32::INFINITY))?;
            let out = concatenate(&[freqs, rest], 0)?;
            out.eval()?;
            Ok(out)
        };
        let freqs = make().map_err(|e| config_error(path, format!("rope frequencies: {e}")))?;
        Self {
            dims,
            traditional,
            base: None,
            scale: 1.0,
            freqs: Some(freqs),
            pre_scale: None,
            inv_freqs: None,
        }
        .with_cpu_frequencies()
    }

    /// Computes [`Self::inv_freqs`] where Grove's CPU rotation runs.
    fn with_cpu_frequencies(mut self) -> Result<Self> {
        if super::cpu_qmm::enabled() {
            let inv =
                super::cpu_fast::inverse_frequencies(self.dims, self.base, self.freqs.as_ref())
                    .map_err(|e| crate::error::RunnerError::Config {
                        path: Default::default(),
                        message: format!("rope frequencies: {e}"),
                    })?;
            self.inv_freqs = Some(inv);
        }
        Ok(self)
    }

    /// `x` with its first `dims` features multiplied by the pre-scale.
    fn scaled(&self, x: &Array) -> Result<Array, Exception> {
        let Some(s) = self.pre_scale else {
            return Ok(x.clone());
        };
        let s = Array::from_f32(s).as_dtype(x.dtype())?;
        if x.dim(-1) == self.dims {
            return x.multiply(&s);
        }
        let parts = split_at_indices(x, &[self.dims], -1)?;
        concatenate(&[parts[0].multiply(&s)?, parts[1].clone()], -1)
    }

    /// A plain (not traditional, not pre-scaled) rotation as Grove's CUDA
    /// decode step takes it: dims, base (else `freqs`), position scale.
    pub(crate) fn plain(&self) -> Option<(i32, Option<f32>, f32, Option<&Array>)> {
        (!self.traditional && self.pre_scale.is_none()).then_some((
            self.dims,
            self.base,
            self.scale,
            self.freqs.as_ref(),
        ))
    }

    /// Applies the rotation to `x` (`[B, heads, L, head_dim]`) at `positions`
    /// (one start for all rows, or one per row).
    pub fn forward_at(&self, x: &Array, positions: &Positions) -> Result<Array, Exception> {
        let x = &self.scaled(x)?;
        if let (Some(inv), Positions::PerRow(offsets)) = (&self.inv_freqs, positions) {
            let grove = cpu_fast::rope(x, self.dims, self.traditional, self.scale, offsets, inv);
            if let Some(out) = grove {
                return out;
            }
        }
        match positions {
            Positions::Uniform(offset) => self.forward(x, *offset),
            Positions::PerRow(offsets) => fast::rope_dynamic(
                x,
                self.dims,
                self.traditional,
                self.base,
                self.scale,
                offsets,
                self.freqs.as_ref(),
            ),
        }
    }

    /// Applies the rotation to `x` (`[B, heads, L, head_dim]`) at position `offset`.
    pub fn forward(&self, x: &Array, offset: i32) -> Result<Array, Exception> {
        if let Some(inv) = &self.inv_freqs {
            let offset = Array::from_int(offset);
            let grove = cpu_fast::rope(x, self.dims, self.traditional, self.scale, &offset, inv);
            if let Some(out) = grove {
                return out;
            }
        }
        fast::rope(
            x,
            self.dims,
            self.traditional,
            self.base,
            self.scale,
            offset,
            self.freqs.as_ref(),
        )
    }
}

/// Llama 3's wavelength-dependent frequencies, in the same float32 operations
/// as mlx-lm's `Llama3RoPE` (Python scalars are folded in double first).
fn llama3_freqs(
    dims: i32,
    base: f64,
    factor: f64,
    low: f64,
    high: f64,
    original: f64,
) -> Result<Array, Exception> {
    let f = |v: f64| Array::from_f32(v as f32);
    let exponents = arange::<_, f32>(0, dims, 2)?.divide(f(dims as f64))?;
    let freqs = f(base).power(&exponents)?;
    let wavelens = freqs.multiply(f(2.0 * std::f64::consts::PI))?;
    let low_wavelen = original / low;
    let high_wavelen = original / high;
    let freqs = select(
        &wavelens.gt(f(low_wavelen))?,
        &freqs.multiply(f(factor))?,
        &freqs,
    )?;
    let medium = wavelens
        .gt(f(high_wavelen))?
        .logical_and(&wavelens.lt(f(low_wavelen))?)?;
    let smooth = f(original)
        .divide(&wavelens)?
        .subtract(f(low))?
        .divide(f(high - low))?;
    let denom = f(1.0).subtract(&smooth)?.divide(f(factor))?.add(&smooth)?;
    let smooth_freqs = freqs.divide(&denom)?;
    let out = select(&medium, &smooth_freqs, &freqs)?;
    out.eval()?;
    Ok(out)
}
