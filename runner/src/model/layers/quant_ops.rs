//! MLX's quantized kernels in every mode Grove loads: affine (scales and
//! biases per group) through mlx-rs, and the microscaling float formats
//! (`mxfp4`, `nvfp4`, `mxfp8`: one shared exponent or fp8 scale per group,
//! no biases), for which mlx-rs 0.33 has no mode argument, through mlx-c
//! directly.
use std::ffi::CString;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Stream};

use crate::model::config::{QuantMode, QuantParams};

/// A packed matrix as the kernels take it.
pub struct QuantRef<'a> {
    pub weight: &'a Array,
    pub scales: &'a Array,
    /// Affine only.
    pub biases: Option<&'a Array>,
    pub params: QuantParams,
}

fn opt(v: i32) -> mlx_sys::mlx_optional_int {
    mlx_sys::mlx_optional_int {
        value: v,
        has_value: true,
    }
}

/// Runs one mlx-c op writing `res`, as mlx-rs's own wrappers do.
fn call(
    what: &str,
    f: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32,
) -> Result<Array, Exception> {
    let stream = Stream::thread_local_or_default();
    // SAFETY: `res` is a fresh handle the op fills; on success it is owned by
    // the returned Array, on failure freed here.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = f(&mut res, stream.as_ptr());
        if status != 0 {
            mlx_sys::mlx_array_free(res);
            return Err(Exception::custom(format!(
                "{what} failed (MLX status {status})"
            )));
        }
        Ok(Array::from_ptr(res))
    }
}

fn mode_name(mode: QuantMode) -> CString {
    CString::new(mode.name()).unwrap_or_default()
}

fn null_array() -> mlx_sys::mlx_array {
    // SAFETY: an empty handle, what mlx-c reads as "absent".
    unsafe { mlx_sys::mlx_array_new() }
}

/// `x @ W^T` against a packed matrix.
pub fn quantized_matmul(x: &Array, q: &QuantRef) -> Result<Array, Exception> {
    quantized_matmul_with(x, q, true)
}

/// `x @ W^T` (`transpose`) or `x @ W` against a packed matrix.
pub fn quantized_matmul_with(x: &Array, q: &QuantRef, transpose: bool) -> Result<Array, Exception> {
    if transpose && let Some(out) = super::cuda_qmv::qmv(x, q) {
        return out;
    }
    if transpose && let Some(out) = super::cpu_qmm::qmm(x, q) {
        return out;
    }
    if q.params.mode == QuantMode::Affine {
        return mlx_rs::ops::quantized_matmul(
            x,
            q.weight,
            q.scales,
            q.biases,
            transpose,
            q.params.group_size,
            q.params.bits,
        );
    }
    let mode = mode_name(q.params.mode);
    let empty = null_array();
    let out = call("quantized_matmul", |res, s| unsafe {
        mlx_sys::mlx_quantized_matmul(
            res,
            x.as_ptr(),
            q.weight.as_ptr(),
            q.scales.as_ptr(),
            q.biases.map_or(empty, Array::as_ptr),
            transpose,
            opt(q.params.group_size),
            opt(q.params.bits),
            mode.as_ptr(),
            s,
        )
    });
    // SAFETY: the empty handle was not consumed by mlx-c.
    unsafe { mlx_sys::mlx_array_free(empty) };
    out
}

/// `x @ W[e]^T` for the experts `indices` name (stacked packed matrices).
pub fn gather_qmm(
    x: &Array,
    q: &QuantRef,
    indices: &Array,
    sorted: bool,
) -> Result<Array, Exception> {
    if q.params.mode == QuantMode::Affine {
        return mlx_rs::ops::gather_qmm(
            x,
            q.weight,
            q.scales,
            q.biases,
            None,
            indices,
            true,
            q.params.group_size,
            q.params.bits,
            sorted,
        );
    }
    let mode = mode_name(q.params.mode);
    let empty = [null_array(), null_array()];
    let out = call("gather_qmm", |res, s| unsafe {
        mlx_sys::mlx_gather_qmm(
            res,
            x.as_ptr(),
            q.weight.as_ptr(),
            q.scales.as_ptr(),
            q.biases.map_or(empty[0], Array::as_ptr),
            empty[1],
            indices.as_ptr(),
            true,
            opt(q.params.group_size),
            opt(q.params.bits),
            mode.as_ptr(),
            sorted,
            s,
        )
    });
    for e in empty {
        // SAFETY: empty handles mlx-c did not take.
        unsafe { mlx_sys::mlx_array_free(e) };
    }
    out
}

/// The float values of packed rows (`w`, `scales`, `biases` already taken
/// at those rows).
pub fn dequantize(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    params: QuantParams,
) -> Result<Array, Exception> {
    if params.mode == QuantMode::Affine
        && let Some(b) = biases
    {
        return mlx_rs::ops::dequantize(w, scales, b, params.group_size, params.bits);
    }
    let mode = mode_name(params.mode);
    let empty = [null_array(), null_array()];
    let out = call("dequantize", |res, s| unsafe {
        mlx_sys::mlx_dequantize(
            res,
            w.as_ptr(),
            scales.as_ptr(),
            biases.map_or(empty[0], Array::as_ptr),
            opt(params.group_size),
            opt(params.bits),
            mode.as_ptr(),
            empty[1],
            mlx_sys::mlx_optional_dtype {
                value: mlx_sys::mlx_dtype__MLX_FLOAT32,
                has_value: false,
            },
            s,
        )
    });
    for e in empty {
        // SAFETY: empty handles mlx-c did not take.
        unsafe { mlx_sys::mlx_array_free(e) };
    }
    out
}
