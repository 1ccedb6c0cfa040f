//! Aggregate decode throughput of concurrent streams through
//! `grove-runner serve` (continuous batching), for tests/bench/batched.py.
//!
//! grove-batch-bench MODEL_DIR PROMPTS_JSON MAX_TOKENS STREAMS[,STREAMS...] [RUNNER_ARGS...]
//!
//! PROMPTS_JSON is a JSON array of token-id arrays, at least as many as the
//! largest stream count. For each stream count N, the first N prompts are sent
//! at once (greedy, MAX_TOKENS each), after a warm-up round of N streams of
//! the same length on the prompts rotated by one token, so that the kernels
//! for N rows and every cache length are compiled (on CUDA a short warm-up
//! left the first timed round ~40% slow) and the prompt cache holds nothing
//! the timed round can reuse (mlx-lm's BatchGenerator has no prompt cache). Prints one
//! JSON line per N: total generated tokens, wall seconds from sending to the
//! last Done, each stream's time to its first text (client side), its
//! generated tokens and its text (to compare two runs' greedy outputs).
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use grove_proto::runner::v1 as pb;
use grove_proto::runner::v1::runner_client::RunnerClient;
use grove_tests::serve::{NO_DISK, Served, tokens_request};
use tonic::transport::Channel;

/// One stream: time to its first text, when it ended, its generated tokens
/// and text.
type Streamed = (Duration, Duration, u32, String);

async fn stream(
    mut client: RunnerClient<Channel>,
    ids: Vec<u32>,
    max_tokens: u32,
    start: Instant,
) -> Result<Streamed> {
    let mut text = String::new();
    let mut s = client
        .generate(tokens_request(&ids, max_tokens))
        .await?
        .into_inner();
    let mut first = None;
    while let Some(msg) = s.message().await? {
        match msg.event {
            Some(pb::generate_response::Event::Text(t)) => {
                first.get_or_insert_with(|| start.elapsed());
                text.push_str(&t);
            }
            Some(pb::generate_response::Event::Done(done)) => {
                let end = start.elapsed();
                let tokens = done.metrics.unwrap_or_default().eval_tokens;
                return Ok((first.unwrap_or(end), end, tokens, text));
            }
            _ => {}
        }
    }
    bail!("stream ended without Done")
}

async fn round(
    client: &RunnerClient<Channel>,
    prompts: &[Vec<u32>],
    max_tokens: u32,
) -> Result<Vec<Streamed>> {
    let start = Instant::now();
    let tasks: Vec<_> = prompts
        .iter()
        .map(|p| tokio::spawn(stream(client.clone(), p.clone(), max_tokens, start)))
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage =
        "usage: grove-batch-bench MODEL_DIR PROMPTS_JSON MAX_TOKENS STREAMS[,..] [RUNNER_ARGS...]";
    let model = args.get(1).context(usage)?;
    let prompts: Vec<Vec<u32>> =
        serde_json::from_str(&std::fs::read_to_string(args.get(2).context(usage)?)?)?;
    let max_tokens: u32 = args.get(3).context(usage)?.parse()?;
    let counts: Vec<usize> = args
        .get(4)
        .context(usage)?
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let extra: Vec<&str> = args[5.min(args.len())..]
        .iter()
        .map(String::as_str)
        .collect();
    let most = counts.iter().copied().max().unwrap_or(1);
    if prompts.len() < most {
        bail!("{} prompts for {most} streams", prompts.len());
    }
    // The daemon's load deadline (GROVE_LOAD_TIMEOUT's default), not a
    // test's 60 s: a fresh CUDA machine's first load of a quantized model
    // compiles MLX's matmul tiles at the warm-up (107.2 s for llama-small
    // 4-bit on an H200; twice the tiles with 8-bit routers).
    let (_served, client) = Served::start_within(
        std::path::Path::new(model),
        &extra,
        NO_DISK,
        Duration::from_secs(600),
    )
    .await?;
    for n in counts {
        let warm: Vec<Vec<u32>> = prompts[..n]
            .iter()
            .map(|p| {
                let mut p = p.clone();
                p.rotate_left(1);
                p
            })
            .collect();
        round(&client, &warm, max_tokens).await?;
        let start = Instant::now();
        let results = round(&client, &prompts[..n], max_tokens).await?;
        let wall = start.elapsed().as_secs_f64();
        let ttft: Vec<f64> = results.iter().map(|r| r.0.as_secs_f64()).collect();
        let tokens: Vec<u32> = results.iter().map(|r| r.2).collect();
        let texts: Vec<&str> = results.iter().map(|r| r.3.as_str()).collect();
        println!(
            "{}",
            serde_json::json!({
                "streams": n,
                "wall_s": wall,
                "tokens": tokens,
                "ttft_s": ttft,
                "texts": texts,
            })
        );
    }
    Ok(())
}
