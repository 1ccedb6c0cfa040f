//! The daemon's settings: environment first (GROVE_*), flags override.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::duration::KeepAlive;

/// Where the daemon listens unless GROVE_HOST says otherwise (ollama's port + 1).
pub const DEFAULT_HOST: &str = "127.0.0.1:11435";

/// Why the settings are unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{name}={value:?}: {message}")]
    Invalid {
        name: &'static str,
        value: String,
        message: String,
    },
    #[error("{0}")]
    Other(String),
}

/// Everything `grove serve` needs.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub host: SocketAddr,
    /// Binding a non-loopback address needs GROVE_ALLOW_REMOTE=1.
    pub allow_remote: bool,
    pub keep_alive: KeepAlive,
    pub max_loaded: usize,
    pub max_queue: usize,
    pub context_length: Option<u32>,
    /// Processes each model is split over unless a request says (GROVE_SHARDS).
    pub shards: u32,
    /// The memory budget is one GPU's: a group of N reserves 1/N of a
    /// model on it (each rank has its own GPU).
    pub per_device: bool,
    pub load_timeout: Duration,
    /// A loaded runner that does not answer Health within this is stuck and
    /// killed (GROVE_RUNNER_TIMEOUT).
    pub runner_timeout: Duration,
    /// Memory the loaded models may reserve (GROVE_MEMORY, bytes; default:
    /// 3/4 of physical RAM).
    pub memory_budget: u64,
    pub runner_bin: PathBuf,
    /// The HTTP APIs' key, CORS origins and body limit.
    pub http: crate::http::HttpConfig,
}

fn env(name: &'static str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn invalid(name: &'static str, value: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name,
        value: value.to_owned(),
        message: message.into(),
    }
}

fn number<T: std::str::FromStr>(name: &'static str, default: T) -> Result<T, ConfigError> {
    match env(name) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| invalid(name, &v, "not a number")),
    }
}

/// A positive duration (`30s`, `5m`, or seconds), else `default`.
fn duration(name: &'static str, default: Duration) -> Result<Duration, ConfigError> {
    match env(name) {
        None => Ok(default),
        Some(v) => match KeepAlive::parse(&v) {
            Ok(KeepAlive::For(d)) if !d.is_zero() => Ok(d),
            _ => Err(invalid(name, &v, "must be a positive duration")),
        },
    }
}

/// `host:port`, `host` (default port) or `:port` (loopback).
pub fn parse_host(text: &str) -> Result<SocketAddr, String> {
    let t = text.trim().trim_start_matches("http://");
    let with_port = if t.starts_with(':') {
        format!("127.0.0.1{t}")
    } else if t.parse::<std::net::IpAddr>().is_ok() {
        format!("{t}:11435")
    } else if t == "localhost" {
        "127.0.0.1:11435".to_string()
    } else {
        t.replace("localhost:", "127.0.0.1:")
    };
    with_port
        .parse()
        .map_err(|_| format!("expected HOST:PORT, like {DEFAULT_HOST}"))
}

/// The daemon's address as clients see it (GROVE_HOST or the default).
pub fn host_from_env() -> Result<SocketAddr, ConfigError> {
    let text = env("GROVE_HOST").unwrap_or_else(|| DEFAULT_HOST.into());
    parse_host(&text).map_err(|m| invalid("GROVE_HOST", &text, m))
}

impl DaemonConfig {
    /// Reads the GROVE_* environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        let keep_alive = match env("GROVE_KEEP_ALIVE") {
            None => KeepAlive::For(Duration::from_secs(300)),
            Some(v) => KeepAlive::parse(&v).map_err(|m| invalid("GROVE_KEEP_ALIVE", &v, m))?,
        };
        // Ten minutes: a runner's first load on a fresh CUDA machine also
        // compiles MLX's quantized matmul at its warm-up, ~36 s per tile
        // height and bit width on an H200 (three heights; a 4-bit model with
        // 8-bit routers has six), besides reading the weights.
        let load_timeout = duration("GROVE_LOAD_TIMEOUT", Duration::from_secs(600))?;
        let runner_timeout = duration("GROVE_RUNNER_TIMEOUT", Duration::from_secs(30))?;
        let runner_bin = runner_binary()?;
        let device = budget_memory(&runner_bin);
        let memory_budget = match env("GROVE_MEMORY") {
            Some(v) => v
                .trim()
                .parse()
                .map_err(|_| invalid("GROVE_MEMORY", &v, "not a number of bytes"))?,
            None => device.0 / 4 * 3,
        };
        // One device's memory: a group's ranks each use their own.
        let per_device = device.1;
        let context_length = match env("GROVE_CONTEXT_LENGTH") {
            None => None,
            Some(v) => Some(
                v.trim()
                    .parse()
                    .map_err(|_| invalid("GROVE_CONTEXT_LENGTH", &v, "not a number"))?,
            ),
        };
        let shards = number("GROVE_SHARDS", 1u32)?;
        if !(1..=crate::sched::MAX_SHARDS).contains(&shards) {
            return Err(invalid(
                "GROVE_SHARDS",
                &shards.to_string(),
                "not 1 to 16 processes",
            ));
        }
        Ok(Self {
            shards,
            per_device,
            host: host_from_env()?,
            allow_remote: env("GROVE_ALLOW_REMOTE").is_some_and(|v| v == "1" || v == "true"),
            keep_alive,
            max_loaded: number("GROVE_MAX_LOADED", 3usize)?.max(1),
            max_queue: number("GROVE_MAX_QUEUE", 512usize)?.max(1),
            context_length,
            load_timeout,
            runner_timeout,
            memory_budget,
            runner_bin,
            http: crate::http::HttpConfig {
                api_key: env("GROVE_API_KEY"),
                cors_origins: env("GROVE_ORIGINS")
                    .map(|v| {
                        v.split(',')
                            .map(|o| o.trim().to_owned())
                            .filter(|o| !o.is_empty())
                            .collect()
                    })
                    .unwrap_or_default(),
                max_body_bytes: number("GROVE_MAX_BODY", crate::http::DEFAULT_MAX_BODY)?,
            },
        })
    }
}

/// `grove-runner`: GROVE_RUNNER, else beside the `grove` binary.
pub fn runner_binary() -> Result<PathBuf, ConfigError> {
    if let Some(path) = env("GROVE_RUNNER") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()
        .map_err(|e| ConfigError::Other(format!("finding the grove binary: {e}")))?;
    let beside = exe.with_file_name("grove-runner");
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(ConfigError::Other(format!(
            "grove-runner is not beside {} (build it, or set GROVE_RUNNER)",
            exe.display()
        )))
    }
}

/// The memory models are loaded into: the GPU's on GPU hosts (asked of MLX
/// through `grove-runner device`, since the daemon does not link MLX), else
/// physical RAM.
/// The memory MLX runs in as `grove-runner device` reports it, and whether
/// it is one device's (a GPU's) rather than the host's RAM.
fn budget_memory(runner: &std::path::Path) -> (u64, bool) {
    let reported = std::process::Command::new(runner)
        .arg("device")
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok());
    let bytes = reported
        .as_ref()
        .and_then(|v| {
            v.get("memory_total_bytes")
                .and_then(serde_json::Value::as_u64)
        })
        .filter(|&n| n > 0);
    let device = reported
        .as_ref()
        .and_then(|v| v.get("source").and_then(serde_json::Value::as_str))
        == Some("device");
    match bytes {
        Some(b) => (b, device),
        None => (physical_memory(), false),
    }
}

fn physical_memory() -> u64 {
    match sysinfo::System::new() {
        Ok(mut sys) => {
            sys.refresh_memory();
            sys.total_memory()
        }
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        assert_eq!(parse_host("127.0.0.1:9000").unwrap().port(), 9000);
        assert_eq!(parse_host(":9000").unwrap().to_string(), "127.0.0.1:9000");
        assert_eq!(parse_host("0.0.0.0").unwrap().to_string(), "0.0.0.0:11435");
        assert_eq!(
            parse_host("localhost").unwrap().to_string(),
            "127.0.0.1:11435"
        );
        assert!(parse_host("nonsense").is_err());
    }
}
