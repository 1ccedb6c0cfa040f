//! The store's errors. Each names the phase it happened in and says what to do
//! about it; none ever contains the hub token.
use std::path::PathBuf;

use thiserror::Error;

/// The step of a store operation an error happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Parsing a model name or path.
    Name,
    /// Asking the hub which commit a revision is and which files it has.
    Resolve,
    /// `HEAD` on a file: its blob id, size and location.
    Metadata,
    /// Fetching a file's bytes.
    Download,
    /// Checking a downloaded file against the hub's hash.
    Verify,
    /// Moving a blob into place and linking the snapshot.
    Link,
    /// Reading the cache: resolving, listing.
    Cache,
    /// Removing a snapshot and its blobs.
    Remove,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Name => "name",
            Phase::Resolve => "resolve",
            Phase::Metadata => "metadata",
            Phase::Download => "download",
            Phase::Verify => "verify",
            Phase::Link => "link",
            Phase::Cache => "cache",
            Phase::Remove => "remove",
        })
    }
}

/// Everything that can go wrong in the store.
#[derive(Debug, Error)]
pub enum StoreError {
    /// A model name that breaks the hub's rules; nothing was touched.
    #[error(
        "invalid model name {name:?}: {reason} (expected ORG/NAME[@REVISION], or a directory path such as ./DIR or /abs/DIR)"
    )]
    InvalidName { name: String, reason: String },

    /// A local directory that is not a model.
    #[error("{}: not a model directory: {reason}", path.display())]
    NotAModelDir { path: PathBuf, reason: String },

    /// The model is not in the local cache.
    #[error("{name} is not in the model store ({}); run `grove pull {name}`", root.display())]
    NotInStore { name: String, root: PathBuf },

    /// A snapshot exists but lacks files (an interrupted pull, or a partial
    /// `huggingface_hub` download).
    #[error(
        "{name}: snapshot {commit} is incomplete (missing {missing}); run `grove pull {name}` to finish it"
    )]
    Incomplete {
        name: String,
        commit: String,
        missing: String,
    },

    /// The repo has no model Grove can run.
    #[error(
        "{name}: not a model Grove can run: {reason} (Grove runs MLX-format repos: config.json, \
         *.safetensors, tokenizer.json)"
    )]
    NotAModel { name: String, reason: String },

    /// `HF_HUB_OFFLINE` is set and the cache cannot answer.
    #[error(
        "{name} is not in the model store ({}) and HF_HUB_OFFLINE is set; unset HF_HUB_OFFLINE to download it",
        root.display()
    )]
    Offline { name: String, root: PathBuf },

    /// HTTP 401/403: a gated or private repo, or a bad token.
    #[error(
        "{phase}: {name}: access denied by {endpoint} (HTTP {status}{detail}); the repo is gated, private or \
         does not exist: {hint}"
    )]
    Unauthorized {
        phase: Phase,
        name: String,
        endpoint: String,
        status: u16,
        detail: String,
        hint: &'static str,
    },

    /// HTTP 404 on the repo or revision.
    #[error("{phase}: {what} (HTTP 404 from {endpoint}); check the name and revision")]
    NotFound {
        phase: Phase,
        what: String,
        endpoint: String,
    },

    /// Any other unexpected HTTP status.
    #[error("{phase}: {url}: HTTP {status}{detail}; try again later")]
    Http {
        phase: Phase,
        url: String,
        status: u16,
        detail: String,
    },

    /// Connection refused, reset, timed out.
    #[error(
        "{phase}: {what}: {cause}; check the network and HF_ENDPOINT ({endpoint}); data already downloaded is \
         kept and the next pull resumes it"
    )]
    Network {
        phase: Phase,
        what: String,
        endpoint: String,
        cause: String,
    },

    /// The downloaded bytes do not hash to what the hub says; the file was deleted.
    #[error(
        "{phase}: {file}: the download does not match the hub's hash (expected {kind} {expected}, got {actual}); \
         the file was discarded and nothing was linked; pull again"
    )]
    HashMismatch {
        phase: Phase,
        file: String,
        kind: &'static str,
        expected: String,
        actual: String,
    },

    /// Not enough disk space; nothing half-written was left visible.
    #[error(
        "{phase}: disk full at {} ({}); partial data was removed and nothing in the cache is corrupt; free \
         some space (or point HF_HUB_CACHE elsewhere) and pull again",
        path.display(),
        space(*needed, *available)
    )]
    DiskFull {
        phase: Phase,
        path: PathBuf,
        /// Bytes the pull still had to write, when known before it started.
        needed: Option<u64>,
        available: u64,
    },

    /// The server answered something the hub protocol does not allow.
    #[error(
        "{phase}: {what}: unexpected answer from {endpoint}: {detail}; is HF_ENDPOINT a Hugging Face hub?"
    )]
    Protocol {
        phase: Phase,
        what: String,
        endpoint: String,
        detail: String,
    },

    /// A file-system error.
    #[error("{phase}: {}: {source}", path.display())]
    Io {
        phase: Phase,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A configuration problem (no home directory, a bad HF_ENDPOINT).
    #[error("{0}")]
    Config(String),
}

/// The store's result type.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// An I/O error at `path` in `phase`; ENOSPC becomes [`StoreError::DiskFull`].
    pub(crate) fn io(phase: Phase, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if is_disk_full(&source) {
            let available = fs4::available_space(path.parent().unwrap_or(&path)).unwrap_or(0);
            return StoreError::DiskFull {
                phase,
                path,
                needed: None,
                available,
            };
        }
        StoreError::Io {
            phase,
            path,
            source,
        }
    }

    /// Whether a later pull can pick up where this one stopped (the network
    /// failed part-way, or the server had a transient problem).
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Network { .. } => true,
            StoreError::Http { status, .. } => *status >= 500 || *status == 429 || *status == 408,
            _ => false,
        }
    }
}

fn space(needed: Option<u64>, available: u64) -> String {
    match needed {
        Some(n) => format!("{n} bytes to download, {available} available"),
        None => format!("the disk filled up while writing; {available} bytes available"),
    }
}

/// ENOSPC / EDQUOT.
pub(crate) fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(28) | Some(122))
}

/// The whole `source()` chain of an error, joined with ": ", with repeated
/// messages left out (reqwest nests hyper nests io).
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let msg = err.to_string();
        if !parts.iter().any(|p| p.contains(&msg)) {
            parts.push(msg);
        }
        cur = err.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_full_is_recognised() {
        let e = StoreError::io(
            Phase::Download,
            "/tmp/x",
            std::io::Error::from_raw_os_error(28),
        );
        assert!(matches!(e, StoreError::DiskFull { .. }), "{e}");
        assert!(e.to_string().contains("nothing in the cache is corrupt"));
    }

    #[test]
    fn messages_say_what_to_do() {
        let e = StoreError::Unauthorized {
            phase: Phase::Resolve,
            name: "org/m".into(),
            endpoint: "http://h".into(),
            status: 401,
            detail: String::new(),
            hint: "set HF_TOKEN",
        };
        assert!(e.to_string().contains("HF_TOKEN"));
        assert!(e.to_string().starts_with("resolve: "));
    }
}
