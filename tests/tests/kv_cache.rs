//! KV memory: a quantized KV cache (mlx-lm's `QuantizedKVCache`, kv_bits,
//! kv_group_size, quantized_kv_start) gives mlx-lm's greedy tokens alone,
//! in a batch and through the prompt cache, which keeps its entry
//! quantized across turns; unsupported models are refused clearly.
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use grove_proto::runner::v1 as pb;
use grove_proto::runner::v1::runner_client::RunnerClient;
use grove_tests::fixtures;
use grove_tests::runner::{generate_json, ids_arg};
use grove_tests::serve::{Completion, Served, all_at_once, complete, tokens_request};
use tonic::transport::Channel;

type Client = RunnerClient<Channel>;

/// `--kv-bits` and friends for one reference setting.
fn kv_args(s: &fixtures::KvSettingReference) -> [String; 6] {
    [
        "--kv-bits".into(),
        s.kv_bits.to_string(),
        "--kv-group-size".into(),
        s.kv_group_size.to_string(),
        "--quantized-kv-start".into(),
        s.quantized_kv_start.to_string(),
    ]
}

/// `grove-runner generate` with each reference setting gives mlx-lm's
/// tokens on every case (q8 and q4, groups of 64 and 32, quantized from the
/// start or from token 20: within prefill for long prompts, within decode
/// for short ones; float32 and 4-bit weights; a hybrid model whose
/// recurrent layers keep their state).
#[test]
fn quantized_kv_matches_mlx_lm() -> Result<()> {
    for model in fixtures::KV_QUANTIZED {
        let reference = fixtures::kv_reference(model)?;
        ensure!(reference.model == model);
        let dir = fixtures::model_dir(model)?;
        for setting in &reference.settings {
            for case in &setting.cases {
                let ids = ids_arg(&case.prompt_tokens);
                let kv = kv_args(setting);
                let mut args = vec![
                    "--model",
                    dir.to_str().unwrap_or_default(),
                    "--prompt-tokens",
                    &ids,
                    "--max-tokens",
                    "24",
                ];
                args.extend(kv.iter().map(String::as_str));
                let out = generate_json(&args)?;
                ensure!(
                    out.tokens == case.tokens && out.finish_reason == case.finish_reason,
                    "{model}/{} kv {}/{}/{}: grove {:?} ({}), mlx-lm {:?} ({})",
                    case.name,
                    setting.kv_bits,
                    setting.kv_group_size,
                    setting.quantized_kv_start,
                    out.tokens,
                    out.finish_reason,
                    case.tokens,
                    case.finish_reason
                );
            }
        }
    }
    Ok(())
}

fn kv_request(ids: &[u32], s: &fixtures::KvSettingReference) -> pb::GenerateRequest {
    let mut req = tokens_request(ids, 24);
    req.kv_bits = Some(s.kv_bits);
    req.kv_group_size = Some(s.kv_group_size);
    req.quantized_kv_start = Some(s.quantized_kv_start);
    req
}

/// The served engine (continuous batching, quantized rows joining and
/// leaving one batch) gives each case mlx-lm's single-sequence tokens, with
/// the setting asked per request; then again with the runner's setting
/// (`--kv-cache-type`) and requests that name none.
#[tokio::test]
async fn quantized_kv_batched_matches_mlx_lm() -> Result<()> {
    for model in ["llama-kv-f32", "qwen3-next-f32"] {
        let reference = fixtures::kv_reference(model)?;
        let dir = fixtures::model_dir(model)?;
        let (served, client) = Served::start(&dir, &[]).await?;
        // A batch turns quantized as a whole, when its longest row reaches
        // the start: a shorter row of a start > 0 turns early (mlx-lm has
        // no quantized batch); from the start (0) every row is exact.
        for setting in reference
            .settings
            .iter()
            .filter(|s| s.quantized_kv_start == 0)
        {
            let reqs = setting
                .cases
                .iter()
                .map(|c| kv_request(&c.prompt_tokens, setting))
                .collect();
            let got = all_at_once(&client, reqs).await?;
            check_batch(model, setting, &got)?;
        }
        drop(served);
        // The runner's own setting.
        for setting in reference
            .settings
            .iter()
            .filter(|s| s.kv_group_size == 64 || model != "llama-kv-f32")
            .take(1)
        {
            let kv = kv_args(setting);
            let args: Vec<&str> = kv.iter().map(String::as_str).collect();
            let (_served, mut client) = Served::start(&dir, &args).await?;
            let status = client.status(pb::StatusRequest {}).await?.into_inner();
            let q = status
                .memory
                .and_then(|m| m.kv_quantization)
                .context("no KV quantization in Status")?;
            ensure!((q.bits, q.group_size) == (setting.kv_bits, setting.kv_group_size));
            let reqs = setting
                .cases
                .iter()
                .map(|c| tokens_request(&c.prompt_tokens, 24))
                .collect();
            let got = all_at_once(&client, reqs).await?;
            check_batch(model, setting, &got)?;
        }
    }
    Ok(())
}

fn check_batch(
    model: &str,
    setting: &fixtures::KvSettingReference,
    got: &[Completion],
) -> Result<()> {
    let mut cold = 0;
    for (case, done) in setting.cases.iter().zip(got) {
        // A row that started from another's prompt-cache entry attended
        // over that entry's quantized keys in its prefill, as mlx-lm does
        // with a prompt cache; mlx-lm's reference is a cold run.
        if done.metrics().cached_prompt_tokens > 0 {
            continue;
        }
        cold += 1;
        let want = &case.text;
        let m = done.metrics();
        ensure!(
            m.eval_tokens as usize == case.tokens.len() && done.text == *want,
            "{model}/{} kv {}/{}/{} batched: {} tokens, mlx-lm {}\n grove  {:?}\n mlx-lm {:?}",
            case.name,
            setting.kv_bits,
            setting.kv_group_size,
            setting.quantized_kv_start,
            m.eval_tokens,
            case.tokens.len(),
            done.text,
            want
        );
    }
    ensure!(
        cold * 2 >= got.len(),
        "{model}: only {cold} of {} rows ran cold",
        got.len()
    );
    Ok(())
}

async fn wait_idle(client: &mut Client) -> Result<()> {
    let start = Instant::now();
    loop {
        let h = client.health(pb::HealthRequest {}).await?.into_inner();
        if h.activity == pb::EngineActivity::Idle as i32 {
            return Ok(());
        }
        ensure!(start.elapsed() < Duration::from_secs(10), "never idle");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The model's shape from config.json: (layers, kv heads, head dim).
fn shape(model: &str) -> Result<(u64, u64, u64)> {
    let text = std::fs::read_to_string(fixtures::model_dir(model)?.join("config.json"))?;
    let c: serde_json::Value = serde_json::from_str(&text)?;
    let get = |k: &str| {
        c[k].as_u64()
            .with_context(|| format!("config.json has no {k}"))
    };
    Ok((
        get("num_hidden_layers")?,
        get("num_key_value_heads")?,
        get("head_dim")?,
    ))
}

/// A q4 runner keeps its prompt-cache entry quantized through five
/// follow-up turns of one conversation: each turn hits the previous one,
/// and the entry's bytes are exactly what 4 bits (plus a float32 scale and
/// bias per 64 elements) predict for the tokens it holds, a sixth of what
/// full precision takes. The runner's capacity in tokens grows by as much.
#[tokio::test]
async fn quantized_entry_survives_follow_up_turns() -> Result<()> {
    let model = "llama-kv-f32";
    let dir = fixtures::model_dir(model)?;
    let (layers, kv_heads, head_dim) = shape(model)?;
    // Per token and layer, keys and values: packed 4-bit words, and a
    // float32 scale and bias per group of 64.
    let q4_per_token = layers * 2 * kv_heads * (head_dim / 2 + head_dim / 64 * 2 * 4);
    let f32_per_token = layers * 2 * kv_heads * head_dim * 4;

    let (_plain, mut plain) = Served::start(&dir, &[]).await?;
    let f32_memory = plain
        .status(pb::StatusRequest {})
        .await?
        .into_inner()
        .memory
        .context("no memory")?;
    ensure!(f32_memory.kv_bytes_per_token == f32_per_token);
    ensure!(f32_memory.kv_quantization.is_none());

    let (_served, mut client) = Served::start(&dir, &["--kv-cache-type", "q4"]).await?;
    let memory = client
        .status(pb::StatusRequest {})
        .await?
        .into_inner()
        .memory
        .context("no memory")?;
    ensure!(
        memory.kv_bytes_per_token == q4_per_token,
        "q4 KV bytes per token {}, predicted {q4_per_token}",
        memory.kv_bytes_per_token
    );
    let grown = memory.kv_capacity_tokens as f64 / f32_memory.kv_capacity_tokens as f64;
    let predicted = f32_per_token as f64 / q4_per_token as f64;
    ensure!(
        (grown / predicted - 1.0).abs() < 0.01,
        "capacity grew {grown:.2}x, bytes per token predict {predicted:.2}x"
    );

    let mut prompt: Vec<u32> = fixtures::reference(model)?
        .cases
        .iter()
        .find(|c| c.name == "ids")
        .context("no ids case")?
        .prompt_tokens
        .clone();
    for turn in 0..6 {
        let done = complete(&mut client, tokens_request(&prompt, 12)).await?;
        let m = done.metrics();
        if turn > 0 {
            ensure!(
                m.cached_prompt_tokens as usize == prompt.len() - 5,
                "turn {turn}: {} tokens reused of {}",
                m.cached_prompt_tokens,
                prompt.len() - 5
            );
        }
        wait_idle(&mut client).await?;
        let status = client.status(pb::StatusRequest {}).await?.into_inner();
        let mem = status.memory.context("no memory")?;
        let held = mem.cached_tokens as u64;
        ensure!(
            held > prompt.len() as u64,
            "turn {turn}: the entry holds {held}"
        );
        let slots = held.div_ceil(256) * 256;
        ensure!(
            mem.kv_bytes == slots * q4_per_token,
            "turn {turn}: entry of {held} tokens takes {} bytes; 4-bit predicts {} \
             (full precision {})",
            mem.kv_bytes,
            slots * q4_per_token,
            slots * f32_per_token
        );
        // The next turn: this prompt and five new tokens (a branch after
        // the prompt, so it reuses exactly the prompt from the entry).
        prompt.extend([101u32 + turn, 202, 303, 404, 505]);
    }
    Ok(())
}

/// Where a quantized cache cannot be had, a request that asks for one is
/// refused with the reason; a runner-wide setting falls back to full
/// precision and says so in Status.
#[tokio::test]
async fn unsupported_quantized_kv_is_refused() -> Result<()> {
    let cases = [
        ("gemma3-f32", 4, 32, "sliding-window"),
        ("gpt-oss-f32", 8, 32, "sinks"),
        ("glm4-moe-lite-f32", 8, 64, "latent"),
        ("qwen3-f32", 4, 64, "multiple of kv_group_size 64"),
    ];
    for (model, bits, group, why) in cases {
        let dir = fixtures::model_dir(model)?;
        let (_served, mut client) = Served::start(&dir, &[]).await?;
        let mut req = tokens_request(&[1, 2, 3, 4], 4);
        req.kv_bits = Some(bits);
        req.kv_group_size = Some(group);
        let err = match complete(&mut client, req).await {
            Ok(_) => anyhow::bail!("{model}: kv_bits {bits} group {group} was accepted"),
            Err(e) => e,
        };
        ensure!(
            err.code() == tonic::Code::InvalidArgument && err.message().contains(why),
            "{model}: {err:?}"
        );
    }
    // Settings MLX cannot quantize with, and options without bits.
    let dir = fixtures::model_dir("llama-kv-f32")?;
    let (_served, mut client) = Served::start(&dir, &[]).await?;
    for (bits, group, start) in [(7, None, None), (4, Some(48), None), (0, None, None)] {
        let mut req = tokens_request(&[1, 2, 3, 4], 2);
        req.kv_bits = Some(bits);
        req.kv_group_size = group;
        req.quantized_kv_start = start;
        let res = complete(&mut client, req).await;
        if bits == 0 {
            ensure!(
                res.is_ok(),
                "kv_bits 0 (full precision) refused: {:?}",
                res.err()
            );
            continue;
        }
        let err = res.err().context("a bad KV setting was accepted")?;
        ensure!(err.code() == tonic::Code::InvalidArgument, "{err:?}");
    }
    let mut req = tokens_request(&[1, 2, 3, 4], 2);
    req.kv_group_size = Some(64);
    let err = complete(&mut client, req)
        .await
        .err()
        .context("group without bits")?;
    ensure!(err.message().contains("need kv_bits"), "{err:?}");

    let (_gemma, mut gemma) = Served::start(
        &fixtures::model_dir("gemma3-f32")?,
        &["--kv-cache-type", "q8"],
    )
    .await?;
    let status = gemma.status(pb::StatusRequest {}).await?.into_inner();
    ensure!(
        status
            .memory
            .context("no memory")?
            .kv_quantization
            .is_none(),
        "gemma3 claims a quantized KV cache"
    );
    complete(&mut gemma, tokens_request(&[1, 2, 3, 4], 2)).await?;
    Ok(())
}
