//! One prefill pass of a sequence alone: the next chunk of its prompt into
//! its own caches, and what the sequence does next (another chunk, join the
//! batch, or its first token when the prompt is a single token).
use mlx_rs::Array;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::transforms::{async_eval, eval};

use super::sequence::Sequence;
use crate::cache::LayerKv;
use crate::error::{MlxPhase, Result};
use crate::generate::maybe_quantize;
use crate::model::Model;

/// What one prefill pass did.
pub(super) enum Advanced {
    /// Evaluated a chunk; more follow.
    Chunk,
    /// Everything but the last prompt token is in the caches: the sequence
    /// joins the batch with that token as its next input, so its first token
    /// comes from a batch step (as in mlx-lm's BatchGenerator).
    Join,
    /// Nothing was in the caches and the prompt is one token: it was
    /// evaluated alone and the first token sampled (`[1]`, dispatched).
    First(Array),
    /// A prewarm's whole prompt is in its caches.
    Prewarmed,
}

/// Evaluates the next chunk (at most `cap` tokens) of the sequence's prompt
/// into `caches`, and says what the sequence does next.
pub(super) fn advance(
    model: &Model,
    seq: &mut Sequence,
    caches: &mut [LayerKv],
    cap: usize,
) -> Result<Advanced> {
    let left = seq.left_to_prefill();
    if left > 0 {
        let n = left.min(seq.chunk).min(cap);
        let start = seq.prefilled;
        let chunk = Model::tokens_array(&seq.prompt[start..start + n]);
        let hidden = model.decoder.forward(&chunk, caches).phase("prefill")?;
        drop(hidden);
        seq.prefilled += n;
        // A quantized KV cache turns quantized where mlx-lm's prefill would
        // check: after each of the request's chunks (counted from what the
        // prompt cache gave) and after the whole prompt, never at the
        // shorter passes the engine takes while others decode.
        if (seq.prefilled - seq.cached).is_multiple_of(seq.chunk) || seq.left_to_prefill() == 0 {
            maybe_quantize(caches, seq.kv).phase("prefill")?;
        }
        eval(caches.iter().flat_map(LayerKv::arrays)).phase("prefill")?;
        mlx_rs::memory::clear_cache().phase("prefill")?;
    }
    if seq.left_to_prefill() > 0 {
        return Ok(Advanced::Chunk);
    }
    if seq.is_prewarm() {
        return Ok(Advanced::Prewarmed);
    }
    if seq.prefilled > 0 {
        return Ok(Advanced::Join);
    }
    let last = Model::tokens_array(&seq.prompt[seq.prompt.len() - 1..]);
    let hidden = model.decoder.forward(&last, caches).phase("prefill")?;
    maybe_quantize(caches, seq.kv).phase("prefill")?;
    let position = hidden.try_index((.., -1, ..)).phase("prefill")?;
    let logits = model.decoder.logits(&position).phase("prefill")?;
    let first = model.agree(seq.first_token(&logits)?).phase("prefill")?;
    async_eval([&first]).phase("prefill")?;
    seq.prefilled = seq.prompt.len();
    Ok(Advanced::First(first))
}
