//! The runner against mlx-lm: on every fixture model (llama, mistral, qwen2,
//! qwen3, llama with biases and sliding windows, gemma3, gemma4, gemma2, phi3,
//! qwen3-moe (also NVFP4), qwen3-next, gpt-oss (also MXFP4 and MXFP8),
//! qwen3.5, qwen3.5-moe and glm4-moe-lite;
//! float32 and 4-bit; bfloat16 qwen3, gemma3, gemma4, gemma2, phi3 and bfloat16-scaled 4-bit
//! llama),
//! greedy decoding must give mlx-lm's tokens exactly,
//! and the last prompt position's logits must agree within LOGIT_TOLERANCE.
use anyhow::{Result, ensure};
use grove_tests::fixtures::{self, Case};
use grove_tests::runner::{generate_json, ids_arg};

/// Largest absolute difference allowed between Grove's and mlx-lm's logits.
/// Both run the same MLX kernels on the same weights; what differs is that
/// mlx-lm's reference logits come from one forward pass over the whole prompt
/// while Grove's come from its chunked prefill with a KV cache, so attention
/// sums in another order. Measured: at most ~2.4e-7 on these fixtures.
const LOGIT_TOLERANCE: f32 = 1e-4;

fn check_case(model: &str, case: &Case, extra: &[&str]) -> Result<()> {
    check_case_in(&fixtures::model_dir(model)?, model, case, extra)
}

fn check_case_in(dir: &std::path::Path, model: &str, case: &Case, extra: &[&str]) -> Result<()> {
    let dump = tempfile::NamedTempFile::new()?;
    let step_dump = tempfile::NamedTempFile::new()?;
    let ids = ids_arg(&case.prompt_tokens);
    let max = case.max_tokens.to_string();
    let mut args = vec![
        "--model",
        dir.to_str().unwrap_or_default(),
        "--prompt-tokens",
        &ids,
        "--max-tokens",
        &max,
        "--temperature",
        "0",
        "--dump-logits",
        dump.path().to_str().unwrap_or_default(),
        "--dump-step-logits",
        step_dump.path().to_str().unwrap_or_default(),
    ];
    args.extend_from_slice(extra);
    let out = generate_json(&args)?;
    ensure!(
        out.tokens == case.tokens,
        "{model}/{} {extra:?}: tokens differ from mlx-lm\n grove:  {:?}\n mlx-lm: {:?}",
        case.name,
        out.tokens,
        case.tokens
    );
    ensure!(out.prompt_tokens == case.prompt_tokens.len());
    ensure!(
        out.finish_reason == case.finish_reason,
        "{model}/{}: finished by {}, mlx-lm by {}",
        case.name,
        out.finish_reason,
        case.finish_reason
    );
    let logits: Vec<f32> = serde_json::from_str(&std::fs::read_to_string(dump.path())?)?;
    ensure!(
        logits.len() == case.logits.len(),
        "{model}/{}: {} logits, mlx-lm has {}",
        case.name,
        logits.len(),
        case.logits.len()
    );
    let worst = logits
        .iter()
        .zip(&case.logits)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    ensure!(
        worst <= LOGIT_TOLERANCE,
        "{model}/{}: logits differ from mlx-lm by up to {worst:e} (tolerance {LOGIT_TOLERANCE:e})",
        case.name
    );
    // The first decode step's logits (written when a second token was
    // decoded) pick the second greedy token.
    let step = std::fs::read_to_string(step_dump.path())?;
    if let Some(&second) = case.tokens.get(1) {
        ensure!(
            !step.is_empty(),
            "{model}/{}: no decode step logits",
            case.name
        );
        let step: Vec<f32> = serde_json::from_str(&step)?;
        let best = step.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        ensure!(
            step.len() == logits.len() && step.get(second as usize) == Some(&best),
            "{model}/{}: the decode step's logits do not pick token {second}",
            case.name
        );
    }
    Ok(())
}

/// Every reference case, from token ids, with the default prefill chunk.
fn check_model(model: &str) -> Result<()> {
    let reference = fixtures::reference(model)?;
    ensure!(reference.model == model);
    ensure!(!reference.cases.is_empty(), "{model}: no reference cases");
    for case in &reference.cases {
        check_case(model, case, &[])?;
    }
    // Chunked prefill (7 tokens per pass over the long prompt) changes nothing.
    let long = reference
        .cases
        .iter()
        .max_by_key(|c| c.prompt_tokens.len())
        .expect("cases is not empty");
    ensure!(
        long.prompt_tokens.len() > 100,
        "{model}: no long case to chunk"
    );
    check_case(model, long, &["--prefill-chunk", "7"])?;
    // A half-precision model: the default promotes it to float32 on the CPU
    // backend (checked above against mlx-lm on the promoted model); kept as
    // stored, it gives mlx-lm's outputs on the model as stored.
    if fixtures::has_half_precision(model)? {
        for case in &fixtures::reference_stored(model)?.cases {
            check_case(model, case, &["--cpu-dtypes", "stored"])?;
        }
    }
    Ok(())
}

#[test]
fn llama_f32_matches_mlx_lm() -> Result<()> {
    check_model("llama-f32")
}

#[test]
fn llama_q4_matches_mlx_lm() -> Result<()> {
    check_model("llama-q4")
}

#[test]
fn mistral_f32_matches_mlx_lm() -> Result<()> {
    check_model("mistral-f32")
}

#[test]
fn mistral_q4_matches_mlx_lm() -> Result<()> {
    check_model("mistral-q4")
}

#[test]
fn qwen2_f32_matches_mlx_lm() -> Result<()> {
    check_model("qwen2-f32")
}

#[test]
fn qwen2_q4_matches_mlx_lm() -> Result<()> {
    check_model("qwen2-q4")
}

#[test]
fn qwen3_f32_matches_mlx_lm() -> Result<()> {
    check_model("qwen3-f32")
}

#[test]
fn qwen3_q4_matches_mlx_lm() -> Result<()> {
    check_model("qwen3-q4")
}

#[test]
fn qwen3_bf16_matches_mlx_lm() -> Result<()> {
    check_model("qwen3-bf16")
}

#[test]
fn llama_q4_with_bf16_scales_matches_mlx_lm() -> Result<()> {
    check_model("llama-q4-bf16")
}

#[test]
fn llama_swa_f32_matches_mlx_lm() -> Result<()> {
    check_model("llama-swa-f32")
}

#[test]
fn llama_swa_q4_matches_mlx_lm() -> Result<()> {
    check_model("llama-swa-q4")
}

#[test]
fn gemma3_f32_matches_mlx_lm() -> Result<()> {
    check_model("gemma3-f32")
}

#[test]
fn gemma3_q4_matches_mlx_lm() -> Result<()> {
    check_model("gemma3-q4")
}

#[test]
fn gemma3_bf16_matches_mlx_lm() -> Result<()> {
    check_model("gemma3-bf16")
}

#[test]
fn gemma4_f32_matches_mlx_lm() -> Result<()> {
    check_model("gemma4-f32")
}

#[test]
fn gemma4_q4_matches_mlx_lm() -> Result<()> {
    check_model("gemma4-q4")
}

#[test]
fn gemma4_bf16_matches_mlx_lm() -> Result<()> {
    check_model("gemma4-bf16")
}

#[test]
fn gemma3_multimodal_checkpoint_matches_mlx_lm() -> Result<()> {
    check_model("gemma3-mm-f32")
}

#[test]
fn gemma4_multimodal_checkpoint_matches_mlx_lm() -> Result<()> {
    check_model("gemma4-mm-f32")
}

/// A multimodal checkpoint's vision tensors are skipped by name, with a
/// line saying so.
#[test]
fn multimodal_checkpoints_skip_their_vision_tensors() -> Result<()> {
    for model in ["gemma3-mm-f32", "gemma4-mm-f32"] {
        let dir = fixtures::model_dir(model)?;
        let out = grove_tests::runner::run(&[
            "generate",
            "--model",
            dir.to_str().unwrap_or_default(),
            "--prompt-tokens",
            "2,100,200",
            "--max-tokens",
            "1",
        ])?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(out.status.success(), "{model}: {err}");
        ensure!(
            err.contains("skipped 2 vision/audio tensors"),
            "{model}: {err}"
        );
    }
    Ok(())
}

#[test]
fn gemma2_f32_matches_mlx_lm() -> Result<()> {
    check_model("gemma2-f32")
}

#[test]
fn gemma2_q4_matches_mlx_lm() -> Result<()> {
    check_model("gemma2-q4")
}

#[test]
fn gemma2_bf16_matches_mlx_lm() -> Result<()> {
    check_model("gemma2-bf16")
}

#[test]
fn phi3_f32_matches_mlx_lm() -> Result<()> {
    check_model("phi3-f32")
}

#[test]
fn phi3_q4_matches_mlx_lm() -> Result<()> {
    check_model("phi3-q4")
}

#[test]
fn phi3_bf16_matches_mlx_lm() -> Result<()> {
    check_model("phi3-bf16")
}

#[test]
fn llama_kv_f32_matches_mlx_lm() -> Result<()> {
    check_model("llama-kv-f32")
}

#[test]
fn llama_kv_q4_matches_mlx_lm() -> Result<()> {
    check_model("llama-kv-q4")
}

/// Text prompts are tokenized as mlx-lm does (BOS rule included), so the text
/// path gives the same prompt length and the same tokens.
#[test]
fn text_prompts_tokenize_like_mlx_lm() -> Result<()> {
    for model in fixtures::MODELS {
        let dir = fixtures::model_dir(model)?;
        for case in fixtures::reference(model)?.cases {
            let Some(prompt) = &case.prompt else { continue };
            let max = case.max_tokens.to_string();
            let out = generate_json(&[
                "--model",
                dir.to_str().unwrap_or_default(),
                "--prompt",
                prompt,
                "--max-tokens",
                &max,
            ])?;
            ensure!(
                out.prompt_tokens == case.prompt_tokens.len(),
                "{model}/{}: {} prompt tokens, mlx-lm has {}",
                case.name,
                out.prompt_tokens,
                case.prompt_tokens.len()
            );
            ensure!(
                out.tokens == case.tokens,
                "{model}/{}: tokens differ",
                case.name
            );
            ensure!(out.prompt_tps > 0.0 && out.decode_tps >= 0.0);
        }
    }
    Ok(())
}
#[test]
fn qwen3_moe_f32_matches_mlx_lm() -> Result<()> {
    check_model("qwen3-moe-f32")
}

/// Its experts 4-bit, its routers 8-bit (mlx-lm's per-layer override).
#[test]
fn qwen3_moe_q4_matches_mlx_lm() -> Result<()> {
    check_model("qwen3-moe-q4")
}

/// The same model with HF's one matrix per expert, stacked at load.
#[test]
fn qwen3_moe_per_expert_checkpoint_matches_mlx_lm() -> Result<()> {
    check_model("qwen3-moe-hf-f32")
}

#[test]
fn qwen3_next_f32_matches_mlx_lm() -> Result<()> {
    check_model("qwen3-next-f32")
}

#[test]
fn qwen3_next_q4_matches_mlx_lm() -> Result<()> {
    check_model("qwen3-next-q4")
}

#[test]
fn gpt_oss_f32_matches_mlx_lm() -> Result<()> {
    check_model("gpt-oss-f32")
}

#[test]
fn gpt_oss_q4_matches_mlx_lm() -> Result<()> {
    check_model("gpt-oss-q4")
}

/// Every matrix MXFP4 (4-bit floats, an e8m0 scale per 32), the routers
/// 8-bit affine.
#[test]
fn gpt_oss_mxfp4_matches_mlx_lm() -> Result<()> {
    check_model("gpt-oss-mxfp4")
}

/// MXFP8: 8-bit floats, an e8m0 scale per 32.
#[test]
fn gpt_oss_mxfp8_matches_mlx_lm() -> Result<()> {
    check_model("gpt-oss-mxfp8")
}

/// NVFP4: 4-bit floats, an fp8 scale per 16; experts through gather_qmm.
#[test]
fn qwen3_moe_nvfp4_matches_mlx_lm() -> Result<()> {
    check_model("qwen3-moe-nvfp4")
}

/// Qwen3.5's text part under its multimodal checkpoint's prefix.
#[test]
fn qwen3_5_f32_matches_mlx_lm() -> Result<()> {
    check_model("qwen3.5-f32")
}

#[test]
fn qwen3_5_q4_matches_mlx_lm() -> Result<()> {
    check_model("qwen3.5-q4")
}

#[test]
fn qwen3_5_moe_f32_matches_mlx_lm() -> Result<()> {
    check_model("qwen3.5-moe-f32")
}

#[test]
fn qwen3_5_moe_q4_matches_mlx_lm() -> Result<()> {
    check_model("qwen3.5-moe-q4")
}

/// HF's layout of the same model (norms as offsets, the convolution turned,
/// fused expert projections), converted at load as mlx-lm's sanitize does.
#[test]
fn qwen3_5_moe_hf_checkpoint_matches_mlx_lm() -> Result<()> {
    check_model("qwen3.5-moe-hf-f32")
}

/// Latent attention (decode in latent space, prefill in head space) and
/// sigmoid-routed experts.
#[test]
fn glm4_moe_lite_f32_matches_mlx_lm() -> Result<()> {
    check_model("glm4-moe-lite-f32")
}

#[test]
fn glm4_moe_lite_q4_matches_mlx_lm() -> Result<()> {
    check_model("glm4-moe-lite-q4")
}

/// GGUF copies of the float32 fixtures, written as llama.cpp's converter writes
/// them (llama's q/k rows permuted, Llama 3 rope scaling as a `rope_freqs`
/// tensor, qwen2's biases, qwen3's q/k norms), load to the same model: every
/// reference case gives mlx-lm's tokens and logits.
#[test]
fn gguf_copies_of_float32_fixtures_match_mlx_lm() -> Result<()> {
    for family in ["llama", "qwen2", "qwen3"] {
        let gguf = fixtures::gguf(&format!("{family}-f32.gguf"))?;
        let model = format!("{family}-f32");
        for case in &fixtures::reference(&model)?.cases {
            check_case_in(&gguf, &model, case, &[])?;
        }
    }
    Ok(())
}

/// A sharded checkpoint (qwen2's fixture is saved in several files) loads.
#[test]
fn sharded_checkpoint_is_sharded() -> Result<()> {
    let dir = fixtures::model_dir("qwen2-f32")?;
    let shards = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        .count();
    ensure!(
        shards >= 2,
        "qwen2-f32 has {shards} safetensors files; the fixture should be sharded"
    );
    Ok(())
}
