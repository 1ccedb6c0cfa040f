//! The `grove-runner` command line. `generate` runs one prompt through a model
//! and prints the text (or one JSON object) with its speeds.
use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::cache::{KvQuant, KvSetting};
use crate::chat_template::sandbox::Sandbox;
use crate::chat_template::{ChatRequest, Message, Role};
use crate::detokenize::Detokenizer;
use crate::engine::EngineConfig;
use crate::error::{Result, RunnerError};
use crate::generate::{GenerateOutput, GenerateParams, generate};
use crate::model::{self, CpuDtypes};
use crate::sample::SamplingOptions;
use crate::server::{self, ServeConfig};
use crate::tokenizer::Tokenizer;

/// Grove's per-model process.
#[derive(Debug, Parser)]
#[command(name = "grove-runner", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate a completion for one prompt and print it with its speeds.
    Generate(GenerateArgs),
    /// Serve the model over gRPC on a Unix socket (grove.runner.v1.Runner).
    Serve(ServeArgs),
    /// Convert a GGUF file into an MLX model directory (config.json,
    /// model.safetensors, tokenizer files) that Grove and mlx-lm load.
    Import(ImportArgs),
    /// Print the memory budgets are sized against, as JSON:
    /// {"memory_total_bytes": N, "source": "device" | "physical_ram"}.
    Device,
    /// Render one chat template job from stdin (the sandbox process that
    /// `serve` starts for each chat request; see chat_template::sandbox).
    #[command(hide = true)]
    Render,
}

/// Arguments of `grove-runner import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The GGUF file.
    pub gguf: PathBuf,
    /// The directory to write (must not exist, or be empty).
    pub out: PathBuf,
    /// Print one JSON object describing the import.
    #[arg(long)]
    pub json: bool,
}

/// The KV cache's element type (ollama's `OLLAMA_KV_CACHE_TYPE` words).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KvCacheType {
    /// Full precision: the model's activation dtype.
    #[default]
    #[value(alias = "f32", alias = "bf16")]
    F16,
    /// 8-bit MLX affine quantization.
    #[value(alias = "q8_0")]
    Q8,
    /// 4-bit MLX affine quantization.
    #[value(alias = "q4_0")]
    Q4,
}

/// How the KV cache is held (mlx-lm's `--kv-bits`, `--kv-group-size`,
/// `--quantized-kv-start`).
#[derive(Debug, Args)]
pub struct KvArgs {
    /// The KV cache type: f16 (full precision), q8 or q4 (MLX affine
    /// quantization, as mlx-lm's QuantizedKVCache).
    #[arg(long, env = "GROVE_KV_CACHE_TYPE", value_enum, default_value_t)]
    pub kv_cache_type: KvCacheType,
    /// Bits per KV element (2-8), as mlx-lm's --kv-bits; instead of
    /// --kv-cache-type.
    #[arg(long)]
    pub kv_bits: Option<u32>,
    /// Elements per quantization group (32, 64 or 128).
    #[arg(long, env = "GROVE_KV_GROUP_SIZE", default_value_t = 64)]
    pub kv_group_size: u32,
    /// Tokens a sequence holds before its cache turns quantized.
    #[arg(long, env = "GROVE_QUANTIZED_KV_START", default_value_t = 0)]
    pub quantized_kv_start: usize,
}

impl KvArgs {
    /// The setting, checked.
    pub fn setting(&self) -> Result<Option<KvSetting>> {
        let typed = match self.kv_cache_type {
            KvCacheType::F16 => None,
            KvCacheType::Q8 => Some(8),
            KvCacheType::Q4 => Some(4),
        };
        let bits = match (self.kv_bits, typed) {
            (Some(b), Some(t)) if b != t => {
                return Err(RunnerError::Request(format!(
                    "--kv-bits {b} contradicts --kv-cache-type {:?}",
                    self.kv_cache_type
                )));
            }
            (Some(0), _) => None,
            (Some(b), _) => Some(b),
            (None, t) => t,
        };
        let Some(bits) = bits else {
            return Ok(None);
        };
        let quant = KvQuant::new(bits.min(64) as i32, self.kv_group_size.min(1 << 20) as i32)
            .map_err(RunnerError::Request)?;
        Ok(Some(KvSetting {
            quant,
            start: self.quantized_kv_start,
        }))
    }
}

/// Arguments of `grove-runner serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model directory (config.json, *.safetensors, tokenizer.json) or GGUF file.
    #[arg(long)]
    pub model: PathBuf,
    /// On the MLX CPU backend: promote float16/bfloat16 arrays to float32
    /// (fast there), or keep them as stored.
    #[arg(long, env = "GROVE_CPU_DTYPES", value_enum, default_value_t)]
    pub cpu_dtypes: CpuDtypes,
    /// Unix socket to listen on.
    #[arg(long)]
    pub socket: PathBuf,
    /// Context limit for every request (tokens).
    #[arg(long, env = "GROVE_CONTEXT_LENGTH")]
    pub context_length: Option<usize>,
    /// Prompt tokens per prefill pass.
    #[arg(long, default_value_t = 2048)]
    pub prefill_chunk: usize,
    /// Requests that may wait for the engine; more are refused as busy.
    #[arg(long, env = "GROVE_MAX_QUEUE", default_value_t = 16)]
    pub queue: usize,
    /// Most sequences prefilling or decoding at once (continuous batching);
    /// default 8 on the CPU backend, 32 on a GPU.
    #[arg(long, env = "GROVE_NUM_PARALLEL", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub num_parallel: Option<u64>,
    /// Most KV-cache tokens all sequences and the prompt cache hold together;
    /// default what the memory budget allows.
    #[arg(long, env = "GROVE_KV_CAPACITY", value_parser = clap::value_parser!(u64).range(2..))]
    pub kv_capacity: Option<u64>,
    /// A system prompt to prefill into the prompt cache at start.
    #[arg(long)]
    pub prewarm_system: Option<String>,
    /// A JSON file with the tool definitions (an array) requests will send,
    /// rendered with the prewarmed system prompt.
    #[arg(long, requires = "prewarm_system")]
    pub prewarm_tools: Option<PathBuf>,
    /// Seconds one chat-template rendering may take (it runs in a sandbox
    /// process, killed at this deadline).
    #[arg(long, env = "GROVE_TEMPLATE_TIMEOUT", default_value_t = 10.0)]
    pub template_timeout: f64,
    /// Bytes of memory the sandbox process of one rendering may use.
    #[arg(long, env = "GROVE_TEMPLATE_MEMORY", default_value_t = 1 << 30)]
    pub template_memory: u64,
    /// Serve the model split over this many processes on this host (tensor
    /// parallelism over MLX distributed: NCCL on CUDA GPUs, one GPU each;
    /// the ring over loopback elsewhere). This process starts them and ends
    /// them together; rank 0 serves the socket, the others follow its steps.
    #[arg(long, env = "GROVE_SHARDS", default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=crate::shard::launch::MAX_RANKS as i64))]
    pub shards: i32,
    #[command(flatten)]
    pub kv: KvArgs,
}

/// Arguments of `grove-runner generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Model directory (config.json, *.safetensors, tokenizer.json) or GGUF file.
    #[arg(long)]
    pub model: PathBuf,
    /// On the MLX CPU backend: promote float16/bfloat16 arrays to float32
    /// (fast there), or keep them as stored.
    #[arg(long, env = "GROVE_CPU_DTYPES", value_enum, default_value_t)]
    pub cpu_dtypes: CpuDtypes,
    /// Prompt text (tokenized with the model's tokenizer; BOS added as mlx-lm does).
    #[arg(
        long,
        conflicts_with = "prompt_tokens",
        required_unless_present = "prompt_tokens"
    )]
    pub prompt: Option<String>,
    /// Prompt as token ids, comma separated.
    #[arg(long, value_delimiter = ',')]
    pub prompt_tokens: Option<Vec<u32>>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Seed for sampling at temperature > 0 (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep only the k most likely tokens.
    #[arg(long)]
    pub top_k: Option<u32>,
    /// Keep the smallest set of tokens whose probability reaches p.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than min_p times the most likely one.
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Penalise tokens of the last 20 (mlx-lm's repetition penalty).
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// Prompt tokens per prefill forward pass.
    #[arg(long, default_value_t = 2048)]
    pub prefill_chunk: usize,
    /// Print one JSON object instead of streamed text.
    #[arg(long)]
    pub json: bool,
    /// Generate this many times in one process (benchmarks: the first run pays
    /// for kernel compilation); each run's report is printed.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Also write the last prompt position's logits (JSON array of floats) here.
    #[arg(long)]
    pub dump_logits: Option<PathBuf>,
    /// Also write the first decode step's logits (the first generated
    /// token's) here: compares the decode step's paths.
    #[arg(long)]
    pub dump_step_logits: Option<PathBuf>,
    /// Split the model over this many processes on this host (tensor
    /// parallelism over MLX distributed: NCCL on CUDA GPUs, one GPU each;
    /// the ring over loopback elsewhere); rank 0 prints.
    #[arg(long, env = "GROVE_SHARDS", default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=crate::shard::launch::MAX_RANKS as i64))]
    pub shards: i32,
    #[command(flatten)]
    pub kv: KvArgs,
}

/// `--json` output.
#[derive(Debug, Serialize)]
struct JsonReport<'a> {
    tokens: &'a [u32],
    text: &'a str,
    prompt_tokens: usize,
    prompt_tps: f64,
    decode_tps: f64,
    /// `stop` (an EOS token) or `length` (`--max-tokens` reached).
    finish_reason: &'static str,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Generate(args) => run_generate(args),
        Command::Serve(args) => run_serve(args),
        Command::Import(args) => {
            let report = crate::import::import(&args.gguf, &args.out)?;
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string(&report)
                        .map_err(|e| RunnerError::Request(e.to_string()))?
                );
            } else {
                println!(
                    "imported {} into {} ({} tensors, {} bytes) in {:.1}s",
                    args.gguf.display(),
                    args.out.display(),
                    report.tensors,
                    report.bytes,
                    report.seconds
                );
            }
            Ok(())
        }
        Command::Render => Err(RunnerError::Request(
            "render runs only as the sandbox process (grove-runner's main handles it)".into(),
        )),
        Command::Device => {
            let (total, source) = crate::memory::budget_memory();
            let source = match source {
                crate::memory::MemorySource::Device => "device",
                crate::memory::MemorySource::PhysicalRam => "physical_ram",
            };
            println!(
                "{}",
                serde_json::json!({"memory_total_bytes": total, "source": source})
            );
            Ok(())
        }
    }
}

fn run_serve(args: ServeArgs) -> Result<()> {
    if args.prefill_chunk == 0 {
        return Err(RunnerError::Request(
            "--prefill-chunk must be at least 1".into(),
        ));
    }
    // A launcher runs its group (copies of this command) and is done.
    let Some(comm) = crate::shard::launch_or_join(args.shards)? else {
        return Ok(());
    };
    // The SSD tier holds whole-model entries; a group keeps its cache in
    // memory only.
    let disk = match comm {
        Some(_) => None,
        None => crate::engine::disk::DiskConfig::from_env().map_err(RunnerError::Request)?,
    };
    if let Some(c) = comm.as_ref().filter(|c| c.rank() != 0) {
        return follow(&args, c.clone());
    }
    let prewarm = match args.prewarm_system {
        Some(system) => Some(prewarm_request(system, args.prewarm_tools.as_deref())?),
        None => None,
    };
    if !(args.template_timeout.is_finite() && args.template_timeout > 0.0) {
        return Err(RunnerError::Request(
            "--template-timeout must be a positive number of seconds".into(),
        ));
    }
    if args.template_memory < 64 << 20 {
        return Err(RunnerError::Request(
            "--template-memory must be at least 64 MiB".into(),
        ));
    }
    let sandbox = Sandbox::new(
        std::time::Duration::from_secs_f64(args.template_timeout),
        args.template_memory,
    )?;
    let config = ServeConfig {
        sandbox,
        prewarm,
        engine: EngineConfig {
            model_dir: args.model,
            context_length: args.context_length,
            prefill_chunk: args.prefill_chunk,
            queue: args.queue,
            num_parallel: args.num_parallel.map(|n| n as usize),
            kv_capacity: args.kv_capacity.map(|n| n as usize),
            cpu_dtypes: args.cpu_dtypes,
            kv: args.kv.setting()?,
            disk,
            shard: comm,
        },
        socket: args.socket,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| RunnerError::Request(format!("starting the async runtime: {e}")))?;
    runtime
        .block_on(server::run(config, shutdown_signal()))
        .map_err(|e| RunnerError::Request(e.to_string()))
}

/// The chat to prewarm: the system prompt, rendered with the tools of `tools_file`.
fn prewarm_request(system: String, tools_file: Option<&std::path::Path>) -> Result<ChatRequest> {
    let tools = match tools_file {
        None => Vec::new(),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| RunnerError::Read {
                path: path.to_owned(),
                source,
            })?;
            match serde_json::from_str(&text) {
                Ok(serde_json::Value::Array(tools)) => tools,
                Ok(_) => {
                    return Err(RunnerError::Request(format!(
                        "{}: tools must be a JSON array",
                        path.display()
                    )));
                }
                Err(e) => {
                    return Err(RunnerError::Request(format!(
                        "{}: not valid JSON: {e}",
                        path.display()
                    )));
                }
            }
        }
    };
    Ok(ChatRequest {
        messages: vec![Message::new(Role::System, system)],
        tools,
        add_generation_prompt: false,
        extra: serde_json::Map::new(),
        reasoning_effort: None,
    })
}

/// SIGINT or SIGTERM.
/// SIGINT, SIGTERM, or the parent (the daemon) going away. Once it fires,
/// the process exits within [`EXIT_DEADLINE`] whatever it is doing: work
/// that ignores cancellation (a model still loading, one long MLX call) does
/// not keep it alive.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let parent = std::os::unix::process::parent_id();
    let orphaned = async move {
        // The daemon kills runners when it dies (PR_SET_PDEATHSIG on Linux);
        // elsewhere a runner notices that it was re-parented.
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            if std::os::unix::process::parent_id() != parent {
                return;
            }
        }
    };
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
                _ = orphaned => {},
            }
        }
        Err(_) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = orphaned => {},
            }
        }
    }
    std::thread::spawn(|| {
        std::thread::sleep(EXIT_DEADLINE);
        eprintln!("grove-runner: still busy {EXIT_DEADLINE:?} after the stop signal; exiting now");
        // SAFETY: _exit ends the process without running destructors that
        // could race the engine thread still inside MLX.
        unsafe { libc::_exit(1) }
    });
}

/// How long a runner may take to exit once told to stop (the daemon sends
/// SIGKILL after 5 s).
const EXIT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(4);

/// A follower rank of `serve`: its engine follows rank 0's steps until the
/// group stops (it has no socket and no clients).
fn follow(args: &ServeArgs, comm: std::sync::Arc<crate::shard::Comm>) -> Result<()> {
    let config = EngineConfig {
        model_dir: args.model.clone(),
        context_length: args.context_length,
        prefill_chunk: args.prefill_chunk,
        queue: args.queue,
        num_parallel: args.num_parallel.map(|n| n as usize),
        kv_capacity: args.kv_capacity.map(|n| n as usize),
        cpu_dtypes: args.cpu_dtypes,
        kv: args.kv.setting()?,
        disk: None,
        shard: Some(comm),
    };
    let (engine, thread) = crate::engine::Engine::spawn(config)
        .map_err(|e| RunnerError::Request(format!("starting the engine: {e}")))?;
    let _ = thread.join();
    let state = engine.snapshot().state;
    drop(engine);
    match state {
        crate::engine::LoadState::Failed(e) => Err(RunnerError::Request(e)),
        _ => Ok(()),
    }
}

fn run_generate(args: GenerateArgs) -> Result<()> {
    // A launcher runs its group (copies of this command) and is done.
    let Some(comm) = crate::shard::launch_or_join(args.shards)? else {
        return Ok(());
    };
    let loading = std::time::Instant::now();
    let opened = crate::source::open_sharded(&args.model, args.cpu_dtypes, comm.as_ref())?;
    let (model, tokenizer) = (opened.model, opened.tokenizer);
    if let Some(c) = &comm {
        // Each rank's own figures (the benchmarks' per-rank load time and memory).
        eprintln!(
            "grove-runner: rank {} of {}: {} bytes of weights loaded in {:.2} s (MLX active {} bytes)",
            c.rank(),
            c.size(),
            model.weight_bytes,
            loading.elapsed().as_secs_f64(),
            mlx_rs::memory::active_memory().unwrap_or(0)
        );
    }
    let prompt = match (&args.prompt, &args.prompt_tokens) {
        (Some(text), _) => tokenizer.encode_prompt(text)?,
        (None, Some(ids)) => ids.clone(),
        (None, None) => {
            return Err(RunnerError::Request(
                "give --prompt or --prompt-tokens".into(),
            ));
        }
    };
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        prefill_chunk: args.prefill_chunk,
        sampling: SamplingOptions {
            temperature: args.temperature,
            seed: args.seed,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repetition_penalty: args.repetition_penalty,
            ..SamplingOptions::default()
        },
        capture_logits: args.dump_logits.is_some() || args.dump_step_logits.is_some(),
        kv: args.kv.setting()?,
    };
    if args.repeat == 0 {
        return Err(RunnerError::Request("--repeat must be at least 1".into()));
    }
    // As `serve` does before it is ready (GPU only unless GROVE_WARMUP says).
    crate::engine::warmup::warm_up_if_wanted(&model, crate::model::dtypes::cpu_backend())?;
    for _ in 0..args.repeat {
        generate_once(&args, &model, &tokenizer, &prompt, &params)?;
    }
    Ok(())
}

fn generate_once(
    args: &GenerateArgs,
    model: &model::Model,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    params: &GenerateParams,
) -> Result<()> {
    // In a group, rank 0 speaks for it (the others' output is dropped and
    // they leave the files to it).
    if model.decoder.shard().is_some_and(|c| c.rank() != 0) {
        generate(model, prompt, tokenizer.eos_ids(), params, |_| {})?;
        return Ok(());
    }
    let mut stream = (!args.json).then(|| TextStream::new(tokenizer));
    let out = generate(model, prompt, tokenizer.eos_ids(), params, |t| {
        if let Some(s) = stream.as_mut() {
            s.push(t);
        }
    })?;
    for (path, logits) in [
        (&args.dump_logits, &out.prompt_logits),
        (&args.dump_step_logits, &out.step_logits),
    ] {
        if let (Some(path), Some(logits)) = (path, logits) {
            let text =
                serde_json::to_string(logits).map_err(|e| RunnerError::Request(e.to_string()))?;
            std::fs::write(path, text).map_err(|source| RunnerError::Read {
                path: path.clone(),
                source,
            })?;
        }
    }
    let text = tokenizer.decode(&out.tokens)?;
    if args.json {
        let report = JsonReport {
            tokens: &out.tokens,
            text: &text,
            prompt_tokens: out.prompt_tokens,
            prompt_tps: out.prompt_tps(),
            decode_tps: out.decode_tps(),
            finish_reason: out.finish.as_str(),
        };
        println!(
            "{}",
            serde_json::to_string(&report).map_err(|e| RunnerError::Request(e.to_string()))?
        );
    } else {
        if let Some(s) = stream.as_mut() {
            s.finish();
        }
        print_speeds(&out);
    }
    Ok(())
}

fn print_speeds(out: &GenerateOutput) {
    println!();
    println!(
        "prompt: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s ({:?})",
        out.prompt_tokens,
        out.prompt_tps(),
        out.tokens.len(),
        out.decode_tps(),
        out.finish
    );
}

/// Prints text as tokens arrive, through the streaming detokenizer (whole
/// characters only, mlx-lm's spacing rules).
struct TextStream {
    detokenizer: Detokenizer,
}

impl TextStream {
    fn new(tokenizer: &Tokenizer) -> Self {
        Self {
            detokenizer: Detokenizer::new(tokenizer),
        }
    }

    fn push(&mut self, token: u32) {
        let piece = self.detokenizer.push(token);
        Self::print(piece);
    }

    fn finish(&mut self) {
        let piece = self.detokenizer.finish();
        Self::print(piece);
    }

    fn print(piece: Option<String>) {
        if let Some(piece) = piece {
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
    }
}
