//! A real `grove serve` on a free loopback port, with its own empty hub cache.
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use grove_proto::v1 as pb;
use grove_proto::v1::grove_client::GroveClient;
use tonic::transport::Channel;

use crate::proc::Group;
use crate::runner::binary;

/// A running daemon in its own process group, its stderr in a file; on drop
/// it gets SIGTERM (so it stops its runners), then its group is killed.
pub struct Daemon {
    proc: Group,
    pub addr: String,
    pub hub: tempfile::TempDir,
    /// An empty ollama store (OLLAMA_MODELS), unless `env` names another.
    pub ollama: tempfile::TempDir,
}

/// A free port on 127.0.0.1.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Daemon {
    /// Starts `grove serve` with `env` (GROVE_* settings) and waits for it.
    pub async fn start(env: &[(&str, &str)]) -> Result<(Self, GroveClient<Channel>)> {
        Self::start_with(env, None).await
    }

    /// As [`Daemon::start`], with files the daemon (and its runners) write
    /// limited to `max_file_bytes` (RLIMIT_FSIZE, SIGXFSZ ignored): writes past
    /// it fail as they would on a full disk.
    pub async fn start_with(
        env: &[(&str, &str)],
        max_file_bytes: Option<u64>,
    ) -> Result<(Self, GroveClient<Channel>)> {
        // The port was free a moment ago; another process may take it before
        // the daemon binds it, so a daemon that finds it in use is started
        // again on another.
        let mut attempt = 1;
        loop {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let hub = tempfile::tempdir()?;
            let ollama = tempfile::tempdir()?;
            let mut cmd = Command::new(binary("grove")?);
            cmd.arg("serve")
                .env("GROVE_HOST", &addr)
                .env("HF_HUB_CACHE", hub.path())
                .env("OLLAMA_MODELS", ollama.path())
                .env("HF_HUB_OFFLINE", "1")
                .env("GROVE_RUNNER", binary("grove-runner")?)
                // The runners' SSD tier is off unless a test turns it on.
                .env("GROVE_KV_DISK", "0")
                .stdin(Stdio::null());
            for (k, v) in env {
                cmd.env(k, v);
            }
            if let Some(limit) = max_file_bytes {
                limit_file_size(&mut cmd, limit);
            }
            let proc = Group::spawn(&mut cmd).context("starting grove serve")?;
            let mut daemon = Self {
                proc,
                addr,
                hub,
                ollama,
            };
            match daemon.connect_when_up().await {
                Ok(client) => return Ok((daemon, client)),
                Err(e)
                    if attempt < 3
                        && !daemon.alive()
                        && daemon.stderr().contains("Address already in use") =>
                {
                    attempt += 1;
                    eprintln!("grove serve: {e}; again on another port");
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn connect_when_up(&mut self) -> Result<GroveClient<Channel>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.proc.try_wait()? {
                bail!("grove serve exited: {status}: {}", self.proc.stderr_tail());
            }
            if let Ok(mut c) = self.client().await {
                match c.version(pb::VersionRequest {}).await {
                    // Up; with GROVE_API_KEY set, this client (without it) is refused.
                    Ok(_) => return Ok(c),
                    Err(s) if s.code() == tonic::Code::Unauthenticated => return Ok(c),
                    Err(_) => {}
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "grove serve did not answer within 30 s: {}",
                    self.proc.stderr_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// What the daemon wrote to stderr so far (its log).
    pub fn stderr(&self) -> String {
        self.proc.stderr()
    }

    /// A new client connection.
    pub async fn client(&self) -> Result<GroveClient<Channel>> {
        Ok(GroveClient::connect(format!("http://{}", self.addr)).await?)
    }

    /// A client connection whose streams take at most `window` unread bytes
    /// each, as a slow reader with a small HTTP/2 window does.
    pub async fn client_with_window(&self, window: u32) -> Result<GroveClient<Channel>> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))?
            .initial_stream_window_size(window)
            .connect()
            .await?;
        Ok(GroveClient::new(channel))
    }

    /// Whether the daemon process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.proc.try_wait(), Ok(None))
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn terminate(&mut self, within: Duration) -> Result<std::process::ExitStatus> {
        self.proc.signal(libc::SIGTERM);
        self.proc.wait(within).context("grove serve after SIGTERM")
    }
}

impl Daemon {
    /// Waits for the process to exit (after a signal sent elsewhere) and reaps it.
    pub fn wait_exit(&mut self, within: Duration) -> Result<std::process::ExitStatus> {
        self.proc.wait(within)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SIGTERM first so the daemon stops its runners; the group is
        // killed (and the daemon reaped) when `proc` drops.
        self.proc.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(8);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.proc.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whether a process with this pid exists.
pub fn process_exists(pid: u32) -> bool {
    PathBuf::from(format!("/proc/{pid}")).exists()
}

/// A user message.
pub fn user(text: &str) -> pb::Message {
    pb::Message {
        role: pb::Role::User as i32,
        content: text.into(),
        ..Default::default()
    }
}

/// A chat request for `model` with one user message.
pub fn chat(model: &str, text: &str, max_tokens: u32) -> pb::ChatRequest {
    pb::ChatRequest {
        model: model.into(),
        messages: vec![user(text)],
        options: Some(pb::Options {
            max_tokens: Some(max_tokens),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The text and final message of a stream, which must end within 240 s.
pub async fn finish(
    stream: tonic::Streaming<pb::GenerateResponse>,
) -> Result<(String, pb::Done), tonic::Status> {
    let within = Duration::from_secs(240);
    tokio::time::timeout(within, finish_unbounded(stream))
        .await
        .unwrap_or_else(|_| {
            Err(tonic::Status::deadline_exceeded(format!(
                "the stream did not end within {within:?}"
            )))
        })
}

async fn finish_unbounded(
    mut stream: tonic::Streaming<pb::GenerateResponse>,
) -> Result<(String, pb::Done), tonic::Status> {
    let mut text = String::new();
    while let Some(m) = stream.message().await? {
        match m.event {
            Some(pb::generate_response::Event::Text(t)) => text.push_str(&t),
            Some(pb::generate_response::Event::Done(d)) => return Ok((text, d)),
            Some(_) => return Err(tonic::Status::internal("an event not asked for")),
            None => {}
        }
    }
    Err(tonic::Status::internal("no Done"))
}

/// Makes `cmd`'s process unable to write files past `limit` bytes: writes fail
/// with EFBIG, as on a full disk (SIGXFSZ ignored, so they fail rather than kill).
pub fn limit_file_size(cmd: &mut Command, limit: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls (signal, setrlimit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit {
                rlim_cur: limit as libc::rlim_t,
                rlim_max: limit as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
