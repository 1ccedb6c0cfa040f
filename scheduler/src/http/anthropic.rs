//! Anthropic's Messages API: `POST /v1/messages`, whole or as its streamed
//! events (message_start, content blocks of thinking, text and tool_use with
//! their deltas, message_delta, message_stop), errors in its shape. The key
//! comes as `x-api-key` or as a bearer token (see `with_auth`).
use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::StreamExt;
use futures_util::stream as fstream;
use grove_proto::v1 as pb;
use grove_proto::v1::grove_server::Grove;
use pb::generate_response::Event as Ev;
use serde_json::{Value, json};
use tonic::{Request, Status};

use super::anthropic_types::MessagesRequest;
use super::stream::{Whole, arguments, whole};
use super::{http_status, new_id};
use crate::api::Api;

pub fn routes() -> Router<Arc<Api>> {
    Router::new().route("/v1/messages", post(messages))
}

/// Anthropic's error body with `status`.
pub fn error(status: StatusCode, message: &str) -> Response {
    super::json(status, &error_json(status, message))
}

fn error_json(status: StatusCode, message: &str) -> Value {
    let kind = match status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

fn status_error(s: &Status) -> Response {
    error(http_status(s.code()), s.message())
}

/// Anthropic's name for how a reply ended.
fn stop_reason(done: &pb::Done) -> &'static str {
    match pb::DoneReason::try_from(done.reason) {
        Ok(pb::DoneReason::Length) => "max_tokens",
        Ok(pb::DoneReason::ToolCalls) => "tool_use",
        _ if !done.stop_sequence.is_empty() => "stop_sequence",
        _ => "end_turn",
    }
}

fn stop_sequence(done: &pb::Done) -> Value {
    if done.stop_sequence.is_empty() {
        Value::Null
    } else {
        json!(done.stop_sequence)
    }
}

/// Usage as Anthropic counts it: input tokens apart from those read from
/// the prompt cache.
fn usage(m: &pb::Metrics) -> Value {
    let cached = m.cached_prompt_tokens.min(m.prompt_tokens);
    json!({
        "input_tokens": m.prompt_tokens - cached,
        "output_tokens": m.eval_tokens,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    })
}

fn tool_use(c: &pb::ToolCall) -> Value {
    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": arguments(c)})
}

/// The whole reply; with `omit_thinking` its thinking block comes empty
/// (`thinking.display: "omitted"`).
fn whole_json(id: &str, model: &str, w: &Whole, omit_thinking: bool) -> Value {
    let mut content = Vec::new();
    if !w.thinking.is_empty() {
        let thinking = if omit_thinking {
            ""
        } else {
            w.thinking.as_str()
        };
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if !w.text.is_empty() {
        content.push(json!({"type": "text", "text": w.text}));
    }
    content.extend(w.tool_calls.iter().map(tool_use));
    json!({
        "id": id, "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop_reason(&w.done),
        "stop_sequence": stop_sequence(&w.done), "usage": usage(&w.metrics()),
    })
}

async fn messages(State(api): State<Arc<Api>>, body: Result<Bytes, BytesRejection>) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => return error(e.status(), &e.body_text()),
    };
    let req: MessagesRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            let message = format!("the request body is not a valid request: {e}");
            return error(StatusCode::BAD_REQUEST, &message);
        }
    };
    let m = match req.into_grove() {
        Ok(m) => m,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.0),
    };
    let model = m.request.model.clone();
    let stream = match api.chat(Request::new(m.request)).await {
        Ok(s) => s.into_inner(),
        Err(s) => return status_error(&s),
    };
    let id = new_id("msg_");
    if !m.stream {
        return match whole(stream).await {
            Ok(w) => super::json(
                StatusCode::OK,
                &whole_json(&id, &model, &w, m.omit_thinking),
            ),
            Err(s) => status_error(&s),
        };
    }
    let start = json!({"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }});
    let opening = [("message_start", start), ("ping", json!({"type": "ping"}))];
    let mut blocks = Blocks {
        omit_thinking: m.omit_thinking,
        ..Blocks::default()
    };
    let events = stream.flat_map(move |item| {
        let out = match item {
            Ok(pb::GenerateResponse { event: Some(e) }) => blocks.on(e),
            Ok(_) => Vec::new(),
            Err(s) => vec![("error", error_json(http_status(s.code()), s.message()))],
        };
        fstream::iter(out)
    });
    let events = fstream::iter(opening).chain(events).map(|(name, data)| {
        Ok::<_, Infallible>(Event::default().event(name).data(data.to_string()))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The content block open in a stream, and how many came before it.
#[derive(Default)]
struct Blocks {
    open: Option<&'static str>,
    next: usize,
    /// Thinking blocks open and close without their text.
    omit_thinking: bool,
}

type Sent = Vec<(&'static str, Value)>;

impl Blocks {
    fn close(&mut self, out: &mut Sent) {
        if let Some(kind) = self.open.take() {
            let index = self.next - 1;
            if kind == "thinking" {
                let delta = json!({"type": "signature_delta", "signature": ""});
                out.push((
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index, "delta": delta}),
                ));
            }
            out.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    /// Opens a block of `kind` unless one is open: its index.
    fn open(&mut self, kind: &'static str, block: Value, out: &mut Sent) -> usize {
        if self.open != Some(kind) {
            self.close(out);
            self.open = Some(kind);
            self.next += 1;
            out.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": self.next - 1, "content_block": block}),
            ));
        }
        self.next - 1
    }

    fn delta(index: usize, delta: Value) -> (&'static str, Value) {
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }

    /// The events one of Grove's events makes.
    fn on(&mut self, e: Ev) -> Sent {
        let mut out = Vec::new();
        match e {
            Ev::Thinking(t) => {
                let block = json!({"type": "thinking", "thinking": "", "signature": ""});
                let i = self.open("thinking", block, &mut out);
                if !self.omit_thinking {
                    let delta = json!({"type": "thinking_delta", "thinking": t});
                    out.push(Self::delta(i, delta));
                }
            }
            Ev::Text(t) => {
                let i = self.open("text", json!({"type": "text", "text": ""}), &mut out);
                out.push(Self::delta(i, json!({"type": "text_delta", "text": t})));
            }
            Ev::ToolCall(c) => {
                self.close(&mut out);
                let block = json!({"type": "tool_use", "id": c.id, "name": c.name, "input": {}});
                let i = self.open("tool_use", block, &mut out);
                let json = arguments(&c).to_string();
                out.push(Self::delta(
                    i,
                    json!({"type": "input_json_delta", "partial_json": json}),
                ));
                self.close(&mut out);
            }
            Ev::Logprobs(_) => {}
            Ev::Done(d) => {
                self.close(&mut out);
                let delta =
                    json!({"stop_reason": stop_reason(&d), "stop_sequence": stop_sequence(&d)});
                let usage = usage(&d.metrics.unwrap_or_default());
                out.push((
                    "message_delta",
                    json!({"type": "message_delta", "delta": delta, "usage": usage}),
                ));
                out.push(("message_stop", json!({"type": "message_stop"})));
            }
        }
        out
    }
}
