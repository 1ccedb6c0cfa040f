//! A small GGUF writer (version 3, alignment 32) for tests and tools: it
//! records where each field lands, so a test can corrupt exactly one, and it
//! makes the tiny models the fuzzers start from.
use std::collections::BTreeMap;

/// A metadata value.
#[derive(Debug, Clone)]
pub enum Val {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

/// One tensor: name, ggml dims (row length first), ggml type id, data.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub kind: u32,
    pub data: Vec<u8>,
}

/// Where fields landed in the written bytes.
#[derive(Debug, Default)]
pub struct Layout {
    pub tensor_count_at: usize,
    pub kv_count_at: usize,
    /// Per metadata key: where its value type (u32) is.
    pub value_type_at: BTreeMap<String, usize>,
    /// Per tensor: where its type (u32) and offset (u64) are.
    pub tensor_type_at: Vec<usize>,
    pub tensor_offset_at: Vec<usize>,
    pub data_at: usize,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn value(out: &mut Vec<u8>, v: &Val) {
    match v {
        Val::U32(x) => {
            out.extend(4u32.to_le_bytes());
            out.extend(x.to_le_bytes());
        }
        Val::F32(x) => {
            out.extend(6u32.to_le_bytes());
            out.extend(x.to_le_bytes());
        }
        Val::Bool(x) => {
            out.extend(7u32.to_le_bytes());
            out.push(u8::from(*x));
        }
        Val::Str(s) => {
            out.extend(8u32.to_le_bytes());
            string(out, s);
        }
        Val::Strs(v) => {
            out.extend(9u32.to_le_bytes());
            out.extend(8u32.to_le_bytes());
            out.extend((v.len() as u64).to_le_bytes());
            for s in v {
                string(out, s);
            }
        }
        Val::I32s(v) => {
            out.extend(9u32.to_le_bytes());
            out.extend(5u32.to_le_bytes());
            out.extend((v.len() as u64).to_le_bytes());
            for x in v {
                out.extend(x.to_le_bytes());
            }
        }
    }
}

/// Writes a version-3 GGUF file (alignment 32) and where its fields are.
pub fn write(metadata: &[(&str, Val)], tensors: &[TensorSpec]) -> (Vec<u8>, Layout) {
    let mut out = Vec::new();
    let mut layout = Layout::default();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    layout.tensor_count_at = out.len();
    out.extend((tensors.len() as u64).to_le_bytes());
    layout.kv_count_at = out.len();
    out.extend((metadata.len() as u64).to_le_bytes());
    for (key, v) in metadata {
        string(&mut out, key);
        layout.value_type_at.insert((*key).to_owned(), out.len());
        value(&mut out, v);
    }
    let mut offset = 0u64;
    for t in tensors {
        string(&mut out, &t.name);
        out.extend((t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend(d.to_le_bytes());
        }
        layout.tensor_type_at.push(out.len());
        out.extend(t.kind.to_le_bytes());
        layout.tensor_offset_at.push(out.len());
        out.extend(offset.to_le_bytes());
        offset += (t.data.len() as u64).div_ceil(32) * 32;
    }
    while out.len() % 32 != 0 {
        out.push(0);
    }
    layout.data_at = out.len();
    for t in tensors {
        out.extend(&t.data);
        while out.len() % 32 != 0 {
            out.push(0);
        }
    }
    (out, layout)
}

/// A float32 tensor of `dims` (ggml order) with small deterministic values.
pub fn f32_tensor(name: &str, dims: &[u64], seed: u32) -> TensorSpec {
    let n: u64 = dims.iter().product();
    let data = (0..n)
        .flat_map(|i| {
            let x = ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32;
            ((x - 500.0) / 5000.0).to_le_bytes()
        })
        .collect();
    TensorSpec {
        name: name.to_owned(),
        dims: dims.to_vec(),
        kind: 0,
        data,
    }
}

/// A complete tiny llama model (hidden 32, 1 layer, 2 heads, vocab 64) with a
/// byte-level vocabulary, in float32.
pub fn tiny_llama() -> (Vec<(&'static str, Val)>, Vec<TensorSpec>) {
    let (hidden, ffn, vocab) = (32u64, 64u64, 64u64);
    let tokens: Vec<String> = (0..vocab).map(|i| format!("t{i}")).collect();
    let metadata = vec![
        ("general.architecture", Val::Str("llama".into())),
        ("llama.block_count", Val::U32(1)),
        ("llama.context_length", Val::U32(256)),
        ("llama.embedding_length", Val::U32(hidden as u32)),
        ("llama.feed_forward_length", Val::U32(ffn as u32)),
        ("llama.attention.head_count", Val::U32(2)),
        ("llama.attention.layer_norm_rms_epsilon", Val::F32(1e-5)),
        ("tokenizer.ggml.model", Val::Str("gpt2".into())),
        ("tokenizer.ggml.tokens", Val::Strs(tokens)),
        (
            "tokenizer.ggml.token_type",
            Val::I32s(vec![1; vocab as usize]),
        ),
        ("tokenizer.ggml.merges", Val::Strs(vec![])),
        ("tokenizer.ggml.eos_token_id", Val::U32(1)),
    ];
    let mut tensors = vec![
        f32_tensor("token_embd.weight", &[hidden, vocab], 1),
        f32_tensor("output_norm.weight", &[hidden], 2),
    ];
    for (i, (name, dims)) in [
        ("attn_norm", vec![hidden]),
        ("ffn_norm", vec![hidden]),
        ("attn_q", vec![hidden, hidden]),
        ("attn_k", vec![hidden, hidden]),
        ("attn_v", vec![hidden, hidden]),
        ("attn_output", vec![hidden, hidden]),
        ("ffn_gate", vec![hidden, ffn]),
        ("ffn_up", vec![hidden, ffn]),
        ("ffn_down", vec![ffn, hidden]),
    ]
    .into_iter()
    .enumerate()
    {
        tensors.push(f32_tensor(
            &format!("blk.0.{name}.weight"),
            &dims,
            10 + i as u32,
        ));
    }
    (metadata, tensors)
}
