//! The fixture models and mlx-lm's reference outputs for them.
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// The fixture models: nine families in float32 and 4-bit (llama, mistral,
/// qwen2, qwen3; llama-swa with biases and sliding windows, gemma3, gemma4,
/// gemma2, phi3), plus bfloat16 variants (qwen3, gemma3, gemma4, gemma2 and
/// phi3 weights;
/// llama 4-bit with bfloat16 scales).
pub const MODELS: [&str; 45] = [
    "llama-f32",
    "llama-q4",
    "llama-q4-bf16",
    "qwen3-bf16",
    "mistral-f32",
    "mistral-q4",
    "qwen2-f32",
    "qwen2-q4",
    "qwen3-f32",
    "qwen3-q4",
    "llama-swa-f32",
    "llama-swa-q4",
    "gemma3-f32",
    "gemma3-q4",
    "gemma3-bf16",
    "gemma4-f32",
    "gemma4-q4",
    "gemma4-bf16",
    "gemma3-mm-f32",
    "gemma4-mm-f32",
    "gemma2-f32",
    "gemma2-q4",
    "gemma2-bf16",
    "phi3-f32",
    "phi3-q4",
    "phi3-bf16",
    "qwen3-moe-f32",
    "qwen3-moe-q4",
    "qwen3-moe-hf-f32",
    "qwen3-next-f32",
    "qwen3-next-q4",
    "gpt-oss-f32",
    "gpt-oss-q4",
    "gpt-oss-mxfp4",
    "gpt-oss-mxfp8",
    "qwen3-moe-nvfp4",
    "qwen3.5-f32",
    "qwen3.5-q4",
    "qwen3.5-moe-f32",
    "qwen3.5-moe-q4",
    "glm4-moe-lite-f32",
    "glm4-moe-lite-q4",
    "qwen3.5-moe-hf-f32",
    "llama-kv-f32",
    "llama-kv-q4",
];

/// The fixtures whose models have recurrent (linear-attention) layers.
pub const RECURRENT: [&str; 4] = [
    "qwen3-next-f32",
    "qwen3-next-q4",
    "qwen3.5-f32",
    "qwen3.5-moe-q4",
];

/// The fixtures whose models have sliding-window layers.
pub const WINDOWED: [&str; 7] = [
    "llama-swa-f32",
    "llama-swa-q4",
    "gemma3-f32",
    "gemma3-q4",
    "gemma3-bf16",
    "gemma4-f32",
    "gpt-oss-f32",
];

/// The fixture root: `GROVE_FIXTURES`, else `.grove/fixtures` in the checkout.
/// Missing fixtures are an error, never a skipped test.
pub fn root() -> Result<PathBuf> {
    let dir = match std::env::var_os("GROVE_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.grove/fixtures"),
    };
    if !dir.join("index.json").is_file() {
        bail!(
            "no fixtures at {} (run `make fixtures`, or set GROVE_FIXTURES)",
            dir.display()
        );
    }
    Ok(dir)
}

/// The directory of one fixture model.
pub fn model_dir(name: &str) -> Result<PathBuf> {
    let dir = root()?.join(name);
    if !dir.join("config.json").is_file() {
        bail!("fixture model {} is missing", dir.display());
    }
    Ok(dir)
}

/// A GGUF copy of a fixture (`DIR/gguf/NAME`, see `GGUF_VARIANTS` in
/// make_fixtures.py).
pub fn gguf(name: &str) -> Result<PathBuf> {
    let path = root()?.join("gguf").join(name);
    if !path.is_file() {
        bail!("fixture GGUF {} is missing", path.display());
    }
    Ok(path)
}

/// mlx-lm's outputs for one model.
#[derive(Debug, Deserialize)]
pub struct Reference {
    pub model: String,
    pub eos_token_ids: Vec<u32>,
    pub cases: Vec<Case>,
}

/// One prompt and what mlx-lm made of it.
#[derive(Debug, Deserialize)]
pub struct Case {
    pub name: String,
    /// The text prompt, or `None` for a token-id case.
    pub prompt: Option<String>,
    pub prompt_tokens: Vec<u32>,
    pub max_tokens: usize,
    /// Greedy generated ids (EOS excluded).
    pub tokens: Vec<u32>,
    /// `stop` (EOS generated) or `length`.
    pub finish_reason: String,
    /// Last prompt position's logits.
    pub logits: Vec<f32>,
    /// mlx-lm's streamed text of `tokens`.
    pub text: String,
    /// mlx-lm's BatchGenerator's ids for this prompt with every case's
    /// prompt in one batch (EOS excluded); `None` where mlx-lm cannot batch
    /// the model (the reference's `batch_error` says why).
    #[serde(default)]
    pub batch_tokens: Option<Vec<u32>>,
    /// For the chat case: the conversation mlx-lm rendered with the template.
    #[serde(default)]
    pub messages: Vec<ChatMessage>,
}

/// One message of a reference conversation.
#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// mlx-lm's outputs for what Grove computes by default on the CPU backend,
/// where half-precision arrays are promoted to float32: `reference-promoted.json`
/// (mlx-lm on the model with those arrays cast to float32) when the fixture has
/// one, else `reference.json`.
pub fn reference(name: &str) -> Result<Reference> {
    let promoted = model_dir(name)?.join("reference-promoted.json");
    if promoted.is_file() {
        return read_reference(&promoted);
    }
    reference_stored(name)
}

/// `reference.json`: mlx-lm's outputs on the model as stored (what Grove gives
/// with `--cpu-dtypes stored`).
pub fn reference_stored(name: &str) -> Result<Reference> {
    read_reference(&model_dir(name)?.join("reference.json"))
}

/// Whether the fixture stores half-precision arrays (and so has a promoted reference).
pub fn has_half_precision(name: &str) -> Result<bool> {
    Ok(model_dir(name)?.join("reference-promoted.json").is_file())
}

fn read_reference(path: &std::path::Path) -> Result<Reference> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The fixtures with mlx-lm references for a quantized KV cache.
pub const KV_QUANTIZED: [&str; 10] = [
    "llama-kv-f32",
    "llama-kv-q4",
    "qwen3-f32",
    "qwen3-q4",
    "qwen3-next-f32",
    "qwen3-next-q4",
    "qwen3-moe-f32",
    "qwen3-moe-q4",
    "qwen3.5-f32",
    "qwen3.5-moe-f32",
];

/// mlx-lm's greedy outputs with a quantized KV cache (`reference-kv.json`).
#[derive(Debug, Deserialize)]
pub struct KvReference {
    pub model: String,
    pub settings: Vec<KvSettingReference>,
}

/// One KV setting and mlx-lm's outputs under it.
#[derive(Debug, Deserialize)]
pub struct KvSettingReference {
    pub kv_bits: u32,
    pub kv_group_size: u32,
    pub quantized_kv_start: u32,
    pub cases: Vec<KvCase>,
}

/// One prompt under a KV setting.
#[derive(Debug, Deserialize)]
pub struct KvCase {
    pub name: String,
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    /// mlx-lm's streamed text of `tokens`.
    pub text: String,
    pub finish_reason: String,
}

/// `reference-kv.json` of a fixture.
pub fn kv_reference(name: &str) -> Result<KvReference> {
    let path = model_dir(name)?.join("reference-kv.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// One of mlx-lm's tensor-parallel generations, made at fixture time by
/// `tests/fixtures/sharded_refs.py` (its `sharded_load` over MLX's ring).
#[derive(Debug, Deserialize)]
pub struct ShardedRun {
    pub ranks: usize,
    pub prompt_tokens: Vec<u32>,
    pub max_tokens: usize,
    /// Rank 0's greedy tokens (EOS excluded).
    pub tokens: Vec<u32>,
    /// The last prompt position's logits.
    pub logits: Vec<f32>,
}

#[derive(Debug, Deserialize)]
struct ShardedReference {
    runs: Vec<ShardedRun>,
}

/// mlx-lm's run of `name` over `ranks` ranks (its reference-sharded.json).
pub fn sharded_reference(name: &str, ranks: usize) -> Result<ShardedRun> {
    let path = model_dir(name)?.join("reference-sharded.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {} (made by `make fixtures`)", path.display()))?;
    let doc: ShardedReference =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    doc.runs
        .into_iter()
        .find(|r| r.ranks == ranks)
        .with_context(|| format!("{}: no run over {ranks} ranks", path.display()))
}
