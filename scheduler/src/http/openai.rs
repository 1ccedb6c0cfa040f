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

use super::openai_types::{ChatCompletionRequest, CompletionRequest, Invalid};
use super::stream::{GenStream, Whole, finish_reason, whole};
use super::{http_status, unix_now};
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

fn invalid(e: Invalid) -> Response {
    let body = json!({"error": {
        "message": e.message, "type": "invalid_request_error", "param": e.param, "code": null,
    }});
    super::json(StatusCode::BAD_REQUEST, &body)
}

fn status_error(s: &Status) -> Response {
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
fn parse<T: serde::de::DeserializeOwned>(
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

fn usage(m: &pb::Metrics) -> Value {
    json!({
        "prompt_tokens": m.prompt_tokens,
        "completion_tokens": m.eval_tokens,
        "total_tokens": m.prompt_tokens + m.eval_tokens,
        "prompt_tokens_details": {"cached_tokens": m.cached_prompt_tokens},
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

/// An id for a response (`chatcmpl-…`, `cmpl-…`).
fn response_id(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}-{nanos:x}")
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
    let stream: GenStream = match api.chat(Request::new(chat.request)).await {
        Ok(s) => s.into_inner(),
        Err(s) => return status_error(&s),
    };
    let (id, created) = (response_id("chatcmpl"), unix_now());
    if !chat.stream {
        return match whole(stream).await {
            Ok(w) => super::json(StatusCode::OK, &chat_whole(&id, created, &model, &w)),
            Err(s) => status_error(&s),
        };
    }
    let include_usage = chat.include_usage;
    let chunk = move |delta: Value, finish: Option<&str>| {
        let mut v = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": FINGERPRINT,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    };
    let first = chunk(json!({"role": "assistant", "content": ""}), None);
    let mut calls = 0usize;
    let events = stream.flat_map(move |item| {
        let out: Vec<Value> = match item {
            Ok(pb::GenerateResponse { event: Some(e) }) => match e {
                Ev::Text(t) => vec![chunk(json!({"content": t}), None)],
                Ev::Thinking(t) => vec![chunk(json!({"reasoning_content": t}), None)],
                Ev::ToolCall(c) => {
                    calls += 1;
                    vec![chunk(
                        json!({"tool_calls": [tool_call_json(&c, Some(calls - 1))]}),
                        None,
                    )]
                }
                Ev::Done(d) => {
                    let mut out = vec![chunk(json!({}), Some(finish_reason(&d)))];
                    if include_usage {
                        let mut last = chunk(json!({}), None);
                        last["choices"] = json!([]);
                        last["usage"] = usage(&d.metrics.unwrap_or_default());
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
    sse(fstream::iter([first]).chain(events))
}

fn chat_whole(id: &str, created: i64, model: &str, w: &Whole) -> Value {
    let mut message = json!({
        "role": "assistant",
        "content": if w.text.is_empty() && !w.tool_calls.is_empty() { Value::Null } else { json!(w.text) },
    });
    if !w.thinking.is_empty() {
        message["reasoning_content"] = json!(w.thinking);
    }
    if !w.tool_calls.is_empty() {
        message["tool_calls"] = w
            .tool_calls
            .iter()
            .map(|c| tool_call_json(c, None))
            .collect();
    }
    json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "system_fingerprint": FINGERPRINT,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason(&w.done)}],
        "usage": usage(&w.metrics()),
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
    let stream: GenStream = match api.generate(Request::new(c.request)).await {
        Ok(s) => s.into_inner(),
        Err(s) => return status_error(&s),
    };
    let (id, created) = (response_id("cmpl"), unix_now());
    let chunk = move |text: &str, finish: Option<&str>, usage: Option<Value>| {
        let mut v = json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": FINGERPRINT,
            "choices": [{"text": text, "index": 0, "logprobs": null, "finish_reason": finish}],
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    };
    if !c.stream {
        return match whole(stream).await {
            Ok(w) => super::json(
                StatusCode::OK,
                &chunk(
                    &w.text,
                    Some(finish_reason(&w.done)),
                    Some(usage(&w.metrics())),
                ),
            ),
            Err(s) => status_error(&s),
        };
    }
    let include_usage = c.include_usage;
    let events = stream.flat_map(move |item| {
        let out: Vec<Value> = match item {
            Ok(pb::GenerateResponse {
                event: Some(Ev::Text(t)),
            }) => vec![chunk(&t, None, None)],
            Ok(pb::GenerateResponse {
                event: Some(Ev::Done(d)),
            }) => {
                let mut out = vec![chunk("", Some(finish_reason(&d)), None)];
                if include_usage {
                    let mut last = chunk("", None, Some(usage(&d.metrics.unwrap_or_default())));
                    last["choices"] = json!([]);
                    out.push(last);
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
