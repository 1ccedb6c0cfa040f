//! A real `grove-runner serve` process on a temporary Unix socket, and a gRPC
//! client connected to it.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use grove_proto::runner::v1 as pb;
use grove_proto::runner::v1::runner_client::RunnerClient;
use tonic::transport::Channel;

use crate::proc::Group;
use crate::runner::binary;

/// How long a test waits for a runner to be READY.
const READY: Duration = Duration::from_secs(60);

/// [`Served::start`]'s environment: the SSD tier off (GROVE_KV_DISK=0), so
/// that runs on the same fixture never see each other's entries.
pub const NO_DISK: &[(&str, &str)] = &[("GROVE_KV_DISK", "0")];

/// A running `grove-runner serve` in its own process group (a group's
/// ranks with it), its stderr in a file; killed with its group on drop.
pub struct Served {
    proc: Group,
    pub socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Served {
    /// Starts a runner for `model` with extra `args` and waits until it is READY.
    /// Its SSD tier is off ([`NO_DISK`]); [`Served::start_env`] turns it on.
    pub async fn start(model: &Path, args: &[&str]) -> Result<(Self, RunnerClient<Channel>)> {
        Self::start_env(model, args, NO_DISK).await
    }

    /// As [`Served::start`], with `env` set for the runner.
    pub async fn start_env(
        model: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<(Self, RunnerClient<Channel>)> {
        Self::start_within(model, args, env, READY).await
    }

    /// As [`Served::start_env`], waiting up to `ready` for READY: benches on
    /// a fresh CUDA machine, whose first load compiles MLX's quantized
    /// matmul at the warm-up (minutes), take the daemon's load deadline.
    pub async fn start_within(
        model: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        ready: Duration,
    ) -> Result<(Self, RunnerClient<Channel>)> {
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("runner.sock");
        let mut cmd = Command::new(binary("grove-runner")?);
        cmd.arg("serve")
            .arg("--model")
            .arg(model)
            .arg("--socket")
            .arg(&socket)
            .args(args)
            .env("GROVE_KV_DISK", "0")
            .stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let proc = Group::spawn(&mut cmd).context("starting grove-runner serve")?;
        let mut served = Self {
            proc,
            socket,
            _dir: dir,
        };
        let client = served.wait_ready(ready).await?;
        Ok((served, client))
    }

    async fn wait_ready(&mut self, ready: Duration) -> Result<RunnerClient<Channel>> {
        let deadline = Instant::now() + ready;
        loop {
            if let Some(status) = self.proc.try_wait()? {
                bail!(
                    "grove-runner serve exited early: {status}: {}",
                    self.proc.stderr_tail()
                );
            }
            if self.socket.exists()
                && let Ok(mut client) = connect(&self.socket).await
            {
                let health = tokio::time::timeout(
                    Duration::from_secs(10),
                    client.health(pb::HealthRequest {}),
                )
                .await
                .context("Health did not answer within 10 s")??
                .into_inner();
                match pb::LoadState::try_from(health.state) {
                    Ok(pb::LoadState::Ready) => return Ok(client),
                    Ok(pb::LoadState::Failed) => {
                        bail!(
                            "the model failed to load: {}: {}",
                            health.error,
                            self.proc.stderr_tail()
                        )
                    }
                    _ => {}
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "grove-runner serve was not ready within {} s: {}",
                    ready.as_secs(),
                    self.proc.stderr_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The process id of the runner (a group's launcher).
    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// What the runner wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.proc.stderr()
    }

    /// Waits for the process to exit by itself.
    pub fn wait_exit(&mut self, within: Duration) -> Result<std::process::ExitStatus> {
        self.proc.wait(within)
    }
}

/// A gRPC client over the Unix socket at `path` (the daemon's own connector).
pub async fn connect(path: &Path) -> Result<RunnerClient<Channel>> {
    Ok(grove::runner_proc::connect(path).await?)
}

/// The text and the final message of one Generate stream.
pub struct Completion {
    pub text: String,
    /// Reasoning and tool calls, when the request split them out.
    pub thinking: String,
    pub tool_calls: Vec<pb::ToolCall>,
    /// Each generated token's log-probability (when asked for).
    pub logprobs: Vec<pb::TokenLogprob>,
    pub done: pb::Done,
}

impl Completion {
    /// The final metrics.
    pub fn metrics(&self) -> pb::Metrics {
        self.done.metrics.unwrap_or_default()
    }

    /// The done reason.
    pub fn reason(&self) -> pb::DoneReason {
        pb::DoneReason::try_from(self.done.reason).unwrap_or(pb::DoneReason::Unspecified)
    }
}

/// The longest a test waits for one Generate stream to end.
pub const STREAM_DEADLINE: Duration = Duration::from_secs(240);

/// Runs Generate to the end, within [`STREAM_DEADLINE`].
pub async fn complete(
    client: &mut RunnerClient<Channel>,
    req: pb::GenerateRequest,
) -> Result<Completion, tonic::Status> {
    tokio::time::timeout(STREAM_DEADLINE, complete_unbounded(client, req))
        .await
        .unwrap_or_else(|_| {
            Err(tonic::Status::deadline_exceeded(format!(
                "the Generate stream did not end within {STREAM_DEADLINE:?}"
            )))
        })
}

async fn complete_unbounded(
    client: &mut RunnerClient<Channel>,
    req: pb::GenerateRequest,
) -> Result<Completion, tonic::Status> {
    let mut stream = client.generate(req).await?.into_inner();
    let (mut text, mut thinking, mut tool_calls) = (String::new(), String::new(), Vec::new());
    let mut logprobs = Vec::new();
    while let Some(msg) = stream.message().await? {
        match msg.event {
            Some(pb::generate_response::Event::Text(t)) => text.push_str(&t),
            Some(pb::generate_response::Event::Thinking(t)) => thinking.push_str(&t),
            Some(pb::generate_response::Event::ToolCall(c)) => tool_calls.push(c),
            Some(pb::generate_response::Event::Logprobs(l)) => logprobs.extend(l.tokens),
            Some(pb::generate_response::Event::Done(done)) => {
                if stream.message().await?.is_some() {
                    return Err(tonic::Status::internal("messages after Done"));
                }
                return Ok(Completion {
                    text,
                    thinking,
                    tool_calls,
                    logprobs,
                    done,
                });
            }
            None => return Err(tonic::Status::internal("empty message")),
        }
    }
    Err(tonic::Status::internal("stream ended without Done"))
}

/// A greedy request over token ids.
pub fn tokens_request(ids: &[u32], max_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest {
        input: Some(pb::generate_request::Input::Tokens(pb::TokenList {
            ids: ids.to_vec(),
        })),
        max_tokens,
        ..Default::default()
    }
}

/// Sends every request at once (one task each) and waits for all of them,
/// in request order.
pub async fn all_at_once(
    client: &RunnerClient<Channel>,
    reqs: Vec<pb::GenerateRequest>,
) -> Result<Vec<Completion>> {
    let tasks: Vec<_> = reqs
        .into_iter()
        .map(|r| {
            let mut c = client.clone();
            tokio::spawn(async move { complete(&mut c, r).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}
