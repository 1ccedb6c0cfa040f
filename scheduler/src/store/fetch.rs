//! Fetching one blob into the cache: under the blob's lock, into
//! `blobs/ETAG.incomplete`, resumed with `Range` after an interruption,
//! checked against the hub's hash, then renamed to `blobs/ETAG`.
//!
//! The blob id says how to check it: 64 hex digits are the LFS SHA-256 of the
//! bytes, 40 are git's blob id, `sha1("blob {len}\0" + bytes)`, as
//! `huggingface_hub` names small files. Any other id (no hub sends one) gets a
//! size check only. The hash is taken over the finished file in one pass, so a
//! resumed download is checked whole, old bytes included.
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc::Sender;

use super::cache::{BlobLock, Store};
use super::error::{Phase, Result, StoreError, is_disk_full};
use super::hub::{FileMeta, HubClient};
use super::name::ModelName;
use super::pull::Progress;

/// How a blob id is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HashKind {
    /// LFS: SHA-256 of the bytes.
    Sha256,
    /// git: SHA-1 of `blob {len}\0` and the bytes.
    GitSha1,
    /// Unknown id: size only.
    None,
}

impl HashKind {
    pub(crate) fn of(etag: &str) -> HashKind {
        let hex = etag.bytes().all(|b| b.is_ascii_hexdigit());
        match etag.len() {
            64 if hex => HashKind::Sha256,
            40 if hex => HashKind::GitSha1,
            _ => HashKind::None,
        }
    }

    fn label(self) -> &'static str {
        match self {
            HashKind::Sha256 => "SHA-256",
            HashKind::GitSha1 => "git blob SHA-1",
            HashKind::None => "size",
        }
    }
}

/// The hex digest of `path` for `kind` (blocking; one sequential read).
pub(crate) fn hash_file(path: &Path, kind: HashKind) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let mut buf = vec![0u8; 1 << 20];
    let mut run = |update: &mut dyn FnMut(&[u8])| -> std::io::Result<()> {
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            update(&buf[..n]);
        }
    };
    Ok(match kind {
        HashKind::Sha256 => {
            let mut h = Sha256::new();
            run(&mut |b| h.update(b))?;
            hex::encode(h.finalize())
        }
        HashKind::GitSha1 => {
            let mut h = Sha1::new();
            h.update(format!("blob {len}\0").as_bytes());
            run(&mut |b| h.update(b))?;
            hex::encode(h.finalize())
        }
        HashKind::None => String::new(),
    })
}

/// One file to fetch.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub file: String,
    pub meta: FileMeta,
}

/// What fetching a blob did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fetched {
    /// Bytes this call took from the network.
    pub downloaded: u64,
    /// The blob's size.
    pub size: u64,
    /// The blob was already there (or another pull made it).
    pub cached: bool,
}

/// Everything a fetch needs.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub store: Store,
    pub hub: HubClient,
    pub name: ModelName,
    pub tx: Sender<Progress>,
    pub retries: u32,
}

impl Ctx {
    async fn emit(&self, p: Progress) {
        let _ = self.tx.send(p).await;
    }
}

/// Makes `blobs/ETAG` exist and match its hash.
pub(crate) async fn fetch(ctx: &Ctx, job: &Job) -> Result<Fetched> {
    let etag = &job.meta.etag;
    let blob = ctx.store.blob_path(&ctx.name, etag);
    let cached = |b: &Path| -> Option<Fetched> {
        let size = std::fs::metadata(b).ok()?.len();
        Some(Fetched {
            downloaded: 0,
            size,
            cached: true,
        })
    };
    if let Some(done) = cached(&blob) {
        return Ok(done);
    }
    let mut waited = false;
    let lock = loop {
        if let Some(lock) = ctx.store.try_lock_blob(&ctx.name, etag)? {
            break Arc::new(lock);
        }
        if !waited {
            waited = true;
            ctx.emit(Progress::FileWaiting {
                file: job.file.clone(),
            })
            .await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Another pull may have finished it while we waited.
    if let Some(done) = cached(&blob) {
        return Ok(done);
    }
    let partial = PathBuf::from(format!("{}.incomplete", blob.display()));
    let mut downloaded = 0;
    let mut attempt = 0;
    loop {
        match download(ctx, job, &partial, &lock, &mut downloaded).await {
            Ok(()) => break,
            Err(e) if e.is_transient() && attempt < ctx.retries => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(250 << attempt.min(5))).await;
            }
            Err(e) => return Err(e),
        }
    }
    let size = verify(ctx, job, &partial).await?;
    std::fs::rename(&partial, &blob).map_err(|e| StoreError::io(Phase::Link, &blob, e))?;
    Ok(Fetched {
        downloaded,
        size,
        cached: false,
    })
}

/// Appends the rest of the file to `partial`, from its current length on.
async fn download(
    ctx: &Ctx,
    job: &Job,
    partial: &Path,
    lock: &Arc<BlobLock>,
    downloaded: &mut u64,
) -> Result<()> {
    let io = |e: std::io::Error| {
        if is_disk_full(&e) {
            let _ = std::fs::remove_file(partial);
        }
        StoreError::io(Phase::Download, partial, e)
    };
    if let Some(dir) = partial.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut have = std::fs::metadata(partial).map(|m| m.len()).unwrap_or(0);
    if job.meta.size.is_some_and(|s| have > s) {
        have = 0;
    }
    if job.meta.size == Some(have) && have > 0 {
        // A previous pull wrote it all but stopped before the check.
        ctx.emit(Progress::FileStart {
            file: job.file.clone(),
            size: have,
            resumed_from: have,
        })
        .await;
        return Ok(());
    }
    let what = format!("{}/{}", ctx.name.repo(), job.file);
    let mut resp = ctx
        .hub
        .download(&ctx.name, &job.meta.location, have, &what)
        .await?;
    let start = match resp.status() {
        StatusCode::PARTIAL_CONTENT => content_range_start(&resp).unwrap_or(u64::MAX),
        StatusCode::RANGE_NOT_SATISFIABLE => u64::MAX,
        _ => 0,
    };
    if start != have {
        // The server ignored or refused the range: start over.
        have = 0;
        if start == u64::MAX {
            let _ = std::fs::remove_file(partial);
            resp = ctx
                .hub
                .download(&ctx.name, &job.meta.location, 0, &what)
                .await?;
        }
    }
    let size = job
        .meta
        .size
        .or_else(|| resp.content_length().map(|l| l + have))
        .unwrap_or(0);
    let mut opts = std::fs::OpenOptions::new();
    opts.create(true).write(true);
    if have == 0 {
        opts.truncate(true);
    } else {
        opts.append(true);
    }
    let mut out = BlobWriter {
        file: Some(opts.open(partial).map_err(io)?),
        buf: Vec::new(),
        lock: lock.clone(),
    };
    ctx.emit(Progress::FileStart {
        file: job.file.clone(),
        size,
        resumed_from: have,
    })
    .await;
    let mut last = Instant::now();
    let result = loop {
        match resp.chunk().await {
            Ok(Some(bytes)) => {
                out.write(&bytes).await.map_err(io)?;
                have += bytes.len() as u64;
                *downloaded += bytes.len() as u64;
                if last.elapsed() >= Duration::from_millis(100) {
                    last = Instant::now();
                    let _ = ctx.tx.try_send(Progress::FileBytes {
                        file: job.file.clone(),
                        done: have,
                        size,
                    });
                }
            }
            Ok(None) if size > 0 && have < size => {
                break Err(format!(
                    "the connection closed after {have} of {size} bytes"
                ));
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(super::error::chain(&e)),
        }
    };
    out.flush(true).await.map_err(io)?;
    let _ = ctx.tx.try_send(Progress::FileBytes {
        file: job.file.clone(),
        done: have,
        size,
    });
    result.map_err(|cause| StoreError::Network {
        phase: Phase::Download,
        what,
        endpoint: ctx.hub.endpoint().to_string(),
        cause,
    })
}

/// Buffers a download and writes it from blocking threads. Each write owns
/// the file and a share of the blob's lock, so when a pull is cancelled (its
/// future dropped) a write already under way still finishes before the lock
/// can pass to another pull: two writers never interleave in one file.
struct BlobWriter {
    file: Option<std::fs::File>,
    buf: Vec<u8>,
    lock: Arc<BlobLock>,
}

impl BlobWriter {
    const FLUSH_AT: usize = 64 << 10;

    async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= Self::FLUSH_AT {
            self.flush(false).await?;
        }
        Ok(())
    }

    async fn flush(&mut self, sync: bool) -> std::io::Result<()> {
        use std::io::Write;
        let mut file = self
            .file
            .take()
            .ok_or_else(|| std::io::Error::other("an earlier write failed"))?;
        let buf = std::mem::take(&mut self.buf);
        let lock = self.lock.clone();
        let (file, r) = tokio::task::spawn_blocking(move || {
            let _hold = lock;
            let r = file
                .write_all(&buf)
                .and_then(|()| if sync { file.sync_data() } else { Ok(()) });
            (file, r)
        })
        .await
        .map_err(std::io::Error::other)?;
        self.file = Some(file);
        r
    }
}

/// `Content-Range: bytes START-END/TOTAL` → START.
fn content_range_start(resp: &reqwest::Response) -> Option<u64> {
    let v = resp
        .headers()
        .get(reqwest::header::CONTENT_RANGE)?
        .to_str()
        .ok()?;
    v.strip_prefix("bytes ")?
        .split('-')
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Checks the finished `partial` against the blob id and size; a mismatch
/// deletes it. Returns its size.
async fn verify(ctx: &Ctx, job: &Job, partial: &Path) -> Result<u64> {
    ctx.emit(Progress::FileVerifying {
        file: job.file.clone(),
    })
    .await;
    let kind = HashKind::of(&job.meta.etag);
    let path = partial.to_path_buf();
    let (len, actual) = tokio::task::spawn_blocking(move || {
        let len = std::fs::metadata(&path)?.len();
        hash_file(&path, kind).map(|h| (len, h))
    })
    .await
    .map_err(|e| StoreError::io(Phase::Verify, partial, std::io::Error::other(e)))?
    .map_err(|e| StoreError::io(Phase::Verify, partial, e))?;
    let mismatch = |kind: HashKind, expected: String, actual: String| {
        let _ = std::fs::remove_file(partial);
        StoreError::HashMismatch {
            phase: Phase::Verify,
            file: format!("{}/{}", ctx.name.repo(), job.file),
            kind: kind.label(),
            expected,
            actual,
        }
    };
    if let Some(size) = job.meta.size.filter(|s| *s != len) {
        return Err(mismatch(
            HashKind::None,
            format!("{size} bytes"),
            format!("{len} bytes"),
        ));
    }
    if kind != HashKind::None && !actual.eq_ignore_ascii_case(&job.meta.etag) {
        return Err(mismatch(kind, job.meta.etag.clone(), actual));
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_the_hub() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        std::fs::write(&p, b"hello\n").unwrap();
        // `git hash-object` and `sha256sum` of "hello\n".
        assert_eq!(
            hash_file(&p, HashKind::GitSha1).unwrap(),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        assert_eq!(
            hash_file(&p, HashKind::Sha256).unwrap(),
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert_eq!(HashKind::of(&"a".repeat(64)), HashKind::Sha256);
        assert_eq!(HashKind::of(&"0".repeat(40)), HashKind::GitSha1);
        assert_eq!(HashKind::of("xyz"), HashKind::None);
    }
}
