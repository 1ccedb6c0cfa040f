//! `grove show`: what a model is, read from its files without loading it
//! (a model directory, or a GGUF file's metadata and tensor infos).
use std::path::Path;

use grove_proto::v1 as pb;
use serde_json::Value;

use crate::model_size::{dir_bytes, model_size, parameter_count};
use crate::resolve::{ModelKind, Resolved};

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// The chat template: `chat_template.jinja`, else tokenizer_config.json's.
fn chat_template(dir: &Path) -> String {
    if let Ok(t) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        return t;
    }
    match read_json(&dir.join("tokenizer_config.json"))
        .and_then(|c| c.get("chat_template").cloned())
    {
        Some(Value::String(t)) => t,
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template").and_then(Value::as_str))
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

/// The license: README front matter's `license:`, else the first line of LICENSE.
fn license(dir: &Path) -> String {
    if let Ok(readme) = std::fs::read_to_string(dir.join("README.md"))
        && let Some(front) = readme.strip_prefix("---")
    {
        for line in front.lines().take_while(|l| l.trim() != "---") {
            if let Some(v) = line.trim().strip_prefix("license:") {
                return v.trim().to_owned();
            }
        }
    }
    std::fs::read_to_string(dir.join("LICENSE"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| !l.trim().is_empty())
                .map(|l| l.trim().to_owned())
        })
        .unwrap_or_default()
}

/// Reads the facts of `model`.
pub fn show(model: &Resolved) -> Result<pb::ShowResponse, String> {
    if model.kind == ModelKind::Gguf {
        return show_gguf(model);
    }
    let dir = &model.path;
    let config = read_json(&dir.join("config.json"))
        .ok_or_else(|| format!("{}: config.json is unreadable", dir.display()))?;
    let quant = config
        .get("quantization")
        .or_else(|| config.get("quantization_config"));
    let bits = quant.and_then(|q| q.get("bits")).and_then(Value::as_u64);
    let group = quant
        .and_then(|q| q.get("group_size"))
        .and_then(Value::as_u64);
    let size = model_size(dir)?;
    let params = parameter_count(dir, &config)?;
    let encoder = matches!(
        config.get("model_type").and_then(Value::as_str),
        Some("bert" | "roberta" | "xlm-roberta")
    );
    Ok(pb::ShowResponse {
        generates: !encoder,
        embeds: encoder || dir.join("modules.json").is_file(),
        name: model.name.clone(),
        path: dir.display().to_string(),
        architecture: config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .or_else(|| config.get("model_type").and_then(Value::as_str))
            .unwrap_or("unknown")
            .to_owned(),
        parameter_count: params.total,
        active_parameter_count: params.active,
        quantization: match (bits, group) {
            (Some(b), Some(g)) => match quant.and_then(|q| q.get("mode")).and_then(Value::as_str) {
                Some(mode) if mode != "affine" => format!("{b}-bit {mode} (group {g})"),
                _ => format!("{b}-bit (group {g})"),
            },
            (Some(b), None) => format!("{b}-bit"),
            _ => String::new(),
        },
        dtype: config
            .get("torch_dtype")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        context_length: config
            .get("max_position_embeddings")
            .and_then(Value::as_u64)
            .unwrap_or(0) as u32,
        chat_template: chat_template(dir),
        license: license(dir),
        size_bytes: dir_bytes(dir).max(size.weight_bytes),
    })
}

/// The facts of a GGUF file: the config it converts to, the ggml types of its
/// tensors and how each converts, its template and license.
fn show_gguf(model: &Resolved) -> Result<pb::ShowResponse, String> {
    use grove_gguf::{GgufModel, blocks};
    use std::collections::BTreeMap;
    let m = GgufModel::open(&model.path).map_err(|e| e.to_string())?;
    let config = &m.plan.config;
    let mut types: BTreeMap<&str, (u64, Option<u32>)> = BTreeMap::new();
    let mut params = 0u64;
    for t in &m.plan.tensors {
        let info = &m.file.tensors[t.index];
        params += info.elements();
        let bits = (info.dims.len() == 2)
            .then(|| blocks::requant_bits(info.kind))
            .flatten();
        let entry = types.entry(info.kind.name()).or_insert((0, bits));
        entry.0 += 1;
    }
    let exact = |k: &str| matches!(k, "Q4_0" | "Q4_1" | "Q8_0");
    let quantization = types
        .iter()
        .filter(|(k, _)| !matches!(**k, "F32" | "F16" | "BF16"))
        .map(|(k, (n, bits))| match bits {
            Some(b) if exact(k) => format!("{n}x {k} (= MLX {b}-bit g32)"),
            Some(b) => format!("{n}x {k} (-> MLX {b}-bit g32)"),
            None => format!("{n}x {k} (-> float32)"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let floats: Vec<String> = types
        .iter()
        .filter(|(k, _)| matches!(**k, "F32" | "F16" | "BF16"))
        .map(|(k, (n, _))| format!("{n}x {k}"))
        .collect();
    let meta = &m.file.metadata;
    let template = meta
        .str("tokenizer.chat_template")
        .ok()
        .flatten()
        .unwrap_or_default()
        .to_owned();
    let size = std::fs::metadata(&model.path).map(|x| x.len()).unwrap_or(0);
    Ok(pb::ShowResponse {
        name: model.name.clone(),
        path: model.path.display().to_string(),
        architecture: config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .map(|a| format!("{a} (GGUF {})", m.plan.family.gguf_name()))
            .unwrap_or_default(),
        parameter_count: params,
        active_parameter_count: params,
        quantization,
        dtype: format!("GGUF, floats {}", floats.join(", ")),
        context_length: config
            .get("max_position_embeddings")
            .and_then(Value::as_u64)
            .unwrap_or(0) as u32,
        chat_template: template,
        generates: true,
        embeds: false,
        license: meta
            .str("general.license")
            .ok()
            .flatten()
            .unwrap_or_default()
            .to_owned(),
        size_bytes: size,
    })
}
