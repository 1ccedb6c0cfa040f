//! A Hugging Face hub on 127.0.0.1 for tests: the endpoints `grove pull` and
//! `huggingface_hub` use, over in-memory repos (the fixture models), with
//! faults to inject.
//!
//! - `GET /api/models/{repo}/revision/{rev}`: `{id, sha, siblings}`;
//! - `GET /api/models/{repo}/tree/{rev}`: the file list with git blob ids and
//!   LFS SHA-256s (what `snapshot_download` reads);
//! - `HEAD|GET /{repo}/resolve/{rev}/{file}`: small files answered directly
//!   with `ETag` = git blob id; `*.safetensors` (LFS) as the hub does, a 302
//!   to a CDN on another origin (`http://localhost:PORT/cdn/SHA256`) carrying
//!   `X-Linked-Etag` = SHA-256 and `X-Linked-Size`; both with `X-Repo-Commit`;
//! - `GET /cdn/{sha256}`: the bytes, with `Range` support;
//! - renamed repos answer with a relative 307 to the new name;
//! - gated repos want `Authorization: Bearer TOKEN` (else 401 `GatedRepo`),
//!   unknown repos and revisions are 404 `RepoNotFound` / `RevisionNotFound`.
//!
//! Faults ([`Faults`]): cut a file's response after N bytes, flip a byte of a
//! file, throttle bodies. Every request is logged ([`Request`]). Also: a pull
//! that collects its events ([`pull_events`]), and a fixture's runner files.
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result};
use grove::store::pull::is_runner_file;

use crate::fixtures;
use grove::store::{ModelName, Progress, PullOptions, Store, StoreError, pull};
use sha1::Sha1;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One file of a repo.
#[derive(Debug, Clone)]
pub struct File {
    pub data: Arc<Vec<u8>>,
    /// Stored in LFS (served through the CDN, named by SHA-256).
    pub lfs: bool,
    pub sha256: String,
    pub git_sha1: String,
}

impl File {
    fn new(name: &str, data: Vec<u8>) -> File {
        let sha256 = hex::encode(Sha256::digest(&data));
        let mut h = Sha1::new();
        h.update(format!("blob {}\0", data.len()).as_bytes());
        h.update(&data);
        File {
            lfs: name.ends_with(".safetensors"),
            sha256,
            git_sha1: hex::encode(h.finalize()),
            data: Arc::new(data),
        }
    }

    /// The blob id the hub gives for it.
    pub fn etag(&self) -> &str {
        if self.lfs {
            &self.sha256
        } else {
            &self.git_sha1
        }
    }
}

/// A repo at one commit.
#[derive(Debug, Clone)]
pub struct Repo {
    pub commit: String,
    pub files: BTreeMap<String, File>,
    /// Branches and tags besides `main`.
    pub tags: Vec<String>,
    /// The token a gated repo wants.
    pub gated: Option<String>,
}

/// Faults to inject.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Cut the next `times` responses for file `.0` after `.1` body bytes.
    pub cut: Option<(String, u64)>,
    pub cut_times: u32,
    /// Flip the byte at this offset of this file whenever it is served.
    pub corrupt: Option<(String, u64)>,
    /// Body bytes per second (0: no limit).
    pub throttle: u64,
}

/// A logged request.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
    pub range: Option<String>,
    pub status: u16,
    /// Body bytes written.
    pub sent: u64,
}

#[derive(Debug, Default)]
struct State {
    repos: HashMap<String, Repo>,
    renamed: HashMap<String, String>,
    faults: Faults,
    log: Vec<Request>,
}

/// The running server; stops when dropped.
#[derive(Debug)]
pub struct HubServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HubServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HubServer {
    /// Listens on 127.0.0.1 (a free port).
    pub async fn start() -> Result<HubServer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let st = st.clone();
                tokio::spawn(async move {
                    let _ = serve(sock, addr, st).await;
                });
            }
        });
        Ok(HubServer { addr, state, task })
    }

    /// `http://127.0.0.1:PORT`, for `HF_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a repo with these files; returns its commit.
    pub fn add_repo(&self, id: &str, files: Vec<(String, Vec<u8>)>) -> String {
        let files: BTreeMap<String, File> = files
            .into_iter()
            .map(|(n, d)| {
                let f = File::new(&n, d);
                (n, f)
            })
            .collect();
        let mut h = Sha1::new();
        h.update(id.as_bytes());
        for (n, f) in &files {
            h.update(n.as_bytes());
            h.update(f.sha256.as_bytes());
        }
        let commit = hex::encode(h.finalize());
        let repo = Repo {
            commit: commit.clone(),
            files,
            tags: vec!["v1".into()],
            gated: None,
        };
        self.lock().repos.insert(id.to_string(), repo);
        commit
    }

    /// Adds a repo holding every file of a fixture model directory.
    pub fn add_fixture(&self, id: &str, dir: &Path) -> Result<String> {
        let mut files = Vec::new();
        for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let e = e?;
            if e.file_type()?.is_file() {
                files.push((
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path())?,
                ));
            }
        }
        Ok(self.add_repo(id, files))
    }

    /// A repo's state (files, hashes).
    pub fn repo(&self, id: &str) -> Option<Repo> {
        self.lock().repos.get(id).cloned()
    }

    /// Makes a repo gated behind `token`.
    pub fn gate(&self, id: &str, token: &str) {
        if let Some(r) = self.lock().repos.get_mut(id) {
            r.gated = Some(token.to_string());
        }
    }

    /// `old` was renamed to `new`: requests for it redirect.
    pub fn rename(&self, old: &str, new: &str) {
        self.lock().renamed.insert(old.to_string(), new.to_string());
    }

    /// Replaces the faults.
    pub fn set_faults(&self, f: Faults) {
        self.lock().faults = f;
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Request> {
        self.lock().log.clone()
    }

    /// Clears the log.
    pub fn clear_log(&self) {
        self.lock().log.clear();
    }

    /// Body bytes sent for one file (by CDN path or resolve path) so far.
    pub fn sent_for(&self, etag: &str, file: &str) -> u64 {
        self.log()
            .iter()
            .filter(|r| {
                r.method == "GET"
                    && (r.path.ends_with(&format!("/{etag}"))
                        || r.path.ends_with(&format!("/{file}")))
            })
            .map(|r| r.sent)
            .sum()
    }
}

/// Runs a pull, collecting its progress events.
pub async fn pull_events(
    store: &Store,
    name: &ModelName,
    opts: &PullOptions,
) -> (Result<PathBuf, StoreError>, Vec<Progress>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let collect = tokio::spawn(async move {
        let mut v = Vec::new();
        while let Some(p) = rx.recv().await {
            v.push(p);
        }
        v
    });
    let r = pull(store, name, opts, tx).await;
    (r, collect.await.unwrap_or_default())
}

/// The runner files of the fixture and their bytes.
pub fn runner_files(fixture: &str) -> Result<Vec<(String, Vec<u8>)>> {
    let dir = fixtures::model_dir(fixture)?;
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir)? {
        let n = e?.file_name().to_string_lossy().into_owned();
        if is_runner_file(&n) {
            out.push((n.clone(), std::fs::read(dir.join(&n))?));
        }
    }
    out.sort();
    Ok(out)
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Option<(String, Arc<Vec<u8>>, u64, u64)>, // file, data, from, to (exclusive)
    json: Option<Vec<u8>>,
}

impl Reply {
    fn new(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: None,
            json: None,
        }
    }
    fn header(mut self, k: &str, v: impl Into<String>) -> Reply {
        self.headers.push((k.to_string(), v.into()));
        self
    }
    fn error(status: u16, code: &str, msg: &str) -> Reply {
        Reply::new(status)
            .header("X-Error-Code", code)
            .header("X-Error-Message", msg)
    }
    fn json(v: serde_json::Value) -> Reply {
        let mut r = Reply::new(200).header("Content-Type", "application/json");
        r.json = Some(v.to_string().into_bytes());
        r
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).and_then(|c| hex(*c)),
                b.get(i + 2).and_then(|c| hex(*c)),
            )
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn serve(mut sock: TcpStream, addr: SocketAddr, st: Arc<Mutex<State>>) -> Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = sock.read(&mut chunk).await?;
        if n == 0 || buf.len() > 65536 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let method = first.next().unwrap_or("").to_string();
    let target = first.next().unwrap_or("/").to_string();
    let mut headers = HashMap::new();
    for l in lines.take_while(|l| !l.is_empty()) {
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let path = target.split('?').next().unwrap_or("/").to_string();
    let reply = {
        let guard = st.lock().unwrap_or_else(|e| e.into_inner());
        route(&guard, &path, &headers, addr)
    };
    // Logged before the reply, and `sent` counted before each write, so a
    // client that has read everything always finds it in the log.
    let index = {
        let mut guard = st.lock().unwrap_or_else(|e| e.into_inner());
        guard.log.push(Request {
            method: method.clone(),
            path,
            authorization: headers.get("authorization").cloned(),
            range: headers.get("range").cloned(),
            status: reply.status,
            sent: 0,
        });
        guard.log.len() - 1
    };
    write_reply(&mut sock, &method, &reply, &st, index).await
}

/// Adds `n` body bytes to request `index`'s log entry.
fn count(st: &Arc<Mutex<State>>, index: usize, n: u64) {
    let mut guard = st.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = guard.log.get_mut(index) {
        r.sent += n;
    }
}

fn route(st: &State, path: &str, h: &HashMap<String, String>, addr: SocketAddr) -> Reply {
    let parts: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(percent_decode)
        .collect();
    let p: Vec<&str> = parts.iter().map(String::as_str).collect();
    if let ["cdn", sha] = p.as_slice() {
        for repo in st.repos.values() {
            if let Some((name, f)) = repo.files.iter().find(|(_, f)| f.lfs && f.sha256 == *sha) {
                return body(name, f, h).header("ETag", format!("\"{sha}\""));
            }
        }
        return Reply::new(404);
    }
    let (api, rest) = match p.as_slice() {
        ["api", "models", rest @ ..] => (true, rest),
        rest => (false, rest),
    };
    if rest.len() < 4 {
        return Reply::error(404, "RepoNotFound", "no such path");
    }
    let repo_id = format!("{}/{}", rest[0], rest[1]);
    if let Some(new) = st.renamed.get(&repo_id) {
        let tail: Vec<&str> = path.split('/').skip(if api { 5 } else { 3 }).collect();
        let prefix = if api { "/api/models/" } else { "/" };
        return Reply::new(307).header("Location", format!("{prefix}{new}/{}", tail.join("/")));
    }
    let Some(repo) = st.repos.get(&repo_id) else {
        return Reply::error(404, "RepoNotFound", "Repository not found");
    };
    if let Some(tok) = &repo.gated {
        match h.get("authorization") {
            Some(a) if *a == format!("Bearer {tok}") => {}
            Some(_) => return Reply::error(403, "GatedRepo", "Access to this model is restricted"),
            None => return Reply::error(401, "GatedRepo", "Access to this model is restricted"),
        }
    }
    let rev = rest[3];
    if rev != "main" && rev != repo.commit && !repo.tags.iter().any(|t| t == rev) {
        return Reply::error(404, "RevisionNotFound", "Invalid rev id");
    }
    match (api, rest[2]) {
        (true, "revision") => Reply::json(serde_json::json!({
            "id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": false,
            "gated": repo.gated.is_some(),
            "siblings": repo.files.keys().map(|n| serde_json::json!({"rfilename": n})).collect::<Vec<_>>(),
        })),
        (true, "tree") => Reply::json(serde_json::Value::Array(
            repo.files
                .iter()
                .map(|(n, f)| {
                    let mut v = serde_json::json!({"type": "file", "oid": f.git_sha1, "size": f.data.len(), "path": n});
                    if f.lfs {
                        v["lfs"] = serde_json::json!({"oid": f.sha256, "size": f.data.len(), "pointerSize": 134});
                    }
                    v
                })
                .collect(),
        )),
        (false, "resolve") => {
            let file = rest[4..].join("/");
            let Some(f) = repo.files.get(&file) else {
                return Reply::error(404, "EntryNotFound", "Entry not found");
            };
            let r = if f.lfs {
                let port = addr.port();
                Reply::new(302)
                    .header("Location", format!("http://localhost:{port}/cdn/{}", f.sha256))
                    .header("X-Linked-Etag", format!("\"{}\"", f.sha256))
                    .header("X-Linked-Size", f.data.len().to_string())
                    .header("ETag", format!("\"{}\"", f.git_sha1))
            } else {
                body(&file, f, h).header("ETag", format!("\"{}\"", f.git_sha1))
            };
            r.header("X-Repo-Commit", repo.commit.clone())
        }
        _ => Reply::error(404, "EntryNotFound", "no such endpoint"),
    }
}

/// The file's bytes, honouring `Range: bytes=N-[M]`.
fn body(name: &str, f: &File, h: &HashMap<String, String>) -> Reply {
    let len = f.data.len() as u64;
    let range = h.get("range").and_then(|r| {
        let (a, b) = r.strip_prefix("bytes=")?.split_once('-')?;
        let a: u64 = a.trim().parse().ok()?;
        let b: u64 = if b.trim().is_empty() {
            len.saturating_sub(1)
        } else {
            b.trim().parse().ok()?
        };
        Some((a, b.min(len.saturating_sub(1))))
    });
    let mut r = match range {
        Some((a, _)) if a >= len => {
            return Reply::new(416).header("Content-Range", format!("bytes */{len}"));
        }
        Some((a, b)) => {
            let mut r = Reply::new(206).header("Content-Range", format!("bytes {a}-{b}/{len}"));
            r.body = Some((name.to_string(), f.data.clone(), a, b + 1));
            r
        }
        None => {
            let mut r = Reply::new(200);
            r.body = Some((name.to_string(), f.data.clone(), 0, len));
            r
        }
    };
    r = r.header("Accept-Ranges", "bytes");
    r
}

async fn write_reply(
    sock: &mut TcpStream,
    method: &str,
    r: &Reply,
    st: &Arc<Mutex<State>>,
    index: usize,
) -> Result<()> {
    let reason = match r.status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        307 => "Temporary Redirect",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Status",
    };
    let len = match (&r.body, &r.json) {
        (Some((_, _, a, b)), _) => b - a,
        (_, Some(j)) => j.len() as u64,
        _ => 0,
    };
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Length: {len}\r\nConnection: close\r\n",
        r.status
    );
    for (k, v) in &r.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    sock.write_all(head.as_bytes()).await?;
    if method == "HEAD" {
        return Ok(sock.flush().await?);
    }
    if let Some(j) = &r.json {
        count(st, index, j.len() as u64);
        sock.write_all(j).await?;
    }
    if let Some((name, data, a, b)) = &r.body {
        let faults = {
            let mut g = st.lock().unwrap_or_else(|e| e.into_inner());
            let f = g.faults.clone();
            if f.cut.as_ref().is_some_and(|(n, _)| n == name) && f.cut_times > 0 {
                g.faults.cut_times -= 1;
                if g.faults.cut_times == 0 {
                    g.faults.cut = None;
                }
            }
            f
        };
        let cut = faults
            .cut
            .filter(|(n, _)| n == name && faults.cut_times > 0)
            .map(|(_, at)| at);
        let flip = faults.corrupt.filter(|(n, _)| n == name).map(|(_, at)| at);
        let step = 16 * 1024;
        let mut pos = *a;
        let mut sent = 0;
        while pos < *b {
            let end = (pos + step).min(*b);
            let mut piece = data[pos as usize..end as usize].to_vec();
            if let Some(at) = flip.filter(|at| (pos..end).contains(at)) {
                piece[(at - pos) as usize] ^= 0xff;
            }
            let cut_now = cut.is_some_and(|limit| sent + piece.len() as u64 >= limit);
            if let Some(limit) = cut.filter(|_| cut_now) {
                piece.truncate((limit - sent) as usize);
            }
            count(st, index, piece.len() as u64);
            sock.write_all(&piece).await?;
            sent += piece.len() as u64;
            if cut_now {
                // Drop the connection mid-body.
                sock.flush().await?;
                return Ok(());
            }
            if faults.throttle > 0 {
                let secs = piece.len() as f64 / faults.throttle as f64;
                tokio::time::sleep(Duration::from_secs_f64(secs)).await;
            }
            pos = end;
        }
    }
    Ok(sock.flush().await?)
}
