//! HTTP/1.1 by hand, for the daemon's JSON APIs: requests exactly as
//! written (malformed bodies, wrong headers, huge bodies), responses read
//! whole or line by line, and the PyPI clients (`openai`, `ollama`, in
//! `.grove/clients`) run as Python scripts.
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The longest a test waits on the daemon's HTTP side for one step.
const WAIT: Duration = Duration::from_secs(120);

/// A response: status, headers (lower-case names) and body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.body).with_context(|| format!("not JSON: {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The request's bytes.
pub fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Sends one request and reads the whole response (the server closes).
pub async fn send(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Reply> {
    let mut s = tokio::time::timeout(WAIT, TcpStream::connect(addr))
        .await
        .context("no connection within 120 s")??;
    // A body the server refuses early may not be read whole: a failed write
    // is fine as long as a response comes.
    let _ = s.write_all(&request(method, path, headers, body)).await;
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut raw))
        .await
        .context("no response within 120 s")??;
    parse(&raw)
}

fn parse(raw: &[u8]) -> Result<Reply> {
    let text = String::from_utf8_lossy(raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("no HTTP response: {text:?}");
    };
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .context("no status line")?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Ok(Reply {
        status,
        headers,
        body,
    })
}

fn dechunk(mut s: &str) -> Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").context("bad chunk")?;
        let n = usize::from_str_radix(size.trim(), 16).context("bad chunk size")?;
        if n == 0 {
            return Ok(out);
        }
        ensure!(rest.len() >= n, "short chunk");
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
}

/// A streaming response read line by line.
pub struct Lines {
    pub status: u16,
    reader: BufReader<TcpStream>,
}

impl Lines {
    /// Sends the request and reads the head.
    pub async fn open(
        addr: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Self> {
        let mut s = tokio::time::timeout(WAIT, TcpStream::connect(addr))
            .await
            .context("no connection within 120 s")??;
        s.write_all(&request("POST", path, headers, body.as_bytes()))
            .await?;
        let mut reader = BufReader::new(s);
        let mut status = 0;
        loop {
            let mut line = String::new();
            tokio::time::timeout(WAIT, reader.read_line(&mut line))
                .await
                .context("no response head within 120 s")??;
            if status == 0 {
                status = line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
            }
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        Ok(Self { status, reader })
    }

    /// The next line of the body that holds `needle` (chunk framing skipped).
    pub async fn next_with(&mut self, needle: &str) -> Result<String> {
        loop {
            let mut line = String::new();
            let n = tokio::time::timeout(WAIT, self.reader.read_line(&mut line))
                .await
                .with_context(|| format!("no line with {needle:?} within 120 s"))??;
            if n == 0 {
                bail!("the stream ended before a line with {needle:?}");
            }
            if line.contains(needle) {
                return Ok(line);
            }
        }
    }
}

/// Runs `tests/http/SCRIPT` with the PyPI clients on the path; its stdout.
pub fn python_client(script: &str, args: &[&str]) -> Result<String> {
    python_client_in("clients", script, args)
}

/// Runs `tests/http/SCRIPT` with the packages make test installed in
/// `.grove/DIR` on the path (`clients`: openai, ollama, anthropic;
/// `frameworks`: LangChain's and instructor); its stdout.
pub fn python_client_in(dir: &str, script: &str, args: &[&str]) -> Result<String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let clients = root.join(".grove").join(dir);
    ensure!(
        clients.is_dir(),
        "{} is missing (make test installs the clients)",
        clients.display()
    );
    let mut cmd =
        std::process::Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()));
    cmd.arg(root.join("tests/http").join(script))
        .args(args)
        .env("PYTHONPATH", &clients);
    run_client(cmd, script)
}

/// Runs `tests/http/SCRIPT` with Node and the npm packages make test
/// installed in `.grove/node`; `None` where this machine has no Node or
/// make test found no npm to install them with.
pub fn node_client(script: &str, args: &[&str]) -> Result<Option<String>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let has_node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let modules = root.join(".grove/node/node_modules");
    if !has_node || !modules.is_dir() {
        return Ok(None);
    }
    let mut cmd = std::process::Command::new("node");
    cmd.arg(root.join("tests/http").join(script))
        .args(args)
        .env("NODE_PATH", &modules);
    run_client(cmd, script).map(Some)
}

fn run_client(mut cmd: std::process::Command, script: &str) -> Result<String> {
    cmd.env("NO_PROXY", "*")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OLLAMA_HOST")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL");
    let out = crate::proc::output(&mut cmd, crate::proc::DEADLINE)?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "{script} failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}
