//! The runner's error type. Each variant names the phase that failed, so a
//! message says what went wrong and where without a backtrace.
use std::path::PathBuf;

/// Everything that can fail inside the runner.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The model directory or one of its files could not be read.
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `config.json` is malformed or describes something Grove does not support.
    #[error("config {path}: {message}")]
    Config { path: PathBuf, message: String },
    /// The safetensors files are missing, malformed or do not fit the config.
    #[error("weights: {0}")]
    Weights(String),
    /// A GGUF file is malformed or describes something Grove cannot run.
    #[error("GGUF {0}")]
    Gguf(#[from] grove_gguf::GgufError),
    /// The tokenizer files are missing or malformed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The prompt or the generation options are not usable.
    #[error("invalid request: {0}")]
    Request(String),
    /// The runner was told to stop (SIGTERM, Shutdown) before the request ended.
    #[error("the runner is stopping")]
    Stopped,
    /// A group of runners (tensor parallelism) could not form, shard the
    /// model or keep in step; `phase` says which.
    #[error("sharding ({phase}): {message}")]
    Shard {
        phase: &'static str,
        message: String,
    },
    /// MLX reported an error while evaluating; `phase` says what was running.
    #[error("MLX error during {phase}: {message}")]
    Mlx {
        phase: &'static str,
        message: String,
    },
}

/// The runner's result type.
pub type Result<T, E = RunnerError> = std::result::Result<T, E>;

/// Adds the phase to an MLX error, e.g. `.phase("prefill")?`.
pub trait MlxPhase<T> {
    /// Turns an MLX exception into [`RunnerError::Mlx`] tagged with `phase`.
    fn phase(self, phase: &'static str) -> Result<T>;
}

impl<T, E: std::fmt::Display> MlxPhase<T> for std::result::Result<T, E> {
    fn phase(self, phase: &'static str) -> Result<T> {
        self.map_err(|e| RunnerError::Mlx {
            phase,
            message: e.to_string(),
        })
    }
}
