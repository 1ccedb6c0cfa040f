//! Quantized keys and values: mlx-lm's `QuantizedKVCache`. Each token's
//! keys and values are MLX affine-quantized along the head dimension (packed
//! `uint32` words plus one scale and one bias per group, in the keys'
//! dtype), as they are written; attention multiplies against the packed
//! planes directly (`quantized_matmul`), never a full-precision copy.
//!
//! A cache starts in full precision and is turned quantized once it holds
//! `quantized_kv_start` tokens (checked after every prefill chunk and every
//! decode step, as mlx-lm's `maybe_quantize_kv_cache`); the buffers keep
//! their layout, so a [`Planes`] of one array (full precision) or three
//! (packed, scales, biases) flows through the same growth, join, filter and
//! extract code.
use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::{TryIndexMutOp, TryIndexOp};
use mlx_rs::ops::{quantize, quantized_matmul};

/// Bit widths MLX's affine quantization takes.
const BITS: [i32; 6] = [2, 3, 4, 5, 6, 8];
/// Group sizes MLX's affine quantization takes.
const GROUPS: [i32; 3] = [32, 64, 128];
/// mlx-lm's default `kv_group_size`.
pub const DEFAULT_GROUP: i32 = 64;

/// How a KV cache is quantized: bits per element and elements per group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct KvQuant {
    pub bits: i32,
    pub group_size: i32,
}

impl KvQuant {
    /// Checked settings (an unsupported width or group is an error naming it).
    pub fn new(bits: i32, group_size: i32) -> Result<Self, String> {
        if !BITS.contains(&bits) {
            return Err(format!(
                "kv_bits must be one of {BITS:?} (or 0 for no quantization), not {bits}"
            ));
        }
        if !GROUPS.contains(&group_size) {
            return Err(format!(
                "kv_group_size must be one of {GROUPS:?}, not {group_size}"
            ));
        }
        Ok(Self { bits, group_size })
    }

    /// Bytes of `elements` quantized elements (a multiple of the group)
    /// whose scales and biases are `dtype_bytes` wide.
    pub fn bytes(self, elements: u64, dtype_bytes: u64) -> u64 {
        elements * self.bits as u64 / 8 + elements / self.group_size as u64 * 2 * dtype_bytes
    }
}

/// A sequence's KV setting: quantized from `start` tokens on (mlx-lm's
/// `kv_bits`, `kv_group_size`, `quantized_kv_start`), or `None` for full
/// precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct KvSetting {
    pub quant: KvQuant,
    pub start: usize,
}

/// Keys or values as held: one full-precision array `[B, H, T, D]`, or the
/// three planes of its quantization (packed `[B, H, T, D * bits / 32]`,
/// scales and biases `[B, H, T, D / group]`).
#[derive(Clone)]
pub struct Planes(Vec<Array>);

impl Planes {
    /// A full-precision array.
    pub fn float(a: Array) -> Self {
        Self(vec![a])
    }

    /// `x` (`[..., D]`) quantized along its last axis.
    pub fn quantize(x: &Array, q: KvQuant) -> Result<Self, Exception> {
        let (w, scales, biases) = quantize(x, q.group_size, q.bits)?;
        Ok(Self(vec![w, scales, biases]))
    }

    /// Rebuilds planes from their arrays (1 or 3).
    pub fn from_parts(parts: Vec<Array>) -> Result<Self, Exception> {
        match parts.len() {
            1 | 3 => Ok(Self(parts)),
            n => Err(Exception::custom(format!(
                "{n} KV planes (1 or 3 expected)"
            ))),
        }
    }

    /// Whether these are quantized planes.
    pub fn is_quantized(&self) -> bool {
        self.0.len() == 3
    }

    /// The full-precision array, if that is what these are.
    pub fn as_float(&self) -> Option<&Array> {
        match self.0.as_slice() {
            [a] => Some(a),
            _ => None,
        }
    }

    /// The arrays (one, or packed, scales, biases).
    pub fn parts(&self) -> &[Array] {
        &self.0
    }

    /// Time slots (axis 2).
    pub fn time(&self) -> i32 {
        self.0[0].dim(2)
    }

    /// Rows (axis 0).
    pub fn rows(&self) -> i32 {
        self.0[0].dim(0)
    }

    /// `f` applied to every plane.
    pub fn map(
        &self,
        mut f: impl FnMut(&Array) -> Result<Array, Exception>,
    ) -> Result<Self, Exception> {
        Ok(Self(self.0.iter().map(&mut f).collect::<Result<_, _>>()?))
    }

    /// `f` applied to every pair of planes of `self` and `other` (the same kind).
    pub fn zip_map(
        &self,
        other: &Planes,
        mut f: impl FnMut(&Array, &Array) -> Result<Array, Exception>,
    ) -> Result<Self, Exception> {
        if self.0.len() != other.0.len() {
            return Err(Exception::custom(
                "joining quantized and full-precision keys and values",
            ));
        }
        Ok(Self(
            self.0
                .iter()
                .zip(&other.0)
                .map(|(a, b)| f(a, b))
                .collect::<Result<_, _>>()?,
        ))
    }

    /// Writes `new` (the same kind of planes) into time slots `slots`, in
    /// place.
    pub fn write_slots(
        &mut self,
        new: &Planes,
        slots: std::ops::Range<i32>,
    ) -> Result<(), Exception> {
        if self.0.len() != new.0.len() {
            return Err(Exception::custom(
                "writing full-precision keys and values into quantized ones",
            ));
        }
        for (buf, part) in self.0.iter_mut().zip(&new.0) {
            buf.try_index_mut((.., .., slots.clone(), ..), part)?;
        }
        Ok(())
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        self.0.iter().map(Array::nbytes).sum()
    }
}

/// What a layer's cache gives attention: keys and values in full precision,
/// or quantized planes with their setting.
pub enum Fetched {
    Float(Array, Array),
    Quantized {
        keys: Planes,
        values: Planes,
        quant: KvQuant,
    },
}

/// Queries attended together: a prefill chunk's scores (`[B, H, L, T]`,
/// float) are made this many rows at a time, so a long prompt over a long
/// cache never holds all of them (mlx-lm #1587); every row's numbers are
/// what one pass over all rows gives.
const QUERY_BLOCK: i32 = 256;

/// mlx-lm's `quantized_scaled_dot_product_attention`: `queries`
/// (`[B, Hq, L, D]`) over quantized keys and values (`[B, Hkv, T, ...]`),
/// under a boolean mask (`[B|1, 1, L, T]`, `[L, T]`, or none), in blocks of
/// [`QUERY_BLOCK`] queries.
pub fn quantized_attention(
    queries: &Array,
    keys: &Planes,
    values: &Planes,
    quant: KvQuant,
    scale: f32,
    mask: Option<&Array>,
) -> Result<Array, Exception> {
    let l = queries.dim(2);
    if l <= QUERY_BLOCK {
        return attend_block(queries, keys, values, quant, scale, mask);
    }
    let mut outs = Vec::new();
    let mut start = 0;
    while start < l {
        let end = (start + QUERY_BLOCK).min(l);
        let q = queries.try_index((.., .., start..end, ..))?;
        let m = match mask {
            Some(m) if m.ndim() >= 2 => {
                let rows = m.ndim() as i32 - 2;
                let idx = Array::arange::<_, i32>(start, end, None)?;
                Some(m.take_axis(&idx, rows)?)
            }
            other => other.cloned(),
        };
        let out = attend_block(&q, keys, values, quant, scale, m.as_ref())?;
        // Each block is evaluated lazily with the rest; keep the graph small.
        outs.push(out);
        start = end;
    }
    mlx_rs::ops::concatenate(&outs, 2)
}

fn attend_block(
    queries: &Array,
    keys: &Planes,
    values: &Planes,
    quant: KvQuant,
    scale: f32,
    mask: Option<&Array>,
) -> Result<Array, Exception> {
    let (b, heads, l, d) = (
        queries.dim(0),
        queries.dim(1),
        queries.dim(2),
        queries.dim(3),
    );
    let kv_heads = keys.parts()[0].dim(1);
    let repeats = heads / kv_heads;
    let dtype = queries.dtype();
    let mut q = queries.multiply(Array::from_f32(scale).as_dtype(dtype)?)?;
    let (mut k, mut v) = (keys.clone(), values.clone());
    if repeats > 1 {
        q = q.reshape(&[b, kv_heads, repeats, l, d])?;
        k = k.map(|x| x.expand_dims(-3))?;
        v = v.map(|x| x.expand_dims(-3))?;
    }
    let [kw, ks, kb] = k.parts() else {
        return Err(Exception::custom("keys are not quantized"));
    };
    let mut scores = quantized_matmul(&q, kw, ks, kb, true, quant.group_size, quant.bits)?;
    if let Some(m) = mask {
        let m = if repeats > 1 && m.ndim() > 3 {
            m.expand_dims(-3)?
        } else {
            m.clone()
        };
        let lowest = Array::from_f32(crate::model::layers::attention::dtype_min(scores.dtype()))
            .as_dtype(scores.dtype())?;
        scores = mlx_rs::ops::select(&m, &scores, &lowest)?;
    }
    let weights = mlx_rs::ops::softmax_axis(&scores, -1, true)?;
    let [vw, vs, vb] = v.parts() else {
        return Err(Exception::custom("values are not quantized"));
    };
    let out = quantized_matmul(&weights, vw, vs, vb, false, quant.group_size, quant.bits)?;
    if repeats > 1 {
        out.reshape(&[b, heads, l, d])
    } else {
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked_and_bytes_follow_the_width() {
        assert!(KvQuant::new(8, 64).is_ok());
        assert!(KvQuant::new(7, 64).unwrap_err().contains("kv_bits"));
        assert!(KvQuant::new(4, 48).unwrap_err().contains("kv_group_size"));
        // 128 float16 elements: 256 bytes; at 4 bits 64 + 2 groups x 2 x 2.
        let q4 = KvQuant::new(4, 64).unwrap();
        assert_eq!(q4.bytes(128, 2), 64 + 8);
        let q8 = KvQuant::new(8, 64).unwrap();
        assert_eq!(q8.bytes(128, 2), 128 + 8);
    }
}
