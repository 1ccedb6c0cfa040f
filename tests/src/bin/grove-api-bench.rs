//! The daemon's HTTP path against its gRPC path on the same request, and
//! what structured output costs per token, on a real `grove serve`.
//!
//! 1. One greedy chat (the prompt cached after a warm-up), `TOKENS` new
//!    tokens, `ROUNDS` times each way, interleaved: gRPC `Chat`, OpenAI's
//!    `/v1/chat/completions` streamed (SSE) and not, ollama's `/api/chat`
//!    streamed (NDJSON), Anthropic's `/v1/messages` streamed, OpenAI's
//!    Responses (`/v1/responses`) streamed, and OpenAI's
//!    SSE with `logprobs` (5 alternatives: the engine's log-softmax and
//!    top-k per token, and their JSON). The HTTP overhead is the difference
//!    of the median wall times, as a share of gRPC's decode time.
//! 2. The same chat constrained to a JSON schema: the grammar's time per
//!    token (Metrics.constraint_ns / constraint_steps) and decode time per
//!    token against the free chat.
//!
//! grove-api-bench MODEL [TOKENS] [ROUNDS]
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use grove_proto::v1 as pb;
use grove_tests::daemon::Daemon;
use grove_tests::http::{Lines, send};
use serde_json::json;

const HEADERS: [(&str, &str); 1] = [("Content-Type", "application/json")];
const PROMPT: &str = "Write a long story about a lighthouse keeper.";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn chat(model: &str, tokens: u32, constraint: Option<pb::Constraint>) -> pb::ChatRequest {
    pb::ChatRequest {
        model: model.into(),
        messages: vec![pb::Message {
            role: pb::Role::User as i32,
            content: PROMPT.into(),
            ..Default::default()
        }],
        options: Some(pb::Options {
            max_tokens: Some(tokens),
            temperature: Some(0.0),
            constraint,
            ..Default::default()
        }),
        ..Default::default()
    }
}

type Client = grove_proto::v1::grove_client::GroveClient<tonic::transport::Channel>;

/// gRPC on a connection kept open, as a client keeps it: wall time and the
/// final metrics.
async fn grpc(c: &mut Client, req: pb::ChatRequest) -> Result<(Duration, pb::Metrics)> {
    let t = Instant::now();
    let mut s = c.chat(req).await?.into_inner();
    while let Some(m) = s.message().await? {
        if let Some(pb::generate_response::Event::Done(done)) = m.event {
            return Ok((t.elapsed(), done.metrics.unwrap_or_default()));
        }
    }
    bail!("no Done")
}

/// A streamed HTTP request read to its last line.
async fn http_stream(
    d: &Daemon,
    path: &str,
    body: &serde_json::Value,
    last: &str,
) -> Result<Duration> {
    http_stream_any(d, path, body, &[last]).await
}

/// Until a line holding any of `ends` (Responses: completed, or incomplete
/// where the token limit cut the reply).
async fn http_stream_any(
    d: &Daemon,
    path: &str,
    body: &serde_json::Value,
    ends: &[&str],
) -> Result<Duration> {
    let t = Instant::now();
    let mut lines = Lines::open(&d.addr, path, &HEADERS, &body.to_string()).await?;
    if lines.status != 200 {
        bail!("{path}: HTTP {}", lines.status);
    }
    loop {
        let line = lines.next_with("").await?;
        if ends.iter().any(|e| line.contains(e)) {
            return Ok(t.elapsed());
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let model = args
        .get(1)
        .context("usage: grove-api-bench MODEL [TOKENS] [ROUNDS]")?;
    let model = std::fs::canonicalize(model)?.display().to_string();
    let tokens: u32 = args.get(2).map_or(Ok(128), |s| s.parse())?;
    let rounds: usize = args.get(3).map_or(Ok(7), |s| s.parse())?;
    let (d, _) = Daemon::start(&[]).await?;

    let openai = |stream: bool| {
        json!({"model": model, "messages": [{"role": "user", "content": PROMPT}],
               "max_tokens": tokens, "temperature": 0, "stream": stream})
    };
    let ollama = json!({"model": model, "messages": [{"role": "user", "content": PROMPT}],
                        "options": {"num_predict": tokens, "temperature": 0}});
    let anthropic = json!({"model": model, "messages": [{"role": "user", "content": PROMPT}],
                           "max_tokens": tokens, "temperature": 0, "stream": true});
    let responses = json!({"model": model, "input": PROMPT, "max_output_tokens": tokens,
                           "temperature": 0, "stream": true});
    let mut with_logprobs = openai(true);
    with_logprobs["logprobs"] = json!(true);
    with_logprobs["top_logprobs"] = json!(5);
    // Warm-up: load, and put the prompt in the prompt cache.
    let mut c = d.client().await?;
    let (_, m) = grpc(&mut c, chat(&model, tokens, None)).await?;
    let generated = m.eval_tokens;
    let (mut g, mut decode, mut sse, mut whole, mut nd) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut messages, mut lp, mut resp, mut g_lp) = (vec![], vec![], vec![], vec![]);
    let mut chat_lp = chat(&model, tokens, None);
    if let Some(o) = chat_lp.options.as_mut() {
        o.top_logprobs = Some(5);
    }
    for round in 0..rounds {
        // Each way goes first in turn, so none always follows another.
        for k in 0..8 {
            match (round + k) % 8 {
                7 => g_lp.push(grpc(&mut c, chat_lp.clone()).await?.0),
                0 => {
                    let (wall, m) = grpc(&mut c, chat(&model, tokens, None)).await?;
                    g.push(wall);
                    decode.push(Duration::from_nanos(m.eval_ns));
                }
                1 => sse
                    .push(http_stream(&d, "/v1/chat/completions", &openai(true), "[DONE]").await?),
                2 => {
                    let t = Instant::now();
                    let body = openai(false).to_string();
                    let r = send(
                        &d.addr,
                        "POST",
                        "/v1/chat/completions",
                        &HEADERS,
                        body.as_bytes(),
                    )
                    .await?;
                    if r.status != 200 {
                        bail!("/v1/chat/completions: {}", r.body);
                    }
                    whole.push(t.elapsed());
                }
                3 => nd.push(http_stream(&d, "/api/chat", &ollama, "\"done\":true").await?),
                4 => messages
                    .push(http_stream(&d, "/v1/messages", &anthropic, "\"message_stop\"").await?),
                5 => resp.push(
                    http_stream_any(
                        &d,
                        "/v1/responses",
                        &responses,
                        &["event: response.completed", "event: response.incomplete"],
                    )
                    .await?,
                ),
                _ => lp
                    .push(http_stream(&d, "/v1/chat/completions", &with_logprobs, "[DONE]").await?),
            }
        }
    }
    let (g_min, g) = (*g.iter().min().context("no rounds")?, median(g));
    let decode = median(decode);
    println!("HTTP against gRPC: {model}, {generated} tokens; median (and least) of {rounds}");
    println!(
        "  gRPC Chat                 {:>9.2} ms ({:.2}); decode {:.2} ms",
        g.as_secs_f64() * 1e3,
        g_min.as_secs_f64() * 1e3,
        decode.as_secs_f64() * 1e3
    );
    let share = |d: f64| d / decode.as_secs_f64() * 100.0;
    for (name, v) in [
        ("OpenAI SSE", sse),
        ("OpenAI not streamed", whole),
        ("ollama NDJSON", nd),
        ("Anthropic SSE", messages),
        ("Responses SSE", resp),
    ] {
        let least = *v.iter().min().context("no rounds")?;
        let m = median(v);
        let over = m.as_secs_f64() - g.as_secs_f64();
        let over_least = least.as_secs_f64() - g_min.as_secs_f64();
        println!(
            "  {name:<25} {:>9.2} ms ({:.2}); overhead {:+.2}% of decode ({:+.2}%)",
            m.as_secs_f64() * 1e3,
            least.as_secs_f64() * 1e3,
            share(over),
            share(over_least)
        );
    }
    // Log-probabilities against gRPC with them: what the HTTP side adds.
    let (lp_g_min, lp_g) = (*g_lp.iter().min().context("no rounds")?, median(g_lp));
    let (least, m) = (*lp.iter().min().context("no rounds")?, median(lp));
    println!(
        "  gRPC Chat, logprobs (5)   {:>9.2} ms ({:.2}); {:+.2}% of decode over gRPC without",
        lp_g.as_secs_f64() * 1e3,
        lp_g_min.as_secs_f64() * 1e3,
        share(lp_g.as_secs_f64() - g.as_secs_f64())
    );
    println!(
        "  OpenAI SSE, logprobs (5)  {:>9.2} ms ({:.2}); overhead {:+.2}% of decode ({:+.2}%) over gRPC with them",
        m.as_secs_f64() * 1e3,
        least.as_secs_f64() * 1e3,
        share(m.as_secs_f64() - lp_g.as_secs_f64()),
        share(least.as_secs_f64() - lp_g_min.as_secs_f64())
    );

    // Structured output.
    let schema = json!({"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40}, "year": {"type": "integer", "minimum": 1800, "maximum": 2100},
        "keeper": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 18, "maximum": 99}},
                   "required": ["name", "age"], "additionalProperties": false},
        "tags": {"type": "array", "items": {"enum": ["sea", "storm", "light", "night"]}, "maxItems": 4}},
        "required": ["title", "year", "keeper", "tags"], "additionalProperties": false});
    let constraint = pb::Constraint {
        kind: Some(pb::constraint::Kind::JsonSchema(schema.to_string())),
    };
    let (mut free, mut fixed, mut grammar) = (vec![], vec![], vec![]);
    for _ in 0..rounds {
        let (_, m) = grpc(&mut c, chat(&model, tokens, None)).await?;
        free.push(Duration::from_nanos(
            m.eval_ns / u64::from(m.eval_tokens.max(1)),
        ));
        let (_, m) = grpc(&mut c, chat(&model, tokens, Some(constraint.clone()))).await?;
        fixed.push(Duration::from_nanos(
            m.eval_ns / u64::from(m.eval_tokens.max(1)),
        ));
        grammar.push(Duration::from_nanos(
            m.constraint_ns / u64::from(m.constraint_steps.max(1)),
        ));
    }
    let (free, fixed, grammar) = (median(free), median(fixed), median(grammar));
    println!("Structured output (a JSON schema), median of {rounds}");
    println!(
        "  decode per token: free {:.3} ms, constrained {:.3} ms ({:+.1}%); grammar {:.1} us per token",
        free.as_secs_f64() * 1e3,
        fixed.as_secs_f64() * 1e3,
        (fixed.as_secs_f64() / free.as_secs_f64() - 1.0) * 100.0,
        grammar.as_secs_f64() * 1e6
    );
    Ok(())
}
