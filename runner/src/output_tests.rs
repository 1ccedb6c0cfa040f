use super::*;

fn qwen() -> OutputFormat {
    OutputFormat {
        think: Some(("<think>".into(), "</think>".into())),
        tools: Some(ToolFormat::Hermes),
        ..Default::default()
    }
}

fn run(format: OutputFormat, text: &str, n: usize) -> (Vec<Piece>, Ending) {
    feed(Box::new(OutputParser::new(format)), text, n)
}

fn every_split(format: OutputFormat, text: &str) -> (Vec<Piece>, Ending) {
    let whole = run(format.clone(), text, text.len().max(1));
    for n in 1..8 {
        let (pieces, ending) = run(format.clone(), text, n);
        assert_eq!(
            strip_ids(&pieces),
            strip_ids(&whole.0),
            "pieces of {n} bytes"
        );
        assert_eq!(ending, whole.1);
    }
    whole
}

fn strip_ids(p: &[Piece]) -> Vec<Piece> {
    p.iter()
        .map(|p| match p {
            Piece::ToolCall(c) => Piece::ToolCall(Call {
                id: String::new(),
                ..c.clone()
            }),
            p => p.clone(),
        })
        .collect()
}

fn tool(name: &str, args: &str) -> Piece {
    Piece::ToolCall(Call {
        id: String::new(),
        name: name.into(),
        arguments_json: args.into(),
    })
}

#[test]
fn hermes_calls_and_thinking_never_leak_into_content() {
    let text = "<think>\nweather first</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": 1}\"}\n</tool_call>";
    let (pieces, ending) = every_split(qwen(), text);
    assert_eq!(
        strip_ids(&pieces),
        vec![
            Piece::Thinking("\nweather first".into()),
            Piece::Content("Let me check.".into()),
            tool("get_weather", r#"{"city":"Paris"}"#),
            tool("get_time", r#"{"tz":1}"#),
        ]
    );
    assert_eq!(
        ending,
        Ending {
            tool_calls: 2,
            malformed: false
        }
    );
}

#[test]
fn a_reply_that_starts_inside_thinking() {
    let f = OutputFormat {
        starts_thinking: true,
        ..qwen()
    };
    let (pieces, _) = every_split(f, "hmm < 3</think>The answer < is 4 <tool");
    assert_eq!(
        pieces,
        vec![
            Piece::Thinking("hmm < 3".into()),
            Piece::Content("The answer < is 4 <tool".into())
        ]
    );
}

#[test]
fn malformed_calls_come_back_as_content() {
    let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {oops}\n</tool_call>";
    let (pieces, ending) = every_split(qwen(), text);
    assert_eq!(pieces, vec![Piece::Content(text.into())]);
    assert!(ending.malformed);
    // Cut off inside a call (max tokens).
    let (pieces, ending) = every_split(qwen(), "ok <tool_call>{\"name\": \"f\"");
    assert_eq!(
        pieces,
        vec![Piece::Content("ok <tool_call>{\"name\": \"f\"".into())]
    );
    assert_eq!(
        ending,
        Ending {
            tool_calls: 0,
            malformed: true
        }
    );
}

#[test]
fn without_tools_markup_is_content() {
    let f = OutputFormat {
        tools: None,
        ..qwen()
    };
    let text = "<tool_call>{\"name\": \"f\"}</tool_call>";
    assert_eq!(every_split(f, text).0, vec![Piece::Content(text.into())]);
}

#[test]
fn mistral_both_syntaxes() {
    let f = OutputFormat {
        tools: Some(ToolFormat::Mistral),
        ..Default::default()
    };
    let (p, e) = every_split(
        f.clone(),
        "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}, \"id\": \"abc123xyz\"}]",
    );
    assert_eq!(
        p,
        vec![Piece::ToolCall(Call {
            id: "abc123xyz".into(),
            name: "a".into(),
            arguments_json: r#"{"x":1}"#.into()
        })]
    );
    assert_eq!(e.tool_calls, 1);
    let (p, _) = every_split(f.clone(), "[TOOL_CALLS]a[ARGS]{\"x\": [1, 2]}b[ARGS]{}");
    assert_eq!(
        strip_ids(&p),
        vec![tool("a", r#"{"x":[1,2]}"#), tool("b", "{}")]
    );
    let (p, e) = every_split(f, "Sure.[TOOL_CALLS]a[ARGS]{\"x\": ");
    assert_eq!(
        p,
        vec![Piece::Content("Sure.[TOOL_CALLS]a[ARGS]{\"x\": ".into())]
    );
    assert!(e.malformed);
}

#[test]
fn llama3_json_replies() {
    let f = OutputFormat {
        tools: Some(ToolFormat::Llama3),
        ..Default::default()
    };
    let (p, _) = every_split(
        f.clone(),
        "  {\"name\": \"f\", \"parameters\": {\"q\": \"x\"}}",
    );
    assert_eq!(strip_ids(&p), vec![tool("f", r#"{"q":"x"}"#)]);
    let (p, _) = every_split(
        f.clone(),
        "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}",
    );
    assert_eq!(strip_ids(&p), vec![tool("f", "{}")]);
    let (p, e) = every_split(f.clone(), "Hello {there}");
    assert_eq!(p, vec![Piece::Content("Hello {there}".into())]);
    assert!(!e.malformed);
    let (p, e) = every_split(f, "{not json");
    assert_eq!(p, vec![Piece::Content("{not json".into())]);
    assert!(e.malformed);
}

#[test]
fn xml_formats_use_the_schema_for_types() {
    let tools = ToolSchemas::from_tools(&[serde_json::json!({"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "integer"}}}}})]);
    let f = OutputFormat {
        tools: Some(ToolFormat::QwenXml),
        schemas: tools.clone(),
        ..Default::default()
    };
    let (p, _) = every_split(
        f,
        "<tool_call>\n<function=f>\n<parameter=s>\n42\n</parameter>\n<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>",
    );
    assert_eq!(strip_ids(&p), vec![tool("f", r#"{"s":"42","n":7}"#)]);
    let f = OutputFormat {
        tools: Some(ToolFormat::Glm),
        schemas: tools,
        ..Default::default()
    };
    let (p, _) = every_split(
        f,
        "<tool_call>f\n<arg_key>s</arg_key>\n<arg_value>42</arg_value>\n<arg_key>n</arg_key><arg_value>7</arg_value></tool_call>",
    );
    assert_eq!(strip_ids(&p), vec![tool("f", r#"{"s":"42","n":7}"#)]);
}

#[test]
fn gemma_formats() {
    let f = OutputFormat {
        tools: Some(ToolFormat::Gemma4),
        ..Default::default()
    };
    let (p, _) = every_split(
        f,
        "<|tool_call>call:get_weather{city:<|\"|>Paris, {France}<|\"|>,days:3,opts:{units:<|\"|>C<|\"|>,list:[1,2]}}<tool_call|>",
    );
    assert_eq!(
        strip_ids(&p),
        vec![tool(
            "get_weather",
            r#"{"city":"Paris, {France}","days":3,"opts":{"units":"C","list":[1,2]}}"#
        )]
    );
    let f = OutputFormat {
        tools: Some(ToolFormat::FunctionGemma),
        ..Default::default()
    };
    let (p, _) = every_split(
        f,
        "<start_function_call>call:f{a:<escape>x<escape>}<end_function_call>",
    );
    assert_eq!(strip_ids(&p), vec![tool("f", r#"{"a":"x"}"#)]);
}

#[test]
fn formats_are_detected_from_templates() {
    assert_eq!(
        ToolFormat::detect("{{ '<tool_call>\\n' }}{{ tool_call.name }}"),
        Some(ToolFormat::Hermes)
    );
    assert_eq!(
        ToolFormat::detect("<tool_call>\n<function="),
        Some(ToolFormat::QwenXml)
    );
    assert_eq!(
        ToolFormat::detect("[TOOL_CALLS]"),
        Some(ToolFormat::Mistral)
    );
    assert_eq!(
        ToolFormat::detect("<tool_call>{{ name }}<arg_key>"),
        Some(ToolFormat::Glm)
    );
    assert_eq!(
        ToolFormat::detect("<|python_tag|>"),
        Some(ToolFormat::Llama3)
    );
    assert_eq!(ToolFormat::detect("{{ messages }}"), None);
    let think = ("<think>".to_owned(), "</think>".to_owned());
    assert!(ends_in_thinking("<|im_start|>assistant\n<think>\n", &think));
    assert!(!ends_in_thinking("<think>\n\n</think>\n\n", &think));
}

#[test]
fn junk_never_panics() {
    for text in [
        "<tool_call>",
        "</think><think>",
        "[TOOL_CALLS]",
        "<tool_call>\u{1F600}</tool_call>",
        "call:{",
        "<|tool_call>call:f{a:<|\"|>}<tool_call|>",
    ] {
        for format in [
            ToolFormat::Hermes,
            ToolFormat::QwenXml,
            ToolFormat::Glm,
            ToolFormat::Mistral,
            ToolFormat::Llama3,
            ToolFormat::Gemma4,
            ToolFormat::FunctionGemma,
        ] {
            let f = OutputFormat {
                tools: Some(format),
                ..qwen()
            };
            let _ = every_split(f, text);
        }
    }
}
