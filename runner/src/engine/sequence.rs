//! One request in the engine: its prompt, sampler, limits, streaming text
//! (detokenizer and stop strings), timings, and the channel its events go to.
//! Everything here is per request, so a request in a batch behaves as it
//! would alone: its own seed, penalties over its own history, its own stops.
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx_rs::Array;
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};

use super::prompt_cache::Checkpoint;
use super::{Event, Metrics, Prewarmed};
use crate::cache::KvSetting;
use crate::detokenize::{Detokenizer, TokenTable};
use crate::error::{MlxPhase, Result, RunnerError};
use crate::generate::FinishReason;
use crate::grammar::Grammar;
use crate::logprobs::{PendingLogprob, TokenLogprob, token_logprobs};
use crate::sample::Sampler;
use crate::stop::StopMatcher;

/// Who is waiting for the sequence.
pub enum Client {
    /// A generation: its events stream back.
    Generate(mpsc::Sender<Event>),
    /// A prewarm: the prompt goes into the prompt cache, then one reply.
    Prewarm(oneshot::Sender<Result<Prewarmed>>),
}

/// What a token did to its sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Continue,
    /// The sequence ended (EOS, a stop string, the token limit or the context).
    Finished(FinishReason),
    /// The client went away.
    Gone,
}

/// One request's state.
pub struct Sequence {
    /// Its number in a group's lockstep (0 alone).
    pub id: u64,
    /// In a group's lockstep: whether rank 0 said its client has gone (the
    /// one view of it every rank shares); `None`: alone, asked live.
    latched: Option<bool>,
    client: Client,
    pub prompt: Vec<u32>,
    /// Prompt tokens reused from the prompt cache.
    pub cached: usize,
    /// Of `cached`: loaded from the SSD tier.
    pub cached_from_disk: usize,
    /// Prompt tokens evaluated into its cache so far (prefill progress).
    pub prefilled: usize,
    /// Tokens per prefill forward pass.
    pub chunk: usize,
    /// Most tokens to generate (already capped by the context).
    pub max_tokens: usize,
    pub sampler: Sampler,
    /// Prompt and generated ids, for the penalties (empty when none is on).
    pub history: Vec<u32>,
    eos: Arc<[u32]>,
    detokenizer: Detokenizer,
    stops: StopMatcher,
    /// Generated ids read back (EOS excluded).
    pub tokens: Vec<u32>,
    /// Generated ids fed back into the KV cache.
    pub fed: usize,
    started: Instant,
    first_at: Option<Instant>,
    /// The batch's next input for this sequence is its last prompt token
    /// (it joined with it), not a generated one.
    prompt_pending: bool,
    _slot: Option<OwnedSemaphorePermit>,
    /// The windowed layers at the end of the prompt (models with sliding
    /// windows), for the prompt cache.
    pub checkpoint: Option<Checkpoint>,
    /// Its KV cache: full precision, or quantized from a start.
    pub kv: Option<KvSetting>,
    /// Text waiting for a client that reads slowly (never blocks the batch).
    outbox: String,
    stopped_by_string: bool,
    /// Structured output: the tokens the sampler may pick, step by step.
    pub grammar: Option<Grammar>,
    /// Log-probabilities wanted, with this many alternatives a token.
    pub logprobs: Option<usize>,
    /// Those of the token being fed (read back with it), and of the token
    /// the step in flight sampled.
    pub lp_fed: Option<PendingLogprob>,
    pub lp_sampled: Option<PendingLogprob>,
    /// Log-probabilities waiting for the client, as `outbox`.
    lp_outbox: Vec<TokenLogprob>,
}

/// Everything a sequence needs to be made.
pub struct Spec {
    pub id: u64,
    /// The sequence runs in a group's lockstep.
    pub lockstep: bool,
    pub client: Client,
    pub prompt: Vec<u32>,
    pub cached: usize,
    pub chunk: usize,
    pub max_tokens: usize,
    pub sampler: Sampler,
    pub eos: Arc<[u32]>,
    pub table: Arc<TokenTable>,
    pub stops: Vec<String>,
    /// The request's place in the runner (parallel + queue); freed when the
    /// sequence is dropped.
    pub slot: Option<OwnedSemaphorePermit>,
    pub kv: Option<KvSetting>,
    pub grammar: Option<Grammar>,
    pub logprobs: Option<usize>,
}

impl Sequence {
    /// A sequence whose first `cached` prompt tokens are already in its cache.
    pub fn new(spec: Spec) -> Result<Self> {
        let history = if spec.sampler.uses_history() {
            spec.prompt.clone()
        } else {
            Vec::new()
        };
        Ok(Self {
            id: spec.id,
            latched: spec.lockstep.then_some(false),
            client: spec.client,
            cached: spec.cached,
            cached_from_disk: 0,
            prefilled: spec.cached,
            chunk: spec.chunk.max(1),
            max_tokens: spec.max_tokens,
            sampler: spec.sampler,
            history,
            eos: spec.eos,
            detokenizer: Detokenizer::with_table(spec.table),
            stops: StopMatcher::new(spec.stops)?,
            tokens: Vec::new(),
            fed: 0,
            started: Instant::now(),
            first_at: None,
            prompt_pending: false,
            checkpoint: None,
            kv: spec.kv,
            outbox: String::new(),
            stopped_by_string: false,
            grammar: spec.grammar,
            logprobs: spec.logprobs,
            lp_fed: None,
            lp_sampled: None,
            lp_outbox: Vec::new(),
            prompt: spec.prompt,
            _slot: spec.slot,
        })
    }

    /// Whether this is a prewarm (prefill only, into the prompt cache).
    pub fn is_prewarm(&self) -> bool {
        matches!(self.client, Client::Prewarm(_))
    }

    /// Whether the client has gone away (in a group's lockstep: whether
    /// rank 0 said so).
    pub fn gone(&self) -> bool {
        self.latched.unwrap_or_else(|| self.live_gone())
    }

    /// Marks the client gone (a group's lockstep, as rank 0 said).
    pub fn mark_gone(&mut self) {
        self.latched = Some(true);
    }

    /// Whether the client has gone away, asked now.
    pub fn live_gone(&self) -> bool {
        match &self.client {
            Client::Generate(events) => events.is_closed(),
            Client::Prewarm(reply) => reply.is_closed(),
        }
    }

    /// Prompt tokens still to evaluate in chunks: all but the last one, whose
    /// logits give the first token (a prewarm samples nothing: all of them).
    pub fn left_to_prefill(&self) -> usize {
        let chunked = if self.is_prewarm() {
            self.prompt.len()
        } else {
            self.prompt.len() - 1
        };
        chunked - self.prefilled.min(chunked)
    }

    /// Tokens the sequence may come to hold: prompt and generation.
    pub fn reserved(&self) -> usize {
        self.prompt.len().saturating_add(self.max_tokens)
    }

    /// Samples the first token from the last prompt position's logits.
    pub fn first_token(&mut self, logits: &Array) -> Result<Array> {
        let logits = match self.constraint_mask(None)? {
            Some(row) => {
                let mask = Array::from_slice(&row, &[1, row.len() as i32]);
                logits.add(&mask).phase("constraining the output")?
            }
            None => logits.clone(),
        };
        let (token, processed) = self
            .sampler
            .sample_processed(&logits, &self.history, None)?;
        if let Some(n) = self.logprobs {
            self.lp_fed = Some(token_logprobs(&processed, &token, n)?);
        }
        Ok(token)
    }

    /// Structured output: advances the grammar past `fed` (the token the
    /// batch just read back for this row, unless it is the prompt's last
    /// one or an end of sequence) and returns the next token's additive
    /// mask (0 or -inf per logit).
    pub fn constraint_mask(&mut self, fed: Option<u32>) -> Result<Option<Vec<f32>>> {
        let Some(grammar) = self.grammar.as_mut() else {
            return Ok(None);
        };
        let mut advanced = Ok(());
        if let Some(token) = fed
            && !self.prompt_pending
            && !self.eos.contains(&token)
        {
            advanced = grammar.consume(token);
        }
        match advanced.and_then(|()| grammar.mask()) {
            Ok(mask) => Ok(Some(mask)),
            // Masks keep the grammar from failing; should it fail anyway,
            // this row ends (only end of sequence is left), not the batch.
            Err(e) => {
                eprintln!("grove-runner: the output constraint failed: {e}; ending the reply");
                let mut mask = vec![f32::NEG_INFINITY; grammar.vocab()];
                for &id in self.eos.iter() {
                    if let Some(v) = mask.get_mut(id as usize) {
                        *v = 0.0;
                    }
                }
                Ok(Some(mask))
            }
        }
    }

    /// Joins the batch with the last prompt token as its next input: until
    /// it is read back, the penalties see it as the pending token, not as
    /// history.
    pub fn feed_prompt_tail(&mut self) {
        self.prompt_pending = true;
        if self.sampler.uses_history() {
            self.history.pop();
        }
    }

    /// The batch read back what it fed: the last prompt token (nothing to
    /// emit) or a generated token (with its log-probabilities, evaluated by
    /// the batch, when they are wanted).
    pub fn on_fed(&mut self, token: u32) -> Progress {
        if let Some(lp) = self.lp_fed.take() {
            match lp.read(token) {
                Ok(lp) => self.lp_outbox.push(lp),
                Err(e) => eprintln!("grove-runner: reading log-probabilities: {e}"),
            }
        }
        if self.prompt_pending {
            self.prompt_pending = false;
            if self.sampler.uses_history() {
                self.history.push(token);
            }
            return if self.flush() || self.latched.is_some() {
                Progress::Continue
            } else {
                Progress::Gone
            };
        }
        self.fed += 1;
        self.on_token(token)
    }

    /// Takes the token read back for this sequence: text out, stops checked.
    pub fn on_token(&mut self, token: u32) -> Progress {
        if self.first_at.is_none() {
            self.first_at = Some(Instant::now());
        }
        if self.eos.contains(&token) {
            // Not part of the reply: neither is its log-probability.
            self.lp_outbox.pop_if(|lp| lp.id == token);
            return Progress::Finished(FinishReason::Stop);
        }
        self.tokens.push(token);
        if self.sampler.uses_history() {
            self.history.push(token);
        }
        if let Some(piece) = self.detokenizer.push(token) {
            let out = self.stops.push(&piece);
            self.outbox.push_str(&out.text);
            if out.stop.is_some() {
                self.stopped_by_string = true;
                return Progress::Finished(FinishReason::Stop);
            }
        }
        if !self.flush() && self.latched.is_none() {
            return Progress::Gone;
        }
        if self.tokens.len() >= self.max_tokens {
            return Progress::Finished(FinishReason::Length);
        }
        Progress::Continue
    }

    /// Sends what the outbox holds if the client has room; false once the
    /// client has gone.
    pub fn flush(&mut self) -> bool {
        let Client::Generate(events) = &self.client else {
            return true;
        };
        if !self.outbox.is_empty() {
            match events.try_send(Event::Text(std::mem::take(&mut self.outbox))) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(Event::Text(back))) => {
                    self.outbox = back;
                    return true;
                }
                Err(_) => return false,
            }
        }
        if !self.lp_outbox.is_empty() {
            match events.try_send(Event::Logprobs(std::mem::take(&mut self.lp_outbox))) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(Event::Logprobs(back))) => {
                    self.lp_outbox = back;
                    return true;
                }
                Err(_) => return false,
            }
        }
        !events.is_closed()
    }

    fn metrics(&self) -> Metrics {
        let prompt_eval = self
            .first_at
            .map_or_else(|| self.started.elapsed(), |t| t - self.started);
        Metrics {
            prompt_tokens: self.prompt.len(),
            cached_prompt_tokens: self.cached,
            cached_from_disk: self.cached_from_disk,
            prompt_eval,
            eval_tokens: self.tokens.len(),
            eval: self.first_at.map_or(Duration::ZERO, |t| t.elapsed()),
            constraint: self.grammar.as_ref().map_or(Duration::ZERO, Grammar::spent),
            constraint_steps: self.grammar.as_ref().map_or(0, Grammar::steps),
        }
    }

    /// Ends the sequence: the text held back, then Done (or a prewarm's
    /// reply), to deliver with [`Pending::deliver`] once the engine has
    /// published its state, so a client that asks for status on Done sees it.
    pub fn finish(mut self, reason: FinishReason) -> Pending {
        let mut reason = reason;
        if !self.stopped_by_string {
            let tail = self.detokenizer.finish().unwrap_or_default();
            let mut last = self.stops.push(&tail);
            if last.stop.is_none() {
                let end = self.stops.finish();
                last.text.push_str(&end.text);
                last.stop = end.stop;
            }
            if last.stop.is_some() {
                reason = FinishReason::Stop;
            }
            self.outbox.push_str(&last.text);
        }
        let metrics = self.metrics();
        let stop = self
            .stops
            .stopped()
            .and_then(|i| self.stops.stops().get(i).cloned());
        match self.client {
            Client::Generate(events) => {
                let mut queue = VecDeque::new();
                if !self.outbox.is_empty() {
                    queue.push_back(Event::Text(self.outbox));
                }
                if !self.lp_outbox.is_empty() {
                    queue.push_back(Event::Logprobs(self.lp_outbox));
                }
                queue.push_back(Event::Done {
                    reason,
                    metrics,
                    stop,
                });
                Pending::Events { events, queue }
            }
            Client::Prewarm(reply) => Pending::Reply {
                reply,
                result: Ok(Prewarmed {
                    cached_tokens: self.prompt.len(),
                    prompt_eval: metrics.prompt_eval,
                }),
            },
        }
    }

    /// Ends the sequence with an error (delivered as [`Sequence::finish`]'s).
    pub fn fail(self, error: RunnerError) -> Pending {
        match self.client {
            Client::Generate(events) => Pending::Events {
                events,
                queue: VecDeque::from([Event::Error(error)]),
            },
            Client::Prewarm(reply) => Pending::Reply {
                reply,
                result: Err(error),
            },
        }
    }
}

/// The last events of a sequence that ended, not yet delivered; a client
/// that reads slowly gets them as room frees in its channel.
pub enum Pending {
    Events {
        events: mpsc::Sender<Event>,
        queue: VecDeque<Event>,
    },
    Reply {
        reply: oneshot::Sender<Result<Prewarmed>>,
        result: Result<Prewarmed>,
    },
}

impl Pending {
    /// Sends what fits; `None` once everything went (or the client left).
    pub fn deliver(self) -> Option<Self> {
        match self {
            Pending::Reply { reply, result } => {
                let _ = reply.send(result);
                None
            }
            Pending::Events { events, mut queue } => {
                while let Some(event) = queue.pop_front() {
                    match events.try_send(event) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(back)) => {
                            queue.push_front(back);
                            return Some(Pending::Events { events, queue });
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => return None,
                    }
                }
                None
            }
        }
    }
}
