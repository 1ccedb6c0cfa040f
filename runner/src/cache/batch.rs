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
//! Several prompts are prefilled together the same way: a batch made
//! [`BatchKvCache::with_padding`] takes `[K, L]` left-padded prompt chunks (the pad
//! slots are masked from every real token), then [`BatchKvCache::merge`]s
//! into the decode batch.
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::{TryIndexMutOp, TryIndexOp};
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::{Array, Dtype};

use super::kv::{KvCache, STEP, write_at};
use super::{AttentionMask, LayerCache, Positions};

/// Keys and values of one layer for every sequence of a batch.
#[derive(Default)]
pub struct BatchKvCache {
    keys: Option<Array>,
    values: Option<Array>,
    /// Time slots written so far (the same for every row).
    idx: i32,
    /// Unused slots before each row's first token.
    left_padding: Vec<i32>,
}

/// A buffer of capacity `cap` (a whole number of steps) holding `data` in its
/// first `data.dim(2)` slots.
fn rebuilt(data: &Array, cap: i32) -> Result<Array, Exception> {
    let shape = [data.dim(0), data.dim(1), cap, data.dim(3)];
    let mut fresh = zeros_dtype(&shape, data.dtype())?;
    fresh.try_index_mut((.., .., ..data.dim(2), ..), data)?;
    Ok(fresh)
}

/// Room for `len` tokens, in whole steps.
fn capacity_for(len: i32) -> i32 {
    ((len + STEP - 1) / STEP).max(1) * STEP
}

impl BatchKvCache {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch for prompts that are left-padded by `left_padding`
    /// slots each (to one length), to be prefilled together.
    pub fn with_padding(left_padding: Vec<i32>) -> Self {
        Self {
            left_padding,
            ..Self::default()
        }
    }

    /// Rows (sequences).
    pub fn rows(&self) -> usize {
        self.left_padding.len()
    }

    /// Time slots written (the longest row's length).
    pub fn idx(&self) -> i32 {
        self.idx
    }

    /// Tokens row `b` holds.
    pub fn len_of(&self, b: usize) -> i32 {
        self.idx - self.left_padding[b]
    }

    /// Appends row(s) holding `len` tokens each in `keys`/`values`
    /// (`[n, H, ≥len, D]`): the sequences that join. Both sides are
    /// right-aligned at the longer length.
    pub fn extend(&mut self, keys: &Array, values: &Array, len: i32) -> Result<(), Exception> {
        let n = keys.dim(0) as usize;
        self.append(keys, values, len, &vec![0; n])
    }

    /// Appends another batch's rows (a prefilled group), their own left
    /// padding kept.
    pub fn merge(&mut self, other: &BatchKvCache) -> Result<(), Exception> {
        match (&other.keys, &other.values) {
            (Some(k), Some(v)) => self.append(k, v, other.idx, &other.left_padding),
            _ => Err(Exception::custom("merging an empty batch")),
        }
    }

    /// [`BatchKvCache::extend`] for rows that are themselves left-padded by
    /// `inner` slots within their `len`.
    fn append(
        &mut self,
        keys: &Array,
        values: &Array,
        len: i32,
        inner: &[i32],
    ) -> Result<(), Exception> {
        let new_idx = self.idx.max(len);
        let pad_left = |x: &Array, have: i32| -> Result<Array, Exception> {
            let used = x.try_index((.., .., ..have, ..))?;
            let missing = new_idx - have;
            if missing == 0 {
                return Ok(used);
            }
            let zeros = zeros_dtype(&[x.dim(0), x.dim(1), missing, x.dim(3)], x.dtype())?;
            concatenate(&[zeros, used], 2)
        };
        let joined = |held: Option<&Array>, new: &Array| -> Result<Array, Exception> {
            let new = pad_left(new, len)?;
            let all = match held {
                Some(h) => concatenate(&[pad_left(h, self.idx)?, new], 0)?,
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

    /// Adds the sequence held by a single-sequence cache.
    pub fn extend_from(&mut self, cache: &KvCache) -> Result<(), Exception> {
        match cache.buffers() {
            Some((k, v)) => self.extend(k, v, cache.offset()),
            None => Err(Exception::custom("joining an empty cache")),
        }
    }

    /// Keeps only the rows `keep` (in that order), then compacts.
    pub fn filter(&mut self, keep: &[usize]) -> Result<(), Exception> {
        if keep.is_empty() {
            *self = Self::new();
            return Ok(());
        }
        let left: Vec<i32> = keep.iter().map(|&b| self.left_padding[b]).collect();
        let cut = left.iter().copied().min().unwrap_or(0);
        let len = self.idx - cut;
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let rows: Vec<i32> = keep.iter().map(|&b| b as i32).collect();
            let rows = Array::from_slice(&rows, &[rows.len() as i32]);
            let compact = |x: &Array| -> Result<Array, Exception> {
                let kept = x.take_axis(&rows, 0)?;
                let used = kept.try_index((.., .., cut..self.idx, ..))?;
                rebuilt(&used, capacity_for(len + 1))
            };
            self.keys = Some(compact(k)?);
            self.values = Some(compact(v)?);
        }
        self.left_padding = left.into_iter().map(|l| l - cut).collect();
        self.idx = len;
        Ok(())
    }

    /// Row `b`'s tokens as a single-sequence cache of its own (copied), e.g.
    /// for the prompt cache when the sequence ends. Keeps the first `keep`
    /// tokens of the row at most.
    pub fn extract(&self, b: usize, keep: i32) -> Result<KvCache, Exception> {
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Ok(KvCache::new());
        };
        let start = self.left_padding[b];
        let len = keep.min(self.idx - start).max(0);
        let row = b as i32;
        let take = |x: &Array| -> Result<Array, Exception> {
            let part = x.try_index((row..row + 1, .., start..start + len, ..))?;
            rebuilt(&part, capacity_for(len))
        };
        Ok(KvCache::from_buffers(take(k)?, take(v)?, len))
    }

    /// The buffers, for evaluation.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys.iter().chain(self.values.iter())
    }

    /// Bytes held by the buffers.
    pub fn nbytes(&self) -> usize {
        self.arrays().map(Array::nbytes).sum()
    }

    fn has_padding(&self) -> bool {
        self.left_padding.iter().any(|&l| l != 0)
    }
}

impl LayerCache for BatchKvCache {
    fn positions(&self) -> Result<Positions, Exception> {
        if !self.has_padding() {
            return Ok(Positions::Uniform(self.idx));
        }
        let starts: Vec<i32> = self.left_padding.iter().map(|l| self.idx - l).collect();
        Ok(Positions::PerRow(Array::from_slice(
            &starts,
            &[starts.len() as i32],
        )))
    }

    /// mlx-lm's `create_causal_mask(n, offset=idx, left_padding)`: a query at
    /// slot `idx + j` of row `b` sees key slots `left_padding[b] ..= idx + j`.
    /// A pad query (a prefilled group's, before its row starts) sees only
    /// itself, so that no row of attention is empty; real tokens never see
    /// it. Without padding this is plain causal masking (or none for one
    /// token).
    fn mask(&self, n: i32) -> Result<AttentionMask, Exception> {
        if !self.has_padding() {
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
        let mask = keys
            .ge(&left)?
            .logical_and(&keys.le(&queries)?)?
            .logical_or(&keys.eq(&queries)?)?;
        Ok(AttentionMask::Array(mask.as_dtype(Dtype::Bool)?))
    }

    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), Exception> {
        let held = write_at(&mut self.keys, &mut self.values, self.idx, keys, values)?;
        self.idx += keys.dim(2);
        Ok(held)
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
        let mut b = BatchKvCache::new();
        b.extend(&seq(10.0, 3), &seq(10.0, 3), 3).unwrap();
        b.extend(&seq(20.0, 5), &seq(20.0, 5), 5).unwrap();
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
        let AttentionMask::Array(m) = b.mask(1).unwrap() else {
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
        let one = b.extract(0, 3).unwrap();
        assert_eq!(one.offset(), 3);
        b.filter(&[]).unwrap();
        assert_eq!((b.rows(), b.nbytes()), (0, 0));
    }
}
