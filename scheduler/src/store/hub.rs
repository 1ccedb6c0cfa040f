//! The hub's HTTP protocol, as `huggingface_hub` speaks it:
//!
//! - `GET {endpoint}/api/models/{repo}/revision/{rev}`: the commit a revision
//!   is at (`sha`) and its files (`siblings[].rfilename`);
//! - `HEAD {endpoint}/{repo}/resolve/{commit}/{file}`: `X-Repo-Commit`, the
//!   blob id (`X-Linked-Etag`, else `ETag`: the SHA-256 of an LFS file, the
//!   git blob id of a small one) and size (`X-Linked-Size`, else
//!   `Content-Length`). Redirects on the hub's own origin (a renamed repo) are
//!   followed; one to another origin (the CDN) ends the walk, and its
//!   `Location` is where the bytes are;
//! - `GET` on that location, with `Range: bytes=N-` to resume.
//!
//! The token goes only to the endpoint's origin, never to a CDN, and is
//! never printed: [`HubToken`]'s `Debug` hides it and errors carry URLs only.
use std::time::Duration;

use reqwest::header::{self, HeaderMap, HeaderValue};
use reqwest::{Method, Response, StatusCode, Url};

use super::cache::hf_home;
use super::error::{Phase, Result, StoreError, chain};
use super::name::{ModelName, is_commit_hash};

/// The hub's default endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// A bearer token for the hub. `Debug` shows `HubToken(***)`.
#[derive(Clone, PartialEq, Eq)]
pub struct HubToken(String);

impl HubToken {
    /// A token, or `None` when blank.
    pub fn new(s: &str) -> Option<HubToken> {
        let t = s.trim();
        (!t.is_empty()).then(|| HubToken(t.to_string()))
    }

    /// `HF_TOKEN` (or the legacy `HUGGING_FACE_HUB_TOKEN`), else the token
    /// file (`HF_TOKEN_PATH`, else `$HF_HOME/token`), as `huggingface_hub`.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Option<HubToken> {
        for var in ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"] {
            if let Some(t) = get(var).as_deref().and_then(HubToken::new) {
                return Some(t);
            }
        }
        let path = match get("HF_TOKEN_PATH").filter(|p| !p.is_empty()) {
            Some(p) => p.into(),
            None => hf_home(get).ok()?.join("token"),
        };
        std::fs::read_to_string(path)
            .ok()
            .as_deref()
            .and_then(HubToken::new)
    }
}

impl HubToken {
    /// The token itself, to hand to the daemon that sends it (never to print).
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for HubToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HubToken(***)")
    }
}

/// A revision's commit and files.
#[derive(Debug, Clone)]
pub struct RepoInfo {
    /// The commit hash the revision is at.
    pub commit: String,
    /// Every file path in the repo at that commit.
    pub files: Vec<String>,
}

/// What `HEAD .../resolve/...` says about one file.
#[derive(Debug, Clone)]
pub struct FileMeta {
    /// The blob id: a SHA-256 (LFS) or git blob SHA-1, unquoted.
    pub etag: String,
    /// The file's size, when the hub says.
    pub size: Option<u64>,
    /// `X-Repo-Commit`.
    pub commit: Option<String>,
    /// Where to `GET` the bytes (the CDN, or the resolve URL itself).
    pub location: Url,
}

/// An HTTP client for one hub endpoint.
#[derive(Debug, Clone)]
pub struct HubClient {
    endpoint: Url,
    token: Option<HubToken>,
    http: reqwest::Client,
}

const MAX_REDIRECTS: usize = 10;

/// A hub endpoint as a URL: `http://` or `https://` with a host, no
/// trailing slash.
pub fn endpoint_url(endpoint: &str) -> Result<Url> {
    let bad = |d: String| StoreError::Config(format!("HF_ENDPOINT {endpoint:?}: {d}"));
    let mut url = Url::parse(endpoint.trim_end_matches('/')).map_err(|e| bad(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(bad("must be an http:// or https:// URL".into()));
    }
    if let Ok(mut segs) = url.path_segments_mut() {
        segs.pop_if_empty();
    }
    Ok(url)
}

impl HubClient {
    /// A client for `endpoint` (`http://` or `https://`).
    pub fn new(endpoint: &str, token: Option<HubToken>) -> Result<HubClient> {
        let url = endpoint_url(endpoint)?;
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(60))
            .user_agent(concat!("grove/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| StoreError::Config(format!("HTTP client: {}", chain(&e))))?;
        Ok(HubClient {
            endpoint: url,
            token,
            http,
        })
    }

    /// The endpoint, for messages.
    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str().trim_end_matches('/')
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.endpoint.clone();
        if let Ok(mut segs) = url.path_segments_mut() {
            segs.pop_if_empty();
            for s in segments {
                segs.push(s);
            }
        }
        url
    }

    /// The revision's commit and file list.
    pub async fn repo_info(&self, name: &ModelName) -> Result<RepoInfo> {
        let (org_name, rev) = (name.repo(), name.revision_or_default());
        let mut segs = vec!["api", "models"];
        segs.extend(org_name.split('/'));
        segs.extend(["revision", rev]);
        let url = self.url(&segs);
        let what = format!("{} at {rev}", name.repo());
        let resp = self
            .request(Method::GET, url, 0, Phase::Resolve, name, &what)
            .await?;
        let body = resp
            .bytes()
            .await
            .map_err(|e| self.net(Phase::Resolve, &what, &e))?;
        let proto = |detail: String| StoreError::Protocol {
            phase: Phase::Resolve,
            what: what.clone(),
            endpoint: self.endpoint().to_string(),
            detail,
        };
        let v: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| proto(format!("not JSON: {e}")))?;
        let commit = v
            .get("sha")
            .and_then(|s| s.as_str())
            .filter(|s| is_commit_hash(s))
            .ok_or_else(|| proto("no commit hash (`sha`)".into()))?
            .to_string();
        let files = v
            .get("siblings")
            .and_then(|s| s.as_array())
            .ok_or_else(|| proto("no file list (`siblings`)".into()))?
            .iter()
            .filter_map(|f| f.get("rfilename")?.as_str().map(str::to_string))
            .collect();
        Ok(RepoInfo { commit, files })
    }

    /// `HEAD` on a file at a commit: its blob id, size and location.
    pub async fn file_meta(&self, name: &ModelName, commit: &str, file: &str) -> Result<FileMeta> {
        let mut segs: Vec<&str> = name.repo().split('/').collect();
        segs.extend(["resolve", commit]);
        segs.extend(file.split('/'));
        let url = self.url(&segs);
        let what = format!("{}/{file}", name.repo());
        let resp = self
            .request(Method::HEAD, url, 0, Phase::Metadata, name, &what)
            .await?;
        let h = resp.headers();
        let get = |k: &str| h.get(k).and_then(|v| v.to_str().ok()).map(str::trim);
        let proto = |detail: &str| StoreError::Protocol {
            phase: Phase::Metadata,
            what: what.clone(),
            endpoint: self.endpoint().to_string(),
            detail: detail.to_string(),
        };
        let redirect = resp.status().is_redirection();
        let etag = get("x-linked-etag")
            .or_else(|| get("etag"))
            .map(|e| e.trim_start_matches("W/").trim_matches('"').to_string())
            .ok_or_else(|| proto("no ETag"))?;
        if etag.is_empty()
            || etag.len() > 128
            || !etag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(proto("an ETag that is not a blob id"));
        }
        let size = get("x-linked-size")
            .or_else(|| {
                if redirect {
                    None
                } else {
                    get("content-length")
                }
            })
            .and_then(|s| s.parse().ok());
        let location = match (redirect, get("location")) {
            (true, Some(loc)) => resp.url().join(loc).map_err(|_| proto("a bad Location"))?,
            _ => resp.url().clone(),
        };
        Ok(FileMeta {
            etag,
            size,
            commit: get("x-repo-commit").map(str::to_string),
            location,
        })
    }

    /// `GET` a file's bytes from `from` on (a `Range` request when `from > 0`).
    pub async fn download(
        &self,
        name: &ModelName,
        location: &Url,
        from: u64,
        what: &str,
    ) -> Result<Response> {
        self.request(
            Method::GET,
            location.clone(),
            from,
            Phase::Download,
            name,
            what,
        )
        .await
    }

    /// Sends one request, following redirects by hand: the token only goes
    /// to the endpoint's origin. A `HEAD` stops at a redirect off the
    /// endpoint's origin and returns it (the hub's metadata is on it).
    async fn request(
        &self,
        method: Method,
        mut url: Url,
        from: u64,
        phase: Phase,
        name: &ModelName,
        what: &str,
    ) -> Result<Response> {
        for _ in 0..MAX_REDIRECTS {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
            if from > 0
                && let Ok(v) = HeaderValue::from_str(&format!("bytes={from}-"))
            {
                headers.insert(header::RANGE, v);
            }
            if let Some(t) = self
                .token
                .as_ref()
                .filter(|_| same_origin(&url, &self.endpoint))
                && let Ok(mut v) = HeaderValue::from_str(&format!("Bearer {}", t.0))
            {
                v.set_sensitive(true);
                headers.insert(header::AUTHORIZATION, v);
            }
            let resp = self
                .http
                .request(method.clone(), url.clone())
                .headers(headers)
                .send()
                .await
                .map_err(|e| self.net(phase, what, &e))?;
            let status = resp.status();
            if status.is_redirection() {
                let next = resp
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| url.join(l).ok());
                let Some(next) = next else {
                    return Err(StoreError::Protocol {
                        phase,
                        what: what.to_string(),
                        endpoint: self.endpoint().to_string(),
                        detail: format!("HTTP {status} without a usable Location"),
                    });
                };
                if method == Method::HEAD && !same_origin(&next, &self.endpoint) {
                    return Ok(resp);
                }
                url = next;
                continue;
            }
            if status.is_success() || status == StatusCode::RANGE_NOT_SATISFIABLE {
                return Ok(resp);
            }
            return Err(self.status_error(phase, name, what, &resp));
        }
        Err(StoreError::Protocol {
            phase,
            what: what.to_string(),
            endpoint: self.endpoint().to_string(),
            detail: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }

    fn net(&self, phase: Phase, what: &str, e: &reqwest::Error) -> StoreError {
        StoreError::Network {
            phase,
            what: what.to_string(),
            endpoint: self.endpoint().to_string(),
            cause: chain(e),
        }
    }

    fn status_error(
        &self,
        phase: Phase,
        name: &ModelName,
        what: &str,
        resp: &Response,
    ) -> StoreError {
        let h = resp.headers();
        let code = h
            .get("x-error-code")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let msg = h
            .get("x-error-message")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let detail = match (code, msg) {
            ("", "") => String::new(),
            (c, "") | ("", c) => format!(": {c}"),
            (c, m) => format!(": {c}: {m}"),
        };
        let endpoint = self.endpoint().to_string();
        let status = resp.status().as_u16();
        match status {
            401 | 403 => StoreError::Unauthorized {
                phase,
                name: name.to_string(),
                endpoint,
                status,
                detail,
                hint: if self.token.is_some() {
                    "the token from HF_TOKEN (or the token file) has no access to it; check the token and \
                     accept the model's terms on its hub page"
                } else {
                    "set HF_TOKEN to a token with access (or log in with `hf auth login`) and accept the \
                     model's terms on its hub page"
                },
            },
            404 => StoreError::NotFound {
                phase,
                what: match code {
                    "RevisionNotFound" => format!(
                        "{} has no revision {:?}",
                        name.repo(),
                        name.revision_or_default()
                    ),
                    "EntryNotFound" => format!("no such file: {what}"),
                    _ if phase == Phase::Resolve => format!("no such repo: {}", name.repo()),
                    _ => format!("not found: {what}"),
                },
                endpoint,
            },
            _ => StoreError::Http {
                phase,
                url: what.to_string(),
                status,
                detail,
            },
        }
    }
}

fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str().map(str::to_ascii_lowercase) == b.host_str().map(str::to_ascii_lowercase)
        && a.port_or_known_default() == b.port_or_known_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comes_from_env_then_file_and_is_never_shown() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("token"), "hf_file\n").unwrap();
        let home = tmp.path().to_string_lossy().into_owned();
        let t = HubToken::from_lookup(&|k| match k {
            "HF_TOKEN" => Some("hf_env".into()),
            "HF_HOME" => Some(home.clone()),
            _ => None,
        });
        assert_eq!(t, HubToken::new("hf_env"));
        let t = HubToken::from_lookup(&|k| (k == "HF_HOME").then(|| home.clone())).unwrap();
        assert_eq!(t, HubToken::new("hf_file").unwrap());
        assert_eq!(format!("{t:?}"), "HubToken(***)");
        let c = HubClient::new("http://127.0.0.1:1/", Some(t)).unwrap();
        assert!(!format!("{c:?}").contains("hf_file"));
        assert!(HubToken::from_lookup(&|_| None).is_none());
    }

    #[test]
    fn urls_are_encoded_per_segment() {
        let c = HubClient::new("https://hub.example/mirror/", None).unwrap();
        let u = c.url(&["api", "models", "org", "m", "revision", "refs/pr/1"]);
        assert_eq!(
            u.as_str(),
            "https://hub.example/mirror/api/models/org/m/revision/refs%2Fpr%2F1"
        );
        assert!(HubClient::new("ftp://x", None).is_err());
        assert!(HubClient::new("not a url", None).is_err());
        let a = Url::parse("https://huggingface.co/x").unwrap();
        assert!(same_origin(
            &a,
            &Url::parse("https://HuggingFace.co:443/y").unwrap()
        ));
        assert!(!same_origin(
            &a,
            &Url::parse("https://cdn.example/y").unwrap()
        ));
    }
}
