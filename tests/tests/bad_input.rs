//! Malformed models and requests end `grove-runner` with a clear error (exit
//! status 1, a message naming what is wrong), never a panic or a crash.
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use grove_tests::fixtures;
use grove_tests::runner::{generate_json, run};
use serde_json::Value;

/// A writable copy of a fixture model.
fn copy_fixture(name: &str) -> Result<(tempfile::TempDir, PathBuf)> {
    let src = fixtures::model_dir(name)?;
    let tmp = tempfile::tempdir()?;
    let dst = tmp.path().join(name);
    fs::create_dir(&dst)?;
    for entry in fs::read_dir(&src)? {
        let entry = entry?;
        fs::copy(entry.path(), dst.join(entry.file_name()))?;
    }
    Ok((tmp, dst))
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) -> Result<()> {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&fs::read_to_string(&path)?)?;
    edit(&mut config);
    fs::write(&path, serde_json::to_string_pretty(&config)?)?;
    Ok(())
}

/// Runs generate on `dir` and expects a clean failure whose message contains `needle`.
fn expect_error(dir: &Path, extra: &[&str], needle: &str) -> Result<()> {
    let mut args = vec![
        "generate",
        "--model",
        dir.to_str().context("path")?,
        "--max-tokens",
        "4",
    ];
    if !extra.iter().any(|a| a.starts_with("--prompt")) {
        args.extend_from_slice(&["--prompt-tokens", "1,2,3"]);
    }
    args.extend_from_slice(extra);
    let out = run(&args)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(1),
        "expected exit status 1, got {} with stderr: {stderr}",
        out.status
    );
    ensure!(
        stderr.starts_with("grove-runner: error: "),
        "not a clean error: {stderr}"
    );
    ensure!(
        stderr.contains(needle),
        "error should mention {needle:?}: {stderr}"
    );
    Ok(())
}

#[test]
fn unsupported_architecture_is_named() -> Result<()> {
    let (_t, dir) = copy_fixture("llama-f32")?;
    edit_config(&dir, |c| {
        c["architectures"] = serde_json::json!(["GPT2LMHeadModel"]);
        c["model_type"] = "gpt2".into();
    })?;
    expect_error(&dir, &[], "unsupported architecture GPT2LMHeadModel")
}

#[test]
fn config_that_is_not_json() -> Result<()> {
    let (_t, dir) = copy_fixture("qwen3-f32")?;
    fs::write(dir.join("config.json"), "{ not json")?;
    expect_error(&dir, &[], "not valid JSON")
}

#[test]
fn config_missing_a_field() -> Result<()> {
    let (_t, dir) = copy_fixture("qwen3-f32")?;
    edit_config(&dir, |c| {
        c.as_object_mut().map(|o| o.remove("head_dim"));
    })?;
    expect_error(&dir, &[], "head_dim")
}

#[test]
fn config_with_impossible_heads() -> Result<()> {
    let (_t, dir) = copy_fixture("llama-f32")?;
    edit_config(&dir, |c| c["num_key_value_heads"] = 3.into())?;
    expect_error(&dir, &[], "not a multiple of num_key_value_heads")
}

#[test]
fn config_that_does_not_fit_the_weights() -> Result<()> {
    let (_t, dir) = copy_fixture("mistral-f32")?;
    edit_config(&dir, |c| c["intermediate_size"] = 96.into())?;
    expect_error(&dir, &[], "the config implies")
}

#[test]
fn unsupported_rope_scaling() -> Result<()> {
    let (_t, dir) = copy_fixture("llama-f32")?;
    edit_config(&dir, |c| {
        c["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0})
    })?;
    expect_error(&dir, &[], "unsupported rope_scaling type \"yarn\"")
}

#[test]
fn unsupported_quantization() -> Result<()> {
    let (_t, dir) = copy_fixture("llama-q4")?;
    edit_config(&dir, |c| {
        c["quantization"]["bits"] = 7.into();
        c.as_object_mut().map(|o| o.remove("quantization_config"));
    })?;
    expect_error(&dir, &[], "bits=7")
}

#[test]
fn truncated_safetensors() -> Result<()> {
    let (_t, dir) = copy_fixture("llama-f32")?;
    let file = dir.join("model.safetensors");
    let bytes = fs::read(&file)?;
    fs::write(&file, &bytes[..bytes.len() / 2])?;
    expect_error(&dir, &[], "model.safetensors")
}

#[test]
fn garbage_safetensors() -> Result<()> {
    let (_t, dir) = copy_fixture("qwen3-q4")?;
    fs::write(
        dir.join("model.safetensors"),
        b"\xff\xff\xff\xff\xff\xff\xff\x7fgarbage",
    )?;
    expect_error(&dir, &[], "the header claims 9223372036854775807 bytes")
}

#[test]
fn index_naming_a_missing_shard() -> Result<()> {
    let (_t, dir) = copy_fixture("qwen2-f32")?;
    let shard = fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("model-"))
        })
        .context("qwen2-f32 fixture is not sharded")?;
    fs::remove_file(&shard)?;
    expect_error(&dir, &[], "does not exist")
}

#[test]
fn missing_config() -> Result<()> {
    let (_t, dir) = copy_fixture("qwen2-q4")?;
    fs::remove_file(dir.join("config.json"))?;
    expect_error(&dir, &[], "config.json")
}

#[test]
fn missing_or_broken_tokenizer() -> Result<()> {
    let (_t, dir) = copy_fixture("mistral-q4")?;
    fs::write(dir.join("tokenizer.json"), "{\"model\": 42}")?;
    expect_error(&dir, &["--prompt", "hello"], "tokenizer")?;
    fs::remove_file(dir.join("tokenizer.json"))?;
    expect_error(
        &dir,
        &["--prompt", "hello"],
        "tokenizer.json does not exist",
    )
}

#[test]
fn token_outside_the_vocabulary() -> Result<()> {
    let dir = fixtures::model_dir("qwen3-f32")?;
    expect_error(
        &dir,
        &["--prompt-tokens", "5,99999"],
        "outside the model's vocabulary",
    )
}

#[test]
fn empty_prompt() -> Result<()> {
    // Qwen's tokenizer adds no BOS, so an empty text is an empty prompt.
    let dir = fixtures::model_dir("qwen2-f32")?;
    expect_error(&dir, &["--prompt", ""], "the prompt is empty")
}

#[test]
fn bad_options() -> Result<()> {
    let dir = fixtures::model_dir("llama-f32")?;
    expect_error(&dir, &["--temperature=-1"], "temperature")?;
    expect_error(&dir, &["--prefill-chunk", "0"], "prefill chunk")
}

#[test]
fn model_directory_that_does_not_exist() -> Result<()> {
    expect_error(
        Path::new("/nonexistent/grove-model"),
        &[],
        "/nonexistent/grove-model",
    )
}

/// Sampling at temperature > 0 is reproducible from its seed.
#[test]
fn sampling_is_seeded() -> Result<()> {
    let dir = fixtures::model_dir("qwen3-f32")?;
    let dir = dir.to_str().context("path")?;
    let sample = |seed: &str| {
        generate_json(&[
            "--model",
            dir,
            "--prompt-tokens",
            "10,20,30",
            "--max-tokens",
            "16",
            "--temperature",
            "1.0",
            "--seed",
            seed,
        ])
    };
    let (a, b, c) = (sample("7")?, sample("7")?, sample("8")?);
    ensure!(a.tokens == b.tokens, "same seed, different tokens");
    ensure!(
        a.tokens != c.tokens,
        "seeds 7 and 8 gave the same 16 tokens"
    );
    Ok(())
}

/// `grove-runner device` reports the memory budgets are sized against (the
/// daemon asks it, since only the runner links MLX).
#[test]
fn device_reports_memory() -> Result<()> {
    let out = run(&["device"])?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    let total = v["memory_total_bytes"]
        .as_u64()
        .context("no memory_total_bytes")?;
    ensure!(total > 1 << 30, "{total} bytes");
    ensure!(
        matches!(v["source"].as_str(), Some("device" | "physical_ram")),
        "{v}"
    );
    Ok(())
}
