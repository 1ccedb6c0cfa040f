//! `grove import FILE.gguf NAME`: converts a GGUF file (with `grove-runner
//! import`) into an MLX model directory: at NAME when NAME is a path, else
//! into the model store as the local snapshot of the repo id NAME, so `grove
//! run NAME`, `grove list` and mlx-lm find it.
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::store::{ModelRef, Store};

/// Runs `grove-runner import GGUF OUT`.
fn convert(gguf: &Path, out: &Path) -> Result<()> {
    let runner = crate::config::runner_binary().map_err(anyhow::Error::msg)?;
    let status = Command::new(&runner)
        .arg("import")
        .arg(gguf)
        .arg(out)
        .status()
        .with_context(|| format!("starting {}", runner.display()))?;
    if !status.success() {
        bail!("the import failed ({status})");
    }
    Ok(())
}

/// Imports `gguf` as `name`.
pub fn import(gguf: &Path, name: &str) -> Result<()> {
    if !grove_gguf::is_gguf(gguf) {
        bail!("{} is not a GGUF file", gguf.display());
    }
    match ModelRef::parse(name)? {
        ModelRef::Path(dir) => convert(gguf, &dir),
        ModelRef::Ollama(_) => {
            bail!("Grove never writes into ollama's store; name a path or ORG/NAME")
        }
        ModelRef::Repo(repo) => {
            let store = Store::from_env()?;
            let staging = store.staging_dir()?;
            let out = staging.join("model");
            let result = convert(gguf, &out)
                .and_then(|()| store.add_snapshot(&repo, &out).map_err(anyhow::Error::from));
            let _ = std::fs::remove_dir_all(&staging);
            let snapshot = result?;
            println!("{repo}: {}", snapshot.display());
            Ok(())
        }
    }
}
