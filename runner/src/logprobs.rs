//! Log-probabilities of generated tokens (a request's `top_logprobs`): the
//! log-softmax of the logits a token was drawn from, its value and the most
//! likely tokens, computed lazily with the step and read back with the token.
use mlx_rs::error::Result as MlxResult;
use mlx_rs::ops::argpartition_axis;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{Array, Dtype};

use crate::error::{MlxPhase, Result};

const PHASE: &str = "log-probabilities";

/// A generated token's log-probability and the most likely tokens at its
/// step (most likely first; ties by id).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// One step's log-probabilities, not evaluated yet: the sampled token's
/// (`[1, 1]`) and, when asked for, the `n` largest with their ids (`[1, n]`).
#[derive(Debug)]
pub struct PendingLogprob {
    chosen: Array,
    top: Option<(Array, Array)>,
}

/// The log-probabilities of `token` (`[1]` uint32) and of the `top` most
/// likely tokens under `logits` (`[1, V]`, those the token was drawn from):
/// log-softmax in float32, before temperature and the top-k/top-p/min-p
/// filters, as mlx-lm's `GenerationResponse.logprobs`.
pub fn token_logprobs(logits: &Array, token: &Array, top: usize) -> Result<PendingLogprob> {
    let lazy = || -> MlxResult<PendingLogprob> {
        let x = logits.as_dtype(Dtype::Float32)?;
        let lp = x.subtract(x.logsumexp_axis(-1, true)?)?;
        let idx = token.reshape(&[1, 1])?.as_dtype(Dtype::Int32)?;
        let chosen = lp.take_along_axis(&idx, -1)?;
        let vocab = lp.shape()[1];
        let n = top.min(vocab as usize) as i32;
        let top = if n == 0 {
            None
        } else {
            // The n largest are the last n of the partition at vocab - n
            // (no negated copy of the vocabulary's values).
            let order = argpartition_axis(&lp, vocab - n, -1)?;
            let ids = order.try_index((.., vocab - n..))?;
            let values = lp.take_along_axis(&ids, -1)?;
            Some((ids.as_dtype(Dtype::Uint32)?, values))
        };
        Ok(PendingLogprob { chosen, top })
    };
    lazy().phase(PHASE)
}

impl PendingLogprob {
    /// Its arrays, to evaluate with the step's tokens.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        std::iter::once(&self.chosen).chain(self.top.iter().flat_map(|(i, v)| [i, v]))
    }

    /// The values for token `id` (evaluated here if the step has not yet).
    pub fn read(&self, id: u32) -> Result<TokenLogprob> {
        let read = || -> MlxResult<TokenLogprob> {
            mlx_rs::transforms::eval(self.arrays())?;
            let logprob = self
                .chosen
                .as_slice::<f32>()
                .first()
                .copied()
                .unwrap_or(f32::NAN);
            let mut top: Vec<(u32, f32)> = match &self.top {
                Some((ids, values)) => ids
                    .as_slice::<u32>()
                    .iter()
                    .copied()
                    .zip(values.as_slice::<f32>().iter().copied())
                    .collect(),
                None => Vec::new(),
            };
            top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            Ok(TokenLogprob { id, logprob, top })
        };
        read().phase(PHASE)
    }
}
