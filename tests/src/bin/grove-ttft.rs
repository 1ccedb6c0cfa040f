//! Time to first token of a follow-up turn (its prefix in the prompt cache)
//! against a cold prefill of the same prompt, through `grove-runner serve`.
//! Turn 1 answers with ANSWER_TOKENS tokens; the follow-up branches where
//! that answer began (a windowed model then goes back ANSWER_TOKENS tokens,
//! or to its checkpoint at the end of turn 1's prompt).
//!
//! With `disk` as a fifth argument the follow-up comes after a restart:
//! turn 1 runs on a runner with an SSD tier (GROVE_KV_DIR in a temporary
//! directory), that runner is killed, and a new one on the same directory
//! serves the follow-up from disk; the cold figure comes from a runner
//! without the tier. GROVE_KV_CACHE_TYPE applies to every runner.
//!
//! grove-ttft MODEL_DIR [PROMPT_TOKENS] [NEW_TOKENS] [ANSWER_TOKENS] [disk]
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use grove_proto::runner::v1 as pb;
use grove_proto::runner::v1::runner_client::RunnerClient;
use grove_tests::serve::{Served, tokens_request};
use tonic::transport::Channel;

/// Sends a request and returns (time to the first message, prompt eval, cached tokens).
async fn first_token(
    client: &mut RunnerClient<Channel>,
    ids: &[u32],
    max_tokens: u32,
) -> Result<(Duration, Duration, u32)> {
    let start = Instant::now();
    let mut stream = client
        .generate(tokens_request(ids, max_tokens))
        .await?
        .into_inner();
    let mut ttft = None;
    while let Some(msg) = stream.message().await? {
        ttft.get_or_insert_with(|| start.elapsed());
        if let Some(pb::generate_response::Event::Done(done)) = msg.event {
            let m = done.metrics.unwrap_or_default();
            let ttft = ttft.context("no message")?;
            return Ok((
                ttft,
                Duration::from_nanos(m.prompt_eval_ns),
                m.cached_prompt_tokens,
            ));
        }
    }
    bail!("stream ended without Done")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let model = args
        .get(1)
        .context("usage: grove-ttft MODEL_DIR [PROMPT_TOKENS] [NEW_TOKENS] [ANSWER_TOKENS]")?;
    let n: u32 = args.get(2).map_or(Ok(2000), |s| s.parse())?;
    let extra: u32 = args.get(3).map_or(Ok(50), |s| s.parse())?;
    let answer: u32 = args.get(4).map_or(Ok(8), |s| s.parse())?;
    if args.get(5).is_some_and(|a| a == "disk") {
        return from_disk(std::path::Path::new(model), n, extra, answer).await;
    }
    let (_served, mut client) = Served::start(std::path::Path::new(model), &[]).await?;
    let conversation: Vec<u32> = (0..n).map(|i| 5 + (i * 37 + 11) % 1000).collect();
    let mut follow_up = conversation.clone();
    follow_up.extend((0..extra).map(|i| 5 + (i * 53 + 7) % 1000));
    let mut other = follow_up.clone();
    other[0] = if other[0] == 7 { 8 } else { 7 };

    first_token(&mut client, &other, 8).await?; // warm-up
    first_token(&mut client, &conversation, answer).await?; // turn 1 fills the cache
    let (warm, warm_eval, cached) = first_token(&mut client, &follow_up, 8).await?;
    let entry = client.status(pb::StatusRequest {}).await?.into_inner();
    let checkpoint = entry.memory.unwrap_or_default().checkpoint_bytes;
    first_token(&mut client, &other, 8).await?; // replace the entry: next is cold
    let (cold, cold_eval, cold_cached) = first_token(&mut client, &follow_up, 8).await?;
    let status = client.status(pb::StatusRequest {}).await?.into_inner();
    let (mem, facts) = (
        status.memory.unwrap_or_default(),
        status.model.unwrap_or_default(),
    );
    println!(
        "memory: {} B total ({:?}), weights {} B, KV capacity {} tokens, context {} (model max {}), \
         KV held {} B for {} tokens (checkpoint {} B after the follow-up), KV per token {} B, \
         windows per sequence {} B, MLX active {} B, cache {} B, peak {} B",
        mem.memory_total_bytes,
        pb::MemorySource::try_from(mem.memory_source).unwrap_or_default(),
        mem.weight_bytes,
        mem.kv_capacity_tokens,
        facts.context_length,
        facts.max_position_embeddings,
        mem.kv_bytes,
        mem.cached_tokens,
        checkpoint,
        mem.kv_bytes_per_token,
        mem.window_bytes_per_sequence,
        mem.mlx_active_bytes,
        mem.mlx_cache_bytes,
        mem.mlx_peak_bytes
    );
    println!(
        "prompt {} tokens: cold TTFT {:.1} ms (prefill {:.1} ms, {} cached) | follow-up TTFT {:.1} ms \
         (prefill {:.1} ms, {} cached) | ratio {:.1}%",
        follow_up.len(),
        cold.as_secs_f64() * 1e3,
        cold_eval.as_secs_f64() * 1e3,
        cold_cached,
        warm.as_secs_f64() * 1e3,
        warm_eval.as_secs_f64() * 1e3,
        cached,
        100.0 * warm.as_secs_f64() / cold.as_secs_f64()
    );
    Ok(())
}

/// The conversation, its follow-up, and an unrelated prompt.
fn prompts(n: u32, extra: u32) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let conversation: Vec<u32> = (0..n).map(|i| 5 + (i * 37 + 11) % 1000).collect();
    let mut follow_up = conversation.clone();
    follow_up.extend((0..extra).map(|i| 5 + (i * 53 + 7) % 1000));
    // Short enough (with its answer) never to be stored.
    let other: Vec<u32> = (0..4).map(|i| 900 - i).collect();
    (conversation, follow_up, other)
}

/// The follow-up's TTFT from the SSD tier after a restart, against cold.
async fn from_disk(model: &std::path::Path, n: u32, extra: u32, answer: u32) -> Result<()> {
    let (conversation, follow_up, other) = prompts(n, extra);
    let dir = tempfile::tempdir()?;
    let dir_text = dir.path().to_str().context("temporary path")?;
    let env = [("GROVE_KV_DIR", dir_text), ("GROVE_KV_DISK", "8G")];
    {
        let (_served, mut client) = Served::start_env(model, &[], &env).await?;
        first_token(&mut client, &other, 4).await?; // warm-up
        first_token(&mut client, &conversation, answer).await?;
        let start = Instant::now();
        while client
            .status(pb::StatusRequest {})
            .await?
            .into_inner()
            .memory
            .unwrap_or_default()
            .disk_entries
            < 1
        {
            if start.elapsed() > Duration::from_secs(60) {
                bail!("turn 1 never reached the disk");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    } // killed
    let restart = Instant::now();
    let (_served, mut client) = Served::start_env(model, &[], &env).await?;
    let load = restart.elapsed();
    first_token(&mut client, &other, 4).await?; // warm-up, too short to be stored
    let (warm, warm_eval, cached) = first_token(&mut client, &follow_up, 8).await?;
    let mem = client
        .status(pb::StatusRequest {})
        .await?
        .into_inner()
        .memory
        .unwrap_or_default();
    let (_cold_runner, mut cold_client) = Served::start(model, &[]).await?;
    first_token(&mut cold_client, &other, 4).await?; // warm-up
    let (cold, cold_eval, _) = first_token(&mut cold_client, &follow_up, 8).await?;
    println!(
        "restart (load) {:.0} ms; disk: {} entries, {} B; KV per token {} B",
        load.as_secs_f64() * 1e3,
        mem.disk_entries,
        mem.disk_bytes,
        mem.kv_bytes_per_token
    );
    println!(
        "prompt {} tokens: cold TTFT {:.1} ms (prefill {:.1} ms) | follow-up after restart TTFT {:.1} ms \
         (prefill {:.1} ms, {} cached from disk) | ratio {:.1}%",
        follow_up.len(),
        cold.as_secs_f64() * 1e3,
        cold_eval.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3,
        warm_eval.as_secs_f64() * 1e3,
        cached,
        100.0 * warm.as_secs_f64() / cold.as_secs_f64()
    );
    Ok(())
}
