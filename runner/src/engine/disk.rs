//! The SSD tier behind the prompt cache: whenever a finished request
//! replaces the in-memory entry, and when the runner stops, the entry (its
//! token ids and every layer, quantized or not) is written to the KV
//! directory, so that many conversations keep their prefixes across turns,
//! evictions and restarts. A request whose prompt shares a longer prefix
//! with a stored entry than with the in-memory one loads it instead of
//! recomputing.
//!
//! Layout: `GROVE_KV_DIR/<model identity>/<key>.safetensors`, the identity a
//! SHA-256 over config.json and each weight file's name, size, first and
//! last MiB (and the Hugging Face snapshot commit), so another model or
//! revision never meets these entries; the key a hash of the tokens and the
//! setting. The file is safetensors: the layers' arrays (only the slots
//! held), and metadata naming the format, the identity, the activation
//! dtype, the KV setting, the layers, the tokens and the SHA-256 of the data.
//!
//! Safety: files are written by a writer thread to a unique temporary name
//! and renamed, so a reader (this runner or another of the same model)
//! sees a whole file or none. A file that is truncated, corrupted (its
//! checksum), foreign (another identity, dtype or layer layout) or
//! unreadable is skipped and removed with a warning, never loaded. The
//! disk budget (`GROVE_KV_DISK`) is shared by every model in the directory:
//! after each write the least recently used files (by modification time,
//! which a hit refreshes) go until the rest fit.
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::time::SystemTime;

use mlx_rs::ops::indexing::{TryIndexMutOp, TryIndexOp};
use mlx_rs::ops::zeros_dtype;
use mlx_rs::{Array, Dtype};
use sha2::{Digest, Sha256};

use crate::cache::kv::STEP;
use crate::cache::{
    CacheKind, KvCache, KvSetting, LayerKv, Planes, RecurrentCache, RotatingKvCache,
};

/// The format this module writes and reads.
const FORMAT: &str = "grove-kv/1";
/// Entries shorter than this are not worth a file.
pub const MIN_TOKENS: usize = 16;
/// Writes waiting for the writer thread; more are dropped (bounded memory).
const QUEUE: usize = 2;
/// The default budget: this share of the free space, at most the cap.
const FREE_SHARE: f64 = 0.10;
const DEFAULT_CAP: u64 = 20 << 30;

/// Where the tier lives and how much it may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskConfig {
    pub dir: PathBuf,
    /// Bytes all models' entries may take together.
    pub budget: u64,
}

impl DiskConfig {
    /// From `GROVE_KV_DIR` (default: the user's cache directory's
    /// `grove/kv`) and `GROVE_KV_DISK` (bytes, with an optional K/M/G/T
    /// suffix; `0` or `off` turns the tier off; default 10% of the free
    /// space there, at most 20 GiB). `None`: off.
    pub fn from_env() -> Result<Option<Self>, String> {
        let dir = match std::env::var_os("GROVE_KV_DIR").filter(|v| !v.is_empty()) {
            Some(d) => PathBuf::from(d),
            None => match default_dir() {
                Some(d) => d,
                None => return Ok(None),
            },
        };
        let budget = match std::env::var("GROVE_KV_DISK") {
            Ok(v) if !v.trim().is_empty() => parse_size(&v)?,
            _ => {
                let _ = fs::create_dir_all(&dir);
                ((free_space(&dir) as f64 * FREE_SHARE) as u64).min(DEFAULT_CAP)
            }
        };
        Ok((budget > 0).then_some(Self { dir, budget }))
    }
}

/// `$XDG_CACHE_HOME/grove/kv`, else `~/Library/Caches/grove/kv` on macOS
/// and `~/.cache/grove/kv` elsewhere.
fn default_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(x).join("grove/kv"));
    }
    let home = PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?);
    Some(if cfg!(target_os = "macos") {
        home.join("Library/Caches/grove/kv")
    } else {
        home.join(".cache/grove/kv")
    })
}

/// `12345`, `512M`, `20G`, `off`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("off") {
        return Ok(0);
    }
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let shift = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => {
            return Err(format!(
                "GROVE_KV_DISK: {text:?} is not a size (bytes, K, M, G, T or off)"
            ));
        }
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("GROVE_KV_DISK: {text:?} is not a size (bytes, K, M, G, T or off)"))
}

/// Free bytes on the file system holding `dir` (0 when unknown).
fn free_space(dir: &Path) -> u64 {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return 0;
    };
    // SAFETY: statvfs fills the zeroed struct from a NUL-terminated path.
    unsafe {
        let mut s: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut s) == 0 {
            (s.f_bavail as u64).saturating_mul(s.f_frsize as u64)
        } else {
            0
        }
    }
}

/// A SHA-256 naming the model: config.json, each weight file's name, size,
/// first and last MiB, and the snapshot commit when the directory is one.
pub fn identity(model: &Path) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut files: Vec<PathBuf> = if model.is_dir() {
        h.update(fs::read(model.join("config.json")).unwrap_or_default());
        fs::read_dir(model)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension()
                    .is_some_and(|x| x == "safetensors" || x == "gguf")
            })
            .collect()
    } else {
        vec![model.to_path_buf()]
    };
    files.sort();
    for path in &files {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        h.update(
            path.file_name()
                .map(|n| n.as_encoded_bytes())
                .unwrap_or_default(),
        );
        h.update(len.to_le_bytes());
        let mut buf = vec![0u8; (1 << 20).min(len) as usize];
        f.read_exact(&mut buf)?;
        h.update(&buf);
        if len > buf.len() as u64 {
            use std::io::Seek;
            f.seek(std::io::SeekFrom::Start(len - buf.len() as u64))?;
            f.read_exact(&mut buf)?;
            h.update(&buf);
        }
    }
    let canonical = fs::canonicalize(model).unwrap_or_else(|_| model.to_path_buf());
    let parts: Vec<_> = canonical.components().collect();
    if let Some(i) = parts.iter().position(|c| c.as_os_str() == "snapshots")
        && let Some(commit) = parts.get(i + 1)
    {
        h.update(commit.as_os_str().as_encoded_bytes());
    }
    Ok(hex::encode(&h.finalize()[..16]))
}

/// The KV setting as the file names it.
fn setting_tag(kv: Option<KvSetting>) -> String {
    match kv {
        None => "none".into(),
        Some(s) => format!("q{}g{}s{}", s.quant.bits, s.quant.group_size, s.start),
    }
}

fn dtype_name(d: Dtype) -> Option<&'static str> {
    Some(match d {
        Dtype::Float32 => "F32",
        Dtype::Float16 => "F16",
        Dtype::Bfloat16 => "BF16",
        Dtype::Uint32 => "U32",
        _ => return None,
    })
}

/// An evaluated array's bytes (little-endian, as safetensors holds them).
fn array_bytes(a: &Array) -> Result<Vec<u8>, String> {
    a.eval().map_err(|e| e.to_string())?;
    fn raw<T: mlx_rs::ArrayElement + Copy>(a: &Array) -> Vec<u8> {
        let s = a.as_slice::<T>();
        // SAFETY: plain-old-data elements viewed as their bytes.
        unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
            .to_vec()
    }
    let a = a.contiguous().map_err(|e| e.to_string())?;
    a.eval().map_err(|e| e.to_string())?;
    Ok(match a.dtype() {
        Dtype::Float32 => raw::<f32>(&a),
        Dtype::Float16 => raw::<half::f16>(&a),
        Dtype::Bfloat16 => raw::<half::bf16>(&a),
        Dtype::Uint32 => raw::<u32>(&a),
        d => return Err(format!("cannot store a {d:?} array")),
    })
}

/// An array of `shape` from safetensors bytes of `dtype` (whose length
/// the caller checked against the shape).
fn array_from(dtype: &str, shape: &[i32], bytes: &[u8]) -> Result<Array, String> {
    macro_rules! make {
        ($n:literal, $f:expr) => {{
            let v: Vec<_> = bytes
                .chunks_exact($n)
                .map(|c| $f(c.try_into().unwrap_or([0u8; $n])))
                .collect();
            Array::from_slice(&v, shape)
        }};
    }
    Ok(match dtype {
        "F32" => make!(4, f32::from_le_bytes),
        "F16" => make!(2, |b| half::f16::from_bits(u16::from_le_bytes(b))),
        "BF16" => make!(2, |b| half::bf16::from_bits(u16::from_le_bytes(b))),
        "U32" => make!(4, u32::from_le_bytes),
        d => return Err(format!("unknown dtype {d}")),
    })
}

/// One stored entry, as the index knows it.
#[derive(Debug, Clone)]
struct Stored {
    path: PathBuf,
    tokens: Vec<u32>,
    setting: String,
}

/// A file to write (built on the engine thread, written on the writer's).
struct WriteJob {
    path: PathBuf,
    /// What the index learns once it is written.
    stored: Stored,
    header: Vec<u8>,
    data: Vec<u8>,
    /// Files this one supersedes (its prefixes), removed once it is in.
    superseded: Vec<PathBuf>,
}

/// Entries and bytes of this model's directory, as the writer last counted.
#[derive(Default)]
pub struct DiskStats {
    pub entries: AtomicU64,
    pub bytes: AtomicU64,
}

/// The tier of one runner: its model's directory and its index.
pub struct DiskTier {
    root: PathBuf,
    dir: PathBuf,
    identity: String,
    dtype: &'static str,
    layout: String,
    budget: u64,
    index: Vec<Stored>,
    writer: SyncSender<WriteJob>,
    thread: std::thread::JoinHandle<()>,
    /// What the writer did: files written (to index) and removed (to forget).
    done: Receiver<Written>,
    /// Entries queued and not yet written.
    pending: Vec<Stored>,
    pub stats: Arc<DiskStats>,
}

/// What the writer reports back.
enum Written {
    Added(Stored),
    Removed(PathBuf),
}

/// Warns on stderr and removes a file that cannot be used.
fn discard(path: &Path, why: &str) {
    eprintln!(
        "grove-runner: KV cache file {} {why}; removed",
        path.display()
    );
    let _ = fs::remove_file(path);
}

/// Reads a stored file's header: its metadata.
fn read_header(path: &Path) -> Result<BTreeMap<String, String>, String> {
    crate::model::safetensors::check(path).map_err(|e| e.to_string())?;
    let mut f = File::open(path).map_err(|e| e.to_string())?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|e| e.to_string())?;
    let mut header = vec![0u8; u64::from_le_bytes(len) as usize];
    f.read_exact(&mut header).map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_slice(&header).map_err(|e| e.to_string())?;
    serde_json::from_value(v.get("__metadata__").cloned().unwrap_or_default())
        .map_err(|_| "has no grove metadata".to_string())
}

fn parse_tokens(text: &str) -> Option<Vec<u32>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split(',').map(|t| t.parse().ok()).collect()
}

/// The layer layout a file must have to serve this model: each layer's kind.
fn layout_of(kinds: &[CacheKind]) -> String {
    kinds
        .iter()
        .map(|k| match k {
            CacheKind::Full => "full".to_string(),
            CacheKind::Window(w) => format!("window{w}"),
            CacheKind::Recurrent => "recurrent".to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl DiskTier {
    /// Opens (creating) this model's directory and indexes what it holds;
    /// `None` (with a warning) when the directory cannot be used.
    pub fn open(
        config: &DiskConfig,
        model: &Path,
        dtype: Dtype,
        kinds: &[CacheKind],
        stats: Arc<DiskStats>,
    ) -> Option<Self> {
        let identity = match identity(model) {
            Ok(i) => i,
            Err(e) => {
                eprintln!("grove-runner: no KV disk tier: reading the model for its identity: {e}");
                return None;
            }
        };
        let dir = config.dir.join(&identity);
        if let Err(e) = fs::create_dir_all(&dir) {
            eprintln!("grove-runner: no KV disk tier: {}: {e}", dir.display());
            return None;
        }
        let (writer, jobs) = sync_channel::<WriteJob>(QUEUE);
        let (removed_tx, done) = std::sync::mpsc::channel();
        let (root, budget, own, counts) = (
            config.dir.clone(),
            config.budget,
            dir.clone(),
            stats.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("grove-kv-writer".into())
            .spawn(move || write_loop(jobs, &root, &own, budget, &removed_tx, &counts));
        let thread = match spawned {
            Ok(t) => t,
            Err(e) => {
                eprintln!("grove-runner: no KV disk tier: starting its writer: {e}");
                return None;
            }
        };
        let mut tier = Self {
            root: config.dir.clone(),
            dir,
            identity,
            dtype: dtype_name(dtype)?,
            layout: layout_of(kinds),
            budget: config.budget,
            index: Vec::new(),
            writer,
            thread,
            done,
            pending: Vec::new(),
            stats,
        };
        tier.scan();
        Some(tier)
    }

    /// Indexes this model's directory; files that cannot serve are removed.
    fn scan(&mut self) {
        self.index.clear();
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.starts_with('.') {
                continue; // Another writer's temporary file.
            }
            if path.extension().is_none_or(|x| x != "safetensors") {
                continue;
            }
            match self.check_meta(&path) {
                Ok(stored) => self.index.push(stored),
                Err(why) => discard(&path, &why),
            }
        }
        count(&self.dir, &self.stats);
    }

    /// The file's metadata checked against this model.
    fn check_meta(&self, path: &Path) -> Result<Stored, String> {
        let meta = read_header(path)?;
        let get = |k: &str| meta.get(k).map(String::as_str).unwrap_or_default();
        if get("format") != FORMAT {
            return Err(format!("is not a {FORMAT} file"));
        }
        if get("model") != self.identity {
            return Err("belongs to another model or revision".into());
        }
        if get("dtype") != self.dtype || get("layers") != self.layout {
            return Err("was written for another dtype or layer layout".into());
        }
        let tokens = parse_tokens(get("tokens")).ok_or("has malformed tokens")?;
        Ok(Stored {
            path: path.to_path_buf(),
            tokens,
            setting: get("kv").to_string(),
        })
    }

    /// Learns what the writer did since the last call: entries now on disk
    /// join the index, removed ones leave it.
    fn forget_removed(&mut self) {
        loop {
            match self.done.try_recv() {
                Ok(Written::Added(stored)) => {
                    self.pending.retain(|p| p.path != stored.path);
                    self.index.retain(|s| s.path != stored.path);
                    self.index.push(stored);
                }
                Ok(Written::Removed(p)) => {
                    self.pending.retain(|s| s.path != p);
                    self.index.retain(|s| s.path != p);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return,
            }
        }
    }

    /// Tokens the best stored entry would give `prompt` (at most all but its
    /// last token), and which entry that is.
    pub fn best(&mut self, prompt: &[u32], kv: Option<KvSetting>) -> Option<(usize, usize)> {
        self.forget_removed();
        let tag = setting_tag(kv);
        let most = prompt.len().saturating_sub(1);
        self.index
            .iter()
            .enumerate()
            .filter(|(_, s)| s.setting == tag)
            .map(|(i, s)| {
                let common = s
                    .tokens
                    .iter()
                    .zip(prompt)
                    .take_while(|(a, b)| a == b)
                    .count();
                (common.min(most), i)
            })
            .filter(|&(n, _)| n > 0)
            .max()
    }

    /// Loads stored entry `i`: its tokens and layers. A file that fails any
    /// check is removed (and forgotten) with a warning.
    pub fn load(&mut self, i: usize, kinds: &[CacheKind]) -> Option<(Vec<u32>, Vec<LayerKv>)> {
        let stored = self.index.get(i)?.clone();
        match self.read(&stored, kinds) {
            Ok(layers) => {
                // A hit: the file is the most recently used.
                if let Ok(f) = File::options().write(true).open(&stored.path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Some((stored.tokens, layers))
            }
            Err(why) => {
                discard(&stored.path, &why);
                self.index.remove(i);
                count(&self.dir, &self.stats);
                None
            }
        }
    }

    fn read(&self, stored: &Stored, kinds: &[CacheKind]) -> Result<Vec<LayerKv>, String> {
        let checked = self.check_meta(&stored.path)?;
        if checked.tokens != stored.tokens || checked.setting != stored.setting {
            return Err("changed since it was indexed".into());
        }
        let bytes = fs::read(&stored.path).map_err(|e| e.to_string())?;
        let truncated = || "is truncated".to_string();
        let len: [u8; 8] = bytes
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(truncated)?;
        let header_end = (u64::from_le_bytes(len) as usize)
            .checked_add(8)
            .ok_or_else(truncated)?;
        let header: BTreeMap<String, serde_json::Value> =
            serde_json::from_slice(bytes.get(8..header_end).ok_or_else(truncated)?)
                .map_err(|e| e.to_string())?;
        let data = bytes.get(header_end..).ok_or_else(truncated)?;
        let meta: BTreeMap<String, String> =
            serde_json::from_value(header.get("__metadata__").cloned().unwrap_or_default())
                .map_err(|_| "has no grove metadata".to_string())?;
        if meta.get("sha256").map(String::as_str) != Some(&hex::encode(Sha256::digest(data))) {
            return Err("fails its checksum (corrupted or truncated)".into());
        }
        let tensor = |name: &str| -> Result<Option<Array>, String> {
            let Some(e) = header.get(name) else {
                return Ok(None);
            };
            let dtype = e["dtype"].as_str().unwrap_or_default();
            let shape: Vec<i32> = e["shape"]
                .as_array()
                .map(|s| s.iter().map(|d| d.as_u64().unwrap_or(0) as i32).collect())
                .unwrap_or_default();
            let (b, end) = (
                e["data_offsets"][0].as_u64().unwrap_or(0) as usize,
                e["data_offsets"][1].as_u64().unwrap_or(0) as usize,
            );
            let part = data.get(b..end).ok_or_else(truncated)?;
            let elements: i64 = shape.iter().map(|&d| d as i64).product();
            let size = match dtype {
                "F32" | "U32" => 4,
                "F16" | "BF16" => 2,
                _ => return Err(format!("tensor {name} has dtype {dtype}")),
            };
            if shape.iter().any(|&d| d < 0) || elements.checked_mul(size) != Some(part.len() as i64)
            {
                return Err(format!(
                    "tensor {name} has a shape that does not match its data"
                ));
            }
            array_from(dtype, &shape, part).map(Some)
        };
        let quant = match stored.setting.as_str() {
            "none" => None,
            _ => {
                let offsets: Vec<&str> = meta
                    .get("quant")
                    .map(|q| q.split(',').collect())
                    .unwrap_or_default();
                match offsets.as_slice() {
                    [bits, group] => Some(crate::cache::KvQuant::new(
                        bits.parse().map_err(|_| "bad quant")?,
                        group.parse().map_err(|_| "bad quant")?,
                    )?),
                    _ => return Err("has no quantization".into()),
                }
            }
        };
        let offsets = parse_tokens(meta.get("offsets").map(String::as_str).unwrap_or_default())
            .filter(|o| o.len() == kinds.len())
            .ok_or("has malformed layer offsets")?;
        let mut layers = Vec::with_capacity(kinds.len());
        for (l, (&kind, &offset)) in kinds.iter().zip(&offsets).enumerate() {
            let offset = offset as i32;
            let planes = |side: &str| -> Result<Option<Planes>, String> {
                let mut parts = Vec::new();
                for j in 0..3 {
                    if let Some(a) = tensor(&format!("layers.{l}.{side}.{j}"))? {
                        parts.push(a);
                    }
                }
                if parts.is_empty() {
                    return Ok(None);
                }
                Planes::from_parts(parts)
                    .map(Some)
                    .map_err(|e| e.to_string())
            };
            let layer = match kind {
                CacheKind::Full => match (planes("k")?, planes("v")?) {
                    (Some(k), Some(v)) => {
                        let cap = (offset.max(1) + STEP - 1) / STEP * STEP;
                        let grow = |p: Planes| {
                            p.map(|x| {
                                let mut fresh =
                                    zeros_dtype(&[x.dim(0), x.dim(1), cap, x.dim(3)], x.dtype())?;
                                fresh.try_index_mut((.., .., ..x.dim(2), ..), x)?;
                                Ok(fresh)
                            })
                        };
                        if k.time() != offset {
                            return Err("holds another number of tokens than it says".into());
                        }
                        let (k, v) = (
                            grow(k).map_err(|e| e.to_string())?,
                            grow(v).map_err(|e| e.to_string())?,
                        );
                        LayerKv::Full(
                            KvCache::from_buffers(k, v, offset, quant)
                                .map_err(|e| e.to_string())?,
                        )
                    }
                    _ => LayerKv::new(kind),
                },
                CacheKind::Window(w) => match (planes("k")?, planes("v")?) {
                    (Some(k), Some(v)) => {
                        let (Some(k), Some(v)) = (k.as_float(), v.as_float()) else {
                            return Err("holds a quantized window".into());
                        };
                        LayerKv::Window(
                            RotatingKvCache::from_temporal(k.clone(), v.clone(), offset, w)
                                .ok_or("holds a window of another size")?,
                        )
                    }
                    _ => LayerKv::new(kind),
                },
                CacheKind::Recurrent => {
                    match (
                        tensor(&format!("layers.{l}.conv"))?,
                        tensor(&format!("layers.{l}.state"))?,
                    ) {
                        (Some(conv), Some(state)) => {
                            let mut r = RecurrentCache::new();
                            r.update(conv, state, offset);
                            LayerKv::Recurrent(r)
                        }
                        _ => LayerKv::new(kind),
                    }
                }
            };
            if layer.offset() != offset {
                return Err("holds another number of tokens than it says".into());
            }
            layers.push(layer);
        }
        let arrays: Vec<&Array> = layers.iter().flat_map(LayerKv::arrays).collect();
        mlx_rs::transforms::eval(arrays).map_err(|e| e.to_string())?;
        Ok(layers)
    }

    /// Queues the entry (`tokens` and its `layers`) to be written, unless it
    /// is short or already stored; files of its prefixes go once it is in.
    pub fn persist(&mut self, tokens: &[u32], layers: &[LayerKv], kv: Option<KvSetting>) {
        self.forget_removed();
        let tag = setting_tag(kv);
        if tokens.len() < MIN_TOKENS
            || layers.first().map_or(0, LayerKv::offset) as usize != tokens.len()
            || self
                .index
                .iter()
                .chain(&self.pending)
                .any(|s| s.setting == tag && s.tokens.starts_with(tokens))
        {
            return;
        }
        let job = match self.build(tokens, layers, kv, &tag) {
            Ok(job) => job,
            Err(e) => {
                eprintln!("grove-runner: not writing a KV cache entry: {e}");
                return;
            }
        };
        let stored = job.stored.clone();
        if self.writer.try_send(job).is_ok() {
            self.pending.push(stored);
        }
    }

    fn build(
        &self,
        tokens: &[u32],
        layers: &[LayerKv],
        kv: Option<KvSetting>,
        tag: &str,
    ) -> Result<WriteJob, String> {
        let mut tensors: Vec<(String, Array)> = Vec::new();
        let mut offsets = Vec::with_capacity(layers.len());
        for (l, layer) in layers.iter().enumerate() {
            offsets.push(layer.offset().to_string());
            let err = |e: mlx_rs::error::Exception| e.to_string();
            match layer {
                LayerKv::Full(c) => {
                    if let Some((k, v)) = c.buffers() {
                        let held = c.offset();
                        for (side, p) in [("k", k), ("v", v)] {
                            for (j, a) in p.parts().iter().enumerate() {
                                tensors.push((
                                    format!("layers.{l}.{side}.{j}"),
                                    a.try_index((.., .., ..held, ..)).map_err(err)?,
                                ));
                            }
                        }
                    }
                }
                LayerKv::Window(c) => {
                    if let Some((k, v)) = c.temporal().map_err(err)? {
                        tensors.push((format!("layers.{l}.k.0"), k));
                        tensors.push((format!("layers.{l}.v.0"), v));
                    }
                }
                LayerKv::Recurrent(r) => {
                    if let (Some(conv), Some(state)) = r.state() {
                        tensors.push((format!("layers.{l}.conv"), conv.clone()));
                        tensors.push((format!("layers.{l}.state"), state.clone()));
                    }
                }
            }
        }
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        let mut data = Vec::new();
        let mut header = serde_json::Map::new();
        for (name, a) in &tensors {
            let bytes = array_bytes(a)?;
            let dtype = dtype_name(a.dtype()).ok_or("an unstorable dtype")?;
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": dtype, "shape": a.shape(), "data_offsets": [data.len(), data.len() + bytes.len()]}),
            );
            data.extend_from_slice(&bytes);
        }
        let tokens_text = tokens
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let mut meta = serde_json::Map::new();
        for (k, v) in [
            ("format", FORMAT.to_string()),
            ("model", self.identity.clone()),
            ("dtype", self.dtype.to_string()),
            ("layers", self.layout.clone()),
            ("kv", tag.to_string()),
            (
                "quant",
                kv.map(|s| format!("{},{}", s.quant.bits, s.quant.group_size))
                    .unwrap_or_default(),
            ),
            ("offsets", offsets.join(",")),
            ("tokens", tokens_text),
            ("sha256", hex::encode(Sha256::digest(&data))),
        ] {
            meta.insert(k.into(), v.into());
        }
        header.insert("__metadata__".into(), serde_json::Value::Object(meta));
        let header = serde_json::to_vec(&header).map_err(|e| e.to_string())?;
        let key = {
            let mut h = Sha256::new();
            h.update(tag.as_bytes());
            for t in tokens {
                h.update(t.to_le_bytes());
            }
            hex::encode(&h.finalize()[..12])
        };
        let superseded = self
            .index
            .iter()
            .filter(|s| s.setting == tag && tokens.starts_with(&s.tokens))
            .map(|s| s.path.clone())
            .collect();
        let path = self.dir.join(format!("{key}.safetensors"));
        Ok(WriteJob {
            stored: Stored {
                path: path.clone(),
                tokens: tokens.to_vec(),
                setting: tag.to_string(),
            },
            path,
            header,
            data,
            superseded,
        })
    }

    /// This model's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory all models share, and its budget.
    pub fn root(&self) -> (&Path, u64) {
        (&self.root, self.budget)
    }

    /// Waits until every queued write is on disk (the runner is stopping).
    pub fn flush(self) {
        drop(self.writer);
        let _ = self.thread.join();
    }
}

/// Counts this model's files into `stats`.
fn count(dir: &Path, stats: &DiskStats) {
    let (mut n, mut bytes) = (0, 0);
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') && name.ends_with(".safetensors") {
                n += 1;
                bytes += e.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    stats.entries.store(n, Ordering::Relaxed);
    stats.bytes.store(bytes, Ordering::Relaxed);
}

/// The writer thread: each job to a temporary name, then renamed; the
/// superseded files removed; then the budget enforced over every model.
fn write_loop(
    jobs: Receiver<WriteJob>,
    root: &Path,
    own: &Path,
    budget: u64,
    done: &std::sync::mpsc::Sender<Written>,
    stats: &DiskStats,
) {
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    while let Ok(job) = jobs.recv() {
        let tmp = own.join(format!(
            ".{}.{}.{}.tmp",
            std::process::id(),
            SERIAL.fetch_add(1, Ordering::Relaxed),
            job.path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        ));
        let written = (|| -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(&(job.header.len() as u64).to_le_bytes())?;
            f.write_all(&job.header)?;
            f.write_all(&job.data)?;
            f.sync_data()?;
            fs::rename(&tmp, &job.path)
        })();
        if let Err(e) = written {
            eprintln!(
                "grove-runner: writing KV cache file {}: {e}",
                job.path.display()
            );
            let _ = fs::remove_file(&tmp);
            let _ = done.send(Written::Removed(job.path.clone()));
            continue;
        }
        let _ = done.send(Written::Added(job.stored));
        for old in job.superseded.iter().filter(|p| **p != job.path) {
            let _ = fs::remove_file(old);
            let _ = done.send(Written::Removed(old.clone()));
        }
        for gone in enforce_budget(root, budget) {
            let _ = done.send(Written::Removed(gone));
        }
        count(own, stats);
    }
}

/// Removes the least recently used entry files under `root` (every model)
/// until the rest fit `budget`; returns what went.
pub fn enforce_budget(root: &Path, budget: u64) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for model in fs::read_dir(root)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
    {
        for e in fs::read_dir(model.path())
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !name.ends_with(".safetensors") {
                continue;
            }
            if let Ok(m) = e.metadata() {
                files.push((
                    m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    m.len(),
                    e.path(),
                ));
            }
        }
    }
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    files.sort();
    let mut gone = Vec::new();
    for (_, len, path) in files {
        if total <= budget {
            break;
        }
        if fs::remove_file(&path).is_ok() {
            total -= len;
            gone.push(path);
        }
    }
    gone
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("2K").unwrap(), 2048);
        assert_eq!(parse_size("3 GiB").unwrap(), 3 << 30);
        assert_eq!(parse_size("off").unwrap(), 0);
        assert!(parse_size("lots").is_err());
    }
}
