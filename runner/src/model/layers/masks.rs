//! The attention masks of one forward pass: one for the layers that attend
//! over everything, made from the first such layer's cache, and one for the
//! sliding-window layers, from the first windowed layer's cache with its
//! window (as mlx-lm's models make `fa_mask` and `swa_mask`), and for
//! recurrent layers the `[B, n]` mask of a left-padded batch's real tokens
//! (mlx-lm's `ssm_mask`).
use mlx_rs::error::Exception;

use crate::cache::{AttentionMask, CacheKind, LayerCache};

/// The masks for the next `n` tokens, by layer kind.
pub struct Masks {
    full: AttentionMask,
    window: AttentionMask,
    recurrent: AttentionMask,
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
        let first = |f: fn(&CacheKind) -> bool| kinds.iter().position(f);
        let full = match first(|k| *k == CacheKind::Full) {
            Some(i) => caches[i].mask(n, None)?,
            None => AttentionMask::None,
        };
        let window = match first(|k| k.window().is_some()) {
            Some(i) => caches[i].mask(n, kinds[i].window())?,
            None => AttentionMask::None,
        };
        let recurrent = match first(|k| *k == CacheKind::Recurrent) {
            Some(i) => caches[i].mask(n, None)?,
            None => AttentionMask::None,
        };
        Ok(Self {
            full,
            window,
            recurrent,
        })
    }

    /// The mask of a layer of `kind`.
    pub fn of(&self, kind: CacheKind) -> &AttentionMask {
        match kind {
            CacheKind::Full => &self.full,
            CacheKind::Window(_) => &self.window,
            CacheKind::Recurrent => &self.recurrent,
        }
    }
}
