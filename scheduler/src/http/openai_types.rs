//! OpenAI's request bodies as Grove reads them, and their translation into
//! `grove.v1` requests. Every field OpenAI defines is either carried out or
//! refused by name (400); an unknown field is refused too, never ignored.
use std::collections::HashMap;

use grove_proto::v1 as pb;

use super::tool_choice::{self, ToolChoice};
use serde::Deserialize;
use serde_json::{Value, json};

/// A refusal: the message and the field (`param`) it is about.
#[derive(Debug)]
pub struct Invalid {
    pub message: String,
    pub param: Option<&'static str>,
}

fn invalid(param: &'static str, message: impl Into<String>) -> Invalid {
    Invalid {
        message: message.into(),
        param: Some(param),
    }
}

/// A string or a list of strings (`stop`, a completion's `prompt`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// A message's content: text, or parts of which only text ones are taken.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Value>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InFunction {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: InFunction,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<InToolCall>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// An earlier reply's call in the legacy functions API.
    #[serde(default)]
    pub function_call: Option<InFunction>,
    /// What an earlier reply refused; only null (as replies carry it back).
    #[serde(default)]
    pub refusal: Option<Value>,
    /// Reasoning of an earlier reply, as Grove returns it; passed to the
    /// template as the message's `reasoning_content` (Qwen3's reads it).
    #[serde(default)]
    pub reasoning_content: Option<String>,
}

/// The sampling fields chat and completions share.
#[derive(Debug, Default)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub max_tokens: Option<u32>,
    pub stop: Option<OneOrMany>,
    pub seed: Option<i64>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub logit_bias: Option<HashMap<String, f32>>,
    /// Beyond OpenAI, as mlx-lm's and vLLM's servers take them.
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub max_completion_tokens: Option<u32>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    /// The legacy functions API: `functions` as tools, `function_call` as
    /// tool_choice, and the reply's call as `message.function_call`.
    pub functions: Option<Vec<Value>>,
    pub function_call: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<Value>,
    pub n: Option<u32>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    /// An end-user id for abuse monitoring; it changes no output, so it is
    /// taken and not used.
    #[serde(rename = "user")]
    pub _user: Option<String>,
    /// Fields that only label, store or route a request on OpenAI's side
    /// (agent frameworks send them): taken and not used (README, "Fields
    /// taken and not used").
    #[serde(rename = "metadata")]
    pub _metadata: Option<Value>,
    #[serde(rename = "store")]
    pub _store: Option<bool>,
    #[serde(rename = "service_tier")]
    pub _service_tier: Option<String>,
    #[serde(rename = "prompt_cache_key")]
    pub _prompt_cache_key: Option<String>,
    #[serde(rename = "safety_identifier")]
    pub _safety_identifier: Option<String>,
    /// Taken at their neutral values only (`["text"]`, `null`, `null`,
    /// `"medium"`: OpenAI's default verbosity).
    pub modalities: Option<Vec<String>>,
    pub audio: Option<Value>,
    pub prediction: Option<Value>,
    pub verbosity: Option<String>,
    /// OpenAI's web search models' options: Grove's models have no web
    /// access, so it is refused by name rather than ignored.
    pub web_search_options: Option<Value>,
    /// For reasoning models, through the template's own variable (see
    /// `pb::ChatRequest::reasoning_effort`).
    pub reasoning_effort: Option<String>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub max_tokens: Option<u32>,
    pub stop: Option<OneOrMany>,
    pub seed: Option<i64>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub logit_bias: Option<HashMap<String, f32>>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

/// OpenAI's `reasoning_effort` values.
pub fn reasoning_effort(v: Option<&str>) -> Result<pb::ReasoningEffort, Invalid> {
    use pb::ReasoningEffort as E;
    Ok(match v {
        None => E::Unspecified,
        Some("none") => E::None,
        Some("minimal") => E::Minimal,
        Some("low") => E::Low,
        Some("medium") => E::Medium,
        Some("high") => E::High,
        Some(other) => {
            return Err(invalid(
                "reasoning_effort",
                format!(
                    "reasoning_effort is \"none\", \"minimal\", \"low\", \"medium\" or \"high\", not {other:?}"
                ),
            ));
        }
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: OneOrMany,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u32>,
    pub best_of: Option<u32>,
    pub echo: Option<bool>,
    pub logprobs: Option<u32>,
    pub suffix: Option<String>,
    #[serde(rename = "user")]
    pub _user: Option<String>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub max_tokens: Option<u32>,
    pub stop: Option<OneOrMany>,
    pub seed: Option<i64>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub logit_bias: Option<HashMap<String, f32>>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

/// OpenAI's completions default to 16 tokens.
const COMPLETION_DEFAULT_MAX_TOKENS: u32 = 16;

fn options(s: Sampling) -> Result<pb::Options, Invalid> {
    let seed = match s.seed {
        Some(n) if n < 0 => return Err(invalid("seed", "seed must not be negative")),
        n => n.map(|n| n as u64),
    };
    let mut logit_bias = HashMap::new();
    for (k, v) in s.logit_bias.unwrap_or_default() {
        let id: u32 = k
            .parse()
            .map_err(|_| invalid("logit_bias", format!("{k:?} is not a token id")))?;
        if !(-100.0..=100.0).contains(&v) {
            return Err(invalid("logit_bias", "biases are between -100 and 100"));
        }
        logit_bias.insert(id, v);
    }
    Ok(pb::Options {
        temperature: s.temperature,
        top_k: s.top_k,
        top_p: s.top_p,
        min_p: s.min_p,
        repetition_penalty: s.repetition_penalty,
        frequency_penalty: s.frequency_penalty,
        presence_penalty: s.presence_penalty,
        seed,
        max_tokens: s.max_tokens,
        stop: s.stop.map(OneOrMany::into_vec).unwrap_or_default(),
        logit_bias,
        ..Default::default()
    })
}

/// The most alternatives a token's log-probability comes with.
pub const MAX_TOP_LOGPROBS: u32 = 20;

fn top_count(field: &'static str, n: u32) -> Result<u32, Invalid> {
    if n > MAX_TOP_LOGPROBS {
        return Err(invalid(
            field,
            format!("{field} is 0 to {MAX_TOP_LOGPROBS}, not {n}"),
        ));
    }
    Ok(n)
}

/// The most choices one request may ask for.
pub const MAX_CHOICES: u32 = 8;

/// `n`: how many choices (1 to [`MAX_CHOICES`]); each is generated as its own
/// request, choice i seeded `seed + i` when a seed is given.
fn choices(n: Option<u32>) -> Result<u32, Invalid> {
    match n.unwrap_or(1) {
        n @ 1..=MAX_CHOICES => Ok(n),
        n => Err(invalid(
            "n",
            format!("n is 1 to {MAX_CHOICES} choices, not {n}"),
        )),
    }
}

fn stream_options(stream: bool, o: Option<StreamOptions>) -> Result<bool, Invalid> {
    match o {
        Some(_) if !stream => Err(invalid(
            "stream_options",
            "stream_options is only allowed when stream is true",
        )),
        Some(o) => Ok(o.include_usage),
        None => Ok(false),
    }
}

fn text_of(content: Option<Content>, i: usize) -> Result<String, Invalid> {
    match content {
        None => Ok(String::new()),
        Some(Content::Text(t)) => Ok(t),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some(kind), _) => {
                        return Err(invalid(
                            "messages",
                            format!(
                                "message {i}: content parts of type {kind:?} are not supported (text only)"
                            ),
                        ));
                    }
                    _ => {
                        return Err(invalid(
                            "messages",
                            format!("message {i}: a content part has no type"),
                        ));
                    }
                }
            }
            Ok(text)
        }
    }
}

fn message(m: ChatMessage, i: usize) -> Result<pb::Message, Invalid> {
    // The legacy API's function result: a tool message named by the function.
    let legacy_result = m.role == "function";
    if legacy_result && m.name.is_none() {
        return Err(invalid(
            "messages",
            format!("message {i}: a function message needs the function's name"),
        ));
    }
    let role = match m.role.as_str() {
        "system" | "developer" => pb::Role::System,
        "user" => pb::Role::User,
        "assistant" => pb::Role::Assistant,
        "tool" | "function" => pb::Role::Tool,
        other => {
            return Err(invalid(
                "messages",
                format!("message {i}: unknown role {other:?}"),
            ));
        }
    };
    if m.refusal.as_ref().is_some_and(|r| !r.is_null()) {
        return Err(invalid(
            "messages",
            format!("message {i}: refusal must be null"),
        ));
    }
    if m.reasoning_content.is_some() && role != pb::Role::Assistant {
        return Err(invalid(
            "messages",
            format!("message {i}: only assistant messages have reasoning_content"),
        ));
    }
    let mut tool_calls = Vec::new();
    for c in m.tool_calls.unwrap_or_default() {
        if c.kind != "function" {
            return Err(invalid(
                "messages",
                format!("message {i}: tool calls are of type \"function\""),
            ));
        }
        tool_calls.push(pb::ToolCall {
            id: c.id,
            name: c.function.name,
            arguments_json: c.function.arguments,
        });
    }
    if let Some(f) = m.function_call {
        if role != pb::Role::Assistant || !tool_calls.is_empty() {
            return Err(invalid(
                "messages",
                format!(
                    "message {i}: only an assistant message without tool_calls has a function_call"
                ),
            ));
        }
        tool_calls.push(pb::ToolCall {
            id: String::new(),
            name: f.name,
            arguments_json: f.arguments,
        });
    }
    if role == pb::Role::Tool && m.tool_call_id.is_none() && !legacy_result {
        return Err(invalid(
            "messages",
            format!("message {i}: a tool message needs tool_call_id"),
        ));
    }
    Ok(pb::Message {
        role: role as i32,
        content: text_of(m.content, i)?,
        reasoning_content: m.reasoning_content.unwrap_or_default(),
        tool_calls,
        tool_call_id: m.tool_call_id.unwrap_or_default(),
        name: m.name.unwrap_or_default(),
    })
}

/// `response_format` as a constraint: text (none), any JSON object, or JSON
/// following `json_schema.schema`.
fn response_format(f: Option<&Value>) -> Result<Option<pb::Constraint>, Invalid> {
    use pb::constraint::Kind;
    let Some(f) = f else { return Ok(None) };
    let kind = match f.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => Kind::JsonObject(true),
        Some("json_schema") => {
            let schema = f.pointer("/json_schema/schema").ok_or_else(|| {
                invalid(
                    "response_format",
                    "json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}",
                )
            })?;
            Kind::JsonSchema(schema.to_string())
        }
        _ => {
            return Err(invalid(
                "response_format",
                "response_format type is text, json_object or json_schema",
            ));
        }
    };
    Ok(Some(pb::Constraint { kind: Some(kind) }))
}

/// A checked chat request: the Grove request and whether to report usage
/// while streaming.
pub struct Chat {
    pub request: pb::ChatRequest,
    pub stream: bool,
    pub include_usage: bool,
    pub n: u32,
    /// The request used the legacy `functions`: the reply's first call is
    /// `function_call`, its finish reason "function_call".
    pub legacy_functions: bool,
    /// Each choice carries its tokens' log-probabilities.
    pub logprobs: bool,
}

impl ChatCompletionRequest {
    pub fn into_grove(self) -> Result<Chat, Invalid> {
        let n = choices(self.n)?;
        if self
            .modalities
            .as_ref()
            .is_some_and(|m| m.iter().any(|x| x != "text"))
        {
            return Err(invalid(
                "modalities",
                "Grove generates text only; modalities must be [\"text\"]",
            ));
        }
        if self.audio.is_some() {
            return Err(invalid(
                "audio",
                "audio output is not supported; audio must be null",
            ));
        }
        if self.verbosity.as_deref().is_some_and(|v| v != "medium") {
            return Err(invalid(
                "verbosity",
                "Grove does not steer the length of answers; verbosity must be \"medium\" (the default)",
            ));
        }
        if self.web_search_options.is_some() {
            return Err(invalid(
                "web_search_options",
                "Grove's models do not search the web; web_search_options must be absent",
            ));
        }
        if self.prediction.is_some() {
            return Err(invalid(
                "prediction",
                "predicted outputs are not supported; prediction must be null",
            ));
        }
        let top_logprobs = match (self.logprobs, self.top_logprobs) {
            (Some(true), n) => Some(top_count("top_logprobs", n.unwrap_or(0))?),
            (_, Some(n)) if n > 0 => {
                return Err(invalid("top_logprobs", "top_logprobs needs logprobs: true"));
            }
            _ => None,
        };
        if self.parallel_tool_calls == Some(false) {
            return Err(invalid(
                "parallel_tool_calls",
                "the model may make several calls in one reply; parallel_tool_calls=false is not supported",
            ));
        }
        let effort = reasoning_effort(self.reasoning_effort.as_deref())?;
        let legacy_functions = self.functions.is_some();
        let (tools, tool_choice) = legacy(
            self.tools,
            self.tool_choice,
            self.functions,
            self.function_call,
        )?;
        let mut constraint = response_format(self.response_format.as_ref())?;
        let include_usage = stream_options(self.stream, self.stream_options)?;
        let tools = tools.unwrap_or_default();
        for t in &tools {
            if t.get("type").and_then(Value::as_str) != Some("function")
                || t.pointer("/function/name")
                    .and_then(Value::as_str)
                    .is_none()
            {
                return Err(invalid(
                    "tools",
                    "each tool is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            }
        }
        let choice = match &tool_choice {
            None => ToolChoice::Auto,
            Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
            Some(Value::String(s)) if s == "none" => ToolChoice::None,
            Some(Value::String(s)) if s == "required" => ToolChoice::Any,
            Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
                ToolChoice::Named(
                    o.get("function")
                        .and_then(|f| f.get("name"))
                        .and_then(Value::as_str)
                        .ok_or_else(|| invalid("tool_choice", "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}"))?
                        .to_owned(),
                )
            }
            Some(_) => return Err(invalid("tool_choice", "tool_choice is \"auto\", \"none\", \"required\" or a named function")),
        };
        let use_tools = tool_choice::apply(
            choice,
            !tools.is_empty(),
            &mut constraint,
            "response_format",
        )
        .map_err(|e| invalid("tool_choice", e))?;
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.into_iter().enumerate() {
            messages.push(message(m, i)?);
        }
        if messages.is_empty() {
            return Err(invalid("messages", "messages must not be empty"));
        }
        let mut options = options(Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            stop: self.stop,
            seed: self.seed,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: self.logit_bias,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
        })?;
        if options.max_tokens == Some(0) {
            options.max_tokens = None;
        }
        options.constraint = constraint;
        options.top_logprobs = top_logprobs;
        let tools_json = if use_tools {
            tools.iter().map(Value::to_string).collect()
        } else {
            Vec::new()
        };
        Ok(Chat {
            request: pb::ChatRequest {
                model: self.model,
                messages,
                parse_tool_calls: !tools_json.is_empty(),
                tools_json,
                options: Some(options),
                split_reasoning: true,
                reasoning_effort: effort as i32,
                ..Default::default()
            },
            stream: self.stream,
            include_usage,
            n,
            legacy_functions,
            logprobs: top_logprobs.is_some(),
        })
    }
}

/// The legacy `functions` and `function_call` as `tools` and `tool_choice`
/// (one API or the other, not both).
fn legacy(
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    functions: Option<Vec<Value>>,
    function_call: Option<Value>,
) -> Result<(Option<Vec<Value>>, Option<Value>), Invalid> {
    let Some(functions) = functions else {
        if function_call.is_some() {
            return Err(invalid("function_call", "function_call needs functions"));
        }
        return Ok((tools, tool_choice));
    };
    if tools.is_some() || tool_choice.is_some() {
        return Err(invalid(
            "functions",
            "give tools (and tool_choice) or the legacy functions (and function_call), not both",
        ));
    }
    let tools = functions
        .into_iter()
        .map(|f| json!({"type": "function", "function": f}))
        .collect();
    let choice = match function_call {
        None => None,
        Some(Value::String(s)) if s == "auto" || s == "none" => Some(Value::String(s)),
        Some(Value::Object(o)) if o.get("name").and_then(Value::as_str).is_some() => {
            Some(json!({"type": "function", "function": {"name": o["name"]}}))
        }
        Some(_) => {
            return Err(invalid(
                "function_call",
                "function_call is \"auto\", \"none\" or {\"name\": ...}",
            ));
        }
    };
    Ok((Some(tools), choice))
}

/// A checked completion request.
pub struct Completion {
    pub request: pb::GenerateRequest,
    pub stream: bool,
    pub include_usage: bool,
    pub n: u32,
    /// Each choice carries its tokens' log-probabilities (legacy shape).
    pub logprobs: bool,
}

impl CompletionRequest {
    pub fn into_grove(self) -> Result<Completion, Invalid> {
        let n = choices(self.n)?;
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(invalid("best_of", "best_of must be 1"));
        }
        if self.echo == Some(true) {
            return Err(invalid("echo", "echo is not supported"));
        }
        let top_logprobs = self
            .logprobs
            .map(|n| top_count("logprobs", n))
            .transpose()?;
        if self.suffix.is_some() {
            return Err(invalid(
                "suffix",
                "suffix (fill in the middle) is not supported",
            ));
        }
        let include_usage = stream_options(self.stream, self.stream_options)?;
        let prompt = match self.prompt.into_vec() {
            v if v.len() == 1 => v.into_iter().next().unwrap_or_default(),
            _ => return Err(invalid("prompt", "give one prompt (a string)")),
        };
        let mut options = options(Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            max_tokens: Some(self.max_tokens.unwrap_or(COMPLETION_DEFAULT_MAX_TOKENS)),
            stop: self.stop,
            seed: self.seed,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: self.logit_bias,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
        })?;
        options.top_logprobs = top_logprobs;
        Ok(Completion {
            request: pb::GenerateRequest {
                shards: None,
                model: self.model,
                prompt,
                options: Some(options),
                keep_alive_ns: None,
            },
            stream: self.stream,
            include_usage,
            n,
            logprobs: top_logprobs.is_some(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(extra: &str) -> Result<Chat, Invalid> {
        let body = format!(
            r#"{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]{extra}}}"#
        );
        serde_json::from_str::<ChatCompletionRequest>(&body)
            .expect("parses")
            .into_grove()
    }

    fn refused(extra: &str) -> String {
        match chat(extra) {
            Ok(_) => panic!("{extra} was accepted"),
            Err(e) => format!("{e:?}"),
        }
    }

    #[test]
    fn labels_and_neutral_values_are_taken() {
        let labels = r#", "metadata": {"run": "7"}, "store": false, "service_tier": "auto",
            "prompt_cache_key": "k", "safety_identifier": "s", "user": "u",
            "modalities": ["text"], "audio": null, "prediction": null,
            "top_logprobs": 0, "logprobs": false, "n": 1, "verbosity": "medium""#;
        assert!(chat(labels).is_ok(), "{:?}", chat(labels).err());
    }

    #[test]
    fn values_that_would_change_the_output_are_refused_by_name() {
        assert!(refused(r#", "modalities": ["text", "audio"]"#).contains("modalities"));
        assert!(refused(r#", "audio": {"voice": "alloy", "format": "wav"}"#).contains("audio"));
        let p = r#", "prediction": {"type": "content", "content": "x"}"#;
        assert!(refused(p).contains("prediction"));
        assert!(refused(r#", "top_logprobs": 2"#).contains("needs logprobs: true"));
        let many = r#", "logprobs": true, "top_logprobs": 21"#;
        assert!(refused(many).contains("top_logprobs is 0 to 20"));
        assert!(refused(r#", "verbosity": "low""#).contains("verbosity"));
        assert!(refused(r#", "n": 9"#).contains("n is 1 to 8"));
        assert!(refused(r#", "n": 0"#).contains("n is 1 to 8"));
        assert_eq!(chat(r#", "n": 4"#).expect("taken").n, 4);
        assert!(refused(r#", "reasoning_effort": "extreme""#).contains("reasoning_effort"));
        assert!(refused(r#", "web_search_options": {}"#).contains("do not search the web"));
    }

    #[test]
    fn logprobs_go_to_the_runner() {
        let c = chat(r#", "logprobs": true, "top_logprobs": 3"#).expect("taken");
        assert!(c.logprobs);
        assert_eq!(c.request.options.and_then(|o| o.top_logprobs), Some(3));
        let c = chat(r#", "logprobs": true"#).expect("taken");
        assert_eq!(c.request.options.and_then(|o| o.top_logprobs), Some(0));
        let c = chat(r#", "logprobs": false, "top_logprobs": 0"#).expect("taken");
        assert!(!c.logprobs);
        assert_eq!(c.request.options.and_then(|o| o.top_logprobs), None);
    }

    #[test]
    fn reasoning_effort_goes_to_the_runner() {
        for (text, want) in [
            ("none", pb::ReasoningEffort::None),
            ("minimal", pb::ReasoningEffort::Minimal),
            ("low", pb::ReasoningEffort::Low),
            ("medium", pb::ReasoningEffort::Medium),
            ("high", pb::ReasoningEffort::High),
        ] {
            let c = chat(&format!(r#", "reasoning_effort": "{text}""#)).expect("taken");
            assert_eq!(c.request.reasoning_effort(), want);
        }
        let c = chat("").expect("taken");
        assert_eq!(
            c.request.reasoning_effort(),
            pb::ReasoningEffort::Unspecified
        );
    }
}
