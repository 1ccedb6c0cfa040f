//! Grove's runner: one process that owns MLX, one model and its KV cache.
//!
//! # Layout
//! - [`cli`]: the `grove-runner` command line (`generate`, `serve`).
//! - [`server`]: the `grove.runner.v1` gRPC service on a Unix socket;
//!   [`request`] checks and converts its requests.
//! - [`engine`]: the one thread that owns MLX, the model and the prompt cache,
//!   and runs every request in one continuously batched decode loop
//!   (admission, interleaved prefill, per-request sampling and stops), and
//!   embedding calls batched together between its steps.
//! - [`harmony`]: gpt-oss's Harmony channels split the same way.
//! - [`reply`]: a generation's stream, split by [`output`] when asked.
//! - [`chat`]: chat requests rendered (in a sandbox process) and tokenized
//!   before they reach the engine.
//! - [`memory`]: KV capacity and MLX limits from measured memory.
//! - [`source`]: a model path, a directory or a GGUF file, opened into the
//!   model, its tokenizer and its chat templates.
//! - [`model`]: config parsing, safetensors loading, GGUF conversion, the
//!   per-backend dtype policy, layers and one file per architecture (llama,
//!   mistral, qwen2, qwen3, ..., bert, an encoder that only embeds), and
//!   embeddings (pooled and normalized as the model's sentence-transformers
//!   files say).
//! - [`import`]: a GGUF file written out as an MLX model directory.
//! - [`logprobs`]: generated tokens' log-probabilities (top_logprobs).
//! - [`shard`]: tensor parallelism over MLX distributed: the group (ring or
//!   NCCL), each rank's slice of the weights, the launcher of a group.
//! - [`cache`]: per-layer KV buffers grown in 256-token steps, for one
//!   sequence or a left-padded batch.
//! - [`generate`]: one request alone: chunked prefill and the pipelined
//!   decode loop (the `generate` command and the reference for the batch).
//! - [`detokenize`]: streaming token ids to text pieces, as mlx-lm's
//!   streaming detokenizers do.
//! - [`output`]: a chat reply split into reasoning, tool calls (per
//!   family, [`tool_args`]) and content, streamed.
//! - [`tool_choice`]: a reply constrained to one tool call (tool_choice
//!   "required" or named).
//! - [`stop`]: stop strings over streamed text, holding back possible prefixes.
//! - [`grammar`]: structured output: JSON schemas and grammars compiled
//!   (llguidance) into per-token masks for the sampler.
//! - [`sample`]: mlx-lm's samplers and logits processors (top-p/min-p/top-k,
//!   penalties, logit bias), seeded.
//! - [`tokenizer`]: tokenizer.json plus the BOS/EOS facts a generation needs.
//! - [`chat_template`]: HF chat templates rendered as transformers'
//!   `apply_chat_template` does (minijinja), bounded in instructions and
//!   output, and run for untrusted models in a sandbox process; tokenize the
//!   text without BOS.
//! - [`error`]: [`RunnerError`], whose variants name the failing phase.
pub mod cache;
pub mod chat;
pub mod chat_template;
pub mod cli;
pub mod detokenize;
pub mod engine;
pub mod error;
pub mod generate;
pub mod grammar;
pub mod harmony;
pub mod import;
pub mod logprobs;
pub mod memory;
pub mod model;
pub mod output;
pub mod reply;
pub mod request;
pub mod sample;
pub mod server;
pub mod shard;
pub mod source;
pub mod stop;
pub mod tokenizer;
pub mod tool_args;
pub mod tool_choice;

pub use error::RunnerError;
