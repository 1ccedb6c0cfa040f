//! The warm-up at load (`engine::warmup`): afterwards MLX holds only the
//! weights, as before it, and a generation gives the same tokens as one
//! without it. (On the CPU the runner skips it; `GROVE_WARMUP=1` runs it.)
mod common;
use common::fixture;

use grove_runner::engine::warmup;
use grove_runner::generate::{GenerateParams, generate};
use grove_runner::model;

fn settled_active() -> i64 {
    // SAFETY: waits on MLX's default stream; no arguments.
    assert_eq!(unsafe { mlx_sys::mlx_synchronize_default() }, 0);
    mlx_rs::memory::active_memory().expect("active memory") as i64
}

#[test]
fn warm_up_leaves_only_the_weights_and_changes_no_token() {
    let model = model::load(&fixture("qwen3-f32")).expect("load");
    let prompt: Vec<u32> = (0..40).map(|i| 5 + (i * 37 % 900) as u32).collect();
    let params = GenerateParams {
        max_tokens: 12,
        ..GenerateParams::default()
    };
    let before = settled_active();
    assert!(warmup::warm_up(&model).expect("warm up") > std::time::Duration::ZERO);
    let after = settled_active();
    assert!(
        after - before <= 64 * 1024,
        "the warm-up left {} bytes behind",
        after - before
    );
    let warm = generate(&model, &prompt, &[], &params, |_| {})
        .expect("generate")
        .tokens;
    let fresh = model::load(&fixture("qwen3-f32")).expect("load");
    let cold = generate(&fresh, &prompt, &[], &params, |_| {})
        .expect("generate")
        .tokens;
    assert_eq!(warm, cold);
    assert_eq!(warm.len(), 12);
    // The CPU runner skips it unless asked.
    if std::env::var_os("GROVE_WARMUP").is_none() {
        assert!(!warmup::wanted(true));
        assert!(warmup::wanted(false));
    }
}
