//! `pull`: a model from the hub into the store, only the files a runner needs,
//! several at once, resumable, verified, and safe to run twice at once.
//!
//! Steps: the revision's commit and file list; the safetensors index first
//! (so only the shards it names are fetched, not e.g. a duplicate
//! `consolidated.safetensors`); `HEAD` on every file for its blob id and size;
//! a disk-space check; the downloads ([`super::fetch`]), each linked into
//! `snapshots/COMMIT/` as soon as its blob is verified; last, `refs/REVISION`.
//! A name resolves only once its ref is written, so an interrupted pull never
//! leaves a model that looks runnable but is not.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::sync::mpsc::Sender;
use tokio::task::JoinSet;

use super::cache::Store;
use super::error::{Phase, Result, StoreError};
use super::fetch::{Ctx, Job, fetch};
use super::hub::{DEFAULT_ENDPOINT, HubClient, HubToken};
use super::name::{ModelName, is_commit_hash};
use super::snapshot::{index_shards, missing_files};

/// The files a runner reads; everything else in a repo is skipped.
const RUNNER_FILES: [&str; 7] = [
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
];
const INDEX: &str = "model.safetensors.index.json";

/// Whether a repo file is one a runner needs (top-level only).
pub fn is_runner_file(path: &str) -> bool {
    !path.contains('/')
        && !path.starts_with('.')
        && (RUNNER_FILES.contains(&path) || path.ends_with(".safetensors"))
}

/// How to reach the hub.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// `HF_ENDPOINT`; default `https://huggingface.co`.
    pub endpoint: String,
    /// `HF_TOKEN` or the token file; sent to the endpoint only.
    pub token: Option<HubToken>,
    /// `HF_HUB_OFFLINE`: answer from the cache or fail; no network.
    pub offline: bool,
    /// Files downloaded at once.
    pub concurrency: usize,
    /// Automatic resumes of one file after a network error, before the pull fails.
    pub retries: u32,
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            endpoint: DEFAULT_ENDPOINT.to_string(),
            token: None,
            offline: false,
            concurrency: 4,
            retries: 3,
        }
    }
}

impl PullOptions {
    /// `HF_ENDPOINT`, `HF_TOKEN`/token file and `HF_HUB_OFFLINE` from the environment.
    pub fn from_env() -> PullOptions {
        PullOptions::from_lookup(&|k| std::env::var(k).ok())
    }

    /// [`PullOptions::from_env`] over any variable lookup.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> PullOptions {
        let truthy = |k: &str| get(k).is_some_and(|v| truthy(&v));
        PullOptions {
            endpoint: get("HF_ENDPOINT")
                .filter(|e| !e.trim().is_empty())
                .map(|e| e.trim().trim_end_matches('/').to_string())
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()),
            token: HubToken::from_lookup(get),
            offline: truthy("HF_HUB_OFFLINE") || truthy("TRANSFORMERS_OFFLINE"),
            ..PullOptions::default()
        }
    }
}

/// Whether a flag variable (`HF_HUB_OFFLINE`) is on, as huggingface_hub
/// reads it: 1, ON, YES or TRUE, in any case.
pub fn truthy(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_uppercase().as_str(),
        "1" | "ON" | "YES" | "TRUE"
    )
}

/// A pull's progress, in order: `Resolved`, then per file `FileStart`,
/// `FileBytes`..., `FileVerifying`, `FileDone` (files interleave), then `Done`.
/// `FileBytes` may be dropped when the receiver lags (they are cumulative).
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// What the pull will do: the commit, and how much is already here.
    Resolved {
        name: String,
        commit: String,
        files: usize,
        total_bytes: u64,
        cached_bytes: u64,
    },
    /// Another pull holds this file's blob lock; waiting for it.
    FileWaiting { file: String },
    /// A download (re)starts; `resumed_from` bytes were already on disk.
    FileStart {
        file: String,
        size: u64,
        resumed_from: u64,
    },
    /// `done` of `size` bytes of one file are on disk.
    FileBytes { file: String, done: u64, size: u64 },
    /// Checking the file's hash.
    FileVerifying { file: String },
    /// The file is in the snapshot; `downloaded` bytes of it came over the network now.
    FileDone {
        file: String,
        size: u64,
        downloaded: u64,
        cached: bool,
    },
    /// The model is in the store.
    Done {
        commit: String,
        path: PathBuf,
        downloaded_bytes: u64,
        total_bytes: u64,
        elapsed: Duration,
    },
}

/// Pulls `name` into `store` and returns its snapshot directory.
pub async fn pull(
    store: &Store,
    name: &ModelName,
    opts: &PullOptions,
    progress: Sender<Progress>,
) -> Result<PathBuf> {
    let started = Instant::now();
    let done = |path: PathBuf, commit: String, total: u64, downloaded: u64| Progress::Done {
        commit,
        path,
        downloaded_bytes: downloaded,
        total_bytes: total,
        elapsed: started.elapsed(),
    };
    // A pinned commit already here, or offline: the cache answers.
    let pinned = name.revision().is_some_and(is_commit_hash);
    if opts.offline || pinned {
        match store.resolve(name) {
            Ok(path) => {
                let commit = store.local_commit(name)?.unwrap_or_default();
                let (files, total) = dir_usage(&path);
                let _ = progress
                    .send(Progress::Resolved {
                        name: name.to_string(),
                        commit: commit.clone(),
                        files,
                        total_bytes: total,
                        cached_bytes: total,
                    })
                    .await;
                let _ = progress.send(done(path.clone(), commit, total, 0)).await;
                return Ok(path);
            }
            Err(StoreError::NotInStore { .. }) if opts.offline => {
                return Err(StoreError::Offline {
                    name: name.to_string(),
                    root: store.root().to_path_buf(),
                });
            }
            Err(e) if opts.offline => return Err(e),
            Err(_) => {}
        }
    }

    let hub = HubClient::new(&opts.endpoint, opts.token.clone())?;
    let info = hub.repo_info(name).await?;
    let commit = info.commit.clone();
    let at_commit = name.with_revision(Some(&commit))?;
    let ctx = Arc::new(Ctx {
        store: store.clone(),
        hub: hub.clone(),
        name: name.clone(),
        tx: progress.clone(),
        retries: opts.retries,
    });
    let not_model = |reason: String| StoreError::NotAModel {
        name: name.to_string(),
        reason,
    };
    let mut files: Vec<String> = info
        .files
        .into_iter()
        .filter(|f| is_runner_file(f))
        .collect();
    files.sort();
    if !files.iter().any(|f| f == "config.json") {
        return Err(not_model(format!("no config.json at {commit}")));
    }

    // The index first: it says which shards to fetch.
    let mut jobs = Vec::new();
    let mut index_downloaded = 0;
    if files.iter().any(|f| f == INDEX) {
        let meta = hub.file_meta(&at_commit, &commit, INDEX).await?;
        check_commit(&hub, &commit, INDEX, meta.commit.as_deref())?;
        let job = Job {
            file: INDEX.to_string(),
            meta,
        };
        index_downloaded = fetch(&ctx, &job).await?.downloaded;
        let blob = store.blob_path(name, &job.meta.etag);
        let shards = index_shards(&blob)
            .ok_or_else(|| not_model(format!("{INDEX} is not a safetensors index")))?;
        if let Some(s) = shards.iter().find(|s| !files.contains(s)) {
            return Err(not_model(format!(
                "{INDEX} names {s}, which the repo does not have"
            )));
        }
        files.retain(|f| !f.ends_with(".safetensors") || shards.contains(f));
        jobs.push(job);
    }
    if !files.iter().any(|f| f.ends_with(".safetensors")) {
        return Err(not_model(format!("no *.safetensors at {commit}")));
    }

    // HEAD every other file, several at once.
    let sem = Arc::new(Semaphore::new(opts.concurrency.max(1) * 2));
    let mut heads = JoinSet::new();
    for file in files.iter().filter(|f| *f != INDEX).cloned() {
        let (hub, sem, at_commit, commit) =
            (hub.clone(), sem.clone(), at_commit.clone(), commit.clone());
        heads.spawn(async move {
            let _permit = sem.acquire_owned().await;
            let meta = hub.file_meta(&at_commit, &commit, &file).await?;
            check_commit(&hub, &commit, &file, meta.commit.as_deref())?;
            Ok::<_, StoreError>(Job { file, meta })
        });
    }
    while let Some(r) = heads.join_next().await {
        jobs.push(r.map_err(join_error)??);
    }
    jobs.sort_by(|a, b| a.file.cmp(&b.file));

    let total: u64 = jobs.iter().map(|j| j.meta.size.unwrap_or(0)).sum();
    let mut cached = 0;
    let mut needed = 0;
    for j in &jobs {
        let blob = store.blob_path(name, &j.meta.etag);
        let fresh_index = j.file == INDEX && index_downloaded > 0;
        if blob.exists() && !fresh_index {
            cached += j.meta.size.unwrap_or(0);
        } else {
            let partial =
                std::fs::metadata(format!("{}.incomplete", blob.display())).map_or(0, |m| m.len());
            needed += j.meta.size.unwrap_or(0).saturating_sub(partial);
        }
    }
    let _ = progress
        .send(Progress::Resolved {
            name: name.to_string(),
            commit: commit.clone(),
            files: jobs.len(),
            total_bytes: total,
            cached_bytes: cached,
        })
        .await;
    check_space(store, name, needed)?;

    // Download and link, several at once; every file runs to its end, and
    // the first error is the pull's.
    let sem = Arc::new(Semaphore::new(opts.concurrency.max(1)));
    let mut tasks = JoinSet::new();
    for job in jobs {
        let (ctx, sem, commit) = (ctx.clone(), sem.clone(), commit.clone());
        tasks.spawn(async move {
            let _permit = sem.acquire_owned().await;
            let got = fetch(&ctx, &job).await?;
            // The index came first; report what that fetch did.
            let early = if job.file == INDEX {
                index_downloaded
            } else {
                0
            };
            ctx.store
                .link(&ctx.name, &commit, &job.file, &job.meta.etag)?;
            let _ = ctx
                .tx
                .send(Progress::FileDone {
                    file: job.file.clone(),
                    size: got.size,
                    downloaded: got.downloaded + early,
                    cached: got.cached && early == 0,
                })
                .await;
            Ok::<_, StoreError>(got.downloaded)
        });
    }
    let mut first_err = None;
    let mut downloaded = index_downloaded;
    while let Some(r) = tasks.join_next().await {
        match r.map_err(join_error).and_then(|r| r) {
            Ok(n) => downloaded += n,
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let dir = store.snapshot_dir(name, &commit);
    let missing = missing_files(&dir);
    if !missing.is_empty() {
        return Err(not_model(format!("the repo lacks {}", missing.join(", "))));
    }
    store.write_ref(name, &commit)?;
    let _ = progress
        .send(done(dir.clone(), commit, total, downloaded))
        .await;
    Ok(dir)
}

fn check_commit(hub: &HubClient, commit: &str, file: &str, got: Option<&str>) -> Result<()> {
    match got {
        Some(c) if c != commit => Err(StoreError::Protocol {
            phase: Phase::Metadata,
            what: file.to_string(),
            endpoint: hub.endpoint().to_string(),
            detail: format!("X-Repo-Commit {c} is not the commit asked for, {commit}"),
        }),
        _ => Ok(()),
    }
}

/// Fails before downloading when the cache's file system lacks `needed` bytes.
fn check_space(store: &Store, name: &ModelName, needed: u64) -> Result<()> {
    let dir = store.repo_dir(name).join("blobs");
    std::fs::create_dir_all(&dir).map_err(|e| StoreError::io(Phase::Download, &dir, e))?;
    match fs4::available_space(&dir) {
        Ok(available) if available < needed => Err(StoreError::DiskFull {
            phase: Phase::Download,
            path: dir,
            needed: Some(needed),
            available,
        }),
        _ => Ok(()),
    }
}

fn join_error(e: tokio::task::JoinError) -> StoreError {
    StoreError::io(
        Phase::Download,
        PathBuf::new(),
        std::io::Error::other(e.to_string()),
    )
}

/// Files in a snapshot and their bytes (following its links).
fn dir_usage(dir: &std::path::Path) -> (usize, u64) {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::metadata(e.path()).ok())
        .filter(|m| m.is_file())
        .fold((0, 0), |(n, b), m| (n + 1, b + m.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_runner_files() {
        for f in [
            "config.json",
            "model-00001-of-00002.safetensors",
            "tokenizer.json",
            "chat_template.jinja",
        ] {
            assert!(is_runner_file(f), "{f}");
        }
        for f in [
            "README.md",
            "pytorch_model.bin",
            "sub/model.safetensors",
            ".gitattributes",
            "reference.json",
        ] {
            assert!(!is_runner_file(f), "{f}");
        }
    }

    #[test]
    fn options_from_env() {
        let o = PullOptions::from_lookup(&|k| match k {
            "HF_ENDPOINT" => Some("http://127.0.0.1:9/".into()),
            "HF_HUB_OFFLINE" => Some("yes".into()),
            "HF_TOKEN" => Some("hf_secret".into()),
            _ => None,
        });
        assert_eq!(o.endpoint, "http://127.0.0.1:9");
        assert!(o.offline && o.token.is_some());
        assert!(!format!("{o:?}").contains("hf_secret"));
        let o = PullOptions::from_lookup(&|k| (k == "HF_HUB_OFFLINE").then(|| "0".into()));
        assert!(!o.offline);
        assert_eq!(o.endpoint, DEFAULT_ENDPOINT);
    }
}
