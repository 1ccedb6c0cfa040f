//! OpenAI's API: `POST /v1/chat/completions`, `POST /v1/completions`,
//! `GET /v1/models[/{id}]`, with streams as server-sent events, usage (with
//! cached prompt tokens) and errors in OpenAI's error object.
use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use futures_util::stream as fstream;
use grove_proto::v1 as pb;
use grove_proto::v1::grove_server::Grove;
use pb::generate_response::Event as Ev;
use serde_json::{Value, json};
use tonic::{Request, Status};

use super::logprobs as lp;
use super::openai_types::{ChatCompletionRequest, CompletionRequest, Invalid};
use super::stream::{GenStream, Whole, finish_reason, whole};
use super::{http_status, new_id, unix_now};
use crate::api::Api;

pub fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
}

/// OpenAI's error object with `status`.
pub fn error(status: StatusCode, message: &str, code: &str) -> Response {
    let kind = match status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::NOT_FOUND => "invalid_request_error",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        s if s.is_client_error() => "invalid_request_error",
        _ => "server_error",
    };
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    super::json(status, &body)
}

pub(super) fn invalid(e: Invalid) -> Response {
    let body = json!({"error": {
        "message": e.message, "type": "invalid_request_error", "param": e.param, "code": null,
    }});
    super::json(StatusCode::BAD_REQUEST, &body)
}

pub(super) fn status_error(s: &Status) -> Response {
    let code = match s.code() {
        tonic::Code::NotFound => "model_not_found",
        tonic::Code::ResourceExhausted => "busy",
        tonic::Code::Unavailable => "unavailable",
        tonic::Code::InvalidArgument => "invalid_request",
        _ => "internal_error",
    };
    error(http_status(s.code()), s.message(), code)
}

/// The body as `T`; a body that is too large, not JSON, or of the wrong
/// shape is a 400 (413) in OpenAI's form.
// The error is the handler's response, returned once per request.
#[allow(clippy::result_large_err)]
pub(super) fn parse<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, Response> {
    let body = body.map_err(|e| error(e.status(), &e.body_text(), "invalid_body"))?;
    serde_json::from_slice(&body).map_err(|e| {
        invalid(Invalid {
            message: format!("the request body is not a valid request: {e}"),
            param: None,
        })
    })
}

fn tool_call_json(c: &pb::ToolCall, index: Option<usize>) -> Value {
    let mut v = json!({
        "id": c.id, "type": "function",
        "function": {"name": c.name, "arguments": c.arguments_json},
    });
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

const FINGERPRINT: &str = concat!("grove-", env!("CARGO_PKG_VERSION"));

/// An SSE response over `events`, ended by `data: [DONE]`.
fn sse(events: impl futures_util::Stream<Item = Value> + Send + 'static) -> Response {
    let events = events
        .map(|v| Ok::<_, Infallible>(Event::default().data(v.to_string())))
        .chain(fstream::iter([Ok(Event::default().data("[DONE]"))]));
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A stream error as OpenAI sends it inside an SSE stream.
fn stream_error(s: &Status) -> Value {
    json!({"error": {"message": s.message(), "type": "server_error", "param": null,
        "code": format!("{:?}", s.code())}})
}

/// The `n` streams of a request: choice i is the request seeded `seed + i`
/// (unseeded choices sample from their own clocks; greedy ones agree).
async fn start_choices<R, F, Fut>(n: u32, request: R, start: F) -> Result<Vec<GenStream>, Status>
where
    R: Clone,
    F: Fn(R) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<GenStream>, Status>>,
    R: Seeded,
{
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let mut r = request.clone();
        if let Some(seed) = r.seed_mut() {
            *seed = seed.wrapping_add(u64::from(i));
        }
        // The first puts the prompt into the runner's prompt cache; every
        // choice starts from it (the prompt is prefilled once).
        if n > 1 && i == 0 {
            r.share_prefill();
        }
        out.push(start(r).await?.into_inner());
    }
    Ok(out)
}

/// A request whose options may carry a seed.
trait Seeded {
    fn seed_mut(&mut self) -> Option<&mut u64>;
    fn share_prefill(&mut self);
}
impl Seeded for pb::ChatRequest {
    fn seed_mut(&mut self) -> Option<&mut u64> {
        self.options.as_mut()?.seed.as_mut()
    }
    fn share_prefill(&mut self) {
        self.options
            .get_or_insert_with(Default::default)
            .share_prefill = true;
    }
}
impl Seeded for pb::GenerateRequest {
    fn seed_mut(&mut self) -> Option<&mut u64> {
        self.options.as_mut()?.seed.as_mut()
    }
    fn share_prefill(&mut self) {
        self.options
            .get_or_insert_with(Default::default)
            .share_prefill = true;
    }
}

/// The choices' streams as one, each item tagged with its choice's index.
fn merged(
    streams: Vec<GenStream>,
) -> impl futures_util::Stream<Item = (usize, Result<pb::GenerateResponse, Status>)> {
    fstream::select_all(
        streams
            .into_iter()
            .enumerate()
            .map(|(i, s)| s.map(move |item| (i, item)).boxed()),
    )
}

/// A stream's choices as they end: the usage once the last of `n` has.
struct Ending {
    totals: Totals,
    left: usize,
}

impl Ending {
    fn new(n: usize) -> Self {
        Self {
            totals: Totals::default(),
            left: n,
        }
    }
    /// A choice ended with `m`: the usage if it was the last one.
    fn done(&mut self, m: &pb::Metrics) -> Option<Value> {
        self.totals.add(m);
        self.left = self.left.saturating_sub(1);
        (self.left == 0).then(|| self.totals.json())
    }
}

/// Usage over all choices: the prompt once, every choice's completion.
#[derive(Default, Clone, Copy)]
struct Totals {
    prompt: u32,
    completion: u32,
    cached: u32,
}

impl Totals {
    /// Over whole replies.
    fn of(ws: &[Whole]) -> Self {
        let mut t = Self::default();
        for w in ws {
            t.add(&w.metrics());
        }
        t
    }
    fn add(&mut self, m: &pb::Metrics) {
        self.prompt = m.prompt_tokens;
        self.cached = self.cached.max(m.cached_prompt_tokens);
        self.completion += m.eval_tokens;
    }
    fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        })
    }
}

async fn chat(State(api): State<Arc<Api>>, body: Result<Bytes, BytesRejection>) -> Response {
    let req: ChatCompletionRequest = match parse(body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let chat = match req.into_grove() {
        Ok(c) => c,
        Err(e) => return invalid(e),
    };
    let model = chat.request.model.clone();
    let streams = match start_choices(chat.n, chat.request, |r| api.chat(Request::new(r))).await {
        Ok(s) => s,
        Err(s) => return status_error(&s),
    };
    let (id, created) = (new_id("chatcmpl-"), unix_now());
    if !chat.stream {
        return match futures_util::future::try_join_all(streams.into_iter().map(whole)).await {
            Ok(w) => super::json(
                StatusCode::OK,
                &chat_whole(
                    &id,
                    created,
                    &model,
                    &w,
                    chat.legacy_functions,
                    chat.logprobs,
                ),
            ),
            Err(s) => status_error(&s),
        };
    }
    let (include_usage, n, legacy) = (chat.include_usage, chat.n as usize, chat.legacy_functions);
    let chunk = move |index: usize, delta: Value, finish: Option<&str>| {
        let mut v = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": FINGERPRINT,
            "choices": [{"index": index, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    };
    let first: Vec<Value> = (0..n)
        .map(|i| chunk(i, json!({"role": "assistant", "content": ""}), None))
        .collect();
    let mut calls = vec![0usize; n];
    let mut ending = Ending::new(n);
    let events = merged(streams).flat_map(move |(i, item)| {
        let out: Vec<Value> = match item {
            Ok(pb::GenerateResponse { event: Some(e) }) => match e {
                Ev::Text(t) => vec![chunk(i, json!({"content": t}), None)],
                Ev::Thinking(t) => vec![chunk(i, json!({"reasoning_content": t}), None)],
                Ev::Logprobs(l) => {
                    let mut c = chunk(i, json!({}), None);
                    c["choices"][0]["logprobs"] = lp::chat(&l.tokens);
                    vec![c]
                }
                Ev::ToolCall(c) => {
                    calls[i] += 1;
                    let delta = if legacy && calls[i] == 1 {
                        json!({"function_call": function_call_json(&c)})
                    } else {
                        json!({"tool_calls": [tool_call_json(&c, Some(calls[i] - 1))]})
                    };
                    vec![chunk(i, delta, None)]
                }
                Ev::Done(d) => {
                    let finish = legacy_finish(finish_reason(&d), legacy);
                    let mut out = vec![chunk(i, json!({}), Some(finish))];
                    if let Some(usage) = ending.done(&d.metrics.unwrap_or_default())
                        && include_usage
                    {
                        let mut last = chunk(i, json!({}), None);
                        last["choices"] = json!([]);
                        last["usage"] = usage;
                        out.push(last);
                    }
                    out
                }
            },
            Ok(_) => Vec::new(),
            Err(s) => vec![stream_error(&s)],
        };
        fstream::iter(out)
    });
    sse(fstream::iter(first).chain(events))
}

/// A call as the legacy functions API writes it.
fn function_call_json(c: &pb::ToolCall) -> Value {
    json!({"name": c.name, "arguments": c.arguments_json})
}

/// The legacy functions API's name for ending in a call.
fn legacy_finish(reason: &'static str, legacy: bool) -> &'static str {
    if legacy && reason == "tool_calls" {
        "function_call"
    } else {
        reason
    }
}

fn chat_whole(
    id: &str,
    created: i64,
    model: &str,
    ws: &[Whole],
    legacy: bool,
    logprobs: bool,
) -> Value {
    let choices: Vec<Value> = ws
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let mut message = json!({
                "role": "assistant",
                "content": if w.text.is_empty() && !w.tool_calls.is_empty() { Value::Null } else { json!(w.text) },
            });
            if !w.thinking.is_empty() {
                message["reasoning_content"] = json!(w.thinking);
            }
            // The legacy API's reply carries its (first) call as
            // function_call; more calls than one also come as tool_calls.
            if legacy && let Some(first) = w.tool_calls.first() {
                message["function_call"] = function_call_json(first);
            }
            if !w.tool_calls.is_empty() && (!legacy || w.tool_calls.len() > 1) {
                message["tool_calls"] = w
                    .tool_calls
                    .iter()
                    .map(|c| tool_call_json(c, None))
                    .collect();
            }
            let finish = legacy_finish(finish_reason(&w.done), legacy);
            let lp = if logprobs { lp::chat(&w.logprobs) } else { Value::Null };
            json!({"index": i, "message": message, "logprobs": lp, "finish_reason": finish})
        })
        .collect();
    json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "system_fingerprint": FINGERPRINT,
        "choices": choices,
        "usage": Totals::of(ws).json(),
    })
}

async fn completions(State(api): State<Arc<Api>>, body: Result<Bytes, BytesRejection>) -> Response {
    let req: CompletionRequest = match parse(body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let c = match req.into_grove() {
        Ok(c) => c,
        Err(e) => return invalid(e),
    };
    let model = c.request.model.clone();
    let streams = match start_choices(c.n, c.request, |r| api.generate(Request::new(r))).await {
        Ok(s) => s,
        Err(s) => return status_error(&s),
    };
    let (id, created) = (new_id("cmpl-"), unix_now());
    let body = move |choices: Value, usage: Option<Value>| {
        let mut v = json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": FINGERPRINT, "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    };
    let choice = |i: usize, text: &str, finish: Option<&str>| json!({"text": text, "index": i, "logprobs": null, "finish_reason": finish});
    let with_logprobs = c.logprobs;
    if !c.stream {
        return match futures_util::future::try_join_all(streams.into_iter().map(whole)).await {
            Ok(ws) => {
                let choices: Vec<Value> = ws
                    .iter()
                    .enumerate()
                    .map(|(i, w)| {
                        let mut v = choice(i, &w.text, Some(finish_reason(&w.done)));
                        if with_logprobs {
                            v["logprobs"] = lp::completion(&w.logprobs, 0).0;
                        }
                        v
                    })
                    .collect();
                let usage = Totals::of(&ws).json();
                super::json(StatusCode::OK, &body(json!(choices), Some(usage)))
            }
            Err(s) => status_error(&s),
        };
    }
    let (include_usage, n) = (c.include_usage, c.n as usize);
    let mut ending = Ending::new(n);
    // Where each choice's next token starts in its text (text_offset).
    let mut offsets = vec![0usize; n];
    let events = merged(streams).flat_map(move |(i, item)| {
        let out: Vec<Value> = match item {
            Ok(pb::GenerateResponse {
                event: Some(Ev::Text(t)),
            }) => vec![body(json!([choice(i, &t, None)]), None)],
            Ok(pb::GenerateResponse {
                event: Some(Ev::Logprobs(l)),
            }) => {
                let (v, end) = lp::completion(&l.tokens, offsets[i]);
                offsets[i] = end;
                let mut c = choice(i, "", None);
                c["logprobs"] = v;
                vec![body(json!([c]), None)]
            }
            Ok(pb::GenerateResponse {
                event: Some(Ev::Done(d)),
            }) => {
                let mut out = vec![body(json!([choice(i, "", Some(finish_reason(&d)))]), None)];
                if let Some(usage) = ending.done(&d.metrics.unwrap_or_default())
                    && include_usage
                {
                    out.push(body(json!([]), Some(usage)));
                }
                out
            }
            Ok(_) => Vec::new(),
            Err(s) => vec![stream_error(&s)],
        };
        fstream::iter(out)
    });
    sse(events)
}

fn model_json(m: &pb::ModelSummary) -> Value {
    json!({"id": m.name, "object": "model", "created": m.modified_unix, "owned_by": "grove"})
}

async fn models(State(api): State<Arc<Api>>) -> Response {
    match api.list(Request::new(pb::ListRequest {})).await {
        Ok(r) => {
            let data: Vec<Value> = r.into_inner().models.iter().map(model_json).collect();
            super::json(StatusCode::OK, &json!({"object": "list", "data": data}))
        }
        Err(s) => status_error(&s),
    }
}

async fn model(State(api): State<Arc<Api>>, Path(id): Path<String>) -> Response {
    let list = match api.list(Request::new(pb::ListRequest {})).await {
        Ok(r) => r.into_inner().models,
        Err(s) => return status_error(&s),
    };
    match list.iter().find(|m| m.name == id) {
        Some(m) => super::json(StatusCode::OK, &model_json(m)),
        None => error(
            StatusCode::NOT_FOUND,
            &format!("the model {id:?} is not in the store"),
            "model_not_found",
        ),
    }
}
