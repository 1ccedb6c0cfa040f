//! OpenAI's Responses API: `POST /v1/responses`, whole or streamed as its
//! events (response.created, output items of reasoning, message and
//! function_call with their deltas, response.completed), and
//! `previous_response_id` served from the daemon's memory of recent
//! responses ([`ResponseStore`], an actor holding the last
//! [`REMEMBERED`] conversations; `store: false` keeps a response out).
use std::collections::{HashMap, VecDeque};
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
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Status};

use super::logprobs as lp;
use super::responses_types::ResponsesRequest;
use super::stream::whole;
use super::{http_status, new_id, openai, unix_now};
use crate::api::Api;

/// How many responses `previous_response_id` can name.
pub const REMEMBERED: usize = 256;

enum StoreCmd {
    Put(String, Vec<pb::Message>),
    Get(String, oneshot::Sender<Option<Vec<pb::Message>>>),
}

/// Recent responses' conversations (inputs and output, not instructions),
/// by response id: an actor; the oldest goes when [`REMEMBERED`] are held.
#[derive(Clone)]
pub struct ResponseStore {
    tx: mpsc::Sender<StoreCmd>,
}

impl ResponseStore {
    /// Starts the actor (on the current tokio runtime).
    pub fn start() -> Self {
        let (tx, mut rx) = mpsc::channel::<StoreCmd>(64);
        tokio::spawn(async move {
            let mut order = VecDeque::new();
            let mut held: HashMap<String, Vec<pb::Message>> = HashMap::new();
            while let Some(cmd) = rx.recv().await {
                match cmd {
                    StoreCmd::Put(id, messages) => {
                        if held.insert(id.clone(), messages).is_none() {
                            order.push_back(id);
                        }
                        while order.len() > REMEMBERED {
                            if let Some(old) = order.pop_front() {
                                held.remove(&old);
                            }
                        }
                    }
                    StoreCmd::Get(id, reply) => {
                        let _ = reply.send(held.get(&id).cloned());
                    }
                }
            }
        });
        Self { tx }
    }

    async fn get(&self, id: &str) -> Option<Vec<pb::Message>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(StoreCmd::Get(id.to_owned(), reply))
            .await
            .ok()?;
        rx.await.ok().flatten()
    }

    async fn put(&self, id: String, messages: Vec<pb::Message>) {
        let _ = self.tx.send(StoreCmd::Put(id, messages)).await;
    }
}

pub fn routes() -> Router<Arc<Api>> {
    Router::new().route("/v1/responses", post(responses))
}

fn status_error(s: &Status) -> Response {
    openai::error(http_status(s.code()), s.message(), "invalid_request")
}

/// One output item as it grows.
enum Item {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
        logprobs: Vec<pb::TokenLogprob>,
    },
    Call {
        id: String,
        call: pb::ToolCall,
    },
}

impl Item {
    fn json(&self, status: &str) -> Value {
        match self {
            Item::Reasoning { id, text } => json!({
                "type": "reasoning", "id": id, "summary": [], "status": status,
                "content": [{"type": "reasoning_text", "text": text}],
            }),
            Item::Message { id, text, logprobs } => json!({
                "type": "message", "id": id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [],
                    "logprobs": lp::token_list(logprobs)}],
            }),
            Item::Call { id, call } => json!({
                "type": "function_call", "id": id, "call_id": call.id, "name": call.name,
                "arguments": call.arguments_json, "status": "completed",
            }),
        }
    }
}

/// The response object around `items`.
fn response_json(
    id: &str,
    created: i64,
    model: &str,
    echo: &Value,
    items: &[Item],
    done: Option<&pb::Done>,
) -> Value {
    let (status, incomplete, usage) = match done {
        None => ("in_progress", Value::Null, Value::Null),
        Some(d) => {
            let m = d.metrics.unwrap_or_default();
            let usage = json!({
                "input_tokens": m.prompt_tokens,
                "input_tokens_details": {"cached_tokens": m.cached_prompt_tokens},
                "output_tokens": m.eval_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": m.prompt_tokens + m.eval_tokens,
            });
            if pb::DoneReason::try_from(d.reason) == Ok(pb::DoneReason::Length) {
                ("incomplete", json!({"reason": "max_output_tokens"}), usage)
            } else {
                ("completed", Value::Null, usage)
            }
        }
    };
    let item_status = if status == "in_progress" {
        "in_progress"
    } else {
        "completed"
    };
    let mut v = json!({
        "id": id, "object": "response", "created_at": created, "status": status,
        "error": null, "incomplete_details": incomplete, "model": model,
        "output": items.iter().map(|i| i.json(item_status)).collect::<Vec<_>>(),
        "usage": usage, "metadata": {},
    });
    if let (Some(o), Some(e)) = (v.as_object_mut(), echo.as_object()) {
        o.extend(e.clone());
    }
    v
}

/// What a response adds to its conversation: the assistant's turn.
fn assistant_turn(items: &[Item]) -> pb::Message {
    let mut m = pb::Message {
        role: pb::Role::Assistant as i32,
        ..Default::default()
    };
    for i in items {
        match i {
            Item::Reasoning { text, .. } => m.reasoning_content.push_str(text),
            Item::Message { text, .. } => m.content.push_str(text),
            Item::Call { call, .. } => m.tool_calls.push(call.clone()),
        }
    }
    m
}

async fn responses(State(api): State<Arc<Api>>, body: Result<Bytes, BytesRejection>) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => return openai::error(e.status(), &e.body_text(), "invalid_body"),
    };
    let req: ResponsesRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            let message = format!("the request body is not a valid request: {e}");
            return openai::error(StatusCode::BAD_REQUEST, &message, "invalid_request");
        }
    };
    let earlier = match &req.previous_response_id {
        None => Vec::new(),
        Some(id) => match api.responses.get(id).await {
            Some(m) => m,
            None => {
                let message = format!(
                    "no response {id:?} is remembered (the last {REMEMBERED}, stored ones)"
                );
                return openai::error(
                    StatusCode::NOT_FOUND,
                    &message,
                    "previous_response_not_found",
                );
            }
        },
    };
    let mut conversation = earlier.clone();
    let r = match req.into_grove(earlier) {
        Ok(r) => r,
        Err(e) => return openai::error(StatusCode::BAD_REQUEST, &e.0, "invalid_request"),
    };
    conversation.extend(r.input.iter().cloned());
    let model = r.request.model.clone();
    let stream = match api.chat(Request::new(r.request)).await {
        Ok(s) => s.into_inner(),
        Err(s) => return status_error(&s),
    };
    let (id, created) = (new_id("resp_"), unix_now());
    let store = r.store.then(|| api.responses.clone());
    if !r.stream {
        let w = match whole(stream).await {
            Ok(w) => w,
            Err(s) => return status_error(&s),
        };
        let mut items = Vec::new();
        if !w.thinking.is_empty() {
            items.push(Item::Reasoning {
                id: new_id("rs_"),
                text: w.thinking.clone(),
            });
        }
        if !w.text.is_empty() {
            items.push(Item::Message {
                id: new_id("msg_"),
                text: w.text.clone(),
                logprobs: w.logprobs.clone(),
            });
        }
        for c in &w.tool_calls {
            items.push(Item::Call {
                id: new_id("fc_"),
                call: c.clone(),
            });
        }
        if let Some(store) = store {
            conversation.push(assistant_turn(&items));
            store.put(id.clone(), conversation).await;
        }
        let v = response_json(&id, created, &model, &r.echo, &items, Some(&w.done));
        return super::json(StatusCode::OK, &v);
    }
    let mut s = Streamer {
        id,
        created,
        model,
        echo: r.echo,
        items: Vec::new(),
        open: false,
        seq: 0,
        early_logprobs: Vec::new(),
    };
    let first = vec![
        s.event("response.created", json!({"response": s.response(None)})),
        s.event(
            "response.in_progress",
            json!({"response": s.response(None)}),
        ),
    ];
    let events = stream
        .then(move |item| {
            let (out, finished) = match item {
                Ok(pb::GenerateResponse { event: Some(e) }) => s.on(e),
                Ok(_) => (Vec::new(), None),
                Err(st) => (vec![s.error(&st)], None),
            };
            let (store, conversation) = (store.clone(), conversation.clone());
            async move {
                if let (Some(store), Some((id, turn))) = (store, finished) {
                    let mut c = conversation;
                    c.push(turn);
                    store.put(id, c).await;
                }
                fstream::iter(out)
            }
        })
        .flatten();
    let events = fstream::iter(first).chain(events).map(|(name, data)| {
        Ok::<_, Infallible>(Event::default().event(name).data(data.to_string()))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A streamed response's state: its items so far, whether the last one is
/// still open (reasoning or message text), the events' sequence number.
struct Streamer {
    id: String,
    created: i64,
    model: String,
    echo: Value,
    items: Vec<Item>,
    open: bool,
    seq: u64,
    /// Log-probabilities that came before any message.
    early_logprobs: Vec<pb::TokenLogprob>,
}

type Sent = Vec<(&'static str, Value)>;

impl Streamer {
    fn event(&mut self, kind: &'static str, mut body: Value) -> (&'static str, Value) {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        (kind, body)
    }

    fn response(&self, done: Option<&pb::Done>) -> Value {
        response_json(
            &self.id,
            self.created,
            &self.model,
            &self.echo,
            &self.items,
            done,
        )
    }

    fn error(&mut self, s: &Status) -> (&'static str, Value) {
        self.event(
            "error",
            json!({"code": format!("{:?}", s.code()), "message": s.message(), "param": null}),
        )
    }

    /// Closes the open item: its text's done events, then the item's.
    fn close(&mut self, out: &mut Sent) {
        if !std::mem::take(&mut self.open) {
            return;
        }
        let index = self.items.len() - 1;
        let (done, part) = match &self.items[index] {
            Item::Reasoning { id, text } => (
                vec![(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                )],
                None,
            ),
            Item::Message { id, text, logprobs } => (
                vec![(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text,
                        "logprobs": lp::token_list(logprobs)}),
                )],
                Some(
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                    "part": {"type": "output_text", "text": text, "annotations": [],
                        "logprobs": lp::token_list(logprobs)}}),
                ),
            ),
            Item::Call { .. } => (Vec::new(), None),
        };
        for (kind, body) in done {
            out.push(self.event(kind, body));
        }
        if let Some(part) = part {
            out.push(self.event("response.content_part.done", part));
        }
        let item = self.items[index].json("completed");
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
    }

    /// Opens `item` (closing the open one): its added events.
    fn add(&mut self, item: Item, out: &mut Sent) {
        self.close(out);
        let index = self.items.len();
        let mut added = item.json("in_progress");
        if let Item::Message { .. } = item {
            // Its part comes next, in content_part.added.
            added["content"] = json!([]);
        }
        let part = match &item {
            Item::Message { id, .. } => Some(
                json!({"item_id": id, "output_index": index, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
            ),
            _ => None,
        };
        self.open = !matches!(item, Item::Call { .. });
        self.items.push(item);
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        ));
        if let Some(part) = part {
            out.push(self.event("response.content_part.added", part));
        }
    }

    /// The events one of Grove's events makes, and at the end the response's
    /// id with the assistant's turn to remember.
    fn on(&mut self, e: Ev) -> (Sent, Option<(String, pb::Message)>) {
        let mut out = Vec::new();
        match e {
            Ev::Thinking(t) => {
                if !(self.open && matches!(self.items.last(), Some(Item::Reasoning { .. }))) {
                    let item = Item::Reasoning {
                        id: new_id("rs_"),
                        text: String::new(),
                    };
                    self.add(item, &mut out);
                }
                let index = self.items.len() - 1;
                if let Some(Item::Reasoning { id, text }) = self.items.last_mut() {
                    text.push_str(&t);
                    let body = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t});
                    out.push(self.event("response.reasoning_text.delta", body));
                }
            }
            Ev::Text(t) => {
                if !(self.open && matches!(self.items.last(), Some(Item::Message { .. }))) {
                    let item = Item::Message {
                        id: new_id("msg_"),
                        text: String::new(),
                        logprobs: std::mem::take(&mut self.early_logprobs),
                    };
                    self.add(item, &mut out);
                }
                let index = self.items.len() - 1;
                if let Some(Item::Message { id, text, .. }) = self.items.last_mut() {
                    text.push_str(&t);
                    let body = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t, "logprobs": []});
                    out.push(self.event("response.output_text.delta", body));
                }
            }
            Ev::ToolCall(c) => {
                let id = new_id("fc_");
                let args = c.arguments_json.clone();
                self.add(
                    Item::Call {
                        id: id.clone(),
                        call: c,
                    },
                    &mut out,
                );
                let index = self.items.len() - 1;
                let delta = json!({"item_id": id, "output_index": index, "delta": args});
                out.push(self.event("response.function_call_arguments.delta", delta));
                let done = json!({"item_id": id, "output_index": index, "arguments": args});
                out.push(self.event("response.function_call_arguments.done", done));
                let item = self.items[index].json("completed");
                out.push(self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                ));
            }
            Ev::Logprobs(l) => {
                // Those of the message being written, as a delta of no text;
                // any before it (reasoning's) join the next message.
                let index = self.items.len().wrapping_sub(1);
                match self.items.last_mut() {
                    Some(Item::Message { id, logprobs, .. }) if self.open => {
                        logprobs.extend(l.tokens.iter().cloned());
                        let body = json!({"item_id": id, "output_index": index, "content_index": 0,
                            "delta": "", "logprobs": lp::token_list(&l.tokens)});
                        out.push(self.event("response.output_text.delta", body));
                    }
                    _ => self.early_logprobs.extend(l.tokens),
                }
            }
            Ev::Done(d) => {
                self.close(&mut out);
                let response = self.response(Some(&d));
                let kind = if response["status"] == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                out.push(self.event(kind, json!({"response": response})));
                return (out, Some((self.id.clone(), assistant_turn(&self.items))));
            }
        }
        (out, None)
    }
}
