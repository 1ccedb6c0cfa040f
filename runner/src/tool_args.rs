//! The argument syntaxes of the tool-call formats in [`crate::output`]: each
//! call's body text to a name and a JSON object of arguments, or None when
//! the model wrote something that is not a call (never a panic).
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};

/// One parsed call.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The model's own id (Mistral writes one), else a fresh `call_…`.
    pub id: String,
    pub name: String,
    /// A JSON object.
    pub arguments_json: String,
}

/// Per tool, its parameters declared as strings: XML-style formats write
/// every value as text, and only the schema says whether `5` is a number.
#[derive(Debug, Clone, Default)]
pub struct ToolSchemas(BTreeMap<String, BTreeSet<String>>);

impl ToolSchemas {
    /// From OpenAI-style tool definitions (`{"type":"function","function":{…}}`
    /// or the function object itself).
    pub fn from_tools(tools: &[Value]) -> Self {
        let mut map = BTreeMap::new();
        for t in tools {
            let f = t.get("function").unwrap_or(t);
            let Some(name) = f.get("name").and_then(Value::as_str) else {
                continue;
            };
            let strings = f
                .pointer("/parameters/properties")
                .and_then(Value::as_object)
                .map(|p| {
                    p.iter()
                        .filter(|(_, s)| s.get("type").and_then(Value::as_str) == Some("string"))
                        .map(|(k, _)| k.clone())
                        .collect()
                })
                .unwrap_or_default();
            map.insert(name.to_owned(), strings);
        }
        Self(map)
    }

    fn is_string(&self, tool: &str, arg: &str) -> bool {
        self.0.get(tool).is_some_and(|s| s.contains(arg))
    }
}

/// A fresh call id, as OpenAI writes them (`call_` and 24 characters).
pub fn new_call_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut id = String::from("call_");
    for _ in 0..24 {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        id.push(ALPHABET[(r >> 58) as usize % ALPHABET.len()] as char);
    }
    id
}

fn call(name: &str, args: Map<String, Value>, id: Option<String>) -> Call {
    Call {
        id: id.unwrap_or_else(new_call_id),
        name: name.to_owned(),
        arguments_json: Value::Object(args).to_string(),
    }
}

/// `{"name":…,"arguments"|"parameters":{…}}`, or a list of them; arguments
/// written as a JSON string are read as one.
fn json_call(v: &Value) -> Option<Call> {
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?;
    if name.is_empty() {
        return None;
    }
    let args = match o.get("arguments").or_else(|| o.get("parameters")) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(Value::String(s)) => match serde_json::from_str(s).ok()? {
            Value::Object(m) => m,
            _ => return None,
        },
        Some(_) => return None,
    };
    let id = o.get("id").and_then(Value::as_str).map(str::to_owned);
    Some(call(name, args, id))
}

/// Hermes and Llama 3 bodies: one JSON call, a list of them, or (Llama 3)
/// several separated by `;`.
pub fn json_calls(body: &str) -> Option<Vec<Call>> {
    let body = body.trim();
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        return match v {
            Value::Array(items) if !items.is_empty() => items.iter().map(json_call).collect(),
            v => json_call(&v).map(|c| vec![c]),
        };
    }
    let calls: Option<Vec<Call>> = body
        .split(';')
        .map(|p| {
            serde_json::from_str::<Value>(p.trim())
                .ok()
                .as_ref()
                .and_then(json_call)
        })
        .collect();
    calls.filter(|c| c.len() > 1)
}

/// Mistral: a JSON list of calls, or `NAME[ARGS]{…}` repeated.
pub fn mistral_calls(body: &str) -> Option<Vec<Call>> {
    let body = body.trim();
    if body.starts_with('[') {
        return json_calls(body);
    }
    let mut calls = Vec::new();
    let mut rest = body;
    while !rest.trim().is_empty() {
        let (name, after) = rest.split_once("[ARGS]")?;
        let name = name.trim();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
        {
            return None;
        }
        let mut de = serde_json::Deserializer::from_str(after.trim_start()).into_iter::<Value>();
        let args = match de.next()? {
            Ok(Value::Object(m)) => m,
            _ => return None,
        };
        let used = de.byte_offset();
        rest = &after.trim_start()[used..];
        calls.push(call(name, args, None));
    }
    (!calls.is_empty()).then_some(calls)
}

/// A value written as text: kept as a string where the schema says so,
/// else read as JSON when it is JSON.
fn typed_value(tools: &ToolSchemas, tool: &str, key: &str, raw: &str) -> Value {
    if tools.is_string(tool, key) {
        return Value::String(raw.to_owned());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
}

/// The text between `open` and `close` after `from`, and where it ends.
fn between<'a>(s: &'a str, open: &str, close: &str) -> Option<(&'a str, &'a str)> {
    let start = s.find(open)? + open.len();
    let len = s[start..].find(close)?;
    Some((&s[start..start + len], &s[start + len + close.len()..]))
}

/// Qwen3-Coder / Qwen 3.5: `<function=NAME><parameter=K>\nV\n</parameter>…</function>`.
pub fn qwen_xml_call(body: &str, tools: &ToolSchemas) -> Option<Call> {
    let (inner, _) = between(body, "<function=", "</function>")?;
    let (name, mut params) = inner.split_once('>')?;
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    let mut args = Map::new();
    while let Some((head, rest)) = between(params, "<parameter=", "</parameter>") {
        let (key, value) = head.split_once('>')?;
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        args.insert(
            key.trim().to_owned(),
            typed_value(tools, name, key.trim(), value),
        );
        params = rest;
    }
    Some(call(name, args, None))
}

/// GLM: `NAME<arg_key>K</arg_key><arg_value>V</arg_value>…`.
pub fn glm_call(body: &str, tools: &ToolSchemas) -> Option<Call> {
    let body = body.trim();
    let (name, mut rest) = match body.find("<arg_key>") {
        Some(i) => (body[..i].trim(), &body[i..]),
        None => (body, ""),
    };
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    let mut args = Map::new();
    while let Some((key, after)) = between(rest, "<arg_key>", "</arg_key>") {
        let (value, after) = between(after, "<arg_value>", "</arg_value>")?;
        args.insert(
            key.trim().to_owned(),
            typed_value(tools, name, key.trim(), value),
        );
        rest = after;
    }
    Some(call(name, args, None))
}

/// Gemma: `call:NAME{key:VALUE,…}` once or more, with strings between
/// `quote` markers and bare keys.
pub fn gemma_calls(body: &str, quote: &str) -> Option<Vec<Call>> {
    let mut calls = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let after = rest.strip_prefix("call:")?;
        let brace = after.find('{')?;
        let name = after[..brace].trim();
        if name.is_empty() {
            return None;
        }
        let (json, used) = gemma_object(&after[brace..], quote)?;
        let Value::Object(args) = serde_json::from_str(&json).ok()? else {
            return None;
        };
        calls.push(call(name, args, None));
        rest = after[brace + used..].trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

/// Gemma's `{…}` at the start of `s` as JSON text, and its length in `s`.
fn gemma_object(s: &str, quote: &str) -> Option<(String, usize)> {
    let mut out = String::new();
    let mut depth = 0usize;
    let mut i = 0;
    let mut expect_key = false;
    while i < s.len() {
        let rest = &s[i..];
        if let Some(r) = rest.strip_prefix(quote) {
            let end = r.find(quote)?;
            out.push_str(&Value::String(r[..end].to_owned()).to_string());
            i += quote.len() * 2 + end;
            expect_key = false;
            continue;
        }
        let c = rest.chars().next()?;
        if expect_key && (c.is_alphanumeric() || c == '_') {
            let len = rest
                .find(|ch: char| !(ch.is_alphanumeric() || ch == '_' || ch == '-'))
                .unwrap_or(rest.len());
            let key = &rest[..len];
            out.push_str(&Value::String(key.to_owned()).to_string());
            i += len;
            expect_key = false;
            continue;
        }
        match c {
            '{' => {
                depth += 1;
                expect_key = true;
            }
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    out.push('}');
                    return Some((out, i + 1));
                }
            }
            ',' => expect_key = innermost_is_object(&out),
            _ if !c.is_whitespace() => expect_key = false,
            _ => {}
        }
        out.push(c);
        i += c.len_utf8();
    }
    None
}

/// Whether the innermost open bracket of JSON text `s` is an object's.
fn innermost_is_object(s: &str) -> bool {
    let mut stack = Vec::new();
    let mut in_str = false;
    let mut esc = false;
    for c in s.chars() {
        if in_str {
            match (esc, c) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' | '[' => stack.push(c),
            '}' | ']' => {
                stack.pop();
            }
            _ => {}
        }
    }
    stack.last() == Some(&'{')
}
