//! Warming the device's kernels before the runner says it is ready.
//!
//! On a GPU, MLX compiles many kernels at their first use (NVRTC on CUDA;
//! Grove's quantized matvec too), so without this the first request of a
//! process pays for them: on an H200 a Llama-8B's first prefill took 9.2 s
//! on a fresh machine and 1.9 s with MLX's kernel cache on disk (see
//! tests/bench/README.md). The runner runs one short generation (a prefill
//! and a few greedy decode steps, the shapes a single request takes) and two
//! longer prefills on throwaway caches at load, then drops them and empties
//! MLX's buffer cache, so afterwards only the weights are held, as before.
//!
//! Why three prompt lengths: MLX's CUDA backend compiles its quantized
//! matmul (`qmm_sm80`, CUTLASS through NVRTC) once per tile height, 16, 32
//! or 64 rows (the next power of two of the rows, clamped), and per bits. On
//! an H200 with an empty kernel cache each took ~36 s (llama-small 4-bit: a
//! 16-token warm-up 40.1 s, then the first 24-token prompt 36.4 s and the
//! first 48-token one 36.2 s, the next ones 2-3 ms); with one length the
//! user's first prompts of 17-32 and of 33 or more tokens each waited that
//! long. With all three lengths the same fresh machine's warm-up took 107.2
//! s and those first prompts 45 and 52 ms. With the kernel cache on disk a
//! load's warm-up takes 0.68-0.89 s against 0.47-0.62 s with one length
//! (loading the kernels' code), and a process's first prompts 42-63 ms
//! against 143-205 ms. The CPU backend compiles
//! nothing at run time, so there it is skipped. `GROVE_WARMUP=0` skips it,
//! `GROVE_WARMUP=1` runs it on any device.
use std::time::{Duration, Instant};

use crate::error::{MlxPhase, Result};
use crate::generate::{GenerateParams, generate};
use crate::model::Model;

/// Prompt tokens of the warm-up generation, then of the two prefills: their
/// prefills take 15, 31 and 63 rows (the last prompt token is decoded), one
/// of each of MLX's quantized matmul tile heights.
const PROMPTS: [usize; 3] = [16, 32, 64];

/// Tokens it generates (the pipelined decode loop's shapes).
const NEW_TOKENS: usize = 3;

/// Whether this runner warms up at load, given whether it computes on the
/// CPU.
pub fn wanted(on_cpu: bool) -> bool {
    match std::env::var("GROVE_WARMUP").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => !on_cpu,
    }
}

/// Warms up when [`wanted`], saying how long it took on stderr.
pub fn warm_up_if_wanted(model: &Model, on_cpu: bool) -> Result<()> {
    if wanted(on_cpu) && model.generates() {
        let took = warm_up(model)?;
        eprintln!(
            "grove-runner: kernels warmed up in {:.2} s",
            took.as_secs_f64()
        );
    }
    Ok(())
}

/// Runs the warm-up generation; returns how long it took.
pub fn warm_up(model: &Model) -> Result<Duration> {
    let start = Instant::now();
    let vocab = model.dims.vocab.max(1) as u32;
    for (i, len) in PROMPTS.into_iter().enumerate() {
        let prompt: Vec<u32> = (0..len as u32).map(|t| (7 + 31 * t) % vocab).collect();
        let params = GenerateParams {
            max_tokens: if i == 0 { NEW_TOKENS } else { 1 },
            ..GenerateParams::default()
        };
        generate(model, &prompt, &[], &params, |_| {})?;
    }
    mlx_rs::memory::clear_cache().phase("warming up")?;
    Ok(start.elapsed())
}
