//! The prompt cache: ONE entry, the token ids whose keys and values the
//! per-layer caches hold. A new prompt reuses the longest common prefix by
//! token content, and always re-evaluates at least its last token.
//!
//! A sliding-window layer cannot always go back to that prefix: its rotating
//! cache has evicted what came before its window. It can when the prefix is
//! the whole entry (the next turn of a chat continues where the last one
//! ended) or only a few tokens short of it; otherwise the entry's
//! [`Checkpoint`] is used: the windowed layers as they were at the end of
//! the entry's prompt, taken when that prompt was prefilled. A follow-up turn
//! then reuses the previous prompt and re-evaluates only the previous answer
//! and the new message, instead of everything. A checkpoint holds one window
//! per windowed layer and the state of each recurrent layer (which cannot go
//! back at all: a prefix shorter than the entry is reused only through the
//! checkpoint), no full layer (those trim back), and it is counted in the
//! entry's bytes and its capacity in tokens.
//!
//! A prewarmed system prompt is kept beside the entry (its tokens and all
//! its layers, sharing buffers with the entry until they diverge), so a
//! conversation that begins with it hits even after other conversations
//! replaced the entry, and even on a model whose layers cannot go back.
//!
//! The entry keeps the KV cache setting it was made with (full precision,
//! or quantized from a start) and its layers as they are, quantized or
//! not; a request is given a prefix only from an entry of its own setting
//! (a quantized entry cannot be made full precision again, and quantizing a
//! full-precision one would not give what the request computes alone).
use mlx_rs::Array;
use mlx_rs::error::Exception;

use crate::cache::{BatchKvCache, CacheKind, KvSetting, LayerKv};

/// The layers of a sequence that cannot go back (windowed and recurrent)
/// as they were at a reuse point: after its first `tokens` tokens.
#[derive(Clone)]
pub struct Checkpoint {
    pub tokens: usize,
    /// One per layer: a copy of a layer that cannot go back, `None` for full
    /// layers (they trim back to `tokens`).
    held: Vec<Option<LayerKv>>,
}

/// A windowed layer's cache copied down to its window, or a recurrent state.
fn kept(layer: &LayerKv) -> Result<Option<LayerKv>, Exception> {
    Ok(match layer {
        LayerKv::Full(_) => None,
        LayerKv::Window(w) => Some(LayerKv::Window(w.compacted()?)),
        // Its arrays are never written in place: sharing them is a copy.
        LayerKv::Recurrent(r) => Some(LayerKv::Recurrent(r.clone())),
    })
}

impl Checkpoint {
    /// The layers of `caches` (a sequence's, holding `tokens`) that cannot
    /// go back, or nothing when the model has none.
    pub fn of(caches: &[LayerKv], tokens: usize) -> Result<Option<Self>, Exception> {
        if caches.iter().all(LayerKv::trims) {
            return Ok(None);
        }
        let held = caches.iter().map(kept).collect::<Result<Vec<_>, _>>()?;
        let cp = Self { tokens, held };
        // Copied now: unevaluated, the copies would keep the sources alive.
        mlx_rs::transforms::async_eval(cp.arrays())?;
        Ok(Some(cp))
    }

    /// Row `row`'s layers that cannot go back, from a prefilled group's
    /// caches, after its first `tokens` tokens (copied).
    pub fn from_batch(
        layers: &[BatchKvCache],
        row: usize,
        tokens: usize,
    ) -> Result<Option<Self>, Exception> {
        if layers.iter().all(|l| l.kind() == CacheKind::Full) {
            return Ok(None);
        }
        let mut held = Vec::with_capacity(layers.len());
        for layer in layers {
            held.push(match layer.kind() {
                CacheKind::Full => None,
                CacheKind::Window(_) | CacheKind::Recurrent => {
                    match layer.extract(row, tokens as i32)? {
                        Some(c @ LayerKv::Recurrent(_)) => Some(c),
                        Some(LayerKv::Window(c)) => Some(LayerKv::Window(c.compacted()?)),
                        _ => return Ok(None),
                    }
                }
            });
        }
        let cp = Self { tokens, held };
        mlx_rs::transforms::async_eval(cp.arrays())?;
        Ok(Some(cp))
    }

    /// Bytes of its buffers.
    pub fn nbytes(&self) -> usize {
        self.held.iter().flatten().map(LayerKv::nbytes).sum()
    }

    /// The buffers.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.held.iter().flatten().flat_map(LayerKv::arrays)
    }
}

/// The single prefix-matchable KV entry.
pub struct PromptCache {
    kinds: Vec<CacheKind>,
    tokens: Vec<u32>,
    layers: Vec<LayerKv>,
    checkpoint: Option<Checkpoint>,
    /// The KV setting the entry was made with.
    kv: Option<KvSetting>,
    /// The last prewarmed system prompt: its tokens and layers, and their
    /// KV setting.
    prewarm: Option<(Vec<u32>, Vec<LayerKv>, Option<KvSetting>)>,
}

impl PromptCache {
    /// An empty entry for a model whose layers are of `kinds`.
    pub fn new(kinds: &[CacheKind]) -> Self {
        Self {
            kinds: kinds.to_vec(),
            tokens: Vec::new(),
            layers: LayerKv::fresh(kinds),
            checkpoint: None,
            kv: None,
            prewarm: None,
        }
    }

    /// Keeps a prewarmed system prompt's layers (`tokens` of them) for
    /// every later conversation that begins with it.
    pub fn set_prewarm(&mut self, tokens: Vec<u32>, layers: Vec<LayerKv>, kv: Option<KvSetting>) {
        self.prewarm = (!tokens.is_empty()).then_some((tokens, layers, kv));
    }

    /// Tokens the prewarmed system prompt gives `prompt` (0 unless the
    /// prompt begins with it and goes on past it, under the same setting).
    fn prewarm_reuse(&self, prompt: &[u32], kv: Option<KvSetting>) -> usize {
        match &self.prewarm {
            Some((tokens, _, made))
                if *made == kv && tokens.len() < prompt.len() && prompt.starts_with(tokens) =>
            {
                tokens.len()
            }
            _ => 0,
        }
    }

    /// The KV setting of the entry.
    pub fn kv(&self) -> Option<KvSetting> {
        self.kv
    }

    /// The entry's layers.
    pub fn layers(&self) -> &[LayerKv] {
        &self.layers
    }

    /// The entry's tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The checkpoint, if any.
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoint.as_ref()
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Tokens held, the prewarmed prompt's included: what the KV budget
    /// counts.
    pub fn footprint(&self) -> usize {
        self.tokens.len() + self.prewarm.as_ref().map_or(0, |(t, _, _)| t.len())
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Bytes of the layers' buffers, the checkpoint and the prewarmed
    /// prompt (counted apart even while it shares the entry's buffers).
    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(LayerKv::nbytes).sum::<usize>()
            + self.checkpoint.as_ref().map_or(0, Checkpoint::nbytes)
            + self
                .prewarm
                .as_ref()
                .map_or(0, |(_, l, _)| l.iter().map(LayerKv::nbytes).sum())
    }

    /// Bytes of the checkpoint alone.
    pub fn checkpoint_bytes(&self) -> usize {
        self.checkpoint.as_ref().map_or(0, Checkpoint::nbytes)
    }

    /// Tokens of the entry `prompt` could share: their common prefix by
    /// content, at most `prompt.len() - 1` (the last prompt token is always
    /// evaluated, for its logits).
    fn common(&self, prompt: &[u32]) -> usize {
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        common.min(prompt.len().saturating_sub(1))
    }

    /// The entry's layers taken back to their first `n` tokens (copies that
    /// share the buffers), if every layer can go back that far.
    fn rewound(&self, n: usize) -> Option<Vec<LayerKv>> {
        let mut out = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let mut c = layer.clone();
            if !c.rewind_to(n as i32).ok()? {
                return None;
            }
            out.push(c);
        }
        Some(out)
    }

    /// The full layers taken back to the checkpoint, its windowed layers in
    /// place of the entry's.
    fn restored(&self, cp: &Checkpoint) -> Option<Vec<LayerKv>> {
        let mut out = Vec::with_capacity(self.layers.len());
        for (layer, held) in self.layers.iter().zip(&cp.held) {
            match held {
                Some(h) => out.push(h.clone()),
                None => {
                    let mut c = layer.clone();
                    if !c.rewind_to(cp.tokens as i32).ok()? {
                        return None;
                    }
                    out.push(c);
                }
            }
        }
        Some(out)
    }

    /// The entry's longest reusable prefix of `prompt` (by content, at most
    /// `prompt.len() - 1` tokens) as caches of a new sequence's own: they
    /// share the entry's buffers until the sequence writes, when MLX copies,
    /// so the entry stays whole for the next request. Where a windowed layer
    /// cannot go back to the common prefix, the checkpoint is used if it
    /// lies within it. Returns the tokens reused and the caches.
    pub fn share_prefix(&self, prompt: &[u32], kv: Option<KvSetting>) -> (usize, Vec<LayerKv>) {
        let (n, caches) = self.share_entry(prompt, kv);
        let warm = self.prewarm_reuse(prompt, kv);
        match &self.prewarm {
            Some((_, layers, _)) if warm > n => (warm, layers.clone()),
            _ => (n, caches),
        }
    }

    /// [`PromptCache::share_prefix`] from the entry alone.
    fn share_entry(&self, prompt: &[u32], kv: Option<KvSetting>) -> (usize, Vec<LayerKv>) {
        if kv != self.kv {
            return (0, LayerKv::fresh(&self.kinds));
        }
        let common = self.common(prompt);
        if common > 0 {
            if let Some(caches) = self.rewound(common) {
                return (common, caches);
            }
            if let Some(cp) = self
                .checkpoint
                .as_ref()
                .filter(|cp| cp.tokens <= common && cp.tokens > 0)
                && let Some(caches) = self.restored(cp)
            {
                return (cp.tokens, caches);
            }
        }
        (0, LayerKv::fresh(&self.kinds))
    }

    /// Tokens a prompt would reuse (see [`PromptCache::share_prefix`]).
    pub fn reusable(&self, prompt: &[u32], kv: Option<KvSetting>) -> usize {
        self.share_prefix(prompt, kv).0
    }

    /// Prepares the entry itself for `prompt` (a generation that extends it
    /// in place): keeps what [`PromptCache::share_prefix`] would share, drops
    /// the rest, and returns how many tokens are reused.
    pub fn reuse_for(&mut self, prompt: &[u32], kv: Option<KvSetting>) -> usize {
        let (keep, caches) = self.share_entry(prompt, kv);
        let warm = self.prewarm_reuse(prompt, kv);
        if warm > keep
            && let Some((tokens, layers, _)) = &self.prewarm
        {
            // The prewarmed prompt serves, not the entry (nor its checkpoint).
            self.layers = layers.clone();
            self.tokens = tokens.clone();
            self.checkpoint = None;
            self.kv = kv;
            return warm;
        }
        self.kv = kv;
        self.layers = caches;
        self.tokens.truncate(keep);
        if self.checkpoint.as_ref().is_some_and(|cp| cp.tokens > keep) {
            self.checkpoint = None;
        }
        keep
    }

    /// Makes `caches` the entry, holding `tokens` (of which the caches may
    /// hold fewer: only what they hold is recorded), with the checkpoint
    /// taken when its prompt was prefilled.
    pub fn replace(
        &mut self,
        tokens: Vec<u32>,
        caches: Vec<LayerKv>,
        checkpoint: Option<Checkpoint>,
        kv: Option<KvSetting>,
    ) {
        self.kv = kv;
        debug_assert_eq!(caches.len(), self.layers.len());
        let held = caches.first().map_or(0, LayerKv::offset) as usize;
        self.layers = caches;
        self.tokens = tokens;
        self.tokens.truncate(held);
        self.checkpoint = checkpoint.filter(|cp| cp.tokens <= self.tokens.len());
    }

    /// The buffers, for inspection.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.layers
            .iter()
            .flat_map(LayerKv::arrays)
            .chain(self.checkpoint.iter().flat_map(Checkpoint::arrays))
            .chain(
                self.prewarm
                    .iter()
                    .flat_map(|(_, l, _)| l.iter().flat_map(LayerKv::arrays)),
            )
    }

    /// The layers, for a generation to extend.
    pub fn layers_mut(&mut self) -> &mut [LayerKv] {
        &mut self.layers
    }

    /// Records what the layers now hold: `tokens`, of which the layers may hold
    /// fewer (the last generated token is never fed back).
    pub fn commit(&mut self, tokens: impl IntoIterator<Item = u32>) {
        let held = self.layers.first().map_or(0, LayerKv::offset) as usize;
        self.tokens.clear();
        self.tokens.extend(tokens.into_iter().take(held));
        let n = self.tokens.len() as i32;
        if n < held as i32 {
            for layer in &mut self.layers {
                if !layer.rewind_to(n).unwrap_or(false) {
                    // The entry goes; a prewarmed prompt stays.
                    let prewarm = self.prewarm.take();
                    self.clear();
                    self.prewarm = prewarm;
                    return;
                }
            }
        }
    }

    /// Forgets everything (the buffers are freed).
    pub fn clear(&mut self) {
        *self = Self::new(&self.kinds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::LayerCache;
    use mlx_rs::Array;

    fn fill(cache: &mut PromptCache, tokens: &[u32]) {
        let n = tokens.len() as i32;
        let kv = Array::from_slice(&vec![0.5f32; (n * 4) as usize], &[1, 1, n, 4]);
        for layer in cache.layers_mut() {
            layer.update_and_fetch(&kv, &kv).unwrap();
        }
        cache.commit(tokens.iter().copied());
    }

    #[test]
    fn reuses_common_prefix_by_content() {
        let mut c = PromptCache::new(&[CacheKind::Full; 2]);
        fill(&mut c, &[1, 2, 3, 4, 5]);
        // Same length, different content after 2 tokens: only 2 reused.
        assert_eq!(c.reuse_for(&[1, 2, 9, 9, 9], None), 2);
        assert_eq!(c.len(), 2);
        assert_eq!(c.layers_mut()[1].offset(), 2);
    }

    #[test]
    fn identical_prompt_reevaluates_one_token() {
        let mut c = PromptCache::new(&[CacheKind::Full]);
        fill(&mut c, &[7, 8, 9]);
        assert_eq!(c.reuse_for(&[7, 8, 9], None), 2);
        assert_eq!(c.reuse_for(&[7], None), 0);
    }

    #[test]
    fn longer_conversation_reuses_all_held() {
        let mut c = PromptCache::new(&[CacheKind::Full]);
        fill(&mut c, &[1, 2, 3]);
        assert_eq!(c.reuse_for(&[1, 2, 3, 4, 5], None), 3);
        // A different first token is a miss, whatever the length.
        assert_eq!(c.reuse_for(&[9, 2, 3, 4, 5, 6], None), 0);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn shared_prefix_leaves_the_entry_whole() {
        let mut c = PromptCache::new(&[CacheKind::Full; 2]);
        fill(&mut c, &[1, 2, 3, 4, 5]);
        let (n, mut caches) = c.share_prefix(&[1, 2, 3, 9], None);
        assert_eq!(n, 3);
        assert_eq!(caches[0].offset(), 3);
        let kv = Array::from_slice(&[9.0f32; 4], &[1, 1, 1, 4]);
        caches[0].update_and_fetch(&kv, &kv).unwrap();
        assert_eq!(c.len(), 5);
        assert_eq!(c.layers_mut()[0].offset(), 5);
        let (n, caches) = c.share_prefix(&[8, 1], None);
        assert_eq!((n, caches[0].offset(), caches.len()), (0, 0, 2));
        c.replace(vec![4, 4, 4], caches, None, None);
        assert_eq!(c.len(), 0, "only what the caches hold is recorded");
    }

    #[test]
    fn commit_keeps_only_what_the_layers_hold() {
        let mut c = PromptCache::new(&[CacheKind::Full]);
        fill(&mut c, &[1, 2]);
        c.commit([1, 2, 3]);
        assert_eq!(c.len(), 2);
    }

    /// One token (`[1, 1, 1, 4]`) whose values are `t`.
    fn token(t: u32) -> Array {
        Array::from_slice(&[t as f32; 4], &[1, 1, 1, 4])
    }

    #[test]
    fn windows_rewind_while_they_hold_the_window_else_the_checkpoint_serves() {
        let kinds = [CacheKind::Full, CacheKind::Window(4)];
        let mut c = PromptCache::new(&kinds);
        let mut caches = LayerKv::fresh(&kinds);
        // A 6-token prompt, one token at a time (in place: the window wraps).
        let prompt: Vec<u32> = (1..=6).collect();
        for &t in &prompt {
            for layer in caches.iter_mut() {
                layer.update_and_fetch(&token(t), &token(t)).unwrap();
            }
        }
        let checkpoint = Checkpoint::of(&caches, prompt.len())
            .unwrap()
            .expect("a windowed layer");
        assert!(checkpoint.nbytes() > 0);
        // Four generated tokens.
        let answer = [7u32, 8, 9, 10];
        for &t in &answer {
            for layer in caches.iter_mut() {
                layer.update_and_fetch(&token(t), &token(t)).unwrap();
            }
        }
        let all: Vec<u32> = prompt.iter().chain(&answer).copied().collect();
        c.replace(all.clone(), caches, Some(checkpoint), None);
        assert_eq!(c.len(), 10);

        // The next turn continues the whole entry: all of it.
        let mut next = all.clone();
        next.push(11);
        let (n, shared) = c.share_prefix(&next, None);
        assert_eq!((n, shared[1].offset()), (10, 10));

        // A branch 3 tokens back: the window of 4 has evicted what token 8
        // needs, so the checkpoint at the end of the prompt serves.
        let branch: Vec<u32> = all[..7].iter().copied().chain([42, 43]).collect();
        let (n, shared) = c.share_prefix(&branch, None);
        assert_eq!(n, 6);
        assert_eq!((shared[0].offset(), shared[1].offset()), (6, 6));
        let window = shared[1].as_window().expect("a window");
        let (k, _) = window.temporal().unwrap().expect("held");
        let k = k.flatten(None, None).unwrap();
        k.eval().unwrap();
        let held: Vec<f32> = k.as_slice::<f32>().chunks(4).map(|c| c[0]).collect();
        assert_eq!(
            held,
            vec![3.0, 4.0, 5.0, 6.0],
            "the window at the prompt's end"
        );

        // A branch before the checkpoint: nothing to reuse.
        let (n, _) = c.share_prefix(&[1, 2, 3, 99, 100], None);
        assert_eq!(n, 0);
        // The entry itself is whole: its bytes count the checkpoint.
        assert_eq!(c.len(), 10);
        assert!(c.checkpoint_bytes() > 0 && c.nbytes() > c.checkpoint_bytes());
    }
}
