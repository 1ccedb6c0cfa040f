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
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Output, State, UndefinedBehavior};
use serde_json::Value as Json;

use crate::error::{Result, RunnerError};

/// Who wrote a message; rendered as `"system"`, `"user"`, `"assistant"`, `"tool"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    /// The role as chat templates spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = RunnerError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "system" => Ok(Role::System),
            "user" => Ok(Role::User),
            "assistant" => Ok(Role::Assistant),
            "tool" => Ok(Role::Tool),
            _ => Err(RunnerError::Request(format!(
                "unknown message role {s:?} (expected system, user, assistant or tool)"
            ))),
        }
    }
}

/// A function call the assistant made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// Usually a JSON object; templates `tojson` it. A string stays a string.
    pub arguments: Json,
    pub id: Option<String>,
}

impl ToolCall {
    /// A call whose arguments arrive as JSON text (the OpenAI API's
    /// `function.arguments`): parsed, as mlx-lm's server does, because templates
    /// expect a dict.
    pub fn from_json_arguments(name: &str, arguments: &str, id: Option<String>) -> Result<Self> {
        let arguments = serde_json::from_str(arguments).map_err(|e| {
            RunnerError::Request(format!("tool call {name:?}: arguments are not JSON: {e}"))
        })?;
        Ok(Self {
            name: name.to_owned(),
            arguments,
            id,
        })
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    /// Always passed to the template (mlx-lm turns a missing content into "").
    pub content: String,
    /// Only on assistant messages; omitted from the template's dict when empty.
    pub tool_calls: Vec<ToolCall>,
    /// On tool messages: the call answered.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

impl Message {
    /// A message with only a role and content.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// What to render.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    /// JSON-schema tool definitions, passed as given; empty renders as `tools = none`.
    pub tools: Vec<Json>,
    /// Ends the prompt with the header of an assistant turn.
    pub add_generation_prompt: bool,
    /// Further template variables (`enable_thinking`, `date_string`, ...); they
    /// override the special tokens.
    pub extra: serde_json::Map<String, Json>,
}

/// Variables the request itself sets; `extra` may not.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// The special tokens transformers always names.
const NAMED_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

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

/// A template's source before parsing.
struct Source {
    name: String,
    text: String,
    origin: PathBuf,
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| RunnerError::Read {
        path: path.to_owned(),
        source,
    })
}

fn read_json(path: &Path) -> Result<Json> {
    if !path.is_file() {
        return Ok(Json::Null);
    }
    serde_json::from_str(&read_text(path)?)
        .map_err(|e| RunnerError::Tokenizer(format!("{}: not valid JSON: {e}", path.display())))
}

/// Adds or replaces (a later source of the same name wins, as in a Python dict).
fn put(sources: &mut Vec<Source>, source: Source) {
    match sources.iter_mut().find(|s| s.name == source.name) {
        Some(old) => *old = source,
        None => sources.push(source),
    }
}

/// The model's templates, from the files or else from `tokenizer_config.json`.
fn template_sources(dir: &Path, config: &Json) -> Result<Vec<Source>> {
    let mut sources = Vec::new();
    let file = dir.join("chat_template.jinja");
    if file.is_file() {
        let text = read_text(&file)?;
        put(
            &mut sources,
            Source {
                name: "default".into(),
                text,
                origin: file,
            },
        );
    }
    let extra_dir = dir.join("additional_chat_templates");
    if extra_dir.is_dir() {
        let entries = std::fs::read_dir(&extra_dir).map_err(|source| RunnerError::Read {
            path: extra_dir.clone(),
            source,
        })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "jinja"))
            .collect();
        files.sort();
        for path in files {
            let Some(name) = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned) else {
                continue;
            };
            let text = read_text(&path)?;
            put(
                &mut sources,
                Source {
                    name,
                    text,
                    origin: path,
                },
            );
        }
    }
    if !sources.is_empty() {
        return Ok(sources);
    }
    let origin = dir.join("tokenizer_config.json");
    let bad =
        |what: &str| RunnerError::Tokenizer(format!("{}: chat_template {what}", origin.display()));
    match config.get("chat_template") {
        None | Some(Json::Null) => {}
        Some(Json::String(text)) => put(
            &mut sources,
            Source {
                name: "default".into(),
                text: text.clone(),
                origin: origin.clone(),
            },
        ),
        Some(Json::Array(items)) => {
            for item in items {
                let (Some(name), Some(text)) = (
                    item.get("name").and_then(Json::as_str),
                    item.get("template").and_then(Json::as_str),
                ) else {
                    return Err(bad(
                        "list entries must be {\"name\": ..., \"template\": ...}",
                    ));
                };
                put(
                    &mut sources,
                    Source {
                        name: name.into(),
                        text: text.into(),
                        origin: origin.clone(),
                    },
                );
            }
        }
        Some(_) => {
            return Err(bad(
                "must be a string or a list of {\"name\", \"template\"}",
            ));
        }
    }
    Ok(sources)
}

/// A token written as a string or as an AddedToken object (`{"content": ...}`).
fn token_text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// The special tokens transformers 5 passes to the template (its
/// `special_tokens_map`): the named ones, then model-specific named tokens
/// (`extra_special_tokens` given as a dict, other `*_token` string entries,
/// `model_specific_special_tokens`). `special_tokens_map.json` only counts when
/// `tokenizer_config.json` has no `added_tokens_decoder` (its legacy path), and
/// then overrides.
fn special_tokens(dir: &Path, config: &Json) -> Result<BTreeMap<String, String>> {
    let mut cfg = config.as_object().cloned().unwrap_or_default();
    if !cfg.contains_key("added_tokens_decoder")
        && let Json::Object(map) = read_json(&dir.join("special_tokens_map.json"))?
    {
        cfg.extend(map);
    }
    let mut out = BTreeMap::new();
    for key in NAMED_TOKENS {
        if let Some(text) = cfg.get(key).and_then(token_text) {
            out.insert(key.to_owned(), text);
        }
    }
    let named_dict = |out: &mut BTreeMap<String, String>, v: Option<&Json>| {
        if let Some(Json::Object(map)) = v {
            for (k, v) in map {
                if let Some(text) = token_text(v) {
                    out.insert(k.clone(), text);
                }
            }
        }
    };
    named_dict(
        &mut out,
        cfg.get("extra_special_tokens")
            .or_else(|| cfg.get("additional_special_tokens")),
    );
    for (k, v) in &cfg {
        let added = v.get("__type").and_then(Json::as_str) == Some("AddedToken");
        if k.ends_with("_token")
            && !NAMED_TOKENS.contains(&k.as_str())
            && (v.is_string() || added)
            && let Some(text) = token_text(v)
        {
            out.insert(k.clone(), text);
        }
    }
    named_dict(&mut out, cfg.get("model_specific_special_tokens"));
    Ok(out)
}

impl ChatTemplate {
    /// Loads the chat template(s) of the model in `dir`; `None` if it has none.
    /// `name` pins a named template (e.g. `"tool_use"`); an unknown name is an error.
    /// Templates that may render are parsed now, so a malformed one fails here.
    pub fn load(dir: &Path, name: Option<&str>) -> Result<Option<Self>> {
        let config = read_json(&dir.join("tokenizer_config.json"))?;
        let sources = template_sources(dir, &config)?;
        if sources.is_empty() {
            return Ok(None);
        }
        let tokens = special_tokens(dir, &config)?;
        Self::from_sources(sources, tokens, name).map(Some)
    }

    fn from_sources(
        sources: Vec<Source>,
        special_tokens: BTreeMap<String, String>,
        pinned: Option<&str>,
    ) -> Result<Self> {
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

    /// Renders the conversation to prompt text.
    pub fn render(&self, req: &ChatRequest) -> Result<String> {
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

        template.render(Value::from_iter(ctx)).map_err(|e| {
            let what = self.describe(name);
            match raised_message(&e) {
                Some(msg) => {
                    RunnerError::Request(format!("{what} rejected the conversation: {msg}"))
                }
                None => RunnerError::Request(format!("{what} failed: {e}")),
            }
        })
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

/// minijinja set up as transformers sets up Jinja2 for chat templates.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
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

/// `{{ x }}` as Jinja2 prints it: Python's `str(x)`.
fn py_formatter(out: &mut Output, _state: &State, value: &Value) -> Result<(), Error> {
    let written = match value.as_str() {
        Some(s) => out.write_str(s),
        None if value.is_undefined() => Ok(()),
        None => out.write_str(&py_str(value)),
    };
    written.map_err(|_| Error::from(ErrorKind::WriteFailure))
}

/// Python's `str(x)`.
fn py_str(v: &Value) -> String {
    let mut s = String::new();
    match v.as_str() {
        Some(text) => s.push_str(text),
        None => py_repr(v, &mut s),
    }
    s
}

/// Python's `repr(x)` for the JSON-like values templates see.
fn py_repr(v: &Value, out: &mut String) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number if !v.is_integer() => match f64::try_from(v.clone()) {
            Ok(f) => out.push_str(&py_float(f, false)),
            Err(_) => out.push_str(&v.to_string()),
        },
        ValueKind::String => py_str_repr(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(items) = v.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&item, out);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = v.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&key, out);
                    out.push_str(": ");
                    py_repr(&v.get_item(&key).unwrap_or_default(), out);
                }
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
}

/// Characters Python's `repr` escapes beyond ASCII controls: C1 controls and the
/// common non-printable spaces, separators and format characters.
fn py_unprintable(c: char) -> bool {
    matches!(c as u32,
        0x00..=0x1f | 0x7f..=0xa0 | 0xad | 0x1680 | 0x2000..=0x200f | 0x2028..=0x202f
        | 0x205f..=0x2064 | 0x3000 | 0xfeff | 0xd800..=0xdfff | 0xfff9..=0xfffb)
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`.
fn py_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if py_unprintable(c) => {
                let n = c as u32;
                if n <= 0xff {
                    let _ = write!(out, "\\x{n:02x}");
                } else {
                    let _ = write!(out, "\\u{n:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `repr(float)`; `json` spells the non-finite values as `json.dumps` does.
fn py_float(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.into();
    }
    if f.is_infinite() {
        return match (json, f > 0.0) {
            (true, true) => "Infinity",
            (true, false) => "-Infinity",
            (false, true) => "inf",
            (false, false) => "-inf",
        }
        .into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the shortest digits that round-trip, as Python's repr.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::new();
    if f < 0.0 {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        } else {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            out.push_str(&digits);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

// ---------------------------------------------------------------------------------------
// tojson: Python's json.dumps

struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let invalid = |msg: &str| Error::new(ErrorKind::InvalidOperation, format!("tojson: {msg}"));
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_str(), v.as_i64()) {
            (Some(s), _) => Some(s.to_owned()),
            (None, Some(n)) => Some(" ".repeat(n.max(0) as usize)),
            _ => return Err(invalid("indent must be an integer or a string")),
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(seps) if !seps.is_none() => {
            let parts: Vec<String> = seps
                .try_iter()
                .map_err(|_| invalid("separators must be a pair of strings"))?
                .map(|s| s.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| invalid("separators must be a pair of strings"))?;
            match <[String; 2]>::try_from(parts) {
                Ok([item, key]) => (item, key),
                Err(_) => return Err(invalid("separators must be a pair of strings")),
            }
        }
        _ if indent.is_some() => (",".into(), ": ".into()),
        _ => (", ".into(), ": ".into()),
    };
    let style = JsonStyle {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    json_value(value, &style, 0, &mut out)?;
    Ok(Value::from(out))
}

fn json_newline(style: &JsonStyle, level: usize, out: &mut String) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn json_value(v: &Value, style: &JsonStyle, level: usize, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
        ValueKind::Number => {
            let f = f64::try_from(v.clone())?;
            out.push_str(&py_float(f, true));
        }
        ValueKind::String => json_str(v.as_str().unwrap_or_default(), style.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                json_newline(style, level + 1, out);
                json_value(item, style, level + 1, out)?;
            }
            json_newline(style, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in v.try_iter()? {
                let item = v.get_item(&key)?;
                let key = match key.kind() {
                    ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
                    ValueKind::None => "null".into(),
                    ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).into(),
                    ValueKind::Number if key.is_integer() => key.to_string(),
                    ValueKind::Number => py_float(f64::try_from(key.clone())?, true),
                    kind => {
                        return Err(Error::new(
                            ErrorKind::InvalidOperation,
                            format!(
                                "tojson: keys must be str, int, float, bool or None, not {kind}"
                            ),
                        ));
                    }
                };
                entries.push((key, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                json_newline(style, level + 1, out);
                json_str(key, style.ensure_ascii, out);
                out.push_str(&style.key_sep);
                json_value(item, style, level + 1, out)?;
            }
            json_newline(style, level, out);
            out.push('}');
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a value of type {kind} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

/// A JSON string as Python's json module writes it.
fn json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

// ---------------------------------------------------------------------------------------
// strftime

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// The date of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

/// Python's `datetime.strftime` (glibc, C locale) for a naive UTC time:
/// `%Z` and `%z` are empty, as for `datetime.now()`; `%-d` drops padding.
fn strftime(secs: i64, micros: u32, format: &str) -> String {
    let days = secs.div_euclid(86400);
    let sod = secs.rem_euclid(86400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (sod / 3600, sod / 60 % 60, sod % 60);
    let wday = (days + 4).rem_euclid(7) as usize;
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let num = |out: &mut String, n: i64, width: usize| {
            if unpadded {
                let _ = write!(out, "{n}");
            } else {
                let _ = write!(out, "{n:0width$}");
            }
        };
        match chars.next() {
            Some('a') => out.push_str(&DAYS[wday][..3]),
            Some('A') => out.push_str(DAYS[wday]),
            Some('b') | Some('h') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('c') => out.push_str(&strftime(secs, micros, "%a %b %e %H:%M:%S %Y")),
            Some('C') => num(&mut out, year.div_euclid(100), 2),
            Some('d') => num(&mut out, day as i64, 2),
            Some('D') | Some('x') => out.push_str(&strftime(secs, micros, "%m/%d/%y")),
            Some('e') => {
                let _ = if unpadded {
                    write!(out, "{day}")
                } else {
                    write!(out, "{day:2}")
                };
            }
            Some('f') => num(&mut out, micros as i64, 6),
            Some('F') => out.push_str(&strftime(secs, micros, "%Y-%m-%d")),
            Some('H') => num(&mut out, hour, 2),
            Some('I') => num(&mut out, hour12, 2),
            Some('j') => num(&mut out, yday, 3),
            Some('k') => {
                let _ = write!(out, "{hour:2}");
            }
            Some('l') => {
                let _ = write!(out, "{hour12:2}");
            }
            Some('m') => num(&mut out, month as i64, 2),
            Some('M') => num(&mut out, minute, 2),
            Some('n') => out.push('\n'),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('R') => out.push_str(&strftime(secs, micros, "%H:%M")),
            Some('s') => {
                let _ = write!(out, "{secs}");
            }
            Some('S') => num(&mut out, second, 2),
            Some('t') => out.push('\t'),
            Some('T') | Some('X') => out.push_str(&strftime(secs, micros, "%H:%M:%S")),
            Some('u') => num(&mut out, if wday == 0 { 7 } else { wday as i64 }, 1),
            Some('w') => num(&mut out, wday as i64, 1),
            Some('y') => num(&mut out, year.rem_euclid(100), 2),
            Some('Y') => {
                let _ = write!(out, "{year}");
            }
            Some('z') | Some('Z') => {}
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
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
#[path = "chat_template_tests.rs"]
mod tests;
