//! One layer's keys and values, in buffers that grow in 256-token steps and are
//! trimmed in place (the layout of mlx-lm's `KVCache`, so attention sees the same
//! arrays and gives the same numbers).
use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{concatenate, zeros_dtype};

use super::quantized::{KvQuant, Planes};

/// Tokens added per growth step.
pub const STEP: i32 = 256;

/// Writes `keys`/`values` (`[B, H, L, ...]` planes) into time slots
/// `prev..prev + L` of the buffers, first growing them by whole [`STEP`]s
/// when they are missing or too short, and returns slots `..prev + L`.
/// Shared by the single-sequence and the batch caches, full precision or
/// quantized (the new tokens already in the buffers' form).
pub(super) fn write_at(
    key_buf: &mut Option<Planes>,
    value_buf: &mut Option<Planes>,
    prev: i32,
    keys: &Planes,
    values: &Planes,
) -> Result<(Planes, Planes), Exception> {
    let len = keys.time();
    let capacity = key_buf.as_ref().map_or(0, Planes::time);
    if key_buf.is_none() || prev + len > capacity {
        *key_buf = Some(grow(keys, key_buf.take(), prev, len)?);
        *value_buf = Some(grow(values, value_buf.take(), prev, len)?);
    }
    let end = prev + len;
    let (Some(k), Some(v)) = (key_buf.as_mut(), value_buf.as_mut()) else {
        unreachable!("buffers were allocated above")
    };
    k.write_slots(keys, prev..end)?;
    v.write_slots(values, prev..end)?;
    if end < k.time() {
        Ok((
            k.map(|x| x.try_index((.., .., ..end, ..)))?,
            v.map(|x| x.try_index((.., .., ..end, ..)))?,
        ))
    } else {
        Ok((k.clone(), v.clone()))
    }
}

/// A buffer with room for `len` more slots after `prev`: `held`'s first
/// `prev` slots (all of it when `prev` is a whole number of steps) and
/// ceil(len / STEP) steps of zeros shaped like `like`, as mlx-lm's
/// `KVCache.update_and_fetch` grows it.
pub(super) fn grow(
    like: &Planes,
    held: Option<Planes>,
    prev: i32,
    len: i32,
) -> Result<Planes, Exception> {
    let steps = (STEP + len - 1) / STEP;
    let fresh =
        like.map(|x| zeros_dtype(&[x.dim(0), x.dim(1), steps * STEP, x.dim(3)], x.dtype()))?;
    match held {
        None => Ok(fresh),
        Some(held) => {
            let held = if prev % STEP != 0 {
                held.map(|h| h.try_index((.., .., ..prev, ..)))?
            } else {
                held
            };
            held.zip_map(&fresh, |h, f| concatenate(&[h, f], 2))
        }
    }
}

/// Keys and values of one attention layer, `[B, kv_heads, capacity, head_dim]`
/// (or its quantized planes). Cloning shares the buffers until either side
/// writes (MLX arrays are immutable; an update makes a new buffer when the
/// old one is shared).
#[derive(Default, Clone)]
pub struct KvCache {
    pub(super) keys: Option<Planes>,
    pub(super) values: Option<Planes>,
    pub(super) offset: i32,
    /// Set once the cache is quantized.
    pub(super) quant: Option<KvQuant>,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache over existing buffers (`[B, H, capacity, D]` planes) holding
    /// `offset` tokens, quantized as `quant` says.
    pub fn from_buffers(
        keys: Planes,
        values: Planes,
        offset: i32,
        quant: Option<KvQuant>,
    ) -> Result<Self, Exception> {
        if keys.is_quantized() != quant.is_some() || values.is_quantized() != quant.is_some() {
            return Err(Exception::custom(
                "KV buffers do not match their quantization",
            ));
        }
        Ok(Self {
            keys: Some(keys),
            values: Some(values),
            offset,
            quant,
        })
    }

    /// Tokens held.
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// How the buffers are quantized (`None`: full precision).
    pub fn quant(&self) -> Option<KvQuant> {
        self.quant
    }

    /// The whole buffers (capacity, not just the `offset` tokens held), if any.
    pub fn buffers(&self) -> Option<(&Planes, &Planes)> {
        Some((self.keys.as_ref()?, self.values.as_ref()?))
    }

    /// Appends `keys`/`values` (`[B, H, L, D]`, full precision; quantized
    /// here when the cache is) and returns everything held so far.
    pub fn update_and_fetch_planes(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Planes, Planes), Exception> {
        let (k, v) = match self.quant {
            None => (Planes::float(keys.clone()), Planes::float(values.clone())),
            Some(q) => (Planes::quantize(keys, q)?, Planes::quantize(values, q)?),
        };
        let held = write_at(&mut self.keys, &mut self.values, self.offset, &k, &v)?;
        self.offset += keys.dim(2);
        Ok(held)
    }

    /// [`KvCache::update_and_fetch_planes`] for a full-precision cache.
    pub fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), Exception> {
        if self.quant.is_some() {
            return Err(not_quantizable());
        }
        let (k, v) = self.update_and_fetch_planes(keys, values)?;
        match (k.as_float(), v.as_float()) {
            (Some(k), Some(v)) => Ok((k.clone(), v.clone())),
            _ => Err(not_quantizable()),
        }
    }

    /// The same tokens quantized (mlx-lm's `KVCache.to_quantized`: the whole
    /// buffers, so the layout is the one mlx-lm attends over); a quantized
    /// cache is returned as it is.
    pub fn to_quantized(&self, q: KvQuant) -> Result<Self, Exception> {
        if self.quant.is_some() {
            return Ok(self.clone());
        }
        let quantized = |p: &Option<Planes>| -> Result<Option<Planes>, Exception> {
            match p.as_ref().and_then(Planes::as_float) {
                Some(a) => Ok(Some(Planes::quantize(a, q)?)),
                None => Ok(None),
            }
        };
        Ok(Self {
            keys: quantized(&self.keys)?,
            values: quantized(&self.values)?,
            offset: self.offset,
            quant: Some(q),
        })
    }

    /// Forgets the last `n` tokens (the buffers stay); returns how many went.
    pub fn trim(&mut self, n: i32) -> i32 {
        let n = n.min(self.offset).max(0);
        self.offset -= n;
        n
    }

    /// The buffers, for evaluation after a prefill chunk.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys
            .iter()
            .chain(self.values.iter())
            .flat_map(|p| p.parts().iter())
    }

    /// Bytes held by the buffers (their capacity, not just the used part).
    pub fn nbytes(&self) -> usize {
        self.arrays().map(Array::nbytes).sum()
    }
}

/// A layer that reads keys and values as full-precision arrays only.
pub(super) fn not_quantizable() -> Exception {
    Exception::custom("this layer cannot attend over a quantized KV cache")
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
