//! Raw bindings to mlx-c, generated at build time by `build.rs`, with the Rust
//! surface mlx-rs 0.33.0 expects from `mlx-sys` 0.7.0.
//!
//! # Layout
//! - `bindings.rs` (in `OUT_DIR`): bindgen's output over every `mlx/c/*.h` header.
//! - `float16_t`, `bfloat16_t`: the 16-bit float carriers, declared here because
//!   the C headers only name them on aarch64.
//! - `grove_cpu_qmm`: Grove's CPU quantized-matmul primitive
//!   (`cxx/cpu_qmm.cpp`), and `grove_cpu_rms_norm`, `grove_cpu_rope`,
//!   `grove_cpu_sdpa`, `grove_cpu_gated`: its primitives for MLX's `fast` ops
//!   and the MLPs' gated activations on the CPU
//!   (`cxx/cpu_fast.cpp`); where they are not built (macOS, whose MLX comes
//!   from source) they report "not covered".
//! - `mach_approximate_time`: the one Mach call mlx-rs makes (to seed
//!   `RandomState::new`), supplied off Apple platforms.
#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]
#![allow(unsafe_op_in_unsafe_fn)]

/// IEEE half-precision bits, as mlx-rs reads them (`f16::from_bits(x.0)`).
#[repr(transparent)]
#[derive(Debug, Default, Copy, Clone, PartialEq, Eq)]
pub struct float16_t(pub u16);

/// bfloat16 bits, as mlx-rs reads them (`bf16::from_bits(x)`).
pub type bfloat16_t = u16;

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// Off Apple platforms there is no Mach clock; mlx-rs only uses this value as a
/// seed, so nanoseconds since the Unix epoch serve.
#[cfg(not(target_vendor = "apple"))]
#[unsafe(no_mangle)]
pub extern "C" fn mach_approximate_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(grove_cpu_qmm)]
unsafe extern "C" {
    /// `*res = x @ dequant(w, scales, biases)^T` on the CPU stream `s` through
    /// Grove's kernel: 0 done, 1 not a product it covers (`res` untouched), 2
    /// an error building the graph.
    pub fn grove_cpu_qmm(
        res: *mut mlx_array,
        x: mlx_array,
        w: mlx_array,
        scales: mlx_array,
        biases: mlx_array,
        group_size: ::std::os::raw::c_int,
        bits: ::std::os::raw::c_int,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// `*res = rms_norm(x, weight if has_weight, eps)` on the CPU stream `s`
    /// (0 done, 1 not covered, 2 an error building the graph).
    pub fn grove_cpu_rms_norm(
        res: *mut mlx_array,
        x: mlx_array,
        has_weight: ::std::os::raw::c_int,
        weight: mlx_array,
        eps: f32,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// `*res = rope(x, dims, traditional, scale, offset)` with the inverse
    /// frequencies given, on the CPU stream `s` (as `grove_cpu_rms_norm`).
    pub fn grove_cpu_rope(
        res: *mut mlx_array,
        x: mlx_array,
        dims: ::std::os::raw::c_int,
        traditional: ::std::os::raw::c_int,
        scale: f32,
        offset: mlx_array,
        inv_freqs: mlx_array,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// `*res = scaled_dot_product_attention(q, k, v, scale, mask, sinks)`
    /// (mask_kind 0 none, 1 causal, 2 `mask`) on the CPU stream `s`.
    pub fn grove_cpu_sdpa(
        res: *mut mlx_array,
        q: mlx_array,
        k: mlx_array,
        v: mlx_array,
        scale: f32,
        mask_kind: ::std::os::raw::c_int,
        mask: mlx_array,
        has_sinks: ::std::os::raw::c_int,
        sinks: mlx_array,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// `*res = act(gate) * up` (act 0 SiLU, 1 tanh-approximated GELU) on the
    /// CPU stream `s`.
    pub fn grove_cpu_gated(
        res: *mut mlx_array,
        act: ::std::os::raw::c_int,
        gate: mlx_array,
        up: mlx_array,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;
}

/// Not built here: every product is left to MLX.
#[cfg(not(grove_cpu_qmm))]
pub unsafe fn grove_cpu_qmm(
    _res: *mut mlx_array,
    _x: mlx_array,
    _w: mlx_array,
    _scales: mlx_array,
    _biases: mlx_array,
    _group_size: ::std::os::raw::c_int,
    _bits: ::std::os::raw::c_int,
    _s: mlx_stream,
) -> ::std::os::raw::c_int {
    1
}

/// Not built here: every norm is left to MLX.
#[cfg(not(grove_cpu_qmm))]
pub unsafe fn grove_cpu_rms_norm(
    _res: *mut mlx_array,
    _x: mlx_array,
    _has_weight: ::std::os::raw::c_int,
    _weight: mlx_array,
    _eps: f32,
    _s: mlx_stream,
) -> ::std::os::raw::c_int {
    1
}

/// Not built here: every rotation is left to MLX.
#[cfg(not(grove_cpu_qmm))]
pub unsafe fn grove_cpu_rope(
    _res: *mut mlx_array,
    _x: mlx_array,
    _dims: ::std::os::raw::c_int,
    _traditional: ::std::os::raw::c_int,
    _scale: f32,
    _offset: mlx_array,
    _inv_freqs: mlx_array,
    _s: mlx_stream,
) -> ::std::os::raw::c_int {
    1
}

/// Not built here: every attention is left to MLX.
#[cfg(not(grove_cpu_qmm))]
pub unsafe fn grove_cpu_sdpa(
    _res: *mut mlx_array,
    _q: mlx_array,
    _k: mlx_array,
    _v: mlx_array,
    _scale: f32,
    _mask_kind: ::std::os::raw::c_int,
    _mask: mlx_array,
    _has_sinks: ::std::os::raw::c_int,
    _sinks: mlx_array,
    _s: mlx_stream,
) -> ::std::os::raw::c_int {
    1
}

/// Not built here: every activation is left to MLX.
#[cfg(not(grove_cpu_qmm))]
pub unsafe fn grove_cpu_gated(
    _res: *mut mlx_array,
    _act: ::std::os::raw::c_int,
    _gate: mlx_array,
    _up: mlx_array,
    _s: mlx_stream,
) -> ::std::os::raw::c_int {
    1
}
