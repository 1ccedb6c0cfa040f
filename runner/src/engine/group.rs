//! Prefilling several prompts in one forward pass, as mlx-lm's
//! `BatchGenerator` does with its `prefill_batch_size`: fresh prompts (no
//! prompt-cache prefix, not a prewarm) that wait together are left-padded to
//! one length and evaluated as `[K, columns]` chunks over a left-padded
//! [`BatchKvCache`] (pad slots masked from every real token; rotary positions
//! per row start at each prompt's first token). Once every prompt but its
//! last token is in, the group merges into the decode batch, each row with
//! its last prompt token as its next input, exactly as a sequence prefilled
//! alone joins it. On a GPU a pass costs about the same for 1 or 8 prompts,
//! so a burst of requests reaches its first tokens several times sooner.
use std::collections::VecDeque;

use mlx_rs::Array;
use mlx_rs::transforms::eval;

use super::sequence::Sequence;
use super::worker::Prefilling;
use crate::cache::{BatchKvCache, CacheKind};
use crate::error::{MlxPhase, Result};
use crate::model::Model;

/// Most prompts prefilled together (mlx-lm's default `prefill_batch_size`).
pub const GROUP_MAX: usize = 8;

/// Prompts being prefilled together.
pub struct Group {
    rows: Vec<Sequence>,
    layers: Vec<BatchKvCache>,
    /// Each row's prompt but its last token, left-padded (with 0) to `len`.
    tokens: Vec<Vec<u32>>,
    /// Pad slots before each row's first token.
    pads: Vec<usize>,
    /// Columns evaluated so far.
    done: usize,
    len: usize,
    /// Fewest prompt tokens per pass any row asked for.
    chunk: usize,
}

/// Whether a waiting sequence can be prefilled in a group: nothing of it is
/// evaluated (no prompt-cache prefix), it samples (not a prewarm), and it has
/// a prompt to prefill before its last token.
fn fresh(p: &Prefilling) -> bool {
    let s = &p.sequence;
    s.prefilled == 0 && !s.is_prewarm() && s.prompt.len() >= 2 && !s.gone()
}

impl Group {
    /// Takes up to [`GROUP_MAX`] fresh sequences from `prefilling`, oldest
    /// first, when the oldest is fresh and at least one more is.
    pub fn form(prefilling: &mut VecDeque<Prefilling>, kinds: &[CacheKind]) -> Option<Group> {
        if !prefilling.front().is_some_and(fresh) {
            return None;
        }
        let kv = prefilling.front().map(|p| p.sequence.kv);
        let picked: Vec<usize> = (0..prefilling.len())
            .filter(|&i| fresh(&prefilling[i]) && Some(prefilling[i].sequence.kv) == kv)
            .take(GROUP_MAX)
            .collect();
        if picked.len() < 2 {
            return None;
        }
        let mut rows = Vec::with_capacity(picked.len());
        for &i in picked.iter().rev() {
            if let Some(p) = prefilling.remove(i) {
                rows.push(p.sequence);
            }
        }
        rows.reverse();
        let len = rows.iter().map(|s| s.prompt.len() - 1).max().unwrap_or(0);
        let pads: Vec<usize> = rows.iter().map(|s| len - (s.prompt.len() - 1)).collect();
        let tokens = rows
            .iter()
            .zip(&pads)
            .map(|(s, &pad)| {
                let mut t = vec![0u32; pad];
                t.extend_from_slice(&s.prompt[..s.prompt.len() - 1]);
                t
            })
            .collect();
        let chunk = rows.iter().map(|s| s.chunk).min().unwrap_or(1).max(1);
        let left: Vec<i32> = pads.iter().map(|&p| p as i32).collect();
        Some(Group {
            layers: kinds
                .iter()
                .map(|&k| BatchKvCache::with_padding(left.clone(), k))
                .collect(),
            rows,
            tokens,
            pads,
            done: 0,
            len,
            chunk,
        })
    }

    /// Sequences in the group.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// The sequences, in row order.
    pub fn rows(&self) -> &[Sequence] {
        &self.rows
    }

    /// Latches the rows rank 0 named as gone (a group's lockstep).
    pub fn mark_gone(&mut self, ids: &[u64]) {
        for row in self.rows.iter_mut().filter(|r| ids.contains(&r.id)) {
            row.mark_gone();
        }
    }

    /// True when every client has gone away.
    pub fn abandoned(&self) -> bool {
        self.rows.iter().all(Sequence::gone)
    }

    /// The buffers that survive a pass.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.layers.iter().flat_map(BatchKvCache::arrays)
    }

    /// Bytes of the buffers.
    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(BatchKvCache::nbytes).sum()
    }

    /// Evaluates the next columns, at most `budget` tokens in all (at least
    /// one column). Returns true when every prompt is in.
    pub fn advance(&mut self, model: &Model, budget: usize) -> Result<bool> {
        let k = self.rows.len();
        let columns = (budget.min(self.chunk * k) / k)
            .max(1)
            .min(self.len - self.done);
        let (start, end) = (self.done, self.done + columns);
        let ids: Vec<i32> = self
            .tokens
            .iter()
            .flat_map(|t| t[start..end].iter().map(|&id| id as i32))
            .collect();
        let chunk = Array::from_slice(&ids, &[k as i32, columns as i32]);
        for layer in &mut self.layers {
            layer.slide().phase("prefill")?;
        }
        let hidden = model
            .decoder
            .forward(&chunk, &mut self.layers)
            .phase("prefill")?;
        drop(hidden);
        // Quantized at the request's chunk boundaries and at the end, as a
        // prompt prefilled alone is (see the worker's `advance`).
        if end.is_multiple_of(self.chunk) || end == self.len {
            let kv = self.rows.first().and_then(|r| r.kv);
            for layer in &mut self.layers {
                layer.maybe_quantize(kv).phase("prefill")?;
            }
        }
        eval(self.arrays()).phase("prefill")?;
        mlx_rs::memory::clear_cache().phase("prefill")?;
        self.done = end;
        for (row, &pad) in self.rows.iter_mut().zip(&self.pads) {
            row.prefilled = end.saturating_sub(pad);
        }
        Ok(self.done == self.len)
    }

    /// The sequences and their caches, once every prompt is in.
    pub fn into_parts(self) -> (Vec<Sequence>, Vec<BatchKvCache>) {
        (self.rows, self.layers)
    }

    /// The sequences, to be failed or ended.
    pub fn into_rows(self) -> Vec<Sequence> {
        self.rows
    }
}
