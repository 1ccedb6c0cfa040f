//! Embeddings over HTTP: OpenAI's `POST /v1/embeddings` (input as a string,
//! strings, token ids or lists of them; `encoding_format` float or base64 of
//! little-endian float32, which OpenAI's Python SDK asks for by default;
//! `dimensions`), ollama's `POST /api/embed` (`input`, `truncate`,
//! `dimensions`) and its older `POST /api/embeddings` (`prompt`, one
//! vector). All three call [`Api::embed`], the gRPC `Embed`. Vectors are
//! written as float32 (shortest round-trip form), not widened to float64.
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine as _;
use grove_proto::v1 as pb;
use grove_proto::v1::grove_server::Grove;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tonic::Request;

use super::openai_types::Invalid;
use super::{ollama, openai};
use crate::api::Api;

pub fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/v1/embeddings", post(openai_embeddings))
        .route("/api/embed", post(ollama_embed))
        .route("/api/embeddings", post(ollama_embeddings))
}

/// A typed body as a JSON response (floats stay float32).
fn typed_json<T: Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => ollama::error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

fn text(s: String) -> pb::EmbedInput {
    pb::EmbedInput {
        input: Some(pb::embed_input::Input::Text(s)),
    }
}

fn tokens(ids: Vec<u32>) -> pb::EmbedInput {
    pb::EmbedInput {
        input: Some(pb::embed_input::Input::Tokens(pb::TokenIds { ids })),
    }
}

// ---- OpenAI ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenAiRequest {
    model: String,
    input: Value,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<u32>,
    /// A label; accepted, no effect.
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
}

/// OpenAI's `input`: a string, strings, token ids, or lists of token ids.
fn openai_inputs(v: Value) -> Result<Vec<pb::EmbedInput>, String> {
    let id = |v: &Value| {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| format!("token id {v} is not a non-negative integer"))
    };
    match v {
        Value::String(s) => Ok(vec![text(s)]),
        Value::Array(items) if items.is_empty() => Err("input is empty".into()),
        Value::Array(items) if items.iter().all(Value::is_string) => Ok(items
            .into_iter()
            .filter_map(|v| match v {
                Value::String(s) => Some(text(s)),
                _ => None,
            })
            .collect()),
        Value::Array(items) if items.iter().all(Value::is_number) => {
            Ok(vec![tokens(items.iter().map(id).collect::<Result<_, _>>()?)])
        }
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|list| {
                let ids = list.as_array().into_iter().flatten().map(id);
                Ok(tokens(ids.collect::<Result<_, String>>()?))
            })
            .collect(),
        _ => Err(
            "input must be a string, a list of strings, a list of token ids or a list of such lists"
                .into(),
        ),
    }
}

#[derive(Serialize)]
struct OpenAiItem {
    object: &'static str,
    index: usize,
    embedding: OpenAiVector,
}

#[derive(Serialize)]
#[serde(untagged)]
enum OpenAiVector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: u64,
    total_tokens: u64,
}

#[derive(Serialize)]
struct OpenAiResponse {
    object: &'static str,
    data: Vec<OpenAiItem>,
    model: String,
    usage: Usage,
}

fn openai_bad(message: impl Into<String>, param: &'static str) -> Response {
    openai::invalid(Invalid {
        message: message.into(),
        param: Some(param),
    })
}

async fn openai_embeddings(
    State(api): State<Arc<Api>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    // Unknown fields are refused by name (serde's message names them).
    let r: OpenAiRequest = match openai::parse(body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let base64 = match r.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return openai_bad(
                format!("encoding_format {other:?} is not one of float, base64"),
                "encoding_format",
            );
        }
    };
    if r.dimensions == Some(0) {
        return openai_bad("dimensions must be at least 1", "dimensions");
    }
    let inputs = match openai_inputs(r.input) {
        Ok(i) => i,
        Err(m) => return openai_bad(m, "input"),
    };
    let req = pb::EmbedRequest {
        model: r.model.clone(),
        inputs,
        truncate: Some(true),
        dimensions: r.dimensions.unwrap_or(0),
        keep_alive_ns: None,
    };
    let out = match api.embed(Request::new(req)).await {
        Ok(o) => o.into_inner(),
        Err(s) => return openai::status_error(&s),
    };
    let data = out
        .embeddings
        .into_iter()
        .enumerate()
        .map(|(index, e)| OpenAiItem {
            object: "embedding",
            index,
            embedding: if base64 {
                let bytes: Vec<u8> = e.values.iter().flat_map(|v| v.to_le_bytes()).collect();
                OpenAiVector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                OpenAiVector::Float(e.values)
            },
        })
        .collect();
    typed_json(&OpenAiResponse {
        object: "list",
        data,
        model: r.model,
        usage: Usage {
            prompt_tokens: out.prompt_tokens,
            total_tokens: out.prompt_tokens,
        },
    })
}

// ---- ollama ----

#[derive(Deserialize)]
struct OllamaEmbed {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    /// `/api/embeddings`' single text.
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    dimensions: Option<u32>,
    #[serde(default)]
    options: Option<Map<String, Value>>,
    #[serde(default)]
    keep_alive: Option<Value>,
}

#[derive(Serialize)]
struct OllamaEmbedResponse {
    model: String,
    embeddings: Vec<Vec<f32>>,
    total_duration: u64,
    load_duration: u64,
    prompt_eval_count: u64,
}

#[derive(Serialize)]
struct OllamaEmbeddingsResponse {
    embedding: Vec<f32>,
}

/// ollama's options on an embedding: the sampling ones change nothing
/// here and are taken (ollama takes them too); the context size would
/// change where inputs are cut, and is refused by name.
fn check_options(o: Option<&Map<String, Value>>) -> Result<(), String> {
    super::ollama_types::options(o)?;
    match o.and_then(|o| o.get("num_ctx")).filter(|v| !v.is_null()) {
        Some(_) => Err(
            "option num_ctx is not supported on embeddings: inputs are cut at the model's context"
                .into(),
        ),
        None => Ok(()),
    }
}

async fn ollama_call(
    api: &Api,
    r: OllamaEmbed,
    inputs: Vec<pb::EmbedInput>,
) -> Result<(String, pb::EmbedResponse), Response> {
    let bad = ollama::bad;
    let model = match r.model {
        Some(m) if !m.trim().is_empty() => m,
        _ => return Err(bad("model is required".into())),
    };
    check_options(r.options.as_ref()).map_err(bad)?;
    let keep_alive_ns = super::ollama_types::keep_alive(r.keep_alive.as_ref()).map_err(bad)?;
    if r.dimensions == Some(0) {
        return Err(bad("dimensions must be at least 1".into()));
    }
    let req = pb::EmbedRequest {
        model: model.clone(),
        inputs,
        truncate: r.truncate,
        dimensions: r.dimensions.unwrap_or(0),
        keep_alive_ns,
    };
    match api.embed(Request::new(req)).await {
        Ok(o) => Ok((model, o.into_inner())),
        Err(s) => Err(ollama::status_error(&s)),
    }
}

async fn ollama_embed(
    State(api): State<Arc<Api>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r: OllamaEmbed = match ollama::parse(body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let inputs = match r.input.clone() {
        Some(Value::String(s)) => vec![text(s)],
        Some(Value::Array(items)) if !items.is_empty() && items.iter().all(Value::is_string) => {
            items
                .into_iter()
                .filter_map(|v| v.as_str().map(|s| text(s.to_owned())))
                .collect()
        }
        _ => {
            return ollama::bad("input must be a string or a non-empty list of strings");
        }
    };
    match ollama_call(&api, r, inputs).await {
        Ok((model, out)) => typed_json(&OllamaEmbedResponse {
            model,
            embeddings: out.embeddings.into_iter().map(|e| e.values).collect(),
            total_duration: out.total_ns,
            load_duration: out.load_ns,
            prompt_eval_count: out.prompt_tokens,
        }),
        Err(r) => r,
    }
}

async fn ollama_embeddings(
    State(api): State<Arc<Api>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r: OllamaEmbed = match ollama::parse(body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let Some(prompt) = r.prompt.clone() else {
        return ollama::bad("prompt is required");
    };
    match ollama_call(&api, r, vec![text(prompt)]).await {
        Ok((_, out)) => typed_json(&OllamaEmbeddingsResponse {
            embedding: out
                .embeddings
                .into_iter()
                .next()
                .map(|e| e.values)
                .unwrap_or_default(),
        }),
        Err(r) => r,
    }
}
