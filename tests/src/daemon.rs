//! A real `grove serve` on a free loopback port, with its own empty hub cache.
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use grove_proto::v1 as pb;
use grove_proto::v1::grove_client::GroveClient;
use tonic::transport::Channel;

use crate::runner::binary;

/// A running daemon; killed (with its runners) on drop.
pub struct Daemon {
    child: Child,
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
        let child = cmd.spawn().context("starting grove serve")?;
        let mut daemon = Self {
            child,
            addr,
            hub,
            ollama,
        };
        let client = daemon.connect_when_up().await?;
        Ok((daemon, client))
    }

    async fn connect_when_up(&mut self) -> Result<GroveClient<Channel>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("grove serve exited: {status}");
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
                bail!("grove serve did not answer within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
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
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn terminate(&mut self, within: Duration) -> Result<std::process::ExitStatus> {
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait()? {
                return Ok(s);
            }
            if Instant::now() > deadline {
                bail!("grove serve did not exit within {within:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Daemon {
    /// Waits for the process to exit (after a signal sent elsewhere) and reaps it.
    pub fn wait_exit(&mut self, within: Duration) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait()? {
                return Ok(s);
            }
            if Instant::now() > deadline {
                bail!("grove serve did not exit within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SIGTERM first so the daemon stops its runners, then make sure.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(8);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
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

/// The text and final message of a stream.
pub async fn finish(
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
