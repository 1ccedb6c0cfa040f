//! The safetensors header, checked in Rust before MLX's loader sees the file:
//! MLX trusts the header (its shapes and offsets size what it reads and
//! allocates), so a malformed or hostile one is refused here with an error
//! that names the file and the tensor.
//!
//! Layout: an 8-byte little-endian header length N, N bytes of JSON (an object
//! of `name: {"dtype", "shape", "data_offsets": [begin, end]}` plus an optional
//! `__metadata__` of strings), then the data; offsets are relative to it.
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde::Deserialize;

use crate::error::{Result, RunnerError};

/// Headers longer than this are refused (the format's own reference
/// implementation caps them at 100 MB).
const MAX_HEADER: u64 = 100 << 20;

#[derive(Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// Bytes per element of a safetensors dtype MLX can load.
fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" => 8,
        _ => return None,
    })
}

/// One tensor as the checked header places it.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// The safetensors dtype name (`BF16`, `U32`, ...).
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Bytes per element.
    pub element: u64,
    /// Where its data begins in the file.
    pub offset: u64,
}

/// Checks the header of `path`: its length against the file, each tensor's
/// dtype, and that its shape's size equals its byte range inside the data.
pub fn check(path: &Path) -> Result<()> {
    header(path).map(drop)
}

/// The checked header of `path`: every tensor, by name.
pub fn header(path: &Path) -> Result<HashMap<String, TensorInfo>> {
    let bad = |message: String| RunnerError::Weights(format!("{}: {message}", path.display()));
    let mut file = File::open(path).map_err(|source| RunnerError::Read {
        path: path.to_owned(),
        source,
    })?;
    let file_len = file
        .metadata()
        .map_err(|source| RunnerError::Read {
            path: path.to_owned(),
            source,
        })?
        .len();
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .map_err(|_| bad("too short for a safetensors header".into()))?;
    let header_len = u64::from_le_bytes(len);
    if header_len > MAX_HEADER || header_len > file_len.saturating_sub(8) {
        return Err(bad(format!(
            "the header claims {header_len} bytes; the file has {file_len}"
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header)
        .map_err(|_| bad("truncated header".into()))?;
    let mut entries: HashMap<String, serde_json::Value> = serde_json::from_slice(&header)
        .map_err(|e| bad(format!("the header is not a JSON object: {e}")))?;
    entries.remove("__metadata__");
    let data_len = file_len - 8 - header_len;
    let mut out = HashMap::with_capacity(entries.len());
    for (name, value) in entries {
        let e: Entry =
            serde_json::from_value(value).map_err(|e| bad(format!("tensor {name:?}: {e}")))?;
        let size = dtype_size(&e.dtype)
            .ok_or_else(|| bad(format!("tensor {name:?} has unknown dtype {:?}", e.dtype)))?;
        let bytes = e
            .shape
            .iter()
            .try_fold(size, |acc, &d| acc.checked_mul(d))
            .filter(|_| e.shape.len() <= 8 && e.shape.iter().all(|&d| d <= i32::MAX as u64))
            .ok_or_else(|| {
                bad(format!(
                    "tensor {name:?} has an impossible shape {:?}",
                    e.shape
                ))
            })?;
        let [begin, end] = e.data_offsets;
        if begin > end || end > data_len || end - begin != bytes {
            return Err(bad(format!(
                "tensor {name:?} ({} {:?}, {bytes} bytes) has data offsets {begin}..{end} \
                 in {data_len} bytes of data",
                e.dtype, e.shape
            )));
        }
        out.insert(
            name,
            TensorInfo {
                dtype: e.dtype,
                shape: e.shape,
                element: size,
                offset: 8 + header_len + begin,
            },
        );
    }
    Ok(out)
}
