//! Model names as users give them: a Hugging Face repo id found in the hub
//! cache (`ORG/NAME[@REVISION]`), or a local model directory.
use std::path::PathBuf;

use crate::store::{ModelRef, Store};

/// A model the daemon can load: its display name and canonical directory.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub name: String,
    pub dir: PathBuf,
}

/// Why a name does not lead to a model.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
}

/// Resolves `model` against the store (or the filesystem).
pub fn resolve(store: &Store, model: &str) -> Result<Resolved, ResolveError> {
    let parsed = ModelRef::parse(model).map_err(|e| ResolveError::Invalid(e.to_string()))?;
    let dir = match parsed {
        ModelRef::Path(path) => path,
        ModelRef::Repo(name) => store.resolve(&name).map_err(|e| {
            ResolveError::NotFound(format!(
                "model {model} is not in the store ({e}); run `grove pull {model}`"
            ))
        })?,
    };
    let dir = dir
        .canonicalize()
        .map_err(|e| ResolveError::NotFound(format!("model {model}: {}: {e}", dir.display())))?;
    if !dir.join("config.json").is_file() {
        return Err(ResolveError::NotFound(format!(
            "model {model}: {} has no config.json",
            dir.display()
        )));
    }
    Ok(Resolved {
        name: model.to_owned(),
        dir,
    })
}
