//! Chat requests, prepared off the engine thread: the conversation is
//! rendered by the model's template in the sandbox process
//! ([`crate::chat_template::sandbox`]) and tokenized on a blocking-pool
//! thread, so the engine only ever sees token ids and a hostile template or
//! a huge prompt holds no one else up.
use std::sync::{Arc, OnceLock};

use crate::chat_template::sandbox::{RenderJob, Sandbox};
use crate::chat_template::{
    ChatRequest, ChatTemplate, Message, RENDER_BYTES_PER_TOKEN, Role, TemplateSpec,
};
use crate::detokenize::TokenTable;
use crate::error::{Result, RunnerError};
use crate::grammar::{Compiler, Constraint, Grammar};
use crate::tokenizer::Tokenizer;

/// What chat requests need of a loaded model.
pub struct ChatParts {
    pub tokenizer: Arc<Tokenizer>,
    /// The templates; `Err` says why the model has none that can render.
    pub templates: std::result::Result<TemplateSpec, String>,
    /// The engine's context length, in tokens.
    pub context: usize,
    /// Token bytes and the logits' width, for output constraints.
    table: Arc<TokenTable>,
    vocab: usize,
    /// Built by the first constrained request (a trie over the vocabulary).
    compiler: OnceLock<std::result::Result<Arc<Compiler>, String>>,
}

impl ChatParts {
    /// The text and bytes token `id` stands for: its bytes in decoded text
    /// where the tokenizer has them per token, else its decoding alone.
    pub fn token_text(&self, id: u32) -> (String, Vec<u8>) {
        let bytes = self.table.text_bytes(id).unwrap_or_else(|| {
            self.tokenizer
                .decode(&[id])
                .unwrap_or_default()
                .into_bytes()
        });
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }

    /// Reads the model's templates and checks that they parse (a template that
    /// does not parse fails every chat request with that error).
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        spec: Result<Option<TemplateSpec>>,
        context: usize,
        table: Arc<TokenTable>,
        vocab: usize,
    ) -> Self {
        let templates = match spec {
            Ok(Some(spec)) => ChatTemplate::from_spec(&spec, None)
                .map(|_| spec)
                .map_err(|e| e.to_string()),
            Ok(None) => Err("the model has no chat template; send a raw prompt instead".to_owned()),
            Err(e) => Err(e.to_string()),
        };
        Self {
            tokenizer,
            templates,
            context,
            table,
            vocab,
            compiler: OnceLock::new(),
        }
    }

    /// Compiles an output constraint (call off the engine thread: the first
    /// one builds the vocabulary's trie).
    pub fn compile(&self, constraint: &Constraint) -> std::result::Result<Grammar, String> {
        let compiler = self
            .compiler
            .get_or_init(|| Compiler::new(&self.tokenizer, &self.table, self.vocab).map(Arc::new));
        compiler.as_ref().map_err(Clone::clone)?.compile(constraint)
    }

    /// The most bytes a rendering may have.
    fn max_bytes(&self) -> usize {
        self.context.saturating_mul(RENDER_BYTES_PER_TOKEN)
    }

    fn spec(&self) -> Result<&TemplateSpec> {
        self.templates
            .as_ref()
            .map_err(|e| RunnerError::Request(e.clone()))
    }
}

/// Renders `request` with the template `name` in the sandbox.
pub async fn render(
    sandbox: &Sandbox,
    parts: &ChatParts,
    request: &ChatRequest,
    name: Option<&str>,
) -> Result<String> {
    let job = RenderJob {
        spec: parts.spec()?.clone(),
        name: name.map(str::to_owned),
        request: request.clone(),
        max_bytes: parts.max_bytes(),
    };
    sandbox.render(&job).await
}

/// Tokenizes text on the blocking pool, as transformers tokenizes a rendered
/// template: without adding special tokens (the template wrote them).
pub async fn tokenize(parts: &Arc<ChatParts>, text: String, add_special: bool) -> Result<Vec<u32>> {
    let parts = parts.clone();
    tokio::task::spawn_blocking(move || parts.tokenizer.encode(&text, add_special))
        .await
        .map_err(|e| RunnerError::Request(format!("tokenizing: {e}")))?
}

/// Tokenizes a raw prompt on the blocking pool, as mlx-lm does (BOS added
/// when the tokenizer adds one).
pub async fn encode_prompt(parts: &Arc<ChatParts>, text: String) -> Result<Vec<u32>> {
    let parts = parts.clone();
    tokio::task::spawn_blocking(move || parts.tokenizer.encode_prompt(&text))
        .await
        .map_err(|e| RunnerError::Request(format!("tokenizing: {e}")))?
}

/// The prompt ids of a chat request.
pub async fn prompt(
    sandbox: &Sandbox,
    parts: &Arc<ChatParts>,
    request: &ChatRequest,
    name: Option<&str>,
) -> Result<Vec<u32>> {
    let text = render(sandbox, parts, request, name).await?;
    tokenize(parts, text, false).await
}

/// The ids every conversation that starts with `chat`'s messages begins
/// with: `chat` is rendered twice with a different user message after it, and
/// the common prefix kept. (Rendering the system turn alone fails with
/// templates that require a user message, such as Qwen3's.)
pub async fn conversation_prefix(
    sandbox: &Sandbox,
    parts: &Arc<ChatParts>,
    chat: &ChatRequest,
) -> Result<Vec<u32>> {
    let with_user = |text: &str| {
        let mut req = chat.clone();
        req.messages.push(Message::new(Role::User, text));
        req.add_generation_prompt = false;
        req
    };
    let (first, second) = (with_user("\u{E000}"), with_user("\u{E001}"));
    let (a, b) = tokio::try_join!(
        render(sandbox, parts, &first, None),
        render(sandbox, parts, &second, None),
    )?;
    let common = a
        .char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((i, _), _)| i);
    let mut text = a;
    text.truncate(common);
    let ids = tokenize(parts, text, false).await?;
    if ids.is_empty() {
        return Err(RunnerError::Request(
            "the system prompt renders to nothing".into(),
        ));
    }
    Ok(ids)
}
