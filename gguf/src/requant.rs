//! Re-quantizing dequantized ggml weights to MLX affine quantization, group 32.
//!
//! Each group of 32 gets scale = (max - min) / (2^bits - 1) and bias = min
//! (both float16, as GGUF's own scales are), and q = round((x - bias) / scale).
//! Unlike `mx.quantize`, which moves the grid so that zero is exact, this keeps
//! the group's own range: ggml's blocks of 32 are themselves such grids
//! (`Q4_K`'s sub-blocks are d*sc*q - dmin*m), so a block that uses its whole
//! range comes back on its original values.
use half::f16;

use crate::blocks::{Data, GROUP};

/// Quantizes `values` (a whole number of groups) to `bits` (4 or 8).
pub fn quantize(values: &[f32], bits: u32) -> Data {
    let levels = ((1u32 << bits) - 1) as f32;
    let per_word = (32 / bits) as usize;
    let groups = values.len() / GROUP;
    let mut weight = Vec::with_capacity(values.len() / per_word);
    let mut scales = Vec::with_capacity(groups);
    let mut biases = Vec::with_capacity(groups);
    for group in values.chunks_exact(GROUP) {
        let (lo, hi) = group
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
        let bias = f16::from_f32(lo);
        let scale = f16::from_f32((hi - lo) / levels);
        let (b, s) = (bias.to_f32(), scale.to_f32());
        scales.push(scale.to_bits());
        biases.push(bias.to_bits());
        for word in group.chunks_exact(per_word) {
            let mut w = 0u32;
            for (i, &x) in word.iter().enumerate() {
                let q = if s > 0.0 {
                    ((x - b) / s).round().clamp(0.0, levels) as u32
                } else {
                    0
                };
                w |= q << (bits as usize * i);
            }
            weight.push(w);
        }
    }
    Data::Affine {
        bits,
        weight,
        scales,
        biases,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_range_grid_comes_back_exactly() {
        // A Q4_K-like sub-block: d*sc*q - dmin*m over q = 0..15.
        let (step, min) = (0.0625f32, -0.5f32);
        let values: Vec<f32> = (0..32)
            .map(|i| min + step * ((i * 5) % 16) as f32)
            .collect();
        let Data::Affine {
            weight,
            scales,
            biases,
            ..
        } = quantize(&values, 4)
        else {
            panic!()
        };
        let (s, b) = (
            f16::from_bits(scales[0]).to_f32(),
            f16::from_bits(biases[0]).to_f32(),
        );
        for (i, &x) in values.iter().enumerate() {
            let q = (weight[i / 8] >> (4 * (i % 8))) & 15;
            assert_eq!(q as f32 * s + b, x);
        }
    }

    #[test]
    fn constant_groups_and_8_bits() {
        let values = vec![0.75f32; 32];
        let Data::Affine { weight, .. } = quantize(&values, 8) else {
            panic!()
        };
        assert_eq!(weight, vec![0u32; 8]);
    }
}
