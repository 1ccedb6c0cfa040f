//! Memory budgets, all derived from measured memory: how many tokens the KV
//! entry may hold, and the limits MLX is given.
//!
//! capacity_tokens = (memory x FRACTION - weight bytes - headroom - windows)
//!                   / KV bytes per token of the full-attention layers
//!
//! A sliding-window layer holds at most its window (plus a step) per
//! sequence, whatever the context, and a recurrent layer its fixed state:
//! `windows` reserves that for every sequence that may run at once, the
//! prompt-cache entry and its checkpoint.
use crate::cache::KvQuant;
use crate::model::Model;

/// Share of memory Grove lets one runner use for weights, KV and activations.
pub const FRACTION: f64 = 0.75;

/// The memory budgets of one loaded model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The memory the budget comes from, and where it is.
    pub memory_total: u64,
    pub memory_source: MemorySource,
    pub weight_bytes: u64,
    /// Reserved for activations of one prefill chunk and the logits.
    pub headroom: u64,
    /// Bytes of keys + values per token, all full-attention layers, as the
    /// runner's KV cache type holds them (quantized: packed, scales, biases).
    pub kv_bytes_per_token: u64,
    /// Bytes the sliding-window and recurrent layers of one sequence hold
    /// at most: the batch's sliding buffer or state, and the checkpoint of
    /// its prompt.
    pub window_bytes_per_sequence: u64,
    /// Tokens the KV entry may hold.
    pub kv_capacity_tokens: u64,
    /// MLX's memory limit and buffer-cache limit.
    pub mlx_memory_limit: u64,
    pub mlx_cache_limit: u64,
}

/// Where the memory a budget is computed from lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemorySource {
    /// Physical RAM: the CPU backend, or unified memory.
    PhysicalRam,
    /// The GPU's own memory (MLX's CUDA backend).
    Device,
}

/// The memory to size budgets against: the GPU's when MLX runs on a GPU with
/// its own memory report, else physical RAM.
pub fn budget_memory() -> (u64, MemorySource) {
    match gpu_memory() {
        Some(total) if total > 0 => (total, MemorySource::Device),
        _ => (physical_memory(), MemorySource::PhysicalRam),
    }
}

/// The default device's memory when it is a GPU (MLX's `device_info`).
fn gpu_memory() -> Option<u64> {
    // SAFETY: plain mlx-c calls on objects created and freed here.
    unsafe {
        let mut dev = mlx_sys::mlx_device_new();
        let mut found = None;
        let mut kind: mlx_sys::mlx_device_type = mlx_sys::mlx_device_type__MLX_CPU;
        if mlx_sys::mlx_get_default_device(&mut dev) == 0
            && mlx_sys::mlx_device_get_type(&mut kind, dev) == 0
            && kind == mlx_sys::mlx_device_type__MLX_GPU
        {
            let mut info = mlx_sys::mlx_device_info_new();
            if mlx_sys::mlx_device_info_get(&mut info, dev) == 0 {
                for key in [c"total_memory", c"memory_size"] {
                    let mut size: usize = 0;
                    if mlx_sys::mlx_device_info_get_size(&mut size, info, key.as_ptr()) == 0 {
                        found = Some(size as u64);
                        break;
                    }
                }
            }
            mlx_sys::mlx_device_info_free(info);
        }
        mlx_sys::mlx_device_free(dev);
        found
    }
}

/// Physical RAM, from sysinfo (0 when it cannot be read).
pub fn physical_memory() -> u64 {
    match sysinfo::System::new() {
        Ok(mut sys) => {
            sys.refresh_memory();
            sys.total_memory()
        }
        Err(_) => 0,
    }
}

impl Budget {
    /// The budget of `model` with `memory_total` bytes, prefill chunks of
    /// `chunk` tokens and up to `sequences` sequences at once.
    pub fn new(
        model: &Model,
        (memory_total, memory_source): (u64, MemorySource),
        chunk: u64,
        sequences: u64,
        kv: Option<KvQuant>,
    ) -> Self {
        let d = &model.dims;
        let dtype_bytes = dtype_bytes(model);
        let per_cache = d.kv_bytes_per_token_by_cache(dtype_bytes);
        let kv_bytes_per_token = kv_bytes_per_token(model, kv);
        let window_bytes_per_sequence: u64 = d
            .kinds
            .iter()
            .zip(&per_cache)
            .filter_map(|(k, b)| {
                // The batch's buffer (window, margin, a step) and the
                // sequence's checkpoint (a window).
                k.window()
                    .map(|w| (2 * w as u64 + crate::cache::kv::STEP as u64 + 16) * b)
            })
            .sum::<u64>()
            + recurrent_bytes_per_sequence(d, dtype_bytes);
        let (hidden, heads, head_dim) = (d.hidden as u64, d.heads as u64, d.head_dim as u64);
        // One chunk's activations: the residual stream and attention/MLP
        // intermediates (a few of each alive at once), attention scores in float32,
        // and float32 logits for a row.
        let width = (4 * hidden + 3 * d.intermediate as u64 + 2 * heads * head_dim) * dtype_bytes;
        let scores = heads * chunk * chunk * 4;
        let headroom = 256 * MIB + chunk * width * 2 + scores + d.vocab as u64 * 4 * 2;
        let usable = (memory_total as f64 * FRACTION) as u64;
        let weight_bytes = model.weight_bytes as u64;
        let windows = window_bytes_per_sequence * (sequences + 2);
        let left = usable.saturating_sub(weight_bytes + headroom + windows);
        // A model of windowed layers only: its context is bounded elsewhere.
        let kv_capacity_tokens = left.checked_div(kv_bytes_per_token.max(1)).unwrap_or(0);
        Self {
            memory_total,
            memory_source,
            weight_bytes,
            headroom,
            kv_bytes_per_token,
            window_bytes_per_sequence,
            kv_capacity_tokens,
            mlx_memory_limit: usable,
            // Freed buffers kept for reuse: enough for a chunk's activations.
            mlx_cache_limit: headroom.min(usable / 8),
        }
    }

    /// Gives MLX its limits.
    pub fn apply(&self) -> Result<(), mlx_rs::error::Exception> {
        mlx_rs::memory::set_memory_limit(self.mlx_memory_limit as usize)?;
        mlx_rs::memory::set_cache_limit(self.mlx_cache_limit as usize)?;
        Ok(())
    }
}

const MIB: u64 = 1 << 20;

/// Bytes per element of the model's activations (and so of its KV cache).
fn dtype_bytes(model: &Model) -> u64 {
    match model.dtype() {
        mlx_rs::Dtype::Float16 | mlx_rs::Dtype::Bfloat16 => 2,
        _ => 4,
    }
}

/// Bytes of keys + values per token of the full-attention layers, in full
/// precision or quantized as `kv` says.
pub fn kv_bytes_per_token(model: &Model, kv: Option<KvQuant>) -> u64 {
    let d = &model.dims;
    let dtype_bytes = dtype_bytes(model);
    d.kinds
        .iter()
        .zip(d.kv_bytes_per_token_by_cache(dtype_bytes))
        .filter(|(k, _)| k.window().is_none())
        .map(|(_, b)| match kv {
            None => b,
            Some(q) => q.bytes(b / dtype_bytes, dtype_bytes),
        })
        .sum()
}

/// The recurrent layers' states of one sequence, twice: in the batch and in
/// the checkpoint of its prompt.
fn recurrent_bytes_per_sequence(d: &crate::model::Dims, dtype_bytes: u64) -> u64 {
    let layers = d
        .kinds
        .iter()
        .filter(|k| **k == crate::cache::CacheKind::Recurrent)
        .count() as u64;
    match d.recurrent_elements {
        Some((conv, state)) => 2 * layers * (conv * dtype_bytes + state * 4),
        None => 0,
    }
}
