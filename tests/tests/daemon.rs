//! `grove serve` end to end: real daemon, real runner processes, fixture models.
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use grove_proto::v1 as pb;
use grove_proto::v1::grove_client::GroveClient;
use grove_tests::daemon::{Daemon, chat, finish, process_exists};
use grove_tests::fixtures;
use tonic::transport::Channel;

/// A prompt the qwen fixtures continue to the end of their 4096-token context.
const ENDLESS: &str = "Once upon a time";

fn model(name: &str) -> Result<String> {
    Ok(fixtures::model_dir(name)?
        .canonicalize()?
        .display()
        .to_string())
}

async fn ps(c: &mut GroveClient<Channel>) -> Result<Vec<pb::RunningModel>> {
    Ok(c.ps(pb::PsRequest {}).await?.into_inner().models)
}

async fn wait_until<F: AsyncFnMut() -> Result<bool>>(
    what: &str,
    within: Duration,
    mut cond: F,
) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if cond().await? {
            return Ok(start.elapsed());
        }
        ensure!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Under a budget that fits one model, loading a second evicts the idle first.
#[tokio::test]
async fn second_model_evicts_the_idle_first() -> Result<()> {
    // Each fixture reserves ~258 MB (weights + 2048 tokens of KV + 256 MB headroom).
    let (_d, mut c) = Daemon::start(&[("GROVE_MEMORY", "400000000")]).await?;
    let (a, b) = (model("qwen3-f32")?, model("llama-q4")?);
    finish(c.chat(chat(&a, "hello", 4)).await?.into_inner()).await?;
    let loaded = ps(&mut c).await?;
    ensure!(loaded.len() == 1 && loaded[0].name == a, "{loaded:?}");
    let first_pid = loaded[0].pid;
    finish(c.chat(chat(&b, "hello", 4)).await?.into_inner()).await?;
    let loaded = ps(&mut c).await?;
    ensure!(
        loaded.len() == 1 && loaded[0].name == b,
        "expected only {b}: {loaded:?}"
    );
    wait_until("evicted runner exits", Duration::from_secs(8), async || {
        Ok(!process_exists(first_pid))
    })
    .await?;

    // A budget that fits neither is RESOURCE_EXHAUSTED with the numbers.
    let (_d2, mut small) = Daemon::start(&[("GROVE_MEMORY", "1000000")]).await?;
    let err = small
        .chat(chat(&a, "hello", 4))
        .await
        .err()
        .context("loaded into 1 MB")?;
    ensure!(err.code() == tonic::Code::ResourceExhausted, "{err:?}");
    ensure!(err.message().contains("1000000"), "{}", err.message());
    Ok(())
}

/// A runner killed mid-stream fails only its request (UNAVAILABLE); the daemon
/// stays up and the next request gets a fresh runner.
#[tokio::test]
async fn runner_crash_fails_only_its_request() -> Result<()> {
    let (mut d, mut c) = Daemon::start(&[]).await?;
    let m = model("qwen3-f32")?;
    let mut stream = c.chat(chat(&m, ENDLESS, 0)).await?.into_inner();
    stream.message().await?.context("no first piece")?;
    let pid = ps(&mut c).await?.first().context("nothing loaded")?.pid;
    // SAFETY: kill(2) on the runner the daemon started.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    let err = loop {
        match stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => anyhow::bail!("the stream ended without an error"),
            Err(e) => break e,
        }
    };
    ensure!(err.code() == tonic::Code::Unavailable, "{err:?}");
    ensure!(d.alive(), "the daemon died with its runner");
    let (text, done) = finish(c.chat(chat(&m, "hello", 4)).await?.into_inner()).await?;
    ensure!(done.metrics.context("metrics")?.eval_tokens > 0, "{text:?}");
    let new_pid = ps(&mut c).await?.first().context("nothing loaded")?.pid;
    ensure!(new_pid != pid, "the dead runner was reused");
    Ok(())
}

/// A client that goes away stops the runner's work: the model is idle at once
/// and the next request is served without waiting.
#[tokio::test]
async fn cancelled_client_frees_the_runner() -> Result<()> {
    let (_d, mut c) = Daemon::start(&[]).await?;
    let m = model("qwen3-f32")?;
    let mut stream = c.chat(chat(&m, ENDLESS, 0)).await?.into_inner();
    stream.message().await?.context("no first piece")?;
    drop(stream);
    let took = wait_until("idle after cancel", Duration::from_secs(3), async || {
        Ok(ps(&mut c)
            .await?
            .first()
            .is_some_and(|r| r.active_requests == 0))
    })
    .await?;
    let start = Instant::now();
    finish(c.chat(chat(&m, "hello", 4)).await?.into_inner()).await?;
    ensure!(
        start.elapsed() < Duration::from_secs(3),
        "the next request waited {:?}",
        start.elapsed()
    );
    eprintln!("idle {took:?} after the client left");
    Ok(())
}

/// 64 concurrent clients on one model all complete, each with the text it
/// gets alone; a small queue overflows with RESOURCE_EXHAUSTED at once.
#[tokio::test]
async fn concurrent_clients_and_queue_limit() -> Result<()> {
    // 64 clients at once get what each gets alone: the runner batches them.
    let (d, mut c) = Daemon::start(&[]).await?;
    let m = model("llama-q4")?;
    let say = |i: usize| chat(&m, &format!("client {i} says hello"), 8 + (i % 5) as u32);
    let mut alone = Vec::new();
    for i in 0..64 {
        alone.push(finish(c.chat(say(i)).await?.into_inner()).await?.0);
    }
    let mut tasks = Vec::new();
    for i in 0..64 {
        let mut c = d.client().await?;
        let req = say(i);
        tasks.push(tokio::spawn(async move {
            let r = c.chat(req).await?;
            finish(r.into_inner()).await.map_err(anyhow::Error::from)
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let (text, d) = t.await??;
        ensure!(d.metrics.is_some());
        ensure!(
            text == alone[i],
            "client {i}: {text:?} together, {:?} alone",
            alone[i]
        );
    }

    let (d, mut c) = Daemon::start(&[("GROVE_MAX_QUEUE", "2")]).await?;
    let q = model("qwen3-f32")?;
    finish(c.chat(chat(&q, "warm up", 2)).await?.into_inner()).await?;
    // Two requests run (the runner batches them), so a third finds the
    // daemon's queue of 2 (running and waiting requests) full.
    let s1 = c.chat(chat(&q, ENDLESS, 0)).await?.into_inner();
    let mut c2 = d.client().await?;
    let q2 = q.clone();
    let waiting = tokio::spawn(async move { c2.chat(chat(&q2, ENDLESS, 0)).await });
    let queued = wait_until(
        "second request running",
        Duration::from_secs(5),
        async || {
            Ok(ps(&mut c)
                .await?
                .first()
                .is_some_and(|r| r.active_requests == 2))
        },
    )
    .await;
    queued?;
    let mut c3 = d.client().await?;
    let start = Instant::now();
    let err = c3
        .chat(chat(&q, ENDLESS, 0))
        .await
        .err()
        .context("a third request was queued")?;
    ensure!(err.code() == tonic::Code::ResourceExhausted, "{err:?}");
    ensure!(
        start.elapsed() < Duration::from_secs(1),
        "the refusal took {:?}",
        start.elapsed()
    );
    drop(s1);
    waiting.abort();
    Ok(())
}

/// Clients that stop reading long generations do not break the runner's
/// connection, which carries every request of that model: the daemon keeps
/// reading the runner and hands the slow client its text in larger pieces
/// (h2 closes a connection that leaves ~10k small frames unread), and other
/// clients are served meanwhile.
#[tokio::test]
async fn slow_clients_do_not_break_the_runner_connection() -> Result<()> {
    const TOKENS: u32 = 3500;
    let (d, mut c) = Daemon::start(&[]).await?;
    let m = model("qwen3-f32")?;
    // Raw text that qwen3-f32 continues past TOKENS without EOS.
    let story = pb::GenerateRequest {
        model: m.clone(),
        prompt: "Once upon a time".into(),
        options: Some(pb::Options {
            max_tokens: Some(TOKENS),
            ..Default::default()
        }),
        ..Default::default()
    };
    let start = Instant::now();
    let alone = finish(c.generate(story.clone()).await?.into_inner()).await?;
    let n = alone.1.metrics.as_ref().map_or(0, |x| x.eval_tokens);
    ensure!(n == TOKENS, "alone: {n} tokens, {:?}", alone.1);
    let took = start.elapsed();

    let mut slow = d.client_with_window(4096).await?;
    let mut streams = Vec::new();
    for _ in 0..4 {
        streams.push(slow.generate(story.clone()).await?.into_inner());
    }
    // Another client is served while the slow one reads nothing.
    let other = finish(c.chat(chat(&m, "hello", 8)).await?.into_inner()).await?;
    ensure!(!other.0.is_empty());
    // Four together take no longer than four alone: by then the runner has
    // sent every token (~14k small frames without coalescing).
    tokio::time::sleep(took * 4 + Duration::from_secs(1)).await;
    for (i, s) in streams.into_iter().enumerate() {
        let (text, _) = finish(s).await?;
        ensure!(
            text == alone.0,
            "slow stream {i} differs from alone ({} vs {} bytes)",
            text.len(),
            alone.0.len()
        );
    }
    Ok(())
}

/// keep_alive 0 leaves no runner behind; an expired keep_alive unloads.
#[tokio::test]
async fn keep_alive_unloads() -> Result<()> {
    let (_d, mut c) = Daemon::start(&[("GROVE_KEEP_ALIVE", "1s")]).await?;
    let m = model("mistral-q4")?;
    let mut req = chat(&m, "hello", 2);
    req.keep_alive_ns = Some(0);
    finish(c.chat(req).await?.into_inner()).await?;
    ensure!(ps(&mut c).await?.is_empty(), "keep_alive 0 left a runner");

    finish(c.chat(chat(&m, "hello", 2)).await?.into_inner()).await?;
    let pid = ps(&mut c).await?.first().context("not loaded")?.pid;
    wait_until("keep_alive 1s expiry", Duration::from_secs(5), async || {
        Ok(ps(&mut c).await?.is_empty())
    })
    .await?;
    wait_until("expired runner exits", Duration::from_secs(8), async || {
        Ok(!process_exists(pid))
    })
    .await?;
    Ok(())
}

/// SIGTERM drains: in-flight streams end with a status, runners are stopped.
#[tokio::test]
async fn sigterm_stops_runners_and_ends_streams() -> Result<()> {
    let (mut d, mut c) = Daemon::start(&[]).await?;
    let m = model("qwen2-f32")?;
    let mut stream = c.chat(chat(&m, ENDLESS, 0)).await?.into_inner();
    stream.message().await?.context("no first piece")?;
    let pid = ps(&mut c).await?.first().context("not loaded")?.pid;
    let status = d.terminate(Duration::from_secs(15))?;
    ensure!(status.success(), "daemon exit status {status}");
    ensure!(!process_exists(pid), "the runner outlived the daemon");
    let ended = loop {
        match stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    let err = ended.err().context("the stream ended as if complete")?;
    ensure!(err.code() == tonic::Code::Unavailable, "{err:?}");
    Ok(())
}

/// Unknown models and bad requests are clear errors; Show reads a model's facts.
#[tokio::test]
async fn errors_and_show() -> Result<()> {
    let (_d, mut c) = Daemon::start(&[]).await?;
    let err = c
        .chat(chat("nobody/nothing", "hi", 2))
        .await
        .err()
        .context("unknown model accepted")?;
    ensure!(err.code() == tonic::Code::NotFound, "{err:?}");
    ensure!(err.message().contains("grove pull"), "{}", err.message());
    let err = c
        .chat(chat("../../etc", "hi", 2))
        .await
        .err()
        .context("bad name accepted")?;
    ensure!(
        matches!(
            err.code(),
            tonic::Code::InvalidArgument | tonic::Code::NotFound
        ),
        "{err:?}"
    );
    let m = model("qwen3-q4")?;
    let mut req = chat(&m, "hi", 2);
    req.messages[0].role = 0;
    let err = c
        .chat(req)
        .await
        .err()
        .context("roleless message accepted")?;
    ensure!(err.code() == tonic::Code::InvalidArgument, "{err:?}");

    let show = c
        .show(pb::ShowRequest { model: m.clone() })
        .await?
        .into_inner();
    ensure!(show.architecture == "Qwen3ForCausalLM", "{show:?}");
    ensure!(
        show.quantization == "4-bit (group 64)",
        "{}",
        show.quantization
    );
    ensure!(show.context_length == 4096 && !show.chat_template.is_empty());
    ensure!(show.parameter_count > 100_000, "{}", show.parameter_count);
    ensure!(show.active_parameter_count == show.parameter_count);
    // A mixture of experts: 3/4 of its two layers' 8 experts are idle per token.
    let moe = model("qwen3-moe-q4")?;
    let show = c.show(pb::ShowRequest { model: moe }).await?.into_inner();
    ensure!(
        show.parameter_count - show.active_parameter_count == 2 * 8 * 3 * 64 * 64 * 3 / 4,
        "{show:?}"
    );
    Ok(())
}

/// `Pull` through the daemon from a local hub server; the model is then listed,
/// runnable by its repo id, and removable; `grove pull` draws the progress.
#[tokio::test]
async fn pull_list_run_rm_through_the_daemon() -> Result<()> {
    let hub = grove_tests::hub_server::HubServer::start().await?;
    hub.add_fixture("test-org/tiny-qwen", &fixtures::model_dir("qwen2-f32")?)?;
    let endpoint = hub.endpoint();
    let (d, mut c) = Daemon::start(&[("HF_ENDPOINT", &endpoint), ("HF_HUB_OFFLINE", "0")]).await?;

    // The CLI's progress, from the daemon's stream.
    let mut cmd = std::process::Command::new(grove_tests::runner::binary("grove")?);
    cmd.args(["pull", "test-org/tiny-qwen"])
        .env("GROVE_HOST", &d.addr)
        .env("GROVE_NO_AUTOSTART", "1");
    let out = grove_tests::proc::output_async(cmd, grove_tests::proc::DEADLINE).await?;
    let progress = String::from_utf8_lossy(&out.stderr);
    eprintln!("grove pull test-org/tiny-qwen:\n{progress}");
    ensure!(out.status.success(), "grove pull failed: {progress}");

    let models = c.list(pb::ListRequest {}).await?.into_inner().models;
    ensure!(
        models
            .iter()
            .any(|m| m.name == "test-org/tiny-qwen" && m.size_bytes > 0),
        "{models:?}"
    );
    let (_, done) = finish(
        c.chat(chat("test-org/tiny-qwen", "hello", 4))
            .await?
            .into_inner(),
    )
    .await?;
    ensure!(done.metrics.context("metrics")?.eval_tokens > 0);

    // Pulling again is a no-op; the stream still ends with DONE.
    let mut stream = c
        .pull(pb::PullRequest {
            model: "test-org/tiny-qwen".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut last = None;
    while let Some(m) = stream.message().await? {
        last = Some(m.stage);
    }
    ensure!(last == Some(pb::PullStage::Done as i32), "{last:?}");

    let freed = c
        .delete(pb::DeleteRequest {
            model: "test-org/tiny-qwen".into(),
        })
        .await?
        .into_inner()
        .freed_bytes;
    ensure!(freed > 0);
    ensure!(
        c.list(pb::ListRequest {})
            .await?
            .into_inner()
            .models
            .is_empty()
    );
    let err = c
        .chat(chat("test-org/tiny-qwen", "hello", 4))
        .await
        .err()
        .context("removed model ran")?;
    ensure!(err.code() == tonic::Code::NotFound, "{err:?}");
    Ok(())
}

/// Reads the child's stdout until `needle` has appeared `count` times in total.
async fn read_until(
    out: &mut tokio::process::ChildStdout,
    seen: &mut String,
    needle: &str,
    count: usize,
) -> Result<()> {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.matches(needle).count() < count {
        ensure!(
            Instant::now() < deadline,
            "no {needle:?} (#{count}) in: {seen}"
        );
        let n = tokio::time::timeout(Duration::from_secs(30), out.read(&mut buf)).await??;
        ensure!(n > 0, "stdout closed; got: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    Ok(())
}

/// `grove run MODEL` without a prompt: an interactive chat that keeps its
/// history, takes triple-quoted multi-line input, /clear and /bye, and where
/// Ctrl-C cancels the answer, not the session.
#[tokio::test]
async fn interactive_chat_session() -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let (d, mut c) = Daemon::start(&[]).await?;
    let m = model("qwen3-f32")?;
    let mut child = tokio::process::Command::new(grove_tests::runner::binary("grove")?);
    child
        .args(["run", &m, "--verbose"])
        .env("GROVE_HOST", &d.addr)
        .env("GROVE_NO_AUTOSTART", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    grove_tests::proc::own_group(child.as_std_mut());
    let mut child = child.spawn()?;
    let _group = grove_tests::proc::KillOnDrop(child.id().context("pid")?);
    let mut stdin = child.stdin.take().context("stdin")?;
    let mut out = child.stdout.take().context("stdout")?;
    let mut seen = String::new();
    read_until(&mut out, &mut seen, ">>> ", 1).await?;

    // A long answer (this fixture answers "hello" past 2000 tokens in chat
    // mode), interrupted with Ctrl-C: the session goes on.
    stdin.write_all(b"hello\n").await?;
    // Interrupt only once the answer is visibly streaming.
    let before = seen.len();
    while seen.len() < before + 16 {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(30), out.read(&mut buf)).await??;
        ensure!(n > 0, "stdout closed; got: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let pid = child.id().context("pid")?;
    // SAFETY: SIGINT to our own child.
    unsafe {
        libc::kill(pid as i32, libc::SIGINT);
    }
    read_until(&mut out, &mut seen, ">>> ", 2).await?;
    wait_until(
        "runner idle after Ctrl-C",
        Duration::from_secs(3),
        async || {
            Ok(ps(&mut c)
                .await?
                .first()
                .is_some_and(|r| r.active_requests == 0))
        },
    )
    .await?;

    // Two turns, the second multi-line: the history is sent again each turn.
    stdin.write_all(b"hello there\n").await?;
    read_until(&mut out, &mut seen, ">>> ", 3).await?;
    stdin
        .write_all(b"\"\"\"first line\nsecond line\"\"\"\n")
        .await?;
    read_until(&mut out, &mut seen, ">>> ", 4).await?;
    stdin.write_all(b"/clear\n").await?;
    read_until(&mut out, &mut seen, "Cleared session context", 1).await?;
    stdin.write_all(b"/bye\n").await?;
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await??;
    ensure!(status.success(), "grove run exited with {status}: {seen}");

    // --verbose wrote the metrics of each answer: the second answered turn's
    // prompt holds the first turn, most of it from the prompt cache.
    let mut err = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_string(
            &mut child.stderr.take().context("stderr")?,
            &mut err,
        ),
    )
    .await
    .context("stderr still open 10 s after grove run exited")??;
    let counts: Vec<(u32, u32)> = err
        .lines()
        .filter_map(|l| l.strip_prefix("prompt eval count:"))
        .filter_map(|l| {
            let mut nums = l
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty());
            Some((nums.next()?.parse().ok()?, nums.next()?.parse().ok()?))
        })
        .collect();
    ensure!(
        counts.len() == 2,
        "expected metrics of 2 answers (the cancelled one has none): {err}"
    );
    ensure!(
        counts[1].0 > counts[0].0 && counts[1].1 >= counts[0].0,
        "history not kept: {counts:?}"
    );
    Ok(())
}
