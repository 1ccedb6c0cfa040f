//! Where a model's chat templates come from (transformers 5's rules, see the
//! module docs of [`super`]) and the special tokens they see.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::{Result, RunnerError};

/// The special tokens transformers always names.
const NAMED_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// A template's source before parsing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Source {
    pub name: String,
    pub text: String,
    /// The file it came from, for error messages.
    pub origin: PathBuf,
}

/// Everything a model's chat templates need, read from its files: the
/// templates' sources and the special tokens they see. Serializable, so a
/// template can be rendered in a sandbox process (see [`super::sandbox`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateSpec {
    pub sources: Vec<Source>,
    pub special_tokens: BTreeMap<String, String>,
}

impl TemplateSpec {
    /// The templates of the model directory `dir`; `None` when it has none.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let origin = dir.join("tokenizer_config.json");
        let config = read_json(&origin)?;
        Self::load_from(Some(dir), &config, &origin)
    }

    /// The templates of a tokenizer_config.json held in memory (a converted
    /// GGUF file's); `origin` names it in errors.
    pub fn from_tokenizer_config(config: &Json, origin: &Path) -> Result<Option<Self>> {
        Self::load_from(None, config, origin)
    }

    fn load_from(dir: Option<&Path>, config: &Json, origin: &Path) -> Result<Option<Self>> {
        let sources = template_sources(dir, config, origin)?;
        if sources.is_empty() {
            return Ok(None);
        }
        let special_tokens = special_tokens(dir, config)?;
        Ok(Some(Self {
            sources,
            special_tokens,
        }))
    }
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| RunnerError::Read {
        path: path.to_owned(),
        source,
    })
}

pub(super) fn read_json(path: &Path) -> Result<Json> {
    if !path.is_file() {
        return Ok(Json::Null);
    }
    serde_json::from_str(&read_text(path)?)
        .map_err(|e| RunnerError::Tokenizer(format!("{}: not valid JSON: {e}", path.display())))
}

/// Adds or replaces (a later source of the same name wins, as in a Python dict).
fn put(sources: &mut Vec<Source>, source: Source) {
    match sources.iter_mut().find(|s| s.name == source.name) {
        Some(old) => *old = source,
        None => sources.push(source),
    }
}

/// The model's templates, from the files in `dir` (if any) or else from
/// `tokenizer_config.json` (`config`, read from `origin`).
fn template_sources(dir: Option<&Path>, config: &Json, origin: &Path) -> Result<Vec<Source>> {
    let mut sources = Vec::new();
    if let Some(dir) = dir {
        file_sources(dir, &mut sources)?;
    }
    if !sources.is_empty() {
        return Ok(sources);
    }
    config_sources(config, origin, &mut sources)?;
    Ok(sources)
}

/// `chat_template.jinja` and `additional_chat_templates/*.jinja`.
fn file_sources(dir: &Path, sources: &mut Vec<Source>) -> Result<()> {
    let file = dir.join("chat_template.jinja");
    if file.is_file() {
        let text = read_text(&file)?;
        put(
            sources,
            Source {
                name: "default".into(),
                text,
                origin: file,
            },
        );
    }
    let extra_dir = dir.join("additional_chat_templates");
    if extra_dir.is_dir() {
        let entries = std::fs::read_dir(&extra_dir).map_err(|source| RunnerError::Read {
            path: extra_dir.clone(),
            source,
        })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "jinja"))
            .collect();
        files.sort();
        for path in files {
            let Some(name) = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned) else {
                continue;
            };
            let text = read_text(&path)?;
            put(
                sources,
                Source {
                    name,
                    text,
                    origin: path,
                },
            );
        }
    }
    Ok(())
}

/// `chat_template` of tokenizer_config.json: a string or a named list.
fn config_sources(config: &Json, origin: &Path, sources: &mut Vec<Source>) -> Result<()> {
    let bad =
        |what: &str| RunnerError::Tokenizer(format!("{}: chat_template {what}", origin.display()));
    match config.get("chat_template") {
        None | Some(Json::Null) => {}
        Some(Json::String(text)) => put(
            sources,
            Source {
                name: "default".into(),
                text: text.clone(),
                origin: origin.to_owned(),
            },
        ),
        Some(Json::Array(items)) => {
            for item in items {
                let (Some(name), Some(text)) = (
                    item.get("name").and_then(Json::as_str),
                    item.get("template").and_then(Json::as_str),
                ) else {
                    return Err(bad(
                        "list entries must be {\"name\": ..., \"template\": ...}",
                    ));
                };
                put(
                    sources,
                    Source {
                        name: name.into(),
                        text: text.into(),
                        origin: origin.to_owned(),
                    },
                );
            }
        }
        Some(_) => {
            return Err(bad(
                "must be a string or a list of {\"name\", \"template\"}",
            ));
        }
    }
    Ok(())
}

/// A token written as a string or as an AddedToken object (`{"content": ...}`).
fn token_text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// The special tokens transformers 5 passes to the template (its
/// `special_tokens_map`): the named ones, then model-specific named tokens
/// (`extra_special_tokens` given as a dict, other `*_token` string entries,
/// `model_specific_special_tokens`). `special_tokens_map.json` only counts when
/// `tokenizer_config.json` has no `added_tokens_decoder` (its legacy path), and
/// then overrides.
pub(super) fn special_tokens(
    dir: Option<&Path>,
    config: &Json,
) -> Result<BTreeMap<String, String>> {
    let mut cfg = config.as_object().cloned().unwrap_or_default();
    if !cfg.contains_key("added_tokens_decoder")
        && let Some(dir) = dir
        && let Json::Object(map) = read_json(&dir.join("special_tokens_map.json"))?
    {
        cfg.extend(map);
    }
    let mut out = BTreeMap::new();
    for key in NAMED_TOKENS {
        if let Some(text) = cfg.get(key).and_then(token_text) {
            out.insert(key.to_owned(), text);
        }
    }
    let named_dict = |out: &mut BTreeMap<String, String>, v: Option<&Json>| {
        if let Some(Json::Object(map)) = v {
            for (k, v) in map {
                if let Some(text) = token_text(v) {
                    out.insert(k.clone(), text);
                }
            }
        }
    };
    named_dict(
        &mut out,
        cfg.get("extra_special_tokens")
            .or_else(|| cfg.get("additional_special_tokens")),
    );
    for (k, v) in &cfg {
        let added = v.get("__type").and_then(Json::as_str) == Some("AddedToken");
        if k.ends_with("_token")
            && !NAMED_TOKENS.contains(&k.as_str())
            && (v.is_string() || added)
            && let Some(text) = token_text(v)
        {
            out.insert(k.clone(), text);
        }
    }
    named_dict(&mut out, cfg.get("model_specific_special_tokens"));
    Ok(out)
}
