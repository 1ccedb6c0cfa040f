//! Grove's quantized matmul for MLX's CPU backend (`mlx-link/cxx/cpu_qmm.cpp`):
//! an MLX primitive, so the product stays in the lazy graph like MLX's own,
//! whose kernel reads MLX's affine 4- and 8-bit layout directly (its AVX2+FMA
//! build where the CPU has it, else the baseline; AVX-512 on request with
//! `GROVE_CPU_ISA=avx512`), split over
//! `GROVE_CPU_THREADS` threads (default: the cores this process may use).
//! MLX 0.32.2's CPU kernel runs on one thread at ~2 GFLOP/s.
//!
//! It computes what `quantized_matmul(x, w, scales, biases, transpose=true)`
//! does for float32 x, as (scale * q + bias) * x in float32; only the order of
//! the sums differs (vector lanes, fused multiply-adds), so results agree with
//! MLX's within float32 rounding (tests/cpu_qmm.rs). Everything else (other
//! modes and bits, half-precision x, `x @ W`, GPUs) keeps MLX's kernels, as
//! does every product when `GROVE_CPU_KERNELS=mlx`.
use std::sync::OnceLock;

use mlx_rs::Array;
use mlx_rs::error::Exception;

use super::quant_ops::QuantRef;
use crate::model::config::{QuantMode, QuantParams};

/// Whether Grove's kernel is used for the products it covers: on the CPU
/// backend unless `GROVE_CPU_KERNELS=mlx`.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let mlx = std::env::var("GROVE_CPU_KERNELS").is_ok_and(|v| v == "mlx");
        !mlx && crate::model::dtypes::cpu_backend()
    })
}

/// Whether the module at `module`, packed with `params`, keeps half-precision
/// scales and biases on the CPU backend: its products are Grove's kernel's
/// (affine 4/8-bit, groups of 32/64/128), which reads them as stored.
/// Embedding tables are not: their rows are looked up by MLX's `dequantize`,
/// whose output would be half precision.
pub fn reads_half_scales(module: &str, params: Option<QuantParams>) -> bool {
    let Some(p) = params else {
        return false;
    };
    let last = module.rsplit('.').next().unwrap_or(module);
    enabled()
        && p.mode == QuantMode::Affine
        && matches!(p.bits, 4 | 8)
        && matches!(p.group_size, 32 | 64 | 128)
        && !last.contains("embed")
        && !matches!(last, "wte" | "tok_embeddings")
}

/// `x @ W^T` through Grove's kernel when it covers this product, else `None`
/// (the caller uses MLX's kernel).
pub fn qmm(x: &Array, q: &QuantRef) -> Option<Result<Array, Exception>> {
    if !enabled() || q.params.mode != QuantMode::Affine {
        return None;
    }
    qmm_always(x, q)
}

/// As [`qmm`] whatever `GROVE_CPU_KERNELS` says (the tests compare the two
/// kernels in one process).
pub fn qmm_always(x: &Array, q: &QuantRef) -> Option<Result<Array, Exception>> {
    let biases = q.biases?;
    super::cpu_fast::primitive("quantized matmul", |res, s| unsafe {
        mlx_sys::grove_cpu_qmm(
            res,
            x.as_ptr(),
            q.weight.as_ptr(),
            q.scales.as_ptr(),
            biases.as_ptr(),
            q.params.group_size,
            q.params.bits,
            s,
        )
    })
}
