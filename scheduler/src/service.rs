//! `grove service install|uninstall|status`: `grove serve` as a per-user
//! service, a launchd agent on macOS (`~/Library/LaunchAgents/dev.grove.serve.plist`,
//! logs in `~/Library/Logs/grove/`, `launchctl bootstrap`/`bootout gui/$UID`) and a
//! systemd user unit on Linux (`~/.config/systemd/user/grove.service`, even when
//! `XDG_CONFIG_HOME` is elsewhere; `systemctl --user enable --now`; logs in the
//! journal; it stops with the user's last session unless `loginctl enable-linger`).
//!
//! The service gets the [`ENV_VARS`] set in the installing shell. `HF_TOKEN` is
//! deliberately never written into the file: the daemon reads the Hugging Face
//! token file instead. [`render`] gives the text without touching the system
//! (`--print`), for either platform on any host.
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The launchd label of the agent (also the plist's file stem).
pub const LAUNCHD_LABEL: &str = "dev.grove.serve";
/// The systemd user unit's name.
pub const SYSTEMD_UNIT: &str = "grove.service";
/// The variables passed to the service when set in the installing shell.
pub const ENV_VARS: &[&str] = &[
    "GROVE_HOST",
    "GROVE_KEEP_ALIVE",
    "GROVE_MAX_LOADED",
    "GROVE_MAX_QUEUE",
    "GROVE_CONTEXT_LENGTH",
    "GROVE_LOAD_TIMEOUT",
    "GROVE_SHARDS",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_ENDPOINT",
];
/// Secrets never written into a service file, even when put in [`ServiceSpec::env`].
const NEVER_WRITTEN: &[&str] = &["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"];
/// Characters systemd does not accept in ExecStart's executable path.
const SYSTEMD_UNSAFE: &[char] = &['$', '"', '\'', '\\', '\u{7f}', '\t', '\n', '\r'];

/// What went wrong, naming the phase.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// `grove service` knows launchd (macOS) and systemd (Linux) only.
    #[error("grove service supports macOS (launchd) and Linux (systemd), not {0}")]
    Unsupported(String),
    /// `$HOME` is unset or empty.
    #[error("HOME is not set; it is needed for the service file's location")]
    NoHome,
    /// The running executable's path could not be found.
    #[error("cannot find the path of the grove executable: {0}")]
    CurrentExe(#[source] io::Error),
    /// A path or variable that cannot be written into the service file.
    #[error("{what} cannot be written into the service file: {reason}")]
    Invalid { what: String, reason: &'static str },
    /// `launchctl` or `systemctl` is not installed or not on `PATH`.
    #[error("{tool} was not found on PATH; it is needed to {purpose}")]
    ToolMissing {
        tool: &'static str,
        purpose: &'static str,
    },
    /// A file or directory could not be written or removed, or a tool run.
    #[error("cannot {action} {path:?}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A service manager command failed.
    #[error("{phase} failed: `{command}` exited with {status}: {message}")]
    Command {
        phase: &'static str,
        command: String,
        status: String,
        message: String,
    },
    /// Uninstall found neither a service file nor a loaded service.
    #[error("the grove service is not installed ({path:?} does not exist)")]
    NotInstalled { path: PathBuf },
}

/// The service manager a file is made for (`--platform macos|linux`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Platform {
    /// launchd (a LaunchAgent plist).
    #[value(name = "macos")]
    MacOs,
    /// systemd (a user unit).
    #[value(name = "linux")]
    Linux,
}

impl Platform {
    /// The platform this binary runs on.
    pub fn current() -> Result<Platform, ServiceError> {
        match std::env::consts::OS {
            "macos" => Ok(Platform::MacOs),
            "linux" => Ok(Platform::Linux),
            other => Err(ServiceError::Unsupported(other.to_string())),
        }
    }
}

/// Everything a service file is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    /// The absolute path of the `grove` binary; the service runs `PROGRAM serve`.
    pub program: PathBuf,
    /// Environment of the service, in file order.
    pub env: Vec<(String, String)>,
    /// The user's home directory: where the service file and logs go.
    pub home: PathBuf,
}

impl ServiceSpec {
    /// The running executable (canonical path), the [`ENV_VARS`] set in this
    /// process, and `$HOME`.
    pub fn from_current_process() -> Result<Self, ServiceError> {
        let exe = std::env::current_exe().and_then(|e| e.canonicalize());
        let program = exe.map_err(ServiceError::CurrentExe)?;
        let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
        let home = PathBuf::from(home.ok_or(ServiceError::NoHome)?);
        Self::from_parts(program, home, |name| std::env::var_os(name))
    }

    /// A spec from `program`, `home` and the [`ENV_VARS`] that `var` knows (an
    /// empty value counts as set). `HF_TOKEN` is never asked for.
    pub fn from_parts(
        program: PathBuf,
        home: PathBuf,
        var: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Self, ServiceError> {
        let mut env = Vec::new();
        for &name in ENV_VARS {
            if let Some(value) = var(name) {
                let value = value.into_string().map_err(|_| ServiceError::Invalid {
                    what: format!("environment variable {name}"),
                    reason: "its value is not valid UTF-8",
                })?;
                env.push((name.to_string(), value));
            }
        }
        let spec = ServiceSpec { program, env, home };
        spec.check(None)?;
        Ok(spec)
    }

    /// Checks that the spec can be written faithfully for `platform`: absolute
    /// UTF-8 paths, variable names that are identifiers, and no characters the
    /// file format cannot carry. [`install`] calls this.
    pub fn validate(&self, platform: Platform) -> Result<(), ServiceError> {
        self.check(Some(platform))
    }

    fn check(&self, platform: Option<Platform>) -> Result<(), ServiceError> {
        let linux_program = |p: &PathBuf| platform == Some(Platform::Linux) && p == &self.program;
        for (what, path) in [("the grove binary", &self.program), ("HOME", &self.home)] {
            let invalid = |reason| {
                let what = format!("{what} {path:?}");
                Err(ServiceError::Invalid { what, reason })
            };
            match path.to_str() {
                None => return invalid("it is not valid UTF-8"),
                Some(_) if !path.is_absolute() => return invalid("it is not absolute"),
                Some(s) if !s.chars().all(representable) => {
                    return invalid("it contains a control character");
                }
                // systemd refuses quotes, backslashes and control characters in
                // the executable's name, and uses it verbatim as the path but
                // with `$` expanded as argv[0]: no spelling of those fits.
                Some(s) if linux_program(path) && s.contains(SYSTEMD_UNSAFE) => {
                    return invalid("systemd cannot run a program whose path has $ \\ \" or '");
                }
                Some(_) => {}
            }
        }
        for (name, value) in &self.env {
            let invalid = |reason| {
                let what = format!("environment variable {name:?}");
                Err(ServiceError::Invalid { what, reason })
            };
            let ident = |(i, c): (usize, char)| {
                c == '_' || c.is_ascii_alphabetic() || i > 0 && c.is_ascii_digit()
            };
            if name.is_empty() || !name.chars().enumerate().all(ident) {
                return invalid("the name is not an identifier");
            }
            if !value.chars().all(representable) {
                return invalid("the value has a control character other than tab/newline");
            }
        }
        Ok(())
    }

    /// The environment that is written: [`ServiceSpec::env`] without secrets.
    fn written_env(&self) -> impl Iterator<Item = &(String, String)> {
        (self.env.iter()).filter(|(name, _)| !NEVER_WRITTEN.contains(&name.as_str()))
    }
}

/// Characters both formats carry: XML 1.0 characters (and so no NUL).
fn representable(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || !(c < ' ' || c == '\u{FFFE}' || c == '\u{FFFF}')
}

/// Where the service file is installed.
pub fn unit_path(platform: Platform, spec: &ServiceSpec) -> PathBuf {
    match platform {
        Platform::MacOs => spec
            .home
            .join("Library/LaunchAgents")
            .join(format!("{LAUNCHD_LABEL}.plist")),
        Platform::Linux => spec.home.join(".config/systemd/user").join(SYSTEMD_UNIT),
    }
}

/// The launchd agent's stdout and stderr files, in `~/Library/Logs/grove`.
pub fn log_paths(spec: &ServiceSpec) -> (PathBuf, PathBuf) {
    let dir = spec.home.join("Library/Logs/grove");
    (dir.join("serve.out.log"), dir.join("serve.err.log"))
}

/// The service file's text: the launchd plist or the systemd unit.
pub fn render(platform: Platform, spec: &ServiceSpec) -> String {
    match platform {
        Platform::MacOs => render_plist(spec),
        Platform::Linux => render_unit(spec),
    }
}

fn render_plist(spec: &ServiceSpec) -> String {
    let s = |v: &str| format!("<string>{}</string>", xml_escape(v));
    let (out, err) = log_paths(spec);
    let mut x = String::from(concat!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
        "<!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" ",
        "\"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n",
        "<!-- grove serve as a launchd agent, written by `grove service install`.\n",
        "     HF_TOKEN is deliberately not written here: the daemon reads the token file. -->\n",
        "<plist version=\"1.0\">\n<dict>\n",
    ));
    x += &format!("\t<key>Label</key>\n\t{}\n", s(LAUNCHD_LABEL));
    x += "\t<key>ProgramArguments</key>\n\t<array>\n";
    x += &format!(
        "\t\t{}\n\t\t{}\n\t</array>\n",
        s(&spec.program.to_string_lossy()),
        s("serve")
    );
    let env: Vec<_> = spec.written_env().collect();
    if !env.is_empty() {
        x += "\t<key>EnvironmentVariables</key>\n\t<dict>\n";
        for (name, value) in env {
            x += &format!("\t\t<key>{}</key>\n\t\t{}\n", xml_escape(name), s(value));
        }
        x += "\t</dict>\n";
    }
    x += "\t<key>RunAtLoad</key>\n\t<true/>\n\t<key>KeepAlive</key>\n\t<true/>\n";
    x += &format!(
        "\t<key>StandardOutPath</key>\n\t{}\n",
        s(&out.to_string_lossy())
    );
    x += &format!(
        "\t<key>StandardErrorPath</key>\n\t{}\n",
        s(&err.to_string_lossy())
    );
    x += "</dict>\n</plist>\n";
    x
}

/// Escapes text for XML character data and attribute values. A carriage return
/// becomes `&#13;` (a raw one would be read back as a newline); characters XML
/// cannot carry at all (rejected by [`ServiceSpec::validate`]) become U+FFFD.
fn xml_escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\r' => out.push_str("&#13;"),
            c if !representable(c) => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

fn render_unit(spec: &ServiceSpec) -> String {
    let mut u = String::from(concat!(
        "# grove serve as a systemd user service, written by `grove service install`.\n",
        "# HF_TOKEN is deliberately not written here: the daemon reads the token file.\n",
        "[Unit]\n",
        "Description=Grove local LLM daemon (grove serve)\n",
        "After=network.target\n\n",
        "[Service]\n",
        "Type=simple\n",
    ));
    u += &format!(
        "ExecStart={} serve\n",
        systemd_quote(&spec.program.to_string_lossy(), true)
    );
    for (name, value) in spec.written_env() {
        u += &format!(
            "Environment={}\n",
            systemd_quote(&format!("{name}={value}"), false)
        );
    }
    u += "Restart=on-failure\nRestartSec=2\n\n[Install]\nWantedBy=default.target\n";
    u
}

/// One double-quoted word of a unit file: C escapes for `\`, `"` and control
/// characters, `%%` for `%` (specifiers). In command lines (`exec`) `$` is
/// doubled, since ExecStart= expands `$VAR`; Environment= does not expand
/// variables and takes `$` literally (systemd.exec(5)), so there it stays.
fn systemd_quote(v: &str, exec: bool) -> String {
    let mut out = String::with_capacity(v.len() + 2);
    out.push('"');
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' if exec => out.push_str("$$"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c < ' ' || c == '\u{7f}' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Writes the service file and loads (launchd) or enables and starts (systemd)
/// it; an existing installation is replaced and restarted. Returns the file's path.
pub fn install(platform: Platform, spec: &ServiceSpec) -> Result<PathBuf, ServiceError> {
    spec.validate(platform)?;
    let path = unit_path(platform, spec);
    let contents = render(platform, spec);
    match platform {
        Platform::MacOs => {
            let ctl = Tool::new("launchctl", "load the launchd agent")?;
            let (domain, target) = launchd_targets();
            if let Some(dir) = log_paths(spec).0.parent() {
                create_dir(dir)?;
            }
            if ctl.run(&["print", &target])?.ok {
                ctl.check("unloading the previous agent", &["bootout", &target])?;
            }
            write_file(&path, &contents)?;
            ctl.check(
                "loading the agent",
                &["bootstrap", &domain, &path.to_string_lossy()],
            )?;
        }
        Platform::Linux => {
            let ctl = Tool::new("systemctl", "enable the systemd user service")?;
            let was_active = ctl.run(&["is-active", "--quiet", SYSTEMD_UNIT])?.ok;
            write_file(&path, &contents)?;
            ctl.check("reloading systemd", &["daemon-reload"])?;
            ctl.check("enabling the service", &["enable", "--now", SYSTEMD_UNIT])?;
            if was_active {
                ctl.check("restarting the service", &["restart", SYSTEMD_UNIT])?;
            }
        }
    }
    Ok(path)
}

/// Stops and unloads (launchd) or disables (systemd) the service and removes its
/// file; [`ServiceError::NotInstalled`] when there was nothing to remove.
pub fn uninstall(platform: Platform, spec: &ServiceSpec) -> Result<(), ServiceError> {
    let path = unit_path(platform, spec);
    let exists = path.exists();
    match platform {
        Platform::MacOs => {
            let ctl = Tool::new("launchctl", "unload the launchd agent")?;
            let (_, target) = launchd_targets();
            let loaded = ctl.run(&["print", &target])?.ok;
            if !exists && !loaded {
                return Err(ServiceError::NotInstalled { path });
            }
            if loaded {
                ctl.check("unloading the agent", &["bootout", &target])?;
            }
            remove_file(&path)?;
        }
        Platform::Linux => {
            let ctl = Tool::new("systemctl", "disable the systemd user service")?;
            if !exists {
                return Err(ServiceError::NotInstalled { path });
            }
            ctl.check("disabling the service", &["disable", "--now", SYSTEMD_UNIT])?;
            remove_file(&path)?;
            ctl.check("reloading systemd", &["daemon-reload"])?;
        }
    }
    Ok(())
}

/// A few lines: whether the file is installed, what the service manager says
/// (`launchctl print`: state, pid, last exit code; `systemctl --user
/// is-enabled`/`is-active`), and where the logs are. A missing tool is
/// reported in the text, not as an error.
pub fn status(platform: Platform, spec: &ServiceSpec) -> Result<String, ServiceError> {
    let path = unit_path(platform, spec);
    let installed = ["not installed", "installed"][usize::from(path.exists())];
    let mut out = format!("file: {} ({installed})\n", path.display());
    match platform {
        Platform::MacOs => {
            let (_, target) = launchd_targets();
            let state = match Tool::new("launchctl", "query launchd") {
                Err(e) => format!("unavailable ({e})"),
                Ok(ctl) => {
                    let r = ctl.run(&["print", &target])?;
                    let keys = ["state =", "pid =", "last exit code ="];
                    let lines: Vec<&str> = (r.stdout.lines().map(str::trim))
                        .filter(|l| keys.iter().any(|k| l.starts_with(k)))
                        .collect();
                    match (r.ok, lines.is_empty()) {
                        (false, _) => format!("not loaded ({})", r.message()),
                        (true, true) => "loaded".to_string(),
                        (true, false) => lines.join(", "),
                    }
                }
            };
            let (o, e) = log_paths(spec);
            out += &format!("launchctl print {target}: {state}\n");
            out += &format!("logs: {} {}\n", o.display(), e.display());
        }
        Platform::Linux => {
            match Tool::new("systemctl", "query systemd") {
                Err(e) => out += &format!("systemctl --user: unavailable ({e})\n"),
                Ok(ctl) => {
                    for verb in ["is-enabled", "is-active"] {
                        let said = ctl.run(&[verb, SYSTEMD_UNIT])?.message();
                        out += &format!("systemctl --user {verb} {SYSTEMD_UNIT}: {said}\n");
                    }
                }
            }
            out += &format!("logs: journalctl --user -u {SYSTEMD_UNIT}\n");
        }
    }
    Ok(out)
}

/// `gui/$UID` and `gui/$UID/dev.grove.serve`.
fn launchd_targets() -> (String, String) {
    unsafe extern "C" {
        /// getuid(2) always succeeds; uid_t is 32 bits on macOS and Linux.
        safe fn getuid() -> u32;
    }
    let domain = format!("gui/{}", getuid());
    let target = format!("{domain}/{LAUNCHD_LABEL}");
    (domain, target)
}

/// A service manager command line tool, with the arguments every call gets.
struct Tool {
    path: PathBuf,
    /// `--user` for systemctl.
    prefix: Option<&'static str>,
}

/// A finished service manager command.
struct Outcome {
    ok: bool,
    command: String,
    status: String,
    stdout: String,
    stderr: String,
}

impl Tool {
    /// `launchctl`, or `systemctl --user`.
    fn new(name: &'static str, purpose: &'static str) -> Result<Tool, ServiceError> {
        let prefix = (name == "systemctl").then_some("--user");
        let path = find_tool(name, purpose)?;
        Ok(Tool { path, prefix })
    }

    fn run(&self, args: &[&str]) -> Result<Outcome, ServiceError> {
        let args: Vec<&str> = self.prefix.iter().chain(args).copied().collect();
        let name = self.path.file_name().unwrap_or_default().to_string_lossy();
        let command = format!("{name} {}", args.join(" "));
        let output = (Command::new(&self.path)
            .args(&args)
            .stdin(Stdio::null())
            .output())
        .map_err(|source| ServiceError::Io {
            action: "run",
            path: self.path.clone(),
            source,
        })?;
        Ok(Outcome {
            ok: output.status.success(),
            command,
            status: output.status.to_string(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    /// Runs `args`; a failure is a [`ServiceError::Command`] naming `phase`.
    fn check(&self, phase: &'static str, args: &[&str]) -> Result<(), ServiceError> {
        let r = self.run(args)?;
        if r.ok {
            return Ok(());
        }
        let message = r.message();
        Err(ServiceError::Command {
            phase,
            command: r.command,
            status: r.status,
            message,
        })
    }
}

impl Outcome {
    /// What the command said: its stdout, else its stderr, else its status.
    fn message(&self) -> String {
        [self.stdout.trim(), self.stderr.trim()]
            .into_iter()
            .find(|s| !s.is_empty())
            .map_or_else(
                || self.status.clone(),
                |s| s.lines().collect::<Vec<_>>().join("; "),
            )
    }
}

/// `name` on `PATH`, else in the standard system directories.
fn find_tool(name: &'static str, purpose: &'static str) -> Result<PathBuf, ServiceError> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let fallback = ["/bin", "/usr/bin", "/sbin", "/usr/sbin"].map(PathBuf::from);
    let executable = |p: &PathBuf| {
        fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    (std::env::split_paths(&path).chain(fallback))
        .map(|dir| dir.join(name))
        .find(executable)
        .ok_or(ServiceError::ToolMissing {
            tool: name,
            purpose,
        })
}

fn create_dir(dir: &Path) -> Result<(), ServiceError> {
    let path = dir.to_path_buf();
    fs::create_dir_all(dir).map_err(|source| ServiceError::Io {
        action: "create",
        path,
        source,
    })
}

/// Writes `contents` to `path` through a temporary file and a rename, so a
/// reader never sees half a file.
fn write_file(path: &Path, contents: &str) -> Result<(), ServiceError> {
    if let Some(dir) = path.parent() {
        create_dir(dir)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, contents)
        .and_then(|()| fs::rename(&tmp, path))
        .map_err(|source| {
            let _ = fs::remove_file(&tmp);
            ServiceError::Io {
                action: "write",
                path: path.to_path_buf(),
                source,
            }
        })
}

fn remove_file(path: &Path) -> Result<(), ServiceError> {
    match fs::remove_file(path) {
        Err(source) if source.kind() != io::ErrorKind::NotFound => Err(ServiceError::Io {
            action: "remove",
            path: path.to_path_buf(),
            source,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ServiceSpec {
        let env = vec![("GROVE_HOST".into(), "127.0.0.1:11500".into())];
        ServiceSpec {
            program: "/opt/grove/bin/grove".into(),
            env,
            home: "/home/u".into(),
        }
    }

    #[test]
    fn paths() {
        let s = spec();
        let plist = "/home/u/Library/LaunchAgents/dev.grove.serve.plist";
        assert_eq!(unit_path(Platform::MacOs, &s), Path::new(plist));
        let unit = "/home/u/.config/systemd/user/grove.service";
        assert_eq!(unit_path(Platform::Linux, &s), Path::new(unit));
        let err = "/home/u/Library/Logs/grove/serve.err.log";
        assert_eq!(log_paths(&s).1, Path::new(err));
    }

    #[test]
    fn escaping() {
        assert_eq!(systemd_quote(r#"a"b\c%d$e"#, false), r#""a\"b\\c%%d$e""#);
        assert_eq!(systemd_quote("$x 100%", true), r#""$$x 100%%""#);
        assert_eq!(systemd_quote("l1\nl2\t\u{1}", false), r#""l1\nl2\t\x01""#);
        assert_eq!(xml_escape(r#"<&>"'"#), "&lt;&amp;&gt;&quot;&apos;");
        assert_eq!(xml_escape("a\rb\u{0}"), "a&#13;b\u{FFFD}");
    }

    #[test]
    fn hf_token_is_never_written() {
        let mut s = spec();
        s.env.push(("HF_TOKEN".into(), "hf_secret".into()));
        for p in [Platform::MacOs, Platform::Linux] {
            let text = render(p, &s);
            assert!(
                !text.contains("hf_secret") && text.contains("127.0.0.1:11500"),
                "{text}"
            );
        }
        let all = |n: &str| Some(OsString::from(format!("v-{n}")));
        let from = ServiceSpec::from_parts("/g".into(), "/h".into(), all).expect("valid");
        assert_eq!(
            from.env.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ENV_VARS
        );
    }

    #[test]
    fn validation() {
        let invalid =
            |s: &ServiceSpec, p| matches!(s.validate(p), Err(ServiceError::Invalid { .. }));
        let mut s = spec();
        s.env.push(("BAD NAME".into(), "x".into()));
        assert!(invalid(&s, Platform::Linux));
        let mut s = spec();
        s.env[0].1 = "nul\u{0}".into();
        assert!(invalid(&s, Platform::MacOs));
        let mut s = spec();
        s.program = "relative/grove".into();
        assert!(invalid(&s, Platform::MacOs));
        for bad in [
            "/opt/$x/grove",
            "/opt/'q'/grove",
            "/opt/\"q\"/grove",
            "/opt/a\\b/grove",
        ] {
            s.program = bad.into();
            assert!(s.validate(Platform::MacOs).is_ok() && invalid(&s, Platform::Linux));
        }
        let mut s = spec();
        s.home = "/home/\"q\" $x".into();
        assert!(s.validate(Platform::Linux).is_ok());
    }

    #[test]
    fn missing_tool_is_a_clear_error() {
        let e = find_tool("grove-no-such-tool", "test").expect_err("absent");
        assert!(
            e.to_string()
                .contains("grove-no-such-tool was not found on PATH"),
            "{e}"
        );
    }
}
