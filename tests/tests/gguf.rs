//! GGUF files: quantized copies of the fixtures against mlx-lm on their
//! imported directories, and malformed files that must end in a clear error.
use std::path::Path;

use anyhow::{Context, Result, ensure};
use grove_gguf::writer::{self as gguf_file, Val};
use grove_tests::fixtures;
use grove_tests::real::{self, Generated};
use grove_tests::runner::{generate_json, ids_arg, run};

/// `grove-runner import GGUF OUT`.
fn import(gguf: &Path, out: &Path) -> Result<()> {
    let status = run(&[
        "import",
        gguf.to_str().unwrap_or_default(),
        out.to_str().unwrap_or_default(),
    ])?;
    ensure!(
        status.status.success(),
        "import of {} failed: {}",
        gguf.display(),
        String::from_utf8_lossy(&status.stderr)
    );
    Ok(())
}

fn grove_tokens(model: &Path, ids: &[u32], max: usize, extra: &[&str]) -> Result<Vec<u32>> {
    let ids = ids_arg(ids);
    let max = max.to_string();
    let mut args = vec![
        "--model",
        model.to_str().unwrap_or_default(),
        "--prompt-tokens",
        &ids,
        "--max-tokens",
        &max,
    ];
    args.extend_from_slice(extra);
    Ok(generate_json(&args)?.tokens)
}

/// Quantized GGUF copies (Q4_0, Q4_1, Q8_0 mapped exactly; Q5_0, Q5_1
/// re-quantized to 8 bits) give, read directly and through `import`, mlx-lm's
/// greedy tokens on the imported directory: as stored with
/// `--cpu-dtypes stored`, and with float16 promoted to float32 by default.
#[test]
fn quantized_gguf_files_match_mlx_lm_on_their_import() -> Result<()> {
    for (file, fixture) in [
        ("llama-q4_0.gguf", "llama-f32"),
        ("qwen2-q4_1.gguf", "qwen2-f32"),
        ("qwen3-q8_0.gguf", "qwen3-f32"),
        ("llama-q5_0.gguf", "llama-f32"),
        ("qwen3-q5_1.gguf", "qwen3-f32"),
    ] {
        let gguf = fixtures::gguf(file)?;
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("model");
        import(&gguf, &dir)?;
        let cases: Vec<serde_json::Value> = fixtures::reference(fixture)?
            .cases
            .iter()
            .map(|c| {
                serde_json::json!({"name": c.name, "prompt_tokens": c.prompt_tokens,
                    "max_tokens": c.max_tokens})
            })
            .collect();
        let cases_file = tmp.path().join("cases.json");
        std::fs::write(&cases_file, serde_json::to_string(&cases)?)?;
        let (d, c) = (
            dir.to_str().unwrap_or_default(),
            cases_file.to_str().unwrap_or_default(),
        );
        let stored: Vec<Generated> = real::reference(&["generate", "--model", d, "--cases", c])?;
        let promoted: Vec<Generated> =
            real::reference(&["generate", "--model", d, "--cases", c, "--promote"])?;
        for (s, p) in stored.iter().zip(&promoted) {
            let max = cases
                .iter()
                .find(|c| c["name"] == s.name.as_str())
                .and_then(|c| c["max_tokens"].as_u64())
                .context("case")? as usize;
            for model in [gguf.as_path(), dir.as_path()] {
                let got = grove_tokens(model, &p.prompt_tokens, max, &[])?;
                ensure!(
                    got == p.tokens,
                    "{file} ({}) / {}: grove {got:?}, mlx-lm (promoted) {:?}",
                    model.display(),
                    p.name,
                    p.tokens
                );
            }
            let got = grove_tokens(&gguf, &s.prompt_tokens, max, &["--cpu-dtypes", "stored"])?;
            ensure!(
                got == s.tokens,
                "{file} / {} stored: grove {got:?}, mlx-lm {:?}",
                s.name,
                s.tokens
            );
        }
    }
    Ok(())
}

/// Runs `grove-runner generate` on `bytes` written to a file and returns its
/// stderr, which must be a clean error (no panic, no abort).
fn bad_file(bytes: &[u8]) -> Result<String> {
    let tmp = tempfile::tempdir()?;
    let path = tmp.path().join("bad.gguf");
    std::fs::write(&path, bytes)?;
    let out = run(&[
        "generate",
        "--model",
        path.to_str().unwrap_or_default(),
        "--prompt-tokens",
        "1,2",
        "--max-tokens",
        "1",
    ])?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(
        out.status.code() == Some(1),
        "expected exit 1, got {}: {stderr}",
        out.status
    );
    ensure!(
        stderr.starts_with("grove-runner: error: ") && !stderr.contains("panicked"),
        "not a clean error: {stderr}"
    );
    Ok(stderr)
}

fn patch_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn patch_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// A well-formed tiny GGUF loads and generates (so the failures below come
/// from the one field each of them breaks).
#[test]
fn a_tiny_gguf_written_here_runs() -> Result<()> {
    let (meta, tensors) = gguf_file::tiny_llama();
    let (bytes, _) = gguf_file::write(&meta, &tensors);
    let tmp = tempfile::tempdir()?;
    let path = tmp.path().join("tiny.gguf");
    std::fs::write(&path, bytes)?;
    let out = grove_tokens(&path, &[3, 4, 5], 4, &[])?;
    ensure!(out.len() <= 4);
    Ok(())
}

/// Malformed GGUF files (truncated, wrong magic, a tensor past the end, an
/// unknown or unsupported tensor type, metadata of the wrong type, huge
/// declared counts and lengths, an unsupported architecture) end in a clear
/// error naming what is wrong, never a panic or an allocation of the claimed size.
#[test]
fn malformed_gguf_files_are_clear_errors() -> Result<()> {
    let (meta, tensors) = gguf_file::tiny_llama();
    let (good, layout) = gguf_file::write(&meta, &tensors);
    let expect = |bytes: &[u8], needle: &str| -> Result<()> {
        let err = bad_file(bytes)?;
        ensure!(err.contains(needle), "expected {needle:?} in: {err}");
        Ok(())
    };

    // Truncated in the metadata, and in the tensor data.
    expect(&good[..200], "truncated")?;
    expect(&good[..good.len() - 100], "run past the end")?;
    // Wrong magic.
    let mut b = good.clone();
    b[..4].copy_from_slice(b"GGUX");
    expect(&b, "neither a model directory nor a GGUF file")?;
    // A tensor whose offset runs past the end.
    let mut b = good.clone();
    patch_u64(&mut b, layout.tensor_offset_at[3], 1 << 40);
    expect(&b, "run past the end")?;
    // An unknown tensor type, and a known one Grove cannot read.
    let mut b = good.clone();
    patch_u32(&mut b, layout.tensor_type_at[3], 99);
    expect(&b, "unknown tensor type 99")?;
    let mut b = good.clone();
    patch_u32(&mut b, layout.tensor_type_at[0], 16); // IQ2_XXS: sizes no longer fit
    let err = bad_file(&b)?;
    ensure!(err.contains("IQ2_XXS") || err.contains("blocks"), "{err}");
    // Metadata of the wrong type: block_count as a float, tokens as int32s.
    let mut b = good.clone();
    patch_u32(&mut b, layout.value_type_at["llama.block_count"], 6);
    expect(&b, "llama.block_count")?;
    let mut m = meta.clone();
    m.retain(|(k, _)| *k != "tokenizer.ggml.tokens");
    m.push(("tokenizer.ggml.tokens", Val::I32s(vec![1; 64])));
    expect(&gguf_file::write(&m, &tensors).0, "tokenizer.ggml.tokens")?;
    // Huge declared counts and lengths.
    let mut b = good.clone();
    patch_u64(&mut b, layout.tensor_count_at, u64::MAX / 2);
    expect(&b, "tensor count claims")?;
    let mut b = good.clone();
    patch_u64(&mut b, layout.kv_count_at, 1 << 62);
    expect(&b, "metadata count claims")?;
    let mut b = good.clone();
    // The first key's length.
    patch_u64(&mut b, layout.kv_count_at + 8, 1 << 50);
    expect(&b, "a string claims")?;
    // An architecture Grove does not convert.
    let mut m = meta.clone();
    m[0] = ("general.architecture", Val::Str("phi3".into()));
    expect(
        &gguf_file::write(&m, &tensors).0,
        "\"phi3\" is not supported",
    )?;
    // A tensor the architecture has no place for.
    let mut t = tensors.clone();
    t.push(gguf_file::f32_tensor("blk.0.mystery.weight", &[32], 3));
    expect(&gguf_file::write(&meta, &t).0, "mystery")?;
    // A missing tensor.
    let mut t = tensors.clone();
    t.retain(|x| x.name != "blk.0.ffn_up.weight");
    expect(&gguf_file::write(&meta, &t).0, "up_proj")?;
    Ok(())
}
