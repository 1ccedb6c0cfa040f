//! What every architecture shares from `config.json`: which architecture it is,
//! and how its weights are quantized. Each architecture file parses the rest
//! into its own serde `Config`.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Result, RunnerError};

/// The architecture families the runner implements, from `architectures[0]`
/// (falling back to `model_type`). Parsed in this one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// Qwen3's mixture of experts (`Qwen3MoeForCausalLM`).
    Qwen3Moe,
    /// Qwen3-Next: gated delta-net layers between full attention, experts.
    Qwen3Next,
    /// gpt-oss: attention sinks, alternating windows, experts with biases.
    GptOss,
    /// Qwen3.5/3.6 (dense and MoE): the text part.
    Qwen3_5,
    /// GLM-4.7-Flash: latent attention, sigmoid-routed experts.
    Glm4MoeLite,
    /// Gemma 3's text model (`Gemma3ForCausalLM`, model_type `gemma3_text`).
    Gemma3Text,
    /// Gemma 3 with vision (`Gemma3ForConditionalGeneration`): its text part.
    Gemma3,
    Gemma2,
    /// Gemma 4's text model (`Gemma4ForCausalLM`, model_type `gemma4_text`).
    Gemma4Text,
    /// Gemma 4 with vision and audio (`Gemma4ForConditionalGeneration`): its text part.
    Gemma4,
    /// Phi-3 and Phi-4 (`Phi3ForCausalLM`).
    Phi3,
    /// BERT (`BertModel`) and RoBERTa/XLM-RoBERTa: encoders that embed and
    /// do not generate.
    Bert,
}

impl Architecture {
    /// Picks the architecture from the raw config.
    pub fn from_config(path: &Path, raw: &Value) -> Result<Self> {
        let named = raw
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str);
        let model_type = raw.get("model_type").and_then(Value::as_str);
        let found = match named {
            Some("LlamaForCausalLM") => Some(Self::Llama),
            Some("MistralForCausalLM") => Some(Self::Mistral),
            Some("Qwen2ForCausalLM") => Some(Self::Qwen2),
            Some("Qwen3ForCausalLM") => Some(Self::Qwen3),
            Some("Qwen3MoeForCausalLM") => Some(Self::Qwen3Moe),
            Some("Qwen3NextForCausalLM") => Some(Self::Qwen3Next),
            Some("GptOssForCausalLM") => Some(Self::GptOss),
            Some("Glm4MoeLiteForCausalLM") => Some(Self::Glm4MoeLite),
            Some(
                "Qwen3_5ForConditionalGeneration"
                | "Qwen3_5MoeForConditionalGeneration"
                | "Qwen3_5ForCausalLM"
                | "Qwen3_5MoeForCausalLM",
            ) => Some(Self::Qwen3_5),
            Some("Gemma3ForCausalLM") => Some(Self::Gemma3Text),
            Some("Gemma3ForConditionalGeneration") => Some(Self::Gemma3),
            Some("Gemma2ForCausalLM") => Some(Self::Gemma2),
            Some("Gemma4ForCausalLM") => Some(Self::Gemma4Text),
            Some("Gemma4ForConditionalGeneration") => Some(Self::Gemma4),
            Some("Phi3ForCausalLM") => Some(Self::Phi3),
            Some(
                "BertModel"
                | "BertForMaskedLM"
                | "BertForPreTraining"
                | "RobertaModel"
                | "RobertaForMaskedLM"
                | "XLMRobertaModel"
                | "XLMRobertaForMaskedLM",
            ) => Some(Self::Bert),
            Some(_) => None,
            None => match model_type {
                Some("llama") => Some(Self::Llama),
                Some("mistral") => Some(Self::Mistral),
                Some("qwen2") => Some(Self::Qwen2),
                Some("qwen3") => Some(Self::Qwen3),
                Some("qwen3_moe") => Some(Self::Qwen3Moe),
                Some("qwen3_next") => Some(Self::Qwen3Next),
                Some("gpt_oss") => Some(Self::GptOss),
                Some("glm4_moe_lite") => Some(Self::Glm4MoeLite),
                Some("qwen3_5" | "qwen3_5_moe" | "qwen3_5_text" | "qwen3_5_moe_text") => {
                    Some(Self::Qwen3_5)
                }
                Some("gemma3_text") => Some(Self::Gemma3Text),
                Some("gemma3") => Some(Self::Gemma3),
                Some("gemma2") => Some(Self::Gemma2),
                Some("gemma4_text") => Some(Self::Gemma4Text),
                Some("gemma4") => Some(Self::Gemma4),
                Some("phi3") => Some(Self::Phi3),
                Some("bert" | "roberta" | "xlm-roberta") => Some(Self::Bert),
                _ => None,
            },
        };
        found.ok_or_else(|| RunnerError::Config {
            path: path.to_owned(),
            message: format!(
                "unsupported architecture {} (model_type {}); supported: \
                 LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, \
                 Qwen3MoeForCausalLM, Qwen3NextForCausalLM, GptOssForCausalLM, \
                 Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration, \
                 Glm4MoeLiteForCausalLM, \
                 Gemma3ForCausalLM, Gemma3ForConditionalGeneration, Gemma2ForCausalLM, \
                 Gemma4ForCausalLM, Gemma4ForConditionalGeneration, \
                 Phi3ForCausalLM, BertModel, RobertaModel, XLMRobertaModel",
                named.unwrap_or("<none>"),
                model_type.unwrap_or("<none>")
            ),
        })
    }

    /// The lower-case family name, as in `model_type`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Qwen3Moe => "qwen3_moe",
            Self::Qwen3Next => "qwen3_next",
            Self::GptOss => "gpt_oss",
            Self::Qwen3_5 => "qwen3_5",
            Self::Glm4MoeLite => "glm4_moe_lite",
            Self::Gemma3Text => "gemma3_text",
            Self::Gemma3 => "gemma3",
            Self::Gemma2 => "gemma2",
            Self::Gemma4Text => "gemma4_text",
            Self::Gemma4 => "gemma4",
            Self::Phi3 => "phi3",
            Self::Bert => "bert",
        }
    }
}

/// MLX's quantization modes: affine (a float scale and bias per group) and
/// the microscaling float formats (a uint8 scale per group, no biases).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum QuantMode {
    #[default]
    Affine,
    /// 4-bit floats (e2m1), an e8m0 exponent per 32 (gpt-oss's experts).
    Mxfp4,
    /// 4-bit floats, an fp8 (e4m3) scale per 16.
    Nvfp4,
    /// 8-bit floats (e4m3), an e8m0 exponent per 32.
    Mxfp8,
}

impl QuantMode {
    /// The name MLX takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Affine => "affine",
            Self::Mxfp4 => "mxfp4",
            Self::Nvfp4 => "nvfp4",
            Self::Mxfp8 => "mxfp8",
        }
    }

    /// Whether a group has a bias beside its scale.
    pub fn has_biases(self) -> bool {
        self == Self::Affine
    }
}

/// How one quantized layer is packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct QuantParams {
    pub group_size: i32,
    pub bits: i32,
    #[serde(default)]
    pub mode: QuantMode,
}

impl QuantParams {
    fn check(self, path: &Path, what: &str) -> Result<Self> {
        let (ok, allowed) = match self.mode {
            QuantMode::Affine => (
                matches!(self.bits, 2 | 3 | 4 | 5 | 6 | 8)
                    && matches!(self.group_size, 32 | 64 | 128),
                "bits 2,3,4,5,6,8; group 32,64,128",
            ),
            QuantMode::Mxfp4 => (
                self.bits == 4 && self.group_size == 32,
                "mxfp4: bits 4, group 32",
            ),
            QuantMode::Nvfp4 => (
                self.bits == 4 && self.group_size == 16,
                "nvfp4: bits 4, group 16",
            ),
            QuantMode::Mxfp8 => (
                self.bits == 8 && self.group_size == 32,
                "mxfp8: bits 8, group 32",
            ),
        };
        if ok {
            Ok(self)
        } else {
            Err(config_error(
                path,
                format!(
                    "{what}: unsupported quantization bits={} group_size={} mode={} ({allowed})",
                    self.bits,
                    self.group_size,
                    self.mode.name()
                ),
            ))
        }
    }
}

/// The `quantization` block of an MLX config: defaults plus per-layer overrides
/// keyed by module path (`false` = that layer stays dense).
#[derive(Debug, Clone, Default)]
pub struct Quantization {
    pub default: Option<QuantParams>,
    overrides: HashMap<String, Option<QuantParams>>,
}

impl Quantization {
    /// Parses `quantization` (or `quantization_config`) from the raw config.
    pub fn from_config(path: &Path, raw: &Value) -> Result<Self> {
        let Some(block) = raw
            .get("quantization")
            .or_else(|| raw.get("quantization_config"))
        else {
            return Ok(Self::default());
        };
        let Some(map) = block.as_object() else {
            return Err(config_error(path, "quantization must be an object".into()));
        };
        if let Some(method) = map.get("quant_method").and_then(Value::as_str)
            && !map.contains_key("group_size")
        {
            return Err(config_error(
                path,
                format!(
                    "quantization_config with quant_method {method:?} is a transformers \
                     checkpoint format, not MLX's; convert the model with mlx_lm.convert"
                ),
            ));
        }
        let default: QuantParams = serde_json::from_value(block.clone())
            .map_err(|e| config_error(path, format!("quantization: {e}")))?;
        let default = default.check(path, "quantization")?;
        let mut overrides = HashMap::new();
        for (key, value) in map {
            match value {
                Value::Object(_) => {
                    let p: QuantParams = serde_json::from_value(value.clone())
                        .map_err(|e| config_error(path, format!("quantization.{key}: {e}")))?;
                    overrides.insert(key.clone(), Some(p.check(path, key)?));
                }
                Value::Bool(false) => {
                    overrides.insert(key.clone(), None);
                }
                _ => {}
            }
        }
        Ok(Self {
            default: Some(default),
            overrides,
        })
    }

    /// The same block for modules named without `prefix` (a multimodal
    /// checkpoint's `language_model.` once its text part is taken).
    pub fn strip_prefix(&self, prefix: &str) -> Self {
        Self {
            default: self.default,
            overrides: self
                .overrides
                .iter()
                .map(|(k, v)| (k.strip_prefix(prefix).unwrap_or(k).to_owned(), *v))
                .collect(),
        }
    }

    /// The packing of the module at `path` (e.g. `model.layers.0.mlp.up_proj`),
    /// if the checkpoint quantizes it.
    pub fn for_layer(&self, module: &str) -> Option<QuantParams> {
        match self.overrides.get(module) {
            Some(explicit) => *explicit,
            None => self.default,
        }
    }
}

/// A JSON file beside a model that may be absent (`None`), its parse error
/// in the caller's terms (`invalid(path, message)`).
pub fn read_optional_json(
    path: &Path,
    invalid: impl Fn(&Path, String) -> RunnerError,
) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| RunnerError::Read {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| invalid(path, format!("not valid JSON: {e}")))
}

/// Reads and parses `config.json` of a model directory.
pub fn read_config(dir: &Path) -> Result<(PathBuf, Value)> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| RunnerError::Read {
        path: path.clone(),
        source,
    })?;
    let raw: Value = serde_json::from_str(&text)
        .map_err(|e| config_error(&path, format!("not valid JSON: {e}")))?;
    if !raw.is_object() {
        return Err(config_error(&path, "must be a JSON object".into()));
    }
    Ok((path, raw))
}

/// Parses the raw config into an architecture's typed `Config`.
pub fn typed<T: serde::de::DeserializeOwned>(path: &Path, raw: &Value) -> Result<T> {
    serde_json::from_value(raw.clone()).map_err(|e| config_error(path, e.to_string()))
}

/// The most layers a config may claim (real models have at most a few
/// hundred): the per-layer tables are sized from the claim before the
/// layers' tensors are found.
pub const MAX_LAYERS: i32 = 4096;

/// `num_hidden_layers` as a count, when it is one a model can have.
pub fn layer_count(path: &Path, n: i32) -> Result<usize> {
    if (1..=MAX_LAYERS).contains(&n) {
        Ok(n as usize)
    } else {
        Err(config_error(
            path,
            format!("num_hidden_layers must be in 1..={MAX_LAYERS}, not {n}"),
        ))
    }
}

/// Rejects an RMS norm epsilon that is not a positive number.
pub fn check_eps(path: &Path, eps: f32) -> Result<()> {
    if eps.is_finite() && eps > 0.0 {
        Ok(())
    } else {
        Err(config_error(
            path,
            format!("rms_norm_eps must be positive, not {eps}"),
        ))
    }
}

/// A config error at `path`.
pub fn config_error(path: &Path, message: String) -> RunnerError {
    RunnerError::Config {
        path: path.to_owned(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn architecture_from_name_or_type() {
        let p = Path::new("c");
        let a = |v| Architecture::from_config(p, &v);
        assert_eq!(
            a(json!({"architectures": ["Qwen3ForCausalLM"]})).unwrap(),
            Architecture::Qwen3
        );
        assert_eq!(
            a(json!({"model_type": "mistral"})).unwrap(),
            Architecture::Mistral
        );
        let err = a(json!({"architectures": ["GPT2LMHeadModel"]}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("GPT2LMHeadModel"), "{err}");
    }

    #[test]
    fn quantization_overrides() {
        let p = Path::new("c");
        let q = Quantization::from_config(
            p,
            &json!({"quantization": {"group_size": 64, "bits": 4, "mode": "affine",
                "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8},
                "lm_head": false}}),
        )
        .unwrap();
        assert_eq!(q.for_layer("model.layers.1.mlp.up_proj").unwrap().bits, 4);
        assert_eq!(q.for_layer("model.layers.0.mlp.gate").unwrap().bits, 8);
        assert!(q.for_layer("lm_head").is_none());
        let bad =
            Quantization::from_config(p, &json!({"quantization": {"group_size": 64, "bits": 7}}));
        assert!(bad.unwrap_err().to_string().contains("bits=7"));
        // MLX's microscaling modes are read (see quant_tests); an unknown
        // mode is refused.
        let mode = Quantization::from_config(
            p,
            &json!({"quantization": {"group_size": 32, "bits": 4, "mode": "int3"}}),
        );
        assert!(mode.is_err());
    }
}

#[cfg(test)]
mod quant_tests {
    use super::*;

    fn parse(q: Value) -> std::result::Result<Quantization, String> {
        let raw = serde_json::json!({ "quantization": q });
        Quantization::from_config(Path::new("config.json"), &raw).map_err(|e| e.to_string())
    }

    #[test]
    fn microscaling_modes_take_their_own_group_and_bits() {
        let q = parse(
            serde_json::json!({"group_size": 32, "bits": 4, "mode": "mxfp4",
            "model.layers.0.mlp.router": {"group_size": 64, "bits": 8}}),
        )
        .unwrap();
        assert_eq!(q.default.map(|p| p.mode), Some(QuantMode::Mxfp4));
        // A per-layer entry without a mode is affine, as mlx-lm writes it.
        let router = q.for_layer("model.layers.0.mlp.router").unwrap();
        assert_eq!((router.mode, router.bits), (QuantMode::Affine, 8));
        assert!(parse(serde_json::json!({"group_size": 16, "bits": 4, "mode": "nvfp4"})).is_ok());
        assert!(parse(serde_json::json!({"group_size": 32, "bits": 8, "mode": "mxfp8"})).is_ok());
        for bad in [
            serde_json::json!({"group_size": 64, "bits": 4, "mode": "mxfp4"}),
            serde_json::json!({"group_size": 16, "bits": 8, "mode": "nvfp4"}),
            serde_json::json!({"group_size": 32, "bits": 4, "mode": "fp3"}),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn a_transformers_quantization_config_is_refused_by_name() {
        let raw = serde_json::json!({"quantization_config": {"quant_method": "mxfp4"}});
        let err = Quantization::from_config(Path::new("config.json"), &raw)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("mlx_lm.convert") && err.contains("mxfp4"),
            "{err}"
        );
    }
}
