//! One generation: chunked prefill, then a pipelined decode loop that stops at
//! EOS or the token limit. Mirrors mlx-lm's `generate_step` so greedy output
//! matches it token for token.
use std::time::Instant;

use mlx_rs::ops::indexing::{TryIndexOp, argmax_axis};
use mlx_rs::transforms::{async_eval, eval};
use mlx_rs::{Array, Dtype, random};

use crate::cache::KvCache;
use crate::error::{MlxPhase, Result, RunnerError};
use crate::model::Model;

/// How to generate.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Prompt tokens evaluated per forward pass during prefill.
    pub prefill_chunk: usize,
    /// 0 = greedy; otherwise sample from softmax(logits / temperature).
    pub temperature: f32,
    /// Seed for sampling (ignored when greedy).
    pub seed: u64,
    /// Keep the last prompt position's logits (float32) in the output.
    pub capture_logits: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            max_tokens: 256,
            prefill_chunk: 2048,
            temperature: 0.0,
            seed: 0,
            capture_logits: false,
        }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-sequence token.
    Stop,
    /// `max_tokens` were generated.
    Length,
}

impl FinishReason {
    /// The lower-case name (`stop`, `length`), as mlx-lm and ollama spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

/// What a generation produced, with its timings.
#[derive(Debug, Clone)]
pub struct GenerateOutput {
    /// Generated ids (EOS excluded).
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    /// From the start until the first generated token was known.
    pub prompt_seconds: f64,
    /// From the first generated token to the last.
    pub decode_seconds: f64,
    /// The last prompt position's logits, when asked for.
    pub prompt_logits: Option<Vec<f32>>,
}

impl GenerateOutput {
    /// Prompt tokens per second of prefill.
    pub fn prompt_tps(&self) -> f64 {
        rate(self.prompt_tokens as f64, self.prompt_seconds)
    }

    /// Generated tokens per second after the first (each needs one decode step).
    pub fn decode_tps(&self) -> f64 {
        rate(
            self.tokens.len().saturating_sub(1) as f64,
            self.decode_seconds,
        )
    }
}

fn rate(n: f64, seconds: f64) -> f64 {
    if seconds > 0.0 { n / seconds } else { 0.0 }
}

/// Chooses the next token from `[1, V]` logits.
struct Sampler {
    temperature: f32,
    key: Option<Array>,
}

impl Sampler {
    fn new(params: &GenerateParams) -> Result<Self> {
        let key = if params.temperature > 0.0 {
            Some(random::key(params.seed).phase("seeding the sampler")?)
        } else {
            None
        };
        Ok(Self {
            temperature: params.temperature,
            key,
        })
    }

    fn sample(&mut self, logits: &Array) -> Result<Array> {
        // As mlx-lm: log-probabilities first, then argmax or a categorical draw.
        let logprobs = logits
            .subtract(logits.logsumexp_axis(-1, true).phase("sampling")?)
            .phase("sampling")?;
        match &mut self.key {
            None => argmax_axis(&logprobs, -1, None).phase("sampling"),
            Some(key) => {
                let (next, sub) = random::split(&*key, 2).phase("sampling")?;
                *key = next;
                let scaled = logprobs
                    .multiply(Array::from_f32(1.0 / self.temperature))
                    .phase("sampling")?;
                random::categorical(&scaled, -1, None, &sub).phase("sampling")
            }
        }
    }
}

/// Runs `tokens` (`[1, L]`) through the model and returns the last position's
/// logits, `[1, V]`.
fn step(model: &Model, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
    let hidden = model.decoder.forward(tokens, caches).phase("forward")?;
    let last = hidden.try_index((.., -1, ..)).phase("forward")?;
    model.decoder.logits(&last).phase("forward")
}

/// Generates from `prompt`, calling `on_token` with each new id as soon as it
/// is known. Greedy at temperature 0.
pub fn generate(
    model: &Model,
    prompt: &[u32],
    eos: &[u32],
    params: &GenerateParams,
    mut on_token: impl FnMut(u32),
) -> Result<GenerateOutput> {
    if prompt.is_empty() {
        return Err(RunnerError::Request("the prompt is empty".into()));
    }
    let vocab = model.spec.vocab as u32;
    if let Some(bad) = prompt.iter().find(|&&t| t >= vocab) {
        return Err(RunnerError::Request(format!(
            "prompt token id {bad} is outside the model's vocabulary of {vocab}"
        )));
    }
    if !(params.temperature.is_finite() && params.temperature >= 0.0) {
        return Err(RunnerError::Request(format!(
            "temperature must be a finite number >= 0, not {}",
            params.temperature
        )));
    }
    if params.prefill_chunk == 0 {
        return Err(RunnerError::Request(
            "prefill chunk must be at least 1 token".into(),
        ));
    }
    let mut sampler = Sampler::new(params)?;
    let mut caches: Vec<KvCache> = (0..model.decoder.num_layers())
        .map(|_| KvCache::new())
        .collect();
    let start = Instant::now();

    // 1. Prefill all but the last prompt token in chunks; keep only the cache.
    let mut done = 0;
    while prompt.len() - done > 1 {
        let n = params.prefill_chunk.min(prompt.len() - done - 1);
        let chunk = Model::tokens_array(&prompt[done..done + n]);
        let hidden = model
            .decoder
            .forward(&chunk, &mut caches)
            .phase("prefill")?;
        drop(hidden);
        eval(caches.iter().flat_map(KvCache::arrays)).phase("prefill")?;
        mlx_rs::memory::clear_cache().phase("prefill")?;
        done += n;
    }

    // 2. The last prompt token gives the first logits.
    let logits = step(model, &Model::tokens_array(&prompt[done..]), &mut caches)?;
    let prompt_logits = if params.capture_logits {
        let l = logits.as_dtype(Dtype::Float32).phase("reading logits")?;
        eval([&l]).phase("reading logits")?;
        Some(l.as_slice::<f32>().to_vec())
    } else {
        None
    };
    let mut y = sampler.sample(&logits)?;
    drop(logits);
    async_eval([&y]).phase("decode")?;

    // 3. Decode: dispatch step n+1 before reading token n back.
    let mut tokens = Vec::new();
    let mut first_at = None;
    let mut finish = FinishReason::Length;
    let mut prompt_seconds = 0.0;
    while tokens.len() < params.max_tokens {
        let next = if tokens.len() + 1 < params.max_tokens {
            let input = y.reshape(&[1, 1]).phase("decode")?;
            let next = sampler.sample(&step(model, &input, &mut caches)?)?;
            async_eval([&next]).phase("decode")?;
            Some(next)
        } else {
            None
        };
        eval([&y]).phase("decode")?;
        let token = y.item_cast::<u32>();
        if first_at.is_none() {
            prompt_seconds = start.elapsed().as_secs_f64();
            first_at = Some(Instant::now());
        }
        if eos.contains(&token) {
            finish = FinishReason::Stop;
            break;
        }
        tokens.push(token);
        on_token(token);
        match next {
            Some(n) => y = n,
            None => break,
        }
    }
    if params.max_tokens == 0 {
        prompt_seconds = start.elapsed().as_secs_f64();
    }
    let decode_seconds = first_at.map_or(0.0, |t| t.elapsed().as_secs_f64());
    Ok(GenerateOutput {
        tokens,
        finish,
        prompt_tokens: prompt.len(),
        prompt_seconds,
        decode_seconds,
        prompt_logits,
    })
}
