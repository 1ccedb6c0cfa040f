//! A generation's stream as the client sees it: the engine's text, split
//! (when the request asks) into reasoning, tool calls and content by
//! [`OutputParser`], ending with Done whose reason says whether the reply
//! ended in tool calls or in markup that did not parse.
use grove_proto::runner::v1 as pb;
use pb::generate_response::Event as Out;

use crate::chat::ChatParts;
use crate::chat_template::ChatRequest;
use crate::harmony::{self, HarmonyParser};
use crate::output::{self, OutputFormat, OutputParser, Piece, Splitter, ToolFormat};
use crate::request::Split;
use crate::tool_args::ToolSchemas;

/// How many of the prompt's last tokens are decoded to see whether the
/// template left a reasoning block open.
const PROMPT_TAIL: usize = 8;

/// How a chat reply is split.
pub enum Format {
    /// Marker-delimited reasoning and tool calls.
    Markup(OutputFormat),
    /// gpt-oss's Harmony channels.
    Harmony,
}

/// The format a chat reply is split with, or None when nothing is split.
pub fn format(
    parts: &ChatParts,
    request: &ChatRequest,
    split: Split,
    prompt: &[u32],
) -> Option<Format> {
    if !split.reasoning && !split.tool_calls {
        return None;
    }
    if template_text(parts).is_some_and(|t| harmony::is_harmony(&t)) {
        return Some(Format::Harmony);
    }
    let think = if split.reasoning {
        output::think_markers(|t| parts.tokenizer.token_id(t).is_some())
    } else {
        None
    };
    let (tools, schemas) = if split.tool_calls && !request.tools.is_empty() {
        (tool_format(parts), ToolSchemas::from_tools(&request.tools))
    } else {
        (None, ToolSchemas::default())
    };
    let starts_thinking = think.as_ref().is_some_and(|m| {
        let tail = &prompt[prompt.len().saturating_sub(PROMPT_TAIL)..];
        parts
            .tokenizer
            .decode(tail)
            .is_ok_and(|t| output::ends_in_thinking(&t, m))
    });
    Some(Format::Markup(OutputFormat {
        think,
        tools,
        schemas,
        starts_thinking,
    }))
}

fn template_text(parts: &ChatParts) -> Option<String> {
    let templates = parts.templates.as_ref().ok()?;
    Some(templates.sources.iter().map(|s| s.text.as_str()).collect())
}

/// The model's tool-call format, from its templates.
pub fn tool_format(parts: &ChatParts) -> Option<ToolFormat> {
    ToolFormat::detect(&template_text(parts)?)
}

/// One stream's splitter (or none: text passes through).
pub struct Reply {
    parser: Option<Box<dyn Splitter>>,
}

fn message(event: Out) -> pb::GenerateResponse {
    pb::GenerateResponse { event: Some(event) }
}

fn event(piece: Piece) -> pb::GenerateResponse {
    message(match piece {
        Piece::Content(t) => Out::Text(t),
        Piece::Thinking(t) => Out::Thinking(t),
        Piece::ToolCall(c) => Out::ToolCall(pb::ToolCall {
            id: c.id,
            name: c.name,
            arguments_json: c.arguments_json,
        }),
    })
}

impl Reply {
    pub fn new(format: Option<Format>) -> Self {
        Self {
            parser: format.map(|f| -> Box<dyn Splitter> {
                match f {
                    Format::Markup(f) => Box::new(OutputParser::new(f)),
                    Format::Harmony => Box::new(HarmonyParser::new()),
                }
            }),
        }
    }

    /// The messages a piece of generated text makes.
    pub fn text(&mut self, text: String) -> Vec<pb::GenerateResponse> {
        match &mut self.parser {
            None => vec![message(Out::Text(text))],
            Some(p) => p.push(&text).into_iter().map(event).collect(),
        }
    }

    /// What was held back, then `done` with its reason as the parser saw it.
    pub fn done(self, mut done: pb::Done) -> Vec<pb::GenerateResponse> {
        let mut out = Vec::new();
        if let Some(p) = self.parser {
            let (pieces, ending) = p.finish();
            out.extend(pieces.into_iter().map(event));
            if ending.malformed {
                done.reason = pb::DoneReason::InvalidToolCall as i32;
            } else if ending.tool_calls > 0 && done.reason == pb::DoneReason::Stop as i32 {
                done.reason = pb::DoneReason::ToolCalls as i32;
            }
        }
        out.push(message(Out::Done(done)));
        out
    }
}
