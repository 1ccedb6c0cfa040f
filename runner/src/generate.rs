//! One generation: chunked prefill, then a pipelined decode loop that stops at
//! EOS or the token limit. Mirrors mlx-lm's `generate_step` so greedy output
//! matches it token for token.
use std::time::Instant;

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::transforms::{async_eval, eval};
use mlx_rs::{Array, Dtype};

use crate::cache::{KvSetting, LayerKv};
use crate::error::{MlxPhase, Result, RunnerError};
use crate::model::Model;
use crate::sample::{Sampler, SamplingOptions};

/// How to generate.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Prompt tokens evaluated per forward pass during prefill.
    pub prefill_chunk: usize,
    /// How the next token is chosen (greedy by default).
    pub sampling: SamplingOptions,
    /// Keep the last prompt position's logits and the first decode step's
    /// (float32) in the output.
    pub capture_logits: bool,
    /// Quantize the KV cache (from a start), or keep full precision.
    pub kv: Option<KvSetting>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            max_tokens: 256,
            prefill_chunk: 2048,
            sampling: SamplingOptions::default(),
            capture_logits: false,
            kv: None,
        }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-sequence token, or the caller stopped it.
    Stop,
    /// `max_tokens` were generated or the context is full.
    Length,
    /// The caller cancelled during prefill.
    Cancelled,
}

impl FinishReason {
    /// The lower-case name (`stop`, `length`), as mlx-lm and ollama spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Cancelled => "cancelled",
        }
    }
}

/// What a generation produced, with its timings.
#[derive(Debug, Clone)]
pub struct GenerateOutput {
    /// Generated ids (EOS excluded).
    pub tokens: Vec<u32>,
    /// How many of `tokens` (from the first) were fed back and sit in the caches.
    pub fed: usize,
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens that came from the prompt cache.
    pub cached_tokens: usize,
    /// From the start until the first generated token was known.
    pub prompt_seconds: f64,
    /// From the first generated token to the last.
    pub decode_seconds: f64,
    /// The last prompt position's logits, when asked for.
    pub prompt_logits: Option<Vec<f32>>,
    /// The first decode step's logits (the first generated token's), when
    /// asked for.
    pub step_logits: Option<Vec<f32>>,
}

impl GenerateOutput {
    fn cancelled(prompt_tokens: usize, cached_tokens: usize, start: Instant) -> Self {
        Self {
            tokens: Vec::new(),
            fed: 0,
            finish: FinishReason::Cancelled,
            prompt_tokens,
            cached_tokens,
            prompt_seconds: start.elapsed().as_secs_f64(),
            decode_seconds: 0.0,
            prompt_logits: None,
            step_logits: None,
        }
    }

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

/// Where a decode step's host time goes, summed over the steps of one
/// generation and printed to stderr at its end when `GROVE_STEP_PROFILE=1`
/// (a benchmark's diagnostic): building the step's graph (the model's ops
/// and the sampler), dispatching it (`async_eval`: MLX encodes every kernel
/// and launches them), and waiting for the step before it to finish. A step
/// whose wait is near zero is bound by the host, not by the device.
#[derive(Default)]
struct StepProfile {
    steps: u32,
    build: std::time::Duration,
    dispatch: std::time::Duration,
    wait: std::time::Duration,
}

impl StepProfile {
    fn from_env() -> Option<Self> {
        std::env::var("GROVE_STEP_PROFILE")
            .is_ok_and(|v| v == "1")
            .then(Self::default)
    }

    fn report(&self) {
        let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / f64::from(self.steps.max(1));
        eprintln!(
            "step profile: {} steps; per step: build {:.0} us, dispatch {:.0} us, wait {:.0} us",
            self.steps,
            per(self.build),
            per(self.dispatch),
            per(self.wait)
        );
    }
}

/// Runs `tokens` (`[1, L]`) through the model and returns the last position's
/// logits, `[1, V]`.
fn step(
    model: &Model,
    tokens: &Array,
    caches: &mut [LayerKv],
    kv: Option<KvSetting>,
) -> Result<Array> {
    let hidden = model.decoder.forward(tokens, caches).phase("forward")?;
    maybe_quantize(caches, kv).phase("forward")?;
    let last = hidden.try_index((.., -1, ..)).phase("forward")?;
    model.decoder.logits(&last).phase("forward")
}

/// mlx-lm's `maybe_quantize_kv_cache`: after each forward pass, every
/// full-attention layer holding at least the setting's start is quantized.
pub fn maybe_quantize(
    caches: &mut [LayerKv],
    kv: Option<KvSetting>,
) -> std::result::Result<(), mlx_rs::error::Exception> {
    if kv.is_some() {
        for cache in caches {
            cache.maybe_quantize(kv)?;
        }
    }
    Ok(())
}

/// What the caller wants after each token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Stop now (cancelled, or a stop string matched).
    Stop,
}

/// Generates from `prompt` with fresh KV caches, calling `on_token` with each
/// new id as soon as it is known. Greedy at temperature 0.
pub fn generate(
    model: &Model,
    prompt: &[u32],
    eos: &[u32],
    params: &GenerateParams,
    mut on_token: impl FnMut(u32),
) -> Result<GenerateOutput> {
    let mut caches = model.new_caches();
    let limits = Limits {
        context: usize::MAX,
        cancelled: &|| false,
        inspect: None,
    };
    generate_cached(model, &mut caches, 0, prompt, eos, params, &limits, |t| {
        on_token(t);
        Flow::Continue
    })
}

/// Where a generation is when it calls [`Limits::inspect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// A prefill chunk was evaluated into the caches.
    PrefillChunk,
    /// A generated token was read back (the next step may be in flight).
    DecodeStep,
}

/// A look at the caches after a prefill chunk or decode step.
pub type Inspect<'a> = dyn Fn(Stage, &[LayerKv]) + 'a;

/// Bounds a generation from outside.
pub struct Limits<'a> {
    /// Most tokens (prompt + generated) the caches may hold.
    pub context: usize,
    /// Checked between prefill chunks; true stops the work.
    pub cancelled: &'a dyn Fn() -> bool,
    /// Called after every prefill chunk and decode step with the caches (the
    /// memory-invariant test looks at MLX's memory there).
    pub inspect: Option<&'a Inspect<'a>>,
}

/// Generates from `prompt` whose first `cached` tokens are already in `caches`
/// (the prompt cache's reuse). On return the caches hold exactly the prompt and
/// the generated tokens that were fed back (see [`GenerateOutput::fed`]).
#[allow(clippy::too_many_arguments)]
pub fn generate_cached(
    model: &Model,
    caches: &mut [LayerKv],
    cached: usize,
    prompt: &[u32],
    eos: &[u32],
    params: &GenerateParams,
    limits: &Limits<'_>,
    mut on_token: impl FnMut(u32) -> Flow,
) -> Result<GenerateOutput> {
    if prompt.is_empty() {
        return Err(RunnerError::Request("the prompt is empty".into()));
    }
    if cached >= prompt.len() {
        return Err(RunnerError::Request(
            "at least one prompt token must be evaluated".into(),
        ));
    }
    if prompt.len() > limits.context {
        return Err(RunnerError::Request(format!(
            "the prompt has {} tokens, more than the context length of {}",
            prompt.len(),
            limits.context
        )));
    }
    let vocab = model.dims.vocab as u32;
    if let Some(bad) = prompt.iter().find(|&&t| t >= vocab) {
        return Err(RunnerError::Request(format!(
            "prompt token id {bad} is outside the model's vocabulary of {vocab}"
        )));
    }
    if params.prefill_chunk == 0 {
        return Err(RunnerError::Request(
            "prefill chunk must be at least 1 token".into(),
        ));
    }
    if let Some(kv) = params.kv {
        model
            .check_kv_quant(kv.quant)
            .map_err(RunnerError::Request)?;
    }
    let mut sampler = Sampler::new(&params.sampling, model.dims.vocab as usize)?;
    // The ids the penalties look at: the prompt and the tokens read back so far.
    let mut history: Vec<u32> = if sampler.uses_history() {
        prompt.to_vec()
    } else {
        Vec::new()
    };
    let start = Instant::now();
    // Generation may fill the context: max_tokens is capped by what is left.
    let max_tokens = params.max_tokens.min(limits.context - prompt.len() + 1);

    // 1. Prefill all but the last prompt token in chunks; keep only the cache.
    let mut done = cached;
    while prompt.len() - done > 1 {
        if (limits.cancelled)() {
            return Ok(GenerateOutput::cancelled(prompt.len(), cached, start));
        }
        let n = params.prefill_chunk.min(prompt.len() - done - 1);
        let chunk = Model::tokens_array(&prompt[done..done + n]);
        let hidden = model.decoder.forward(&chunk, caches).phase("prefill")?;
        drop(hidden);
        maybe_quantize(caches, params.kv).phase("prefill")?;
        eval(caches.iter().flat_map(LayerKv::arrays)).phase("prefill")?;
        mlx_rs::memory::clear_cache().phase("prefill")?;
        done += n;
        if let Some(inspect) = limits.inspect {
            inspect(Stage::PrefillChunk, caches);
        }
    }

    // 2. The last prompt token gives the first logits.
    let logits = step(
        model,
        &Model::tokens_array(&prompt[done..]),
        caches,
        params.kv,
    )?;
    let prompt_logits = if params.capture_logits {
        let l = logits.as_dtype(Dtype::Float32).phase("reading logits")?;
        eval([&l]).phase("reading logits")?;
        Some(l.as_slice::<f32>().to_vec())
    } else {
        None
    };
    let mut y = model
        .agree(sampler.sample(&logits, &history)?)
        .phase("decode")?;
    drop(logits);
    async_eval([&y]).phase("decode")?;

    // 3. Decode: dispatch step n+1 before reading token n back.
    let mut tokens = Vec::new();
    let mut first_at = None;
    let mut finish = FinishReason::Length;
    let mut prompt_seconds = 0.0;
    let mut fed = 0;
    // The step dispatched but not read back when the loop ends (after an EOS or
    // a stop): it is still evaluated asynchronously and must finish before its
    // arrays (and, at exit, MLX itself) go away.
    let mut in_flight = if max_tokens == 0 {
        Some(y.clone())
    } else {
        None
    };
    let mut profile = StepProfile::from_env();
    let mut step_logits = None;
    while tokens.len() < max_tokens {
        let next = if tokens.len() + 1 < max_tokens {
            let t0 = Instant::now();
            let logits = match model.decoder.fast_decode(&y, caches).phase("decode")? {
                Some(logits) => {
                    maybe_quantize(caches, params.kv).phase("decode")?;
                    logits
                }
                None => step(
                    model,
                    &y.reshape(&[1, 1]).phase("decode")?,
                    caches,
                    params.kv,
                )?,
            };
            if params.capture_logits && fed == 0 {
                let l = logits.as_dtype(Dtype::Float32).phase("reading logits")?;
                eval([&l]).phase("reading logits")?;
                step_logits = Some(l.as_slice::<f32>().to_vec());
            }
            let next = sampler.sample_after(&logits, &history, Some(&y))?;
            let next = model.agree(next).phase("decode")?;
            fed += 1;
            let t1 = Instant::now();
            async_eval([&next]).phase("decode")?;
            if let Some(p) = profile.as_mut() {
                p.build += t1 - t0;
                p.dispatch += t1.elapsed();
            }
            Some(next)
        } else {
            None
        };
        let t2 = Instant::now();
        eval([&y]).phase("decode")?;
        if let Some(p) = profile.as_mut() {
            p.wait += t2.elapsed();
            p.steps += 1;
        }
        let token = y.item_cast::<u32>();
        if let Some(inspect) = limits.inspect {
            inspect(Stage::DecodeStep, caches);
        }
        if first_at.is_none() {
            prompt_seconds = start.elapsed().as_secs_f64();
            first_at = Some(Instant::now());
        }
        if eos.contains(&token) {
            finish = FinishReason::Stop;
            in_flight = next;
            break;
        }
        tokens.push(token);
        if sampler.uses_history() {
            history.push(token);
        }
        if on_token(token) == Flow::Stop {
            finish = FinishReason::Stop;
            in_flight = next;
            break;
        }
        if (limits.cancelled)() {
            finish = FinishReason::Cancelled;
            in_flight = next;
            break;
        }
        match next {
            Some(n) => y = n,
            None => break,
        }
    }
    if let Some(pending) = in_flight {
        eval([&pending]).phase("decode")?;
    }
    if let Some(p) = profile {
        p.report();
    }
    if max_tokens == 0 {
        prompt_seconds = start.elapsed().as_secs_f64();
    }
    let decode_seconds = first_at.map_or(0.0, |t| t.elapsed().as_secs_f64());
    // The caches hold the prompt and the `fed` tokens dispatched back into the
    // model; a token fed after an EOS or a stop is not part of the text: drop it.
    let fed = fed.min(tokens.len());
    let keep = (prompt.len() + fed) as i32;
    for cache in caches.iter_mut() {
        // A windowed layer that cannot go back leaves the caches unusable
        // for reuse; they are emptied (the caller's entry then misses).
        if !cache.rewind_to(keep).phase("decode")? {
            for c in caches.iter_mut() {
                *c = LayerKv::new(c.kind());
            }
            break;
        }
    }
    Ok(GenerateOutput {
        fed,
        tokens,
        finish,
        prompt_tokens: prompt.len(),
        cached_tokens: cached,
        prompt_seconds,
        decode_seconds,
        prompt_logits,
        step_logits,
    })
}
