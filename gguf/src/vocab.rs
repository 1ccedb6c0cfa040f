//! The tokenizer a GGUF file describes (`tokenizer.ggml.*`), built with the
//! `tokenizers` crate the way transformers 5 builds it from the same metadata
//! (`integrations/gguf/gguf_tokenizer_mapping.py`), plus the
//! `tokenizer_config.json` and `generation_config.json` facts around it.
//!
//! - `gpt2`: byte-level BPE from the tokens and merges; tokens spelled outside
//!   the byte alphabet are respelled; the split regex comes from
//!   `tokenizer.ggml.pre` as llama.cpp defines it (`llama-vocab.cpp`).
//! - `llama` (SentencePiece BPE): byte fallback, `▁` for spaces; merges from
//!   the file or, when it has none, recovered from the vocabulary and scores
//!   (transformers' `generate_merges`). Gemma files use Gemma's normalizer and
//!   order merges by token position, as transformers' `gemma_tokenizer` does.
//! - Control tokens (type 3) become special added tokens, user-defined ones
//!   (type 4) plain added tokens; BOS/EOS are added by a template post-
//!   processor when `add_bos_token`/`add_eos_token` say so.
use std::collections::HashMap;

use serde_json::{Map, Value as Json, json};
use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab as BpeVocab};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::error::{GgufError, Result};
use crate::plan::Family;
use crate::reader::GgufFile;

/// llama.cpp's token types (`llama_token_type`).
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// A tokenizer and the configuration files that go with it.
pub struct Vocab {
    pub tokenizer: Tokenizer,
    pub tokenizer_config: Map<String, Json>,
    pub generation_config: Map<String, Json>,
}

/// What the metadata says, checked.
struct Meta<'a> {
    model: &'a str,
    pre: Option<&'a str>,
    tokens: &'a [String],
    types: Option<&'a [i32]>,
    scores: Option<&'a [f32]>,
    merges: Option<&'a [String]>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    end_of_turn: Vec<u32>,
    add_bos: Option<bool>,
    add_eos: Option<bool>,
    add_space_prefix: Option<bool>,
}

fn tok_error(file: &GgufFile, message: String) -> GgufError {
    GgufError::Tokenizer {
        path: file.path().to_owned(),
        message,
    }
}

impl<'a> Meta<'a> {
    fn read(file: &'a GgufFile) -> Result<Self> {
        let m = &file.metadata;
        let wrong = |e: crate::value::TypeMismatch| GgufError::Metadata {
            path: file.path().to_owned(),
            key: Some(e.key.clone()),
            message: e.to_string(),
        };
        let model = m
            .str("tokenizer.ggml.model")
            .map_err(wrong)?
            .ok_or_else(|| tok_error(file, "tokenizer.ggml.model is missing".into()))?;
        let tokens = m
            .strings("tokenizer.ggml.tokens")
            .map_err(wrong)?
            .ok_or_else(|| tok_error(file, "tokenizer.ggml.tokens is missing".into()))?;
        if tokens.is_empty() || tokens.len() > u32::MAX as usize {
            return Err(tok_error(file, "tokenizer.ggml.tokens is empty".into()));
        }
        let types = m.i32s("tokenizer.ggml.token_type").map_err(wrong)?;
        let scores = m.f32s("tokenizer.ggml.scores").map_err(wrong)?;
        for (key, len) in [
            ("token_type", types.map(<[i32]>::len)),
            ("scores", scores.map(<[f32]>::len)),
        ] {
            if let Some(len) = len
                && len != tokens.len()
            {
                return Err(tok_error(
                    file,
                    format!(
                        "tokenizer.ggml.{key} has {len} entries for {} tokens",
                        tokens.len()
                    ),
                ));
            }
        }
        let id = |key: &str| -> Result<Option<u32>> {
            match m.uint(key).map_err(wrong)? {
                None => Ok(None),
                Some(id) if id < tokens.len() as u64 => Ok(Some(id as u32)),
                Some(id) => Err(tok_error(
                    file,
                    format!("{key} is {id}, past the {} tokens", tokens.len()),
                )),
            }
        };
        let mut end_of_turn = Vec::new();
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            end_of_turn.extend(id(key)?);
        }
        Ok(Self {
            model,
            pre: m.str("tokenizer.ggml.pre").map_err(wrong)?,
            tokens,
            types,
            scores,
            merges: m.strings("tokenizer.ggml.merges").map_err(wrong)?,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            end_of_turn,
            add_bos: m.bool("tokenizer.ggml.add_bos_token").map_err(wrong)?,
            add_eos: m.bool("tokenizer.ggml.add_eos_token").map_err(wrong)?,
            add_space_prefix: m.bool("tokenizer.ggml.add_space_prefix").map_err(wrong)?,
        })
    }

    fn token(&self, id: Option<u32>) -> Option<&str> {
        id.map(|i| self.tokens[i as usize].as_str())
    }

    fn kind(&self, index: usize) -> i32 {
        self.types.map_or(1, |t| t[index])
    }
}

/// Builds the tokenizer of `file` (a model of `family`).
pub fn build(file: &GgufFile, family: Family) -> Result<Vocab> {
    let meta = Meta::read(file)?;
    let err = |e: String| tok_error(file, e);
    let (mut tokenizer, byte_level) = match (meta.model, family) {
        ("gpt2", _) => (byte_level(&meta).map_err(err)?, true),
        ("llama", Family::Gemma3) => (gemma(&meta).map_err(err)?, false),
        ("llama", _) => (sentencepiece(&meta).map_err(err)?, false),
        (other, _) => {
            return Err(tok_error(
                file,
                format!("tokenizer model {other:?} is not supported (gpt2, llama)"),
            ));
        }
    };
    // Special and added tokens.
    let alphabet = bytes_to_unicode();
    let spelled = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let mut special: Vec<AddedToken> = Vec::new();
    let mut plain: Vec<AddedToken> = Vec::new();
    let named = [meta.bos, meta.eos, meta.unk, meta.pad];
    for (i, token) in meta.tokens.iter().enumerate() {
        let kind = meta.kind(i);
        let is_named = named.contains(&Some(i as u32));
        if is_named || (kind == CONTROL && (!byte_level || spelled(token))) {
            special.push(AddedToken::from(token.clone(), true).normalized(false));
        } else if kind == USER_DEFINED && tokenizer.token_to_id(token).is_some() {
            plain.push(AddedToken::from(token.clone(), false).normalized(false));
        }
    }
    tokenizer.add_special_tokens(&special);
    tokenizer.add_tokens(&plain);

    // BOS/EOS as the file asks (llama.cpp adds BOS to SentencePiece vocabularies
    // that do not say otherwise).
    let add_bos = meta.add_bos.unwrap_or(meta.model == "llama") && meta.bos.is_some();
    let add_eos = meta.add_eos.unwrap_or(false) && meta.eos.is_some();
    let mut single = Vec::new();
    let mut specials = Vec::new();
    if add_bos && let (Some(id), Some(t)) = (meta.bos, meta.token(meta.bos)) {
        single.push(t.to_owned());
        specials.push((t.to_owned(), id));
    }
    single.push("$A".into());
    if add_eos && let (Some(id), Some(t)) = (meta.eos, meta.token(meta.eos)) {
        single.push(t.to_owned());
        specials.push((t.to_owned(), id));
    }
    let pair: Vec<String> = single
        .iter()
        .cloned()
        .chain(single.iter().map(|s| {
            if s == "$A" {
                "$B:1".into()
            } else {
                format!("{s}:1")
            }
        }))
        .collect();
    let processor = TemplateProcessing::builder()
        .try_single(single)
        .and_then(|b| b.try_pair(pair))
        .map_err(|e| err(format!("post-processor: {e}")))?
        .special_tokens(specials)
        .build()
        .map_err(|e| err(format!("post-processor: {e}")))?;
    tokenizer.with_post_processor(Some(processor));

    // tokenizer_config.json and generation_config.json.
    let mut config = Map::new();
    config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
    for (key, id) in [
        ("bos_token", meta.bos),
        ("eos_token", meta.eos),
        ("unk_token", meta.unk),
        ("pad_token", meta.pad),
    ] {
        if let Some(t) = meta.token(id) {
            config.insert(key.into(), json!(t));
        }
    }
    config.insert("add_bos_token".into(), json!(add_bos));
    config.insert("add_eos_token".into(), json!(add_eos));
    config.insert("clean_up_tokenization_spaces".into(), json!(false));
    if let Some(template) = chat_templates(file)? {
        config.insert("chat_template".into(), template);
    }
    let mut generation = Map::new();
    if let Some(bos) = meta.bos {
        generation.insert("bos_token_id".into(), json!(bos));
    }
    let mut eos: Vec<u32> = meta.eos.into_iter().collect();
    for id in &meta.end_of_turn {
        if !eos.contains(id) {
            eos.push(*id);
        }
    }
    match eos.as_slice() {
        [] => {}
        [one] => drop(generation.insert("eos_token_id".into(), json!(one))),
        many => drop(generation.insert("eos_token_id".into(), json!(many))),
    }
    if let Some(pad) = meta.pad {
        generation.insert("pad_token_id".into(), json!(pad));
    }
    Ok(Vocab {
        tokenizer,
        tokenizer_config: config,
        generation_config: generation,
    })
}

/// `tokenizer.chat_template` (the default) and `tokenizer.chat_template.NAME`
/// (named ones), as tokenizer_config.json writes them.
fn chat_templates(file: &GgufFile) -> Result<Option<Json>> {
    let m = &file.metadata;
    let wrong = |e: crate::value::TypeMismatch| GgufError::Metadata {
        path: file.path().to_owned(),
        key: Some(e.key.clone()),
        message: e.to_string(),
    };
    let default = m.str("tokenizer.chat_template").map_err(wrong)?;
    let mut named = Vec::new();
    for key in m.keys() {
        if let Some(name) = key.strip_prefix("tokenizer.chat_template.") {
            let text = m.str(key).map_err(wrong)?.unwrap_or_default();
            named.push(json!({"name": name, "template": text}));
        }
    }
    Ok(match (default, named.is_empty()) {
        (None, true) => None,
        (Some(t), true) => Some(json!(t)),
        (default, false) => {
            if let Some(t) = default {
                named.insert(0, json!({"name": "default", "template": t}));
            }
            Some(Json::Array(named))
        }
    })
}

/// GPT-2's byte-to-character map.
fn bytes_to_unicode() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars = vec!['\0'; 256];
    for &b in &printable {
        chars[b as usize] = char::from_u32(b).unwrap_or('\0');
    }
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars[b as usize] = char::from_u32(256 + n).unwrap_or('\0');
            printable.push(b);
            n += 1;
        }
    }
    chars
}

/// The split regex llama.cpp uses for a `tokenizer.ggml.pre` name, or None
/// for GPT-2's own (ByteLevel's built-in regex).
fn split_regex(pre: &str) -> std::result::Result<Option<&'static str>, String> {
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    Ok(match pre {
        "default" | "gpt2" | "gpt-2" | "smollm" => None,
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "dbrx"
        | "smaug-bpe" | "lfm2" | "midm-2.0" => Some(LLAMA3),
        "qwen2" | "deepseek-r1-qwen" | "megrez" | "kormo" => Some(QWEN2),
        "qwen35" => Some(QWEN35),
        "tekken" => Some(TEKKEN),
        "gpt-4o" | "llama4" | "minimax-m2" => Some(GPT4O),
        other => {
            return Err(format!(
                "pre-tokenizer {other:?} is not supported (default, gpt2, smollm, llama-bpe, \
                 qwen2, qwen35, tekken, gpt-4o and their aliases)"
            ));
        }
    })
}

fn byte_level(meta: &Meta) -> std::result::Result<Tokenizer, String> {
    let alphabet = bytes_to_unicode();
    let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let vocab: BpeVocab = meta
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let spelled = if in_alphabet(t) {
                t.clone()
            } else {
                t.bytes().map(|b| alphabet[b as usize]).collect()
            };
            (spelled, i as u32)
        })
        .collect();
    let merges = file_merges(meta.merges.unwrap_or(&[]))?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .continuing_subword_prefix(String::new())
        .end_of_word_suffix(String::new())
        .build()
        .map_err(|e| format!("BPE model: {e}"))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let pre = meta.pre.unwrap_or("default");
    let pre_tokenizer: PreTokenizerWrapper = match split_regex(pre)? {
        None if pre == "smollm" => Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into(),
        None => ByteLevel::new(false, true, true).into(),
        Some(regex) => {
            let split = Split::new(
                SplitPattern::Regex(regex.into()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| format!("split regex: {e}"))?;
            Sequence::new(vec![
                split.into(),
                ByteLevel::new(false, true, false).into(),
            ])
            .into()
        }
    };
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::new(true, true, true)));
    Ok(tokenizer)
}

fn file_merges(merges: &[String]) -> std::result::Result<Vec<(String, String)>, String> {
    merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .filter(|(_, r)| !r.contains(' '))
                .map(|(l, r)| (l.to_owned(), r.to_owned()))
                .ok_or_else(|| format!("merge {m:?} is not two tokens separated by one space"))
        })
        .collect()
}

/// Unique tokens in first-seen order, with the last index and key of each
/// (a Python dict built from the list).
fn first_seen<'t>(tokens: &[&'t str], keys: &[f64]) -> Vec<(&'t str, u32, f64)> {
    let mut at: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    let mut out: Vec<(&str, u32, f64)> = Vec::with_capacity(tokens.len());
    for (i, (&t, &k)) in tokens.iter().zip(keys).enumerate() {
        match at.get(t) {
            Some(&slot) => out[slot] = (t, i as u32, k),
            None => {
                at.insert(t, out.len());
                out.push((t, i as u32, k));
            }
        }
    }
    out
}

/// transformers' `generate_merges(vocab, vocab_scores)`: every split of a
/// token into two tokens of the vocabulary, best score first.
fn generate_merges(tokens: &[&str], keys: &[f64]) -> Vec<(String, String)> {
    let entries = first_seen(tokens, keys);
    let index: HashMap<&str, u32> = entries.iter().map(|&(t, i, _)| (t, i)).collect();
    let mut merges: Vec<(&str, &str, f64)> = Vec::new();
    for &(piece, _, score) in &entries {
        let mut local: Vec<(&str, &str, f64)> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (l, r) = piece.split_at(at);
                (index.contains_key(l) && index.contains_key(r)).then_some((l, r, score))
            })
            .collect();
        local.sort_by_key(|&(l, r, _)| (index[l], index[r]));
        merges.extend(local);
    }
    // Python's stable sort with reverse=True: descending, ties in place.
    merges.sort_by(|a, b| {
        b.2.total_cmp(&a.2)
            .then_with(|| b.0.chars().count().cmp(&a.0.chars().count()))
            .then_with(|| b.1.chars().count().cmp(&a.1.chars().count()))
    });
    merges
        .into_iter()
        .map(|(l, r, _)| (l.to_owned(), r.to_owned()))
        .collect()
}

fn spm_bpe(
    meta: &Meta,
    tokens: &[&str],
    keys: &[f64],
    unk: Option<&str>,
) -> std::result::Result<BPE, String> {
    let vocab: BpeVocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| ((*t).to_owned(), i as u32))
        .collect();
    let merges = match meta.merges {
        Some(m) if !m.is_empty() => file_merges(m)?,
        _ => generate_merges(tokens, keys),
    };
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .fuse_unk(true)
        .byte_fallback(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk.to_owned());
    }
    builder.build().map_err(|e| format!("BPE model: {e}"))
}

/// Llama/Mistral-style SentencePiece BPE (transformers' `LlamaTokenizer`).
fn sentencepiece(meta: &Meta) -> std::result::Result<Tokenizer, String> {
    let tokens: Vec<&str> = meta.tokens.iter().map(String::as_str).collect();
    let keys: Vec<f64> = match meta.scores {
        Some(s) => s.iter().map(|&x| f64::from(x)).collect(),
        None if meta.merges.is_some() => vec![0.0; tokens.len()],
        None => return Err("a SentencePiece vocabulary needs scores or merges".into()),
    };
    let bpe = spm_bpe(meta, &tokens, &keys, meta.token(meta.unk))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let prepend = if meta.add_space_prefix.unwrap_or(true) {
        PrependScheme::First
    } else {
        PrependScheme::Never
    };
    tokenizer.with_pre_tokenizer(Some(Metaspace::new('\u{2581}', prepend, false)));
    let replace = Replace::new("\u{2581}", " ").map_err(|e| e.to_string())?;
    let mut decoders: Vec<DecoderWrapper> = vec![
        replace.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if prepend == PrependScheme::First {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// Gemma's SentencePiece BPE (transformers' `gemma_tokenizer`): all-space
/// tokens respelled with `▁`, merges ordered by token position.
fn gemma(meta: &Meta) -> std::result::Result<Tokenizer, String> {
    let respelled: Vec<String> = meta
        .tokens
        .iter()
        .map(|t| {
            if t.contains(' ') && t.trim().is_empty() {
                "\u{2581}".repeat(t.chars().count())
            } else {
                t.clone()
            }
        })
        .collect();
    let tokens: Vec<&str> = respelled.iter().map(String::as_str).collect();
    let keys: Vec<f64> = (0..tokens.len()).map(|i| -(i as f64)).collect();
    let unk = meta.unk.map(|i| tokens[i as usize]);
    let bpe = spm_bpe(meta, &tokens, &keys, unk)?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_normalizer(Some(
        Replace::new(" ", "\u{2581}").map_err(|e| e.to_string())?,
    ));
    tokenizer.with_pre_tokenizer(Some(
        Split::new(
            SplitPattern::String(" ".into()),
            SplitDelimiterBehavior::MergedWithPrevious,
            false,
        )
        .map_err(|e| e.to_string())?,
    ));
    let replace = Replace::new("\u{2581}", " ").map_err(|e| e.to_string())?;
    tokenizer.with_decoder(Some(DecoderSequence::new(vec![
        replace.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ])));
    Ok(tokenizer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_merges_follow_transformers() {
        // transformers: generate_merges({'▁':0,'a':1,'b':2,'▁a':3,'ab':4},
        //   {'▁':-1,'a':-2,'b':-3,'▁a':-4,'ab':-5}) == [('▁','a'), ('a','b')]
        let tokens = ["▁", "a", "b", "▁a", "ab"];
        let keys = [-1.0, -2.0, -3.0, -4.0, -5.0];
        assert_eq!(
            generate_merges(&tokens, &keys),
            vec![("▁".into(), "a".into()), ("a".into(), "b".into())]
        );
    }

    #[test]
    fn byte_alphabet_is_gpt2s() {
        let a = bytes_to_unicode();
        assert_eq!(a[b' ' as usize], 'Ġ');
        assert_eq!(a[b'\n' as usize], 'Ċ');
        assert_eq!(a[b'A' as usize], 'A');
    }
}
