//! The prompt cache: ONE entry, the token ids whose keys and values the
//! per-layer caches hold. A new prompt reuses the longest common prefix by
//! token content, and always re-evaluates at least its last token.
use crate::cache::KvCache;

/// The single prefix-matchable KV entry.
pub struct PromptCache {
    tokens: Vec<u32>,
    layers: Vec<KvCache>,
}

impl PromptCache {
    /// An empty entry for a model of `layers` layers.
    pub fn new(layers: usize) -> Self {
        Self {
            tokens: Vec::new(),
            layers: (0..layers).map(|_| KvCache::new()).collect(),
        }
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Bytes of the layers' buffers.
    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(KvCache::nbytes).sum()
    }

    /// Tokens of the entry `prompt` can reuse: their common prefix by
    /// content, at most `prompt.len() - 1` (the last prompt token is always
    /// evaluated, for its logits).
    fn reusable(&self, prompt: &[u32]) -> usize {
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        common.min(prompt.len().saturating_sub(1))
    }

    /// Prepares the entry for `prompt`: keeps the longest common prefix (by
    /// content), at most `prompt.len() - 1` tokens, trims the rest, and returns
    /// how many tokens are reused.
    pub fn reuse_for(&mut self, prompt: &[u32]) -> usize {
        let keep = self.reusable(prompt);
        self.truncate(keep);
        keep
    }

    /// The entry's longest common prefix with `prompt` (by content, at most
    /// `prompt.len() - 1` tokens) as caches of a new sequence's own: they
    /// share the entry's buffers until the sequence writes, when MLX copies,
    /// so the entry stays whole for the next request. Returns the tokens
    /// reused and the caches.
    pub fn share_prefix(&self, prompt: &[u32]) -> (usize, Vec<KvCache>) {
        let keep = self.reusable(prompt);
        if keep == 0 {
            return (0, (0..self.layers.len()).map(|_| KvCache::new()).collect());
        }
        let caches = self
            .layers
            .iter()
            .map(|layer| {
                let mut shared = layer.clone();
                shared.trim(shared.offset() - keep as i32);
                shared
            })
            .collect();
        (keep, caches)
    }

    /// Makes `caches` the entry, holding `tokens` (of which the caches may
    /// hold fewer: only what they hold is recorded).
    pub fn replace(&mut self, tokens: Vec<u32>, caches: Vec<KvCache>) {
        debug_assert_eq!(caches.len(), self.layers.len());
        self.layers = caches;
        self.tokens = tokens;
        let held = self.layers.first().map_or(0, |l| l.offset()) as usize;
        self.truncate(held);
    }

    /// The buffers, for inspection.
    pub fn arrays(&self) -> impl Iterator<Item = &mlx_rs::Array> {
        self.layers.iter().flat_map(KvCache::arrays)
    }

    /// Keeps only the first `n` tokens.
    pub fn truncate(&mut self, n: usize) {
        let n = n.min(self.tokens.len());
        self.tokens.truncate(n);
        for layer in &mut self.layers {
            layer.trim(layer.offset() - n as i32);
        }
    }

    /// The layers, for a generation to extend.
    pub fn layers_mut(&mut self) -> &mut [KvCache] {
        &mut self.layers
    }

    /// Records what the layers now hold: `tokens`, of which the layers may hold
    /// fewer (the last generated token is never fed back).
    pub fn commit(&mut self, tokens: impl IntoIterator<Item = u32>) {
        let held = self.layers.first().map_or(0, |l| l.offset()) as usize;
        self.tokens.clear();
        self.tokens.extend(tokens.into_iter().take(held));
        let n = self.tokens.len();
        self.truncate(n);
    }

    /// Forgets everything (the buffers are freed).
    pub fn clear(&mut self) {
        let layers = self.layers.len();
        *self = Self::new(layers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let mut c = PromptCache::new(2);
        fill(&mut c, &[1, 2, 3, 4, 5]);
        // Same length, different content after 2 tokens: only 2 reused.
        assert_eq!(c.reuse_for(&[1, 2, 9, 9, 9]), 2);
        assert_eq!(c.len(), 2);
        assert_eq!(c.layers_mut()[1].offset(), 2);
    }

    #[test]
    fn identical_prompt_reevaluates_one_token() {
        let mut c = PromptCache::new(1);
        fill(&mut c, &[7, 8, 9]);
        assert_eq!(c.reuse_for(&[7, 8, 9]), 2);
        assert_eq!(c.reuse_for(&[7]), 0);
    }

    #[test]
    fn longer_conversation_reuses_all_held() {
        let mut c = PromptCache::new(1);
        fill(&mut c, &[1, 2, 3]);
        assert_eq!(c.reuse_for(&[1, 2, 3, 4, 5]), 3);
        // A different first token is a miss, whatever the length.
        assert_eq!(c.reuse_for(&[9, 2, 3, 4, 5, 6]), 0);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn shared_prefix_leaves_the_entry_whole() {
        let mut c = PromptCache::new(2);
        fill(&mut c, &[1, 2, 3, 4, 5]);
        let (n, mut caches) = c.share_prefix(&[1, 2, 3, 9]);
        assert_eq!(n, 3);
        assert_eq!(caches[0].offset(), 3);
        let kv = Array::from_slice(&[9.0f32; 4], &[1, 1, 1, 4]);
        caches[0].update_and_fetch(&kv, &kv).unwrap();
        assert_eq!(c.len(), 5);
        assert_eq!(c.layers_mut()[0].offset(), 5);
        let (n, caches) = c.share_prefix(&[8, 1]);
        assert_eq!((n, caches[0].offset(), caches.len()), (0, 0, 2));
        c.replace(vec![4, 4, 4], caches);
        assert_eq!(c.len(), 0, "only what the caches hold is recorded");
    }

    #[test]
    fn commit_keeps_only_what_the_layers_hold() {
        let mut c = PromptCache::new(1);
        fill(&mut c, &[1, 2]);
        c.commit([1, 2, 3]);
        assert_eq!(c.len(), 2);
    }
}
