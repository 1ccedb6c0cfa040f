//! `grove-runner import`: a GGUF file written out as an MLX model directory,
//! laid out as mlx-lm's converter lays one out, so mlx-lm loads it too:
//! `config.json` (with its `quantization` block), `model.safetensors` (or
//! shards of at most 5 GB with `model.safetensors.index.json`, as mlx-lm
//! writes them), `tokenizer.json`, `tokenizer_config.json` (with the chat
//! template) and `generation_config.json`.
//!
//! The directory is written under a temporary name beside the target and
//! renamed into place at the end, so a failed import leaves nothing behind.
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use mlx_rs::Array;
use serde::Serialize;
use serde_json::{Value, json};

use crate::error::{Result, RunnerError};
use crate::model::gguf;

/// mlx-lm's shard size limit.
const SHARD_BYTES: usize = 5 << 30;

/// What an import wrote.
#[derive(Debug, Serialize)]
pub struct ImportReport {
    pub dir: PathBuf,
    pub tensors: usize,
    pub bytes: u64,
    pub shards: usize,
    pub seconds: f64,
}

fn write_err(path: &Path, source: std::io::Error) -> RunnerError {
    RunnerError::Read {
        path: path.to_owned(),
        source,
    }
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| RunnerError::Request(format!("{}: {e}", path.display())))?;
    std::fs::write(path, text + "\n").map_err(|e| write_err(path, e))
}

/// Removes the temporary directory unless the import finished.
struct Staging(Option<PathBuf>);

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Converts `gguf` and writes the model directory `out`, which must not exist
/// or be empty.
pub fn import(gguf_path: &Path, out: &Path) -> Result<ImportReport> {
    let started = Instant::now();
    if out.exists() {
        let empty = out.is_dir()
            && std::fs::read_dir(out)
                .map_err(|e| write_err(out, e))?
                .next()
                .is_none();
        if !empty {
            return Err(RunnerError::Request(format!(
                "{} already exists and is not an empty directory",
                out.display()
            )));
        }
    }
    let converted = gguf::convert(gguf_path)?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| write_err(&parent, e))?;
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let staging_dir = parent.join(format!(".{name}.importing-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging_dir);
    std::fs::create_dir(&staging_dir).map_err(|e| write_err(&staging_dir, e))?;
    let mut staging = Staging(Some(staging_dir.clone()));

    let tensors = converted.tensors.len();
    let (bytes, shards) = write_weights(&staging_dir, converted.tensors)?;
    write_json(&staging_dir.join("config.json"), &converted.config)?;
    let tokenizer_json = converted
        .vocab
        .tokenizer
        .to_string(false)
        .map_err(|e| RunnerError::Tokenizer(format!("serializing the tokenizer: {e}")))?;
    let path = staging_dir.join("tokenizer.json");
    std::fs::write(&path, tokenizer_json).map_err(|e| write_err(&path, e))?;
    write_json(
        &staging_dir.join("tokenizer_config.json"),
        &Value::Object(converted.vocab.tokenizer_config),
    )?;
    write_json(
        &staging_dir.join("generation_config.json"),
        &Value::Object(converted.vocab.generation_config),
    )?;

    if out.exists() {
        std::fs::remove_dir(out).map_err(|e| write_err(out, e))?;
    }
    std::fs::rename(&staging_dir, out).map_err(|e| write_err(out, e))?;
    staging.0 = None;
    Ok(ImportReport {
        dir: out.to_owned(),
        tensors,
        bytes,
        shards,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Writes the tensors as one safetensors file or 5 GB shards with an index.
fn write_weights(dir: &Path, tensors: HashMap<String, Array>) -> Result<(u64, usize)> {
    let mut names: Vec<String> = tensors.keys().cloned().collect();
    names.sort();
    let mut shards: Vec<Vec<String>> = vec![Vec::new()];
    let mut size = 0usize;
    let mut total = 0u64;
    for name in names {
        let bytes = tensors[&name].nbytes();
        if size + bytes > SHARD_BYTES && !shards.last().is_some_and(Vec::is_empty) {
            shards.push(Vec::new());
            size = 0;
        }
        size += bytes;
        total += bytes as u64;
        if let Some(shard) = shards.last_mut() {
            shard.push(name);
        }
    }
    let metadata = HashMap::from([("format".to_owned(), "mlx".to_owned())]);
    let count = shards.len();
    let mut index = BTreeMap::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = if count == 1 {
            "model.safetensors".to_owned()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", i + 1)
        };
        let path = dir.join(&file);
        Array::save_safetensors(
            shard.iter().map(|n| (n.as_str(), &tensors[n])),
            &metadata,
            &path,
        )
        .map_err(|e| RunnerError::Weights(format!("writing {}: {e}", path.display())))?;
        for name in shard {
            index.insert(name.clone(), json!(file));
        }
    }
    if count > 1 {
        write_json(
            &dir.join("model.safetensors.index.json"),
            &json!({"metadata": {"total_size": total}, "weight_map": index}),
        )?;
    }
    Ok((total, count))
}
