//! Tensor parallelism over MLX distributed: one model served by a group of
//! runner processes, one per device, as mlx-lm's `shard()` splits it.
//!
//! - [`comm`]: the MLX group (ring or NCCL) and the collectives Grove uses.
//! - [`load`]: each rank's slice of the weights, read by offset.
//! - [`launch`]: the addresses and variables of a group on one host, and
//!   the launcher that starts its processes and ends them together.
//! - [`bell`]: the pipes an idle group's followers wait on, rather than on
//!   a collective that would spin.
//!
//! Every rank holds the whole embedding, norms and head, `1/N` of every
//! attention and MLP projection, and the keys and values of `1/N` of the KV
//! heads; after attention and after the MLP the partial outputs are summed
//! over the group (two `all_sum` per layer), so every rank holds the same
//! hidden states and logits. The sampled tokens are rank 0's, sent to the
//! others through the group, so all ranks feed the same tokens.
pub mod bell;
pub mod comm;
pub mod launch;
pub mod load;

use std::sync::Arc;

pub use comm::{Backend, Comm};

use crate::error::{Result, RunnerError};
use crate::model::Architecture;
use crate::model::layers::decoder::DecoderSpec;

/// The variable that gives a group member its rank (set by the launcher).
pub const RANK_VAR: &str = "GROVE_SHARD_RANK";
/// The variable that gives a group member the group's size.
pub const SIZE_VAR: &str = "GROVE_SHARDS";
/// The variable that names the backend the launcher chose.
pub const BACKEND_VAR: &str = "GROVE_SHARD_BACKEND";

/// A rank's partial output summed over its group (as is, alone): what a
/// split model does after attention and after the MLP.
pub fn reduce(
    shard: Option<&Arc<Comm>>,
    r: mlx_rs::Array,
) -> std::result::Result<mlx_rs::Array, mlx_rs::error::Exception> {
    match shard {
        Some(comm) => comm.all_sum(&r),
        None => Ok(r),
    }
}

/// Whether this process was started as a member of a group, and which.
pub fn member_from_env() -> Result<Option<(i32, i32, Backend)>> {
    let Ok(rank) = std::env::var(RANK_VAR) else {
        return Ok(None);
    };
    let bad = |message: String| RunnerError::Shard {
        phase: "reading the group's variables",
        message,
    };
    let rank: i32 = rank
        .parse()
        .map_err(|_| bad(format!("{RANK_VAR}={rank:?} is not a rank")))?;
    let size: i32 = std::env::var(SIZE_VAR)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("{RANK_VAR} is set but {SIZE_VAR} is not a number")))?;
    if !(0..size).contains(&rank) {
        return Err(bad(format!("rank {rank} is outside a group of {size}")));
    }
    let backend = match std::env::var(BACKEND_VAR).as_deref() {
        Ok("nccl") => Backend::Nccl,
        Ok("ring") | Err(_) => Backend::Ring,
        Ok(other) => return Err(bad(format!("{BACKEND_VAR}={other:?} is not ring or nccl"))),
    };
    Ok(Some((rank, size, backend)))
}

/// Joins the group this process was started in, if any, and checks that
/// MLX agrees with the launcher on its rank and size.
pub fn join_from_env() -> Result<Option<Arc<Comm>>> {
    let Some((rank, size, backend)) = member_from_env()? else {
        return Ok(None);
    };
    let comm = Comm::join(backend)?.with_bell(bell::Bell::from_env()?);
    if comm.rank() != rank || comm.size() != size {
        return Err(RunnerError::Shard {
            phase: "joining the group",
            message: format!(
                "MLX placed this process at rank {} of {}; the launcher said {rank} of {size}",
                comm.rank(),
                comm.size()
            ),
        });
    }
    Ok(Some(Arc::new(comm)))
}

/// What `--shards N` makes of this process.
pub enum Role {
    /// No group.
    Alone,
    /// It starts the group's ranks (copies of its own command) and ends
    /// them together.
    Launcher,
    /// A rank of the group (started by a launcher).
    Member(Arc<Comm>),
}

pub fn role(shards: i32) -> Result<Role> {
    let Some(comm) = join_from_env()? else {
        return Ok(if shards > 1 {
            Role::Launcher
        } else {
            Role::Alone
        });
    };
    if comm.size() != shards {
        return Err(RunnerError::Shard {
            phase: "joining the group",
            message: format!("--shards {shards} in a group of {}", comm.size()),
        });
    }
    Ok(Role::Member(comm))
}

/// What `--shards N` makes of this process, acted on: a launcher runs its
/// group (copies of this process's command, `run_local`) and gets `None`
/// once every rank has ended; a member gets its group, a process alone
/// `Some(None)`.
pub fn launch_or_join(shards: i32) -> Result<Option<Option<Arc<Comm>>>> {
    match role(shards)? {
        Role::Launcher => {
            let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
            launch::run_local(shards, Backend::from_env()?, &argv)?;
            Ok(None)
        }
        Role::Member(comm) => Ok(Some(Some(comm))),
        Role::Alone => Ok(Some(None)),
    }
}

/// The families a group can serve, as errors name them.
const SHARDABLE: &str =
    "Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Qwen3.5, GLM-4.7-Flash and gpt-oss";

/// Refuses the architectures Grove cannot shard, before any weight is read.
pub fn check_architecture(architecture: Architecture) -> Result<()> {
    match architecture {
        Architecture::Llama
        | Architecture::Mistral
        | Architecture::Qwen2
        | Architecture::Qwen3
        | Architecture::Qwen3Moe
        | Architecture::Qwen3_5
        | Architecture::Glm4MoeLite
        | Architecture::GptOss => Ok(()),
        Architecture::Qwen3Next => Err(RunnerError::Shard {
            phase: "planning the shards",
            message: "Qwen3Next models cannot be sharded (mlx-lm has no shard() for them \
                      either); {SHARDABLE} can"
                .into(),
        }),
        _ => Err(RunnerError::Shard {
            phase: "planning the shards",
            message: format!(
                "{architecture:?} models cannot be sharded (mlx-lm has no shard() for them \
                 either); {SHARDABLE} can"
            ),
        }),
    }
}

/// Whether a group of `architecture` may outnumber its KV heads: each rank
/// then holds one, the ranks of a head next to each other (mlx-lm repeats
/// Qwen3.5's k and v projections so; its other models' `shard()` refuse).
fn repeats_kv(architecture: Architecture) -> bool {
    architecture == Architecture::Qwen3_5
}

/// Whether a group of `architecture` splits its untied head by vocabulary
/// rows and gathers the logits (mlx-lm's Qwen3.5 `shard()`; the others keep
/// the head whole on every rank).
fn splits_head(architecture: Architecture) -> bool {
    architecture == Architecture::Qwen3_5
}

/// `size` ranks share `kv` KV heads: 1/N each, or with more ranks than
/// heads (where the family allows it, [`repeats_kv`]) one each.
fn kv_share(kv: i64, size: i64, repeat: bool) -> Option<i64> {
    if kv > 0 && kv % size == 0 {
        Some(kv / size)
    } else if repeat && kv > 0 && size > kv && size % kv == 0 {
        Some(1)
    } else {
        None
    }
}

/// Checks, from config.json alone (before any weight is read), that `size`
/// ranks can share the heads, the KV heads and the MLP's width.
pub fn check_config(architecture: Architecture, raw: &serde_json::Value, size: i32) -> Result<()> {
    let text = raw.get("text_config").unwrap_or(raw);
    let count = |name: &str| text.get(name).and_then(serde_json::Value::as_i64);
    let heads = count("num_attention_heads");
    let uneven = |name: &str, value: i64| RunnerError::Shard {
        phase: "planning the shards",
        message: format!("{name} is {value}, which {size} ranks cannot share evenly"),
    };
    if let Some(h) = heads
        && h % i64::from(size) != 0
    {
        return Err(uneven("num_attention_heads", h));
    }
    if let Some(kv) = count("num_key_value_heads").or(heads)
        && kv_share(kv, size.into(), repeats_kv(architecture)).is_none()
    {
        return Err(uneven("num_key_value_heads", kv));
    }
    let tied = text
        .get("tie_word_embeddings")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    let vocab = (splits_head(architecture) && !tied)
        .then(|| count("vocab_size"))
        .flatten();
    let counts = [
        ("vocab_size", vocab),
        ("intermediate_size", count("intermediate_size")),
        ("moe_intermediate_size", count("moe_intermediate_size")),
        (
            "shared_expert_intermediate_size",
            count("shared_expert_intermediate_size"),
        ),
        ("linear_num_key_heads", count("linear_num_key_heads")),
        ("linear_num_value_heads", count("linear_num_value_heads")),
    ];
    for (name, value) in counts {
        if let Some(value) = value
            && value % i64::from(size) != 0
        {
            return Err(uneven(name, value));
        }
    }
    Ok(())
}

/// The spec of one rank's part of the decoder: `1/size` of the heads, the
/// KV heads and the MLP's width. Counts that `size` does not divide are an
/// error that names them.
pub fn split_spec(spec: &mut DecoderSpec, size: i32, architecture: Architecture) -> Result<()> {
    let a = &spec.attention;
    let kv_heads =
        kv_share(a.kv_heads.into(), size.into(), repeats_kv(architecture)).ok_or_else(|| {
            RunnerError::Shard {
                phase: "planning the shards",
                message: format!(
                    "num_key_value_heads is {}, which {size} ranks cannot share evenly",
                    a.kv_heads
                ),
            }
        })?;
    let counts = [
        ("num_attention_heads", a.heads),
        ("intermediate_size", spec.mlp.intermediate),
    ];
    for (name, value) in counts {
        if value % size != 0 {
            return Err(RunnerError::Shard {
                phase: "planning the shards",
                message: format!("{name} is {value}, which {size} ranks cannot share evenly"),
            });
        }
    }
    // Qwen3.5's output gate is per head, beside each head's queries in
    // q_proj's rows, so it splits with them.
    if a.fused_qkv || spec.mlp.fused || a.sinks {
        return Err(RunnerError::Shard {
            phase: "planning the shards",
            message: "fused or gated projections cannot be sharded".into(),
        });
    }
    if let Some(moe) = &spec.moe {
        let i = moe.shape.intermediate;
        if i % size != 0 {
            return Err(RunnerError::Shard {
                phase: "planning the shards",
                message: format!(
                    "moe_intermediate_size is {i}, which {size} ranks cannot share evenly"
                ),
            });
        }
        if let Some(shared) = moe.shape.shared_intermediate
            && shared % size != 0
        {
            return Err(RunnerError::Shard {
                phase: "planning the shards",
                message: format!(
                    "shared_expert_intermediate_size is {shared}, which {size} ranks cannot \
                     share evenly"
                ),
            });
        }
    }
    if let Some(d) = &spec.delta {
        for (name, value) in [
            ("linear_num_key_heads", d.key_heads),
            ("linear_num_value_heads", d.value_heads),
        ] {
            if value % size != 0 {
                return Err(RunnerError::Shard {
                    phase: "planning the shards",
                    message: format!("{name} is {value}, which {size} ranks cannot share evenly"),
                });
            }
        }
    }
    spec.attention.heads /= size;
    spec.attention.kv_heads = kv_heads as i32;
    if splits_head(architecture) && !spec.tie_embeddings {
        // Qwen3.5's untied head: 1/N of the vocabulary per rank (mlx-lm
        // asserts the same divisibility).
        if spec.vocab % size != 0 {
            return Err(RunnerError::Shard {
                phase: "planning the shards",
                message: format!(
                    "vocab_size is {}, which {size} ranks cannot share evenly",
                    spec.vocab
                ),
            });
        }
        spec.head_parts = size;
    }
    spec.mlp.intermediate /= size;
    if let Some(moe) = spec.moe.as_mut() {
        // Every rank holds every expert, 1/N of each one's width (mlx-lm's
        // shard_inplace of switch_mlp); the router stays whole.
        moe.shape.intermediate /= size;
        if let Some(shared) = moe.shape.shared_intermediate.as_mut() {
            *shared /= size;
        }
    }
    if let Some(d) = spec.delta.as_mut() {
        // 1/N of the key and of the value heads, so of the convolution's
        // channels and of the recurrent state too (mlx-lm's qwen3_5.shard).
        d.key_heads /= size;
        d.value_heads /= size;
    }
    Ok(())
}

/// What the tensor names of `architecture` do not say about its splits,
/// from its config.
pub fn layout(
    architecture: Architecture,
    path: &std::path::Path,
    raw: &serde_json::Value,
) -> Result<load::Layout> {
    Ok(match architecture {
        Architecture::Qwen3_5 => {
            let c = crate::model::qwen3_5::Config::parse(path, raw)?;
            let width = i64::from(c.linear_num_key_heads) * i64::from(c.linear_key_head_dim);
            load::Layout {
                split_head: !c.tie_word_embeddings,
                repeat_kv_heads: u64::try_from(c.num_key_value_heads).ok(),
                delta_key_width: Some(u64::try_from(width).map_err(|_| RunnerError::Shard {
                    phase: "planning the shards",
                    message: format!("linear_num_key_heads x linear_key_head_dim is {width}"),
                })?),
            }
        }
        _ => load::Layout::default(),
    })
}
