//! `grove-runner serve` as the daemon will drive it: real processes on fixture
//! models, over gRPC on a Unix socket.
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use grove_proto::runner::v1 as pb;
use grove_tests::fixtures;
use grove_tests::serve::{Served, complete, tokens_request};

/// A prompt whose greedy continuation on qwen3-f32 runs past 1000 tokens
/// without EOS (checked when the test was written).
const LONG_RUNNING: [u32; 12] = [142, 587, 872, 826, 787, 69, 266, 125, 512, 784, 465, 488];

/// Turn 2 of a conversation reuses turn 1's prompt and answer from the prompt
/// cache (by content), and gives the same text as a cold run of the same prompt.
#[tokio::test]
async fn multi_turn_reuses_the_shared_prefix() -> Result<()> {
    let model = "qwen3-f32";
    let reference = fixtures::reference(model)?;
    let case = reference
        .cases
        .iter()
        .find(|c| c.name == "ids")
        .context("no ids case")?;
    let (_served, mut client) = Served::start(&fixtures::model_dir(model)?, &[]).await?;

    // Turn 1: the reference prompt; the answer is mlx-lm's greedy tokens.
    let turn1 = complete(
        &mut client,
        tokens_request(&case.prompt_tokens, case.max_tokens as u32),
    )
    .await?;
    ensure!(
        turn1.metrics().cached_prompt_tokens == 0,
        "cold start reused tokens"
    );
    ensure!(turn1.metrics().eval_tokens as usize == case.tokens.len());
    // Every generated token but a length-limited last one was fed back.
    let fed = if case.finish_reason == "length" {
        case.tokens.len() - 1
    } else {
        case.tokens.len()
    };

    // Turn 2: the conversation so far plus new tokens.
    let mut prompt2 = case.prompt_tokens.clone();
    prompt2.extend(&case.tokens);
    prompt2.extend([11u32, 22, 33, 44, 55]);
    let turn2 = complete(&mut client, tokens_request(&prompt2, 16)).await?;
    let m = turn2.metrics();
    ensure!(m.prompt_tokens as usize == prompt2.len());
    ensure!(
        m.cached_prompt_tokens as usize == case.prompt_tokens.len() + fed,
        "turn 2 reused {} tokens, expected the shared prefix of {}",
        m.cached_prompt_tokens,
        case.prompt_tokens.len() + fed
    );

    // A replaced conversation of greater length sharing no first token: a miss.
    let mut other = prompt2.clone();
    other[0] = if other[0] == 7 { 8 } else { 7 };
    other.push(99);
    let replaced = complete(&mut client, tokens_request(&other, 4)).await?;
    ensure!(
        replaced.metrics().cached_prompt_tokens == 0,
        "content differs, yet tokens were reused"
    );

    // Turn 2's prompt again, now cold: the same text as with the cache.
    let cold = complete(&mut client, tokens_request(&prompt2, 16)).await?;
    ensure!(cold.metrics().cached_prompt_tokens == 0);
    ensure!(
        cold.text == turn2.text,
        "cached and cold runs differ:\n{:?}\n{:?}",
        turn2.text,
        cold.text
    );

    // The identical prompt once more: all but its last token come from the cache.
    let again = complete(&mut client, tokens_request(&prompt2, 16)).await?;
    ensure!(again.metrics().cached_prompt_tokens as usize == prompt2.len() - 1);
    ensure!(again.text == turn2.text);
    Ok(())
}

async fn wait_idle(
    client: &mut grove_proto::runner::v1::runner_client::RunnerClient<tonic::transport::Channel>,
) -> Result<Duration> {
    let start = Instant::now();
    loop {
        let h = client.health(pb::HealthRequest {}).await?.into_inner();
        if h.activity == pb::EngineActivity::Idle as i32 {
            return Ok(start.elapsed());
        }
        ensure!(
            start.elapsed() < Duration::from_secs(5),
            "the engine is still busy 5 s after the client left"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A client that drops its stream stops the engine's work, in decode and in
/// prefill; health answers meanwhile, and the next request is served.
#[tokio::test]
async fn cancelled_client_stops_the_work() -> Result<()> {
    let (_served, mut client) = Served::start(
        &fixtures::model_dir("qwen3-f32")?,
        &["--prefill-chunk", "8"],
    )
    .await?;

    // Decode: until the context is full (thousands of steps), dropped after 3 pieces.
    let mut stream = client
        .generate(tokens_request(&LONG_RUNNING, 0))
        .await?
        .into_inner();
    for _ in 0..3 {
        stream.message().await?.context("stream ended early")?;
    }
    let h = client.health(pb::HealthRequest {}).await?.into_inner();
    ensure!(
        h.activity == pb::EngineActivity::Decoding as i32,
        "expected decoding, got {:?}",
        h.activity
    );
    drop(stream);
    wait_idle(&mut client).await?;

    // Prefill: 3000 prompt tokens in chunks of 8, dropped at once.
    let long: Vec<u32> = (0..3000).map(|i| 5 + (i * 37 % 900) as u32).collect();
    let stream = client
        .generate(tokens_request(&long, 4))
        .await?
        .into_inner();
    drop(stream);
    wait_idle(&mut client).await?;

    let after = complete(&mut client, tokens_request(&LONG_RUNNING, 8)).await?;
    ensure!(after.metrics().eval_tokens == 8);
    Ok(())
}

/// A prompt longer than the context is INVALID_ARGUMENT naming both numbers;
/// generation that fills the context ends with done reason LENGTH.
#[tokio::test]
async fn context_limits() -> Result<()> {
    let (_served, mut client) = Served::start(
        &fixtures::model_dir("qwen3-f32")?,
        &["--context-length", "64"],
    )
    .await?;
    let long: Vec<u32> = (0..80).map(|i| 5 + i).collect();
    let err = complete(&mut client, tokens_request(&long, 4))
        .await
        .err()
        .context("80 tokens fit 64")?;
    ensure!(err.code() == tonic::Code::InvalidArgument, "{err:?}");
    ensure!(
        err.message().contains("80") && err.message().contains("64"),
        "{}",
        err.message()
    );

    // num_ctx narrows it further; max_tokens 0 = until the context is full.
    let mut req = tokens_request(&LONG_RUNNING, 0);
    req.num_ctx = 20;
    let done = complete(&mut client, req).await?;
    ensure!(
        done.reason() == pb::DoneReason::Length,
        "{:?}",
        done.reason()
    );
    ensure!(done.metrics().eval_tokens as usize == 20 - LONG_RUNNING.len() + 1);

    let status = client.status(pb::StatusRequest {}).await?.into_inner();
    let facts = status.model.context("no model facts")?;
    ensure!(facts.context_length == 64);
    ensure!(facts.architecture == pb::Architecture::Qwen3 as i32);
    ensure!(facts.num_layers == 2 && facts.vocab_size == 1024);
    let memory = status.memory.context("no memory report")?;
    ensure!(
        memory.weight_bytes > 0 && memory.kv_capacity_tokens > 64 && memory.memory_total_bytes > 0
    );
    ensure!(memory.cached_tokens > 0 && memory.kv_bytes > 0);
    Ok(())
}

/// Bad options and prompts are INVALID_ARGUMENT before any stream starts.
#[tokio::test]
async fn bad_requests_are_rejected() -> Result<()> {
    let (_served, mut client) = Served::start(&fixtures::model_dir("llama-q4")?, &[]).await?;
    let cases: Vec<(&str, pb::GenerateRequest)> = vec![
        (
            "negative temperature",
            pb::GenerateRequest {
                sampling: Some(pb::SamplingOptions {
                    temperature: -1.0,
                    ..Default::default()
                }),
                ..tokens_request(&[1, 2, 3], 4)
            },
        ),
        (
            "top_p above 1",
            pb::GenerateRequest {
                sampling: Some(pb::SamplingOptions {
                    top_p: Some(1.5),
                    ..Default::default()
                }),
                ..tokens_request(&[1, 2, 3], 4)
            },
        ),
        ("empty prompt", tokens_request(&[], 4)),
        (
            "token outside the vocabulary",
            tokens_request(&[1, 5000], 4),
        ),
        (
            "empty stop string",
            pb::GenerateRequest {
                stop: vec![String::new()],
                ..tokens_request(&[1, 2], 4)
            },
        ),
        ("no input", pb::GenerateRequest::default()),
    ];
    for (what, req) in cases {
        let err = complete(&mut client, req)
            .await
            .err()
            .with_context(|| format!("{what} was accepted"))?;
        ensure!(
            err.code() == tonic::Code::InvalidArgument,
            "{what}: {err:?}"
        );
    }
    // The runner is still fine, and sampling options are honoured: top_k = 1
    // at temperature 1 leaves only the argmax, so it equals greedy decoding.
    let greedy = complete(&mut client, tokens_request(&[1, 2, 3], 12)).await?;
    ensure!(greedy.metrics().prompt_tokens == 3);
    let top1 = complete(
        &mut client,
        pb::GenerateRequest {
            sampling: Some(pb::SamplingOptions {
                temperature: 1.0,
                top_k: Some(1),
                seed: Some(5),
                ..Default::default()
            }),
            ..tokens_request(&[1, 2, 3], 12)
        },
    )
    .await?;
    ensure!(
        top1.text == greedy.text,
        "{:?} vs {:?}",
        top1.text,
        greedy.text
    );
    Ok(())
}

/// Stop strings end generation and are never emitted; text prompts, Tokenize
/// and Detokenize agree with the model's tokenizer.
#[tokio::test]
async fn stop_strings_and_tokenizer_calls() -> Result<()> {
    let model = "qwen3-f32";
    let (mut served, mut client) = Served::start(&fixtures::model_dir(model)?, &[]).await?;
    let free = complete(&mut client, tokens_request(&LONG_RUNNING, 40)).await?;
    ensure!(
        free.text.chars().count() > 12,
        "too little text to cut: {:?}",
        free.text
    );
    // A stop string from the middle of the free-running text.
    let chars: Vec<char> = free.text.chars().collect();
    let stop: String = chars[8..11].iter().collect();
    let cut = free.text.find(&stop).context("stop not in text")?;
    let mut req = tokens_request(&LONG_RUNNING, 40);
    req.stop = vec![stop.clone()];
    let stopped = complete(&mut client, req).await?;
    ensure!(stopped.reason() == pb::DoneReason::Stop);
    ensure!(
        stopped.text == free.text[..cut],
        "{:?} vs {:?}",
        stopped.text,
        &free.text[..cut]
    );

    let ids = client
        .tokenize(pb::TokenizeRequest {
            text: "The quick brown fox".into(),
            add_special_tokens: true,
        })
        .await?
        .into_inner()
        .ids;
    let reference = fixtures::reference(model)?;
    let short = reference
        .cases
        .iter()
        .find(|c| c.name == "short")
        .context("no short case")?;
    ensure!(
        ids == short.prompt_tokens,
        "{ids:?} vs {:?}",
        short.prompt_tokens
    );
    let text = client
        .detokenize(pb::DetokenizeRequest { ids })
        .await?
        .into_inner()
        .text;
    ensure!(text == "The quick brown fox", "{text:?}");

    // Shutdown ends the process and removes its socket.
    client.shutdown(pb::ShutdownRequest {}).await?;
    let status = served.wait_exit(Duration::from_secs(10))?;
    ensure!(status.success(), "exit status {status}");
    ensure!(!served.socket.exists(), "socket left behind");
    Ok(())
}
