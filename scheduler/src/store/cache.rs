//! The Hugging Face hub cache, read and written exactly as `huggingface_hub`
//! does, so Grove, mlx-lm and `huggingface-cli` share one set of downloads:
//!
//! ```text
//! $HF_HUB_CACHE/
//!   .locks/models--ORG--NAME/ETAG.lock        one flock per blob
//!   models--ORG--NAME/
//!     blobs/ETAG                              file contents, named by SHA-256 (LFS) or git blob id
//!     blobs/ETAG.incomplete                   a download in progress (Grove's; resumable)
//!     refs/REVISION                           the commit a branch or tag was at when pulled
//!     snapshots/COMMIT/FILE -> ../../blobs/ETAG   relative symlinks
//! ```
//!
//! A blob appears only after its hash was checked, and a snapshot file only
//! links to a blob that exists, so a reader never sees a partial file.
use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::error::{Phase, Result, StoreError};
use super::name::{ModelName, ModelRef, is_commit_hash};
use super::snapshot::{
    linked_blobs, missing_files, prune_empty_dirs, safe_relative, snapshot_usage, symlink, unique,
};

/// The local model store: one hub cache directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// One snapshot in the store, as `grove list` shows it.
#[derive(Debug, Clone)]
pub struct LocalModel {
    /// The name to run it by: `ORG/NAME` for the snapshot `main` points at,
    /// else `ORG/NAME@REF` (its first ref), else `ORG/NAME@COMMIT`.
    pub name: ModelName,
    /// The snapshot's commit hash.
    pub commit: String,
    /// The refs (branches, tags) that point at this commit.
    pub refs: Vec<String>,
    /// Bytes of the distinct blobs the snapshot links to.
    pub size_bytes: u64,
    /// The newest blob's modification time (the snapshot's, if empty).
    pub modified: SystemTime,
    /// The snapshot directory, ready for `grove-runner --model`.
    pub path: PathBuf,
    /// Whether config, weights and tokenizer are all there.
    pub complete: bool,
}

/// What [`Store::remove`] deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoveReport {
    /// The repo and the revision asked for.
    pub name: ModelName,
    /// The snapshot's commit.
    pub commit: String,
    /// Blobs deleted (those no other snapshot links to).
    pub blobs_removed: usize,
    /// Their bytes.
    pub bytes_freed: u64,
    /// Whether the repo had no snapshot left and its folder went too.
    pub repo_removed: bool,
}

/// An exclusive `flock` on one blob's lock file, the same file
/// `huggingface_hub` locks; released on drop.
#[derive(Debug)]
pub(crate) struct BlobLock {
    _file: File,
}

/// `v` with a leading `~/` replaced by `HOME`.
fn expand_home(get: &dyn Fn(&str) -> Option<String>, v: &str) -> Result<PathBuf> {
    let Some(rest) = v.strip_prefix("~/") else {
        return Ok(PathBuf::from(v));
    };
    let home = get("HOME")
        .filter(|h| !h.is_empty())
        .ok_or_else(|| StoreError::Config("HOME is not set; set HF_HOME or HF_HUB_CACHE".into()))?;
    Ok(PathBuf::from(home).join(rest))
}

/// `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
pub(crate) fn hf_home(get: &dyn Fn(&str) -> Option<String>) -> Result<PathBuf> {
    if let Some(h) = get("HF_HOME").filter(|v| !v.is_empty()) {
        return expand_home(get, &h);
    }
    if let Some(x) = get("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Ok(expand_home(get, &x)?.join("huggingface"));
    }
    expand_home(get, "~/.cache/huggingface")
}

impl Store {
    /// The cache `huggingface_hub` would use: `HF_HUB_CACHE`, else
    /// `HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`, else
    /// `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
    /// Fails when none of those nor `HOME` is set.
    pub fn from_env() -> Result<Store> {
        Store::from_lookup(&|k| std::env::var(k).ok())
    }

    /// [`Store::from_env`] over any variable lookup (for tests).
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Store> {
        for var in ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"] {
            if let Some(v) = get(var).filter(|v| !v.is_empty()) {
                return Ok(Store::new(expand_home(get, &v)?));
            }
        }
        Ok(Store::new(hf_home(get)?.join("hub")))
    }

    /// A store at `root` (created on the first pull).
    pub fn new(root: impl Into<PathBuf>) -> Store {
        Store { root: root.into() }
    }

    /// The cache directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `models--ORG--NAME`.
    pub fn repo_dir(&self, name: &ModelName) -> PathBuf {
        self.root.join(name.folder_name())
    }

    pub(crate) fn blob_path(&self, name: &ModelName, etag: &str) -> PathBuf {
        self.repo_dir(name).join("blobs").join(etag)
    }

    pub(crate) fn snapshot_dir(&self, name: &ModelName, commit: &str) -> PathBuf {
        self.repo_dir(name).join("snapshots").join(commit)
    }

    /// The commit `name` stands for locally: its revision if that is a
    /// commit hash, else what `refs/REVISION` says. No network.
    pub fn local_commit(&self, name: &ModelName) -> Result<Option<String>> {
        let rev = name.revision_or_default();
        if is_commit_hash(rev) {
            return Ok(Some(rev.to_string()));
        }
        let path = self.repo_dir(name).join("refs").join(rev);
        match fs::read_to_string(&path) {
            Ok(s) if is_commit_hash(s.trim()) => Ok(Some(s.trim().to_string())),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => Ok(None),
            Err(e) => Err(StoreError::io(Phase::Cache, path, e)),
        }
    }

    /// The snapshot directory of `name`, which must be complete. No network.
    pub fn resolve(&self, name: &ModelName) -> Result<PathBuf> {
        let not_here = || StoreError::NotInStore {
            name: name.to_string(),
            root: self.root.clone(),
        };
        let commit = self.local_commit(name)?.ok_or_else(not_here)?;
        let dir = self.snapshot_dir(name, &commit);
        if !dir.is_dir() {
            return Err(not_here());
        }
        let missing = missing_files(&dir);
        if !missing.is_empty() {
            return Err(StoreError::Incomplete {
                name: name.to_string(),
                commit,
                missing: missing.join(", "),
            });
        }
        Ok(dir)
    }

    /// A model directory for a reference: a repo's snapshot, or a local
    /// directory that holds a model (ollama models are another store's).
    pub fn resolve_ref(&self, model: &ModelRef) -> Result<PathBuf> {
        match model {
            ModelRef::Repo(name) => self.resolve(name),
            ModelRef::Ollama(name) => Err(StoreError::InvalidName {
                name: name.to_string(),
                reason: "an ollama model is not in the Hugging Face cache".into(),
            }),
            ModelRef::Path(path) => {
                if !path.is_dir() {
                    return Err(StoreError::NotAModelDir {
                        path: path.clone(),
                        reason: "no such directory".into(),
                    });
                }
                let missing = missing_files(path);
                if !missing.is_empty() {
                    return Err(StoreError::NotAModelDir {
                        path: path.clone(),
                        reason: format!("missing {}", missing.join(", ")),
                    });
                }
                Ok(path.clone())
            }
        }
    }

    /// Every snapshot of every model repo, sorted by name.
    pub fn list(&self) -> Result<Vec<LocalModel>> {
        let mut out = Vec::new();
        let entries = match fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(StoreError::io(Phase::Cache, &self.root, e)),
        };
        for entry in entries.flatten() {
            let folder = entry.file_name();
            let Some(repo) = folder.to_str().and_then(ModelName::from_folder_name) else {
                continue;
            };
            let refs = self.refs(&repo);
            let Ok(snaps) = fs::read_dir(entry.path().join("snapshots")) else {
                continue;
            };
            for snap in snaps.flatten() {
                let Some(commit) = snap.file_name().to_str().map(str::to_string) else {
                    continue;
                };
                let path = snap.path();
                if !path.is_dir() {
                    continue;
                }
                let my_refs: Vec<String> = refs
                    .iter()
                    .filter(|(_, c)| **c == commit)
                    .map(|(r, _)| r.clone())
                    .collect();
                let rev = if my_refs.iter().any(|r| r == "main") {
                    None
                } else {
                    Some(my_refs.first().cloned().unwrap_or_else(|| commit.clone()))
                };
                let Ok(name) = repo.with_revision(rev.as_deref()) else {
                    continue;
                };
                let (size_bytes, newest) = snapshot_usage(&path);
                let modified = newest
                    .or_else(|| path.metadata().and_then(|m| m.modified()).ok())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                out.push(LocalModel {
                    name,
                    complete: missing_files(&path).is_empty(),
                    commit,
                    refs: my_refs,
                    size_bytes,
                    modified,
                    path,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name).then(a.commit.cmp(&b.commit)));
        Ok(out)
    }

    /// Every ref of a repo (`refs/main`, `refs/refs/pr/1`, ...) and its commit.
    fn refs(&self, name: &ModelName) -> BTreeMap<String, String> {
        let base = self.repo_dir(name).join("refs");
        let mut out = BTreeMap::new();
        let mut stack = vec![base.clone()];
        while let Some(dir) = stack.pop() {
            for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if let (Ok(rel), Ok(c)) = (p.strip_prefix(&base), fs::read_to_string(&p))
                    && is_commit_hash(c.trim())
                {
                    out.insert(rel.to_string_lossy().into_owned(), c.trim().to_string());
                }
            }
        }
        out
    }

    /// Removes the snapshot `name` resolves to, the refs pointing at it, and
    /// the blobs no other snapshot links to; the repo folder goes too when no
    /// snapshot is left. Blobs a running pull holds locked are kept.
    pub fn remove(&self, name: &ModelName) -> Result<RemoveReport> {
        let not_here = || StoreError::NotInStore {
            name: name.to_string(),
            root: self.root.clone(),
        };
        let commit = self.local_commit(name)?.ok_or_else(not_here)?;
        let repo = self.repo_dir(name);
        let snap = self.snapshot_dir(name, &commit);
        let io = |p: &Path, e| StoreError::io(Phase::Remove, p, e);
        // Refs to this commit go first, so no reader follows one into a
        // half-removed snapshot.
        let refs = self.refs(name);
        for (r, c) in &refs {
            if *c == commit {
                let p = repo.join("refs").join(r);
                fs::remove_file(&p).map_err(|e| io(&p, e))?;
            }
        }
        if !snap.is_dir() {
            return Err(not_here());
        }
        let mine = linked_blobs(&snap);
        fs::remove_dir_all(&snap).map_err(|e| io(&snap, e))?;
        let mut others = HashSet::new();
        for s in fs::read_dir(repo.join("snapshots"))
            .into_iter()
            .flatten()
            .flatten()
        {
            others.extend(linked_blobs(&s.path()));
        }
        let last = others.is_empty();
        let blobs = repo.join("blobs");
        let (mut blobs_removed, mut bytes_freed) = (0, 0);
        for entry in fs::read_dir(&blobs).into_iter().flatten().flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            let etag = file.split('.').next().unwrap_or_default().to_string();
            let partial = file.ends_with(".incomplete");
            let wanted = if partial {
                last
            } else {
                mine.contains(&file) && !others.contains(&file)
            };
            if !wanted {
                continue;
            }
            // A pull holding the lock is writing or linking this blob: keep it.
            let Ok(Some(_lock)) = self.try_lock_blob(name, &etag) else {
                continue;
            };
            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
            if fs::remove_file(entry.path()).is_ok() && !partial {
                blobs_removed += 1;
                bytes_freed += len;
            }
        }
        let mut repo_removed = false;
        if last {
            for sub in ["refs", ".no_exist", "trees"] {
                let _ = fs::remove_dir_all(repo.join(sub));
            }
            for sub in ["blobs", "snapshots"] {
                let _ = fs::remove_dir(repo.join(sub));
            }
            repo_removed = fs::remove_dir(&repo).is_ok();
            if repo_removed {
                let _ = fs::remove_dir_all(self.root.join(".locks").join(name.folder_name()));
            }
        } else {
            prune_empty_dirs(&repo.join("refs"));
        }
        Ok(RemoveReport {
            name: name.clone(),
            commit,
            blobs_removed,
            bytes_freed,
            repo_removed,
        })
    }

    /// Takes the blob's lock if free; `None` if another pull (Grove's or
    /// `huggingface_hub`'s) holds it.
    pub(crate) fn try_lock_blob(&self, name: &ModelName, etag: &str) -> Result<Option<BlobLock>> {
        use fs4::fs_std::FileExt;
        let dir = self.root.join(".locks").join(name.folder_name());
        fs::create_dir_all(&dir).map_err(|e| StoreError::io(Phase::Download, &dir, e))?;
        let path = dir.join(format!("{etag}.lock"));
        let mut opts = fs::OpenOptions::new();
        opts.create(true).truncate(false).write(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o664);
        let file = opts
            .open(&path)
            .map_err(|e| StoreError::io(Phase::Download, &path, e))?;
        match FileExt::try_lock_exclusive(&file) {
            Ok(true) => Ok(Some(BlobLock { _file: file })),
            Ok(false) => Ok(None),
            Err(e) => Err(StoreError::io(Phase::Download, &path, e)),
        }
    }

    /// Points `refs/REVISION` at `commit` (atomically; unchanged refs are not
    /// rewritten). A commit-hash revision needs no ref.
    pub(crate) fn write_ref(&self, name: &ModelName, commit: &str) -> Result<()> {
        let rev = name.revision_or_default();
        if is_commit_hash(rev) {
            return Ok(());
        }
        let path = self.repo_dir(name).join("refs").join(rev);
        if fs::read_to_string(&path).is_ok_and(|c| c.trim() == commit) {
            return Ok(());
        }
        let io = |p: &Path, e| StoreError::io(Phase::Link, p, e);
        let dir = path.parent().unwrap_or(&path);
        fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let tmp = dir.join(format!(".{}.grove-{}", unique(), std::process::id()));
        fs::write(&tmp, commit).map_err(|e| io(&tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| {
            let _ = fs::remove_file(&tmp);
            io(&path, e)
        })
    }

    /// Links `snapshots/COMMIT/FILE` to `../../blobs/ETAG` (a relative
    /// symlink, replaced atomically if it pointed elsewhere).
    pub(crate) fn link(
        &self,
        name: &ModelName,
        commit: &str,
        file: &str,
        etag: &str,
    ) -> Result<()> {
        let rel = safe_relative(file).ok_or_else(|| StoreError::Protocol {
            phase: Phase::Link,
            what: file.to_string(),
            endpoint: String::new(),
            detail: "unsafe file name".into(),
        })?;
        let pointer = self.snapshot_dir(name, commit).join(&rel);
        let depth = rel.components().count() + 1;
        let target: PathBuf = std::iter::repeat_n("..", depth)
            .collect::<PathBuf>()
            .join("blobs")
            .join(etag);
        if fs::read_link(&pointer).is_ok_and(|t| t == target) {
            return Ok(());
        }
        let io = |p: &Path, e| StoreError::io(Phase::Link, p, e);
        let dir = pointer.parent().unwrap_or(&pointer);
        fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let tmp = dir.join(format!(".{}.grove-{}", unique(), std::process::id()));
        symlink(&target, &tmp).map_err(|e| io(&tmp, e))?;
        fs::rename(&tmp, &pointer).map_err(|e| {
            let _ = fs::remove_file(&tmp);
            io(&pointer, e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn cache_root_follows_huggingface_hub() {
        let s = Store::from_lookup(&env(&[
            ("HF_HUB_CACHE", "/c"),
            ("HF_HOME", "/h"),
            ("HOME", "/u"),
        ]));
        assert_eq!(s.unwrap().root(), Path::new("/c"));
        let s = Store::from_lookup(&env(&[("HF_HOME", "/h"), ("HOME", "/u")])).unwrap();
        assert_eq!(s.root(), Path::new("/h/hub"));
        let s = Store::from_lookup(&env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/u")])).unwrap();
        assert_eq!(s.root(), Path::new("/x/huggingface/hub"));
        let s = Store::from_lookup(&env(&[("HOME", "/u")])).unwrap();
        assert_eq!(s.root(), Path::new("/u/.cache/huggingface/hub"));
        let s = Store::from_lookup(&env(&[("HF_HOME", "~/hf"), ("HOME", "/u")])).unwrap();
        assert_eq!(s.root(), Path::new("/u/hf/hub"));
        assert!(Store::from_lookup(&env(&[])).is_err());
    }

    #[test]
    fn link_ref_resolve_list_remove() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let name = ModelName::parse("org/m").unwrap();
        let (c1, c2) = ("1".repeat(40), "2".repeat(40));
        let blobs = store.repo_dir(&name).join("blobs");
        fs::create_dir_all(&blobs).unwrap();
        for (etag, body) in [
            ("a", "{}"),
            ("b", "tok"),
            ("w", "weights"),
            ("w2", "weights2"),
        ] {
            fs::write(blobs.join(etag), body).unwrap();
        }
        for (f, e) in [
            ("config.json", "a"),
            ("tokenizer.json", "b"),
            ("model.safetensors", "w"),
        ] {
            store.link(&name, &c1, f, e).unwrap();
            store
                .link(&name, &c2, f, if e == "w" { "w2" } else { e })
                .unwrap();
        }
        let link = fs::read_link(store.snapshot_dir(&name, &c1).join("config.json")).unwrap();
        assert_eq!(link, Path::new("../../blobs/a"));
        store.link(&name, &c1, "sub/x.json", "a").unwrap();
        let link = fs::read_link(store.snapshot_dir(&name, &c1).join("sub/x.json")).unwrap();
        assert_eq!(link, Path::new("../../../blobs/a"));
        assert!(store.link(&name, &c1, "../evil", "a").is_err());

        assert!(matches!(
            store.resolve(&name),
            Err(StoreError::NotInStore { .. })
        ));
        store.write_ref(&name, &c1).unwrap();
        let v1 = name.with_revision(Some("v1")).unwrap();
        store.write_ref(&v1, &c2).unwrap();
        assert_eq!(
            store.resolve(&name).unwrap(),
            store.snapshot_dir(&name, &c1)
        );
        assert_eq!(store.resolve(&v1).unwrap(), store.snapshot_dir(&name, &c2));

        let list = store.list().unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].name.to_string(), "org/m");
        assert_eq!(list[0].size_bytes, 2 + 3 + 7);
        assert_eq!(list[1].name.to_string(), "org/m@v1");
        assert!(list.iter().all(|m| m.complete));

        let r = store.remove(&name).unwrap();
        assert_eq!(
            (r.blobs_removed, r.bytes_freed, r.repo_removed),
            (1, 7, false)
        );
        assert!(blobs.join("a").exists() && !blobs.join("w").exists());
        assert!(store.resolve(&name).is_err());
        assert!(store.resolve(&v1).is_ok());
        fs::write(blobs.join("zz.incomplete"), "part").unwrap();
        let r = store.remove(&v1).unwrap();
        assert_eq!((r.blobs_removed, r.repo_removed), (3, true));
        assert!(!store.repo_dir(&name).exists());
        assert!(store.list().unwrap().is_empty());
    }
}
