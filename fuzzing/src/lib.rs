//! Strategies for Grove's fuzz tests (proptest): valid inputs mutated the ways
//! hostile or damaged files differ from good ones. Each crate's `fuzz_*` tests
//! run these against its parsers; the rule they check is a clear error, no
//! panic, no allocation beyond the input or a documented cap.
//!
//! The budget is proptest's: `PROPTEST_CASES` (256 by default, as `make test`
//! runs them; `make fuzz` runs many more). A failing input's seed is saved by
//! proptest in the file [`persistence`] names and replayed first on every
//! later run, and each input found gets its own regression test.
//!
//! # Layout
//! - [`bytes`]: byte-level mutations of a file.
//! - [`json`]: value-level mutations of a JSON document.
//! - [`LargestAlloc`]: a global allocator that records the largest single
//!   allocation, so a test can check that no header made the parser allocate
//!   what it merely claimed.
use std::alloc::{GlobalAlloc, Layout, System};

use proptest::prelude::*;
use serde_json::Value;

thread_local! {
    /// The largest allocation this thread made since its last reset.
    static LARGEST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The system allocator, recording per thread the largest allocation since
/// the last [`LargestAlloc::reset`] (tests run in parallel threads). Install
/// it in a test binary with
/// `#[global_allocator] static ALLOC: LargestAlloc = LargestAlloc::new();`.
pub struct LargestAlloc {
    _private: (),
}

impl LargestAlloc {
    pub const fn new() -> Self {
        Self { _private: () }
    }

    /// Forgets what this thread recorded.
    pub fn reset(&self) {
        LARGEST.with(|l| l.set(0));
    }

    /// The largest allocation (in bytes) this thread made since its last reset.
    pub fn largest(&self) -> usize {
        LARGEST.with(|l| l.get())
    }
}

fn record(size: usize) {
    // A thread being torn down has no slot left: nothing to record.
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

impl Default for LargestAlloc {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for LargestAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Values that break size and count fields.
const INTERESTING: [u64; 12] = [
    0,
    1,
    2,
    7,
    255,
    65_535,
    (1 << 31) - 1,
    1 << 31,
    u32::MAX as u64,
    1 << 40,
    i64::MAX as u64,
    u64::MAX,
];

/// One change to a byte string.
#[derive(Debug, Clone)]
enum Edit {
    /// Set the byte at (index mod len).
    Byte(usize, u8),
    /// Write an interesting value as a little-endian u32 or u64 at (index mod len).
    Field(usize, u64, bool),
    /// Cut the input at (index mod len).
    Truncate(usize),
    /// Insert bytes at (index mod len).
    Insert(usize, Vec<u8>),
    /// Copy a range over another (moves a length to where a count was, ...).
    Splice(usize, usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Byte(i, b)),
        3 => (any::<usize>(), prop::sample::select(&INTERESTING[..]), any::<bool>())
            .prop_map(|(i, v, wide)| Edit::Field(i, v, wide)),
        1 => any::<usize>().prop_map(Edit::Truncate),
        1 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        1 => (any::<usize>(), any::<usize>(), 1usize..16)
            .prop_map(|(a, b, n)| Edit::Splice(a, b, n)),
    ]
}

fn apply(mut data: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        if data.is_empty() {
            break;
        }
        let len = data.len();
        match e {
            Edit::Byte(i, b) => data[i % len] = *b,
            Edit::Field(i, v, wide) => {
                let bytes = if *wide {
                    v.to_le_bytes().to_vec()
                } else {
                    (*v as u32).to_le_bytes().to_vec()
                };
                let at = i % len;
                for (k, b) in bytes.iter().enumerate() {
                    if at + k < len {
                        data[at + k] = *b;
                    }
                }
            }
            Edit::Truncate(i) => data.truncate(i % len),
            Edit::Insert(i, b) => {
                let at = i % len;
                data.splice(at..at, b.iter().copied());
            }
            Edit::Splice(a, b, n) => {
                let (a, b) = (a % len, b % len);
                let n = (*n).min(len - a).min(len - b);
                let chunk = data[a..a + n].to_vec();
                data[b..b + n].copy_from_slice(&chunk);
            }
        }
    }
    data
}

/// Byte-level mutations.
pub mod bytes {
    use super::*;

    /// `valid` with 1 to 8 random edits (bytes, size fields, truncation,
    /// insertion, splices).
    pub fn mutated(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(edit(), 1..8).prop_map(move |edits| apply(valid.clone(), &edits))
    }
}

/// JSON-level mutations.
pub mod json {
    use super::*;

    /// Values a field may be replaced with.
    fn hostile() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            prop::sample::select(&INTERESTING[..]).prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            prop_oneof![
                Just(-1.0f64),
                Just(0.0),
                Just(1e308),
                Just(-1e-308),
                Just(0.5)
            ]
            .prop_map(Value::from),
            "[a-z_]{0,12}".prop_map(Value::from),
            Just(Value::Array(vec![])),
            Just(Value::Object(Default::default())),
            Just(serde_json::json!([1, "x", null])),
        ]
    }

    /// Every path (object keys, array indices) in `v`.
    fn paths(v: &Value, prefix: Vec<Step>, out: &mut Vec<Vec<Step>>) {
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    let mut p = prefix.clone();
                    p.push(Step::Key(k.clone()));
                    out.push(p.clone());
                    paths(child, p, out);
                }
            }
            Value::Array(a) => {
                for (i, child) in a.iter().enumerate().take(8) {
                    let mut p = prefix.clone();
                    p.push(Step::Index(i));
                    out.push(p.clone());
                    paths(child, p, out);
                }
            }
            _ => {}
        }
    }

    #[derive(Debug, Clone)]
    enum Step {
        Key(String),
        Index(usize),
    }

    fn at<'a>(v: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
        let mut cur = v;
        for s in path {
            cur = match (s, cur) {
                (Step::Key(k), Value::Object(m)) => m.get_mut(k)?,
                (Step::Index(i), Value::Array(a)) => a.get_mut(*i)?,
                _ => return None,
            };
        }
        Some(cur)
    }

    /// `valid` with 1 to 4 of its fields replaced by hostile values, or removed.
    pub fn mutated(valid: Value) -> impl Strategy<Value = Value> {
        let mut all = Vec::new();
        paths(&valid, Vec::new(), &mut all);
        let n = all.len().max(1);
        prop::collection::vec((0..n, hostile(), any::<bool>()), 1..4).prop_map(move |edits| {
            let mut v = valid.clone();
            for (i, new, remove) in edits {
                let Some(path) = all.get(i) else { continue };
                if remove
                    && let Some((last, parent)) = path.split_last()
                    && let (Step::Key(k), Some(Value::Object(m))) = (last, at(&mut v, parent))
                {
                    m.remove(k);
                    continue;
                }
                if let Some(slot) = at(&mut v, path) {
                    *slot = new;
                }
            }
            v
        })
    }
}

/// Where a fuzz test binary keeps the seeds of failing inputs
/// (`tests/proptest-regressions/NAME.txt` of the crate, committed).
pub fn persistence(
    name: &'static str,
) -> Option<Box<dyn proptest::test_runner::FailurePersistence>> {
    let path: &'static str =
        Box::leak(format!("tests/proptest-regressions/{name}.txt").into_boxed_str());
    Some(Box::new(
        proptest::test_runner::FileFailurePersistence::Direct(path),
    ))
}
