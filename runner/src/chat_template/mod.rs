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
use std::str::FromStr;

use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};
use serde_json::Value as Json;

use crate::error::{Result, RunnerError};

mod python;
mod strftime;

use python::{py_formatter, py_str, tojson};
use strftime::strftime;

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

/// The model's templates, from the files in `dir` (if any) or else from
/// `tokenizer_config.json` (`config`, read from `origin`).
fn template_sources(dir: Option<&Path>, config: &Json, origin: &Path) -> Result<Vec<Source>> {
    let mut sources = Vec::new();
    if let Some(dir) = dir {
        file_sources(dir, &mut sources)?;
    }
    if !sources.is_empty() {
        return Ok(sources);
    }
    config_sources(config, origin, &mut sources)?;
    Ok(sources)
}

/// `chat_template.jinja` and `additional_chat_templates/*.jinja`.
fn file_sources(dir: &Path, sources: &mut Vec<Source>) -> Result<()> {
    let file = dir.join("chat_template.jinja");
    if file.is_file() {
        let text = read_text(&file)?;
        put(
            sources,
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
                sources,
                Source {
                    name,
                    text,
                    origin: path,
                },
            );
        }
    }
    Ok(())
}

/// `chat_template` of tokenizer_config.json: a string or a named list.
fn config_sources(config: &Json, origin: &Path, sources: &mut Vec<Source>) -> Result<()> {
    let bad =
        |what: &str| RunnerError::Tokenizer(format!("{}: chat_template {what}", origin.display()));
    match config.get("chat_template") {
        None | Some(Json::Null) => {}
        Some(Json::String(text)) => put(
            sources,
            Source {
                name: "default".into(),
                text: text.clone(),
                origin: origin.to_owned(),
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
                    sources,
                    Source {
                        name: name.into(),
                        text: text.into(),
                        origin: origin.to_owned(),
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
    Ok(())
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
fn special_tokens(dir: Option<&Path>, config: &Json) -> Result<BTreeMap<String, String>> {
    let mut cfg = config.as_object().cloned().unwrap_or_default();
    if !cfg.contains_key("added_tokens_decoder")
        && let Some(dir) = dir
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
        let origin = dir.join("tokenizer_config.json");
        let config = read_json(&origin)?;
        Self::load_from(Some(dir), &config, &origin, name)
    }

    /// The chat template(s) of a tokenizer_config.json held in memory (a
    /// converted GGUF file's); `origin` names it in errors.
    pub fn from_tokenizer_config(
        config: &Json,
        origin: &Path,
        name: Option<&str>,
    ) -> Result<Option<Self>> {
        Self::load_from(None, config, origin, name)
    }

    fn load_from(
        dir: Option<&Path>,
        config: &Json,
        origin: &Path,
        name: Option<&str>,
    ) -> Result<Option<Self>> {
        let sources = template_sources(dir, config, origin)?;
        if sources.is_empty() {
            return Ok(None);
        }
        let tokens = special_tokens(dir, config)?;
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
