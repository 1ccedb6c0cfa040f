//! Tests of [`super::Decoder::fast_parts`]: which arrays the CUDA decode step
//! would be handed, layer by layer, for the fixture models (the step itself
//! runs only on a CUDA GPU: tests/bench/gpu_decode_check.sh).
use std::path::{Path, PathBuf};

use super::*;
use crate::model::Network;
use crate::model::layers::cuda_decode::DecodeMat;

/// `$GROVE_FIXTURES`, else `.grove/fixtures` in the repository.
fn fixture(name: &str) -> PathBuf {
    let dir = match std::env::var_os("GROVE_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.grove/fixtures"),
    };
    dir.join(name)
}

fn decoder(model: &crate::model::Model) -> &Decoder {
    match &model.decoder {
        Network::Decoder(d) => d,
        _ => panic!("not a plain decoder"),
    }
}

/// The weight array a matrix hands over.
fn weight<'a>(m: &DecodeMat<'a>) -> &'a mlx_rs::Array {
    match *m {
        DecodeMat::Affine { weight, .. } | DecodeMat::Dense(weight) => weight,
    }
}

/// Whether `m` hands over `array` itself (not a copy, not another one).
fn is(m: &DecodeMat<'_>, array: &mlx_rs::Array) -> bool {
    std::ptr::eq(weight(m), array)
}

#[test]
fn qwen3_moe_hands_over_its_router_and_stacked_experts() {
    let model = crate::model::load(&fixture("qwen3-moe-q4")).expect("load qwen3-moe-q4");
    let d = decoder(&model);
    let parts = d.fast_parts().expect("qwen3-moe-q4 is covered");
    // The fixture: 3 layers, the middle one dense (mlp_only_layers [1]),
    // 8 experts of 64, 2 a token, renormalised, quantized (weight, scales,
    // biases per matrix: the router, then gate, up, down stacked).
    assert_eq!(parts.layers.len(), 3);
    for (i, layer) in parts.layers.iter().enumerate() {
        match (&layer.mlp, &d.blocks[i].mlp) {
            (FastMlp::Dense(g, u, dn), FeedForward::Dense(m)) => {
                assert_eq!(i, 1);
                let p = m.parameters();
                assert!(
                    is(g, p[0]) && is(u, p[3]) && is(dn, p[6]),
                    "layer {i}: gate, up, down"
                );
            }
            (FastMlp::Experts(e), FeedForward::Sparse(m)) => {
                assert_ne!(i, 1);
                assert_eq!(
                    (e.shape.experts, e.shape.top_k, e.shape.intermediate),
                    (8, 2, 64)
                );
                assert!(e.shape.normalize);
                let p = m.parameters();
                assert!(is(&e.router, p[0]), "layer {i}: router");
                assert!(is(&e.gate, p[3]), "layer {i}: gate");
                assert!(is(&e.up, p[6]), "layer {i}: up");
                assert!(is(&e.down, p[9]), "layer {i}: down");
                assert_eq!(weight(&e.gate).shape()[0], 8, "layer {i}: experts stacked");
            }
            _ => panic!("layer {i}: the wrong kind of feed-forward part"),
        }
    }
}

#[test]
fn dense_llama_layers_hand_over_gate_up_down() {
    let model = crate::model::load(&fixture("llama-q4")).expect("load llama-q4");
    let d = decoder(&model);
    let parts = d.fast_parts().expect("llama-q4 is covered");
    assert_eq!(parts.layers.len(), d.blocks.len());
    for (i, (layer, block)) in parts.layers.iter().zip(&d.blocks).enumerate() {
        let (FastMlp::Dense(g, u, dn), FeedForward::Dense(m)) = (&layer.mlp, &block.mlp) else {
            panic!("layer {i}: a dense model's layer handed over experts");
        };
        let p = m.parameters();
        assert!(
            is(g, p[0]) && is(u, p[3]) && is(dn, p[6]),
            "layer {i}: gate, up, down"
        );
    }
}

#[test]
fn experts_the_step_does_not_cover_are_left_to_mlx() {
    // Float experts, and nvfp4 ones (not MLX's affine mode).
    for name in ["qwen3-moe-f32", "qwen3-moe-nvfp4"] {
        let model =
            crate::model::load(&fixture(name)).unwrap_or_else(|e| panic!("load {name}: {e}"));
        assert!(
            decoder(&model).fast_parts().is_none(),
            "{name} was handed to the step"
        );
    }
}
