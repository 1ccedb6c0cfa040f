//! Tests of [`super`]: mlx-lm's outputs recorded by
//! runner/tests-data/gen_detokenize.py, a line-by-line transliteration of
//! mlx-lm's detokenizers to compare against on random ids, and round trips.
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::*;

const MODELS: [&str; 4] = ["llama-f32", "mistral-f32", "qwen2-f32", "qwen3-f32"];

/// `$GROVE_FIXTURES`, else `.grove/fixtures` in the repository.
fn fixtures() -> PathBuf {
    match std::env::var_os("GROVE_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.grove/fixtures"),
    }
}

fn load_dir(dir: &Path) -> Tokenizer {
    let config = dir.join("config.json");
    let config: Value = match std::fs::read_to_string(&config) {
        Ok(text) => serde_json::from_str(&text).expect("config.json is JSON"),
        Err(_) => Value::Null,
    };
    Tokenizer::load(dir, &config).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// A fixture's tokenizer; a missing fixture fails the test.
fn load(name: &str) -> Tokenizer {
    let dir = fixtures().join(name);
    assert!(
        dir.join("tokenizer.json").is_file(),
        "fixture {} is missing (set GROVE_FIXTURES to the fixtures directory)",
        dir.display()
    );
    load_dir(&dir)
}

/// Feeds `ids` one at a time, then finishes; returns the pieces.
fn pieces(d: &mut Detokenizer, ids: &[u32]) -> Vec<String> {
    d.reset();
    let mut out: Vec<String> = ids.iter().filter_map(|&id| d.push(id)).collect();
    out.extend(d.finish());
    assert!(out.iter().all(|p| !p.is_empty()), "empty piece in {out:?}");
    out
}

/// mlx-lm's BPE and SPM streaming detokenizers, transliterated: the held
/// bytes are re-decoded after every token (O(n²), as in Python).
struct Reference {
    kind: DetokenizerKind,
    tokens: Vec<Option<String>>,
    text: String,
    unflushed: String,
    unflushed_bytes: Vec<u8>,
}

impl Reference {
    fn new(tok: &Tokenizer) -> Self {
        let inner = tok.inner();
        let kind = TokenTable::new(tok).kind();
        let n = inner.get_vocab_size(true) as u32;
        let tokens = (0..n).map(|id| inner.id_to_token(id)).collect();
        Self {
            kind,
            tokens,
            text: String::new(),
            unflushed: String::new(),
            unflushed_bytes: vec![],
        }
    }

    fn byte_decoder(c: char) -> Option<u8> {
        gpt2_byte_table().get(c as usize).copied().flatten()
    }

    /// `_decode_bytes`: `if res:` keeps byte 0 as the UTF-8 of its character.
    fn decode_adding(s: &str) -> String {
        let mut bytes = Vec::new();
        for c in s.chars() {
            match Self::byte_decoder(c) {
                Some(b) if b != 0 => bytes.push(b),
                _ => bytes.extend_from_slice(c.to_string().as_bytes()),
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// `finalize`'s decoding (a character outside the alphabet, a KeyError in
    /// mlx-lm, is kept as UTF-8).
    fn decode_final(s: &str) -> String {
        let mut bytes = Vec::new();
        for c in s.chars() {
            match Self::byte_decoder(c) {
                Some(b) => bytes.push(b),
                None => bytes.extend_from_slice(c.to_string().as_bytes()),
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn trim(&self, text: String) -> String {
        match (
            self.kind.trims_first_space() && self.text.is_empty(),
            text.strip_prefix(' '),
        ) {
            (true, Some(rest)) => rest.to_owned(),
            _ => text,
        }
    }

    fn spm_flush(&mut self, force: bool) {
        let mut bytes = Vec::new();
        let mut rest = &self.unflushed_bytes[..];
        while !rest.is_empty() {
            if rest.starts_with("\u{2581}".as_bytes()) {
                bytes.push(b' ');
                rest = &rest[3..];
            } else {
                bytes.push(rest[0]);
                rest = &rest[1..];
            }
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if !force && text.ends_with('\u{FFFD}') {
            return;
        }
        let text = self.trim(text);
        self.text.push_str(&text);
        self.unflushed_bytes.clear();
    }

    fn add(&mut self, id: u32) {
        let token = self.tokens.get(id as usize);
        if let DetokenizerKind::Spm { .. } = self.kind {
            let token = token.cloned().flatten().unwrap_or_default();
            match spm_byte(&token) {
                Some(b) => self.unflushed_bytes.push(b),
                None => self.unflushed_bytes.extend_from_slice(token.as_bytes()),
            }
            return self.spm_flush(false);
        }
        let v = match token {
            Some(t) => t.clone().unwrap_or_default(),
            None => "!".to_owned(),
        };
        self.unflushed.push_str(&v);
        let text = Self::decode_adding(&self.unflushed);
        let mut chars = v.chars();
        let single_space = matches!((chars.next(), chars.next()), (Some(c), None) if Self::byte_decoder(c) == Some(32));
        if !text.ends_with('\u{FFFD}') && !single_space {
            let text = self.trim(text);
            self.text.push_str(&text);
            self.unflushed.clear();
        }
    }

    fn finalize(&mut self) -> String {
        if let DetokenizerKind::Spm { .. } = self.kind {
            self.spm_flush(true);
        } else {
            let text = self.trim(Self::decode_final(&self.unflushed));
            self.text.push_str(&text);
            self.unflushed.clear();
        }
        std::mem::take(&mut self.text)
    }

    fn run(&mut self, ids: &[u32]) -> String {
        ids.iter().for_each(|&id| self.add(id));
        self.finalize()
    }
}

/// A small xorshift generator, so the tests need no extra crates.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Random ids that favour the hard cases: byte tokens, specials, spaces.
fn random_ids(rng: &mut Rng, tok: &Tokenizer, n: usize) -> Vec<u32> {
    let inner = tok.inner();
    let size = inner.get_vocab_size(true);
    let special: Vec<u32> = inner.get_added_tokens_decoder().keys().copied().collect();
    let short: Vec<u32> = (0..size as u32)
        .filter(|&id| {
            inner
                .id_to_token(id)
                .is_some_and(|t| t.chars().count() == 1 || t.starts_with("<0x"))
        })
        .collect();
    (0..n)
        .map(|_| match rng.below(10) {
            0 if !special.is_empty() => special[rng.below(special.len())],
            1..=5 => short[rng.below(short.len())],
            6 => (size + rng.below(3)) as u32,
            _ => rng.below(size) as u32,
        })
        .collect()
}

#[derive(Deserialize)]
struct Vectors {
    models: HashMap<String, ModelVectors>,
    odd_bpe: OddVectors,
}

/// Cases over a made-up byte-level vocabulary with unusual tokens.
#[derive(Deserialize)]
struct OddVectors {
    tokens: Vec<String>,
    cases: Vec<Case>,
}

fn vectors() -> Vectors {
    serde_json::from_str(include_str!("../tests-data/detokenize.json")).expect("detokenize.json")
}

#[derive(Deserialize)]
struct ModelVectors {
    detokenizer: String,
    vocab_size: usize,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    ids: Vec<u32>,
    text: String,
}

#[test]
fn matches_mlx_lm_vectors() {
    let vectors = vectors();
    for name in MODELS {
        let model = &vectors.models[name];
        let tok = load(name);
        assert_eq!(
            tok.vocab_size(),
            model.vocab_size,
            "{name}: fixture changed?"
        );
        let mut d = Detokenizer::new(&tok);
        let kind = match d.kind() {
            DetokenizerKind::Bpe => "bpe",
            DetokenizerKind::Spm { trim_space: true } => "spm",
            DetokenizerKind::Spm { trim_space: false } => "spm_no_trim",
            DetokenizerKind::Naive => "naive",
        };
        assert_eq!(kind, model.detokenizer, "{name}");
        for case in &model.cases {
            let got = pieces(&mut d, &case.ids).concat();
            assert_eq!(got, case.text, "{name} {}: {:?}", case.name, case.ids);
            let mut reference = Reference::new(&tok);
            assert_eq!(
                reference.run(&case.ids),
                case.text,
                "reference {name} {}",
                case.name
            );
        }
    }
}

#[test]
fn matches_transliteration_on_random_ids() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for name in MODELS {
        let tok = load(name);
        let table = Arc::new(TokenTable::new(&tok));
        let mut d = Detokenizer::with_table(Arc::clone(&table));
        let mut reference = Reference::new(&tok);
        for _ in 0..400 {
            let len = rng.below(40);
            // Past the vocabulary: "!" for BPE as in mlx-lm; nothing for SPM
            // (an IndexError in mlx-lm).
            let ids = random_ids(&mut rng, &tok, len);
            let got = pieces(&mut d, &ids).concat();
            assert_eq!(got, reference.run(&ids), "{name}: {ids:?}");
        }
    }
}

#[test]
fn round_trips_text() {
    let texts = [
        "Hello, world! How are you?",
        " leading space and  double",
        "emoji 👋🏽👨‍👩‍👧 🇫🇷 and CJK 中文字符, 日本語のテキスト",
        "tabs\tand\nnew\n\nlines  ",
        "naïve café ∑∫√ →",
    ];
    let mut rng = Rng(42);
    for name in MODELS {
        let tok = load(name);
        let mut d = Detokenizer::new(&tok);
        for i in 0..60 {
            let text = if i < texts.len() {
                texts[i].to_owned()
            } else {
                // Random picks of the texts' characters.
                let chars: Vec<char> = texts.concat().chars().collect();
                (0..rng.below(30))
                    .map(|_| chars[rng.below(chars.len())])
                    .collect()
            };
            // SPM: mlx-lm drops every leading "▁" token, the decoder's Strip
            // only one space; start with a non-space to compare the two.
            let text = match d.kind() {
                DetokenizerKind::Spm { .. } => text.trim_start(),
                _ => text.as_str(),
            };
            let ids = tok
                .inner()
                .encode(text, false)
                .expect("encode")
                .get_ids()
                .to_vec();
            let mut expected = tok.decode(&ids).expect("decode");
            if d.kind() == DetokenizerKind::Bpe && expected.starts_with(' ') {
                expected.remove(0);
            }
            assert_eq!(pieces(&mut d, &ids).concat(), expected, "{name}: {text:?}");
        }
    }
}

#[test]
fn multibyte_characters_come_out_whole() {
    let tok = load("mistral-f32");
    let mut d = Detokenizer::new(&tok);
    let byte = |b: u8| {
        tok.inner()
            .token_to_id(&format!("<0x{b:02X}>"))
            .expect("byte token")
    };
    // 👋 is F0 9F 91 8B: nothing until the last byte, then the whole emoji.
    let ids: Vec<u32> = "a👋".bytes().map(byte).collect();
    let out: Vec<Option<String>> = ids.iter().map(|&id| d.push(id)).collect();
    assert_eq!(out, [Some("a".into()), None, None, None, Some("👋".into())]);
    // A truncated character comes out as U+FFFD at the end.
    d.reset();
    assert_eq!(d.push(byte(0xE4)), None);
    assert_eq!(d.finish(), Some("\u{FFFD}".into()));
}

/// A BPE tokenizer over `tokens` (no merges) with `decoder`, written to a
/// temporary directory.
fn odd_tokenizer(tokens: &[String], decoder: Value) -> (tempfile::TempDir, Tokenizer) {
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), Value::from(i)))
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null,
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []},
    });
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).expect("write");
    let tok = load_dir(dir.path());
    (dir, tok)
}

#[test]
fn byte_zero_quirks_match_mlx_lm() {
    let odd = vectors().odd_bpe;
    let (_dir, tok) = odd_tokenizer(
        &odd.tokens,
        serde_json::json!({
            "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true
        }),
    );
    let id = |t: &str| tok.inner().token_to_id(t).expect("token");
    let mut d = Detokenizer::new(&tok);
    assert_eq!(d.kind(), DetokenizerKind::Bpe);
    // Flushed while adding tokens, byte 0 stays "Ā"; held to the end, NUL.
    assert_eq!(pieces(&mut d, &[id("Ā")]).concat(), "Ā");
    assert_eq!(pieces(&mut d, &[id("Āä")]).concat(), "\u{0}\u{FFFD}");
    assert_eq!(pieces(&mut d, &[id("Āä"), id("a")]).concat(), "Ā\u{FFFD}a");
    let mut reference = Reference::new(&tok);
    for case in &odd.cases {
        let got = pieces(&mut d, &case.ids).concat();
        assert_eq!(got, case.text, "{}: {:?}", case.name, case.ids);
        assert_eq!(
            reference.run(&case.ids),
            case.text,
            "reference {}",
            case.name
        );
    }
    let mut rng = Rng(7);
    let n = tok.vocab_size();
    for _ in 0..3000 {
        let ids: Vec<u32> = (0..rng.below(12))
            .map(|_| {
                if rng.below(2) == 0 {
                    (n - 1 - rng.below(11)) as u32
                } else {
                    rng.below(n + 2) as u32
                }
            })
            .collect();
        assert_eq!(
            pieces(&mut d, &ids).concat(),
            reference.run(&ids),
            "{ids:?}"
        );
    }
}

#[test]
fn kinds_follow_the_decoder() {
    use DetokenizerKind::*;
    let mut spm = serde_json::json!({"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
    assert_eq!(
        DetokenizerKind::for_decoder(Some(&spm)),
        Spm { trim_space: true }
    );
    spm["decoders"][3]["start"] = 2.into();
    assert_eq!(DetokenizerKind::for_decoder(Some(&spm)), Naive);
    spm["decoders"].as_array_mut().expect("array").pop();
    assert_eq!(
        DetokenizerKind::for_decoder(Some(&spm)),
        Spm { trim_space: false }
    );
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false});
    assert_eq!(DetokenizerKind::for_decoder(Some(&byte_level)), Bpe);
    assert_eq!(DetokenizerKind::for_decoder(None), Naive);
    assert_eq!(
        Detokenizer::new(&load("mistral-f32")).kind(),
        Spm { trim_space: true }
    );
}

#[test]
fn naive_streams_the_tokenizers_decode() {
    // A WordPiece decoder is none of mlx-lm's fast cases.
    let decoder = serde_json::json!({"type": "WordPiece", "prefix": "##", "cleanup": true});
    let (_dir, tok) = odd_tokenizer(&vectors().odd_bpe.tokens, decoder);
    let mut d = Detokenizer::new(&tok);
    assert_eq!(d.kind(), DetokenizerKind::Naive);
    let id = |t: &str| tok.inner().token_to_id(t).expect("token");
    let ids = [id("a"), id("中"), id("\n"), id("b")];
    let got = pieces(&mut d, &ids);
    assert_eq!(got.concat(), tok.decode(&ids[..3]).expect("decode") + "b");
}

/// mlx-lm re-decodes its held bytes on every token; text that stays held
/// (a run of invalid bytes, or `Ā` held to the end) must still cost O(1) per
/// token here, so 200k tokens take milliseconds rather than hours.
#[test]
fn long_held_runs_stay_linear() {
    let n = 200_000;
    let tok = load("llama-f32");
    let continuation = tok.inner().token_to_id("Ģ").expect("byte 0x80"); // GPT-2's 0x80
    let mut d = Detokenizer::new(&tok);
    let ids = vec![continuation; n];
    assert_eq!(pieces(&mut d, &ids).concat(), "\u{FFFD}".repeat(n));

    let odd = vectors().odd_bpe;
    let (_dir, tok) = odd_tokenizer(
        &odd.tokens,
        serde_json::json!({
            "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true
        }),
    );
    let id = |t: &str| tok.inner().token_to_id(t).expect("token");
    let mut d = Detokenizer::new(&tok);
    let mut ids = vec![id("Āä")];
    ids.extend(std::iter::repeat_n(id("ä"), n));
    let expected = format!("\u{0}{}", "\u{FFFD}".repeat(n + 1));
    assert_eq!(pieces(&mut d, &ids).concat(), expected);
}
