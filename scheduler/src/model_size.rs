//! What loading a model costs, read without loading it: weight bytes from the
//! safetensors headers (or a GGUF file's tensor infos), the minimum KV cache
//! from config.json (or the GGUF metadata).
use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde_json::Value;

/// Tokens of KV cache every loaded model must at least have room for.
pub const MIN_KV_TOKENS: u64 = 2048;
/// Activations and MLX's buffers besides weights and KV.
pub const HEADROOM: u64 = 256 << 20;

/// The memory a model needs to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSize {
    pub weight_bytes: u64,
    /// KV bytes per token, all layers.
    pub kv_bytes_per_token: u64,
    /// Weights + the minimum KV + headroom.
    pub min_bytes: u64,
}

/// Reads the sizes of the model at `path`: a directory or a GGUF file.
pub fn model_size(path: &Path) -> Result<ModelSize, String> {
    if path.is_file() {
        return gguf_size(path);
    }
    dir_size(path)
}

/// What the runner holds for a GGUF file once converted, conservatively (as
/// on the CPU backend): quantized matrices at their MLX bit width plus
/// float32 scales and biases per group of 32, half-precision floats promoted
/// to float32, and a float32 KV cache.
fn gguf_size(path: &Path) -> Result<ModelSize, String> {
    let model = grove_gguf::GgufModel::open(path).map_err(|e| e.to_string())?;
    let mut weight_bytes = 0u64;
    for t in &model.plan.tensors {
        let info = &model.file.tensors[t.index];
        let n = info.elements();
        weight_bytes += match grove_gguf::blocks::requant_bits(info.kind) {
            Some(bits) if info.dims.len() == 2 => n * u64::from(bits) / 8 + n / 32 * 8,
            _ => n * 4,
        };
    }
    let get = |k: &str| model.plan.config.get(k).and_then(Value::as_u64);
    let layers = get("num_hidden_layers").unwrap_or(0);
    let kv_heads = get("num_key_value_heads").unwrap_or(1);
    let head_dim = get("head_dim").unwrap_or(0);
    let kv_bytes_per_token = 2 * layers * kv_heads * head_dim * 4;
    let min_tokens = get("max_position_embeddings").map_or(MIN_KV_TOKENS, |m| m.min(MIN_KV_TOKENS));
    Ok(ModelSize {
        weight_bytes,
        kv_bytes_per_token,
        min_bytes: weight_bytes + kv_bytes_per_token * min_tokens + HEADROOM,
    })
}

/// Reads the sizes of the model in `dir`.
fn dir_size(dir: &Path) -> Result<ModelSize, String> {
    let mut weight_bytes = 0u64;
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    let mut found = false;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "safetensors") {
            weight_bytes += safetensors_bytes(&path)?;
            found = true;
        }
    }
    if !found {
        return Err(format!("no safetensors files in {}", dir.display()));
    }
    let config_path = dir.join("config.json");
    let config: Value = std::fs::read_to_string(&config_path)
        .map_err(|e| format!("reading {}: {e}", config_path.display()))
        .and_then(|t| {
            serde_json::from_str(&t).map_err(|e| format!("{}: {e}", config_path.display()))
        })?;
    // A multimodal checkpoint (Gemma 3/4) sizes its text model in text_config.
    let text = config
        .get("text_config")
        .filter(|t| t.is_object())
        .unwrap_or(&config);
    let get = |k: &str| text.get(k).and_then(Value::as_u64);
    let layers = get("num_hidden_layers").unwrap_or(0);
    let heads = get("num_attention_heads").unwrap_or(1).max(1);
    let kv_heads = get("num_key_value_heads").unwrap_or(heads);
    let head_dim = get("head_dim").unwrap_or(get("hidden_size").unwrap_or(0) / heads);
    let dtype_bytes = match text
        .get("torch_dtype")
        .or_else(|| config.get("torch_dtype"))
        .and_then(Value::as_str)
    {
        Some("float32") => 4,
        _ => 2,
    };
    let kv_bytes_per_token = 2 * layers * kv_heads * head_dim * dtype_bytes;
    let min_tokens = get("max_position_embeddings").map_or(MIN_KV_TOKENS, |m| m.min(MIN_KV_TOKENS));
    Ok(ModelSize {
        weight_bytes,
        kv_bytes_per_token,
        min_bytes: weight_bytes + kv_bytes_per_token * min_tokens + HEADROOM,
    })
}

/// Parameters of a model: all of them, and those one token uses (a
/// mixture of experts runs `num_experts_per_tok` of its `num_experts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParameterCount {
    pub total: u64,
    pub active: u64,
}

/// Parameters in the model's safetensors files; packed quantized (uint32)
/// tensors count as the values they hold at their layer's bit width
/// (`quantization`'s per-layer entries, else `bits`), scales and biases not
/// at all. Routed experts' tensors (`.switch_mlp.`, `.experts.`) count in
/// `active` by the share of experts a token uses.
pub fn parameter_count(dir: &Path, config: &Value) -> Result<ParameterCount, String> {
    let quant = config
        .get("quantization")
        .or_else(|| config.get("quantization_config"));
    let bits_of = |tensor: &str| -> Option<u64> {
        let q = quant?;
        let module = tensor.rsplit_once('.').map_or(tensor, |(m, _)| m);
        q.get(module)
            .and_then(|o| o.get("bits"))
            .or_else(|| q.get("bits"))
            .and_then(Value::as_u64)
    };
    let text = config
        .get("text_config")
        .filter(|t| t.is_object())
        .unwrap_or(config);
    let get = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| text.get(*k).and_then(Value::as_u64))
    };
    let share = match (
        get(&["num_experts_per_tok", "num_experts_per_token"]),
        get(&["num_experts", "n_routed_experts", "num_local_experts"]),
    ) {
        (Some(k), Some(e)) if e > 0 && k <= e => k as f64 / e as f64,
        _ => 1.0,
    };
    let (mut total, mut experts) = (0u64, 0u64);
    for entry in std::fs::read_dir(dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .flatten()
    {
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "safetensors") {
            continue;
        }
        for (name, tensor) in header(&path)? {
            let dtype = tensor.get("dtype").and_then(Value::as_str).unwrap_or("");
            let numel: u64 = tensor
                .get("shape")
                .and_then(Value::as_array)
                .map_or(0, |s| s.iter().filter_map(Value::as_u64).product());
            let bits = bits_of(&name);
            let n = if dtype == "U32" {
                numel * 32 / bits.unwrap_or(32).max(1)
            } else if bits.is_some() && (name.ends_with(".scales") || name.ends_with(".biases")) {
                0
            } else {
                numel
            };
            total += n;
            if name.contains(".switch_mlp.") || name.contains(".experts.") {
                experts += n;
            }
        }
    }
    let idle = (experts as f64 * (1.0 - share)).round() as u64;
    Ok(ParameterCount {
        total,
        active: total - idle.min(total),
    })
}

/// Bytes of the files in `dir` (following links, as the hub cache uses them).
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| std::fs::metadata(e.path()).ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// The tensors of one safetensors header.
fn header(path: &Path) -> Result<serde_json::Map<String, Value>, String> {
    let bad = |what: &str| format!("{}: {what}", path.display());
    let mut file = File::open(path).map_err(|e| bad(&e.to_string()))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .map_err(|_| bad("too short for a safetensors header"))?;
    let len = u64::from_le_bytes(len);
    // The claimed length is checked against the file before anything that
    // size is allocated.
    let file_len = file.metadata().map_err(|e| bad(&e.to_string()))?.len();
    if len > 100 << 20 || len > file_len.saturating_sub(8) {
        return Err(bad("header length is implausible"));
    }
    let mut raw = vec![0u8; len as usize];
    file.read_exact(&mut raw)
        .map_err(|_| bad("truncated header"))?;
    let value: Value =
        serde_json::from_slice(&raw).map_err(|e| bad(&format!("header is not JSON: {e}")))?;
    let Value::Object(mut map) = value else {
        return Err(bad("header is not an object"));
    };
    map.remove("__metadata__");
    Ok(map)
}

/// The data bytes of one safetensors file, from its header.
fn safetensors_bytes(path: &Path) -> Result<u64, String> {
    let bad = |what: &str| format!("{}: {what}", path.display());
    let mut bytes = 0u64;
    for (name, tensor) in header(path)? {
        let offsets = tensor
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|o| Some((o.first()?.as_u64()?, o.get(1)?.as_u64()?)))
            .ok_or_else(|| bad(&format!("tensor {name} has no data_offsets")))?;
        bytes += offsets.1.saturating_sub(offsets.0);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by fuzzing: a header length of 16 MB in a 300-byte file made the
    /// daemon allocate the 16 MB before reading.
    #[test]
    fn a_header_longer_than_its_file_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = (16u64 << 20).to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        let path = dir.path().join("model.safetensors");
        std::fs::write(&path, bytes).unwrap();
        assert!(header(&path).unwrap_err().contains("implausible"));
    }
}
