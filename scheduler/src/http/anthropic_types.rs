//! Anthropic's Messages request (`POST /v1/messages`) as Grove's chat
//! request: `system`, content blocks (text, tool_use, tool_result,
//! thinking), `tools` and `tool_choice`, `thinking`, `stop_sequences`.
//! What Grove cannot do is refused by name (images, documents, server tools,
//! `disable_parallel_tool_use`); unknown fields are refused by serde.
use grove_proto::v1 as pb;

use super::tool_choice::{self, ToolChoice};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesRequest {
    pub model: String,
    pub max_tokens: u32,
    pub messages: Vec<InMessage>,
    #[serde(default)]
    pub system: Option<Blocks>,
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub stream: bool,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub thinking: Option<Value>,
    /// `effort` (the template's reasoning effort) and `format` (a JSON schema).
    pub output_config: Option<Value>,
    /// Code execution containers: refused.
    pub container: Option<Value>,
    /// Labels, routing and hints (a user id, a workspace, a region, a tier, a
    /// speed, prompt caching, cache diagnostics): taken and not used (README).
    #[serde(rename = "metadata")]
    pub _metadata: Option<Value>,
    #[serde(rename = "service_tier")]
    pub _service_tier: Option<Value>,
    #[serde(rename = "cache_control")]
    pub _cache_control: Option<Value>,
    #[serde(rename = "diagnostics")]
    pub _diagnostics: Option<Value>,
    #[serde(rename = "inference_geo")]
    pub _inference_geo: Option<Value>,
    #[serde(rename = "speed")]
    pub _speed: Option<Value>,
    #[serde(rename = "user_profile_id")]
    pub _user_profile_id: Option<Value>,
    #[serde(rename = "workspace_id")]
    pub _workspace_id: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InMessage {
    pub role: String,
    pub content: Blocks,
}

/// A string, or content blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Blocks {
    Text(String),
    List(Vec<Value>),
}

/// Why a request was refused, and the field.
#[derive(Debug)]
pub struct Invalid(pub String);

fn invalid(message: impl Into<String>) -> Invalid {
    Invalid(message.into())
}

/// A request for Grove, and how to answer it.
pub struct Messages {
    pub request: pb::ChatRequest,
    pub stream: bool,
    /// `thinking.display: "omitted"`: thinking blocks come without their text.
    pub omit_thinking: bool,
}

fn kind(block: &Value) -> &str {
    block.get("type").and_then(Value::as_str).unwrap_or("")
}

fn text_field(block: &Value, field: &str, what: &str) -> Result<String, Invalid> {
    match block.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(invalid(format!(
            "{what}: a {} block needs a string `{field}`",
            kind(block)
        ))),
    }
}

/// The text of `system` or of a tool result's content: a string or text blocks.
fn plain_text(blocks: Blocks, what: &str) -> Result<String, Invalid> {
    match blocks {
        Blocks::Text(t) => Ok(t),
        Blocks::List(list) => {
            let mut out = String::new();
            for b in &list {
                match kind(b) {
                    "text" => out.push_str(&text_field(b, "text", what)?),
                    other => {
                        return Err(invalid(format!(
                            "{what}: content blocks of type {other:?} are not supported (text only)"
                        )));
                    }
                }
            }
            Ok(out)
        }
    }
}

fn message(role: pb::Role, content: String) -> pb::Message {
    pb::Message {
        role: role as i32,
        content,
        ..Default::default()
    }
}

/// One Anthropic message as Grove's messages: a user's tool results become
/// tool messages (before its text), an assistant's tool_use blocks its
/// calls and its thinking its reasoning.
fn messages_of(m: InMessage, i: usize, out: &mut Vec<pb::Message>) -> Result<(), Invalid> {
    let what = format!("messages[{i}]");
    let blocks = match m.content {
        Blocks::Text(t) => vec![json!({"type": "text", "text": t})],
        Blocks::List(list) => list,
    };
    match m.role.as_str() {
        "user" => {
            let mut text = String::new();
            for b in &blocks {
                match kind(b) {
                    "text" => text.push_str(&text_field(b, "text", &what)?),
                    "tool_result" => {
                        let id = text_field(b, "tool_use_id", &what)?;
                        let content = match b.get("content") {
                            None | Some(Value::Null) => String::new(),
                            Some(c) => plain_text(
                                serde_json::from_value(c.clone())
                                    .map_err(|e| invalid(format!("{what}: {e}")))?,
                                &what,
                            )?,
                        };
                        let error = b.get("is_error").and_then(Value::as_bool) == Some(true);
                        let mut tool = message(
                            pb::Role::Tool,
                            if error {
                                format!("Error: {content}")
                            } else {
                                content
                            },
                        );
                        tool.tool_call_id = id;
                        out.push(tool);
                    }
                    other => {
                        return Err(invalid(format!(
                            "{what}: content blocks of type {other:?} are not supported (text and tool_result)"
                        )));
                    }
                }
            }
            if !text.is_empty() || blocks.is_empty() {
                out.push(message(pb::Role::User, text));
            }
        }
        "assistant" => {
            let mut reply = message(pb::Role::Assistant, String::new());
            for b in &blocks {
                match kind(b) {
                    "text" => reply.content.push_str(&text_field(b, "text", &what)?),
                    "thinking" => reply
                        .reasoning_content
                        .push_str(&text_field(b, "thinking", &what)?),
                    // Opaque (encrypted) reasoning of Anthropic's models: nothing to render.
                    "redacted_thinking" => {}
                    "tool_use" => reply.tool_calls.push(pb::ToolCall {
                        id: text_field(b, "id", &what)?,
                        name: text_field(b, "name", &what)?,
                        arguments_json: b.get("input").cloned().unwrap_or(json!({})).to_string(),
                    }),
                    other => {
                        return Err(invalid(format!(
                            "{what}: content blocks of type {other:?} are not supported in an assistant message"
                        )));
                    }
                }
            }
            out.push(reply);
        }
        other => {
            return Err(invalid(format!(
                "{what}: role is \"user\" or \"assistant\", not {other:?}"
            )));
        }
    }
    Ok(())
}

/// Anthropic's tools as the OpenAI-style definitions chat templates take.
fn tools_of(tools: Vec<Value>) -> Result<Vec<Value>, Invalid> {
    let mut out = Vec::with_capacity(tools.len());
    for t in tools {
        match t.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(other) => {
                return Err(invalid(format!(
                    "tools: server tools ({other:?}) are not supported; define custom tools"
                )));
            }
        }
        let Some(name) = t.get("name").and_then(Value::as_str) else {
            return Err(invalid("tools: each tool needs a name"));
        };
        let mut function = json!({"name": name});
        if let Some(d) = t.get("description") {
            function["description"] = d.clone();
        }
        function["parameters"] = t
            .get("input_schema")
            .cloned()
            .unwrap_or(json!({"type": "object"}));
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(out)
}

/// `output_config`: `effort` as the template's reasoning effort (xhigh and
/// max as high, its top level), `format` (a JSON schema) as the constraint.
fn output_config(
    c: Option<&Value>,
) -> Result<(pb::ReasoningEffort, Option<pb::Constraint>), Invalid> {
    let Some(c) = c else {
        return Ok((pb::ReasoningEffort::Unspecified, None));
    };
    if let Some(key) = c
        .as_object()
        .and_then(|o| o.keys().find(|k| *k != "effort" && *k != "format"))
    {
        return Err(invalid(format!("output_config.{key} is not supported")));
    }
    let effort = match c.get("effort") {
        None | Some(Value::Null) => pb::ReasoningEffort::Unspecified,
        Some(Value::String(e)) => match e.as_str() {
            "low" => pb::ReasoningEffort::Low,
            "medium" => pb::ReasoningEffort::Medium,
            "high" | "xhigh" | "max" => pb::ReasoningEffort::High,
            other => {
                return Err(invalid(format!(
                    "output_config.effort is low, medium, high, xhigh or max, not {other:?}"
                )));
            }
        },
        Some(other) => {
            return Err(invalid(format!(
                "output_config.effort is a string, not {other}"
            )));
        }
    };
    let format = match c.get("format") {
        None | Some(Value::Null) => None,
        Some(f) if f.get("type").and_then(Value::as_str) == Some("json_schema") => {
            let schema = f
                .get("schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| invalid("output_config.format needs a schema (an object)"))?;
            Some(pb::Constraint {
                kind: Some(pb::constraint::Kind::JsonSchema(schema.to_string())),
            })
        }
        Some(_) => return Err(invalid("output_config.format.type is json_schema")),
    };
    Ok((effort, format))
}

impl MessagesRequest {
    pub fn into_grove(self) -> Result<Messages, Invalid> {
        if self.max_tokens == 0 {
            return Err(invalid("max_tokens must be at least 1"));
        }
        let mut messages = Vec::new();
        if let Some(system) = self.system {
            messages.push(message(pb::Role::System, plain_text(system, "system")?));
        }
        for (i, m) in self.messages.into_iter().enumerate() {
            messages_of(m, i, &mut messages)?;
        }
        if !messages.iter().any(|m| m.role != pb::Role::System as i32) {
            return Err(invalid("messages must not be empty"));
        }
        let tools = tools_of(self.tools.unwrap_or_default())?;
        // tool_choice: auto (the default), any (some call), tool (that
        // one), none (no tools in the prompt).
        let choice = match &self.tool_choice {
            None => ToolChoice::Auto,
            Some(choice) => {
                if choice
                    .get("disable_parallel_tool_use")
                    .and_then(Value::as_bool)
                    == Some(true)
                {
                    return Err(invalid(
                        "tool_choice.disable_parallel_tool_use: the model may make several calls in one reply",
                    ));
                }
                match choice.get("type").and_then(Value::as_str) {
                    Some("auto") => ToolChoice::Auto,
                    Some("none") => ToolChoice::None,
                    Some("any") => ToolChoice::Any,
                    Some("tool") => ToolChoice::Named(
                        choice
                            .get("name")
                            .and_then(Value::as_str)
                            .ok_or_else(|| {
                                invalid("tool_choice: {\"type\": \"tool\"} needs a name")
                            })?
                            .to_owned(),
                    ),
                    _ => return Err(invalid("tool_choice.type is auto, any, tool or none")),
                }
            }
        };
        // thinking: on (enabled, adaptive) or off through the template's
        // switch; budget_tokens is a target Grove does not enforce
        // (max_tokens bounds the reply).
        let (enable_thinking, omit_thinking) = match &self.thinking {
            None => (None, false),
            Some(t) => {
                let omit = match t.get("display").and_then(Value::as_str) {
                    None | Some("summarized") => false,
                    Some("omitted") => true,
                    Some(other) => {
                        return Err(invalid(format!(
                            "thinking.display is summarized or omitted, not {other:?}"
                        )));
                    }
                };
                match t.get("type").and_then(Value::as_str) {
                    Some("enabled" | "adaptive") => (Some(true), omit),
                    Some("disabled") => (Some(false), false),
                    _ => {
                        return Err(invalid("thinking.type is enabled, adaptive or disabled"));
                    }
                }
            }
        };
        if self.container.is_some() {
            return Err(invalid(
                "container: Grove runs no code execution containers",
            ));
        }
        let (effort, mut constraint) = output_config(self.output_config.as_ref())?;
        let use_tools = tool_choice::apply(
            choice,
            !tools.is_empty(),
            &mut constraint,
            "output_config.format",
        )
        .map_err(Invalid)?;
        let tools_json: Vec<String> = if use_tools {
            tools.iter().map(Value::to_string).collect()
        } else {
            Vec::new()
        };
        let options = pb::Options {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            max_tokens: Some(self.max_tokens),
            stop: self.stop_sequences.unwrap_or_default(),
            constraint,
            ..Default::default()
        };
        if options.stop.iter().any(String::is_empty) {
            return Err(invalid("stop_sequences must not be empty strings"));
        }
        Ok(Messages {
            request: pb::ChatRequest {
                model: self.model,
                messages,
                parse_tool_calls: !tools_json.is_empty(),
                tools_json,
                options: Some(options),
                enable_thinking,
                reasoning_effort: effort as i32,
                split_reasoning: true,
                ..Default::default()
            },
            stream: self.stream,
            omit_thinking,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(body: Value) -> Result<Messages, Invalid> {
        serde_json::from_value::<MessagesRequest>(body)
            .map_err(|e| Invalid(e.to_string()))?
            .into_grove()
    }

    #[test]
    fn a_conversation_with_tools_becomes_grove_messages() {
        let m = req(json!({
            "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "stop_sequences": ["\n\n"], "metadata": {"user_id": "u"},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Call it.", "signature": "s"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "22 C"}]},
                    {"type": "text", "text": "And tomorrow?"}]},
            ],
        }))
        .expect("taken");
        let r = m.request;
        let roles: Vec<i32> = r.messages.iter().map(|m| m.role).collect();
        use pb::Role::*;
        assert_eq!(
            roles,
            [System, User, Assistant, Tool, User].map(|r| r as i32)
        );
        assert_eq!(r.messages[0].content, "Be brief.");
        assert_eq!(r.messages[2].reasoning_content, "Call it.");
        assert_eq!(
            r.messages[2].tool_calls[0].arguments_json,
            r#"{"city":"Paris"}"#
        );
        assert_eq!(r.messages[3].tool_call_id, "toolu_1");
        assert_eq!(r.messages[3].content, "22 C");
        assert_eq!(r.enable_thinking, Some(true));
        assert!(r.parse_tool_calls && r.tools_json[0].contains("\"parameters\""));
        let o = r.options.expect("options");
        assert_eq!((o.max_tokens, o.stop.len()), (Some(64), 1));
        assert!(matches!(
            o.constraint.and_then(|c| c.kind),
            Some(pb::constraint::Kind::ToolCall(t)) if t.name == "get_weather"
        ));
    }

    #[test]
    fn what_grove_cannot_do_is_refused_by_name() {
        let base = |extra: Value| {
            let mut v = json!({"model": "m", "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}]});
            if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            v
        };
        let refused = |v: Value| req(v).err().expect("refused").0;
        let image =
            json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]});
        assert!(refused(base(image)).contains("\"image\""));
        let server = json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]});
        assert!(refused(base(server)).contains("server tools"));
        let serial = json!({"tools": [{"name": "f", "input_schema": {}}],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}});
        assert!(refused(base(serial)).contains("disable_parallel_tool_use"));
        assert!(refused(base(json!({"tool_choice": {"type": "any"}}))).contains("no tools"));
        assert!(refused(base(json!({"top_logprobs": 2}))).contains("unknown field"));
        let no_max = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        assert!(refused(no_max).contains("max_tokens"));
    }
}
