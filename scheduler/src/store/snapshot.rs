//! Looking inside snapshot directories: what a runner needs and what is
//! missing, which blobs a snapshot links to, how big it is; and the small
//! file-system helpers the cache uses to change it atomically.
use std::collections::HashSet;
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

#[cfg(unix)]
pub(crate) fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
pub(crate) fn symlink(_target: &Path, _link: &Path) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "the hub cache layout needs symlinks",
    ))
}

/// A process-wide unique suffix for temporary names.
pub(crate) fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{nanos:x}{:x}", N.fetch_add(1, Ordering::Relaxed))
}

/// `file` as a relative path of normal components only (no `..`, no root).
pub(crate) fn safe_relative(file: &str) -> Option<PathBuf> {
    if file.is_empty() || file.contains('\\') || file.contains('\0') {
        return None;
    }
    let p = PathBuf::from(file);
    p.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then_some(p)
}

/// What a runner needs and `dir` lacks: `config.json`, `tokenizer.json`, and
/// the weights (every shard the index names, else some `*.safetensors`).
pub fn missing_files(dir: &Path) -> Vec<String> {
    let mut missing: Vec<String> = ["config.json", "tokenizer.json"]
        .iter()
        .filter(|f| !dir.join(f).is_file())
        .map(|f| f.to_string())
        .collect();
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        match index_shards(&index) {
            Some(shards) => missing.extend(
                shards
                    .into_iter()
                    .filter(|s| safe_relative(s).is_none_or(|rel| !dir.join(rel).is_file())),
            ),
            None => missing.push("a readable model.safetensors.index.json".into()),
        }
    } else {
        let any = fs::read_dir(dir).into_iter().flatten().flatten().any(|e| {
            e.file_name().to_string_lossy().ends_with(".safetensors") && e.path().is_file()
        });
        if !any {
            missing.push("*.safetensors".into());
        }
    }
    missing
}

/// The distinct shard files a safetensors index's `weight_map` names.
pub(crate) fn index_shards(index: &Path) -> Option<Vec<String>> {
    let v: serde_json::Value = serde_json::from_slice(&fs::read(index).ok()?).ok()?;
    let map = v.get("weight_map")?.as_object()?;
    let mut shards: Vec<String> = map
        .values()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect();
    shards.sort();
    shards.dedup();
    Some(shards)
}

/// Blob file names the snapshot's symlinks point at.
pub(crate) fn linked_blobs(snapshot: &Path) -> HashSet<String> {
    let mut out = HashSet::new();
    let mut stack = vec![snapshot.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            match fs::read_link(&p) {
                Ok(t) => {
                    if let Some(f) = t.file_name() {
                        out.insert(f.to_string_lossy().into_owned());
                    }
                }
                Err(_) if p.is_dir() => stack.push(p),
                Err(_) => {}
            }
        }
    }
    out
}

/// Bytes of the distinct files a snapshot reaches, and the newest mtime.
pub(crate) fn snapshot_usage(snapshot: &Path) -> (u64, Option<SystemTime>) {
    let mut seen = HashSet::new();
    let (mut size, mut newest) = (0u64, None::<SystemTime>);
    let mut stack = vec![snapshot.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            let Ok(meta) = fs::metadata(&p) else { continue };
            if meta.is_dir() {
                stack.push(p);
                continue;
            }
            let key = fs::canonicalize(&p).unwrap_or(p);
            if seen.insert(key) {
                size += meta.len();
                if let Ok(m) = meta.modified() {
                    newest = Some(newest.map_or(m, |n| n.max(m)));
                }
            }
        }
    }
    (size, newest)
}

/// Removes empty directories under `dir` (not `dir` itself).
pub(crate) fn prune_empty_dirs(dir: &Path) {
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() && fs::read_link(&p).is_err() {
            prune_empty_dirs(&p);
            let _ = fs::remove_dir(&p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::cache::Store;
    use crate::store::name::ModelRef;

    #[test]
    fn incomplete_snapshots_say_what_is_missing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs::write(dir.join("config.json"), "{}").unwrap();
        fs::write(
            dir.join("model.safetensors.index.json"),
            r#"{"weight_map":{"a":"model-1.safetensors","b":"model-2.safetensors"}}"#,
        )
        .unwrap();
        fs::write(dir.join("model-1.safetensors"), "x").unwrap();
        assert_eq!(
            missing_files(dir),
            ["tokenizer.json", "model-2.safetensors"]
        );
        let store = Store::new(dir.join("cache"));
        let e = store
            .resolve_ref(&ModelRef::Path(dir.to_path_buf()))
            .unwrap_err();
        assert!(e.to_string().contains("model-2.safetensors"), "{e}");
    }
}
