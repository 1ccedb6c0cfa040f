//! Tests of [`super`]: renderings recorded from transformers'
//! `apply_chat_template` by runner/tests-data/gen_chat.py (fixture models, the
//! realistic templates of runner/tests-data/chat/templates, single-feature
//! templates, strftime), compared byte for byte, plus the error cases.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{Value as Json, json};

use super::python::py_float;
use super::spec::{read_json, special_tokens};
use super::*;
use crate::tokenizer::Tokenizer;

/// `$GROVE_FIXTURES`, else `.grove/fixtures` in the repository.
fn fixtures() -> PathBuf {
    match std::env::var_os("GROVE_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.grove/fixtures"),
    }
}

fn fixture(name: &str) -> PathBuf {
    let dir = fixtures().join(name);
    assert!(
        dir.join("tokenizer_config.json").is_file(),
        "fixture {} is missing (set GROVE_FIXTURES to the fixtures directory)",
        dir.display()
    );
    dir
}

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests-data/chat")
}

fn vectors(file: &str) -> Json {
    let path = data().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run runner/tests-data/gen_chat.py)",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("test vectors are JSON")
}

fn message(v: &Json) -> Message {
    let text = |key: &str| v.get(key).and_then(Json::as_str).map(str::to_owned);
    let tool_calls = v
        .get("tool_calls")
        .and_then(Json::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    assert_eq!(c["type"], "function");
                    ToolCall {
                        name: c["function"]["name"].as_str().unwrap().to_owned(),
                        arguments: c["function"]["arguments"].clone(),
                        id: c.get("id").and_then(Json::as_str).map(str::to_owned),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    Message {
        role: v["role"].as_str().unwrap().parse().unwrap(),
        content: text("content").unwrap(),
        tool_calls,
        tool_call_id: text("tool_call_id"),
        name: text("name"),
        reasoning_content: text("reasoning_content"),
    }
}

/// The request of a case; `conversation` holds its messages and tools.
fn request_of(case: &Json, conversation: &Json) -> ChatRequest {
    ChatRequest {
        messages: conversation["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(message)
            .collect(),
        tools: conversation
            .get("tools")
            .and_then(Json::as_array)
            .cloned()
            .unwrap_or_default(),
        add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap_or(false),
        extra: case["extra"].as_object().cloned().unwrap_or_default(),
        reasoning_effort: None,
    }
}

/// A case whose conversation is named in `file["conversations"]`.
fn request(file: &Json, case: &Json) -> ChatRequest {
    let name = case["conversation"].as_str().unwrap();
    request_of(case, &file["conversations"][name])
}

fn label(case: &Json) -> String {
    format!(
        "{} {} agp={} extra={} name={}",
        case.get("model").or(case.get("template")).unwrap(),
        case["conversation"],
        case["add_generation_prompt"],
        case["extra"],
        case["template_name"]
    )
}

/// Compares one rendering with the recorded outcome; `Err` describes a mismatch.
fn check(case: &Json, got: &Result<String>) -> std::result::Result<(), String> {
    match (case.get("expected").and_then(Json::as_str), got) {
        (Some(want), Ok(text)) if want == text => Ok(()),
        (Some(want), Ok(text)) => Err(format!("rendered\n{text:?}\nwant\n{want:?}")),
        (Some(_), Err(e)) => Err(format!("failed: {e}")),
        (None, got) => {
            let want = case["error"]
                .as_str()
                .expect("a case has expected or error");
            match got {
                Err(RunnerError::Request(msg)) if msg.contains(want) => Ok(()),
                other => Err(format!(
                    "want a request error containing {want:?}, got {other:?}"
                )),
            }
        }
    }
}

fn report(failures: Vec<String>, total: usize) {
    assert!(total > 0, "no test vectors");
    assert!(
        failures.is_empty(),
        "{} of {total} cases differ from transformers:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

fn load_tokenizer(dir: &Path) -> Tokenizer {
    let config: Json = std::fs::read_to_string(dir.join("config.json"))
        .map(|t| serde_json::from_str(&t).expect("config.json is JSON"))
        .unwrap_or(Json::Null);
    Tokenizer::load(dir, &config).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

#[test]
fn fixture_models_render_as_transformers() {
    let file = vectors("fixtures.json");
    let cases = file["cases"].as_array().unwrap();
    let mut templates: HashMap<String, ChatTemplate> = HashMap::new();
    let mut tokenizers: HashMap<String, Tokenizer> = HashMap::new();
    let mut failures = Vec::new();
    for case in cases {
        let model = case["model"].as_str().unwrap();
        let dir = fixture(model);
        let template = templates.entry(model.to_owned()).or_insert_with(|| {
            ChatTemplate::load(&dir, None)
                .unwrap_or_else(|e| panic!("{model}: {e}"))
                .unwrap_or_else(|| panic!("{model} has no chat template"))
        });
        let got = template.render(&request(&file, case));
        if let Err(msg) = check(case, &got) {
            failures.push(format!("{}: {msg}", label(case)));
            continue;
        }
        // transformers' tokenize=True: the rendered text without special tokens.
        if let (Some(ids), Ok(text)) = (case.get("ids"), &got) {
            let tok = tokenizers
                .entry(model.to_owned())
                .or_insert_with(|| load_tokenizer(&dir));
            let want: Vec<u32> = serde_json::from_value(ids.clone()).unwrap();
            let ids = tok.encode(text, false).unwrap();
            if ids != want {
                failures.push(format!("{}: ids {ids:?}, want {want:?}", label(case)));
            }
        }
    }
    report(failures, cases.len());
}

#[test]
fn fixtures_cover_both_template_locations() {
    // f32: `chat_template` in tokenizer_config.json; q4: chat_template.jinja.
    let f32 = fixture("llama-f32");
    let q4 = fixture("llama-q4");
    assert!(!f32.join("chat_template.jinja").exists());
    assert!(q4.join("chat_template.jinja").is_file());
    let config = read_json(&q4.join("tokenizer_config.json")).unwrap();
    assert!(config.get("chat_template").is_none());
    let t = ChatTemplate::load(&q4, None).unwrap().unwrap();
    assert_eq!(t.templates[0].1, q4.join("chat_template.jinja"));
}

#[test]
fn bos_is_not_added_twice() {
    // Llama's template writes BOS; encoding with special tokens would add another.
    let dir = fixture("llama-f32");
    let template = ChatTemplate::load(&dir, None).unwrap().unwrap();
    let text = template
        .render(&ChatRequest {
            messages: vec![Message::new(Role::User, "Hi")],
            add_generation_prompt: true,
            ..Default::default()
        })
        .unwrap();
    assert!(text.starts_with("<|begin_of_text|>"));
    let tok = load_tokenizer(&dir);
    let bos = tok.encode("<|begin_of_text|>", false).unwrap();
    assert_eq!(bos.len(), 1);
    let plain = tok.encode(&text, false).unwrap();
    let doubled = tok.encode(&text, true).unwrap();
    assert_eq!(plain.iter().filter(|&&id| id == bos[0]).count(), 1);
    assert_eq!(doubled.iter().filter(|&&id| id == bos[0]).count(), 2);
}

#[test]
fn realistic_templates_render_as_transformers() {
    let file = vectors("templates.json");
    let cases = file["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    for case in cases {
        let dir = data()
            .join("templates")
            .join(case["template"].as_str().unwrap());
        let name = case["template_name"].as_str();
        let got = ChatTemplate::load(&dir, name)
            .and_then(|t| t.expect("a chat template").render(&request(&file, case)));
        if let Err(msg) = check(case, &got) {
            failures.push(format!("{}: {msg}", label(case)));
        }
    }
    report(failures, cases.len());
}

#[test]
fn jinja_features_render_as_transformers() {
    let file = vectors("jinja.json");
    let tokens_dir = fixture(file["special_tokens_from"].as_str().unwrap());
    let config = read_json(&tokens_dir.join("tokenizer_config.json")).unwrap();
    let tokens = special_tokens(Some(&tokens_dir), &config).unwrap();
    let cases = file["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    for case in cases {
        let source = Source {
            name: "default".into(),
            text: case["template"].as_str().unwrap().into(),
            origin: PathBuf::from("jinja.json"),
        };
        let spec = TemplateSpec {
            sources: vec![source],
            special_tokens: tokens.clone(),
        };
        let got =
            ChatTemplate::from_spec(&spec, None).and_then(|t| t.render(&request_of(case, case)));
        if let Err(msg) = check(case, &got) {
            failures.push(format!("{} {:?}: {msg}", case["name"], case["template"]));
        }
    }
    report(failures, cases.len());
}

#[test]
fn strftime_matches_python() {
    let cases = vectors("strftime.json");
    let cases = cases.as_array().unwrap();
    let mut failures = Vec::new();
    for case in cases {
        let ts = case["timestamp"].as_i64().unwrap();
        let format = case["format"].as_str().unwrap();
        let got = strftime(ts, 0, format);
        if got != case["expected"] {
            failures.push(format!(
                "{ts} {format:?}: {got:?}, want {}",
                case["expected"]
            ));
        }
    }
    report(failures, cases.len());
    // `strftime_now` is today's date in the Llama 3.1 layout.
    let now = strftime_now("%d %b %Y");
    assert_eq!(now.len(), 11, "{now:?}");
}

#[test]
fn python_floats() {
    for (f, want) in [
        (1.0, "1.0"),
        (0.1, "0.1"),
        (1e16, "1e+16"),
        (1e15, "1000000000000000.0"),
        (1e-5, "1e-05"),
        (0.0001, "0.0001"),
        (-2.5e-300, "-2.5e-300"),
        (123456789.125, "123456789.125"),
        (-0.0, "-0.0"),
    ] {
        assert_eq!(py_float(f, false), want, "{f:e}");
    }
    assert_eq!(py_float(f64::NAN, true), "NaN");
    assert_eq!(py_float(f64::NEG_INFINITY, false), "-inf");
}

#[test]
fn generation_tags_become_plain_blocks() {
    assert_eq!(
        rewrite_generation_tags("a{%- generation %}b{%endgeneration-%}c{% if x %}{% endif %}"),
        "a{%- if true %}b{% endif -%}c{% if x %}{% endif %}"
    );
    assert_eq!(
        rewrite_generation_tags("{% generations %}{%"),
        "{% generations %}{%"
    );
}

// ---------------------------------------------------------------------------------------
// Loading and errors

/// A model directory holding `tokenizer_config.json` = `config` and the given files.
fn model_dir(config: Json, files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

fn user(text: &str) -> ChatRequest {
    ChatRequest {
        messages: vec![Message::new(Role::User, text)],
        ..Default::default()
    }
}

fn request_error(r: Result<impl std::fmt::Debug>) -> String {
    match r {
        Err(RunnerError::Request(msg)) => msg,
        other => panic!("want a request error, got {other:?}"),
    }
}

#[test]
fn a_model_without_template_has_none() {
    let dir = model_dir(json!({"eos_token": "</s>"}), &[]);
    assert!(ChatTemplate::load(dir.path(), None).unwrap().is_none());
    let empty = tempfile::tempdir().unwrap();
    assert!(ChatTemplate::load(empty.path(), None).unwrap().is_none());
}

#[test]
fn jinja_files_win_over_tokenizer_config() {
    let dir = model_dir(
        json!({"chat_template": "config", "bos_token": {"content": "<s>", "lstrip": false}}),
        &[
            ("chat_template.jinja", "file {{ bos_token }}"),
            ("additional_chat_templates/extra.jinja", "extra"),
        ],
    );
    let t = ChatTemplate::load(dir.path(), None).unwrap().unwrap();
    assert_eq!(t.names().collect::<Vec<_>>(), ["default", "extra"]);
    assert_eq!(t.render(&user("hi")).unwrap(), "file <s>");
    let t = ChatTemplate::load(dir.path(), Some("extra"))
        .unwrap()
        .unwrap();
    assert_eq!(t.render(&user("hi")).unwrap(), "extra");
}

#[test]
fn unknown_template_name_is_an_error() {
    let msg = request_error(ChatTemplate::load(
        &data().join("templates/multi"),
        Some("nope"),
    ));
    assert!(
        msg.contains("\"nope\"") && msg.contains("default, tool_use, rag"),
        "{msg}"
    );
    let msg = request_error(ChatTemplate::load(&fixture("llama-f32"), Some("tool_use")));
    assert!(
        msg.contains("\"tool_use\"") && msg.contains("default"),
        "{msg}"
    );
}

#[test]
fn malformed_template_is_a_tokenizer_error() {
    let dir = model_dir(
        json!({"chat_template": "{% for m in messages %}{{ m.content }"}),
        &[],
    );
    match ChatTemplate::load(dir.path(), None) {
        Err(RunnerError::Tokenizer(msg)) => {
            assert!(msg.contains("\"default\""), "{msg}");
            assert!(msg.contains("tokenizer_config.json"), "{msg}");
            assert!(msg.contains("syntax error"), "{msg}");
        }
        other => panic!("want a tokenizer error, got {other:?}"),
    }
    let dir = model_dir(json!({"chat_template": 3}), &[]);
    assert!(matches!(
        ChatTemplate::load(dir.path(), None),
        Err(RunnerError::Tokenizer(_))
    ));
    let dir = model_dir(json!({"chat_template": [{"name": "default"}]}), &[]);
    assert!(matches!(
        ChatTemplate::load(dir.path(), None),
        Err(RunnerError::Tokenizer(_))
    ));
    // A broken template that cannot be selected does not stop the model loading.
    let dir = model_dir(
        json!({"chat_template": [
            {"name": "default", "template": "ok"},
            {"name": "rag", "template": "{% if %}"},
        ]}),
        &[],
    );
    let t = ChatTemplate::load(dir.path(), None).unwrap().unwrap();
    assert_eq!(t.render(&user("hi")).unwrap(), "ok");
    match ChatTemplate::load(dir.path(), Some("rag")) {
        Err(RunnerError::Tokenizer(msg)) => assert!(msg.contains("\"rag\""), "{msg}"),
        other => panic!("want a tokenizer error, got {other:?}"),
    }
}

#[test]
fn raise_exception_is_a_request_error() {
    let dir = model_dir(
        json!({"chat_template": "{% if messages[0].role != 'system' %}{{ raise_exception('System first, got ' + messages[0].role) }}{% endif %}ok"}),
        &[],
    );
    let t = ChatTemplate::load(dir.path(), None).unwrap().unwrap();
    let msg = request_error(t.render(&user("hi")));
    assert!(
        msg.ends_with("rejected the conversation: System first, got user"),
        "{msg}"
    );
    assert!(
        msg.contains("\"default\"") && msg.contains("tokenizer_config.json"),
        "{msg}"
    );
    let mut req = user("hi");
    req.messages.insert(0, Message::new(Role::System, "s"));
    assert_eq!(t.render(&req).unwrap(), "ok");
}

#[test]
fn other_render_failures_are_request_errors() {
    let dir = model_dir(
        json!({"chat_template": "line one\n{{ messages[0].content + 1 }}"}),
        &[],
    );
    let t = ChatTemplate::load(dir.path(), None).unwrap().unwrap();
    let msg = request_error(t.render(&user("hi")));
    assert!(msg.contains("failed") && msg.contains("default:2"), "{msg}");
}

#[test]
fn bad_requests_are_rejected() {
    let t = ChatTemplate::load(&fixture("qwen2-f32"), None)
        .unwrap()
        .unwrap();
    let msg = request_error(t.render(&ChatRequest::default()));
    assert!(msg.contains("empty conversation"), "{msg}");

    let mut req = user("hi");
    req.messages[0].tool_calls.push(ToolCall {
        name: "f".into(),
        arguments: json!({}),
        id: None,
    });
    let msg = request_error(t.render(&req));
    assert!(msg.contains("only assistant messages"), "{msg}");

    let mut req = user("hi");
    req.extra.insert("messages".into(), json!([]));
    let msg = request_error(t.render(&req));
    assert!(msg.contains("\"messages\""), "{msg}");

    assert!(request_error("developer".parse::<Role>()).contains("developer"));
    let call = ToolCall::from_json_arguments("f", r#"{"a": [1, 2]}"#, Some("x".into())).unwrap();
    assert_eq!(call.arguments, json!({"a": [1, 2]}));
    assert!(request_error(ToolCall::from_json_arguments("f", "{", None)).contains("\"f\""));
}

#[test]
fn template_selection_follows_transformers() {
    let dir = model_dir(
        json!({"chat_template": [
            {"name": "tool_use", "template": "tools:{{ tools | length if tools else 0 }}"},
            {"name": "rag", "template": "rag"},
        ]}),
        &[],
    );
    let t = ChatTemplate::load(dir.path(), None).unwrap().unwrap();
    // No default: fine with tools (tool_use), an error without.
    let mut req = user("hi");
    req.tools
        .push(json!({"type": "function", "function": {"name": "f"}}));
    assert_eq!(t.render(&req).unwrap(), "tools:1");
    let msg = request_error(t.render(&user("hi")));
    assert!(msg.contains("tool_use, rag"), "{msg}");
    // Pinned by name, whatever the tools.
    let t = ChatTemplate::load(dir.path(), Some("tool_use"))
        .unwrap()
        .unwrap();
    assert_eq!(t.render(&user("hi")).unwrap(), "tools:0");
}

#[test]
fn special_tokens_as_transformers_names_them() {
    let dir = model_dir(
        json!({
            "bos_token": {"__type": "AddedToken", "content": "<s>"},
            "eos_token": "</s>",
            "pad_token": null,
            "image_token": "<image>",
            "extra_special_tokens": {"audio_token": "<audio>"},
            "chat_template": "{{ bos_token }}{{ eos_token }}{{ image_token }}{{ audio_token }}{{ pad_token is defined }}",
        }),
        &[],
    );
    let t = ChatTemplate::load(dir.path(), None).unwrap().unwrap();
    assert_eq!(t.render(&user("hi")).unwrap(), "<s></s><image><audio>False");
    // special_tokens_map.json counts only without added_tokens_decoder.
    let dir = model_dir(
        json!({"eos_token": "</s>", "chat_template": "{{ eos_token }}"}),
        &[(
            "special_tokens_map.json",
            r#"{"eos_token": {"content": "<|end|>"}}"#,
        )],
    );
    let t = ChatTemplate::load(dir.path(), None).unwrap().unwrap();
    assert_eq!(t.render(&user("hi")).unwrap(), "<|end|>");
}

#[test]
fn chat_template_is_send_and_sync() {
    fn shareable<T: Send + Sync>() {}
    shareable::<ChatTemplate>();
    shareable::<ChatRequest>();
}

/// The fuel budget is at least 100 times what real templates need: every
/// realistic template renders a 60-message tool-calling conversation within
/// FUEL / 100 instructions.
#[test]
fn real_templates_need_a_hundredth_of_the_fuel() {
    let tool = serde_json::json!({"type": "function", "function": {"name": "get_weather",
        "description": "Weather in a city", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}});
    let mut messages = vec![Message::new(Role::System, "You are helpful.")];
    for i in 0..30 {
        messages.push(Message::new(
            Role::User,
            format!("Question {i}: what is the weather?"),
        ));
        messages.push(Message::new(
            Role::Assistant,
            format!("Answer {i}: sunny and mild."),
        ));
    }
    messages.push(Message::new(Role::User, "And tomorrow?"));
    let req = ChatRequest {
        messages,
        tools: vec![tool.clone(), tool],
        add_generation_prompt: true,
        extra: Default::default(),
        reasoning_effort: None,
    };
    let mut rendered = 0;
    for name in ["llama3", "mistral", "qwen25", "qwen3"] {
        let dir = data().join("templates").join(name);
        let mut t = ChatTemplate::load(&dir, None).unwrap().unwrap();
        t.set_fuel(FUEL / 100);
        match t.render(&req) {
            Ok(text) => assert!(text.len() > 1000, "{name}"),
            // Mistral's template refuses a system message with tools here; that
            // is its own rule, not the budget.
            Err(e) => assert!(!e.to_string().contains("budget"), "{name}: {e}"),
        }
        rendered += 1;
    }
    assert_eq!(rendered, 4);
}

// Reasoning effort

fn effort_template(source: &str) -> ChatTemplate {
    let dir = model_dir(json!({"chat_template": source}), &[]);
    ChatTemplate::load(dir.path(), None).unwrap().unwrap()
}

fn with_effort(effort: ReasoningEffort) -> ChatRequest {
    ChatRequest {
        reasoning_effort: Some(effort),
        ..user("hi")
    }
}

#[test]
fn reasoning_effort_sets_the_templates_own_variable() {
    // gpt-oss reads `reasoning_effort` (a level); it cannot turn reasoning off.
    let gpt = effort_template("Reasoning: {{ reasoning_effort | default('medium') }}");
    assert_eq!(gpt.render(&user("hi")).unwrap(), "Reasoning: medium");
    assert_eq!(
        gpt.render(&with_effort(ReasoningEffort::High)).unwrap(),
        "Reasoning: high"
    );
    // As gpt-oss's own template reads it: inside a macro, with a default.
    let harmony = effort_template(
        "{%- macro sys() -%}{%- if reasoning_effort is not defined %}{%- set reasoning_effort = 'medium' %}\
         {%- endif %}{{- 'Reasoning: ' + reasoning_effort }}{%- endmacro -%}{{- sys() }}",
    );
    assert_eq!(
        harmony.render(&with_effort(ReasoningEffort::Low)).unwrap(),
        "Reasoning: low"
    );
    let off = request_error(gpt.render(&with_effort(ReasoningEffort::Minimal)));
    assert!(off.contains("reasoning_effort \"minimal\""), "{off}");
    // Qwen3 reads `enable_thinking`: none and minimal are off, the rest on.
    let qwen = effort_template(
        "{% if enable_thinking is defined and not enable_thinking %}off{% else %}on{% endif %}",
    );
    assert_eq!(
        qwen.render(&with_effort(ReasoningEffort::None)).unwrap(),
        "off"
    );
    assert_eq!(
        qwen.render(&with_effort(ReasoningEffort::Low)).unwrap(),
        "on"
    );
    let mut contradicted = with_effort(ReasoningEffort::High);
    contradicted
        .extra
        .insert("enable_thinking".into(), json!(false));
    let msg = request_error(qwen.render(&contradicted));
    assert!(msg.contains("contradicts"), "{msg}");
    // A template with neither refuses it, naming the field.
    let plain = effort_template("{{ messages[0].content }}");
    assert_eq!(plain.render(&user("hi")).unwrap(), "hi");
    let msg = request_error(plain.render(&with_effort(ReasoningEffort::Medium)));
    assert!(
        msg.contains("reasoning_effort") && msg.contains("no reasoning setting"),
        "{msg}"
    );
}
