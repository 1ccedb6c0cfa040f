//! Loading safetensors (one file or a sharded index) into named MLX arrays, and
//! handing them out to layers with errors that name the missing tensor.
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use crate::error::{Result, RunnerError};
use crate::model::config::QuantMode;

/// The tensors of a checkpoint, taken out one by one as layers are built.
pub struct Weights {
    tensors: HashMap<String, Array>,
}

#[derive(Deserialize)]
struct Index {
    weight_map: HashMap<String, String>,
}

impl Weights {
    /// Loads every safetensors file of `dir`: the files named by
    /// `model.safetensors.index.json` if present, else `model.safetensors`, else
    /// all `*.safetensors` files.
    pub fn load(dir: &Path) -> Result<Self> {
        let files = safetensors_files(dir)?;
        let mut tensors = HashMap::new();
        for file in files {
            super::safetensors::check(&file)?;
            let loaded = Array::load_safetensors(&file).map_err(|e| {
                RunnerError::Weights(format!(
                    "{}: not a readable safetensors file: {e}",
                    file.display()
                ))
            })?;
            tensors.extend(loaded);
        }
        Ok(Self { tensors })
    }

    /// [`Weights::load`] of rank `rank` of `size`: the tensors the group
    /// splits are this rank's slices, read by offset
    /// ([`crate::shard::load`]).
    pub fn load_rank(
        dir: &Path,
        layout: &crate::shard::load::Layout,
        rank: i32,
        size: i32,
    ) -> Result<Self> {
        let mut tensors = HashMap::new();
        for file in safetensors_files(dir)? {
            tensors.extend(crate::shard::load::load_file(&file, layout, rank, size)?);
        }
        Ok(Self { tensors })
    }

    /// Wraps tensors already in memory (tests).
    pub fn from_map(tensors: HashMap<String, Array>) -> Self {
        Self { tensors }
    }

    /// The tensors, by name.
    pub fn into_map(self) -> HashMap<String, Array> {
        self.tensors
    }

    /// Whether a tensor of this name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Whether any tensor satisfies `pred` (of its name and array).
    pub fn any_array(&self, pred: impl Fn(&str, &Array) -> bool) -> bool {
        self.tensors.iter().any(|(k, a)| pred(k, a))
    }

    /// The names that satisfy `pred`.
    pub fn names(&self, pred: impl Fn(&str) -> bool) -> Vec<String> {
        self.tensors.keys().filter(|k| pred(k)).cloned().collect()
    }

    /// Takes a tensor out as it is, if it exists.
    pub fn pop(&mut self, name: &str) -> Option<Array> {
        self.tensors.remove(name)
    }

    /// Whether any tensor's name satisfies `pred`.
    pub fn any(&self, pred: impl Fn(&str) -> bool) -> bool {
        self.tensors.keys().any(|k| pred(k))
    }

    /// Replaces each tensor whose name satisfies `pred` by `f` of it.
    pub fn update(
        &mut self,
        pred: impl Fn(&str) -> bool,
        f: impl Fn(&Array) -> std::result::Result<Array, mlx_rs::error::Exception>,
    ) -> Result<()> {
        for (name, array) in self.tensors.iter_mut() {
            if pred(name) {
                *array = f(array)
                    .map_err(|e| RunnerError::Weights(format!("converting {name}: {e}")))?;
            }
        }
        Ok(())
    }

    /// The shape of a tensor, if it exists.
    pub fn shape_of(&self, name: &str) -> Option<Vec<i32>> {
        self.tensors.get(name).map(|a| a.shape().to_vec())
    }

    /// Puts a tensor (one made from others at load) under `name`.
    pub fn insert(&mut self, name: String, array: Array) {
        self.tensors.insert(name, array);
    }

    /// Takes a tensor out, checking its shape.
    pub fn take(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        let array = self
            .tensors
            .remove(name)
            .ok_or_else(|| RunnerError::Weights(format!("missing tensor {name}")))?;
        if array.shape() != shape {
            return Err(RunnerError::Weights(format!(
                "tensor {name} has shape {:?}, the config implies {shape:?}",
                array.shape()
            )));
        }
        Ok(array)
    }

    /// Takes a float tensor (float32, float16 or bfloat16), checking its shape.
    pub fn take_float(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        let array = self.take(name, shape)?;
        match array.dtype() {
            Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16 => Ok(array),
            other => Err(RunnerError::Weights(format!(
                "tensor {name} has dtype {other:?}; expected float32, float16 or bfloat16"
            ))),
        }
    }

    /// Takes a packed quantized tensor (uint32), checking its shape.
    pub fn take_packed(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        let array = self.take(name, shape)?;
        if array.dtype() != Dtype::Uint32 {
            return Err(RunnerError::Weights(format!(
                "tensor {name} has dtype {:?}; quantized weights are packed uint32",
                array.dtype()
            )));
        }
        Ok(array)
    }

    /// Takes `{prefix}.scales` (and `{prefix}.biases` in affine mode) of a
    /// packed matrix: float in affine mode, uint8 exponents or fp8 scales in
    /// the microscaling modes.
    pub fn take_scales(
        &mut self,
        prefix: &str,
        shape: &[i32],
        mode: QuantMode,
    ) -> Result<(Array, Option<Array>)> {
        let name = format!("{prefix}.scales");
        if mode.has_biases() {
            let scales = self.take_float(&name, shape)?;
            let biases = self.take_float(&format!("{prefix}.biases"), shape)?;
            return Ok((scales, Some(biases)));
        }
        let scales = self.take(&name, shape)?;
        if scales.dtype() != Dtype::Uint8 {
            return Err(RunnerError::Weights(format!(
                "tensor {name} has dtype {:?}; {} scales are uint8",
                scales.dtype(),
                mode.name()
            )));
        }
        Ok((scales, None))
    }

    /// Drops tensors the runner has no use for (e.g. precomputed rotary tables).
    pub fn discard(&mut self, pred: impl Fn(&str) -> bool) {
        self.tensors.retain(|name, _| !pred(name));
    }

    /// Fails if any tensor was not used: a checkpoint that does not match its
    /// config must not load silently.
    pub fn finish(self) -> Result<()> {
        if self.tensors.is_empty() {
            return Ok(());
        }
        let names: BTreeSet<&String> = self.tensors.keys().collect();
        let shown: Vec<&str> = names.iter().take(8).map(|s| s.as_str()).collect();
        Err(RunnerError::Weights(format!(
            "{} unexpected tensors (the config does not describe them): {}{}",
            names.len(),
            shown.join(", "),
            if names.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        )))
    }
}

fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|source| RunnerError::Read {
            path: index.clone(),
            source,
        })?;
        let parsed: Index = serde_json::from_str(&text)
            .map_err(|e| RunnerError::Weights(format!("{}: {e}", index.display())))?;
        let names: BTreeSet<String> = parsed.weight_map.into_values().collect();
        let mut files = Vec::new();
        for name in names {
            if name.contains('/') || name.contains("..") {
                return Err(RunnerError::Weights(format!(
                    "{}: shard name {name:?} leaves the model directory",
                    index.display()
                )));
            }
            let file = dir.join(&name);
            if !file.is_file() {
                return Err(RunnerError::Weights(format!(
                    "{} names shard {name}, which does not exist",
                    index.display()
                )));
            }
            files.push(file);
        }
        return Ok(files);
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let entries = std::fs::read_dir(dir).map_err(|source| RunnerError::Read {
        path: dir.to_owned(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(RunnerError::Weights(format!(
            "no safetensors files in {}",
            dir.display()
        )));
    }
    Ok(files)
}
