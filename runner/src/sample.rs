//! Choosing the next token: logits processors and samplers with the semantics
//! of mlx-lm 0.32.2 (`mlx_lm/sample_utils.py`).
//!
//! Per step, as `generate_step` does there:
//! 1. processors on the raw logits, in mlx-lm's order: logit bias, repetition
//!    penalty, presence penalty, frequency penalty;
//! 2. `logprobs = logits - logsumexp(logits)`;
//! 3. temperature 0: `argmax(logprobs)`; otherwise top-p, then min-p, then
//!    top-k, then `categorical(logprobs * (1 / temperature))`.
//!
//! Everything stays on the device and lazy. Scalars take the logits' dtype, as
//! Python's weakly typed scalars do, so bf16 logits stay bf16 like in mlx-lm.
use std::time::{SystemTime, UNIX_EPOCH};

use half::{bf16, f16};
use mlx_rs::error::Result as MlxResult;
use mlx_rs::ops::indexing::{TryIndexOp, argmax_axis, scatter_add_single};
use mlx_rs::ops::{argpartition_axis, broadcast_to, concatenate, select, sort_axis};
use mlx_rs::{Array, Dtype, random};

use crate::error::{MlxPhase, Result, RunnerError};

/// mlx-lm's default window for the repetition, presence and frequency penalties.
pub const DEFAULT_CONTEXT_SIZE: usize = 20;

const PHASE: &str = "sampling";

/// How to choose each token. `Default` is greedy with no processors.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingOptions {
    /// 0 = greedy (argmax); otherwise sample from softmax(logprobs / temperature).
    pub temperature: f32,
    /// Keep only the `k` most likely tokens; `k >= vocab` keeps all.
    pub top_k: Option<u32>,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose
    /// probability sums to at least `p`; 1 keeps all.
    pub top_p: Option<f32>,
    /// Drop tokens whose probability is below `min_p` times the top one's; 0 keeps all.
    pub min_p: Option<f32>,
    /// Divide positive and multiply negative logits of recent tokens by this.
    pub repetition_penalty: Option<f32>,
    /// How many of the last tokens (prompt included) the repetition penalty sees.
    pub repetition_context_size: usize,
    /// Subtracted from a recent token's logit once per occurrence (OpenAI).
    pub frequency_penalty: Option<f32>,
    /// Subtracted from a recent token's logit once if it occurs at all (OpenAI).
    pub presence_penalty: Option<f32>,
    /// How many of the last tokens the frequency and presence penalties see.
    pub penalty_window: usize,
    /// Added to the logit of each listed token id.
    pub logit_bias: Vec<(u32, f32)>,
    /// Same seed, same options, same logits: same tokens. `None` seeds from the clock.
    pub seed: Option<u64>,
}

impl Default for SamplingOptions {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            min_p: None,
            repetition_penalty: None,
            repetition_context_size: DEFAULT_CONTEXT_SIZE,
            frequency_penalty: None,
            presence_penalty: None,
            penalty_window: DEFAULT_CONTEXT_SIZE,
            logit_bias: Vec::new(),
            seed: None,
        }
    }
}

fn bad(option: &str, value: impl std::fmt::Display, rule: &str) -> RunnerError {
    RunnerError::Request(format!("{option} must be {rule}, not {value}"))
}

impl SamplingOptions {
    /// Checks every option against a vocabulary of `vocab` tokens; the error
    /// names the first bad option and its value.
    pub fn validate(&self, vocab: usize) -> Result<()> {
        let t = self.temperature;
        if vocab == 0 {
            return Err(RunnerError::Request("the vocabulary is empty".into()));
        } else if !(t.is_finite() && t >= 0.0) {
            return Err(bad("temperature", t, "a finite number >= 0"));
        } else if self.top_k == Some(0) {
            return Err(bad("top_k", 0, "at least 1"));
        }
        if let Some(p) = self.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Err(bad("top_p", p, "in (0, 1]"));
        }
        if let Some(p) = self.min_p.filter(|p| !(0.0..=1.0).contains(p)) {
            return Err(bad("min_p", p, "in [0, 1]"));
        }
        if let Some(r) = self.repetition_penalty {
            if !(r.is_finite() && r > 0.0) {
                return Err(bad("repetition_penalty", r, "a finite number > 0"));
            } else if self.repetition_context_size == 0 {
                return Err(bad("repetition_context_size", 0, "at least 1"));
            }
        }
        let additive = [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ];
        for (name, v) in additive.into_iter().filter_map(|(n, v)| Some((n, v?))) {
            if !v.is_finite() {
                return Err(bad(name, v, "a finite number"));
            } else if self.penalty_window == 0 {
                return Err(bad("penalty_window", 0, "at least 1"));
            }
        }
        for (i, &(id, b)) in self.logit_bias.iter().enumerate() {
            if id as usize >= vocab {
                let rule = format!("below the vocabulary size {vocab}");
                return Err(bad("logit_bias token id", id, &rule));
            } else if !b.is_finite() {
                return Err(bad(&format!("logit_bias[{id}]"), b, "a finite number"));
            } else if self.logit_bias[..i].iter().any(|&(prev, _)| prev == id) {
                let msg = format!("logit_bias lists token id {id} more than once");
                return Err(RunnerError::Request(msg));
            }
        }
        Ok(())
    }
}

/// Chooses tokens from `[B, V]` logits (B is 1 in the decode loop), keeping
/// the PRNG key between steps.
#[derive(Debug)]
pub struct Sampler {
    vocab: usize,
    /// `1 / temperature`; `None` is greedy.
    inv_temp: Option<f32>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    top_k: Option<i32>,
    /// Penalty and context size.
    repetition: Option<(f32, usize)>,
    presence: Option<f32>,
    frequency: Option<f32>,
    penalty_window: usize,
    /// Token ids `[n]` (uint32) and their biases `[n, 1, 1]` (float32).
    bias: Option<(Array, Array)>,
    key: Option<Array>,
    seed: Option<u64>,
}

impl Sampler {
    /// Validates `opts` and prepares a sampler for logits over `vocab` tokens.
    pub fn new(opts: &SamplingOptions, vocab: usize) -> Result<Self> {
        opts.validate(vocab)?;
        // mlx-lm: temp == 0 is greedy and ignores the filters; top_p only when
        // 0 < p < 1, min_p only when != 0. A temperature so small that 1/t
        // overflows is greedy too (mlx-lm would produce NaNs there).
        let inv_temp = Some(1.0 / opts.temperature).filter(|v| v.is_finite());
        let seed = inv_temp.map(|_| opts.seed.unwrap_or_else(clock_seed));
        let key = seed.map(random::key).transpose();
        let key = key.phase("seeding the sampler")?;
        let bias = (!opts.logit_bias.is_empty()).then(|| {
            let n = opts.logit_bias.len() as i32;
            let (ids, values): (Vec<u32>, Vec<f32>) = opts.logit_bias.iter().copied().unzip();
            let ids = Array::from_slice(&ids, &[n]);
            (ids, Array::from_slice(&values, &[n, 1, 1]))
        });
        let nonzero = |v: Option<f32>| v.filter(|&x| x != 0.0);
        Ok(Self {
            vocab,
            inv_temp,
            top_p: opts.top_p.filter(|&p| p > 0.0 && p < 1.0),
            min_p: nonzero(opts.min_p),
            top_k: (opts.top_k.filter(|&k| (k as usize) < vocab)).map(|k| k as i32),
            // A penalty of 1 changes nothing; skip its kernels.
            repetition: (opts.repetition_penalty.filter(|&r| r != 1.0))
                .map(|r| (r, opts.repetition_context_size)),
            presence: nonzero(opts.presence_penalty),
            frequency: nonzero(opts.frequency_penalty),
            penalty_window: opts.penalty_window,
            bias,
            key,
            seed,
        })
    }

    /// The seed in use (drawn from the clock when none was given); `None` when greedy.
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }

    /// True when tokens are chosen by argmax.
    pub fn is_greedy(&self) -> bool {
        self.inv_temp.is_none()
    }

    /// True when [`Sampler::sample`] reads `history` (some penalty is on).
    pub fn uses_history(&self) -> bool {
        self.repetition.is_some() || self.presence.is_some() || self.frequency.is_some()
    }

    /// True when some logits processor (a bias or a penalty) is on.
    pub fn has_processors(&self) -> bool {
        self.bias.is_some() || self.uses_history()
    }

    /// Chooses the next token from `logits` (`[1, V]`, any float dtype).
    /// `history`: the ids so far (prompt + generated) for the penalties.
    /// Returns the id as a lazy `[1]` uint32 array.
    pub fn sample(&mut self, logits: &Array, history: &[u32]) -> Result<Array> {
        self.sample_after(logits, history, None)
    }

    /// Like [`Sampler::sample`] for a pipelined decode loop: `pending` is the
    /// last sampled id (`[1]` uint32, maybe not yet evaluated) that follows
    /// `history` but has not been read back yet. The penalties then see
    /// `history ++ [pending]` without forcing evaluation, as mlx-lm's lazy
    /// token array does.
    pub fn sample_after(
        &mut self,
        logits: &Array,
        history: &[u32],
        pending: Option<&Array>,
    ) -> Result<Array> {
        Ok(self.sample_processed(logits, history, pending)?.0)
    }

    /// Like [`Sampler::sample_after`], also returning the logits the token
    /// was drawn from: after the bias and the penalties (what its
    /// log-probabilities are computed from; see
    /// [`crate::logprobs::token_logprobs`]).
    pub fn sample_processed(
        &mut self,
        logits: &Array,
        history: &[u32],
        pending: Option<&Array>,
    ) -> Result<(Array, Array)> {
        let shape = logits.shape();
        if shape.len() != 2 || shape[1] as usize != self.vocab {
            let message = format!("logits have shape {shape:?}, expected [1, {}]", self.vocab);
            return Err(RunnerError::Mlx {
                phase: PHASE,
                message,
            });
        }
        let logits = self.process(logits, history, pending)?;
        let token = self.choose(&logits).phase(PHASE)?;
        Ok((token, logits))
    }

    /// As mlx-lm: log-probabilities, then argmax or filters and a categorical draw.
    fn choose(&mut self, logits: &Array) -> MlxResult<Array> {
        let (Some(inv_temp), Some(key)) = (self.inv_temp, self.key.as_mut()) else {
            return greedy_tokens(logits);
        };
        let mut x = logits.subtract(logits.logsumexp_axis(-1, true)?)?;
        if let Some(p) = self.top_p {
            x = apply_top_p(&x, p)?;
        }
        if let Some(p) = self.min_p {
            x = apply_min_p(&x, p)?;
        }
        if let Some(k) = self.top_k {
            x = apply_top_k(&x, k)?;
        }
        let (next, sub) = random::split(&*key, 2)?;
        *key = next;
        let scaled = x.multiply(scalar(inv_temp, x.dtype())?)?;
        random::categorical(&scaled, -1, None, &sub)
    }

    /// Checks the history the penalties will read, then runs the processors.
    fn process(&self, logits: &Array, history: &[u32], pending: Option<&Array>) -> Result<Array> {
        let windows = [
            self.repetition.map(|r| r.1),
            self.presence.map(|_| self.penalty_window),
            self.frequency.map(|_| self.penalty_window),
        ];
        let widest = windows.into_iter().flatten().max();
        if self.bias.is_none() && widest.is_none() {
            return Ok(logits.clone());
        }
        let tail = &history[history.len().saturating_sub(widest.unwrap_or(0))..];
        if let Some(bad) = tail.iter().find(|&&t| t as usize >= self.vocab) {
            let vocab = self.vocab;
            let msg = format!("history token id {bad} is outside the vocabulary of {vocab}");
            return Err(RunnerError::Request(msg));
        }
        self.processors(logits, history, pending).phase(PHASE)
    }

    /// The logits processors, in mlx-lm's order, with mlx-lm's scatter modes.
    fn processors(&self, x: &Array, hist: &[u32], last: Option<&Array>) -> MlxResult<Array> {
        let (dtype, rows) = (x.dtype(), x.shape()[0]);
        let mut x = x.clone();
        if let Some((ids, values)) = &self.bias {
            // `logits.at[:, ids].add(values)`
            let upd = broadcast_to(values.as_dtype(dtype)?, &[ids.shape()[0], rows, 1])?;
            x = scatter_add_single(&x, ids, &upd, 1)?;
        }
        if let Some((penalty, size)) = self.repetition
            && let Some(ids) = window(hist, last, size)?
        {
            // `logits[:, tokens] = where(sel < 0, sel * penalty, sel / penalty)`
            let (idx, p) = (along(&ids, rows)?, scalar(penalty, dtype)?);
            let sel = x.take_along_axis(&idx, -1)?;
            let neg = sel.lt(scalar(0.0, dtype)?)?;
            let adj = select(&neg, sel.multiply(&p)?, sel.divide(&p)?)?;
            x = x.put_along_axis(&idx, &adj, -1)?;
        }
        if let Some(penalty) = self.presence
            && let Some(ids) = window(hist, last, self.penalty_window)?
        {
            // `logits[:, tokens] -= penalty`: once per distinct id.
            let idx = along(&ids, rows)?;
            let sel = x.take_along_axis(&idx, -1)?;
            let adj = sel.subtract(scalar(penalty, dtype)?)?;
            x = x.put_along_axis(&idx, &adj, -1)?;
        }
        if let Some(penalty) = self.frequency
            && let Some(ids) = window(hist, last, self.penalty_window)?
        {
            // `logits.at[:, tokens].subtract(penalty)`: once per occurrence.
            let upd = broadcast_to(scalar(-penalty, dtype)?, &[ids.shape()[0], rows, 1])?;
            x = scatter_add_single(&x, &ids, &upd, 1)?;
        }
        Ok(x)
    }
}

/// The last `size` ids of `history ++ [pending]` as a `[n]` uint32 array.
fn window(history: &[u32], pending: Option<&Array>, size: usize) -> MlxResult<Option<Array>> {
    let from_history = size.saturating_sub(usize::from(pending.is_some()));
    let tail = &history[history.len().saturating_sub(from_history)..];
    let tail = (!tail.is_empty()).then(|| Array::from_slice(tail, &[tail.len() as i32]));
    let pending = pending.map(|p| p.reshape(&[1])?.as_dtype(Dtype::Uint32));
    let pending = pending.transpose()?;
    Ok(match (tail, pending) {
        (Some(t), Some(p)) => Some(concatenate(&[t, p], 0)?),
        (t, p) => t.or(p),
    })
}

/// `[n]` ids as `[rows, n]` indices for `take_along_axis`/`put_along_axis`.
fn along(ids: &Array, rows: i32) -> MlxResult<Array> {
    broadcast_to(ids.reshape(&[1, -1])?, &[rows, ids.shape()[0]])
}

/// A 0-d array of `value` in `dtype`, like a Python float next to an array.
fn scalar(value: f32, dtype: Dtype) -> MlxResult<Array> {
    match dtype {
        Dtype::Float32 => Ok(Array::from_f32(value)),
        Dtype::Bfloat16 => Ok(Array::from_slice(&[bf16::from_f32(value)], &[])),
        Dtype::Float16 => Ok(Array::from_slice(&[f16::from_f32(value)], &[])),
        other => Array::from_f32(value).as_dtype(other),
    }
}

/// Each row's greedy token of `logits` (`[B, V]`): mlx-lm's
/// `argmax(logits - logsumexp(logits))`, `[B]` uint32; on a CUDA GPU by
/// Grove's greedy pick (one node of two kernels), else MLX's operations.
pub fn greedy_tokens(logits: &Array) -> MlxResult<Array> {
    if logits.ndim() == 2
        && let Some(t) = crate::model::layers::cuda_pick::greedy_pick(logits)?
    {
        return Ok(t);
    }
    let x = logits.subtract(logits.logsumexp_axis(-1, true)?)?;
    argmax_axis(&x, -1, None)
}

/// mlx-lm's `apply_top_p`: drop the tokens whose strictly-more-likely tokens
/// already hold at least `top_p` of the mass (ties at the threshold are kept).
fn apply_top_p(logprobs: &Array, top_p: f32) -> MlxResult<Array> {
    let sorted = sort_axis(logprobs, -1)?;
    let probs = sorted.as_dtype(Dtype::Float32)?.exp()?;
    let mass_above = probs.cumsum(-1, true, false)?;
    let first = |a: &Array| a.try_index((.., ..1));
    let total = first(&mass_above)?.add(first(&probs)?)?;
    let limit = total.multiply(Array::from_f32(top_p))?;
    let dropped = mass_above.ge(&limit)?.sum_axis(-1, true)?;
    let threshold = sorted.take_along_axis(&dropped, -1)?;
    let ninf = scalar(f32::NEG_INFINITY, logprobs.dtype())?;
    select(logprobs.lt(&threshold)?, &ninf, logprobs)
}

/// mlx-lm's `apply_min_p` (min_tokens_to_keep = 1): drop tokens with
/// `logprob < max_logprob + ln(min_p)`.
fn apply_min_p(logprobs: &Array, min_p: f32) -> MlxResult<Array> {
    let (dtype, top) = (logprobs.dtype(), logprobs.max_axis(-1, true)?);
    let floor = top.add(scalar(min_p.ln(), dtype)?)?;
    let ninf = scalar(f32::NEG_INFINITY, dtype)?;
    select(logprobs.lt(&floor)?, &ninf, logprobs)
}

/// mlx-lm's `apply_top_k`: -inf everywhere but the `top_k` largest (0 < k < V).
fn apply_top_k(logprobs: &Array, top_k: i32) -> MlxResult<Array> {
    let order = argpartition_axis(logprobs.negative()?, top_k - 1, -1)?;
    let rest = order.try_index((.., top_k..))?;
    logprobs.put_along_axis(&rest, scalar(f32::NEG_INFINITY, logprobs.dtype())?, -1)
}

/// A seed for when none was given.
fn clock_seed() -> u64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH);
    let nanos = since_epoch.map_or(0, |d| d.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::transforms::eval;

    const L: [f32; 10] = [1.2, 0.3, -0.5, 2.0, 1.9, -1.0, 0.0, 0.7, 1.1, -2.3];
    const PROBS: [f32; 4] = [0.3, 0.05, 0.5, 0.15];

    fn row(values: &[f32]) -> Array {
        Array::from_slice(values, &[1, values.len() as i32])
    }

    fn read<T: mlx_rs::ArrayElement + Clone>(a: &Array) -> Vec<T> {
        let a = a.as_dtype(T::DTYPE).unwrap();
        eval([&a]).unwrap();
        a.as_slice::<T>().to_vec()
    }

    /// Options at `temperature` with `seed`, then edited by `edit`.
    fn with(t: f32, seed: u64, edit: impl FnOnce(&mut SamplingOptions)) -> SamplingOptions {
        let mut o = SamplingOptions::default();
        (o.temperature, o.seed) = (t, Some(seed));
        edit(&mut o);
        o
    }

    /// `n` independent draws in one call: the `[1, V]` row broadcast to `[n, V]`.
    fn draws(o: &SamplingOptions, values: &[f32], n: i32) -> Vec<u32> {
        let mut s = Sampler::new(o, values.len()).unwrap();
        let many = broadcast_to(row(values), &[n, values.len() as i32]).unwrap();
        read(&s.sample(&many, &[]).unwrap())
    }

    /// A decode loop over fixed logits `L`; history = prompt + generated.
    fn sequence(o: &SamplingOptions, dtype: Dtype, pipelined: bool) -> Vec<u32> {
        let mut s = Sampler::new(o, L.len()).unwrap();
        let logits = row(&L).as_dtype(dtype).unwrap();
        let mut history = vec![3, 4, 3, 7];
        let mut pending: Option<Array> = None;
        for _ in 0..16 {
            let y = s.sample_after(&logits, &history, pending.as_ref()).unwrap();
            assert_eq!((y.shape(), y.dtype()), (&[1][..], Dtype::Uint32));
            if let Some(p) = pending.take() {
                history.push(read(&p)[0]);
            }
            match pipelined {
                true => pending = Some(y),
                false => history.push(read(&y)[0]),
            }
        }
        history.extend(pending.map(|p| read::<u32>(&p)[0]));
        history.split_off(4)
    }

    fn case_c() -> SamplingOptions {
        with(1.0, 123, |o| {
            o.top_p = Some(0.95);
            (o.repetition_penalty, o.repetition_context_size) = (Some(1.3), 6);
            (o.presence_penalty, o.frequency_penalty) = (Some(0.4), Some(0.25));
            o.logit_bias = vec![(5, 2.0), (3, -0.5)];
        })
    }

    /// Which ids of `probs` survive a filter applied to their log-probabilities.
    fn kept(filter: impl Fn(&Array) -> MlxResult<Array>, probs: &[f32]) -> Vec<usize> {
        let lp: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let out: Vec<f32> = read(&filter(&row(&lp)).unwrap());
        (0..probs.len()).filter(|&i| out[i].is_finite()).collect()
    }

    fn processed(o: &SamplingOptions, values: &[f32], history: &[u32]) -> Vec<f32> {
        let s = Sampler::new(o, values.len()).unwrap();
        read(&s.process(&row(values), history, None).unwrap())
    }

    fn greedy(o: &SamplingOptions, values: &[f32], history: &[u32]) -> u32 {
        let mut s = Sampler::new(o, values.len()).unwrap();
        read(&s.sample(&row(values), history).unwrap())[0]
    }

    #[test]
    fn greedy_picks_argmax() {
        for dtype in [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
            let mut s = Sampler::new(&SamplingOptions::default(), L.len()).unwrap();
            assert!(s.is_greedy() && s.seed().is_none());
            let y = s.sample(&row(&L).as_dtype(dtype).unwrap(), &[]).unwrap();
            assert_eq!(read::<u32>(&y), vec![3]);
        }
    }

    /// Token sequences produced by mlx-lm 0.32.2 (`make_sampler`,
    /// `make_logits_processors`, `mx.random.seed`) for the same inputs, in
    /// float32 and bfloat16, read back each step or pipelined.
    #[test]
    fn matches_mlx_lm_token_for_token() {
        let b = with(0.75, 7, |o| {
            (o.top_p, o.min_p, o.top_k) = (Some(0.9), Some(0.05), Some(6))
        });
        let d = with(0.0, 0, |o| {
            (o.repetition_penalty, o.repetition_context_size) = (Some(1.5), 4);
            o.frequency_penalty = Some(0.3);
        });
        #[rustfmt::skip]
        let cases = [
            (with(0.75, 42, |_| ()), [8, 3, 0, 4, 4, 0, 3, 4, 4, 4, 3, 4, 3, 3, 4, 8]),
            (b, [0, 8, 3, 3, 3, 0, 4, 3, 0, 3, 4, 4, 8, 3, 3, 3]),
            (case_c(), [0, 8, 2, 0, 5, 5, 6, 7, 4, 4, 5, 7, 1, 3, 3, 1]),
            (d, [0, 8, 4, 3, 4, 0, 8, 3, 7, 4, 0, 8, 3, 1, 4, 0]),
        ];
        for (o, want) in &cases {
            for dtype in [Dtype::Float32, Dtype::Bfloat16] {
                for pipelined in [false, true] {
                    assert_eq!(sequence(o, dtype, pipelined), want, "{o:?} {dtype:?}");
                }
            }
        }
    }

    #[test]
    fn seeded_runs_repeat_and_seeds_differ() {
        let flat = [0.0f32; 16];
        let a = draws(&with(1.0, 5, |_| ()), &flat, 64);
        assert_eq!(a, draws(&with(1.0, 5, |_| ()), &flat, 64));
        assert_ne!(a, draws(&with(1.0, 6, |_| ()), &flat, 64));
        // Successive steps use fresh keys.
        let mut s = Sampler::new(&with(1.0, 5, |_| ()), 16).unwrap();
        let many = broadcast_to(row(&flat), &[64, 16]).unwrap();
        assert_eq!(read::<u32>(&s.sample(&many, &[]).unwrap()), a);
        assert_ne!(read::<u32>(&s.sample(&many, &[]).unwrap()), a);
    }

    #[test]
    fn draws_follow_softmax_over_temperature() {
        let (n, t, values) = (4000, 0.7f32, [0.5f32, 1.0, -0.3, 2.0, 0.0]);
        let got = draws(&with(t, 11, |_| ()), &values, n);
        let z: f32 = values.iter().map(|v| (v / t).exp()).sum();
        for (i, v) in values.iter().enumerate() {
            let freq = got.iter().filter(|&&g| g as usize == i).count() as f32 / n as f32;
            let p = (v / t).exp() / z;
            // 4 standard deviations of a frequency over 4000 draws is <= 0.032.
            assert!((freq - p).abs() < 0.032, "token {i}: {freq} vs {p}");
        }
    }

    #[test]
    fn top_k_keeps_the_k_best() {
        let got = draws(&with(1.0, 3, |o| o.top_k = Some(2)), &L, 4000);
        assert!(got.iter().all(|&g| g == 3 || g == 4));
        assert!(got.contains(&3) && got.contains(&4));
        // k >= vocab keeps everything.
        assert!(draws(&with(1.0, 3, |o| o.top_k = Some(10)), &L, 4000).contains(&9));
    }

    #[test]
    fn top_p_keeps_smallest_set_reaching_p() {
        // Sorted: 0.5 (id 2), 0.3 (id 0), 0.15 (id 3), 0.05 (id 1).
        #[rustfmt::skip]
        let cases = [(0.45, vec![2]), (0.5, vec![2]), (0.6, vec![0, 2]), (0.799, vec![0, 2]),
            (0.801, vec![0, 2, 3]), (0.95, vec![0, 2, 3]), (0.99, vec![0, 1, 2, 3])];
        for (p, want) in cases {
            assert_eq!(kept(|x| apply_top_p(x, p), &PROBS), want, "top_p {p}");
        }
        // Tied tokens at the threshold are all kept.
        assert_eq!(kept(|x| apply_top_p(x, 0.3), &[0.25; 4]), vec![0, 1, 2, 3]);
        let lp: Vec<f32> = PROBS.iter().map(|p| p.ln()).collect();
        let got = draws(&with(1.0, 9, |o| o.top_p = Some(0.6)), &lp, 2000);
        assert!(got.iter().all(|&g| g == 0 || g == 2));
    }

    #[test]
    fn min_p_drops_below_fraction_of_max() {
        assert_eq!(kept(|x| apply_min_p(x, 0.2), &PROBS), vec![0, 2, 3]);
        assert_eq!(kept(|x| apply_min_p(x, 0.5), &PROBS), vec![0, 2]);
        assert_eq!(kept(|x| apply_min_p(x, 1.0), &PROBS), vec![2]);
    }

    #[test]
    fn repetition_penalty_divides_positive_multiplies_negative() {
        let values = [2.0f32, 1.8, -1.0, -1.2, 0.5];
        let o = with(0.0, 0, |o| {
            (o.repetition_penalty, o.repetition_context_size) = (Some(1.5), 3)
        });
        let out = processed(&o, &values, &[0, 2]);
        assert_eq!(out, vec![2.0 / 1.5, 1.8, -1.5, -1.2, 0.5]);
        assert_eq!(greedy(&o, &values, &[0, 2]), 1);
        // Id 0 has left the 3-token window: untouched, still the argmax.
        let out = processed(&o, &values, &[0, 3, 3, 3]);
        assert_eq!(out, vec![2.0, 1.8, -1.0, -1.2f32 * 1.5, 0.5]);
        assert_eq!(greedy(&o, &values, &[0, 3, 3, 3]), 0);
    }

    #[test]
    fn frequency_and_presence_subtract_per_count_and_once() {
        let o = with(0.0, 0, |o| {
            (o.frequency_penalty, o.presence_penalty) = (Some(0.5), Some(0.25));
            o.penalty_window = 4;
        });
        // Window [1, 1, 2, 4]; the 5 and the leading 1s are outside it.
        let out = processed(&o, &[0.0; 6], &[5, 1, 1, 1, 1, 2, 4]);
        assert_eq!(out, vec![0.0, -1.25, -0.75, 0.0, -0.75, 0.0]);
        assert_eq!(greedy(&o, &[0.0, 0.9, 0.0, 0.0, 0.0, -1.0], &[1, 1]), 0);
    }

    #[test]
    fn processors_match_mlx_lm_values() {
        // From mlx-lm 0.32.2 with the same options and tokens.
        #[rustfmt::skip]
        let want = [
            (Dtype::Float32, [1.2, 0.3, -0.5, -0.24615383, 1.25, 0.11923078, 0.0, -0.11153844, 1.1, -3.64]),
            (Dtype::Bfloat16, [1.203125, 0.30078125, -0.5, -0.2421875, 1.25, 0.119140625, 0.0,
                -0.111328125, 1.1015625, -3.640625]),
        ];
        let s = Sampler::new(&case_c(), L.len()).unwrap();
        let history = [3, 4, 3, 7, 3, 3, 5, 9];
        for (dtype, want) in want {
            let x = s
                .process(&row(&L).as_dtype(dtype).unwrap(), &history, None)
                .unwrap();
            assert_eq!(x.dtype(), dtype);
            let got: Vec<f32> = read(&x);
            assert!(
                got.iter().zip(want).all(|(g, w)| (g - w).abs() <= 1e-6),
                "{got:?}"
            );
        }
    }

    #[test]
    fn logit_bias_shifts() {
        let o = with(0.0, 0, |o| o.logit_bias = vec![(9, 10.0), (3, -100.0)]);
        let out = processed(&o, &L, &[]);
        assert_eq!((out[9], out[3], out[0]), (-2.3 + 10.0, 2.0 - 100.0, 1.2));
        assert_eq!(greedy(&o, &L, &[]), 9);
    }

    #[test]
    fn validation_names_the_bad_option() {
        type Edit = fn(&mut SamplingOptions);
        #[rustfmt::skip]
        let cases: [(Edit, &str); 18] = [
            (|o| o.temperature = -0.1, "temperature"),
            (|o| o.temperature = f32::NAN, "temperature"),
            (|o| o.temperature = f32::INFINITY, "temperature"),
            (|o| o.top_k = Some(0), "top_k"),
            (|o| o.top_p = Some(0.0), "top_p"),
            (|o| o.top_p = Some(1.5), "top_p"),
            (|o| o.top_p = Some(f32::NAN), "top_p"),
            (|o| o.min_p = Some(-0.1), "min_p"),
            (|o| o.min_p = Some(f32::NAN), "min_p"),
            (|o| o.repetition_penalty = Some(0.0), "repetition_penalty"),
            (|o| o.repetition_penalty = Some(f32::NAN), "repetition_penalty"),
            (|o| (o.repetition_penalty, o.repetition_context_size) = (Some(1.1), 0), "repetition_context_size"),
            (|o| o.frequency_penalty = Some(f32::INFINITY), "frequency_penalty"),
            (|o| o.presence_penalty = Some(f32::NAN), "presence_penalty"),
            (|o| (o.presence_penalty, o.penalty_window) = (Some(0.5), 0), "penalty_window"),
            (|o| o.logit_bias = vec![(10, 1.0)], "logit_bias"),
            (|o| o.logit_bias = vec![(1, f32::NAN)], "logit_bias"),
            (|o| o.logit_bias = vec![(1, 1.0), (1, 2.0)], "logit_bias"),
        ];
        for (edit, name) in cases {
            let o = with(0.5, 0, edit);
            match Sampler::new(&o, 10) {
                Err(RunnerError::Request(m)) => assert!(m.contains(name), "{m}"),
                other => panic!("{o:?} gave {other:?}"),
            }
        }
        let ok = with(0.5, 0, |o| {
            (o.top_p, o.min_p, o.top_k) = (Some(1.0), Some(0.0), Some(50));
            o.presence_penalty = Some(-1.0);
        });
        assert!(ok.validate(10).is_ok());
        let mut s = Sampler::new(&ok, 10).unwrap();
        let out_of_vocab = s.sample(&row(&L), &[10]);
        assert!(matches!(out_of_vocab, Err(RunnerError::Request(_))));
        assert!(s.sample(&row(&[0.0; 4]), &[]).is_err());
    }
}
