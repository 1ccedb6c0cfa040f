//! Each rank's slice of the weights, read from the safetensors files by
//! offset: a rank never reads (or allocates) the whole of a tensor it
//! shards. The slicing is mlx-lm's `shard()` for the Llama family
//! (`shard_linear` of mlx.nn): q, k, v, gate and up are split by output rows
//! ("all-to-sharded"), o and down by input columns ("sharded-to-all", their
//! outputs summed over the group); embeddings, norms and the head are whole
//! on every rank.
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use mlx_rs::Array;

use crate::error::{Result, RunnerError};
use crate::model::safetensors::TensorInfo;

/// How one tensor is split over the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// By output rows (the last axis but one): this rank's block of rows,
    /// of every expert when the experts are stacked.
    Rows,
    /// By input columns (the last axis): a block of every row.
    Cols,
    /// The bias of a row-parallel layer: added once, after the sum (whole on
    /// rank 0, zeros on the others).
    RankZero,
}

/// The projections split by rows, and those split by columns (as modules
/// under `model.layers.N.`; an expert's are under `mlp.experts.E.` in HF's
/// layout or stacked under `mlp.switch_mlp.`).
const COLUMN_PARALLEL: [&str; 2] = ["gate_proj", "up_proj"];
const ATTENTION_COLUMN: [&str; 3] = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"];

/// How the tensor `name` is split (`None`: whole on every rank). The
/// router (`mlp.gate`), norms, embeddings and the head are whole.
pub fn split_of(name: &str) -> Option<Split> {
    let rest = name.strip_prefix("model.layers.")?;
    let (_, rest) = rest.split_once('.')?;
    let (module, leaf) = rest.rsplit_once('.')?;
    // The MLP's projection, and whether its experts are stacked in one
    // tensor (mlx-lm's `switch_mlp`, gpt-oss's `experts`) rather than one
    // tensor per expert (HF's `experts.E`).
    let (mlp_part, stacked) = if let Some(p) = module.strip_prefix("mlp.switch_mlp.") {
        (Some(p), true)
    } else if let Some(e) = module.strip_prefix("mlp.experts.") {
        match e.split_once('.') {
            Some((index, part)) if index.parse::<u32>().is_ok() => (Some(part), false),
            _ => (Some(e), true),
        }
    } else {
        (module.strip_prefix("mlp."), false)
    };
    let column = ATTENTION_COLUMN.contains(&module)
        || mlp_part.is_some_and(|p| COLUMN_PARALLEL.contains(&p));
    let row = module == "self_attn.o_proj" || mlp_part == Some("down_proj");
    if module == "self_attn" && leaf == "sinks" {
        // gpt-oss's sink logit per head: this rank's heads.
        Some(Split::Rows)
    } else if column && stacked && leaf == "bias" {
        // Stacked experts' biases, [experts, out]: split by out.
        Some(Split::Cols)
    } else if column {
        Some(Split::Rows)
    } else if row {
        Some(if leaf == "bias" {
            Split::RankZero
        } else {
            Split::Cols
        })
    } else {
        None
    }
}

/// MLX's dtype for a safetensors dtype name.
fn mlx_dtype(name: &str) -> Option<mlx_sys::mlx_dtype> {
    Some(match name {
        "BOOL" => mlx_sys::mlx_dtype__MLX_BOOL,
        "U8" => mlx_sys::mlx_dtype__MLX_UINT8,
        "I8" => mlx_sys::mlx_dtype__MLX_INT8,
        "U16" => mlx_sys::mlx_dtype__MLX_UINT16,
        "I16" => mlx_sys::mlx_dtype__MLX_INT16,
        "F16" => mlx_sys::mlx_dtype__MLX_FLOAT16,
        "BF16" => mlx_sys::mlx_dtype__MLX_BFLOAT16,
        "U32" => mlx_sys::mlx_dtype__MLX_UINT32,
        "I32" => mlx_sys::mlx_dtype__MLX_INT32,
        "F32" => mlx_sys::mlx_dtype__MLX_FLOAT32,
        "U64" => mlx_sys::mlx_dtype__MLX_UINT64,
        "I64" => mlx_sys::mlx_dtype__MLX_INT64,
        "F64" => mlx_sys::mlx_dtype__MLX_FLOAT64,
        _ => return None,
    })
}

/// Reads rank `rank` of `size`'s slice of the tensor `name` (whose checked
/// header entry is `info`) from `path`.
pub fn read_slice(
    path: &Path,
    name: &str,
    info: &TensorInfo,
    split: Split,
    rank: i32,
    size: i32,
) -> Result<Array> {
    let bad = |message: String| RunnerError::Shard {
        phase: "slicing the weights",
        message: format!("{name} in {}: {message}", path.display()),
    };
    let dtype = mlx_dtype(&info.dtype).ok_or_else(|| bad(format!("dtype {}", info.dtype)))?;
    let (rank, size) = (rank as u64, size.max(1) as u64);
    let shape = &info.shape;
    // A bias is one row: whole or nothing. A matrix (or stacked matrices)
    // splits its rows or its columns.
    let axis = match split {
        Split::RankZero => 0,
        Split::Rows if shape.len() >= 2 => shape.len() - 2,
        Split::Rows => 0,
        Split::Cols => shape.len().saturating_sub(1),
    };
    if shape.is_empty() || (split == Split::Cols && shape.len() < 2) {
        return Err(bad(format!(
            "a {}-dimensional tensor {shape:?} cannot be split that way",
            shape.len()
        )));
    }
    if split != Split::RankZero && !shape[axis].is_multiple_of(size) {
        return Err(bad(format!(
            "its axis {axis} has {} entries, which {size} ranks cannot share evenly",
            shape[axis]
        )));
    }
    let file = File::open(path).map_err(|source| RunnerError::Read {
        path: path.to_owned(),
        source,
    })?;
    let read = |buf: &mut [u8], at: u64| {
        file.read_exact_at(buf, at)
            .map_err(|source| RunnerError::Read {
                path: path.to_owned(),
                source,
            })
    };
    let el = info.element;
    let mut out_shape: Vec<u64> = shape.clone();
    let bytes = if split == Split::RankZero {
        let total: u64 = shape.iter().product::<u64>() * el;
        let mut buf = vec![0u8; total as usize];
        if rank == 0 {
            read(&mut buf, info.offset)?;
        }
        buf
    } else {
        // The tensor as [outer, shape[axis], inner]: this rank's block of
        // the middle axis is one contiguous piece per outer index.
        let outer: u64 = shape[..axis].iter().product();
        let inner: u64 = shape[axis + 1..].iter().product::<u64>() * el;
        let part = shape[axis] / size;
        out_shape[axis] = part;
        let piece = (part * inner) as usize;
        let mut buf = vec![0u8; outer as usize * piece];
        for (o, chunk) in buf.chunks_exact_mut(piece.max(1)).enumerate() {
            let at = info.offset + (o as u64 * shape[axis] + rank * part) * inner;
            read(chunk, at)?;
        }
        buf
    };
    let dims: Vec<i32> = out_shape.iter().map(|&d| d as i32).collect();
    // SAFETY: `bytes` holds exactly the elements of `dims` in `dtype` (the
    // header was checked: element size and shape); MLX copies them.
    let array = unsafe {
        Array::from_ptr(mlx_sys::mlx_array_new_data(
            bytes.as_ptr().cast(),
            dims.as_ptr(),
            dims.len() as i32,
            dtype,
        ))
    };
    Ok(array)
}

/// This rank's tensors of one safetensors file: the ones it shares, sliced
/// by offset; the others as MLX's loader gives them (read when evaluated).
pub fn load_file(path: &Path, rank: i32, size: i32) -> Result<HashMap<String, Array>> {
    let header = crate::model::safetensors::header(path)?;
    let loaded = Array::load_safetensors(path).map_err(|e| {
        RunnerError::Weights(format!(
            "{}: not a readable safetensors file: {e}",
            path.display()
        ))
    })?;
    let mut out = HashMap::with_capacity(loaded.len());
    for (name, array) in loaded {
        let array = match (split_of(&name), header.get(&name)) {
            (Some(split), Some(info)) => {
                // MLX's lazy array is dropped unread.
                drop(array);
                read_slice(path, &name, info, split, rank, size)?
            }
            _ => array,
        };
        out.insert(name, array);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_follow_mlx_lm_shard() {
        let s = |n: &str| split_of(n);
        assert_eq!(
            s("model.layers.3.self_attn.q_proj.weight"),
            Some(Split::Rows)
        );
        assert_eq!(s("model.layers.3.self_attn.k_proj.bias"), Some(Split::Rows));
        assert_eq!(s("model.layers.0.mlp.up_proj.scales"), Some(Split::Rows));
        assert_eq!(s("model.layers.0.mlp.down_proj.biases"), Some(Split::Cols));
        assert_eq!(
            s("model.layers.9.self_attn.o_proj.weight"),
            Some(Split::Cols)
        );
        assert_eq!(
            s("model.layers.9.self_attn.o_proj.bias"),
            Some(Split::RankZero)
        );
        assert_eq!(s("model.layers.9.input_layernorm.weight"), None);
        assert_eq!(s("model.layers.9.self_attn.q_norm.weight"), None);
        assert_eq!(s("model.embed_tokens.weight"), None);
        assert_eq!(s("lm_head.weight"), None);
        // Experts: stacked (mlx-lm) or one by one (HF); the router is whole.
        assert_eq!(
            s("model.layers.0.mlp.switch_mlp.gate_proj.weight"),
            Some(Split::Rows)
        );
        assert_eq!(
            s("model.layers.0.mlp.switch_mlp.down_proj.scales"),
            Some(Split::Cols)
        );
        assert_eq!(
            s("model.layers.0.mlp.experts.7.up_proj.weight"),
            Some(Split::Rows)
        );
        assert_eq!(
            s("model.layers.0.mlp.experts.7.down_proj.weight"),
            Some(Split::Cols)
        );
        assert_eq!(s("model.layers.0.mlp.gate.weight"), None);
        assert_eq!(s("model.layers.0.mlp.experts.x.down_proj.weight"), None);
        // gpt-oss: stacked experts with biases, sinks per head.
        assert_eq!(
            s("model.layers.0.mlp.experts.gate_proj.weight"),
            Some(Split::Rows)
        );
        assert_eq!(
            s("model.layers.0.mlp.experts.gate_proj.bias"),
            Some(Split::Cols)
        );
        assert_eq!(
            s("model.layers.0.mlp.experts.down_proj.weight"),
            Some(Split::Cols)
        );
        assert_eq!(
            s("model.layers.0.mlp.experts.down_proj.bias"),
            Some(Split::RankZero)
        );
        assert_eq!(s("model.layers.0.mlp.router.bias"), None);
        assert_eq!(s("model.layers.0.self_attn.sinks"), Some(Split::Rows));
    }
}
