//! Where a model comes from: a model directory (config.json, safetensors,
//! tokenizer files) or a GGUF file, converted in memory and read in place.
//! Either way the engine gets the model, its tokenizer and its chat templates.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::chat_template::TemplateSpec;
use crate::error::{Result, RunnerError};
use crate::model::{self, CpuDtypes, Model};
use crate::shard::Comm;
use crate::tokenizer::Tokenizer;

/// What kind of file a model path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Directory,
    Gguf,
}

impl SourceKind {
    /// A directory, or a file that starts with the GGUF magic.
    pub fn detect(path: &Path) -> Result<Self> {
        if path.is_dir() {
            Ok(Self::Directory)
        } else if path.is_file() {
            if grove_gguf::is_gguf(path) {
                Ok(Self::Gguf)
            } else {
                Err(RunnerError::Weights(format!(
                    "{} is neither a model directory nor a GGUF file",
                    path.display()
                )))
            }
        } else {
            Err(RunnerError::Read {
                path: path.to_owned(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such model"),
            })
        }
    }
}

/// Where the chat templates are: the directory's files and its
/// tokenizer_config.json, or a converted GGUF file's tokenizer config.
#[derive(Debug, Clone)]
pub struct Templates {
    dir: Option<PathBuf>,
    origin: PathBuf,
    config: Value,
}

impl Templates {
    /// The model's templates and the special tokens they see; `Ok(None)` when
    /// it has none.
    pub fn spec(&self) -> Result<Option<TemplateSpec>> {
        match &self.dir {
            Some(dir) => TemplateSpec::from_dir(dir),
            None => TemplateSpec::from_tokenizer_config(&self.config, &self.origin),
        }
    }
}

/// A loaded model with its tokenizer and templates.
pub struct Opened {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub templates: Templates,
    pub kind: SourceKind,
}

/// Loads the model at `path` (a directory or a GGUF file).
pub fn open(path: &Path, policy: CpuDtypes) -> Result<Opened> {
    open_sharded(path, policy, None)
}

/// [`open`] of this rank's part of the model when `shard` is a group.
pub fn open_sharded(path: &Path, policy: CpuDtypes, shard: Option<&Arc<Comm>>) -> Result<Opened> {
    match SourceKind::detect(path)? {
        SourceKind::Gguf if shard.is_some() => Err(RunnerError::Shard {
            phase: "planning the shards",
            message: format!(
                "{} is a GGUF file, which is converted whole in memory; \
                 `grove-runner import` writes it as a model directory, which can be sharded",
                path.display()
            ),
        }),
        SourceKind::Directory => {
            let model = model::load_dir_sharded(path, policy, shard)?;
            let tokenizer = Tokenizer::load(path, &model.raw_config)?;
            Ok(Opened {
                model,
                tokenizer,
                templates: Templates {
                    dir: Some(path.to_owned()),
                    origin: path.join("tokenizer_config.json"),
                    config: Value::Null,
                },
                kind: SourceKind::Directory,
            })
        }
        SourceKind::Gguf => {
            let converted = model::gguf::convert(path)?;
            let model = model::load_parts(path, converted.config, converted.tensors, policy)?;
            let tok_config = Value::Object(converted.vocab.tokenizer_config);
            let gen_config = Value::Object(converted.vocab.generation_config);
            let tokenizer = Tokenizer::from_parts(
                converted.vocab.tokenizer,
                &tok_config,
                &gen_config,
                &model.raw_config,
            );
            Ok(Opened {
                model,
                tokenizer,
                templates: Templates {
                    dir: None,
                    origin: path.to_owned(),
                    config: tok_config,
                },
                kind: SourceKind::Gguf,
            })
        }
    }
}
