//! `grove-runner serve` as the daemon will drive it: real processes on fixture
//! models, over gRPC on a Unix socket.
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use grove_proto::runner::v1 as pb;
use grove_tests::fixtures;
use grove_tests::serve::{Served, complete, tokens_request};

/// A prompt whose greedy continuation on qwen3-f32 runs past 1000 tokens
/// without EOS (checked when the test was written).
const LONG_RUNNING: [u32; 12] = [142, 587, 872, 826, 787, 69, 266, 125, 512, 784, 465, 488];

/// Turn 2 of a conversation reuses turn 1's prompt and answer from the prompt
/// cache (by content), and gives the same text as a cold run of the same prompt.
#[tokio::test]
async fn multi_turn_reuses_the_shared_prefix() -> Result<()> {
    let model = "qwen3-f32";
    let reference = fixtures::reference(model)?;
    let case = reference
        .cases
        .iter()
        .find(|c| c.name == "ids")
        .context("no ids case")?;
    let (_served, mut client) = Served::start(&fixtures::model_dir(model)?, &[]).await?;

    // Turn 1: the reference prompt; the answer is mlx-lm's greedy tokens.
    let turn1 = complete(
        &mut client,
        tokens_request(&case.prompt_tokens, case.max_tokens as u32),
    )
    .await?;
    ensure!(
        turn1.metrics().cached_prompt_tokens == 0,
        "cold start reused tokens"
    );
    ensure!(turn1.metrics().eval_tokens as usize == case.tokens.len());
    // Every generated token was fed back (the batch's pipelined step feeds
    // a token before reading it back), so the cache holds them all.
    let fed = case.tokens.len();

    // Turn 2: the conversation so far plus new tokens.
    let mut prompt2 = case.prompt_tokens.clone();
    prompt2.extend(&case.tokens);
    prompt2.extend([11u32, 22, 33, 44, 55]);
    let turn2 = complete(&mut client, tokens_request(&prompt2, 16)).await?;
    let m = turn2.metrics();
    ensure!(m.prompt_tokens as usize == prompt2.len());
    ensure!(
        m.cached_prompt_tokens as usize == case.prompt_tokens.len() + fed,
        "turn 2 reused {} tokens, expected the shared prefix of {}",
        m.cached_prompt_tokens,
        case.prompt_tokens.len() + fed
    );

    // A replaced conversation of greater length sharing no first token: a miss.
    let mut other = prompt2.clone();
    other[0] = if other[0] == 7 { 8 } else { 7 };
    other.push(99);
    let replaced = complete(&mut client, tokens_request(&other, 4)).await?;
    ensure!(
        replaced.metrics().cached_prompt_tokens == 0,
        "content differs, yet tokens were reused"
    );

    // Turn 2's prompt again, now cold: the same text as with the cache.
    let cold = complete(&mut client, tokens_request(&prompt2, 16)).await?;
    ensure!(cold.metrics().cached_prompt_tokens == 0);
    ensure!(
        cold.text == turn2.text,
        "cached and cold runs differ:\n{:?}\n{:?}",
        turn2.text,
        cold.text
    );

    // The identical prompt once more: all but its last token come from the cache.
    let again = complete(&mut client, tokens_request(&prompt2, 16)).await?;
    ensure!(again.metrics().cached_prompt_tokens as usize == prompt2.len() - 1);
    ensure!(again.text == turn2.text);
    Ok(())
}

async fn wait_idle(
    client: &mut grove_proto::runner::v1::runner_client::RunnerClient<tonic::transport::Channel>,
) -> Result<Duration> {
    let start = Instant::now();
    loop {
        let h = client.health(pb::HealthRequest {}).await?.into_inner();
        if h.activity == pb::EngineActivity::Idle as i32 {
            return Ok(start.elapsed());
        }
        ensure!(
            start.elapsed() < Duration::from_secs(5),
            "the engine is still busy 5 s after the client left"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A client that drops its stream stops the engine's work, in decode and in
/// prefill; health answers meanwhile, and the next request is served.
#[tokio::test]
async fn cancelled_client_stops_the_work() -> Result<()> {
    let (_served, mut client) = Served::start(
        &fixtures::model_dir("qwen3-f32")?,
        &["--prefill-chunk", "8"],
    )
    .await?;

    // Decode: until the context is full (thousands of steps), dropped after 3 pieces.
    let mut stream = client
        .generate(tokens_request(&LONG_RUNNING, 0))
        .await?
        .into_inner();
    for _ in 0..3 {
        stream.message().await?.context("stream ended early")?;
    }
    let h = client.health(pb::HealthRequest {}).await?.into_inner();
    ensure!(
        h.activity == pb::EngineActivity::Decoding as i32,
        "expected decoding, got {:?}",
        h.activity
    );
    drop(stream);
    wait_idle(&mut client).await?;

    // Prefill: 3000 prompt tokens in chunks of 8, dropped at once.
    let long: Vec<u32> = (0..3000).map(|i| 5 + (i * 37 % 900) as u32).collect();
    let stream = client
        .generate(tokens_request(&long, 4))
        .await?
        .into_inner();
    drop(stream);
    wait_idle(&mut client).await?;

    let after = complete(&mut client, tokens_request(&LONG_RUNNING, 8)).await?;
    ensure!(after.metrics().eval_tokens == 8);
    Ok(())
}

/// A prompt longer than the context is INVALID_ARGUMENT naming both numbers;
/// generation that fills the context ends with done reason LENGTH.
#[tokio::test]
async fn context_limits() -> Result<()> {
    let (_served, mut client) = Served::start(
        &fixtures::model_dir("qwen3-f32")?,
        &["--context-length", "64"],
    )
    .await?;
    let long: Vec<u32> = (0..80).map(|i| 5 + i).collect();
    let err = complete(&mut client, tokens_request(&long, 4))
        .await
        .err()
        .context("80 tokens fit 64")?;
    ensure!(err.code() == tonic::Code::InvalidArgument, "{err:?}");
    ensure!(
        err.message().contains("80") && err.message().contains("64"),
        "{}",
        err.message()
    );

    // num_ctx narrows it further; max_tokens 0 = until the context is full.
    let mut req = tokens_request(&LONG_RUNNING, 0);
    req.num_ctx = 20;
    let done = complete(&mut client, req).await?;
    ensure!(
        done.reason() == pb::DoneReason::Length,
        "{:?}",
        done.reason()
    );
    ensure!(done.metrics().eval_tokens as usize == 20 - LONG_RUNNING.len() + 1);

    let status = client.status(pb::StatusRequest {}).await?.into_inner();
    let facts = status.model.context("no model facts")?;
    ensure!(facts.context_length == 64);
    ensure!(facts.architecture == pb::Architecture::Qwen3 as i32);
    ensure!(facts.num_layers == 2 && facts.vocab_size == 1024);
    ensure!(facts.active_parameter_count == facts.parameter_count);
    let memory = status.memory.context("no memory report")?;
    ensure!(
        memory.weight_bytes > 0 && memory.kv_capacity_tokens > 64 && memory.memory_total_bytes > 0
    );
    ensure!(memory.cached_tokens > 0 && memory.kv_bytes > 0);
    Ok(())
}

/// A mixture of experts reports all its parameters and those a token uses:
/// qwen3-moe-f32 has two sparse layers of 8 experts (3 matrices of 64x64
/// each), 2 per token, so 3/4 of 196,608 expert parameters are idle.
#[tokio::test]
async fn mixture_of_experts_reports_active_parameters() -> Result<()> {
    let dir = fixtures::model_dir("qwen3-moe-f32")?;
    let (_served, mut client) = Served::start(&dir, &[]).await?;
    let status = client.status(pb::StatusRequest {}).await?.into_inner();
    let facts = status.model.context("no model facts")?;
    ensure!(facts.architecture == pb::Architecture::Qwen3Moe as i32);
    let experts = 2 * 8 * 3 * 64 * 64;
    ensure!(
        facts.parameter_count > experts
            && facts.parameter_count - facts.active_parameter_count == experts * 3 / 4,
        "{} total, {} active",
        facts.parameter_count,
        facts.active_parameter_count
    );
    // The daemon's budget counts every expert's bytes.
    let memory = status.memory.context("no memory report")?;
    ensure!(memory.weight_bytes >= facts.parameter_count * 4);

    // gpt-oss: 4 layers of 8 experts (3 matrices of 64x128 and their
    // biases: 128 for gate and up, 64 for down).
    let dir = fixtures::model_dir("gpt-oss-f32")?;
    let (_served, mut client) = Served::start(&dir, &[]).await?;
    let status = client.status(pb::StatusRequest {}).await?.into_inner();
    let facts = status.model.context("no model facts")?;
    ensure!(facts.architecture == pb::Architecture::GptOss as i32);
    let experts = 4 * 8 * (3 * 64 * 128 + 128 + 128 + 64);
    ensure!(
        facts.parameter_count - facts.active_parameter_count == experts * 3 / 4,
        "{} total, {} active",
        facts.parameter_count,
        facts.active_parameter_count
    );
    Ok(())
}

/// Each request must be refused with INVALID_ARGUMENT.
async fn expect_invalid(
    client: &mut grove_proto::runner::v1::runner_client::RunnerClient<tonic::transport::Channel>,
    cases: Vec<(&str, pb::GenerateRequest)>,
) -> Result<()> {
    for (what, req) in cases {
        let err = complete(client, req)
            .await
            .err()
            .with_context(|| format!("{what} was accepted"))?;
        ensure!(
            err.code() == tonic::Code::InvalidArgument,
            "{what}: {err:?}"
        );
    }
    Ok(())
}

/// Bad options and prompts are INVALID_ARGUMENT before any stream starts.
#[tokio::test]
async fn bad_requests_are_rejected() -> Result<()> {
    let (_served, mut client) = Served::start(&fixtures::model_dir("llama-q4")?, &[]).await?;
    let cases: Vec<(&str, pb::GenerateRequest)> = vec![
        (
            "negative temperature",
            pb::GenerateRequest {
                sampling: Some(pb::SamplingOptions {
                    temperature: -1.0,
                    ..Default::default()
                }),
                ..tokens_request(&[1, 2, 3], 4)
            },
        ),
        (
            "top_p above 1",
            pb::GenerateRequest {
                sampling: Some(pb::SamplingOptions {
                    top_p: Some(1.5),
                    ..Default::default()
                }),
                ..tokens_request(&[1, 2, 3], 4)
            },
        ),
        ("empty prompt", tokens_request(&[], 4)),
        (
            "token outside the vocabulary",
            tokens_request(&[1, 5000], 4),
        ),
        (
            "empty stop string",
            pb::GenerateRequest {
                stop: vec![String::new()],
                ..tokens_request(&[1, 2], 4)
            },
        ),
        ("no input", pb::GenerateRequest::default()),
    ];
    expect_invalid(&mut client, cases).await?;
    // The runner is still fine, and sampling options are honoured: top_k = 1
    // at temperature 1 leaves only the argmax, so it equals greedy decoding.
    let greedy = complete(&mut client, tokens_request(&[1, 2, 3], 12)).await?;
    ensure!(greedy.metrics().prompt_tokens == 3);
    let top1 = complete(
        &mut client,
        pb::GenerateRequest {
            sampling: Some(pb::SamplingOptions {
                temperature: 1.0,
                top_k: Some(1),
                seed: Some(5),
                ..Default::default()
            }),
            ..tokens_request(&[1, 2, 3], 12)
        },
    )
    .await?;
    ensure!(
        top1.text == greedy.text,
        "{:?} vs {:?}",
        top1.text,
        greedy.text
    );
    Ok(())
}

/// Stop strings end generation and are never emitted; text prompts, Tokenize
/// and Detokenize agree with the model's tokenizer.
#[tokio::test]
async fn stop_strings_and_tokenizer_calls() -> Result<()> {
    let model = "qwen3-f32";
    let (mut served, mut client) = Served::start(&fixtures::model_dir(model)?, &[]).await?;
    let free = complete(&mut client, tokens_request(&LONG_RUNNING, 40)).await?;
    ensure!(
        free.text.chars().count() > 12,
        "too little text to cut: {:?}",
        free.text
    );
    // A stop string from the middle of the free-running text.
    let chars: Vec<char> = free.text.chars().collect();
    let stop: String = chars[8..11].iter().collect();
    let cut = free.text.find(&stop).context("stop not in text")?;
    let mut req = tokens_request(&LONG_RUNNING, 40);
    req.stop = vec![stop.clone()];
    let stopped = complete(&mut client, req).await?;
    ensure!(stopped.reason() == pb::DoneReason::Stop);
    ensure!(
        stopped.text == free.text[..cut],
        "{:?} vs {:?}",
        stopped.text,
        &free.text[..cut]
    );

    let ids = client
        .tokenize(pb::TokenizeRequest {
            text: "The quick brown fox".into(),
            add_special_tokens: true,
        })
        .await?
        .into_inner()
        .ids;
    let reference = fixtures::reference(model)?;
    let short = reference
        .cases
        .iter()
        .find(|c| c.name == "short")
        .context("no short case")?;
    ensure!(
        ids == short.prompt_tokens,
        "{ids:?} vs {:?}",
        short.prompt_tokens
    );
    let text = client
        .detokenize(pb::DetokenizeRequest { ids })
        .await?
        .into_inner()
        .text;
    ensure!(text == "The quick brown fox", "{text:?}");

    // Shutdown ends the process and removes its socket.
    client.shutdown(pb::ShutdownRequest {}).await?;
    let status = served.wait_exit(Duration::from_secs(10))?;
    ensure!(status.success(), "exit status {status}");
    ensure!(!served.socket.exists(), "socket left behind");
    Ok(())
}

fn message(role: pb::Role, content: &str) -> pb::Message {
    pb::Message {
        role: role as i32,
        content: content.into(),
        ..Default::default()
    }
}

fn chat_request(
    messages: Vec<pb::Message>,
    tools: &[&str],
    max_tokens: u32,
) -> pb::GenerateRequest {
    pb::GenerateRequest {
        input: Some(pb::generate_request::Input::Chat(pb::Chat {
            messages,
            tools_json: tools.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        })),
        max_tokens,
        ..Default::default()
    }
}

/// Models with sliding-window layers (windows of 24 and 32 tokens, prompts
/// of ~300) or recurrent ones: every follow-up turn hits the prompt cache
/// although the rotating caches have evicted the start and a recurrent
/// state cannot go back at all, and gives the text of a cold run.
/// A turn that continues the entry reuses all of it; one that branches 40
/// tokens back reuses at least the entry's checkpoint at the end of the last
/// prompt (here the windows still hold enough to go back: the batch keeps a
/// margin and slides by whole steps; prompt_cache's tests cover the
/// checkpoint itself; a recurrent model reuses exactly the checkpoint).
#[tokio::test]
async fn windowed_models_hit_the_cache_every_turn() -> Result<()> {
    for model in fixtures::WINDOWED.iter().chain(&fixtures::RECURRENT) {
        let model = *model;
        let reference = fixtures::reference(model)?;
        // A recurrent state holds the EOS it took in, so a turn that
        // continues after the answer without it branches off the entry (see
        // chat_turn_two_reuses_turn_one): the longest case that ends by
        // length is used for those.
        let recurrent = fixtures::RECURRENT.contains(&model);
        let case = reference
            .cases
            .iter()
            .filter(|c| !recurrent || c.finish_reason == "length")
            .max_by_key(|c| c.prompt_tokens.len())
            .context("no case")?;
        let (_served, mut client) = Served::start(&fixtures::model_dir(model)?, &[]).await?;
        let turn1 = complete(
            &mut client,
            tokens_request(&case.prompt_tokens, case.max_tokens as u32),
        )
        .await?;
        ensure!(turn1.metrics().cached_prompt_tokens == 0);
        ensure!(turn1.text == case.text, "{model}: turn 1 is not mlx-lm's");

        // Turn 2 continues the whole entry: all of it is reused.
        let mut prompt2 = case.prompt_tokens.clone();
        prompt2.extend(&case.tokens);
        prompt2.extend([11u32, 22, 33, 44, 55]);
        let turn2 = complete(&mut client, tokens_request(&prompt2, 40)).await?;
        let held = case.prompt_tokens.len() + case.tokens.len();
        ensure!(
            turn2.metrics().cached_prompt_tokens as usize == held,
            "{model}: turn 2 reused {}, expected {held}",
            turn2.metrics().cached_prompt_tokens
        );

        // Turn 3 branches where turn 2's answer began, 40 tokens back.
        let mut prompt3 = prompt2.clone();
        prompt3.extend([66u32, 77, 88]);
        let turn3 = complete(&mut client, tokens_request(&prompt3, 16)).await?;
        ensure!(
            turn3.metrics().cached_prompt_tokens as usize >= prompt2.len() - 1,
            "{model}: turn 3 reused {}, expected at least the checkpoint at {}",
            turn3.metrics().cached_prompt_tokens,
            prompt2.len() - 1
        );

        // A recurrent state goes back only to the checkpoint, which costs
        // one state per recurrent layer (qwen3-next: 3 layers of a 3x128
        // float32 convolution state and 4 float32 16x16 recurrent states).
        if recurrent {
            ensure!(
                turn3.metrics().cached_prompt_tokens as usize == prompt2.len() - 1,
                "{model}: turn 3 reused {}",
                turn3.metrics().cached_prompt_tokens
            );
            let status = client.status(pb::StatusRequest {}).await?.into_inner();
            let m = status.memory.context("no memory report")?;
            // Of 4 layers, qwen3.5-moe's has 2 recurrent, the others 3.
            let recurrent_layers = if model.starts_with("qwen3.5-moe") {
                2
            } else {
                3
            };
            let per_state = recurrent_layers * (3 * 128 + 4 * 16 * 16) * 4;
            ensure!(m.checkpoint_bytes == per_state, "{m:?}");
            ensure!(m.window_bytes_per_sequence == 2 * per_state, "{m:?}");
            // Full attention: the other layers, 2 KV heads of 32 floats.
            ensure!(
                m.kv_bytes_per_token == (4 - recurrent_layers) * 2 * 2 * 32 * 4,
                "{m:?}"
            );
        }
        // Gemma 4's shared layers keep no cache but are layers.
        if model == "gemma4-f32" {
            let status = client.status(pb::StatusRequest {}).await?.into_inner();
            let facts = status.model.context("no model facts")?;
            ensure!(facts.num_layers == 4, "{facts:?}");
        }
        // Memory figures count each kind of layer: gemma3-f32 has one
        // global layer of 3 (2 KV heads of 32 floats) and two windows of 32.
        if model == "gemma3-f32" {
            let status = client.status(pb::StatusRequest {}).await?.into_inner();
            let m = status.memory.context("no memory report")?;
            let per_layer_token = 2 * 2 * 32 * 4;
            ensure!(m.kv_bytes_per_token == per_layer_token, "{m:?}");
            ensure!(
                m.window_bytes_per_sequence == 2 * (2 * 32 + 256 + 16) * per_layer_token,
                "{m:?}"
            );
            ensure!(
                m.checkpoint_bytes > 0 && m.checkpoint_bytes < m.kv_bytes,
                "{m:?}"
            );
        }
        // Cold runs of turns 2 and 3 give the same text.
        for (p, cached, max) in [(&prompt2, &turn2, 40), (&prompt3, &turn3, 16)] {
            let mut other = p[..5].to_vec();
            other[0] = if other[0] == 7 { 8 } else { 7 };
            complete(&mut client, tokens_request(&other, 2)).await?;
            let cold = complete(&mut client, tokens_request(p, max)).await?;
            ensure!(cold.metrics().cached_prompt_tokens == 0);
            ensure!(
                cold.text == cached.text,
                "{model}: cached {:?}, cold {:?}",
                cached.text,
                cold.text
            );
        }
    }
    Ok(())
}

const WEATHER_TOOL: &str = r#"{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}"#;

/// A chat conversation's second turn reuses the first turn (its prompt and the
/// answer as far as the template re-renders it) and answers as a cold run does.
#[tokio::test]
async fn chat_turn_two_reuses_turn_one() -> Result<()> {
    for model in ["qwen2-f32", "llama-q4", "qwen3-next-f32"] {
        let (_served, mut client) = Served::start(&fixtures::model_dir(model)?, &[]).await?;
        // A recurrent model goes back to its checkpoint when the answer
        // re-renders differently: all of the prompt but its last token
        // (evaluated with the first decode step).
        let least = |prompt: u32| {
            if fixtures::RECURRENT.contains(&model) {
                prompt - 1
            } else {
                prompt
            }
        };
        let system = message(pb::Role::System, "You are a terse assistant.");
        let user1 = message(pb::Role::User, "Tell me about the quick brown fox.");
        let turn1 = complete(
            &mut client,
            chat_request(vec![system.clone(), user1.clone()], &[], 12),
        )
        .await?;
        let first_prompt = turn1.metrics().prompt_tokens;

        let turn2_messages = vec![
            system.clone(),
            user1,
            message(pb::Role::Assistant, &turn1.text),
            message(pb::Role::User, "And the lazy dog?"),
        ];
        let turn2 = complete(&mut client, chat_request(turn2_messages.clone(), &[], 12)).await?;
        let m = turn2.metrics();
        ensure!(
            m.cached_prompt_tokens >= least(first_prompt)
                && m.cached_prompt_tokens < m.prompt_tokens,
            "{model}: turn 2 reused {} of {} tokens; turn 1's prompt alone was {first_prompt}",
            m.cached_prompt_tokens,
            m.prompt_tokens
        );

        // Cold: replace the entry with an unrelated conversation, then turn 2
        // again. (Templates may share a few opening tokens, e.g. a default
        // system prompt.)
        let other = vec![message(
            pb::Role::User,
            "Something else entirely, at length.",
        )];
        complete(&mut client, chat_request(other, &[], 2)).await?;
        let cold = complete(&mut client, chat_request(turn2_messages, &[], 12)).await?;
        ensure!(
            cold.metrics().cached_prompt_tokens < first_prompt / 2,
            "{model}: after an unrelated chat, turn 2 still reused {} tokens",
            cold.metrics().cached_prompt_tokens
        );
        ensure!(
            cold.text == turn2.text,
            "{model}: cached and cold turn 2 differ: {:?} vs {:?}",
            turn2.text,
            cold.text
        );
    }
    Ok(())
}

/// A system prompt prewarmed with the request's tools makes the first request warm.
#[tokio::test]
async fn prewarmed_system_prompt() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tools = dir.path().join("tools.json");
    std::fs::write(&tools, format!("[{WEATHER_TOOL}]"))?;
    let system = "You are a weather bot. Answer with tool calls.";
    let model = qwen3_with_tool_template(dir.path())?;
    let tools_arg = tools.to_str().context("path")?;
    let (_served, mut client) = Served::start(
        &model,
        &["--prewarm-system", system, "--prewarm-tools", tools_arg],
    )
    .await?;
    // The prewarm is queued ahead of this request, so it is done by the time it runs.
    let messages = vec![
        message(pb::Role::System, system),
        message(pb::Role::User, "Weather in Paris?"),
    ];
    let first = complete(
        &mut client,
        chat_request(messages.clone(), &[WEATHER_TOOL], 4),
    )
    .await?;
    let status = client.status(pb::StatusRequest {}).await?.into_inner();
    ensure!(status.memory.context("memory")?.cached_tokens > 0);
    ensure!(
        first.metrics().cached_prompt_tokens > 40,
        "the first request reused only {} tokens",
        first.metrics().cached_prompt_tokens
    );

    // The RPC does the same on demand, and reports what it holds.
    let again = client
        .prewarm(pb::PrewarmRequest {
            system: system.into(),
            tools_json: vec![WEATHER_TOOL.into()],
            ..Default::default()
        })
        .await?
        .into_inner();
    ensure!(again.cached_tokens as u32 >= first.metrics().cached_prompt_tokens);
    Ok(())
}

/// A prewarmed system prompt stays warm across conversations: after an
/// unrelated chat replaced the entry, a conversation that begins with the
/// system prompt still reuses it, on a model whose recurrent layers cannot
/// go back as on an attention-only one.
#[tokio::test]
async fn prewarmed_system_prompt_outlives_other_conversations() -> Result<()> {
    let system = "You are a terse assistant who answers in one line.";
    for model in ["qwen3-next-f32", "qwen2-f32"] {
        let dir = fixtures::model_dir(model)?;
        let (_served, mut client) = Served::start(&dir, &["--prewarm-system", system]).await?;
        let warm = client
            .prewarm(pb::PrewarmRequest {
                system: system.into(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .cached_tokens;
        ensure!(warm > 5, "{model}: the prewarm holds {warm} tokens");
        let ask = |user: &str| {
            chat_request(
                vec![
                    message(pb::Role::System, system),
                    message(pb::Role::User, user),
                ],
                &[],
                6,
            )
        };
        let first = complete(&mut client, ask("Tell me about the quick brown fox.")).await?;
        ensure!(
            first.metrics().cached_prompt_tokens as u64 == warm as u64,
            "{model}: the first chat reused {} of the prewarm's {warm}",
            first.metrics().cached_prompt_tokens
        );
        // Another conversation, without the system prompt, takes the entry.
        let other = vec![message(
            pb::Role::User,
            "Something else entirely, at length.",
        )];
        complete(&mut client, chat_request(other, &[], 6)).await?;
        let again = complete(&mut client, ask("And the lazy dog?")).await?;
        ensure!(
            again.metrics().cached_prompt_tokens as u64 >= warm as u64,
            "{model}: after another conversation, reused {} of the prewarm's {warm}",
            again.metrics().cached_prompt_tokens
        );
    }
    Ok(())
}

/// A copy of the qwen3-q4 fixture whose chat template is a realistic Qwen3 one
/// (it renders tools into the system turn).
fn qwen3_with_tool_template(into: &std::path::Path) -> Result<std::path::PathBuf> {
    let src = fixtures::model_dir("qwen3-q4")?;
    let dst = into.join("qwen3-tools");
    std::fs::create_dir(&dst)?;
    for entry in std::fs::read_dir(&src)? {
        let entry = entry?;
        if entry.file_name() != "chat_template.jinja" {
            std::fs::copy(entry.path(), dst.join(entry.file_name()))?;
        }
    }
    let realistic = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../runner/tests-data/chat/templates/src/qwen3.jinja");
    std::fs::copy(&realistic, dst.join("chat_template.jinja"))
        .with_context(|| format!("copying {}", realistic.display()))?;
    Ok(dst)
}

/// Malformed conversations are INVALID_ARGUMENT.
#[tokio::test]
async fn bad_chats_are_rejected() -> Result<()> {
    let (_served, mut client) = Served::start(&fixtures::model_dir("mistral-f32")?, &[]).await?;
    let no_role = pb::Message {
        content: "hi".into(),
        ..Default::default()
    };
    let bad_call = pb::Message {
        role: pb::Role::Assistant as i32,
        tool_calls: vec![pb::ToolCall {
            name: "get_weather".into(),
            arguments_json: "{not json".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let cases = vec![
        ("no role", chat_request(vec![no_role], &[], 2)),
        ("no messages", chat_request(vec![], &[], 2)),
        (
            "tool call arguments",
            chat_request(vec![message(pb::Role::User, "hi"), bad_call], &[], 2),
        ),
        (
            "tool that is not JSON",
            chat_request(vec![message(pb::Role::User, "hi")], &["{oops"], 2),
        ),
    ];
    expect_invalid(&mut client, cases).await?;
    let ok = complete(
        &mut client,
        chat_request(vec![message(pb::Role::User, "hi")], &[], 2),
    )
    .await?;
    ensure!(ok.metrics().prompt_tokens > 2);
    Ok(())
}

/// A client that opens a stream and never reads it does not wedge the runner:
/// Health answers at once meanwhile, and when that client goes away the
/// request queued behind it is served.
#[tokio::test]
async fn a_client_that_never_reads_does_not_deadlock() -> Result<()> {
    let (_served, mut client) = Served::start(&fixtures::model_dir("qwen3-f32")?, &[]).await?;
    // Until the context is full: thousands of pieces, more than the buffers hold.
    let silent = client
        .generate(tokens_request(&LONG_RUNNING, 0))
        .await?
        .into_inner();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let start = Instant::now();
    client.health(pb::HealthRequest {}).await?;
    ensure!(
        start.elapsed() < Duration::from_millis(500),
        "Health took {:?}",
        start.elapsed()
    );

    let mut other = client.clone();
    let queued =
        tokio::spawn(async move { complete(&mut other, tokens_request(&[1, 2, 3], 4)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(silent);
    let done = tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .context("the queued request never ran after the silent client left")???;
    ensure!(done.metrics().eval_tokens == 4);
    Ok(())
}

/// A conversation sent as chat messages gives exactly mlx-lm's prompt (its
/// template rendering and tokenization) and exactly mlx-lm's streamed text.
#[tokio::test]
async fn chat_matches_mlx_lm_end_to_end() -> Result<()> {
    for model in fixtures::MODELS {
        let reference = fixtures::reference(model)?;
        let case = reference
            .cases
            .iter()
            .find(|c| c.name == "chat")
            .context("no chat case")?;
        let (_served, mut client) = Served::start(&fixtures::model_dir(model)?, &[]).await?;
        let messages = case
            .messages
            .iter()
            .map(|m| {
                let role = match m.role.as_str() {
                    "system" => pb::Role::System,
                    "assistant" => pb::Role::Assistant,
                    _ => pb::Role::User,
                };
                message(role, &m.content)
            })
            .collect();
        let done = complete(
            &mut client,
            chat_request(messages, &[], case.max_tokens as u32),
        )
        .await?;
        ensure!(
            done.metrics().prompt_tokens as usize == case.prompt_tokens.len(),
            "{model}: the chat renders to {} tokens, mlx-lm's to {}",
            done.metrics().prompt_tokens,
            case.prompt_tokens.len()
        );
        ensure!(
            done.text == case.text,
            "{model}: text differs from mlx-lm's\n grove:  {:?}\n mlx-lm: {:?}",
            done.text,
            case.text
        );
    }
    Ok(())
}
