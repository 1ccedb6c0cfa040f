//! What a GGUF file is in Hugging Face / MLX terms: a `config.json` built
//! from llama.cpp's metadata keys, and for each tensor its HF name and the
//! llama.cpp conversion to undo.
//!
//! llama.cpp's converter (convert_hf_to_gguf.py) changes three things this
//! undoes, as transformers' GGUF loader does:
//! - llama-family `attn_q`/`attn_k` rows are permuted for its interleaved
//!   rope ([`Transform::UnpermuteRows`]);
//! - Gemma's RMS norms, which compute `x * (1 + w)`, are stored as `w + 1`
//!   ([`Transform::SubtractOne`]);
//! - a tied output head is not stored (`output.weight` absent), and Llama 3's
//!   rope scaling becomes a `rope_freqs` tensor (matched back to its
//!   parameters here).
use serde_json::{Map, Value as Json, json};

use crate::error::{GgufError, Result};
use crate::reader::GgufFile;
use crate::types::GgmlType;
use crate::value::TypeMismatch;

/// The GGUF architectures Grove converts, and what they become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
}

impl Family {
    /// `general.architecture` values Grove supports.
    pub const SUPPORTED: &'static str = "llama, qwen2, qwen3, gemma3";

    fn from_arch(arch: &str) -> Option<Self> {
        Some(match arch {
            "llama" => Self::Llama,
            "qwen2" => Self::Qwen2,
            "qwen3" => Self::Qwen3,
            "gemma3" => Self::Gemma3,
            _ => return None,
        })
    }

    /// The `general.architecture` value.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Gemma3 => "gemma3",
        }
    }

    /// The HF class and `model_type`.
    fn hf_names(self) -> (&'static str, &'static str) {
        match self {
            Self::Llama => ("LlamaForCausalLM", "llama"),
            Self::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
            Self::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
            Self::Gemma3 => ("Gemma3ForCausalLM", "gemma3_text"),
        }
    }
}

/// A change llama.cpp made to a tensor, to undo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transform {
    None,
    /// Rows were permuted per head for interleaved rope: undo with rows
    /// reshaped to `(heads, 2, head_dim / 2)` -> `(heads, head_dim / 2, 2)`.
    UnpermuteRows {
        heads: usize,
    },
    /// Stored as `w + 1`.
    SubtractOne,
}

/// One tensor: where it comes from and what it becomes.
#[derive(Debug, Clone)]
pub struct TensorPlan {
    /// Index into [`GgufFile::tensors`].
    pub index: usize,
    /// The HF name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    pub transform: Transform,
}

/// What a GGUF file is, in HF terms.
#[derive(Debug, Clone)]
pub struct Plan {
    pub family: Family,
    /// `config.json` without its `quantization` block (that depends on how
    /// each tensor converts).
    pub config: Map<String, Json>,
    pub tensors: Vec<TensorPlan>,
}

fn unsupported(file: &GgufFile, message: String) -> GgufError {
    GgufError::Unsupported {
        path: file.path().to_owned(),
        message,
    }
}

fn meta_error(file: &GgufFile, e: TypeMismatch) -> GgufError {
    GgufError::Metadata {
        path: file.path().to_owned(),
        key: Some(e.key.clone()),
        message: e.to_string(),
    }
}

/// Typed access to `{arch}.*` keys with errors that name the file.
struct Keys<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl Keys<'_> {
    fn uint(&self, key: &str) -> Result<Option<u64>> {
        let full = format!("{}.{key}", self.arch);
        self.file
            .metadata
            .uint(&full)
            .map_err(|e| meta_error(self.file, e))
    }

    fn need(&self, key: &str) -> Result<u64> {
        self.uint(key)?
            .filter(|&v| v > 0)
            .ok_or_else(|| GgufError::Metadata {
                path: self.file.path().to_owned(),
                key: Some(format!("{}.{key}", self.arch)),
                message: "missing or zero, but the architecture needs it".into(),
            })
    }

    fn float(&self, key: &str) -> Result<Option<f64>> {
        let full = format!("{}.{key}", self.arch);
        self.file
            .metadata
            .float(&full)
            .map_err(|e| meta_error(self.file, e))
    }

    fn string(&self, key: &str) -> Result<Option<&str>> {
        let full = format!("{}.{key}", self.arch);
        self.file
            .metadata
            .str(&full)
            .map_err(|e| meta_error(self.file, e))
    }
}

impl Plan {
    /// Works out the config and the tensor mapping of `file`.
    pub fn new(file: &GgufFile) -> Result<Self> {
        let arch = file
            .metadata
            .str("general.architecture")
            .map_err(|e| meta_error(file, e))?
            .ok_or_else(|| GgufError::Metadata {
                path: file.path().to_owned(),
                key: Some("general.architecture".into()),
                message: "missing".into(),
            })?;
        let family = Family::from_arch(arch).ok_or_else(|| {
            unsupported(
                file,
                format!(
                    "GGUF architecture {arch:?} is not supported (supported: {})",
                    Family::SUPPORTED
                ),
            )
        })?;
        let keys = Keys { file, arch };
        let config = config(file, family, &keys)?;
        let heads = config["num_attention_heads"].as_u64().unwrap_or(1) as usize;
        let kv_heads = config["num_key_value_heads"].as_u64().unwrap_or(1) as usize;
        let layers = config["num_hidden_layers"].as_u64().unwrap_or(0) as usize;
        let mut tensors = Vec::with_capacity(file.tensors.len());
        for (index, t) in file.tensors.iter().enumerate() {
            if t.name == "rope_freqs.weight" {
                continue; // Read into the config's rope_scaling.
            }
            let (name, transform) =
                hf_name(family, &t.name, heads, kv_heads, layers).ok_or_else(|| {
                    unsupported(
                        file,
                        format!(
                            "tensor {:?} has no place in a {arch} model (Grove maps: \
                             token_embd, output_norm, output, blk.N.attn_*/ffn_*)",
                            t.name
                        ),
                    )
                })?;
            tensors.push(TensorPlan {
                index,
                name,
                transform,
            });
        }
        Ok(Self {
            family,
            config,
            tensors,
        })
    }
}

/// The HF name of a llama.cpp tensor, and what to undo.
fn hf_name(
    family: Family,
    gguf: &str,
    heads: usize,
    kv_heads: usize,
    layers: usize,
) -> Option<(String, Transform)> {
    let gemma = family == Family::Gemma3;
    let norm = if gemma {
        Transform::SubtractOne
    } else {
        Transform::None
    };
    match gguf {
        "token_embd.weight" => return Some(("model.embed_tokens.weight".into(), Transform::None)),
        "output_norm.weight" => return Some(("model.norm.weight".into(), norm)),
        "output.weight" => return Some(("lm_head.weight".into(), Transform::None)),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, leaf) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if layer >= layers || layer.to_string() != rest[..rest.find('.')?] {
        return None;
    }
    let (module, suffix) = leaf.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let permute = |heads| {
        if family == Family::Llama {
            Transform::UnpermuteRows { heads }
        } else {
            Transform::None
        }
    };
    let (hf, transform) = match (module, gemma) {
        ("attn_q", _) => ("self_attn.q_proj", permute(heads)),
        ("attn_k", _) => ("self_attn.k_proj", permute(kv_heads)),
        ("attn_v", _) => ("self_attn.v_proj", Transform::None),
        ("attn_output", _) => ("self_attn.o_proj", Transform::None),
        ("ffn_gate", _) => ("mlp.gate_proj", Transform::None),
        ("ffn_up", _) => ("mlp.up_proj", Transform::None),
        ("ffn_down", _) => ("mlp.down_proj", Transform::None),
        ("attn_norm", _) => ("input_layernorm", norm),
        ("attn_q_norm", _) if family != Family::Llama => ("self_attn.q_norm", norm),
        ("attn_k_norm", _) if family != Family::Llama => ("self_attn.k_norm", norm),
        ("ffn_norm", false) => ("post_attention_layernorm", norm),
        ("ffn_norm", true) => ("pre_feedforward_layernorm", norm),
        ("post_attention_norm", true) => ("post_attention_layernorm", norm),
        ("post_ffw_norm", true) => ("post_feedforward_layernorm", norm),
        _ => return None,
    };
    if suffix == "bias" && transform == Transform::SubtractOne {
        return None;
    }
    Some((format!("model.layers.{layer}.{hf}.{suffix}"), transform))
}

/// The `config.json` of `family`, from the metadata.
fn config(file: &GgufFile, family: Family, keys: &Keys) -> Result<Map<String, Json>> {
    let layers = keys.need("block_count")?;
    let hidden = keys.need("embedding_length")?;
    let heads = keys.need("attention.head_count")?;
    let kv_heads = keys.uint("attention.head_count_kv")?.unwrap_or(heads);
    let ffn = keys.need("feed_forward_length")?;
    let head_dim = keys.uint("attention.key_length")?.unwrap_or(hidden / heads);
    if let Some(v) = keys.uint("attention.value_length")?
        && v != head_dim
    {
        return Err(unsupported(
            file,
            format!("attention.value_length {v} differs from key_length {head_dim}"),
        ));
    }
    if let Some(rot) = keys.uint("rope.dimension_count")?
        && rot != head_dim
    {
        return Err(unsupported(
            file,
            format!(
                "rope over {rot} of {head_dim} head dimensions (partial rotary) is not supported"
            ),
        ));
    }
    let eps = keys
        .float("attention.layer_norm_rms_epsilon")?
        .ok_or_else(|| GgufError::Metadata {
            path: file.path().to_owned(),
            key: Some(format!("{}.attention.layer_norm_rms_epsilon", keys.arch)),
            message: "missing (only RMS-norm models are supported)".into(),
        })?;
    let theta = keys.float("rope.freq_base")?.unwrap_or(match family {
        Family::Gemma3 => 1_000_000.0,
        _ => 10_000.0,
    });
    let vocab = vocab_size(file, keys)?;
    let embd = file
        .tensor("token_embd.weight")
        .ok_or_else(|| unsupported(file, "the file has no token_embd.weight".into()))?;
    if embd.dims != [hidden, vocab] {
        return Err(unsupported(
            file,
            format!(
                "token_embd.weight has shape {:?}, but the metadata says {vocab} tokens of {hidden}",
                embd.shape()
            ),
        ));
    }
    let (class, model_type) = family.hf_names();
    let mut c = Map::new();
    c.insert("architectures".into(), json!([class]));
    c.insert("model_type".into(), json!(model_type));
    c.insert("hidden_size".into(), json!(hidden));
    c.insert("intermediate_size".into(), json!(ffn));
    c.insert("num_hidden_layers".into(), json!(layers));
    c.insert("num_attention_heads".into(), json!(heads));
    c.insert("num_key_value_heads".into(), json!(kv_heads));
    c.insert("head_dim".into(), json!(head_dim));
    c.insert("rms_norm_eps".into(), json!(eps as f32));
    c.insert("rope_theta".into(), json!(theta));
    c.insert("vocab_size".into(), json!(vocab));
    if let Some(ctx) = keys.uint("context_length")? {
        c.insert("max_position_embeddings".into(), json!(ctx));
    }
    let tied = file.tensor("output.weight").is_none();
    c.insert("tie_word_embeddings".into(), json!(tied));
    for (key, name) in [
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
        ("pad_token_id", "tokenizer.ggml.padding_token_id"),
    ] {
        if let Some(id) = file.metadata.uint(name).map_err(|e| meta_error(file, e))? {
            c.insert(key.into(), json!(id));
        }
    }
    if let Some(scaling) = rope_scaling(file, keys, head_dim, theta)? {
        c.insert("rope_scaling".into(), scaling);
    }
    match family {
        Family::Llama => {
            let bias = file.tensor("blk.0.attn_q.bias").is_some();
            c.insert("attention_bias".into(), json!(bias));
            c.insert("mlp_bias".into(), json!(false));
            if file.tensor("blk.0.ffn_gate.bias").is_some() {
                return Err(unsupported(file, "MLP biases are not supported".into()));
            }
        }
        Family::Qwen2 | Family::Qwen3 => {}
        Family::Gemma3 => {
            let window = keys.need("attention.sliding_window")?;
            c.insert("sliding_window".into(), json!(window));
            // llama.cpp's values for Gemma 3 (llama-model.cpp), which the
            // file does not carry: every 6th layer global, local rope base
            // 10000, attention scaled by the head size except 27B's.
            c.insert("sliding_window_pattern".into(), json!(6));
            c.insert("rope_local_base_freq".into(), json!(10_000.0));
            let scalar = if layers == 62 {
                hidden / heads
            } else {
                head_dim
            };
            c.insert("query_pre_attn_scalar".into(), json!(scalar));
            c.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
        }
    }
    Ok(c)
}

/// The vocabulary size: `{arch}.vocab_size`, else the token list's length.
fn vocab_size(file: &GgufFile, keys: &Keys) -> Result<u64> {
    let tokens = file
        .metadata
        .strings("tokenizer.ggml.tokens")
        .map_err(|e| meta_error(file, e))?
        .map(|t| t.len() as u64);
    match (keys.uint("vocab_size")?, tokens) {
        (Some(v), Some(t)) if v != t => Err(unsupported(
            file,
            format!(
                "{}.vocab_size is {v} but the tokenizer has {t} tokens",
                keys.arch
            ),
        )),
        (Some(v), _) | (None, Some(v)) if v > 0 => Ok(v),
        _ => Err(unsupported(
            file,
            "the file has no tokenizer.ggml.tokens (no vocabulary)".into(),
        )),
    }
}

/// `rope_scaling` from `{arch}.rope.scaling.*` or a `rope_freqs` tensor.
fn rope_scaling(file: &GgufFile, keys: &Keys, head_dim: u64, theta: f64) -> Result<Option<Json>> {
    let kind = keys.string("rope.scaling.type")?;
    let factor = keys.float("rope.scaling.factor")?;
    let scaling = match (kind, factor) {
        (None | Some("none"), None) | (Some("none"), _) => None,
        (None | Some("linear"), Some(1.0)) => None,
        (None | Some("linear"), Some(f)) => Some(json!({"rope_type": "linear", "factor": f})),
        (Some(other), _) => {
            return Err(unsupported(
                file,
                format!("rope scaling {other:?} is not supported (none, linear, Llama 3's)"),
            ));
        }
    };
    let Some(freqs) = file.tensor("rope_freqs.weight") else {
        return Ok(scaling);
    };
    if scaling.is_some() {
        return Err(unsupported(
            file,
            "both rope.scaling and rope_freqs are set".into(),
        ));
    }
    if freqs.kind != GgmlType::F32 || freqs.dims != [head_dim / 2] {
        return Err(unsupported(
            file,
            format!(
                "rope_freqs.weight is {} {:?}, expected F32 [{}]",
                freqs.kind,
                freqs.dims,
                head_dim / 2
            ),
        ));
    }
    let bytes = file.read(freqs)?;
    let factors: Vec<f32> = bytemuck::pod_collect_to_vec(bytes.as_bytes());
    llama3_scaling(&factors, head_dim, theta)
        .map(Some)
        .ok_or_else(|| {
            unsupported(
                file,
                "rope_freqs.weight does not match Llama 3's rope scaling with any known \
                 parameters"
                    .into(),
            )
        })
}

/// The Llama 3 rope parameters whose per-dimension factors (as llama.cpp's
/// converter computes them) equal `factors`.
fn llama3_scaling(factors: &[f32], head_dim: u64, theta: f64) -> Option<Json> {
    let factor = factors.iter().copied().fold(f32::MIN, f32::max) as f64;
    let candidates = [(1.0, 4.0, 8192.0), (1.0, 4.0, 4096.0), (1.0, 4.0, 16384.0)];
    for (low, high, original) in candidates {
        let low_wavelen = original / low;
        let high_wavelen = original / high;
        let matches = factors.iter().enumerate().all(|(i, &got)| {
            let freq = 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let want = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            ((got as f64) - want).abs() <= 1e-4 * want.abs().max(1.0)
        });
        if matches {
            return Some(json!({
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": original,
            }));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_and_transforms() {
        let f = |fam, n| hf_name(fam, n, 9, 3, 30);
        assert_eq!(
            f(Family::Llama, "blk.3.attn_q.weight"),
            Some((
                "model.layers.3.self_attn.q_proj.weight".into(),
                Transform::UnpermuteRows { heads: 9 }
            ))
        );
        assert_eq!(
            f(Family::Llama, "blk.3.attn_k.weight").unwrap().1,
            Transform::UnpermuteRows { heads: 3 }
        );
        assert_eq!(
            f(Family::Qwen2, "blk.0.attn_k.bias").unwrap(),
            (
                "model.layers.0.self_attn.k_proj.bias".into(),
                Transform::None
            )
        );
        assert_eq!(
            f(Family::Gemma3, "blk.1.ffn_norm.weight").unwrap(),
            (
                "model.layers.1.pre_feedforward_layernorm.weight".into(),
                Transform::SubtractOne
            )
        );
        assert!(f(Family::Llama, "blk.30.attn_q.weight").is_none());
        assert!(f(Family::Llama, "blk.01.attn_q.weight").is_none());
        assert!(f(Family::Llama, "blk.0.attn_q_norm.weight").is_none());
        assert!(f(Family::Llama, "blk.0.post_ffw_norm.weight").is_none());
        assert!(f(Family::Llama, "something").is_none());
    }

    #[test]
    fn llama3_rope_factors_are_recognised() {
        // llama.cpp's factors for Llama 3.1 (factor 8, 1, 4, 8192), head 128.
        let (dim, theta) = (128u64, 500_000.0f64);
        let factors: Vec<f32> = (0..dim / 2)
            .map(|i| {
                let freq = 1.0 / theta.powf(2.0 * i as f64 / dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                let f = if wavelen < 8192.0 / 4.0 {
                    1.0
                } else if wavelen > 8192.0 {
                    8.0
                } else {
                    let s = (8192.0 / wavelen - 1.0) / 3.0;
                    1.0 / ((1.0 - s) / 8.0 + s)
                };
                f as f32
            })
            .collect();
        let got = llama3_scaling(&factors, dim, theta).unwrap();
        assert_eq!(got["factor"], json!(8.0));
        assert_eq!(got["original_max_position_embeddings"], json!(8192.0));
        let mut off = factors.clone();
        off[40] *= 1.5;
        assert!(llama3_scaling(&off, dim, theta).is_none());
    }
}
