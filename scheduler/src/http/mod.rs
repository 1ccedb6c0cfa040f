//! The daemon's HTTP/JSON APIs, OpenAI's ([`openai`], and its Responses:
//! [`responses`]), ollama's ([`ollama`]), Anthropic's Messages
//! ([`anthropic`]) and both embedding APIs ([`embeddings`]), on the same
//! address as its gRPC API: gRPC paths
//! (`/grove.v1.Grove/…`) and HTTP paths (`/v1/…`, `/api/…`) share one
//! router. Every handler calls the same [`Api`] the gRPC service is, so a
//! request takes one path to the scheduler and the runner whichever way it
//! came; only the JSON is translated here.
//!
//! Around them: an optional key (GROVE_API_KEY) that every call, HTTP or
//! gRPC, must carry (as a bearer token, or Anthropic's `x-api-key`); CORS for the configured origins only
//! (GROVE_ORIGINS, off by default); a request body limit (GROVE_MAX_BODY).
pub mod anthropic;
mod anthropic_types;
pub mod embeddings;
mod logprobs;
pub mod ollama;
mod ollama_types;
pub mod openai;
mod openai_types;
pub mod responses;
mod responses_types;
mod stream;
mod tool_choice;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, Method, Request, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::api::Api;

/// How the HTTP side is set up.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The bearer token every call must carry (GROVE_API_KEY).
    pub api_key: Option<String>,
    /// Origins browsers may call from (GROVE_ORIGINS, comma-separated; `*`
    /// for any). Empty: no CORS headers at all.
    pub cors_origins: Vec<String>,
    /// The largest request body, in bytes (GROVE_MAX_BODY).
    pub max_body_bytes: usize,
}

/// The default body limit: a long conversation with tools fits; a body that
/// could only exhaust memory does not.
pub const DEFAULT_MAX_BODY: usize = 32 << 20;

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            cors_origins: Vec::new(),
            max_body_bytes: DEFAULT_MAX_BODY,
        }
    }
}

/// The HTTP routes (OpenAI's and ollama's) over `api`.
pub fn routes(api: Arc<Api>, config: &HttpConfig) -> Router {
    let router = Router::new()
        .merge(openai::routes())
        .merge(ollama::routes())
        .merge(anthropic::routes())
        .merge(responses::routes())
        .merge(embeddings::routes())
        .with_state(api)
        .layer(DefaultBodyLimit::max(config.max_body_bytes));
    match cors(&config.cors_origins) {
        Some(layer) => router.layer(layer),
        None => router,
    }
}

fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o.trim()).ok()),
        )
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::HeaderName::from_static(API_KEY_HEADER),
                header::HeaderName::from_static("anthropic-version"),
            ]),
    )
}

/// Anthropic's header for the key.
const API_KEY_HEADER: &str = "x-api-key";

/// Requires `Authorization: Bearer KEY` (or `x-api-key: KEY`) on every
/// request (HTTP and gRPC) when a key is set; CORS preflights (OPTIONS)
/// carry none and pass.
pub fn with_auth(router: Router, key: Option<String>) -> Router {
    let Some(key) = key else { return router };
    let key = Arc::new(key);
    router.layer(axum::middleware::from_fn(
        move |req: Request<Body>, next: Next| {
            let key = key.clone();
            async move {
                if req.method() == Method::OPTIONS || authorized(&req, &key) {
                    return next.run(req).await;
                }
                let missing = !req.headers().contains_key(header::AUTHORIZATION)
                    && !req.headers().contains_key(API_KEY_HEADER);
                let message = if missing {
                    "this server needs an API key: send `Authorization: Bearer KEY` or `x-api-key: KEY` (GROVE_API_KEY)"
                } else {
                    "the API key is wrong"
                };
                let grpc = req
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("application/grpc"));
                if grpc {
                    return tonic::Status::unauthenticated(message).into_http::<Body>();
                }
                if req.uri().path().starts_with("/v1/messages") {
                    anthropic::error(StatusCode::UNAUTHORIZED, message)
                } else if req.uri().path().starts_with("/api") {
                    ollama::error(StatusCode::UNAUTHORIZED, message)
                } else {
                    openai::error(StatusCode::UNAUTHORIZED, message, "invalid_api_key")
                }
            }
        },
    ))
}

fn authorized(req: &Request<Body>, key: &str) -> bool {
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let given = bearer.or_else(|| {
        req.headers()
            .get(API_KEY_HEADER)
            .and_then(|v| v.to_str().ok())
    });
    let Some(given) = given else {
        return false;
    };
    // Compared in time independent of where the first difference is.
    let (a, b) = (given.trim().as_bytes(), key.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The HTTP status for a gRPC status code.
pub fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code as C;
    match code {
        C::InvalidArgument | C::OutOfRange => StatusCode::BAD_REQUEST,
        C::NotFound => StatusCode::NOT_FOUND,
        C::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        C::Unauthenticated => StatusCode::UNAUTHORIZED,
        C::PermissionDenied => StatusCode::FORBIDDEN,
        C::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        C::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        C::AlreadyExists => StatusCode::CONFLICT,
        C::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A fresh id for a response or an item: `prefix` then the time in
/// nanoseconds and a counter (two ids asked for in the same nanosecond
/// differ), in hex: `chatcmpl-…`, `msg_…`, `resp_…`.
pub fn new_id(prefix: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}{nanos:x}{n:04x}")
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> i64 {
    unix(SystemTime::now())
}

pub fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// `t` as RFC 3339 in UTC with nanoseconds, as ollama writes times.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// A JSON response with `status`.
pub fn json(status: StatusCode, value: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_are_rfc3339() {
        let t = UNIX_EPOCH + Duration::new(1_691_176_965, 499_127_000);
        assert_eq!(rfc3339(t), "2023-08-04T19:22:45.499127000Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(&rfc3339(leap)[..10], "2000-02-29");
    }
}
