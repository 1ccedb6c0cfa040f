//! What a chat request holds: the conversation, tools and template variables,
//! serializable so that it can be rendered in another process.
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::{Result, RunnerError};

/// Who wrote a message; rendered as `"system"`, `"user"`, `"assistant"`, `"tool"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    /// Always passed to the template (mlx-lm turns a missing content into "").
    pub content: String,
    /// Only on assistant messages; omitted from the template's dict when empty.
    pub tool_calls: Vec<ToolCall>,
    /// On tool messages: the call answered.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// On assistant messages: the reasoning of that turn, for templates that
    /// read `message.reasoning_content` (Qwen3's); omitted when None.
    #[serde(default)]
    pub reasoning_content: Option<String>,
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
            reasoning_content: None,
        }
    }
}

/// How much a reasoning model thinks (OpenAI's `reasoning_effort`, ollama's
/// `think` levels), given to the template through its own variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningEffort {
    None,
    Minimal,
    Low,
    Medium,
    High,
}

impl ReasoningEffort {
    /// As the request spelled it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Minimal => "minimal",
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
        }
    }

    /// The level a `reasoning_effort` template variable takes (gpt-oss's
    /// template knows low, medium and high; it always reasons).
    pub fn level(self) -> Option<&'static str> {
        matches!(self, Self::Low | Self::Medium | Self::High).then(|| self.as_str())
    }

    /// For an on/off switch (`enable_thinking`): none and minimal are off.
    pub fn thinks(self) -> bool {
        !matches!(self, Self::None | Self::Minimal)
    }
}

/// What to render.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    /// JSON-schema tool definitions, passed as given; empty renders as `tools = none`.
    pub tools: Vec<Json>,
    /// Ends the prompt with the header of an assistant turn.
    pub add_generation_prompt: bool,
    /// Further template variables (`enable_thinking`, `date_string`, ...); they
    /// override the special tokens.
    pub extra: serde_json::Map<String, Json>,
    /// Set through the template's `reasoning_effort` or `enable_thinking`
    /// variable, whichever it reads; refused if it reads neither.
    #[serde(default)]
    pub reasoning_effort: Option<ReasoningEffort>,
}
