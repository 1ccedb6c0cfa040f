//! Grove's own quantized matrix-vector kernel for decode on NVIDIA GPUs
//! (`qmv.cuh`), run through MLX's custom-kernel API (`mlx_fast_cuda_kernel`,
//! compiled by MLX with NVRTC at first use and cached with its other kernels).
//!
//! It computes exactly what MLX's affine `quantized_matmul(x, w, scales,
//! biases, transpose=true)` does, for 4- and 8-bit weights with groups of 32,
//! 64 or 128, float32/float16/bfloat16 activations and up to [`MAX_ROWS`] rows
//! of x, in float32 throughout (MLX's own CUDA matvec sums 4-bit products in
//! the activations' type). On an H200 it takes 0.4-0.7x the time of MLX
//! 0.32.2's kernel per call (tests/bench/gpu_qmv.sh), but each call costs
//! the host more (MLX rebuilds a custom kernel's source and looks its module
//! up at every call), and a decode step at batch 1 is mostly bound by the
//! host: so it is used only for matrices of at least [`MIN_BYTES`], where the
//! device time it saves is larger. Everything it does not cover, and every
//! device that is not a CUDA GPU (Metal, the CPU), keeps MLX's kernels.
//! `GROVE_CUDA_QMV=0` turns it off and `GROVE_CUDA_QMV=all` uses it for
//! every matrix it covers (for A/B measurements).
use std::ffi::{CStr, CString, c_char};
use std::sync::OnceLock;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype, Stream};

use super::quant_ops::QuantRef;
use crate::model::config::QuantMode;

/// The most rows of x (tokens in the batch) it is used for: measured faster
/// than MLX's kernels up to 4 on an H200; at 8 MLX's tiled matmul wins.
pub const MAX_ROWS: i32 = 4;

/// The least packed weight bytes of a matrix it is used for by default.
pub const MIN_BYTES: usize = 16 << 20;

/// Output rows per warp (measured best of 1, 2 and 4).
const ROWS_PER_WARP: i32 = 2;

/// 16-byte weight loads each lane issues before it uses any.
const CHUNK: i32 = 8;

const HEADER: &str = include_str!("qmv.cuh");
const BODY: &str = "grove_qmv<M, K, N, BITS, GS, R, CHUNK>(x, w, scales, biases, out);";

/// The compiled-on-demand kernel object.
struct Kernel(mlx_sys::mlx_fast_cuda_kernel);

// SAFETY: the handle is an immutable description (names and source) that
// MLX only reads when it is applied; applying it from any thread is what
// `mx.fast.cuda_kernel` objects allow in Python.
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

/// The kernel and the least weight bytes it is used for, when this process
/// computes on a CUDA GPU and it is not turned off; `None` otherwise.
fn kernel() -> Option<&'static (Kernel, usize)> {
    static KERNEL: OnceLock<Option<(Kernel, usize)>> = OnceLock::new();
    KERNEL
        .get_or_init(|| {
            let min_bytes = match std::env::var("GROVE_CUDA_QMV").as_deref() {
                Ok("0") => return None,
                Ok("all") => 0,
                _ => MIN_BYTES,
            };
            if !on_cuda_gpu() {
                return None;
            }
            let header = CString::new(compact(HEADER)).ok()?;
            let body = CString::new(BODY).ok()?;
            let inputs = strings(&[c"x", c"w", c"scales", c"biases"]);
            let outputs = strings(&[c"out"]);
            // SAFETY: all pointers are valid C strings / vectors for the call;
            // mlx-c copies them into the kernel object.
            let k = unsafe {
                let k = mlx_sys::mlx_fast_cuda_kernel_new(
                    c"grove_qmv".as_ptr(),
                    inputs,
                    outputs,
                    body.as_ptr(),
                    header.as_ptr(),
                    true,
                    0,
                );
                mlx_sys::mlx_vector_string_free(inputs);
                mlx_sys::mlx_vector_string_free(outputs);
                k
            };
            (!k.ctx.is_null()).then_some((Kernel(k), min_bytes))
        })
        .as_ref()
}

/// The source without comments and indentation: MLX rebuilds and hashes the
/// kernel's whole source at every call, so a shorter one costs less host time
/// per call.
fn compact(source: &str) -> String {
    source
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn strings(names: &[&CStr]) -> mlx_sys::mlx_vector_string {
    let ptrs: Vec<*const c_char> = names.iter().map(|c| c.as_ptr()).collect();
    // SAFETY: `ptrs` points at static C strings; mlx-c copies them.
    unsafe { mlx_sys::mlx_vector_string_new_data(ptrs.as_ptr().cast_mut(), ptrs.len()) }
}

/// Whether MLX's default device is a GPU of its CUDA backend (asked once).
pub fn on_cuda_gpu() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(ask_cuda_gpu)
}

fn ask_cuda_gpu() -> bool {
    let mut cuda = false;
    // SAFETY: a plain query that writes one bool.
    let known = unsafe { mlx_sys::mlx_cuda_is_available(&mut cuda) } == 0;
    known && cuda && !crate::model::dtypes::cpu_backend()
}

fn float_type(d: Dtype) -> bool {
    matches!(d, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16)
}

/// `x @ W^T` through Grove's kernel when it covers this product, else `None`
/// (the caller uses MLX's kernel).
pub fn qmv(x: &Array, q: &QuantRef) -> Option<Result<Array, Exception>> {
    let (kernel, min_bytes) = kernel()?;
    let p = q.params;
    let biases = q.biases?;
    let (shape, wshape) = (x.shape(), q.weight.shape());
    let (&k, lead) = shape.split_last()?;
    let rows: i32 = lead.iter().product();
    let n = *wshape.first()?;
    let vals = 4 * 32 / p.bits.max(1); // one lane's values per 16-byte load
    let fits = p.mode == QuantMode::Affine
        && matches!(p.bits, 4 | 8)
        && matches!(p.group_size, 32 | 64 | 128)
        && p.group_size % vals == 0
        && wshape.len() == 2
        && wshape[1] * 32 / p.bits == k
        && k % vals == 0
        && (1..=MAX_ROWS).contains(&rows)
        && n % ROWS_PER_WARP == 0
        && float_type(x.dtype())
        && float_type(q.scales.dtype())
        && biases.dtype() == q.scales.dtype()
        && q.weight.dtype() == Dtype::Uint32
        && q.weight.nbytes() >= *min_bytes;
    if !fits {
        return None;
    }
    Some(
        apply(
            kernel,
            x,
            q.weight,
            q.scales,
            biases,
            [rows, k, n, p.bits, p.group_size],
        )
        .and_then(|out| {
            let mut out_shape = lead.to_vec();
            out_shape.push(n);
            out.reshape(&out_shape)
        }),
    )
}

fn apply(
    kernel: &Kernel,
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    [m, k, n, bits, gs]: [i32; 5],
) -> Result<Array, Exception> {
    let x2 = x.reshape(&[m, k])?;
    let stream = Stream::thread_local_or_default();
    let names = [c"M", c"K", c"N", c"BITS", c"GS", c"R", c"CHUNK"];
    let values = [m, k, n, bits, gs, ROWS_PER_WARP, CHUNK];
    let out_shape = [m, n];
    // SAFETY: every handle is created here and freed before returning; the
    // inputs are live arrays; on success the output is owned by the Array.
    unsafe {
        let config = mlx_sys::mlx_fast_cuda_kernel_config_new();
        let mut status = mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
            config,
            out_shape.as_ptr(),
            out_shape.len(),
            x.dtype() as mlx_sys::mlx_dtype,
        );
        status |=
            mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, 32 * n / ROWS_PER_WARP, 1, 1);
        status |= mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(config, 128, 1, 1);
        for (name, value) in names.iter().zip(values) {
            status |= mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(
                config,
                name.as_ptr(),
                value,
            );
        }
        let ins = [x2.as_ptr(), w.as_ptr(), scales.as_ptr(), biases.as_ptr()];
        let inputs = mlx_sys::mlx_vector_array_new_data(ins.as_ptr(), ins.len());
        let mut outputs = mlx_sys::mlx_vector_array_new();
        if status == 0 {
            status = mlx_sys::mlx_fast_cuda_kernel_apply(
                &mut outputs,
                kernel.0,
                inputs,
                config,
                stream.as_ptr(),
            );
        }
        let mut out = mlx_sys::mlx_array_new();
        if status == 0 {
            status = mlx_sys::mlx_vector_array_get(&mut out, outputs, 0);
        }
        mlx_sys::mlx_vector_array_free(inputs);
        mlx_sys::mlx_vector_array_free(outputs);
        mlx_sys::mlx_fast_cuda_kernel_config_free(config);
        if status != 0 {
            mlx_sys::mlx_array_free(out);
            return Err(Exception::custom(format!(
                "Grove's quantized matvec failed (MLX status {status})"
            )));
        }
        Ok(Array::from_ptr(out))
    }
}
