//! `grove-runner serve`: the `grove.runner.v1.Runner` gRPC service on a Unix
//! socket, in front of the [`Engine`]. Handlers validate, queue and stream; they
//! never touch MLX.
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use grove_proto::runner::v1 as pb;
use grove_proto::runner::v1::runner_server::{Runner, RunnerServer};
use tokio::net::UnixListener;
use tokio::sync::{Notify, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::chat::{self, ChatParts};
use crate::chat_template::sandbox::Sandbox;
use crate::chat_template::{ChatRequest, Message, Role};
use crate::engine::embed::EmbedJob;
use crate::engine::{Activity, Engine, EngineConfig, Event, LoadState, Snapshot};
use crate::generate::FinishReason;
use crate::grammar::Constraint;
use crate::logprobs::TokenLogprob;
use crate::memory::MemorySource;
use crate::model::Architecture;
use crate::model::pooling::Pooling;
use crate::reply::{self, Reply};
use crate::request::{Prompt, job, runner_status, submit_status, template_vars, tools};
use crate::tool_choice;

/// Most inputs one embedding call may carry (OpenAI's limit).
const MAX_EMBED_INPUTS: usize = 2048;

/// How `serve` is set up.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub engine: EngineConfig,
    pub socket: PathBuf,
    /// A system prompt (and tools) to prefill into the prompt cache at start.
    pub prewarm: Option<ChatRequest>,
    /// Where chat templates render.
    pub sandbox: Sandbox,
}

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("binding {path}: {source}")]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting the engine thread: {0}")]
    Engine(std::io::Error),
    #[error("serving gRPC: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves until `shutdown` resolves or a client calls Shutdown; then removes the socket.
pub async fn run(
    config: ServeConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    if config.socket.exists() {
        // A stale socket from a dead runner; a live one would still be bound.
        let _ = std::fs::remove_file(&config.socket);
    }
    let listener = UnixListener::bind(&config.socket).map_err(|source| ServeError::Bind {
        path: config.socket.clone(),
        source,
    })?;
    let (engine, thread) = Engine::spawn(config.engine.clone()).map_err(ServeError::Engine)?;
    let stop = Arc::new(Notify::new());
    let (queued_tx, prewarm_queued) = tokio::sync::watch::channel(config.prewarm.is_none());
    let (broken_tx, broken) = tokio::sync::watch::channel(false);
    if config.engine.shard.is_some() {
        // A group's launcher says SIGUSR1 when a rank has died.
        let mut usr1 =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
                .map_err(ServeError::Engine)?;
        let stop = stop.clone();
        tokio::spawn(async move {
            usr1.recv().await;
            eprintln!("grove-runner: a rank of the group ended; failing requests and stopping");
            let _ = broken_tx.send(true);
            // The streams in flight get their status before the server goes.
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            stop.notify_one();
        });
    }
    let service = Service {
        broken,
        engine,
        sandbox: config.sandbox.clone(),
        stop: stop.clone(),
        prewarm_queued,
    };
    if let Some(chat) = config.prewarm.clone() {
        let (engine, sandbox) = (service.engine.clone(), service.sandbox.clone());
        tokio::spawn(async move {
            let result = async {
                let ids = prewarm_ids(&engine, &sandbox, &chat).await?;
                // Generations wait until it is in the prompt cache: admitted
                // beside it, they would start before it is there.
                engine
                    .queue_prewarm(ids)
                    .map_err(submit_status)?
                    .await
                    .map_err(|_| submit_status(crate::engine::SubmitError::Stopped))?
                    .map_err(runner_status)
            }
            .await;
            let _ = queued_tx.send(true);
            match result {
                Ok(p) => eprintln!(
                    "grove-runner: prewarmed {} tokens in {:?}",
                    p.cached_tokens, p.prompt_eval
                ),
                Err(e) => eprintln!("grove-runner: prewarm failed: {}", e.message()),
            }
        });
    }
    let (fired_tx, mut fired) = tokio::sync::watch::channel(false);
    let engine = service.engine.clone();
    let stopped = async move {
        tokio::select! {
            _ = shutdown => {},
            _ = stop.notified() => {},
            // An engine that stopped on its own (a group that fell out of
            // step) takes the server down with it.
            _ = engine.stopped() => {},
        }
        // In-flight generations end at their next step; streams then close.
        engine.stop();
        let _ = fired_tx.send(true);
    };
    let serve = tonic::transport::Server::builder()
        .add_service(RunnerServer::new(service))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stopped);
    // Graceful shutdown waits for clients to hang up; a daemon keeps its
    // connection open, so in-flight streams get GRACE to end, then we go.
    let deadline = async move {
        let _ = fired.wait_for(|f| *f).await;
        tokio::time::sleep(GRACE).await;
    };
    let served = tokio::select! {
        r = serve => r.map_err(ServeError::from),
        _ = deadline => Ok(()),
    };
    let _ = std::fs::remove_file(&config.socket);
    // The service, and with it the engine's last handle, is gone: the engine
    // thread ends after its current step (its event channels are closed).
    let joined = tokio::task::spawn_blocking(move || thread.join());
    if tokio::time::timeout(GRACE, joined).await.is_err() {
        // The engine is inside work that cannot be cancelled (a model still
        // loading, one long MLX call). Exiting normally would run MLX's static
        // destructors under it; end the process here instead.
        eprintln!("grove-runner: the engine is still busy {GRACE:?} after the shutdown; exiting");
        // SAFETY: _exit ends the process at once; nothing here needs flushing.
        unsafe { libc::_exit(0) }
    }
    served
}

/// Resolves once the group has lost a rank (never for a runner alone).
async fn lost(broken: &mut tokio::sync::watch::Receiver<bool>) {
    loop {
        if *broken.borrow_and_update() {
            return;
        }
        if broken.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The status of a request whose group lost a rank.
fn group_lost() -> Status {
    Status::unavailable(
        "a rank of this model's group ended; the group stops, and the next request starts a new one",
    )
}

/// How long in-flight work may take to end after a shutdown.
const GRACE: std::time::Duration = std::time::Duration::from_secs(2);

struct Service {
    engine: Engine,
    /// True once the group this runner leads has lost a rank (its
    /// launcher's SIGUSR1): requests fail as UNAVAILABLE.
    broken: tokio::sync::watch::Receiver<bool>,
    sandbox: Sandbox,
    stop: Arc<Notify>,
    /// True once the startup prewarm (if any) is done or has failed:
    /// generations wait for it, so they find it in the prompt cache.
    prewarm_queued: tokio::sync::watch::Receiver<bool>,
}

/// Renders a system prompt's conversation prefix and prefills it.
async fn prewarm(
    engine: &Engine,
    sandbox: &Sandbox,
    chat: &ChatRequest,
) -> Result<crate::engine::Prewarmed, Status> {
    let ids = prewarm_ids(engine, sandbox, chat).await?;
    engine
        .prewarm(ids)
        .await
        .map_err(submit_status)?
        .map_err(runner_status)
}

/// The ids of a system prompt (and tools) as a conversation begins with them.
async fn prewarm_ids(
    engine: &Engine,
    sandbox: &Sandbox,
    chat: &ChatRequest,
) -> Result<Vec<u32>, Status> {
    let parts = engine.chat_parts().await.map_err(runner_status)?;
    chat::conversation_prefix(sandbox, &parts, chat)
        .await
        .map_err(runner_status)
}

fn health(s: &Snapshot) -> pb::HealthResponse {
    let (state, error) = match &s.state {
        LoadState::Loading => (pb::LoadState::Loading, String::new()),
        LoadState::Ready => (pb::LoadState::Ready, String::new()),
        LoadState::Failed(e) => (pb::LoadState::Failed, e.clone()),
        LoadState::Stopping => (pb::LoadState::Stopping, String::new()),
    };
    let activity = match s.activity {
        Activity::Idle => pb::EngineActivity::Idle,
        Activity::Prefilling => pb::EngineActivity::Prefilling,
        Activity::Decoding => pb::EngineActivity::Decoding,
    };
    pb::HealthResponse {
        state: state as i32,
        activity: activity as i32,
        error,
    }
}

fn dtype(d: mlx_rs::Dtype) -> pb::DType {
    match d {
        mlx_rs::Dtype::Float16 => pb::DType::Float16,
        mlx_rs::Dtype::Bfloat16 => pb::DType::Bfloat16,
        _ => pb::DType::Float32,
    }
}

fn status(s: &Snapshot) -> pb::StatusResponse {
    let model = s.facts.as_ref().map(|f| pb::ModelFacts {
        architecture: match f.architecture {
            Architecture::Llama => pb::Architecture::Llama,
            Architecture::Mistral => pb::Architecture::Mistral,
            Architecture::Qwen2 => pb::Architecture::Qwen2,
            Architecture::Qwen3 => pb::Architecture::Qwen3,
            Architecture::Qwen3Moe => pb::Architecture::Qwen3Moe,
            Architecture::Qwen3Next => pb::Architecture::Qwen3Next,
            Architecture::GptOss => pb::Architecture::GptOss,
            Architecture::Qwen3_5 => pb::Architecture::Qwen35,
            Architecture::Glm4MoeLite => pb::Architecture::Glm4MoeLite,
            Architecture::Gemma3Text => pb::Architecture::Gemma3Text,
            Architecture::Gemma3 => pb::Architecture::Gemma3,
            Architecture::Gemma2 => pb::Architecture::Gemma2,
            Architecture::Phi3 => pb::Architecture::Phi3,
            Architecture::Gemma4Text => pb::Architecture::Gemma4Text,
            Architecture::Gemma4 => pb::Architecture::Gemma4,
            Architecture::Bert => pb::Architecture::Bert,
        } as i32,
        dtype: dtype(f.dtype) as i32,
        quantization: f.quantization.map(|q| pb::Quantization {
            bits: q.bits as u32,
            group_size: q.group_size as u32,
        }),
        parameter_count: f.parameter_count,
        active_parameter_count: f.active_parameter_count,
        context_length: f.context_length as u32,
        max_position_embeddings: f.max_position_embeddings.unwrap_or(0),
        vocab_size: f.vocab_size as u32,
        num_layers: f.num_layers as u32,
        stored_dtype: dtype(f.dtypes.stored) as i32,
        promoted_to_float32: f.dtypes.promoted,
        gguf: f.gguf,
        max_parallel: f.parallel as u32,
        generates: f.generates,
        embedding_length: f.embedding_length as u32,
        pooling: match f.embedding.pooling {
            Pooling::Mean => pb::Pooling::Mean,
            Pooling::Cls => pb::Pooling::Cls,
            Pooling::LastToken => pb::Pooling::Last,
        } as i32,
    });
    let m = &s.memory;
    let memory = pb::MemoryReport {
        weight_bytes: m.budget.map_or(0, |b| b.weight_bytes),
        kv_bytes: m.kv_bytes,
        cached_tokens: m.cached_tokens as u32,
        kv_capacity_tokens: s
            .facts
            .as_ref()
            .map_or(0, |f| f.kv_capacity.min(u32::MAX as usize) as u32),
        mlx_active_bytes: m.mlx_active,
        mlx_cache_bytes: m.mlx_cache,
        mlx_peak_bytes: m.mlx_peak,
        memory_total_bytes: m.budget.map_or(0, |b| b.memory_total),
        memory_source: match m.budget.map(|b| b.memory_source) {
            Some(MemorySource::Device) => pb::MemorySource::Device,
            Some(MemorySource::PhysicalRam) => pb::MemorySource::PhysicalRam,
            None => pb::MemorySource::Unspecified,
        } as i32,
        kv_bytes_per_token: m.budget.map_or(0, |b| b.kv_bytes_per_token),
        window_bytes_per_sequence: m.budget.map_or(0, |b| b.window_bytes_per_sequence),
        checkpoint_bytes: m.checkpoint_bytes,
        kv_quantization: m.kv.map(|k| pb::KvQuantization {
            bits: k.quant.bits as u32,
            group_size: k.quant.group_size as u32,
            start: k.start.min(u32::MAX as usize) as u32,
        }),
        disk_entries: m.disk_entries.min(u32::MAX as usize) as u32,
        disk_bytes: m.disk_bytes,
        disk_budget_bytes: m.disk_budget,
        ranks: m
            .ranks
            .iter()
            .enumerate()
            .map(|(i, r)| pb::RankMemory {
                rank: i as u32,
                weight_bytes: r[0],
                kv_bytes: r[1],
                mlx_active_bytes: r[2],
                mlx_peak_bytes: r[3],
            })
            .collect(),
    };
    pb::StatusResponse {
        health: Some(health(s)),
        model,
        memory: Some(memory),
        batch: Some(pb::BatchReport {
            active_sequences: s.active as u32,
            waiting_sequences: s.waiting as u32,
        }),
    }
}

/// The engine's log-probabilities as a message, each id with its text.
fn logprobs_message(parts: &ChatParts, tokens: Vec<TokenLogprob>) -> pb::GenerateResponse {
    let one = |id: u32, logprob: f32, top: Vec<pb::TokenLogprob>| {
        let (token, bytes) = parts.token_text(id);
        pb::TokenLogprob {
            id,
            token,
            bytes,
            logprob,
            top,
        }
    };
    let tokens = tokens
        .into_iter()
        .map(|t| {
            let top = t
                .top
                .into_iter()
                .map(|(id, lp)| one(id, lp, Vec::new()))
                .collect();
            one(t.id, t.logprob, top)
        })
        .collect();
    pb::GenerateResponse {
        event: Some(pb::generate_response::Event::Logprobs(pb::Logprobs {
            tokens,
        })),
    }
}

fn done_of(reason: FinishReason, m: crate::engine::Metrics, stop: Option<String>) -> pb::Done {
    let reason = match reason {
        FinishReason::Stop => pb::DoneReason::Stop,
        FinishReason::Length => pb::DoneReason::Length,
        FinishReason::Cancelled => pb::DoneReason::Cancelled,
    };
    pb::Done {
        reason: reason as i32,
        metrics: Some(pb::Metrics {
            prompt_tokens: m.prompt_tokens as u32,
            cached_prompt_tokens: m.cached_prompt_tokens as u32,
            prompt_eval_ns: m.prompt_eval.as_nanos() as u64,
            eval_tokens: m.eval_tokens as u32,
            eval_ns: m.eval.as_nanos() as u64,
            cached_prompt_tokens_disk: m.cached_from_disk as u32,
            constraint_ns: m.constraint.as_nanos() as u64,
            constraint_steps: m.constraint_steps,
        }),
        stop_sequence: stop.unwrap_or_default(),
    }
}

type GenerateStream = Pin<Box<dyn Stream<Item = Result<pb::GenerateResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Runner for Service {
    async fn health(
        &self,
        _: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, Status> {
        Ok(Response::new(health(&self.engine.snapshot())))
    }

    async fn status(
        &self,
        _: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        Ok(Response::new(status(&self.engine.snapshot())))
    }

    type GenerateStream = GenerateStream;

    async fn generate(
        &self,
        req: Request<pb::GenerateRequest>,
    ) -> Result<Response<GenerateStream>, Status> {
        let facts = self.engine.snapshot().facts;
        if let Some(f) = facts.as_ref().filter(|f| !f.generates) {
            return Err(Status::invalid_argument(format!(
                "this is an embedding model ({}); it does not generate text",
                f.architecture.name()
            )));
        }
        let vocab = facts.map_or(usize::MAX, |f| f.vocab_size);
        let req = req.into_inner();
        let share_prefill = req.share_prefill;
        let (mut job, prompt, mut constraint) = job(req, vocab)?;
        let wants_logprobs = job.logprobs.is_some();
        if let (Some(Constraint::ToolCall(name)), Prompt::Chat(request, _, split)) =
            (&constraint, &prompt)
        {
            let parts = self.engine.chat_parts().await.map_err(runner_status)?;
            if !split.tool_calls {
                return Err(Status::invalid_argument(
                    "a tool-call constraint needs parse_tool_calls",
                ));
            }
            let format = reply::tool_format(&parts);
            let lark = tool_choice::grammar(format, &request.tools, name.as_deref())
                .map_err(Status::invalid_argument)?;
            constraint = Some(Constraint::Lark(lark));
        }
        if let Some(constraint) = constraint {
            // Compiled on the blocking pool: a schema can take milliseconds.
            let parts = self.engine.chat_parts().await.map_err(runner_status)?;
            let grammar = tokio::task::spawn_blocking(move || parts.compile(&constraint))
                .await
                .map_err(|e| Status::internal(format!("compiling the constraint: {e}")))?
                .map_err(Status::invalid_argument)?;
            job.grammar = Some(grammar);
        }
        let mut format = None;
        job.input = match prompt {
            Prompt::Tokens(ids) => ids,
            Prompt::Text(text) => {
                let parts = self.engine.chat_parts().await.map_err(runner_status)?;
                chat::encode_prompt(&parts, text)
                    .await
                    .map_err(runner_status)?
            }
            Prompt::Chat(request, name, split) => {
                // Rendered and tokenized here, never on the engine thread; a
                // client that leaves drops this, which stops the sandbox.
                let parts = self.engine.chat_parts().await.map_err(runner_status)?;
                let ids = chat::prompt(&self.sandbox, &parts, &request, name.as_deref())
                    .await
                    .map_err(runner_status)?;
                format = reply::format(&parts, &request, split, &ids);
                ids
            }
        };
        // A startup prewarm goes first (a system prompt's prefill after loading).
        let mut queued = self.prewarm_queued.clone();
        let _ = queued.wait_for(|q| *q).await;
        let mut broken = self.broken.clone();
        if *broken.borrow() {
            return Err(group_lost());
        }
        // The first of several choices on this prompt: the prompt but its last
        // token goes into the prompt cache first (the engine holds back
        // generations on it until then), so every choice starts from it.
        let _shared = match share_prefill && job.input.len() > 1 {
            true => Some(
                self.engine
                    .queue_prewarm(job.input[..job.input.len() - 1].to_vec())
                    .map_err(submit_status)?,
            ),
            false => None,
        };
        let mut events = self.engine.generate(job).map_err(submit_status)?;
        // Errors before the stream starts are statuses; after, they end the stream.
        let first = tokio::select! {
            e = events.recv() => e,
            _ = lost(&mut broken) => return Err(group_lost()),
        };
        match first {
            Some(Event::Started) => {}
            Some(Event::Error(e)) => return Err(runner_status(e)),
            Some(_) | None => {
                return Err(Status::internal(
                    "the engine ended the request without starting it",
                ));
            }
        }
        let (tx, rx) = mpsc::channel(16);
        let parts = if wants_logprobs {
            Some(self.engine.chat_parts().await.map_err(runner_status)?)
        } else {
            None
        };
        tokio::spawn(async move {
            let mut reply = Some(Reply::new(format));
            loop {
                let event = tokio::select! {
                    e = events.recv() => e,
                    _ = lost(&mut broken) => {
                        let _ = tx.send(Err(group_lost())).await;
                        return;
                    }
                };
                let Some(event) = event else {
                    break;
                };
                let items = match (event, reply.as_mut()) {
                    (Event::Text(text), Some(r)) => r.text(text).into_iter().map(Ok).collect(),
                    (Event::Logprobs(tokens), Some(_)) => match &parts {
                        Some(parts) => vec![Ok(logprobs_message(parts, tokens))],
                        None => continue,
                    },
                    (
                        Event::Done {
                            reason,
                            metrics,
                            stop,
                        },
                        Some(_),
                    ) => reply
                        .take()
                        .map(|r| r.done(done_of(reason, metrics, stop)))
                        .unwrap_or_default()
                        .into_iter()
                        .map(Ok)
                        .collect(),
                    (Event::Error(e), _) => vec![Err(runner_status(e))],
                    _ => continue,
                };
                for item in items {
                    if tx.send(item).await.is_err() {
                        // The client went away: dropping `events` cancels the engine's work.
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn tokenize(
        &self,
        req: Request<pb::TokenizeRequest>,
    ) -> Result<Response<pb::TokenizeResponse>, Status> {
        let r = req.into_inner();
        let parts = self.engine.chat_parts().await.map_err(runner_status)?;
        let ids = chat::tokenize(&parts, r.text, r.add_special_tokens)
            .await
            .map_err(runner_status)?;
        Ok(Response::new(pb::TokenizeResponse { ids }))
    }

    async fn detokenize(
        &self,
        req: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeResponse>, Status> {
        let parts = self.engine.chat_parts().await.map_err(runner_status)?;
        let ids = req.into_inner().ids;
        let text = tokio::task::spawn_blocking(move || parts.tokenizer.decode(&ids))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(runner_status)?;
        Ok(Response::new(pb::DetokenizeResponse { text }))
    }

    async fn prewarm(
        &self,
        req: Request<pb::PrewarmRequest>,
    ) -> Result<Response<pb::PrewarmResponse>, Status> {
        let r = req.into_inner();
        let chat = ChatRequest {
            messages: vec![Message::new(Role::System, r.system)],
            tools: tools(&r.tools_json)?,
            add_generation_prompt: false,
            extra: template_vars(r.template_vars_json)?,
            reasoning_effort: None,
        };
        let done = prewarm(&self.engine, &self.sandbox, &chat).await?;
        Ok(Response::new(pb::PrewarmResponse {
            cached_tokens: done.cached_tokens as u32,
            prompt_eval_ns: done.prompt_eval.as_nanos() as u64,
        }))
    }

    async fn embed(
        &self,
        req: Request<pb::EmbedRequest>,
    ) -> Result<Response<pb::EmbedResponse>, Status> {
        let r = req.into_inner();
        if r.inputs.is_empty() {
            return Err(Status::invalid_argument("no inputs to embed"));
        }
        if r.inputs.len() > MAX_EMBED_INPUTS {
            return Err(Status::invalid_argument(format!(
                "{} inputs; at most {MAX_EMBED_INPUTS} per call",
                r.inputs.len()
            )));
        }
        let parts = self.engine.chat_parts().await.map_err(runner_status)?;
        let Some(facts) = self.engine.snapshot().facts else {
            return Err(Status::unavailable("the model is not loaded"));
        };
        let hidden = facts.embedding_length;
        if r.dimensions as usize > hidden {
            return Err(Status::invalid_argument(format!(
                "dimensions {} is more than the model's {hidden}",
                r.dimensions
            )));
        }
        let limit = facts.context_length;
        let mut inputs = Vec::with_capacity(r.inputs.len());
        for (n, input) in r.inputs.into_iter().enumerate() {
            let mut ids = match input.input {
                Some(pb::embed_input::Input::Text(t)) => chat::tokenize(&parts, t, true)
                    .await
                    .map_err(runner_status)?,
                Some(pb::embed_input::Input::Tokens(l)) => l.ids,
                None => return Err(Status::invalid_argument(format!("input {n} is empty"))),
            };
            if ids.is_empty() {
                return Err(Status::invalid_argument(format!("input {n} has no tokens")));
            }
            if let Some(&bad) = ids.iter().find(|&&t| t as usize >= facts.vocab_size) {
                return Err(Status::invalid_argument(format!(
                    "input {n}: token id {bad} is outside the vocabulary of {}",
                    facts.vocab_size
                )));
            }
            if ids.len() > limit {
                if !r.truncate {
                    return Err(Status::invalid_argument(format!(
                        "input {n} has {} tokens, more than the model's context of {limit} \
                         (truncate cuts it)",
                        ids.len()
                    )));
                }
                ids.truncate(limit);
            }
            inputs.push(ids);
        }
        let counts: Vec<u32> = inputs.iter().map(|i| i.len() as u32).collect();
        let done = self
            .engine
            .embed(EmbedJob {
                inputs,
                dimensions: r.dimensions as usize,
            })
            .await
            .map_err(submit_status)?
            .map_err(runner_status)?;
        Ok(Response::new(pb::EmbedResponse {
            embeddings: done
                .vectors
                .into_iter()
                .zip(counts)
                .map(|(values, tokens)| pb::Embedding { values, tokens })
                .collect(),
            total_ns: done.took.as_nanos() as u64,
        }))
    }

    async fn shutdown(
        &self,
        _: Request<pb::ShutdownRequest>,
    ) -> Result<Response<pb::ShutdownResponse>, Status> {
        self.stop.notify_one();
        Ok(Response::new(pb::ShutdownResponse {}))
    }
}
