//! Fuzzing the GGUF reader and conversion (see grove-fuzzing): mutated tiny
//! models in float32 and in several block types must give a clear error or a
//! converted model, never a panic, and no single allocation may exceed what the
//! file could hold (16 bytes per byte of file: float32 out of 4-bit blocks is
//! 7x, a string list's entries 3x) plus 1 MiB.
use grove_fuzzing::LargestAlloc;
use grove_fuzzing::bytes::mutated;
use grove_gguf::GgufModel;
use grove_gguf::writer::{self, TensorSpec};
use proptest::prelude::*;

#[global_allocator]
static ALLOC: LargestAlloc = LargestAlloc::new();

/// The tiny llama, with its matrices re-typed: ggml type id and block bytes.
fn model(kinds: &[(u32, usize, usize)]) -> Vec<u8> {
    let (meta, mut tensors) = writer::tiny_llama();
    for (i, t) in tensors.iter_mut().enumerate() {
        if t.dims.len() != 2 || t.name == "token_embd.weight" {
            continue;
        }
        let (kind, block, bytes) = kinds[i % kinds.len()];
        if !(t.dims[0] as usize).is_multiple_of(block) {
            continue;
        }
        let n: u64 = t.dims.iter().product();
        let len = n as usize / block * bytes;
        *t = TensorSpec {
            name: t.name.clone(),
            dims: t.dims.clone(),
            kind,
            // Any bytes are valid blocks; small f16 scales keep values finite.
            data: (0..len).map(|j| (j * 37 % 23) as u8).collect(),
        };
    }
    writer::write(&meta, &tensors).0
}

fn check(bytes: &[u8]) {
    let tmp = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(tmp.path(), bytes).unwrap();
    ALLOC.reset();
    if let Ok(m) = GgufModel::open(tmp.path()) {
        let _ = m.vocab();
        for t in &m.plan.tensors {
            let _ = m.tensor(t);
        }
    }
    let largest = ALLOC.largest();
    assert!(
        largest <= 16 * bytes.len() + (1 << 20),
        "an allocation of {largest} bytes for a file of {}",
        bytes.len()
    );
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: grove_fuzzing::persistence("fuzz"),
        ..ProptestConfig::default()
    })]
    #[test]
    fn fuzz_gguf_float32(bytes in mutated(model(&[(0, 1, 4)]))) {
        check(&bytes);
    }

    #[test]
    fn fuzz_gguf_quantized(bytes in mutated(model(&[(2, 32, 18), (8, 32, 34), (12, 256, 144), (6, 32, 22)]))) {
        check(&bytes);
    }
}

/// The unmutated models convert.
#[test]
fn the_seeds_are_valid() {
    for bytes in [model(&[(0, 1, 4)]), model(&[(2, 32, 18), (8, 32, 34)])] {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), &bytes).unwrap();
        let m = GgufModel::open(tmp.path()).unwrap();
        m.vocab().unwrap();
        for t in &m.plan.tensors {
            m.tensor(t).unwrap();
        }
    }
}
