//! The engine: one OS thread that owns MLX, the model, the tokenizer and the
//! prompt cache. Requests arrive over a bounded channel; each generation gets its
//! own event channel, and a closed event channel is the cancellation signal.
//! Health and status come from a [`Snapshot`] the thread publishes, so they
//! never wait behind a prefill.
pub mod prompt_cache;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use crate::chat::ChatParts;
use crate::error::{Result, RunnerError};
use crate::generate::{FinishReason, Flow, GenerateParams, Limits, generate_cached};
use crate::memory::{Budget, budget_memory};
use crate::model::{Architecture, Model, QuantParams};
use crate::tokenizer::Tokenizer;
use prompt_cache::PromptCache;

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub model_dir: PathBuf,
    /// Context limit for every request (GROVE_CONTEXT_LENGTH); None = no extra limit.
    pub context_length: Option<usize>,
    /// Default prompt tokens per prefill pass.
    pub prefill_chunk: usize,
    /// Requests that may wait for the engine.
    pub queue: usize,
    /// Dtypes on the CPU backend.
    pub cpu_dtypes: crate::model::CpuDtypes,
}

/// Where loading stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadState {
    Loading,
    Ready,
    Failed(String),
    Stopping,
}

/// What the engine is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    Idle,
    Prefilling,
    Decoding,
}

/// Facts about the loaded model.
#[derive(Debug, Clone)]
pub struct Facts {
    pub architecture: Architecture,
    pub dtype: mlx_rs::Dtype,
    pub quantization: Option<QuantParams>,
    pub parameter_count: u64,
    pub context_length: usize,
    pub max_position_embeddings: Option<u32>,
    pub vocab_size: usize,
    pub num_layers: usize,
    /// The stored dtypes and what loading did to them.
    pub dtypes: crate::model::DtypeReport,
    /// Whether the model came from a GGUF file.
    pub gguf: bool,
}

/// Memory figures, refreshed after every request.
#[derive(Debug, Clone, Default)]
pub struct MemoryFigures {
    pub budget: Option<Budget>,
    pub kv_bytes: u64,
    pub cached_tokens: usize,
    pub mlx_active: u64,
    pub mlx_cache: u64,
    pub mlx_peak: u64,
}

/// What the engine publishes for Health and Status.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub state: LoadState,
    pub activity: Activity,
    pub facts: Option<Facts>,
    pub memory: MemoryFigures,
}

/// A prompt, as text or ids (conversations are rendered and tokenized before
/// they reach the engine; see [`crate::chat`]).
#[derive(Debug, Clone)]
pub enum Input {
    Text(String),
    Tokens(Vec<u32>),
}

/// What prewarming put into the prompt cache.
#[derive(Debug, Clone, Copy)]
pub struct Prewarmed {
    pub cached_tokens: usize,
    pub prompt_eval: Duration,
}

/// One generation request.
#[derive(Debug, Clone)]
pub struct Job {
    pub input: Input,
    pub params: GenerateParams,
    /// 0 = until the context is full.
    pub max_tokens: usize,
    /// 0 = the engine's context.
    pub num_ctx: usize,
    pub stop: Vec<String>,
}

/// Counters of one generation.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub prompt_tokens: usize,
    pub cached_prompt_tokens: usize,
    pub prompt_eval: Duration,
    pub eval_tokens: usize,
    pub eval: Duration,
}

/// What a generation streams.
#[derive(Debug)]
pub enum Event {
    /// The request was accepted; text follows.
    Started,
    Text(String),
    Done {
        reason: FinishReason,
        metrics: Metrics,
    },
    /// The request failed (before `Started`: it was never accepted).
    Error(RunnerError),
}

enum Request {
    Generate {
        job: Job,
        events: mpsc::Sender<Event>,
    },
    Prewarm {
        prompt: Vec<u32>,
        reply: oneshot::Sender<Result<Prewarmed>>,
    },
    /// Wakes the engine to see that it is stopping.
    Stop,
}

/// Why a request was not queued.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the runner is busy: {0} requests are already waiting")]
    QueueFull(usize),
    #[error("the engine has stopped")]
    Stopped,
}

/// The handle the gRPC handlers hold. Dropping every handle stops the engine.
#[derive(Clone)]
pub struct Engine {
    requests: mpsc::Sender<Request>,
    snapshot: watch::Receiver<Snapshot>,
    parts: watch::Receiver<Option<Arc<ChatParts>>>,
    stopping: Arc<AtomicBool>,
    queue: usize,
}

impl Engine {
    /// Starts the engine thread; it loads the model in the background.
    pub fn spawn(config: EngineConfig) -> std::io::Result<(Self, JoinHandle<()>)> {
        let (requests, rx) = mpsc::channel(config.queue.max(1));
        let (snap_tx, snapshot) = watch::channel(Snapshot {
            state: LoadState::Loading,
            activity: Activity::Idle,
            facts: None,
            memory: MemoryFigures::default(),
        });
        let (parts_tx, parts) = watch::channel(None);
        let stopping = Arc::new(AtomicBool::new(false));
        let queue = config.queue.max(1);
        let worker_stopping = stopping.clone();
        let thread = std::thread::Builder::new()
            .name("grove-engine".into())
            .spawn(move || Worker::run(config, rx, snap_tx, parts_tx, worker_stopping))?;
        Ok((
            Self {
                requests,
                snapshot,
                parts,
                stopping,
                queue,
            },
            thread,
        ))
    }

    /// Stops the engine: the running generation ends at its next step or
    /// prefill chunk, queued ones fail, and the thread exits.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = self.requests.try_send(Request::Stop);
    }

    /// The tokenizer and templates, once the model has loaded.
    pub async fn chat_parts(&self) -> Result<Arc<ChatParts>> {
        let mut parts = self.parts.clone();
        let mut snapshot = self.snapshot.clone();
        loop {
            if let Some(p) = parts.borrow_and_update().clone() {
                return Ok(p);
            }
            let state = snapshot.borrow_and_update().state.clone();
            match state {
                LoadState::Failed(e) => {
                    return Err(RunnerError::Request(format!(
                        "the model failed to load: {e}"
                    )));
                }
                LoadState::Stopping => {
                    return Err(RunnerError::Request("the runner is stopping".into()));
                }
                LoadState::Loading | LoadState::Ready => {}
            }
            tokio::select! {
                r = parts.changed() => if r.is_err() { return Err(RunnerError::Request("the engine has stopped".into())) },
                r = snapshot.changed() => if r.is_err() { return Err(RunnerError::Request("the engine has stopped".into())) },
            }
        }
    }

    /// The latest snapshot (never waits for the engine).
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot.borrow().clone()
    }

    fn submit(&self, request: Request) -> std::result::Result<(), SubmitError> {
        self.requests.try_send(request).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => SubmitError::QueueFull(self.queue),
            mpsc::error::TrySendError::Closed(_) => SubmitError::Stopped,
        })
    }

    /// Queues a generation; its events arrive on the returned channel.
    pub fn generate(&self, job: Job) -> std::result::Result<mpsc::Receiver<Event>, SubmitError> {
        let (events, rx) = mpsc::channel(64);
        self.submit(Request::Generate { job, events })?;
        Ok(rx)
    }

    /// Prefills the ids of a rendered system prompt into the prompt cache.
    pub async fn prewarm(
        &self,
        prompt: Vec<u32>,
    ) -> std::result::Result<Result<Prewarmed>, SubmitError> {
        let (reply, rx) = oneshot::channel();
        self.submit(Request::Prewarm { prompt, reply })?;
        rx.await.map_err(|_| SubmitError::Stopped)
    }
}

/// Sends `event`, waiting while the reader is slow; false once it has gone.
fn send(events: &mpsc::Sender<Event>, mut event: Event) -> bool {
    loop {
        match events.try_send(event) {
            Ok(()) => return true,
            Err(mpsc::error::TrySendError::Closed(_)) => return false,
            Err(mpsc::error::TrySendError::Full(back)) => {
                event = back;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

struct Loaded {
    model: Model,
    tokenizer: Arc<Tokenizer>,
    cache: PromptCache,
    budget: Budget,
    context: usize,
}

struct Worker {
    config: EngineConfig,
    snapshot: watch::Sender<Snapshot>,
    parts: watch::Sender<Option<Arc<ChatParts>>>,
    stopping: Arc<AtomicBool>,
}

impl Worker {
    fn run(
        config: EngineConfig,
        mut rx: mpsc::Receiver<Request>,
        snapshot: watch::Sender<Snapshot>,
        parts: watch::Sender<Option<Arc<ChatParts>>>,
        stopping: Arc<AtomicBool>,
    ) {
        let worker = Self {
            config,
            snapshot,
            parts,
            stopping,
        };
        let mut loaded = match worker.load() {
            Ok(l) => Some(l),
            Err(e) => {
                worker
                    .snapshot
                    .send_modify(|s| s.state = LoadState::Failed(e.to_string()));
                None
            }
        };
        while let Some(request) = rx.blocking_recv() {
            if worker.stopping.load(Ordering::SeqCst) {
                let err = || RunnerError::Stopped;
                match request {
                    Request::Generate { events, .. } => drop(send(&events, Event::Error(err()))),
                    Request::Prewarm { reply, .. } => drop(reply.send(Err(err()))),
                    Request::Stop => {}
                }
                if rx.is_empty() {
                    break;
                }
                continue;
            }
            match (request, loaded.as_mut()) {
                (Request::Stop, _) => {}
                (Request::Generate { job, events }, Some(l)) => worker.generate(l, job, &events),
                (Request::Prewarm { prompt, reply }, Some(l)) => {
                    let _ = reply.send(worker.prewarm(l, &prompt));
                }
                (request, None) => {
                    let err = || RunnerError::Request("the model failed to load".into());
                    match request {
                        Request::Generate { events, .. } => {
                            send(&events, Event::Error(err()));
                        }
                        Request::Prewarm { reply, .. } => drop(reply.send(Err(err()))),
                        Request::Stop => {}
                    }
                }
            }
        }
        worker
            .snapshot
            .send_modify(|s| s.state = LoadState::Stopping);
    }

    fn load(&self) -> Result<Loaded> {
        let opened = crate::source::open(&self.config.model_dir, self.config.cpu_dtypes)?;
        let model = opened.model;
        let tokenizer = Arc::new(opened.tokenizer);
        let budget = Budget::new(&model, budget_memory(), self.config.prefill_chunk as u64);
        budget.apply().map_err(|e| RunnerError::Mlx {
            phase: "setting memory limits",
            message: e.to_string(),
        })?;
        let mut context = budget.kv_capacity_tokens as usize;
        if let Some(max) = model.max_position_embeddings {
            context = context.min(max as usize);
        }
        if let Some(limit) = self.config.context_length {
            context = context.min(limit);
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
            context_length: context,
            max_position_embeddings: model.max_position_embeddings,
            vocab_size: model.spec.vocab as usize,
            num_layers: model.decoder.num_layers(),
            dtypes: model.dtypes,
            gguf: opened.kind == crate::source::SourceKind::Gguf,
        };
        let cache = PromptCache::new(model.decoder.num_layers());
        let parts = ChatParts::new(tokenizer.clone(), opened.templates.spec(), context);
        let loaded = Loaded {
            model,
            tokenizer,
            cache,
            budget,
            context,
        };
        self.parts.send_replace(Some(Arc::new(parts)));
        self.snapshot.send_modify(|s| {
            s.state = LoadState::Ready;
            s.facts = Some(facts);
        });
        self.publish_memory(&loaded);
        Ok(loaded)
    }

    fn publish_memory(&self, l: &Loaded) {
        let figures = MemoryFigures {
            budget: Some(l.budget),
            kv_bytes: l.cache.nbytes() as u64,
            cached_tokens: l.cache.len(),
            mlx_active: mlx_rs::memory::active_memory().unwrap_or(0) as u64,
            mlx_cache: mlx_rs::memory::cache_memory().unwrap_or(0) as u64,
            mlx_peak: mlx_rs::memory::peak_memory().unwrap_or(0) as u64,
        };
        self.snapshot.send_modify(|s| {
            s.memory = figures;
            s.activity = Activity::Idle;
        });
    }

    /// Prefills the start of conversations (a rendered system prompt and its
    /// tools, see [`crate::chat::conversation_prefix`]) into the entry.
    fn prewarm(&self, l: &mut Loaded, prompt: &[u32]) -> Result<Prewarmed> {
        if prompt.is_empty() {
            return Err(RunnerError::Request(
                "the system prompt renders to nothing".into(),
            ));
        }
        if prompt.len() > l.context {
            return Err(RunnerError::Request(format!(
                "the system prompt has {} tokens, more than the context length of {}",
                prompt.len(),
                l.context
            )));
        }
        self.snapshot
            .send_modify(|s| s.activity = Activity::Prefilling);
        let cached = l.cache.reuse_for(prompt);
        let params = GenerateParams {
            max_tokens: 0,
            ..GenerateParams::default()
        };
        let limits = Limits {
            context: l.context,
            cancelled: &|| self.stopping.load(Ordering::SeqCst),
            inspect: None,
        };
        let outcome = generate_cached(
            &l.model,
            l.cache.layers_mut(),
            cached,
            prompt,
            &[],
            &params,
            &limits,
            |_| Flow::Continue,
        );
        let out = match outcome {
            Ok(out) => out,
            Err(e) => {
                l.cache.clear();
                self.publish_memory(l);
                return Err(e);
            }
        };
        l.cache.commit(prompt.iter().copied());
        let _ = mlx_rs::memory::clear_cache();
        self.publish_memory(l);
        Ok(Prewarmed {
            cached_tokens: l.cache.len(),
            prompt_eval: Duration::from_secs_f64(out.prompt_seconds),
        })
    }

    fn generate(&self, l: &mut Loaded, job: Job, events: &mpsc::Sender<Event>) {
        let outcome = self.generate_inner(l, job, events);
        if let Err(e) = outcome {
            // A failed generation may leave the layers half-extended.
            l.cache.clear();
            send(events, Event::Error(e));
        }
        let _ = mlx_rs::memory::clear_cache();
        self.publish_memory(l);
    }

    fn generate_inner(&self, l: &mut Loaded, job: Job, events: &mpsc::Sender<Event>) -> Result<()> {
        let prompt = match &job.input {
            Input::Text(text) => l.tokenizer.encode_prompt(text)?,
            Input::Tokens(ids) => ids.clone(),
        };
        let context = match job.num_ctx {
            0 => l.context,
            n => n.min(l.context),
        };
        if prompt.is_empty() {
            return Err(RunnerError::Request("the prompt is empty".into()));
        }
        if prompt.len() > context {
            return Err(RunnerError::Request(format!(
                "the prompt has {} tokens, more than the context length of {context}",
                prompt.len()
            )));
        }
        let mut params = job.params.clone();
        params.max_tokens = match job.max_tokens {
            0 => usize::MAX,
            n => n,
        };
        if !send(events, Event::Started) {
            return Ok(());
        }
        self.snapshot
            .send_modify(|s| s.activity = Activity::Prefilling);
        let cached = l.cache.reuse_for(&prompt);
        let mut text = crate::detokenize::Detokenizer::new(&l.tokenizer);
        let mut stops = crate::stop::StopMatcher::new(job.stop.iter().cloned())?;
        let mut gone = false;
        let mut stopped = false;
        let mut first = true;
        let cancelled = || events.is_closed() || self.stopping.load(Ordering::SeqCst);
        let limits = Limits {
            context,
            cancelled: &cancelled,
            inspect: None,
        };
        let started = Instant::now();
        let eos = l.tokenizer.eos_ids().to_vec();
        let out = generate_cached(
            &l.model,
            l.cache.layers_mut(),
            cached,
            &prompt,
            &eos,
            &params,
            &limits,
            |token| {
                if first {
                    first = false;
                    self.snapshot
                        .send_modify(|s| s.activity = Activity::Decoding);
                }
                let Some(piece) = text.push(token) else {
                    return Flow::Continue;
                };
                let out = stops.push(&piece);
                if !out.text.is_empty() && !send(events, Event::Text(out.text)) {
                    gone = true;
                    return Flow::Stop;
                }
                if out.stop.is_some() {
                    stopped = true;
                    return Flow::Stop;
                }
                Flow::Continue
            },
        )?;
        l.cache
            .commit(prompt.iter().copied().chain(out.tokens.iter().copied()));
        if gone || events.is_closed() {
            return Ok(());
        }
        if self.stopping.load(Ordering::SeqCst) {
            return Err(RunnerError::Stopped);
        }
        let mut reason = out.finish;
        if !stopped {
            let tail = text.finish().unwrap_or_default();
            let mut last = stops.push(&tail);
            if last.stop.is_none() {
                let end = stops.finish();
                last.text.push_str(&end.text);
                last.stop = end.stop;
            }
            if last.stop.is_some() {
                reason = FinishReason::Stop;
            }
            if !last.text.is_empty() {
                send(events, Event::Text(last.text));
            }
        }
        let metrics = Metrics {
            prompt_tokens: out.prompt_tokens,
            cached_prompt_tokens: out.cached_tokens,
            prompt_eval: Duration::from_secs_f64(out.prompt_seconds),
            eval_tokens: out.tokens.len(),
            eval: started
                .elapsed()
                .saturating_sub(Duration::from_secs_f64(out.prompt_seconds)),
        };
        send(events, Event::Done { reason, metrics });
        Ok(())
    }
}
