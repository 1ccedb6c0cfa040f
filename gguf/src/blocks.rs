//! Tensor data: ggml blocks to what MLX holds.
//!
//! - `Q4_0`, `Q4_1` and `Q8_0` are affine per block of 32 (value = q * d + m),
//!   which is MLX's affine quantization with group 32, so their blocks are
//!   repacked bit for bit into MLX's layout: `weight` as uint32 words holding
//!   8 (4-bit) or 4 (8-bit) values, lowest bits first, and float16 `scales`
//!   and `biases` per group (`Q4_0`: d and -8d; `Q4_1`: d and m; `Q8_0`: d and
//!   -128d with the signed quants offset by 128). This is what MLX's own GGUF
//!   reader does for these types.
//! - `F32`, `F16` and `BF16` stay as they are.
//! - Every other type candle (Hugging Face's ggml port) can decode, K-quants
//!   and `Q5_0`/`Q5_1` among them, is dequantized to float32 by it and, for a
//!   matrix, re-quantized to MLX affine group 32 ([`requant_bits`] picks 4 or
//!   8 bits; [`crate::requant`] does it); a vector stays float32.
use std::borrow::Cow;

use candle_core::CpuStorage;
use candle_core::quantized::GgmlDType;
use half::f16;

use crate::types::GgmlType;

/// A tensor's data, converted.
#[derive(Debug)]
pub enum Data {
    F32(Vec<f32>),
    /// float16 bit patterns.
    F16(Vec<u16>),
    /// bfloat16 bit patterns.
    Bf16(Vec<u16>),
    /// MLX affine quantization, group 32: `weight` has `rows * cols * bits / 32`
    /// words, `scales` and `biases` (float16 bits) `rows * cols / 32` entries.
    Affine {
        bits: u32,
        weight: Vec<u32>,
        scales: Vec<u16>,
        biases: Vec<u16>,
    },
}

/// The group size of the exact mapping.
pub const GROUP: usize = 32;

/// The types this module can convert.
pub fn supported(kind: GgmlType) -> bool {
    kind.is_float() || candle_type(kind).is_some()
}

fn candle_type(kind: GgmlType) -> Option<GgmlDType> {
    use GgmlType::*;
    Some(match kind {
        Q4_0 => GgmlDType::Q4_0,
        Q4_1 => GgmlDType::Q4_1,
        Q5_0 => GgmlDType::Q5_0,
        Q5_1 => GgmlDType::Q5_1,
        Q8_0 => GgmlDType::Q8_0,
        Q8_1 => GgmlDType::Q8_1,
        Q2K => GgmlDType::Q2K,
        Q3K => GgmlDType::Q3K,
        Q4K => GgmlDType::Q4K,
        Q5K => GgmlDType::Q5K,
        Q6K => GgmlDType::Q6K,
        Q8K => GgmlDType::Q8K,
        _ => return None,
    })
}

/// The bits a quantized type is re-quantized to when it has no exact MLX
/// form: 4 for types of at most 5 bits per weight (`Q2_K`, `Q3_K`, `Q4_K`),
/// 8 for the rest (`Q5_0`, `Q5_1`, `Q5_K`, `Q6_K`, `Q8_1`, `Q8_K`), so no
/// tensor loses more than the file already lost; `None` for float types.
pub fn requant_bits(kind: GgmlType) -> Option<u32> {
    match kind {
        k if k.is_float() => None,
        GgmlType::Q4_0 | GgmlType::Q4_1 => Some(4),
        GgmlType::Q8_0 => Some(8),
        k if k.bits_per_weight() <= 5.0 => Some(4),
        _ => Some(8),
    }
}

/// Converts a tensor: `bytes` holding `elements` values of type `kind` (a
/// whole number of blocks, 8-byte aligned, as
/// [`crate::reader::GgufFile::read`] gives). A quantized `matrix` (rows of
/// `cols` values) becomes MLX affine data, exactly where the type allows;
/// anything else becomes float.
pub fn convert_tensor(
    kind: GgmlType,
    bytes: &[u8],
    elements: usize,
    cols: Option<usize>,
) -> Result<Data, String> {
    let Some(cols) = cols.filter(|&c| c % GROUP == 0 && !kind.is_float()) else {
        return convert(kind, bytes, elements, false);
    };
    match convert(kind, bytes, elements, true)? {
        Data::F32(values) => {
            let bits = requant_bits(kind).unwrap_or(8);
            debug_assert_eq!(values.len() % cols, 0);
            Ok(crate::requant::quantize(&values, bits))
        }
        data => Ok(data),
    }
}

/// Converts `bytes` holding `elements` values of type `kind`. `exact` picks
/// the bit-exact affine mapping where the type allows it; otherwise quantized
/// types come back dequantized as float32.
pub fn convert(kind: GgmlType, bytes: &[u8], elements: usize, exact: bool) -> Result<Data, String> {
    let (block, size) = kind.block();
    let expected = elements / block as usize * size as usize;
    if !elements.is_multiple_of(block as usize) || bytes.len() != expected {
        return Err(format!(
            "{} bytes do not hold {elements} {kind} values ({expected} bytes)",
            bytes.len()
        ));
    }
    match kind {
        GgmlType::F32 => Ok(Data::F32(bytemuck::pod_collect_to_vec(bytes))),
        GgmlType::F16 => Ok(Data::F16(bytemuck::pod_collect_to_vec(bytes))),
        GgmlType::Bf16 => Ok(Data::Bf16(bytemuck::pod_collect_to_vec(bytes))),
        GgmlType::Q4_0 if exact => Ok(repack_q4(bytes, 18, |_| -8.0)),
        GgmlType::Q4_1 if exact => Ok(repack_q4(bytes, 20, |b| {
            f16::from_bits(u16::from_le_bytes([b[2], b[3]])).to_f32()
        })),
        GgmlType::Q8_0 if exact => Ok(repack_q8_0(bytes)),
        other => {
            let Some(dtype) = candle_type(other) else {
                return Err(format!("GGML type {other} cannot be decoded"));
            };
            let blocks = dtype.from_data(Cow::Borrowed(bytes));
            match blocks.dequantize(elements) {
                Ok(CpuStorage::F32(v)) => Ok(Data::F32(v)),
                Ok(_) => Err(format!("decoding {other} gave no float32 values")),
                Err(e) => Err(format!("decoding {other}: {e}")),
            }
        }
    }
}

fn d_of(block: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32()
}

/// `Q4_0` (d, 16 bytes of nibbles) or `Q4_1` (d, m, nibbles): block element j
/// is the low nibble of byte j, element j + 16 its high nibble. `bias(block)`
/// gives m, or a multiple of d for `Q4_0` (passed as a negative factor).
fn repack_q4(bytes: &[u8], block_bytes: usize, bias: impl Fn(&[u8]) -> f32) -> Data {
    let blocks = bytes.len() / block_bytes;
    let mut weight = Vec::with_capacity(blocks * 4);
    let mut scales = Vec::with_capacity(blocks);
    let mut biases = Vec::with_capacity(blocks);
    for b in bytes.chunks_exact(block_bytes) {
        let d = d_of(b);
        let m = bias(b);
        // Q4_0 passes a factor of d (-8), Q4_1 the stored minimum.
        let m = if block_bytes == 18 { m * d } else { m };
        scales.push(f16::from_f32(d).to_bits());
        biases.push(f16::from_f32(m).to_bits());
        let qs = &b[block_bytes - 16..];
        let mut values = [0u8; 32];
        for j in 0..16 {
            values[j] = qs[j] & 0x0f;
            values[j + 16] = qs[j] >> 4;
        }
        for word in values.chunks_exact(8) {
            weight.push(
                word.iter()
                    .enumerate()
                    .fold(0u32, |w, (i, &q)| w | (u32::from(q) << (4 * i))),
            );
        }
    }
    Data::Affine {
        bits: 4,
        weight,
        scales,
        biases,
    }
}

/// `Q8_0` (d, 32 signed bytes): q + 128 as unsigned bytes, bias -128 d.
fn repack_q8_0(bytes: &[u8]) -> Data {
    let blocks = bytes.len() / 34;
    let mut weight = Vec::with_capacity(blocks * 8);
    let mut scales = Vec::with_capacity(blocks);
    let mut biases = Vec::with_capacity(blocks);
    for b in bytes.chunks_exact(34) {
        let d = d_of(b);
        scales.push(f16::from_f32(d).to_bits());
        biases.push(f16::from_f32(-128.0 * d).to_bits());
        for q in b[2..].chunks_exact(4) {
            // Two's complement q + 128 is q with its top bit flipped.
            weight.push(u32::from_le_bytes([
                q[0] ^ 0x80,
                q[1] ^ 0x80,
                q[2] ^ 0x80,
                q[3] ^ 0x80,
            ]));
        }
    }
    Data::Affine {
        bits: 8,
        weight,
        scales,
        biases,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dequantizes MLX affine data back to floats.
    fn unpack(data: &Data) -> Vec<f32> {
        let Data::Affine {
            bits,
            weight,
            scales,
            biases,
        } = data
        else {
            panic!("not affine")
        };
        let per_word = 32 / bits;
        let mask = (1u32 << bits) - 1;
        let mut out = Vec::new();
        for (i, w) in weight.iter().enumerate() {
            for k in 0..per_word {
                let q = (w >> (bits * k)) & mask;
                let g = (i * per_word as usize + k as usize) / GROUP;
                let s = f16::from_bits(scales[g]).to_f32();
                let b = f16::from_bits(biases[g]).to_f32();
                out.push(q as f32 * s + b);
            }
        }
        out
    }

    fn block_q4_0(d: f32, q: &[u8; 32]) -> Vec<u8> {
        let mut b = f16::from_f32(d).to_bits().to_le_bytes().to_vec();
        for j in 0..16 {
            b.push(q[j] | (q[j + 16] << 4));
        }
        b
    }

    #[test]
    fn exact_mappings_equal_candles_dequantization() {
        let mut q = [0u8; 32];
        for (i, v) in q.iter_mut().enumerate() {
            *v = ((i * 7 + 3) % 16) as u8;
        }
        let mut bytes = block_q4_0(0.125, &q);
        bytes.extend(block_q4_0(-0.5, &q));
        let exact = convert(GgmlType::Q4_0, &bytes, 64, true).unwrap();
        let Data::F32(reference) = convert(GgmlType::Q4_0, &bytes, 64, false).unwrap() else {
            panic!()
        };
        assert_eq!(unpack(&exact), reference);

        // Q4_1: d, m, nibbles.
        let mut b = Vec::new();
        b.extend(f16::from_f32(0.25).to_bits().to_le_bytes());
        b.extend(f16::from_f32(-1.5).to_bits().to_le_bytes());
        b.extend(&block_q4_0(0.0, &q)[2..]);
        let exact = convert(GgmlType::Q4_1, &b, 32, true).unwrap();
        let Data::F32(reference) = convert(GgmlType::Q4_1, &b, 32, false).unwrap() else {
            panic!()
        };
        assert_eq!(unpack(&exact), reference);

        // Q8_0: d, 32 signed bytes.
        let mut b = f16::from_f32(0.03).to_bits().to_le_bytes().to_vec();
        b.extend((0..32).map(|i: i32| ((i * 9 - 128) as i8) as u8));
        let exact = convert(GgmlType::Q8_0, &b, 32, true).unwrap();
        let Data::F32(reference) = convert(GgmlType::Q8_0, &b, 32, false).unwrap() else {
            panic!()
        };
        assert_eq!(unpack(&exact), reference);
    }

    #[test]
    fn wrong_sizes_are_errors() {
        assert!(convert(GgmlType::Q4_0, &[0u8; 17], 32, true).is_err());
        assert!(convert(GgmlType::Q4K, &[0u8; 144], 255, true).is_err());
        assert!(convert(GgmlType::Iq2Xxs, &[0u8; 66], 256, true).is_err());
    }
}
