//! The `grove` command line (clap). Every command but `serve` and `service`
//! talks gRPC to the daemon, starting one when none answers.
pub mod client;
pub mod run;

use std::time::{Duration, SystemTime};

use anyhow::{Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use grove_proto::v1 as pb;

use crate::config::{DaemonConfig, host_from_env, parse_host};
use crate::duration::KeepAlive;

/// Grove: local LLMs on MLX.
#[derive(Debug, Parser)]
#[command(name = "grove", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon (gRPC on GROVE_HOST, default 127.0.0.1:11435).
    Serve {
        /// Address to listen on (overrides GROVE_HOST).
        #[arg(long)]
        host: Option<String>,
    },
    /// Chat with a model: one answer for PROMPT, else an interactive session.
    Run(RunArgs),
    /// Download a model from the Hugging Face hub.
    Pull { model: String },
    /// Convert a GGUF file into an MLX model directory: at NAME when it is a
    /// path (./DIR), else into the store as the repo id NAME.
    Import {
        gguf: std::path::PathBuf,
        name: String,
    },
    /// Models in the store.
    #[command(alias = "ls")]
    List,
    /// Loaded models.
    Ps,
    /// A model's architecture, parameters, quantization, context and template.
    Show {
        model: String,
        /// Print only the chat template.
        #[arg(long)]
        template: bool,
    },
    /// Remove a model from the store.
    Rm { model: String },
    /// Unload a model.
    Stop { model: String },
    /// Run the daemon as a user service (launchd on macOS, systemd on Linux).
    Service {
        #[command(subcommand)]
        action: ServiceAction,
    },
}

/// `grove run` options.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// A Hugging Face repo id in the store, a model directory, a GGUF file,
    /// or an ollama model (ollama:NAME[:TAG]).
    pub model: String,
    /// Answer this and exit.
    pub prompt: Option<String>,
    /// Print timings and token counts after each answer.
    #[arg(long)]
    pub verbose: bool,
    #[arg(long)]
    pub temperature: Option<f32>,
    #[arg(long)]
    pub top_p: Option<f32>,
    #[arg(long)]
    pub top_k: Option<u32>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Context length for this session.
    #[arg(long)]
    pub num_ctx: Option<u32>,
    /// Split the model over this many processes on the daemon's host
    /// (tensor parallelism; default GROVE_SHARDS of the daemon, 1). A model
    /// loaded over another count is reloaded when idle.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub shards: Option<u32>,
    /// Most tokens per answer.
    #[arg(long)]
    pub max_tokens: Option<u32>,
    /// How long the model stays loaded: 5m, 1h, 0 (unload), -1 (forever).
    #[arg(long, allow_hyphen_values = true)]
    pub keep_alive: Option<String>,
    /// A system prompt.
    #[arg(long)]
    pub system: Option<String>,
}

/// `grove service` actions.
#[derive(Debug, Subcommand)]
pub enum ServiceAction {
    Install {
        /// Print the unit or plist instead of installing it.
        #[arg(long)]
        print: bool,
        /// Platform to print for (default: this one).
        #[arg(long, value_enum)]
        platform: Option<PlatformArg>,
    },
    Uninstall,
    Status,
}

/// `--platform`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PlatformArg {
    Macos,
    Linux,
}

fn keep_alive_ns(text: Option<&str>) -> Result<Option<i64>> {
    let Some(text) = text else { return Ok(None) };
    Ok(Some(
        match KeepAlive::parse(text).map_err(anyhow::Error::msg)? {
            KeepAlive::Unload => 0,
            KeepAlive::Forever => -1,
            KeepAlive::For(d) => d.as_nanos().min(i64::MAX as u128) as i64,
        },
    ))
}

fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MB", n as f64 / (1u64 << 20) as f64),
        n => format!("{:.1} KB", n as f64 / 1024.0),
    }
}

fn until(expires_unix: i64, active: u32) -> String {
    if active > 0 {
        let s = if active == 1 { "" } else { "s" };
        return format!("in use ({active} request{s})");
    }
    if expires_unix == 0 {
        return "Forever".into();
    }
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(expires_unix as u64);
    match at.duration_since(SystemTime::now()) {
        Ok(d) if d.as_secs() >= 60 => format!("{} minutes from now", d.as_secs().div_ceil(60)),
        Ok(d) => format!("{} seconds from now", d.as_secs()),
        Err(_) => "now".into(),
    }
}

/// A model argument as the daemon needs it: an existing directory or file
/// becomes an absolute path (the daemon runs elsewhere); anything else is a
/// repo id or an ollama name.
fn model_arg(model: &str) -> String {
    let path = std::path::Path::new(model);
    match path.exists().then(|| path.canonicalize()) {
        Some(Ok(abs)) => abs.display().to_string(),
        _ => model.to_owned(),
    }
}

/// A gRPC status as a user-facing error: its message, not its debug form.
fn status(e: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", e.message())
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> Result<()> {
    let addr = host_from_env()?;
    match cli.command {
        Command::Serve { host } => {
            let mut config = DaemonConfig::from_env()?;
            if let Some(h) = host {
                config.host = parse_host(&h).map_err(anyhow::Error::msg)?;
            }
            crate::daemon::run(config, shutdown_signal()).await?;
        }
        Command::Run(mut args) => {
            args.model = model_arg(&args.model);
            let keep_alive = keep_alive_ns(args.keep_alive.as_deref())?;
            let client = client::connect_or_start(addr).await?;
            run::run(client, args, keep_alive).await.map_err(|e| {
                match e.downcast::<tonic::Status>() {
                    Ok(s) => status(s),
                    Err(e) => e,
                }
            })?;
        }
        Command::Pull { model } => {
            crate::cli_pull::pull(client::connect_or_start(addr).await?, &model).await?
        }
        Command::Import { gguf, name } => {
            tokio::task::spawn_blocking(move || crate::cli_import::import(&gguf, &name)).await??
        }
        Command::List => {
            let mut c = client::connect_or_start(addr).await?;
            let models = c
                .list(pb::ListRequest {})
                .await
                .map_err(status)?
                .into_inner()
                .models;
            println!("{:<48} {:<14} {:>10}  PATH", "NAME", "REVISION", "SIZE");
            for m in models {
                let rev: String = m.revision.chars().take(12).collect();
                println!(
                    "{:<48} {:<14} {:>10}  {}",
                    m.name,
                    rev,
                    human_bytes(m.size_bytes),
                    m.path
                );
            }
        }
        Command::Ps => {
            let mut c = client::connect_or_start(addr).await?;
            let models = c
                .ps(pb::PsRequest {})
                .await
                .map_err(status)?
                .into_inner()
                .models;
            println!(
                "{:<48} {:>10} {:<10} {:>8} {:>14}  UNTIL",
                "NAME", "SIZE", "PROCESSOR", "CONTEXT", "KV CACHE"
            );
            for m in models {
                let processor = if m.processor == pb::Processor::Gpu as i32 {
                    "100% GPU"
                } else {
                    "100% CPU"
                };
                let kv = match m.kv_bits {
                    0 => format!("full {}", m.kv_capacity_tokens),
                    b => format!("q{b} {}", m.kv_capacity_tokens),
                };
                println!(
                    "{:<48} {:>10} {:<10} {:>8} {:>14}  {}",
                    m.name,
                    human_bytes(m.size_bytes),
                    processor,
                    m.context_length,
                    kv,
                    until(m.expires_unix, m.active_requests)
                );
                if m.shards > 1 {
                    println!("  split over {} processes:", m.shards);
                    for r in &m.ranks {
                        println!(
                            "    rank {:<3} pid {:<8} {:<8} {:>10} resident",
                            r.rank,
                            r.pid,
                            r.device,
                            human_bytes(r.resident_bytes)
                        );
                    }
                }
            }
        }
        Command::Show { model, template } => {
            let mut c = client::connect_or_start(addr).await?;
            let s = c
                .show(pb::ShowRequest {
                    model: model_arg(&model),
                })
                .await
                .map_err(status)?
                .into_inner();
            if template {
                println!("{}", s.chat_template);
                return Ok(());
            }
            println!("  Model");
            println!("    name              {}", s.name);
            println!("    path              {}", s.path);
            println!("    architecture      {}", s.architecture);
            if s.active_parameter_count > 0 && s.active_parameter_count < s.parameter_count {
                println!(
                    "    parameters        {} ({} active per token)",
                    s.parameter_count, s.active_parameter_count
                );
            } else {
                println!("    parameters        {}", s.parameter_count);
            }
            println!(
                "    quantization      {}",
                if s.quantization.is_empty() {
                    "none"
                } else {
                    &s.quantization
                }
            );
            println!("    dtype             {}", s.dtype);
            println!("    context length    {}", s.context_length);
            println!("    size              {}", human_bytes(s.size_bytes));
            if !s.license.is_empty() {
                println!("    license           {}", s.license);
            }
            println!(
                "    chat template     {}",
                if s.chat_template.is_empty() {
                    "none"
                } else {
                    "yes (grove show --template)"
                }
            );
        }
        Command::Rm { model } => {
            let mut c = client::connect_or_start(addr).await?;
            let r = c
                .delete(pb::DeleteRequest {
                    model: model.clone(),
                })
                .await
                .map_err(status)?
                .into_inner();
            println!("deleted '{model}' ({} freed)", human_bytes(r.freed_bytes));
        }
        Command::Stop { model } => {
            let Ok(mut c) = client::connect(addr).await else {
                bail!("no daemon is running on {addr}")
            };
            c.unload(pb::UnloadRequest {
                model: model_arg(&model),
            })
            .await
            .map_err(status)?;
        }
        Command::Service { action } => crate::cli_service::run(action)?,
    }
    Ok(())
}

/// SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
