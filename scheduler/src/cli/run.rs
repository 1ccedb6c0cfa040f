//! `grove run MODEL [PROMPT]`: one answer, or an interactive chat that keeps
//! its history (`/bye`, `/clear`, `"""` for multi-line input; Ctrl-C cancels
//! the answer, not the session).
use std::io::Write;
use std::time::Duration;

use anyhow::{Result, bail};
use grove_proto::v1 as pb;
use tokio::io::AsyncBufReadExt;
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::RunArgs;
use super::client::Client;

fn message(role: pb::Role, content: &str) -> pb::Message {
    pb::Message {
        role: role as i32,
        content: content.to_owned(),
        ..Default::default()
    }
}

fn options(args: &RunArgs) -> pb::Options {
    pb::Options {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        seed: args.seed,
        num_ctx: args.num_ctx,
        max_tokens: args.max_tokens,
        ..Default::default()
    }
}

/// Streams one answer to stdout; returns its text, or None if cancelled
/// (Ctrl-C). `interrupts` is the session's one SIGINT listener: it keeps a
/// signal that arrives while text is being printed, which a listener made
/// anew for each message would miss.
async fn answer(
    client: &mut Client,
    args: &RunArgs,
    keep_alive: Option<i64>,
    history: &[pb::Message],
    interrupts: &mut Signal,
) -> Result<Option<String>> {
    let req = pb::ChatRequest {
        model: args.model.clone(),
        messages: history.to_vec(),
        options: Some(options(args)),
        keep_alive_ns: keep_alive,
        shards: args.shards,
        ..Default::default()
    };
    // Ctrl-C also leaves while the model is still loading.
    let mut stream = tokio::select! {
        r = client.chat(req) => r?.into_inner(),
        _ = interrupts.recv() => {
            println!();
            return Ok(None);
        }
    };
    let mut text = String::new();
    let mut out = std::io::stdout();
    loop {
        let msg = tokio::select! {
            m = stream.message() => m?,
            _ = interrupts.recv() => {
                println!();
                return Ok(None); // dropping the stream cancels the runner's work
            }
        };
        let Some(msg) = msg else {
            bail!("the stream ended without a final message")
        };
        match msg.event {
            Some(pb::generate_response::Event::Text(t)) => {
                print!("{t}");
                out.flush()?;
                text.push_str(&t);
            }
            Some(pb::generate_response::Event::Done(done)) => {
                println!();
                if args.verbose {
                    print_metrics(&done.metrics.unwrap_or_default());
                }
                return Ok(Some(text));
            }
            // Not asked for (the chat shows the model's text as it is).
            Some(pb::generate_response::Event::Thinking(_))
            | Some(pb::generate_response::Event::ToolCall(_))
            | Some(pb::generate_response::Event::Logprobs(_))
            | None => {}
        }
    }
}

fn secs(ns: u64) -> String {
    format!("{:.6}s", Duration::from_nanos(ns).as_secs_f64())
}

fn rate(tokens: u32, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        tokens as f64 / (ns as f64 / 1e9)
    }
}

/// The metrics as ollama's --verbose prints them.
fn print_metrics(m: &pb::Metrics) {
    eprintln!("total duration:       {}", secs(m.total_ns));
    eprintln!("load duration:        {}", secs(m.load_ns));
    eprintln!(
        "prompt eval count:    {} token(s) ({} cached)",
        m.prompt_tokens, m.cached_prompt_tokens
    );
    eprintln!("prompt eval duration: {}", secs(m.prompt_eval_ns));
    eprintln!(
        "prompt eval rate:     {:.2} tokens/s",
        rate(
            m.prompt_tokens - m.cached_prompt_tokens.min(m.prompt_tokens),
            m.prompt_eval_ns
        )
    );
    eprintln!("eval count:           {} token(s)", m.eval_tokens);
    eprintln!("eval duration:        {}", secs(m.eval_ns));
    eprintln!(
        "eval rate:            {:.2} tokens/s",
        rate(m.eval_tokens, m.eval_ns)
    );
}

/// Runs `grove run`.
/// An embedding model (one that does not generate, as ollama's `run` does
/// with one): each prompt's vector, printed as a JSON array.
async fn embed(
    client: &mut Client,
    args: &RunArgs,
    keep_alive: Option<i64>,
    text: &str,
) -> Result<()> {
    let r = client
        .embed(pb::EmbedRequest {
            model: args.model.clone(),
            inputs: vec![pb::EmbedInput {
                input: Some(pb::embed_input::Input::Text(text.to_owned())),
            }],
            keep_alive_ns: keep_alive,
            ..Default::default()
        })
        .await?
        .into_inner();
    let values = r
        .embeddings
        .into_iter()
        .next()
        .map(|e| e.values)
        .unwrap_or_default();
    println!("{}", serde_json::to_string(&values)?);
    Ok(())
}

pub async fn run(mut client: Client, args: RunArgs, keep_alive: Option<i64>) -> Result<()> {
    let shown = client
        .show(pb::ShowRequest {
            model: args.model.clone(),
        })
        .await
        .map(|r| r.into_inner());
    if let Ok(s) = shown
        && !s.generates
        && s.embeds
    {
        let Some(text) = &args.prompt else {
            anyhow::bail!(
                "{} is an embedding model: give the text to embed (grove run MODEL TEXT)",
                args.model
            );
        };
        return embed(&mut client, &args, keep_alive, text).await;
    }
    let mut interrupts = signal(SignalKind::interrupt())?;
    let mut history = Vec::new();
    if let Some(system) = &args.system {
        history.push(message(pb::Role::System, system));
    }
    if let Some(prompt) = &args.prompt {
        history.push(message(pb::Role::User, prompt));
        answer(&mut client, &args, keep_alive, &history, &mut interrupts).await?;
        return Ok(());
    }
    // Load the model up front so the first answer starts at once; Ctrl-C
    // while it loads leaves.
    let load = client.load(pb::LoadRequest {
        model: args.model.clone(),
        keep_alive_ns: keep_alive,
        shards: args.shards,
    });
    tokio::select! {
        r = load => {
            r?;
        }
        _ = interrupts.recv() => {
            println!();
            return Ok(());
        }
    }
    let (lines_tx, mut lines) = tokio::sync::mpsc::channel::<String>(16);
    tokio::spawn(async move {
        let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = stdin.next_line().await {
            if lines_tx.send(line).await.is_err() {
                break;
            }
        }
    });
    loop {
        print!(">>> ");
        std::io::stdout().flush()?;
        let line = tokio::select! {
            l = lines.recv() => l,
            _ = interrupts.recv() => {
                println!("\nUse /bye or Ctrl-D to leave.");
                continue;
            }
        };
        let Some(mut input) = line else {
            println!();
            return Ok(()); // Ctrl-D
        };
        if input.trim_start().starts_with("\"\"\"") {
            // Multi-line: everything up to a closing """.
            let mut block = input.trim_start().trim_start_matches("\"\"\"").to_owned();
            while !block.trim_end().ends_with("\"\"\"") {
                print!("... ");
                std::io::stdout().flush()?;
                let Some(more) = lines.recv().await else {
                    break;
                };
                block.push('\n');
                block.push_str(&more);
            }
            input = block.trim_end().trim_end_matches("\"\"\"").to_owned();
        }
        match input.trim() {
            "" => continue,
            "/bye" => return Ok(()),
            "/clear" => {
                history.retain(|m| m.role == pb::Role::System as i32);
                println!("Cleared session context");
                continue;
            }
            "/?" | "/help" => {
                println!(
                    "/bye to leave, /clear to forget the conversation, \"\"\" to start and end multi-line input"
                );
                continue;
            }
            _ => {}
        }
        history.push(message(pb::Role::User, &input));
        match answer(&mut client, &args, keep_alive, &history, &mut interrupts).await {
            Ok(Some(text)) => history.push(message(pb::Role::Assistant, &text)),
            Ok(None) => {
                history.pop();
            }
            Err(e) => {
                history.pop();
                eprintln!("grove: {e}");
            }
        }
    }
}
