//! A chat reply's text split the way the model's chat template marks it:
//! reasoning (`<think>`…`</think>`), tool calls in the family's markup, and
//! content. Streamed: text is passed on as soon as it can no longer become a
//! marker, so markup never leaks into content. The formats and how they are
//! recognised follow mlx-lm's tool parsers (`mlx_lm/tool_parsers`, chosen from
//! the template as `tokenizer_utils._infer_tool_parser` does), plus Llama 3's
//! JSON calls. The argument syntaxes are in [`crate::tool_args`].
use crate::tool_args::{self, Call, ToolSchemas};

/// How a family writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Qwen 2.5/3, Hermes: `<tool_call>{"name":…,"arguments":…}</tool_call>`.
    Hermes,
    /// Qwen3-Coder, Qwen 3.5: `<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>`.
    QwenXml,
    /// GLM 4.5-4.7: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`.
    Glm,
    /// Mistral: `[TOOL_CALLS]` then a JSON list or `NAME[ARGS]{…}`, to the end.
    Mistral,
    /// Llama 3.1-3.3: the whole reply is `{"name":…,"parameters":…}`, maybe
    /// after `<|python_tag|>`.
    Llama3,
    /// Gemma 4: `<|tool_call>call:NAME{k:<|"|>v<|"|>}<tool_call|>`.
    Gemma4,
    /// FunctionGemma: `<start_function_call>call:NAME{k:<escape>v<escape>}<end_function_call>`.
    FunctionGemma,
}

impl ToolFormat {
    /// The family's format, from its chat template (mlx-lm's rules, in its order).
    pub fn detect(template: &str) -> Option<Self> {
        let has = |s: &str| template.contains(s);
        if has("<|tool_call>") && has("<tool_call|>") {
            Some(Self::Gemma4)
        } else if has("<start_function_call>") {
            Some(Self::FunctionGemma)
        } else if has("<arg_key>") {
            Some(Self::Glm)
        } else if has("<tool_call>\\n<function=") || has("<tool_call>\n<function=") {
            Some(Self::QwenXml)
        } else if has("[TOOL_CALLS]") {
            Some(Self::Mistral)
        } else if has("<tool_call>") {
            Some(Self::Hermes)
        } else if has("<|python_tag|>") || has("\"parameters\": dictionary of argument name") {
            Some(Self::Llama3)
        } else {
            None
        }
    }

    /// The text that opens a call, and the one that closes it (None: the call
    /// runs to the end of the reply).
    fn markers(self) -> (&'static str, Option<&'static str>) {
        match self {
            Self::Hermes | Self::QwenXml | Self::Glm => ("<tool_call>", Some("</tool_call>")),
            Self::Mistral => ("[TOOL_CALLS]", None),
            Self::Llama3 => ("<|python_tag|>", None),
            Self::Gemma4 => ("<|tool_call>", Some("<tool_call|>")),
            Self::FunctionGemma => ("<start_function_call>", Some("<end_function_call>")),
        }
    }

    fn parse(self, body: &str, tools: &ToolSchemas) -> Option<Vec<Call>> {
        match self {
            Self::Hermes | Self::Llama3 => tool_args::json_calls(body),
            Self::Mistral => tool_args::mistral_calls(body),
            Self::QwenXml => tool_args::qwen_xml_call(body, tools).map(|c| vec![c]),
            Self::Glm => tool_args::glm_call(body, tools).map(|c| vec![c]),
            Self::Gemma4 => tool_args::gemma_calls(body, "<|\"|>"),
            Self::FunctionGemma => tool_args::gemma_calls(body, "<escape>"),
        }
    }
}

/// What a reply's text is made of.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Content(String),
    Thinking(String),
    ToolCall(Call),
}

/// How the reply's text is to be split.
#[derive(Debug, Clone, Default)]
pub struct OutputFormat {
    /// The reasoning block's markers.
    pub think: Option<(String, String)>,
    /// Tool-call markup to parse (None when the request has no tools).
    pub tools: Option<ToolFormat>,
    /// The request's tools, for the argument types of XML-style calls.
    pub schemas: ToolSchemas,
    /// The prompt ends inside a reasoning block (the template opened it).
    pub starts_thinking: bool,
}

/// The reasoning markers a vocabulary has, as mlx-lm's `_infer_thinking`.
pub fn think_markers(has_token: impl Fn(&str) -> bool) -> Option<(String, String)> {
    const PAIRS: [(&str, &str); 3] = [
        ("<think>", "</think>"),
        ("<longcat_think>", "</longcat_think>"),
        ("<|think:start|>", "<|think:end|>"),
    ];
    for (a, b) in PAIRS {
        if has_token(a) && has_token(b) {
            return Some((a.to_owned(), b.to_owned()));
        }
    }
    if has_token("<|channel>") && has_token("<channel|>") {
        return Some(("<|channel>thought".to_owned(), "<channel|>".to_owned()));
    }
    None
}

/// Whether `prompt_tail` (the end of a rendered prompt) leaves a reasoning
/// block open, so the reply starts inside it.
pub fn ends_in_thinking(prompt_tail: &str, think: &(String, String)) -> bool {
    match (prompt_tail.rfind(&think.0), prompt_tail.rfind(&think.1)) {
        (Some(open), Some(close)) => open > close,
        (Some(_), None) => true,
        _ => false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Llama 3 only: nothing but whitespace yet; a call may still start.
    Start,
    Content,
    Thinking,
    /// Inside a call's markup.
    Tool,
}

/// The streaming splitter of one reply.
pub struct OutputParser {
    format: OutputFormat,
    state: State,
    buf: String,
    /// Whitespace between pieces, held until content follows (dropped when
    /// only tool calls follow it).
    gap: String,
    /// Content right after a reasoning block starts without its blank lines.
    trim_content: bool,
    calls: usize,
    malformed: bool,
}

/// How a finished reply ended, as the parser saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ending {
    pub tool_calls: usize,
    /// Tool-call markup that did not parse was returned as content.
    pub malformed: bool,
}

impl OutputParser {
    pub fn new(format: OutputFormat) -> Self {
        let state = if format.starts_thinking && format.think.is_some() {
            State::Thinking
        } else if format.tools == Some(ToolFormat::Llama3) {
            State::Start
        } else {
            State::Content
        };
        Self {
            format,
            state,
            buf: String::new(),
            gap: String::new(),
            trim_content: false,
            calls: 0,
            malformed: false,
        }
    }

    /// Takes the next piece of text; returns what is now known.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// The reply ended: everything held back, and how it ended.
    pub fn finish(mut self) -> (Vec<Piece>, Ending) {
        let mut out = Vec::new();
        while self.step(&mut out) {}
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Tool => {
                let (open, close) = self.tool_format().markers();
                let parsed = match close {
                    None => self.tool_format().parse(&rest, &self.format.schemas),
                    Some(_) => None, // cut off before its end
                };
                match parsed {
                    Some(calls) => self.emit_calls(calls, &mut out),
                    None => {
                        self.malformed = true;
                        let raw = if self.tool_format() == ToolFormat::Llama3 {
                            rest
                        } else {
                            format!("{open}{rest}")
                        };
                        self.content(&raw, &mut out);
                    }
                }
            }
            State::Thinking if !rest.is_empty() => out.push(Piece::Thinking(rest)),
            _ => self.content(&rest, &mut out),
        }
        if self.calls == 0 && !self.gap.is_empty() {
            out.push(Piece::Content(std::mem::take(&mut self.gap)));
        }
        let ending = Ending {
            tool_calls: self.calls,
            malformed: self.malformed,
        };
        (out, ending)
    }

    fn tool_format(&self) -> ToolFormat {
        self.format.tools.unwrap_or(ToolFormat::Hermes)
    }

    /// One move of the state machine; false when it needs more text.
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match self.state {
            State::Start => {
                let t = self.buf.trim_start();
                if t.is_empty() {
                    return false;
                }
                let tag = ToolFormat::Llama3.markers().0;
                if let Some(rest) = t.strip_prefix(tag) {
                    self.buf = rest.to_owned();
                    self.state = State::Tool;
                } else if t.starts_with('{') {
                    self.buf = t.to_owned();
                    self.state = State::Tool;
                } else if tag.starts_with(t) {
                    return false;
                } else {
                    self.state = State::Content;
                }
                true
            }
            State::Content | State::Thinking => {
                let markers = self.markers();
                let found = markers
                    .iter()
                    .filter_map(|m| self.buf.find(m.as_str()).map(|i| (i, m.clone())))
                    .min_by_key(|(i, _)| *i);
                match found {
                    Some((i, marker)) => {
                        let before: String = self.buf.drain(..i + marker.len()).collect();
                        self.text(&before[..i], out);
                        self.state = self.after(&marker);
                        true
                    }
                    None => {
                        let keep = held_back(&self.buf, &markers);
                        let ready: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.text(&ready, out);
                        false
                    }
                }
            }
            State::Tool => {
                let (open, close) = self.tool_format().markers();
                let Some(close) = close else { return false };
                let Some(i) = self.buf.find(close) else {
                    return false;
                };
                let body: String = self.buf.drain(..i + close.len()).collect();
                let body = &body[..i];
                match self.tool_format().parse(body, &self.format.schemas) {
                    Some(calls) => self.emit_calls(calls, out),
                    None => {
                        self.malformed = true;
                        self.content(&format!("{open}{body}{close}"), out);
                    }
                }
                self.state = State::Content;
                true
            }
        }
    }

    /// The markers that can change the state from here.
    fn markers(&self) -> Vec<String> {
        let mut m = Vec::new();
        match self.state {
            State::Thinking => {
                if let Some((_, close)) = &self.format.think {
                    m.push(close.clone());
                }
            }
            _ => {
                if let Some((open, _)) = &self.format.think {
                    m.push(open.clone());
                }
                if let Some(f) = self.format.tools
                    && f != ToolFormat::Llama3
                {
                    m.push(f.markers().0.to_owned());
                }
            }
        }
        m
    }

    fn after(&mut self, marker: &str) -> State {
        match (&self.format.think, self.state) {
            (Some((_, close)), State::Thinking) if close == marker => {
                self.trim_content = true;
                State::Content
            }
            (Some((open, _)), _) if open == marker => State::Thinking,
            _ => State::Tool,
        }
    }

    fn text(&mut self, text: &str, out: &mut Vec<Piece>) {
        if self.state == State::Thinking {
            if !text.is_empty() {
                out.push(Piece::Thinking(text.to_owned()));
            }
        } else {
            self.content(text, out);
        }
    }

    fn content(&mut self, text: &str, out: &mut Vec<Piece>) {
        let text = if self.trim_content {
            let t = text.trim_start();
            if !t.is_empty() {
                self.trim_content = false;
            }
            t
        } else {
            text
        };
        // Trailing whitespace waits for what follows it: more content gets
        // it, tool calls drop it.
        let body = text.trim_end();
        if body.is_empty() {
            self.gap.push_str(text);
            return;
        }
        let mut s = std::mem::take(&mut self.gap);
        s.push_str(body);
        out.push(Piece::Content(s));
        self.gap.push_str(&text[body.len()..]);
    }

    fn emit_calls(&mut self, calls: Vec<Call>, out: &mut Vec<Piece>) {
        self.gap.clear();
        for c in calls {
            self.calls += 1;
            out.push(Piece::ToolCall(c));
        }
    }
}

/// A streaming splitter of one reply: this module's marker-based one, or
/// [`crate::harmony`]'s.
pub trait Splitter: Send {
    /// Takes the next piece of text; returns what is now known.
    fn push(&mut self, text: &str) -> Vec<Piece>;
    /// The reply ended: everything held back, and how it ended.
    fn finish(self: Box<Self>) -> (Vec<Piece>, Ending);
}

impl Splitter for OutputParser {
    fn push(&mut self, text: &str) -> Vec<Piece> {
        OutputParser::push(self, text)
    }

    fn finish(self: Box<Self>) -> (Vec<Piece>, Ending) {
        OutputParser::finish(*self)
    }
}

/// Feeds `text` to `p` in pieces of `n` bytes (on char boundaries) and
/// merges neighbouring pieces of one kind.
#[cfg(test)]
pub(crate) fn feed(mut p: Box<dyn Splitter>, text: &str, n: usize) -> (Vec<Piece>, Ending) {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let mut j = (i + n).min(text.len());
        while !text.is_char_boundary(j) {
            j += 1;
        }
        out.extend(p.push(&text[i..j]));
        i = j;
    }
    let (rest, ending) = p.finish();
    out.extend(rest);
    let mut merged: Vec<Piece> = Vec::new();
    for piece in out {
        match (merged.last_mut(), piece) {
            (Some(Piece::Content(a)), Piece::Content(b)) => a.push_str(&b),
            (Some(Piece::Thinking(a)), Piece::Thinking(b)) => a.push_str(&b),
            (_, p) => merged.push(p),
        }
    }
    (merged, ending)
}

/// How many bytes at the end of `buf` could be the start of a marker.
pub(crate) fn held_back<S: AsRef<str>>(buf: &str, markers: &[S]) -> usize {
    let mut keep = 0;
    for m in markers {
        let m = m.as_ref();
        for k in (1..m.len().min(buf.len() + 1)).rev() {
            if buf.is_char_boundary(buf.len() - k)
                && m.is_char_boundary(k)
                && buf.ends_with(&m[..k])
            {
                keep = keep.max(k);
                break;
            }
        }
    }
    keep
}

#[cfg(test)]
#[path = "output_tests.rs"]
mod tests;
