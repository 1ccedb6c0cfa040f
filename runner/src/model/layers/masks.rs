//! The attention masks of one forward pass: one for the layers that attend
//! over everything, made from the first such layer's cache, and one for the
//! sliding-window layers, from the first windowed layer's cache with its
//! window (as mlx-lm's models make `fa_mask` and `swa_mask`).
use mlx_rs::error::Exception;

use crate::cache::{AttentionMask, CacheKind, LayerCache};

/// The masks for the next `n` tokens, by layer kind.
pub struct Masks {
    full: AttentionMask,
    window: AttentionMask,
}

impl Masks {
    /// Takes the masks from `caches` (one per layer, of `kinds`) before the
    /// forward pass appends to them.
    pub fn new<C: LayerCache>(
        kinds: &[CacheKind],
        caches: &[C],
        n: i32,
    ) -> Result<Self, Exception> {
        if caches.len() != kinds.len() {
            return Err(Exception::custom(format!(
                "{} caches for {} layers",
                caches.len(),
                kinds.len()
            )));
        }
        let first = |window: bool| kinds.iter().position(|k| k.window().is_some() == window);
        let full = match first(false) {
            Some(i) => caches[i].mask(n, None)?,
            None => AttentionMask::None,
        };
        let window = match first(true) {
            Some(i) => caches[i].mask(n, kinds[i].window())?,
            None => AttentionMask::None,
        };
        Ok(Self { full, window })
    }

    /// The mask of a layer of `kind`.
    pub fn of(&self, kind: CacheKind) -> &AttentionMask {
        match kind {
            CacheKind::Full => &self.full,
            CacheKind::Window(_) => &self.window,
        }
    }
}
