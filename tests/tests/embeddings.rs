//! Embeddings through a real daemon: OpenAI's and ollama's PyPI clients
//! (tests/http/embed_client.py) get mlx-embeddings' vectors within 1e-4 on a
//! BERT with mean pooling, one with CLS pooling and no normalization, an
//! XLM-RoBERTa (positions after its padding id) and a Qwen3-Embedding-shaped
//! decoder (last token), for concurrent calls too;
//! the gRPC `Embed` the same; and what is refused, by name.
use std::path::Path;

use anyhow::{Context, Result, ensure};
use grove_proto::v1 as pb;
use grove_tests::daemon::Daemon;
use grove_tests::fixtures;
use grove_tests::http::{Reply, python_client, send};
use serde_json::{Value, json};

const KEY: &str = "grove-embed-key-7a1c";

fn model(name: &str) -> Result<String> {
    Ok(fixtures::model_dir(&format!("embed/{name}"))?
        .display()
        .to_string())
}

/// A JSON POST to the daemon, answered whole.
async fn post(addr: &str, path: &str, body: &Value) -> Result<Reply> {
    let headers = [("Content-Type", "application/json")];
    send(addr, "POST", path, &headers, body.to_string().as_bytes()).await
}

fn reference(dir: &str) -> Result<Value> {
    let text = std::fs::read_to_string(Path::new(dir).join("embed_ref.json"))?;
    Ok(serde_json::from_str(&text)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_get_the_reference_vectors() -> Result<()> {
    let models = [
        model("bert-f32")?,
        model("bert-cls-f32")?,
        model("xlm-roberta-f32")?,
        model("qwen3-embed-f32")?,
    ];
    let (d, _) = Daemon::start(&[("GROVE_API_KEY", KEY)]).await?;
    let base = format!("http://{}", d.addr);
    let mut args = vec![base.clone(), KEY.to_owned()];
    args.extend(models.iter().cloned());
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        python_client("embed_client.py", &args)
    })
    .await??;
    println!("{out}");
    ensure!(out.lines().count() == 4, "one line per model: {out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grpc_embed_and_refusals() -> Result<()> {
    let bert = model("bert-f32")?;
    let qwen = model("qwen3-embed-f32")?;
    let (d, mut client) = Daemon::start(&[]).await?;

    // gRPC: texts and token ids of both models in one call each, batched.
    for dir in [&bert, &qwen] {
        let want = reference(dir)?;
        let cases = want["cases"].as_array().context("cases")?;
        let inputs = cases
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let input = if i % 2 == 0 {
                    pb::embed_input::Input::Text(c["text"].as_str().unwrap_or("").to_owned())
                } else {
                    let ids = c["ids"].as_array().into_iter().flatten();
                    pb::embed_input::Input::Tokens(pb::TokenIds {
                        ids: ids.filter_map(Value::as_u64).map(|n| n as u32).collect(),
                    })
                };
                pb::EmbedInput { input: Some(input) }
            })
            .collect();
        let r = client
            .embed(pb::EmbedRequest {
                model: dir.clone(),
                inputs,
                ..Default::default()
            })
            .await?
            .into_inner();
        ensure!(r.embeddings.len() == cases.len(), "{r:?}");
        for (c, e) in cases.iter().zip(&r.embeddings) {
            let want: Vec<f64> = c["embedding"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_f64)
                .collect();
            ensure!(want.len() == e.values.len(), "{dir}: length");
            let diff = want
                .iter()
                .zip(&e.values)
                .map(|(w, g)| (w - *g as f64).abs())
                .fold(0.0, f64::max);
            ensure!(diff <= 1e-4, "{dir} {:?}: differs by {diff}", c["text"]);
        }
    }

    // An input past BERT's 128 positions: cut by default, refused with
    // truncate false (ollama's rule), by name.
    let long = "the quick brown fox jumps over the lazy dog ".repeat(30);
    let body = json!({"model": bert, "input": long});
    let r = post(&d.addr, "/api/embed", &body).await?;
    ensure!(r.status == 200, "{r:?}");
    ensure!(r.json()?["prompt_eval_count"] == 128, "{r:?}");
    let body = json!({"model": bert, "input": long, "truncate": false});
    let r = post(&d.addr, "/api/embed", &body).await?;
    ensure!(r.status == 400 && r.body.contains("truncate"), "{r:?}");

    // What would change the output and is not done, refused by name.
    let refusals = [
        (
            "/v1/embeddings",
            json!({"model": bert, "input": "a", "dimensions": 65}),
            "dimensions",
        ),
        (
            "/v1/embeddings",
            json!({"model": bert, "input": "a", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (
            "/v1/embeddings",
            json!({"model": bert, "input": "a", "pooling": "max"}),
            "pooling",
        ),
        (
            "/v1/embeddings",
            json!({"model": bert, "input": [[1, 2], "a"]}),
            "input",
        ),
        (
            "/v1/embeddings",
            json!({"model": bert, "input": [7000]}),
            "vocabulary",
        ),
        (
            "/api/embed",
            json!({"model": bert, "input": "a", "options": {"num_ctx": 8}}),
            "num_ctx",
        ),
        ("/api/embed", json!({"model": bert, "input": []}), "input"),
        ("/api/embeddings", json!({"model": bert}), "prompt"),
    ];
    for (path, body, needle) in refusals {
        let r = post(&d.addr, path, &body).await?;
        ensure!(
            r.status == 400 && r.body.contains(needle),
            "{path} {body}: {r:?}"
        );
    }
    // Labels are taken.
    let body = json!({"model": bert, "input": "a", "user": "someone", "encoding_format": "float"});
    let r = post(&d.addr, "/v1/embeddings", &body).await?;
    ensure!(r.status == 200, "{r:?}");

    // ollama's show says what each model does.
    for (dir, want) in [
        (&bert, json!(["embedding"])),
        (&qwen, json!(["completion", "embedding"])),
    ] {
        let body = json!({"model": dir});
        let r = post(&d.addr, "/api/show", &body).await?;
        ensure!(r.json()?["capabilities"] == want, "{dir}: {r:?}");
    }

    // `grove run` on an embedding model prints its vector (as ollama's run).
    let mut run = std::process::Command::new(grove_tests::runner::binary("grove")?);
    run.args(["run", &bert, "Hello, world"])
        .env("GROVE_HOST", &d.addr)
        .env("GROVE_NO_AUTOSTART", "1");
    let out = grove_tests::proc::output_ok(&mut run, grove_tests::proc::DEADLINE)?;
    let printed: Vec<f64> = serde_json::from_slice(&out.stdout)?;
    let want = reference(&bert)?;
    let first: Vec<f64> = want["cases"][0]["embedding"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_f64)
        .collect();
    ensure!(
        printed.len() == first.len()
            && printed
                .iter()
                .zip(&first)
                .all(|(a, b)| (a - b).abs() <= 1e-4),
        "grove run printed {printed:?}"
    );

    // An encoder does not generate: a clear error, not a crash.
    let body = json!({"model": bert, "prompt": "hello", "stream": false});
    let r = post(&d.addr, "/api/generate", &body).await?;
    ensure!(
        r.status == 400 && r.body.contains("does not generate"),
        "{r:?}"
    );
    Ok(())
}
