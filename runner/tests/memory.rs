//! Pin/sweep: after every prefill chunk and decode step, and after every
//! request, MLX's active memory is the weights plus the KV buffers plus a small
//! constant (the in-flight token), and it stays flat across requests.
use std::cell::Cell;
use std::path::PathBuf;

use grove_runner::cache::KvCache;
use grove_runner::engine::prompt_cache::PromptCache;
use grove_runner::generate::{GenerateParams, Limits, Stage, generate_cached};
use grove_runner::model;

/// Most bytes MLX may hold beyond weights and KV buffers at a checkpoint.
const SLACK: i64 = 64 * 1024;

fn fixture(name: &str) -> PathBuf {
    let root = std::env::var_os("GROVE_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.grove/fixtures"));
    let dir = root.join(name);
    assert!(
        dir.join("config.json").is_file(),
        "fixture {} is missing (make fixtures)",
        dir.display()
    );
    dir
}

/// MLX's active bytes once all queued work has finished.
fn settled_active() -> i64 {
    // SAFETY: waits on MLX's default stream; no arguments.
    let rc = unsafe { mlx_sys::mlx_synchronize_default() };
    assert_eq!(rc, 0, "mlx_synchronize_default failed");
    mlx_rs::memory::active_memory().expect("active memory") as i64
}

fn kv_bytes(caches: &[KvCache]) -> i64 {
    caches.iter().map(KvCache::nbytes).sum::<usize>() as i64
}

#[test]
fn active_memory_is_weights_plus_kv_plus_a_constant() {
    let model = model::load(&fixture("qwen3-f32")).expect("load");
    let weights = model.weight_bytes as i64;
    let eos: Vec<u32> = Vec::new(); // no EOS: every request runs to its limit
    let mut cache = PromptCache::new(model.decoder.num_layers());
    let worst = Cell::new(i64::MIN);
    let checks = Cell::new(0usize);
    let inspect = |_stage: Stage, caches: &[KvCache]| {
        let slack = settled_active() - weights - kv_bytes(caches);
        assert!(
            slack <= SLACK,
            "MLX holds {slack} bytes beyond weights and KV"
        );
        worst.set(worst.get().max(slack));
        checks.set(checks.get() + 1);
    };
    let limits = Limits {
        context: 4096,
        cancelled: &|| false,
        inspect: Some(&inspect),
    };
    let params = |max_tokens| GenerateParams {
        max_tokens,
        prefill_chunk: 64,
        ..GenerateParams::default()
    };

    // 100 decode steps after a 300-token prompt prefilled in chunks of 64.
    let prompt: Vec<u32> = (0..300).map(|i| 5 + (i * 31 % 1000) as u32).collect();
    let out = generate_cached(
        &model,
        cache.layers_mut(),
        0,
        &prompt,
        &eos,
        &params(100),
        &limits,
        |_| grove_runner::generate::Flow::Continue,
    )
    .expect("generate");
    assert_eq!(out.tokens.len(), 100);
    assert_eq!(
        checks.get(),
        5 + 100,
        "5 prefill chunks (299 tokens by 64) and 100 steps were checked"
    );
    cache.commit(prompt.iter().copied().chain(out.tokens.iter().copied()));

    // 50 requests: alternating conversations, so the entry is trimmed, reused
    // and replaced. After each, memory is exactly weights + KV + the constant.
    let mut after = Vec::new();
    for r in 0..50u32 {
        let len = 40 + (r % 5) * 30;
        let first = if r % 2 == 0 { 7 } else { 9 };
        let prompt: Vec<u32> = std::iter::once(first)
            .chain((1..len).map(|i| 5 + (i * 17 + r) % 1000))
            .collect();
        let reused = cache.reuse_for(&prompt);
        let out = generate_cached(
            &model,
            cache.layers_mut(),
            reused,
            &prompt,
            &eos,
            &params(8),
            &limits,
            |_| grove_runner::generate::Flow::Continue,
        )
        .expect("generate");
        cache.commit(prompt.iter().copied().chain(out.tokens.iter().copied()));
        mlx_rs::memory::clear_cache().expect("clear cache");
        let slack = settled_active() - weights - cache.nbytes() as i64;
        assert!(
            slack <= SLACK,
            "request {r}: MLX holds {slack} bytes beyond weights and KV"
        );
        after.push(slack);
    }
    // Flat: the last requests hold no more than the first ones.
    let first = after[..10].iter().max().copied().unwrap_or(0);
    let last = after[40..].iter().max().copied().unwrap_or(0);
    assert!(
        last <= first,
        "memory beyond weights + KV grew across requests: {first} -> {last}"
    );
    eprintln!(
        "memory invariant: weights {weights} B; worst slack during steps {} B, after requests {:?} B",
        worst.get(),
        (after.iter().min(), after.iter().max())
    );
}
