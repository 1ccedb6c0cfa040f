//! A GGUF file as the runner loads it: grove-gguf converts each tensor (HF
//! name, MLX affine layout or float) and this turns them into MLX arrays,
//! with the `config.json` the conversion implies.
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::path::Path;

use grove_gguf::{Data, GgufModel, Vocab};
use mlx_rs::{Array, Dtype};
use serde_json::Value;

use crate::error::{Result, RunnerError};

/// A converted GGUF file.
pub struct Converted {
    /// The config.json the file implies (with its `quantization` block).
    pub config: Value,
    /// Every tensor under its HF name (`.weight`/`.scales`/`.biases`).
    pub tensors: HashMap<String, Array>,
    /// The tokenizer and its configuration files.
    pub vocab: Vocab,
}

/// Opens and converts the GGUF file at `path`.
pub fn convert(path: &Path) -> Result<Converted> {
    let model = GgufModel::open(path)?;
    let vocab = model.vocab()?;
    let mut tensors = HashMap::with_capacity(model.plan.tensors.len() * 3);
    let mut quantized = BTreeMap::new();
    for plan in &model.plan.tensors {
        let t = model.tensor(plan)?;
        let dims = |shape: &[usize]| -> Result<Vec<i32>> {
            shape
                .iter()
                .map(|&d| {
                    i32::try_from(d).map_err(|_| {
                        RunnerError::Weights(format!("{}: dimension {d} is too large", t.name))
                    })
                })
                .collect()
        };
        let shape = dims(&t.shape)?;
        match t.data {
            Data::F32(v) => {
                tensors.insert(t.name, array(&v, &shape, Dtype::Float32)?);
            }
            Data::F16(v) => {
                tensors.insert(t.name, array(&v, &shape, Dtype::Float16)?);
            }
            Data::Bf16(v) => {
                tensors.insert(t.name, array(&v, &shape, Dtype::Bfloat16)?);
            }
            Data::Affine {
                bits,
                weight,
                scales,
                biases,
            } => {
                let (rows, cols) = match shape[..] {
                    [rows, cols] => (rows, cols),
                    _ => {
                        return Err(RunnerError::Weights(format!(
                            "{}: quantized tensors must be matrices, not {shape:?}",
                            t.name
                        )));
                    }
                };
                let module = t
                    .name
                    .strip_suffix(".weight")
                    .ok_or_else(|| RunnerError::Weights(format!("{}: a quantized bias", t.name)))?
                    .to_owned();
                let group = grove_gguf::blocks::GROUP as i32;
                let packed = cols * bits as i32 / 32;
                tensors.insert(t.name, array(&weight, &[rows, packed], Dtype::Uint32)?);
                let groups = [rows, cols / group];
                tensors.insert(
                    format!("{module}.scales"),
                    array(&scales, &groups, Dtype::Float16)?,
                );
                tensors.insert(
                    format!("{module}.biases"),
                    array(&biases, &groups, Dtype::Float16)?,
                );
                quantized.insert(module, bits);
            }
        }
    }
    let config = Value::Object(model.config(&quantized));
    Ok(Converted {
        config,
        tensors,
        vocab,
    })
}

/// An MLX array of `dtype` over `data` (copied), checking the element count.
fn array<T: Copy>(data: &[T], shape: &[i32], dtype: Dtype) -> Result<Array> {
    let n: i64 = shape.iter().map(|&d| i64::from(d)).product();
    let width = match dtype {
        Dtype::Float32 | Dtype::Uint32 => 4,
        Dtype::Float16 | Dtype::Bfloat16 => 2,
        _ => 0,
    };
    if n != data.len() as i64 || std::mem::size_of::<T>() != width {
        return Err(RunnerError::Weights(format!(
            "{} values do not fill shape {shape:?} of {dtype:?}",
            data.len()
        )));
    }
    // SAFETY: `data` holds exactly `n` elements of `dtype`'s size; MLX copies them.
    Ok(unsafe { Array::from_raw_data(data.as_ptr() as *const c_void, shape, dtype) })
}
