//! ollama's API: `/api/chat`, `/api/generate` (NDJSON streams, the final
//! line's counts and nanosecond durations as ollama writes them), `/api/tags`,
//! `/api/ps`, `/api/show`, `/api/pull` (streamed progress), `/api/delete`,
//! `/api/version`; errors as `{"error": …}`.
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use futures_util::stream as fstream;
use futures_util::{Stream, StreamExt};
use grove_proto::v1 as pb;
use grove_proto::v1::grove_server::Grove;
use pb::generate_response::Event as Ev;
use serde_json::{Value, json};
use tonic::{Request, Status};

use super::logprobs as lp;
use super::ollama_types::{
    self as t, ChatRequest, GenerateRequest, ModelRequest, keep_alive, options, think,
};
use super::stream::{GenStream, arguments, finish_reason, whole};
use super::{http_status, rfc3339};
use crate::api::Api;

pub fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/", get(running).head(running))
        .route("/api/chat", post(chat))
        .route("/api/generate", post(generate))
        .route("/api/tags", get(tags))
        .route("/api/ps", get(ps))
        .route("/api/show", post(show))
        .route("/api/pull", post(pull))
        .route("/api/delete", delete(remove))
        .route("/api/version", get(version))
}

/// ollama's error body.
pub fn error(status: StatusCode, message: &str) -> Response {
    super::json(status, &json!({ "error": message }))
}

pub(super) fn bad(message: impl AsRef<str>) -> Response {
    error(StatusCode::BAD_REQUEST, message.as_ref())
}

pub(super) fn status_error(s: &Status) -> Response {
    error(http_status(s.code()), s.message())
}

// The error is the handler's response, returned once per request.
#[allow(clippy::result_large_err)]
pub(super) fn parse<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, Response> {
    let body = body.map_err(|e| error(e.status(), &e.body_text()))?;
    serde_json::from_slice(&body).map_err(|e| bad(format!("the request body is not valid: {e}")))
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(r) => return r,
        }
    };
}

async fn running() -> &'static str {
    "Grove is running"
}

async fn version() -> Response {
    super::json(
        StatusCode::OK,
        &json!({ "version": env!("CARGO_PKG_VERSION") }),
    )
}

fn now() -> String {
    rfc3339(SystemTime::now())
}

/// An NDJSON response of `lines`.
fn ndjson(lines: impl Stream<Item = Value> + Send + 'static) -> Response {
    let body = Body::from_stream(lines.map(|v| Ok::<_, Infallible>(Bytes::from(format!("{v}\n")))));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        body,
    )
        .into_response()
}

/// ollama's `done_reason`: tool calls end with "stop" there.
fn done_reason(done: &pb::Done) -> &'static str {
    match finish_reason(done) {
        "tool_calls" => "stop",
        r => r,
    }
}

/// The final line's fields.
fn final_fields(v: &mut Value, done: &pb::Done) {
    let m = done.metrics.unwrap_or_default();
    v["done"] = json!(true);
    v["done_reason"] = json!(done_reason(done));
    v["total_duration"] = json!(m.total_ns);
    v["load_duration"] = json!(m.load_ns);
    v["prompt_eval_count"] = json!(m.prompt_tokens);
    v["prompt_eval_duration"] = json!(m.prompt_eval_ns);
    v["eval_count"] = json!(m.eval_tokens);
    v["eval_duration"] = json!(m.eval_ns);
}

fn tool_calls_json(calls: &[pb::ToolCall], first: usize) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"id": c.id, "function": {"index": first + i, "name": c.name, "arguments": arguments(c)}})
        })
        .collect()
}

/// A load (or, with keep_alive 0, an unload) asked by a request without
/// input, answered as ollama does.
async fn load_or_unload(api: &Api, model: String, keep: Option<i64>, line: Value) -> Response {
    let reason = if keep == Some(0) {
        match api.unload(Request::new(pb::UnloadRequest { model })).await {
            Ok(_) => "unload",
            Err(s) if s.code() == tonic::Code::NotFound => "unload",
            Err(s) => return status_error(&s),
        }
    } else {
        let req = pb::LoadRequest {
            shards: None,
            model,
            keep_alive_ns: keep,
        };
        match api.load(Request::new(req)).await {
            Ok(_) => "load",
            Err(s) => return status_error(&s),
        }
    };
    let mut v = line;
    v["done"] = json!(true);
    v["done_reason"] = json!(reason);
    super::json(StatusCode::OK, &v)
}

/// Streams (or gathers) a generation as ollama lines, each made by
/// `line(text, thinking, calls)`.
async fn reply(
    stream: GenStream,
    streaming: bool,
    logprobs: bool,
    line: impl Fn(&str, &str, Value) -> Value + Send + 'static,
) -> Response {
    if !streaming {
        return match whole(stream).await {
            Ok(w) => {
                let calls = if w.tool_calls.is_empty() {
                    Value::Null
                } else {
                    tool_calls_json(&w.tool_calls, 0)
                };
                let mut v = line(&w.text, &w.thinking, calls);
                if logprobs {
                    v["logprobs"] = lp::token_list(&w.logprobs);
                }
                final_fields(&mut v, &w.done);
                super::json(StatusCode::OK, &v)
            }
            Err(s) => status_error(&s),
        };
    }
    let mut calls = 0;
    let lines = stream.map(move |item| match item {
        Ok(pb::GenerateResponse { event: Some(e) }) => match e {
            Ev::Text(t) => line(&t, "", Value::Null),
            Ev::Thinking(t) => line("", &t, Value::Null),
            Ev::Logprobs(l) => {
                let mut v = line("", "", Value::Null);
                v["logprobs"] = lp::token_list(&l.tokens);
                v
            }
            Ev::ToolCall(c) => {
                calls += 1;
                line("", "", tool_calls_json(std::slice::from_ref(&c), calls - 1))
            }
            Ev::Done(d) => {
                let mut v = line("", "", Value::Null);
                final_fields(&mut v, &d);
                v
            }
        },
        Ok(_) => line("", "", Value::Null),
        Err(s) => json!({ "error": s.message() }),
    });
    ndjson(lines)
}

async fn chat(State(api): State<Arc<Api>>, body: Result<Bytes, BytesRejection>) -> Response {
    let req: ChatRequest = tri!(parse(body));
    let top = tri!(t::top_logprobs(req.logprobs, req.top_logprobs).map_err(bad));
    let keep = tri!(keep_alive(req.keep_alive.as_ref()).map_err(bad));
    let mut opts = tri!(options(req.options.as_ref()).map_err(bad));
    opts.top_logprobs = top;
    opts.constraint = tri!(t::format(req.format.as_ref()).map_err(bad));
    let thinking = tri!(think(req.think.as_ref()).map_err(bad));
    let model = req.model.clone();
    let line = move |text: &str, thinking: &str, calls: Value| {
        let mut message = json!({"role": "assistant", "content": text});
        if !thinking.is_empty() {
            message["thinking"] = json!(thinking);
        }
        if !calls.is_null() {
            message["tool_calls"] = calls;
        }
        json!({"model": model, "created_at": now(), "message": message, "done": false})
    };
    if req.messages.is_empty() {
        let first = line("", "", Value::Null);
        return load_or_unload(&api, req.model, keep, first).await;
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.into_iter().enumerate() {
        messages.push(tri!(t::message(m, i).map_err(bad)));
    }
    let tools: Vec<String> = req
        .tools
        .unwrap_or_default()
        .iter()
        .map(Value::to_string)
        .collect();
    let request = pb::ChatRequest {
        shards: None,
        model: req.model,
        messages,
        parse_tool_calls: !tools.is_empty(),
        tools_json: tools,
        options: Some(opts),
        keep_alive_ns: keep,
        enable_thinking: thinking.enable,
        reasoning_effort: thinking.effort as i32,
        split_reasoning: true,
    };
    let stream = match api.chat(Request::new(request)).await {
        Ok(s) => s.into_inner(),
        Err(s) => return status_error(&s),
    };
    reply(stream, req.stream.unwrap_or(true), top.is_some(), line).await
}

async fn generate(State(api): State<Arc<Api>>, body: Result<Bytes, BytesRejection>) -> Response {
    let req: GenerateRequest = tri!(parse(body));
    let top = tri!(t::top_logprobs(req.logprobs, req.top_logprobs).map_err(bad));
    let images = req.images.as_ref().is_some_and(|v| !v.is_empty());
    tri!(t::unsupported(images).map_err(bad));
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return bad("suffix (fill in the middle) is not supported");
    }
    if req.template.as_ref().is_some_and(|s| !s.is_empty()) {
        return bad(
            "a custom template is not supported: Grove renders the model's own chat template",
        );
    }
    if req.context.as_ref().is_some_and(|c| !c.is_empty()) {
        return bad("context (token ids of an earlier reply) is not supported; use /api/chat");
    }
    let keep = tri!(keep_alive(req.keep_alive.as_ref()).map_err(bad));
    let mut opts = tri!(options(req.options.as_ref()).map_err(bad));
    opts.top_logprobs = top;
    opts.constraint = tri!(t::format(req.format.as_ref()).map_err(bad));
    let thinking = tri!(think(req.think.as_ref()).map_err(bad));
    let model = req.model.clone();
    let line = move |text: &str, thinking: &str, _: Value| {
        let mut v = json!({"model": model, "created_at": now(), "response": text, "done": false});
        if !thinking.is_empty() {
            v["thinking"] = json!(thinking);
        }
        v
    };
    if req.prompt.is_empty() && req.system.is_none() {
        let first = line("", "", Value::Null);
        return load_or_unload(&api, req.model, keep, first).await;
    }
    let streaming = req.stream.unwrap_or(true);
    let result = if req.raw == Some(true) {
        if req.system.is_some() || thinking.is_set() {
            return bad("raw prompts take no system prompt or think (nothing is templated)");
        }
        let request = pb::GenerateRequest {
            shards: None,
            model: req.model,
            prompt: req.prompt,
            options: Some(opts),
            keep_alive_ns: keep,
        };
        api.generate(Request::new(request)).await
    } else {
        let mut messages = Vec::new();
        let message = |role: pb::Role, content: String| pb::Message {
            role: role as i32,
            content,
            ..Default::default()
        };
        if let Some(system) = req.system {
            messages.push(message(pb::Role::System, system));
        }
        messages.push(message(pb::Role::User, req.prompt));
        let request = pb::ChatRequest {
            model: req.model,
            messages,
            options: Some(opts),
            keep_alive_ns: keep,
            enable_thinking: thinking.enable,
            reasoning_effort: thinking.effort as i32,
            split_reasoning: true,
            ..Default::default()
        };
        api.chat(Request::new(request)).await
    };
    match result {
        Ok(s) => reply(s.into_inner(), streaming, top.is_some(), line).await,
        Err(s) => status_error(&s),
    }
}

/// `135.1M`, `8.0B`: a parameter count as ollama shows it.
fn parameter_size(n: u64) -> String {
    match n {
        0 => String::new(),
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n => format!("{:.1}K", n as f64 / 1e3),
    }
}

fn details(s: Option<&pb::ShowResponse>, path: &str) -> Value {
    let Some(s) = s else {
        return json!({"format": if path.ends_with(".gguf") { "gguf" } else { "safetensors" }});
    };
    let level = if s.quantization.is_empty() {
        s.dtype.to_uppercase()
    } else {
        s.quantization.clone()
    };
    json!({
        "parent_model": "",
        "format": if s.path.ends_with(".gguf") { "gguf" } else { "safetensors" },
        "family": s.architecture,
        "families": [s.architecture],
        "parameter_size": parameter_size(s.parameter_count),
        "quantization_level": level,
    })
}

async fn show_of(api: &Api, model: &str) -> Option<pb::ShowResponse> {
    let req = pb::ShowRequest {
        model: model.to_owned(),
    };
    api.show(Request::new(req))
        .await
        .ok()
        .map(|r| r.into_inner())
}

async fn tags(State(api): State<Arc<Api>>) -> Response {
    let list = match api.list(Request::new(pb::ListRequest {})).await {
        Ok(r) => r.into_inner().models,
        Err(s) => return status_error(&s),
    };
    let mut models = Vec::with_capacity(list.len());
    for m in list {
        let facts = show_of(&api, &m.name).await;
        let modified = SystemTime::UNIX_EPOCH + Duration::from_secs(m.modified_unix.max(0) as u64);
        models.push(json!({
            "name": m.name, "model": m.name, "modified_at": rfc3339(modified),
            "size": m.size_bytes, "digest": m.revision, "details": details(facts.as_ref(), &m.path),
        }));
    }
    super::json(StatusCode::OK, &json!({ "models": models }))
}

async fn ps(State(api): State<Arc<Api>>) -> Response {
    let running = match api.ps(Request::new(pb::PsRequest {})).await {
        Ok(r) => r.into_inner().models,
        Err(s) => return status_error(&s),
    };
    let mut models = Vec::with_capacity(running.len());
    for m in running {
        let facts = show_of(&api, &m.name).await;
        let expires = SystemTime::UNIX_EPOCH + Duration::from_secs(m.expires_unix.max(0) as u64);
        let on_gpu = m.processor == pb::Processor::Gpu as i32;
        models.push(json!({
            "name": m.name, "model": m.name, "size": m.size_bytes,
            "digest": "", "details": details(facts.as_ref(), ""),
            "expires_at": rfc3339(expires),
            "size_vram": if on_gpu { m.size_bytes } else { 0 },
            "context_length": m.context_length,
        }));
    }
    super::json(StatusCode::OK, &json!({ "models": models }))
}

async fn show(State(api): State<Arc<Api>>, body: Result<Bytes, BytesRejection>) -> Response {
    let req: ModelRequest = tri!(parse(body));
    let model = tri!(req.model().map_err(bad));
    let s = match api.show(Request::new(pb::ShowRequest { model })).await {
        Ok(r) => r.into_inner(),
        Err(s) => return status_error(&s),
    };
    let mut capabilities = Vec::new();
    if s.generates {
        capabilities.push("completion");
        if s.chat_template.contains("tools") {
            capabilities.push("tools");
        }
        if s.chat_template.contains("enable_thinking") || s.chat_template.contains("<think>") {
            capabilities.push("thinking");
        }
    }
    if s.embeds {
        capabilities.push("embedding");
    }
    let arch = s.architecture.clone();
    let body = json!({
        "modelfile": "", "parameters": "", "template": s.chat_template, "license": s.license,
        "details": details(Some(&s), &s.path),
        "model_info": {
            "general.architecture": arch,
            "general.parameter_count": s.parameter_count,
            format!("{arch}.context_length"): s.context_length,
        },
        "capabilities": capabilities,
    });
    super::json(StatusCode::OK, &body)
}

/// A pull progress message as ollama's status lines.
fn pull_lines(p: &pb::PullProgress) -> Vec<Value> {
    use pb::PullStage as S;
    let file = |status: String| json!({"status": status, "digest": p.file, "total": p.total_bytes, "completed": p.completed_bytes});
    match S::try_from(p.stage) {
        Ok(S::Resolved) => vec![json!({"status": "pulling manifest"})],
        Ok(S::FileStart | S::FileBytes | S::FileWaiting) => {
            vec![file(format!("pulling {}", p.file))]
        }
        Ok(S::FileDone) => {
            let mut v = file(format!("pulling {}", p.file));
            v["completed"] = v["total"].clone();
            vec![v]
        }
        Ok(S::FileVerifying) => vec![json!({"status": "verifying sha256 digest"})],
        Ok(S::Done) => vec![
            json!({"status": "writing manifest"}),
            json!({"status": "success"}),
        ],
        _ => Vec::new(),
    }
}

async fn pull(State(api): State<Arc<Api>>, body: Result<Bytes, BytesRejection>) -> Response {
    let req: ModelRequest = tri!(parse(body));
    let model = tri!(req.model().map_err(bad));
    if req.insecure == Some(true) {
        return bad("insecure pulls are not supported: the hub is reached over HTTPS");
    }
    let hub = req.hub.map(|h| pb::HubSettings {
        endpoint: h.endpoint,
        token: h.token,
        offline: h.offline,
    });
    let mut stream = match api.pull(Request::new(pb::PullRequest { model, hub })).await {
        Ok(s) => s.into_inner(),
        Err(s) => return status_error(&s),
    };
    if req.stream == Some(false) {
        while let Some(item) = stream.next().await {
            if let Err(s) = item {
                return status_error(&s);
            }
        }
        return super::json(StatusCode::OK, &json!({"status": "success"}));
    }
    let lines = stream.flat_map(|item| {
        fstream::iter(match item {
            Ok(p) => pull_lines(&p),
            Err(s) => vec![json!({ "error": s.message() })],
        })
    });
    ndjson(lines)
}

async fn remove(State(api): State<Arc<Api>>, body: Result<Bytes, BytesRejection>) -> Response {
    let req: ModelRequest = tri!(parse(body));
    let model = tri!(req.model().map_err(bad));
    match api.delete(Request::new(pb::DeleteRequest { model })).await {
        Ok(_) => (StatusCode::OK, "").into_response(),
        Err(s) => status_error(&s),
    }
}
