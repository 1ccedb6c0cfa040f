//! Time to first token of a follow-up turn (its prefix in the prompt cache)
//! against a cold prefill of the same prompt, through `grove-runner serve`.
//! Turn 1 answers with ANSWER_TOKENS tokens; the follow-up branches where
//! that answer began (a windowed model then goes back ANSWER_TOKENS tokens,
//! or to its checkpoint at the end of turn 1's prompt).
//!
//! grove-ttft MODEL_DIR [PROMPT_TOKENS] [NEW_TOKENS] [ANSWER_TOKENS]
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
