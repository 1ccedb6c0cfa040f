//! Runner requests checked and converted: the proto's generation options
//! validated against the model (vocabulary, stop strings), and its
//! conversation turned into the chat template's request. Errors are gRPC
//! statuses (INVALID_ARGUMENT for anything the client sent wrong).
use std::collections::HashMap;

use grove_proto::runner::v1 as pb;
use tonic::Status;

use crate::cache::{KvQuant, KvSetting};
use crate::chat_template::{ChatRequest, Message, ReasoningEffort, Role, ToolCall};
use crate::engine::{Job, KvChoice, SubmitError};
use crate::error::RunnerError;
use crate::generate::GenerateParams;
use crate::grammar::Constraint;
use crate::sample::SamplingOptions;

pub fn submit_status(e: SubmitError) -> Status {
    match e {
        SubmitError::QueueFull(_) => Status::resource_exhausted(e.to_string()),
        SubmitError::Stopped => Status::unavailable(e.to_string()),
    }
}

pub fn runner_status(e: RunnerError) -> Status {
    match e {
        RunnerError::Request(_) | RunnerError::Tokenizer(_) => {
            Status::invalid_argument(e.to_string())
        }
        RunnerError::Stopped | RunnerError::Shard { .. } => Status::unavailable(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

/// The sampler's options from the request, validated against the vocabulary.
fn sampling_options(s: pb::SamplingOptions, vocab: usize) -> Result<SamplingOptions, Status> {
    let defaults = SamplingOptions::default();
    let mut logit_bias: Vec<(u32, f32)> = s.logit_bias.into_iter().collect();
    logit_bias.sort_by_key(|(id, _)| *id);
    let opts = SamplingOptions {
        temperature: s.temperature,
        top_k: s.top_k,
        top_p: s.top_p,
        min_p: s.min_p,
        repetition_penalty: s.repetition_penalty,
        repetition_context_size: s
            .repetition_context_size
            .map_or(defaults.repetition_context_size, |n| n as usize),
        frequency_penalty: s.frequency_penalty,
        presence_penalty: s.presence_penalty,
        penalty_window: s
            .penalty_window
            .map_or(defaults.penalty_window, |n| n as usize),
        logit_bias,
        seed: s.seed,
    };
    opts.validate(vocab).map_err(runner_status)?;
    Ok(opts)
}

fn parse_json(what: &str, text: &str) -> Result<serde_json::Value, Status> {
    serde_json::from_str(text)
        .map_err(|e| Status::invalid_argument(format!("{what} is not valid JSON: {e}")))
}

pub fn tools(tools_json: &[String]) -> Result<Vec<serde_json::Value>, Status> {
    tools_json
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let v = parse_json(&format!("tool {i}"), t)?;
            if v.is_object() {
                Ok(v)
            } else {
                Err(Status::invalid_argument(format!(
                    "tool {i} must be a JSON object"
                )))
            }
        })
        .collect()
}

pub fn template_vars(
    vars: HashMap<String, String>,
) -> Result<serde_json::Map<String, serde_json::Value>, Status> {
    let mut out = serde_json::Map::new();
    for (name, value) in vars {
        let v = parse_json(&format!("template variable {name}"), &value)?;
        out.insert(name, v);
    }
    Ok(out)
}

/// A `Chat` message as the chat template takes it.
pub fn chat_request(chat: pb::Chat) -> Result<(ChatRequest, Option<String>), Status> {
    let mut messages = Vec::with_capacity(chat.messages.len());
    for (i, m) in chat.messages.into_iter().enumerate() {
        let role = match pb::Role::try_from(m.role) {
            Ok(pb::Role::System) => Role::System,
            Ok(pb::Role::User) => Role::User,
            Ok(pb::Role::Assistant) => Role::Assistant,
            Ok(pb::Role::Tool) => Role::Tool,
            _ => {
                return Err(Status::invalid_argument(format!(
                    "message {i} has no valid role"
                )));
            }
        };
        let mut tool_calls = Vec::with_capacity(m.tool_calls.len());
        for call in m.tool_calls {
            let id = (!call.id.is_empty()).then_some(call.id);
            tool_calls.push(
                ToolCall::from_json_arguments(&call.name, &call.arguments_json, id)
                    .map_err(runner_status)?,
            );
        }
        messages.push(Message {
            role,
            content: m.content,
            tool_calls,
            tool_call_id: (!m.tool_call_id.is_empty()).then_some(m.tool_call_id),
            name: (!m.name.is_empty()).then_some(m.name),
            reasoning_content: (!m.reasoning_content.is_empty()).then_some(m.reasoning_content),
        });
    }
    if messages.is_empty() {
        return Err(Status::invalid_argument("the conversation has no messages"));
    }
    let mut extra = template_vars(chat.template_vars_json)?;
    if let Some(thinking) = chat.enable_thinking {
        extra.insert("enable_thinking".into(), thinking.into());
    }
    let effort = pb::ReasoningEffort::try_from(chat.reasoning_effort).map_err(|_| {
        Status::invalid_argument(format!(
            "reasoning_effort {} is not a ReasoningEffort",
            chat.reasoning_effort
        ))
    })?;
    let reasoning_effort = match effort {
        pb::ReasoningEffort::Unspecified => None,
        pb::ReasoningEffort::None => Some(ReasoningEffort::None),
        pb::ReasoningEffort::Minimal => Some(ReasoningEffort::Minimal),
        pb::ReasoningEffort::Low => Some(ReasoningEffort::Low),
        pb::ReasoningEffort::Medium => Some(ReasoningEffort::Medium),
        pb::ReasoningEffort::High => Some(ReasoningEffort::High),
    };
    let request = ChatRequest {
        messages,
        tools: tools(&chat.tools_json)?,
        add_generation_prompt: chat.add_generation_prompt.unwrap_or(true),
        extra,
        reasoning_effort,
    };
    let name = (!chat.template_name.is_empty()).then_some(chat.template_name);
    Ok((request, name))
}

/// A request's prompt: ids, text to tokenize, or a conversation to render.
pub enum Prompt {
    Tokens(Vec<u32>),
    Text(String),
    /// The conversation, its template's name, and how to split the reply.
    Chat(ChatRequest, Option<String>, Split),
}

/// What of a chat reply's markup is parsed out of its text.
#[derive(Debug, Clone, Copy, Default)]
pub struct Split {
    pub reasoning: bool,
    pub tool_calls: bool,
}

/// The most alternatives a token's log-probability comes with (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// Checks the options against the model's facts, and builds the engine's job
/// (with an empty prompt when it is a conversation still to render).
pub fn job(
    req: pb::GenerateRequest,
    vocab: usize,
) -> Result<(Job, Prompt, Option<Constraint>), Status> {
    let prompt = match req.input {
        Some(pb::generate_request::Input::Prompt(text)) => Prompt::Text(text),
        Some(pb::generate_request::Input::Tokens(list)) => Prompt::Tokens(list.ids),
        Some(pb::generate_request::Input::Chat(chat)) => {
            let split = Split {
                reasoning: chat.split_reasoning,
                tool_calls: chat.parse_tool_calls,
            };
            let (request, template) = chat_request(chat)?;
            Prompt::Chat(request, template, split)
        }
        None => return Err(Status::invalid_argument("give a prompt or tokens")),
    };
    let sampling = sampling_options(req.sampling.unwrap_or_default(), vocab)?;
    if req.stop.iter().any(String::is_empty) {
        return Err(Status::invalid_argument("stop strings must not be empty"));
    }
    let kv = kv_choice(req.kv_bits, req.kv_group_size, req.quantized_kv_start)?;
    if let Some(n) = req.top_logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
        return Err(Status::invalid_argument(format!(
            "top_logprobs must be at most {MAX_TOP_LOGPROBS}, not {n}"
        )));
    }
    let defaults = GenerateParams::default();
    let job = Job {
        input: Vec::new(),
        params: GenerateParams {
            max_tokens: defaults.max_tokens,
            prefill_chunk: match req.prefill_chunk {
                0 => defaults.prefill_chunk,
                n => n as usize,
            },
            sampling,
            capture_logits: false,
            kv: None,
        },
        max_tokens: req.max_tokens as usize,
        num_ctx: req.num_ctx as usize,
        stop: req.stop,
        kv,
        grammar: None,
        logprobs: req.top_logprobs.map(|n| n as usize),
    };
    let constraint = constraint(req.constraint)?;
    Ok((job, prompt, constraint))
}

/// A request's output constraint; a schema that is not JSON is refused here.
fn constraint(c: Option<pb::Constraint>) -> Result<Option<Constraint>, Status> {
    use pb::constraint::Kind;
    Ok(match c.and_then(|c| c.kind) {
        None | Some(Kind::JsonObject(false)) => None,
        Some(Kind::JsonObject(true)) => Some(Constraint::JsonObject),
        Some(Kind::JsonSchema(s)) => {
            let schema: serde_json::Value = serde_json::from_str(&s).map_err(|e| {
                Status::invalid_argument(format!("the JSON schema is not JSON: {e}"))
            })?;
            if !schema.is_object() && !schema.is_boolean() {
                return Err(Status::invalid_argument("a JSON schema is an object"));
            }
            Some(Constraint::JsonSchema(schema))
        }
        Some(Kind::Lark(s)) => Some(Constraint::Lark(s)),
        Some(Kind::Regex(s)) => Some(Constraint::Regex(s)),
        Some(Kind::ToolCall(t)) => {
            Some(Constraint::ToolCall((!t.name.is_empty()).then_some(t.name)))
        }
    })
}

/// A request's KV cache: the runner's unless it names a bit width; 0 is
/// full precision. A group or start without bits is refused (it would be
/// ignored).
fn kv_choice(
    bits: Option<u32>,
    group: Option<u32>,
    start: Option<u32>,
) -> Result<KvChoice, Status> {
    let Some(bits) = bits else {
        if group.is_some() || start.is_some() {
            return Err(Status::invalid_argument(
                "kv_group_size and quantized_kv_start need kv_bits",
            ));
        }
        return Ok(KvChoice::Runner);
    };
    if bits == 0 {
        return Ok(KvChoice::Exactly(None));
    }
    let group = group.unwrap_or(crate::cache::quantized::DEFAULT_GROUP as u32);
    let quant = KvQuant::new(
        bits.min(i32::MAX as u32) as i32,
        group.min(i32::MAX as u32) as i32,
    )
    .map_err(Status::invalid_argument)?;
    Ok(KvChoice::Exactly(Some(KvSetting {
        quant,
        start: start.unwrap_or(0) as usize,
    })))
}
