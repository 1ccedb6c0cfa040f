//! A chat reply split into reasoning, tool calls and content by the runner
//! (`split_reasoning`, `parse_tool_calls`), end to end on a fixture whose
//! template opens a reasoning block, and with tool markup forced by a logit
//! bias. The formats themselves are unit-tested in runner/src/output_tests.rs.
use std::path::Path;

use anyhow::{Context, Result, ensure};
use grove_proto::runner::v1 as pb;
use grove_tests::fixtures;
use grove_tests::serve::{Served, complete};

/// ChatML whose generation prompt opens `<think>`, as Qwen 3.5's does, and
/// that shows tools in Hermes style.
const TEMPLATE: &str = "{% if tools %}<|im_start|>system\nCall tools as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}";

/// The fixture `qwen3-moe-f32` (its vocabulary has <think> and <tool_call>)
/// in `dir`, with [`TEMPLATE`].
fn model_with_template(dir: &Path) -> Result<()> {
    let src = fixtures::model_dir("qwen3-moe-f32")?;
    for entry in std::fs::read_dir(&src)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == "tokenizer_config.json" {
            let mut config: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(entry.path())?)?;
            config["chat_template"] = TEMPLATE.into();
            std::fs::write(dir.join(&name), config.to_string())?;
        } else {
            std::os::unix::fs::symlink(entry.path(), dir.join(&name))?;
        }
    }
    Ok(())
}

fn chat(split: bool, tools: &[&str], max_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest {
        input: Some(pb::generate_request::Input::Chat(pb::Chat {
            messages: vec![pb::Message {
                role: pb::Role::User as i32,
                content: "What is the weather in Paris?".into(),
                ..Default::default()
            }],
            tools_json: tools.iter().map(|t| t.to_string()).collect(),
            split_reasoning: split,
            parse_tool_calls: split,
            ..Default::default()
        })),
        max_tokens,
        ..Default::default()
    }
}

const TOOL: &str = r#"{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}"#;

#[tokio::test]
async fn reasoning_opened_by_the_template_is_split_out() -> Result<()> {
    let dir = tempfile::tempdir()?;
    model_with_template(dir.path())?;
    let (_served, mut client) = Served::start(dir.path(), &[]).await?;

    let whole = complete(&mut client, chat(false, &[], 40)).await?;
    let split = complete(&mut client, chat(true, &[], 40)).await?;
    ensure!(whole.thinking.is_empty() && whole.tool_calls.is_empty());
    // The same greedy tokens, split where the model closed the block (if it did).
    let (thinking, text) = match whole.text.split_once("</think>") {
        Some((t, rest)) => (t.to_owned(), rest.trim_start().to_owned()),
        None => (whole.text.clone(), String::new()),
    };
    ensure!(
        split.thinking == thinking && split.text == text,
        "split {:?} / {:?} from {:?}",
        split.thinking,
        split.text,
        whole.text
    );
    ensure!(!split.thinking.is_empty());
    ensure!(split.reason() == whole.reason());
    Ok(())
}

#[tokio::test]
async fn markup_that_does_not_parse_comes_back_as_text() -> Result<()> {
    let dir = tempfile::tempdir()?;
    model_with_template(dir.path())?;
    let (_served, mut client) = Served::start(dir.path(), &[]).await?;
    let ids = client
        .tokenize(pb::TokenizeRequest {
            text: "<tool_call>".into(),
            add_special_tokens: false,
        })
        .await?
        .into_inner()
        .ids;
    let &[id] = ids.as_slice() else {
        anyhow::bail!("<tool_call> is {ids:?}, not one token");
    };
    // Every step picks <tool_call>: a call that opens and never closes.
    let mut req = chat(true, &[TOOL], 3);
    req.sampling = Some(pb::SamplingOptions {
        logit_bias: [(id, 100.0)].into(),
        ..Default::default()
    });
    // The reply starts inside the template's <think>, where markup is
    // reasoning; without the reasoning split, tool parsing acts alone.
    if let Some(pb::generate_request::Input::Chat(c)) = req.input.as_mut() {
        c.split_reasoning = false;
    }
    let r = complete(&mut client, req).await?;
    ensure!(r.text == "<tool_call>".repeat(3), "{:?}", r.text);
    ensure!(r.tool_calls.is_empty());
    ensure!(
        r.reason() == pb::DoneReason::InvalidToolCall,
        "{:?}",
        r.reason()
    );
    // Without parse_tool_calls the same reply is plain text that ran to its length.
    let mut plain = chat(false, &[TOOL], 3);
    plain.sampling = Some(pb::SamplingOptions {
        logit_bias: [(id, 100.0)].into(),
        ..Default::default()
    });
    let r = complete(&mut client, plain).await.context("plain")?;
    ensure!(r.text == "<tool_call>".repeat(3) && r.reason() == pb::DoneReason::Length);
    Ok(())
}
