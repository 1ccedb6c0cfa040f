//! The scheduler: one task owns every runner's state and answers commands sent
//! over a bounded channel with oneshot replies. It starts runners (one process
//! per model), fits them into the memory budget by evicting idle ones least
//! recently used first, unloads them when their keep_alive runs out, bounds each
//! model's queue, and forgets a runner that dies so the next request starts a
//! fresh one.
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use grove_proto::runner::v1 as rpb;
use grove_proto::runner::v1::runner_client::RunnerClient;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::transport::Channel;

use crate::duration::KeepAlive;
use crate::model_size::{ModelSize, model_size};
use crate::runner_proc::{self, StderrTail};

/// How the scheduler is set up.
#[derive(Debug, Clone)]
pub struct SchedConfig {
    pub runner_bin: PathBuf,
    /// Private (0700) directory for the runners' sockets.
    pub socket_dir: PathBuf,
    pub keep_alive: KeepAlive,
    /// Most models loaded at once.
    pub max_loaded: usize,
    /// Most requests per model, running or waiting.
    pub max_queue: usize,
    pub load_timeout: Duration,
    /// A loaded runner that misses Health for this long is killed.
    pub runner_timeout: Duration,
    /// Memory the loaded models' reservations may add up to.
    pub memory_budget: u64,
    /// Passed to every runner (GROVE_CONTEXT_LENGTH).
    pub context_length: Option<u32>,
    /// Processes a model is split over when a request does not say
    /// (GROVE_SHARDS).
    pub shards: u32,
    /// The memory budget is one GPU's, and a group's ranks each have their
    /// own: a group of N reserves 1/N of the model. (On the CPU all ranks
    /// share the host's memory and the whole model is reserved.)
    pub per_device: bool,
}

/// The most processes one model may be split over (as the runner allows).
pub const MAX_SHARDS: u32 = 16;

/// Why a request could not get a runner.
#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    NoMemory(String),
    #[error("loading {model}: {message}")]
    LoadFailed { model: String, message: String },
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    Invalid(String),
}

/// What a loaded runner reports about itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunnerFacts {
    pub context_length: u32,
    pub on_gpu: bool,
    pub kv_capacity_tokens: u32,
    /// 0: a full-precision KV cache.
    pub kv_bits: u32,
}

/// A loaded model, for `ps`.
#[derive(Debug, Clone)]
pub struct Running {
    pub name: String,
    pub reserved_bytes: u64,
    pub facts: RunnerFacts,
    /// When it will unload, if it is idle with a finite keep_alive.
    pub expires: Option<SystemTime>,
    pub active: usize,
    pub pid: u32,
    pub loading: bool,
    /// Processes the model is split over.
    pub shards: u32,
    /// A group's ranks: (pid, resident bytes), in rank order.
    pub ranks: Vec<(u32, u64)>,
}

/// The right to use a runner for one request; dropping it releases the runner.
pub struct Lease {
    pub client: RunnerClient<Channel>,
    pub stderr: StderrTail,
    /// Time spent loading the runner for this request (zero if it was loaded).
    pub load_time: Duration,
    key: PathBuf,
    generation: u64,
    keep_alive: KeepAlive,
    commands: mpsc::Sender<Command>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let release = Command::Release {
            key: self.key.clone(),
            generation: self.generation,
            keep_alive: self.keep_alive,
        };
        if let Err(mpsc::error::TrySendError::Full(cmd)) = self.commands.try_send(release) {
            let commands = self.commands.clone();
            tokio::spawn(async move {
                let _ = commands.send(cmd).await;
            });
        }
    }
}

struct Loaded {
    client: RunnerClient<Channel>,
    facts: RunnerFacts,
}

enum Command {
    Acquire {
        name: String,
        key: PathBuf,
        keep_alive: Option<KeepAlive>,
        shards: Option<u32>,
        reply: oneshot::Sender<Result<Lease, SchedError>>,
    },
    Release {
        key: PathBuf,
        generation: u64,
        keep_alive: KeepAlive,
    },
    Loaded {
        key: PathBuf,
        generation: u64,
        result: Result<Loaded, String>,
    },
    Exited {
        key: PathBuf,
        generation: u64,
    },
    Unload {
        key: PathBuf,
        reply: oneshot::Sender<bool>,
    },
    Ps {
        reply: oneshot::Sender<Vec<Running>>,
    },
    Shutdown {
        reply: oneshot::Sender<()>,
    },
}

/// The handle the API holds.
#[derive(Clone)]
pub struct Scheduler {
    commands: mpsc::Sender<Command>,
}

impl Scheduler {
    /// Starts the scheduler task.
    pub fn start(config: SchedConfig) -> Self {
        let (tx, rx) = mpsc::channel(256);
        let actor = Actor {
            config,
            slots: HashMap::new(),
            commands: tx.clone(),
            next_generation: 1,
            closing: false,
        };
        tokio::spawn(actor.run(rx));
        Self { commands: tx }
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, SchedError> {
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(make(reply))
            .await
            .map_err(|_| SchedError::ShuttingDown)?;
        rx.await.map_err(|_| SchedError::ShuttingDown)
    }

    /// A runner for the model in `key` (a canonical directory), loading it if needed.
    pub async fn acquire(
        &self,
        name: String,
        key: PathBuf,
        keep_alive: Option<KeepAlive>,
        shards: Option<u32>,
    ) -> Result<Lease, SchedError> {
        self.ask(|reply| Command::Acquire {
            name,
            key,
            keep_alive,
            shards,
            reply,
        })
        .await?
    }

    /// Unloads the model now if it is loaded and idle (or when its requests end).
    pub async fn unload(&self, key: PathBuf) -> Result<bool, SchedError> {
        self.ask(|reply| Command::Unload { key, reply }).await
    }

    /// The loaded models.
    pub async fn ps(&self) -> Result<Vec<Running>, SchedError> {
        self.ask(|reply| Command::Ps { reply }).await
    }

    /// Stops every runner and waits until they are reaped.
    pub async fn shutdown(&self) {
        let _ = self.ask(|reply| Command::Shutdown { reply }).await;
    }
}

enum State {
    Loading {
        waiters: Vec<(oneshot::Sender<Result<Lease, SchedError>>, KeepAlive)>,
        started: Instant,
    },
    Ready {
        client: RunnerClient<Channel>,
        facts: RunnerFacts,
    },
}

struct Slot {
    name: String,
    generation: u64,
    state: State,
    size: ModelSize,
    /// Requests holding or waiting for this runner.
    active: usize,
    keep_alive: KeepAlive,
    last_used: Instant,
    idle_until: Option<Instant>,
    pid: u32,
    /// Processes the model is split over (the runner is their launcher).
    shards: u32,
    stderr: StderrTail,
    /// Dropping it stops the runner; the supervisor reports `Exited`.
    stop: Option<oneshot::Sender<()>>,
    stopped: Option<watch::Receiver<bool>>,
}

struct Actor {
    config: SchedConfig,
    slots: HashMap<PathBuf, Slot>,
    commands: mpsc::Sender<Command>,
    next_generation: u64,
    closing: bool,
}

impl Actor {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(cmd) => self.handle(cmd).await,
                    None => break,
                },
                _ = tick.tick() => self.expire(),
            }
        }
    }

    async fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Acquire {
                name,
                key,
                keep_alive,
                shards,
                reply,
            } => {
                let keep_alive = keep_alive.unwrap_or(self.config.keep_alive);
                let shards = shards.unwrap_or(self.config.shards);
                if let Some(Err(e)) = self.acquire(name, key, keep_alive, shards, reply) {
                    tracing_warn(&e.to_string());
                }
            }
            Command::Release {
                key,
                generation,
                keep_alive,
            } => self.release(&key, generation, keep_alive),
            Command::Loaded {
                key,
                generation,
                result,
            } => self.loaded(&key, generation, result),
            Command::Exited { key, generation } => {
                if self
                    .slots
                    .get(&key)
                    .is_some_and(|s| s.generation == generation)
                    && let Some(slot) = self.slots.remove(&key)
                {
                    fail_waiters(slot, "the runner exited while loading");
                }
            }
            Command::Unload { key, reply } => {
                let found = self.slots.get_mut(&key).map(|slot| {
                    slot.keep_alive = KeepAlive::Unload;
                    slot.active == 0
                });
                if found == Some(true) {
                    self.remove(&key);
                }
                let _ = reply.send(found.is_some());
            }
            Command::Ps { reply } => {
                let _ = reply.send(self.ps());
            }
            Command::Shutdown { reply } => {
                self.closing = true;
                let keys: Vec<PathBuf> = self.slots.keys().cloned().collect();
                let mut waits = Vec::new();
                for key in keys {
                    if let Some(mut slot) = self.slots.remove(&key) {
                        waits.extend(slot.stopped.take());
                        fail_waiters(slot, "the daemon is shutting down");
                    }
                }
                let all = async {
                    for mut w in waits {
                        let _ = w.wait_for(|s| *s).await;
                    }
                };
                let _ = tokio::time::timeout(runner_proc::STOP_GRACE + Duration::from_secs(2), all)
                    .await;
                let _ = reply.send(());
            }
        }
    }

    /// Returns `Some(Err)` only for logging; the reply has been sent.
    fn acquire(
        &mut self,
        name: String,
        key: PathBuf,
        keep_alive: KeepAlive,
        shards: u32,
        reply: oneshot::Sender<Result<Lease, SchedError>>,
    ) -> Option<Result<(), SchedError>> {
        if self.closing {
            let _ = reply.send(Err(SchedError::ShuttingDown));
            return None;
        }
        if !(1..=MAX_SHARDS).contains(&shards) {
            let _ = reply.send(Err(SchedError::Invalid(format!(
                "shards must be 1 to {MAX_SHARDS}, not {shards}"
            ))));
            return None;
        }
        // Loaded as another group: reloaded when idle, else the request is
        // refused (the running requests keep their runner).
        if let Some(slot) = self.slots.get(&key)
            && slot.shards != shards
        {
            if slot.active == 0 && matches!(slot.state, State::Ready { .. }) {
                self.remove(&key);
            } else {
                let _ = reply.send(Err(SchedError::Busy(format!(
                    "{name} is loaded over {} processes and in use; a request for {shards} \
                     can be served once it is idle",
                    slot.shards
                ))));
                return None;
            }
        }
        let max_queue = self.config.max_queue;
        if let Some(slot) = self.slots.get_mut(&key) {
            if slot.active >= max_queue {
                let _ = reply.send(Err(SchedError::Busy(format!(
                    "{name} is busy: {} requests are running or waiting (GROVE_MAX_QUEUE={max_queue})",
                    slot.active
                ))));
                return None;
            }
            slot.active += 1;
            slot.idle_until = None;
            slot.last_used = Instant::now();
            match &mut slot.state {
                State::Loading { waiters, .. } => waiters.push((reply, keep_alive)),
                State::Ready { client, .. } => {
                    let client = client.clone();
                    let lease = make_lease(
                        slot,
                        &key,
                        client,
                        keep_alive,
                        Duration::ZERO,
                        &self.commands,
                    );
                    let _ = reply.send(Ok(lease));
                }
            }
            return None;
        }
        let size = match model_size(&key) {
            Ok(s) if self.config.per_device && shards > 1 => {
                let n = u64::from(shards);
                ModelSize {
                    weight_bytes: s.weight_bytes.div_ceil(n),
                    kv_bytes_per_token: s.kv_bytes_per_token.div_ceil(n),
                    min_bytes: s.min_bytes.div_ceil(n),
                }
            }
            Ok(s) => s,
            Err(message) => {
                let _ = reply.send(Err(SchedError::LoadFailed {
                    model: name,
                    message,
                }));
                return None;
            }
        };
        if let Err(e) = self.make_room(&name, size) {
            let _ = reply.send(Err(e));
            return None;
        }
        self.load(name, key, size, keep_alive, shards, reply);
        None
    }

    /// Evicts idle runners, least recently used first, until `size` fits.
    fn make_room(&mut self, name: &str, size: ModelSize) -> Result<(), SchedError> {
        loop {
            let reserved: u64 = self.slots.values().map(|s| s.size.min_bytes).sum();
            let too_many = self.slots.len() >= self.config.max_loaded;
            let too_big = reserved + size.min_bytes > self.config.memory_budget;
            if !too_many && !too_big {
                return Ok(());
            }
            let idle = self
                .slots
                .iter()
                .filter(|(_, s)| s.active == 0 && matches!(s.state, State::Ready { .. }))
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| k.clone());
            match idle {
                Some(key) => self.remove(&key),
                None if too_many => {
                    return Err(SchedError::Busy(format!(
                        "cannot load {name}: {} models are loaded and busy (GROVE_MAX_LOADED={})",
                        self.slots.len(),
                        self.config.max_loaded
                    )));
                }
                None => {
                    return Err(SchedError::NoMemory(format!(
                        "cannot load {name}: it needs {} bytes (weights {} + minimum KV cache and headroom), \
                         {} of the {} byte budget are held by busy models",
                        size.min_bytes, size.weight_bytes, reserved, self.config.memory_budget
                    )));
                }
            }
        }
    }

    fn load(
        &mut self,
        name: String,
        key: PathBuf,
        size: ModelSize,
        keep_alive: KeepAlive,
        shards: u32,
        reply: oneshot::Sender<Result<Lease, SchedError>>,
    ) {
        let generation = self.next_generation;
        self.next_generation += 1;
        let socket = self
            .config
            .socket_dir
            .join(format!("runner-{generation}.sock"));
        let mut extra = vec![
            "--queue".to_string(),
            (self.config.max_queue + 1).to_string(),
        ];
        if let Some(ctx) = self.config.context_length {
            extra.extend(["--context-length".to_string(), ctx.to_string()]);
        }
        // Always said, so a GROVE_SHARDS in the runner's environment does
        // not decide instead.
        extra.extend(["--shards".to_string(), shards.to_string()]);
        let spawned = match runner_proc::spawn(&self.config.runner_bin, &key, &socket, &extra) {
            Ok(s) => s,
            Err(message) => {
                let _ = reply.send(Err(SchedError::LoadFailed {
                    model: name,
                    message,
                }));
                return;
            }
        };
        let (stop_tx, stop_rx) = oneshot::channel();
        let (stopped_tx, stopped_rx) = watch::channel(false);
        let pid = spawned.pid;
        let stderr = spawned.stderr.clone();
        // The supervisor owns the child: it reaps it and reports the exit.
        let commands = self.commands.clone();
        let (exit_key, exit_generation) = (key.clone(), generation);
        let child = spawned.child;
        tokio::spawn(async move {
            let mut child = child;
            tokio::select! {
                _ = child.wait() => {}
                _ = stop_rx => runner_proc::stop(child, pid).await,
            }
            let _ = stopped_tx.send(true);
            let _ = commands
                .send(Command::Exited {
                    key: exit_key,
                    generation: exit_generation,
                })
                .await;
        });
        // The loader waits for Health READY, then reports back and watches it.
        let commands = self.commands.clone();
        let (timeout, runner_timeout) = (self.config.load_timeout, self.config.runner_timeout);
        let (load_key, load_stderr, mut exited) = (key.clone(), stderr.clone(), stopped_rx.clone());
        let watch_exit = stopped_rx.clone();
        tokio::spawn(async move {
            let ready = tokio::select! {
                r = runner_proc::wait_ready(&socket, &load_stderr, timeout, runner_timeout) => r,
                _ = async { exited.wait_for(|s| *s).await.map(|_| ()) } => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Err(format!("the runner exited while loading: {}", load_stderr.text()))
                }
            };
            let result = match ready {
                Ok(mut client) => {
                    let facts = match client.status(rpb::StatusRequest {}).await {
                        Ok(s) => {
                            let s = s.into_inner();
                            RunnerFacts {
                                context_length: s.model.map_or(0, |m| m.context_length),
                                on_gpu: s.memory.as_ref().is_some_and(|m| {
                                    m.memory_source == rpb::MemorySource::Device as i32
                                }),
                                kv_capacity_tokens: s
                                    .memory
                                    .as_ref()
                                    .map_or(0, |m| m.kv_capacity_tokens),
                                kv_bits: s
                                    .memory
                                    .as_ref()
                                    .and_then(|m| m.kv_quantization)
                                    .map_or(0, |q| q.bits),
                            }
                        }
                        Err(_) => RunnerFacts::default(),
                    };
                    tokio::spawn(runner_proc::watch_health(
                        client.clone(),
                        pid,
                        load_stderr.clone(),
                        runner_timeout,
                        watch_exit,
                    ));
                    Ok(Loaded { client, facts })
                }
                Err(e) => Err(e),
            };
            let _ = commands
                .send(Command::Loaded {
                    key: load_key,
                    generation,
                    result,
                })
                .await;
        });
        self.slots.insert(
            key,
            Slot {
                name,
                generation,
                state: State::Loading {
                    waiters: vec![(reply, keep_alive)],
                    started: Instant::now(),
                },
                size,
                shards,
                active: 1,
                keep_alive,
                last_used: Instant::now(),
                idle_until: None,
                pid,
                stderr,
                stop: Some(stop_tx),
                stopped: Some(stopped_rx),
            },
        );
    }

    fn loaded(&mut self, key: &PathBuf, generation: u64, result: Result<Loaded, String>) {
        let Some(slot) = self
            .slots
            .get_mut(key)
            .filter(|s| s.generation == generation)
        else {
            return;
        };
        match result {
            Ok(loaded) => {
                let State::Loading { waiters, started } = std::mem::replace(
                    &mut slot.state,
                    State::Ready {
                        client: loaded.client.clone(),
                        facts: loaded.facts,
                    },
                ) else {
                    return;
                };
                let load_time = started.elapsed();
                for (reply, keep_alive) in waiters {
                    let lease = make_lease(
                        slot,
                        key,
                        loaded.client.clone(),
                        keep_alive,
                        load_time,
                        &self.commands,
                    );
                    // A waiter that went away releases its lease on drop.
                    let _ = reply.send(Ok(lease));
                }
            }
            Err(message) => {
                if let Some(slot) = self.slots.remove(key) {
                    fail_waiters(slot, &message);
                }
            }
        }
    }

    fn release(&mut self, key: &PathBuf, generation: u64, keep_alive: KeepAlive) {
        let Some(slot) = self
            .slots
            .get_mut(key)
            .filter(|s| s.generation == generation)
        else {
            return;
        };
        slot.active = slot.active.saturating_sub(1);
        slot.last_used = Instant::now();
        if slot.keep_alive != KeepAlive::Unload || slot.active == 0 {
            slot.keep_alive = keep_alive;
        }
        if slot.active > 0 {
            return;
        }
        match slot.keep_alive {
            KeepAlive::Unload => self.remove(key),
            KeepAlive::For(d) => slot.idle_until = Some(Instant::now() + d),
            KeepAlive::Forever => slot.idle_until = None,
        }
    }

    /// Unloads idle runners whose keep_alive ran out.
    fn expire(&mut self) {
        let now = Instant::now();
        let due: Vec<PathBuf> = self
            .slots
            .iter()
            .filter(|(_, s)| s.active == 0 && s.idle_until.is_some_and(|t| t <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.remove(&key);
        }
    }

    /// Forgets a slot; dropping its stop handle stops the runner.
    fn remove(&mut self, key: &PathBuf) {
        if let Some(slot) = self.slots.remove(key) {
            fail_waiters(slot, "the model was unloaded");
        }
    }

    fn ps(&self) -> Vec<Running> {
        let now = Instant::now();
        let mut out: Vec<Running> = self
            .slots
            .values()
            .map(|s| Running {
                name: s.name.clone(),
                reserved_bytes: s.size.min_bytes,
                facts: match &s.state {
                    State::Ready { facts, .. } => *facts,
                    State::Loading { .. } => RunnerFacts::default(),
                },
                expires: s
                    .idle_until
                    .map(|t| SystemTime::now() + t.saturating_duration_since(now)),
                active: s.active,
                pid: s.pid,
                loading: matches!(s.state, State::Loading { .. }),
                shards: s.shards,
                ranks: if s.shards > 1 {
                    runner_proc::group_ranks(s.pid)
                } else {
                    Vec::new()
                },
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

fn make_lease(
    slot: &Slot,
    key: &std::path::Path,
    client: RunnerClient<Channel>,
    keep_alive: KeepAlive,
    load_time: Duration,
    commands: &mpsc::Sender<Command>,
) -> Lease {
    Lease {
        client,
        stderr: slot.stderr.clone(),
        load_time,
        key: key.to_path_buf(),
        generation: slot.generation,
        keep_alive,
        commands: commands.clone(),
    }
}

/// Fails the requests waiting for a slot that will not load; stops its runner.
fn fail_waiters(mut slot: Slot, why: &str) {
    drop(slot.stop.take());
    if let State::Loading { waiters, .. } = slot.state {
        for (reply, _) in waiters {
            let _ = reply.send(Err(SchedError::LoadFailed {
                model: slot.name.clone(),
                message: format!("{why}: {}", slot.stderr.text()),
            }));
        }
    }
}

fn tracing_warn(message: &str) {
    eprintln!("grove: {message}");
}
