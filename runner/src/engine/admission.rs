//! Admission: which waiting requests start, and how a request becomes a
//! sequence.
//!
//! Requests start oldest first while the batch has a free slot (at most
//! `parallel` sequences) and their KV fits: the tokens every active sequence
//! may come to hold, padded to the longest (a batch's rows share one length),
//! plus the prompt-cache entry, must stay within the KV capacity. When only
//! the entry is in the way it is dropped; otherwise the request waits until a
//! sequence leaves. A request alone always fits (its context is at most the
//! capacity). A new sequence starts from the entry's common prefix.
//!
//! Every sequence in flight shares one KV setting (the batch's layers hold
//! one form): a request that asks for another waits until they are done.
//! The capacity is counted in tokens of the runner's setting; a request of
//! a larger one reserves proportionally more.
use super::sequence::{Client, Pending, Sequence, Spec};
use super::worker::{Loaded, Prefilling, State, Worker};
use super::{Event, Job, KvChoice, Request};
use crate::cache::KvSetting;
use crate::error::{Result, RunnerError};
use crate::memory::kv_bytes_per_token;
use crate::sample::Sampler;

pub(super) fn refuse(request: Request, error: impl Fn() -> RunnerError) {
    match request {
        Request::Generate { events, .. } => drop(events.try_send(Event::Error(error()))),
        Request::Prewarm { reply, .. } => drop(reply.send(Err(error()))),
        Request::Embed { reply, .. } => drop(reply.send(Err(error()))),
        Request::Stop => {}
    }
}

impl Worker {
    /// Tokens the active sequences' KV may take with one more of `reserve`
    /// tokens: a batch pads every row to the longest one. (A sequence that
    /// fills its context holds one token more, the last one fed: within the
    /// 256-token growth step, not counted.)
    fn footprint(s: &State, reserve: usize, context: usize) -> usize {
        let longest = s
            .prefilling_rows()
            .map(Sequence::reserved)
            .chain(s.batch.rows().iter().map(Sequence::reserved))
            .map(|r| r.min(context))
            .fold(reserve, usize::max);
        longest * (s.active() + 1)
    }

    /// Moves waiting requests into prefill, oldest first, while they fit.
    pub(super) fn admit(&self, l: &mut Loaded, s: &mut State) {
        while let Some(request) = s.waiting.front() {
            if s.active() >= l.parallel {
                return;
            }
            // In a group, a request rank 0 has not yet sent the others (not
            // numbered in a tick) waits for its tick: a suffix of the line.
            if self.lockstep.is_some()
                && !matches!(request, Request::Generate { id, .. } | Request::Prewarm { id, .. } if *id != 0)
            {
                return;
            }
            // A generation whose prompt a prewarm is putting into the prompt
            // cache (the choices of one request) waits for it, and then
            // starts from the cache instead of prefilling the same tokens.
            if let Request::Generate { job, .. } = request
                && s.prefilling_rows().any(|p| {
                    p.is_prewarm() && !p.prompt.is_empty() && job.input.starts_with(&p.prompt)
                })
            {
                return;
            }
            let kv = kv_of(l, request);
            if let Some(active) = active_kv(s)
                && active != kv
            {
                return; // Waits for the other setting's sequences to end.
            }
            let reserve = match request {
                Request::Generate { job, .. } => scaled(l, self.reserve(l, job), kv),
                Request::Prewarm { prompt, .. } => prompt.len(),
                Request::Embed { .. } | Request::Stop => 0,
            };
            let fits = |s: &State, entry: usize| {
                Self::footprint(s, reserve, l.context) + entry <= l.capacity
            };
            if !fits(s, l.cache.footprint()) {
                if !fits(s, 0) && s.active() > 0 {
                    return; // Waits for room.
                }
                // The prompt cache entry is what is in the way: it goes
                // (sequences that started from it keep their own copies).
                l.cache.clear();
            }
            let Some(request) = s.waiting.pop_front() else {
                return;
            };
            if !fits(s, l.cache.footprint()) {
                refuse(request, || {
                    RunnerError::Request(format!(
                        "the request needs {reserve} tokens of KV cache; the runner holds {}",
                        l.capacity
                    ))
                });
                continue;
            }
            match self.start(l, request) {
                Ok(Some(p)) => s.prefilling.push_back(p),
                Ok(None) => {}
                Err((client, e)) => drop(fail(client, e)),
            }
        }
    }

    /// Tokens a job may come to hold (prompt + generation, within its context).
    fn reserve(&self, l: &Loaded, job: &Job) -> usize {
        let context = match job.num_ctx {
            0 => l.context,
            n => n.min(l.context),
        };
        let max = if job.max_tokens == 0 {
            usize::MAX
        } else {
            job.max_tokens
        };
        job.input.len().saturating_add(max).min(context)
    }

    /// Checks a request and makes its sequence, starting from the prompt
    /// cache's common prefix. `Ok(None)`: the client already left.
    #[allow(clippy::result_large_err)]
    fn start(
        &self,
        l: &mut Loaded,
        request: Request,
    ) -> std::result::Result<Option<Prefilling>, (Client, RunnerError)> {
        let (id, client, prompt, mut job, slot) = match request {
            Request::Generate {
                id,
                job,
                events,
                slot,
            } => {
                let prompt = job.input.clone();
                (id, Client::Generate(events), prompt, Some(*job), slot)
            }
            Request::Prewarm {
                id,
                prompt,
                reply,
                slot,
            } => (id, Client::Prewarm(reply), prompt, None, slot),
            Request::Embed { reply, .. } => {
                let _ = reply.send(Err(RunnerError::Request(
                    "an embedding call reached the prefill".into(),
                )));
                return Ok(None);
            }
            Request::Stop => return Ok(None),
        };
        let context = match job.as_ref().map_or(0, |j| j.num_ctx) {
            0 => l.context,
            n => n.min(l.context),
        };
        let checked = check_prompt(&prompt, context, l.model.dims.vocab as u32, job.is_none());
        if let Err(e) = checked {
            return Err((client, e));
        }
        let kv = match job.as_ref().map(|j| j.kv) {
            Some(KvChoice::Exactly(kv)) => kv,
            _ => l.kv,
        };
        if let Some(setting) = kv
            && let Err(why) = l.model.check_kv_quant(setting.quant)
        {
            return Err((client, RunnerError::Request(why)));
        }
        let (sampler, chunk, max_tokens, stops) = match &job {
            Some(job) => {
                let sampler = match Sampler::new(&job.params.sampling, l.model.dims.vocab as usize)
                {
                    Ok(s) => s,
                    Err(e) => return Err((client, e)),
                };
                if job.params.prefill_chunk == 0 {
                    let e = RunnerError::Request("prefill chunk must be at least 1 token".into());
                    return Err((client, e));
                }
                let max = if job.max_tokens == 0 {
                    usize::MAX
                } else {
                    job.max_tokens
                };
                // Generation may fill the context: the limit is what is left.
                let max = max.min(context - prompt.len() + 1);
                (sampler, job.params.prefill_chunk, max, job.stop.clone())
            }
            None => {
                let sampler = match Sampler::new(&Default::default(), 1) {
                    Ok(s) => s,
                    Err(e) => return Err((client, e)),
                };
                (sampler, self.config.prefill_chunk, 0, Vec::new())
            }
        };
        // In a group's lockstep only rank 0's word ends a sequence (at the
        // next step), so every rank runs the same passes.
        if let Client::Generate(events) = &client
            && events.try_send(Event::Started).is_err()
            && self.lockstep.is_none()
        {
            return Ok(None);
        }
        let (mut cached, mut caches) = l.cache.share_prefix(&prompt, kv);
        // A stored entry that shares more of the prompt replaces the one
        // in memory (which is on disk already, written when it was made).
        let mut from_disk = 0;
        if let Some(disk) = l.disk.as_mut()
            && let Some((n, i)) = disk.best(&prompt, kv)
            && n > cached
            && let Some((tokens, layers)) = disk.load(i, l.model.kinds())
        {
            l.cache.replace(tokens, layers, None, kv);
            (cached, caches) = l.cache.share_prefix(&prompt, kv);
            from_disk = cached;
        }
        let spec = Spec {
            id,
            lockstep: self.lockstep.is_some(),
            client,
            prompt,
            cached,
            chunk,
            max_tokens,
            sampler,
            eos: l.eos.clone(),
            table: l.table.clone(),
            stops,
            slot: Some(slot),
            kv,
            grammar: job.as_mut().and_then(|j| j.grammar.take()),
            logprobs: job.as_ref().and_then(|j| j.logprobs),
        };
        match Sequence::new(spec) {
            Ok(mut sequence) => {
                sequence.cached_from_disk = from_disk;
                Ok(Some(Prefilling { sequence, caches }))
            }
            // Only an empty stop string can fail here, and the request layer
            // refuses those first.
            Err(_) => Ok(None),
        }
    }
}

/// The KV setting a request will run with.
fn kv_of(l: &Loaded, request: &Request) -> Option<KvSetting> {
    match request {
        Request::Generate { job, .. } => match job.kv {
            KvChoice::Exactly(kv) => kv,
            KvChoice::Runner => l.kv,
        },
        Request::Prewarm { .. } | Request::Embed { .. } | Request::Stop => l.kv,
    }
}

/// The setting of the sequences in flight (`None` when there are none).
fn active_kv(s: &State) -> Option<Option<KvSetting>> {
    s.prefilling_rows()
        .map(|r| r.kv)
        .next()
        .or_else(|| s.batch.kv())
}

/// `tokens` of a request's setting counted in tokens of the runner's.
fn scaled(l: &Loaded, tokens: usize, kv: Option<KvSetting>) -> usize {
    if kv == l.kv {
        return tokens;
    }
    let runner = kv_bytes_per_token(&l.model, l.kv.map(|k| k.quant)).max(1);
    let mine = kv_bytes_per_token(&l.model, kv.map(|k| k.quant));
    ((tokens as u128 * mine as u128).div_ceil(runner as u128)).min(usize::MAX as u128) as usize
}

fn fail(client: Client, e: RunnerError) -> Option<Pending> {
    match client {
        Client::Generate(events) => drop(events.try_send(Event::Error(e))),
        Client::Prewarm(reply) => drop(reply.send(Err(e))),
    }
    None
}

/// The checks every prompt passes before it reaches the model.
fn check_prompt(prompt: &[u32], context: usize, vocab: u32, prewarm: bool) -> Result<()> {
    let what = if prewarm {
        "the system prompt"
    } else {
        "the prompt"
    };
    if prompt.is_empty() {
        return Err(RunnerError::Request(format!("{what} is empty")));
    }
    if prompt.len() > context {
        return Err(RunnerError::Request(format!(
            "{what} has {} tokens, more than the context length of {context}",
            prompt.len()
        )));
    }
    if let Some(bad) = prompt.iter().find(|&&t| t >= vocab) {
        return Err(RunnerError::Request(format!(
            "prompt token id {bad} is outside the model's vocabulary of {vocab}"
        )));
    }
    Ok(())
}
