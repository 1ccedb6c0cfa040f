//! Gemma 4 (`gemma4_text`, and the text part of `gemma4` checkpoints) as
//! mlx-lm's gemma4_text: sliding-window and global layers (the global ones
//! with their own head size, kv heads, keys shared as values where
//! `attention_k_eq_v`, and proportional partial rotation), q/k RMS norms and a
//! scale-free RMS norm on values, attention scale 1, the last
//! `num_kv_shared_layers` layers reading the keys and values of the last
//! earlier layer of their type (they keep no cache), a double-wide MLP in
//! those, per-layer input embeddings gated into every layer, a learned
//! per-layer scalar, and soft-capped logits. The mixture-of-experts block
//! (`enable_moe_block`, the 26B model) is refused: experts come with the
//! MoE families.
mod config;

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};

pub use config::{Config, RopeParams};

use super::Dims;
use super::config::{Quantization, check_eps, config_error};
use super::layers::attention::softcap;
use super::layers::embedding::Embedding;
use super::layers::linear::Linear;
use super::layers::masks::Masks;
use super::layers::mlp::{Activation, Mlp, MlpShape};
use super::layers::norm::RmsNorm;
use super::layers::rope::Rope;
use super::weights::Weights;
use crate::cache::{AttentionMask, CacheKind, LayerCache, Positions};
use crate::error::Result;

/// Keys, values and their rotary positions, as a layer leaves them for the
/// layers that share them.
struct SharedKv {
    keys: Array,
    values: Array,
    positions: Positions,
}

/// The projections of a layer that computes its own keys and values.
struct OwnKv {
    k: Linear,
    /// `None`: values are the keys' projection (`attention_k_eq_v`).
    v: Option<Linear>,
    k_norm: RmsNorm,
}

struct Layer {
    global: bool,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    q: Linear,
    q_norm: RmsNorm,
    kv: Option<OwnKv>,
    o: Linear,
    rope: Rope,
    /// The layer whose keys and values a shared layer reads.
    source: usize,
    input_norm: RmsNorm,
    post_attention_norm: RmsNorm,
    pre_feedforward_norm: RmsNorm,
    mlp: Mlp,
    post_feedforward_norm: RmsNorm,
    /// Gate, projection and norm of the per-layer input.
    per_layer: Option<(Linear, Linear, RmsNorm)>,
    scalar: Array,
    eps: f32,
}

/// Per-layer input embeddings and their projection from the hidden state.
struct PerLayerInputs {
    width: i32,
    embed: Embedding,
    projection: Linear,
    norm: RmsNorm,
}

/// A loaded Gemma 4 text model.
pub struct Gemma4 {
    dims: Dims,
    embed: Embedding,
    per_layer: Option<PerLayerInputs>,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    final_cap: Option<f32>,
    window: i32,
}

impl Gemma4 {
    /// Builds the model from HF-named weights (`model.layers.N...`).
    pub fn load(path: &Path, w: &mut Weights, quant: &Quantization, c: &Config) -> Result<Self> {
        if c.enable_moe_block {
            return Err(config_error(
                path,
                "Gemma 4's mixture-of-experts block (enable_moe_block) is not supported yet".into(),
            ));
        }
        check_eps(path, c.rms_norm_eps)?;
        let globals = c.globals(path)?;
        let n = globals.len();
        let shared = c.num_kv_shared_layers.clamp(0, n as i32) as usize;
        let first_shared = n - shared;
        if first_shared == 0 {
            return Err(config_error(
                path,
                format!(
                    "num_kv_shared_layers {} leaves no layer with keys",
                    c.num_kv_shared_layers
                ),
            ));
        }
        let window = CacheKind::Window(c.sliding_window);
        let kinds: Vec<CacheKind> = globals[..first_shared]
            .iter()
            .map(|&g| if g { CacheKind::Full } else { window })
            .collect();
        let global_dim = if c.global_head_dim > 0 {
            c.global_head_dim
        } else {
            c.head_dim
        };
        let kv_heads_of =
            |global: bool| match (global && c.attention_k_eq_v, c.num_global_key_value_heads) {
                (true, Some(h)) => h,
                _ => c.num_key_value_heads,
            };
        let dims = Dims {
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            kv_widths: Some(
                globals[..first_shared]
                    .iter()
                    .map(|&g| kv_heads_of(g) * if g { global_dim } else { c.head_dim })
                    .collect(),
            ),
            kinds,
            recurrent_elements: None,
        };
        dims.validate(path)?;
        for (what, v) in [
            ("global_head_dim", global_dim),
            ("num_global_key_value_heads", kv_heads_of(true)),
        ] {
            if v <= 0 || v % 2 != 0 && what == "global_head_dim" {
                return Err(config_error(
                    path,
                    format!("{what} must be positive and even, not {v}"),
                ));
            }
        }
        if c.num_attention_heads % kv_heads_of(true) != 0 {
            return Err(config_error(
                path,
                "num_attention_heads is not a multiple of the global kv heads".into(),
            ));
        }
        let eps = c.rms_norm_eps;
        let h = c.hidden_size;
        let embed = Embedding::load(w, quant, "model.embed_tokens", c.vocab_size, h)?;
        let width = c.hidden_size_per_layer_input;
        let per_layer = if width > 0 {
            Some(PerLayerInputs {
                width,
                embed: Embedding::load(
                    w,
                    quant,
                    "model.embed_tokens_per_layer",
                    c.vocab_size_per_layer_input,
                    n as i32 * width,
                )?,
                projection: Linear::load(
                    w,
                    quant,
                    "model.per_layer_model_projection",
                    h,
                    n as i32 * width,
                    false,
                )?,
                norm: RmsNorm::load(w, "model.per_layer_projection_norm", width, eps)?,
            })
        } else {
            None
        };
        w.discard(|name| name.contains("self_attn.rotary_emb"));
        // The last earlier layer of each type, for the shared layers.
        let mut last_of = HashMap::new();
        for (i, &g) in globals[..first_shared].iter().enumerate() {
            last_of.insert(g, i);
        }
        let mut layers = Vec::with_capacity(n);
        for (i, &global) in globals.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let head_dim = if global { global_dim } else { c.head_dim };
            let kv_heads = kv_heads_of(global);
            let own = i < first_shared;
            let source = if own {
                i
            } else {
                *last_of.get(&global).ok_or_else(|| {
                    config_error(
                        path,
                        format!("shared layer {i} has no earlier layer of its type"),
                    )
                })?
            };
            let kv = if own {
                let k_eq_v = global && c.attention_k_eq_v;
                Some(OwnKv {
                    k: Linear::load(
                        w,
                        quant,
                        &format!("{p}.self_attn.k_proj"),
                        h,
                        kv_heads * head_dim,
                        false,
                    )?,
                    v: if k_eq_v {
                        None
                    } else {
                        Some(Linear::load(
                            w,
                            quant,
                            &format!("{p}.self_attn.v_proj"),
                            h,
                            kv_heads * head_dim,
                            false,
                        )?)
                    },
                    k_norm: RmsNorm::load(w, &format!("{p}.self_attn.k_norm"), head_dim, eps)?,
                })
            } else {
                // mlx-lm drops what a shared layer's checkpoint still carries.
                let prefix = format!("{p}.self_attn.");
                w.discard(|name| {
                    name.strip_prefix(prefix.as_str()).is_some_and(|rest| {
                        rest.starts_with("k_proj.")
                            || rest.starts_with("v_proj.")
                            || rest.starts_with("k_norm.")
                    })
                });
                None
            };
            let intermediate = if !own && c.use_double_wide_mlp {
                2 * c.intermediate_size
            } else {
                c.intermediate_size
            };
            let per_layer_parts = if width > 0 {
                Some((
                    Linear::load(
                        w,
                        quant,
                        &format!("{p}.per_layer_input_gate"),
                        h,
                        width,
                        false,
                    )?,
                    Linear::load(
                        w,
                        quant,
                        &format!("{p}.per_layer_projection"),
                        width,
                        h,
                        false,
                    )?,
                    RmsNorm::load(w, &format!("{p}.post_per_layer_input_norm"), h, eps)?,
                ))
            } else {
                None
            };
            layers.push(Layer {
                global,
                heads: c.num_attention_heads,
                kv_heads,
                head_dim,
                q: Linear::load(
                    w,
                    quant,
                    &format!("{p}.self_attn.q_proj"),
                    h,
                    c.num_attention_heads * head_dim,
                    false,
                )?,
                q_norm: RmsNorm::load(w, &format!("{p}.self_attn.q_norm"), head_dim, eps)?,
                kv,
                o: Linear::load(
                    w,
                    quant,
                    &format!("{p}.self_attn.o_proj"),
                    c.num_attention_heads * head_dim,
                    h,
                    false,
                )?,
                rope: c.rope(path, global, head_dim)?,
                source,
                input_norm: RmsNorm::load(w, &format!("{p}.input_layernorm"), h, eps)?,
                post_attention_norm: RmsNorm::load(
                    w,
                    &format!("{p}.post_attention_layernorm"),
                    h,
                    eps,
                )?,
                pre_feedforward_norm: RmsNorm::load(
                    w,
                    &format!("{p}.pre_feedforward_layernorm"),
                    h,
                    eps,
                )?,
                mlp: Mlp::load(
                    w,
                    quant,
                    &format!("{p}.mlp"),
                    MlpShape {
                        hidden: h,
                        intermediate,
                        activation: Activation::GeluApprox,
                        bias: false,
                        fused: false,
                    },
                )?,
                post_feedforward_norm: RmsNorm::load(
                    w,
                    &format!("{p}.post_feedforward_layernorm"),
                    h,
                    eps,
                )?,
                per_layer: per_layer_parts,
                scalar: w.take_float(&format!("{p}.layer_scalar"), &[1])?,
                eps,
            });
        }
        let norm = RmsNorm::load(w, "model.norm", h, eps)?;
        let lm_head = if c.tie_word_embeddings {
            w.discard(|name| name.starts_with("lm_head."));
            None
        } else {
            Some(Linear::load(w, quant, "lm_head", h, c.vocab_size, false)?)
        };
        Ok(Self {
            dims,
            embed,
            per_layer,
            layers,
            norm,
            lm_head,
            final_cap: c.final_logit_softcapping,
            window: c.sliding_window,
        })
    }

    /// The model's sizes and its caches' kinds (the shared layers keep none).
    pub fn dims(&self) -> &Dims {
        &self.dims
    }

    /// Layers, those that read another's keys included.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Runs `tokens` (`[B, L]`) through every layer, appending to `caches`
    /// (one per layer that computes its keys).
    pub fn forward<C: LayerCache>(
        &self,
        tokens: &Array,
        caches: &mut [C],
    ) -> Result<Array, Exception> {
        let (b, l) = (tokens.dim(0), tokens.dim(1));
        let n = self.layers.len() as i32;
        // 1. Embed the tokens and scale them by sqrt(hidden).
        let e = self.embed.forward(tokens)?;
        let scale = Array::from_f32((self.dims.hidden as f64).sqrt() as f32).as_dtype(e.dtype())?;
        let mut h = e.multiply(&scale)?;
        // 2. Per-layer inputs: their own embeddings and a projection of the
        //    hidden state, normed, summed and scaled; [B, L, layers, width].
        let inputs = match &self.per_layer {
            Some(p) => {
                let d = h.dtype();
                let own = p
                    .embed
                    .forward(tokens)?
                    .multiply(Array::from_f32((p.width as f64).sqrt() as f32).as_dtype(d)?)?
                    .reshape(&[b, l, n, p.width])?;
                let projected = p
                    .projection
                    .forward(&h)?
                    .multiply(
                        Array::from_f32((self.dims.hidden as f64).powf(-0.5) as f32).as_dtype(d)?,
                    )?
                    .reshape(&[b, l, n, p.width])?;
                let projected = p.norm.forward(&projected)?;
                Some(
                    projected
                        .add(&own)?
                        .multiply(Array::from_f32(0.5f64.sqrt() as f32).as_dtype(d)?)?,
                )
            }
            None => None,
        };
        // 3. One mask per layer type, from the first cache of each.
        let masks = Masks::new(&self.dims.kinds, caches, l)?;
        let window = CacheKind::Window(self.window);
        // 4. Each layer; a shared layer attends over its source's keys.
        let mut shared: Vec<Option<SharedKv>> = (0..self.layers.len()).map(|_| None).collect();
        for (i, layer) in self.layers.iter().enumerate() {
            let mask = masks.of(if layer.global {
                CacheKind::Full
            } else {
                window
            });
            let input = match &inputs {
                Some(x) => Some(x.index_layer(i as i32)?),
                None => None,
            };
            let cache = if layer.kv.is_some() {
                caches.get_mut(i)
            } else {
                None
            };
            let (out, kv) = layer.forward(
                &h,
                mask,
                cache,
                shared[layer.source].as_ref(),
                input.as_ref(),
            )?;
            if let Some(kv) = kv {
                shared[i] = Some(kv);
            }
            h = out;
        }
        // 5. Final norm.
        self.norm.forward(&h)
    }

    /// Vocabulary logits, soft-capped when the config says.
    pub fn logits(&self, hidden: &Array) -> Result<Array, Exception> {
        let out = match &self.lm_head {
            Some(head) => head.forward(hidden)?,
            None => self.embed.as_linear(hidden)?,
        };
        match self.final_cap {
            Some(cap) => softcap(&out, cap),
            None => Ok(out),
        }
    }

    /// Every weight array.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out = self.embed.parameters();
        if let Some(p) = &self.per_layer {
            out.extend(p.embed.parameters());
            out.extend(p.projection.parameters());
            out.extend(p.norm.parameters());
        }
        for l in &self.layers {
            out.extend(l.parameters());
        }
        out.extend(self.norm.parameters());
        if let Some(head) = &self.lm_head {
            out.extend(head.parameters());
        }
        out
    }

    /// The dtype activations are computed in.
    pub fn compute_dtype(&self) -> Dtype {
        self.norm.parameters()[0].dtype()
    }
}

/// `x[:, :, i, :]` of the per-layer inputs.
trait LayerIndex {
    fn index_layer(&self, i: i32) -> Result<Array, Exception>;
}

impl LayerIndex for Array {
    fn index_layer(&self, i: i32) -> Result<Array, Exception> {
        use mlx_rs::ops::indexing::TryIndexOp;
        self.try_index((.., .., i, ..))
    }
}

impl Layer {
    /// The layer on `x`; returns the output and, for a layer with its own
    /// cache, the keys and values it attended over.
    fn forward<C: LayerCache>(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut C>,
        source: Option<&SharedKv>,
        per_layer_input: Option<&Array>,
    ) -> Result<(Array, Option<SharedKv>), Exception> {
        let (b, l) = (x.dim(0), x.dim(1));
        let xn = self.input_norm.forward(x)?;
        // 1. Queries, normed per head.
        let q = self
            .q
            .forward(&xn)?
            .reshape(&[b, l, self.heads, self.head_dim])?;
        let q = self.q_norm.forward(&q)?.transpose_axes(&[0, 2, 1, 3])?;
        // 2. Keys and values: this layer's own (normed, keys rotated, then
        //    cached), or its source's.
        let (keys, values, positions, own) = match (&self.kv, cache) {
            (Some(kv), Some(cache)) => {
                let k =
                    kv.k.forward(&xn)?
                        .reshape(&[b, l, self.kv_heads, self.head_dim])?;
                let v = match &kv.v {
                    Some(v) => v
                        .forward(&xn)?
                        .reshape(&[b, l, self.kv_heads, self.head_dim])?,
                    None => k.clone(),
                };
                let positions = cache.positions()?;
                let k = kv.k_norm.forward(&k)?.transpose_axes(&[0, 2, 1, 3])?;
                let k = self.rope.forward_at(&k, &positions)?;
                let v = crate::model::layers::cpu_fast::rms_norm(&v, None, self.eps)?
                    .transpose_axes(&[0, 2, 1, 3])?;
                let (k, v) = cache.update_and_fetch(&k, &v)?;
                (k, v, positions, true)
            }
            _ => match source {
                Some(s) => (s.keys.clone(), s.values.clone(), s.positions.clone(), false),
                None => return Err(Exception::custom("a shared layer has no keys to read")),
            },
        };
        let q = self.rope.forward_at(&q, &positions)?;
        // 3. Attention at scale 1 under the layer type's mask.
        let out =
            crate::model::layers::cpu_fast::sdpa(&q, &keys, &values, 1.0, mask.as_sdpa(), None)?;
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        let out = self.o.forward(&out)?;
        // 4. Residuals around the attention and the MLP, each sandwiched.
        let h = x.add(&self.post_attention_norm.forward(&out)?)?;
        let r = self.mlp.forward(&self.pre_feedforward_norm.forward(&h)?)?;
        let mut h = h.add(&self.post_feedforward_norm.forward(&r)?)?;
        // 5. The per-layer input, gated in.
        if let (Some((gate, proj, norm)), Some(input)) = (&self.per_layer, per_layer_input) {
            let g = gelu_approx(&gate.forward(&h)?)?.multiply(input)?;
            h = h.add(&norm.forward(&proj.forward(&g)?)?)?;
        }
        // 6. The layer's scalar.
        let h = h.multiply(&self.scalar)?;
        let kv = own.then_some(SharedKv {
            keys,
            values,
            positions,
        });
        Ok((h, kv))
    }

    fn parameters(&self) -> Vec<&Array> {
        let mut out = self.q.parameters();
        out.extend(self.q_norm.parameters());
        if let Some(kv) = &self.kv {
            out.extend(kv.k.parameters());
            if let Some(v) = &kv.v {
                out.extend(v.parameters());
            }
            out.extend(kv.k_norm.parameters());
        }
        out.extend(self.o.parameters());
        for n in [
            &self.input_norm,
            &self.post_attention_norm,
            &self.pre_feedforward_norm,
            &self.post_feedforward_norm,
        ] {
            out.extend(n.parameters());
        }
        out.extend(self.mlp.parameters());
        if let Some((g, p, n)) = &self.per_layer {
            out.extend(g.parameters());
            out.extend(p.parameters());
            out.extend(n.parameters());
        }
        out.push(&self.scalar);
        out
    }
}

/// mlx's `nn.gelu_approx`, in `x`'s dtype.
fn gelu_approx(x: &Array) -> Result<Array, Exception> {
    super::layers::mlp::gelu_approx(x)
}
