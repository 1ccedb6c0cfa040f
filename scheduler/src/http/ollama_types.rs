//! ollama's request bodies as Grove reads them (`/api/chat`,
//! `/api/generate`, their `options` and `keep_alive`), translated into
//! `grove.v1` requests. What Grove cannot do is refused by name, never
//! ignored.
use std::time::Duration;

use grove_proto::v1 as pb;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::duration::KeepAlive;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InFunction {
    pub name: String,
    #[serde(default)]
    pub arguments: Map<String, Value>,
    /// ollama numbers the calls of one message; their order says the same.
    #[serde(default, rename = "index")]
    pub _index: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InToolCall {
    #[serde(default)]
    pub id: Option<String>,
    pub function: InFunction,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: String,
    #[serde(default)]
    pub thinking: Option<String>,
    #[serde(default)]
    pub images: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_calls: Option<Vec<InToolCall>>,
    /// On tool messages: the tool that answered.
    #[serde(default)]
    pub tool_name: Option<String>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    pub model: String,
    #[serde(default)]
    pub messages: Vec<Message>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub format: Option<Value>,
    #[serde(default)]
    pub options: Option<Map<String, Value>>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub keep_alive: Option<Value>,
    #[serde(default)]
    pub think: Option<Value>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    pub model: String,
    #[serde(default)]
    pub prompt: String,
    #[serde(default)]
    pub suffix: Option<String>,
    #[serde(default)]
    pub system: Option<String>,
    #[serde(default)]
    pub template: Option<String>,
    #[serde(default)]
    pub context: Option<Vec<u32>>,
    #[serde(default)]
    pub raw: Option<bool>,
    #[serde(default)]
    pub images: Option<Vec<Value>>,
    #[serde(default)]
    pub format: Option<Value>,
    #[serde(default)]
    pub options: Option<Map<String, Value>>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub keep_alive: Option<Value>,
    #[serde(default)]
    pub think: Option<Value>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<u32>,
}

/// A `{"model": …}` body (`/api/show`, `/api/delete`, `/api/pull`); ollama's
/// older clients say `name`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub insecure: Option<bool>,
    #[serde(default)]
    pub verbose: Option<bool>,
    /// The client's hub settings for a pull (Grove's own field; ollama pulls
    /// from its registry). Show and delete read the local store only, so
    /// there it is accepted and changes nothing.
    #[serde(default)]
    pub hub: Option<HubBody>,
}

/// `{"endpoint": …, "token": …, "offline": …}`: grove.v1.HubSettings in JSON.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HubBody {
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub offline: Option<bool>,
}

impl std::fmt::Debug for HubBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubBody")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("offline", &self.offline)
            .finish()
    }
}

impl ModelRequest {
    pub fn model(&self) -> Result<String, String> {
        if self.verbose == Some(true) {
            return Err(
                "verbose is not supported: Grove's show has no tokenizer arrays to add".into(),
            );
        }
        match self.model.clone().or_else(|| self.name.clone()) {
            Some(m) if !m.trim().is_empty() => Ok(m),
            _ => Err("model is required".into()),
        }
    }
}

/// `keep_alive` as ollama takes it: a duration string or a number of seconds.
pub fn keep_alive(v: Option<&Value>) -> Result<Option<i64>, String> {
    let parsed = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => KeepAlive::parse(s)?,
        Some(Value::Number(n)) => match n.as_f64() {
            Some(s) if s < 0.0 => KeepAlive::Forever,
            Some(0.0) => KeepAlive::Unload,
            Some(s) if s.is_finite() => KeepAlive::For(Duration::from_secs_f64(s)),
            _ => return Err(format!("keep_alive {n} is not a number of seconds")),
        },
        Some(other) => {
            return Err(format!(
                "keep_alive {other} is neither a duration nor seconds"
            ));
        }
    };
    Ok(Some(match parsed {
        KeepAlive::Unload => 0,
        KeepAlive::Forever => -1,
        KeepAlive::For(d) => d.as_nanos().clamp(1, i64::MAX as u128) as i64,
    }))
}

fn num<T: TryFrom<u64>>(k: &str, v: &Value) -> Result<T, String> {
    v.as_u64()
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| format!("option {k} must be a non-negative integer, not {v}"))
}

fn float(k: &str, v: &Value) -> Result<f32, String> {
    v.as_f64()
        .map(|f| f as f32)
        .ok_or_else(|| format!("option {k} must be a number, not {v}"))
}

/// ollama's `options` as Grove's. Options that only tune ollama's own
/// engine (GPU layers, threads, mmap) or samplers Grove does not have are
/// refused by name, except at the values that turn them off.
pub fn options(o: Option<&Map<String, Value>>) -> Result<pb::Options, String> {
    let mut out = pb::Options::default();
    for (k, v) in o.into_iter().flatten() {
        if v.is_null() {
            continue;
        }
        match k.as_str() {
            "temperature" => out.temperature = Some(float(k, v)?),
            "top_k" => out.top_k = Some(num(k, v)?),
            "top_p" => out.top_p = Some(float(k, v)?),
            "min_p" => out.min_p = Some(float(k, v)?),
            "repeat_penalty" => out.repetition_penalty = Some(float(k, v)?),
            "repeat_last_n" => out.repetition_context_size = Some(num(k, v)?),
            "presence_penalty" => out.presence_penalty = Some(float(k, v)?),
            "frequency_penalty" => out.frequency_penalty = Some(float(k, v)?),
            "seed" => {
                // ollama's -1 means a random seed, as no seed does here.
                if v.as_i64() != Some(-1) {
                    out.seed = Some(num(k, v)?);
                }
            }
            "num_predict" => match v.as_i64() {
                // -1: until the context is full; -2: fill the context.
                Some(-1 | -2) => out.max_tokens = None,
                _ => out.max_tokens = Some(num(k, v)?),
            },
            "num_ctx" => out.num_ctx = Some(num(k, v)?),
            "stop" => {
                let list = v
                    .as_array()
                    .ok_or("option stop must be a list of strings")?;
                for s in list {
                    out.stop.push(
                        s.as_str()
                            .ok_or("option stop must be a list of strings")?
                            .to_owned(),
                    );
                }
            }
            // The prompt's batch size: Grove's prefill chunk (the tokens of
            // one forward pass), which changes memory, not the reply.
            "num_batch" => {
                let n = v
                    .as_u64()
                    .filter(|n| (1..=u64::from(u32::MAX)).contains(n))
                    .ok_or("option num_batch must be a positive integer")?;
                out.prefill_chunk = Some(n as u32);
            }
            // Hints about loading and resources, as ollama's MLX engine
            // takes them: no effect on the output (README, "Fields taken and
            // not used").
            "num_gpu" | "num_thread" | "use_mmap" | "numa" | "low_vram" | "main_gpu" => {}
            // The tokens ollama keeps when it cuts a prompt that overflows
            // the context: Grove never cuts one (a prompt that does not fit
            // is refused), so no value changes the output.
            "num_keep" if v.as_u64().is_some() || v.as_i64() == Some(-1) => {}
            // At its neutral value only (true would penalize newlines).
            "penalize_newline" if v.as_bool() == Some(false) => {}
            "mirostat" if v.as_f64() == Some(0.0) => {}
            "typical_p" | "tfs_z" if v.as_f64() == Some(1.0) => {}
            other => {
                return Err(format!(
                    "option {other:?} is not supported by Grove (it takes temperature, top_k, top_p, min_p, \
                     repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty, seed, num_predict, \
                     num_ctx, num_batch and stop; num_gpu, num_thread, num_keep, use_mmap, numa, low_vram and main_gpu are \
                     taken and not used)"
                ));
            }
        }
    }
    Ok(out)
}

/// ollama's `think`: a switch (true/false: the template's `enable_thinking`)
/// or a level ("low", "medium", "high": a reasoning effort, which the model's
/// template takes as `reasoning_effort` or, on and off, as `enable_thinking`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Think {
    pub enable: Option<bool>,
    pub effort: pb::ReasoningEffort,
}

impl Think {
    pub fn is_set(&self) -> bool {
        self.enable.is_some() || self.effort != pb::ReasoningEffort::Unspecified
    }
}

pub fn think(v: Option<&Value>) -> Result<Think, String> {
    let effort = |e| Think {
        enable: None,
        effort: e,
    };
    match v {
        None | Some(Value::Null) => Ok(Think::default()),
        Some(Value::Bool(b)) => Ok(Think {
            enable: Some(*b),
            effort: pb::ReasoningEffort::Unspecified,
        }),
        Some(Value::String(s)) if s == "low" => Ok(effort(pb::ReasoningEffort::Low)),
        Some(Value::String(s)) if s == "medium" => Ok(effort(pb::ReasoningEffort::Medium)),
        Some(Value::String(s)) if s == "high" => Ok(effort(pb::ReasoningEffort::High)),
        Some(other) => Err(format!(
            "think is true, false, \"low\", \"medium\" or \"high\", not {other}"
        )),
    }
}

/// ollama's `format`: "json" (any JSON object or array) or a JSON schema.
pub fn format(f: Option<&Value>) -> Result<Option<pb::Constraint>, String> {
    use pb::constraint::Kind;
    let kind = match f {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) if s.is_empty() => return Ok(None),
        Some(Value::String(s)) if s == "json" => {
            Kind::JsonSchema(r#"{"type": ["object", "array"]}"#.into())
        }
        Some(schema @ Value::Object(_)) => Kind::JsonSchema(schema.to_string()),
        Some(other) => return Err(format!("format is \"json\" or a JSON schema, not {other}")),
    };
    Ok(Some(pb::Constraint { kind: Some(kind) }))
}

/// Refuses what Grove does not do.
pub fn unsupported(images: bool) -> Result<(), String> {
    if images {
        return Err("images are not supported: Grove runs text models".into());
    }
    Ok(())
}

/// `logprobs` and `top_logprobs` (0 to 20 alternatives) as the runner's
/// option: set when log-probabilities are wanted.
pub fn top_logprobs(logprobs: Option<bool>, top: Option<u32>) -> Result<Option<u32>, String> {
    match (logprobs, top) {
        (Some(true), Some(n)) if n > 20 => Err(format!("top_logprobs is 0 to 20, not {n}")),
        (Some(true), n) => Ok(Some(n.unwrap_or(0))),
        (_, Some(n)) if n > 0 => Err("top_logprobs needs logprobs: true".into()),
        _ => Ok(None),
    }
}

/// A chat message as Grove's.
pub fn message(m: Message, i: usize) -> Result<pb::Message, String> {
    let role = match m.role.as_str() {
        "system" => pb::Role::System,
        "user" => pb::Role::User,
        "assistant" => pb::Role::Assistant,
        "tool" => pb::Role::Tool,
        other => return Err(format!("message {i}: unknown role {other:?}")),
    };
    if m.images.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err("images are not supported: Grove runs text models".into());
    }
    let tool_calls = m
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .map(|c| pb::ToolCall {
            id: c.id.unwrap_or_default(),
            name: c.function.name,
            arguments_json: Value::Object(c.function.arguments).to_string(),
        })
        .collect();
    Ok(pb::Message {
        role: role as i32,
        content: m.content,
        tool_calls,
        tool_call_id: m.tool_call_id.unwrap_or_default(),
        name: m.tool_name.unwrap_or_default(),
        reasoning_content: m.thinking.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(json: &str) -> Result<pb::Options, String> {
        let m: Map<String, Value> = serde_json::from_str(json).expect("an object");
        options(Some(&m))
    }

    #[test]
    fn load_hints_are_taken_and_output_options_still_checked() {
        let hints = r#"{"num_gpu": 1, "num_thread": 4, "num_batch": 512, "num_keep": 4, "use_mmap": true, "numa": false,
            "low_vram": false, "main_gpu": 0, "penalize_newline": false, "temperature": 0.5}"#;
        let o = opts(hints).expect("taken");
        assert_eq!(o.temperature, Some(0.5));
        assert_eq!(o.prefill_chunk, Some(512));
        assert!(
            opts(r#"{"num_batch": 0}"#)
                .expect_err("no chunk")
                .contains("num_batch")
        );
        let e = opts(r#"{"penalize_newline": true}"#).expect_err("changes the output");
        assert!(e.contains("penalize_newline"), "{e}");
    }

    #[test]
    fn think_is_a_switch_or_a_level() {
        assert_eq!(think(None).unwrap(), Think::default());
        let on = think(Some(&Value::Bool(true))).unwrap();
        assert_eq!(
            (on.enable, on.effort),
            (Some(true), pb::ReasoningEffort::Unspecified)
        );
        let high = think(Some(&Value::from("high"))).unwrap();
        assert_eq!(
            (high.enable, high.effort),
            (None, pb::ReasoningEffort::High)
        );
        assert!(high.is_set() && !Think::default().is_set());
        let e = think(Some(&Value::from("max"))).expect_err("not a level");
        assert!(e.contains("think"), "{e}");
    }
}
