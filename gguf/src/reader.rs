//! The GGUF container (header, metadata, tensor infos, aligned data), read
//! with every length checked against what is left of the file before anything
//! is allocated: a header may claim anything, the file's size bounds it.
//!
//! Layout (little-endian, versions 2 and 3): `GGUF`, u32 version, u64 tensor
//! count, u64 metadata count; metadata as (string key, u32 type, value);
//! tensor infos as (string name, u32 dims, u64 x dims, u32 type, u64 offset);
//! then the data, starting at the next multiple of `general.alignment`
//! (default 32), each tensor at its offset from there.
use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{GgufError, Result};
use crate::types::GgmlType;
use crate::value::{Array, Metadata, Value};

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// ggml's limit on tensor dimensions.
const MAX_DIMS: u32 = 4;
/// GGUF keys are at most this long (the spec's limit).
const MAX_KEY_LEN: u64 = 65_535;
/// Arrays of arrays deeper than this are refused.
const MAX_NESTING: u32 = 4;

/// One tensor's description.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the fastest-varying (a row's length).
    pub dims: Vec<u64>,
    pub kind: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub bytes: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The shape in row-major (numpy/MLX) order: `dims` reversed.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}

/// An open GGUF file: its metadata and tensor infos; data is read on demand.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    file: File,
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    /// Where tensor data starts.
    pub data_offset: u64,
    pub file_len: u64,
}

/// Whether the file at `path` starts with the GGUF magic.
pub fn is_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == MAGIC
}

/// A reader that knows how much of the file is left.
struct Cursor<'a> {
    inner: BufReader<&'a File>,
    pos: u64,
    len: u64,
    path: &'a Path,
}

/// What is being read, for error messages.
#[derive(Clone, Copy)]
enum Part<'a> {
    Header,
    Metadata(Option<&'a str>),
    Tensor(Option<&'a str>),
}

impl<'a> Cursor<'a> {
    fn error(&self, part: Part<'_>, message: String) -> GgufError {
        let path = self.path.to_owned();
        match part {
            Part::Header => GgufError::Header { path, message },
            Part::Metadata(key) => GgufError::Metadata {
                path,
                key: key.map(str::to_owned),
                message,
            },
            Part::Tensor(name) => GgufError::TensorInfo {
                path,
                name: name.map(str::to_owned),
                message,
            },
        }
    }

    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn bytes<const N: usize>(&mut self, part: Part<'_>) -> Result<[u8; N]> {
        if self.remaining() < N as u64 {
            return Err(self.error(
                part,
                format!("the file ends at byte {} (truncated)", self.len),
            ));
        }
        let mut buf = [0u8; N];
        self.inner
            .read_exact(&mut buf)
            .map_err(|source| GgufError::Io {
                path: self.path.to_owned(),
                source,
            })?;
        self.pos += N as u64;
        Ok(buf)
    }

    fn u8(&mut self, part: Part<'_>) -> Result<u8> {
        Ok(self.bytes::<1>(part)?[0])
    }
    fn u16(&mut self, part: Part<'_>) -> Result<u16> {
        Ok(u16::from_le_bytes(self.bytes(part)?))
    }
    fn u32(&mut self, part: Part<'_>) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(part)?))
    }
    fn u64(&mut self, part: Part<'_>) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(part)?))
    }

    /// A length-prefixed UTF-8 string of at most `max` bytes.
    fn string(&mut self, part: Part<'_>, max: u64) -> Result<String> {
        let len = self.u64(part)?;
        if len > max || len > self.remaining() {
            return Err(self.error(
                part,
                format!(
                    "a string claims {len} bytes, but only {} remain in the file{}",
                    self.remaining(),
                    if len > max {
                        format!(" (and the limit is {max})")
                    } else {
                        String::new()
                    }
                ),
            ));
        }
        let mut buf = vec![0u8; len as usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(|source| GgufError::Io {
                path: self.path.to_owned(),
                source,
            })?;
        self.pos += len;
        String::from_utf8(buf).map_err(|_| self.error(part, "a string is not valid UTF-8".into()))
    }

    /// Fails unless `count` elements of at least `min_size` bytes each fit in
    /// what is left of the file.
    fn check_count(&self, part: Part<'_>, what: &str, count: u64, min_size: u64) -> Result<()> {
        let fits = count
            .checked_mul(min_size)
            .is_some_and(|need| need <= self.remaining());
        if fits {
            Ok(())
        } else {
            Err(self.error(
                part,
                format!(
                    "{what} claims {count} entries, more than the {} bytes left in the file \
                     can hold (truncated or corrupt)",
                    self.remaining()
                ),
            ))
        }
    }

    /// One value of GGUF type `kind`.
    fn value(&mut self, part: Part<'_>, kind: u32, depth: u32) -> Result<Value> {
        Ok(match kind {
            0 => Value::U8(self.u8(part)?),
            1 => Value::I8(self.u8(part)? as i8),
            2 => Value::U16(self.u16(part)?),
            3 => Value::I16(self.u16(part)? as i16),
            4 => Value::U32(self.u32(part)?),
            5 => Value::I32(self.u32(part)? as i32),
            6 => Value::F32(f32::from_bits(self.u32(part)?)),
            7 => match self.u8(part)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.error(part, format!("a bool holds {b}, not 0 or 1"))),
            },
            8 => Value::String(self.string(part, u64::MAX)?),
            9 => Value::Array(self.array(part, depth)?),
            10 => Value::U64(self.u64(part)?),
            11 => Value::I64(self.u64(part)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(part)?)),
            other => return Err(self.error(part, format!("unknown value type {other}"))),
        })
    }

    fn array(&mut self, part: Part<'_>, depth: u32) -> Result<Array> {
        if depth >= MAX_NESTING {
            return Err(self.error(part, format!("arrays nested deeper than {MAX_NESTING}")));
        }
        let kind = self.u32(part)?;
        let count = self.u64(part)?;
        let min_size = match kind {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            other => return Err(self.error(part, format!("unknown array element type {other}"))),
        };
        self.check_count(part, "an array", count, min_size)?;
        let n = count as usize;
        Ok(match kind {
            8 => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string(part, u64::MAX)?);
                }
                Array::Strings(v)
            }
            6 => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(f32::from_bits(self.u32(part)?));
                }
                Array::F32(v)
            }
            5 => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.u32(part)? as i32);
                }
                Array::I32(v)
            }
            4 => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.u32(part)?);
                }
                Array::U32(v)
            }
            _ => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(part, kind, depth + 1)?);
                }
                Array::Other(v)
            }
        })
    }
}

impl GgufFile {
    /// Opens `path` and reads its header, metadata and tensor infos, checking
    /// that every tensor lies inside the file.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let mut c = Cursor {
            inner: BufReader::with_capacity(1 << 16, &file),
            pos: 0,
            len: file_len,
            path,
        };
        // 1. Header.
        let magic = c.bytes::<4>(Part::Header)?;
        if magic != MAGIC {
            return Err(c.error(
                Part::Header,
                format!("not a GGUF file (starts with {magic:02x?}, not \"GGUF\")"),
            ));
        }
        let version = c.u32(Part::Header)?;
        match version {
            2 | 3 => {}
            1 => {
                return Err(c.error(
                    Part::Header,
                    "GGUF version 1 is not supported (convert it again with llama.cpp)".into(),
                ));
            }
            v if v.swap_bytes() <= 3 => {
                return Err(c.error(Part::Header, "big-endian GGUF is not supported".into()));
            }
            v => return Err(c.error(Part::Header, format!("unknown GGUF version {v}"))),
        }
        let tensor_count = c.u64(Part::Header)?;
        let kv_count = c.u64(Part::Header)?;
        // Each key/value takes at least 8 (key length) + 4 (type) + 1 bytes.
        c.check_count(Part::Header, "the metadata count", kv_count, 13)?;
        // Each tensor info takes at least 8 + 4 + 8 + 4 + 8 bytes.
        c.check_count(Part::Header, "the tensor count", tensor_count, 32)?;

        // 2. Metadata.
        let mut pairs = Vec::with_capacity(kv_count as usize);
        for _ in 0..kv_count {
            let key = c.string(Part::Metadata(None), MAX_KEY_LEN)?;
            let kind = c.u32(Part::Metadata(Some(&key)))?;
            let value = c.value(Part::Metadata(Some(&key)), kind, 0)?;
            pairs.push((key, value));
        }
        let metadata = Metadata::new(pairs);
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(Value::U32(a)) if a.is_power_of_two() && *a <= 1 << 16 => u64::from(*a),
            Some(other) => {
                return Err(c.error(
                    Part::Metadata(Some("general.alignment")),
                    format!("must be a uint32 power of two up to 65536, not {other:?}"),
                ));
            }
        };

        // 3. Tensor infos.
        let mut raw = Vec::with_capacity(tensor_count as usize);
        let mut names = HashSet::new();
        for _ in 0..tensor_count {
            let name = c.string(Part::Tensor(None), MAX_KEY_LEN)?;
            let part = Part::Tensor(Some(&name));
            let ndims = c.u32(part)?;
            if ndims == 0 || ndims > MAX_DIMS {
                return Err(c.error(part, format!("{ndims} dimensions (ggml allows 1 to 4)")));
            }
            let mut dims = Vec::with_capacity(ndims as usize);
            for _ in 0..ndims {
                dims.push(c.u64(part)?);
            }
            let type_id = c.u32(part)?;
            let offset = c.u64(part)?;
            let kind = GgmlType::from_id(type_id)
                .ok_or_else(|| c.error(part, format!("unknown tensor type {type_id}")))?;
            if !names.insert(name.clone()) {
                return Err(c.error(part, "the name appears twice".into()));
            }
            raw.push((name, dims, kind, offset));
        }
        let data_offset = c.pos.div_ceil(alignment) * alignment;

        // 4. Every tensor must fit inside the file.
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dims, kind, offset) in raw {
            let part = Part::Tensor(Some(&name));
            let bytes = tensor_bytes(&dims, kind).map_err(|m| c.error(part, m))?;
            if offset % alignment != 0 {
                return Err(c.error(
                    part,
                    format!("data offset {offset} is not a multiple of the alignment {alignment}"),
                ));
            }
            let end = data_offset
                .checked_add(offset)
                .and_then(|start| start.checked_add(bytes));
            match end {
                Some(end) if end <= file_len => {}
                _ => {
                    return Err(c.error(
                        part,
                        format!(
                            "its {bytes} bytes at data offset {offset} run past the end of the \
                             file ({file_len} bytes, data from byte {data_offset})"
                        ),
                    ));
                }
            }
            tensors.push(TensorInfo {
                name,
                dims,
                kind,
                offset: data_offset + offset,
                bytes,
            });
        }
        drop(c);
        Ok(Self {
            path: path.to_owned(),
            file,
            version,
            metadata,
            tensors,
            data_offset,
            file_len,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Reads a tensor's bytes into a buffer aligned for any block type.
    pub fn read(&self, info: &TensorInfo) -> Result<Aligned> {
        let mut buf = Aligned::zeroed(info.bytes as usize);
        self.file
            .read_exact_at(buf.as_mut_bytes(), info.offset)
            .map_err(|e| GgufError::TensorData {
                path: self.path.clone(),
                name: info.name.clone(),
                message: format!("reading {} bytes at {}: {e}", info.bytes, info.offset),
            })?;
        Ok(buf)
    }
}

/// Bytes of a tensor of this shape and type, or why the shape is impossible.
fn tensor_bytes(dims: &[u64], kind: GgmlType) -> std::result::Result<u64, String> {
    if dims.contains(&0) {
        return Err(format!("shape {dims:?} has an empty dimension"));
    }
    let elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n < 1 << 48)
        .ok_or_else(|| format!("shape {dims:?} is impossibly large"))?;
    let (block, size) = kind.block();
    if !dims[0].is_multiple_of(block) {
        return Err(format!(
            "rows of {} elements are not whole {kind} blocks of {block}",
            dims[0]
        ));
    }
    Ok(elements / block * size)
}

/// Bytes with 8-byte alignment, so they can be viewed as any ggml block type.
#[derive(Debug)]
pub struct Aligned {
    words: Vec<u64>,
    len: usize,
}

impl Aligned {
    fn zeroed(len: usize) -> Self {
        Self {
            words: vec![0u64; len.div_ceil(8)],
            len,
        }
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    fn as_mut_bytes(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(metadata: &[u8], kv_count: u64, tensor_count: u64) -> tempfile::NamedTempFile {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(tensor_count.to_le_bytes());
        bytes.extend(kv_count.to_le_bytes());
        bytes.extend(metadata);
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), bytes).unwrap();
        f
    }

    fn key(name: &str) -> Vec<u8> {
        let mut b = (name.len() as u64).to_le_bytes().to_vec();
        b.extend(name.as_bytes());
        b
    }

    /// Declared sizes far beyond the file are refused before anything of
    /// that size is allocated (an allocation of 2^40 strings would abort).
    #[test]
    fn huge_declarations_allocate_nothing() {
        for (elem, count) in [
            (8u32, 1u64 << 40),
            (0, 1 << 33),
            (9, u64::MAX),
            (6, 1 << 62),
        ] {
            let mut m = key("huge");
            m.extend(9u32.to_le_bytes());
            m.extend(elem.to_le_bytes());
            m.extend(count.to_le_bytes());
            m.extend([0u8; 64]);
            let f = file_with(&m, 1, 0);
            let err = GgufFile::open(f.path()).unwrap_err().to_string();
            assert!(err.contains("claims"), "{err}");
            assert!(err.contains("huge"), "{err}");
        }
        let f = file_with(&[0u8; 64], u64::MAX, 0);
        assert!(GgufFile::open(f.path()).is_err());
        let f = file_with(&[0u8; 64], 0, 1 << 60);
        assert!(GgufFile::open(f.path()).is_err());
        // A string value longer than the file.
        let mut m = key("s");
        m.extend(8u32.to_le_bytes());
        m.extend((1u64 << 50).to_le_bytes());
        let f = file_with(&m, 1, 0);
        let err = GgufFile::open(f.path()).unwrap_err().to_string();
        assert!(err.contains("a string claims"), "{err}");
    }

    #[test]
    fn nested_arrays_and_bad_values() {
        // Arrays nested deeper than the limit.
        let mut m = key("deep");
        m.extend(9u32.to_le_bytes());
        for _ in 0..6 {
            m.extend(9u32.to_le_bytes());
            m.extend(1u64.to_le_bytes());
        }
        m.extend([0u8; 32]);
        let f = file_with(&m, 1, 0);
        let err = GgufFile::open(f.path()).unwrap_err().to_string();
        assert!(err.contains("nested"), "{err}");
        // A bool that is neither 0 nor 1, an unknown value type.
        let mut m = key("b");
        m.extend(7u32.to_le_bytes());
        m.push(7);
        let f = file_with(&m, 1, 0);
        assert!(
            GgufFile::open(f.path())
                .unwrap_err()
                .to_string()
                .contains("bool")
        );
        let mut m = key("t");
        m.extend(77u32.to_le_bytes());
        m.extend([0u8; 8]);
        let f = file_with(&m, 1, 0);
        let err = GgufFile::open(f.path()).unwrap_err().to_string();
        assert!(err.contains("unknown value type 77"), "{err}");
    }
}
