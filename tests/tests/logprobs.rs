//! Log-probabilities from `grove-runner serve` (a request's top_logprobs):
//! each generated token's and its step's most likely tokens equal mlx-lm's
//! `GenerationResponse.logprobs` (after the logits processors) within 1e-4,
//! for requests batched with others that ask for none, on fixtures of
//! several families (Gemma 2's soft-capped logits among them).
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use grove_proto::runner::v1 as pb;
use grove_tests::fixtures;
use grove_tests::serve::{Served, all_at_once, tokens_request};
use serde::Deserialize;
use serde_json::json;

const TOLERANCE: f32 = 1e-4;

/// One generated token as mlx-lm gives it.
#[derive(Debug, Deserialize)]
struct Step {
    id: u32,
    logprob: f32,
    top: Vec<(u32, f32)>,
}

/// mlx-lm's steps for `cases` (tests/fixtures/logprobs_ref.py).
fn reference(model: &Path, cases: &serde_json::Value) -> Result<Vec<Vec<Step>>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/logprobs_ref.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut cmd = Command::new(python);
    cmd.arg(script).arg(model).arg(cases.to_string());
    let out = grove_tests::proc::output_ok(&mut cmd, grove_tests::proc::DEADLINE)?;
    serde_json::from_slice(&out.stdout).context("parsing logprobs_ref.py's output")
}

/// Grove's tokens against mlx-lm's steps: the same ids, each log-probability
/// and each alternative's within [`TOLERANCE`] (an alternative's id may
/// differ only where two values tie within it).
fn compare(what: &str, got: &[pb::TokenLogprob], want: &[Step], top: usize) -> Result<()> {
    let ids: Vec<u32> = got.iter().map(|t| t.id).collect();
    let want_ids: Vec<u32> = want.iter().map(|s| s.id).collect();
    ensure!(
        ids == want_ids,
        "{what}: tokens {ids:?}, mlx-lm {want_ids:?}"
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        ensure!(
            (g.logprob - w.logprob).abs() <= TOLERANCE,
            "{what} token {i}: logprob {} against mlx-lm's {}",
            g.logprob,
            w.logprob
        );
        ensure!(
            g.top.len() == top && w.top.len() == top,
            "{what} token {i}: {} alternatives, mlx-lm {}, asked {top}",
            g.top.len(),
            w.top.len()
        );
        for (j, (a, (id, lp))) in g.top.iter().zip(&w.top).enumerate() {
            ensure!(
                (a.logprob - lp).abs() <= TOLERANCE,
                "{what} token {i} alternative {j}: {} against mlx-lm's {lp}",
                a.logprob
            );
            let tied = |k: usize| {
                w.top
                    .get(k)
                    .is_some_and(|(_, v)| (v - lp).abs() <= TOLERANCE)
            };
            ensure!(
                a.id == *id || (j > 0 && tied(j - 1)) || tied(j + 1),
                "{what} token {i} alternative {j}: id {} against mlx-lm's {id}",
                a.id
            );
        }
        ensure!(
            !g.bytes.is_empty() || g.token.is_empty(),
            "{what} token {i}: no bytes"
        );
    }
    Ok(())
}

#[tokio::test]
async fn logprobs_match_mlx_lm() -> Result<()> {
    for model in ["qwen3-f32", "llama-f32", "gemma2-f32", "qwen3-q4"] {
        let dir = fixtures::model_dir(model)?;
        let reference_cases = fixtures::reference(model)?.cases;
        let prompt = |i: usize| {
            reference_cases[i % reference_cases.len()]
                .prompt_tokens
                .clone()
        };
        let (plain, processed) = (prompt(0), prompt(1));
        let bias_id = processed[0];
        let cases = json!([
            {"prompt": plain, "max_tokens": 6, "top": 5},
            {"prompt": processed, "max_tokens": 6, "top": 3,
             "logit_bias": {bias_id.to_string(): 3.0}, "repetition_penalty": 1.3},
            {"prompt": [plain[0]], "max_tokens": 3, "top": 2},
        ]);
        let want = reference(&dir, &cases)?;

        let (_served, client) = Served::start(&dir, &[]).await?;
        let mut first = tokens_request(&plain, 6);
        first.top_logprobs = Some(5);
        let mut second = tokens_request(&processed, 6);
        second.top_logprobs = Some(3);
        second.sampling = Some(pb::SamplingOptions {
            logit_bias: [(bias_id, 3.0)].into(),
            repetition_penalty: Some(1.3),
            ..Default::default()
        });
        // A row that asks for none, in the same batch; and a one-token
        // prompt, whose first token is sampled by its prefill, not a step.
        let third = tokens_request(&prompt(2), 6);
        let mut fourth = tokens_request(&plain[..1], 3);
        fourth.top_logprobs = Some(2);
        let got = all_at_once(&client, vec![first, second, third, fourth]).await?;
        compare(&format!("{model} plain"), &got[0].logprobs, &want[0], 5)?;
        compare(&format!("{model} processed"), &got[1].logprobs, &want[1], 3)?;
        ensure!(
            got[2].logprobs.is_empty(),
            "{model}: logprobs nobody asked for"
        );
        compare(&format!("{model} one token"), &got[3].logprobs, &want[2], 2)?;
        for c in [&got[0], &got[1], &got[3]] {
            ensure!(
                c.logprobs.len() == c.metrics().eval_tokens as usize,
                "{model}: {} logprobs for {} tokens",
                c.logprobs.len(),
                c.metrics().eval_tokens
            );
        }
    }
    Ok(())
}

/// More alternatives than 20 are refused by name.
#[tokio::test]
async fn too_many_alternatives_are_refused() -> Result<()> {
    let (_served, mut client) = Served::start(&fixtures::model_dir("qwen3-f32")?, &[]).await?;
    let mut req = tokens_request(&[1, 2, 3], 2);
    req.top_logprobs = Some(21);
    let answer = tokio::time::timeout(std::time::Duration::from_secs(60), client.generate(req))
        .await
        .context("the runner did not answer within 60 s")?;
    let err = answer.err().context("21 alternatives were taken")?;
    ensure!(
        err.code() == tonic::Code::InvalidArgument && err.message().contains("top_logprobs"),
        "{err:?}"
    );
    Ok(())
}
