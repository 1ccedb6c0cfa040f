//! Fuzzing what the runner reads from a model directory and from clients (see
//! grove-fuzzing): mutated config.json, safetensors headers and index files,
//! tokenizer.json and tokenizer_config.json, chat templates, and runner
//! protos. Each must load or fail with a clear error; never panic, never make
//! one Rust allocation larger than 16 bytes per input byte plus 8 MiB, never
//! make MLX allocate more than 64 MiB for a model whose weights are ~1 MB.
mod common;
use common::fixture;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use grove_fuzzing::LargestAlloc;
use grove_fuzzing::{bytes, json};
use grove_proto::runner::v1 as pb;
use grove_runner::chat_template::{ChatTemplate, Source, TemplateSpec};
use grove_runner::model::{self, CpuDtypes};
use grove_runner::request;
use grove_runner::tokenizer::Tokenizer;
use mlx_rs::Array;
use proptest::prelude::*;
use prost::Message;

#[global_allocator]
static ALLOC: LargestAlloc = LargestAlloc::new();

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&read(path)).unwrap()
}

/// The tensors of a fixture, loaded once.
fn tensors(name: &'static str) -> HashMap<String, Array> {
    static CACHE: OnceLock<std::sync::Mutex<HashMap<&'static str, HashMap<String, Array>>>> =
        OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap();
    cache
        .entry(name)
        .or_insert_with(|| {
            model::weights::Weights::load(&fixture(name))
                .unwrap()
                .into_map()
        })
        .clone()
}

/// A copy of a fixture directory with `file` replaced by `contents`.
fn dir_with(name: &str, file: &str, contents: &[u8]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap().flatten() {
        let target = tmp.path().join(entry.file_name());
        std::os::unix::fs::symlink(entry.path(), &target).unwrap();
    }
    let _ = std::fs::remove_file(tmp.path().join(file));
    std::fs::write(tmp.path().join(file), contents).unwrap();
    tmp
}

fn check_alloc(input: usize) {
    let largest = ALLOC.largest();
    assert!(
        largest <= 16 * input + (8 << 20),
        "an allocation of {largest} bytes for an input of {input}"
    );
}

fn check_mlx_peak() {
    let peak = mlx_rs::memory::peak_memory().unwrap_or(0);
    assert!(peak <= 64 << 20, "MLX peaked at {peak} bytes");
    let _ = mlx_rs::memory::reset_peak_memory();
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: grove_fuzzing::persistence("fuzz"),
        ..ProptestConfig::default()
    })]
    /// config.json: any field replaced or removed; the model loads or the
    /// error names the config.
    #[test]
    fn fuzz_config_json(config in json::mutated(read_json(&fixture("qwen3-f32").join("config.json")))) {
        ALLOC.reset();
        let text = config.to_string();
        let _ = model::load_parts(Path::new("config.json"), config, tensors("qwen3-f32"), CpuDtypes::Float32);
        check_alloc(text.len());
        check_mlx_peak();
    }

    /// A quantized config with mutated fields.
    #[test]
    fn fuzz_quantized_config(config in json::mutated(read_json(&fixture("llama-q4").join("config.json")))) {
        ALLOC.reset();
        let text = config.to_string();
        let _ = model::load_parts(Path::new("config.json"), config, tensors("llama-q4"), CpuDtypes::Float32);
        check_alloc(text.len());
        check_mlx_peak();
    }

    /// safetensors files with mutated headers and data.
    #[test]
    fn fuzz_safetensors(file in bytes::mutated(read(&fixture("qwen3-q4").join("model.safetensors")))) {
        let dir = dir_with("qwen3-q4", "model.safetensors", &file);
        ALLOC.reset();
        let _ = model::load_dir(dir.path(), CpuDtypes::Float32);
        check_alloc(file.len());
        check_mlx_peak();
    }

    /// model.safetensors.index.json with mutated entries.
    #[test]
    fn fuzz_safetensors_index(index in json::mutated(read_json(&fixture("qwen2-f32").join("model.safetensors.index.json")))) {
        let text = index.to_string();
        let dir = dir_with("qwen2-f32", "model.safetensors.index.json", text.as_bytes());
        ALLOC.reset();
        let _ = model::load_dir(dir.path(), CpuDtypes::Float32);
        check_alloc(text.len());
    }

    /// tokenizer.json, mutated as JSON and as bytes.
    #[test]
    fn fuzz_tokenizer_json(t in json::mutated(read_json(&fixture("qwen3-f32").join("tokenizer.json")))) {
        let text = t.to_string();
        let dir = dir_with("qwen3-f32", "tokenizer.json", text.as_bytes());
        ALLOC.reset();
        if let Ok(tok) = Tokenizer::load(dir.path(), &serde_json::Value::Null) {
            let _ = tok.encode("Hello world 123 <|im_end|>", true);
            let _ = tok.decode(&[1, 2, 3, 1000, 5000]);
        }
        check_alloc(text.len());
    }

    #[test]
    fn fuzz_tokenizer_json_bytes(t in bytes::mutated(read(&fixture("llama-f32").join("tokenizer.json")))) {
        let dir = dir_with("llama-f32", "tokenizer.json", &t);
        ALLOC.reset();
        if let Ok(tok) = Tokenizer::load(dir.path(), &serde_json::Value::Null) {
            let _ = tok.encode("Hello world", true);
        }
        check_alloc(t.len());
    }

    /// tokenizer_config.json: special tokens and chat templates.
    #[test]
    fn fuzz_tokenizer_config(c in json::mutated(read_json(&fixture("qwen3-f32").join("tokenizer_config.json")))) {
        ALLOC.reset();
        let dir = fixture("qwen3-f32");
        if let Ok(tok) = Tokenizer::load(&dir, &serde_json::Value::Null) {
            let inner = tok.inner().clone();
            let _ = Tokenizer::from_parts(inner, &c, &c, &c);
        }
        if let Ok(Some(spec)) = TemplateSpec::from_tokenizer_config(&c, Path::new("tokenizer_config.json")) {
            let _ = ChatTemplate::from_spec(&spec, None);
        }
        check_alloc(c.to_string().len());
    }

    /// Chat templates: a real one mutated byte by byte must parse or fail.
    #[test]
    fn fuzz_chat_template_source(t in bytes::mutated(read(&fixture("qwen3-q4").join("chat_template.jinja")))) {
        let text = String::from_utf8_lossy(&t).into_owned();
        let spec = TemplateSpec {
            sources: vec![Source { name: "default".into(), text, origin: PathBuf::from("t.jinja") }],
            special_tokens: Default::default(),
        };
        ALLOC.reset();
        let _ = ChatTemplate::from_spec(&spec, None);
        check_alloc(t.len());
    }

    /// Runner requests as bytes on the wire: decoded (or not) and checked.
    #[test]
    fn fuzz_generate_request(wire in bytes::mutated(sample_request().encode_to_vec())) {
        ALLOC.reset();
        if let Ok(req) = pb::GenerateRequest::decode(wire.as_slice()) {
            let _ = request::job(req, 1024);
        }
        if let Ok(req) = pb::PrewarmRequest::decode(wire.as_slice()) {
            let _ = request::tools(&req.tools_json);
            let _ = request::template_vars(req.template_vars_json);
        }
        check_alloc(wire.len());
    }
}

fn sample_request() -> pb::GenerateRequest {
    pb::GenerateRequest {
        input: Some(pb::generate_request::Input::Chat(pb::Chat {
            messages: vec![pb::Message {
                role: pb::Role::User as i32,
                content: "What is the capital of France?".into(),
                tool_calls: vec![pb::ToolCall {
                    id: "c1".into(),
                    name: "f".into(),
                    arguments_json: "{\"a\": 1}".into(),
                }],
                ..Default::default()
            }],
            tools_json: vec!["{\"type\": \"function\"}".into()],
            template_vars_json: [("x".to_owned(), "[1, 2]".to_owned())].into(),
            ..Default::default()
        })),
        sampling: Some(pb::SamplingOptions {
            temperature: 0.7,
            top_k: Some(40),
            top_p: Some(0.9),
            logit_bias: [(5, 1.0)].into(),
            seed: Some(3),
            ..Default::default()
        }),
        stop: vec!["\n\n".into()],
        share_prefill: true,
        max_tokens: 16,
        num_ctx: 512,
        prefill_chunk: 64,
        kv_bits: Some(4),
        kv_group_size: Some(64),
        quantized_kv_start: Some(0),
        constraint: Some(pb::Constraint {
            kind: Some(pb::constraint::Kind::JsonSchema(
                r#"{"type": "object", "properties": {"a": {"type": "integer"}}}"#.into(),
            )),
        }),
        top_logprobs: Some(5),
    }
}

/// Found by fuzzing: a config claiming 65535 layers made the decoder reserve
/// room for all of them (31 MB) before finding that the tensors hold two.
#[test]
fn regression_a_huge_layer_count_allocates_nothing() {
    let mut config = read_json(&fixture("qwen3-f32").join("config.json"));
    config["num_hidden_layers"] = 4000.into();
    ALLOC.reset();
    let err = model::load_parts(
        Path::new("config.json"),
        config,
        tensors("qwen3-f32"),
        CpuDtypes::Float32,
    )
    .err()
    .expect("65535 layers loaded from two");
    assert!(err.to_string().contains("model.layers.2"), "{err}");
    check_alloc(400);
}

/// Sizes that only a config claims never size an allocation: a head of two
/// billion features (rotary tables are built from the config before any
/// tensor is read) and two billion layers (per-layer tables likewise).
#[test]
fn regression_huge_claimed_sizes_allocate_nothing() {
    for (key, value) in [
        ("head_dim", 2_147_483_646i64),
        ("num_hidden_layers", 2_147_483_647),
    ] {
        let mut config = read_json(&fixture("llama-q4").join("config.json"));
        config[key] = value.into();
        ALLOC.reset();
        let err = model::load_parts(
            Path::new("config.json"),
            config,
            tensors("llama-q4"),
            CpuDtypes::Float32,
        )
        .err()
        .expect("loaded");
        assert!(err.to_string().contains(&value.to_string()), "{key}: {err}");
        check_alloc(400);
        check_mlx_peak();
    }
}
