//! `grove::store::pull` against a real HTTP hub on 127.0.0.1
//! ([`grove_tests::hub_server`]) serving the fixture models (`qwen2-f32` is
//! sharded in three): a clean pull, interrupted and resumed pulls, a corrupted
//! byte, two pulls at once, offline mode, 401/403/404 messages, and interop
//! with `huggingface_hub` and mlx-lm both ways.
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use grove::store::{
    HubToken, ModelName, Progress, ProgressBar, PullOptions, Store, StoreError, pull,
};
use grove_tests::fixtures;
use grove_tests::hub_server::{Faults, HubServer, pull_events, runner_files};

const SHARDED: &str = "grove-test/qwen2-f32";
const SHARD1: &str = "model-00001-of-00003.safetensors";
const SHARD2: &str = "model-00002-of-00003.safetensors";

/// A server with the sharded fixture, and an empty cache.
async fn setup() -> Result<(HubServer, tempfile::TempDir, Store)> {
    let server = HubServer::start().await?;
    server.add_fixture(SHARDED, &fixtures::model_dir("qwen2-f32")?)?;
    let cache = tempfile::tempdir()?;
    let store = Store::new(cache.path().join("hub"));
    Ok((server, cache, store))
}

fn opts(server: &HubServer) -> PullOptions {
    PullOptions {
        endpoint: server.endpoint(),
        token: None,
        offline: false,
        concurrency: 4,
        retries: 0,
    }
}

fn name(s: &str) -> ModelName {
    ModelName::parse(s).expect("a valid test name")
}

/// A pull that must fail.
async fn pull_err(store: &Store, n: &str, o: &PullOptions) -> StoreError {
    pull_events(store, &name(n), o).await.0.expect_err(n)
}

/// Bytes a pull downloaded, from its last event.
fn downloaded(events: &[Progress]) -> Option<u64> {
    match events.last() {
        Some(Progress::Done {
            downloaded_bytes, ..
        }) => Some(*downloaded_bytes),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clean_pull_makes_a_hub_cache_snapshot() -> Result<()> {
    let (server, _cache, store) = setup().await?;
    // Files a runner does not need, and a shard the index does not name.
    let mut files: Vec<(String, Vec<u8>)> = runner_files("qwen2-f32")?;
    files.push(("consolidated.safetensors".into(), vec![7; 50_000]));
    files.push(("pytorch_model.bin".into(), vec![1; 1000]));
    files.push(("sub/model.safetensors".into(), vec![2; 1000]));
    files.push(("README.md".into(), b"# readme".to_vec()));
    let commit = server.add_repo("org/extra", files);
    let mut o = opts(&server);
    o.token = HubToken::new("hf_test_secret_token");

    let (r, events) = pull_events(&store, &name("org/extra"), &o).await;
    let dir = r?;
    assert_eq!(
        dir,
        store
            .root()
            .join("models--org--extra/snapshots")
            .join(&commit)
    );
    let want = runner_files("qwen2-f32")?;
    let mut got: Vec<String> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    got.sort();
    assert_eq!(got, want.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>());
    let repo = server.repo("org/extra").context("repo")?;
    for (n, bytes) in &want {
        let link = std::fs::read_link(dir.join(n))?;
        let etag = repo.files[n].etag();
        assert_eq!(link, Path::new("../../blobs").join(etag), "{n}");
        assert_eq!(&std::fs::read(dir.join(n))?, bytes, "{n}");
    }
    let refs = std::fs::read_to_string(store.root().join("models--org--extra/refs/main"))?;
    assert_eq!(refs, commit);
    assert_eq!(store.resolve(&name("org/extra"))?, dir);
    assert_eq!(store.resolve(&name(&format!("org/extra@{commit}")))?, dir);

    let total: u64 = want.iter().map(|(_, b)| b.len() as u64).sum();
    let list = store.list()?;
    assert_eq!(list.len(), 1);
    assert_eq!(
        (
            list[0].name.to_string(),
            list[0].size_bytes,
            list[0].complete
        ),
        ("org/extra".to_string(), total, true)
    );
    assert_eq!(downloaded(&events), Some(total));

    // The token went to the hub, never to the CDN.
    let log = server.log();
    for req in &log {
        let to_cdn = req.path.starts_with("/cdn/");
        let auth = req.authorization.as_deref();
        assert_eq!(
            auth,
            (!to_cdn).then_some("Bearer hf_test_secret_token"),
            "{req:?}"
        );
    }
    assert!(log.iter().any(|r| r.path.starts_with("/cdn/")));

    // A second pull downloads nothing.
    server.clear_log();
    let (r, events) = pull_events(&store, &name("org/extra"), &o).await;
    assert_eq!(r?, dir);
    assert_eq!(downloaded(&events), Some(0));
    assert!(
        !server
            .log()
            .iter()
            .any(|r| r.method == "GET" && r.path.starts_with("/cdn/"))
    );

    // A renamed repo: the hub redirects, the pull follows.
    server.rename("old-org/extra", "org/extra");
    let (r, _) = pull_events(&store, &name("old-org/extra"), &o).await;
    assert!(r?.ends_with(&commit));

    // `grove rm` takes the snapshot and its blobs.
    let report = store.remove(&name("org/extra"))?;
    assert_eq!(report.bytes_freed, total);
    assert!(report.repo_removed);
    assert!(!store.root().join("models--org--extra").exists());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interrupted_pull_resumes_with_range() -> Result<()> {
    let (server, _cache, store) = setup().await?;
    let repo = server.repo(SHARDED).context("repo")?;
    let shard = &repo.files[SHARD1];
    let size = shard.data.len() as u64;
    let total: u64 = runner_files("qwen2-f32")?
        .iter()
        .map(|(_, b)| b.len() as u64)
        .sum();
    let cut_at = 100_000;
    // 1 MiB/s per connection, so the timings mean something.
    server.set_faults(Faults {
        cut: Some((SHARD1.into(), cut_at)),
        cut_times: 1,
        throttle: 1 << 20,
        ..Faults::default()
    });
    let t = Instant::now();
    let (r, _) = pull_events(&store, &name(SHARDED), &opts(&server)).await;
    let first = t.elapsed();
    let e = r.expect_err("the cut must fail the pull");
    assert!(matches!(e, StoreError::Network { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("kept") && msg.contains("resumes"), "{msg}");
    let partial = store.root().join(format!(
        "models--grove-test--qwen2-f32/blobs/{}.incomplete",
        shard.sha256
    ));
    assert_eq!(std::fs::metadata(&partial)?.len(), cut_at);
    assert!(!linked(&store, SHARDED, &repo.commit, SHARD1));
    assert!(
        store.resolve(&name(SHARDED)).is_err(),
        "no ref before the pull completes"
    );

    server.clear_log();
    let t = Instant::now();
    let (r, events) = pull_events(&store, &name(SHARDED), &opts(&server)).await;
    let second = t.elapsed();
    let dir = r?;
    let ranged: Vec<_> = server
        .log()
        .into_iter()
        .filter(|q| q.path.ends_with(&shard.sha256) && q.method == "GET")
        .collect();
    assert_eq!(ranged.len(), 1, "{ranged:?}");
    assert_eq!(ranged[0].range.as_deref(), Some("bytes=100000-"));
    assert_eq!(ranged[0].sent, size - cut_at);
    let downloaded_bytes = downloaded(&events).context("no Done event")?;
    assert!(downloaded_bytes < total, "{downloaded_bytes} >= {total}");
    assert_eq!(std::fs::read(dir.join(SHARD1))?, *shard.data);
    assert!(!partial.exists());
    println!(
        "interrupted pull: failed after {first:?} with {cut_at} of {size} bytes of {SHARD1} on disk; \
         resumed pull: {second:?}, downloaded {downloaded_bytes} of {total} bytes ({SHARD1}: {} bytes from \
         offset {cut_at})",
        size - cut_at
    );
    Ok(())
}

/// Whether the snapshot of `repo` at `commit` has an entry for `file`.
fn linked(store: &Store, repo: &str, commit: &str, file: &str) -> bool {
    let dir = store
        .root()
        .join(format!("models--{}", repo.replace('/', "--")));
    std::fs::symlink_metadata(dir.join("snapshots").join(commit).join(file)).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aborted_pull_resumes_and_retries_resume_by_themselves() -> Result<()> {
    let (server, _cache, store) = setup().await?;
    let repo = server.repo(SHARDED).context("repo")?;
    // Slow enough to abort part-way.
    server.set_faults(Faults {
        throttle: 256 << 10,
        ..Faults::default()
    });
    let (store2, n, o) = (store.clone(), name(SHARDED), opts(&server));
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let task = tokio::spawn(async move { pull(&store2, &n, &o, tx).await });
    // Abort once a shard has bytes on disk (writes go out every 64 KiB).
    while let Some(p) = rx.recv().await {
        if let Progress::FileBytes { file, done, .. } = &p
            && file.ends_with(".safetensors")
            && *done >= 128 << 10
        {
            break;
        }
    }
    task.abort();
    let _ = task.await;
    let blobs = store.root().join("models--grove-test--qwen2-f32/blobs");
    let partial: u64 = std::fs::read_dir(&blobs)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum();
    assert!(partial > 0, "the aborted pull left no partial data");

    // The next pull resumes; a cut during it is retried (with Range) by the pull itself.
    server.clear_log();
    server.set_faults(Faults {
        cut: Some((SHARD2.into(), 50_000)),
        cut_times: 1,
        ..Faults::default()
    });
    let mut o = opts(&server);
    o.retries = 2;
    let (r, events) = pull_events(&store, &name(SHARDED), &o).await;
    let dir = r?;
    let log = server.log();
    assert!(
        log.iter()
            .any(|q| q.range.is_some() && q.path.ends_with(&repo.files[SHARD2].sha256))
    );
    let resumed: u64 = events
        .iter()
        .filter_map(|p| match p {
            Progress::FileStart { resumed_from, .. } => Some(*resumed_from),
            _ => None,
        })
        .sum();
    assert!(
        resumed >= partial + 50_000,
        "resumed {resumed}, partial {partial}"
    );
    for (n, bytes) in runner_files("qwen2-f32")? {
        assert_eq!(std::fs::read(dir.join(&n))?, bytes, "{n}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corrupted_byte_is_rejected() -> Result<()> {
    let (server, _cache, store) = setup().await?;
    let repo = server.repo(SHARDED).context("repo")?;
    for (file, offset) in [(SHARD2, 12_345u64), ("tokenizer.json", 100)] {
        let store = Store::new(store.root().join(file));
        server.set_faults(Faults {
            corrupt: Some((file.into(), offset)),
            ..Faults::default()
        });
        let (r, _) = pull_events(&store, &name(SHARDED), &opts(&server)).await;
        let e = r.expect_err("a corrupted file must fail the pull");
        assert!(matches!(e, StoreError::HashMismatch { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(file) && msg.contains("discarded"), "{msg}");
        let etag = repo.files[file].etag();
        let blobs = store.root().join("models--grove-test--qwen2-f32/blobs");
        assert!(
            !blobs.join(etag).exists(),
            "{file}: a bad blob became visible"
        );
        assert!(
            !blobs.join(format!("{etag}.incomplete")).exists(),
            "{file}: bad bytes kept"
        );
        assert!(!linked(&store, SHARDED, &repo.commit, file));
        assert!(store.resolve(&name(SHARDED)).is_err());
    }
    server.set_faults(Faults::default());
    let (r, _) = pull_events(&store, &name(SHARDED), &opts(&server)).await;
    let dir = r?;
    assert_eq!(std::fs::read(dir.join(SHARD2))?, *repo.files[SHARD2].data);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_pulls_at_once_both_succeed() -> Result<()> {
    let (server, _cache, store) = setup().await?;
    server.set_faults(Faults {
        throttle: 2 << 20,
        ..Faults::default()
    });
    let (n, o) = (name(SHARDED), opts(&server));
    let other = Store::new(store.root());
    let ((a, ea), (b, eb)) = tokio::join!(pull_events(&store, &n, &o), pull_events(&other, &n, &o));
    let (a, b) = (a?, b?);
    assert_eq!(a, b);
    for (f, bytes) in runner_files("qwen2-f32")? {
        assert_eq!(std::fs::read(a.join(&f))?, bytes, "{f}");
    }
    // Each blob crossed the network once; the other pull waited for it.
    let repo = server.repo(SHARDED).context("repo")?;
    for (f, file) in repo
        .files
        .iter()
        .filter(|(f, _)| grove::store::pull::is_runner_file(f))
    {
        assert_eq!(
            server.sent_for(file.etag(), f),
            file.data.len() as u64,
            "{f}"
        );
    }
    let waited = ea
        .iter()
        .chain(&eb)
        .any(|p| matches!(p, Progress::FileWaiting { .. }));
    let cached = ea
        .iter()
        .chain(&eb)
        .any(|p| matches!(p, Progress::FileDone { cached: true, .. }));
    assert!(waited || cached, "the pulls did not share work");
    let blobs = store.root().join("models--grove-test--qwen2-f32/blobs");
    assert!(
        std::fs::read_dir(blobs)?
            .all(|e| e.is_ok_and(|e| !e.file_name().to_string_lossy().contains("incomplete")))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn offline_mode_uses_only_the_cache() -> Result<()> {
    let (server, _cache, store) = setup().await?;
    let mut off = opts(&server);
    off.offline = true;
    let (r, _) = pull_events(&store, &name(SHARDED), &off).await;
    let e = r.expect_err("nothing cached");
    assert!(matches!(e, StoreError::Offline { .. }), "{e}");
    assert!(e.to_string().contains("HF_HUB_OFFLINE"), "{e}");
    assert!(server.log().is_empty(), "offline mode touched the network");

    let dir = pull_events(&store, &name(SHARDED), &opts(&server))
        .await
        .0?;
    server.clear_log();
    assert_eq!(pull_events(&store, &name(SHARDED), &off).await.0?, dir);
    let commit = server.repo(SHARDED).context("repo")?.commit;
    let pinned = name(&format!("{SHARDED}@{commit}"));
    assert_eq!(pull_events(&store, &pinned, &off).await.0?, dir);
    // A pinned commit already here needs no network even online.
    assert_eq!(pull_events(&store, &pinned, &opts(&server)).await.0?, dir);
    assert!(server.log().is_empty(), "{:?}", server.log());
    let e = pull_err(&store, &format!("{SHARDED}@v1"), &off).await;
    assert!(e.to_string().contains("HF_HUB_OFFLINE"), "{e}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_say_what_to_do() -> Result<()> {
    let (server, _cache, store) = setup().await?;
    server.gate(SHARDED, "hf_right_token");
    let (r, _) = pull_events(&store, &name(SHARDED), &opts(&server)).await;
    let e = r.expect_err("gated");
    let msg = e.to_string();
    assert!(
        matches!(e, StoreError::Unauthorized { status: 401, .. }),
        "{msg}"
    );
    assert!(msg.contains("HF_TOKEN") && msg.contains("gated"), "{msg}");

    let mut o = opts(&server);
    o.token = HubToken::new("hf_wrong_token");
    let e = pull_err(&store, SHARDED, &o).await;
    let msg = e.to_string();
    assert!(
        matches!(e, StoreError::Unauthorized { status: 403, .. }),
        "{msg}"
    );
    assert!(
        msg.contains("token") && !msg.contains("hf_wrong_token"),
        "{msg}"
    );
    assert!(!format!("{e:?}").contains("hf_wrong_token"));

    o.token = HubToken::new("hf_right_token");
    pull_events(&store, &name(SHARDED), &o).await.0?;

    let e = pull_err(&store, "nobody/nothing", &o).await;
    assert!(matches!(e, StoreError::NotFound { .. }), "{e}");
    assert!(
        e.to_string().contains("no such repo: nobody/nothing"),
        "{e}"
    );
    let e = pull_err(&store, &format!("{SHARDED}@v9"), &o).await;
    assert!(e.to_string().contains("has no revision \"v9\""), "{e}");

    let e = ModelName::parse("org/../../etc").expect_err("bad name");
    assert!(matches!(e, StoreError::InvalidName { .. }), "{e}");

    // Nothing listens on this port.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    o.endpoint = format!("http://{dead}");
    let e = pull_err(&store, "org/other", &o).await;
    assert!(matches!(e, StoreError::Network { .. }), "{e}");
    assert!(e.to_string().contains("HF_ENDPOINT"), "{e}");
    println!("messages:\n  {msg}\n  {e}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn progress_transcript() -> Result<()> {
    let (server, _cache, store) = setup().await?;
    server.set_faults(Faults {
        throttle: 512 << 10,
        ..Faults::default()
    });
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let render = tokio::spawn(async move {
        let (mut plain, mut tty) = (
            ProgressBar::new(Vec::new(), false),
            ProgressBar::new(Vec::new(), true),
        );
        while let Some(p) = rx.recv().await {
            plain.update(&p);
            tty.update(&p);
        }
        (plain.into_inner(), tty.into_inner())
    });
    pull(&store, &name(SHARDED), &opts(&server), tx).await?;
    let (plain, tty) = render.await?;
    let plain = String::from_utf8(plain)?;
    let tty = String::from_utf8(tty)?;
    println!("--- grove pull {SHARDED} (plain) ---\n{plain}");
    let frames: Vec<&str> = tty.split('\r').filter(|f| f.contains('[')).collect();
    println!("--- terminal: {} redraws; some frames ---", frames.len());
    for f in frames.iter().step_by((frames.len() / 6).max(1)) {
        println!("{}", f.replace("\x1b[2K", "").trim_end());
    }
    assert!(
        plain.contains("pulling grove-test/qwen2-f32") && plain.contains("done:"),
        "{plain}"
    );
    assert!(
        plain.contains("MiB/s") || plain.contains("KiB/s"),
        "{plain}"
    );
    assert!(tty.contains("ETA"), "{tty:?}");
    Ok(())
}

fn python(script: &str, args: &[&str], hf_home: &Path) -> Result<String> {
    let py_dir = std::env::var_os("PYTHONPATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.grove/py"));
    let out = grove_tests::proc::output(
        std::process::Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
            .arg("-c")
            .arg(script)
            .args(args)
            .env("PYTHONPATH", py_dir)
            .env("HF_HOME", hf_home)
            .env("HF_HUB_DISABLE_TELEMETRY", "1")
            .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            .env("HF_HUB_DISABLE_XET", "1")
            .env_remove("HF_TOKEN")
            .env_remove("HF_ENDPOINT")
            .env_remove("HF_HUB_CACHE")
            .env_remove("HF_HUB_OFFLINE"),
        grove_tests::proc::DEADLINE,
    )?;
    ensure!(
        out.status.success(),
        "python failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn huggingface_hub_snapshot_is_listed_and_runnable_by_grove() -> Result<()> {
    let (server, cache, store) = setup().await?;
    let endpoint = server.endpoint();
    let (root, home) = (store.root().to_path_buf(), cache.path().join("home"));
    let script = "import sys; from huggingface_hub import snapshot_download as s; \
                  print(s(sys.argv[1], endpoint=sys.argv[2], cache_dir=sys.argv[3]))";
    let root_s = root.to_string_lossy().into_owned();
    let out =
        tokio::task::spawn_blocking(move || python(script, &[SHARDED, &endpoint, &root_s], &home))
            .await??;
    let py_dir = PathBuf::from(out.trim());

    let list = store.list()?;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0].name.to_string(), SHARDED);
    assert!(list[0].complete);
    let dir = store.resolve(&name(SHARDED))?;
    assert_eq!(dir, py_dir);

    // Runnable: the same tokens as on the fixture directory.
    let generate = |d: &Path| -> Result<Vec<u32>> {
        let d = d.to_string_lossy().into_owned();
        let a = [
            "--model",
            &d,
            "--prompt-tokens",
            "1,2,3",
            "--max-tokens",
            "4",
        ];
        Ok(grove_tests::runner::generate_json(&a)?.tokens)
    };
    assert_eq!(
        generate(&dir)?,
        generate(&fixtures::model_dir("qwen2-f32")?)?
    );

    // A Grove pull over it reuses every blob.
    let (r, events) = pull_events(&store, &name(SHARDED), &opts(&server)).await;
    assert_eq!(r?, dir);
    assert_eq!(downloaded(&events), Some(0), "{events:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grove_pull_is_loadable_by_mlx_lm_and_accepted_by_huggingface_hub() -> Result<()> {
    let (server, cache, store) = setup().await?;
    let dir = pull_events(&store, &name(SHARDED), &opts(&server))
        .await
        .0?;
    let commit = server.repo(SHARDED).context("repo")?.commit;
    let script = r#"
import sys
from huggingface_hub import scan_cache_dir, snapshot_download, try_to_load_from_cache
repo, cache, snap = sys.argv[1], sys.argv[2], sys.argv[3]
info = scan_cache_dir(cache)
assert not info.warnings, info.warnings
[r] = [r for r in info.repos if r.repo_id == repo]
[rev] = list(r.revisions)
print("scan", r.repo_id, rev.commit_hash, sorted(rev.refs), r.size_on_disk, len(rev.files))
print("cached", try_to_load_from_cache(repo, "config.json", cache_dir=cache))
print("offline", snapshot_download(repo, cache_dir=cache, local_files_only=True))
from mlx_lm import load
model, tok = load(snap)
print("mlx_lm", type(model).__module__, len(tok.encode("hello world")) > 0)
"#;
    let (root, home, d) = (
        store.root().to_string_lossy().into_owned(),
        cache.path().join("home"),
        dir.to_string_lossy().into_owned(),
    );
    let out =
        tokio::task::spawn_blocking(move || python(script, &[SHARDED, &root, &d], &home)).await??;
    println!("{out}");
    let want = runner_files("qwen2-f32")?;
    let total: u64 = want.iter().map(|(_, b)| b.len() as u64).sum();
    let scan = format!("scan {SHARDED} {commit} ['main'] {total} {}", want.len());
    assert!(out.contains(&scan), "{out}");
    assert!(
        out.contains(&format!("cached {}", dir.join("config.json").display())),
        "{out}"
    );
    assert!(out.contains(&format!("offline {}", dir.display())), "{out}");
    assert!(out.contains("mlx_lm mlx_lm.models.qwen2 True"), "{out}");
    Ok(())
}
