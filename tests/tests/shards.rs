//! Tensor parallelism on the CPU: a group of ranks over MLX's ring backend on
//! loopback (`grove-runner generate --shards N`) against mlx-lm and against
//! one runner. Every rank holds 1/N of the heads and of the MLP; greedy
//! tokens must be mlx-lm's exactly and the logits within LOGIT_TOLERANCE
//! (the partial sums add up in another order than one matrix product).
//! Also: what cannot be sharded is refused with the numbers, and a rank that
//! dies takes its group down with it, leaving no process behind.
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use grove_tests::fixtures::{self, Case};
use grove_tests::proc::{DEADLINE, Group, OutputWithin};
use grove_tests::runner::{binary, generate_json, ids_arg, run};

/// Largest absolute difference allowed against mlx-lm's (or one runner's)
/// logits. Measured: ~3e-6 on the float fixtures, ~6e-5 on SmolLM2.
const LOGIT_TOLERANCE: f32 = 1e-4;

/// Generates `case`'s prompt on `dir` with `extra` arguments; returns the
/// tokens and the last prompt position's logits.
fn generate(dir: &std::path::Path, case: &Case, extra: &[&str]) -> Result<(Vec<u32>, Vec<f32>)> {
    generate_ids(dir, &case.prompt_tokens, case.max_tokens, extra)
}

/// As [`generate`], for a prompt of token ids.
fn generate_ids(
    dir: &std::path::Path,
    prompt: &[u32],
    max_tokens: usize,
    extra: &[&str],
) -> Result<(Vec<u32>, Vec<f32>)> {
    let dump = tempfile::NamedTempFile::new()?;
    let ids = ids_arg(prompt);
    let max = max_tokens.to_string();
    let mut args = vec![
        "--model",
        dir.to_str().unwrap_or_default(),
        "--prompt-tokens",
        &ids,
        "--max-tokens",
        &max,
        "--dump-logits",
        dump.path().to_str().unwrap_or_default(),
    ];
    args.extend_from_slice(extra);
    let out = generate_json(&args)?;
    let logits: Vec<f32> = serde_json::from_str(&std::fs::read_to_string(dump.path())?)?;
    Ok((out.tokens, logits))
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
}

/// Every reference case of `model` on 2 ranks gives mlx-lm's tokens.
fn two_ranks_match_mlx_lm(model: &str) -> Result<()> {
    let dir = fixtures::model_dir(model)?;
    let reference = fixtures::reference(model)?;
    ensure!(!reference.cases.is_empty(), "{model}: no reference cases");
    for case in &reference.cases {
        let (tokens, logits) = generate(&dir, case, &["--shards", "2"])?;
        ensure!(
            tokens == case.tokens,
            "{model}/{} on 2 ranks: tokens differ from mlx-lm\n grove:  {tokens:?}\n mlx-lm: {:?}",
            case.name,
            case.tokens
        );
        ensure!(logits.len() == case.logits.len());
        let w = worst(&logits, &case.logits);
        ensure!(
            w <= LOGIT_TOLERANCE,
            "{model}/{} on 2 ranks: logits differ from mlx-lm by up to {w:e}",
            case.name
        );
    }
    Ok(())
}

#[test]
fn llama_on_two_ranks_matches_mlx_lm() -> Result<()> {
    two_ranks_match_mlx_lm("llama-f32")
}

#[test]
fn mistral_on_two_ranks_matches_mlx_lm() -> Result<()> {
    two_ranks_match_mlx_lm("mistral-f32")
}

#[test]
fn qwen2_on_two_ranks_matches_mlx_lm() -> Result<()> {
    // Biases on q, k and v: split with their rows.
    two_ranks_match_mlx_lm("qwen2-f32")
}

#[test]
fn qwen3_on_two_ranks_matches_mlx_lm() -> Result<()> {
    // Norms over each q and k head: whole on every rank.
    two_ranks_match_mlx_lm("qwen3-f32")
}

#[test]
fn qwen3_moe_on_two_ranks_matches_mlx_lm() -> Result<()> {
    // Every expert split by its width (stacked, mlx-lm's layout), the
    // router whole; a dense layer among them (mlp_only_layers).
    two_ranks_match_mlx_lm("qwen3-moe-f32")
}

#[test]
fn qwen3_moe_in_hf_layout_on_two_ranks_matches_mlx_lm() -> Result<()> {
    // One tensor per expert (HF's layout), each sliced before stacking.
    two_ranks_match_mlx_lm("qwen3-moe-hf-f32")
}

#[test]
fn gpt_oss_on_two_ranks_matches_mlx_lm() -> Result<()> {
    // Sinks per head, biases on q/k/v/o and on every expert, the router
    // whole, sliding windows on alternate layers.
    two_ranks_match_mlx_lm("gpt-oss-f32")
}

#[test]
fn qwen3_5_on_two_ranks_matches_mlx_lm() -> Result<()> {
    // Gated delta-nets split by heads (the fused q/k/v projection and the
    // convolution piece by piece), gated attention, an untied head.
    two_ranks_match_mlx_lm("qwen3.5-f32")
}

#[test]
fn qwen3_5_moe_on_two_ranks_matches_mlx_lm() -> Result<()> {
    // Every expert and the shared expert 1/N wide; the shared expert's
    // sigmoid gate and the router whole.
    two_ranks_match_mlx_lm("qwen3.5-moe-f32")
}

#[test]
fn qwen3_5_moe_in_hf_layout_on_two_ranks_matches_mlx_lm() -> Result<()> {
    // HF's names under model.language_model, its convolution layout and
    // its fused gate_up of stacked experts (each half split apart).
    two_ranks_match_mlx_lm("qwen3.5-moe-hf-f32")
}

#[test]
fn glm4_moe_lite_on_two_ranks_matches_mlx_lm() -> Result<()> {
    // Latent attention by heads (q_b_proj's rows, embed_q and unembed_out),
    // the latent and its cache whole on every rank; shared and routed
    // experts 1/N wide, the bias-corrected router whole.
    two_ranks_match_mlx_lm("glm4-moe-lite-f32")
}

/// Runs the Python `script` with `src` and `dst` as its arguments; its
/// error output is the error.
fn python(script: &str, src: &std::path::Path, dst: &std::path::Path) -> Result<()> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args(["-c", script])
        .arg(src)
        .arg(dst)
        .output_within(DEADLINE)?;
    ensure!(
        out.status.success(),
        "{python} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `model` quantized to 4 bits with groups of 32 (the fixtures' groups of
/// 64 span a whole row of o_proj, which two ranks cannot share) by mlx-lm's
/// converter: 2 ranks give one runner's tokens, and a chunked prefill
/// changes nothing.
fn quantized_on_two_ranks_matches_one_runner(model: &str) -> Result<()> {
    let src = fixtures::model_dir(model)?;
    let tmp = tempfile::tempdir()?;
    let dst = tmp.path().join("q4-g32");
    let script = concat!(
        "import sys, contextlib, io\n",
        "from mlx_lm import convert\n",
        "with contextlib.redirect_stdout(io.StringIO()):\n",
        "    convert(sys.argv[1], sys.argv[2], quantize=True, q_bits=4, q_group_size=32)\n",
    );
    python(script, &src, &dst).context("mlx-lm's convert")?;
    let reference = fixtures::reference(model)?;
    let long = reference
        .cases
        .iter()
        .max_by_key(|c| c.prompt_tokens.len())
        .context("no cases")?;
    for case in [&reference.cases[0], long] {
        let (one, one_logits) = generate(&dst, case, &[])?;
        for extra in [
            &["--shards", "2"][..],
            &["--shards", "2", "--prefill-chunk", "7"],
        ] {
            let (two, two_logits) = generate(&dst, case, extra)?;
            ensure!(
                one == two,
                "{} {extra:?}: 2 ranks gave {two:?}, one runner {one:?}",
                case.name
            );
            let w = worst(&one_logits, &two_logits);
            ensure!(
                w <= LOGIT_TOLERANCE,
                "{} {extra:?}: logits differ by {w:e}",
                case.name
            );
        }
    }
    Ok(())
}

#[test]
fn quantized_llama_on_two_ranks_matches_one_runner() -> Result<()> {
    quantized_on_two_ranks_matches_one_runner("llama-f32")
}

#[test]
fn quantized_glm4_moe_lite_on_two_ranks_matches_one_runner() -> Result<()> {
    // Quantized per-head latent matrices (embed_q, unembed_out) split by
    // heads with their scales and biases.
    quantized_on_two_ranks_matches_one_runner("glm4-moe-lite-f32")
}

/// Runs a sharded generate that must fail; returns its stderr.
fn refused(model: &std::path::Path, shards: &str) -> Result<String> {
    let out = run(&[
        "generate",
        "--model",
        model.to_str().unwrap_or_default(),
        "--prompt-tokens",
        "1,2,3",
        "--max-tokens",
        "2",
        "--shards",
        shards,
    ])?;
    ensure!(
        !out.status.success(),
        "{shards} ranks of {} did not fail",
        model.display()
    );
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn what_cannot_be_split_is_refused_with_the_numbers() -> Result<()> {
    // 4 heads over 3 ranks.
    let err = refused(&fixtures::model_dir("llama-f32")?, "3")?;
    ensure!(
        err.contains("num_attention_heads is 4, which 3 ranks cannot share evenly"),
        "{err}"
    );
    // Groups of 64 across o_proj's 64 inputs: one group per row.
    let err = refused(&fixtures::model_dir("llama-q4")?, "2")?;
    ensure!(
        err.contains("o_proj") && err.contains("has 1 entries, which 2 ranks cannot share evenly"),
        "{err}"
    );
    // Qwen3.5 may outnumber its KV heads, not its delta-nets' key heads.
    let err = refused(&fixtures::model_dir("qwen3.5-f32")?, "4")?;
    ensure!(
        err.contains("linear_num_key_heads is 2, which 4 ranks cannot share evenly"),
        "{err}"
    );
    // Other families may not outnumber them (nor may 3 ranks share 2).
    let err = refused(&fixtures::model_dir("qwen3-f32")?, "4")?;
    ensure!(
        err.contains("num_key_value_heads is 2, which 4 ranks cannot share evenly"),
        "{err}"
    );
    // mlx-lm has no shard() for Phi-3 (fused q/k/v).
    let err = refused(&fixtures::model_dir("phi3-f32")?, "2")?;
    ensure!(err.contains("Phi3 models cannot be sharded"), "{err}");
    // mlx-lm has no shard() for Qwen3-Next either.
    let err = refused(&fixtures::model_dir("qwen3-next-f32")?, "2")?;
    ensure!(err.contains("Qwen3Next models cannot be sharded"), "{err}");
    // A GGUF file is converted whole; its imported directory can be split.
    let err = refused(&fixtures::gguf("llama-f32.gguf")?, "2")?;
    ensure!(err.contains("is a GGUF file"), "{err}");
    Ok(())
}

/// The children of `pid` (Linux).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// The CPU time (user and system) process `pid` has used, in seconds
/// (Linux; at the kernel's usual 100 ticks per second).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis: state is the
    // first, utime the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// A rank killed in the middle of a prefill: the launcher fails naming it,
/// within seconds, and the other rank is gone too.
#[test]
fn a_killed_rank_takes_its_group_down() -> Result<()> {
    let dir = fixtures::model_dir("llama-f32")?;
    let reference = fixtures::reference("llama-f32")?;
    let long = reference
        .cases
        .iter()
        .max_by_key(|c| c.prompt_tokens.len())
        .context("no cases")?;
    let ids = ids_arg(&long.prompt_tokens);
    // One token per prefill pass, 100 times over: many seconds of work.
    let mut launcher = Group::spawn(
        Command::new(binary("grove-runner")?)
            .args(["generate", "--model"])
            .arg(&dir)
            .args([
                "--prompt-tokens",
                &ids,
                "--max-tokens",
                "1",
                "--prefill-chunk",
                "1",
                "--json",
                "--repeat",
                "100",
            ])
            .args(["--shards", "2"])
            .stdin(Stdio::null())
            .stdout(Stdio::null()),
    )?;
    let pid = launcher.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    let ranks = loop {
        let c = children(pid);
        if c.len() == 2 {
            break c;
        }
        if Instant::now() > deadline {
            bail!(
                "the launcher did not start 2 ranks: {c:?}: {}",
                launcher.stderr_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Let the group form and start working.
    std::thread::sleep(Duration::from_millis(500));
    ensure!(
        launcher.try_wait()?.is_none(),
        "the group finished before a rank could be killed"
    );
    // SAFETY: sends SIGKILL to a child process of this test.
    unsafe { libc::kill(ranks[1] as i32, libc::SIGKILL) };
    let killed_at = Instant::now();
    let status = loop {
        if let Some(s) = launcher.try_wait()? {
            break s;
        }
        if killed_at.elapsed() > Duration::from_secs(15) {
            bail!(
                "the launcher did not end within 15 s of a rank's death: {}",
                launcher.stderr_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = launcher.stderr();
    ensure!(!status.success(), "the launcher succeeded: {stderr}");
    ensure!(stderr.contains("rank 1 ended with signal: 9"), "{stderr}");
    ensure!(!alive(ranks[0]), "rank 0 ({}) outlived its group", ranks[0]);
    Ok(())
}

/// A prompt whose greedy continuation on qwen3-f32 runs past 1000 tokens
/// without EOS (as in batching.rs).
const LONG_RUNNING: [u32; 12] = [142, 587, 872, 826, 787, 69, 266, 125, 512, 784, 465, 488];

/// `serve --shards 2`: every reference case at once (continuously batched
/// on the group) gives mlx-lm's text, twice (the second time from the
/// prompt cache); a client that leaves mid-stream leaves the group in step.
#[tokio::test]
async fn a_served_group_batches_caches_and_cancels() -> Result<()> {
    use grove_tests::serve::{Served, all_at_once, complete, tokens_request};
    for model in ["llama-f32", "qwen3-f32"] {
        let reference = fixtures::reference(model)?;
        let (served, mut client) =
            Served::start(&fixtures::model_dir(model)?, &["--shards", "2"]).await?;
        ensure!(children(served.pid()).len() == 2, "{model}: not 2 ranks");
        let reqs: Vec<_> = reference
            .cases
            .iter()
            .map(|c| tokens_request(&c.prompt_tokens, c.max_tokens as u32))
            .collect();
        for round in 0..2 {
            let got = all_at_once(&client, reqs.clone()).await?;
            for (case, done) in reference.cases.iter().zip(&got) {
                ensure!(
                    done.text == case.text,
                    "{model}/{} round {round}: group {:?}, mlx-lm {:?}",
                    case.name,
                    done.text,
                    case.text
                );
                ensure!(done.metrics().eval_tokens as usize == case.tokens.len());
            }
        }
        // The memory invariant on every rank: once the group is idle, MLX
        // holds exactly each rank's weights and its KV buffers (the prompt
        // cache's entry), as it does for one runner.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let status = client
                .status(grove_proto::runner::v1::StatusRequest {})
                .await?
                .into_inner();
            let memory = status.memory.context("no memory report")?;
            let held = |r: &grove_proto::runner::v1::RankMemory| {
                (r.mlx_active_bytes as i64 - (r.weight_bytes + r.kv_bytes) as i64).abs()
            };
            let ok = memory.ranks.len() == 2
                && memory
                    .ranks
                    .iter()
                    .all(|r| r.kv_bytes > 0 && held(r) <= 64 << 10);
            if ok {
                // The two ranks hold the same share (o and down's biases
                // aside, none here): their weights are equal.
                ensure!(memory.ranks[0].weight_bytes == memory.ranks[1].weight_bytes);
                ensure!(memory.ranks[0].weight_bytes == memory.weight_bytes);
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "{model}: the ranks' memory is not weights + KV: {:?}",
                memory.ranks
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // An idle group rests: its followers wait on the doorbell, not in a
        // collective (MLX's ring polls its sockets while a receive waits).
        let ranks = children(served.pid());
        let before: Vec<f64> = ranks.iter().map(|&p| cpu_seconds(p)).collect();
        tokio::time::sleep(Duration::from_secs(1)).await;
        for (&p, b) in ranks.iter().zip(&before) {
            let used = cpu_seconds(p) - b;
            ensure!(
                used < 0.1,
                "{model}: an idle rank used {used:.2} s of CPU in 1 s"
            );
        }
        // A finished conversation is in the prompt cache.
        complete(&mut client, reqs[0].clone()).await?;
        let again = complete(&mut client, reqs[0].clone()).await?;
        ensure!(again.text == reference.cases[0].text);
        ensure!(
            again.metrics().cached_prompt_tokens > 0,
            "{model}: nothing came from the prompt cache"
        );
        if model == "qwen3-f32" {
            // A client that leaves after a few pieces.
            let mut stream = client
                .generate(tokens_request(&LONG_RUNNING, 500))
                .await?
                .into_inner();
            for _ in 0..5 {
                stream.message().await?.context("ended early")?;
            }
            drop(stream);
            let case = &reference.cases[0];
            let done = complete(&mut client, reqs[0].clone()).await?;
            ensure!(done.text == case.text, "after a cancel: {:?}", done.text);
        }
    }
    Ok(())
}

/// A follower killed while the group decodes: the request in flight fails
/// with UNAVAILABLE, the group's launcher exits, and no rank is left.
#[tokio::test]
async fn a_served_group_fails_unavailable_when_a_rank_dies() -> Result<()> {
    use grove_tests::serve::{Served, tokens_request};
    let (mut served, mut client) =
        Served::start(&fixtures::model_dir("qwen3-f32")?, &["--shards", "2"]).await?;
    let ranks = children(served.pid());
    ensure!(ranks.len() == 2, "not 2 ranks: {ranks:?}");
    let mut stream = client
        .generate(tokens_request(&LONG_RUNNING, 1000))
        .await?
        .into_inner();
    for _ in 0..3 {
        stream.message().await?.context("ended early")?;
    }
    // SAFETY: SIGKILL to a process this test started (through the launcher).
    unsafe { libc::kill(ranks[1] as i32, libc::SIGKILL) };
    let status = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    })
    .await
    .context("the stream did not end within 20 s of a rank's death")?;
    let status = status.context("the stream ended without an error")?;
    ensure!(
        status.code() == tonic::Code::Unavailable,
        "{:?}: {}",
        status.code(),
        status.message()
    );
    let exit = served.wait_exit(Duration::from_secs(20))?;
    ensure!(!exit.success(), "the launcher exited with {exit}");
    ensure!(!alive(ranks[0]), "rank 0 outlived its group");
    Ok(())
}

/// The daemon's runner as a group: a request for 2 shards (or
/// GROVE_SHARDS=2) gets a launcher and two ranks that answer as one runner
/// does, shown by `ps`; a rank killed mid-stream fails the request with
/// UNAVAILABLE and leaves no rank behind; the next request starts a fresh
/// group; a request for another count reloads the idle model.
#[tokio::test]
async fn the_daemon_runs_a_group_and_recovers_from_a_killed_rank() -> Result<()> {
    use grove_proto::v1 as gpb;
    use grove_tests::daemon::{Daemon, chat, finish};
    let m = fixtures::model_dir("qwen3-f32")?
        .canonicalize()?
        .display()
        .to_string();
    let (mut d, mut c) = Daemon::start(&[]).await?;
    let (want, _) = finish(c.chat(chat(&m, "hello", 16)).await?.into_inner()).await?;
    let sharded = |text: &str, max: u32| gpb::ChatRequest {
        shards: Some(2),
        ..chat(&m, text, max)
    };
    let (got, _) = finish(c.chat(sharded("hello", 16)).await?.into_inner()).await?;
    ensure!(got == want, "group {got:?}, one runner {want:?}");
    let ps = c.ps(gpb::PsRequest {}).await?.into_inner().models;
    let running = ps.first().context("nothing loaded")?;
    ensure!(ps.len() == 1 && running.shards == 2, "{ps:?}");
    ensure!(running.ranks.len() == 2, "{ps:?}");
    for (i, r) in running.ranks.iter().enumerate() {
        ensure!(
            r.rank == i as u32 && r.device == "cpu" && r.resident_bytes > 0,
            "{r:?}"
        );
    }
    let launcher = running.pid;
    let ranks: Vec<u32> = running.ranks.iter().map(|r| r.pid).collect();
    ensure!(
        children(launcher) == ranks,
        "ps's ranks are not the launcher's"
    );
    let mut stream = c.chat(sharded("Once upon a time", 0)).await?.into_inner();
    stream.message().await?.context("no first piece")?;
    // SAFETY: SIGKILL to a rank of the daemon's runner group.
    unsafe { libc::kill(ranks[1] as i32, libc::SIGKILL) };
    let err = loop {
        match stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => bail!("the stream ended without an error"),
            Err(e) => break e,
        }
    };
    ensure!(err.code() == tonic::Code::Unavailable, "{err:?}");
    ensure!(d.alive(), "the daemon died with its runner");
    let gone = Instant::now();
    while ranks.iter().chain([&launcher]).any(|&p| alive(p)) {
        ensure!(
            gone.elapsed() < Duration::from_secs(20),
            "a rank or the launcher outlived the group"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (again, _) = finish(c.chat(sharded("hello", 16)).await?.into_inner()).await?;
    ensure!(again == want, "the new group gave {again:?}");
    // Another count: the idle group is replaced by one runner.
    finish(c.chat(chat(&m, "hello", 4)).await?.into_inner()).await?;
    let ps = c.ps(gpb::PsRequest {}).await?.into_inner().models;
    ensure!(
        ps.len() == 1 && ps[0].shards == 1 && ps[0].ranks.is_empty(),
        "{ps:?}"
    );
    let bad = c
        .chat(gpb::ChatRequest {
            shards: Some(0),
            ..chat(&m, "hello", 4)
        })
        .await
        .err()
        .context("0 shards were accepted")?;
    ensure!(bad.code() == tonic::Code::InvalidArgument, "{bad:?}");
    // GROVE_SHARDS sets the daemon's default.
    let (_d2, mut c2) = Daemon::start(&[("GROVE_SHARDS", "2")]).await?;
    let (got, _) = finish(c2.chat(chat(&m, "hello", 16)).await?.into_inner()).await?;
    ensure!(got == want, "GROVE_SHARDS=2 gave {got:?}");
    let ps = c2.ps(gpb::PsRequest {}).await?.into_inner().models;
    ensure!(
        ps.len() == 1 && ps[0].shards == 2 && ps[0].ranks.len() == 2,
        "{ps:?}"
    );
    Ok(())
}

/// In bfloat16 (kept as stored) a split model rounds each rank's partial
/// output before the sum, so 2 ranks drift from one runner within a few
/// dozen tokens, in mlx-lm as in Grove. Grove's 2 ranks must give mlx-lm's
/// 2 ranks (its `sharded_load` over the same ring backend, run at fixture
/// time): the same logits and the same greedy tokens up to Grove's EOS.
#[test]
fn bf16_on_two_ranks_matches_mlx_lm_on_two_ranks() -> Result<()> {
    let dir = fixtures::model_dir("qwen3-bf16")?;
    let mlx = fixtures::sharded_reference("qwen3-bf16", 2)?;
    let (ids, n) = (&mlx.prompt_tokens, mlx.max_tokens);
    let (tokens, logits) =
        generate_ids(&dir, ids, n, &["--shards", "2", "--cpu-dtypes", "stored"])?;
    ensure!(!tokens.is_empty() && tokens.len() <= mlx.tokens.len());
    ensure!(
        mlx.tokens.starts_with(&tokens),
        "Grove's 2 ranks {tokens:?}, mlx-lm's {:?}",
        mlx.tokens
    );
    let w = worst(&logits, &mlx.logits);
    ensure!(
        w <= LOGIT_TOLERANCE,
        "logits differ from mlx-lm's 2 ranks by {w:e}"
    );
    // And they do differ from one runner's (what the test is about).
    let (_, alone) = generate_ids(&dir, ids, n, &["--cpu-dtypes", "stored"])?;
    ensure!(
        worst(&alone, &logits) > LOGIT_TOLERANCE,
        "no drift in bfloat16?"
    );
    Ok(())
}

/// Qwen3.5 over more ranks than KV heads (4 ranks, 2 KV heads): each rank
/// holds one KV head, the ranks of a head next to each other, as mlx-lm
/// repeats the k and v projections before it splits them. The fixture
/// qwen3.5-wide-f32 has 4 delta-net key heads (qwen3.5-f32 has 2), and
/// mlx-lm's 4 ranks ran on it at fixture time.
#[test]
fn qwen3_5_over_more_ranks_than_kv_heads_matches_mlx_lm() -> Result<()> {
    let dir = fixtures::model_dir("qwen3.5-wide-f32")?;
    let mlx = fixtures::sharded_reference("qwen3.5-wide-f32", 4)?;
    let (ids, n) = (&mlx.prompt_tokens, mlx.max_tokens);
    let (tokens, logits) = generate_ids(&dir, ids, n, &["--shards", "4"])?;
    ensure!(!tokens.is_empty() && mlx.tokens.starts_with(&tokens));
    let w = worst(&logits, &mlx.logits);
    ensure!(
        w <= LOGIT_TOLERANCE,
        "logits differ from mlx-lm's 4 ranks by {w:e}"
    );
    let (alone, _) = generate_ids(&dir, ids, n, &[])?;
    ensure!(alone == tokens, "4 ranks {tokens:?}, one runner {alone:?}");
    Ok(())
}
