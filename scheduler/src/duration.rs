//! `keep_alive` as ollama users write it: `5m`, `1h30m`, `10s`, `500ms`, a
//! plain number of seconds, `0` (unload at once) or a negative value (forever).
use std::time::Duration;

/// How long a model stays loaded after its last request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// Unload when the last request ends.
    Unload,
    /// Unload after this long idle.
    For(Duration),
    /// Never unload for idleness.
    Forever,
}

impl KeepAlive {
    /// From signed nanoseconds, as the API carries it.
    pub fn from_nanos(ns: i64) -> Self {
        match ns {
            0 => Self::Unload,
            n if n < 0 => Self::Forever,
            n => Self::For(Duration::from_nanos(n as u64)),
        }
    }

    /// Parses `5m`, `1h30m`, `90`, `-1`, `0`, `250ms`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        if t.is_empty() {
            return Err("keep_alive is empty".into());
        }
        if let Some(rest) = t.strip_prefix('-') {
            // Any negative duration means forever, as in ollama.
            parse_duration(rest).map_err(|e| format!("keep_alive {text:?}: {e}"))?;
            return Ok(Self::Forever);
        }
        let d = parse_duration(t).map_err(|e| format!("keep_alive {text:?}: {e}"))?;
        Ok(if d.is_zero() {
            Self::Unload
        } else {
            Self::For(d)
        })
    }
}

/// `90` (seconds), `1.5` (seconds), `10s`, `5m`, `1h30m`, `250ms`.
fn parse_duration(t: &str) -> Result<Duration, String> {
    if t.is_empty() {
        return Err("no duration given".into());
    }
    if let Ok(secs) = t.parse::<f64>() {
        if !secs.is_finite() || secs < 0.0 {
            return Err("not a valid number of seconds".into());
        }
        return Ok(Duration::from_secs_f64(secs));
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("expected a number at {rest:?}"));
        }
        let value: f64 = rest[..digits]
            .parse()
            .map_err(|_| format!("bad number {:?}", &rest[..digits]))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err("a unit (ms, s, m, h) must follow each number".into()),
            other => return Err(format!("unknown unit {other:?} (use ms, s, m or h)")),
        };
        rest = &rest[unit_len..];
        total += value * scale;
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_ollama() {
        assert_eq!(
            KeepAlive::parse("5m").unwrap(),
            KeepAlive::For(Duration::from_secs(300))
        );
        assert_eq!(
            KeepAlive::parse("1h30m").unwrap(),
            KeepAlive::For(Duration::from_secs(5400))
        );
        assert_eq!(
            KeepAlive::parse("90").unwrap(),
            KeepAlive::For(Duration::from_secs(90))
        );
        assert_eq!(
            KeepAlive::parse("250ms").unwrap(),
            KeepAlive::For(Duration::from_millis(250))
        );
        assert_eq!(KeepAlive::parse("0").unwrap(), KeepAlive::Unload);
        assert_eq!(KeepAlive::parse("0s").unwrap(), KeepAlive::Unload);
        assert_eq!(KeepAlive::parse("-1").unwrap(), KeepAlive::Forever);
        assert_eq!(KeepAlive::parse("-5m").unwrap(), KeepAlive::Forever);
        for bad in ["", "5x", "m", "five", "-", "1h30"] {
            assert!(KeepAlive::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(KeepAlive::from_nanos(-1), KeepAlive::Forever);
        assert_eq!(KeepAlive::from_nanos(0), KeepAlive::Unload);
    }
}
