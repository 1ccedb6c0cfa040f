//! OpenAI's Responses request (`POST /v1/responses`) as Grove's chat
//! request: `instructions`, `input` as text or items (messages, function
//! calls and their outputs, reasoning), function `tools`, `tool_choice`,
//! `text.format`, `reasoning.effort`. What would change the output and is
//! not done is refused by name; unknown fields by serde.
use grove_proto::v1 as pb;

use super::tool_choice::{self, ToolChoice};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponsesRequest {
    pub model: String,
    #[serde(default)]
    pub input: Option<Value>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub text: Option<Value>,
    pub reasoning: Option<Value>,
    pub previous_response_id: Option<String>,
    #[serde(default)]
    pub stream: bool,
    pub store: Option<bool>,
    pub parallel_tool_calls: Option<bool>,
    pub truncation: Option<String>,
    pub top_logprobs: Option<u32>,
    pub background: Option<bool>,
    pub max_tool_calls: Option<u32>,
    pub conversation: Option<Value>,
    pub prompt: Option<Value>,
    /// Labels, routing and hints: taken and not used (README).
    #[serde(rename = "metadata")]
    pub _metadata: Option<Value>,
    #[serde(rename = "user")]
    pub _user: Option<String>,
    #[serde(rename = "service_tier")]
    pub _service_tier: Option<Value>,
    #[serde(rename = "prompt_cache_key")]
    pub _prompt_cache_key: Option<Value>,
    #[serde(rename = "prompt_cache_retention")]
    pub _prompt_cache_retention: Option<Value>,
    #[serde(rename = "prompt_cache_options")]
    pub _prompt_cache_options: Option<Value>,
    /// Options for image inputs (which are refused where they come).
    #[serde(rename = "image")]
    pub _image: Option<Value>,
    #[serde(rename = "safety_identifier")]
    pub _safety_identifier: Option<Value>,
    /// `message.output_text.logprobs` turns log-probabilities on; the
    /// other values only ask for data Grove has not (taken, not used).
    pub include: Option<Vec<String>>,
    #[serde(rename = "stream_options")]
    pub _stream_options: Option<Value>,
}

/// Why a request was refused.
#[derive(Debug)]
pub struct Invalid(pub String);

fn invalid(message: impl Into<String>) -> Invalid {
    Invalid(message.into())
}

/// What the handler needs: Grove's request (its messages after the earlier
/// responses' ones), the new input messages to remember, and the request's
/// own settings echoed in the response.
pub struct Responses {
    pub request: pb::ChatRequest,
    pub input: Vec<pb::Message>,
    pub stream: bool,
    pub store: bool,
    /// The response object's echo of the request's settings.
    pub echo: Value,
}

fn message(role: pb::Role, content: String) -> pb::Message {
    pb::Message {
        role: role as i32,
        content,
        ..Default::default()
    }
}

fn kind(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("")
}

/// Text of a message's content: a string or text parts.
fn content_text(c: Option<&Value>, what: &str) -> Result<String, Invalid> {
    match c {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                match (kind(p), p.get("text").and_then(Value::as_str)) {
                    ("input_text" | "output_text" | "text", Some(t)) => out.push_str(t),
                    (other, _) => {
                        return Err(invalid(format!(
                            "{what}: content parts of type {other:?} are not supported (text only)"
                        )));
                    }
                }
            }
            Ok(out)
        }
        Some(other) => Err(invalid(format!(
            "{what}: content is text or parts, not {other}"
        ))),
    }
}

/// The last message if it is the assistant's, else a new one: function
/// calls and reasoning items join the assistant turn they belong to.
fn assistant(out: &mut Vec<pb::Message>) -> &mut pb::Message {
    let last_is_assistant = out
        .last()
        .is_some_and(|m| m.role == pb::Role::Assistant as i32);
    if !last_is_assistant {
        out.push(message(pb::Role::Assistant, String::new()));
    }
    let i = out.len() - 1;
    &mut out[i]
}

/// `input` as Grove's messages.
pub fn input_messages(input: Option<Value>) -> Result<Vec<pb::Message>, Invalid> {
    let items = match input {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => return Ok(vec![message(pb::Role::User, s)]),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(invalid(format!(
                "input is text or a list of items, not {other}"
            )));
        }
    };
    let mut out: Vec<pb::Message> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let what = format!("input[{i}]");
        let text = |field: &str| -> Result<String, Invalid> {
            item.get(field)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| invalid(format!("{what}: a {} item needs `{field}`", kind(item))))
        };
        match kind(item) {
            "" | "message" => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("user") => pb::Role::User,
                    Some("system" | "developer") => pb::Role::System,
                    Some("assistant") => pb::Role::Assistant,
                    other => {
                        return Err(invalid(format!(
                            "{what}: role is user, system, developer or assistant, not {other:?}"
                        )));
                    }
                };
                let content = content_text(item.get("content"), &what)?;
                if role == pb::Role::Assistant {
                    assistant(&mut out).content.push_str(&content);
                } else {
                    out.push(message(role, content));
                }
            }
            "function_call" => {
                let call = pb::ToolCall {
                    id: text("call_id")?,
                    name: text("name")?,
                    arguments_json: text("arguments")?,
                };
                assistant(&mut out).tool_calls.push(call);
            }
            "function_call_output" => {
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    other => content_text(other, &what)?,
                };
                let mut tool = message(pb::Role::Tool, output);
                tool.tool_call_id = text("call_id")?;
                out.push(tool);
            }
            "reasoning" => {
                let mut thought = String::new();
                for part in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    thought.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""));
                }
                assistant(&mut out).reasoning_content.push_str(&thought);
            }
            other => {
                return Err(invalid(format!(
                    "{what}: items of type {other:?} are not supported"
                )));
            }
        }
    }
    Ok(out)
}

/// Function tools as the chat templates take them.
fn tools_of(tools: &[Value]) -> Result<Vec<Value>, Invalid> {
    tools
        .iter()
        .map(|t| {
            if kind(t) != "function" {
                return Err(invalid(format!(
                    "tools: tools of type {:?} are not supported (function tools only)",
                    kind(t)
                )));
            }
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("tools: each function tool needs a name"))?;
            let mut f = json!({"name": name});
            for key in ["description", "parameters", "strict"] {
                if let Some(v) = t.get(key) {
                    f[key] = v.clone();
                }
            }
            Ok(json!({"type": "function", "function": f}))
        })
        .collect()
}

/// `text.format` as a constraint (text: none); `text.verbosity` other than
/// medium would change the reply.
fn text_format(text: Option<&Value>) -> Result<Option<pb::Constraint>, Invalid> {
    let Some(text) = text else { return Ok(None) };
    if let Some(v) = text
        .get("verbosity")
        .and_then(Value::as_str)
        .filter(|v| *v != "medium")
    {
        return Err(invalid(format!(
            "text.verbosity {v:?} is not supported (medium only)"
        )));
    }
    let Some(format) = text.get("format") else {
        return Ok(None);
    };
    use pb::constraint::Kind;
    let kind = match kind(format) {
        "text" => return Ok(None),
        "json_object" => Kind::JsonObject(true),
        "json_schema" => {
            let schema = format
                .get("schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| invalid("text.format json_schema needs a schema (an object)"))?;
            Kind::JsonSchema(schema.to_string())
        }
        other => {
            return Err(invalid(format!(
                "text.format.type {other:?} is not supported"
            )));
        }
    };
    Ok(Some(pb::Constraint { kind: Some(kind) }))
}

fn effort(reasoning: Option<&Value>) -> Result<pb::ReasoningEffort, Invalid> {
    let Some(e) = reasoning
        .and_then(|r| r.get("effort"))
        .filter(|e| !e.is_null())
    else {
        return Ok(pb::ReasoningEffort::Unspecified);
    };
    Ok(match e.as_str() {
        Some("none") => pb::ReasoningEffort::None,
        Some("minimal") => pb::ReasoningEffort::Minimal,
        Some("low") => pb::ReasoningEffort::Low,
        Some("medium") => pb::ReasoningEffort::Medium,
        Some("high" | "xhigh") => pb::ReasoningEffort::High,
        _ => {
            return Err(invalid(format!(
                "reasoning.effort is none, minimal, low, medium, high or xhigh, not {e}"
            )));
        }
    })
}

impl ResponsesRequest {
    /// Grove's request; `earlier` are the messages of the response named by
    /// previous_response_id (its inputs and output), put before the input.
    pub fn into_grove(self, earlier: Vec<pb::Message>) -> Result<Responses, Invalid> {
        let refuse = |cond: bool, what: &str| {
            if cond {
                Err(invalid(what.to_owned()))
            } else {
                Ok(())
            }
        };
        refuse(
            self.background == Some(true),
            "background responses are not supported",
        )?;
        refuse(
            self.conversation.is_some(),
            "conversation is not supported; use previous_response_id",
        )?;
        refuse(self.prompt.is_some(), "prompt templates are not supported")?;
        refuse(
            self.max_tool_calls.is_some(),
            "max_tool_calls is not supported",
        )?;
        // Log-probabilities: asked for by the include, or by top_logprobs.
        let top = self.top_logprobs.unwrap_or(0);
        refuse(top > 20, "top_logprobs is 0 to 20")?;
        let with_logprobs = top > 0
            || self
                .include
                .iter()
                .flatten()
                .any(|i| i == "message.output_text.logprobs");
        refuse(
            self.parallel_tool_calls == Some(false),
            "parallel_tool_calls=false is not supported: the model may make several calls in one reply",
        )?;
        refuse(
            self.truncation.as_deref().is_some_and(|t| t != "disabled"),
            "truncation \"auto\" is not supported: Grove refuses a prompt that does not fit",
        )?;
        let input = input_messages(self.input)?;
        let mut messages = Vec::new();
        if let Some(i) = &self.instructions {
            messages.push(message(pb::Role::System, i.clone()));
        }
        messages.extend(earlier);
        messages.extend(input.iter().cloned());
        if !messages.iter().any(|m| m.role != pb::Role::System as i32) {
            return Err(invalid("input must not be empty"));
        }
        let tools = tools_of(self.tools.as_deref().unwrap_or_default())?;
        let mut constraint = text_format(self.text.as_ref())?;
        let choice = match &self.tool_choice {
            None => ToolChoice::Auto,
            Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
            Some(Value::String(s)) if s == "none" => ToolChoice::None,
            Some(Value::String(s)) if s == "required" => ToolChoice::Any,
            Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
                ToolChoice::Named(
                    o.get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| {
                            invalid("tool_choice: {\"type\": \"function\"} needs a name")
                        })?
                        .to_owned(),
                )
            }
            Some(_) => {
                return Err(invalid(
                    "tool_choice is auto, none, required or a named function",
                ));
            }
        };
        let use_tools =
            tool_choice::apply(choice, !tools.is_empty(), &mut constraint, "text.format")
                .map_err(Invalid)?;
        let effort = effort(self.reasoning.as_ref())?;
        let tools_json: Vec<String> = if use_tools {
            tools.iter().map(Value::to_string).collect()
        } else {
            Vec::new()
        };
        let store = self.store != Some(false);
        let echo = json!({
            "instructions": self.instructions, "max_output_tokens": self.max_output_tokens,
            "temperature": self.temperature, "top_p": self.top_p,
            "tools": self.tools.unwrap_or_default(),
            "tool_choice": self.tool_choice.unwrap_or(json!("auto")),
            "text": self.text.unwrap_or(json!({"format": {"type": "text"}})),
            "reasoning": self.reasoning.unwrap_or(json!({"effort": null, "summary": null})),
            "parallel_tool_calls": true, "truncation": "disabled", "store": store,
            "previous_response_id": self.previous_response_id,
            "top_logprobs": top,
        });
        Ok(Responses {
            request: pb::ChatRequest {
                model: self.model,
                messages,
                parse_tool_calls: !tools_json.is_empty(),
                tools_json,
                options: Some(pb::Options {
                    temperature: self.temperature,
                    top_p: self.top_p,
                    max_tokens: self.max_output_tokens,
                    top_logprobs: with_logprobs.then_some(top),
                    constraint,
                    ..Default::default()
                }),
                split_reasoning: true,
                reasoning_effort: effort as i32,
                ..Default::default()
            },
            input,
            stream: self.stream,
            store,
            echo,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(body: Value) -> Result<Responses, Invalid> {
        serde_json::from_value::<ResponsesRequest>(body)
            .map_err(|e| Invalid(e.to_string()))?
            .into_grove(Vec::new())
    }

    #[test]
    fn items_become_grove_messages() {
        let r = req(json!({
            "model": "m", "instructions": "Be brief.", "store": false, "metadata": {"k": "v"},
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
            "reasoning": {"effort": "low", "summary": "auto"},
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call it."}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "22 C"},
                {"type": "message", "role": "developer", "content": "Short."},
            ],
        }))
        .expect("taken");
        use pb::Role::*;
        let roles: Vec<i32> = r.request.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [System, User, Assistant, Tool, System].map(|r| r as i32)
        );
        let a = &r.request.messages[2];
        assert_eq!(
            (a.reasoning_content.as_str(), a.tool_calls[0].id.as_str()),
            ("Call it.", "c1")
        );
        assert_eq!(r.request.messages[3].tool_call_id, "c1");
        assert_eq!(r.input.len(), 4, "the instructions are not input");
        assert!(!r.store);
        assert_eq!(r.request.reasoning_effort(), pb::ReasoningEffort::Low);
        assert!(r.request.tools_json[0].contains("\"function\":{\"name\":\"get_weather\""));
    }

    #[test]
    fn what_grove_cannot_do_is_refused_by_name() {
        let refused = |extra: Value| {
            let mut v = json!({"model": "m", "input": "hi"});
            if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            req(v).err().expect("refused").0
        };
        assert!(refused(json!({"background": true})).contains("background"));
        assert!(refused(json!({"truncation": "auto"})).contains("truncation"));
        assert!(refused(json!({"tools": [{"type": "web_search"}]})).contains("\"web_search\""));
        let image = json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]});
        assert!(refused(image).contains("input_image"));
        assert!(refused(json!({"text": {"verbosity": "low"}})).contains("verbosity"));
        assert!(refused(json!({"mirostat": 2})).contains("unknown field"));
    }
}
