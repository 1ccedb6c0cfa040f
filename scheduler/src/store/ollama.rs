//! Models pulled by ollama, read in place and never changed.
//!
//! ollama keeps `OLLAMA_MODELS` (default `~/.ollama/models`) as
//! `manifests/HOST/NAMESPACE/MODEL/TAG` (a JSON image manifest) and
//! `blobs/sha256-HEX`. The manifest's layer of media type
//! `application/vnd.ollama.image.model` is the GGUF file. Grove names such a
//! model `ollama:MODEL:TAG` (library models, `registry.ollama.ai/library`),
//! `ollama:NAMESPACE/MODEL:TAG` or `ollama:HOST/NAMESPACE/MODEL:TAG`, as
//! ollama itself shortens them; the tag defaults to `latest`.
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Deserialize;

/// The prefix that marks an ollama model name.
pub const PREFIX: &str = "ollama:";
const DEFAULT_HOST: &str = "registry.ollama.ai";
const DEFAULT_NAMESPACE: &str = "library";
const MODEL_LAYER: &str = "application/vnd.ollama.image.model";
/// Manifests are small JSON documents; larger ones are refused unread.
const MAX_MANIFEST: u64 = 1 << 20;

/// Why an ollama model cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OllamaError {
    #[error("{name:?} is not an ollama model name: {reason}")]
    InvalidName { name: String, reason: String },
    #[error("ollama model {name} is not in {root} (pull it with `ollama pull`)")]
    NotFound { name: String, root: PathBuf },
    #[error("ollama model {name}: {path}: {reason}")]
    Manifest {
        name: String,
        path: PathBuf,
        reason: String,
    },
}

/// A parsed `HOST/NAMESPACE/MODEL:TAG`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct OllamaName {
    pub host: String,
    pub namespace: String,
    pub model: String,
    pub tag: String,
}

fn valid_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

impl OllamaName {
    /// Parses what follows `ollama:`.
    pub fn parse(s: &str) -> Result<Self, OllamaError> {
        let bad = |reason: &str| OllamaError::InvalidName {
            name: s.to_owned(),
            reason: reason.to_owned(),
        };
        let (path, tag) = match s.rsplit_once(':') {
            Some((p, t)) => (p, t),
            None => (s, "latest"),
        };
        let parts: Vec<&str> = path.split('/').collect();
        let (host, namespace, model) = match parts[..] {
            [m] => (DEFAULT_HOST, DEFAULT_NAMESPACE, m),
            [n, m] => (DEFAULT_HOST, n, m),
            [h, n, m] => (h, n, m),
            _ => return Err(bad("expected [HOST/][NAMESPACE/]MODEL[:TAG]")),
        };
        for part in [host, namespace, model, tag] {
            if !valid_part(part) {
                return Err(bad(
                    "each part must be letters, digits, '.', '-' or '_' (not '.' or '..')",
                ));
            }
        }
        Ok(Self {
            host: host.to_owned(),
            namespace: namespace.to_owned(),
            model: model.to_owned(),
            tag: tag.to_owned(),
        })
    }

    fn manifest_rel(&self) -> PathBuf {
        [&self.host, &self.namespace, &self.model, &self.tag]
            .iter()
            .collect()
    }
}

impl std::fmt::Display for OllamaName {
    /// `ollama:` plus the shortest name ollama would show.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(PREFIX)?;
        if self.host != DEFAULT_HOST {
            write!(f, "{}/{}/", self.host, self.namespace)?;
        } else if self.namespace != DEFAULT_NAMESPACE {
            write!(f, "{}/", self.namespace)?;
        }
        write!(f, "{}:{}", self.model, self.tag)
    }
}

#[derive(Deserialize)]
struct Manifest {
    #[serde(default)]
    layers: Vec<Layer>,
}

#[derive(Deserialize)]
struct Layer {
    #[serde(rename = "mediaType")]
    media_type: String,
    digest: String,
    #[serde(default)]
    size: u64,
}

/// One ollama model as `grove list` shows it.
#[derive(Debug, Clone)]
pub struct OllamaModel {
    pub name: OllamaName,
    /// The GGUF blob.
    pub path: PathBuf,
    /// `sha256:...` of the GGUF layer.
    pub digest: String,
    pub size_bytes: u64,
    pub modified: SystemTime,
}

/// ollama's model directory, read-only.
#[derive(Debug, Clone)]
pub struct OllamaStore {
    root: PathBuf,
}

impl OllamaStore {
    /// `OLLAMA_MODELS`, else `~/.ollama/models` (None without a HOME).
    pub fn from_env() -> Option<Self> {
        Self::from_lookup(&|k| std::env::var(k).ok())
    }

    /// As [`OllamaStore::from_env`] over any variable lookup.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Option<Self> {
        match get("OLLAMA_MODELS").filter(|v| !v.is_empty()) {
            Some(dir) => Some(Self::new(dir)),
            None => get("HOME").map(|h| Self::new(Path::new(&h).join(".ollama/models"))),
        }
    }

    /// A store rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The GGUF blob of `name`.
    pub fn resolve(&self, name: &OllamaName) -> Result<OllamaModel, OllamaError> {
        let path = self.root.join("manifests").join(name.manifest_rel());
        if !path.is_file() {
            return Err(OllamaError::NotFound {
                name: name.to_string(),
                root: self.root.clone(),
            });
        }
        self.read(name.clone(), &path)
    }

    fn read(&self, name: OllamaName, path: &Path) -> Result<OllamaModel, OllamaError> {
        let fail = |reason: String| OllamaError::Manifest {
            name: name.to_string(),
            path: path.to_owned(),
            reason,
        };
        let file = fs::File::open(path).map_err(|e| fail(e.to_string()))?;
        let mut text = String::new();
        file.take(MAX_MANIFEST + 1)
            .read_to_string(&mut text)
            .map_err(|e| fail(e.to_string()))?;
        if text.len() as u64 > MAX_MANIFEST {
            return Err(fail(format!("larger than {MAX_MANIFEST} bytes")));
        }
        let manifest: Manifest =
            serde_json::from_str(&text).map_err(|e| fail(format!("not a manifest: {e}")))?;
        let layer = manifest
            .layers
            .iter()
            .find(|l| l.media_type == MODEL_LAYER)
            .ok_or_else(|| fail(format!("no {MODEL_LAYER} layer")))?;
        let hex = layer
            .digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| fail(format!("bad digest {:?}", layer.digest)))?;
        let blob = self.root.join("blobs").join(format!("sha256-{hex}"));
        let meta =
            fs::metadata(&blob).map_err(|e| fail(format!("blob {}: {e}", blob.display())))?;
        if layer.size != 0 && meta.len() != layer.size {
            return Err(fail(format!(
                "blob {} has {} bytes, the manifest says {}",
                blob.display(),
                meta.len(),
                layer.size
            )));
        }
        Ok(OllamaModel {
            name,
            path: blob,
            digest: layer.digest.clone(),
            size_bytes: meta.len(),
            modified: fs::metadata(path)
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH),
        })
    }

    /// Every model whose manifest names a GGUF blob that is present; others
    /// (partial pulls, unreadable manifests) are skipped.
    pub fn list(&self) -> Vec<OllamaModel> {
        let base = self.root.join("manifests");
        let mut out = Vec::new();
        let dirs = |p: &Path| -> Vec<(String, PathBuf)> {
            let mut v: Vec<(String, PathBuf)> = fs::read_dir(p)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| Some((e.file_name().to_str()?.to_owned(), e.path())))
                .collect();
            v.sort();
            v
        };
        for (host, h) in dirs(&base) {
            for (namespace, n) in dirs(&h) {
                for (model, m) in dirs(&n) {
                    for (tag, t) in dirs(&m) {
                        if !t.is_file() {
                            continue;
                        }
                        let name = OllamaName {
                            host: host.clone(),
                            namespace: namespace.clone(),
                            model: model.clone(),
                            tag,
                        };
                        if [&name.host, &name.namespace, &name.model, &name.tag]
                            .iter()
                            .all(|p| valid_part(p))
                            && let Ok(found) = self.read(name, &t)
                        {
                            out.push(found);
                        }
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_as_ollama_shows_them() {
        let n = OllamaName::parse("llama3.2").unwrap();
        assert_eq!(
            (n.host.as_str(), n.namespace.as_str(), n.tag.as_str()),
            ("registry.ollama.ai", "library", "latest")
        );
        assert_eq!(n.to_string(), "ollama:llama3.2:latest");
        let n = OllamaName::parse("me/tiny:q4").unwrap();
        assert_eq!(n.to_string(), "ollama:me/tiny:q4");
        let n = OllamaName::parse("hf.co/org/model:Q8_0").unwrap();
        assert_eq!(n.to_string(), "ollama:hf.co/org/model:Q8_0");
        for bad in ["", "../x", "a/../b", "a/b/c/d", "x:", "x y", "/x"] {
            assert!(OllamaName::parse(bad).is_err(), "{bad:?}");
        }
    }
}
