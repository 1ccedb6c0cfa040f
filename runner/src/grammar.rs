//! Structured output: a JSON schema (or any JSON object, a Lark grammar, a
//! regular expression) compiled by llguidance into a matcher that gives,
//! before every sampled token, the set of tokens that keep the output inside
//! the grammar. The sampler masks the rest (their logits to -inf), so the
//! text always parses; the grammar advances with each token read back.
//!
//! The token trie is built once per model from the tokenizer's own bytes
//! ([`TokenTable::text_bytes`]), over the model's whole logits width (ids
//! past the tokenizer's vocabulary are never allowed).
use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};

use crate::detokenize::TokenTable;
use crate::tokenizer::Tokenizer;

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object.
    JsonObject,
    /// JSON valid against this schema.
    JsonSchema(serde_json::Value),
    /// llguidance's Lark dialect (which can embed `%json{...}` schemas).
    Lark(String),
    /// A regular expression (Rust regex syntax) over the whole output.
    Regex(String),
    /// One call of the request's tools (the named one, or any) in the
    /// family's markup; made into a [`Constraint::Lark`] once the chat is
    /// known ([`crate::tool_choice`]).
    ToolCall(Option<String>),
}

/// Compiles constraints for one model; shared by its requests.
pub struct Compiler {
    factory: ParserFactory,
    vocab: usize,
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler")
            .field("vocab", &self.vocab)
            .finish()
    }
}

impl Compiler {
    /// The trie of `tokenizer`'s tokens (`table` gives their bytes) over
    /// `vocab` logits.
    pub fn new(tokenizer: &Tokenizer, table: &TokenTable, vocab: usize) -> Result<Self, String> {
        let inner = tokenizer.inner();
        let specials: std::collections::HashSet<u32> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        let known = inner.get_vocab_size(true).min(vocab);
        let mut words = Vec::with_capacity(vocab);
        for id in 0..vocab as u32 {
            let word = if (id as usize) >= known {
                None
            } else if specials.contains(&id) {
                inner.id_to_token(id).map(|name| {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(name.as_bytes());
                    w
                })
            } else {
                Some(table.text_bytes(id).ok_or_else(|| {
                    "structured output needs a byte-level BPE or SentencePiece tokenizer; this model's \
                     decodes token by token in a way Grove cannot map to bytes"
                        .to_owned()
                })?)
            };
            // Holes and ids past the tokenizer: a special name nothing matches.
            words.push(word.unwrap_or_else(|| {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(format!("<[{id}]>").as_bytes());
                w
            }));
        }
        let eos = tokenizer.eos_ids();
        let first = *eos
            .first()
            .ok_or("the model has no end-of-sequence token")?;
        let info = TokRxInfo::new(vocab as u32, first);
        let mut trie = TokTrie::from(&info, &words);
        if eos.len() > 1 {
            trie = trie.with_eos_tokens(eos);
        }
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.set_stderr_log_level(0);
        factory.set_buffer_log_level(0);
        Ok(Self { factory, vocab })
    }

    /// A fresh matcher for `constraint`; an unsupported schema feature or a
    /// malformed grammar is an error naming it.
    pub fn compile(&self, constraint: &Constraint) -> Result<Grammar, String> {
        let grammar = match constraint {
            Constraint::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            Constraint::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(compact(schema.clone()))
            }
            Constraint::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Constraint::ToolCall(_) => {
                return Err("a tool-call constraint needs the chat's tools".into());
            }
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| format!("the output constraint cannot be used: {e}"))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(format!("the output constraint cannot be used: {e}"));
        }
        Ok(Grammar {
            matcher,
            vocab: self.vocab,
            spent: Duration::ZERO,
            steps: 0,
        })
    }
}

/// JSON written as `json.dumps` writes it (`{"a": 1, "b": [2, 3]}`), unless
/// the schema sets llguidance's own `x-guidance` options: free whitespace
/// would let a model pad forever without breaking the grammar.
pub fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut()
        && !o.contains_key("x-guidance")
    {
        o.insert(
            "x-guidance".into(),
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// One request's matcher.
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
    vocab: usize,
    /// Time spent computing masks and advancing, and how many masks.
    spent: Duration,
    steps: u32,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("steps", &self.steps)
            .field("spent", &self.spent)
            .finish()
    }
}

impl Grammar {
    /// Advances past a sampled token.
    pub fn consume(&mut self, token: u32) -> Result<(), String> {
        let t = Instant::now();
        let r = self.matcher.consume_token(token).map_err(|e| e.to_string());
        self.spent += t.elapsed();
        r
    }

    /// The additive mask for the next token: 0 where allowed, -inf elsewhere,
    /// one value per logit. Once the grammar is complete only end of
    /// sequence is allowed.
    pub fn mask(&mut self) -> Result<Vec<f32>, String> {
        let t = Instant::now();
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        let mut row = vec![f32::NEG_INFINITY; self.vocab];
        allowed.iter_set_entries(|i| {
            if let Some(v) = row.get_mut(i) {
                *v = 0.0;
            }
        });
        self.spent += t.elapsed();
        self.steps += 1;
        Ok(row)
    }

    /// The logits' width.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Time spent on the grammar so far.
    pub fn spent(&self) -> Duration {
        self.spent
    }

    /// Masks computed so far.
    pub fn steps(&self) -> u32 {
        self.steps
    }
}
