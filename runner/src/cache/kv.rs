//! One layer's keys and values, in buffers that grow in 256-token steps and are
//! trimmed in place (the layout of mlx-lm's `KVCache`, so attention sees the same
//! arrays and gives the same numbers).
use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::{TryIndexMutOp, TryIndexOp};
use mlx_rs::ops::{concatenate, zeros_dtype};

/// Tokens added per growth step.
pub const STEP: i32 = 256;

/// Writes `keys`/`values` (`[B, H, L, D]`) into time slots `prev..prev + L`
/// of the buffers, first growing them by whole [`STEP`]s when they are
/// missing or too short, and returns slots `..prev + L`. Shared by the
/// single-sequence and the batch caches.
pub(super) fn write_at(
    key_buf: &mut Option<Array>,
    value_buf: &mut Option<Array>,
    prev: i32,
    keys: &Array,
    values: &Array,
) -> Result<(Array, Array), Exception> {
    let len = keys.dim(2);
    let capacity = key_buf.as_ref().map_or(0, |k| k.dim(2));
    if key_buf.is_none() || prev + len > capacity {
        let steps = (STEP + len - 1) / STEP;
        let grow = |x: &Array, held: Option<Array>| -> Result<Array, Exception> {
            let shape = [x.dim(0), x.dim(1), steps * STEP, x.dim(3)];
            let fresh = zeros_dtype(&shape, x.dtype())?;
            match held {
                None => Ok(fresh),
                Some(held) => {
                    let held = if prev % STEP != 0 {
                        held.try_index((.., .., ..prev, ..))?
                    } else {
                        held
                    };
                    concatenate(&[held, fresh], 2)
                }
            }
        };
        *key_buf = Some(grow(keys, key_buf.take())?);
        *value_buf = Some(grow(values, value_buf.take())?);
    }
    let end = prev + len;
    let (Some(k), Some(v)) = (key_buf.as_mut(), value_buf.as_mut()) else {
        unreachable!("buffers were allocated above")
    };
    k.try_index_mut((.., .., prev..end, ..), keys)?;
    v.try_index_mut((.., .., prev..end, ..), values)?;
    if end < k.dim(2) {
        Ok((
            k.try_index((.., .., ..end, ..))?,
            v.try_index((.., .., ..end, ..))?,
        ))
    } else {
        Ok((k.clone(), v.clone()))
    }
}

/// Keys and values of one attention layer, `[B, kv_heads, capacity, head_dim]`.
/// Cloning shares the buffers until either side writes (MLX arrays are
/// immutable; an update makes a new buffer when the old one is shared).
#[derive(Default, Clone)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache over existing buffers (`[B, H, capacity, D]`) holding `offset` tokens.
    pub fn from_buffers(keys: Array, values: Array, offset: i32) -> Self {
        Self {
            keys: Some(keys),
            values: Some(values),
            offset,
        }
    }

    /// Tokens held.
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// The whole buffers (capacity, not just the `offset` tokens held), if any.
    pub fn buffers(&self) -> Option<(&Array, &Array)> {
        Some((self.keys.as_ref()?, self.values.as_ref()?))
    }

    /// Appends `keys`/`values` (`[B, H, L, D]`) and returns everything held so far.
    pub fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), Exception> {
        let held = write_at(&mut self.keys, &mut self.values, self.offset, keys, values)?;
        self.offset += keys.dim(2);
        Ok(held)
    }

    /// Forgets the last `n` tokens (the buffers stay); returns how many went.
    pub fn trim(&mut self, n: i32) -> i32 {
        let n = n.min(self.offset).max(0);
        self.offset -= n;
        n
    }

    /// The buffers, for evaluation after a prefill chunk.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys.iter().chain(self.values.iter())
    }

    /// Bytes held by the buffers (their capacity, not just the used part).
    pub fn nbytes(&self) -> usize {
        self.arrays().map(Array::nbytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::indexing::TryIndexOp;

    fn filled(len: i32, value: f32) -> Array {
        Array::from_slice(&vec![value; (2 * len * 4) as usize], &[1, 2, len, 4])
    }

    #[test]
    fn grows_in_steps_and_trims_in_place() {
        let mut cache = KvCache::new();
        let (k, v) = cache
            .update_and_fetch(&filled(3, 1.0), &filled(3, 1.0))
            .unwrap();
        assert_eq!(k.shape(), &[1, 2, 3, 4]);
        assert_eq!(v.shape(), &[1, 2, 3, 4]);
        let one_step = cache.nbytes();
        assert_eq!(one_step, 2 * (2 * STEP * 4 * 4) as usize);

        // 300 more tokens do not fit: as in mlx-lm, the 3 used tokens are kept and
        // ceil(300 / 256) = 2 fresh steps appended, so capacity is 3 + 512.
        let (k, _) = cache
            .update_and_fetch(&filled(300, 2.0), &filled(300, 2.0))
            .unwrap();
        assert_eq!(k.dim(2), 303);
        let grown = 2 * (2 * (3 + 2 * STEP) * 4 * 4) as usize;
        assert_eq!(cache.nbytes(), grown);
        let first: Vec<f32> = k
            .try_index((.., .., 0..3, ..))
            .unwrap()
            .flatten(None, None)
            .unwrap()
            .as_slice()
            .to_vec();
        assert!(first.iter().all(|&x| x == 1.0), "old tokens kept");

        // Trimming keeps the buffers; the next append overwrites the tail.
        assert_eq!(cache.trim(100), 100);
        assert_eq!(cache.offset(), 203);
        assert_eq!(cache.nbytes(), grown);
        let (k, _) = cache
            .update_and_fetch(&filled(1, 3.0), &filled(1, 3.0))
            .unwrap();
        assert_eq!(k.dim(2), 204);
        let last: Vec<f32> = k
            .try_index((.., .., 203..204, ..))
            .unwrap()
            .flatten(None, None)
            .unwrap()
            .as_slice()
            .to_vec();
        assert!(last.iter().all(|&x| x == 3.0));
        assert_eq!(cache.trim(1000), 204);
        assert_eq!(cache.offset(), 0);
    }
}
