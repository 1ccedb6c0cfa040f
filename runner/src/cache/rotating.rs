//! One sliding-window layer's keys and values: mlx-lm's `RotatingKVCache(max_size, keep)`
//! line for line, so attention sees the same arrays (same order, same lengths) and masks.
//!
//! Multi-token chunks take the concatenating path: the buffer is put back in temporal
//! order, trimmed to `max_size - 1` tokens (the first `keep` always stay) and the chunk
//! appended, so every new token sees at least `max_size` keys. Single tokens are written
//! in place: the buffer grows in 256-token steps up to `max_size`, then the write index
//! wraps round to `keep`, overwriting the oldest token. The returned arrays are therefore
//! not in temporal order once the window has wrapped; [`RotatingKvCache::make_mask`]
//! gives the mask that matches them.
use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::{TryIndexMutOp, TryIndexOp};
use mlx_rs::ops::{concatenate, zeros_dtype};

/// Tokens added per growth step of the in-place path (mlx-lm's `RotatingKVCache.step`).
pub const STEP: i32 = 256;

/// The attention mask for the next chunk, as mlx-lm's `make_mask` returns it
/// (a boolean array is `[N, offset + N]` for a chunk, `[mask_size]` for one token).
pub type WindowMask = super::AttentionMask;

/// Keys and values of one sliding-window attention layer, `[B, kv_heads, T, head_dim]`
/// with `T` at most `max_size` between single-token steps (`max_size - 1 + L` right
/// after an `L`-token chunk). Cloning shares the buffers until either side writes.
#[derive(Clone)]
pub struct RotatingKvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
    max_size: i32,
    keep: i32,
    /// Where the next in-place token goes (mlx-lm's `_idx`).
    idx: i32,
}

impl RotatingKvCache {
    /// An empty cache keeping the last `max_size` tokens, of which the first `keep`
    /// tokens of the sequence are never evicted.
    pub fn new(max_size: i32, keep: i32) -> Self {
        Self {
            keys: None,
            values: None,
            offset: 0,
            max_size,
            keep,
            idx: 0,
        }
    }

    /// Tokens seen (not held: at most `max_size` are kept between decode steps).
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// The window size.
    pub fn max_size(&self) -> i32 {
        self.max_size
    }

    /// Tokens that are never evicted.
    pub fn keep(&self) -> i32 {
        self.keep
    }

    /// Tokens in the window, `min(offset, max_size)` (mlx-lm's `size()`).
    pub fn size(&self) -> i32 {
        self.offset.min(self.max_size)
    }

    /// Whether nothing was ever stored (mlx-lm's `empty()`).
    pub fn is_empty(&self) -> bool {
        self.keys.is_none()
    }

    /// Appends `keys`/`values` (`[B, H, L, D]`) and returns what attention should see:
    /// in place for `L == 1`, by concatenation otherwise (mlx-lm's `update_and_fetch`).
    pub fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), Exception> {
        if keys.dim(2) == 1 {
            self.update_in_place(keys, values)
        } else {
            self.update_concat(keys, values)
        }
    }

    /// `_trim`: drops `trim_size` tokens after the first `keep`, then appends `append`.
    fn trim_cat(
        &self,
        trim_size: i32,
        v: &Array,
        append: Option<&Array>,
    ) -> Result<Array, Exception> {
        let mut parts = Vec::with_capacity(3);
        if trim_size > 0 {
            parts.push(v.try_index((.., .., ..self.keep, ..))?);
            parts.push(v.try_index((.., .., (trim_size + self.keep).., ..))?);
        } else {
            parts.push(v.clone());
        }
        if let Some(append) = append {
            parts.push(append.clone());
        }
        concatenate(&parts, 2)
    }

    /// `_temporal_order`: the buffer oldest-first, cut at the write index when unused.
    fn temporal_order(&self, v: &Array) -> Result<Array, Exception> {
        if self.idx == v.dim(2) {
            Ok(v.clone())
        } else if self.idx < self.offset {
            concatenate(
                &[
                    v.try_index((.., .., ..self.keep, ..))?,
                    v.try_index((.., .., self.idx.., ..))?,
                    v.try_index((.., .., self.keep..self.idx, ..))?,
                ],
                2,
            )
        } else {
            v.try_index((.., .., ..self.idx, ..))
        }
    }

    /// `_update_concat`.
    fn update_concat(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array), Exception> {
        match (self.keys.take(), self.values.take()) {
            (Some(held_k), Some(held_v)) => {
                // Temporal order first, to keep the context.
                let held_k = self.temporal_order(&held_k)?;
                let held_v = self.temporal_order(&held_v)?;
                self.idx = held_k.dim(2);
                // At most max_size - 1 + L, so every new token sees max_size keys.
                let trim_size = self.idx - self.max_size + 1;
                self.keys = Some(self.trim_cat(trim_size, &held_k, Some(keys))?);
                self.values = Some(self.trim_cat(trim_size, &held_v, Some(values))?);
            }
            _ => {
                self.keys = Some(keys.clone());
                self.values = Some(values.clone());
            }
        }
        self.offset += keys.dim(2);
        let (Some(k), Some(v)) = (self.keys.as_ref(), self.values.as_ref()) else {
            unreachable!("buffers were set above")
        };
        self.idx = k.dim(2);
        Ok((k.clone(), v.clone()))
    }

    /// `_update_in_place`.
    fn update_in_place(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), Exception> {
        let (b, heads, s, k_head_dim) = (keys.dim(0), keys.dim(1), keys.dim(2), keys.dim(3));
        let prev = self.offset;
        let grow = match &self.keys {
            None => true,
            Some(k) => prev >= k.dim(2) && k.dim(2) < self.max_size,
        };
        if grow {
            let new_size = STEP.min(self.max_size - prev);
            let new_k = zeros_dtype(&[b, heads, new_size, k_head_dim], keys.dtype())?;
            let new_v = zeros_dtype(&[b, heads, new_size, values.dim(3)], values.dtype())?;
            match (self.keys.take(), self.values.take()) {
                (Some(held_k), Some(held_v)) => {
                    self.keys = Some(concatenate(&[held_k, new_k], 2)?);
                    self.values = Some(concatenate(&[held_v, new_v], 2)?);
                }
                _ => {
                    self.keys = Some(new_k);
                    self.values = Some(new_v);
                }
            }
            self.idx = prev;
        }
        let (Some(held_k), Some(held_v)) = (self.keys.take(), self.values.take()) else {
            unreachable!("buffers were allocated above")
        };

        // Trim if needed (a chunk left the buffer longer than the window).
        let trim_size = held_k.dim(2) - self.max_size;
        let (mut k, mut v) = if trim_size > 0 {
            let k = self.trim_cat(trim_size, &held_k, None)?;
            let v = self.trim_cat(trim_size, &held_v, None)?;
            self.idx = self.max_size;
            (k, v)
        } else {
            (held_k, held_v)
        };

        // Rotate.
        if self.idx == self.max_size {
            self.idx = self.keep;
        }

        // Assign.
        k.try_index_mut((.., .., self.idx..self.idx + s, ..), keys)?;
        v.try_index_mut((.., .., self.idx..self.idx + s, ..), values)?;
        self.offset += s;
        self.idx += s;

        // keys_and_values()
        let out = if self.offset < k.dim(2) {
            (
                k.try_index((.., .., ..self.offset, ..))?,
                v.try_index((.., .., ..self.offset, ..))?,
            )
        } else {
            (k.clone(), v.clone())
        };
        self.keys = Some(k);
        self.values = Some(v);
        Ok(out)
    }

    /// A cache that has seen `offset` tokens and holds the last `keys.dim(2)`
    /// of them oldest first (`[1, H, T, D]`), as after a chunk (`_update_concat`).
    /// `None` when it holds too few for the next token to see its window.
    pub fn from_temporal(keys: Array, values: Array, offset: i32, max_size: i32) -> Option<Self> {
        let held = keys.dim(2);
        if held > offset || held < offset.min(max_size) {
            return None;
        }
        Some(Self {
            idx: held,
            keys: Some(keys),
            values: Some(values),
            offset,
            max_size,
            keep: 0,
        })
    }

    /// The tokens held, oldest first, and how many (the last of `offset`).
    pub fn temporal(&self) -> Result<Option<(Array, Array)>, Exception> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => {
                let (k, v) = (self.temporal_order(k)?, self.temporal_order(v)?);
                let held = k.dim(2).min(self.offset);
                Ok(Some((
                    k.try_index((.., .., ..held, ..))?,
                    v.try_index((.., .., ..held, ..))?,
                )))
            }
            _ => Ok(None),
        }
    }

    /// The same cache holding only what its next token needs, the last
    /// `max_size` tokens at most, in buffers of its own (a chunk leaves up to
    /// `max_size - 1 + L` tokens, and a view would keep them all alive).
    pub fn compacted(&self) -> Result<Self, Exception> {
        let Some((k, v)) = self.temporal()? else {
            return Ok(self.clone());
        };
        if self.keep != 0 {
            return Ok(self.clone());
        }
        let held = k.dim(2);
        let kept = held.min(self.max_size);
        let copy = |x: &Array| -> Result<Array, Exception> {
            let part = x.try_index((.., .., held - kept.., ..))?;
            let mut fresh = zeros_dtype(part.shape(), part.dtype())?;
            fresh.try_index_mut((.., .., .., ..), &part)?;
            Ok(fresh)
        };
        Ok(Self {
            keys: Some(copy(&k)?),
            values: Some(copy(&v)?),
            offset: self.offset,
            max_size: self.max_size,
            keep: 0,
            idx: kept,
        })
    }

    /// Forgets the last `n` tokens when the window of the token that then
    /// comes next is still held: always before anything was evicted, else
    /// when at least `max_size` tokens remain (they are put back in temporal
    /// order). False, and nothing changed, when that cannot be.
    pub fn rewind(&mut self, n: i32) -> Result<bool, Exception> {
        let n = n.min(self.offset).max(0);
        if n == 0 {
            return Ok(true);
        }
        if self.is_trimmable() {
            self.trim(n);
            return Ok(true);
        }
        if self.keep != 0 {
            return Ok(false);
        }
        let Some((k, v)) = self.temporal()? else {
            return Ok(false);
        };
        let left = k.dim(2) - n;
        let offset = self.offset - n;
        if left < offset.min(self.max_size) {
            return Ok(false);
        }
        self.keys = Some(k.try_index((.., .., ..left, ..))?);
        self.values = Some(v.try_index((.., .., ..left, ..))?);
        self.offset = offset;
        self.idx = left;
        Ok(true)
    }

    /// The mask for the next chunk of `n` tokens, taken before the update, as
    /// `cache.make_mask(n)` with no window size (`"causal"` or a window array for
    /// chunks, none for single tokens).
    pub fn make_mask(&self, n: i32) -> Result<WindowMask, Exception> {
        self.make_mask_with(n, None, false)
    }

    /// mlx-lm's `make_mask(N, window_size, return_array)`, which is what
    /// `create_attention_mask(h, cache, window_size=..., return_array=...)` returns.
    ///
    /// For `n > 1`: the `[n, offset' + n]` window mask of `create_causal_mask` (with
    /// `offset' = min(max_size - 1, offset)` and the window `window_size` or else
    /// `max_size`) when the chunk reaches past the window or `return_array`, else
    /// `Causal`. For `n <= 1`: `None` unless a `window_size` smaller than `max_size` is
    /// given and `offset >= window_size`, then the 1-D mask over the (rotated) buffer
    /// that keeps only the last `window_size` tokens.
    pub fn make_mask_with(
        &self,
        n: i32,
        window_size: Option<i32>,
        return_array: bool,
    ) -> Result<WindowMask, Exception> {
        if n > 1 {
            // Python's `window_size or self.max_size`: 0 counts as unset.
            let window = window_size.filter(|&w| w != 0).unwrap_or(self.max_size);
            let offset = (self.max_size - 1).min(self.offset);
            if offset + n > window || return_array {
                Ok(WindowMask::Array(causal_mask(n, offset, Some(window))?))
            } else {
                Ok(WindowMask::Causal)
            }
        } else {
            let Some(window) = window_size else {
                return Ok(WindowMask::None);
            };
            // A mask is needed when the window is smaller than the buffer.
            if self.offset >= window && self.max_size > window {
                let idx = if self.idx >= self.max_size {
                    0
                } else {
                    self.idx
                };
                let mask_size = if self.offset < self.max_size {
                    self.offset + 1
                } else {
                    self.max_size
                };
                let mask = Array::arange::<_, i32>(None, mask_size, None)?
                    .ge(Array::from_int(mask_size - window))?;
                Ok(WindowMask::Array(roll_1d(&mask, idx + 1)?))
            } else {
                Ok(WindowMask::None)
            }
        }
    }

    /// Whether `trim` may be used: only while nothing has been evicted
    /// (`offset < max_size`).
    pub fn is_trimmable(&self) -> bool {
        self.offset < self.max_size
    }

    /// Forgets the last `n` tokens (the buffers stay); returns how many went. As in
    /// mlx-lm it only moves `offset` and the write index, so use it only while
    /// [`Self::is_trimmable`].
    pub fn trim(&mut self, n: i32) -> i32 {
        let n = n.min(self.offset).max(0);
        self.offset -= n;
        self.idx -= n;
        n
    }

    /// The buffers, for evaluation after a prefill chunk.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys.iter().chain(self.values.iter())
    }

    /// Bytes held by the buffers (their whole length, not just the used part).
    pub fn nbytes(&self) -> usize {
        self.arrays().map(Array::nbytes).sum()
    }
}

/// mlx-lm's `create_causal_mask(N, offset, window_size)`: `[n, offset + n]` bools, query
/// `i` (at position `offset + i`) sees key `j` when `j <= offset + i < j + window`.
pub(crate) fn causal_mask(
    n: i32,
    offset: i32,
    window_size: Option<i32>,
) -> Result<Array, Exception> {
    let rinds = Array::arange::<_, i32>(None, offset + n, None)?;
    let linds = Array::arange::<_, i32>(offset, offset + n, None)?.reshape(&[n, 1])?;
    let rinds = rinds.reshape(&[1, offset + n])?;
    let mask = linds.ge(&rinds)?;
    match window_size {
        Some(window) => mask.logical_and(linds.lt(rinds.add(Array::from_int(window))?)?),
        None => Ok(mask),
    }
}

/// `mx.roll(x, shift)` for a 1-D array: element `i` moves to `(i + shift) mod len`.
fn roll_1d(x: &Array, shift: i32) -> Result<Array, Exception> {
    let len = x.dim(0);
    if len == 0 {
        return Ok(x.clone());
    }
    let shift = shift.rem_euclid(len);
    if shift == 0 {
        return Ok(x.clone());
    }
    concatenate(
        &[x.try_index(len - shift..)?, x.try_index(..len - shift)?],
        0,
    )
}

#[cfg(test)]
mod tests {
    //! Replays runner/tests-data/rotating.json, written by gen_rotating.py from mlx-lm
    //! 0.32.2's RotatingKVCache: same ops, same inputs; the returned keys/values must be
    //! equal element for element, and the masks, offsets, trimmability, trim counts and
    //! byte counts the same.
    use super::*;
    use mlx_rs::Dtype;
    use serde_json::Value;

    fn code(tok: i64, h: i32, d: i32) -> f32 {
        (1 + tok * 12 + i64::from(h) * 4 + i64::from(d)) as f32
    }

    /// `[1, heads, toks.len(), dim]`, the generator's encoding; `None` is an all-zero slot.
    fn encode(toks: &[Option<i64>], heads: i32, dim: i32, sign: f32, dtype: Dtype) -> Array {
        let mut data = Vec::new();
        for h in 0..heads {
            for tok in toks {
                for d in 0..dim {
                    data.push(tok.map_or(0.0, |t| sign * code(t, h, d)));
                }
            }
        }
        let shape = [1, heads, toks.len() as i32, dim];
        Array::from_slice(&data, &shape).as_dtype(dtype).unwrap()
    }

    fn floats(a: &Array) -> Vec<f32> {
        // flatten copies a strided view (a slice of the buffer) into a contiguous array.
        let a = a.as_type::<f32>().unwrap().flatten(None, None).unwrap();
        a.eval().unwrap();
        a.as_slice::<f32>().to_vec()
    }

    fn describe(mask: &WindowMask) -> String {
        match mask {
            WindowMask::None => "none".into(),
            WindowMask::Causal => "causal".into(),
            WindowMask::Array(m) => {
                let shape = m.shape().to_vec();
                assert_eq!(m.dtype(), Dtype::Bool);
                let m = m.flatten(None, None).unwrap();
                m.eval().unwrap();
                let bits: String = m
                    .as_slice::<bool>()
                    .iter()
                    .map(|&b| if b { '1' } else { '0' })
                    .collect();
                format!("{shape:?}:{bits}")
            }
        }
    }

    fn expected_mask(v: &Value) -> String {
        match v {
            Value::String(s) => s.clone(),
            Value::Object(o) => {
                let shape: Vec<i32> = o["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_i64().unwrap() as i32)
                    .collect();
                format!("{shape:?}:{}", o["bits"].as_str().unwrap())
            }
            other => panic!("bad mask {other}"),
        }
    }

    fn toks(v: &Value) -> Vec<Option<i64>> {
        v.as_array().unwrap().iter().map(Value::as_i64).collect()
    }

    #[test]
    fn rotating_matches_mlx_lm() {
        let data: Value =
            serde_json::from_str(include_str!("../../tests-data/rotating.json")).unwrap();
        let heads = data["heads"].as_i64().unwrap() as i32;
        let dk = data["k_head_dim"].as_i64().unwrap() as i32;
        let dv = data["v_head_dim"].as_i64().unwrap() as i32;
        let scenarios = data["scenarios"].as_array().unwrap();
        assert_eq!(scenarios.len(), 6);
        let mut checked = 0;
        for (si, sc) in scenarios.iter().enumerate() {
            let max_size = sc["max_size"].as_i64().unwrap() as i32;
            let keep = sc["keep"].as_i64().unwrap() as i32;
            let dtype = match sc["dtype"].as_str().unwrap() {
                "float32" => Dtype::Float32,
                "float16" => Dtype::Float16,
                other => panic!("dtype {other}"),
            };
            let mut cache = RotatingKvCache::new(max_size, keep);
            let mut next = 0i64;
            for (i, step) in sc["steps"].as_array().unwrap().iter().enumerate() {
                let at = format!("scenario {si} (max {max_size}, keep {keep}) step {i}");
                let n = step["n"].as_i64().unwrap() as i32;
                match step["op"].as_str().unwrap() {
                    "u" => {
                        for m in step["masks"].as_array().unwrap() {
                            let q = m["n"].as_i64().unwrap() as i32;
                            let window = m["window"].as_i64().map(|w| w as i32);
                            let array = m["array"].as_bool().unwrap();
                            let got = cache.make_mask_with(q, window, array).unwrap();
                            assert_eq!(
                                describe(&got),
                                expected_mask(&m["mask"]),
                                "{at}: make_mask({q}, {window:?}, {array})"
                            );
                            if window.is_none() && !array {
                                let plain = cache.make_mask(q).unwrap();
                                assert_eq!(describe(&plain), describe(&got), "{at}");
                            }
                            checked += 1;
                        }
                        let fed: Vec<Option<i64>> = (next..next + i64::from(n)).map(Some).collect();
                        next += i64::from(n);
                        let (k, v) = cache
                            .update_and_fetch(
                                &encode(&fed, heads, dk, 1.0, dtype),
                                &encode(&fed, heads, dv, -1.0, dtype),
                            )
                            .unwrap();
                        let want_k = encode(&toks(&step["keys"]), heads, dk, 1.0, dtype);
                        let want_v = encode(&toks(&step["values"]), heads, dv, -1.0, dtype);
                        assert_eq!(k.dtype(), dtype, "{at}");
                        assert_eq!(v.dtype(), dtype, "{at}");
                        assert_eq!(k.shape(), want_k.shape(), "{at}: keys shape");
                        assert_eq!(v.shape(), want_v.shape(), "{at}: values shape");
                        assert_eq!(floats(&k), floats(&want_k), "{at}: keys");
                        assert_eq!(floats(&v), floats(&want_v), "{at}: values");
                        checked += 2;
                    }
                    "t" => {
                        let want = step["trimmed"].as_i64().unwrap() as i32;
                        assert_eq!(cache.trim(n), want, "{at}: trim({n})");
                        checked += 1;
                    }
                    other => panic!("op {other}"),
                }
                assert_eq!(
                    i64::from(cache.offset()),
                    step["offset"].as_i64().unwrap(),
                    "{at}: offset"
                );
                assert_eq!(
                    cache.is_trimmable(),
                    step["trimmable"].as_bool().unwrap(),
                    "{at}: trimmable"
                );
                assert_eq!(
                    cache.nbytes() as u64,
                    step["nbytes"].as_u64().unwrap(),
                    "{at}: nbytes"
                );
                assert_eq!(cache.size(), cache.offset().min(max_size));
                checked += 3;
            }
        }
        assert!(checked > 1000, "only {checked} checks");
    }

    #[test]
    fn rotating_mask_helpers() {
        // create_causal_mask(3, 2, window_size=3)
        let m = causal_mask(3, 2, Some(3)).unwrap();
        assert_eq!(describe(&WindowMask::Array(m)), "[3, 5]:111000111000111");
        // mx.roll([0, 1, 2, 3], 1) == [3, 0, 1, 2]; shifts wrap like numpy.
        let x = Array::from_slice(&[0i32, 1, 2, 3], &[4]);
        for (shift, want) in [
            (1, [3, 0, 1, 2]),
            (4, [0, 1, 2, 3]),
            (6, [2, 3, 0, 1]),
            (-1, [1, 2, 3, 0]),
        ] {
            let r = roll_1d(&x, shift).unwrap();
            r.eval().unwrap();
            assert_eq!(r.as_slice::<i32>(), &want, "shift {shift}");
        }
        let cache = RotatingKvCache::new(8, 0);
        assert!(cache.is_empty());
        assert!(cache.make_mask(1).unwrap().as_sdpa().is_none());
        assert!(matches!(cache.make_mask(4).unwrap(), WindowMask::Causal));
        assert!(matches!(
            cache.make_mask(9).unwrap().as_sdpa(),
            Some(mlx_rs::fast::ScaledDotProductAttentionMask::Array(_))
        ));
        assert_eq!(cache.nbytes(), 0);
    }
}
