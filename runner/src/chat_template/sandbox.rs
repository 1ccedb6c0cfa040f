//! Rendering an untrusted chat template in a child process.
//!
//! A model's chat template is a program from wherever the model came from.
//! minijinja bounds its instructions ([`super::FUEL`]) and this module's
//! caller bounds its output ([`super::RENDER_BYTES_PER_TOKEN`] per token of
//! context), but one instruction can still double a string, and nothing in a
//! thread can be stopped from outside. So each rendering runs in a fresh
//! `grove-runner render` process: memory capped (`RLIMIT_DATA`), CPU capped
//! (`RLIMIT_CPU`), killed at a wall-clock deadline, killed with the runner
//! (`PR_SET_PDEATHSIG`), and gone with all its memory when it exits. The
//! runner's engine thread never renders; a client that leaves or a SIGTERM
//! drops the wait, which kills the child.
//!
//! Protocol: the job (spec, template name, request, output cap) as JSON on
//! stdin; the text on stdout with exit status 0, or a message on stderr with
//! exit status 2 (the template failed) or 3 (the job was malformed).
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{ChatRequest, ChatTemplate, TemplateSpec};
use crate::error::{Result, RunnerError};

/// A job's JSON may not be longer than this (a conversation is bounded by the
/// gRPC message size, 4 MiB by default).
const MAX_JOB_BYTES: u64 = 64 << 20;
/// Bytes of the child's error message kept.
const MAX_ERROR_BYTES: u64 = 16 << 10;

/// What to render.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RenderJob {
    pub spec: TemplateSpec,
    /// A named template (e.g. `tool_use`); None = the default rule.
    pub name: Option<String>,
    pub request: ChatRequest,
    /// The most bytes the text may have.
    pub max_bytes: usize,
}

/// The child's limits.
#[derive(Debug, Clone)]
pub struct Sandbox {
    exe: PathBuf,
    /// Wall-clock limit for one rendering (and, rounded up, its CPU limit).
    pub timeout: Duration,
    /// The child's data-segment limit in bytes (Linux: heap and private mappings).
    pub memory: u64,
}

/// Default wall-clock limit.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default memory limit.
pub const DEFAULT_MEMORY: u64 = 1 << 30;

impl Sandbox {
    /// A sandbox that runs this executable's `render` subcommand.
    pub fn new(timeout: Duration, memory: u64) -> Result<Self> {
        let exe = std::env::current_exe()
            .map_err(|e| RunnerError::Request(format!("finding grove-runner itself: {e}")))?;
        Ok(Self {
            exe,
            timeout,
            memory,
        })
    }

    /// Renders `job` in a child process within the limits.
    pub async fn render(&self, job: &RenderJob) -> Result<String> {
        let input = serde_json::to_vec(job)
            .map_err(|e| RunnerError::Request(format!("encoding the render job: {e}")))?;
        let mut cmd = tokio::process::Command::new(&self.exe);
        // The child loads what the runner links, OpenBLAS among them, whose
        // thread pool starts at load: a thread per core, each with a buffer
        // that counts against RLIMIT_DATA (~32 MiB a thread measured here),
        // so on a 16-core machine the pool alone passed 1 GiB and the child
        // died before rendering. A rendering does no BLAS: one thread.
        cmd.arg("render")
            .env("OPENBLAS_NUM_THREADS", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let (memory, cpu) = (self.memory, self.timeout.as_secs().max(1) + 1);
        // SAFETY: only async-signal-safe calls (setrlimit, prctl) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                limit(libc::RLIMIT_DATA, memory);
                limit(libc::RLIMIT_CPU, cpu);
                #[cfg(target_os = "linux")]
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| RunnerError::Request(format!("starting the template sandbox: {e}")))?;
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(RunnerError::Request(
                "the template sandbox has no pipes".into(),
            ));
        };
        let cap = job.max_bytes as u64 + 1;
        let work = async {
            // A child that dies early closes stdin: its status tells why.
            let _ = stdin.write_all(&input).await;
            drop(stdin);
            let mut text = Vec::new();
            let mut message = Vec::new();
            let (mut out, mut err) = (stdout.take(cap), stderr.take(MAX_ERROR_BYTES));
            let (read_out, read_err) =
                tokio::join!(out.read_to_end(&mut text), err.read_to_end(&mut message),);
            read_out.and(read_err)?;
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((status, text, message))
        };
        let outcome = tokio::time::timeout(self.timeout, work).await;
        let (status, text, message) = match outcome {
            Err(_) => {
                return Err(RunnerError::Request(format!(
                    "the chat template did not finish within {:?} (the limit); it was stopped",
                    self.timeout
                )));
            }
            Ok(Err(e)) => {
                return Err(RunnerError::Request(format!(
                    "the template sandbox failed: {e}"
                )));
            }
            Ok(Ok(done)) => done,
        };
        let message = String::from_utf8_lossy(&message).trim().to_owned();
        match status.code() {
            Some(0) if text.len() > job.max_bytes => Err(RunnerError::Request(format!(
                "the chat template rendered more than {} bytes",
                job.max_bytes
            ))),
            Some(0) => String::from_utf8(text).map_err(|_| {
                RunnerError::Request("the chat template rendered invalid UTF-8".into())
            }),
            Some(2 | 3) => Err(RunnerError::Request(message)),
            _ => Err(RunnerError::Request(format!(
                "the chat template was stopped after {:.1}s: it ran out of its {} MiB of \
                 memory or {} s of CPU ({status}){}",
                started.elapsed().as_secs_f64(),
                self.memory >> 20,
                cpu,
                match message.lines().find(|l| !l.trim().is_empty()) {
                    Some(line) => format!(": {line}"),
                    None => String::new(),
                }
            ))),
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
type Resource = libc::__rlimit_resource_t;
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
type Resource = libc::c_int;

fn limit(resource: Resource, value: u64) {
    let lim = libc::rlimit {
        rlim_cur: value as libc::rlim_t,
        rlim_max: value as libc::rlim_t,
    };
    // SAFETY: setrlimit with a valid pointer; a failure leaves the old limit.
    unsafe {
        libc::setrlimit(resource, &lim);
    }
}

/// The `render` subcommand: reads a [`RenderJob`] from stdin, writes the text
/// to stdout (see the module docs for the protocol).
pub fn worker() -> ExitCode {
    let fail = |code: u8, message: &str| {
        let _ = writeln!(std::io::stderr(), "{message}");
        ExitCode::from(code)
    };
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin()
        .take(MAX_JOB_BYTES + 1)
        .read_to_end(&mut input)
    {
        return fail(3, &format!("reading the render job: {e}"));
    }
    if input.len() as u64 > MAX_JOB_BYTES {
        return fail(3, "the render job is too large");
    }
    let job: RenderJob = match serde_json::from_slice(&input) {
        Ok(j) => j,
        Err(e) => return fail(3, &format!("the render job is malformed: {e}")),
    };
    drop(input);
    let rendered = ChatTemplate::from_spec(&job.spec, job.name.as_deref())
        .and_then(|t| t.render_capped(&job.request, job.max_bytes));
    match rendered {
        Ok(text) => {
            let mut out = std::io::stdout().lock();
            if out
                .write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .is_err()
            {
                return ExitCode::from(3);
            }
            ExitCode::SUCCESS
        }
        Err(RunnerError::Request(message)) => fail(2, &message),
        Err(e) => fail(2, &e.to_string()),
    }
}
