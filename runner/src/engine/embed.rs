//! Embedding calls on the engine thread. Every call waiting at a turn is
//! taken out of the line at once; all their inputs are sorted by length and
//! cut into forward passes of at most [`ROWS`] inputs and [`TOKENS`] padded
//! tokens (a decoder: its prefill chunk's, whose KV cache and activations
//! the memory budget holds room for), so the inputs of concurrent calls share passes (and little
//! padding); each call gets its vectors back in its own order. A pass runs
//! between two decode steps, as a prefill chunk does. A model that only
//! embeds (an encoder) refuses generations here, by name.
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, oneshot};

use super::Request;
use super::admission::refuse;
use super::worker::{Loaded, State, Worker};
use crate::error::{Result, RunnerError};

/// Most inputs in one forward pass.
pub const ROWS: usize = 32;

/// Most tokens (inputs x longest) in one forward pass of an encoder (it
/// keeps no KV cache).
pub const TOKENS: usize = 8192;

/// One embedding call: token ids per input (checked against the context
/// before they reach the engine).
#[derive(Debug, Clone)]
pub struct EmbedJob {
    pub inputs: Vec<Vec<u32>>,
    /// Values kept of each vector (0: all).
    pub dimensions: usize,
}

/// What an embedding call gets back.
#[derive(Debug, Clone)]
pub struct Embedded {
    pub vectors: Vec<Vec<f32>>,
    /// From the engine taking the call to its last vector read back.
    pub took: Duration,
}

/// A call in flight on the engine thread.
pub(super) struct Call {
    pub job: EmbedJob,
    pub reply: oneshot::Sender<Result<Embedded>>,
    pub _slot: OwnedSemaphorePermit,
}

impl Worker {
    /// Answers every embedding call waiting; on a model that only embeds,
    /// refuses every generation and prewarm waiting.
    pub(super) fn embed_waiting(&self, l: &Loaded, s: &mut State) {
        let generates = l.model.generates();
        // Every turn of the decode loop passes here: nothing to take out of
        // the line unless an embedding call waits (or an encoder is loaded).
        if generates && !s.waiting.iter().any(|r| matches!(r, Request::Embed { .. })) {
            return;
        }
        let mut calls = Vec::new();
        for r in std::mem::take(&mut s.waiting) {
            match r {
                Request::Embed { job, reply, slot } if self.lockstep.is_none() => {
                    calls.push(Call {
                        job,
                        reply,
                        _slot: slot,
                    })
                }
                Request::Embed { reply, .. } => drop(reply.send(Err(RunnerError::Request(
                    "embeddings are not served by a runner split over a group".into(),
                )))),
                r @ (Request::Generate { .. } | Request::Prewarm { .. }) if !generates => {
                    refuse(r, || {
                        RunnerError::Request(format!(
                            "this is an embedding model ({}); it does not generate text",
                            l.model.architecture.name()
                        ))
                    })
                }
                r => s.waiting.push_back(r),
            }
        }
        if !calls.is_empty() {
            let tokens = match l.model.generates() {
                true => self.config.prefill_chunk.max(1),
                false => TOKENS,
            };
            run(l, calls, tokens);
        }
    }
}

/// Embeds every input of `calls` in as few passes as the limits allow.
fn run(l: &Loaded, calls: Vec<Call>, tokens: usize) {
    let start = Instant::now();
    // (call, input) of every input, shortest first.
    let mut order: Vec<(usize, usize)> = calls
        .iter()
        .enumerate()
        .flat_map(|(c, call)| (0..call.job.inputs.len()).map(move |i| (c, i)))
        .collect();
    order.sort_by_key(|&(c, i)| calls[c].job.inputs[i].len());
    let mut results: Vec<Vec<Option<Vec<f32>>>> = calls
        .iter()
        .map(|c| vec![None; c.job.inputs.len()])
        .collect();
    let mut failed: Vec<Option<RunnerError>> = calls.iter().map(|_| None).collect();
    let hidden = l.model.dims.hidden as usize;
    let mut at = 0;
    while at < order.len() {
        // Inputs of the same `dimensions` share a pass; sorted by length,
        // the pass ends where the padded tokens would pass the limit.
        let dims = |k: usize| {
            let (c, _) = order[k];
            match calls[c].job.dimensions {
                0 => hidden,
                d => d.min(hidden),
            }
        };
        let len = |k: usize| {
            let (c, i) = order[k];
            calls[c].job.inputs[i].len().max(1)
        };
        let mut end = at + 1;
        while end < order.len()
            && end - at < ROWS
            && dims(end) == dims(at)
            && len(end) * (end - at + 1) <= tokens
        {
            end += 1;
        }
        let members: Vec<usize> = (at..end).collect();
        let rows: Vec<Vec<u32>> = members
            .iter()
            .map(|&k| {
                let (c, i) = order[k];
                calls[c].job.inputs[i].clone()
            })
            .collect();
        let width = dims(at);
        let r = l.model.embed(&rows, width as i32);
        match r.and_then(|a| {
            a.try_as_slice::<f32>()
                .map(<[f32]>::to_vec)
                .map_err(|e| RunnerError::Mlx {
                    phase: "reading embeddings",
                    message: e.to_string(),
                })
        }) {
            Ok(values) => {
                for (n, &k) in members.iter().enumerate() {
                    let (c, i) = order[k];
                    results[c][i] = Some(values[n * width..(n + 1) * width].to_vec());
                }
            }
            Err(e) => {
                for &k in &members {
                    let (c, _) = order[k];
                    failed[c].get_or_insert_with(|| RunnerError::Request(e.to_string()));
                }
            }
        }
        at = end;
    }
    let took = start.elapsed();
    for ((call, vectors), error) in calls.into_iter().zip(results).zip(failed) {
        let answer = match error {
            Some(e) => Err(e),
            None => Ok(Embedded {
                vectors: vectors.into_iter().map(Option::unwrap_or_default).collect(),
                took,
            }),
        };
        let _ = call.reply.send(answer);
    }
}
