//! Streaming detokenization: token ids in, text pieces out, exactly as mlx-lm
//! streams them.
//!
//! mlx-lm 0.32.2 (`mlx_lm/tokenizer_utils.py`) picks a streaming detokenizer
//! from tokenizer.json's `decoder`, and [`Detokenizer`] makes the same choice
//! ([`DetokenizerKind`]) and follows the same rules, so the concatenated pieces
//! (after [`Detokenizer::finish`]) equal mlx-lm's `detokenizer.text` after
//! `finalize()`:
//!
//! - **BPE** (`ByteLevel` decoder; Llama 3, Qwen). Each token string is mapped
//!   back to bytes through GPT-2's byte alphabet; characters outside it are
//!   kept as UTF-8. Like mlx-lm, the character for byte 0 (`Ā`) is kept as the
//!   text `Ā` while tokens are added (mlx-lm tests the byte for truthiness) but
//!   becomes a NUL byte in text that is still held at the end. Ids past the
//!   vocabulary decode as `!` (mlx-lm's padded-vocabulary fallback). Text is
//!   held while its decoding ends in U+FFFD (an incomplete character) or the
//!   last token is the single-space token.
//! - **SPM** (`Replace(▁→space)`, `ByteFallback`, `Fuse`, optional `Strip`;
//!   Llama 2, Mistral). `<0xNN>` tokens are the byte NN, other tokens their
//!   UTF-8; `▁` becomes a space after the bytes are joined (so a `▁` spelled in
//!   byte tokens does too). Text is held while its decoding ends in U+FFFD.
//! - **Naive** (any other decoder): the current line is re-decoded with the
//!   tokenizer on every token; trailing U+FFFD (and, for tokenizers that clean
//!   up spaces, one trailing space) are held back, and a line is committed once
//!   it ends in a newline. This is mlx-lm's O(line²) fallback; BPE and SPM are
//!   O(1) amortised per token.
//!
//! Held text is decoded with Python's `errors="replace"` rules (each maximal
//! invalid subsequence becomes one U+FFFD), so an incomplete character left at
//! the end comes out as U+FFFD from [`Detokenizer::finish`]. BPE, and SPM
//! with `Strip`, drop one leading space from the first flushed text while the
//! text so far is empty, which is how mlx-lm trims the first token's space.
//!
//! Pieces are always whole characters. Text mlx-lm holds only to decide a
//! later flush (e.g. after a single-space token) is emitted as soon as it can
//! no longer change.
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::tokenizer::Tokenizer;

/// Which of mlx-lm's streaming detokenizers a tokenizer gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DetokenizerKind {
    /// `BPEStreamingDetokenizer`: byte-level BPE.
    Bpe,
    /// `SPMStreamingDetokenizer`; `trim_space` when the decoder ends in `Strip`.
    Spm { trim_space: bool },
    /// `NaiveStreamingDetokenizer`: re-decodes the current line.
    Naive,
}

impl DetokenizerKind {
    /// The kind mlx-lm picks for a tokenizer.json `decoder` (as JSON).
    pub fn for_decoder(decoder: Option<&Value>) -> Self {
        let Some(decoder) = decoder else {
            return Self::Naive;
        };
        let mut spm = vec![
            json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
            json!({"type": "ByteFallback"}),
            json!({"type": "Fuse"}),
        ];
        let no_strip = json!({"type": "Sequence", "decoders": spm.clone()});
        spm.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        let strip = json!({"type": "Sequence", "decoders": spm});
        if *decoder == strip {
            Self::Spm { trim_space: true }
        } else if *decoder == no_strip {
            Self::Spm { trim_space: false }
        } else if decoder.get("type").and_then(Value::as_str) == Some("ByteLevel") {
            Self::Bpe
        } else {
            Self::Naive
        }
    }

    /// Whether the first flushed text loses a leading space.
    fn trims_first_space(self) -> bool {
        matches!(self, Self::Bpe | Self::Spm { trim_space: true })
    }
}

/// The byte each character of GPT-2's byte alphabet stands for, indexed by
/// code point (the alphabet lies in U+0021..U+0143).
fn gpt2_byte_table() -> [Option<u8>; 0x144] {
    let printable = |b: u8| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut table = [None; 0x144];
    let mut next = 0x100;
    for b in 0..=255u8 {
        if printable(b) {
            table[usize::from(b)] = Some(b);
        } else {
            table[next] = Some(b);
            next += 1;
        }
    }
    table
}

const SINGLE_SPACE: u8 = 1;
const HAS_NUL: u8 = 2;

/// Per-id data for streaming detokenization, built once per tokenizer
/// (O(vocabulary)) and shared by [`Detokenizer`]s through an [`Arc`].
pub struct TokenTable {
    kind: DetokenizerKind,
    /// The bytes of every id, concatenated; id `i` is `bytes[ends[i-1]..ends[i]]`.
    /// BPE: as mlx-lm decodes while adding tokens (`Ā` kept as UTF-8).
    bytes: Vec<u8>,
    ends: Vec<usize>,
    /// [`SINGLE_SPACE`] and [`HAS_NUL`] bits per id.
    flags: Vec<u8>,
    /// BPE ids containing `Ā`: their bytes as mlx-lm's `finalize` decodes them.
    final_bytes: HashMap<u32, Box<[u8]>>,
    /// Naive only: the tokenizer that decodes each line, and whether it
    /// cleans up spaces (mlx-lm's `"a ,b"` probe).
    naive: Option<(tokenizers::Tokenizer, bool)>,
}

impl TokenTable {
    /// Builds the table for `tok`, choosing the kind from its decoder.
    pub fn new(tok: &Tokenizer) -> Self {
        let inner = tok.inner();
        let decoder = inner
            .get_decoder()
            .and_then(|d| serde_json::to_value(d).ok());
        Self::with_kind(inner, DetokenizerKind::for_decoder(decoder.as_ref()))
    }

    /// Builds the table for `inner` with a given kind.
    fn with_kind(inner: &tokenizers::Tokenizer, kind: DetokenizerKind) -> Self {
        // mlx-lm maps `range(len(tokenizer))`: the vocabulary with added tokens.
        let n = inner.get_vocab_size(true);
        let mut table = Self {
            kind,
            bytes: Vec::new(),
            ends: Vec::with_capacity(n),
            flags: vec![0; n],
            final_bytes: HashMap::new(),
            naive: None,
        };
        let gpt2 = gpt2_byte_table();
        let byte_of = |c: char| gpt2.get(c as usize).copied().flatten();
        for id in 0..n {
            // An id without a token (a hole in the vocabulary) decodes to nothing;
            // mlx-lm would fail on it.
            let token = u32::try_from(id).ok().and_then(|id| inner.id_to_token(id));
            let token = token.as_deref().unwrap_or("");
            match kind {
                DetokenizerKind::Bpe => {
                    let mut fin = Vec::new();
                    for c in token.chars() {
                        let mut utf8 = [0; 4];
                        let utf8 = c.encode_utf8(&mut utf8).as_bytes();
                        match byte_of(c) {
                            Some(0) => {
                                table.bytes.extend_from_slice(utf8);
                                fin.push(0);
                                table.flags[id] |= HAS_NUL;
                            }
                            Some(b) => {
                                table.bytes.push(b);
                                fin.push(b);
                            }
                            // Not in the alphabet: kept as UTF-8 (mlx-lm's
                            // `finalize` would raise KeyError instead).
                            None => {
                                table.bytes.extend_from_slice(utf8);
                                fin.extend_from_slice(utf8);
                            }
                        }
                    }
                    let mut chars = token.chars();
                    if let (Some(c), None) = (chars.next(), chars.next())
                        && byte_of(c) == Some(b' ')
                    {
                        table.flags[id] |= SINGLE_SPACE;
                    }
                    if table.flags[id] & HAS_NUL != 0 {
                        table.final_bytes.insert(id as u32, fin.into_boxed_slice());
                    }
                }
                DetokenizerKind::Spm { .. } => match spm_byte(token) {
                    Some(b) => table.bytes.push(b),
                    None => table.bytes.extend_from_slice(token.as_bytes()),
                },
                DetokenizerKind::Naive => {}
            }
            table.ends.push(table.bytes.len());
        }
        if kind == DetokenizerKind::Naive {
            let probe = inner
                .encode("a ,b", false)
                .ok()
                .and_then(|e| inner.decode(e.get_ids(), false).ok());
            let clean_spaces = probe.is_some_and(|text| !text.contains(" ,"));
            table.naive = Some((inner.clone(), clean_spaces));
        }
        table
    }

    /// The kind of detokenizer this table drives.
    pub fn kind(&self) -> DetokenizerKind {
        self.kind
    }

    /// The bytes of `id` as decoded while adding tokens.
    fn bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match self.ends.get(i) {
            Some(&end) => &self.bytes[if i == 0 { 0 } else { self.ends[i - 1] }..end],
            None if self.kind == DetokenizerKind::Bpe => b"!",
            // mlx-lm would raise IndexError.
            None => b"",
        }
    }

    /// The bytes `id` stands for in decoded text (what a grammar matches),
    /// or None when this kind of tokenizer has no per-token bytes (Naive).
    pub fn text_bytes(&self, id: u32) -> Option<Vec<u8>> {
        match self.kind {
            DetokenizerKind::Bpe => Some(self.final_bytes(id).to_vec()),
            DetokenizerKind::Spm { .. } => {
                let raw = self.bytes(id);
                let mut out = Vec::with_capacity(raw.len());
                let mut i = 0;
                while i < raw.len() {
                    if raw[i..].starts_with("\u{2581}".as_bytes()) {
                        out.push(b' ');
                        i += 3;
                    } else {
                        out.push(raw[i]);
                        i += 1;
                    }
                }
                Some(out)
            }
            DetokenizerKind::Naive => None,
        }
    }

    /// The bytes of `id` as decoded at `finalize`.
    fn final_bytes(&self, id: u32) -> &[u8] {
        match self.final_bytes.get(&id) {
            Some(b) => b,
            None => self.bytes(id),
        }
    }

    fn flag(&self, id: u32, flag: u8) -> bool {
        self.flags.get(id as usize).is_some_and(|f| f & flag != 0)
    }
}

/// The byte a SentencePiece byte-fallback token stands for: mlx-lm reads
/// `int(token[3:5], 16)` for every token starting with `<0x`.
fn spm_byte(token: &str) -> Option<u8> {
    let digits = token.strip_prefix("<0x")?;
    let end = digits
        .char_indices()
        .nth(2)
        .map_or(digits.len(), |(i, _)| i);
    let digits = &digits[..end];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u8::from_str_radix(digits, 16).ok()
}

/// Incremental UTF-8 decoding with Python's `errors="replace"` rules; an
/// incomplete character at the end waits for more bytes.
#[derive(Clone, Default)]
struct Utf8Stream {
    pending: Vec<u8>,
    /// Whether the last character decoded is U+FFFD.
    ends_with_fffd: bool,
    scratch: Vec<u8>,
}

impl Utf8Stream {
    /// Decodes `bytes` after the pending ones into `out`; `metaspace` turns `▁`
    /// into a space.
    fn feed(&mut self, bytes: &[u8], metaspace: bool, out: &mut String) {
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        buf.append(&mut self.pending);
        buf.extend_from_slice(bytes);
        let mut rest = &buf[..];
        while !rest.is_empty() {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    self.push(s, metaspace, out);
                    rest = &[];
                }
                Err(e) => {
                    let (valid, bad) = rest.split_at(e.valid_up_to());
                    if let Ok(s) = std::str::from_utf8(valid) {
                        self.push(s, metaspace, out);
                    }
                    match e.error_len() {
                        Some(len) => {
                            self.push("\u{FFFD}", false, out);
                            rest = &bad[len..];
                        }
                        None => {
                            self.pending.extend_from_slice(bad);
                            rest = &[];
                        }
                    }
                }
            }
        }
        self.scratch = buf;
    }

    fn push(&mut self, s: &str, metaspace: bool, out: &mut String) {
        if let Some(c) = s.chars().next_back() {
            self.ends_with_fffd = c == '\u{FFFD}';
        }
        if metaspace && s.contains('\u{2581}') {
            out.push_str(&s.replace('\u{2581}', " "));
        } else {
            out.push_str(s);
        }
    }

    /// Whether the text decoded so far ends in U+FFFD, counting an incomplete
    /// character as one (as Python's decoder does).
    fn ends_with_replacement(&self) -> bool {
        !self.pending.is_empty() || self.ends_with_fffd
    }

    /// Decodes an incomplete character left at the end as U+FFFD.
    fn finish(&mut self, out: &mut String) {
        if !self.pending.is_empty() {
            self.pending.clear();
            self.push("\u{FFFD}", false, out);
        }
    }

    fn reset(&mut self) {
        self.pending.clear();
        self.ends_with_fffd = false;
    }
}

/// Turns a stream of token ids into text pieces, one token at a time. Create
/// one per generation; see the [module docs](self) for the rules.
pub struct Detokenizer {
    table: Arc<TokenTable>,
    state: State,
}

/// The streaming state, apart from the shared table.
#[derive(Default)]
struct State {
    /// Text produced by the current call.
    out: String,
    /// Whether any text has been emitted (mlx-lm's `self.text` is non-empty).
    emitted_any: bool,
    /// Whether the current chunk's first character is still to be emitted
    /// and should be dropped if it is a space.
    trim_first: bool,
    /// The bytes mlx-lm holds in `_unflushed`, decoded as tokens are added.
    decoder: Utf8Stream,
    /// Decoded text not emitted yet (only while `holding`).
    held: String,
    /// BPE: the chunk holds a token with `Ā`, so its text depends on whether
    /// it is flushed by a token or by `finalize`; emit nothing until then.
    holding: bool,
    /// BPE while `holding`: the chunk decoded as `finalize` would.
    final_decoder: Utf8Stream,
    final_held: String,
    /// Naive: the current line's tokens and how many of its characters have
    /// been emitted.
    line: Vec<u32>,
    line_emitted: usize,
}

impl Detokenizer {
    /// A detokenizer for `tok`. Builds a [`TokenTable`], which costs
    /// O(vocabulary); use [`Detokenizer::with_table`] to share one.
    pub fn new(tok: &Tokenizer) -> Self {
        Self::with_table(Arc::new(TokenTable::new(tok)))
    }

    /// A detokenizer over a shared table.
    pub fn with_table(table: Arc<TokenTable>) -> Self {
        let mut detokenizer = Self {
            table,
            state: State::default(),
        };
        detokenizer.reset();
        detokenizer
    }

    /// The kind of mlx-lm detokenizer this mirrors.
    pub fn kind(&self) -> DetokenizerKind {
        self.table.kind
    }

    /// Forgets the stream so far, to start another.
    pub fn reset(&mut self) {
        let trim = self.table.kind.trims_first_space();
        self.state = State {
            trim_first: trim,
            ..State::default()
        };
    }

    /// Adds one token; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Option<String> {
        let (table, s) = (&*self.table, &mut self.state);
        match table.kind {
            DetokenizerKind::Naive => s.push_naive(table, id),
            DetokenizerKind::Bpe | DetokenizerKind::Spm { .. } => s.push_stream(table, id),
        }
        s.take()
    }

    /// Ends the stream: returns the text still held back, an incomplete
    /// character as U+FFFD. The detokenizer can then start a new stream that
    /// continues the text (as mlx-lm's does after `finalize`).
    pub fn finish(&mut self) -> Option<String> {
        let (table, s) = (&*self.table, &mut self.state);
        match table.kind {
            DetokenizerKind::Naive => s.finish_naive(table),
            DetokenizerKind::Bpe | DetokenizerKind::Spm { .. } => s.finish_stream(table),
        }
        s.take()
    }
}

impl State {
    fn take(&mut self) -> Option<String> {
        (!self.out.is_empty()).then(|| std::mem::take(&mut self.out))
    }

    /// Emits the start of the current chunk's text.
    fn emit(out: &mut String, text: &str, trim_first: &mut bool, emitted_any: &mut bool) {
        let mut text = text;
        if *trim_first && !text.is_empty() {
            *trim_first = false;
            text = text.strip_prefix(' ').unwrap_or(text);
        }
        *emitted_any |= !text.is_empty();
        out.push_str(text);
    }

    fn emit_held(&mut self) {
        Self::emit(
            &mut self.out,
            &self.held,
            &mut self.trim_first,
            &mut self.emitted_any,
        );
        self.held.clear();
    }

    /// mlx-lm flushed `_unflushed`: the next token starts a new chunk.
    fn new_chunk(&mut self, table: &TokenTable) {
        self.decoder.reset();
        self.final_decoder.reset();
        self.held.clear();
        self.final_held.clear();
        self.holding = false;
        self.trim_first = table.kind.trims_first_space() && !self.emitted_any;
    }

    fn push_stream(&mut self, table: &TokenTable, id: u32) {
        let metaspace = matches!(table.kind, DetokenizerKind::Spm { .. });
        if table.flag(id, HAS_NUL) && !self.holding {
            // Everything decoded so far was emitted; the two decodings part here.
            self.holding = true;
            self.final_decoder = self.decoder.clone();
        }
        self.decoder
            .feed(table.bytes(id), metaspace, &mut self.held);
        if self.holding {
            let bytes = table.final_bytes(id);
            self.final_decoder.feed(bytes, false, &mut self.final_held);
        }
        let flush = !self.decoder.ends_with_replacement() && !table.flag(id, SINGLE_SPACE);
        if flush || !self.holding {
            self.emit_held();
        }
        if flush {
            self.new_chunk(table);
        }
    }

    fn finish_stream(&mut self, table: &TokenTable) {
        if self.holding {
            self.final_decoder.finish(&mut self.final_held);
            let text = std::mem::take(&mut self.final_held);
            Self::emit(
                &mut self.out,
                &text,
                &mut self.trim_first,
                &mut self.emitted_any,
            );
        } else {
            self.decoder.finish(&mut self.held);
            self.emit_held();
        }
        self.new_chunk(table);
    }

    /// Emits the characters of the line's text past those already emitted
    /// (mlx-lm's `last_segment`).
    fn emit_line(&mut self, text: &str) -> usize {
        if let Some((i, _)) = text.char_indices().nth(self.line_emitted) {
            self.out.push_str(&text[i..]);
        }
        text.chars().count()
    }

    fn push_naive(&mut self, table: &TokenTable, id: u32) {
        let Some((tok, clean_spaces)) = &table.naive else {
            return;
        };
        self.line.push(id);
        let mut text = tok.decode(&self.line, false).unwrap_or_default();
        if text.ends_with('\u{FFFD}') {
            text.truncate(text.trim_end_matches('\u{FFFD}').len());
        } else if *clean_spaces && text.ends_with(' ') {
            text.pop();
        }
        let chars = self.emit_line(&text);
        if text.ends_with('\n') {
            self.line.clear();
            self.line_emitted = 0;
        } else {
            self.line_emitted = chars;
        }
    }

    fn finish_naive(&mut self, table: &TokenTable) {
        if let Some((tok, _)) = &table.naive {
            let text = tok.decode(&self.line, false).unwrap_or_default();
            self.emit_line(&text);
        }
        self.line.clear();
        self.line_emitted = 0;
    }
}

#[cfg(test)]
#[path = "detokenize_tests.rs"]
mod tests;
