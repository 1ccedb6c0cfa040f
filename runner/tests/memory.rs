//! Pin/sweep: after every prefill chunk and decode step, and after every
//! request, MLX's active memory is the weights plus the KV buffers plus a small
//! constant (the in-flight token), and it stays flat across requests.
mod common;
use common::fixture;
use std::cell::Cell;

use grove_runner::cache::LayerKv;
use grove_runner::engine::prompt_cache::PromptCache;
use grove_runner::generate::{GenerateParams, Limits, Stage, generate_cached};
use grove_runner::model;

/// Most bytes MLX may hold beyond weights and KV buffers at a checkpoint.
const SLACK: i64 = 64 * 1024;

/// What "flat across requests" allows between the first and the last ones.
/// The settled read sometimes counts a few small arrays more for one request
/// and not the next: on the recurrent fixture every request read 1564 bytes
/// but one that read 5404 (1 of 16 runs, two at a time; 2460 at most in 1 of
/// 5 runs alone), and CI once failed on 1564 -> 5404 when the last window's
/// most was compared. So its least is, as the batched test does: a leak
/// raises the floor. A leak of 34 bytes or more per request exceeds the
/// allowance: it lifts the last window's least above the first window's
/// most by at least 31 requests' worth.
const JITTER: i64 = 1024;

/// MLX's memory counters are per process: the tests take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// MLX's active bytes once all queued work has finished.
fn settled_active() -> i64 {
    // SAFETY: waits on MLX's default stream; no arguments.
    let rc = unsafe { mlx_sys::mlx_synchronize_default() };
    assert_eq!(rc, 0, "mlx_synchronize_default failed");
    mlx_rs::memory::active_memory().expect("active memory") as i64
}

fn kv_bytes(caches: &[LayerKv]) -> i64 {
    caches.iter().map(LayerKv::nbytes).sum::<usize>() as i64
}

#[test]
fn active_memory_is_weights_plus_kv_plus_a_constant() {
    active_invariant("qwen3-f32");
}

/// The same with recurrent layers: their states (and the convolution's last
/// inputs, which must not keep a view of the whole chunk alive) count as KV.
#[test]
fn active_memory_invariant_holds_with_recurrent_layers() {
    active_invariant("qwen3-next-f32");
}

fn active_invariant(name: &str) {
    let _turn = alone();
    let model = model::load(&fixture(name)).expect("load");
    let weights = model.weight_bytes as i64;
    let eos: Vec<u32> = Vec::new(); // no EOS: every request runs to its limit
    let mut cache = PromptCache::new(model.kinds());
    let worst = Cell::new(i64::MIN);
    let checks = Cell::new(0usize);
    let inspect = |_stage: Stage, caches: &[LayerKv]| {
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
        let reused = cache.reuse_for(&prompt, None);
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
    // Flat: the last requests' floor is no higher than the first ones'
    // most, give or take JITTER.
    let first = after[..10].iter().max().copied().unwrap_or(0);
    let last = after[40..].iter().min().copied().unwrap_or(0);
    assert!(
        last <= first + JITTER,
        "memory beyond weights + KV grew across requests: {first} -> {last} ({after:?})"
    );
    eprintln!(
        "memory invariant: weights {weights} B; worst slack during steps {} B, after requests {:?} B",
        worst.get(),
        (after.iter().min(), after.iter().max())
    );
}

/// The same invariant under continuous batching: after every prefill chunk
/// and decode step of the engine, MLX holds the weights, the KV buffers of
/// the prompt cache, the batch and the prefilling sequences, and a small
/// constant; after each of 50 rounds of 8 concurrent requests (joining and
/// leaving at different steps) memory is back to weights + entry, flat.
#[test]
fn batched_memory_is_weights_plus_kv_plus_a_constant() {
    batched_invariant("qwen3-f32");
}

/// The same with experts (a mixture of experts' sorted gather matmuls).
#[test]
fn batched_memory_invariant_holds_with_experts() {
    batched_invariant("qwen3-moe-f32");
}

/// The same with recurrent layers, whose states and checkpoints count as KV.
/// Within a step the slack is larger, as with a quantized cache: in a
/// process of its own (each test has one under cargo-nextest) the worst
/// step held 73,228 and 76,056 bytes in two runs, with the convolution's and
/// the delta-net's per-row buffers rebuilt for the batch; when idle it is
/// held to SLACK after every round, so it does not grow across requests.
#[test]
fn batched_memory_invariant_holds_with_recurrent_layers() {
    batched_invariant_with("qwen3-next-f32", None, 2 * SLACK, false);
}

fn batched_invariant(name: &str) {
    batched_invariant_with(name, None, SLACK, false);
}

/// Structured output: half the rows constrained to a JSON object (a token
/// mask per step, the grammar on the host); the masks are gone after each
/// step like every other temporary.
#[test]
fn batched_memory_invariant_holds_with_structured_output() {
    batched_invariant_with("qwen3-f32", None, SLACK, true);
}

/// A quantized KV cache: its packed planes are all that stays. Within a
/// step the slack is larger (measured up to ~68 KB on this fixture, 0 when
/// idle): each row and layer holds six buffers, the scales and biases small
/// ones, and MLX's allocator counts more than their bytes while the batch's
/// buffers are rebuilt; it does not grow across rounds (checked below).
#[test]
fn batched_memory_invariant_holds_with_a_quantized_cache() {
    let quant = grove_runner::cache::KvQuant::new(4, 64).expect("q4");
    batched_invariant_with(
        "llama-kv-f32",
        Some(grove_runner::cache::KvSetting { quant, start: 0 }),
        2 * SLACK,
        false,
    );
}

fn batched_invariant_with(
    name: &str,
    kv: Option<grove_runner::cache::KvSetting>,
    step_slack: i64,
    constrained: bool,
) {
    let _turn = alone();
    use grove_runner::engine::{Engine, EngineConfig, Event, Job, LoadState};
    use std::sync::{Arc, Mutex};

    let dir = fixture(name);
    let weights = model::load(&dir).expect("load").weight_bytes as i64;
    // (checks, worst slack) seen by the inspector on the engine thread.
    let seen = Arc::new(Mutex::new((0usize, i64::MIN)));
    let inspector = {
        let seen = seen.clone();
        Box::new(move |arrays: &[&mlx_rs::Array]| {
            let kv: i64 = arrays.iter().map(|a| a.nbytes() as i64).sum();
            let slack = settled_active() - weights - kv;
            if let Ok(mut s) = seen.lock() {
                s.0 += 1;
                s.1 = s.1.max(slack);
            }
        })
    };
    let config = EngineConfig {
        model_dir: dir,
        context_length: None,
        prefill_chunk: 64,
        queue: 64,
        num_parallel: Some(8),
        kv_capacity: None,
        cpu_dtypes: Default::default(),
        kv,
        disk: None,
        shard: None,
    };
    let (engine, thread) = Engine::spawn_inspected(config, Some(inspector)).expect("spawn");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let job = |prompt: Vec<u32>, max_tokens: usize| Job {
        input: prompt,
        params: GenerateParams {
            prefill_chunk: 64,
            ..GenerateParams::default()
        },
        max_tokens,
        num_ctx: 0,
        stop: Vec::new(),
        kv: Default::default(),
        grammar: None,
        logprobs: None,
    };
    let mut after = Vec::new();
    rt.block_on(async {
        while engine.snapshot().state == LoadState::Loading {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let parts = engine.chat_parts().await.expect("chat parts");
        for round in 0..50u32 {
            let mut streams = Vec::new();
            for i in 0..8u32 {
                let len = 10 + (round * 7 + i * 23) % 150;
                let first = if (round + i) % 3 == 0 { 7 } else { 9 };
                let prompt: Vec<u32> = std::iter::once(first)
                    .chain((1..len).map(|k| 5 + (k * 17 + round + i) % 1000))
                    .collect();
                let max = 4 + ((round + i * 5) % 20) as usize;
                let mut job = job(prompt, max);
                if constrained && i % 2 == 0 {
                    let c = grove_runner::grammar::Constraint::JsonObject;
                    job.grammar = Some(parts.compile(&c).expect("a JSON object grammar"));
                }
                streams.push(engine.generate(job).expect("submit"));
            }
            for mut events in streams {
                loop {
                    match events.recv().await {
                        Some(Event::Done { .. }) => break,
                        Some(Event::Error(e)) => panic!("round {round}: {e}"),
                        Some(_) => {}
                        None => panic!("round {round}: the stream ended without Done"),
                    }
                }
            }
            // Idle again: the engine publishes settled figures before it waits.
            let mut snap = engine.snapshot();
            for _ in 0..2500 {
                if snap.activity == grove_runner::engine::Activity::Idle {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                snap = engine.snapshot();
            }
            assert_eq!(snap.activity, grove_runner::engine::Activity::Idle);
            let slack = snap.memory.mlx_active as i64 - weights - snap.memory.kv_bytes as i64;
            assert!(
                slack <= SLACK,
                "round {round}: MLX holds {slack} bytes beyond weights and KV when idle"
            );
            after.push(slack);
        }
    });
    engine.stop();
    drop(engine);
    thread.join().expect("engine thread");
    let (checks, worst) = *seen.lock().expect("lock");
    assert!(checks > 50 * 8, "only {checks} steps were inspected");
    assert!(
        worst <= step_slack,
        "during a step MLX held {worst} bytes beyond weights and KV"
    );
    // A leak raises the floor: the last rounds' least slack is no more
    // than the first rounds' most (small buffers come and go, multiples of
    // 512 B, with a quantized cache's scales and biases).
    let first = after[..10].iter().max().copied().unwrap_or(0);
    let last = after[40..].iter().min().copied().unwrap_or(0);
    assert!(
        last <= first,
        "memory beyond weights + KV grew across rounds: {first} -> {last} ({after:?})"
    );
    eprintln!(
        "{name}: batched memory invariant: {checks} steps, worst slack {worst} B; idle after rounds {:?} B",
        (after.iter().min(), after.iter().max())
    );
}
