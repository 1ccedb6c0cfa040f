//! Mistral: Llama's decoder; mlx-lm runs it as llama. Its `sliding_window`
//! alone (Mistral 7B v0.1) changes nothing there, since every layer attends
//! fully unless `layer_types` names sliding layers, so it changes nothing here.
use std::path::Path;

use serde::Deserialize;

use super::layers::decoder::DecoderSpec;
use super::llama;
use crate::error::Result;

/// `config.json` of a `MistralForCausalLM`: Llama's (which reads
/// `sliding_window` with `layer_types`).
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub llama: llama::Config,
}

impl Config {
    /// The decoder this config describes.
    pub fn spec(&self, path: &Path, has_lm_head: bool) -> Result<DecoderSpec> {
        self.llama.spec(path, has_lm_head)
    }
}
