//! Running the `grove-runner` binary.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// A built binary of the workspace: in `GROVE_BIN_DIR`, else beside this
/// executable (a workspace binary) or one level up (a test under `deps/`).
pub fn binary(name: &str) -> Result<PathBuf> {
    let dirs: Vec<PathBuf> = match std::env::var_os("GROVE_BIN_DIR") {
        Some(d) => vec![PathBuf::from(d)],
        None => {
            let exe = std::env::current_exe()?;
            exe.ancestors()
                .skip(1)
                .take(2)
                .map(Path::to_path_buf)
                .collect()
        }
    };
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} is not built in {dirs:?} (run `make build`)"))
}

/// `grove-runner generate --json` output.
#[derive(Debug, Deserialize)]
pub struct GenerateJson {
    pub tokens: Vec<u32>,
    pub text: String,
    pub prompt_tokens: usize,
    pub prompt_tps: f64,
    pub decode_tps: f64,
    pub finish_reason: String,
}

/// Runs `grove-runner` with `args` and returns its raw output; past
/// [`crate::proc::DEADLINE`] it is killed with its ranks and fails.
pub fn run(args: &[&str]) -> Result<Output> {
    run_within(args, crate::proc::DEADLINE)
}

/// As [`run`], with its own deadline.
pub fn run_within(args: &[&str], within: std::time::Duration) -> Result<Output> {
    let bin = binary("grove-runner")?;
    crate::proc::output(Command::new(&bin).args(args), within)
}

/// Runs `grove-runner generate --json` with `args`; fails on a non-zero exit.
pub fn generate_json(args: &[&str]) -> Result<GenerateJson> {
    let mut all = vec!["generate", "--json"];
    all.extend_from_slice(args);
    let out = run(&all)?;
    if !out.status.success() {
        bail!(
            "grove-runner {:?} failed ({}): {}",
            all,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8(out.stdout).context("stdout is not UTF-8")?;
    serde_json::from_str(stdout.trim()).with_context(|| format!("parsing {stdout:?}"))
}

/// The ids as the comma-separated list `--prompt-tokens` takes.
pub fn ids_arg(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}
