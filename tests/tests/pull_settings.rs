//! The hub settings of a pull are the client's: `grove pull` sends its
//! shell's `HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE` with the request,
//! and the daemon uses them for that pull only (a daemon started earlier,
//! by `grove service install` or an earlier `grove run`, keeps its own
//! environment). Settings a client does not send are the daemon's own.
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use grove_proto::v1 as pb;
use grove_tests::daemon::Daemon;
use grove_tests::fixtures;
use grove_tests::hub_server::HubServer;
use grove_tests::proc::{DEADLINE, output_async};
use grove_tests::runner::binary;

/// `grove pull REPO` against the daemon at `addr`, with exactly `env` as
/// the hub settings of its shell (HF_* variables of this test's own
/// environment are not passed on; HF_HOME is `home`, which has no token
/// file unless a test writes one).
async fn cli_pull(
    addr: &str,
    repo: &str,
    home: &std::path::Path,
    env: &[(&str, &str)],
) -> Result<std::process::Output> {
    let mut cmd = Command::new(binary("grove")?);
    cmd.args(["pull", repo])
        .env("GROVE_HOST", addr)
        .env("GROVE_NO_AUTOSTART", "1")
        .env("HF_HOME", home);
    for var in [
        "HF_ENDPOINT",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    output_async(cmd, DEADLINE).await
}

/// The requests `hub` got for `repo`, each with the Authorization it carried.
fn requests_for(hub: &HubServer, repo: &str) -> Vec<(String, Option<String>)> {
    hub.log()
        .into_iter()
        .filter(|r| r.path.contains(repo))
        .map(|r| (r.path, r.authorization))
        .collect()
}

/// Every request `hub` got for `repo` carried `Bearer {token}`, and there
/// was at least one.
fn reached_with(hub: &HubServer, repo: &str, token: &str) -> Result<()> {
    let seen = requests_for(hub, repo);
    ensure!(
        !seen.is_empty(),
        "{} got no request for {repo}",
        hub.endpoint()
    );
    let want = format!("Bearer {token}");
    // The hub's own API and resolve URLs get the token (a CDN would not).
    for (path, auth) in &seen {
        if path.starts_with("/api/") || path.contains("/resolve/") {
            ensure!(
                auth.as_deref() == Some(want.as_str()),
                "{path} on {} carried {auth:?}, not {want:?}",
                hub.endpoint()
            );
        }
    }
    Ok(())
}

/// The models the daemon lists.
async fn listed(
    c: &mut grove_proto::v1::grove_client::GroveClient<tonic::transport::Channel>,
) -> Result<Vec<String>> {
    Ok(c.list(pb::ListRequest {})
        .await?
        .into_inner()
        .models
        .into_iter()
        .map(|m| m.name)
        .collect())
}

/// POSTs `body` as JSON to `path` and expects 200.
async fn post_ok(addr: &str, path: &str, body: &serde_json::Value) -> Result<()> {
    let reply = grove_tests::http::send(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
    .await?;
    ensure!(
        reply.status == 200,
        "{path}: {} {}",
        reply.status,
        reply.body
    );
    Ok(())
}

#[tokio::test]
async fn each_pull_reaches_the_hub_its_client_names_with_its_token() -> Result<()> {
    let model = fixtures::model_dir("qwen2-f32")?;
    let (one, two) = (HubServer::start().await?, HubServer::start().await?);
    one.add_fixture("org-one/tiny", &model)?;
    one.gate("org-one/tiny", "hf_token_one");
    two.add_fixture("org-two/tiny", &model)?;
    two.gate("org-two/tiny", "hf_token_two");

    // A daemon with no hub settings at all: no endpoint, no token (nor a
    // token file in its HF_HOME), not offline. Empty values are unset.
    let daemon_home = tempfile::tempdir()?;
    let home = daemon_home.path().to_string_lossy().into_owned();
    let (d, mut c) = Daemon::start(&[
        ("HF_HOME", &home),
        ("HF_ENDPOINT", ""),
        ("HF_TOKEN", ""),
        ("HF_HUB_OFFLINE", ""),
    ])
    .await?;

    // Each pull goes to the hub its shell names, with the token it names.
    let client_home = tempfile::tempdir()?;
    for (hub, other, repo, token) in [
        (&one, &two, "org-one/tiny", "hf_token_one"),
        (&two, &one, "org-two/tiny", "hf_token_two"),
    ] {
        let endpoint = hub.endpoint();
        let out = cli_pull(
            &d.addr,
            repo,
            client_home.path(),
            &[("HF_ENDPOINT", &endpoint), ("HF_TOKEN", token)],
        )
        .await?;
        ensure!(
            out.status.success(),
            "grove pull {repo}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        reached_with(hub, repo, token)?;
        ensure!(
            requests_for(other, repo).is_empty(),
            "{repo} was asked of the other hub"
        );
    }
    let models = listed(&mut c).await?;
    for repo in ["org-one/tiny", "org-two/tiny"] {
        ensure!(models.iter().any(|m| m == repo), "{repo} not in {models:?}");
    }

    // The wrong token is the hub's refusal (the daemon has no token of its
    // own to fall back on).
    one.clear_log();
    let endpoint = one.endpoint();
    one.add_fixture("org-one/other", &model)?;
    one.gate("org-one/other", "hf_token_one");
    let out = cli_pull(
        &d.addr,
        "org-one/other",
        client_home.path(),
        &[("HF_ENDPOINT", &endpoint), ("HF_TOKEN", "hf_wrong")],
    )
    .await?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "a wrong token pulled: {err}");
    reached_with(&one, "org-one/other", "hf_wrong")?;

    // The client's token file counts as its HF_TOKEN does.
    std::fs::write(client_home.path().join("token"), "hf_token_one\n")?;
    let out = cli_pull(
        &d.addr,
        "org-one/other",
        client_home.path(),
        &[("HF_ENDPOINT", &endpoint)],
    )
    .await?;
    ensure!(
        out.status.success(),
        "grove pull with the token file: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(client_home.path().join("token"))?;

    // Offline from the client's shell: no request reaches any hub.
    two.clear_log();
    two.add_fixture("org-two/later", &model)?;
    let endpoint = two.endpoint();
    let out = cli_pull(
        &d.addr,
        "org-two/later",
        client_home.path(),
        &[("HF_ENDPOINT", &endpoint), ("HF_HUB_OFFLINE", "1")],
    )
    .await?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && err.contains("HF_HUB_OFFLINE"),
        "an offline pull: {err}"
    );
    ensure!(two.log().is_empty(), "an offline pull reached the hub");

    // ollama's /api/pull takes the same settings in a `hub` object.
    let body = serde_json::json!({
        "model": "org-two/later",
        "stream": false,
        "hub": {"endpoint": endpoint, "token": "hf_token_two"},
    });
    post_ok(&d.addr, "/api/pull", &body).await?;
    reached_with(&two, "org-two/later", "hf_token_two")?;
    // /api/show reads the local store only: a hub object there is accepted
    // and changes nothing.
    let body = serde_json::json!({"model": "org-two/later", "hub": {"token": "hf_token_two"}});
    post_ok(&d.addr, "/api/show", &body).await?;

    // A bad endpoint is refused before anything starts.
    let err = c
        .pull(pb::PullRequest {
            model: "org-two/later".into(),
            hub: Some(pb::HubSettings {
                endpoint: Some("ftp://127.0.0.1:9".into()),
                ..Default::default()
            }),
        })
        .await
        .err()
        .context("an ftp endpoint was accepted")?;
    ensure!(err.code() == tonic::Code::InvalidArgument, "{err:?}");

    // No token reached the daemon's log.
    let log = d.stderr();
    for token in ["hf_token_one", "hf_token_two", "hf_wrong"] {
        ensure!(!log.contains(token), "the daemon logged {token}:\n{log}");
    }
    Ok(())
}

/// A pull whose client sends no settings uses the daemon's own: its
/// endpoint and its token.
#[tokio::test]
async fn a_pull_without_settings_uses_the_daemons_own() -> Result<()> {
    let hub = HubServer::start().await?;
    hub.add_fixture("org/tiny", &fixtures::model_dir("qwen2-f32")?)?;
    hub.gate("org/tiny", "hf_daemon_token");
    let endpoint = hub.endpoint();
    let daemon_home = tempfile::tempdir()?;
    let home = daemon_home.path().to_string_lossy().into_owned();
    let (d, mut c) = Daemon::start(&[
        ("HF_HOME", &home),
        ("HF_ENDPOINT", &endpoint),
        ("HF_TOKEN", "hf_daemon_token"),
        ("HF_HUB_OFFLINE", "0"),
    ])
    .await?;
    let client_home = tempfile::tempdir()?;
    let out = tokio::time::timeout(
        Duration::from_secs(200),
        cli_pull(&d.addr, "org/tiny", client_home.path(), &[]),
    )
    .await??;
    ensure!(
        out.status.success(),
        "grove pull with the daemon's settings: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    reached_with(&hub, "org/tiny", "hf_daemon_token")?;
    ensure!(listed(&mut c).await?.iter().any(|m| m == "org/tiny"));
    ensure!(!d.stderr().contains("hf_daemon_token"));
    Ok(())
}
