//! A layer's keys and values as Grove's CUDA decode step takes them
//! (`model::layers::cuda_decode`): it writes the new token's keys and values
//! into slot `idx` itself, so the cache hands over its buffers with room for
//! it and takes back the written ones. A sequence's full cache and a decode
//! batch's are covered; windowed, recurrent and quantized layers are not.
use mlx_rs::Array;
use mlx_rs::error::Exception;

use super::kv::grow;
use super::{BatchKvCache, KvCache, LayerKv, Planes};

/// Full-precision keys and values `[B, H, capacity, D]` with room at slot
/// `idx`, `idx`, and each row's left padding.
pub type Slots = (Array, Array, i32, Vec<i32>);

/// A cache the decode step can write one token into.
pub trait DecodeSlots {
    /// The buffers with room for the new token (grown by one step when
    /// full, as an update would). `None` for a layer the step does not
    /// cover: recurrent, windowed, quantized or still empty.
    fn decode_buffers(&mut self) -> Result<Option<Slots>, Exception>;
    /// Takes back the buffers the step wrote slot `idx` of.
    fn decode_written(&mut self, keys: Array, values: Array);
}

/// `keys`, `values` with room at slot `idx`: as they are, or (full) grown
/// as an update of one token grows them ([`super::kv::grow`]).
fn with_room(
    keys: &mut Option<Planes>,
    values: &mut Option<Planes>,
    idx: i32,
) -> Result<Option<(Array, Array)>, Exception> {
    let full = match (
        keys.as_ref().and_then(Planes::as_float),
        values.as_ref().and_then(Planes::as_float),
    ) {
        (Some(k), Some(_)) => idx >= k.dim(2),
        _ => return Ok(None),
    };
    if full {
        for buf in [&mut *keys, &mut *values] {
            if let Some(held) = buf.take() {
                *buf = Some(grow(&held, Some(held.clone()), idx, 1)?);
            }
        }
    }
    Ok(keys
        .as_ref()
        .and_then(Planes::as_float)
        .zip(values.as_ref().and_then(Planes::as_float))
        .map(|(k, v)| (k.clone(), v.clone())))
}

impl DecodeSlots for BatchKvCache {
    fn decode_buffers(&mut self) -> Result<Option<Slots>, Exception> {
        if self.recurrent.is_some() || self.window.is_some() || self.quant.is_some() {
            return Ok(None);
        }
        Ok(with_room(&mut self.keys, &mut self.values, self.idx)?
            .map(|(k, v)| (k, v, self.idx, self.left_padding.clone())))
    }

    fn decode_written(&mut self, keys: Array, values: Array) {
        self.keys = Some(Planes::float(keys));
        self.values = Some(Planes::float(values));
        self.idx += 1;
    }
}

impl DecodeSlots for KvCache {
    fn decode_buffers(&mut self) -> Result<Option<Slots>, Exception> {
        if self.quant.is_some() {
            return Ok(None);
        }
        let rows = self
            .keys
            .as_ref()
            .and_then(Planes::as_float)
            .map_or(0, |k| k.dim(0));
        Ok(with_room(&mut self.keys, &mut self.values, self.offset)?
            .map(|(k, v)| (k, v, self.offset, vec![0; rows as usize])))
    }

    fn decode_written(&mut self, keys: Array, values: Array) {
        self.keys = Some(Planes::float(keys));
        self.values = Some(Planes::float(values));
        self.offset += 1;
    }
}

impl DecodeSlots for LayerKv {
    fn decode_buffers(&mut self) -> Result<Option<Slots>, Exception> {
        match self {
            LayerKv::Full(c) => c.decode_buffers(),
            _ => Ok(None),
        }
    }

    fn decode_written(&mut self, keys: Array, values: Array) {
        if let LayerKv::Full(c) = self {
            c.decode_written(keys, values);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::kv::STEP;
    use crate::cache::{CacheKind, LayerCache};
    use mlx_rs::ops::indexing::{TryIndexMutOp, TryIndexOp};
    use mlx_rs::transforms::eval;

    /// `[rows, 2, len, 4]` holding `first + i` at time slot i of every row.
    fn seq(rows: i32, len: i32, first: f32) -> Array {
        let v: Vec<f32> = (0..rows * 2 * len * 4)
            .map(|i| first + ((i / 4) % len) as f32)
            .collect();
        Array::from_slice(&v, &[rows, 2, len, 4])
    }

    fn read(a: &Array) -> Vec<f32> {
        let a = a.flatten(None, None).unwrap();
        eval([&a]).unwrap();
        a.as_slice::<f32>().to_vec()
    }

    /// What the CUDA step does to the buffers: the new token into slot idx.
    fn write_slot(cache: &mut impl DecodeSlots, token: &Array) -> (i32, Vec<i32>) {
        let (mut k, mut v, idx, left) = cache.decode_buffers().unwrap().expect("covered");
        assert!(idx < k.dim(2), "room at slot {idx}");
        k.try_index_mut((.., .., idx..idx + 1, ..), token).unwrap();
        v.try_index_mut((.., .., idx..idx + 1, ..), token).unwrap();
        cache.decode_written(k, v);
        (idx, left)
    }

    #[test]
    fn a_sequence_cache_grows_and_advances_as_an_update_would() {
        // 256 tokens fill the first step exactly: the decode token needs a
        // second one, as update_and_fetch would append.
        let prompt = seq(1, STEP, 0.0);
        let token = seq(1, 1, 1000.0);
        let (mut fast, mut slow) = (KvCache::new(), KvCache::new());
        fast.update_and_fetch(&prompt, &prompt).unwrap();
        slow.update_and_fetch(&prompt, &prompt).unwrap();
        assert_eq!(write_slot(&mut fast, &token), (STEP, vec![0]));
        let (want, _) = slow.update_and_fetch(&token, &token).unwrap();
        assert_eq!(fast.offset(), STEP + 1);
        assert_eq!(fast.nbytes(), slow.nbytes());
        let (k, _) = fast.buffers().unwrap();
        let got = k
            .as_float()
            .unwrap()
            .try_index((.., .., ..STEP + 1, ..))
            .unwrap();
        assert_eq!(read(&got), read(&want));
    }

    #[test]
    fn a_batch_hands_over_its_left_padding_and_idx() {
        let mut fast = BatchKvCache::new(CacheKind::Full);
        let mut slow = BatchKvCache::new(CacheKind::Full);
        for c in [&mut fast, &mut slow] {
            c.extend(
                &Planes::float(seq(1, 3, 10.0)),
                &Planes::float(seq(1, 3, 10.0)),
                3,
            )
            .unwrap();
            c.extend(
                &Planes::float(seq(1, 5, 20.0)),
                &Planes::float(seq(1, 5, 20.0)),
                5,
            )
            .unwrap();
        }
        let token = seq(2, 1, 1000.0);
        let (idx, left) = write_slot(&mut fast, &token);
        assert_eq!((idx, left), (5, vec![2, 0]));
        let (want, _) = slow.update_and_fetch(&token, &token).unwrap();
        assert_eq!(fast.idx(), 6);
        let (k, _, _, _) = fast.decode_buffers().unwrap().expect("covered");
        let got = k.try_index((.., .., ..6, ..)).unwrap();
        assert_eq!(read(&got), read(&want));
    }

    #[test]
    fn quantized_windowed_recurrent_and_empty_layers_are_not_covered() {
        let mut empty = KvCache::new();
        assert!(empty.decode_buffers().unwrap().is_none());
        let mut window = LayerKv::new(CacheKind::Window(8));
        window
            .update_and_fetch(&seq(1, 3, 0.0), &seq(1, 3, 0.0))
            .unwrap();
        assert!(window.decode_buffers().unwrap().is_none());
        let mut recurrent = BatchKvCache::new(CacheKind::Recurrent);
        assert!(recurrent.decode_buffers().unwrap().is_none());
        let mut quantized = KvCache::new();
        let x = Array::from_slice(&[0.5f32; 2 * 4 * 64], &[1, 2, 4, 64]);
        quantized.update_and_fetch(&x, &x).unwrap();
        let mut quantized = quantized
            .to_quantized(crate::cache::KvQuant::new(8, 64).unwrap())
            .unwrap();
        assert!(quantized.decode_buffers().unwrap().is_none());
    }
}
