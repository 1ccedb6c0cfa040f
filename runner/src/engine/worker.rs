//! The engine thread's loop: continuous batching.
//!
//! Each turn of the loop: take what arrived (blocking only when there is
//! nothing to do), admit waiting requests while the batch has room (at most
//! `parallel` sequences, and their KV within the capacity), evaluate one
//! prefill chunk of the oldest prefilling sequence, then run one decode step
//! of the batch. Prefill chunks are at most [`INTERLEAVED_CHUNK`] tokens while
//! the batch decodes, so running streams keep flowing during a long prompt.
//! A prefilled sequence joins the batch; a sequence leaves it at the step its
//! token ends it (EOS, stop string, limit) or its client goes.
//!
//! The prompt cache's single entry: a new request starts from the entry's
//! common prefix (by token content), sharing its buffers copy-on-write. The
//! entry is replaced by the most recently *finished* request (ended by EOS, a
//! stop string or its limit; cancelled and failed ones never) and by a
//! prewarm; so a conversation's next turn finds its previous turn.
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mlx_rs::Array;
use tokio::sync::{mpsc, watch};

use super::admission::refuse;
use super::batch::{Batch, reason};
use super::group::Group;
use super::prefill::{Advanced, advance};
use super::prompt_cache::{Checkpoint, PromptCache};
use super::sequence::{Pending, Progress, Sequence};
use super::{
    Activity, EngineConfig, Facts, Inspector, LoadState, MemoryFigures, Request, Snapshot,
};
use crate::cache::LayerKv;
use crate::chat::ChatParts;
use crate::detokenize::TokenTable;
use crate::error::{Result, RunnerError};
use crate::memory::{Budget, budget_memory};
use crate::model::Model;

/// Most prompt tokens per prefill pass while other sequences are decoding.
pub const INTERLEAVED_CHUNK: usize = 128;

pub(super) struct Loaded {
    pub(super) model: Model,
    pub(super) eos: Arc<[u32]>,
    pub(super) table: Arc<TokenTable>,
    pub(super) cache: PromptCache,
    pub(super) budget: Budget,
    pub(super) context: usize,
    /// KV tokens all sequences and the entry may hold together.
    pub(super) capacity: usize,
    /// Most sequences prefilling or decoding at once.
    pub(super) parallel: usize,
    /// MLX runs on the CPU backend (compute-bound: larger passes cost more).
    pub(super) on_cpu: bool,
    /// The KV setting of requests that do not choose one (the configured
    /// one, or full precision where the model cannot quantize its cache).
    pub(super) kv: Option<crate::cache::KvSetting>,
    /// The SSD tier, when on.
    pub(super) disk: Option<super::disk::DiskTier>,
}

/// A sequence evaluating its prompt into caches of its own.
pub(super) struct Prefilling {
    pub(super) sequence: Sequence,
    pub(super) caches: Vec<LayerKv>,
}

pub(super) struct Worker {
    /// The group this engine keeps in step with (see [`super::lockstep`]).
    pub lockstep: Option<Arc<crate::shard::Comm>>,
    pub config: EngineConfig,
    pub snapshot: watch::Sender<Snapshot>,
    pub parts: watch::Sender<Option<Arc<ChatParts>>>,
    pub stopping: Arc<AtomicBool>,
    pub disk: Arc<super::disk::DiskStats>,
}

/// Everything in flight.
pub(super) struct State {
    pub(super) waiting: VecDeque<Request>,
    pub(super) prefilling: VecDeque<Prefilling>,
    /// Fresh prompts being prefilled together.
    pub(super) group: Option<Group>,
    pub(super) batch: Batch,
    /// Final events for clients that read slowly.
    pub(super) pending: Vec<Pending>,
    /// A group's ranks' memory when it last went idle (weights, KV, MLX
    /// active, MLX peak).
    pub(super) ranks: Vec<[u64; 4]>,
}

impl State {
    pub(super) fn active(&self) -> usize {
        self.prefilling_count() + self.batch.len()
    }

    /// Sequences prefilling, alone or in the group.
    fn prefilling_count(&self) -> usize {
        self.prefilling.len() + self.group.as_ref().map_or(0, Group::len)
    }

    /// Every sequence prefilling, alone or in the group.
    pub(super) fn prefilling_rows(&self) -> impl Iterator<Item = &Sequence> {
        self.prefilling
            .iter()
            .map(|p| &p.sequence)
            .chain(self.group.iter().flat_map(|g| g.rows()))
    }

    fn idle(&self) -> bool {
        self.waiting.is_empty()
            && self.prefilling.is_empty()
            && self.group.is_none()
            && self.batch.is_empty()
            && self.pending.is_empty()
    }
}

impl Worker {
    pub fn run(self, mut rx: mpsc::Receiver<Request>, inspect: Option<Inspector>) {
        let mut loaded = match self.load() {
            Ok(l) => Some(l),
            Err(e) => {
                self.snapshot
                    .send_modify(|s| s.state = LoadState::Failed(e.to_string()));
                None
            }
        };
        let Some(l) = loaded.as_mut() else {
            if self.lockstep.as_ref().is_some_and(|c| c.rank() != 0) {
                // A follower has no clients to refuse.
                self.snapshot.send_modify(|s| s.state = LoadState::Stopping);
                return;
            }
            while let Some(request) = rx.blocking_recv() {
                refuse(request, || {
                    RunnerError::Request("the model failed to load".into())
                });
            }
            self.snapshot.send_modify(|s| s.state = LoadState::Stopping);
            return;
        };
        let mut s = State {
            waiting: VecDeque::new(),
            prefilling: VecDeque::new(),
            group: None,
            batch: Batch::new(l.model.kinds()),
            pending: Vec::new(),
            ranks: Vec::new(),
        };
        let mut open = true;
        // (prefilling, decoding, waiting) as last published.
        let counts = |s: &State, rx: &mpsc::Receiver<Request>| {
            (
                s.prefilling_count(),
                s.batch.len(),
                s.waiting.len() + rx.len(),
            )
        };
        let mut shown = None;
        // In a group: rank 0 leads the others' turns, they follow.
        let lockstep = self.lockstep.clone();
        let mut lead = super::lockstep::Lead::default();
        let mut follow = super::lockstep::Follow::default();
        let follower = lockstep.as_ref().is_some_and(|c| c.rank() != 0);
        // Whether this turn starts with rank 0's tick: every turn, but
        // while the batch decodes only when the step just read back said
        // so (rank 0 sends its "news follows" with the tokens). A tick is a
        // blocking collective that would wait for the step in flight.
        let mut tick_due = true;
        loop {
            // 0. A follower's turn starts with rank 0's news.
            if let (true, true, Some(comm)) = (follower, tick_due, lockstep.as_deref()) {
                match follow.take_turn(comm, l, &mut s) {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => {
                        eprintln!("grove-runner: {e}");
                        break;
                    }
                }
            }
            // 1. What arrived; block only when there is nothing to do.
            if s.idle() && open && !follower && tick_due {
                settle();
                let _ = mlx_rs::memory::clear_cache();
                // A group that goes idle: every rank says what it holds.
                if let Some(comm) = lockstep.as_deref() {
                    match lead.report(comm, l, &s) {
                        Ok(ranks) => s.ranks = ranks,
                        Err(e) => {
                            eprintln!("grove-runner: {e}");
                            self.stopping.store(true, Ordering::SeqCst);
                            break;
                        }
                    }
                }
                self.publish(l, &s, rx.len(), true);
                shown = Some(counts(&s, &rx));
                match rx.blocking_recv() {
                    Some(r) => s.waiting.push_back(r),
                    None => open = false,
                }
                // The followers wait on the group's doorbell while it is idle.
                if let Some(Err(e)) = lockstep.as_deref().map(crate::shard::Comm::ring_bell) {
                    eprintln!("grove-runner: {e}");
                    self.stopping.store(true, Ordering::SeqCst);
                    break;
                }
            }
            // Every request holds one of `parallel + queue` slots until its
            // sequence ends, so the waiting line is bounded; one whose
            // client left frees its slot now, not when its turn comes.
            while let Ok(r) = rx.try_recv() {
                s.waiting.push_back(r);
            }
            // Embedding calls are answered now, all together.
            if !self.stopping.load(Ordering::SeqCst) {
                self.embed_waiting(l, &mut s);
            }
            let stop = self.stopping.load(Ordering::SeqCst) || (!open && s.idle());
            match lockstep.as_deref() {
                // Rank 0: the others hear of arrivals, departures and the
                // stop before anyone acts on them.
                Some(comm) if !follower && tick_due => match lead.turn(comm, &mut s, stop) {
                    Ok(false) => {}
                    Ok(true) => break,
                    Err(e) => {
                        eprintln!("grove-runner: {e}");
                        self.stopping.store(true, Ordering::SeqCst);
                        break;
                    }
                },
                Some(_) => {}
                None => {
                    s.waiting
                        .retain(|r| !matches!(r, Request::Stop) && !r.abandoned());
                    if stop {
                        break;
                    }
                }
            }
            // 2. Admit, prefill one chunk, decode one step.
            self.admit(l, &mut s);
            self.prefill(l, &mut s, inspect.as_ref());
            // Rank 0 tells the others, with the step's tokens, whether it
            // has a tick to send at the turn after next.
            let news = lockstep.is_some()
                && !follower
                && lead.has_news(
                    &s,
                    !rx.is_empty(),
                    self.stopping.load(Ordering::SeqCst) || (!open && s.idle()),
                );
            self.decode(l, &mut s, news, inspect.as_ref());
            tick_due = s.batch.take_news_read().unwrap_or(true);
            // 3. Publish, then deliver what ended (a client that asks for
            //    status on Done sees the state after its request).
            let now = counts(&s, &rx);
            if shown != Some(now) {
                self.publish(l, &s, rx.len(), false);
                shown = Some(now);
            }
            s.pending = std::mem::take(&mut s.pending)
                .into_iter()
                .filter_map(Pending::deliver)
                .collect();
            if s.active() == 0 && !s.pending.is_empty() {
                std::thread::sleep(Duration::from_millis(1));
            }
            if !open && s.idle() && lockstep.is_none() {
                break;
            }
        }
        // Stopping: everything still here fails.
        for r in s.waiting.drain(..) {
            refuse(r, || RunnerError::Stopped);
        }
        for p in s.prefilling.drain(..) {
            drop(p.sequence.fail(RunnerError::Stopped).deliver());
        }
        for seq in s.group.take().map(Group::into_rows).unwrap_or_default() {
            drop(seq.fail(RunnerError::Stopped).deliver());
        }
        for seq in s.batch.drain() {
            drop(seq.fail(RunnerError::Stopped).deliver());
        }
        while let Ok(r) = rx.try_recv() {
            refuse(r, || RunnerError::Stopped);
        }
        // What is queued for the SSD tier reaches it before the process ends.
        persist(l);
        if let Some(disk) = l.disk.take() {
            disk.flush();
        }
        self.snapshot.send_modify(|s| s.state = LoadState::Stopping);
    }

    fn load(&self) -> Result<Loaded> {
        let opened = crate::source::open_sharded(
            &self.config.model_dir,
            self.config.cpu_dtypes,
            self.lockstep.as_ref(),
        )?;
        let model = opened.model;
        let tokenizer = Arc::new(opened.tokenizer);
        // Resolved when the engine was spawned.
        let mut parallel = self.config.num_parallel.unwrap_or(1).max(1);
        // A runner-wide quantized cache the model cannot take falls back to
        // full precision (as ollama's OLLAMA_KV_CACHE_TYPE does), said on
        // stderr and in Status; a request that asks for one is refused.
        let kv = match self.config.kv {
            Some(setting) => match model.check_kv_quant(setting.quant) {
                Ok(()) => Some(setting),
                Err(why) => {
                    eprintln!("grove-runner: {why}; the KV cache stays full precision");
                    None
                }
            },
            None => None,
        };
        let budget = Budget::new(
            &model,
            budget_memory(),
            self.config.prefill_chunk as u64,
            parallel as u64,
            kv.map(|k| k.quant),
        );
        budget.apply().map_err(|e| RunnerError::Mlx {
            phase: "setting memory limits",
            message: e.to_string(),
        })?;
        let mut capacity = match self.config.kv_capacity {
            Some(c) => c.min(budget.kv_capacity_tokens as usize),
            None => budget.kv_capacity_tokens as usize,
        };
        let mut context = capacity;
        if let Some(max) = model.max_position_embeddings {
            context = context.min(max as usize);
        }
        if let Some(limit) = self.config.context_length {
            context = context.min(limit);
        }
        // A group's ranks admit alike only with the same limits.
        if let Some(comm) = &self.lockstep {
            [capacity, context, parallel] =
                super::lockstep::agree_limits(comm, [capacity, context, parallel])?;
        }
        if context < 2 {
            return Err(RunnerError::Request(format!(
                "not enough memory for a KV cache: {} bytes total, {} of weights",
                budget.memory_total, budget.weight_bytes
            )));
        }
        let facts = Facts {
            architecture: model.architecture,
            dtype: model.dtype(),
            quantization: model.quantization,
            parameter_count: model.parameter_count(),
            active_parameter_count: model.active_parameter_count(),
            context_length: context,
            max_position_embeddings: model.max_position_embeddings,
            vocab_size: model.dims.vocab as usize,
            num_layers: model.decoder.num_layers(),
            dtypes: model.dtypes,
            gguf: opened.kind == crate::source::SourceKind::Gguf,
            parallel,
            kv_capacity: capacity,
            generates: model.generates(),
            embedding_length: model.dims.hidden as usize,
            embedding: model.embedding,
        };
        let table = Arc::new(TokenTable::new(&tokenizer));
        let parts = ChatParts::new(
            tokenizer.clone(),
            opened.templates.spec(),
            context,
            table.clone(),
            model.dims.vocab as usize,
        );
        let loaded = Loaded {
            eos: tokenizer.eos_ids().to_vec().into(),
            table,
            cache: PromptCache::new(model.kinds()),
            model,
            budget,
            context,
            capacity,
            parallel,
            on_cpu: crate::model::dtypes::cpu_backend(),
            kv,
            disk: None,
        };
        let mut loaded = loaded;
        if let Some(config) = &self.config.disk {
            loaded.disk = super::disk::DiskTier::open(
                config,
                &self.config.model_dir,
                loaded.model.dtype(),
                loaded.model.kinds(),
                self.disk.clone(),
            );
        }
        super::warmup::warm_up_if_wanted(&loaded.model, loaded.on_cpu)?;
        self.parts.send_replace(Some(Arc::new(parts)));
        // The load's own figures go out with Ready: a client that asks for
        // Status as soon as Health says Ready (before the loop's first
        // publish) sees the budget and the KV setting, not defaults.
        self.snapshot.send_modify(|s| {
            s.state = LoadState::Ready;
            s.facts = Some(facts);
            s.memory.budget = Some(loaded.budget);
            s.memory.kv = loaded.kv;
        });
        Ok(loaded)
    }

    /// Publishes the figures; `idle`: nothing is in flight (Activity::Idle
    /// is only published then, after the device has finished, so its memory
    /// figures are settled).
    fn publish(&self, l: &Loaded, s: &State, queued: usize, idle: bool) {
        let kv = kv_bytes(l, s);
        let figures = MemoryFigures {
            ranks: s.ranks.clone(),
            budget: Some(l.budget),
            kv_bytes: kv as u64,
            checkpoint_bytes: l.cache.checkpoint_bytes() as u64,
            cached_tokens: l.cache.len(),
            mlx_active: mlx_rs::memory::active_memory().unwrap_or(0) as u64,
            mlx_cache: mlx_rs::memory::cache_memory().unwrap_or(0) as u64,
            mlx_peak: mlx_rs::memory::peak_memory().unwrap_or(0) as u64,
            kv: l.kv,
            ..MemoryFigures::default()
        };
        let activity = if idle {
            Some(Activity::Idle)
        } else if s.prefilling_count() > 0 {
            Some(Activity::Prefilling)
        } else if !s.batch.is_empty() {
            Some(Activity::Decoding)
        } else {
            None
        };
        self.snapshot.send_modify(|snap| {
            snap.memory = figures;
            if let Some(activity) = activity {
                snap.activity = activity;
            }
            snap.active = s.active();
            snap.waiting = s.waiting.len() + queued;
        });
    }

    /// One prefill chunk of the oldest prefilling sequence; a sequence whose
    /// prompt is done samples its first token and joins the batch (a prewarm
    /// becomes the prompt-cache entry).
    fn prefill(&self, l: &mut Loaded, s: &mut State, inspect: Option<&Inspector>) {
        if s.group.is_none() {
            s.group = Group::form(&mut s.prefilling, l.model.kinds());
        }
        if s.group.is_some() {
            self.prefill_group(l, s, inspect);
            return;
        }
        let Some(p) = s.prefilling.front_mut() else {
            return;
        };
        if p.sequence.gone() {
            if let Some(p) = s.prefilling.pop_front() {
                drop(p.sequence.fail(RunnerError::Request("cancelled".into())));
            }
            return;
        }
        let cap = if s.batch.is_empty() {
            usize::MAX
        } else {
            INTERLEAVED_CHUNK
        };
        let advanced = advance(&l.model, &mut p.sequence, &mut p.caches, cap);
        inspect_all(l, s, inspect);
        let first = match advanced {
            Ok(Advanced::Chunk) => return,
            Ok(Advanced::First(first)) => Some(Some(first)),
            Ok(Advanced::Join) => Some(None),
            Ok(Advanced::Prewarmed) => None,
            Err(e) => {
                if let Some(p) = s.prefilling.pop_front() {
                    s.pending.push(p.sequence.fail(self.in_step(e)));
                }
                return;
            }
        };
        let Some(Prefilling { sequence, caches }) = s.prefilling.pop_front() else {
            return;
        };
        let Some(first) = first else {
            let checkpoint = Checkpoint::of(&caches, sequence.prompt.len()).unwrap_or(None);
            // Kept apart too: later conversations that begin with it hit
            // even after others replace the entry.
            l.cache
                .set_prewarm(sequence.prompt.clone(), caches.clone(), sequence.kv);
            l.cache
                .replace(sequence.prompt.clone(), caches, checkpoint, sequence.kv);
            persist(l);
            s.pending
                .push(sequence.finish(crate::generate::FinishReason::Length));
            return;
        };
        if let Err(e) = s.batch.join(sequence, caches, first) {
            // The batch is in an unknown state: everything in it fails.
            for seq in s.batch.drain() {
                s.pending.push(seq.fail(self.in_step(RunnerError::Mlx {
                    phase: "joining the batch",
                    message: e.to_string(),
                })));
            }
        }
    }

    /// One pass of the group's prompts; once they are in, the group joins
    /// the batch. While the batch decodes, a pass takes
    /// [`INTERLEAVED_CHUNK`] tokens per row on a GPU (where 8 rows cost
    /// about what one does) and in all on the CPU (where they cost 8 times).
    fn prefill_group(&self, l: &mut Loaded, s: &mut State, inspect: Option<&Inspector>) {
        let Some(g) = s.group.as_mut() else {
            return;
        };
        if g.abandoned() {
            for seq in s.group.take().map(Group::into_rows).unwrap_or_default() {
                drop(seq.fail(RunnerError::Request("cancelled".into())));
            }
            return;
        }
        let budget = if s.batch.is_empty() {
            usize::MAX
        } else if l.on_cpu {
            INTERLEAVED_CHUNK
        } else {
            INTERLEAVED_CHUNK * g.len()
        };
        let advanced = g.advance(&l.model, budget);
        inspect_all(l, s, inspect);
        match advanced {
            Ok(false) => {}
            Ok(true) => {
                let Some(g) = s.group.take() else {
                    return;
                };
                let (rows, layers) = g.into_parts();
                if let Err(e) = s.batch.join_group(rows, layers) {
                    for seq in s.batch.drain() {
                        s.pending.push(seq.fail(self.in_step(RunnerError::Mlx {
                            phase: "joining the batch",
                            message: e.to_string(),
                        })));
                    }
                }
            }
            Err(e) => {
                let message = e.to_string();
                for seq in s.group.take().map(Group::into_rows).unwrap_or_default() {
                    s.pending.push(seq.fail(self.in_step(RunnerError::Mlx {
                        phase: "prefill",
                        message: message.clone(),
                    })));
                }
            }
        }
    }

    /// One decode step of the batch; sequences that end leave it.
    fn decode(&self, l: &mut Loaded, s: &mut State, news: bool, inspect: Option<&Inspector>) {
        if s.batch.is_empty() {
            return;
        }
        let left = match s.batch.step(&l.model, news) {
            Ok(left) => left,
            Err(e) => {
                let message = e.to_string();
                for seq in s.batch.drain() {
                    s.pending.push(seq.fail(self.in_step(RunnerError::Mlx {
                        phase: "decode",
                        message: message.clone(),
                    })));
                }
                return;
            }
        };
        for gone in left {
            match (gone.outcome, gone.cache) {
                (Progress::Finished(r), Some((caches, checkpoint, tail))) => {
                    let held = caches.first().map_or(0, LayerKv::offset) as usize;
                    let tokens: Vec<u32> = gone
                        .sequence
                        .prompt
                        .iter()
                        .chain(&gone.sequence.tokens)
                        .chain(&tail)
                        .copied()
                        .take(held)
                        .collect();
                    l.cache
                        .replace(tokens, caches, checkpoint, gone.sequence.kv);
                    persist(l);
                    s.pending.push(gone.sequence.finish(r));
                }
                (outcome, _) => s.pending.push(gone.sequence.finish(reason(outcome))),
            }
        }
        inspect_all(l, s, inspect);
    }
}

/// Bytes of every KV buffer: the prompt cache's, the batch's and the
/// prefilling sequences'.
pub(super) fn kv_bytes(l: &Loaded, s: &State) -> usize {
    l.cache.nbytes()
        + s.batch.nbytes()
        + s.prefilling
            .iter()
            .flat_map(|p| &p.caches)
            .map(LayerKv::nbytes)
            .sum::<usize>()
        + s.group.as_ref().map_or(0, Group::nbytes)
}

/// Writes the prompt cache's entry to the SSD tier (when on).
fn persist(l: &mut Loaded) {
    if let Some(disk) = l.disk.as_mut() {
        disk.persist(l.cache.tokens(), l.cache.layers(), l.cache.kv());
    }
}

/// Waits until the device has finished what was dispatched (a discarded
/// step in flight holds buffers until then).
pub(super) fn settle() {
    // SAFETY: waits on MLX's default stream; takes no arguments.
    let _ = unsafe { mlx_sys::mlx_synchronize_default() };
}

/// Shows the inspector every array that survives the step.
fn inspect_all(l: &Loaded, s: &State, inspect: Option<&Inspector>) {
    let Some(inspect) = inspect else {
        return;
    };
    let arrays: Vec<&Array> = l
        .cache
        .arrays()
        .chain(s.batch.arrays())
        .chain(
            s.prefilling
                .iter()
                .flat_map(|p| &p.caches)
                .flat_map(LayerKv::arrays),
        )
        .chain(s.group.iter().flat_map(Group::arrays))
        .collect();
    inspect(&arrays);
}
