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
/// [`CpuDtypes::Float32`], every float16/bfloat16 array becomes float32.
pub fn apply(
    tensors: &mut HashMap<String, Array>,
    policy: CpuDtypes,
    on_cpu: bool,
) -> Result<DtypeReport> {
    let stored = stored_dtype(tensors);
    let promote = on_cpu && policy == CpuDtypes::Float32;
    let mut promoted = false;
    if promote {
        for array in tensors.values_mut() {
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
