//! gpt-oss replies in OpenAI's Harmony format, split as [`crate::output`]
//! splits marker-delimited families: a reply is a run of messages
//! `<|channel|>NAME[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY<|end|>`,
//! each after the first opened by `<|start|>assistant`. The `analysis`
//! channel is reasoning, `final` (and `commentary` without a recipient) is
//! content, and `commentary to=functions.NAME` is a call of NAME with BODY as
//! its JSON arguments (ended by `<|call|>`, which stops generation, so the
//! call ends with the reply). Streamed: a body's text goes out as it comes,
//! holding back only what may still be the marker that ends it.
use crate::output::{Ending, Piece, Splitter, held_back};
use crate::tool_args::{Call, new_call_id};

const MESSAGE: &str = "<|message|>";
const START: &str = "<|start|>";
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];

/// Whether a chat template writes Harmony.
pub fn is_harmony(template: &str) -> bool {
    template.contains("<|channel|>") && template.contains("<|message|>")
}

#[derive(Debug, Clone, PartialEq)]
enum Route {
    Thinking,
    Content,
    Call(String),
}

#[derive(Debug)]
enum State {
    /// Reading a header, up to `<|message|>`.
    Header,
    /// Inside a body going to `Route`.
    Body(Route),
}

/// The streaming splitter of one Harmony reply.
pub struct HarmonyParser {
    state: State,
    buf: String,
    calls: usize,
    malformed: bool,
}

impl Default for HarmonyParser {
    fn default() -> Self {
        Self::new()
    }
}

impl Splitter for HarmonyParser {
    fn push(&mut self, text: &str) -> Vec<Piece> {
        HarmonyParser::push(self, text)
    }

    fn finish(self: Box<Self>) -> (Vec<Piece>, Ending) {
        HarmonyParser::finish(*self)
    }
}

/// Where a header sends its body.
fn route(header: &str) -> Route {
    let channel = header
        .split("<|channel|>")
        .nth(1)
        .map(|c| c.split(['<', ' ']).next().unwrap_or("").trim())
        .unwrap_or("");
    let recipient = header
        .split_whitespace()
        .find_map(|w| w.strip_prefix("to="))
        .map(|r| r.split('<').next().unwrap_or(r).to_owned());
    match (channel, recipient) {
        (_, Some(r)) => Route::Call(r.strip_prefix("functions.").unwrap_or(&r).to_owned()),
        ("analysis", None) => Route::Thinking,
        _ => Route::Content,
    }
}

impl HarmonyParser {
    pub fn new() -> Self {
        Self {
            state: State::Header,
            buf: String::new(),
            calls: 0,
            malformed: false,
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    pub fn finish(mut self) -> (Vec<Piece>, Ending) {
        let mut out = Vec::new();
        while self.step(&mut out) {}
        let rest = std::mem::take(&mut self.buf);
        match std::mem::replace(&mut self.state, State::Header) {
            // A call's body runs to `<|call|>`, which ends generation.
            State::Body(Route::Call(name)) => self.call(&name, &rest, &mut out),
            State::Body(route) => self.text(&route, rest, &mut out),
            State::Header if !rest.trim().is_empty() => {
                // Text outside any message: the model did not write Harmony.
                out.push(Piece::Content(rest));
            }
            State::Header => {}
        }
        let ending = Ending {
            tool_calls: self.calls,
            malformed: self.malformed,
        };
        (out, ending)
    }

    fn text(&self, route: &Route, text: String, out: &mut Vec<Piece>) {
        if text.is_empty() {
            return;
        }
        out.push(match route {
            Route::Thinking => Piece::Thinking(text),
            _ => Piece::Content(text),
        });
    }

    fn call(&mut self, name: &str, body: &str, out: &mut Vec<Piece>) {
        match serde_json::from_str::<serde_json::Value>(body.trim()) {
            Ok(serde_json::Value::Object(args)) if !name.is_empty() => {
                self.calls += 1;
                out.push(Piece::ToolCall(Call {
                    id: new_call_id(),
                    name: name.to_owned(),
                    arguments_json: serde_json::Value::Object(args).to_string(),
                }));
            }
            _ => {
                self.malformed = true;
                out.push(Piece::Content(format!(
                    "to=functions.{name}{MESSAGE}{body}"
                )));
            }
        }
    }

    /// One move; false when more text is needed.
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match &self.state {
            State::Header => {
                // A reply that does not open a message is plain content.
                let opens = ["<|channel|>", "assistant", START]
                    .iter()
                    .any(|m| self.buf.starts_with(m) || m.starts_with(self.buf.as_str()));
                if !opens {
                    self.state = State::Body(Route::Content);
                    return true;
                }
                let Some(i) = self.buf.find(MESSAGE) else {
                    return false;
                };
                let header: String = self.buf.drain(..i + MESSAGE.len()).collect();
                self.state = State::Body(route(&header[..i]));
                true
            }
            State::Body(route) => {
                let route = route.clone();
                let found = ENDS
                    .iter()
                    .chain([&START])
                    .filter_map(|m| self.buf.find(m).map(|i| (i, m.len())))
                    .min();
                match found {
                    Some((i, len)) => {
                        let body: String = self.buf.drain(..i).collect();
                        self.buf.drain(..len);
                        match &route {
                            Route::Call(name) => self.call(name, &body, out),
                            r => self.text(r, body, out),
                        }
                        // The next message's `<|start|>assistant` is header.
                        self.state = State::Header;
                        true
                    }
                    None if matches!(route, Route::Call(_)) => false,
                    None => {
                        let keep = held_back(&self.buf, &[ENDS[0], ENDS[1], ENDS[2], START]);
                        let ready: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.text(&route, ready, out);
                        false
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str, n: usize) -> (Vec<Piece>, Ending) {
        let (pieces, ending) = crate::output::feed(Box::new(HarmonyParser::new()), text, n);
        let pieces = pieces
            .into_iter()
            .map(|p| match p {
                Piece::ToolCall(c) => Piece::ToolCall(Call {
                    id: String::new(),
                    ..c
                }),
                p => p,
            })
            .collect();
        (pieces, ending)
    }

    #[test]
    fn reasoning_content_and_calls() {
        let text = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
        for n in [1, 2, 3, 7, text.len()] {
            let (p, e) = run(text, n);
            assert_eq!(
                p,
                vec![
                    Piece::Thinking("Need weather.".into()),
                    Piece::ToolCall(Call {
                        id: String::new(),
                        name: "get_weather".into(),
                        arguments_json: r#"{"city":"Paris"}"#.into()
                    }),
                ],
                "{n}"
            );
            assert_eq!(
                e,
                Ending {
                    tool_calls: 1,
                    malformed: false
                }
            );
        }
        let text = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is <b>4</b>.";
        for n in [1, 4, text.len()] {
            let (p, _) = run(text, n);
            assert_eq!(
                p,
                vec![
                    Piece::Thinking("Easy.".into()),
                    Piece::Content("It is <b>4</b>.".into())
                ]
            );
        }
    }

    #[test]
    fn recipient_before_the_channel_and_bad_arguments() {
        let (p, e) = run(
            "<|channel|>commentary to=functions.f<|channel|>commentary json<|message|>{oops",
            3,
        );
        assert_eq!(
            p,
            vec![Piece::Content("to=functions.f<|message|>{oops".into())]
        );
        assert!(e.malformed);
        let (p, _) = run("plain text, no harmony", 4);
        assert_eq!(p, vec![Piece::Content("plain text, no harmony".into())]);
    }
}
