//! Chat templates: a conversation rendered to prompt text as transformers'
//! `tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=...,
//! tokenize=False, **extra)` renders it (transformers 5, which mlx-lm uses), with
//! minijinja in place of Jinja2.
//!
//! # Where the template comes from (transformers 5)
//! - `chat_template.jinja` (the name `default`) and `additional_chat_templates/<name>.jinja`
//!   beside `tokenizer_config.json`. When any of these files exists, the
//!   `chat_template` entry of `tokenizer_config.json` is ignored entirely.
//! - Otherwise `chat_template` in `tokenizer_config.json`: a string (`default`) or
//!   a list of `{"name", "template"}`.
//! - Which template renders: the name given to [`ChatTemplate::load`]; else
//!   `tool_use` when the request has tools and the model has one; else `default`.
//!   An unknown name is an error (transformers would render the name itself as a
//!   template).
//!
//! # What the template sees
//! - The special tokens (`bos_token`, `eos_token`, `unk_token`, `sep_token`,
//!   `pad_token`, `cls_token`, `mask_token`, plus named model-specific ones such as
//!   `image_token`) that are set, as strings; then [`ChatRequest::extra`], which
//!   overrides them; then `messages`, `tools` (`none` when there are none),
//!   `documents` (`none`) and `add_generation_prompt`.
//! - Messages as dicts, keys in this order, absent rather than `none` when unset
//!   (transformers drops `None` values): `role`, `content`, `name`, `tool_calls`,
//!   `tool_call_id`; a tool call as `{"type": "function", "function": {"name",
//!   "arguments"}, "id"}`. Tools are passed exactly as given: transformers does not
//!   wrap a bare function dict in `{"type": "function", "function": ...}`.
//! - The environment of transformers: `trim_blocks`, `lstrip_blocks`, loop controls,
//!   `raise_exception(msg)`, `strftime_now(fmt)` (UTC here; Python uses local time),
//!   `namespace`, `dict`, and a `tojson` filter that is `json.dumps(x,
//!   ensure_ascii=False, indent=None, separators=None, sort_keys=False)`: no HTML
//!   escaping, `", "`/`": "` separators, Python float formatting.
//! - Python compatibility beyond minijinja: string/dict/list methods
//!   (minijinja-contrib's pycompat: `.strip()`, `.split()`, `.startswith()`,
//!   `.items()`, `.get()`, ...), and `{{ x }}` prints floats (`1e-07`, `2.0`) and
//!   lists and dicts (`['a', None]`) as Python's `str` does (minijinja already
//!   prints `None`/`True`/`False`). `{% generation %}` blocks render their body.
//!   Known differences: `~` and `|string` still format floats and containers
//!   the minijinja way; Python tuples (`dictsort`, `.items()` printed whole)
//!   print as lists.
//! - Map order: serde_json (without its `preserve_order` feature) sorts object
//!   keys, so tools, tool-call arguments and `extra` reach the template with sorted
//!   keys, where Python keeps the request's order; `tojson` of a tool schema then
//!   differs from transformers unless the request's keys were already sorted.
//!
//! # mlx-lm's extra variables
//! mlx-lm's `TokenizerWrapper.apply_chat_template` always passes `enable_thinking`:
//! the request's value, else whether the vocabulary has a thinking pair
//! (`<think>`/`</think>`, `<longcat_think>`/`</longcat_think>`,
//! `<|think:start|>`/`<|think:end|>`). To render as mlx-lm does, the engine sets
//! `extra["enable_thinking"]` the same way; this module passes `extra` as given.
//!
//! # Tokenizing the result
//! transformers (`apply_chat_template(..., tokenize=True)`) and mlx-lm (server and
//! `generate` CLI) tokenize the rendered text with `add_special_tokens=False`: the
//! template writes BOS itself where the model wants one. Use
//! [`Tokenizer::encode`](crate::tokenizer::Tokenizer::encode)`(text, false)`:
//! `encode(text, true)` gives Llama two BOS, and `encode_prompt` adds the
//! tokenizer's BOS to any rendering that does not start with it.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};

use crate::error::{Result, RunnerError};

mod python;
mod request;
pub mod sandbox;
mod spec;
mod strftime;

pub use request::{ChatRequest, Message, ReasoningEffort, Role, ToolCall};
pub use spec::{Source, TemplateSpec};

use python::{py_formatter, py_str, tojson};
use strftime::strftime;

/// Variables the request itself sets; `extra` may not.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// A model's chat template(s), parsed.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Every template the model has: name and the file it came from.
    templates: Vec<(String, PathBuf)>,
    /// The template asked for by name at load, if any.
    pinned: Option<String>,
    special_tokens: BTreeMap<String, String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("templates", &self.templates)
            .field("pinned", &self.pinned)
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

impl ChatTemplate {
    /// Loads the chat template(s) of the model in `dir`; `None` if it has none.
    /// `name` pins a named template (e.g. `"tool_use"`); an unknown name is an error.
    /// Templates that may render are parsed now, so a malformed one fails here.
    pub fn load(dir: &Path, name: Option<&str>) -> Result<Option<Self>> {
        match TemplateSpec::from_dir(dir)? {
            Some(spec) => Self::from_spec(&spec, name).map(Some),
            None => Ok(None),
        }
    }

    /// Parses the templates of `spec` that may render (`pinned`, else
    /// `default` and `tool_use`).
    pub fn from_spec(spec: &TemplateSpec, pinned: Option<&str>) -> Result<Self> {
        let sources = spec.sources.clone();
        let special_tokens = spec.special_tokens.clone();
        let names = || {
            sources
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if let Some(name) = pinned
            && !sources.iter().any(|s| s.name == name)
        {
            return Err(RunnerError::Request(format!(
                "the model has no chat template named {name:?} (it has: {})",
                names()
            )));
        }
        let mut env = environment();
        for s in &sources {
            let selectable = match pinned {
                Some(name) => s.name == name,
                None => s.name == "default" || s.name == "tool_use",
            };
            if !selectable {
                continue;
            }
            env.add_template_owned(s.name.clone(), rewrite_generation_tags(&s.text))
                .map_err(|e| {
                    RunnerError::Tokenizer(format!(
                        "chat template {:?} ({}) does not parse: {e}",
                        s.name,
                        s.origin.display()
                    ))
                })?;
        }
        Ok(Self {
            env,
            templates: sources.into_iter().map(|s| (s.name, s.origin)).collect(),
            pinned: pinned.map(str::to_owned),
            special_tokens,
        })
    }

    /// Replaces the fuel budget (tests measure how much real templates need).
    #[cfg(test)]
    pub(crate) fn set_fuel(&mut self, fuel: u64) {
        self.env.set_fuel(Some(fuel));
    }

    /// The names of the model's templates (`default`, `tool_use`, ...).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.templates.iter().map(|(n, _)| n.as_str())
    }

    /// The special tokens passed to the template.
    pub fn special_tokens(&self) -> &BTreeMap<String, String> {
        &self.special_tokens
    }

    /// The template a request renders with, as transformers' `get_chat_template`.
    fn select(&self, has_tools: bool) -> Result<&str> {
        if let Some(name) = &self.pinned {
            return Ok(name);
        }
        let has = |n: &str| self.templates.iter().any(|(name, _)| name == n);
        if has_tools && has("tool_use") {
            Ok("tool_use")
        } else if has("default") {
            Ok("default")
        } else {
            Err(RunnerError::Request(format!(
                "the model has several chat templates and none named \"default\"; \
                 load one by name (it has: {})",
                self.names().collect::<Vec<_>>().join(", ")
            )))
        }
    }

    /// `name (file)` for error messages.
    fn describe(&self, name: &str) -> String {
        match self.templates.iter().find(|(n, _)| n == name) {
            Some((_, origin)) => format!("chat template {name:?} ({})", origin.display()),
            None => format!("chat template {name:?}"),
        }
    }

    /// Renders the conversation to prompt text, within [`FUEL`] instructions
    /// and no output cap. Untrusted templates render in the sandbox
    /// ([`sandbox::render`]), which also caps the output, memory and time.
    pub fn render(&self, req: &ChatRequest) -> Result<String> {
        self.render_capped(req, usize::MAX)
    }

    /// Renders the conversation, failing once the text passes `max_bytes`.
    pub fn render_capped(&self, req: &ChatRequest, max_bytes: usize) -> Result<String> {
        if req.messages.is_empty() {
            return Err(RunnerError::Request(
                "cannot apply a chat template to an empty conversation".into(),
            ));
        }
        for (i, m) in req.messages.iter().enumerate() {
            if !m.tool_calls.is_empty() && m.role != Role::Assistant {
                return Err(RunnerError::Request(format!(
                    "message {i} ({}) has tool calls; only assistant messages may",
                    m.role
                )));
            }
        }
        if let Some(key) = RESERVED.iter().find(|k| req.extra.contains_key(**k)) {
            return Err(RunnerError::Request(format!(
                "template variable {key:?} cannot be set as an extra variable"
            )));
        }
        let name = self.select(!req.tools.is_empty())?;
        let template = self
            .env
            .get_template(name)
            .map_err(|e| RunnerError::Tokenizer(format!("{}: {e}", self.describe(name))))?;

        let mut ctx: BTreeMap<String, Value> = self
            .special_tokens
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        for (k, v) in &req.extra {
            ctx.insert(k.clone(), Value::from_serialize(v));
        }
        if let Some(effort) = req.reasoning_effort {
            let (key, value) = self.effort_variable(&template, name, effort, &req.extra)?;
            ctx.insert(key.into(), value);
        }
        let messages: Vec<Value> = req.messages.iter().map(message_value).collect();
        ctx.insert("messages".into(), Value::from(messages));
        let tools = if req.tools.is_empty() {
            Value::from(())
        } else {
            Value::from(
                req.tools
                    .iter()
                    .map(Value::from_serialize)
                    .collect::<Vec<_>>(),
            )
        };
        ctx.insert("tools".into(), tools);
        ctx.insert("documents".into(), Value::from(()));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(req.add_generation_prompt),
        );

        let mut out = Capped::new(max_bytes);
        match template.render_captured_to(Value::from_iter(ctx), &mut out) {
            Ok(_) => String::from_utf8(out.bytes).map_err(|_| {
                RunnerError::Request(format!("{} rendered invalid UTF-8", self.describe(name)))
            }),
            Err(e) => {
                let what = self.describe(name);
                Err(RunnerError::Request(match raised_message(&e) {
                    Some(msg) => format!("{what} rejected the conversation: {msg}"),
                    None if e.kind() == ErrorKind::OutOfFuel => {
                        format!("{what} ran past its budget of {FUEL} template instructions")
                    }
                    None if out.overflowed => format!(
                        "{what} rendered more than {max_bytes} bytes (the limit is \
                         {RENDER_BYTES_PER_TOKEN} bytes per token of context)"
                    ),
                    None => format!("{what} failed: {e}"),
                }))
            }
        }
    }
}

impl ChatTemplate {
    /// The variable a reasoning effort sets: `reasoning_effort` (its level)
    /// where the template reads it, else `enable_thinking` (on or off); an
    /// error naming the field where it reads neither, or where the effort
    /// asks for what the template cannot do or `extra` already says otherwise.
    fn effort_variable(
        &self,
        template: &minijinja::Template<'_, '_>,
        name: &str,
        effort: ReasoningEffort,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(&'static str, Value)> {
        let reads = template.undeclared_variables(false);
        let refuse = |why: String| {
            Err(RunnerError::Request(format!(
                "reasoning_effort {:?}: {why}",
                effort.as_str()
            )))
        };
        if reads.contains("reasoning_effort") {
            return match effort.level() {
                Some(level) => Ok(("reasoning_effort", Value::from(level))),
                None => refuse(format!(
                    "{} takes low, medium or high (the model always reasons)",
                    self.describe(name)
                )),
            };
        }
        if reads.contains("enable_thinking") {
            let on = effort.thinks();
            if extra
                .get("enable_thinking")
                .is_some_and(|v| v.as_bool() != Some(on))
            {
                return refuse("it contradicts the request's enable_thinking".into());
            }
            return Ok(("enable_thinking", Value::from(on)));
        }
        refuse(format!(
            "{} has no reasoning setting (it reads neither reasoning_effort nor enable_thinking)",
            self.describe(name)
        ))
    }
}

/// A message as transformers hands it to the template.
fn message_value(m: &Message) -> Value {
    let mut pairs: Vec<(&str, Value)> = vec![
        ("role", Value::from(m.role.as_str())),
        ("content", Value::from(m.content.as_str())),
    ];
    if let Some(name) = &m.name {
        pairs.push(("name", Value::from(name.as_str())));
    }
    if !m.tool_calls.is_empty() {
        let calls: Vec<Value> = m.tool_calls.iter().map(tool_call_value).collect();
        pairs.push(("tool_calls", Value::from(calls)));
    }
    if let Some(id) = &m.tool_call_id {
        pairs.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(r) = &m.reasoning_content {
        pairs.push(("reasoning_content", Value::from(r.as_str())));
    }
    Value::from_iter(pairs)
}

fn tool_call_value(c: &ToolCall) -> Value {
    let function = Value::from_iter([
        ("name", Value::from(c.name.as_str())),
        ("arguments", Value::from_serialize(&c.arguments)),
    ]);
    let mut pairs = vec![("type", Value::from("function")), ("function", function)];
    if let Some(id) = &c.id {
        pairs.push(("id", Value::from(id.as_str())));
    }
    Value::from_iter(pairs)
}

// ---------------------------------------------------------------------------------------
// The environment

/// Template instructions one rendering may run: well over 100 times what a
/// long tool-calling conversation takes with the real templates in
/// tests-data (see the fuel test), and a fraction of a second of CPU.
pub const FUEL: u64 = 20_000_000;

/// A rendered prompt may hold this many bytes per token of context: far more
/// than any tokenizer packs into a token, so a cap this size only stops a
/// template that writes far more than the context could ever take.
pub const RENDER_BYTES_PER_TOKEN: usize = 32;

/// An output that refuses to grow past a cap.
struct Capped {
    bytes: Vec<u8>,
    max: usize,
    overflowed: bool,
}

impl Capped {
    fn new(max: usize) -> Self {
        Self {
            bytes: Vec::new(),
            max,
            overflowed: false,
        }
    }
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len().saturating_add(buf.len()) > self.max {
            self.overflowed = true;
            return Err(std::io::Error::other("the rendered text is too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// minijinja set up as transformers sets up Jinja2 for chat templates, with
/// a fuel budget.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(FUEL));
    env.set_debug(false);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(py_formatter);
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

/// The message of `raise_exception`, carried as the error's source.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let text = py_str(&message);
    Err(Error::new(ErrorKind::InvalidOperation, text.clone()).with_source(Raised(text)))
}

/// The `raise_exception` message behind a render error, if that is what failed.
fn raised_message(err: &Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cause {
        if let Some(raised) = e.downcast_ref::<Raised>() {
            return Some(raised.0.clone());
        }
        cause = e.source();
    }
    None
}

fn strftime_now(format: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    strftime(now.as_secs() as i64, now.subsec_micros(), format)
}

// ---------------------------------------------------------------------------------------

/// transformers' `{% generation %}...{% endgeneration %}` (marks assistant text for
/// masks) rendered as a plain block: `{% if true %}...{% endif %}`, whitespace
/// control kept.
fn rewrite_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(pos) = rest.find("{%") {
        out.push_str(&rest[..pos]);
        let tag = &rest[pos..];
        match generation_tag(tag) {
            Some((len, replacement)) => {
                out.push_str(&replacement);
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// `{%[-+] generation|endgeneration [-+]%}` at the start of `tag`: its length and
/// the tag to use instead.
fn generation_tag(tag: &str) -> Option<(usize, String)> {
    let b = tag.as_bytes();
    let mut i = 2;
    let marker = |i: usize| match b.get(i) {
        Some(b'-') => "-",
        Some(b'+') => "+",
        _ => "",
    };
    let open = marker(i);
    i += open.len();
    while b.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    let start = i;
    while b
        .get(i)
        .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
    {
        i += 1;
    }
    let replacement = match &tag[start..i] {
        "generation" => "if true",
        "endgeneration" => "endif",
        _ => return None,
    };
    while b.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    let close = marker(i);
    i += close.len();
    tag[i..]
        .starts_with("%}")
        .then(|| (i + 2, format!("{{%{open} {replacement} {close}%}}")))
}

#[cfg(test)]
mod tests;
