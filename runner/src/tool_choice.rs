//! `tool_choice` "required" or a named function: the reply is constrained
//! to one tool call in the model family's markup, with the arguments
//! following the tool's JSON schema (llguidance Lark with `%json`). Only
//! the families whose calls are JSON can be constrained this way.
use serde_json::{Value, json};

use crate::grammar::compact;
use crate::output::ToolFormat;

/// The schema of one call `{"name": NAME, ARGS: PARAMETERS}`.
fn call_schema(tool: &Value, args_key: &str) -> Option<(String, Value)> {
    let f = tool.get("function").unwrap_or(tool);
    let name = f.get("name")?.as_str()?.to_owned();
    let params = f
        .get("parameters")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}));
    let schema = json!({
        "type": "object",
        "properties": {"name": {"const": name}, args_key: params},
        "required": ["name", args_key],
        "additionalProperties": false,
    });
    Some((name, schema))
}

/// The Lark grammar of one call to `name` (or to any of `tools`) in
/// `format`'s markup.
pub fn grammar(
    format: Option<ToolFormat>,
    tools: &[Value],
    name: Option<&str>,
) -> Result<String, String> {
    let args_key = match format {
        Some(ToolFormat::Llama3) => "parameters",
        Some(ToolFormat::Hermes | ToolFormat::Mistral) => "arguments",
        Some(other) => {
            return Err(format!(
                "tool_choice that forces a call is supported for JSON tool calls (Qwen/Hermes, Llama 3, \
                 Mistral); this model writes {other:?} calls"
            ));
        }
        None => return Err("the model's chat template has no tool-call format Grove knows".into()),
    };
    let mut calls = Vec::new();
    for t in tools {
        let Some((n, schema)) = call_schema(t, args_key) else {
            return Err("every tool needs a function name".into());
        };
        if name.is_none_or(|want| want == n) {
            calls.push(schema);
        }
    }
    if calls.is_empty() {
        return Err(match name {
            Some(n) => format!("tool_choice names {n:?}, which is not among the tools"),
            None => "tool_choice requires a call, but the request has no tools".into(),
        });
    }
    let schema = compact(if calls.len() == 1 {
        calls.remove(0)
    } else {
        json!({"anyOf": calls})
    });
    let body = match format {
        Some(ToolFormat::Hermes) => "\"<tool_call>\\n\" call \"\\n</tool_call>\"",
        Some(ToolFormat::Mistral) => "\"[TOOL_CALLS]\" \"[\" call \"]\"",
        _ => "call",
    };
    Ok(format!("start: {body}\ncall: %json {schema}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammars_per_family() {
        let tools = [
            json!({"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}),
            json!({"type": "function", "function": {"name": "b"}}),
        ];
        let g = grammar(Some(ToolFormat::Hermes), &tools, Some("b")).unwrap();
        assert!(g.starts_with("start: \"<tool_call>\\n\" call"), "{g}");
        assert!(
            g.contains(r#""const":"b""#) && !g.contains(r#""const":"a""#),
            "{g}"
        );
        let g = grammar(Some(ToolFormat::Llama3), &tools, None).unwrap();
        assert!(g.contains("anyOf") && g.contains("parameters"), "{g}");
        assert!(grammar(Some(ToolFormat::Glm), &tools, None).is_err());
        assert!(grammar(Some(ToolFormat::Hermes), &tools, Some("c")).is_err());
        assert!(grammar(Some(ToolFormat::Hermes), &[], None).is_err());
    }
}
