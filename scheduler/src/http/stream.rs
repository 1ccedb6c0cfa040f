//! A generation's gRPC stream read for HTTP: whole (non-streaming replies)
//! or event by event, and the names HTTP APIs give its ending.
use std::pin::Pin;

use grove_proto::v1 as pb;
use pb::generate_response::Event;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

pub type GenStream = Pin<Box<dyn Stream<Item = Result<pb::GenerateResponse, Status>> + Send>>;

/// A whole reply.
#[derive(Debug, Default)]
pub struct Whole {
    pub text: String,
    pub thinking: String,
    pub tool_calls: Vec<pb::ToolCall>,
    /// Each generated token's log-probability (when asked for).
    pub logprobs: Vec<pb::TokenLogprob>,
    pub done: pb::Done,
}

impl Whole {
    pub fn metrics(&self) -> pb::Metrics {
        self.done.metrics.unwrap_or_default()
    }
}

/// Reads `stream` to its end.
pub async fn whole(mut stream: GenStream) -> Result<Whole, Status> {
    let mut out = Whole::default();
    while let Some(msg) = stream.next().await {
        match msg?.event {
            Some(Event::Text(t)) => out.text.push_str(&t),
            Some(Event::Thinking(t)) => out.thinking.push_str(&t),
            Some(Event::ToolCall(c)) => out.tool_calls.push(c),
            Some(Event::Logprobs(l)) => out.logprobs.extend(l.tokens),
            Some(Event::Done(d)) => {
                out.done = d;
                return Ok(out);
            }
            None => {}
        }
    }
    Err(Status::internal(
        "the reply ended without its final message",
    ))
}

/// OpenAI's (and ollama's) name for how a reply ended.
pub fn finish_reason(done: &pb::Done) -> &'static str {
    match pb::DoneReason::try_from(done.reason) {
        Ok(pb::DoneReason::Length) => "length",
        Ok(pb::DoneReason::ToolCalls) => "tool_calls",
        Ok(pb::DoneReason::InvalidToolCall) => "invalid_tool_call",
        Ok(pb::DoneReason::Cancelled) => "cancelled",
        _ => "stop",
    }
}

/// A tool call's arguments as a JSON value (they are checked JSON objects
/// when the runner sends them).
pub fn arguments(call: &pb::ToolCall) -> serde_json::Value {
    serde_json::from_str(&call.arguments_json)
        .unwrap_or_else(|_| serde_json::Value::String(call.arguments_json.clone()))
}
