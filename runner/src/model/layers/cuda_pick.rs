//! Greedy sampling on a CUDA GPU: each row's `argmax(x - logsumexp(x))`,
//! what mlx-lm's greedy sampler computes with three MLX operations, as one
//! MLX graph node of two kernels (`mlx-link/cuda/pick.cu`) that spread a
//! row of logits over many blocks where MLX's kernels read it with one
//! (H200, Llama-1B: 37 us a step for MLX's three).
//!
//! Taken where Grove's CUDA decode step may be ([`super::cuda_lib::wanted`])
//! unless `GROVE_FD_PICK=0`, on logits already on the GPU's stream: those of
//! Grove's decode step, or logits evaluated earlier (its kernels go straight
//! onto the stream, ahead of what MLX has recorded and not yet launched).
//! Everywhere else, and for logits it does not cover (MLX's step's, or
//! processed by penalties or a grammar), the caller runs MLX's operations.
use std::ffi::c_void;
use std::sync::OnceLock;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Stream};

use super::cuda_lib::{PickFn, lib, wanted};

fn pick_fn() -> Option<PickFn> {
    static PICK: OnceLock<Option<PickFn>> = OnceLock::new();
    *PICK.get_or_init(|| {
        if !wanted() || std::env::var("GROVE_FD_PICK").as_deref() == Ok("0") {
            return None;
        }
        lib()?.pick
    })
}

/// Each row's greedy token of `logits` (`[B, V]`), `[B]` uint32, or `None`
/// where the pick is not taken.
pub fn greedy_pick(logits: &Array) -> Result<Option<Array>, Exception> {
    let Some(pick) = pick_fn() else {
        return Ok(None);
    };
    let stream = Stream::thread_local_or_default();
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `stream` and `logits` are live for the call; on 0 `out` holds
    // a new `mlx::core::array*`, owned from here on by the Array made of it.
    let status = unsafe { pick(stream.as_ptr().ctx, logits.as_ptr().ctx, &mut out) };
    if status != 0 || out.is_null() {
        return Ok(None);
    }
    // SAFETY: see above.
    Ok(Some(unsafe {
        Array::from_ptr(mlx_sys::mlx_array { ctx: out })
    }))
}
