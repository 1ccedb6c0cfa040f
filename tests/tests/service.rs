//! `grove service`: the launchd plist and the systemd unit that `grove service
//! install` writes, read back by real parsers: Python's plistlib for the plist;
//! for the unit, `systemd-analyze verify` and systemd's own unit loader
//! (`systemd --test`, which prints the environment it parsed) where they exist,
//! and always a small parser here (sections, ExecStart, Environment escaping).
//! Each test says which path ran. Nothing is installed (there is no launchd or
//! systemd user session here): `install`/`uninstall` run only where they stop
//! before touching the system.
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use grove::service::{self, ENV_VARS, Platform, ServiceError, ServiceSpec};
use grove_tests::proc::{DEADLINE, OutputWithin};
use grove_tests::runner::binary;
use serde_json::{Value, json};

const SECRET: &str = "hf_secret_never_written";

/// A value for each passed-through variable, with everything the formats escape.
const VALUES: &[(&str, &str)] = &[
    ("GROVE_HOST", "127.0.0.1:11500"),
    ("GROVE_KEEP_ALIVE", "-1"),
    ("GROVE_MAX_LOADED", ""),
    ("GROVE_MAX_QUEUE", "  spaces around  "),
    ("GROVE_CONTEXT_LENGTH", "8192"),
    ("GROVE_LOAD_TIMEOUT", "tab\there"),
    ("GROVE_SHARDS", "2"),
    ("HF_HOME", "/tmp/hf <&>\"' home"),
    ("HF_HUB_CACHE", "l1\nl2\r\nl3"),
    (
        "HF_ENDPOINT",
        r#"<&>"' %h %% $HOME ${X} $$ \back\slash ]]> ü🌲"#,
    ),
];

/// A spec in a temporary directory whose paths need escaping too. The program
/// is a link to this test binary, so it exists and is executable.
struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    spec: ServiceSpec,
}

fn fixture() -> Result<Fixture> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().to_path_buf();
    let home = root.join("home <&> \"q\" 'a' %h");
    // systemd refuses quotes and backslashes in ExecStart's program (validate
    // says so); the plist test puts them in.
    let bin = root.join("bin <&> %d ü");
    fs::create_dir_all(&home)?;
    fs::create_dir_all(&bin)?;
    let program = bin.join("grove");
    std::os::unix::fs::symlink(std::env::current_exe()?, &program)?;
    let names: Vec<&str> = VALUES.iter().map(|(n, _)| *n).collect();
    ensure!(
        names == ENV_VARS,
        "VALUES must cover ENV_VARS in order: {ENV_VARS:?}"
    );
    let vars: BTreeMap<&str, &str> = VALUES
        .iter()
        .copied()
        .chain([("HF_TOKEN", SECRET)])
        .collect();
    let spec = ServiceSpec::from_parts(program, home, |n| vars.get(n).map(Into::into))?;
    ensure!(
        spec.env.iter().all(|(n, _)| n != "HF_TOKEN"),
        "HF_TOKEN was taken: {spec:?}"
    );
    spec.validate(Platform::MacOs)?;
    spec.validate(Platform::Linux)?;
    Ok(Fixture {
        _tmp: tmp,
        root,
        spec,
    })
}

/// The spec with HF_TOKEN put into `env` by hand: still never written.
fn with_token(spec: &ServiceSpec) -> ServiceSpec {
    let mut spec = spec.clone();
    spec.env.push(("HF_TOKEN".into(), SECRET.into()));
    spec
}

fn text(p: &Path) -> Result<&str> {
    p.to_str().with_context(|| format!("{p:?} is not UTF-8"))
}

/// `name` on PATH, as `which` finds it.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

// ---------------------------------------------------------------- launchd

#[test]
fn launchd_plist_reads_back_with_plistlib() -> Result<()> {
    let f = fixture()?;
    let mut spec = with_token(&f.spec);
    spec.program = f.root.join(r#"bin "q" 'a' \ $x <&>/grove"#);
    let plist = service::render(Platform::MacOs, &spec);
    ensure!(
        !plist.contains(SECRET) && !plist.contains("<key>HF_TOKEN"),
        "{plist}"
    );
    let path = f.root.join("dev.grove.serve.plist");
    fs::write(&path, &plist)?;
    let script = "import json, plistlib, sys\n\
                  with open(sys.argv[1], 'rb') as f:\n    json.dump(plistlib.load(f), sys.stdout)";
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args(["-c", script])
        .arg(&path)
        .output_within(DEADLINE);
    let out = out.with_context(|| format!("running {python} (plistlib)"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success(),
        "plistlib rejected the plist: {stderr}\n{plist}"
    );
    let got: Value = serde_json::from_slice(&out.stdout)?;

    let (log_out, log_err) = service::log_paths(&spec);
    let logs = spec.home.join("Library/Logs/grove");
    ensure!(log_out.parent() == Some(&logs) && log_err.parent() == Some(&logs));
    let env: serde_json::Map<String, Value> = VALUES
        .iter()
        .map(|(n, v)| (n.to_string(), json!(v)))
        .collect();
    let expected = json!({
        "Label": "dev.grove.serve",
        "ProgramArguments": [text(&spec.program)?, "serve"],
        "EnvironmentVariables": env,
        "RunAtLoad": true,
        "KeepAlive": true,
        "StandardOutPath": text(&log_out)?,
        "StandardErrorPath": text(&log_err)?,
    });
    ensure!(
        got == expected,
        "plistlib read\n{got:#}\nexpected\n{expected:#}\nfrom\n{plist}"
    );
    let want = spec.home.join("Library/LaunchAgents/dev.grove.serve.plist");
    ensure!(service::unit_path(Platform::MacOs, &spec) == want);
    eprintln!(
        "plistlib ({python}) read the plist back exactly, {} variables",
        VALUES.len()
    );
    Ok(())
}

// ---------------------------------------------------------------- systemd

/// A unit file's `(section, key, value)` lines, for the subset written here.
fn unit_lines(unit: &str) -> Result<Vec<(String, String, String)>> {
    let mut section = String::new();
    let mut lines = Vec::new();
    for line in unit
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
        } else if let Some((key, value)) = line.split_once('=') {
            ensure!(!section.is_empty(), "{line:?} outside a section");
            ensure!(!value.ends_with('\\'), "a continuation line: {line:?}");
            lines.push((section.clone(), key.to_string(), value.to_string()));
        } else {
            bail!("not a unit file line: {line:?}");
        }
    }
    Ok(lines)
}

/// A value's words as systemd reads them: double quotes and C escapes undone,
/// then `%%` to `%` (specifiers), then in command lines (`exec`) `$$` to `$`.
/// Anything else after `%` or `$` would be expanded by systemd: an error here.
fn unit_words(value: &str, exec: bool) -> Result<Vec<String>> {
    let mut words = Vec::new();
    let mut chars = value.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_ascii_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(words);
        }
        let (mut raw, mut quoted) = (String::new(), false);
        while let Some(c) = chars.next() {
            match c {
                '"' => quoted = !quoted,
                c if c.is_ascii_whitespace() && !quoted => break,
                '\\' => raw.push(match chars.next() {
                    Some('n') => '\n',
                    Some('t') => '\t',
                    Some('r') => '\r',
                    Some('x') => {
                        let hex: String = chars.by_ref().take(2).collect();
                        char::from(u8::from_str_radix(&hex, 16).context("\\x escape")?)
                    }
                    Some(c @ ('\\' | '"' | '\'')) => c,
                    other => bail!("unexpected escape \\{other:?} in {value:?}"),
                }),
                c => raw.push(c),
            }
        }
        ensure!(!quoted, "unterminated quote in {value:?}");
        let mut word = String::new();
        let mut it = raw.chars();
        while let Some(c) = it.next() {
            match c {
                '%' | '$' if c == '%' || exec => {
                    ensure!(it.next() == Some(c), "{c} is not doubled in {value:?}");
                    word.push(c);
                }
                c => word.push(c),
            }
        }
        words.push(word);
    }
}

/// The environment a unit sets, as `(name, value)` in file order.
fn unit_env(lines: &[(String, String, String)]) -> Result<Vec<(String, String)>> {
    let mut env = Vec::new();
    for (_, _, value) in lines
        .iter()
        .filter(|(s, k, _)| s == "Service" && k == "Environment")
    {
        for word in unit_words(value, false)? {
            let (name, value) = word.split_once('=').context("an assignment")?;
            env.push((name.to_string(), value.to_string()));
        }
    }
    Ok(env)
}

fn expected_env() -> Vec<(String, String)> {
    VALUES
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

#[test]
fn systemd_unit_structure_and_escaping() -> Result<()> {
    let f = fixture()?;
    let unit = service::render(Platform::Linux, &with_token(&f.spec));
    ensure!(
        !unit.contains(SECRET) && !unit.contains("HF_TOKEN="),
        "{unit}"
    );
    let lines = unit_lines(&unit)?;
    let mut sections: Vec<&str> = lines.iter().map(|(s, _, _)| s.as_str()).collect();
    sections.dedup();
    ensure!(
        sections == ["Unit", "Service", "Install"],
        "sections {sections:?}\n{unit}"
    );
    let get = |section: &str, key: &str| -> Vec<&str> {
        let hits = lines.iter().filter(|(s, k, _)| s == section && k == key);
        hits.map(|(_, _, v)| v.as_str()).collect()
    };
    ensure!(
        get("Unit", "Description").iter().any(|d| !d.is_empty()),
        "{unit}"
    );
    ensure!(get("Unit", "After") == ["network.target"], "{unit}");
    ensure!(get("Service", "Restart") == ["on-failure"], "{unit}");
    ensure!(get("Install", "WantedBy") == ["default.target"], "{unit}");
    let exec = get("Service", "ExecStart");
    ensure!(exec.len() == 1, "one ExecStart: {exec:?}");
    let argv = unit_words(exec[0], true)?;
    ensure!(
        argv == [text(&f.spec.program)?, "serve"],
        "ExecStart read as {argv:?}\n{unit}"
    );
    ensure!(Path::new(&argv[0]).is_absolute());
    let env = unit_env(&lines)?;
    ensure!(
        env == expected_env(),
        "Environment read as {env:#?}\n{unit}"
    );
    let want = f.spec.home.join(".config/systemd/user/grove.service");
    ensure!(service::unit_path(Platform::Linux, &f.spec) == want);
    eprintln!(
        "the parser here read the unit back: sections, ExecStart, {} variables",
        env.len()
    );
    Ok(())
}

/// `systemd-analyze --user verify` of `unit` installed as grove.service under a
/// scratch config home: its exit status and its complaints about grove.service
/// (it exits 0 on syntax warnings, so these are what counts).
fn analyze_verify(tool: &Path, dir: &Path, unit: &str) -> Result<(bool, Vec<String>)> {
    let user = dir.join("config/systemd/user");
    let runtime = dir.join("runtime");
    fs::create_dir_all(&user)?;
    fs::create_dir_all(&runtime)?;
    fs::set_permissions(
        &runtime,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )?;
    let file = user.join("grove.service");
    fs::write(&file, unit)?;
    let out = Command::new(tool)
        .args(["--user", "verify", "--man=no"])
        .arg(&file)
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("XDG_RUNTIME_DIR", &runtime)
        .output_within(DEADLINE)?;
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    let complaints = said
        .lines()
        .filter(|l| l.contains("grove.service"))
        .map(String::from);
    Ok((out.status.success(), complaints.collect()))
}

#[test]
fn systemd_unit_passes_systemd_analyze_verify() -> Result<()> {
    let Some(tool) = which("systemd-analyze") else {
        eprintln!("systemd-analyze: not on PATH; only the parser here checked the unit");
        return Ok(());
    };
    let f = fixture()?;
    let unit = service::render(Platform::Linux, &f.spec);
    let (ok, complaints) = analyze_verify(&tool, &f.root.join("good"), &unit)?;
    ensure!(
        ok && complaints.is_empty(),
        "verify: ok={ok} {complaints:#?}\n{unit}"
    );
    // Controls: the same check catches a missing program and a broken quote.
    let mut missing = f.spec.clone();
    missing.program = f.root.join("no such dir/grove");
    let broken = format!("{unit}[Service]\nEnvironment=\"BROKEN=unterminated\n");
    for (name, bad) in [
        ("missing", service::render(Platform::Linux, &missing)),
        ("broken", broken),
    ] {
        let (ok, complaints) = analyze_verify(&tool, &f.root.join(name), &bad)?;
        ensure!(
            !(ok && complaints.is_empty()),
            "verify did not catch the {name} unit"
        );
    }
    eprintln!(
        "systemd-analyze verify ({}): ran, no complaints (controls caught)",
        tool.display()
    );
    Ok(())
}

/// systemd's unit loader, run as an unprivileged user (`systemd --test --user`
/// refuses root): the Environment it parsed from `unit`, or None (and why) when
/// it cannot run here.
fn systemd_loaded_env(dir: &Path, unit: &str) -> Result<Option<Vec<String>>> {
    let candidates = ["/lib/systemd/systemd", "/usr/lib/systemd/systemd"];
    let Some(systemd) = candidates.iter().map(Path::new).find(|p| p.is_file()) else {
        eprintln!("systemd --test: no systemd binary");
        return Ok(None);
    };
    let id = |args: &[&str]| -> Result<String> {
        let out = Command::new("id").args(args).output_within(DEADLINE)?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let root = id(&["-u"])? == "0";
    let setpriv = which("setpriv");
    if root && setpriv.is_none() {
        eprintln!("systemd --test: running as root without setpriv to drop to nobody");
        return Ok(None);
    }
    let (user, runtime) = (dir.join("config/systemd/user"), dir.join("runtime"));
    fs::create_dir_all(&user)?;
    fs::create_dir_all(&runtime)?;
    fs::write(user.join("grove.service"), unit)?;
    let mut cmd = match (&setpriv, root) {
        (Some(setpriv), true) => {
            let (uid, gid) = (
                id(&["-u", "nobody"])?.parse()?,
                id(&["-g", "nobody"])?.parse()?,
            );
            for p in [
                dir,
                &dir.join("config"),
                &dir.join("config/systemd"),
                &user,
                &runtime,
            ] {
                std::os::unix::fs::chown(p, Some(uid), Some(gid))?;
            }
            // The scratch root above `dir` must be passable whatever the umask.
            if let Some(scratch) = dir.parent() {
                let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
                fs::set_permissions(scratch, mode)?;
            }
            std::os::unix::fs::chown(user.join("grove.service"), Some(uid), Some(gid))?;
            let mut cmd = Command::new(setpriv);
            let ids = [format!("--reuid={uid}"), format!("--regid={gid}")];
            cmd.args(ids).arg("--clear-groups").arg(systemd);
            cmd
        }
        _ => Command::new(systemd),
    };
    let out = cmd
        .args(["--test", "--user", "--unit=grove.service", "--no-pager"])
        .env("HOME", dir)
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("XDG_RUNTIME_DIR", &runtime)
        .output_within(DEADLINE)?;
    let dump = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !stderr.contains("grove.service"),
        "systemd complained: {stderr}"
    );
    let Some(start) = dump.find("-> Unit grove.service:") else {
        eprintln!("systemd --test: no dump ({}): {stderr}", out.status);
        return Ok(None);
    };
    // Properties are "\t\tKey: value" lines; a value's own newlines continue it.
    let mut env: Vec<String> = Vec::new();
    let mut open = false;
    for line in dump[start..].split('\n').skip(1) {
        if line.starts_with("\t-> ") || (line.starts_with('\t') && !line.starts_with("\t\t")) {
            break;
        }
        if let Some(value) = line.strip_prefix("\t\tEnvironment: ") {
            env.push(value.to_string());
            open = true;
        } else if open && !line.starts_with("\t\t") {
            let last = env.last_mut().context("an open value")?;
            last.push('\n');
            last.push_str(line);
        } else {
            open = false;
        }
    }
    Ok(Some(env))
}

#[test]
fn systemd_loads_the_environment_exactly() -> Result<()> {
    let f = fixture()?;
    let unit = service::render(Platform::Linux, &f.spec);
    let Some(got) = systemd_loaded_env(&f.root.join("load"), &unit)? else {
        eprintln!("systemd --test did not run; the parser here checked the escaping");
        return Ok(());
    };
    let want: Vec<String> = VALUES.iter().map(|(n, v)| format!("{n}={v}")).collect();
    ensure!(
        got == want,
        "systemd loaded\n{got:#?}\nexpected\n{want:#?}\nfrom\n{unit}"
    );
    eprintln!(
        "systemd --test --user loaded all {} variables exactly",
        want.len()
    );
    Ok(())
}

// ---------------------------------------------------------------- the CLI and the rest

/// `grove service install --print --platform P` prints exactly [`service::render`]
/// for the grove binary, $HOME and the variables it was started with.
#[test]
fn cli_print_shows_the_file_without_installing() -> Result<()> {
    let grove = binary("grove")?;
    let f = fixture()?;
    let program = grove.canonicalize()?;
    let spec = ServiceSpec {
        program,
        env: expected_env(),
        home: f.spec.home.clone(),
    };
    for (platform, name) in [(Platform::Linux, "linux"), (Platform::MacOs, "macos")] {
        let out = Command::new(&grove)
            .args(["service", "install", "--print", "--platform", name])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &spec.home)
            .envs(VALUES.iter().copied())
            .env("HF_TOKEN", SECRET)
            .output_within(DEADLINE)?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let what = format!("grove service install --print --platform {name}");
        ensure!(out.status.success(), "{what}: {}: {stderr}", out.status);
        let want = service::render(platform, &spec);
        ensure!(
            stdout.trim_end() == want.trim_end(),
            "{what} printed\n{stdout}\nexpected\n{want}"
        );
        ensure!(!stdout.contains(SECRET));
        let installed = service::unit_path(platform, &spec);
        ensure!(!installed.exists(), "--print installed {installed:?}");
    }
    eprintln!("grove service install --print matches render() for linux and macos");
    Ok(())
}

/// Status reports a missing installation; uninstall says there is nothing to
/// remove; a missing service manager is a clear error. (Only the calls that stop
/// before touching the system run: on macOS the launchd ones are left out.)
#[test]
fn status_and_uninstall_without_an_installation() -> Result<()> {
    let f = fixture()?;
    for platform in [Platform::Linux, Platform::MacOs] {
        let status = service::status(platform, &f.spec)?;
        let path = service::unit_path(platform, &f.spec);
        ensure!(
            status.contains(&format!("{} (not installed)", path.display())),
            "{status}"
        );
        eprintln!("status ({platform:?}):\n{status}");
    }
    if which("systemctl").is_some() {
        let e = service::uninstall(Platform::Linux, &f.spec);
        ensure!(matches!(e, Err(ServiceError::NotInstalled { .. })), "{e:?}");
    }
    if cfg!(target_os = "macos") {
        return Ok(());
    }
    for e in [
        service::uninstall(Platform::MacOs, &f.spec),
        service::install(Platform::MacOs, &f.spec).map(|_| ()),
    ] {
        let e = e.err().context("launchctl is not here, so this fails")?;
        ensure!(
            matches!(
                e,
                ServiceError::ToolMissing {
                    tool: "launchctl",
                    ..
                }
            ),
            "{e}"
        );
        ensure!(e.to_string().contains("launchctl was not found"), "{e}");
    }
    let plist = service::unit_path(Platform::MacOs, &f.spec);
    ensure!(
        !plist.exists() && !f.spec.home.join("Library").exists(),
        "install wrote files"
    );
    Ok(())
}
