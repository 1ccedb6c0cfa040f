//! The tokenizer (tokenizer.json through the `tokenizers` crate) and the
//! special tokens a generation needs: BOS for prompts, the EOS set for stopping.
use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use crate::error::{Result, RunnerError};

/// A model's tokenizer with its BOS/EOS facts.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<String>,
    eos_ids: Vec<u32>,
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    crate::model::config::read_optional_json(path, |p, m| {
        RunnerError::Tokenizer(format!("{}: {m}", p.display()))
    })
}

/// A special token written as a string or as `{"content": ...}`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// `eos_token_id` as one id or a list.
fn token_ids(v: Option<&Value>) -> Option<Vec<u32>> {
    match v? {
        Value::Number(n) => n.as_u64().map(|n| vec![n as u32]),
        Value::Array(a) => Some(
            a.iter()
                .filter_map(Value::as_u64)
                .map(|n| n as u32)
                .collect(),
        ),
        _ => None,
    }
}

/// Reads tokenizer.json. The JSON is checked first, and the `tokenizers`
/// crate's own parsing runs under `catch_unwind`: it panics on some malformed
/// files (a truncated decoder section hits an `expect`), which must be an
/// error here, never a crash.
fn parse_tokenizer_json(path: &Path) -> Result<tokenizers::Tokenizer> {
    let bad = |m: String| RunnerError::Tokenizer(format!("{}: {m}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|source| RunnerError::Read {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str::<serde::de::IgnoredAny>(&text)
        .map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let parsed = std::panic::catch_unwind(|| text.parse::<tokenizers::Tokenizer>());
    let tokenizer = match parsed {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return Err(bad(e.to_string())),
        Err(_) => {
            return Err(bad(
                "the tokenizers library could not read it (it panicked)".into(),
            ));
        }
    };
    // tokenizers takes some files it cannot use: a template post-processor
    // whose special token is not in its table parses, then panics on the
    // first encode. A probe with and without special tokens finds them here.
    for add_special in [true, false] {
        guarded("encoding a probe", || {
            tokenizer.encode("Hello, world", add_special)
        })
        .map_err(|e| bad(format!("it cannot encode: {e}")))?;
    }
    Ok(tokenizer)
}

/// Runs a call into the `tokenizers` crate; its error or its panic (it
/// indexes and `expect`s on what a malformed file left out) is an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> tokenizers::Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(RunnerError::Tokenizer(format!("{what}: {e}"))),
        Err(_) => Err(RunnerError::Tokenizer(format!(
            "{what}: the tokenizers library panicked (a malformed tokenizer.json)"
        ))),
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` from `dir`; BOS/EOS come from `config` (config.json),
    /// `generation_config.json` (its EOS wins, as in mlx-lm) and
    /// `tokenizer_config.json` (its EOS token is always added to the set).
    pub fn load(dir: &Path, config: &Value) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(RunnerError::Tokenizer(format!(
                "{} does not exist",
                path.display()
            )));
        }
        let inner = parse_tokenizer_json(&path)?;
        let tok_config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let gen_config = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);
        Ok(Self::from_parts(inner, &tok_config, &gen_config, config))
    }

    /// A tokenizer already built, with the contents of tokenizer_config.json,
    /// generation_config.json and config.json (Null where absent).
    pub fn from_parts(
        inner: tokenizers::Tokenizer,
        tok_config: &Value,
        gen_config: &Value,
        config: &Value,
    ) -> Self {
        let mut eos: BTreeSet<u32> = token_ids(gen_config.get("eos_token_id"))
            .or_else(|| token_ids(config.get("eos_token_id")))
            .unwrap_or_default()
            .into_iter()
            .collect();
        if let Some(id) =
            token_text(tok_config.get("eos_token")).and_then(|t| inner.token_to_id(&t))
        {
            eos.insert(id);
        }
        Self {
            bos: token_text(tok_config.get("bos_token")),
            inner,
            eos_ids: eos.into_iter().collect(),
        }
    }

    /// Tokenizes a text prompt as mlx-lm does: with the tokenizer's special
    /// tokens (e.g. BOS) unless the text already starts with the BOS token.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let add_special = match &self.bos {
            Some(bos) => !text.starts_with(bos.as_str()),
            None => true,
        };
        let encoding = guarded("encoding the prompt", || {
            self.inner.encode(text, add_special)
        })?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Tokenizes text, with or without the tokenizer's special tokens (BOS).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let encoding = guarded("encoding", || self.inner.encode(text, add_special))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Decodes ids to text, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        guarded("decoding", || self.inner.decode(ids, false))
    }

    /// The id of a token, if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The ids that end a generation.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// The tokenizer's vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The underlying `tokenizers` tokenizer (e.g. for the detokenizer's tables).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by fuzzing: tokenizers 0.22 panics (`expect("Helper")`) on a
    /// file that ends inside its decoder section.
    #[test]
    fn a_truncated_tokenizer_json_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let text = r#"{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true,"#;
        std::fs::write(dir.path().join("tokenizer.json"), text).unwrap();
        let err = Tokenizer::load(dir.path(), &Value::Null).err().unwrap();
        assert!(err.to_string().contains("tokenizer.json"), "{err}");
        // Valid JSON that tokenizers cannot use is an error too.
        std::fs::write(dir.path().join("tokenizer.json"), r#"{"decoder": 3}"#).unwrap();
        assert!(Tokenizer::load(dir.path(), &Value::Null).is_err());
    }

    /// Found by fuzzing: a template post-processor that names a special
    /// token missing from its table parses, then tokenizers 0.22 panics
    /// ("no entry found for key") on the first encode. An error at load.
    #[test]
    fn a_template_with_a_missing_special_token_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let text = r#"{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {}},
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"Hello": 0, ",": 1, "world": 2, "<unk>": 3}, "unk_token": "<unk>"}}"#;
        std::fs::write(dir.path().join("tokenizer.json"), text).unwrap();
        let err = Tokenizer::load(dir.path(), &Value::Null).err().unwrap();
        assert!(err.to_string().contains("cannot encode"), "{err}");
    }
}
