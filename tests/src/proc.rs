//! Child processes under a deadline. Every process a test starts (runners,
//! ranks, Python references, daemons, clients) is the leader of its own
//! process group; one that outlives its deadline is killed with its whole
//! group (whatever it started that stayed in the group: ranks, helpers),
//! and the test fails with what it wrote to stderr. Nothing here waits on a
//! child, or on a pipe from it, without a deadline.
//!
//! - [`output`]: run to the end within a deadline, stdout and stderr captured.
//! - [`output_async`]: the same from async code, off the runtime's threads
//!   (a test's own servers, on its runtime, keep answering meanwhile).
//! - [`Group`]: a long-lived child (a daemon, a served runner, a client
//!   driven through its pipes) whose stderr goes to a file, killed with its
//!   group when dropped.
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The deadline of a child that has no reason to take long: a reference
/// computation, a CLI call, a one-shot generation on a fixture.
pub const DEADLINE: Duration = Duration::from_secs(180);

/// How long the pipes of a finished (or killed) child may stay open, held by
/// something that left its group, before the output read so far is taken.
const DRAIN: Duration = Duration::from_secs(5);

/// How much of a stderr goes into an error: its end.
const TAIL: usize = 6000;

/// The end of `text`, at most [`TAIL`] bytes, cut at a character boundary.
pub fn tail(text: &str) -> &str {
    if text.len() <= TAIL {
        return text;
    }
    let mut start = text.len() - TAIL;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// Sends `signal` to process group `pgid` (nothing when it is gone).
pub fn kill_group(pgid: u32, signal: i32) {
    if pgid > 1 {
        // SAFETY: kill(2) on a process group this test created.
        unsafe {
            libc::kill(-(pgid as i32), signal);
        }
    }
}

/// Makes `cmd`'s process the leader of a new process group (its pid is the
/// group's id), so the group can be killed as one, and has the kernel kill
/// it when the thread that started it ends (`PR_SET_PDEATHSIG`): a test
/// process killed by the test runner's own deadline leaves no child behind
/// (the daemon's runners and a group's ranks die with their parent too).
pub fn own_group(cmd: &mut Command) -> &mut Command {
    die_with_parent(cmd);
    cmd.process_group(0)
}

/// `PR_SET_PDEATHSIG` (SIGKILL) for the child `cmd` starts (Linux).
pub fn die_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe; between fork and exec it only sets
    // the child's parent-death signal.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// The program and arguments of `cmd`, for errors.
fn describe(cmd: &Command) -> String {
    let mut s = Path::new(cmd.get_program())
        .file_name()
        .unwrap_or(cmd.get_program())
        .to_string_lossy()
        .into_owned();
    for a in cmd.get_args() {
        let a = a.to_string_lossy();
        s.push(' ');
        if a.chars().count() > 80 {
            s.extend(a.chars().take(80));
            s.push_str("...");
        } else {
            s.push_str(&a);
        }
    }
    s
}

/// Reads `pipe` to its end on a thread; the bytes arrive on the receiver.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    } else {
        let _ = tx.send(Vec::new());
    }
    rx
}

/// Runs `cmd` to its end within `within`, in its own process group, with
/// stdin empty and stdout and stderr captured. Past the deadline the whole
/// group gets SIGKILL and the error carries the tail of its stderr. A
/// non-zero exit is not an error here: the caller looks at the status.
pub fn output(cmd: &mut Command, within: Duration) -> Result<Output> {
    let what = describe(cmd);
    own_group(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("starting {what}"))?;
    let pgid = child.id();
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            kill_group(pgid, libc::SIGKILL);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = out.recv_timeout(DRAIN).unwrap_or_default();
    let stderr = err.recv_timeout(DRAIN).unwrap_or_default();
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => bail!(
            "{what} did not finish within {within:?}: killed with its process group; its stderr:\n{}",
            tail(&String::from_utf8_lossy(&stderr))
        ),
    }
}

/// [`output`], and a non-zero exit is an error carrying the tail of stderr.
pub fn output_ok(cmd: &mut Command, within: Duration) -> Result<Output> {
    let what = describe(cmd);
    let out = output(cmd, within)?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr))
        );
    }
    Ok(out)
}

/// [`output`] from async code: the child is waited for on a blocking thread,
/// so the test's runtime goes on serving (a hub server, a daemon's client).
pub async fn output_async(mut cmd: Command, within: Duration) -> Result<Output> {
    tokio::task::spawn_blocking(move || output(&mut cmd, within))
        .await
        .context("the waiting thread panicked")?
}

/// A long-lived child in its own process group, its stderr in a file (read
/// back with [`Group::stderr`]). Dropping it kills the group and reaps the
/// child.
pub struct Group {
    child: Child,
    what: String,
    stderr: tempfile::NamedTempFile,
}

impl Group {
    /// Starts `cmd` (stdin empty unless the caller set it; stderr to a file).
    pub fn spawn(cmd: &mut Command) -> Result<Self> {
        let what = describe(cmd);
        let stderr = tempfile::NamedTempFile::new()?;
        own_group(cmd).stderr(stderr.reopen()?);
        let child = cmd.spawn().with_context(|| format!("starting {what}"))?;
        Ok(Self {
            child,
            what,
            stderr,
        })
    }

    /// The child (its pid is the group's id).
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read(self.stderr.path())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The end of its stderr, for errors.
    pub fn stderr_tail(&self) -> String {
        tail(&self.stderr()).to_owned()
    }

    /// Its exit status, if it has ended.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Waits for it to end by itself within `within`; past that, the group
    /// is killed and the error carries its stderr.
    pub fn wait(&mut self, within: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait()? {
                return Ok(s);
            }
            if Instant::now() >= deadline {
                self.kill();
                bail!(
                    "{} did not exit within {within:?}: killed with its process group; its stderr:\n{}",
                    self.what,
                    self.stderr_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `signal` to the child alone.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on this test's own child.
        unsafe {
            libc::kill(self.child.id() as i32, signal);
        }
    }

    /// Kills the whole group and reaps the child.
    pub fn kill(&mut self) {
        kill_group(self.child.id(), libc::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kills process group `pgid` when dropped: for a child started some other
/// way (tokio's, driven through its pipes) with [`own_group`]'s setting, so
/// that a test that fails half-way leaves nothing running.
pub struct KillOnDrop(pub u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        kill_group(self.0, libc::SIGKILL);
    }
}

/// [`output`] as a method of `Command`, where `.output()` was.
pub trait OutputWithin {
    /// Runs the command to its end within `within` (see [`output`]).
    fn output_within(&mut self, within: Duration) -> Result<Output>;
}

impl OutputWithin for Command {
    fn output_within(&mut self, within: Duration) -> Result<Output> {
        output(self, within)
    }
}
