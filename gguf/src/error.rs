//! The GGUF error type. Each variant names the part of the file that failed,
//! so a message says where a malformed or unsupported file went wrong.
use std::path::PathBuf;

/// Everything that can fail while reading or converting a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The fixed header (magic, version, counts) is malformed.
    #[error("{path}: bad GGUF header: {message}")]
    Header { path: PathBuf, message: String },
    /// A metadata key/value pair is malformed.
    #[error("{path}: bad GGUF metadata{}: {message}", key.as_deref().map(|k| format!(" at key {k:?}")).unwrap_or_default())]
    Metadata {
        path: PathBuf,
        key: Option<String>,
        message: String,
    },
    /// A tensor's description (name, shape, type, offset) is malformed.
    #[error("{path}: bad GGUF tensor info{}: {message}", name.as_deref().map(|n| format!(" for {n:?}")).unwrap_or_default())]
    TensorInfo {
        path: PathBuf,
        name: Option<String>,
        message: String,
    },
    /// A tensor's data cannot be decoded.
    #[error("{path}: tensor {name:?}: {message}")]
    TensorData {
        path: PathBuf,
        name: String,
        message: String,
    },
    /// The file is well formed but describes something Grove cannot run.
    #[error("{path}: {message}")]
    Unsupported { path: PathBuf, message: String },
    /// The tokenizer the metadata describes cannot be built.
    #[error("{path}: tokenizer: {message}")]
    Tokenizer { path: PathBuf, message: String },
}

/// The crate's result type.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;
