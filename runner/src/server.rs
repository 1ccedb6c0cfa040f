//! `grove-runner serve`: the `grove.runner.v1.Runner` gRPC service on a Unix
//! socket, in front of the [`Engine`]. Handlers validate, queue and stream; they
//! never touch MLX.
use std::collections::HashMap;
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

use crate::chat_template::{ChatRequest, Message, Role, ToolCall};
use crate::engine::{
    Activity, Engine, EngineConfig, Event, Input, Job, LoadState, Snapshot, SubmitError,
};
use crate::error::RunnerError;
use crate::generate::{FinishReason, GenerateParams};
use crate::memory::MemorySource;
use crate::model::Architecture;
use crate::sample::SamplingOptions;

/// How `serve` is set up.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub engine: EngineConfig,
    pub socket: PathBuf,
    /// A system prompt (and tools) to prefill into the prompt cache at start.
    pub prewarm: Option<ChatRequest>,
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
    if let Some(chat) = config.prewarm.clone() {
        // Queued first, so the first request finds the system prompt cached.
        let engine = engine.clone();
        tokio::spawn(async move {
            match engine.prewarm(chat).await {
                Ok(Ok(p)) => eprintln!(
                    "grove-runner: prewarmed {} tokens in {:?}",
                    p.cached_tokens, p.prompt_eval
                ),
                Ok(Err(e)) => eprintln!("grove-runner: prewarm failed: {e}"),
                Err(e) => eprintln!("grove-runner: prewarm failed: {e}"),
            }
        });
    }
    let stop = Arc::new(Notify::new());
    let service = Service {
        engine,
        stop: stop.clone(),
    };
    let (fired_tx, mut fired) = tokio::sync::watch::channel(false);
    let stopped = async move {
        tokio::select! {
            _ = shutdown => {},
            _ = stop.notified() => {},
        }
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
    let _ = tokio::time::timeout(GRACE, joined).await;
    served
}

/// How long in-flight work may take to end after a shutdown.
const GRACE: std::time::Duration = std::time::Duration::from_secs(2);

struct Service {
    engine: Engine,
    stop: Arc<Notify>,
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
        } as i32,
        dtype: dtype(f.dtype) as i32,
        quantization: f.quantization.map(|q| pb::Quantization {
            bits: q.bits as u32,
            group_size: q.group_size as u32,
        }),
        parameter_count: f.parameter_count,
        context_length: f.context_length as u32,
        max_position_embeddings: f.max_position_embeddings.unwrap_or(0),
        vocab_size: f.vocab_size as u32,
        num_layers: f.num_layers as u32,
        stored_dtype: dtype(f.dtypes.stored) as i32,
        promoted_to_float32: f.dtypes.promoted,
        gguf: f.gguf,
    });
    let m = &s.memory;
    let memory = pb::MemoryReport {
        weight_bytes: m.budget.map_or(0, |b| b.weight_bytes),
        kv_bytes: m.kv_bytes,
        cached_tokens: m.cached_tokens as u32,
        kv_capacity_tokens: m
            .budget
            .map_or(0, |b| b.kv_capacity_tokens.min(u32::MAX as u64) as u32),
        mlx_active_bytes: m.mlx_active,
        mlx_cache_bytes: m.mlx_cache,
        mlx_peak_bytes: m.mlx_peak,
        memory_total_bytes: m.budget.map_or(0, |b| b.memory_total),
        memory_source: match m.budget.map(|b| b.memory_source) {
            Some(MemorySource::Device) => pb::MemorySource::Device,
            Some(MemorySource::PhysicalRam) => pb::MemorySource::PhysicalRam,
            None => pb::MemorySource::Unspecified,
        } as i32,
    };
    pb::StatusResponse {
        health: Some(health(s)),
        model,
        memory: Some(memory),
    }
}

fn submit_status(e: SubmitError) -> Status {
    match e {
        SubmitError::QueueFull(_) => Status::resource_exhausted(e.to_string()),
        SubmitError::Stopped => Status::unavailable(e.to_string()),
    }
}

fn runner_status(e: RunnerError) -> Status {
    match e {
        RunnerError::Request(_) | RunnerError::Tokenizer(_) => {
            Status::invalid_argument(e.to_string())
        }
        _ => Status::internal(e.to_string()),
    }
}

/// The sampler's options from the request, validated against the vocabulary.
fn sampling_options(s: pb::SamplingOptions, vocab: usize) -> Result<SamplingOptions, Status> {
    let defaults = SamplingOptions::default();
    let mut logit_bias: Vec<(u32, f32)> = s.logit_bias.into_iter().collect();
    logit_bias.sort_by_key(|(id, _)| *id);
    let opts = SamplingOptions {
        temperature: s.temperature,
        top_k: s.top_k,
        top_p: s.top_p,
        min_p: s.min_p,
        repetition_penalty: s.repetition_penalty,
        repetition_context_size: s
            .repetition_context_size
            .map_or(defaults.repetition_context_size, |n| n as usize),
        frequency_penalty: s.frequency_penalty,
        presence_penalty: s.presence_penalty,
        penalty_window: s
            .penalty_window
            .map_or(defaults.penalty_window, |n| n as usize),
        logit_bias,
        seed: s.seed,
    };
    opts.validate(vocab).map_err(runner_status)?;
    Ok(opts)
}

fn parse_json(what: &str, text: &str) -> Result<serde_json::Value, Status> {
    serde_json::from_str(text)
        .map_err(|e| Status::invalid_argument(format!("{what} is not valid JSON: {e}")))
}

fn tools(tools_json: &[String]) -> Result<Vec<serde_json::Value>, Status> {
    tools_json
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let v = parse_json(&format!("tool {i}"), t)?;
            if v.is_object() {
                Ok(v)
            } else {
                Err(Status::invalid_argument(format!(
                    "tool {i} must be a JSON object"
                )))
            }
        })
        .collect()
}

fn template_vars(
    vars: HashMap<String, String>,
) -> Result<serde_json::Map<String, serde_json::Value>, Status> {
    let mut out = serde_json::Map::new();
    for (name, value) in vars {
        let v = parse_json(&format!("template variable {name}"), &value)?;
        out.insert(name, v);
    }
    Ok(out)
}

/// A `Chat` message as the chat template takes it.
fn chat_request(chat: pb::Chat) -> Result<(ChatRequest, Option<String>), Status> {
    let mut messages = Vec::with_capacity(chat.messages.len());
    for (i, m) in chat.messages.into_iter().enumerate() {
        let role = match pb::Role::try_from(m.role) {
            Ok(pb::Role::System) => Role::System,
            Ok(pb::Role::User) => Role::User,
            Ok(pb::Role::Assistant) => Role::Assistant,
            Ok(pb::Role::Tool) => Role::Tool,
            _ => {
                return Err(Status::invalid_argument(format!(
                    "message {i} has no valid role"
                )));
            }
        };
        let mut tool_calls = Vec::with_capacity(m.tool_calls.len());
        for call in m.tool_calls {
            let id = (!call.id.is_empty()).then_some(call.id);
            tool_calls.push(
                ToolCall::from_json_arguments(&call.name, &call.arguments_json, id)
                    .map_err(runner_status)?,
            );
        }
        messages.push(Message {
            role,
            content: m.content,
            tool_calls,
            tool_call_id: (!m.tool_call_id.is_empty()).then_some(m.tool_call_id),
            name: (!m.name.is_empty()).then_some(m.name),
        });
    }
    if messages.is_empty() {
        return Err(Status::invalid_argument("the conversation has no messages"));
    }
    let mut extra = template_vars(chat.template_vars_json)?;
    if let Some(thinking) = chat.enable_thinking {
        extra.insert("enable_thinking".into(), thinking.into());
    }
    let request = ChatRequest {
        messages,
        tools: tools(&chat.tools_json)?,
        add_generation_prompt: chat.add_generation_prompt.unwrap_or(true),
        extra,
    };
    let name = (!chat.template_name.is_empty()).then_some(chat.template_name);
    Ok((request, name))
}

/// Checks the options against the model's facts, and builds the engine's job.
fn job(req: pb::GenerateRequest, vocab: usize) -> Result<Job, Status> {
    let input = match req.input {
        Some(pb::generate_request::Input::Prompt(text)) => Input::Text(text),
        Some(pb::generate_request::Input::Tokens(list)) => Input::Tokens(list.ids),
        Some(pb::generate_request::Input::Chat(chat)) => {
            let (request, template) = chat_request(chat)?;
            Input::Chat { request, template }
        }
        None => return Err(Status::invalid_argument("give a prompt or tokens")),
    };
    let sampling = sampling_options(req.sampling.unwrap_or_default(), vocab)?;
    if req.stop.iter().any(String::is_empty) {
        return Err(Status::invalid_argument("stop strings must not be empty"));
    }
    let defaults = GenerateParams::default();
    Ok(Job {
        input,
        params: GenerateParams {
            max_tokens: defaults.max_tokens,
            prefill_chunk: match req.prefill_chunk {
                0 => defaults.prefill_chunk,
                n => n as usize,
            },
            sampling,
            capture_logits: false,
        },
        max_tokens: req.max_tokens as usize,
        num_ctx: req.num_ctx as usize,
        stop: req.stop,
    })
}

fn done_message(reason: FinishReason, m: crate::engine::Metrics) -> pb::GenerateResponse {
    let reason = match reason {
        FinishReason::Stop => pb::DoneReason::Stop,
        FinishReason::Length => pb::DoneReason::Length,
        FinishReason::Cancelled => pb::DoneReason::Cancelled,
    };
    pb::GenerateResponse {
        event: Some(pb::generate_response::Event::Done(pb::Done {
            reason: reason as i32,
            metrics: Some(pb::Metrics {
                prompt_tokens: m.prompt_tokens as u32,
                cached_prompt_tokens: m.cached_prompt_tokens as u32,
                prompt_eval_ns: m.prompt_eval.as_nanos() as u64,
                eval_tokens: m.eval_tokens as u32,
                eval_ns: m.eval.as_nanos() as u64,
            }),
        })),
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
        let vocab = self
            .engine
            .snapshot()
            .facts
            .map_or(usize::MAX, |f| f.vocab_size);
        let job = job(req.into_inner(), vocab)?;
        let mut events = self.engine.generate(job).map_err(submit_status)?;
        // Errors before the stream starts are statuses; after, they end the stream.
        match events.recv().await {
            Some(Event::Started) => {}
            Some(Event::Error(e)) => return Err(runner_status(e)),
            Some(_) | None => {
                return Err(Status::internal(
                    "the engine ended the request without starting it",
                ));
            }
        }
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                let item = match event {
                    Event::Text(text) => Ok(pb::GenerateResponse {
                        event: Some(pb::generate_response::Event::Text(text)),
                    }),
                    Event::Done { reason, metrics } => Ok(done_message(reason, metrics)),
                    Event::Error(e) => Err(runner_status(e)),
                    Event::Started => continue,
                };
                if tx.send(item).await.is_err() {
                    // The client went away: dropping `events` cancels the engine's work.
                    return;
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
        let ids = self
            .engine
            .tokenize(r.text, r.add_special_tokens)
            .await
            .map_err(submit_status)?;
        Ok(Response::new(pb::TokenizeResponse {
            ids: ids.map_err(runner_status)?,
        }))
    }

    async fn detokenize(
        &self,
        req: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeResponse>, Status> {
        let text = self
            .engine
            .detokenize(req.into_inner().ids)
            .await
            .map_err(submit_status)?;
        Ok(Response::new(pb::DetokenizeResponse {
            text: text.map_err(runner_status)?,
        }))
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
        };
        let done = self
            .engine
            .prewarm(chat)
            .await
            .map_err(submit_status)?
            .map_err(runner_status)?;
        Ok(Response::new(pb::PrewarmResponse {
            cached_tokens: done.cached_tokens as u32,
            prompt_eval_ns: done.prompt_eval.as_nanos() as u64,
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
