//! The daemon's HTTP APIs (OpenAI's, ollama's, Anthropic's Messages) on its
//! gRPC address: the PyPI `openai`, `anthropic` and `ollama` clients against
//! a real daemon, and raw HTTP
//! for what clients never send (malformed bodies, huge bodies, missing keys,
//! a client that leaves mid-stream).
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use grove_proto::v1 as pb;
use grove_proto::v1::grove_client::GroveClient;
use grove_tests::daemon::Daemon;
use grove_tests::fixtures;
use grove_tests::http::{Lines, node_client, python_client, python_client_in, send};
use grove_tests::hub_server::HubServer;

const KEY: &str = "grove-test-key-5d41402abc4b2a76";
const BEARER: &str = "Bearer grove-test-key-5d41402abc4b2a76";
const REPO: &str = "test-org/tiny-qwen3";

fn auth() -> [(&'static str, &'static str); 2] {
    [
        ("Authorization", BEARER),
        ("Content-Type", "application/json"),
    ]
}

/// A gRPC client that sends the key.
async fn grpc(
    d: &Daemon,
    key: &'static str,
) -> Result<
    GroveClient<
        tonic::service::interceptor::InterceptedService<
            tonic::transport::Channel,
            impl tonic::service::Interceptor,
        >,
    >,
> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", d.addr))?
        .connect()
        .await?;
    Ok(GroveClient::with_interceptor(
        channel,
        move |mut r: tonic::Request<()>| {
            if let Ok(v) = format!("Bearer {key}").parse() {
                r.metadata_mut().insert("authorization", v);
            }
            Ok(r)
        },
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn openai_and_ollama_clients_from_pypi() -> Result<()> {
    let hub = HubServer::start().await?;
    hub.add_fixture(REPO, &fixtures::model_dir("qwen3-moe-f32")?)?;
    let endpoint = hub.endpoint();
    let (d, _) = Daemon::start(&[
        ("HF_ENDPOINT", &endpoint),
        ("HF_HUB_OFFLINE", "0"),
        ("GROVE_API_KEY", KEY),
    ])
    .await?;
    let base = format!("http://{}", d.addr);

    // Into the store through ollama's pull, not streamed.
    let body = format!(r#"{{"model": "{REPO}", "stream": false}}"#);
    let r = send(&d.addr, "POST", "/api/pull", &auth(), body.as_bytes()).await?;
    ensure!(r.status == 200 && r.json()?["status"] == "success", "{r:?}");

    let b = base.clone();
    let out =
        tokio::task::spawn_blocking(move || python_client("openai_client.py", &[&b, KEY, REPO]))
            .await??;
    eprintln!("{out}");
    let b = base.clone();
    let out =
        tokio::task::spawn_blocking(move || python_client("anthropic_client.py", &[&b, KEY, REPO]))
            .await??;
    eprintln!("{out}");
    let b = base.clone();
    let out = tokio::task::spawn_blocking(move || {
        python_client_in("frameworks", "frameworks_client.py", &[&b, KEY, REPO])
    })
    .await??;
    eprintln!("{out}");
    let b = base.clone();
    match tokio::task::spawn_blocking(move || node_client("node_client.cjs", &[&b, KEY, REPO]))
        .await??
    {
        Some(out) => eprintln!("{out}"),
        None => eprintln!("no Node or npm on this machine: the npm clients were not run"),
    }
    // The ollama script pulls again (from the cache), then deletes the model.
    let out =
        tokio::task::spawn_blocking(move || python_client("ollama_client.py", &[&base, KEY, REPO]))
            .await??;
    eprintln!("{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn raw_http_errors_keys_limits_and_cors() -> Result<()> {
    let (d, _) = Daemon::start(&[
        ("GROVE_API_KEY", KEY),
        ("GROVE_MAX_BODY", "65536"),
        ("GROVE_ORIGINS", "http://app.example"),
    ])
    .await?;
    let model = fixtures::model_dir("qwen3-f32")?.display().to_string();
    let a = auth();
    let post = |path: &'static str, body: String| {
        let addr = d.addr.clone();
        async move { send(&addr, "POST", path, &a, body.as_bytes()).await }
    };

    // Malformed JSON and wrong types: 400 in each API's error shape.
    let r = post("/v1/chat/completions", "{\"model\": ".into()).await?;
    ensure!(
        r.status == 400 && r.json()?["error"]["type"] == "invalid_request_error",
        "{r:?}"
    );
    let r = post(
        "/v1/chat/completions",
        r#"{"model": 5, "messages": []}"#.into(),
    )
    .await?;
    ensure!(
        r.status == 400
            && r.json()?["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("invalid type")),
        "{r:?}"
    );
    let r = post("/api/chat", r#"{"model": "x", "messages": "hi"}"#.into()).await?;
    ensure!(r.status == 400 && r.json()?["error"].is_string(), "{r:?}");
    let r = post("/api/generate", "not json".into()).await?;
    ensure!(r.status == 400 && r.json()?["error"].is_string(), "{r:?}");
    // A field Grove does not implement is named, not ignored.
    let body = format!(
        r#"{{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}], "modalities": ["audio"]}}"#
    );
    let r = post("/v1/chat/completions", body).await?;
    ensure!(r.status == 400 && r.body.contains("modalities"), "{r:?}");

    // A body over GROVE_MAX_BODY: 413, and the daemon carries on.
    let huge = format!(
        r#"{{"model": "{model}", "prompt": "{}"}}"#,
        "a".repeat(200_000)
    );
    let r = post("/v1/completions", huge.clone()).await?;
    ensure!(r.status == 413, "{r:?}");
    let r = post("/api/generate", huge).await?;
    ensure!(r.status == 413, "{r:?}");

    // Unknown models: 404.
    let r = post(
        "/v1/chat/completions",
        r#"{"model": "nobody/none", "messages": [{"role": "user", "content": "hi"}]}"#.into(),
    )
    .await?;
    ensure!(
        r.status == 404 && r.json()?["error"]["code"] == "model_not_found",
        "{r:?}"
    );
    let r = post(
        "/api/chat",
        r#"{"model": "nobody/none", "messages": [{"role": "user", "content": "hi"}]}"#.into(),
    )
    .await?;
    ensure!(r.status == 404, "{r:?}");

    // Keys: none or a wrong one is 401 over HTTP and UNAUTHENTICATED over gRPC.
    let r = send(&d.addr, "GET", "/v1/models", &[], b"").await?;
    ensure!(
        r.status == 401 && r.json()?["error"]["type"] == "authentication_error",
        "{r:?}"
    );
    let r = send(
        &d.addr,
        "GET",
        "/api/tags",
        &[("Authorization", "Bearer nope")],
        b"",
    )
    .await?;
    ensure!(r.status == 401 && r.json()?["error"].is_string(), "{r:?}");
    let r = send(&d.addr, "GET", "/api/version", &a, b"").await?;
    ensure!(r.status == 200, "{r:?}");
    let mut plain = d.client().await?;
    let e = plain
        .version(pb::VersionRequest {})
        .await
        .expect_err("no key, yet served");
    ensure!(e.code() == tonic::Code::Unauthenticated, "{e:?}");
    let mut wrong = grpc(&d, "wrong").await?;
    let e = wrong
        .ps(pb::PsRequest {})
        .await
        .expect_err("a wrong key, yet served");
    ensure!(e.code() == tonic::Code::Unauthenticated, "{e:?}");
    let mut c = grpc(&d, KEY).await?;
    c.version(pb::VersionRequest {}).await?;
    // The CLI sends GROVE_API_KEY.
    let out = grove_tests::proc::output_async(
        {
            let mut cmd = std::process::Command::new(grove_tests::runner::binary("grove")?);
            cmd.arg("ps")
                .env("GROVE_HOST", &d.addr)
                .env("GROVE_NO_AUTOSTART", "1")
                .env("GROVE_API_KEY", KEY);
            cmd
        },
        grove_tests::proc::DEADLINE,
    )
    .await?;
    ensure!(
        out.status.success(),
        "grove ps with the key: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // CORS: the configured origin only; preflights need no key.
    let pre = [
        ("Origin", "http://app.example"),
        ("Access-Control-Request-Method", "POST"),
        (
            "Access-Control-Request-Headers",
            "authorization,content-type",
        ),
    ];
    let r = send(&d.addr, "OPTIONS", "/v1/chat/completions", &pre, b"").await?;
    ensure!(
        r.header("access-control-allow-origin") == Some("http://app.example"),
        "{r:?}"
    );
    let other = [("Origin", "http://evil.example"), ("Authorization", BEARER)];
    let r = send(&d.addr, "GET", "/v1/models", &other, b"").await?;
    ensure!(
        r.status == 200 && r.header("access-control-allow-origin").is_none(),
        "{r:?}"
    );

    // A client that leaves mid-stream: the generation stops at once.
    let body = format!(
        r#"{{"model": "{model}", "prompt": "hello", "max_tokens": 100000, "stream": true}}"#
    );
    let mut lines = Lines::open(&d.addr, "/v1/completions", &a, &body).await?;
    ensure!(lines.status == 200);
    lines.next_with("data: ").await?;
    let ps = c.ps(pb::PsRequest {}).await?.into_inner();
    ensure!(ps.models.iter().any(|m| m.active_requests == 1), "{ps:?}");
    drop(lines);
    let left = Instant::now();
    loop {
        let ps = c.ps(pb::PsRequest {}).await?.into_inner();
        if ps.models.iter().all(|m| m.active_requests == 0) {
            break;
        }
        ensure!(
            left.elapsed() < Duration::from_secs(5),
            "still generating 5 s after the client left: {ps:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "the request ended {:?} after the client left",
        left.elapsed()
    );
    // And the runner is free for the next one.
    let body = format!(r#"{{"model": "{model}", "prompt": "hello", "max_tokens": 3}}"#);
    let r = post("/v1/completions", body).await?;
    ensure!(
        r.status == 200 && r.json()?["usage"]["completion_tokens"] == 3,
        "{r:?}"
    );
    Ok(())
}

/// A daemon on a non-loopback address without a key refuses to start.
#[test]
fn remote_bind_needs_a_key() -> Result<()> {
    let out = grove_tests::proc::output(
        std::process::Command::new(grove_tests::runner::binary("grove")?)
            .arg("serve")
            .env("GROVE_HOST", "0.0.0.0:0")
            .env("GROVE_ALLOW_REMOTE", "1")
            .env_remove("GROVE_API_KEY"),
        Duration::from_secs(60),
    )?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && err.contains("GROVE_API_KEY"),
        "{err}"
    );
    Ok(())
}
