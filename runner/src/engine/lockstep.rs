//! A group's engines in step (tensor parallelism). Every rank's engine runs
//! the same loop over its own slice of the model, and every forward pass
//! sums partial outputs over the group, so every rank must make the same
//! passes in the same order. Everything the loop decides from is the same
//! on every rank (the model's facts, the capacity agreed at load, the
//! tokens: rank 0's), but for what comes from outside: the requests that
//! arrive and the clients that leave. Rank 0 alone has clients; at the top
//! of each turn it sends a [`Tick`] through the group with the requests
//! that arrived (numbered) and the numbers of those whose clients left, and
//! every rank applies the same tick. A rank's own view of a client is never
//! asked (a sequence's "gone" is latched, see [`super::sequence`]).
//!
//! A tick is a blocking collective: it waits for whatever the group has in
//! flight. So while the batch decodes (each step dispatched before the last
//! one is read back), rank 0 sends a "news follows" flag with every step's
//! tokens ([`Lead::has_news`]), and the turn after a step that read it back
//! starts with a tick only when it was set. Requests rank 0 has not yet
//! numbered in a tick wait (admission skips them).
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::worker::{Loaded, State, Worker};
use super::{Event, Job, KvChoice, Request};
use crate::error::{Result, RunnerError};
use crate::generate::GenerateParams;
use crate::shard::Comm;

/// What rank 0 tells the others at the top of a turn.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Tick {
    /// Requests that arrived, in arrival order.
    pub arrived: Vec<Arrival>,
    /// Requests and sequences whose clients left.
    pub gone: Vec<u64>,
    /// The engine stops.
    pub stop: bool,
    /// The group is idle: every rank reports its memory ([`share_memory`]).
    #[serde(default)]
    pub report: bool,
}

impl Tick {
    fn is_empty(&self) -> bool {
        self.arrived.is_empty() && self.gone.is_empty() && !self.stop && !self.report
    }
}

/// A request as the other ranks need it: everything that decides its
/// passes and its end (its output constraint only shapes rank 0's sampling,
/// whose tokens every rank feeds).
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Arrival {
    Generate {
        id: u64,
        input: Vec<u32>,
        params: Box<GenerateParams>,
        max_tokens: usize,
        num_ctx: usize,
        stop: Vec<String>,
        kv: KvChoice,
    },
    Prewarm {
        id: u64,
        prompt: Vec<u32>,
    },
}

fn wire_err(e: impl std::fmt::Display) -> RunnerError {
    RunnerError::Shard {
        phase: "keeping the group in step",
        message: e.to_string(),
    }
}

/// Rank 0's side: numbers requests and sends the ticks.
#[derive(Default)]
pub(super) struct Lead {
    next_id: u64,
}

impl Lead {
    /// Numbers the requests that arrived since the last tick, collects the
    /// clients that left, sends the tick and applies it. Returns whether the
    /// engine stops.
    pub fn turn(&mut self, comm: &Comm, s: &mut State, stop: bool) -> Result<bool> {
        let mut tick = Tick {
            stop,
            ..Tick::default()
        };
        s.waiting.retain(|r| !matches!(r, Request::Stop));
        for request in s.waiting.iter_mut() {
            match request {
                Request::Generate { id, job, .. } if *id == 0 => {
                    self.next_id += 1;
                    *id = self.next_id;
                    tick.arrived.push(Arrival::Generate {
                        id: *id,
                        input: job.input.clone(),
                        params: Box::new(job.params.clone()),
                        max_tokens: job.max_tokens,
                        num_ctx: job.num_ctx,
                        stop: job.stop.clone(),
                        kv: job.kv,
                    });
                }
                Request::Prewarm { id, prompt, .. } if *id == 0 => {
                    self.next_id += 1;
                    *id = self.next_id;
                    tick.arrived.push(Arrival::Prewarm {
                        id: *id,
                        prompt: prompt.clone(),
                    });
                }
                _ => {}
            }
        }
        tick.gone.extend(
            s.waiting
                .iter()
                .filter(|r| r.abandoned())
                .filter_map(request_id),
        );
        tick.gone.extend(clients_left(s));
        let bytes = if tick.is_empty() {
            Vec::new()
        } else {
            serde_json::to_vec(&tick).map_err(wire_err)?
        };
        comm.broadcast_bytes(&bytes)?;
        apply_gone(s, &tick.gone);
        Ok(tick.stop)
    }
}

impl Lead {
    /// Whether rank 0 has something to tell the others: requests that
    /// arrived (`arrived`: still in the channel), clients that left, or the
    /// engine's `stop`.
    pub fn has_news(&self, s: &State, arrived: bool, stop: bool) -> bool {
        stop || arrived
            || s.waiting
                .iter()
                .any(|r| request_id(r).is_none_or(|id| id == 0) || r.abandoned())
            || clients_left(s).next().is_some()
    }

    /// The group goes idle: asks every rank for its memory and returns
    /// every rank's figures (this one's included). The followers then wait
    /// on the doorbell, which the caller rings when work arrives.
    pub fn report(&mut self, comm: &Comm, l: &Loaded, s: &State) -> Result<Vec<[u64; 4]>> {
        let tick = Tick {
            report: true,
            ..Tick::default()
        };
        comm.broadcast_bytes(&serde_json::to_vec(&tick).map_err(wire_err)?)?;
        share_memory(comm, own_memory(l, s))
    }
}

/// The sequences whose clients rank 0 has seen leave since its last tick.
fn clients_left(s: &State) -> impl Iterator<Item = u64> + '_ {
    s.prefilling
        .iter()
        .map(|p| &p.sequence)
        .chain(s.group.iter().flat_map(|g| g.rows()))
        .chain(s.batch.rows())
        .filter(|q| !q.gone() && q.live_gone())
        .map(|q| q.id)
}

/// Every rank's `own` figures, in rank order (each fills its slot of a
/// vector the group sums).
pub(super) fn share_memory(comm: &Comm, own: [u64; 4]) -> Result<Vec<[u64; 4]>> {
    let n = comm.size().max(1) as usize;
    let mut all = vec![0i64; n * 4];
    let at = comm.rank() as usize * 4;
    for (slot, v) in all[at..at + 4].iter_mut().zip(own) {
        *slot = v.min(i64::MAX as u64) as i64;
    }
    let x = mlx_rs::Array::from_slice(&all, &[all.len() as i32]);
    let sum = comm.all_sum(&x).map_err(wire_err)?;
    sum.eval().map_err(wire_err)?;
    Ok(sum
        .as_slice::<i64>()
        .chunks_exact(4)
        .map(|c| [c[0], c[1], c[2], c[3]].map(|v| v.max(0) as u64))
        .collect())
}

/// What a follower's turn brought.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Turn {
    /// The engine stops.
    pub stop: bool,
    /// Rank 0 asks for every rank's memory.
    pub report: bool,
}

fn request_id(r: &Request) -> Option<u64> {
    match r {
        Request::Generate { id, .. } | Request::Prewarm { id, .. } => Some(*id),
        Request::Embed { .. } | Request::Stop => None,
    }
}

/// Drops the waiting requests and latches the sequences rank 0 named.
fn apply_gone(s: &mut State, gone: &[u64]) {
    if gone.is_empty() {
        return;
    }
    s.waiting
        .retain(|r| request_id(r).is_none_or(|id| !gone.contains(&id)));
    for p in s.prefilling.iter_mut() {
        if gone.contains(&p.sequence.id) {
            p.sequence.mark_gone();
        }
    }
    if let Some(g) = s.group.as_mut() {
        g.mark_gone(gone);
    }
    s.batch.mark_gone(gone);
}

/// A follower's side: takes rank 0's ticks and stands in for its clients.
pub(super) struct Follow {
    /// The stand-ins' event streams, read and dropped every turn.
    events: Vec<mpsc::Receiver<Event>>,
    slots: Arc<Semaphore>,
}

impl Default for Follow {
    fn default() -> Self {
        Self {
            events: Vec::new(),
            slots: Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)),
        }
    }
}

impl Follow {
    /// A follower's turn: rank 0's tick; when the group goes idle, this
    /// rank's memory for rank 0's report, then a wait on the doorbell.
    /// Returns whether the engine stops.
    pub fn take_turn(&mut self, comm: &Comm, l: &Loaded, s: &mut State) -> Result<bool> {
        let turn = self.turn(comm, s)?;
        if turn.report {
            super::worker::settle();
            let _ = mlx_rs::memory::clear_cache();
            share_memory(comm, own_memory(l, s))?;
            comm.wait_bell()?;
        }
        Ok(turn.stop)
    }

    /// Waits for rank 0's tick and applies it.
    fn turn(&mut self, comm: &Comm, s: &mut State) -> Result<Turn> {
        // What the stand-ins were sent is read and dropped.
        self.events.retain_mut(|rx| {
            loop {
                match rx.try_recv() {
                    Ok(_) => {}
                    Err(mpsc::error::TryRecvError::Empty) => break true,
                    Err(mpsc::error::TryRecvError::Disconnected) => break false,
                }
            }
        });
        let bytes = comm.broadcast_bytes(&[])?;
        if bytes.is_empty() {
            return Ok(Turn::default());
        }
        let tick: Tick = serde_json::from_slice(&bytes).map_err(wire_err)?;
        for arrival in tick.arrived {
            let slot = self.slots.clone().try_acquire_owned().map_err(wire_err)?;
            let request = match arrival {
                Arrival::Generate {
                    id,
                    input,
                    params,
                    max_tokens,
                    num_ctx,
                    stop,
                    kv,
                } => {
                    let (events, rx) = mpsc::channel(64);
                    self.events.push(rx);
                    Request::Generate {
                        id,
                        job: Box::new(Job {
                            input,
                            params: *params,
                            max_tokens,
                            num_ctx,
                            stop,
                            kv,
                            grammar: None,
                            logprobs: None,
                        }),
                        events,
                        slot,
                    }
                }
                Arrival::Prewarm { id, prompt } => {
                    let (reply, _) = oneshot::channel();
                    Request::Prewarm {
                        id,
                        prompt,
                        reply,
                        slot,
                    }
                }
            };
            s.waiting.push_back(request);
        }
        apply_gone(s, &tick.gone);
        Ok(Turn {
            stop: tick.stop,
            report: tick.report,
        })
    }
}

/// The capacity, context and parallelism every rank runs with: the least
/// of each over the group (their memory may differ).
pub(super) fn agree_limits(comm: &Comm, limits: [usize; 3]) -> Result<[usize; 3]> {
    let values: Vec<i64> = limits
        .iter()
        .map(|&v| v.min(i64::MAX as usize) as i64)
        .collect();
    let agreed = comm.all_min(&values)?;
    let mut out = limits;
    for (o, a) in out.iter_mut().zip(agreed) {
        *o = a.max(0) as usize;
    }
    Ok(out)
}

/// This rank's weights, KV, MLX active and peak bytes.
pub(super) fn own_memory(l: &Loaded, s: &State) -> [u64; 4] {
    [
        l.model.weight_bytes as u64,
        super::worker::kv_bytes(l, s) as u64,
        mlx_rs::memory::active_memory().unwrap_or(0) as u64,
        mlx_rs::memory::peak_memory().unwrap_or(0) as u64,
    ]
}

impl Worker {
    /// A failed pass: alone, the error as it is; in a group, the ranks may
    /// no longer be in step (a rank died, a collective failed), so the
    /// group ends: the error says so (UNAVAILABLE to clients) and the
    /// engine stops.
    pub(super) fn in_step(&self, e: RunnerError) -> RunnerError {
        if self.lockstep.is_none() {
            return e;
        }
        self.stopping.store(true, Ordering::SeqCst);
        RunnerError::Shard {
            phase: "keeping the group in step",
            message: e.to_string(),
        }
    }
}
