//! Model names as users give them: a Hugging Face repo id found in the hub
//! cache (`ORG/NAME[@REVISION]`), a local model directory or GGUF file, or a
//! model in ollama's store (`ollama:NAME[:TAG]`, its GGUF blob read in place).
use std::path::PathBuf;

use crate::store::{ModelRef, OllamaStore, Store};

/// What a model's path holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// config.json, safetensors, tokenizer files.
    Directory,
    /// One GGUF file, converted by the runner at load.
    Gguf,
}

/// A model the daemon can load: its display name and canonical path.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub name: String,
    /// The model directory or GGUF file the runner is given.
    pub path: PathBuf,
    pub kind: ModelKind,
}

/// Why a name does not lead to a model.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
}

/// Resolves `model` against the stores (or the filesystem).
pub fn resolve(
    store: &Store,
    ollama: Option<&OllamaStore>,
    model: &str,
) -> Result<Resolved, ResolveError> {
    let parsed = ModelRef::parse(model).map_err(|e| ResolveError::Invalid(e.to_string()))?;
    let path = match parsed {
        ModelRef::Path(path) => path,
        // The store's error names the model and says to pull it.
        ModelRef::Repo(name) => store
            .resolve(&name)
            .map_err(|e| ResolveError::NotFound(e.to_string()))?,
        ModelRef::Ollama(name) => {
            let Some(ollama) = ollama else {
                return Err(ResolveError::NotFound(format!(
                    "model {model}: no ollama store (set OLLAMA_MODELS or HOME)"
                )));
            };
            ollama
                .resolve(&name)
                .map_err(|e| ResolveError::NotFound(e.to_string()))?
                .path
        }
    };
    let path = path
        .canonicalize()
        .map_err(|e| ResolveError::NotFound(format!("model {model}: {}: {e}", path.display())))?;
    let kind = if path.is_dir() {
        if !path.join("config.json").is_file() {
            return Err(ResolveError::NotFound(format!(
                "model {model}: {} has no config.json",
                path.display()
            )));
        }
        ModelKind::Directory
    } else if grove_gguf::is_gguf(&path) {
        ModelKind::Gguf
    } else {
        return Err(ResolveError::NotFound(format!(
            "model {model}: {} is neither a model directory nor a GGUF file",
            path.display()
        )));
    };
    Ok(Resolved {
        name: model.to_owned(),
        path,
        kind,
    })
}
