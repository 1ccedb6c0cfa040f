//! Model names: `ORG/NAME[@REVISION]` with the Hugging Face hub's rules, a
//! local directory or GGUF file path, or an ollama model (`ollama:NAME:TAG`).
//!
//! Parsing never touches the file system, so a name such as `../../etc` or
//! `org/name@../../x` is rejected before any path is built from it. A local
//! path is told apart by its spelling alone: it starts with `/`, `./`,
//! `../` or `~/` (or is `.`, `..`, `~`), or it ends in `.gguf`. So `org/name`
//! always means the hub repo, and `./org/name` the directory.
use std::fmt;
use std::path::PathBuf;

use super::error::{Result, StoreError};

/// The revision used when a name has none.
pub const DEFAULT_REVISION: &str = "main";

/// A hub model: a repo id and an optional revision (branch, tag or commit).
/// Always valid: the only ways to make one check the hub's rules.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelName {
    repo: String,
    revision: Option<String>,
}

/// What a user may name a model by: a hub repo or a local directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// `ORG/NAME[@REVISION]`.
    Repo(ModelName),
    /// A directory holding `config.json`, safetensors and a tokenizer, or a
    /// GGUF file.
    Path(PathBuf),
    /// A model in ollama's store, read in place.
    Ollama(super::ollama::OllamaName),
}

impl ModelRef {
    /// Parses a model reference; see the module docs for how a path is told
    /// apart. `~` is expanded from `HOME`.
    pub fn parse(s: &str) -> Result<ModelRef> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix(super::ollama::PREFIX) {
            return super::ollama::OllamaName::parse(rest)
                .map(ModelRef::Ollama)
                .map_err(|e| StoreError::InvalidName {
                    name: s.to_string(),
                    reason: e.to_string(),
                });
        }
        if looks_like_path(s) {
            let path = match s.strip_prefix('~') {
                Some(rest) => {
                    let home = std::env::var_os("HOME").ok_or_else(|| StoreError::InvalidName {
                        name: s.to_string(),
                        reason: "~ needs HOME to be set".into(),
                    })?;
                    PathBuf::from(home).join(rest.trim_start_matches('/'))
                }
                None => PathBuf::from(s),
            };
            return Ok(ModelRef::Path(path));
        }
        ModelName::parse(s).map(ModelRef::Repo)
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelRef::Repo(n) => n.fmt(f),
            ModelRef::Path(p) => p.display().fmt(f),
            ModelRef::Ollama(n) => n.fmt(f),
        }
    }
}

fn looks_like_path(s: &str) -> bool {
    matches!(s, "." | ".." | "~")
        || ["/", "./", "../", "~/"].iter().any(|p| s.starts_with(p))
        || s.to_ascii_lowercase().ends_with(".gguf")
}

impl ModelName {
    /// Parses `ORG/NAME[@REVISION]` (or the hub's legacy `NAME`).
    pub fn parse(s: &str) -> Result<ModelName> {
        let bad = |reason: &str| StoreError::InvalidName {
            name: s.to_string(),
            reason: reason.to_string(),
        };
        if s.is_empty() {
            return Err(bad("empty"));
        }
        let (repo, revision) = match s.split_once('@') {
            Some((r, rev)) => (r, Some(rev)),
            None => (s, None),
        };
        ModelName::new(repo, revision).map_err(|e| match e {
            StoreError::InvalidName { reason, .. } => bad(&reason),
            other => other,
        })
    }

    /// A name from its parts, checked like [`ModelName::parse`].
    pub fn new(repo: &str, revision: Option<&str>) -> Result<ModelName> {
        validate_repo(repo).map_err(|reason| StoreError::InvalidName {
            name: repo.to_string(),
            reason,
        })?;
        if let Some(rev) = revision {
            validate_revision(rev).map_err(|reason| StoreError::InvalidName {
                name: format!("{repo}@{rev}"),
                reason,
            })?;
        }
        Ok(ModelName {
            repo: repo.to_string(),
            revision: revision.map(str::to_string),
        })
    }

    /// The repo id, `ORG/NAME`.
    pub fn repo(&self) -> &str {
        &self.repo
    }

    /// The revision as written, if any.
    pub fn revision(&self) -> Option<&str> {
        self.revision.as_deref()
    }

    /// The revision, `main` when none was given.
    pub fn revision_or_default(&self) -> &str {
        self.revision.as_deref().unwrap_or(DEFAULT_REVISION)
    }

    /// The same repo at another revision.
    pub fn with_revision(&self, revision: Option<&str>) -> Result<ModelName> {
        ModelName::new(&self.repo, revision)
    }

    /// The repo's folder in the hub cache: `models--ORG--NAME`.
    pub fn folder_name(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }

    /// The repo named by a cache folder (`models--ORG--NAME`), if it is one.
    pub fn from_folder_name(folder: &str) -> Option<ModelName> {
        let rest = folder.strip_prefix("models--")?;
        let repo = rest.replacen("--", "/", 1);
        ModelName::new(&repo, None).ok()
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.revision {
            Some(rev) => write!(f, "{}@{}", self.repo, rev),
            None => f.write_str(&self.repo),
        }
    }
}

impl std::str::FromStr for ModelName {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<ModelName> {
        ModelName::parse(s)
    }
}

/// Whether `s` is a full commit hash (40 lowercase hex digits).
pub fn is_commit_hash(s: &str) -> bool {
    s.len() == 40
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// huggingface_hub's `validate_repo_id`: `NAME` or `ORG/NAME`, each part
/// 1-96 of `[A-Za-z0-9_.-]`, starting and ending with `[A-Za-z0-9_]`; no
/// `--`, no `..`, no trailing `.git`.
fn validate_repo(repo: &str) -> std::result::Result<(), String> {
    if repo.is_empty() {
        return Err("the repo id is empty".into());
    }
    let parts: Vec<&str> = repo.split('/').collect();
    if parts.len() > 2 {
        return Err("a repo id is ORG/NAME: at most one '/'".into());
    }
    for part in &parts {
        if part.is_empty() || part.len() > 96 {
            return Err("each part of a repo id has 1 to 96 characters".into());
        }
        if let Some(c) = part
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(format!(
                "{c:?} is not allowed (letters, digits, '-', '_', '.')"
            ));
        }
        let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if !word(part.chars().next()) || !word(part.chars().last()) {
            return Err("a part may not start or end with '-' or '.'".into());
        }
    }
    if repo.contains("--") || repo.contains("..") {
        return Err("'--' and '..' are not allowed".into());
    }
    if repo.ends_with(".git") {
        return Err("a repo id may not end with .git".into());
    }
    Ok(())
}

/// A branch, tag (git ref-name rules, restricted to `[A-Za-z0-9._/-]`) or
/// commit: safe to use as a path under `refs/`.
fn validate_revision(rev: &str) -> std::result::Result<(), String> {
    if rev.is_empty() || rev.len() > 255 {
        return Err("the revision after '@' has 1 to 255 characters".into());
    }
    if let Some(c) = rev
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')))
    {
        return Err(format!(
            "{c:?} is not allowed in a revision (letters, digits, '-', '_', '.', '/')"
        ));
    }
    for comp in rev.split('/') {
        if comp.is_empty() {
            return Err("a revision may not start or end with '/' nor contain '//'".into());
        }
        if comp.starts_with('.') || comp.ends_with(".lock") || comp.ends_with('.') {
            return Err("a revision part may not start with '.' or end with '.' or '.lock'".into());
        }
    }
    if rev.contains("..") {
        return Err("'..' is not allowed in a revision".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names() {
        let n = ModelName::parse("mlx-community/Qwen3-0.6B-4bit").unwrap();
        assert_eq!(n.repo(), "mlx-community/Qwen3-0.6B-4bit");
        assert_eq!(n.revision(), None);
        assert_eq!(n.revision_or_default(), "main");
        assert_eq!(n.folder_name(), "models--mlx-community--Qwen3-0.6B-4bit");
        let n = ModelName::parse("org/m@refs/pr/1").unwrap();
        assert_eq!(n.revision(), Some("refs/pr/1"));
        assert_eq!(n.to_string(), "org/m@refs/pr/1");
        let c = "0123456789abcdef0123456789abcdef01234567";
        let n = ModelName::parse(&format!("org/m@{c}")).unwrap();
        assert!(is_commit_hash(n.revision().unwrap()));
        assert_eq!(
            ModelName::parse("gpt2").unwrap().folder_name(),
            "models--gpt2"
        );
        assert_eq!(
            ModelName::from_folder_name("models--org--m.x")
                .unwrap()
                .repo(),
            "org/m.x"
        );
        assert!(ModelName::from_folder_name("datasets--org--m").is_none());
    }

    #[test]
    fn rejects_bad_names() {
        for bad in [
            "",
            "org/../x",
            "../x/y",
            "org/..",
            "a/b/c",
            "org//m",
            "/etc/passwd",
            "org/m.git",
            "org/-m",
            "org/m-",
            ".org/m",
            "org--x/m",
            "org/m x",
            "org/m\0",
            "orgé/m",
            "org/m@",
            "org/m@../../x",
            "org/m@/abs",
            "org/m@a//b",
            "org/m@a/",
            "org/m@.hidden",
            "org/m@x.lock",
            "org/m@a b",
            "org/m@a@b",
            "org/m@a\\b",
        ] {
            let e = ModelName::parse(bad).expect_err(bad);
            assert!(matches!(e, StoreError::InvalidName { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("ORG/NAME"), "{e}");
        }
        let long = format!("org/{}", "a".repeat(97));
        assert!(ModelName::parse(&long).is_err());
    }

    #[test]
    fn paths_are_told_apart_by_spelling() {
        assert_eq!(
            ModelRef::parse("./models/x").unwrap(),
            ModelRef::Path(PathBuf::from("./models/x"))
        );
        assert_eq!(
            ModelRef::parse("/abs/dir").unwrap(),
            ModelRef::Path(PathBuf::from("/abs/dir"))
        );
        assert!(matches!(
            ModelRef::parse("../x").unwrap(),
            ModelRef::Path(_)
        ));
        assert!(matches!(
            ModelRef::parse("org/m@v1").unwrap(),
            ModelRef::Repo(_)
        ));
        assert!(ModelRef::parse("org/../../etc").is_err());
        if std::env::var_os("HOME").is_some() {
            let ModelRef::Path(p) = ModelRef::parse("~/m").unwrap() else {
                panic!("not a path")
            };
            assert!(p.is_absolute() && p.ends_with("m"));
        }
    }
}
