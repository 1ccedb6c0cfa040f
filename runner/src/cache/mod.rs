//! KV caches: the per-layer growable buffer of one sequence ([`kv::KvCache`]),
//! the sliding-window one ([`rotating::RotatingKvCache`]), either of them as a
//! sequence's layer ([`layer::LayerKv`], by the layer's [`CacheKind`]), and the
//! left-padded buffer of a decode batch ([`batch::BatchKvCache`], mlx-lm's
//! `BatchKVCache`, which also keeps only a window for windowed layers), and
//! the state of a recurrent layer ([`recurrent::RecurrentCache`], mlx-lm's
//! `ArraysCache`), alone or in a batch. Full-attention layers' keys and
//! values may be quantized ([`quantized`], mlx-lm's `QuantizedKVCache`).
//! Layers read any of them through [`LayerCache`].
pub mod batch;
pub mod decode_slots;
pub mod kv;
pub mod layer;
pub mod quantized;
pub mod recurrent;
pub mod rotating;

use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::fast::ScaledDotProductAttentionMask;

pub use batch::BatchKvCache;
pub use decode_slots::DecodeSlots;
pub use kv::KvCache;
pub use layer::LayerKv;
pub use quantized::{Fetched, KvQuant, KvSetting, Planes};
pub use recurrent::RecurrentCache;
pub use rotating::RotatingKvCache;

/// What a layer attends over, and so which cache it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheKind {
    /// Every earlier token (a growing cache).
    Full,
    /// Only the last `n` tokens, itself included (a rotating cache of `n`).
    Window(i32),
    /// No attention: a recurrent state of fixed size (linear attention).
    Recurrent,
}

impl CacheKind {
    /// The window, for a windowed layer.
    pub fn window(self) -> Option<i32> {
        match self {
            CacheKind::Window(n) => Some(n),
            CacheKind::Full | CacheKind::Recurrent => None,
        }
    }

    /// Whether the layer keeps keys and values for every token.
    pub fn grows(self) -> bool {
        self == CacheKind::Full
    }
}

/// The attention mask for the next chunk.
#[derive(Debug, Clone)]
pub enum AttentionMask {
    /// No mask: every query sees every key (a single token).
    None,
    /// Plain causal masking within the chunk.
    Causal,
    /// A boolean mask (true = attend), broadcast against `[B, H, N, keys]`.
    Array(Array),
}

impl AttentionMask {
    /// The mask as `scaled_dot_product_attention` takes it.
    pub fn as_sdpa(&self) -> Option<ScaledDotProductAttentionMask<'_>> {
        match self {
            AttentionMask::None => None,
            AttentionMask::Causal => Some(ScaledDotProductAttentionMask::Causal),
            AttentionMask::Array(mask) => Some(ScaledDotProductAttentionMask::Array(mask)),
        }
    }
}

/// The positions of the tokens a forward pass adds, for the rotary embedding.
#[derive(Debug, Clone)]
pub enum Positions {
    /// Every sequence continues at the same position.
    Uniform(i32),
    /// One starting position per sequence (`[B]` int32), for a batch whose
    /// sequences have different lengths.
    PerRow(Array),
}

/// What attention needs from a layer's cache: where the new tokens sit, what
/// they may see, and the keys and values with them appended.
pub trait LayerCache {
    /// The rotary positions of the next tokens.
    fn positions(&self) -> Result<Positions, Exception>;
    /// The mask for the next `n` tokens, taken before they are appended;
    /// `window` limits each query to the last `window` keys (itself included).
    fn mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask, Exception>;
    /// Appends `keys`/`values` (`[B, H, L, D]`) and returns all the layer holds.
    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), Exception>;
    /// A recurrent layer's state; `None` for an attention layer's cache.
    fn recurrent(&mut self) -> Option<&mut RecurrentCache>;
    /// [`LayerCache::update_and_fetch`] that also gives quantized keys and
    /// values as they are held (a layer that attends over them directly).
    fn update_and_fetch_kv(&mut self, keys: &Array, values: &Array) -> Result<Fetched, Exception> {
        let (k, v) = self.update_and_fetch(keys, values)?;
        Ok(Fetched::Float(k, v))
    }
}

/// Full-precision or quantized planes as attention takes them.
pub(crate) fn fetched(
    (keys, values): (Planes, Planes),
    quant: Option<KvQuant>,
) -> Result<Fetched, Exception> {
    match quant {
        Some(quant) => Ok(Fetched::Quantized {
            keys,
            values,
            quant,
        }),
        None => match (keys.as_float(), values.as_float()) {
            (Some(k), Some(v)) => Ok(Fetched::Float(k.clone(), v.clone())),
            _ => Err(kv::not_quantizable()),
        },
    }
}

impl LayerCache for KvCache {
    fn positions(&self) -> Result<Positions, Exception> {
        Ok(Positions::Uniform(self.offset()))
    }

    /// mlx-lm's `create_attention_mask(N, offset, window_size)` of a `KVCache`.
    fn mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask, Exception> {
        Ok(match window {
            Some(w) => AttentionMask::Array(rotating::causal_mask(n, self.offset(), Some(w))?),
            None if n == 1 => AttentionMask::None,
            None => AttentionMask::Causal,
        })
    }

    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), Exception> {
        KvCache::update_and_fetch(self, keys, values)
    }

    fn recurrent(&mut self) -> Option<&mut RecurrentCache> {
        None
    }

    fn update_and_fetch_kv(&mut self, keys: &Array, values: &Array) -> Result<Fetched, Exception> {
        let held = self.update_and_fetch_planes(keys, values)?;
        fetched(held, self.quant())
    }
}
