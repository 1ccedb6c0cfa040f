//! Fuzzing what the daemon reads from clients and from disk (see
//! grove-fuzzing): public API requests as bytes on the wire, model names,
//! durations, ollama manifests, and the safetensors headers and configs it
//! sizes models from. Each must give a value or a clear error, never panic,
//! never allocate more than 16 bytes per input byte plus 8 MiB.
use grove_fuzzing::{LargestAlloc, bytes, json};
use grove_proto::v1 as pb;
use proptest::prelude::*;
use prost::Message;

use crate::api;
use crate::duration::KeepAlive;
use crate::model_size;
use crate::store::{ModelRef, OllamaName, OllamaStore};

#[global_allocator]
static ALLOC: LargestAlloc = LargestAlloc::new();

fn check_alloc(input: usize) {
    let largest = ALLOC.largest();
    assert!(
        largest <= 16 * input + (8 << 20),
        "an allocation of {largest} bytes for an input of {input}"
    );
}

fn chat_request() -> pb::ChatRequest {
    pb::ChatRequest {
        model: "org/model".into(),
        messages: vec![pb::Message {
            role: pb::Role::User as i32,
            content: "hello".into(),
            tool_calls: vec![pb::ToolCall {
                id: "1".into(),
                name: "f".into(),
                arguments_json: "{}".into(),
            }],
            ..Default::default()
        }],
        options: Some(pb::Options {
            temperature: Some(0.5),
            max_tokens: Some(8),
            stop: vec!["x".into()],
            logit_bias: [(3, -1.0)].into(),
            ..Default::default()
        }),
        keep_alive_ns: Some(-1),
        tools_json: vec!["{}".into()],
        ..Default::default()
    }
}

fn safetensors_file() -> Vec<u8> {
    let header = br#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"__metadata__":{"format":"mlx"}}"#;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(&[0u8; 16]);
    out
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: grove_fuzzing::persistence("daemon"),
        ..ProptestConfig::default()
    })]

    /// Chat and Generate requests as bytes: decoded (or not) and converted
    /// for the runner.
    #[test]
    fn fuzz_public_requests(wire in bytes::mutated(chat_request().encode_to_vec())) {
        ALLOC.reset();
        if let Ok(r) = pb::ChatRequest::decode(wire.as_slice()) {
            if let Ok(input) = api::chat_input(&r) {
                let _ = api::runner_request(input, r.options.clone());
            }
            let _ = r.keep_alive_ns.map(KeepAlive::from_nanos);
            let _ = ModelRef::parse(&r.model);
        }
        if let Ok(r) = pb::GenerateRequest::decode(wire.as_slice()) {
            let _ = ModelRef::parse(&r.model);
        }
        check_alloc(wire.len());
    }

    /// Model names and keep_alive durations as users type them.
    #[test]
    fn fuzz_names_and_durations(text in "\\PC{0,64}") {
        let _ = ModelRef::parse(&text);
        let _ = OllamaName::parse(&text);
        let _ = KeepAlive::parse(&text);
    }

    /// ollama manifests, mutated.
    #[test]
    fn fuzz_ollama_manifest(manifest in json::mutated(serde_json::json!({
        "schemaVersion": 2,
        "layers": [{"mediaType": "application/vnd.ollama.image.model",
                    "digest": format!("sha256:{}", "a".repeat(64)), "size": 4}]
    }))) {
        let store = tempfile::tempdir().unwrap();
        let dir = store.path().join("manifests/registry.ollama.ai/library/m");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("latest"), manifest.to_string()).unwrap();
        std::fs::create_dir_all(store.path().join("blobs")).unwrap();
        std::fs::write(store.path().join(format!("blobs/sha256-{}", "a".repeat(64))), b"GGUF").unwrap();
        let s = OllamaStore::new(store.path());
        let _ = s.list();
        let _ = s.resolve(&OllamaName::parse("m").unwrap());
    }

    /// Sizing a model from its safetensors header and config.json.
    #[test]
    fn fuzz_model_size(file in bytes::mutated(safetensors_file()),
                       config in json::mutated(serde_json::json!({
                           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                           "hidden_size": 64, "head_dim": 16, "max_position_embeddings": 4096,
                           "torch_dtype": "float32", "quantization": {"bits": 4, "group_size": 64}})))
    {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model.safetensors"), &file).unwrap();
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        ALLOC.reset();
        let _ = model_size::model_size(dir.path());
        let _ = model_size::parameter_count(dir.path(), &serde_json::json!({"quantization": {"bits": 4}}));
        check_alloc(file.len() + config.to_string().len());
    }
}
