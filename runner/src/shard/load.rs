//! Each rank's slice of the weights, read from the safetensors files by
//! offset: a rank never reads (or allocates) the whole of a tensor it
//! shards. The slicing is mlx-lm's `shard()` for the Llama family
//! (`shard_linear` of mlx.nn): q, k, v, gate and up are split by output rows
//! ("all-to-sharded"), o and down by input columns ("sharded-to-all", their
//! outputs summed over the group); embeddings, norms and the head are whole
//! on every rank. Qwen3.5's gated delta-nets split by heads as mlx-lm's
//! `qwen3_5.shard()` does: the fused q/k/v projection and the convolution's
//! channels piece by piece (q, k and v each 1/N), z, b, a, the decay and
//! its bias by value heads, and the output projection by columns.
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
    /// By output rows, each of the pieces between these bounds split apart
    /// (Qwen3.5's `in_proj_qkv`: this rank's q, its k and its v).
    RowPieces([u64; 2]),
    /// Along the first axis, pieces as [`Split::RowPieces`] (Qwen3.5's
    /// depthwise convolution, one channel per q, k and v feature).
    ChannelPieces([u64; 2]),
    /// Along the first axis (a latent attention's per-head matrices
    /// `embed_q` and `unembed_out`, `[heads, out, in]`: this rank's heads).
    Leading,
    /// A key or value projection of this many KV heads, by output rows;
    /// with more ranks than heads each rank takes its heads' rows whole
    /// (mlx-lm's `repeat_kv_layer_inplace` of Qwen3.5, then the split).
    KvRows(u64),
    /// By output rows, each half apart (HF's stacked `experts.gate_up_proj`:
    /// gate rows, then up rows).
    RowHalves,
}

/// What the names alone do not say about a model's splits, from its config.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Layout {
    /// Qwen3.5's key width (`linear_num_key_heads x linear_key_head_dim`):
    /// where q ends and k ends in its delta-nets' fused projection and
    /// convolution. `None`: a model without delta-nets.
    pub delta_key_width: Option<u64>,
    /// The KV heads, where a group may outnumber them (Qwen3.5, as mlx-lm
    /// repeats its k and v projections); `None`: a rank count the KV heads
    /// are not a multiple of is refused.
    pub repeat_kv_heads: Option<u64>,
    /// The untied head is split by vocabulary rows (Qwen3.5, as mlx-lm's
    /// `shard()`), its logits gathered.
    pub split_head: bool,
}

/// The projections split by rows, and those split by columns (as modules
/// under `model.layers.N.`; an expert's are under `mlp.experts.E.` in HF's
/// layout or stacked under `mlp.switch_mlp.`).
const COLUMN_PARALLEL: [&str; 2] = ["gate_proj", "up_proj"];
const ATTENTION_COLUMN: [&str; 4] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    // Latent attention's query up-projection (GLM-4.7-Flash).
    "self_attn.q_b_proj",
];
/// Latent attention's per-head matrices, split by heads (the latent
/// projection `kv_a_proj_with_mqa` and its norm are whole).
const LATENT_HEADS: [&str; 2] = ["self_attn.embed_q", "self_attn.unembed_out"];

/// The projections of a delta-net split by (value) heads.
const DELTA_ROWS: [&str; 3] = [
    "linear_attn.in_proj_z",
    "linear_attn.in_proj_b",
    "linear_attn.in_proj_a",
];

/// How the tensor `name` is split (`None`: whole on every rank). The
/// router (`mlp.gate`), the shared expert's gate, norms, embeddings and the
/// head are whole. A multimodal checkpoint's text layers
/// (`model.language_model.layers.`, mlx-lm's `language_model.model.layers.`)
/// split as a text model's.
pub fn split_of(name: &str, layout: &Layout) -> Option<Split> {
    let head = name.strip_prefix("language_model.").unwrap_or(name);
    if layout.split_head && head.starts_with("lm_head.") {
        return Some(Split::Rows);
    }
    let rest = [
        "model.layers.",
        "model.language_model.layers.",
        "language_model.model.layers.",
    ]
    .iter()
    .find_map(|p| name.strip_prefix(p))?;
    let (_, rest) = rest.split_once('.')?;
    let (module, leaf) = rest.rsplit_once('.')?;
    if let Some(split) = delta_split(module, leaf, layout) {
        return Some(split);
    }
    if module == "mlp.experts" && layout.delta_key_width.is_some() {
        // Qwen3.5-MoE in HF's layout: stacked, unsuffixed tensors.
        return match leaf {
            "gate_up_proj" => Some(Split::RowHalves),
            "down_proj" => Some(Split::Cols),
            _ => None,
        };
    }
    // A shared expert splits as a dense MLP (its sigmoid gate stays whole).
    let module = module
        .strip_prefix("mlp.shared_expert.")
        .or_else(|| module.strip_prefix("mlp.shared_experts."))
        .map_or(module.to_owned(), |p| format!("mlp.{p}"));
    let module = module.as_str();
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
    if let (Some(kv), "self_attn.k_proj" | "self_attn.v_proj") = (layout.repeat_kv_heads, module) {
        Some(Split::KvRows(kv))
    } else if LATENT_HEADS.contains(&module) {
        Some(Split::Leading)
    } else if module == "self_attn" && leaf == "sinks" {
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

/// How a Qwen3.5 delta-net's tensor `module.leaf` is split, if it is one.
fn delta_split(module: &str, leaf: &str, layout: &Layout) -> Option<Split> {
    let key = layout.delta_key_width?;
    let bounds = [key, 2 * key];
    match (module, leaf) {
        ("linear_attn.in_proj_qkv", _) => Some(Split::RowPieces(bounds)),
        ("linear_attn.conv1d", "weight") => Some(Split::ChannelPieces(bounds)),
        ("linear_attn", "dt_bias" | "A_log") => Some(Split::Rows),
        ("linear_attn.out_proj", _) => Some(Split::Cols),
        (m, _) if DELTA_ROWS.contains(&m) => Some(Split::Rows),
        _ => None,
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
    let rows = if shape.len() >= 2 { shape.len() - 2 } else { 0 };
    let axis = match split {
        Split::RankZero | Split::ChannelPieces(_) | Split::Leading => 0,
        Split::Rows | Split::RowPieces(_) | Split::RowHalves | Split::KvRows(_) => rows,
        Split::Cols => shape.len().saturating_sub(1),
    };
    if shape.is_empty() || (split == Split::Cols && shape.len() < 2) {
        return Err(bad(format!(
            "a {}-dimensional tensor {shape:?} cannot be split that way",
            shape.len()
        )));
    }
    // The pieces of the split axis that are each shared out: one, or q, k
    // and v, or gate and up.
    let len = shape[axis];
    let bounds: Vec<u64> = match split {
        Split::RowPieces(b) | Split::ChannelPieces(b) => [&[0][..], &b[..], &[len][..]].concat(),
        Split::RowHalves => vec![0, len / 2, len],
        _ => vec![0, len],
    };
    // More ranks than KV heads: each rank reads its head's rows whole (the
    // ranks of one head next to each other), as mlx-lm's repeat then split.
    let repeated = match split {
        Split::KvRows(kv) if size > kv => {
            if kv == 0 || !size.is_multiple_of(kv) || !len.is_multiple_of(kv) {
                return Err(bad(format!(
                    "{size} ranks cannot share {kv} KV heads ({len} rows)"
                )));
            }
            let block = len / kv;
            Some((rank / (size / kv) * block, block))
        }
        _ => None,
    };
    if bounds.windows(2).any(|w| w[1] < w[0])
        || (split == Split::RowHalves && !len.is_multiple_of(2))
    {
        return Err(bad(format!(
            "its axis {axis} has {len} entries, which cannot hold the pieces {bounds:?}"
        )));
    }
    if split != Split::RankZero
        && repeated.is_none()
        && let Some(w) = bounds
            .windows(2)
            .find(|w| !(w[1] - w[0]).is_multiple_of(size))
    {
        let what = if bounds.len() > 2 {
            format!("the piece {}..{} of its axis {axis}", w[0], w[1])
        } else {
            format!("its axis {axis}")
        };
        return Err(bad(format!(
            "{what} has {} entries, which {size} ranks cannot share evenly",
            w[1] - w[0]
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
        // each piece of the middle axis is contiguous per outer index.
        let outer: u64 = shape[..axis].iter().product();
        let inner: u64 = shape[axis + 1..].iter().product::<u64>() * el;
        let blocks: Vec<(u64, u64)> = match repeated {
            Some(block) => vec![block],
            None => bounds
                .windows(2)
                .map(|w| {
                    let part = (w[1] - w[0]) / size;
                    (w[0] + rank * part, part)
                })
                .collect(),
        };
        let kept: u64 = blocks.iter().map(|(_, part)| part).sum();
        out_shape[axis] = kept;
        let row = (kept * inner) as usize;
        let mut buf = vec![0u8; outer as usize * row];
        for (o, chunk) in buf.chunks_exact_mut(row.max(1)).enumerate() {
            let mut done = 0usize;
            for &(start, part) in &blocks {
                let bytes = (part * inner) as usize;
                let at = info.offset + (o as u64 * len + start) * inner;
                read(&mut chunk[done..done + bytes], at)?;
                done += bytes;
            }
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
pub fn load_file(
    path: &Path,
    layout: &Layout,
    rank: i32,
    size: i32,
) -> Result<HashMap<String, Array>> {
    let header = crate::model::safetensors::header(path)?;
    let loaded = Array::load_safetensors(path).map_err(|e| {
        RunnerError::Weights(format!(
            "{}: not a readable safetensors file: {e}",
            path.display()
        ))
    })?;
    let mut out = HashMap::with_capacity(loaded.len());
    for (name, array) in loaded {
        let array = match (split_of(&name, layout), header.get(&name)) {
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
        let s = |n: &str| split_of(n, &Layout::default());
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
        // GLM-4.7-Flash: latent attention by heads, its latent whole; the
        // shared experts as a dense MLP; the router and its bias whole.
        assert_eq!(
            s("model.layers.0.self_attn.q_b_proj.weight"),
            Some(Split::Rows)
        );
        assert_eq!(
            s("model.layers.0.self_attn.embed_q.scales"),
            Some(Split::Leading)
        );
        assert_eq!(
            s("model.layers.0.self_attn.unembed_out.weight"),
            Some(Split::Leading)
        );
        assert_eq!(s("model.layers.0.self_attn.q_a_proj.weight"), None);
        assert_eq!(
            s("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"),
            None
        );
        assert_eq!(s("model.layers.0.self_attn.kv_a_layernorm.weight"), None);
        assert_eq!(
            s("model.layers.1.mlp.shared_experts.up_proj.weight"),
            Some(Split::Rows)
        );
        assert_eq!(
            s("model.layers.1.mlp.shared_experts.down_proj.weight"),
            Some(Split::Cols)
        );
        assert_eq!(s("model.layers.1.mlp.gate.e_score_correction_bias"), None);
    }

    #[test]
    fn qwen3_5_splits_follow_its_shard() {
        let layout = Layout {
            delta_key_width: Some(32),
            repeat_kv_heads: Some(2),
            split_head: false,
        };
        let s = |n: &str| split_of(n, &layout);
        for prefix in [
            "model.language_model.layers.0",
            "language_model.model.layers.0",
        ] {
            let t = |leaf: &str| s(&format!("{prefix}.{leaf}"));
            assert_eq!(
                t("linear_attn.in_proj_qkv.weight"),
                Some(Split::RowPieces([32, 64]))
            );
            assert_eq!(
                t("linear_attn.in_proj_qkv.scales"),
                Some(Split::RowPieces([32, 64]))
            );
            assert_eq!(
                t("linear_attn.conv1d.weight"),
                Some(Split::ChannelPieces([32, 64]))
            );
            assert_eq!(t("linear_attn.in_proj_z.weight"), Some(Split::Rows));
            assert_eq!(t("linear_attn.in_proj_a.weight"), Some(Split::Rows));
            assert_eq!(t("linear_attn.dt_bias"), Some(Split::Rows));
            assert_eq!(t("linear_attn.A_log"), Some(Split::Rows));
            assert_eq!(t("linear_attn.out_proj.weight"), Some(Split::Cols));
            assert_eq!(t("linear_attn.norm.weight"), None);
            assert_eq!(t("self_attn.q_proj.weight"), Some(Split::Rows));
            assert_eq!(t("self_attn.k_proj.weight"), Some(Split::KvRows(2)));
            assert_eq!(t("self_attn.v_proj.scales"), Some(Split::KvRows(2)));
            assert_eq!(t("mlp.shared_expert.gate_proj.weight"), Some(Split::Rows));
            assert_eq!(t("mlp.shared_expert.down_proj.weight"), Some(Split::Cols));
            assert_eq!(t("mlp.shared_expert_gate.weight"), None);
            assert_eq!(t("mlp.experts.gate_up_proj"), Some(Split::RowHalves));
            assert_eq!(t("mlp.experts.down_proj"), Some(Split::Cols));
            assert_eq!(t("input_layernorm.weight"), None);
        }
        assert_eq!(s("language_model.model.embed_tokens.weight"), None);
        assert_eq!(s("language_model.lm_head.weight"), None);
        let split_head = Layout {
            split_head: true,
            ..layout
        };
        assert_eq!(
            split_of("language_model.lm_head.scales", &split_head),
            Some(Split::Rows)
        );
        assert_eq!(split_of("lm_head.weight", &split_head), Some(Split::Rows));
        // Without delta-nets those names are nobody's.
        assert_eq!(
            split_of(
                "model.layers.0.linear_attn.in_proj_qkv.weight",
                &Layout::default()
            ),
            None
        );
    }

    /// A little-endian float32 safetensors file of `tensors`.
    fn write_f32(path: &Path, tensors: &[(&str, Vec<u64>)]) -> HashMap<String, TensorInfo> {
        let mut header = serde_json::Map::new();
        let mut data = Vec::new();
        for (name, shape) in tensors {
            let n: u64 = shape.iter().product();
            let start = data.len();
            for i in 0..n {
                data.extend_from_slice(&(i as f32).to_le_bytes());
            }
            header.insert(
                (*name).to_owned(),
                serde_json::json!({"dtype": "F32", "shape": shape,
                    "data_offsets": [start, data.len()]}),
            );
        }
        let text = serde_json::Value::Object(header).to_string();
        let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(text.as_bytes());
        bytes.extend_from_slice(&data);
        std::fs::write(path, bytes).expect("writing a test file");
        crate::model::safetensors::header(path).expect("reading it back")
    }

    fn values(a: &Array) -> (Vec<i32>, Vec<f32>) {
        (a.shape().to_vec(), a.as_slice::<f32>().to_vec())
    }

    #[test]
    fn pieces_are_each_shared_out() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("m.safetensors");
        // Rows 0..6 of width 2 as [q q | k k | v v]; a convolution of 6
        // channels, kernel 2; stacked gate_up of 2 experts, 4 rows of 1.
        let h = write_f32(
            &path,
            &[
                ("qkv", vec![6, 2]),
                ("conv", vec![6, 2, 1]),
                ("gu", vec![2, 4, 1]),
            ],
        );
        let read = |name: &str, split, rank| {
            read_slice(&path, name, &h[name], split, rank, 2).expect("a slice")
        };
        let qkv = read("qkv", Split::RowPieces([2, 4]), 1);
        assert_eq!(values(&qkv), (vec![3, 2], vec![2., 3., 6., 7., 10., 11.]));
        let conv = read("conv", Split::ChannelPieces([2, 4]), 0);
        assert_eq!(values(&conv), (vec![3, 2, 1], vec![0., 1., 4., 5., 8., 9.]));
        let gu = read("gu", Split::RowHalves, 1);
        assert_eq!(values(&gu), (vec![2, 2, 1], vec![1., 3., 5., 7.]));
        // 2 KV heads of 3 rows (as "qkv" is laid out) over 4 ranks: ranks
        // 0 and 1 read head 0, ranks 2 and 3 head 1; over 2, one each.
        let kv = |rank, size| {
            read_slice(&path, "qkv", &h["qkv"], Split::KvRows(2), rank, size).expect("a slice")
        };
        let head0 = (vec![3, 2], vec![0., 1., 2., 3., 4., 5.]);
        let head1 = (vec![3, 2], vec![6., 7., 8., 9., 10., 11.]);
        assert_eq!(values(&kv(1, 4)), head0);
        assert_eq!(values(&kv(2, 4)), head1);
        assert_eq!(values(&kv(1, 2)), head1);
        let err = read_slice(&path, "qkv", &h["qkv"], Split::KvRows(2), 0, 3)
            .expect_err("3 ranks, 2 heads");
        assert!(
            err.to_string().contains("3 ranks cannot share 2 KV heads"),
            "{err}"
        );
        // A piece the group cannot share is named.
        let err = read_slice(&path, "qkv", &h["qkv"], Split::RowPieces([1, 4]), 0, 2)
            .expect_err("pieces of 1, 3 and 2 rows");
        assert!(err.to_string().contains("the piece 0..1"), "{err}");
    }
}
