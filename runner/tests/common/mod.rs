//! What the runner's integration tests share.
use std::path::PathBuf;

/// A fixture model's directory (`make fixtures`; `GROVE_FIXTURES` or
/// `.grove/fixtures`), asserted to be there.
pub fn fixture(name: &str) -> PathBuf {
    let root = std::env::var_os("GROVE_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.grove/fixtures"));
    let dir = root.join(name);
    assert!(
        dir.join("config.json").is_file(),
        "fixture {} is missing (make fixtures)",
        dir.display()
    );
    dir
}
