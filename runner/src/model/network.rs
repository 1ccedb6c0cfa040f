//! A loaded model of any architecture: the shared pre-norm [`Decoder`]
//! (Llama, Mistral, Qwen2, Qwen3, Phi-3) or a family with blocks of its own.
//! Every variant has the same four operations, dispatched here.
use mlx_rs::Array;
use mlx_rs::error::Exception;

use super::bert::Bert;
use super::gemma2::Gemma2;
use super::gemma3::Gemma3;
use super::gemma4::Gemma4;
use super::glm4_moe_lite::Glm4MoeLite;
use super::gpt_oss::GptOss;
use super::layers::decoder::Decoder;
use crate::cache::{CacheKind, LayerCache};

/// The model's layers.
pub enum Network {
    Decoder(Decoder),
    Gemma3(Gemma3),
    Gemma2(Gemma2),
    Gemma4(Gemma4),
    GptOss(GptOss),
    Glm4MoeLite(Glm4MoeLite),
    /// An encoder: it embeds ([`Bert::forward`]); it has no caches and
    /// no vocabulary head, so `forward` and `logits` refuse.
    Bert(Bert),
}

fn encoder_only() -> Exception {
    Exception::custom("an encoder model embeds; it does not generate")
}

impl Network {
    /// Runs `tokens` (`[B, L]` int32) through every layer, appending to
    /// `caches` (one per layer), and returns the final hidden states.
    pub fn forward<C: LayerCache>(
        &self,
        tokens: &Array,
        caches: &mut [C],
    ) -> Result<Array, Exception> {
        match self {
            Network::Decoder(m) => m.forward(tokens, caches),
            Network::Gemma3(m) => m.forward(tokens, caches),
            Network::Gemma2(m) => m.forward(tokens, caches),
            Network::Gemma4(m) => m.forward(tokens, caches),
            Network::GptOss(m) => m.forward(tokens, caches),
            Network::Glm4MoeLite(m) => m.forward(tokens, caches),
            Network::Bert(_) => Err(encoder_only()),
        }
    }

    /// One decode step of `tokens` (`[B]` uint32) by Grove's CUDA decode
    /// step: the logits `[B, V]`, the caches written. `None` (nothing
    /// changed) where the step is not taken: not on a CUDA GPU, a family,
    /// model or batch it does not cover; then the caller runs
    /// [`Self::forward`].
    pub fn fast_decode<C: crate::cache::DecodeSlots>(
        &self,
        tokens: &Array,
        caches: &mut [C],
    ) -> Result<Option<Array>, Exception> {
        match self {
            Network::Decoder(m) => match m.fast_decode() {
                Some(f) => f.step(tokens, caches),
                None => Ok(None),
            },
            _ => Ok(None),
        }
    }

    /// The group the model is split over, if any.
    pub fn shard(&self) -> Option<&std::sync::Arc<crate::shard::Comm>> {
        match self {
            Network::Decoder(m) => m.shard(),
            Network::GptOss(m) => m.shard(),
            Network::Glm4MoeLite(m) => m.shard(),
            _ => None,
        }
    }

    /// Vocabulary logits of hidden states.
    pub fn logits(&self, hidden: &Array) -> Result<Array, Exception> {
        match self {
            Network::Decoder(m) => m.logits(hidden),
            Network::Gemma3(m) => m.logits(hidden),
            Network::Gemma2(m) => m.logits(hidden),
            Network::Gemma4(m) => m.logits(hidden),
            Network::GptOss(m) => m.logits(hidden),
            Network::Glm4MoeLite(m) => m.logits(hidden),
            Network::Bert(_) => Err(encoder_only()),
        }
    }

    /// Each layer's kind of cache.
    pub fn kinds(&self) -> &[CacheKind] {
        match self {
            Network::Decoder(m) => m.kinds(),
            Network::Gemma3(m) => &m.dims().kinds,
            Network::Gemma2(m) => &m.dims().kinds,
            Network::Gemma4(m) => &m.dims().kinds,
            Network::GptOss(m) => &m.dims().kinds,
            Network::Glm4MoeLite(m) => &m.dims().kinds,
            Network::Bert(m) => &m.dims().kinds,
        }
    }

    /// Number of layers (Gemma 4's shared layers keep no cache, so it may
    /// be more than the caches a forward pass needs: `kinds().len()`).
    pub fn num_layers(&self) -> usize {
        match self {
            Network::Gemma4(m) => m.num_layers(),
            Network::Bert(m) => m.num_layers(),
            _ => self.kinds().len(),
        }
    }

    /// Every weight array.
    pub fn parameters(&self) -> Vec<&Array> {
        match self {
            Network::Decoder(m) => m.parameters(),
            Network::Gemma3(m) => m.parameters(),
            Network::Gemma2(m) => m.parameters(),
            Network::Gemma4(m) => m.parameters(),
            Network::GptOss(m) => m.parameters(),
            Network::Glm4MoeLite(m) => m.parameters(),
            Network::Bert(m) => m.parameters(),
        }
    }

    /// The routed experts' arrays and the share of them a token uses, per
    /// sparse layer (none for a dense model).
    pub fn expert_parameters(&self) -> Vec<(Vec<&Array>, f64)> {
        match self {
            Network::Decoder(m) => m.expert_parameters(),
            Network::GptOss(m) => m.expert_parameters(),
            Network::Glm4MoeLite(m) => m.expert_parameters(),
            _ => Vec::new(),
        }
    }

    /// The dtype activations are computed in.
    pub fn compute_dtype(&self) -> mlx_rs::Dtype {
        match self {
            Network::Decoder(m) => m.compute_dtype(),
            Network::Gemma3(m) => m.compute_dtype(),
            Network::Gemma2(m) => m.compute_dtype(),
            Network::Gemma4(m) => m.compute_dtype(),
            Network::GptOss(m) => m.compute_dtype(),
            Network::Glm4MoeLite(m) => m.compute_dtype(),
            Network::Bert(m) => m.compute_dtype(),
        }
    }
}
