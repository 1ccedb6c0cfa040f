//! The batched forward pass against each sequence alone: sequences of
//! different lengths, left-padded into one [`BatchKvCache`] per layer, give
//! the logits they give one at a time, step after step, while sequences join
//! and leave; and prompts prefilled together, left-padded, give the logits
//! each gives alone.
mod common;
use common::fixture;

use grove_runner::cache::{BatchKvCache, CacheKind, LayerKv};
use grove_runner::model::{self, Model};
use mlx_rs::Array;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::transforms::eval;

/// Largest difference allowed between a row's logits batched and alone.
const TOLERANCE: f32 = 1e-4;

fn read(a: &Array) -> Vec<f32> {
    let a = a
        .as_dtype(mlx_rs::Dtype::Float32)
        .unwrap()
        .flatten(None, None)
        .unwrap();
    eval([&a]).unwrap();
    a.as_slice::<f32>().to_vec()
}

/// Last-position logits of `tokens` (`[B, L]`) through `caches`, `[B, V]`.
fn logits<C: grove_runner::cache::LayerCache>(
    model: &Model,
    tokens: &Array,
    caches: &mut [C],
) -> Array {
    let hidden = model.decoder.forward(tokens, caches).unwrap();
    let last = hidden.try_index((.., -1, ..)).unwrap();
    model.decoder.logits(&last).unwrap()
}

/// One sequence alone: its caches and its greedy continuation.
struct Alone {
    caches: Vec<LayerKv>,
    next: u32,
}

impl Alone {
    fn prefill(model: &Model, prompt: &[u32]) -> (Self, Vec<f32>) {
        let mut caches: Vec<LayerKv> = model.new_caches().into_iter().collect();
        let l = read(&logits(model, &Model::tokens_array(prompt), &mut caches));
        let next = argmax(&l);
        (Self { caches, next }, l)
    }

    fn step(&mut self, model: &Model) -> Vec<f32> {
        let l = read(&logits(
            model,
            &Model::tokens_array(&[self.next]),
            &mut self.caches,
        ));
        self.next = argmax(&l);
        l
    }
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn prompt(seed: u32, len: u32) -> Vec<u32> {
    (0..len).map(|i| 5 + (i * 37 + seed * 101) % 900).collect()
}

fn check(model_name: &str, steps: usize) {
    let model = model::load(&fixture(model_name)).expect("load");
    let vocab = model.dims.vocab as usize;
    // Three sequences of different lengths, each prefilled alone; a copy of
    // each joins the batch.
    let lengths = [5u32, 40, 300];
    let mut alone = Vec::new();
    let mut batch: Vec<BatchKvCache> = model
        .kinds()
        .iter()
        .map(|&k| BatchKvCache::new(k))
        .collect();
    let mut rows: Vec<usize> = Vec::new();
    let mut worst = 0.0f32;
    let join = |batch: &mut [BatchKvCache], a: &Alone| {
        for (layer, cache) in batch.iter_mut().zip(&a.caches) {
            layer.extend_from(cache).unwrap();
        }
    };
    for (i, &len) in lengths.iter().enumerate() {
        let (a, _) = Alone::prefill(&model, &prompt(i as u32, len));
        join(&mut batch, &a);
        alone.push(a);
        rows.push(i);
    }
    for step in 0..steps {
        // The batch feeds every row's next token at once (a windowed layer's
        // batch first cuts what no row sees any more, as the engine does).
        for layer in &mut batch {
            layer.slide().unwrap();
        }
        let next: Vec<u32> = rows.iter().map(|&r| alone[r].next).collect();
        let input = Array::from_slice(&next, &[next.len() as i32, 1]);
        let batched = read(&logits(&model, &input, &mut batch));
        for (b, &r) in rows.iter().enumerate() {
            let solo = alone[r].step(&model);
            let d = max_diff(&batched[b * vocab..(b + 1) * vocab], &solo);
            assert!(
                d <= TOLERANCE,
                "{model_name}: step {step}, row {b} (sequence {r}): logits differ by {d}"
            );
            worst = worst.max(d);
        }
        // Step 10: the middle sequence leaves. Step 20: a new one joins.
        if step == 10 {
            rows.remove(1);
            for layer in &mut batch {
                layer.filter(&[0, 2]).unwrap();
            }
        }
        if step == 20 {
            let (a, _) = Alone::prefill(&model, &prompt(9, 77));
            join(&mut batch, &a);
            alone.push(a);
            rows.push(alone.len() - 1);
        }
    }
    // A windowed layer's batch held about its window, not the sequences.
    for layer in &batch {
        if let CacheKind::Window(w) = layer.kind() {
            assert!(
                layer.idx() < w + 16 + 256,
                "{model_name}: a windowed batch holds {} slots",
                layer.idx()
            );
        }
    }
    // A row leaving keeps its sequence: what it holds goes on as alone.
    let row = rows.len() - 1;
    let seq = rows[row];
    let mut left: Vec<LayerKv> = batch
        .iter()
        .map(|l| {
            l.extract(row, l.len_of(row))
                .unwrap()
                .expect("holds its window")
        })
        .collect();
    let next = alone[seq].next;
    let again = read(&logits(
        &model,
        &Array::from_slice(&[next], &[1, 1]),
        &mut left,
    ));
    let d = max_diff(&again, &alone[seq].step(&model));
    assert!(d <= TOLERANCE, "{model_name}: extracted row differs by {d}");
    eprintln!("{model_name}: batched logits within {worst:e} of each sequence alone");
}

#[test]
fn batched_logits_match_each_sequence_alone_qwen3() {
    check("qwen3-f32", 40);
}

#[test]
fn batched_logits_match_each_sequence_alone_llama_q4() {
    check("llama-q4", 40);
}

#[test]
fn batched_logits_match_each_sequence_alone_mistral() {
    check("mistral-f32", 40);
}

/// Sliding-window layers: the batch masks each row to its window and slides
/// its buffer (300 + 60 tokens pass the window of 32 plus a step), rows join
/// from rotating caches and leave as rotating caches.
#[test]
fn batched_logits_match_each_sequence_alone_gemma3() {
    check("gemma3-f32", 60);
}

#[test]
fn batched_logits_match_each_sequence_alone_llama_swa() {
    check("llama-swa-f32", 60);
}

/// Prompts of different lengths prefilled together (left-padded, in chunks
/// of 64 columns) give each prompt's logits alone; merged into a running
/// batch they decode as they do alone.
fn check_group(model_name: &str) {
    let model = model::load(&fixture(model_name)).expect("load");
    let vocab = model.dims.vocab as usize;
    let lengths = [5u32, 40, 300];
    let prompts: Vec<Vec<u32>> = lengths
        .iter()
        .enumerate()
        .map(|(i, &len)| prompt(20 + i as u32, len))
        .collect();
    let longest = *lengths.iter().max().unwrap() as usize;
    let pads: Vec<i32> = lengths
        .iter()
        .map(|&l| (longest - l as usize) as i32)
        .collect();
    let mut group: Vec<BatchKvCache> = model
        .kinds()
        .iter()
        .map(|&k| BatchKvCache::with_padding(pads.clone(), k))
        .collect();
    let padded: Vec<Vec<u32>> = prompts
        .iter()
        .zip(&pads)
        .map(|(p, &pad)| {
            let mut t = vec![0u32; pad as usize];
            t.extend_from_slice(p);
            t
        })
        .collect();
    let mut last = Vec::new();
    let mut start = 0;
    while start < longest {
        for layer in &mut group {
            layer.slide().unwrap();
        }
        let end = (start + 64).min(longest);
        let ids: Vec<u32> = padded.iter().flat_map(|t| t[start..end].to_vec()).collect();
        let input = Array::from_slice(&ids, &[padded.len() as i32, (end - start) as i32]);
        last = read(&logits(&model, &input, &mut group));
        start = end;
    }
    let mut worst = 0.0f32;
    let mut alone = Vec::new();
    for (b, p) in prompts.iter().enumerate() {
        let (a, solo) = Alone::prefill(&model, p);
        let d = max_diff(&last[b * vocab..(b + 1) * vocab], &solo);
        assert!(
            d <= TOLERANCE,
            "{model_name}: prompt {b} prefilled in a group: logits differ by {d}"
        );
        worst = worst.max(d);
        alone.push(a);
    }
    // A running batch of one sequence; the group merges into it.
    let (mut first, _) = Alone::prefill(&model, &prompt(30, 17));
    let mut batch: Vec<BatchKvCache> = model
        .kinds()
        .iter()
        .map(|&k| BatchKvCache::new(k))
        .collect();
    for (layer, cache) in batch.iter_mut().zip(&first.caches) {
        layer.extend_from(cache).unwrap();
    }
    let step = read(&logits(
        &model,
        &Array::from_slice(&[first.next], &[1, 1]),
        &mut batch,
    ));
    worst = worst.max(max_diff(&step, &first.step(&model)));
    for (layer, g) in batch.iter_mut().zip(&group) {
        layer.merge(g).unwrap();
    }
    alone.insert(0, first);
    for step in 0..10 {
        for layer in &mut batch {
            layer.slide().unwrap();
        }
        let next: Vec<u32> = alone.iter().map(|a| a.next).collect();
        let input = Array::from_slice(&next, &[next.len() as i32, 1]);
        let batched = read(&logits(&model, &input, &mut batch));
        for (b, a) in alone.iter_mut().enumerate() {
            let d = max_diff(&batched[b * vocab..(b + 1) * vocab], &a.step(&model));
            assert!(
                d <= TOLERANCE,
                "{model_name}: step {step}, row {b}: logits differ by {d}"
            );
            worst = worst.max(d);
        }
    }
    eprintln!("{model_name}: group prefill and merge within {worst:e} of each sequence alone");
}

#[test]
fn batched_logits_match_each_sequence_alone_qwen3_moe() {
    check("qwen3-moe-f32", 40);
}

#[test]
fn batched_logits_match_each_sequence_alone_qwen3_next() {
    check("qwen3-next-f32", 40);
}

#[test]
fn batched_logits_match_each_sequence_alone_glm4_moe_lite() {
    check("glm4-moe-lite-f32", 40);
}

#[test]
fn group_prefill_matches_each_prompt_alone_glm4_moe_lite() {
    check_group("glm4-moe-lite-f32");
}

#[test]
fn group_prefill_matches_each_prompt_alone_qwen3_next() {
    check_group("qwen3-next-f32");
}

#[test]
fn group_prefill_matches_each_prompt_alone_qwen3() {
    check_group("qwen3-f32");
}

#[test]
fn group_prefill_matches_each_prompt_alone_llama_q4() {
    check_group("llama-q4");
}

#[test]
fn group_prefill_matches_each_prompt_alone_gemma3() {
    check_group("gemma3-f32");
}

/// Gemma 4: layers that read another layer's keys, per-layer inputs.
#[test]
fn batched_logits_match_each_sequence_alone_gemma4() {
    check("gemma4-f32", 60);
}
