//! Grove's daemon and CLI: one `grove-runner` process per model, scheduled
//! against memory, behind the public `grove.v1` gRPC API.
//!
//! # Layout
//! - [`cli`]: the `grove` command line; [`cli_pull`], [`cli_service`],
//!   [`cli_import`] its `pull`, `service` and `import` commands.
//! - [`daemon`]: `grove serve`, i.e. [`daemon::run`]`(config, shutdown)`.
//! - [`api`]: the `grove.v1.Grove` gRPC service.
//! - [`http`]: OpenAI's (chat, completions, Responses, embeddings), ollama's
//!   and Anthropic's HTTP APIs over the same service, on the same address,
//!   behind the same optional API key.
//! - [`sched`]: the scheduler actor: runner processes, memory budget, eviction,
//!   keep_alive, queues, crash recovery.
//! - [`runner_proc`]: starting, watching and stopping one `grove-runner`.
//! - [`mlx_wheels`]: the MLX wheels pip installed beside the runner (two
//!   backends in one environment are said at start).
//! - [`config`], [`duration`]: settings from GROVE_* and keep_alive parsing.
//! - [`resolve`], [`show`], [`model_size`]: model names, facts and sizes.
//! - [`pull_rpc`]: the daemon's `Pull` stream over [`store::pull`].
//! - [`store`]: the model store, i.e. the Hugging Face hub cache (names,
//!   snapshots, listing, removal) and `pull` from the hub.
//! - [`service`]: launchd and systemd user services.
pub mod api;
pub mod cli;
pub mod cli_import;
pub mod cli_pull;
pub mod cli_service;
pub mod config;
pub mod daemon;
pub mod duration;
#[cfg(test)]
mod fuzz_tests;
pub mod http;
pub mod mlx_wheels;
pub mod model_size;
pub mod pull_rpc;
pub mod resolve;
pub mod runner_proc;
pub mod sched;
pub mod service;
pub mod show;
pub mod store;
