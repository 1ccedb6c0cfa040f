//! One layer's keys and values for a decode batch: mlx-lm's `BatchKVCache`.
//! Sequences of different lengths share one `[B, H, T, D]` buffer, each
//! right-aligned at the shared write index `idx` with `left_padding[b]`
//! unused slots before it; a mask hides the padding and each row's rotary
//! positions start at `idx - left_padding[b]`. The buffer grows in 256-token
//! steps like [`KvCache`]'s. A sequence joins by [`BatchKvCache::extend`]
//! (both sides re-padded to one length) and leaves by
//! [`BatchKvCache::filter`], which also compacts: the padding every remaining
//! row shares is cut and the buffer rebuilt at the size it needs, so a long
//! sequence that left does not leave its length behind.
//!
//! A windowed layer's batch ([`CacheKind::Window`]) masks each query to its
//! window and, between passes, [`BatchKvCache::slide`]s: the slots no row can
//! see any more are cut from the front (a row's left padding may then go
//! negative: it began before the buffer), so it holds about a window, not
//! the whole sequence. Its rows join from, and leave as, rotating caches.
//!
//! Several prompts are prefilled together the same way: a batch made
//! [`BatchKvCache::with_padding`] takes `[K, L]` left-padded prompt chunks (the pad
//! slots are masked from every real token), then [`BatchKvCache::merge`]s
//! into the decode batch.
//!
//! A recurrent layer's batch ([`CacheKind::Recurrent`]) holds no keys: its
//! rows' states are stacked in a [`RecurrentCache`], joined, filtered and
//! extracted the same way.
//!
//! A full-attention batch may hold its keys and values quantized (every
//! row: [`BatchKvCache::to_quantized`]); a row that joins is brought to the
//! batch's form, or the batch to the row's when the row is quantized.
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::{TryIndexMutOp, TryIndexOp};
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::{Array, Dtype};

use super::kv::{KvCache, STEP, not_quantizable, write_at};
use super::{
    AttentionMask, CacheKind, Fetched, KvQuant, KvSetting, LayerCache, LayerKv, Planes, Positions,
    RecurrentCache, RotatingKvCache, fetched,
};

/// Slots a windowed batch keeps beyond its window when it slides, so that a
/// row leaving a few tokens short of the end still has its window.
const WINDOW_MARGIN: i32 = 16;

/// Keys and values of one layer for every sequence of a batch.
#[derive(Default)]
pub struct BatchKvCache {
    pub(super) keys: Option<Planes>,
    pub(super) values: Option<Planes>,
    /// How keys and values are quantized (`None`: full precision).
    pub(super) quant: Option<KvQuant>,
    /// Time slots written so far (the same for every row).
    pub(super) idx: i32,
    /// Unused slots before each row's first token (negative: the row's
    /// first tokens were cut, windowed layers only).
    pub(super) left_padding: Vec<i32>,
    /// A windowed layer's window.
    pub(super) window: Option<i32>,
    /// A recurrent layer's states (then nothing above is used).
    pub(super) recurrent: Option<RecurrentCache>,
}

/// A buffer of capacity `cap` (a whole number of steps) holding `data` in its
/// first `data.dim(2)` slots.
fn rebuilt(data: &Planes, cap: i32) -> Result<Planes, Exception> {
    data.map(|data| {
        let shape = [data.dim(0), data.dim(1), cap, data.dim(3)];
        let mut fresh = zeros_dtype(&shape, data.dtype())?;
        fresh.try_index_mut((.., .., ..data.dim(2), ..), data)?;
        Ok(fresh)
    })
}

/// Room for `len` tokens, in whole steps.
fn capacity_for(len: i32) -> i32 {
    ((len + STEP - 1) / STEP).max(1) * STEP
}

impl BatchKvCache {
    /// An empty batch for a layer of `kind`.
    pub fn new(kind: CacheKind) -> Self {
        Self {
            window: kind.window(),
            recurrent: (kind == CacheKind::Recurrent).then(RecurrentCache::new),
            ..Self::default()
        }
    }

    /// An empty batch for a layer of `kind`, for prompts that are
    /// left-padded by `left_padding` slots each (to one length), to be
    /// prefilled together.
    pub fn with_padding(left_padding: Vec<i32>, kind: CacheKind) -> Self {
        Self {
            window: kind.window(),
            recurrent: (kind == CacheKind::Recurrent)
                .then(|| RecurrentCache::with_padding(left_padding.clone())),
            left_padding,
            ..Self::default()
        }
    }

    /// The kind of layer this batch serves.
    pub fn kind(&self) -> CacheKind {
        if self.recurrent.is_some() {
            return CacheKind::Recurrent;
        }
        self.window.map_or(CacheKind::Full, CacheKind::Window)
    }

    /// Rows (sequences).
    pub fn rows(&self) -> usize {
        match &self.recurrent {
            Some(r) if r.offset() > 0 || !self.left_padding.is_empty() => r.rows(),
            Some(_) => 0,
            None => self.left_padding.len(),
        }
    }

    /// Time slots written (the longest row's length).
    pub fn idx(&self) -> i32 {
        match &self.recurrent {
            Some(r) => r.offset(),
            None => self.idx,
        }
    }

    /// Tokens row `b` holds.
    pub fn len_of(&self, b: usize) -> i32 {
        match &self.recurrent {
            Some(r) => r.len_of(b),
            None => self.idx - self.left_padding[b],
        }
    }

    /// Appends row(s) holding `len` tokens each in `keys`/`values`
    /// (`[n, H, ≥len, D]`): the sequences that join. Both sides are
    /// right-aligned at the longer length.
    pub fn extend(&mut self, keys: &Planes, values: &Planes, len: i32) -> Result<(), Exception> {
        let n = keys.rows() as usize;
        self.append(keys, values, len, &vec![0; n])
    }

    /// How keys and values are held.
    pub fn quant(&self) -> Option<KvQuant> {
        self.quant
    }

    /// mlx-lm's `maybe_quantize_kv_cache` for a batch: a full-attention
    /// layer turns quantized (every row) once its longest row holds the
    /// setting's start.
    pub fn maybe_quantize(&mut self, setting: Option<KvSetting>) -> Result<(), Exception> {
        match setting {
            Some(s)
                if self.kind() == CacheKind::Full
                    && self.quant.is_none()
                    && self.idx.max(0) as usize >= s.start =>
            {
                self.to_quantized(s.quant)
            }
            _ => Ok(()),
        }
    }

    /// Every row quantized (the whole buffers, as mlx-lm's `to_quantized`);
    /// nothing changes when it already is, or for a layer without keys.
    pub fn to_quantized(&mut self, q: KvQuant) -> Result<(), Exception> {
        if self.quant.is_some() || self.recurrent.is_some() {
            return Ok(());
        }
        if self.window.is_some() {
            return Err(Exception::custom(
                "a sliding-window layer's KV cache cannot be quantized",
            ));
        }
        let quantized = |p: &Option<Planes>| -> Result<Option<Planes>, Exception> {
            match p.as_ref().and_then(Planes::as_float) {
                Some(a) => Ok(Some(Planes::quantize(a, q)?)),
                None => Ok(None),
            }
        };
        self.keys = quantized(&self.keys)?;
        self.values = quantized(&self.values)?;
        self.quant = Some(q);
        Ok(())
    }

    /// Appends another batch's rows (a prefilled group), their own left
    /// padding kept.
    pub fn merge(&mut self, other: &BatchKvCache) -> Result<(), Exception> {
        if let (Some(mine), Some(theirs)) = (&mut self.recurrent, &other.recurrent) {
            return mine.merge(theirs);
        }
        if let Some(q) = other.quant {
            self.to_quantized(q)?;
        }
        match (&other.keys, &other.values, self.quant, other.quant) {
            (Some(k), Some(v), Some(q), None) => {
                let (k, v) = (quantize_float(k, q)?, quantize_float(v, q)?);
                self.append(&k, &v, other.idx, &other.left_padding)
            }
            (Some(k), Some(v), ..) => self.append(k, v, other.idx, &other.left_padding),
            _ => Err(Exception::custom("merging an empty batch")),
        }
    }

    /// [`BatchKvCache::extend`] for rows that are themselves left-padded by
    /// `inner` slots within their `len`.
    fn append(
        &mut self,
        keys: &Planes,
        values: &Planes,
        len: i32,
        inner: &[i32],
    ) -> Result<(), Exception> {
        let new_idx = self.idx.max(len);
        let pad_left = |x: &Planes, have: i32| -> Result<Planes, Exception> {
            x.map(|x| {
                let used = x.try_index((.., .., ..have, ..))?;
                let missing = new_idx - have;
                if missing == 0 {
                    return Ok(used);
                }
                let zeros = zeros_dtype(&[x.dim(0), x.dim(1), missing, x.dim(3)], x.dtype())?;
                concatenate(&[zeros, used], 2)
            })
        };
        let joined = |held: Option<&Planes>, new: &Planes| -> Result<Planes, Exception> {
            let new = pad_left(new, len)?;
            let all = match held {
                Some(h) => pad_left(h, self.idx)?.zip_map(&new, |a, b| concatenate(&[a, b], 0))?,
                None => new,
            };
            rebuilt(&all, capacity_for(new_idx + 1))
        };
        let k = joined(self.keys.as_ref(), keys)?;
        let v = joined(self.values.as_ref(), values)?;
        let grow = new_idx - self.idx;
        for lp in &mut self.left_padding {
            *lp += grow;
        }
        self.left_padding
            .extend(inner.iter().map(|l| l + new_idx - len));
        self.idx = new_idx;
        self.keys = Some(k);
        self.values = Some(v);
        Ok(())
    }

    /// Adds the sequence held by a single-sequence cache (a rotating one
    /// holds only the end of its sequence: the row begins before the buffer).
    pub fn extend_from(&mut self, cache: &LayerKv) -> Result<(), Exception> {
        match cache {
            LayerKv::Recurrent(c) => match &mut self.recurrent {
                Some(r) => r.merge(c),
                None => Err(Exception::custom(
                    "a recurrent state joining an attention batch",
                )),
            },
            _ if self.recurrent.is_some() => Err(Exception::custom(
                "keys and values joining a recurrent batch",
            )),
            LayerKv::Full(c) => {
                let c = match (c.quant(), self.quant) {
                    (Some(q), None) => {
                        self.to_quantized(q)?;
                        c.clone()
                    }
                    (None, Some(q)) => c.to_quantized(q)?,
                    _ => c.clone(),
                };
                match c.buffers() {
                    Some((k, v)) => self.extend(k, v, c.offset()),
                    None => Err(Exception::custom("joining an empty cache")),
                }
            }
            LayerKv::Window(c) => match c.temporal()? {
                Some((k, v)) => {
                    let held = k.dim(2);
                    let (k, v) = (Planes::float(k), Planes::float(v));
                    self.append(&k, &v, held, &[held - c.offset()])
                }
                None => Err(Exception::custom("joining an empty cache")),
            },
        }
    }

    /// A windowed batch cuts the slots that no row can see any more (all but
    /// the last window and a margin), once they are a whole step. Call it
    /// between forward passes, never within one: masks are made before.
    pub fn slide(&mut self) -> Result<(), Exception> {
        let Some(window) = self.window else {
            return Ok(());
        };
        let keep = window + WINDOW_MARGIN;
        if self.idx < keep + STEP {
            return Ok(());
        }
        let cut = self.idx - keep;
        let compact = |x: &Planes| -> Result<Planes, Exception> {
            rebuilt(
                &x.map(|x| x.try_index((.., .., cut..self.idx, ..)))?,
                capacity_for(keep + 1),
            )
        };
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let (k, v) = (compact(k)?, compact(v)?);
            self.keys = Some(k);
            self.values = Some(v);
        }
        for lp in &mut self.left_padding {
            *lp -= cut;
        }
        self.idx = keep;
        Ok(())
    }

    /// Keeps only the rows `keep` (in that order), then compacts.
    pub fn filter(&mut self, keep: &[usize]) -> Result<(), Exception> {
        if let Some(r) = &mut self.recurrent {
            return r.filter(keep);
        }
        if keep.is_empty() {
            *self = Self::new(self.kind());
            return Ok(());
        }
        let left: Vec<i32> = keep.iter().map(|&b| self.left_padding[b]).collect();
        let cut = left.iter().copied().min().unwrap_or(0).max(0);
        let len = self.idx - cut;
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let rows: Vec<i32> = keep.iter().map(|&b| b as i32).collect();
            let rows = Array::from_slice(&rows, &[rows.len() as i32]);
            let compact = |x: &Planes| -> Result<Planes, Exception> {
                let used = x.map(|x| {
                    x.take_axis(&rows, 0)?
                        .try_index((.., .., cut..self.idx, ..))
                })?;
                rebuilt(&used, capacity_for(len + 1))
            };
            self.keys = Some(compact(k)?);
            self.values = Some(compact(v)?);
        }
        self.left_padding = left.into_iter().map(|l| l - cut).collect();
        self.idx = len;
        Ok(())
    }

    /// Row `b`'s first `keep` tokens (at most) as a single-sequence cache of
    /// its own (copied), e.g. for the prompt cache when the sequence ends: a
    /// growing cache, or for a windowed layer a rotating one of what the
    /// buffer still holds (`None` if that is less than the window).
    /// A recurrent layer's row only as a whole (`None` if `keep` is short of
    /// it: a state cannot go back).
    pub fn extract(&self, b: usize, keep: i32) -> Result<Option<LayerKv>, Exception> {
        if let Some(r) = &self.recurrent {
            if keep < r.len_of(b) {
                return Ok(None);
            }
            return Ok(Some(LayerKv::Recurrent(r.extract(b)?)));
        }
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Ok(Some(LayerKv::new(self.kind())));
        };
        let first = self.left_padding[b];
        let len = keep.min(self.idx - first).max(0);
        let start = first.max(0);
        let end = first + len;
        let row = b as i32;
        let part =
            |x: &Planes| x.map(|x| x.try_index((row..row + 1, .., start..end.max(start), ..)));
        Ok(match self.window {
            None => Some(LayerKv::Full(KvCache::from_buffers(
                rebuilt(&part(k)?, capacity_for(len))?,
                rebuilt(&part(v)?, capacity_for(len))?,
                len,
                self.quant,
            )?)),
            Some(window) => {
                let held = (end - start).max(0);
                let float = |p: Planes| p.as_float().cloned().ok_or_else(not_quantizable);
                RotatingKvCache::from_temporal(
                    float(rebuilt(&part(k)?, held)?)?,
                    float(rebuilt(&part(v)?, held)?)?,
                    len,
                    window,
                )
                .map(LayerKv::Window)
            }
        })
    }

    /// The buffers, for evaluation.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys
            .iter()
            .chain(self.values.iter())
            .flat_map(|p| p.parts().iter())
            .chain(self.recurrent.iter().flat_map(RecurrentCache::arrays))
    }

    /// Bytes held by the buffers.
    pub fn nbytes(&self) -> usize {
        self.arrays().map(Array::nbytes).sum()
    }

    fn has_padding(&self) -> bool {
        self.left_padding.iter().any(|&l| l > 0)
    }
}

impl LayerCache for BatchKvCache {
    fn positions(&self) -> Result<Positions, Exception> {
        if let Some(&first) = self.left_padding.first()
            && self.left_padding.iter().all(|&l| l == first)
        {
            return Ok(Positions::Uniform(self.idx - first));
        }
        let starts: Vec<i32> = self.left_padding.iter().map(|l| self.idx - l).collect();
        Ok(Positions::PerRow(Array::from_slice(
            &starts,
            &[starts.len() as i32],
        )))
    }

    /// mlx-lm's `create_causal_mask(n, offset=idx, window, left_padding)`: a
    /// query at slot `idx + j` of row `b` sees key slots from
    /// `left_padding[b]` (and within its window) to `idx + j`. A pad query (a
    /// prefilled group's, before its row starts) sees only itself, so that no
    /// row of attention is empty; real tokens never see it. Without padding
    /// or a window to apply this is plain causal masking (or none for one
    /// token).
    fn mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask, Exception> {
        if let Some(r) = &self.recurrent {
            return r.mask(n);
        }
        let window = window.or(self.window);
        let windowed = window.is_some_and(|w| self.idx + n > w);
        if !self.has_padding() && !windowed {
            return Ok(if n > 1 {
                AttentionMask::Causal
            } else {
                AttentionMask::None
            });
        }
        let b = self.rows() as i32;
        let keys = Array::arange::<_, i32>(None, self.idx + n, None)?.reshape(&[1, 1, 1, -1])?;
        let queries =
            Array::arange::<_, i32>(self.idx, self.idx + n, None)?.reshape(&[1, 1, -1, 1])?;
        let left = Array::from_slice(&self.left_padding, &[b, 1, 1, 1]);
        let mut seen = keys.ge(&left)?.logical_and(&keys.le(&queries)?)?;
        if let Some(w) = window.filter(|_| windowed) {
            seen = seen.logical_and(&keys.gt(&queries.subtract(Array::from_int(w))?)?)?;
        }
        let mask = seen.logical_or(&keys.eq(&queries)?)?;
        Ok(AttentionMask::Array(mask.as_dtype(Dtype::Bool)?))
    }

    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), Exception> {
        match self.update_and_fetch_kv(keys, values)? {
            Fetched::Float(k, v) => Ok((k, v)),
            Fetched::Quantized { .. } => Err(not_quantizable()),
        }
    }

    fn recurrent(&mut self) -> Option<&mut RecurrentCache> {
        self.recurrent.as_mut()
    }

    fn update_and_fetch_kv(&mut self, keys: &Array, values: &Array) -> Result<Fetched, Exception> {
        if self.recurrent.is_some() {
            return Err(Exception::custom(
                "a recurrent layer keeps no keys and values",
            ));
        }
        let (k, v) = match self.quant {
            None => (Planes::float(keys.clone()), Planes::float(values.clone())),
            Some(q) => (Planes::quantize(keys, q)?, Planes::quantize(values, q)?),
        };
        let held = write_at(&mut self.keys, &mut self.values, self.idx, &k, &v)?;
        self.idx += keys.dim(2);
        fetched(held, self.quant)
    }
}

/// Full-precision planes quantized (quantized ones as they are).
fn quantize_float(p: &Planes, q: KvQuant) -> Result<Planes, Exception> {
    match p.as_float() {
        Some(a) => Planes::quantize(a, q),
        None => Ok(p.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::transforms::eval;

    /// `[1, 1, len, 1]` holding `first..first + len`.
    fn seq(first: f32, len: i32) -> Array {
        let v: Vec<f32> = (0..len).map(|i| first + i as f32).collect();
        Array::from_slice(&v, &[1, 1, len, 1])
    }

    fn read(a: &Array) -> Vec<f32> {
        let a = a.flatten(None, None).unwrap();
        eval([&a]).unwrap();
        a.as_slice::<f32>().to_vec()
    }

    #[test]
    fn join_pads_left_leave_compacts() {
        let mut b = BatchKvCache::new(CacheKind::Full);
        b.extend(
            &Planes::float(seq(10.0, 3)),
            &Planes::float(seq(10.0, 3)),
            3,
        )
        .unwrap();
        b.extend(
            &Planes::float(seq(20.0, 5)),
            &Planes::float(seq(20.0, 5)),
            5,
        )
        .unwrap();
        assert_eq!((b.rows(), b.idx()), (2, 5));
        assert_eq!(b.left_padding, vec![2, 0]);
        let Positions::PerRow(p) = b.positions().unwrap() else {
            panic!()
        };
        assert_eq!(read(&p.as_dtype(Dtype::Float32).unwrap()), vec![3.0, 5.0]);
        // One decode step: both rows append.
        let step = Array::from_slice(&[13.0f32, 25.0], &[2, 1, 1, 1]);
        let (k, _) = b.update_and_fetch(&step, &step).unwrap();
        assert_eq!(
            read(&k),
            vec![
                0.0, 0.0, 10.0, 11.0, 12.0, 13.0, 20.0, 21.0, 22.0, 23.0, 24.0, 25.0
            ]
        );
        // The mask hides row 0's padding and nothing of row 1.
        let AttentionMask::Array(m) = b.mask(1, None).unwrap() else {
            panic!()
        };
        let m = read(&m.as_dtype(Dtype::Float32).unwrap());
        assert_eq!(&m[..7], &[0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
        assert!(m[7..].iter().all(|&x| x == 1.0));
        // The long row leaves: the short one is compacted to its own length.
        b.filter(&[0]).unwrap();
        assert_eq!((b.rows(), b.idx(), b.left_padding.clone()), (1, 4, vec![0]));
        let (k, _) = b.update_and_fetch(&seq(14.0, 1), &seq(14.0, 1)).unwrap();
        assert_eq!(read(&k), vec![10.0, 11.0, 12.0, 13.0, 14.0]);
        assert_eq!(b.nbytes(), 2 * STEP as usize * 4);
        // Extracting gives the row without padding.
        let one = b.extract(0, 3).unwrap().unwrap();
        assert_eq!(one.offset(), 3);
        b.filter(&[]).unwrap();
        assert_eq!((b.rows(), b.nbytes()), (0, 0));
    }
}
