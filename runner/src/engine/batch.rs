//! The decode batch: every sequence past its prefill advances by one token in
//! one forward pass per step (`[B, 1]` tokens over the layers'
//! [`BatchKvCache`]s). Steps are pipelined as mlx-lm's `GenerationBatch`:
//! step n + 1 is dispatched before step n's tokens are read back, so the
//! device never waits for the host. Sequences join between steps (their
//! prefilled cache appended, their first token added to the input) and leave
//! as soon as their token says so (their rows filtered out of the caches and
//! of the step already in flight).
use mlx_rs::Array;
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::transforms::{async_eval, eval};

use super::prompt_cache::Checkpoint;
use super::sequence::{Progress, Sequence};
use crate::cache::{BatchKvCache, CacheKind, KvSetting, LayerKv};
use crate::error::{MlxPhase, Result};
use crate::generate::FinishReason;
use crate::logprobs::{PendingLogprob, token_logprobs};
use crate::model::Model;
use crate::sample::greedy_tokens;

/// A sequence that left the batch, with how it ended.
pub struct Left {
    pub sequence: Sequence,
    pub outcome: Progress,
    /// Its KV (prompt and the generated tokens that are text), when it ended
    /// normally: a candidate for the prompt cache, with the checkpoint of its
    /// windowed layers taken at the end of its prompt, and the tokens it
    /// holds beyond the prompt and the text (a fed EOS that a recurrent
    /// state has taken in and cannot give back).
    pub cache: Option<(Vec<LayerKv>, Option<Checkpoint>, Vec<u32>)>,
}

/// The running batch.
pub struct Batch {
    layers: Vec<BatchKvCache>,
    rows: Vec<Sequence>,
    /// The tokens to feed next, `[B]` uint32: each row's last sampled token,
    /// not yet fed and not yet read back.
    next: Option<Array>,
    /// In a group, rank 0's "news follows" flag sent with `next` (`[1]`);
    /// `None` alone, or when `next` came from a prefill.
    next_news: Option<Array>,
    /// The flag read back by the last step (`None`: that step read none).
    news_read: Option<bool>,
    /// The KV setting every row shares (taken from the first to join).
    kv: Option<KvSetting>,
}

impl Batch {
    /// An empty batch for a model whose layers are of `kinds`.
    pub fn new(kinds: &[CacheKind]) -> Self {
        Self {
            layers: kinds.iter().map(|&k| BatchKvCache::new(k)).collect(),
            rows: Vec::new(),
            next: None,
            next_news: None,
            news_read: None,
            kv: None,
        }
    }

    /// What the step since the last call read of rank 0's "news follows"
    /// flag (in a group; `None` when none was read, or no step ran): the
    /// engine's next turn starts with rank 0's tick only when it is set
    /// (`engine::lockstep`).
    pub fn take_news_read(&mut self) -> Option<bool> {
        self.news_read.take()
    }

    /// The KV setting of the rows, while there are any.
    pub fn kv(&self) -> Option<Option<KvSetting>> {
        (!self.rows.is_empty()).then_some(self.kv)
    }

    /// Sequences decoding.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when nothing decodes.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
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

    /// Bytes of the layers' buffers and of the rows' checkpoints.
    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(BatchKvCache::nbytes).sum::<usize>()
            + self
                .rows
                .iter()
                .filter_map(|r| r.checkpoint.as_ref())
                .map(Checkpoint::nbytes)
                .sum::<usize>()
    }

    /// The arrays that survive a step: the caches, the rows' checkpoints and
    /// the tokens in flight.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.layers
            .iter()
            .flat_map(BatchKvCache::arrays)
            .chain(
                self.rows
                    .iter()
                    .filter_map(|r| r.checkpoint.as_ref())
                    .flat_map(Checkpoint::arrays),
            )
            .chain(self.next.iter())
            .chain(
                self.rows
                    .iter()
                    .flat_map(|r| r.lp_fed.iter().chain(&r.lp_sampled))
                    .flat_map(PendingLogprob::arrays),
            )
    }

    /// Adds a prefilled sequence: its caches (one per layer) and its next
    /// input: its first sampled token (`[1]`, maybe not evaluated yet), or
    /// with `None` its last prompt token, whose logits the next step samples
    /// the first token from. A model with windowed layers keeps them as the
    /// sequence's checkpoint (the end of its prompt).
    pub fn join(
        &mut self,
        mut sequence: Sequence,
        caches: Vec<LayerKv>,
        first: Option<Array>,
    ) -> Result<()> {
        if self.rows.is_empty() {
            self.kv = sequence.kv;
        }
        for (layer, cache) in self.layers.iter_mut().zip(&caches) {
            layer.extend_from(cache).phase("joining the batch")?;
        }
        if !sequence.is_prewarm() {
            let held = caches.first().map_or(0, LayerKv::offset) as usize;
            sequence.checkpoint = Checkpoint::of(&caches, held).phase("joining the batch")?;
        }
        drop(caches);
        let first = match first {
            Some(first) => first.reshape(&[1]).phase("joining the batch")?,
            None => {
                sequence.feed_prompt_tail();
                let last = sequence.prompt.len() - 1;
                Array::from_slice(&sequence.prompt[last..], &[1])
            }
        };
        self.next = Some(match self.next.take() {
            Some(next) => concatenate(&[next, first], 0).phase("joining the batch")?,
            None => first,
        });
        self.rows.push(sequence);
        Ok(())
    }

    /// Adds a group of sequences prefilled together (their prompts but the
    /// last token in `layers`); each row's next input is its last prompt
    /// token, as with [`Batch::join`] and `None`.
    pub fn join_group(&mut self, rows: Vec<Sequence>, layers: Vec<BatchKvCache>) -> Result<()> {
        if self.rows.is_empty()
            && let Some(first) = rows.first()
        {
            self.kv = first.kv;
        }
        for (layer, group) in self.layers.iter_mut().zip(&layers) {
            layer.merge(group).phase("joining the batch")?;
        }
        let mut checkpoints = Vec::with_capacity(rows.len());
        for (row, sequence) in rows.iter().enumerate() {
            let held = sequence.prompt.len() - 1;
            checkpoints
                .push(Checkpoint::from_batch(&layers, row, held).phase("joining the batch")?);
        }
        drop(layers);
        let mut inputs = Vec::with_capacity(rows.len() + 1);
        inputs.extend(self.next.take());
        for (mut sequence, checkpoint) in rows.into_iter().zip(checkpoints) {
            sequence.checkpoint = checkpoint;
            sequence.feed_prompt_tail();
            let last = sequence.prompt.len() - 1;
            inputs.push(Array::from_slice(&sequence.prompt[last..], &[1]));
            self.rows.push(sequence);
        }
        self.next = Some(concatenate(&inputs, 0).phase("joining the batch")?);
        Ok(())
    }

    /// One decode step: feeds every row's pending token, dispatches the next,
    /// reads the pending tokens back and hands them to their sequences.
    /// Returns the sequences that left. In a group, `news` (rank 0's: it
    /// has a tick to send) goes with the sampled tokens.
    pub fn step(&mut self, model: &Model, news: bool) -> Result<Vec<Left>> {
        self.news_read = None;
        let Some(y) = self.next.take() else {
            return Ok(Vec::new());
        };
        let y_news = self.next_news.take();
        let b = self.rows.len() as i32;
        for layer in &mut self.layers {
            layer.slide().phase("decode")?;
        }
        // 1. Forward the pending tokens; logits of the one position, [B, V]:
        //    Grove's CUDA decode step where it covers the model and batch,
        //    else MLX's ops.
        let fast = model
            .decoder
            .fast_decode(&y, &mut self.layers)
            .phase("decode")?;
        let mut logits = match fast {
            Some(logits) => logits,
            None => {
                let inputs = y.reshape(&[b, 1]).phase("decode")?;
                let hidden = model
                    .decoder
                    .forward(&inputs, &mut self.layers)
                    .phase("decode")?;
                let last = hidden.try_index((.., -1, ..)).phase("decode")?;
                model.decoder.logits(&last).phase("decode")?
            }
        };
        for layer in &mut self.layers {
            layer.maybe_quantize(self.kv).phase("decode")?;
        }
        // Structured output: the rows' grammars take the tokens being fed
        // (read back now, while the forward runs) and mask the logits.
        let mut read_back = None;
        if self.rows.iter().any(|r| r.grammar.is_some()) {
            async_eval([&logits]).phase("decode")?;
            eval([&y]).phase("decode")?;
            let fed: Vec<u32> = y.as_slice::<u32>().to_vec();
            let v = logits.shape()[1] as usize;
            let mut masks = vec![0f32; self.rows.len() * v];
            for (i, row) in self.rows.iter_mut().enumerate() {
                if let Some(mask) = row.constraint_mask(fed.get(i).copied())? {
                    masks[i * v..(i + 1) * v].copy_from_slice(&mask[..v.min(mask.len())]);
                }
            }
            let masks = Array::from_slice(&masks, &[b, v as i32]);
            logits = logits.add(&masks).phase("decode")?;
            read_back = Some(fed);
        }
        // 2. Sample every row: one argmax when all are plain greedy, else
        //    each row with its own sampler (its seed, its penalties).
        let plain = self
            .rows
            .iter()
            .all(|r| r.sampler.is_greedy() && !r.sampler.has_processors());
        let mut processed = Vec::new();
        let next = if plain {
            greedy_tokens(&logits).phase("decode")?
        } else {
            let mut picked = Vec::with_capacity(self.rows.len());
            for (i, row) in self.rows.iter_mut().enumerate() {
                let i = i as i32;
                let row_logits = logits.try_index(i..i + 1).phase("decode")?;
                let pending = y.try_index(i..i + 1).phase("decode")?;
                let (token, drawn_from) =
                    row.sampler
                        .sample_processed(&row_logits, &row.history, Some(&pending))?;
                picked.push(token.reshape(&[1]).phase("decode")?);
                processed.push(drawn_from);
            }
            concatenate(&picked, 0).phase("decode")?
        };
        let (next, next_news) = model.agree_flagged(next, news).phase("decode")?;
        // Log-probabilities of what was sampled, for the rows that ask.
        for (i, row) in self.rows.iter_mut().enumerate() {
            let Some(n) = row.logprobs else { continue };
            let at = i as i32;
            let drawn_from = match processed.get(i) {
                Some(p) => p.clone(),
                None => logits.try_index(at..at + 1).phase("decode")?,
            };
            let token = next.try_index(at..at + 1).phase("decode")?;
            row.lp_sampled = Some(token_logprobs(&drawn_from, &token, n)?);
        }
        let lp_sampled = self
            .rows
            .iter()
            .filter_map(|r| r.lp_sampled.as_ref())
            .flat_map(PendingLogprob::arrays);
        async_eval(std::iter::once(&next).chain(&next_news).chain(lp_sampled)).phase("decode")?;
        // 3. Read the pending tokens back (the next step is already running).
        let tokens: Vec<u32> = match read_back {
            Some(tokens) => tokens,
            None => {
                eval([&y]).phase("decode")?;
                y.as_slice::<u32>().to_vec()
            }
        };
        if let Some(flag) = y_news {
            eval([&flag]).phase("decode")?;
            self.news_read = Some(flag.as_slice::<u32>().first().is_some_and(|&f| f != 0));
        }
        // (on_fed reads each token's log-probabilities, where asked for:
        // computed with the step before, already done.)
        let mut outcomes = Vec::with_capacity(self.rows.len());
        for (row, &token) in self.rows.iter_mut().zip(&tokens) {
            let mut outcome = row.on_fed(token);
            if outcome == Progress::Continue && row.gone() {
                outcome = Progress::Gone;
            }
            outcomes.push(outcome);
            row.lp_fed = row.lp_sampled.take();
        }
        // 4. Rows that ended leave, from the caches and from the step in flight.
        if outcomes.iter().all(|o| *o == Progress::Continue) {
            self.next = Some(next);
            self.next_news = next_news;
            return Ok(Vec::new());
        }
        let mut left = Vec::new();
        let mut keep = Vec::new();
        for (i, outcome) in outcomes.iter().enumerate() {
            match outcome {
                Progress::Continue => keep.push(i),
                Progress::Finished(_) => {
                    let row = &mut self.rows[i];
                    // The cache holds the prompt and every token fed; a fed
                    // EOS is not text and is not kept.
                    let mut held = (row.prompt.len() + row.fed.min(row.tokens.len())) as i32;
                    // A recurrent state cannot go back: where it took in
                    // the EOS, the entry keeps the EOS too.
                    let mut tail = Vec::new();
                    if row.fed > row.tokens.len()
                        && self.layers.iter().any(|l| l.kind() == CacheKind::Recurrent)
                    {
                        held += 1;
                        tail.push(tokens[i]);
                    }
                    let mut caches = Vec::with_capacity(self.layers.len());
                    for layer in &self.layers {
                        caches.push(layer.extract(i, held).phase("leaving the batch")?);
                    }
                    // A windowed layer that no longer holds its window
                    // cannot be cached.
                    let caches: Option<Vec<LayerKv>> = caches.into_iter().collect();
                    if let Some(caches) = &caches {
                        // Copied as soon as the step in flight is done:
                        // unevaluated, the copies would keep the whole batch
                        // buffers alive through their graph.
                        async_eval(caches.iter().flat_map(LayerKv::arrays))
                            .phase("leaving the batch")?;
                    }
                    let checkpoint = row.checkpoint.take();
                    left.push((i, caches.map(|c| (c, checkpoint, tail))));
                }
                Progress::Gone => left.push((i, None)),
            }
        }
        for layer in &mut self.layers {
            layer.filter(&keep).phase("leaving the batch")?;
        }
        // Likewise the compacted buffers, so the old ones go.
        async_eval(self.layers.iter().flat_map(BatchKvCache::arrays)).phase("leaving the batch")?;
        let keep_rows = Array::from_slice(
            &keep.iter().map(|&i| i as i32).collect::<Vec<_>>(),
            &[keep.len() as i32],
        );
        self.next = if keep.is_empty() {
            None
        } else {
            self.next_news = next_news;
            Some(next.take_axis(&keep_rows, 0).phase("leaving the batch")?)
        };
        let mut rows: Vec<Option<Sequence>> = std::mem::take(&mut self.rows)
            .into_iter()
            .map(Some)
            .collect();
        let mut out = Vec::new();
        for (i, cache) in left {
            if let Some(sequence) = rows[i].take() {
                out.push(Left {
                    sequence,
                    outcome: outcomes[i],
                    cache,
                });
            }
        }
        self.rows = rows.into_iter().flatten().collect();
        Ok(out)
    }

    /// Empties the batch; the sequences are returned to be failed or ended.
    pub fn drain(&mut self) -> Vec<Sequence> {
        for layer in &mut self.layers {
            *layer = BatchKvCache::new(layer.kind());
        }
        self.next = None;
        self.next_news = None;
        std::mem::take(&mut self.rows)
    }
}

/// Why a sequence that left ended, for its Done message.
pub fn reason(outcome: Progress) -> FinishReason {
    match outcome {
        Progress::Finished(r) => r,
        Progress::Continue | Progress::Gone => FinishReason::Cancelled,
    }
}
