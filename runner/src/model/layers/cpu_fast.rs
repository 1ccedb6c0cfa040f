//! MLX's `fast` ops (RMS norm, rotary embedding, scaled dot-product
//! attention) and the MLPs' gated activations through Grove's CPU primitives
//! (`mlx-link/cxx/cpu_fast.cpp`) where they cover the call, else through MLX.
//!
//! MLX 0.32.2 runs none of them as one kernel on the CPU: each is its
//! fallback, a chain of ordinary ops (about 6, 20 and 9 of them), and each op
//! costs host time; attention also computes the full square of scores under a
//! causal mask and a softmax whose exp runs one value at a time. Grove's
//! primitives are one graph node each and compute the same float32
//! operations, in another order where sums run in vector lanes (results agree
//! within float32 rounding: tests/cpu_fast.rs). They are used where Grove's
//! quantized kernel is ([`cpu_qmm::enabled`]: the CPU backend, unless
//! `GROVE_CPU_KERNELS=mlx`), for float32 inputs; anything else is MLX's.
use std::os::raw::c_int;

use mlx_rs::error::Exception;
use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::{Array, Stream};

use super::cpu_qmm;

/// Builds a graph node through `build` (a `grove_cpu_*` entry point given the
/// result handle and the stream): `None` when it does not cover the call.
pub(crate) fn primitive(
    what: &str,
    build: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> c_int,
) -> Option<Result<Array, Exception>> {
    let stream = Stream::thread_local_or_default();
    // SAFETY: `res` is a fresh handle; on status 0 the result is owned by the
    // returned Array, otherwise it is freed here. The entry points only read
    // the arrays they are given, which the caller keeps alive.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = build(&mut res, stream.as_ptr());
        match status {
            0 => Some(Ok(Array::from_ptr(res))),
            1 => {
                mlx_sys::mlx_array_free(res);
                None
            }
            _ => {
                mlx_sys::mlx_array_free(res);
                Some(Err(Exception::custom(format!(
                    "Grove's CPU {what} failed to build its graph node"
                ))))
            }
        }
    }
}

/// `mx.fast.rms_norm(x, weight, eps)`.
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array, Exception> {
    if let Some(out) = cpu_qmm::enabled()
        .then(|| rms_norm_always(x, weight, eps))
        .flatten()
    {
        return out;
    }
    fast::rms_norm(x, weight, eps)
}

/// Grove's RMS norm whatever `GROVE_CPU_KERNELS` says (`None`: not covered).
pub fn rms_norm_always(
    x: &Array,
    weight: Option<&Array>,
    eps: f32,
) -> Option<Result<Array, Exception>> {
    primitive("RMS norm", |res, s| unsafe {
        mlx_sys::grove_cpu_rms_norm(
            res,
            x.as_ptr(),
            weight.is_some() as c_int,
            weight.unwrap_or(x).as_ptr(),
            eps,
            s,
        )
    })
}

/// The inverse frequencies MLX's rope fallback multiplies positions by: from
/// `freqs` (`1 / freqs`) or from `base` (`exp(-i * ln(base) / (dims / 2))`),
/// in the same MLX ops, evaluated once.
pub fn inverse_frequencies(
    dims: i32,
    base: Option<f32>,
    freqs: Option<&Array>,
) -> Result<Array, Exception> {
    let out = match freqs {
        Some(f) => mlx_rs::ops::reciprocal(f)?,
        None => {
            let half = dims / 2;
            let base = base.unwrap_or(10_000.0);
            let step = Array::from_f32(base.ln() / half as f32);
            mlx_rs::ops::exp(Array::arange::<_, f32>(0, -half, -1)?.multiply(&step)?)?
        }
    };
    out.eval()?;
    Ok(out)
}

/// Grove's rotation of `x` (`[B, H, L, D]`, float32) at `offset` (one int32
/// or one per batch row), given [`inverse_frequencies`] (which `Rope` holds
/// only where Grove's kernels run); `None`: not covered.
pub fn rope(
    x: &Array,
    dims: i32,
    traditional: bool,
    scale: f32,
    offset: &Array,
    inv_freqs: &Array,
) -> Option<Result<Array, Exception>> {
    primitive("rotary embedding", |res, s| unsafe {
        mlx_sys::grove_cpu_rope(
            res,
            x.as_ptr(),
            dims,
            traditional as c_int,
            scale,
            offset.as_ptr(),
            inv_freqs.as_ptr(),
            s,
        )
    })
}

/// `act(gate) * up` through Grove's primitive for SiLU and tanh-approximated
/// GELU (`None`: not covered, or not on the CPU backend).
pub fn gated(
    act: super::mlp::Activation,
    gate: &Array,
    up: &Array,
) -> Option<Result<Array, Exception>> {
    cpu_qmm::enabled()
        .then(|| gated_always(act, gate, up))
        .flatten()
}

/// As [`gated`] whatever `GROVE_CPU_KERNELS` says.
pub fn gated_always(
    act: super::mlp::Activation,
    gate: &Array,
    up: &Array,
) -> Option<Result<Array, Exception>> {
    let code = match act {
        super::mlp::Activation::Silu => 0,
        super::mlp::Activation::GeluApprox => 1,
        super::mlp::Activation::SwigluOai => return None,
    };
    primitive("gated activation", |res, s| unsafe {
        mlx_sys::grove_cpu_gated(res, code, gate.as_ptr(), up.as_ptr(), s)
    })
}

/// mlx's exact `nn.gelu` (`x (1 + erf(x / sqrt 2)) / 2`, BERT's) through
/// Grove's activation primitive, on whole vectors with MLX's erf (`None`:
/// not covered, or not on the CPU backend).
pub fn gelu(x: &Array) -> Option<Result<Array, Exception>> {
    cpu_qmm::enabled()
        .then(|| {
            primitive("GELU", |res, s| unsafe {
                mlx_sys::grove_cpu_gated(res, 2, x.as_ptr(), x.as_ptr(), s)
            })
        })
        .flatten()
}

/// `mx.fast.scaled_dot_product_attention(q, k, v, scale, mask, sinks)`.
pub fn sdpa(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: Option<ScaledDotProductAttentionMask<'_>>,
    sinks: Option<&Array>,
) -> Result<Array, Exception> {
    if let Some(out) = cpu_qmm::enabled()
        .then(|| sdpa_always(q, k, v, scale, copy_mask(&mask), sinks))
        .flatten()
    {
        return out;
    }
    fast::scaled_dot_product_attention(q, k, v, scale, mask, sinks)
}

/// The same mask again (mlx-rs's mask type is not `Clone`).
fn copy_mask<'a>(
    mask: &Option<ScaledDotProductAttentionMask<'a>>,
) -> Option<ScaledDotProductAttentionMask<'a>> {
    match mask {
        None => None,
        Some(ScaledDotProductAttentionMask::Causal) => Some(ScaledDotProductAttentionMask::Causal),
        Some(ScaledDotProductAttentionMask::Array(m)) => {
            Some(ScaledDotProductAttentionMask::Array(m))
        }
    }
}

/// Grove's attention whatever `GROVE_CPU_KERNELS` says (`None`: not covered).
pub fn sdpa_always(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: Option<ScaledDotProductAttentionMask<'_>>,
    sinks: Option<&Array>,
) -> Option<Result<Array, Exception>> {
    let (kind, mask) = match mask {
        None => (0, q),
        Some(ScaledDotProductAttentionMask::Causal) => (1, q),
        Some(ScaledDotProductAttentionMask::Array(m)) => (2, m),
    };
    primitive("attention", |res, s| unsafe {
        mlx_sys::grove_cpu_sdpa(
            res,
            q.as_ptr(),
            k.as_ptr(),
            v.as_ptr(),
            scale,
            kind,
            mask.as_ptr(),
            sinks.is_some() as c_int,
            sinks.unwrap_or(q).as_ptr(),
            s,
        )
    })
}
