//! Embedding throughput of a real `grove serve`, and the HTTP path's cost
//! against gRPC on the same call.
//!
//! 1. Texts per second with B texts in one call (B = 1, 8, 32) and with B
//!    one-text calls at once (the runner batches them across calls), each
//!    the median of ROUNDS, against the same B texts one call after another
//!    (batch 1).
//! 2. OpenAI's `/v1/embeddings` (floats, and the SDKs' default base64) and
//!    ollama's `/api/embed` against gRPC `Embed` on the same 8 texts: the
//!    difference of the medians, as a share of gRPC's time and per token.
//!
//! Prints one JSON object per row.
//!
//! grove-embed-bench MODEL_DIR [ROUNDS]
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use grove_proto::v1 as pb;
use grove_tests::daemon::Daemon;
use grove_tests::http::send;
use serde_json::json;

const HEADERS: [(&str, &str); 1] = [("Content-Type", "application/json")];

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Sentences of 20-40 words, each different.
fn texts(n: usize) -> Vec<String> {
    const WORDS: [&str; 16] = [
        "the", "river", "carries", "light", "over", "stones", "while", "a", "keeper", "counts",
        "ships", "at", "night", "near", "old", "harbors",
    ];
    (0..n)
        .map(|i| {
            let len = 20 + (i * 7) % 21;
            (0..len)
                .map(|j| WORDS[(i * 5 + j * 3 + j * j) % WORDS.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn request(model: &str, texts: &[String]) -> pb::EmbedRequest {
    pb::EmbedRequest {
        model: model.into(),
        inputs: texts
            .iter()
            .map(|t| pb::EmbedInput {
                input: Some(pb::embed_input::Input::Text(t.clone())),
            })
            .collect(),
        ..Default::default()
    }
}

type Client = grove_proto::v1::grove_client::GroveClient<tonic::transport::Channel>;

async fn grpc(c: &mut Client, model: &str, texts: &[String]) -> Result<(Duration, u64)> {
    let t = Instant::now();
    let r = c.embed(request(model, texts)).await?.into_inner();
    ensure!(
        r.embeddings.len() == texts.len(),
        "{} vectors",
        r.embeddings.len()
    );
    Ok((t.elapsed(), r.prompt_tokens))
}

/// `n` one-text calls at once: the wall time until the last returns.
async fn concurrent(c: &Client, model: &str, texts: &[String]) -> Result<Duration> {
    let t = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for text in texts {
        let mut c = c.clone();
        let one = [text.clone()];
        let model = model.to_owned();
        calls.spawn(async move { grpc(&mut c, &model, &one).await });
    }
    while let Some(r) = calls.join_next().await {
        r??;
    }
    Ok(t.elapsed())
}

async fn http(addr: &str, path: &str, body: &serde_json::Value) -> Result<Duration> {
    let t = Instant::now();
    let r = send(addr, "POST", path, &HEADERS, body.to_string().as_bytes()).await?;
    ensure!(r.status == 200, "{path}: {r:?}");
    Ok(t.elapsed())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .context("usage: grove-embed-bench MODEL_DIR [ROUNDS]")?;
    let rounds: usize = args.next().map_or(Ok(7), |r| r.parse())?;
    let (d, mut client) = Daemon::start(&[]).await?;
    let all = texts(32);
    // Loads the model and warms the path.
    grpc(&mut client, &model, &all[..8]).await?;

    // 1. Throughput.
    for b in [1usize, 8, 32] {
        let batch = &all[..b];
        let (mut alone, mut one_call, mut many_calls) = (Vec::new(), Vec::new(), Vec::new());
        let mut tokens = 0;
        for _ in 0..rounds {
            let t = Instant::now();
            for text in batch {
                grpc(&mut client, &model, std::slice::from_ref(text)).await?;
            }
            alone.push(t.elapsed());
            let (t, n) = grpc(&mut client, &model, batch).await?;
            one_call.push(t);
            tokens = n;
            many_calls.push(concurrent(&client, &model, batch).await?);
        }
        let per_s = |d: Duration| b as f64 / d.as_secs_f64();
        let base = per_s(median(alone));
        let (one, many) = (per_s(median(one_call)), per_s(median(many_calls)));
        println!(
            "{}",
            json!({"row": "throughput", "batch": b, "tokens": tokens,
                   "texts_per_s_batch_1": base,
                   "texts_per_s_one_call": one, "texts_per_s_concurrent_calls": many,
                   "one_call_vs_batch_1": one / base, "concurrent_vs_batch_1": many / base})
        );
    }

    // 2. HTTP against gRPC on 8 texts.
    let batch = &all[..8];
    let inputs: Vec<&str> = batch.iter().map(String::as_str).collect();
    let float = json!({"model": model, "input": inputs, "encoding_format": "float"});
    let b64 = json!({"model": model, "input": inputs, "encoding_format": "base64"});
    let ollama = json!({"model": model, "input": inputs});
    let (mut g, mut f, mut b, mut o) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut tokens = 0;
    for _ in 0..rounds {
        let (t, n) = grpc(&mut client, &model, batch).await?;
        g.push(t);
        tokens = n;
        f.push(http(&d.addr, "/v1/embeddings", &float).await?);
        b.push(http(&d.addr, "/v1/embeddings", &b64).await?);
        o.push(http(&d.addr, "/api/embed", &ollama).await?);
    }
    let g = median(g);
    for (name, times) in [("openai float", f), ("openai base64", b), ("ollama", o)] {
        let t = median(times);
        let extra = t.as_secs_f64() - g.as_secs_f64();
        println!(
            "{}",
            json!({"row": "http", "path": name, "grpc_ms": g.as_secs_f64() * 1e3,
                   "http_ms": t.as_secs_f64() * 1e3, "overhead": extra / g.as_secs_f64(),
                   "overhead_us_per_token": extra * 1e6 / tokens.max(1) as f64})
        );
    }
    Ok(())
}
