//! Models: a model directory (config.json + safetensors) or a GGUF file
//! (converted by [`gguf`]) into a runnable decoder.
//!
//! `config.rs` parses what all architectures share and picks the
//! [`Architecture`]; one file per architecture holds its serde `Config` (and,
//! where its blocks differ from the shared decoder's, its model and forward
//! pass); `layers/` holds the building blocks and the shared pre-norm
//! decoder; [`network`] is the loaded model of any architecture; [`dtypes`]
//! picks the dtypes the backend computes fastest in.
pub mod bert;
pub mod config;
pub mod dtypes;
mod embed;
pub mod gemma2;
pub mod gemma3;
pub mod gemma4;
pub mod gguf;
pub mod glm4_moe_lite;
pub mod gpt_oss;
pub mod layers;
pub mod llama;
pub mod mistral;
pub mod network;
pub mod phi3;
pub mod pooling;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_5;
pub mod qwen3_moe;
pub mod qwen3_next;
pub mod safetensors;
pub mod weights;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use mlx_rs::Array;
use serde_json::Value;

pub use config::{Architecture, QuantParams, Quantization};
pub use dtypes::{CpuDtypes, DtypeReport};
use layers::decoder::Decoder;
pub use network::Network;
use weights::Weights;

use crate::cache::CacheKind;
use crate::error::{MlxPhase, Result};
use crate::shard::Comm;
use config::config_error;

/// The sizes of a model that budgets and checks need, whatever its family.
#[derive(Debug, Clone)]
pub struct Dims {
    pub vocab: i32,
    pub hidden: i32,
    pub intermediate: i32,
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    /// One per cache (per layer, but for layers that read another's keys).
    pub kinds: Vec<CacheKind>,
    /// Each cache's `kv_heads * head_dim` where layers differ (Gemma 4;
    /// recurrent layers: 0); `None`: all are `kv_heads * head_dim`.
    pub kv_widths: Option<Vec<i32>>,
    /// Values one recurrent layer's state holds per sequence: its
    /// convolution's (compute dtype) and its recurrence's (float32).
    pub recurrent_elements: Option<(u64, u64)>,
}

impl Dims {
    /// Rejects shapes that cannot describe a working model.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab),
            ("num_hidden_layers", self.kinds.len() as i32),
            ("intermediate_size", self.intermediate),
            ("hidden_size", self.hidden),
            ("num_attention_heads", self.heads),
            ("num_key_value_heads", self.kv_heads),
            ("head_dim", self.head_dim),
        ];
        for (name, value) in positive {
            if value <= 0 {
                return Err(config_error(
                    path,
                    format!("{name} must be positive, not {value}"),
                ));
            }
        }
        if self.heads % self.kv_heads != 0 {
            return Err(config_error(
                path,
                format!(
                    "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                    self.heads, self.kv_heads
                ),
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(config_error(
                path,
                format!(
                    "head_dim {} must be even for rotary embeddings",
                    self.head_dim
                ),
            ));
        }
        if let Some(w) = self
            .kinds
            .iter()
            .filter_map(|k| k.window())
            .find(|&w| w < 1)
        {
            return Err(config_error(
                path,
                format!("sliding_window must be positive, not {w}"),
            ));
        }
        Ok(())
    }

    /// Bytes of keys and values one token takes in each cache.
    pub fn kv_bytes_per_token_by_cache(&self, dtype_bytes: u64) -> Vec<u64> {
        (0..self.kinds.len())
            .map(|i| {
                let width = match &self.kv_widths {
                    Some(w) => w.get(i).copied().unwrap_or(0),
                    None => self.kv_heads * self.head_dim,
                };
                2 * width.max(0) as u64 * dtype_bytes
            })
            .collect()
    }
}

/// A loaded model and the facts about it.
pub struct Model {
    pub architecture: Architecture,
    pub decoder: Network,
    pub dims: Dims,
    pub quantization: Option<QuantParams>,
    /// The model's own context limit (`max_position_embeddings`), if it states one.
    pub max_position_embeddings: Option<u32>,
    /// Bytes of all weight arrays.
    pub weight_bytes: usize,
    /// The parsed config.json, for the tokenizer's BOS/EOS lookup.
    pub raw_config: Value,
    /// The stored dtypes and what loading did to them.
    pub dtypes: DtypeReport,
    /// How its embeddings are pooled and normalized.
    pub embedding: pooling::EmbedSpec,
}

/// Loads the model directory `dir` with the default dtype policy.
pub fn load(dir: &Path) -> Result<Model> {
    load_dir(dir, CpuDtypes::default())
}

/// Loads the model directory `dir`: validates the config, loads and checks
/// every tensor, and evaluates the weights so loading errors surface here.
pub fn load_dir(dir: &Path, policy: CpuDtypes) -> Result<Model> {
    load_dir_sharded(dir, policy, None)
}

/// [`load_dir`] of this rank's part of the model when `shard` is a group:
/// only its slices of the split tensors are read.
pub fn load_dir_sharded(dir: &Path, policy: CpuDtypes, shard: Option<&Arc<Comm>>) -> Result<Model> {
    let (path, raw) = config::read_config(dir)?;
    // The config is checked before the weights are read.
    let architecture = Architecture::from_config(&path, &raw)?;
    Quantization::from_config(&path, &raw)?;
    let tensors = match shard {
        Some(comm) => {
            crate::shard::check_architecture(architecture)?;
            crate::shard::check_config(architecture, &raw, comm.size())?;
            let layout = crate::shard::layout(architecture, &path, &raw)?;
            Weights::load_rank(dir, &layout, comm.rank(), comm.size())?.into_map()
        }
        None => Weights::load(dir)?.into_map(),
    };
    load_parts_sharded(&path, raw, tensors, policy, shard)
}

/// Builds a model from a parsed config (read from `path`, named in errors)
/// and its tensors.
pub fn load_parts(
    path: &Path,
    raw: Value,
    tensors: HashMap<String, Array>,
    policy: CpuDtypes,
) -> Result<Model> {
    load_parts_sharded(path, raw, tensors, policy, None)
}

/// [`load_parts`] of one rank's tensors of a model split over `shard`.
fn load_parts_sharded(
    path: &Path,
    raw: Value,
    mut tensors: HashMap<String, Array>,
    policy: CpuDtypes,
    shard: Option<&Arc<Comm>>,
) -> Result<Model> {
    let architecture = Architecture::from_config(path, &raw)?;
    let mut quantization = Quantization::from_config(path, &raw)?;
    if matches!(
        architecture,
        Architecture::Gemma3 | Architecture::Gemma4 | Architecture::Qwen3_5
    ) {
        gemma3::take_text_part(&mut tensors);
        quantization = quantization.strip_prefix(gemma3::TEXT_PREFIX);
    }
    let dtypes = dtypes::apply(&mut tensors, policy, dtypes::cpu_backend(), |module| {
        layers::cpu_qmm::reads_half_scales(module, quantization.for_layer(module))
    })?;
    // Embedding checkpoints of decoder families (Qwen3-Embedding) store the
    // decoder without its `model.` prefix and without a head.
    if !tensors.keys().any(|k| k.starts_with("model."))
        && tensors.contains_key("embed_tokens.weight")
    {
        tensors = tensors
            .into_iter()
            .map(|(k, v)| (format!("model.{k}"), v))
            .collect();
    }
    let mut weights = Weights::from_map(tensors);
    let path = path.to_owned();
    let has_lm_head = weights.contains("lm_head.weight");
    let q = &quantization;
    let decoder_of = |mut spec: layers::decoder::DecoderSpec, w: &mut Weights| -> Result<_> {
        let Some(comm) = shard else {
            let dims = spec.dims();
            return Ok((Network::Decoder(Decoder::load(&path, w, q, &spec)?), dims));
        };
        crate::shard::check_architecture(architecture)?;
        crate::shard::split_spec(&mut spec, comm.size(), architecture)?;
        let dims = spec.dims();
        let mut decoder = Decoder::load(&path, w, q, &spec)?;
        decoder.set_shard(comm.clone());
        Ok((Network::Decoder(decoder), dims))
    };
    if shard.is_some() {
        crate::shard::check_architecture(architecture)?;
    }
    let ((decoder, dims), max_positions) = match architecture {
        Architecture::Llama => {
            let c: llama::Config = config::typed(&path, &raw)?;
            let spec = c.spec(&path, has_lm_head)?;
            (decoder_of(spec, &mut weights)?, c.max_position_embeddings)
        }
        Architecture::Mistral => {
            let c: mistral::Config = config::typed(&path, &raw)?;
            let spec = c.spec(&path, has_lm_head)?;
            (
                decoder_of(spec, &mut weights)?,
                c.llama.max_position_embeddings,
            )
        }
        Architecture::Qwen2 => {
            let c: qwen2::Config = config::typed(&path, &raw)?;
            let spec = c.spec(&path)?;
            (
                decoder_of(spec, &mut weights)?,
                Some(c.max_position_embeddings),
            )
        }
        Architecture::Qwen3 => {
            let c: qwen3::Config = config::typed(&path, &raw)?;
            let spec = c.spec(&path)?;
            (
                decoder_of(spec, &mut weights)?,
                Some(c.base.max_position_embeddings),
            )
        }
        Architecture::Qwen3Moe => {
            let c: qwen3_moe::Config = config::typed(&path, &raw)?;
            let spec = c.spec(&path)?;
            (
                decoder_of(spec, &mut weights)?,
                Some(c.qwen3.base.max_position_embeddings),
            )
        }
        Architecture::Qwen3Next => {
            let c: qwen3_next::Config = config::typed(&path, &raw)?;
            let spec = c.spec(&path)?;
            qwen3_next::sanitize(&mut weights)?;
            (
                decoder_of(spec, &mut weights)?,
                Some(c.max_position_embeddings),
            )
        }
        Architecture::Qwen3_5 => {
            let c = qwen3_5::Config::parse(&path, &raw)?;
            let spec = c.spec(&path)?;
            qwen3_5::sanitize(&mut weights)?;
            (
                decoder_of(spec, &mut weights)?,
                Some(c.max_position_embeddings),
            )
        }
        Architecture::Glm4MoeLite => {
            let c: glm4_moe_lite::Config = config::typed(&path, &raw)?;
            let m = glm4_moe_lite::Glm4MoeLite::load(&path, &mut weights, q, &c, shard)?;
            let dims = m.dims().clone();
            (
                (Network::Glm4MoeLite(m), dims),
                Some(c.max_position_embeddings),
            )
        }
        Architecture::GptOss => {
            let c: gpt_oss::Config = config::typed(&path, &raw)?;
            let m = gpt_oss::GptOss::load(&path, &mut weights, q, &c, shard)?;
            let dims = m.dims().clone();
            ((Network::GptOss(m), dims), c.max_position_embeddings)
        }
        Architecture::Phi3 => {
            let c: phi3::Config = config::typed(&path, &raw)?;
            let spec = c.spec(&path)?;
            (
                decoder_of(spec, &mut weights)?,
                Some(c.max_position_embeddings),
            )
        }
        Architecture::Gemma3Text | Architecture::Gemma3 => {
            let c = gemma3::Config::parse(&path, &raw, architecture)?;
            let m = gemma3::Gemma3::load(&path, &mut weights, q, &c, has_lm_head)?;
            let dims = m.dims().clone();
            ((Network::Gemma3(m), dims), Some(c.max_position_embeddings))
        }
        Architecture::Gemma4Text | Architecture::Gemma4 => {
            let c = gemma4::Config::parse(&path, &raw, architecture)?;
            let m = gemma4::Gemma4::load(&path, &mut weights, q, &c)?;
            let dims = m.dims().clone();
            ((Network::Gemma4(m), dims), Some(c.max_position_embeddings))
        }
        Architecture::Bert => {
            let c: bert::Config = config::typed(&path, &raw)?;
            let m = bert::Bert::load(&path, &mut weights, q, &c)?;
            let (dims, positions) = (m.dims().clone(), m.max_positions() as u32);
            ((Network::Bert(m), dims), Some(positions))
        }
        Architecture::Gemma2 => {
            let c: gemma2::Config = config::typed(&path, &raw)?;
            let m = gemma2::Gemma2::load(&path, &mut weights, q, &c)?;
            let dims = m.dims().clone();
            ((Network::Gemma2(m), dims), c.max_position_embeddings)
        }
    };
    weights.finish()?;
    let params = decoder.parameters();
    mlx_rs::transforms::eval(params.iter().copied()).phase("loading weights")?;
    let weight_bytes = params.iter().map(|a| a.nbytes()).sum();
    // A model directory's sentence-transformers files (a GGUF file has none).
    let dir = (path.file_name() == Some(std::ffi::OsStr::new("config.json")))
        .then(|| path.parent())
        .flatten();
    let embedding = pooling::EmbedSpec::read(dir, architecture == Architecture::Bert)?;
    Ok(Model {
        architecture,
        decoder,
        dims,
        quantization: quantization.default,
        max_position_embeddings: max_positions,
        weight_bytes,
        raw_config: raw,
        dtypes,
        embedding,
    })
}

impl Model {
    /// The dtype the model computes in (that of its norms' weights).
    pub fn dtype(&self) -> mlx_rs::Dtype {
        self.decoder.compute_dtype()
    }

    /// Parameters, counting each packed quantized weight as the values it holds.
    pub fn parameter_count(&self) -> u64 {
        let bits = self.quantization.map_or(32, |q| q.bits as u64);
        self.decoder
            .parameters()
            .iter()
            .map(|a| match a.dtype() {
                mlx_rs::Dtype::Uint32 => a.size() as u64 * 32 / bits,
                _ => a.size() as u64,
            })
            .sum()
    }

    /// Parameters one token uses: all but the share of routed experts a
    /// mixture of experts leaves idle (`1 - top_k / experts`).
    pub fn active_parameter_count(&self) -> u64 {
        let bits = self.quantization.map_or(32, |q| q.bits as u64);
        let count = |a: &Array| match a.dtype() {
            mlx_rs::Dtype::Uint32 => a.size() as u64 * 32 / bits,
            _ => a.size() as u64,
        };
        let idle: f64 = self
            .decoder
            .expert_parameters()
            .iter()
            .map(|(arrays, share)| {
                arrays.iter().map(|a| count(a)).sum::<u64>() as f64 * (1.0 - share)
            })
            .sum();
        self.parameter_count().saturating_sub(idle.round() as u64)
    }

    /// Each layer's kind of cache.
    pub fn kinds(&self) -> &[CacheKind] {
        &self.dims.kinds
    }

    /// Whether the KV cache can be quantized as `q` (mlx-lm's
    /// `QuantizedKVCache`): every layer with keys must be a full-attention
    /// layer of plain grouped-query attention whose head size is a multiple
    /// of the group. Sliding windows are refused as mlx-lm refuses them
    /// (`RotatingKVCache Quantization NYI`), and so are the layers that
    /// attend in their own way (Gemma 2's soft-capping, gpt-oss's sinks,
    /// GLM's latent attention, Gemma 4's shared keys). Recurrent layers keep
    /// their state as it is.
    pub fn check_kv_quant(&self, q: crate::cache::KvQuant) -> std::result::Result<(), String> {
        let own_attention = match self.architecture {
            Architecture::Gemma2 => Some("soft-capped attention"),
            Architecture::GptOss => Some("attention sinks"),
            Architecture::Glm4MoeLite => Some("latent (MLA) attention"),
            Architecture::Gemma4Text | Architecture::Gemma4 => Some("layers that share keys"),
            _ => None,
        };
        if let Some(what) = own_attention {
            return Err(format!(
                "a quantized KV cache is not supported for {:?} models ({what})",
                self.architecture
            ));
        }
        if self.kinds().iter().any(|k| k.window().is_some()) {
            return Err(format!(
                "a quantized KV cache is not supported for models with sliding-window layers \
                 ({:?}; mlx-lm does not quantize a rotating cache either)",
                self.architecture
            ));
        }
        let head_dim = self.dims.head_dim;
        if head_dim % q.group_size != 0 {
            return Err(format!(
                "a quantized KV cache needs heads a multiple of kv_group_size {} wide; \
                 this model's are {head_dim}",
                q.group_size
            ));
        }
        Ok(())
    }

    /// Fresh caches for one sequence.
    pub fn new_caches(&self) -> Vec<crate::cache::LayerKv> {
        crate::cache::LayerKv::fresh(self.kinds())
    }

    /// The sampled tokens every rank feeds: rank 0's, sent through the
    /// group when the model is split over one (the same array alone).
    pub fn agree(&self, tokens: Array) -> std::result::Result<Array, mlx_rs::error::Exception> {
        match self.decoder.shard() {
            Some(comm) => comm.from_rank0(&tokens),
            None => Ok(tokens),
        }
    }

    /// [`Model::agree`], with rank 0's `news` flag sent in the same
    /// collective (`engine::lockstep`): the tokens, and the flag as every
    /// rank sees it (`None` alone).
    pub fn agree_flagged(
        &self,
        tokens: Array,
        news: bool,
    ) -> std::result::Result<(Array, Option<Array>), mlx_rs::error::Exception> {
        match self.decoder.shard() {
            Some(comm) => {
                let (tokens, flag) = comm.from_rank0_flagged(&tokens, news)?;
                Ok((tokens, Some(flag)))
            }
            None => Ok((tokens, None)),
        }
    }

    /// A token-id prompt as the `[1, L]` int32 array the decoder takes.
    pub fn tokens_array(ids: &[u32]) -> Array {
        let ids: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
        Array::from_slice(&ids, &[1, ids.len() as i32])
    }
}
