//! The public `grove.v1.Grove` service: validates and resolves, asks the
//! scheduler for a runner, and relays the runner's stream with load time added.
use std::pin::Pin;
use std::time::{Duration, Instant, SystemTime};

use grove_proto::runner::v1 as rpb;
use grove_proto::v1 as pb;
use grove_proto::v1::grove_server::Grove;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status};

use crate::duration::KeepAlive;
use crate::resolve::{ResolveError, Resolved, resolve};
use crate::sched::{Lease, SchedError, Scheduler};
use crate::show;
use crate::store::{OllamaStore, Store};

/// The service's state: the scheduler handle and the stores.
pub struct Api {
    pub sched: Scheduler,
    pub store: Store,
    /// ollama's store, listed and read in place (None without HOME or OLLAMA_MODELS).
    pub ollama: Option<OllamaStore>,
    /// Turns true when the daemon starts shutting down: every relay then ends
    /// its stream with UNAVAILABLE at once.
    pub closing: tokio::sync::watch::Receiver<bool>,
    /// Recent Responses API replies, for `previous_response_id`.
    pub responses: crate::http::responses::ResponseStore,
}

type GenStream = Pin<Box<dyn Stream<Item = Result<pb::GenerateResponse, Status>> + Send>>;
type PullStream = Pin<Box<dyn Stream<Item = Result<pb::PullProgress, Status>> + Send>>;

fn resolve_status(e: ResolveError) -> Status {
    match e {
        ResolveError::Invalid(m) => Status::invalid_argument(m),
        ResolveError::NotFound(m) => Status::not_found(m),
    }
}

fn sched_status(e: SchedError) -> Status {
    match e {
        SchedError::Busy(m) | SchedError::NoMemory(m) => Status::resource_exhausted(m),
        e @ SchedError::LoadFailed { .. } => Status::failed_precondition(e.to_string()),
        e @ SchedError::ShuttingDown => Status::unavailable(e.to_string()),
        SchedError::Invalid(m) => Status::invalid_argument(m),
    }
}

fn keep_alive(ns: Option<i64>) -> Option<KeepAlive> {
    ns.map(KeepAlive::from_nanos)
}

fn sampling(o: &pb::Options) -> rpb::SamplingOptions {
    rpb::SamplingOptions {
        temperature: o.temperature.unwrap_or(0.0),
        top_k: o.top_k,
        top_p: o.top_p,
        min_p: o.min_p,
        repetition_penalty: o.repetition_penalty,
        repetition_context_size: o.repetition_context_size,
        frequency_penalty: o.frequency_penalty,
        presence_penalty: o.presence_penalty,
        logit_bias: o.logit_bias.clone(),
        seed: o.seed,
        ..Default::default()
    }
}

pub(crate) fn runner_request(
    input: rpb::generate_request::Input,
    o: Option<pb::Options>,
) -> rpb::GenerateRequest {
    let o = o.unwrap_or_default();
    rpb::GenerateRequest {
        input: Some(input),
        sampling: Some(sampling(&o)),
        stop: o.stop.clone(),
        max_tokens: o.max_tokens.unwrap_or(0),
        num_ctx: o.num_ctx.unwrap_or(0),
        prefill_chunk: o.prefill_chunk.unwrap_or(0),
        top_logprobs: o.top_logprobs,
        share_prefill: o.share_prefill,
        kv_bits: o.kv_bits,
        kv_group_size: o.kv_group_size,
        quantized_kv_start: o.quantized_kv_start,
        constraint: o.constraint.map(|c| rpb::Constraint {
            kind: c.kind.map(|k| {
                use pb::constraint::Kind as K;
                use rpb::constraint::Kind as R;
                match k {
                    K::JsonObject(b) => R::JsonObject(b),
                    K::JsonSchema(s) => R::JsonSchema(s),
                    K::Lark(s) => R::Lark(s),
                    K::Regex(s) => R::Regex(s),
                    K::ToolCall(t) => R::ToolCall(rpb::ToolCallConstraint { name: t.name }),
                }
            }),
        }),
    }
}

fn role(r: i32) -> Result<rpb::Role, Status> {
    match pb::Role::try_from(r) {
        Ok(pb::Role::System) => Ok(rpb::Role::System),
        Ok(pb::Role::User) => Ok(rpb::Role::User),
        Ok(pb::Role::Assistant) => Ok(rpb::Role::Assistant),
        Ok(pb::Role::Tool) => Ok(rpb::Role::Tool),
        _ => Err(Status::invalid_argument("every message needs a role")),
    }
}

pub(crate) fn chat_input(r: &pb::ChatRequest) -> Result<rpb::generate_request::Input, Status> {
    let mut messages = Vec::with_capacity(r.messages.len());
    for m in &r.messages {
        messages.push(rpb::Message {
            role: role(m.role)? as i32,
            content: m.content.clone(),
            tool_calls: m
                .tool_calls
                .iter()
                .map(|c| rpb::ToolCall {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    arguments_json: c.arguments_json.clone(),
                })
                .collect(),
            tool_call_id: m.tool_call_id.clone(),
            name: m.name.clone(),
            reasoning_content: m.reasoning_content.clone(),
        });
    }
    Ok(rpb::generate_request::Input::Chat(rpb::Chat {
        messages,
        tools_json: r.tools_json.clone(),
        add_generation_prompt: None,
        enable_thinking: r.enable_thinking,
        split_reasoning: r.split_reasoning,
        parse_tool_calls: r.parse_tool_calls,
        reasoning_effort: effort(r.reasoning_effort()) as i32,
        ..Default::default()
    }))
}

/// The request's reasoning effort as the runner's protocol spells it.
fn effort(e: pb::ReasoningEffort) -> rpb::ReasoningEffort {
    use pb::ReasoningEffort as P;
    use rpb::ReasoningEffort as R;
    match e {
        P::Unspecified => R::Unspecified,
        P::None => R::None,
        P::Minimal => R::Minimal,
        P::Low => R::Low,
        P::Medium => R::Medium,
        P::High => R::High,
    }
}

fn done(d: rpb::Done, load: Duration, started: Instant) -> pb::GenerateResponse {
    let m = d.metrics.unwrap_or_default();
    let reason = match rpb::DoneReason::try_from(d.reason) {
        Ok(rpb::DoneReason::Stop) => pb::DoneReason::Stop,
        Ok(rpb::DoneReason::Length) => pb::DoneReason::Length,
        Ok(rpb::DoneReason::Cancelled) => pb::DoneReason::Cancelled,
        Ok(rpb::DoneReason::ToolCalls) => pb::DoneReason::ToolCalls,
        Ok(rpb::DoneReason::InvalidToolCall) => pb::DoneReason::InvalidToolCall,
        _ => pb::DoneReason::Unspecified,
    };
    pb::GenerateResponse {
        event: Some(pb::generate_response::Event::Done(pb::Done {
            reason: reason as i32,
            metrics: Some(pb::Metrics {
                prompt_tokens: m.prompt_tokens,
                cached_prompt_tokens: m.cached_prompt_tokens,
                prompt_eval_ns: m.prompt_eval_ns,
                eval_tokens: m.eval_tokens,
                eval_ns: m.eval_ns,
                load_ns: load.as_nanos() as u64,
                total_ns: started.elapsed().as_nanos() as u64,
                cached_prompt_tokens_disk: m.cached_prompt_tokens_disk,
                constraint_ns: m.constraint_ns,
                constraint_steps: m.constraint_steps,
            }),
            stop_sequence: d.stop_sequence,
        })),
    }
}

/// A runner-side failure as the client should see it: a dead runner is
/// UNAVAILABLE with the end of its stderr; request errors pass through.
async fn runner_failure(status: Status, lease: &Lease, model: &str) -> Status {
    match status.code() {
        Code::InvalidArgument
        | Code::ResourceExhausted
        | Code::FailedPrecondition
        | Code::NotFound => status,
        _ => {
            // Give the stderr reader a moment to catch the runner's last words.
            tokio::time::sleep(Duration::from_millis(150)).await;
            let tail = lease.stderr.text();
            Status::unavailable(format!(
                "the runner for {model} failed ({}){}",
                status.message(),
                if tail.is_empty() {
                    String::new()
                } else {
                    format!(": {tail}")
                }
            ))
        }
    }
}

fn token_logprob(t: rpb::TokenLogprob) -> pb::TokenLogprob {
    pb::TokenLogprob {
        id: t.id,
        token: t.token,
        bytes: t.bytes,
        logprob: t.logprob,
        top: t.top.into_iter().map(token_logprob).collect(),
    }
}

/// Events the client has not taken yet, neighbouring text (or reasoning)
/// merged into one message.
#[derive(Default)]
struct Pending(std::collections::VecDeque<pb::generate_response::Event>);

impl Pending {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn push(&mut self, e: rpb::generate_response::Event) {
        use pb::generate_response::Event as E;
        use rpb::generate_response::Event as R;
        let e = match e {
            R::Text(t) => E::Text(t),
            R::Thinking(t) => E::Thinking(t),
            R::ToolCall(c) => E::ToolCall(pb::ToolCall {
                id: c.id,
                name: c.name,
                arguments_json: c.arguments_json,
            }),
            R::Logprobs(l) => E::Logprobs(pb::Logprobs {
                tokens: l.tokens.into_iter().map(token_logprob).collect(),
            }),
            R::Done(_) => return,
        };
        match (self.0.back_mut(), e) {
            (Some(E::Text(a)), E::Text(b)) | (Some(E::Thinking(a)), E::Thinking(b)) => {
                a.push_str(&b)
            }
            (Some(E::Logprobs(a)), E::Logprobs(b)) => a.tokens.extend(b.tokens),
            (_, e) => self.0.push_back(e),
        }
    }

    fn pop(&mut self) -> Option<pb::GenerateResponse> {
        self.0
            .pop_front()
            .map(|e| pb::GenerateResponse { event: Some(e) })
    }
}

impl Api {
    fn resolve(&self, model: &str) -> Result<Resolved, Status> {
        if model.trim().is_empty() {
            return Err(Status::invalid_argument("name a model"));
        }
        resolve(&self.store, self.ollama.as_ref(), model).map_err(resolve_status)
    }

    /// Runs one generation on the model's runner and relays its stream.
    async fn relay(
        &self,
        model: Resolved,
        ka: Option<KeepAlive>,
        shards: Option<u32>,
        req: rpb::GenerateRequest,
    ) -> Result<GenStream, Status> {
        let started = Instant::now();
        let lease = self
            .sched
            .acquire(model.name.clone(), model.path.clone(), ka, shards)
            .await
            .map_err(sched_status)?;
        let mut client = lease.client.clone();
        let mut stream = match client.generate(req).await {
            Ok(s) => s.into_inner(),
            Err(status) => return Err(runner_failure(status, &lease, &model.name).await),
        };
        let (tx, rx) = mpsc::channel(16);
        let mut closing = self.closing.clone();
        tokio::spawn(async move {
            let lease = lease; // released when the relay ends
            // Text the client has not taken yet. The runner's stream is read
            // at once whatever the client does: one connection carries every
            // request of the runner, and h2 closes a connection whose peer
            // leaves many small frames unread (ENHANCE_YOUR_CALM), which
            // would fail every other request on it. A slow client gets the
            // text in larger pieces instead.
            let mut pending = Pending::default();
            loop {
                let next = tokio::select! {
                    permit = tx.reserve(), if !pending.is_empty() => match permit {
                        Ok(p) => {
                            if let Some(e) = pending.pop() {
                                p.send(Ok(e));
                            }
                            continue;
                        }
                        // The client went away: dropping `stream` cancels the runner's work.
                        Err(_) => return,
                    },
                    m = stream.message() => m,
                    _ = async { closing.wait_for(|c| *c).await.map(|_| ()) } => {
                        let _ = tx.send(Err(Status::unavailable("the daemon is shutting down"))).await;
                        return;
                    }
                };
                let item = match next {
                    Ok(Some(msg)) => match msg.event {
                        Some(rpb::generate_response::Event::Done(d)) => {
                            while let Some(e) = pending.pop() {
                                if tx.send(Ok(e)).await.is_err() {
                                    return;
                                }
                            }
                            let _ = tx.send(Ok(done(d, lease.load_time, started))).await;
                            return;
                        }
                        Some(e) => {
                            pending.push(e);
                            continue;
                        }
                        None => continue,
                    },
                    Ok(None) => Err(runner_failure(
                        Status::unknown("stream ended early"),
                        &lease,
                        &model.name,
                    )
                    .await),
                    Err(status) => Err(runner_failure(status, &lease, &model.name).await),
                };
                while let Some(e) = pending.pop() {
                    if tx.send(Ok(e)).await.is_err() {
                        return;
                    }
                }
                let _ = tx.send(item).await;
                return;
            }
        });
        Ok(Box::pin(ReceiverStream::new(rx)))
    }
}

#[tonic::async_trait]
impl Grove for Api {
    type ChatStream = GenStream;
    type GenerateStream = GenStream;
    type PullStream = PullStream;

    async fn chat(&self, req: Request<pb::ChatRequest>) -> Result<Response<GenStream>, Status> {
        let r = req.into_inner();
        let model = self.resolve(&r.model)?;
        if r.messages.is_empty() {
            return Err(Status::invalid_argument("the conversation has no messages"));
        }
        let input = chat_input(&r)?;
        let stream = self
            .relay(
                model,
                keep_alive(r.keep_alive_ns),
                r.shards,
                runner_request(input, r.options),
            )
            .await?;
        Ok(Response::new(stream))
    }

    async fn generate(
        &self,
        req: Request<pb::GenerateRequest>,
    ) -> Result<Response<GenStream>, Status> {
        let r = req.into_inner();
        let model = self.resolve(&r.model)?;
        if r.prompt.is_empty() {
            return Err(Status::invalid_argument("the prompt is empty"));
        }
        let input = rpb::generate_request::Input::Prompt(r.prompt);
        let stream = self
            .relay(
                model,
                keep_alive(r.keep_alive_ns),
                r.shards,
                runner_request(input, r.options),
            )
            .await?;
        Ok(Response::new(stream))
    }

    async fn list(
        &self,
        _: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let models = self
            .store
            .list()
            .map_err(|e| Status::internal(e.to_string()))?;
        let unix = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
        };
        // A snapshot an interrupted pull left incomplete is not a model yet
        // (`grove pull` resumes it).
        let mut models: Vec<pb::ModelSummary> = models
            .into_iter()
            .filter(|m| m.complete)
            .map(|m| pb::ModelSummary {
                name: m.name.to_string(),
                revision: m.commit,
                size_bytes: m.size_bytes,
                modified_unix: unix(m.modified),
                path: m.path.display().to_string(),
            })
            .collect();
        let ollama = self.ollama.clone();
        let found =
            tokio::task::spawn_blocking(move || ollama.map(|o| o.list()).unwrap_or_default())
                .await
                .map_err(|e| Status::internal(e.to_string()))?;
        models.extend(found.into_iter().map(|m| pb::ModelSummary {
            name: m.name.to_string(),
            revision: m.digest,
            size_bytes: m.size_bytes,
            modified_unix: unix(m.modified),
            path: m.path.display().to_string(),
        }));
        Ok(Response::new(pb::ListResponse { models }))
    }

    async fn show(
        &self,
        req: Request<pb::ShowRequest>,
    ) -> Result<Response<pb::ShowResponse>, Status> {
        let model = self.resolve(&req.into_inner().model)?;
        show::show(&model)
            .map(Response::new)
            .map_err(Status::failed_precondition)
    }

    async fn delete(
        &self,
        req: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let name = req.into_inner().model;
        let parsed = crate::store::ModelRef::parse(&name)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let repo = match parsed {
            crate::store::ModelRef::Repo(repo) => repo,
            crate::store::ModelRef::Ollama(_) => {
                return Err(Status::invalid_argument(
                    "Grove reads ollama's store but never changes it; remove the model with `ollama rm`",
                ));
            }
            crate::store::ModelRef::Path(_) => {
                return Err(Status::invalid_argument(
                    "grove rm removes models from the store, not local directories or files",
                ));
            }
        };
        if let Ok(model) = self.resolve(&name) {
            let _ = self.sched.unload(model.path).await;
        }
        let report = self
            .store
            .remove(&repo)
            .map_err(|e| Status::not_found(e.to_string()))?;
        Ok(Response::new(pb::DeleteResponse {
            freed_bytes: report.bytes_freed,
        }))
    }

    async fn ps(&self, _: Request<pb::PsRequest>) -> Result<Response<pb::PsResponse>, Status> {
        let running = self.sched.ps().await.map_err(sched_status)?;
        let models = running
            .into_iter()
            .map(|r| pb::RunningModel {
                name: r.name,
                size_bytes: r.reserved_bytes,
                processor: if r.facts.on_gpu {
                    pb::Processor::Gpu
                } else {
                    pb::Processor::Cpu
                } as i32,
                context_length: r.facts.context_length,
                expires_unix: r
                    .expires
                    .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs() as i64),
                active_requests: r.active as u32,
                pid: r.pid,
                kv_capacity_tokens: r.facts.kv_capacity_tokens,
                kv_bits: r.facts.kv_bits,
                shards: r.shards,
                ranks: r
                    .ranks
                    .iter()
                    .enumerate()
                    .map(|(i, &(pid, resident))| pb::RunningRank {
                        rank: i as u32,
                        pid,
                        device: if r.facts.on_gpu {
                            format!("cuda:{i}")
                        } else {
                            "cpu".into()
                        },
                        resident_bytes: resident,
                    })
                    .collect(),
            })
            .collect();
        Ok(Response::new(pb::PsResponse { models }))
    }

    async fn load(
        &self,
        req: Request<pb::LoadRequest>,
    ) -> Result<Response<pb::LoadResponse>, Status> {
        let r = req.into_inner();
        let model = self.resolve(&r.model)?;
        let lease = self
            .sched
            .acquire(
                model.name,
                model.path,
                keep_alive(r.keep_alive_ns),
                r.shards,
            )
            .await
            .map_err(sched_status)?;
        Ok(Response::new(pb::LoadResponse {
            load_ns: lease.load_time.as_nanos() as u64,
        }))
    }

    async fn embed(
        &self,
        req: Request<pb::EmbedRequest>,
    ) -> Result<Response<pb::EmbedResponse>, Status> {
        let started = Instant::now();
        let r = req.into_inner();
        let model = self.resolve(&r.model)?;
        if r.inputs.is_empty() {
            return Err(Status::invalid_argument("no inputs to embed"));
        }
        let inputs = r
            .inputs
            .into_iter()
            .enumerate()
            .map(|(n, i)| {
                let input = match i.input {
                    Some(pb::embed_input::Input::Text(t)) => rpb::embed_input::Input::Text(t),
                    Some(pb::embed_input::Input::Tokens(t)) => {
                        rpb::embed_input::Input::Tokens(rpb::TokenList { ids: t.ids })
                    }
                    None => return Err(Status::invalid_argument(format!("input {n} is empty"))),
                };
                Ok(rpb::EmbedInput { input: Some(input) })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let lease = self
            .sched
            .acquire(
                model.name.clone(),
                model.path.clone(),
                keep_alive(r.keep_alive_ns),
                None,
            )
            .await
            .map_err(sched_status)?;
        let mut client = lease.client.clone();
        let request = rpb::EmbedRequest {
            inputs,
            truncate: r.truncate.unwrap_or(true),
            dimensions: r.dimensions,
        };
        let reply = match client.embed(request).await {
            Ok(r) => r.into_inner(),
            Err(status) => return Err(runner_failure(status, &lease, &model.name).await),
        };
        Ok(Response::new(pb::EmbedResponse {
            prompt_tokens: reply.embeddings.iter().map(|e| e.tokens as u64).sum(),
            embeddings: reply
                .embeddings
                .into_iter()
                .map(|e| pb::EmbedVector { values: e.values })
                .collect(),
            total_ns: started.elapsed().as_nanos() as u64,
            load_ns: lease.load_time.as_nanos() as u64,
        }))
    }

    async fn unload(
        &self,
        req: Request<pb::UnloadRequest>,
    ) -> Result<Response<pb::UnloadResponse>, Status> {
        let model = self.resolve(&req.into_inner().model)?;
        match self.sched.unload(model.path).await.map_err(sched_status)? {
            true => Ok(Response::new(pb::UnloadResponse {})),
            false => Err(Status::not_found(format!("{} is not loaded", model.name))),
        }
    }

    async fn version(
        &self,
        _: Request<pb::VersionRequest>,
    ) -> Result<Response<pb::VersionResponse>, Status> {
        Ok(Response::new(pb::VersionResponse {
            version: env!("CARGO_PKG_VERSION").into(),
        }))
    }

    async fn pull(&self, req: Request<pb::PullRequest>) -> Result<Response<PullStream>, Status> {
        let req = req.into_inner();
        crate::pull_rpc::pull(self.store.clone(), req.model, req.hub)
            .await
            .map(Response::new)
    }
}
