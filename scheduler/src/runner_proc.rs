//! One `grove-runner serve` child process: started in its own process group
//! with its socket in the daemon's private directory, ready when its Health
//! says so, watched by Health while loaded (a runner that stops answering is
//! stuck, since Health is answered from a snapshot, and is killed), stopped
//! with SIGTERM, a deadline, then SIGKILL, and always reaped. A runner dies
//! with the daemon (`PR_SET_PDEATHSIG` on Linux; it also watches its parent),
//! and socket directories of dead daemons are removed at start.
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use grove_proto::runner::v1 as rpb;
use grove_proto::runner::v1::runner_client::RunnerClient;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tonic::transport::{Channel, Endpoint, Uri};

/// Lines of a runner's stderr kept for error messages.
const STDERR_LINES: usize = 20;
/// How long a stopping runner gets after SIGTERM.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// The last lines a runner wrote to stderr (shared with the task reading them).
#[derive(Debug, Clone, Default)]
pub struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    /// Adds a line (the daemon's own notes go here too, e.g. why it killed the runner).
    pub fn push(&self, line: String) {
        if let Ok(mut lines) = self.0.lock() {
            if lines.len() == STDERR_LINES {
                lines.pop_front();
            }
            lines.push_back(line);
        }
    }

    /// The kept lines, joined.
    pub fn text(&self) -> String {
        self.0
            .lock()
            .map(|l| l.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    }
}

/// A started runner.
pub struct Spawned {
    pub child: Child,
    pub pid: u32,
    pub socket: PathBuf,
    pub stderr: StderrTail,
}

/// Where MLX's CUDA backend keeps the kernels it compiles at run time, unless
/// MLX_PTX_CACHE_DIR says: `$XDG_CACHE_HOME/grove/mlx-ptx/VERSION` (else
/// under `~/.cache`). MLX's own default is under the temporary
/// directory, which a reboot may empty; measured on an H200, a runner whose
/// first prefill finds the cache empty takes 6.1 s instead of 1.9 s.
/// (The CUDA driver keeps its own cache in `~/.nv/ComputeCache`.)
fn ptx_cache_dir() -> Option<std::path::PathBuf> {
    if std::env::var_os("MLX_PTX_CACHE_DIR").is_some() {
        return None;
    }
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => std::path::PathBuf::from(x),
        None => std::path::PathBuf::from(std::env::var_os("HOME")?).join(".cache"),
    };
    // Per Grove version: each pins its MLX.
    Some(base.join("grove/mlx-ptx").join(env!("CARGO_PKG_VERSION")))
}

/// Starts `runner serve` for `model` listening on `socket`.
pub fn spawn(
    runner: &Path,
    model: &Path,
    socket: &Path,
    extra: &[String],
) -> Result<Spawned, String> {
    let mut cmd = Command::new(runner);
    cmd.arg("serve")
        .arg("--model")
        .arg(model)
        .arg("--socket")
        .arg(socket)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = ptx_cache_dir() {
        cmd.env("MLX_PTX_CACHE_DIR", dir);
    }
    // SAFETY: prctl is async-signal-safe; it only sets this child's death signal.
    #[cfg(target_os = "linux")]
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting {}: {e}", runner.display()))?;
    let pid = child.id().ok_or("the runner exited at once")?;
    let stderr = StderrTail::default();
    if let Some(pipe) = child.stderr.take() {
        let tail = stderr.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(pipe).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tail.push(line);
            }
        });
    }
    Ok(Spawned {
        child,
        pid,
        socket: socket.to_owned(),
        stderr,
    })
}

/// A group's ranks, started by the launcher `pid`: each one's pid and
/// resident bytes, in the order they were started (rank order). Linux reads
/// them from /proc; elsewhere the list is empty.
pub fn group_ranks(pid: u32) -> Vec<(u32, u64)> {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    children
        .split_whitespace()
        .filter_map(|s| s.parse::<u32>().ok())
        .map(|child| {
            let resident = std::fs::read_to_string(format!("/proc/{child}/statm"))
                .ok()
                .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
                .unwrap_or(0);
            (child, resident * page)
        })
        .collect()
}

/// A gRPC client on the runner's Unix socket.
pub async fn connect(socket: &Path) -> Result<RunnerClient<Channel>, tonic::transport::Error> {
    let socket = socket.to_owned();
    let channel = Endpoint::from_static("http://runner.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await?;
    Ok(RunnerClient::new(channel))
}

/// Waits until the runner on `socket` says READY; fails if it reports a failed
/// load or `timeout` passes. (Its exit is watched by the caller.)
pub async fn wait_ready(
    socket: &Path,
    stderr: &StderrTail,
    timeout: Duration,
    call_timeout: Duration,
) -> Result<RunnerClient<Channel>, String> {
    let deadline = Instant::now() + timeout;
    loop {
        // A stopped runner would hold a call forever: each one is bounded.
        let probe = async {
            let mut client = connect(socket).await.ok()?;
            let h = client.health(rpb::HealthRequest {}).await.ok()?;
            Some((client, h))
        };
        if socket.exists()
            && let Ok(Some((client, h))) = tokio::time::timeout(call_timeout, probe).await
        {
            let h = h.into_inner();
            match rpb::LoadState::try_from(h.state) {
                Ok(rpb::LoadState::Ready) => return Ok(client),
                Ok(rpb::LoadState::Failed) => {
                    return Err(format!("the model failed to load: {}", h.error));
                }
                _ => {}
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the runner was not ready within {timeout:?} (GROVE_LOAD_TIMEOUT): {}",
                stderr.text()
            ));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Checks a loaded runner's Health every `timeout / 4` (at most 1 s apart);
/// a reply that does not come within `timeout` means the process is stuck
/// (stopped, or wedged outside the engine thread, since Health is answered
/// from a snapshot even during a long prefill): its group is killed, with the
/// cause added to its stderr tail for the requests that fail. Ends when the
/// runner exits.
pub async fn watch_health(
    mut client: RunnerClient<Channel>,
    pid: u32,
    stderr: StderrTail,
    timeout: Duration,
    mut exited: tokio::sync::watch::Receiver<bool>,
) {
    let every = (timeout / 4).min(Duration::from_secs(1));
    loop {
        let check = tokio::time::timeout(timeout, client.health(rpb::HealthRequest {}));
        tokio::select! {
            _ = exited.wait_for(|e| *e) => return,
            answer = check => {
                if answer.is_err() {
                    stderr.push(format!(
                        "grove: the runner stopped answering (no Health reply within {timeout:?}, \
                         GROVE_RUNNER_TIMEOUT); it was killed"
                    ));
                    signal_group(pid, libc::SIGKILL);
                    return;
                }
            }
        }
        tokio::select! {
            _ = exited.wait_for(|e| *e) => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// The prefix of the daemon's private socket directories.
pub const SOCKET_DIR_PREFIX: &str = "grove-runners-";
/// The file in a socket directory naming the daemon that owns it.
const OWNER_FILE: &str = "daemon.pid";

/// Marks `dir` as this daemon's.
pub fn claim_socket_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::write(dir.join(OWNER_FILE), std::process::id().to_string())
}

/// Removes socket directories (in the temp dir) whose daemon is gone: left by
/// a daemon that was killed. Directories of live daemons, or without an owner
/// file, are left alone.
pub fn remove_stale_socket_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(SOCKET_DIR_PREFIX) {
            continue;
        }
        let dir = entry.path();
        let owner = std::fs::read_to_string(dir.join(OWNER_FILE))
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok());
        let Some(pid) = owner else { continue };
        if !process_alive(pid) {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Whether `pid` is a live process (a zombie, killed but not yet reaped by
/// its parent, counts as dead).
fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    if pid <= 0 || unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_none_or(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// Sends `signal` to the runner's process group.
pub fn signal_group(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a process group we created; errors (e.g. already gone) are ignored.
    unsafe {
        libc::kill(-(pid as i32), signal);
    }
}

/// Stops a runner: SIGTERM to its group, then SIGKILL after [`STOP_GRACE`], and reaps it.
pub async fn stop(mut child: Child, pid: u32) {
    signal_group(pid, libc::SIGTERM);
    if tokio::time::timeout(STOP_GRACE, child.wait())
        .await
        .is_err()
    {
        signal_group(pid, libc::SIGKILL);
        let _ = child.wait().await;
    }
}
