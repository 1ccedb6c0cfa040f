//! Grove's protocols: `grove.v1` (the public API) and `grove.runner.v1` (daemon
//! to runner). The .proto files and their generated Rust arrive with the runner
//! and daemon issues; the crate exists now so the workspace layout is the real one.
//!
//! # Layout
//! - `grove/v1/grove.proto`, `grove/runner/v1/runner.proto` (to come).
