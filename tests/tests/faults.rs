//! Hostile chat templates and process faults, with real processes: each ends
//! with a clear error for the affected request only, within a bounded time,
//! and the next request is served. The times to the client's error and the
//! runner's peak RSS are printed (`cargo test -- --nocapture`).
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use grove_proto::v1 as pb;
use grove_proto::v1::grove_client::GroveClient;
use grove_tests::daemon::{Daemon, chat, finish, process_exists};
use grove_tests::fixtures;
use grove_tests::proc::{DEADLINE, OutputWithin};
use grove_tests::real::{self, SMOLLM2};
use tonic::transport::Channel;

/// A copy of the qwen3-f32 fixture whose chat template is `template`.
fn with_template(template: &str) -> Result<tempfile::TempDir> {
    let src = fixtures::model_dir("qwen3-f32")?;
    let tmp = tempfile::tempdir()?;
    for entry in std::fs::read_dir(&src)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == "chat_template.jinja" {
            continue;
        }
        std::fs::copy(entry.path(), tmp.path().join(&name))?;
    }
    let path = tmp.path().join("tokenizer_config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    config["chat_template"] = serde_json::Value::String(template.into());
    std::fs::write(&path, serde_json::to_string(&config)?)?;
    Ok(tmp)
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

async fn runner_pid(c: &mut GroveClient<Channel>, model: &str) -> Result<u32> {
    let ps = c.ps(pb::PsRequest {}).await?.into_inner().models;
    Ok(ps
        .iter()
        .find(|m| m.name == model)
        .with_context(|| format!("{model} is not loaded: {ps:?}"))?
        .pid)
}

/// Peak resident memory of a process (VmHWM), in MiB.
fn peak_rss_mib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .context("no VmHWM")?
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()?;
    Ok(kb / 1024)
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a process this test's daemon started.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// The error a stream ends with, and when.
async fn stream_error(
    stream: Result<tonic::Response<tonic::Streaming<pb::GenerateResponse>>, tonic::Status>,
) -> Result<tonic::Status> {
    let mut stream = match stream {
        Ok(s) => s.into_inner(),
        Err(e) => return Ok(e),
    };
    loop {
        match stream.message().await {
            Ok(Some(m)) if matches!(m.event, Some(pb::generate_response::Event::Done(_))) => {
                bail!("the request finished normally")
            }
            Ok(Some(_)) => continue,
            Ok(None) => bail!("the stream ended without an error"),
            Err(e) => return Ok(e),
        }
    }
}

fn generate(model: &str, prompt: &str, max_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest {
        model: model.into(),
        prompt: prompt.into(),
        options: Some(pb::Options {
            max_tokens: Some(max_tokens),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Serves a raw prompt on `model` to the end.
async fn served(c: &mut GroveClient<Channel>, model: &str) -> Result<()> {
    let (_, done) = finish(c.generate(generate(model, "Hello", 2)).await?.into_inner()).await?;
    ensure!(done.metrics.context("metrics")?.eval_tokens > 0);
    Ok(())
}

/// Templates that loop and grow end in INVALID_ARGUMENT naming the limit, fast;
/// the runner's memory stays small, and the same runner serves on. (The time
/// limit is far off here, so that each case meets the limit it is for even
/// when the machine is busy: under `make test`'s load the string doubling once
/// took past a 3 s limit before it reached its memory limit.)
#[tokio::test]
async fn hostile_templates_are_stopped_by_their_limits() -> Result<()> {
    let cases = [
        (
            "nested loops writing 1 GB",
            "{% for i in range(10000) %}{% for j in range(10000) %}{{ 'xxxxxxxxxx' }}{% endfor %}{% endfor %}",
            "rendered more than",
        ),
        (
            "nested loops writing nothing",
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "budget of 20000000 template instructions",
        ),
        (
            "a string doubled 40 times",
            "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
            "256 MiB of memory",
        ),
        (
            "raise_exception",
            "{{ raise_exception('no such role') }}",
            "rejected the conversation: no such role",
        ),
    ];
    let (_d, mut c) = Daemon::start(&[
        ("GROVE_TEMPLATE_TIMEOUT", "60"),
        ("GROVE_TEMPLATE_MEMORY", "268435456"),
    ])
    .await?;
    for (what, template, expected) in cases {
        stopped(&mut c, what, template, expected, Duration::from_secs(20)).await?;
    }
    Ok(())
}

/// A template that stalls ends at the time limit, as the others at theirs.
#[tokio::test]
async fn slow_templates_are_stopped_by_their_time_limit() -> Result<()> {
    let (_d, mut c) = Daemon::start(&[("GROVE_TEMPLATE_TIMEOUT", "3")]).await?;
    stopped(
        &mut c,
        "slow string work",
        "{% for i in range(4000) %}{% set x = ('ab' * 4000000)|replace('a', 'c') %}{% endfor %}hi",
        "did not finish within",
        Duration::from_secs(8),
    )
    .await
}

/// Chats on a model whose template is `template`: INVALID_ARGUMENT naming
/// `expected` within `bound`, the runner's peak memory within 64 MiB of what it
/// was, and the same runner serving a raw prompt before and after. The whole
/// case (the load, the chat, the raw prompts, the unload) has a deadline: the
/// bound and two minutes more.
async fn stopped(
    c: &mut GroveClient<Channel>,
    what: &str,
    template: &str,
    expected: &str,
    bound: Duration,
) -> Result<()> {
    let wait = bound + Duration::from_secs(120);
    let case = async {
        let dir = with_template(template)?;
        let model = path_str(dir.path());
        served(c, &model).await?;
        let pid = runner_pid(c, &model).await?;
        let before = peak_rss_mib(pid)?;
        let started = Instant::now();
        let err = c
            .chat(chat(&model, "hi", 4))
            .await
            .err()
            .with_context(|| format!("{what}: the chat succeeded"))?;
        let took = started.elapsed();
        ensure!(
            err.code() == tonic::Code::InvalidArgument && err.message().contains(expected),
            "{what}: {err:?}"
        );
        ensure!(took < bound, "{what}: took {took:?}");
        let peak = peak_rss_mib(pid)?;
        ensure!(
            peak < before + 64,
            "{what}: runner peak RSS grew from {before} to {peak} MiB"
        );
        served(c, &model).await?;
        ensure!(
            runner_pid(c, &model).await? == pid,
            "{what}: the runner restarted"
        );
        eprintln!(
            "hostile template: {what}: error after {:.2}s, runner peak RSS {peak} MiB: {}",
            took.as_secs_f64(),
            err.message()
        );
        c.unload(pb::UnloadRequest { model }).await?;
        Ok(())
    };
    tokio::time::timeout(wait, case)
        .await
        .with_context(|| format!("{what}: not done within {wait:?}"))?
}

/// The sandbox's smallest memory limit (64 MiB) still renders a real
/// model's template: the child starts no OpenBLAS thread per core (each
/// counts ~32 MiB against its limit; on a 16-core GPU machine they filled
/// the default 1 GiB and every chat failed). Fails here, on two cores,
/// when the child starts its pool.
#[tokio::test]
async fn templates_render_within_the_smallest_sandbox() -> Result<()> {
    let (_d, mut c) = Daemon::start(&[("GROVE_TEMPLATE_MEMORY", "67108864")]).await?;
    let model = path_str(&fixtures::model_dir("qwen3-f32")?);
    let (_, done) = finish(c.chat(chat(&model, "hi", 2)).await?.into_inner()).await?;
    ensure!(done.metrics.context("metrics")?.eval_tokens > 0);
    Ok(())
}

/// A slow template keeps no one from shutting the runner down: a SIGTERM
/// mid-render ends the runner (and its sandbox) within a bounded time.
#[tokio::test]
async fn sigterm_mid_render_ends_the_runner() -> Result<()> {
    let dir = with_template(
        "{% for i in range(2000) %}{% set x = ('ab' * 4000000)|replace('a', 'c') %}{% endfor %}hi",
    )?;
    let model = path_str(dir.path());
    let (_d, mut c) = Daemon::start(&[("GROVE_TEMPLATE_TIMEOUT", "60")]).await?;
    served(&mut c, &model).await?;
    let pid = runner_pid(&mut c, &model).await?;
    let mut c2 = c.clone();
    let request = tokio::spawn({
        let model = model.clone();
        async move { stream_error(c2.chat(chat(&model, "hi", 4)).await).await }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let started = Instant::now();
    signal(pid, libc::SIGTERM);
    let err = request.await??;
    let gone = wait_for(Duration::from_secs(8), || !process_exists(pid)).await;
    ensure!(gone, "the runner outlived SIGTERM by 8 s");
    eprintln!(
        "fault: SIGTERM mid-render: client error after {:.2}s, runner gone after {:.2}s: {}",
        started.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64(),
        err.message()
    );
    served(&mut c, &path_str(&fixtures::model_dir("qwen3-f32")?)).await?;
    Ok(())
}

async fn wait_for(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    cond()
}

/// The tests that need a prefill lasting seconds run MLX's own CPU quantized
/// kernel (~18 tok/s on SmolLM2 here) rather than Grove's (~140 tok/s): what
/// they test is what a runner busy for that long does, not its speed.
const SLOW_PREFILL: (&str, &str) = ("GROVE_CPU_KERNELS", "mlx");

/// Where in a request a fault lands.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Prefill,
    Decode,
    Render,
}

/// A request that will be in `phase` for several seconds, and a model for it.
fn long_request(phase: Phase, slow_template: &Path) -> Result<(String, LongRequest)> {
    let smollm = path_str(&real::model(SMOLLM2)?);
    Ok(match phase {
        // MLX's own quantized kernel (SLOW_PREFILL) prefills ~18 tok/s on this
        // CPU: ~290 tokens take ~16 s.
        Phase::Prefill => (
            smollm.clone(),
            LongRequest::Generate(generate(&smollm, &"The history of France. ".repeat(48), 4)),
        ),
        Phase::Decode => (
            smollm.clone(),
            LongRequest::Generate(generate(&smollm, "Once upon a time", 400)),
        ),
        Phase::Render => {
            let m = path_str(slow_template);
            (m.clone(), LongRequest::Chat(chat(&m, "hi", 4)))
        }
    })
}

enum LongRequest {
    Generate(pb::GenerateRequest),
    Chat(pb::ChatRequest),
}

async fn send(
    mut c: GroveClient<Channel>,
    r: LongRequest,
) -> Result<tonic::Response<tonic::Streaming<pb::GenerateResponse>>, tonic::Status> {
    match r {
        LongRequest::Generate(g) => c.generate(g).await,
        LongRequest::Chat(ch) => c.chat(ch).await,
    }
}

/// Runner SIGKILL, SIGSTOP and SIGTERM mid-prefill, mid-decode and
/// mid-render: the request fails (UNAVAILABLE for a dead or stuck runner) within
/// a bounded time, and the next request is served by a fresh runner.
#[tokio::test]
async fn runner_faults_fail_only_their_request() -> Result<()> {
    let slow = with_template(
        "{% for i in range(4000) %}{% set x = ('ab' * 4000000)|replace('a', 'c') %}{% endfor %}hi",
    )?;
    let (_d, mut c) = Daemon::start(&[
        ("GROVE_RUNNER_TIMEOUT", "2s"),
        ("GROVE_TEMPLATE_TIMEOUT", "60"),
        SLOW_PREFILL,
    ])
    .await?;
    for sig in [libc::SIGKILL, libc::SIGSTOP, libc::SIGTERM] {
        for phase in [Phase::Prefill, Phase::Decode, Phase::Render] {
            let (model, request) = long_request(phase, slow.path())?;
            served(&mut c, &model).await?;
            let pid = runner_pid(&mut c, &model).await?;
            let pending = tokio::spawn(send(c.clone(), request));
            // Into the phase: decoding has begun once text flows; prefill and
            // rendering last many seconds from the start.
            tokio::time::sleep(Duration::from_millis(match phase {
                Phase::Decode => 5000,
                _ => 1500,
            }))
            .await;
            let started = Instant::now();
            signal(pid, sig);
            let err = stream_error(pending.await?).await?;
            let took = started.elapsed();
            ensure!(
                matches!(err.code(), tonic::Code::Unavailable | tonic::Code::Internal),
                "{sig} {phase:?}: {err:?}"
            );
            if sig == libc::SIGSTOP {
                ensure!(
                    err.message().contains("stopped answering"),
                    "{phase:?}: {}",
                    err.message()
                );
            }
            // A SIGTERM ends decoding at the next step; an uninterruptible
            // prefill chunk or rendering ends with the runner's 4 s deadline.
            let limit = match (sig, phase) {
                (libc::SIGTERM, Phase::Decode) => Duration::from_secs(2),
                _ => Duration::from_secs(8),
            };
            ensure!(took < limit, "{sig} {phase:?}: {took:?}");
            let gone = wait_for(Duration::from_secs(8), || !process_exists(pid)).await;
            ensure!(gone, "{sig} {phase:?}: the runner is still there");
            eprintln!(
                "fault: signal {sig} mid-{phase:?}: client error after {:.2}s: {}",
                took.as_secs_f64(),
                err.message().lines().next().unwrap_or_default()
            );
            served(&mut c, &model).await?;
            ensure!(runner_pid(&mut c, &model).await? != pid);
        }
    }
    Ok(())
}

/// A long prefill on a healthy runner is not mistaken for a stuck one, even
/// with a 2 s deadline.
#[tokio::test]
async fn long_healthy_prefill_is_not_killed() -> Result<()> {
    let smollm = path_str(&real::model(SMOLLM2)?);
    let (_d, mut c) = Daemon::start(&[("GROVE_RUNNER_TIMEOUT", "2s"), SLOW_PREFILL]).await?;
    let started = Instant::now();
    let (_, done) = finish(
        c.generate(generate(&smollm, &"The history of France. ".repeat(32), 2))
            .await?
            .into_inner(),
    )
    .await?;
    let m = done.metrics.context("metrics")?;
    ensure!(
        m.prompt_eval_ns > 4_000_000_000,
        "the prefill took only {} ns; it must outlast the 2 s deadline",
        m.prompt_eval_ns
    );
    eprintln!(
        "healthy prefill of {} tokens took {:.1}s with GROVE_RUNNER_TIMEOUT=2s",
        m.prompt_tokens,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A daemon killed mid-stream takes its runners with it (no orphans), and the
/// next daemon removes the dead one's socket directory and serves.
#[tokio::test]
async fn daemon_sigkill_leaves_no_orphans() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let tmpdir = path_str(tmp.path());
    let m = path_str(&fixtures::model_dir("qwen3-f32")?);
    let (mut d, mut c) = Daemon::start(&[("TMPDIR", &tmpdir)]).await?;
    let mut stream = c.chat(chat(&m, "Once upon a time", 0)).await?.into_inner();
    stream.message().await?.context("no first piece")?;
    let pid = runner_pid(&mut c, &m).await?;
    let dirs = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().contains("grove-runners-"))
            .collect()
    };
    let old = dirs(tmp.path());
    ensure!(old.len() == 1, "{old:?}");
    let daemon_pid = d.pid();
    signal(daemon_pid, libc::SIGKILL);
    let err = loop {
        match stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => bail!("the stream ended without an error"),
            Err(e) => break e,
        }
    };
    ensure!(
        wait_for(Duration::from_secs(5), || !process_exists(pid)).await,
        "the runner outlived its daemon"
    );
    eprintln!(
        "fault: daemon SIGKILL mid-stream: client error {:?}",
        err.code()
    );
    // Reaped, as the daemon's parent (a shell, systemd) would.
    d.wait_exit(Duration::from_secs(5))?;
    let (_d2, mut c2) = Daemon::start(&[("TMPDIR", &tmpdir)]).await?;
    ensure!(
        !old[0].exists(),
        "the dead daemon's socket dir is still there"
    );
    served(&mut c2, &m).await?;
    drop(d);
    Ok(())
}

/// Every entry under `dir`, recursively (links not followed).
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

/// A full disk (simulated with RLIMIT_FSIZE: writes past the limit fail with
/// EFBIG, as they would with ENOSPC) while importing a GGUF file, importing it
/// into the store, and pulling: each is a clear error, leaves no partial file
/// anywhere a model is looked for, and the same work succeeds once there is room.
#[tokio::test]
async fn disk_full_fails_cleanly_and_loses_nothing() -> Result<()> {
    use grove_tests::daemon::limit_file_size;
    let gguf = real::model(SMOLLM2)?;
    let runner = grove_tests::runner::binary("grove-runner")?;
    let grove = grove_tests::runner::binary("grove")?;

    // grove-runner import.
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("smollm2");
    let mut cmd = std::process::Command::new(&runner);
    cmd.arg("import").arg(&gguf).arg(&out);
    limit_file_size(&mut cmd, 8 << 20);
    let o = cmd.output_within(DEADLINE)?;
    let err = String::from_utf8_lossy(&o.stderr);
    ensure!(
        !o.status.success() && err.contains("grove-runner: error: "),
        "{err}"
    );
    ensure!(
        tree(tmp.path()).is_empty(),
        "left behind: {:?}",
        tree(tmp.path())
    );
    eprintln!("fault: disk full during import: {}", err.trim());

    // grove import into the store.
    let hub = tempfile::tempdir()?;
    let mut cmd = std::process::Command::new(&grove);
    cmd.arg("import")
        .arg(&gguf)
        .arg("test-org/full")
        .env("HF_HUB_CACHE", hub.path())
        .env("GROVE_RUNNER", &runner);
    limit_file_size(&mut cmd, 8 << 20);
    let o = cmd.output_within(DEADLINE)?;
    let err = String::from_utf8_lossy(&o.stderr);
    ensure!(!o.status.success(), "{err}");
    let left = tree(hub.path());
    ensure!(
        left.iter()
            .all(|p| !p.to_string_lossy().contains("snapshots")
                && !p.to_string_lossy().contains(".grove-import")),
        "left behind: {left:?}"
    );
    eprintln!("fault: disk full during grove import: {}", err.trim());
    let o = std::process::Command::new(&grove)
        .arg("import")
        .arg(&gguf)
        .arg("test-org/full")
        .env("HF_HUB_CACHE", hub.path())
        .env("GROVE_RUNNER", &runner)
        .output_within(DEADLINE)?;
    ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // A pull through a daemon that cannot write more than 64 KiB per file.
    let server = grove_tests::hub_server::HubServer::start().await?;
    server.add_fixture("test-org/tiny-qwen", &fixtures::model_dir("qwen2-f32")?)?;
    let endpoint = server.endpoint();
    let cache = tempfile::tempdir()?;
    let cache_s = path_str(cache.path());
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HUB_OFFLINE", "0"),
        ("HF_HUB_CACHE", cache_s.as_str()),
    ];
    {
        let (_d, mut c) = Daemon::start_with(&env, Some(64 << 10)).await?;
        let err = match c
            .pull(pb::PullRequest {
                model: "test-org/tiny-qwen".into(),
                ..Default::default()
            })
            .await
        {
            Err(e) => e,
            Ok(s) => stream_pull_error(s.into_inner()).await?,
        };
        eprintln!("fault: disk full during pull: {}", err.message());
        let models = c.list(pb::ListRequest {}).await?.into_inner().models;
        ensure!(models.is_empty(), "a partial pull is listed: {models:?}");
        // What the snapshot shows is whole and verified (the rest resumes later).
        let repo = server.repo("test-org/tiny-qwen").context("repo")?;
        for p in tree(cache.path()) {
            let Ok(rel) = p.strip_prefix(cache.path()) else {
                continue;
            };
            let parts: Vec<String> = rel
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            if parts.len() == 4 && parts[1] == "snapshots" {
                let want = repo.files.get(&parts[3]).context("unknown file")?;
                ensure!(
                    std::fs::read(&p)? == *want.data,
                    "{} is partial",
                    p.display()
                );
            }
        }
    }
    let (_d, mut c) = Daemon::start_with(&env, None).await?;
    let s = c
        .pull(pb::PullRequest {
            model: "test-org/tiny-qwen".into(),
            ..Default::default()
        })
        .await?;
    let mut s = s.into_inner();
    while s.message().await?.is_some() {}
    served(&mut c, "test-org/tiny-qwen").await?;
    Ok(())
}

async fn stream_pull_error(mut s: tonic::Streaming<pb::PullProgress>) -> Result<tonic::Status> {
    loop {
        match s.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => bail!("the pull finished"),
            Err(e) => return Ok(e),
        }
    }
}
