//! One layer of one sequence's cache, by the layer's [`CacheKind`]: a growing
//! [`KvCache`] for a layer that attends over everything, a
//! [`RotatingKvCache`] of the window for a sliding-window layer, a
//! [`RecurrentCache`] for a linear-attention layer (mlx-lm's `make_cache` of
//! each architecture).
use mlx_rs::Array;
use mlx_rs::error::Exception;

use super::{
    AttentionMask, CacheKind, Fetched, KvCache, KvQuant, KvSetting, LayerCache, Positions,
    RecurrentCache, RotatingKvCache,
};

/// A sequence's cache of one layer. Cloning shares the buffers until either
/// side writes.
#[derive(Clone)]
pub enum LayerKv {
    Full(KvCache),
    Window(RotatingKvCache),
    Recurrent(RecurrentCache),
}

impl LayerKv {
    /// An empty cache for a layer of `kind`.
    pub fn new(kind: CacheKind) -> Self {
        match kind {
            CacheKind::Full => LayerKv::Full(KvCache::new()),
            CacheKind::Window(n) => LayerKv::Window(RotatingKvCache::new(n, 0)),
            CacheKind::Recurrent => LayerKv::Recurrent(RecurrentCache::new()),
        }
    }

    /// Empty caches for layers of `kinds`.
    pub fn fresh(kinds: &[CacheKind]) -> Vec<Self> {
        kinds.iter().map(|&k| Self::new(k)).collect()
    }

    /// The kind of layer this caches.
    pub fn kind(&self) -> CacheKind {
        match self {
            LayerKv::Full(_) => CacheKind::Full,
            LayerKv::Window(c) => CacheKind::Window(c.max_size()),
            LayerKv::Recurrent(_) => CacheKind::Recurrent,
        }
    }

    /// Tokens seen (a window holds fewer).
    pub fn offset(&self) -> i32 {
        match self {
            LayerKv::Full(c) => c.offset(),
            LayerKv::Window(c) => c.offset(),
            LayerKv::Recurrent(c) => c.offset(),
        }
    }

    /// Keeps only the first `n` tokens when the layer can (a window that has
    /// evicted what the next token needs cannot, nor a recurrent state: false,
    /// nothing changed).
    pub fn rewind_to(&mut self, n: i32) -> Result<bool, Exception> {
        let drop = self.offset() - n;
        match self {
            LayerKv::Full(c) => {
                c.trim(drop);
                Ok(true)
            }
            LayerKv::Window(c) => c.rewind(drop),
            LayerKv::Recurrent(_) => Ok(drop == 0),
        }
    }

    /// How its keys and values are quantized (`None`: full precision, or
    /// no keys at all).
    pub fn quant(&self) -> Option<KvQuant> {
        match self {
            LayerKv::Full(c) => c.quant(),
            LayerKv::Window(_) | LayerKv::Recurrent(_) => None,
        }
    }

    /// Quantizes a full-attention layer's keys and values when `setting`
    /// asks for it and the layer holds at least its start (mlx-lm's
    /// `maybe_quantize_kv_cache`); other layers stay as they are (a window
    /// with a setting is refused before it gets here).
    pub fn maybe_quantize(&mut self, setting: Option<KvSetting>) -> Result<(), Exception> {
        if let (Some(s), LayerKv::Full(c)) = (setting, &*self)
            && c.quant().is_none()
            && c.offset() as usize >= s.start
        {
            *self = LayerKv::Full(c.to_quantized(s.quant)?);
        }
        Ok(())
    }

    /// The windowed layer's cache, if this is one.
    pub fn as_window(&self) -> Option<&RotatingKvCache> {
        match self {
            LayerKv::Window(c) => Some(c),
            _ => None,
        }
    }

    /// Whether it can go back to any earlier token (only a growing cache can).
    pub fn trims(&self) -> bool {
        matches!(self, LayerKv::Full(_))
    }

    /// The buffers, for evaluation.
    pub fn arrays(&self) -> Box<dyn Iterator<Item = &Array> + '_> {
        match self {
            LayerKv::Full(c) => Box::new(c.arrays()),
            LayerKv::Window(c) => Box::new(c.arrays()),
            LayerKv::Recurrent(c) => Box::new(c.arrays()),
        }
    }

    /// Bytes held by the buffers.
    pub fn nbytes(&self) -> usize {
        match self {
            LayerKv::Full(c) => c.nbytes(),
            LayerKv::Window(c) => c.nbytes(),
            LayerKv::Recurrent(c) => c.nbytes(),
        }
    }
}

impl LayerCache for LayerKv {
    fn positions(&self) -> Result<Positions, Exception> {
        Ok(Positions::Uniform(self.offset()))
    }

    fn mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask, Exception> {
        match self {
            LayerKv::Full(c) => c.mask(n, window),
            LayerKv::Window(c) => c.make_mask_with(n, window, false),
            LayerKv::Recurrent(c) => c.mask(n),
        }
    }

    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), Exception> {
        match self {
            LayerKv::Full(c) => c.update_and_fetch(keys, values),
            LayerKv::Window(c) => c.update_and_fetch(keys, values),
            LayerKv::Recurrent(_) => Err(Exception::custom(
                "a recurrent layer keeps no keys and values",
            )),
        }
    }

    fn recurrent(&mut self) -> Option<&mut RecurrentCache> {
        match self {
            LayerKv::Recurrent(c) => Some(c),
            _ => None,
        }
    }

    fn update_and_fetch_kv(&mut self, keys: &Array, values: &Array) -> Result<Fetched, Exception> {
        match self {
            LayerKv::Full(c) => c.update_and_fetch_kv(keys, values),
            _ => self
                .update_and_fetch(keys, values)
                .map(|(k, v)| Fetched::Float(k, v)),
        }
    }
}
