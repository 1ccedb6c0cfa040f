//! A progress display for `grove pull`, fed with [`Progress`] events: one bar
//! (bytes, rate, ETA) redrawn in place on a terminal, or plain lines (one per
//! file, and a status line every few seconds) when the output is a pipe or a
//! log.
use std::collections::HashMap;
use std::collections::VecDeque;
use std::io::Write;
use std::time::{Duration, Instant};

use super::pull::Progress;

/// The rate is averaged over this window.
const RATE_WINDOW: Duration = Duration::from_secs(5);
/// A terminal bar is redrawn at most this often.
const REDRAW: Duration = Duration::from_millis(100);
/// Plain output prints a status line this often.
const PLAIN_EVERY: Duration = Duration::from_secs(5);
const BAR_WIDTH: usize = 24;

/// Renders [`Progress`] events to a writer.
#[derive(Debug)]
pub struct ProgressBar<W: Write> {
    out: W,
    tty: bool,
    name: String,
    total: u64,
    cached: u64,
    /// Per file: bytes on disk, and whether it counted as cached.
    files: HashMap<String, (u64, bool)>,
    /// Bytes taken from the network so far.
    net: u64,
    samples: VecDeque<(Instant, u64)>,
    last_draw: Option<Instant>,
    drawn: bool,
    /// The totals are known (the bar waits for them).
    resolved: bool,
}

impl ProgressBar<std::io::Stderr> {
    /// A display on stderr; a bar if stderr is a terminal, else plain lines.
    pub fn stderr() -> Self {
        use std::io::IsTerminal;
        let err = std::io::stderr();
        let tty = err.is_terminal();
        ProgressBar::new(err, tty)
    }
}

impl<W: Write> ProgressBar<W> {
    /// A display on `out`, as a redrawn bar if `tty`.
    pub fn new(out: W, tty: bool) -> Self {
        ProgressBar {
            out,
            tty,
            name: String::new(),
            total: 0,
            cached: 0,
            files: HashMap::new(),
            net: 0,
            samples: VecDeque::new(),
            last_draw: None,
            drawn: false,
            resolved: false,
        }
    }

    /// The writer back (for tests).
    pub fn into_inner(self) -> W {
        self.out
    }

    /// Handles one event now.
    pub fn update(&mut self, p: &Progress) {
        self.update_at(p, Instant::now());
    }

    /// Handles one event at `now` (write errors are ignored: progress is
    /// never worth failing a pull over).
    pub fn update_at(&mut self, p: &Progress, now: Instant) {
        let _ = self.handle(p, now);
    }

    fn handle(&mut self, p: &Progress, now: Instant) -> std::io::Result<()> {
        match p {
            Progress::Resolved {
                name,
                commit,
                files,
                total_bytes,
                cached_bytes,
            } => {
                self.name = name.clone();
                self.resolved = true;
                self.total = *total_bytes;
                self.cached = *cached_bytes;
                self.samples.push_back((now, self.net));
                let short = commit.get(..12).unwrap_or(commit);
                let cached = if *cached_bytes > 0 {
                    format!(", {} already here", bytes(*cached_bytes))
                } else {
                    String::new()
                };
                self.line(&format!(
                    "pulling {name} (commit {short}): {files} files, {}{cached}",
                    bytes(*total_bytes)
                ))?;
            }
            Progress::FileWaiting { file } => {
                self.line(&format!(
                    "  {file}: waiting for another pull of the same file"
                ))?;
            }
            Progress::FileStart {
                file,
                size,
                resumed_from,
            } => {
                self.files.insert(file.clone(), (*resumed_from, false));
                if *resumed_from > 0 {
                    self.line(&format!(
                        "  {file}: resuming at {} of {}",
                        bytes(*resumed_from),
                        bytes(*size)
                    ))?;
                }
            }
            Progress::FileBytes { file, done, .. } => {
                self.advance(file, *done);
                self.tick(now, false)?;
            }
            Progress::FileVerifying { .. } => {}
            Progress::FileDone {
                file, size, cached, ..
            } => {
                if *cached {
                    self.files.insert(file.clone(), (*size, true));
                } else {
                    self.advance(file, *size);
                }
                let how = if *cached { "already here" } else { "verified" };
                if self.tty {
                    self.line(&format!("  {file}  {}  {how}", bytes(*size)))?;
                    self.tick(now, true)?;
                } else {
                    let status = self.status(now);
                    self.line(&format!("  {file}  {}  {how}  [{status}]", bytes(*size)))?;
                }
            }
            Progress::Done {
                commit,
                path,
                downloaded_bytes,
                elapsed,
                ..
            } => {
                let secs = elapsed.as_secs_f64().max(1e-3);
                let short = commit.get(..12).unwrap_or(commit);
                self.line(&format!(
                    "done: {} at {short} in {:.1}s, {} downloaded ({}/s)\n  {}",
                    self.name,
                    secs,
                    bytes(*downloaded_bytes),
                    bytes((*downloaded_bytes as f64 / secs) as u64),
                    path.display()
                ))?;
            }
        }
        self.out.flush()
    }

    fn advance(&mut self, file: &str, done: u64) {
        let entry = self.files.entry(file.to_string()).or_insert((0, false));
        self.net += done.saturating_sub(entry.0);
        entry.0 = done;
    }

    /// Bytes on disk: cached files plus what downloads have written.
    fn on_disk(&self) -> u64 {
        let written: u64 = self
            .files
            .values()
            .filter(|(_, c)| !c)
            .map(|(d, _)| d)
            .sum();
        (self.cached + written).min(self.total.max(self.cached + written))
    }

    /// Bytes per second over the last few seconds.
    fn rate(&mut self, now: Instant) -> f64 {
        self.samples.push_back((now, self.net));
        while self.samples.len() > 2
            && self
                .samples
                .front()
                .is_some_and(|(t, _)| now - *t > RATE_WINDOW)
        {
            self.samples.pop_front();
        }
        match (self.samples.front(), self.samples.back()) {
            (Some((t0, b0)), Some((t1, b1))) if *t1 > *t0 => {
                (b1 - b0) as f64 / (*t1 - *t0).as_secs_f64()
            }
            _ => 0.0,
        }
    }

    fn status(&mut self, now: Instant) -> String {
        let done = self.on_disk();
        let rate = self.rate(now);
        let pct = if self.total > 0 {
            done as f64 / self.total as f64
        } else {
            1.0
        };
        let left = self.total.saturating_sub(done);
        let eta = if left == 0 {
            "ETA 0s".to_string()
        } else if rate > 0.0 {
            format!("ETA {}", duration(left as f64 / rate))
        } else {
            "ETA --".to_string()
        };
        format!(
            "{:>3.0}% {}/{} {}/s {eta}",
            pct * 100.0,
            bytes(done),
            bytes(self.total),
            bytes(rate as u64)
        )
    }

    /// Redraws the bar (terminal) or prints a status line (plain, every few seconds).
    fn tick(&mut self, now: Instant, force: bool) -> std::io::Result<()> {
        if !self.resolved {
            return Ok(());
        }
        let every = if self.tty { REDRAW } else { PLAIN_EVERY };
        if !force && self.last_draw.is_some_and(|t| now - t < every) {
            return Ok(());
        }
        self.last_draw = Some(now);
        let status = self.status(now);
        if self.tty {
            let frac = if self.total > 0 {
                self.on_disk() as f64 / self.total as f64
            } else {
                1.0
            };
            let fill = ((frac * BAR_WIDTH as f64) as usize).min(BAR_WIDTH);
            let bar = format!("{}{}", "#".repeat(fill), "-".repeat(BAR_WIDTH - fill));
            write!(self.out, "\r\x1b[2K{} [{bar}] {status}", self.name)?;
            self.drawn = true;
        } else {
            writeln!(self.out, "  {status}")?;
        }
        Ok(())
    }

    /// Prints a line above the bar.
    fn line(&mut self, s: &str) -> std::io::Result<()> {
        if self.tty && self.drawn {
            write!(self.out, "\r\x1b[2K")?;
            self.drawn = false;
        }
        writeln!(self.out, "{s}")
    }
}

/// `1.2 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `42s`, `3m05s`, `2h10m`.
fn duration(secs: f64) -> String {
    let s = secs.ceil().max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn events() -> Vec<(u64, Progress)> {
        let f = |s: &str| s.to_string();
        vec![
            (
                0,
                Progress::Resolved {
                    name: f("org/m"),
                    commit: "ab".repeat(20),
                    files: 2,
                    total_bytes: 3 << 20,
                    cached_bytes: 1 << 20,
                },
            ),
            (
                0,
                Progress::FileDone {
                    file: f("config.json"),
                    size: 1 << 20,
                    downloaded: 0,
                    cached: true,
                },
            ),
            (
                0,
                Progress::FileStart {
                    file: f("model.safetensors"),
                    size: 2 << 20,
                    resumed_from: 0,
                },
            ),
            (
                1000,
                Progress::FileBytes {
                    file: f("model.safetensors"),
                    done: 1 << 20,
                    size: 2 << 20,
                },
            ),
            (
                6000,
                Progress::FileBytes {
                    file: f("model.safetensors"),
                    done: 3 << 19,
                    size: 2 << 20,
                },
            ),
            (
                7000,
                Progress::FileDone {
                    file: f("model.safetensors"),
                    size: 2 << 20,
                    downloaded: 2 << 20,
                    cached: false,
                },
            ),
            (
                7000,
                Progress::Done {
                    commit: "ab".repeat(20),
                    path: PathBuf::from("/c/snap"),
                    downloaded_bytes: 2 << 20,
                    total_bytes: 3 << 20,
                    elapsed: Duration::from_secs(7),
                },
            ),
        ]
    }

    fn render(tty: bool) -> String {
        let t0 = Instant::now();
        let mut bar = ProgressBar::new(Vec::new(), tty);
        for (ms, e) in events() {
            bar.update_at(&e, t0 + Duration::from_millis(ms));
        }
        String::from_utf8(bar.into_inner()).unwrap()
    }

    #[test]
    fn plain_output_has_bytes_rate_and_eta() {
        let out = render(false);
        assert!(
            out.contains(
                "pulling org/m (commit abababababab): 2 files, 3.0 MiB, 1.0 MiB already here"
            ),
            "{out}"
        );
        assert!(out.contains(" 83% 2.5 MiB/3.0 MiB"), "{out}");
        assert!(out.contains("ETA 1s"), "{out}");
        assert!(
            out.contains("model.safetensors  2.0 MiB  verified"),
            "{out}"
        );
        assert!(!out.contains('\x1b'), "{out}");
    }

    #[test]
    fn terminal_output_redraws_a_bar() {
        let out = render(true);
        assert!(
            out.contains("\r\x1b[2Korg/m [################--------]"),
            "{out:?}"
        );
        assert!(
            out.contains("done: org/m at abababababab in 7.0s"),
            "{out:?}"
        );
    }

    #[test]
    fn units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(duration(125.0), "2m05s");
        assert_eq!(duration(7300.0), "2h01m");
    }
}
