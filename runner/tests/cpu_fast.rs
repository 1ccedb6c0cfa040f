//! Grove's CPU primitives for MLX's `fast` ops (`model::layers::cpu_fast`)
//! against MLX's own ops on the CPU (their fallbacks), on random inputs:
//! - RMS norm with and without a weight, over contiguous and strided x;
//! - rotary embeddings at a uniform offset and per-row offsets, traditional
//!   and not, partial rotation (dims < head size), given frequencies and a
//!   position scale, over a transposed (strided) x as prompts pass it;
//! - attention: decode (1-3 queries, the row path) and prompts (the tiled
//!   path, with tails of the 4-query tiles and 64-query units), causal with
//!   and without earlier keys, no mask, boolean and additive mask arrays
//!   broadcast over heads, attention sinks, grouped-query heads, head sizes
//!   64/80/128 and a value size unlike the key's, keys and values as strided
//!   slices of a larger cache buffer, and batches.
//!
//! Only the order of float32 sums differs, so the results agree to float32
//! rounding. What a primitive does not cover is left to MLX (`None`).
use mlx_rs::fast::{self, ScaledDotProductAttentionMask as Mask};
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{Array, Dtype};

use grove_runner::model::layers::cpu_fast;

fn max_abs(a: &Array) -> f32 {
    a.abs().unwrap().max(None).unwrap().item_cast::<f32>()
}

fn normal(shape: &[i32], seed: u64) -> Array {
    let key = mlx_rs::random::key(seed).unwrap();
    mlx_rs::random::normal::<f32>(shape, None, None, &key).unwrap()
}

/// `ours` equals `mlx` within `bound` of mlx's largest magnitude.
fn close(what: &str, ours: &Array, mlx: &Array, bound: f32) {
    assert_eq!(ours.shape(), mlx.shape(), "{what}: shape");
    assert_eq!(ours.dtype(), Dtype::Float32, "{what}: dtype");
    let scale = max_abs(mlx).max(1e-6);
    let err = max_abs(&ours.subtract(mlx).unwrap()) / scale;
    assert!(
        err.is_finite() && err <= bound,
        "{what}: max error {err:.2e} over {bound:.1e}"
    );
}

#[test]
fn rms_norm_matches_mlx() {
    for (shape, weight, strided) in [
        (vec![1, 1, 576], true, false),
        (vec![3, 7, 64], true, false),
        (vec![2, 5, 100], false, false),
        (vec![9, 33], true, true),
    ] {
        let n = *shape.last().unwrap();
        let x = if strided {
            let mut s = shape.clone();
            s.reverse();
            normal(&s, 1).t()
        } else {
            normal(&shape, 1)
        };
        let w = normal(&[n], 2);
        let w = weight.then_some(&w);
        let what = format!(
            "rms_norm {shape:?} weight {} strided {strided}",
            w.is_some()
        );
        let ours = cpu_fast::rms_norm_always(&x, w, 1e-5)
            .unwrap_or_else(|| panic!("{what}: not covered"))
            .unwrap();
        close(&what, &ours, &fast::rms_norm(&x, w, 1e-5).unwrap(), 2e-6);
    }
    // Half precision is MLX's.
    let x = normal(&[2, 8], 3).as_dtype(Dtype::Float16).unwrap();
    assert!(cpu_fast::rms_norm_always(&x, None, 1e-5).is_none());
}

#[test]
fn rope_matches_mlx() {
    let freqs = normal(&[16], 4)
        .abs()
        .unwrap()
        .add(Array::from_f32(1.0))
        .unwrap();
    // (shape [B, H, L, D], dims, traditional, scale, offset, freqs, transposed)
    type Case = (Vec<i32>, i32, bool, f32, i32, bool, bool);
    let cases: Vec<Case> = vec![
        (vec![1, 9, 1, 64], 64, false, 1.0, 127, false, false),
        (vec![1, 3, 17, 64], 64, false, 1.0, 5, false, true),
        (vec![2, 4, 6, 64], 64, true, 0.5, 0, false, true),
        (vec![1, 2, 5, 64], 32, false, 1.0, 300, true, false),
        (vec![1, 2, 3, 48], 32, true, 1.0, 9, true, true),
    ];
    for (shape, dims, trad, scale, offset, with_freqs, transposed) in cases {
        let what = format!(
            "rope {shape:?} dims {dims} traditional {trad} scale {scale} offset {offset} \
             freqs {with_freqs} transposed {transposed}"
        );
        let x = if transposed {
            let (b, h, l, d) = (shape[0], shape[1], shape[2], shape[3]);
            normal(&[b, l, h, d], 5)
                .transpose_axes(&[0, 2, 1, 3])
                .unwrap()
        } else {
            normal(&shape, 5)
        };
        let f = with_freqs.then(|| freqs.try_index(..dims / 2).unwrap());
        let base = (!with_freqs).then_some(10_000.0);
        let inv = cpu_fast::inverse_frequencies(dims, base, f.as_ref()).unwrap();
        let ours = cpu_fast::rope(&x, dims, trad, scale, &Array::from_int(offset), &inv)
            .unwrap_or_else(|| panic!("{what}: not covered"))
            .unwrap();
        let mlx = fast::rope(&x, dims, trad, base, scale, offset, f.as_ref()).unwrap();
        close(&what, &ours, &mlx, 2e-6);
    }
    // One offset per batch row.
    let x = normal(&[3, 2, 1, 64], 6);
    let offsets = Array::from_slice(&[4i32, 0, 1000], &[3]);
    let inv = cpu_fast::inverse_frequencies(64, Some(10_000.0), None).unwrap();
    let ours = cpu_fast::rope(&x, 64, false, 1.0, &offsets, &inv)
        .unwrap()
        .unwrap();
    let mlx = fast::rope_dynamic(&x, 64, false, 10_000.0, 1.0, &offsets, None).unwrap();
    close("rope per-row offsets", &ours, &mlx, 2e-6);
}

#[derive(Clone, Copy, Debug)]
enum M {
    None,
    Causal,
    Bool,
    Add,
    /// Causal within a sliding window of 20 keys (Gemma's local layers).
    Window,
    /// The padding mask with query 0 seeing no key at all.
    NoKeys,
}

struct Attn {
    b: i32,
    hq: i32,
    hkv: i32,
    lq: i32,
    lk: i32,
    d: i32,
    dv: i32,
    mask: M,
    sinks: bool,
    /// Keys and values as the first `lk` positions of a longer buffer.
    sliced: bool,
}

fn check_attention(c: &Attn, seed: u64) {
    let what = format!(
        "attention B{} Hq{} Hkv{} Lq{} Lk{} D{} Dv{} {:?} sinks {} sliced {}",
        c.b, c.hq, c.hkv, c.lq, c.lk, c.d, c.dv, c.mask, c.sinks, c.sliced
    );
    let q = normal(&[c.b, c.hq, c.lq, c.d], seed);
    let cap = if c.sliced { c.lk + 29 } else { c.lk };
    let k = normal(&[c.b, c.hkv, cap, c.d], seed + 1);
    let v = normal(&[c.b, c.hkv, cap, c.dv], seed + 2);
    let (k, v) = if c.sliced {
        (
            k.try_index((.., .., ..c.lk, ..)).unwrap(),
            v.try_index((.., .., ..c.lk, ..)).unwrap(),
        )
    } else {
        (k, v)
    };
    // A padding-style mask: batch row r hides its first r keys (and every
    // row keeps its last key), broadcast over heads.
    let allowed = {
        let j = Array::arange::<_, i32>(None, c.lk, None)
            .unwrap()
            .reshape(&[1, 1, 1, -1])
            .unwrap();
        let r = Array::arange::<_, i32>(None, c.b, None)
            .unwrap()
            .reshape(&[-1, 1, 1, 1])
            .unwrap();
        let last = Array::from_int(c.lk - 1);
        j.ge(&r).unwrap().logical_or(j.eq(&last).unwrap()).unwrap()
    };
    let additive = normal(&[c.lq, c.lk], seed + 3);
    let window = {
        let i = Array::arange::<_, i32>(c.lk - c.lq, c.lk, None)
            .unwrap()
            .reshape(&[-1, 1])
            .unwrap();
        let j = Array::arange::<_, i32>(None, c.lk, None)
            .unwrap()
            .reshape(&[1, -1])
            .unwrap();
        let near = j.gt(i.subtract(Array::from_int(20)).unwrap()).unwrap();
        j.le(&i).unwrap().logical_and(&near).unwrap()
    };
    let no_keys = {
        let row = Array::arange::<_, i32>(None, c.lq, None)
            .unwrap()
            .reshape(&[1, 1, -1, 1])
            .unwrap();
        allowed
            .logical_and(row.gt(Array::from_int(0)).unwrap())
            .unwrap()
    };
    let sinks = normal(&[c.hq], seed + 4);
    let sinks = c.sinks.then_some(&sinks);
    let mask = |m: M| match m {
        M::None => None,
        M::Causal => Some(Mask::Causal),
        M::Bool => Some(Mask::Array(&allowed)),
        M::Add => Some(Mask::Array(&additive)),
        M::Window => Some(Mask::Array(&window)),
        M::NoKeys => Some(Mask::Array(&no_keys)),
    };
    let scale = (c.d as f32).powf(-0.5);
    let ours = cpu_fast::sdpa_always(&q, &k, &v, scale, mask(c.mask), sinks)
        .unwrap_or_else(|| panic!("{what}: not covered"))
        .unwrap();
    let mlx = fast::scaled_dot_product_attention(&q, &k, &v, scale, mask(c.mask), sinks).unwrap();
    close(&what, &ours, &mlx, 1e-5);
}

#[test]
fn attention_matches_mlx() {
    // (B, Hq, Hkv, Lq, Lk, D, Dv, mask, sinks, sliced)
    #[rustfmt::skip]
    let cases = [
        // Decode: one to three queries over caches of several lengths.
        (1, 9, 3, 1, 1, 64, 64, M::None, false, true),
        (1, 9, 3, 1, 7, 64, 64, M::None, false, true),
        (1, 9, 3, 1, 16, 64, 64, M::None, false, true),
        (1, 9, 3, 1, 129, 64, 64, M::None, false, true),
        (1, 9, 3, 1, 300, 64, 64, M::None, false, true),
        (1, 9, 3, 2, 40, 64, 64, M::Causal, false, false),
        (1, 4, 4, 3, 3, 64, 64, M::Causal, false, false),
        (3, 9, 3, 1, 50, 64, 64, M::Bool, false, false),
        (1, 8, 1, 1, 33, 64, 64, M::None, true, false),
        // Prompts: the tiled path, causal from the start and after earlier keys.
        (1, 9, 3, 70, 70, 64, 64, M::Causal, false, false),
        (1, 9, 3, 37, 100, 64, 64, M::Causal, false, true),
        (1, 2, 2, 130, 130, 128, 128, M::Causal, false, false),
        (1, 9, 3, 5, 5, 80, 80, M::None, false, false),
        (1, 4, 2, 9, 21, 64, 64, M::Add, false, false),
        (2, 9, 3, 6, 18, 64, 64, M::Bool, false, false),
        (1, 8, 2, 12, 12, 64, 64, M::Causal, true, false),
        (1, 9, 3, 8, 8, 64, 32, M::Causal, false, false),
        (1, 4, 1, 100, 100, 64, 64, M::Window, false, false),
        (1, 4, 2, 40, 140, 64, 64, M::Window, true, true),
        (2, 9, 3, 9, 30, 64, 64, M::NoKeys, false, false),
    ];
    for (i, (b, hq, hkv, lq, lk, d, dv, mask, sinks, sliced)) in cases.into_iter().enumerate() {
        let c = Attn {
            b,
            hq,
            hkv,
            lq,
            lk,
            d,
            dv,
            mask,
            sinks,
            sliced,
        };
        check_attention(&c, 10 * (i as u64 + 1));
    }
}

#[test]
fn attention_leaves_the_rest_to_mlx() {
    let q = normal(&[1, 2, 1, 64], 1);
    let k = normal(&[1, 2, 4, 64], 2);
    // Half precision, a head size not a multiple of 8, more queries than keys
    // under a causal mask: MLX's.
    let h = |a: &Array| a.as_dtype(Dtype::Float16).unwrap();
    assert!(cpu_fast::sdpa_always(&h(&q), &h(&k), &h(&k), 1.0, None, None).is_none());
    let q6 = normal(&[1, 2, 1, 6], 3);
    let k6 = normal(&[1, 2, 4, 6], 4);
    assert!(cpu_fast::sdpa_always(&q6, &k6, &k6, 1.0, None, None).is_none());
    let q5 = normal(&[1, 2, 5, 64], 5);
    assert!(cpu_fast::sdpa_always(&q5, &k, &k, 1.0, Some(Mask::Causal), None).is_none());
}

#[test]
fn gated_activations_match_mlx() {
    use grove_runner::model::layers::mlp::{Activation, gelu_approx};
    // Lengths with and without a vector tail, one over a thread's chunk, and
    // a strided gate (half of a fused gate_up).
    for (shape, strided) in [
        (vec![1, 1, 1536], false),
        (vec![2, 3, 37], false),
        (vec![1, 9, 2048], false),
        (vec![4, 70], true),
    ] {
        let (gate, up) = if strided {
            let mut s = shape.clone();
            *s.last_mut().unwrap() *= 2;
            let both = normal(&s, 7).multiply(Array::from_f32(4.0)).unwrap();
            let parts = mlx_rs::ops::split_equal(&both, 2, -1).unwrap();
            (parts[0].clone(), parts[1].clone())
        } else {
            (
                normal(&shape, 7).multiply(Array::from_f32(4.0)).unwrap(),
                normal(&shape, 8),
            )
        };
        let silu = gate
            .multiply(mlx_rs::ops::sigmoid(&gate).unwrap())
            .unwrap()
            .multiply(&up)
            .unwrap();
        let gelu = gelu_approx(&gate).unwrap().multiply(&up).unwrap();
        for (act, mlx) in [(Activation::Silu, silu), (Activation::GeluApprox, gelu)] {
            let what = format!("{act:?} {shape:?} strided {strided}");
            let ours = cpu_fast::gated_always(act, &gate, &up)
                .unwrap_or_else(|| panic!("{what}: not covered"))
                .unwrap();
            close(&what, &ours, &mlx, 1e-6);
        }
    }
    let g = normal(&[4], 1);
    assert!(cpu_fast::gated_always(Activation::SwigluOai, &g, &g).is_none());
}
