//! GGUF files (llama.cpp's model format) for Grove, without MLX: a reader
//! that bounds every length by the file's size, and the conversion of a file
//! into what an MLX-layout model directory holds (config.json, tensors under
//! HF names in MLX affine quantization or float, the tokenizer and its
//! configs). The runner turns [`Tensor`]s into MLX arrays; the daemon reads
//! metadata only.
//!
//! # Layout
//! - [`reader`]: the container: header, metadata, tensor infos, data.
//! - [`value`]: metadata values and typed getters.
//! - [`types`]: ggml tensor types, block sizes.
//! - [`blocks`]: ggml blocks to MLX affine (exact for `Q4_0`, `Q4_1`,
//!   `Q8_0`) or float32 (every other type, decoded by candle).
//! - [`requant`]: float32 matrices back to MLX affine, group 32.
//! - [`plan`]: the HF config and tensor names, and llama.cpp's conversions to
//!   undo.
//! - [`vocab`]: the tokenizer, tokenizer_config and generation_config.
//! - [`writer`]: a small GGUF writer for tests and tools.
//! - [`error`]: [`GgufError`], naming the part of the file that failed.
pub mod blocks;
pub mod error;
pub mod plan;
pub mod reader;
pub mod requant;
pub mod types;
pub mod value;
pub mod vocab;
pub mod writer;

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value as Json, json};

pub use blocks::Data;
pub use error::{GgufError, Result};
pub use plan::{Family, Plan, TensorPlan, Transform};
pub use reader::{GgufFile, TensorInfo, is_gguf};
pub use types::GgmlType;
pub use vocab::Vocab;

/// One converted tensor under its HF name.
#[derive(Debug)]
pub struct Tensor {
    pub name: String,
    /// Row-major shape of the logical (unpacked) tensor.
    pub shape: Vec<usize>,
    pub data: Data,
}

/// An open GGUF file and its plan.
pub struct GgufModel {
    pub file: GgufFile,
    pub plan: Plan,
}

impl GgufModel {
    /// Opens `path` and works out its config and tensor names.
    pub fn open(path: &Path) -> Result<Self> {
        let file = GgufFile::open(path)?;
        let plan = Plan::new(&file)?;
        for t in &plan.tensors {
            let info = &file.tensors[t.index];
            if !blocks::supported(info.kind) {
                return Err(GgufError::Unsupported {
                    path: path.to_owned(),
                    message: format!(
                        "tensor {:?} is {}, a type Grove cannot read (F32, F16, BF16, Q4_0, \
                         Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q8_K)",
                        info.name, info.kind
                    ),
                });
            }
        }
        Ok(Self { file, plan })
    }

    /// The tokenizer and its configuration files.
    pub fn vocab(&self) -> Result<Vocab> {
        vocab::build(&self.file, self.plan.family)
    }

    /// Reads and converts one tensor of the plan.
    pub fn tensor(&self, plan: &TensorPlan) -> Result<Tensor> {
        let info = &self.file.tensors[plan.index];
        let fail = |message: String| GgufError::TensorData {
            path: self.file.path().to_owned(),
            name: info.name.clone(),
            message,
        };
        let shape: Vec<usize> = info.shape().iter().map(|&d| d as usize).collect();
        let elements = info.elements() as usize;
        let bytes = self.file.read(info)?;
        // A matrix is quantized along its rows; vectors stay float.
        let cols = (shape.len() == 2).then(|| shape[1]);
        let mut data =
            blocks::convert_tensor(info.kind, bytes.as_bytes(), elements, cols).map_err(fail)?;
        drop(bytes);
        match plan.transform {
            Transform::None => {}
            Transform::UnpermuteRows { heads } => {
                let rows = shape[0];
                if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
                    return Err(fail(format!(
                        "{rows} rows do not split into {heads} heads of an even size"
                    )));
                }
                unpermute(&mut data, rows, heads);
            }
            Transform::SubtractOne => subtract_one(&mut data).map_err(fail)?,
        }
        Ok(Tensor {
            name: plan.name.clone(),
            shape,
            data,
        })
    }

    /// The full `config.json`: the plan's config plus the `quantization`
    /// block for the quantized modules (`name` -> bits; group 32 throughout):
    /// the most common bit width is the default, others are per-module
    /// overrides, as mlx-lm writes mixed quantization.
    pub fn config(&self, quantized: &BTreeMap<String, u32>) -> Map<String, Json> {
        let mut config = self.plan.config.clone();
        let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
        for bits in quantized.values() {
            *counts.entry(*bits).or_default() += 1;
        }
        if let Some((&default, _)) = counts.iter().max_by_key(|&(bits, n)| (*n, *bits)) {
            let group = blocks::GROUP;
            let mut q = Map::new();
            q.insert("group_size".into(), json!(group));
            q.insert("bits".into(), json!(default));
            q.insert("mode".into(), json!("affine"));
            for (module, &bits) in quantized {
                if bits != default {
                    q.insert(
                        module.clone(),
                        json!({"group_size": group, "bits": bits, "mode": "affine"}),
                    );
                }
            }
            config.insert("quantization".into(), Json::Object(q.clone()));
            config.insert("quantization_config".into(), Json::Object(q));
        }
        config
    }
}

/// Undoes llama.cpp's per-head row permutation. It stored row
/// `(h * half + i) * 2 + j` of the file from HF row `(h * 2 + j) * half + i`
/// (`reshape(heads, 2, half).swapaxes(1, 2)`); this puts each back.
fn unpermute(data: &mut Data, rows: usize, heads: usize) {
    fn apply<T: Copy>(v: &mut Vec<T>, rows: usize, heads: usize) {
        let width = v.len() / rows;
        let half = rows / heads / 2;
        let mut out = Vec::with_capacity(v.len());
        for h in 0..heads {
            for j in 0..2 {
                for i in 0..half {
                    let stored = (h * half + i) * 2 + j;
                    out.extend_from_slice(&v[stored * width..(stored + 1) * width]);
                }
            }
        }
        *v = out;
    }
    match data {
        Data::F32(v) => apply(v, rows, heads),
        Data::F16(v) | Data::Bf16(v) => apply(v, rows, heads),
        Data::Affine {
            weight,
            scales,
            biases,
            ..
        } => {
            apply(weight, rows, heads);
            apply(scales, rows, heads);
            apply(biases, rows, heads);
        }
    }
}

fn subtract_one(data: &mut Data) -> std::result::Result<(), String> {
    use half::{bf16, f16};
    match data {
        Data::F32(v) => v.iter_mut().for_each(|x| *x -= 1.0),
        Data::F16(v) => v
            .iter_mut()
            .for_each(|x| *x = f16::from_f32(f16::from_bits(*x).to_f32() - 1.0).to_bits()),
        Data::Bf16(v) => v
            .iter_mut()
            .for_each(|x| *x = bf16::from_f32(bf16::from_bits(*x).to_f32() - 1.0).to_bits()),
        Data::Affine { .. } => return Err("a quantized norm weight cannot be offset".into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpps_permute() {
        // llama.cpp: w.reshape(heads, 2, half, cols).swapaxes(1, 2).reshape(...)
        // with heads 2, head_dim 6 (half 3): file rows 0,3,1,4,2,5 | 6,9,7,10,8,11.
        let original: Vec<f32> = (0..12).map(|r| r as f32).collect();
        let permuted: Vec<f32> = [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11]
            .iter()
            .map(|&r| r as f32)
            .collect();
        let mut data = Data::F32(permuted);
        unpermute(&mut data, 12, 2);
        let Data::F32(v) = data else { panic!() };
        assert_eq!(v, original);
        // Rows of several words move whole.
        let mut data = Data::F16((0..24).collect());
        unpermute(&mut data, 12, 2);
        let Data::F16(v) = data else { panic!() };
        assert_eq!(&v[..4], &[0, 1, 4, 5]);
    }
}
