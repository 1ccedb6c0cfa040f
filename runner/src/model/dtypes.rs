//! Which dtypes a model computes in, per backend.
//!
//! MLX's CPU backend emulates half-precision arithmetic on x86: a 4-bit
//! matrix-vector product with float16 activations took 40.6 ms where the same
//! weights with float32 activations took 1.2 ms (576x1536, 2 cores), and a
//! dense float16 one 4.5 ms against 1.1 ms in float32. Activations take the
//! dtype of the norm weights and embeddings, so on the CPU backend every
//! float16/bfloat16 array of a checkpoint (quantization scales and biases,
//! norms, embeddings, dense matrices, biases) is promoted to float32 at load,
//! and the model computes (and caches keys and values) in float32. Packed
//! quantized weights are not touched. On Metal and CUDA nothing changes.
//! `GROVE_CPU_DTYPES=stored` (or `--cpu-dtypes stored`) keeps the stored
//! dtypes on the CPU too, at half the memory of promoted dense matrices.
use std::collections::HashMap;

use mlx_rs::{Array, Dtype};

use crate::error::{MlxPhase, Result};

/// What to do with half-precision arrays on the CPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CpuDtypes {
    /// Promote float16/bfloat16 arrays to float32 (the default).
    #[default]
    Float32,
    /// Keep the dtypes the checkpoint stores.
    Stored,
}

/// What loading did to the checkpoint's dtypes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DtypeReport {
    /// The half-precision dtype the checkpoint stores most float values in,
    /// else float32.
    pub stored: Dtype,
    /// Whether half-precision arrays were promoted to float32.
    pub promoted: bool,
}

impl DtypeReport {
    /// A line for Status and logs, e.g. "bfloat16 promoted to float32 (CPU backend)".
    pub fn describe(&self) -> String {
        if self.promoted {
            format!(
                "{} arrays promoted to float32 (MLX CPU backend)",
                dtype_name(self.stored)
            )
        } else {
            format!("{} as stored", dtype_name(self.stored))
        }
    }
}

/// The lower-case dtype name.
pub fn dtype_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Float32 => "float32",
        Dtype::Float16 => "float16",
        Dtype::Bfloat16 => "bfloat16",
        Dtype::Uint32 => "uint32",
        _ => "other",
    }
}

/// Whether MLX's default device is the CPU.
pub fn cpu_backend() -> bool {
    mlx_rs::Device::default()
        .get_type()
        .map(|t| matches!(t, mlx_rs::DeviceType::Cpu))
        .unwrap_or(true)
}

/// Applies the policy to a checkpoint's arrays: on the CPU backend with
/// [`CpuDtypes::Float32`], every float16/bfloat16 array becomes float32,
/// except the scales and biases of matrices whose products Grove's CPU
/// kernel computes (`half_scales_ok`): it reads them as stored, so keeping
/// them half-size cuts what a decode step reads (0.75 -> 0.625 byte per
/// 4-bit weight) and changes no result (the kernel widens them exactly).
pub fn apply(
    tensors: &mut HashMap<String, Array>,
    policy: CpuDtypes,
    on_cpu: bool,
    half_scales_ok: impl Fn(&str) -> bool,
) -> Result<DtypeReport> {
    let stored = stored_dtype(tensors);
    let promote = on_cpu && policy == CpuDtypes::Float32;
    let mut promoted = false;
    if promote {
        let keep: std::collections::HashSet<String> = tensors
            .keys()
            .filter(|name| keeps_half_scales(tensors, name, &half_scales_ok))
            .cloned()
            .collect();
        for (name, array) in tensors.iter_mut() {
            if keep.contains(name) {
                continue;
            }
            if matches!(array.dtype(), Dtype::Float16 | Dtype::Bfloat16) {
                *array = array
                    .as_dtype(Dtype::Float32)
                    .phase("promoting weights to float32")?;
                promoted = true;
            }
        }
    }
    Ok(DtypeReport { stored, promoted })
}

/// Whether `name` is the scales or biases of a 2-D packed matrix (uint32
/// `{module}.weight`) of a module `half_scales_ok` names, in half precision.
fn keeps_half_scales(
    tensors: &HashMap<String, Array>,
    name: &str,
    half_scales_ok: &impl Fn(&str) -> bool,
) -> bool {
    let Some(module) = name
        .strip_suffix(".scales")
        .or_else(|| name.strip_suffix(".biases"))
    else {
        return false;
    };
    let half = |n: &str| {
        tensors
            .get(n)
            .is_some_and(|a| matches!(a.dtype(), Dtype::Float16 | Dtype::Bfloat16))
    };
    let packed_2d = tensors
        .get(&format!("{module}.weight"))
        .is_some_and(|w| w.dtype() == Dtype::Uint32 && w.ndim() == 2);
    // Both halves of a pair stay as stored, or neither (the kernel takes one
    // dtype for the two).
    let pair = half(&format!("{module}.scales"))
        && half(&format!("{module}.biases"))
        && tensors.get(&format!("{module}.scales")).map(Array::dtype)
            == tensors.get(&format!("{module}.biases")).map(Array::dtype);
    packed_2d && pair && half_scales_ok(module)
}

/// The half-precision dtype most of the checkpoint's float values are
/// stored in, else float32.
fn stored_dtype(tensors: &HashMap<String, Array>) -> Dtype {
    let (mut f16, mut bf16) = (0usize, 0usize);
    for a in tensors.values() {
        match a.dtype() {
            Dtype::Float16 => f16 += a.size(),
            Dtype::Bfloat16 => bf16 += a.size(),
            _ => {}
        }
    }
    match (f16, bf16) {
        (0, 0) => Dtype::Float32,
        (h, b) if h >= b => Dtype::Float16,
        _ => Dtype::Bfloat16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zeros(shape: &[i32], dtype: Dtype) -> Array {
        Array::zeros::<f32>(shape).unwrap().as_dtype(dtype).unwrap()
    }

    #[test]
    fn scales_of_kernel_matrices_stay_half_and_the_rest_is_promoted() {
        let mut t = HashMap::new();
        for m in [
            "layers.0.up",
            "embed_tokens",
            "layers.0.mixed",
            "experts.up",
        ] {
            let shape: &[i32] = if m.starts_with("experts") {
                &[2, 8, 4]
            } else {
                &[8, 4]
            };
            t.insert(format!("{m}.weight"), zeros(shape, Dtype::Uint32));
            t.insert(format!("{m}.scales"), zeros(shape, Dtype::Float16));
            let biases = if m == "layers.0.mixed" {
                Dtype::Bfloat16
            } else {
                Dtype::Float16
            };
            t.insert(format!("{m}.biases"), zeros(shape, biases));
        }
        t.insert("norm.weight".into(), zeros(&[4], Dtype::Float16));
        let report = apply(&mut t, CpuDtypes::Float32, true, |m| m != "embed_tokens").unwrap();
        assert!(report.promoted);
        let dtype = |n: &str| t[n].dtype();
        // Covered 2-D matrices keep both halves as stored.
        assert_eq!(dtype("layers.0.up.scales"), Dtype::Float16);
        assert_eq!(dtype("layers.0.up.biases"), Dtype::Float16);
        // Not named by the predicate, mixed pair, 3-D stack, plain arrays: float32.
        for n in [
            "embed_tokens.scales",
            "layers.0.mixed.scales",
            "layers.0.mixed.biases",
            "experts.up.scales",
            "norm.weight",
        ] {
            assert_eq!(dtype(n), Dtype::Float32, "{n}");
        }
        // Off the CPU, or with `stored`, nothing changes.
        let mut t2 = HashMap::new();
        t2.insert("norm.weight".to_string(), zeros(&[4], Dtype::Float16));
        apply(&mut t2, CpuDtypes::Stored, true, |_| true).unwrap();
        assert_eq!(t2["norm.weight"].dtype(), Dtype::Float16);
    }
}
