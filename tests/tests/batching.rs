//! Continuous batching in `grove-runner serve`: requests that run together
//! give what each gives alone (greedy: mlx-lm's tokens; sampled: the same
//! seeded draws), whatever joins or leaves the batch meanwhile, and the
//! limits on sequences and KV capacity hold requests back until room frees.
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use grove_proto::runner::v1 as pb;
use grove_proto::runner::v1::runner_client::RunnerClient;
use grove_tests::fixtures;
use grove_tests::serve::{Completion, Served, all_at_once, complete, tokens_request};
use tonic::transport::Channel;

/// A prompt whose greedy continuation on qwen3-f32 runs past 1000 tokens
/// without EOS (checked when the test was written).
const LONG_RUNNING: [u32; 12] = [142, 587, 872, 826, 787, 69, 266, 125, 512, 784, 465, 488];

type Client = RunnerClient<Channel>;

/// Runs the requests one after another.
async fn one_by_one(client: &mut Client, reqs: &[pb::GenerateRequest]) -> Result<Vec<Completion>> {
    let mut out = Vec::new();
    for r in reqs {
        out.push(complete(client, r.clone()).await?);
    }
    Ok(out)
}

async fn batch_status(client: &mut Client) -> Result<pb::BatchReport> {
    let s = client.status(pb::StatusRequest {}).await?.into_inner();
    s.batch.context("no batch report")
}

async fn wait_for(
    client: &mut Client,
    what: &str,
    cond: impl Fn(&pb::BatchReport) -> bool,
) -> Result<pb::BatchReport> {
    let start = Instant::now();
    loop {
        let b = batch_status(client).await?;
        if cond(&b) {
            return Ok(b);
        }
        ensure!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: still {b:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn same(alone: &[Completion], together: &[Completion], what: &str) -> Result<()> {
    for (i, (a, t)) in alone.iter().zip(together).enumerate() {
        ensure!(
            a.text == t.text,
            "{what} {i}: alone {:?}, batched {:?}",
            a.text,
            t.text
        );
        ensure!(a.reason() == t.reason(), "{what} {i}: done reasons differ");
        ensure!(
            a.metrics().eval_tokens == t.metrics().eval_tokens,
            "{what} {i}: token counts differ"
        );
    }
    Ok(())
}

/// On every fixture, all reference cases in one batch (EOS and length
/// endings, prompts from 8 to ~600 tokens) give mlx-lm's text, as mlx-lm's
/// own BatchGenerator does.
#[tokio::test]
async fn batched_requests_match_mlx_lm() -> Result<()> {
    for model in fixtures::MODELS {
        let reference = fixtures::reference(model)?;
        let (_served, client) = Served::start(&fixtures::model_dir(model)?, &[]).await?;
        let reqs: Vec<_> = reference
            .cases
            .iter()
            .map(|c| tokens_request(&c.prompt_tokens, c.max_tokens as u32))
            .collect();
        let got = all_at_once(&client, reqs).await?;
        for (case, done) in reference.cases.iter().zip(&got) {
            // Where mlx-lm can batch the model, its batch agrees with its
            // solo runs (gemma2's cannot: see make_fixtures.py).
            if let Some(batch) = &case.batch_tokens {
                ensure!(
                    batch == &case.tokens,
                    "{model}/{}: mlx-lm's batch and solo tokens differ; regenerate fixtures",
                    case.name
                );
            }
            ensure!(
                done.text == case.text,
                "{model}/{}: batched {:?}, mlx-lm {:?}",
                case.name,
                done.text,
                case.text
            );
            let reason = match case.finish_reason.as_str() {
                "stop" => pb::DoneReason::Stop,
                _ => pb::DoneReason::Length,
            };
            ensure!(done.reason() == reason, "{model}/{}", case.name);
            ensure!(done.metrics().eval_tokens as usize == case.tokens.len());
        }
    }
    Ok(())
}

/// Requests that join a batch already decoding, a few milliseconds apart,
/// and the running one, all give what they give alone.
#[tokio::test]
async fn joining_a_running_batch() -> Result<()> {
    let model = "qwen3-f32";
    let reference = fixtures::reference(model)?;
    let (_served, mut client) = Served::start(&fixtures::model_dir(model)?, &[]).await?;
    let long = tokens_request(&LONG_RUNNING, 300);
    let alone = complete(&mut client, long.clone()).await?;

    let mut stream = client.generate(long).await?.into_inner();
    let mut text = String::new();
    for _ in 0..5 {
        if let Some(pb::generate_response::Event::Text(t)) =
            stream.message().await?.context("ended early")?.event
        {
            text.push_str(&t);
        }
    }
    let mut tasks = Vec::new();
    for case in &reference.cases {
        let mut c = client.clone();
        let req = tokens_request(&case.prompt_tokens, case.max_tokens as u32);
        tasks.push(tokio::spawn(async move { complete(&mut c, req).await }));
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    for (case, t) in reference.cases.iter().zip(tasks) {
        let done = t.await??;
        ensure!(done.text == case.text, "{}: {:?}", case.name, done.text);
    }
    let mut done = None;
    while let Some(m) = stream.message().await? {
        match m.event {
            Some(pb::generate_response::Event::Text(t)) => text.push_str(&t),
            Some(pb::generate_response::Event::Done(d)) => done = Some(d),
            Some(_) => bail!("an event not asked for"),
            None => {}
        }
    }
    ensure!(done.is_some(), "no Done");
    ensure!(
        text == alone.text,
        "the running request changed when others joined"
    );
    Ok(())
}

/// Eight clients with different sampling options, stop strings and limits
/// (seeded) get the same text together as each alone: sampling state is
/// per request.
#[tokio::test]
async fn sampling_is_per_request() -> Result<()> {
    let (_served, mut client) = Served::start(&fixtures::model_dir("qwen3-f32")?, &[]).await?;
    let prompt =
        |seed: u32| -> Vec<u32> { (0..20).map(|i| 5 + (i * 53 + seed * 17) % 900).collect() };
    let sampled = |seed: u64, f: &dyn Fn(&mut pb::SamplingOptions)| {
        let mut s = pb::SamplingOptions {
            temperature: 0.8,
            seed: Some(seed),
            ..Default::default()
        };
        f(&mut s);
        s
    };
    let mut reqs = Vec::new();
    let options = [
        sampled(1, &|_| {}),
        sampled(2, &|s| s.top_k = Some(20)),
        sampled(3, &|s| s.top_p = Some(0.9)),
        sampled(4, &|s| s.min_p = Some(0.05)),
        sampled(5, &|s| s.repetition_penalty = Some(1.3)),
        sampled(6, &|s| {
            s.presence_penalty = Some(0.5);
            s.frequency_penalty = Some(0.3);
        }),
        sampled(7, &|s| {
            s.temperature = 0.0;
            s.logit_bias = [(100u32, 5.0f32), (200, -100.0)].into_iter().collect();
        }),
        pb::SamplingOptions::default(),
    ];
    for (i, sampling) in options.into_iter().enumerate() {
        let mut r = tokens_request(&prompt(i as u32), 24 + 4 * i as u32);
        r.sampling = Some(sampling);
        reqs.push(r);
    }
    // A stop string that greedy output contains, for the last request.
    let greedy = complete(&mut client, reqs[7].clone()).await?;
    let words: Vec<&str> = greedy.text.split_whitespace().collect();
    let stop = words
        .get(words.len() / 2)
        .context("greedy text too short")?;
    reqs[7].stop = vec![stop.to_string()];

    let alone = one_by_one(&mut client, &reqs).await?;
    ensure!(
        alone[7].reason() == pb::DoneReason::Stop,
        "the stop string did not stop"
    );
    let together = all_at_once(&client, reqs.clone()).await?;
    same(&alone, &together, "request")?;
    // And again, in the reverse order of arrival.
    let mut reversed = reqs.clone();
    reversed.reverse();
    let mut together = all_at_once(&client, reversed).await?;
    together.reverse();
    same(&alone, &together, "reversed request")
}

/// A client that leaves mid-decode or mid-prefill leaves the batch; the
/// others go on undisturbed and the batch empties.
#[tokio::test]
async fn cancelling_one_leaves_the_others() -> Result<()> {
    let (_served, mut client) = Served::start(&fixtures::model_dir("qwen3-f32")?, &[]).await?;
    let others: Vec<_> = (0..3u32)
        .map(|s| {
            let ids: Vec<u32> = (0..30).map(|i| 5 + (i * 29 + s * 7) % 900).collect();
            tokens_request(&ids, 120)
        })
        .collect();
    let alone = one_by_one(&mut client, &others).await?;

    let running = tokio::spawn({
        let c = client.clone();
        let others = others.clone();
        async move { all_at_once(&c, others).await }
    });
    // One leaves while decoding.
    let mut decoding = client
        .generate(tokens_request(&LONG_RUNNING, 0))
        .await?
        .into_inner();
    for _ in 0..3 {
        decoding.message().await?.context("ended early")?;
    }
    drop(decoding);
    // One leaves while its long prompt is still being prefilled in small chunks.
    let long: Vec<u32> = (0..3000).map(|i| 5 + (i * 37 % 900) as u32).collect();
    let mut req = tokens_request(&long, 4);
    req.prefill_chunk = 8;
    let prefilling = client.generate(req).await?.into_inner();
    wait_for(&mut client, "the long prompt admitted", |b| {
        b.active_sequences >= 1
    })
    .await?;
    drop(prefilling);

    let together = running.await??;
    same(&alone, &together, "request")?;
    wait_for(&mut client, "the batch empties", |b| {
        b.active_sequences == 0 && b.waiting_sequences == 0
    })
    .await?;
    Ok(())
}

/// `--num-parallel 2`: a third request waits (status shows it) until one of
/// two running requests leaves, then runs to the same text as alone.
#[tokio::test]
async fn parallel_limit_queues_the_rest() -> Result<()> {
    let (_served, mut client) =
        Served::start(&fixtures::model_dir("qwen3-f32")?, &["--num-parallel", "2"]).await?;
    let status = client.status(pb::StatusRequest {}).await?.into_inner();
    ensure!(status.model.context("no facts")?.max_parallel == 2);
    let third = tokens_request(&[7, 8, 9, 10, 11], 16);
    let alone = complete(&mut client, third.clone()).await?;

    let first = client
        .generate(tokens_request(&LONG_RUNNING, 0))
        .await?
        .into_inner();
    let second = client
        .generate(tokens_request(&LONG_RUNNING, 0))
        .await?
        .into_inner();
    let waiting = tokio::spawn({
        let mut c = client.clone();
        async move { complete(&mut c, third).await }
    });
    let b = wait_for(&mut client, "two running, one waiting", |b| {
        b.active_sequences == 2 && b.waiting_sequences == 1
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        !waiting.is_finished(),
        "the third ran past the limit: {b:?}"
    );
    drop(first);
    let done = waiting.await??;
    ensure!(done.text == alone.text);
    drop(second);
    wait_for(&mut client, "the batch empties", |b| {
        b.active_sequences == 0
    })
    .await?;
    Ok(())
}

/// `--queue` counts only requests that wait: as many as `--num-parallel`
/// may arrive at once on top of it, and one more than both is refused with
/// RESOURCE_EXHAUSTED until a running request ends.
#[tokio::test]
async fn queue_counts_only_waiting_requests() -> Result<()> {
    let (_served, mut client) = Served::start(
        &fixtures::model_dir("qwen3-f32")?,
        &["--num-parallel", "4", "--queue", "1"],
    )
    .await?;
    // Five at once: four run, one waits; none is refused.
    let short: Vec<_> = (0..5u32)
        .map(|i| tokens_request(&[7 + i, 8, 9, 10, 11], 8))
        .collect();
    let done = all_at_once(&client, short).await?;
    ensure!(done.len() == 5 && done.iter().all(|c| !c.text.is_empty()));

    // Five long generations, read as they come (a client that leaves many
    // small frames unread loses its connection to h2's flood guard). A
    // request's stream opens when it is admitted, so each is its own task.
    let mut running = Vec::new();
    for _ in 0..5 {
        let mut c = client.clone();
        running.push(tokio::spawn(async move {
            let mut stream = c
                .generate(tokens_request(&LONG_RUNNING, 0))
                .await?
                .into_inner();
            while stream.message().await?.is_some() {}
            anyhow::Ok(())
        }));
    }
    wait_for(&mut client, "four running, one waiting", |b| {
        b.active_sequences == 4 && b.waiting_sequences == 1
    })
    .await?;
    let refused = client
        .generate(tokens_request(&[7, 8, 9], 4))
        .await
        .err()
        .context("a sixth request was accepted past --num-parallel 4 --queue 1")?;
    ensure!(
        refused.code() == tonic::Code::ResourceExhausted
            && refused.message().contains("1 requests are already waiting"),
        "{refused:?}"
    );
    // A request that ends frees its place.
    running.remove(0).abort();
    let start = Instant::now();
    loop {
        match client.generate(tokens_request(&[7, 8, 9], 4)).await {
            Ok(_) => break,
            Err(e) if e.code() == tonic::Code::ResourceExhausted => {
                ensure!(
                    start.elapsed() < Duration::from_secs(30),
                    "never freed: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    for r in running {
        r.abort();
    }
    Ok(())
}

/// `--kv-capacity`: requests are admitted while the KV they may come to hold
/// fits (a batch pads every row to the longest); the rest wait, and one
/// that fits only alone runs once the others are done.
#[tokio::test]
async fn kv_capacity_admits_what_fits() -> Result<()> {
    // Each request reserves 12 + 500 = 512 tokens: two fit in 1200, three do not.
    let (_served, mut client) = Served::start(
        &fixtures::model_dir("qwen3-f32")?,
        &["--kv-capacity", "1200"],
    )
    .await?;
    let status = client.status(pb::StatusRequest {}).await?.into_inner();
    let memory = status.memory.context("no memory report")?;
    ensure!(memory.kv_capacity_tokens == 1200, "{memory:?}");
    ensure!(status.model.context("no facts")?.context_length == 1200);

    let req = tokens_request(&LONG_RUNNING, 500);
    let alone = complete(&mut client, req.clone()).await?;
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let mut c = client.clone();
            let r = req.clone();
            tokio::spawn(async move { complete(&mut c, r).await })
        })
        .collect();
    wait_for(&mut client, "two admitted, one waiting", |b| {
        b.active_sequences == 2 && b.waiting_sequences == 1
    })
    .await?;
    for t in tasks {
        let done = t.await??;
        ensure!(done.text == alone.text);
    }
    // One request as long as the whole capacity runs (it evicts the prompt
    // cache entry it does not fit beside).
    let whole = tokens_request(&LONG_RUNNING, 0);
    let done = complete(&mut client, whole).await?;
    ensure!(done.metrics().eval_tokens as usize == 1200 - LONG_RUNNING.len() + 1);
    ensure!(done.reason() == pb::DoneReason::Length);
    Ok(())
}
