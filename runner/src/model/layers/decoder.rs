//! The pre-norm decoder-only transformer that Llama, Mistral, Qwen2 and Qwen3
//! share; each architecture file maps its config onto a [`DecoderSpec`].
use std::path::Path;

use mlx_rs::Array;
use mlx_rs::error::Exception;

use super::attention::{Attention, AttentionShape};
use super::embedding::Embedding;
use super::linear::Linear;
use super::mlp::Mlp;
use super::norm::RmsNorm;
use super::rope::{Rope, RopeScalingConfig};
use crate::cache::LayerCache;
use crate::error::Result;
use crate::model::config::{Quantization, config_error};
use crate::model::weights::Weights;

/// Everything that fixes a decoder's shape.
#[derive(Debug, Clone)]
pub struct DecoderSpec {
    pub vocab: i32,
    pub layers: i32,
    pub intermediate: i32,
    pub rms_eps: f32,
    pub attention: AttentionShape,
    pub rope_theta: f64,
    pub rope_traditional: bool,
    pub rope_scaling: Option<RopeScalingConfig>,
    pub tie_embeddings: bool,
}

impl DecoderSpec {
    /// Rejects shapes that cannot describe a working model.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let a = &self.attention;
        let positive = [
            ("vocab_size", self.vocab),
            ("num_hidden_layers", self.layers),
            ("intermediate_size", self.intermediate),
            ("hidden_size", a.hidden),
            ("num_attention_heads", a.heads),
            ("num_key_value_heads", a.kv_heads),
            ("head_dim", a.head_dim),
        ];
        for (name, value) in positive {
            if value <= 0 {
                return Err(config_error(
                    path,
                    format!("{name} must be positive, not {value}"),
                ));
            }
        }
        if a.heads % a.kv_heads != 0 {
            return Err(config_error(
                path,
                format!(
                    "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                    a.heads, a.kv_heads
                ),
            ));
        }
        if a.head_dim % 2 != 0 {
            return Err(config_error(
                path,
                format!("head_dim {} must be even for rotary embeddings", a.head_dim),
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return Err(config_error(
                path,
                format!("rms_norm_eps must be positive, not {}", self.rms_eps),
            ));
        }
        Ok(())
    }
}

struct Block {
    input_norm: RmsNorm,
    attention: Attention,
    post_norm: RmsNorm,
    mlp: Mlp,
}

/// A loaded decoder.
pub struct Decoder {
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
}

impl Decoder {
    /// Builds the decoder from HF-named weights (`model.layers.N...`).
    pub fn load(
        path: &Path,
        w: &mut Weights,
        quant: &Quantization,
        spec: &DecoderSpec,
    ) -> Result<Self> {
        spec.validate(path)?;
        let hidden = spec.attention.hidden;
        let rope = Rope::new(
            path,
            spec.attention.head_dim,
            spec.rope_theta,
            spec.rope_traditional,
            spec.rope_scaling.as_ref(),
        )?;
        // Precomputed rotary tables some checkpoints carry are not used.
        w.discard(|name| name.ends_with(".rotary_emb.inv_freq"));
        let embed = Embedding::load(w, quant, "model.embed_tokens", spec.vocab, hidden)?;
        // Grown layer by layer: the config's count is only a claim until the
        // tensors of each layer are found.
        let mut blocks = Vec::new();
        for i in 0..spec.layers {
            let p = format!("model.layers.{i}");
            blocks.push(Block {
                input_norm: RmsNorm::load(
                    w,
                    &format!("{p}.input_layernorm"),
                    hidden,
                    spec.rms_eps,
                )?,
                attention: Attention::load(
                    w,
                    quant,
                    &format!("{p}.self_attn"),
                    spec.attention,
                    rope.clone(),
                )?,
                post_norm: RmsNorm::load(
                    w,
                    &format!("{p}.post_attention_layernorm"),
                    hidden,
                    spec.rms_eps,
                )?,
                mlp: Mlp::load(w, quant, &format!("{p}.mlp"), hidden, spec.intermediate)?,
            });
        }
        let norm = RmsNorm::load(w, "model.norm", hidden, spec.rms_eps)?;
        let lm_head = if spec.tie_embeddings {
            // Some tied checkpoints still carry a copy of the head.
            w.discard(|name| name.starts_with("lm_head."));
            None
        } else {
            Some(Linear::load(
                w, quant, "lm_head", hidden, spec.vocab, false,
            )?)
        };
        Ok(Self {
            embed,
            blocks,
            norm,
            lm_head,
        })
    }

    /// Number of layers, i.e. of KV caches a forward pass needs.
    pub fn num_layers(&self) -> usize {
        self.blocks.len()
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
        // 2. One mask for every layer: causal within a chunk, a single token
        //    sees the cache, a batch hides each row's padding.
        let mask = match caches.first() {
            Some(c) => c.mask(tokens.dim(1))?,
            None => return Err(Exception::custom("no caches")),
        };
        // 3. Each block: h += attention(norm(h)); h += mlp(norm(h)).
        for (block, cache) in self.blocks.iter().zip(caches.iter_mut()) {
            let r = block
                .attention
                .forward(&block.input_norm.forward(&h)?, cache, &mask)?;
            let h1 = h.add(&r)?;
            let r = block.mlp.forward(&block.post_norm.forward(&h1)?)?;
            h = h1.add(&r)?;
        }
        // 4. Final norm.
        self.norm.forward(&h)
    }

    /// Projects hidden states to vocabulary logits (tied or separate head).
    pub fn logits(&self, hidden: &Array) -> Result<Array, Exception> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => self.embed.as_linear(hidden),
        }
    }
}

impl Decoder {
    /// Every weight array, for evaluation and byte counts.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out = self.embed.parameters();
        for b in &self.blocks {
            out.extend(b.input_norm.parameters());
            out.extend(b.attention.parameters());
            out.extend(b.post_norm.parameters());
            out.extend(b.mlp.parameters());
        }
        out.extend(self.norm.parameters());
        if let Some(head) = &self.lm_head {
            out.extend(head.parameters());
        }
        out
    }

    /// The dtype activations are computed in.
    pub fn compute_dtype(&self) -> mlx_rs::Dtype {
        self.norm.parameters()[0].dtype()
    }
}
