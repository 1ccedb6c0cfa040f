//! The SSD tier behind the prompt cache (GROVE_KV_DIR, GROVE_KV_DISK): a
//! conversation's entry outlives the runner and other conversations, is
//! loaded instead of recomputed, and bad files are skipped and removed.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use grove_proto::runner::v1 as pb;
use grove_proto::runner::v1::runner_client::RunnerClient;
use grove_tests::fixtures;
use grove_tests::serve::{Completion, Served, complete, tokens_request};
use tonic::transport::Channel;

type Client = RunnerClient<Channel>;

const MODEL: &str = "llama-kv-f32";

/// A runner on `model` whose SSD tier is `dir` with `budget`.
async fn runner(model: &str, dir: &Path, budget: &str, args: &[&str]) -> Result<(Served, Client)> {
    let dir = dir.to_str().context("path")?;
    Served::start_env(
        &fixtures::model_dir(model)?,
        args,
        &[("GROVE_KV_DIR", dir), ("GROVE_KV_DISK", budget)],
    )
    .await
}

async fn memory(client: &mut Client) -> Result<pb::MemoryReport> {
    client
        .status(pb::StatusRequest {})
        .await?
        .into_inner()
        .memory
        .context("no memory report")
}

/// Waits until the tier holds `n` entries (written by its writer thread).
async fn wait_entries(client: &mut Client, n: u32) -> Result<pb::MemoryReport> {
    let start = Instant::now();
    loop {
        let m = memory(client).await?;
        if m.disk_entries == n {
            return Ok(m);
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("the SSD tier holds {} entries, not {n}", m.disk_entries);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A conversation's first prompt: the "long" reference case with its first
/// token after BOS made `tag`, so conversations share only BOS.
fn conversation(tag: u32) -> Result<Vec<u32>> {
    let mut p = fixtures::reference(MODEL)?
        .cases
        .into_iter()
        .find(|c| c.name == "long")
        .context("no long case")?
        .prompt_tokens;
    p[1] = tag;
    p.truncate(200);
    Ok(p)
}

/// The next turn of a conversation: its last prompt and five new tokens.
fn next_turn(prompt: &[u32], turn: u32) -> Vec<u32> {
    let mut p = prompt.to_vec();
    p.extend([11 + turn, 22, 33, 44, 55]);
    p
}

async fn turn(client: &mut Client, prompt: &[u32]) -> Result<Completion> {
    Ok(complete(client, tokens_request(prompt, 8)).await?)
}

/// The model's entry files in `dir` (one subdirectory per model).
fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for model in std::fs::read_dir(dir)? {
        for f in std::fs::read_dir(model?.path())? {
            let f = f?.path();
            if f.extension().is_some_and(|x| x == "safetensors") {
                out.push(f);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// A runner killed (SIGKILL) after a turn, and started again on the same
/// directory, serves the follow-up turn's prefix from disk (a quantized
/// entry, here q4), and gives the text a cold run gives.
#[tokio::test]
async fn follow_up_turn_from_disk_after_a_restart() -> Result<()> {
    for args in [&[][..], &["--kv-cache-type", "q4"][..]] {
        let dir = tempfile::tempdir()?;
        let first = conversation(500)?;
        let second = next_turn(&first, 0);
        {
            let (_served, mut client) = runner(MODEL, dir.path(), "1G", args).await?;
            let m = turn(&mut client, &first).await?.metrics();
            ensure!(m.cached_prompt_tokens == 0 && m.cached_prompt_tokens_disk == 0);
            let mem = wait_entries(&mut client, 1).await?;
            ensure!(mem.disk_bytes > 0 && mem.disk_budget_bytes == 1 << 30);
        } // Killed here.
        let (_served, mut client) = runner(MODEL, dir.path(), "1G", args).await?;
        ensure!(memory(&mut client).await?.disk_entries == 1);
        let warm = turn(&mut client, &second).await?;
        let m = warm.metrics();
        ensure!(
            m.cached_prompt_tokens as usize == first.len()
                && m.cached_prompt_tokens_disk == m.cached_prompt_tokens,
            "{args:?}: {} cached, {} from disk; the first turn's prompt has {}",
            m.cached_prompt_tokens,
            m.cached_prompt_tokens_disk,
            first.len()
        );
        let (_cold, mut cold) = Served::start(&fixtures::model_dir(MODEL)?, args).await?;
        let reference = turn(&mut cold, &second).await?;
        ensure!(reference.metrics().cached_prompt_tokens == 0);
        if args.is_empty() {
            ensure!(
                warm.text == reference.text,
                "from disk {:?}, cold {:?}",
                warm.text,
                reference.text
            );
        }
    }
    Ok(())
}

/// Conversations A, B, A, C, B: each returns to its own prefix, from disk
/// when another replaced it in memory.
#[tokio::test]
async fn alternating_conversations_return_to_their_prefixes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_served, mut client) = runner(MODEL, dir.path(), "1G", &[]).await?;
    let (a1, b1, c1) = (conversation(500)?, conversation(600)?, conversation(700)?);
    let (a2, b2) = (next_turn(&a1, 1), next_turn(&b1, 2));
    let steps: [(&str, &[u32], usize, usize, u32); 5] = [
        ("A", &a1, 0, 0, 1),
        ("B", &b1, 1, 0, 2),
        ("A again", &a2, a1.len(), a1.len(), 3),
        ("C", &c1, 1, 0, 4),
        ("B again", &b2, b1.len(), b1.len(), 5),
    ];
    for (name, prompt, cached, disk, entries) in steps {
        let m = turn(&mut client, prompt).await?.metrics();
        // A new conversation shares BOS with the entry in memory.
        ensure!(
            m.cached_prompt_tokens as usize == cached
                && m.cached_prompt_tokens_disk as usize == disk,
            "{name}: {} cached ({} from disk); expected {cached} ({disk})",
            m.cached_prompt_tokens,
            m.cached_prompt_tokens_disk
        );
        wait_entries(&mut client, entries).await?;
    }
    Ok(())
}

/// A way to damage a stored file.
type Damage = fn(&Path) -> Result<()>;

/// Truncated, corrupted and foreign files are skipped and removed with a
/// warning, never loaded: the turn is computed and its text is right.
#[tokio::test]
async fn bad_files_are_skipped_and_removed() -> Result<()> {
    let first = conversation(500)?;
    let second = next_turn(&first, 0);
    let (_cold, mut cold) = Served::start(&fixtures::model_dir(MODEL)?, &[]).await?;
    let want = turn(&mut cold, &second).await?.text;
    let damages: [(&str, Damage); 3] = [
        ("truncated", |f| {
            let len = std::fs::metadata(f)?.len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(f)?
                .set_len(len - 100)?;
            Ok(())
        }),
        ("corrupted", |f| {
            let mut bytes = std::fs::read(f)?;
            let at = bytes.len() - 50;
            bytes[at] ^= 0x55;
            std::fs::write(f, bytes)?;
            Ok(())
        }),
        ("garbage", |f| {
            std::fs::write(f, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot safetensors")?;
            Ok(())
        }),
    ];
    for (what, damage) in damages {
        let dir = tempfile::tempdir()?;
        {
            let (_served, mut client) = runner(MODEL, dir.path(), "1G", &[]).await?;
            turn(&mut client, &first).await?;
            wait_entries(&mut client, 1).await?;
        }
        let stored = files(dir.path())?;
        ensure!(stored.len() == 1);
        damage(&stored[0])?;
        let (_served, mut client) = runner(MODEL, dir.path(), "1G", &[]).await?;
        let done = turn(&mut client, &second).await?;
        ensure!(
            done.metrics().cached_prompt_tokens_disk == 0 && done.text == want,
            "{what}: {} tokens from disk, text {:?}",
            done.metrics().cached_prompt_tokens_disk,
            done.text
        );
        ensure!(!stored[0].exists(), "{what}: the bad file is still there");
    }

    // A file of another model, put into this model's directory, is refused.
    let dir = tempfile::tempdir()?;
    {
        let (_served, mut client) = runner("qwen3-f32", dir.path(), "1G", &[]).await?;
        turn(&mut client, &conversation(500)?).await?;
        wait_entries(&mut client, 1).await?;
    }
    let theirs = files(dir.path())?.pop().context("no qwen3 file")?;
    {
        let (_served, mut client) = runner(MODEL, dir.path(), "1G", &[]).await?;
        turn(&mut client, &conversation(600)?).await?;
        wait_entries(&mut client, 1).await?;
    }
    let mine = files(dir.path())?
        .into_iter()
        .find(|f| *f != theirs)
        .context("no llama-kv file")?;
    let target = mine.with_file_name("foreign.safetensors");
    std::fs::copy(&theirs, &target)?;
    let (_served, mut client) = runner(MODEL, dir.path(), "1G", &[]).await?;
    ensure!(memory(&mut client).await?.disk_entries == 1);
    ensure!(!target.exists(), "a foreign file was kept");
    ensure!(theirs.exists() && mine.exists());
    Ok(())
}

/// The disk budget holds: with room for about two entries, the least
/// recently used go as new ones are written, across restarts.
#[tokio::test]
async fn disk_budget_evicts_the_least_recently_used() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let size = {
        let (_served, mut client) = runner(MODEL, dir.path(), "1G", &[]).await?;
        turn(&mut client, &conversation(500)?).await?;
        wait_entries(&mut client, 1).await?.disk_bytes
    };
    let budget = (size * 5 / 2).to_string();
    let (_served, mut client) = runner(MODEL, dir.path(), &budget, &[]).await?;
    for tag in [600, 700, 800] {
        turn(&mut client, &conversation(tag)?).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let start = Instant::now();
    loop {
        let m = memory(&mut client).await?;
        if m.disk_entries == 2 {
            ensure!(m.disk_bytes <= size * 5 / 2);
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(10),
            "{} entries",
            m.disk_entries
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The two most recent conversations are there (700 from disk; 800 is
    // in memory), the oldest two are not.
    let hit = |m: pb::Metrics| m.cached_prompt_tokens_disk > 0;
    ensure!(hit(turn(&mut client, &next_turn(&conversation(700)?, 0))
        .await?
        .metrics()));
    ensure!(!hit(turn(&mut client, &next_turn(&conversation(500)?, 0))
        .await?
        .metrics()));
    ensure!(!hit(turn(&mut client, &next_turn(&conversation(600)?, 0))
        .await?
        .metrics()));
    Ok(())
}
