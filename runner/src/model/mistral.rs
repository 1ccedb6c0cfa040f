//! Mistral: Llama's decoder; mlx-lm runs it as llama. Its `sliding_window`
//! (Mistral 7B v0.1) is ignored there too, since every layer attends fully.
use std::path::Path;

use serde::Deserialize;

use super::layers::decoder::DecoderSpec;
use super::llama;
use crate::error::Result;

/// `config.json` of a `MistralForCausalLM`.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub llama: llama::Config,
    #[serde(default)]
    pub sliding_window: Option<u32>,
}

impl Config {
    /// The decoder this config describes.
    pub fn spec(&self, path: &Path, has_lm_head: bool) -> Result<DecoderSpec> {
        self.llama.spec(path, has_lm_head)
    }
}
