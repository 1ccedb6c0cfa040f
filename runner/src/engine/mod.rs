//! The engine: one OS thread that owns MLX, the model and the prompt cache,
//! and runs every request in one continuously batched decode loop
//! ([`worker`]). Requests arrive over a bounded channel; each generation gets
//! its own event channel, and a closed event channel is the cancellation
//! signal. Health and status come from a [`Snapshot`] the thread publishes, so
//! they never wait behind a prefill.
mod admission;
pub mod batch;
pub mod disk;
pub mod embed;
mod group;
mod lockstep;
mod prefill;
pub mod prompt_cache;
pub mod sequence;
pub mod warmup;
mod worker;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use mlx_rs::Array;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};

use crate::cache::KvSetting;
use crate::chat::ChatParts;
use crate::error::{Result, RunnerError};
use crate::generate::{FinishReason, GenerateParams};
use crate::logprobs::TokenLogprob;
use crate::memory::Budget;
use crate::model::{Architecture, QuantParams};

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
    /// Most sequences prefilling or decoding at once (GROVE_NUM_PARALLEL);
    /// None = 8 on the CPU backend, 32 on a GPU.
    pub num_parallel: Option<usize>,
    /// Most KV tokens all sequences and the prompt cache hold together
    /// (GROVE_KV_CAPACITY); None = what the memory budget allows.
    pub kv_capacity: Option<usize>,
    /// Dtypes on the CPU backend.
    pub cpu_dtypes: crate::model::CpuDtypes,
    /// The KV cache of requests that do not choose one
    /// (GROVE_KV_CACHE_TYPE): full precision, or quantized from a start.
    pub kv: Option<KvSetting>,
    /// The SSD tier behind the prompt cache (GROVE_KV_DIR, GROVE_KV_DISK);
    /// `None`: off.
    pub disk: Option<disk::DiskConfig>,
    /// The group this runner is a rank of (tensor parallelism): rank 0
    /// takes requests and sends each step's news to the others, which
    /// follow ([`lockstep`]); `None`: alone.
    pub shard: Option<Arc<crate::shard::Comm>>,
}

/// The KV cache a job asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum KvChoice {
    /// The runner's ([`EngineConfig::kv`]).
    #[default]
    Runner,
    /// Full precision (`None`) or quantized as given.
    Exactly(Option<KvSetting>),
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
    /// Parameters one token uses (fewer for a mixture of experts).
    pub active_parameter_count: u64,
    pub context_length: usize,
    pub max_position_embeddings: Option<u32>,
    pub vocab_size: usize,
    pub num_layers: usize,
    /// The stored dtypes and what loading did to them.
    pub dtypes: crate::model::DtypeReport,
    /// Whether the model came from a GGUF file.
    pub gguf: bool,
    /// Most sequences prefilling or decoding at once.
    pub parallel: usize,
    /// KV tokens all sequences and the prompt cache may hold together.
    pub kv_capacity: usize,
    /// Whether it generates text (an encoder only embeds).
    pub generates: bool,
    /// Values in one embedding, and how they are made.
    pub embedding_length: usize,
    pub embedding: crate::model::pooling::EmbedSpec,
}

/// Memory figures, refreshed after every request.
#[derive(Debug, Clone, Default)]
pub struct MemoryFigures {
    pub budget: Option<Budget>,
    pub kv_bytes: u64,
    /// Of `kv_bytes`: the prompt-cache entry's checkpoint.
    pub checkpoint_bytes: u64,
    pub cached_tokens: usize,
    pub mlx_active: u64,
    pub mlx_cache: u64,
    pub mlx_peak: u64,
    /// The runner's KV setting in effect.
    pub kv: Option<KvSetting>,
    /// The SSD tier: this model's entries and their bytes, and the budget.
    pub disk_entries: usize,
    pub disk_bytes: u64,
    pub disk_budget: u64,
    /// A group's ranks when it last went idle: weights, KV, MLX active and
    /// peak bytes of each.
    pub ranks: Vec<[u64; 4]>,
}

/// What the engine publishes for Health and Status.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub state: LoadState,
    pub activity: Activity,
    pub facts: Option<Facts>,
    pub memory: MemoryFigures,
    /// Sequences prefilling or decoding.
    pub active: usize,
    /// Requests waiting for room in the batch.
    pub waiting: usize,
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
    /// The prompt ids (text and conversations are tokenized before they
    /// reach the engine; see [`crate::chat`]).
    pub input: Vec<u32>,
    pub params: GenerateParams,
    /// 0 = until the context is full.
    pub max_tokens: usize,
    /// 0 = the engine's context.
    pub num_ctx: usize,
    pub stop: Vec<String>,
    /// Its KV cache.
    pub kv: KvChoice,
    /// Structured output: the compiled constraint (compiled before the job
    /// reaches the engine thread).
    pub grammar: Option<crate::grammar::Grammar>,
    /// Log-probabilities: each generated token's, with this many most likely
    /// alternatives, as [`Event::Logprobs`].
    pub logprobs: Option<usize>,
}

/// Counters of one generation.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub prompt_tokens: usize,
    pub cached_prompt_tokens: usize,
    /// Of `cached_prompt_tokens`: loaded from the SSD tier.
    pub cached_from_disk: usize,
    pub prompt_eval: Duration,
    pub eval_tokens: usize,
    pub eval: Duration,
    /// Time on the output constraint, and its masks.
    pub constraint: Duration,
    pub constraint_steps: u32,
}

/// What a generation streams.
#[derive(Debug)]
pub enum Event {
    /// The request was accepted; text follows.
    Started,
    Text(String),
    /// Log-probabilities of generated tokens, in order (a job's `logprobs`).
    Logprobs(Vec<TokenLogprob>),
    Done {
        reason: FinishReason,
        metrics: Metrics,
        /// The stop string that ended the reply, if one did.
        stop: Option<String>,
    },
    /// The request failed (before `Started`: it was never accepted).
    Error(RunnerError),
}

/// Called (in tests) after every prefill chunk and decode step with every
/// array that survives it: the prompt cache's, the batch's and the
/// prefilling sequences' buffers and the tokens in flight.
pub type Inspector = Box<dyn Fn(&[&Array]) + Send>;

enum Request {
    Generate {
        /// Its number in a group's lockstep (given when rank 0 sends it to
        /// the others; 0 alone).
        id: u64,
        job: Box<Job>,
        events: mpsc::Sender<Event>,
        slot: OwnedSemaphorePermit,
    },
    Prewarm {
        id: u64,
        prompt: Vec<u32>,
        reply: oneshot::Sender<Result<Prewarmed>>,
        slot: OwnedSemaphorePermit,
    },
    /// An embedding call ([`embed`]).
    Embed {
        job: embed::EmbedJob,
        reply: oneshot::Sender<Result<embed::Embedded>>,
        slot: OwnedSemaphorePermit,
    },
    /// Wakes the engine to see that it is stopping.
    Stop,
}

impl Request {
    /// Whether nobody waits for the answer any more.
    fn abandoned(&self) -> bool {
        match self {
            Request::Generate { events, .. } => events.is_closed(),
            Request::Prewarm { reply, .. } => reply.is_closed(),
            Request::Embed { reply, .. } => reply.is_closed(),
            Request::Stop => false,
        }
    }
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
    slots: Arc<Semaphore>,
    /// The SSD tier's counts, kept by its writer thread.
    disk: Arc<disk::DiskStats>,
    disk_budget: u64,
}

impl Engine {
    /// Starts the engine thread; it loads the model in the background.
    pub fn spawn(config: EngineConfig) -> std::io::Result<(Self, JoinHandle<()>)> {
        Self::spawn_inspected(config, None)
    }

    /// [`Engine::spawn`] with an [`Inspector`] on the engine thread.
    pub fn spawn_inspected(
        config: EngineConfig,
        inspect: Option<Inspector>,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let mut config = config;
        let parallel = config.num_parallel.unwrap_or_else(default_parallel).max(1);
        config.num_parallel = Some(parallel);
        let queue = config.queue.max(1);
        let slots = Arc::new(Semaphore::new(parallel + queue));
        // Room for every slot's request and a Stop.
        let (requests, rx) = mpsc::channel(parallel + queue + 1);
        let (snap_tx, snapshot) = watch::channel(Snapshot {
            state: LoadState::Loading,
            activity: Activity::Idle,
            facts: None,
            memory: MemoryFigures::default(),
            active: 0,
            waiting: 0,
        });
        let (parts_tx, parts) = watch::channel(None);
        let stopping = Arc::new(AtomicBool::new(false));
        let worker_stopping = stopping.clone();
        let disk = Arc::new(disk::DiskStats::default());
        let disk_budget = config.disk.as_ref().map_or(0, |d| d.budget);
        let worker_disk = disk.clone();
        let thread = std::thread::Builder::new()
            .name("grove-engine".into())
            .spawn(move || {
                let worker = worker::Worker {
                    lockstep: config.shard.clone(),
                    config,
                    snapshot: snap_tx,
                    parts: parts_tx,
                    stopping: worker_stopping,
                    disk: worker_disk,
                };
                worker.run(rx, inspect)
            })?;
        Ok((
            Self {
                requests,
                snapshot,
                parts,
                stopping,
                queue,
                slots,
                disk,
                disk_budget,
            },
            thread,
        ))
    }

    /// Stops the engine: running generations end at the next step or prefill
    /// chunk, queued ones fail, and the thread exits.
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

    /// Resolves once the engine has stopped (or its thread is gone).
    pub async fn stopped(&self) {
        let mut snapshot = self.snapshot.clone();
        let _ = snapshot.wait_for(|s| s.state == LoadState::Stopping).await;
    }

    /// The latest snapshot (never waits for the engine).
    pub fn snapshot(&self) -> Snapshot {
        let mut s = self.snapshot.borrow().clone();
        // Live: the writer thread counts after each write.
        s.memory.disk_entries = self.disk.entries.load(Ordering::Relaxed) as usize;
        s.memory.disk_bytes = self.disk.bytes.load(Ordering::Relaxed);
        s.memory.disk_budget = self.disk_budget;
        s
    }

    /// A place for one more request: `parallel` of them run, `queue` more
    /// wait; a request holds its place until its sequence ends.
    fn slot(&self) -> std::result::Result<OwnedSemaphorePermit, SubmitError> {
        self.slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| SubmitError::QueueFull(self.queue))
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
        let slot = self.slot()?;
        self.submit(Request::Generate {
            id: 0,
            job: Box::new(job),
            events,
            slot,
        })?;
        Ok(rx)
    }

    /// Embeds token lists (see [`embed`]); waits for the vectors.
    pub async fn embed(
        &self,
        job: embed::EmbedJob,
    ) -> std::result::Result<Result<embed::Embedded>, SubmitError> {
        let (reply, rx) = oneshot::channel();
        let slot = self.slot()?;
        self.submit(Request::Embed { job, reply, slot })?;
        rx.await.map_err(|_| SubmitError::Stopped)
    }

    /// Prefills the ids of a rendered system prompt into the prompt cache.
    pub async fn prewarm(
        &self,
        prompt: Vec<u32>,
    ) -> std::result::Result<Result<Prewarmed>, SubmitError> {
        self.queue_prewarm(prompt)?
            .await
            .map_err(|_| SubmitError::Stopped)
    }

    /// Queues a prewarm (ahead of anything submitted after this returns);
    /// its result comes on the receiver.
    pub fn queue_prewarm(
        &self,
        prompt: Vec<u32>,
    ) -> std::result::Result<oneshot::Receiver<Result<Prewarmed>>, SubmitError> {
        let (reply, rx) = oneshot::channel();
        let slot = self.slot()?;
        self.submit(Request::Prewarm {
            id: 0,
            prompt,
            reply,
            slot,
        })?;
        Ok(rx)
    }
}

/// Sequences at once when GROVE_NUM_PARALLEL is not set: a CPU is
/// compute-bound beyond a few rows, a GPU is not.
fn default_parallel() -> usize {
    if crate::model::dtypes::cpu_backend() {
        8
    } else {
        32
    }
}
