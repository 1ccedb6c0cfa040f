//! A model directory made on this machine (`grove import FILE.gguf ORG/NAME`)
//! added to the hub cache as a local snapshot, so Grove, mlx-lm and
//! huggingface_hub find it like a download: each file becomes a blob named by
//! its SHA-256, the snapshot's commit is a hash over the file names and
//! hashes, and `refs/REVISION` points at it.
use std::fs;
use std::path::{Path, PathBuf};

use sha1::{Digest, Sha1};

use super::cache::Store;
use super::error::{Phase, Result, StoreError};
use super::fetch::{HashKind, hash_file};
use super::name::ModelName;

impl Store {
    /// A fresh empty directory inside the cache root, on the same file system
    /// as the blobs, for a directory to be added with [`Store::add_snapshot`].
    pub fn staging_dir(&self) -> Result<PathBuf> {
        let dir = self
            .root()
            .join(format!(".grove-import-{}", super::snapshot::unique()));
        fs::create_dir_all(&dir).map_err(|e| StoreError::io(Phase::Link, &dir, e))?;
        Ok(dir)
    }

    /// Moves the files of `dir` (flat) into the cache as the snapshot of
    /// `name`, points its revision at it, and removes `dir`.
    pub fn add_snapshot(&self, name: &ModelName, dir: &Path) -> Result<PathBuf> {
        let io = |p: &Path, e| StoreError::io(Phase::Link, p, e);
        let mut files: Vec<(String, PathBuf)> = fs::read_dir(dir)
            .map_err(|e| io(dir, e))?
            .flatten()
            .filter(|e| e.path().is_file())
            .filter_map(|e| Some((e.file_name().to_str()?.to_owned(), e.path())))
            .collect();
        files.sort();
        let mut hashes = Vec::with_capacity(files.len());
        let mut commit = Sha1::new();
        for (file, path) in &files {
            let hash = hash_file(path, HashKind::Sha256).map_err(|e| io(path, e))?;
            commit.update(file.as_bytes());
            commit.update([0]);
            commit.update(hash.as_bytes());
            commit.update([b'\n']);
            hashes.push(hash);
        }
        let commit = hex::encode(commit.finalize());
        for ((file, path), hash) in files.iter().zip(&hashes) {
            let blob = self.blob_path(name, hash);
            let parent = blob.parent().unwrap_or(&blob);
            fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            if blob.is_file() {
                fs::remove_file(path).map_err(|e| io(path, e))?;
            } else {
                fs::rename(path, &blob).map_err(|e| io(&blob, e))?;
            }
            self.link(name, &commit, file, hash)?;
        }
        self.write_ref(name, &commit)?;
        let _ = fs::remove_dir_all(dir);
        Ok(self.snapshot_dir(name, &commit))
    }
}
