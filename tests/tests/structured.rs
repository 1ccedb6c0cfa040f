//! Structured output: decoding constrained to a JSON schema (or any JSON
//! object, a regular expression, a forced tool call) by llguidance's token
//! masks, in batched decode beside unconstrained requests. Every constrained
//! reply that ends by itself parses and validates against its schema; the
//! unconstrained ones in the same batch are unchanged.
use anyhow::{Context, Result, ensure};
use grove_proto::runner::v1 as pb;
use grove_tests::fixtures;
use grove_tests::serve::{Served, all_at_once, complete};
use serde_json::{Value, json};

const MODEL: &str = "qwen3-moe-f32";

fn chat(
    text: &str,
    max_tokens: u32,
    constraint: Option<pb::constraint::Kind>,
) -> pb::GenerateRequest {
    pb::GenerateRequest {
        input: Some(pb::generate_request::Input::Chat(pb::Chat {
            messages: vec![pb::Message {
                role: pb::Role::User as i32,
                content: text.into(),
                ..Default::default()
            }],
            ..Default::default()
        })),
        max_tokens,
        constraint: constraint.map(|k| pb::Constraint { kind: Some(k) }),
        ..Default::default()
    }
}

/// Schemas whose every value is bounded, so a random model finishes them.
fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "ok": {"type": "boolean"},
            "color": {"enum": ["red", "green", "blue"]}},
            "required": ["name", "age", "ok", "color"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 2, "maxItems": 4}),
        json!({"type": "object", "properties": {
            "point": {"type": "object", "properties": {"x": {"type": "number", "minimum": 0, "maximum": 1}, "y": {"enum": [1, 2]}},
                      "required": ["x", "y"], "additionalProperties": false},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
            "required": ["point", "tags"], "additionalProperties": false}),
        json!({"anyOf": [{"type": "boolean"}, {"type": "null"}]}),
    ]
}

fn check(schema: &Value, text: &str) -> Result<()> {
    let value: Value = serde_json::from_str(text).with_context(|| format!("not JSON: {text:?}"))?;
    let validator = jsonschema::validator_for(schema)?;
    if let Err(e) = validator.validate(&value) {
        anyhow::bail!("{text} does not validate: {e}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn constrained_rows_in_one_batch_always_validate() -> Result<()> {
    let (_served, client) = Served::start(&fixtures::model_dir(MODEL)?, &[]).await?;
    let free = [
        chat("Tell me a story", 24, None),
        chat("Why is the sky blue?", 24, None),
    ];
    let mut alone = Vec::new();
    for r in &free {
        alone.push(complete(&mut client.clone(), r.clone()).await?);
    }
    let mut reqs: Vec<pb::GenerateRequest> = free.to_vec();
    let schemas = schemas();
    for (i, s) in schemas.iter().enumerate() {
        reqs.push(chat(
            &format!("Give me JSON number {i}"),
            200,
            Some(pb::constraint::Kind::JsonSchema(s.to_string())),
        ));
    }
    reqs.push(chat(
        "Any object",
        200,
        Some(pb::constraint::Kind::Regex("(yes|no), [0-9]{3}".into())),
    ));
    let out = all_at_once(&client, reqs).await?;
    for (a, b) in alone.iter().zip(&out) {
        ensure!(
            a.text == b.text,
            "an unconstrained row changed beside constrained ones"
        );
    }
    let mut steps = 0;
    let mut ns = 0;
    for (schema, c) in schemas.iter().zip(&out[2..]) {
        ensure!(
            c.reason() == pb::DoneReason::Stop,
            "{schema}: ended by {:?}: {:?}",
            c.reason(),
            c.text
        );
        check(schema, &c.text)?;
        eprintln!("{schema} -> {}", c.text);
        steps += c.metrics().constraint_steps;
        ns += c.metrics().constraint_ns;
    }
    let rx = out.last().context("no regex row")?;
    ensure!(rx.reason() == pb::DoneReason::Stop, "{:?}", rx.text);
    let (word, digits) = rx.text.split_once(", ").context("regex output")?;
    ensure!(
        ["yes", "no"].contains(&word)
            && digits.len() == 3
            && digits.bytes().all(|b| b.is_ascii_digit()),
        "{:?}",
        rx.text
    );
    ensure!(steps > 0);
    eprintln!(
        "constraint cost: {:.1} us per token over {steps} tokens",
        ns as f64 / 1e3 / steps as f64
    );
    Ok(())
}

#[tokio::test]
async fn a_forced_tool_call_parses_and_follows_its_schema() -> Result<()> {
    let (_served, mut client) = Served::start(&fixtures::model_dir(MODEL)?, &[]).await?;
    let params = json!({"type": "object", "properties": {
        "city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": false});
    let tools = [
        json!({"type": "function", "function": {"name": "get_weather", "parameters": params}}),
        json!({"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}),
    ];
    let mut req = chat(
        "What is the weather in Paris?",
        300,
        Some(pb::constraint::Kind::ToolCall(pb::ToolCallConstraint {
            name: "get_weather".into(),
        })),
    );
    if let Some(pb::generate_request::Input::Chat(c)) = req.input.as_mut() {
        c.tools_json = tools.iter().map(Value::to_string).collect();
        c.parse_tool_calls = true;
    }
    let r = complete(&mut client, req.clone()).await?;
    ensure!(
        r.reason() == pb::DoneReason::ToolCalls,
        "{:?}: {:?}",
        r.reason(),
        r.text
    );
    ensure!(
        r.text.is_empty() && r.tool_calls.len() == 1,
        "{:?} {:?}",
        r.text,
        r.tool_calls
    );
    let call = &r.tool_calls[0];
    ensure!(call.name == "get_weather" && call.id.starts_with("call_"));
    check(&params, &call.arguments_json)?;
    eprintln!("forced call: {}({})", call.name, call.arguments_json);

    // Without parse_tool_calls, a forced call is refused (it would come as text).
    if let Some(pb::generate_request::Input::Chat(c)) = req.input.as_mut() {
        c.parse_tool_calls = false;
    }
    let e = complete(&mut client, req.clone())
        .await
        .err()
        .context("accepted")?;
    ensure!(e.code() == tonic::Code::InvalidArgument, "{e:?}");
    // A name that is not a tool, and a schema llguidance cannot compile: 400s.
    if let Some(pb::generate_request::Input::Chat(c)) = req.input.as_mut() {
        c.parse_tool_calls = true;
    }
    req.constraint = Some(pb::Constraint {
        kind: Some(pb::constraint::Kind::ToolCall(pb::ToolCallConstraint {
            name: "nope".into(),
        })),
    });
    let e = complete(&mut client, req).await.err().context("accepted")?;
    ensure!(
        e.code() == tonic::Code::InvalidArgument && e.message().contains("nope"),
        "{e:?}"
    );
    for bad in [
        r#"{"type": "strange"}"#,
        "not json",
        r##"{"$ref": "#/nowhere"}"##,
    ] {
        let e = complete(
            &mut client,
            chat("x", 4, Some(pb::constraint::Kind::JsonSchema(bad.into()))),
        )
        .await
        .err()
        .context("accepted")?;
        ensure!(e.code() == tonic::Code::InvalidArgument, "{bad}: {e:?}");
        eprintln!("{bad}: {}", e.message());
    }
    Ok(())
}
