//! A request's tool choice, whichever API named it (OpenAI chat's and
//! Responses' `auto`/`none`/`required`/a named function, Anthropic's
//! `auto`/`none`/`any`/`tool`): the tools offered as they are, left out of
//! the prompt, or one call forced through the output constraint.
use grove_proto::v1 as pb;

pub enum ToolChoice {
    Auto,
    None,
    /// A call to any of the tools.
    Any,
    /// A call to this tool.
    Named(String),
}

/// Whether the tools go into the prompt; a forced call becomes `constraint`
/// (it needs tools, and no other constraint: `format` names the request's
/// field for one, e.g. `response_format`).
pub fn apply(
    choice: ToolChoice,
    has_tools: bool,
    constraint: &mut Option<pb::Constraint>,
    format: &str,
) -> Result<bool, String> {
    let name = match choice {
        ToolChoice::Auto => return Ok(true),
        ToolChoice::None => return Ok(false),
        ToolChoice::Any => String::new(),
        ToolChoice::Named(name) => name,
    };
    if !has_tools {
        return Err("tool_choice forces a call, but there are no tools".into());
    }
    if constraint.is_some() {
        return Err(format!(
            "a forced tool call and {format} cannot be combined"
        ));
    }
    *constraint = Some(pb::Constraint {
        kind: Some(pb::constraint::Kind::ToolCall(pb::ToolCallConstraint {
            name,
        })),
    });
    Ok(true)
}
