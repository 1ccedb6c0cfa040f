//! Helpers for Grove's end-to-end tests: where the fixture models and the
//! built binaries are, and how to run them.
//!
//! # Layout
//! - [`fixtures`]: the fixture directory (`GROVE_FIXTURES`, made by
//!   `tests/fixtures/make_fixtures.py`) and its `reference.json` files (mlx-lm's
//!   outputs).
//! - [`runner`]: running `grove-runner generate` and parsing its output.
//! - [`serve`]: a `grove-runner serve` process and a gRPC client on its socket.
pub mod fixtures;
pub mod runner;
pub mod serve;
