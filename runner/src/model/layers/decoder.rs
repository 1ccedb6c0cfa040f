//! The pre-norm decoder-only transformer that Llama, Mistral, Qwen2, Qwen3,
//! Qwen3-MoE, Qwen3-Next and Phi-3 share (`h += mix(norm(h)); h +=
//! mlp(norm(h))`, the mixer attention or, on recurrent layers, a gated
//! delta-net; the MLP dense or a sparse mixture of experts); each of those
//! architecture files maps its config onto a [`DecoderSpec`]. Families whose
//! blocks differ (Gemma's four norms per block) have their own model files
//! over the same blocks.
use std::path::Path;
use std::sync::{Arc, OnceLock};

use mlx_rs::Array;
use mlx_rs::error::Exception;

use super::attention::{Attention, AttentionShape};
use super::cuda_decode::{FastDecode, FastLayer, FastMlp, FastParts};
use super::embedding::Embedding;
use super::gated_delta::{DeltaShape, GatedDeltaNet};
use super::linear::Linear;
use super::masks::Masks;
use super::mlp::{Mlp, MlpShape};
use super::moe::{MoeShape, SparseMoe};
use super::norm::RmsNorm;
use super::rope::Rope;
use crate::cache::{CacheKind, LayerCache};
use crate::error::Result;
use crate::model::Dims;
use crate::model::config::{Quantization, check_eps};
use crate::model::weights::Weights;
use crate::shard::Comm;

/// Everything that fixes a decoder's shape.
#[derive(Clone)]
pub struct DecoderSpec {
    pub vocab: i32,
    pub rms_eps: f32,
    pub attention: AttentionShape,
    pub mlp: MlpShape,
    pub rope: Rope,
    /// One per layer: full attention, or a sliding window.
    pub kinds: Vec<CacheKind>,
    pub tie_embeddings: bool,
    /// The untied head's share of the vocabulary on this rank: `1` whole,
    /// `N` a 1/N block of rows whose logits the group gathers (Qwen3.5 in
    /// a group, as mlx-lm's `shard()` splits its head).
    pub head_parts: i32,
    /// Sparse layers and their experts (Qwen3-MoE); `None`: all dense.
    pub moe: Option<MoeLayers>,
    /// The gated delta-net of the layers whose kind is
    /// [`CacheKind::Recurrent`] (Qwen3-Next).
    pub delta: Option<DeltaShape>,
}

/// Which layers are sparse, and the shape of their expert blocks.
#[derive(Debug, Clone)]
pub struct MoeLayers {
    pub shape: MoeShape,
    /// One per layer: a sparse block (else the dense `mlp`).
    pub sparse: Vec<bool>,
}

impl DecoderSpec {
    /// The sizes the runner's budgets need.
    pub fn dims(&self) -> Dims {
        let a = &self.attention;
        Dims {
            vocab: self.vocab,
            hidden: a.hidden,
            intermediate: self.mlp.intermediate,
            heads: a.heads,
            kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            kinds: self.kinds.clone(),
            kv_widths: self.kinds.contains(&CacheKind::Recurrent).then(|| {
                let width = a.kv_heads * a.head_dim;
                self.kinds
                    .iter()
                    .map(|k| if *k == CacheKind::Recurrent { 0 } else { width })
                    .collect()
            }),
            recurrent_elements: self.delta.map(|d| d.state_elements()),
        }
    }
}

/// A block's feed-forward part.
pub enum FeedForward {
    Dense(Mlp),
    Sparse(Box<SparseMoe>),
}

impl FeedForward {
    fn forward(&self, x: &Array) -> Result<Array, Exception> {
        match self {
            Self::Dense(m) => m.forward(x),
            Self::Sparse(m) => m.forward(x),
        }
    }

    fn parameters(&self) -> Vec<&Array> {
        match self {
            Self::Dense(m) => m.parameters(),
            Self::Sparse(m) => m.parameters(),
        }
    }
}

/// What mixes a block's tokens: attention, or a recurrence.
enum Mixer {
    Attention(Attention),
    Delta(GatedDeltaNet),
}

struct Block {
    input_norm: RmsNorm,
    attention: Mixer,
    post_norm: RmsNorm,
    mlp: FeedForward,
}

/// A loaded decoder.
pub struct Decoder {
    embed: Embedding,
    blocks: Vec<Block>,
    kinds: Vec<CacheKind>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    /// Whether `lm_head` holds 1/N of the vocabulary (its logits gathered
    /// over the group).
    head_split: bool,
    /// The group this decoder's projections are split over (tensor
    /// parallelism); `None`: the whole model is here.
    shard: Option<Arc<Comm>>,
    /// Grove's CUDA decode step over these weights, made at the first
    /// decode step where it is wanted and the model is covered.
    fast: OnceLock<Option<FastDecode>>,
}

impl Decoder {
    /// Builds the decoder from HF-named weights (`model.layers.N...`).
    pub fn load(
        path: &Path,
        w: &mut Weights,
        quant: &Quantization,
        spec: &DecoderSpec,
    ) -> Result<Self> {
        spec.dims().validate(path)?;
        check_eps(path, spec.rms_eps)?;
        let hidden = spec.attention.hidden;
        // Precomputed rotary tables some checkpoints carry are not used.
        w.discard(|name| name.ends_with(".rotary_emb.inv_freq"));
        let embed = Embedding::load(w, quant, "model.embed_tokens", spec.vocab, hidden)?;
        // Grown layer by layer: the config's count is only a claim until the
        // tensors of each layer are found.
        let mut blocks = Vec::new();
        for i in 0..spec.kinds.len() {
            let p = format!("model.layers.{i}");
            blocks.push(Block {
                input_norm: RmsNorm::load(
                    w,
                    &format!("{p}.input_layernorm"),
                    hidden,
                    spec.rms_eps,
                )?,
                attention: match (spec.kinds[i], spec.delta) {
                    (CacheKind::Recurrent, Some(d)) => Mixer::Delta(GatedDeltaNet::load(
                        w,
                        quant,
                        &format!("{p}.linear_attn"),
                        d,
                    )?),
                    (CacheKind::Recurrent, None) => {
                        return Err(crate::error::RunnerError::Weights(format!(
                            "{p}: a recurrent layer without a gated delta-net shape"
                        )));
                    }
                    _ => Mixer::Attention(Attention::load(
                        w,
                        quant,
                        &format!("{p}.self_attn"),
                        spec.attention,
                        spec.rope.clone(),
                    )?),
                },
                post_norm: RmsNorm::load(
                    w,
                    &format!("{p}.post_attention_layernorm"),
                    hidden,
                    spec.rms_eps,
                )?,
                mlp: match &spec.moe {
                    Some(moe) if moe.sparse.get(i).copied().unwrap_or(false) => {
                        FeedForward::Sparse(Box::new(SparseMoe::load(
                            w,
                            quant,
                            &format!("{p}.mlp"),
                            moe.shape,
                        )?))
                    }
                    _ => FeedForward::Dense(Mlp::load(w, quant, &format!("{p}.mlp"), spec.mlp)?),
                },
            });
        }
        let norm = RmsNorm::load(w, "model.norm", hidden, spec.rms_eps)?;
        let lm_head = if spec.tie_embeddings {
            // Some tied checkpoints still carry a copy of the head.
            w.discard(|name| name.starts_with("lm_head."));
            None
        } else {
            Some(Linear::load(
                w,
                quant,
                "lm_head",
                hidden,
                spec.vocab / spec.head_parts.max(1),
                false,
            )?)
        };
        Ok(Self {
            embed,
            blocks,
            kinds: spec.kinds.clone(),
            norm,
            head_split: spec.head_parts > 1 && !spec.tie_embeddings,
            lm_head,
            shard: None,
            fast: OnceLock::new(),
        })
    }

    /// Marks this decoder as one rank's part of a model split over `comm`
    /// (loaded from [`crate::shard::split_spec`]'s spec): the partial
    /// outputs of attention and of the MLP are summed over the group.
    pub fn set_shard(&mut self, comm: Arc<Comm>) {
        self.shard = Some(comm);
    }

    /// The group this decoder is split over, if any.
    pub fn shard(&self) -> Option<&Arc<Comm>> {
        self.shard.as_ref()
    }

    /// Each layer's kind of cache.
    pub fn kinds(&self) -> &[CacheKind] {
        &self.kinds
    }

    /// Runs `tokens` (`[B, L]` int32) through every block, appending to `caches`
    /// (one per layer: a sequence's, or a batch's), and returns the final
    /// normalised hidden states `[B, L, hidden]`.
    pub fn forward<C: LayerCache>(
        &self,
        tokens: &Array,
        caches: &mut [C],
    ) -> Result<Array, Exception> {
        // 1. Embed the tokens.
        let mut h = self.embed.forward(tokens)?;
        // 2. One mask per kind of layer: causal within a chunk, a single token
        //    sees the cache, a window limits what it sees, a batch hides each
        //    row's padding.
        let masks = Masks::new(&self.kinds, caches, tokens.dim(1))?;
        // 3. Each block: h += attention(norm(h)); h += mlp(norm(h)); on a
        //    rank of a group, each partial output summed over the group first.
        for ((block, cache), &kind) in self.blocks.iter().zip(caches.iter_mut()).zip(&self.kinds) {
            let x = block.input_norm.forward(&h)?;
            let r = match &block.attention {
                Mixer::Attention(a) => a.forward(&x, cache, masks.of(kind))?,
                Mixer::Delta(d) => d.forward(&x, cache, masks.of(kind))?,
            };
            let h1 = h.add(&crate::shard::reduce(self.shard.as_ref(), r)?)?;
            let r = block.mlp.forward(&block.post_norm.forward(&h1)?)?;
            h = h1.add(&crate::shard::reduce(self.shard.as_ref(), r)?)?;
        }
        // 4. Final norm.
        self.norm.forward(&h)
    }

    /// Projects hidden states to vocabulary logits (tied or separate head).
    pub fn logits(&self, hidden: &Array) -> Result<Array, Exception> {
        match (&self.lm_head, &self.shard) {
            (Some(head), Some(comm)) if self.head_split => {
                comm.gather_last_axis(&head.forward(hidden)?)
            }
            (Some(head), _) => head.forward(hidden),
            (None, _) => self.embed.as_linear(hidden),
        }
    }
}

impl Decoder {
    /// Every weight array, for evaluation and byte counts.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out = self.embed.parameters();
        for b in &self.blocks {
            out.extend(b.input_norm.parameters());
            out.extend(match &b.attention {
                Mixer::Attention(a) => a.parameters(),
                Mixer::Delta(d) => d.parameters(),
            });
            out.extend(b.post_norm.parameters());
            out.extend(b.mlp.parameters());
        }
        out.extend(self.norm.parameters());
        if let Some(head) = &self.lm_head {
            out.extend(head.parameters());
        }
        out
    }

    /// The routed experts' arrays and the share of them a token uses
    /// (`top_k / experts`), per sparse layer.
    pub fn expert_parameters(&self) -> Vec<(Vec<&Array>, f64)> {
        self.blocks
            .iter()
            .filter_map(|b| match &b.mlp {
                FeedForward::Sparse(m) => {
                    let s = m.shape();
                    Some((m.expert_parameters(), s.top_k as f64 / s.experts as f64))
                }
                FeedForward::Dense(_) => None,
            })
            .collect()
    }

    /// Grove's CUDA decode step for this model, where it is wanted
    /// ([`super::cuda_lib::wanted`]) and covers the model: plain
    /// attention on every layer, dense SiLU MLPs or routed quantized
    /// experts without a shared one, no biases, one rank.
    pub fn fast_decode(&self) -> Option<&FastDecode> {
        self.fast
            .get_or_init(|| {
                if !super::cuda_lib::wanted() || self.shard.is_some() {
                    return None;
                }
                FastDecode::new(&self.fast_parts()?)
            })
            .as_ref()
    }

    /// The weights the CUDA decode step takes, layer by layer, where every
    /// layer is of a kind it covers (on any backend: which arrays go where
    /// is plain Rust, tested on the CPU).
    pub(crate) fn fast_parts(&self) -> Option<FastParts<'_>> {
        if self.kinds.iter().any(|k| *k != CacheKind::Full) {
            return None;
        }
        let mut layers = Vec::with_capacity(self.blocks.len());
        for b in &self.blocks {
            let Mixer::Attention(a) = &b.attention else {
                return None;
            };
            let mlp = match &b.mlp {
                FeedForward::Dense(m) => {
                    let (g, u, d) = m.plain_silu()?;
                    FastMlp::Dense(g, u, d)
                }
                FeedForward::Sparse(m) => FastMlp::Experts(m.decode_parts()?),
            };
            layers.push(FastLayer {
                input_norm: b.input_norm.weight_eps(),
                attention: a.plain_parts()?,
                post_norm: b.post_norm.weight_eps(),
                mlp,
            });
        }
        let embed = self.embed.decode_matrix()?;
        let head = match &self.lm_head {
            Some(h) => Some(h.decode_matrix()?),
            None => None,
        };
        Some(FastParts {
            embed,
            final_norm: self.norm.weight_eps(),
            head,
            vocab: head.unwrap_or(embed).rows(),
            layers,
        })
    }

    /// The dtype activations are computed in.
    pub fn compute_dtype(&self) -> mlx_rs::Dtype {
        self.norm.parameters()[0].dtype()
    }
}

#[cfg(test)]
#[path = "decoder_fast_tests.rs"]
mod fast_tests;
