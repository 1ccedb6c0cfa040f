//! Warming the device's kernels before the runner says it is ready.
//!
//! On a GPU, MLX compiles many kernels at their first use (NVRTC on CUDA;
//! Grove's quantized matvec too), so without this the first request of a
//! process pays for them: on an H200 a Llama-8B's first prefill took 9.2 s
//! on a fresh machine and 1.9 s with MLX's kernel cache on disk (see
//! tests/bench/README.md). The runner runs one short generation (a prefill
//! and a few greedy decode steps, the shapes a single request takes) on a
//! throwaway cache at load, then drops it and empties MLX's buffer cache, so
//! afterwards only the weights are held, as before. The CPU backend compiles
//! nothing at run time, so there it is skipped. `GROVE_WARMUP=0` skips it,
//! `GROVE_WARMUP=1` runs it on any device.
use std::time::{Duration, Instant};

use crate::error::{MlxPhase, Result};
use crate::generate::{GenerateParams, generate};
use crate::model::Model;

/// Prompt tokens of the warm-up generation.
const PROMPT: usize = 16;

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
    let prompt: Vec<u32> = (0..PROMPT as u32).map(|i| (7 + 31 * i) % vocab).collect();
    let params = GenerateParams {
        max_tokens: NEW_TOKENS,
        ..GenerateParams::default()
    };
    generate(model, &prompt, &[], &params, |_| {})?;
    mlx_rs::memory::clear_cache().phase("warming up")?;
    Ok(start.elapsed())
}
