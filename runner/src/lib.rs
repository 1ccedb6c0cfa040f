//! Grove's runner: one process that owns MLX, one model and its KV cache.
//!
//! # Layout
//! - [`cli`]: the `grove-runner` command line (`generate`).
//! - [`model`]: config parsing, safetensors loading, layers and one file per
//!   architecture (llama, mistral, qwen2, qwen3).
//! - [`cache`]: per-layer KV buffers grown in 256-token steps.
//! - [`generate`]: chunked prefill and the pipelined decode loop.
//! - [`tokenizer`]: tokenizer.json plus the BOS/EOS facts a generation needs.
//! - [`error`]: [`RunnerError`], whose variants name the failing phase.
pub mod cache;
pub mod cli;
pub mod error;
pub mod generate;
pub mod model;
pub mod tokenizer;

pub use error::RunnerError;
