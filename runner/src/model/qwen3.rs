//! Qwen3 (dense): Qwen2's decoder without q/k/v biases, with an explicit head
//! size and RMS norms over each query and key head before the rotation.
use std::path::Path;

use serde::Deserialize;

use super::layers::decoder::DecoderSpec;
use super::qwen2;
use crate::error::Result;

/// `config.json` of a `Qwen3ForCausalLM`.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub base: qwen2::Config,
    pub head_dim: i32,
}

impl Config {
    /// The decoder this config describes.
    pub fn spec(&self, path: &Path) -> Result<DecoderSpec> {
        self.base.spec_with(
            path,
            Some(self.head_dim),
            false,
            Some(self.base.rms_norm_eps),
        )
    }
}
