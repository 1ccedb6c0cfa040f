//! Stop strings over streamed text.
//!
//! [`StopMatcher`] is fed the text pieces of a generation (e.g. from the
//! [`Detokenizer`](crate::detokenize::Detokenizer)) and returns the text that is
//! safe to emit now. It holds back any suffix that could still grow into a stop
//! string, so a stop string spread over several pieces is never half emitted.
//! When a stop string completes, the text before it is returned with the stop
//! reported; neither the stop string nor anything after it is ever emitted.
//!
//! The result does not depend on how the text is split into pieces: the output
//! is the whole text up to the earliest occurrence of any stop string (the one
//! that starts first; among those starting at the same place, the shortest is
//! reported). A stop string that completes while a longer one that starts
//! earlier could still complete is held until that is decided.
use crate::error::{Result, RunnerError};

/// What [`StopMatcher::push`] and [`StopMatcher::finish`] return.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopOutput {
    /// Text safe to emit now: never part of a stop string or after one.
    pub text: String,
    /// The index (in the list given to [`StopMatcher::new`]) of the stop
    /// string that just ended the stream, if one did.
    pub stop: Option<usize>,
}

/// Finds stop strings in streamed text; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// The longest stop string's length in bytes.
    max_len: usize,
    /// Text received but not emitted: a possible start of a stop string.
    held: String,
    /// The stop string that ended the stream.
    stopped: Option<usize>,
}

impl StopMatcher {
    /// A matcher for `stops`; no stop strings means text passes straight
    /// through. An empty stop string is a [`RunnerError::Request`].
    pub fn new<I, S>(stops: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let stops: Vec<String> = stops.into_iter().map(Into::into).collect();
        if let Some(i) = stops.iter().position(String::is_empty) {
            return Err(RunnerError::Request(format!(
                "stop string {i} is empty; stop strings must not be empty"
            )));
        }
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        Ok(Self {
            stops,
            max_len,
            held: String::new(),
            stopped: None,
        })
    }

    /// The stop strings, in the order given.
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// The index of the stop string that ended the stream, once one has.
    pub fn stopped(&self) -> Option<usize> {
        self.stopped
    }

    /// Feeds the next piece of text. After a stop, everything is ignored.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if self.stopped.is_some() {
            return StopOutput::default();
        }
        self.held.push_str(piece);
        self.scan(false)
    }

    /// Ends the stream: returns the text still held back (up to a stop string
    /// that completed while a longer one was still possible).
    pub fn finish(&mut self) -> StopOutput {
        if self.stopped.is_some() {
            return StopOutput::default();
        }
        self.scan(true)
    }

    /// The earliest complete stop string in `held`: (start, stop index).
    fn earliest_match(&self) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize)> = None;
        for (i, stop) in self.stops.iter().enumerate() {
            if let Some(start) = self.held.find(stop.as_str()) {
                let better = best.is_none_or(|(s, j)| {
                    start < s || (start == s && stop.len() < self.stops[j].len())
                });
                if better {
                    best = Some((start, i));
                }
            }
        }
        best
    }

    /// The first position before `limit` from which the rest of `held` is a
    /// proper prefix of a stop string, i.e. a stop string could still follow.
    fn earliest_partial(&self, limit: usize) -> Option<usize> {
        let len = self.held.len();
        let from = len.saturating_sub(self.max_len.saturating_sub(1));
        self.held
            .char_indices()
            .map(|(i, _)| i)
            .skip_while(|&i| i < from)
            .take_while(|&i| i < limit)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops
                    .iter()
                    .any(|s| s.len() > tail.len() && s.starts_with(tail))
            })
    }

    fn scan(&mut self, at_end: bool) -> StopOutput {
        let found = self.earliest_match();
        let limit = found.map_or(self.held.len(), |(start, _)| start);
        let partial = if at_end {
            None
        } else {
            self.earliest_partial(limit)
        };
        match (found, partial) {
            (_, Some(keep_from)) => StopOutput {
                text: self.held.drain(..keep_from).collect(),
                stop: None,
            },
            (Some((start, i)), None) => {
                self.held.truncate(start);
                self.stopped = Some(i);
                StopOutput {
                    text: std::mem::take(&mut self.held),
                    stop: Some(i),
                }
            }
            (None, None) => StopOutput {
                text: std::mem::take(&mut self.held),
                stop: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces`, then finishes; returns the emitted pieces and the stop.
    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, Option<usize>) {
        let mut m = StopMatcher::new(stops.iter().copied()).expect("valid stops");
        let mut out = Vec::new();
        let mut stop = None;
        for piece in pieces {
            let o = m.push(piece);
            out.push(o.text);
            stop = stop.or(o.stop);
        }
        let o = m.finish();
        out.push(o.text);
        (out, stop.or(o.stop))
    }

    fn joined(stops: &[&str], pieces: &[&str]) -> (String, Option<usize>) {
        let (out, stop) = run(stops, pieces);
        (out.concat(), stop)
    }

    #[test]
    fn stop_spanning_three_pieces() {
        let (out, stop) = run(&["<|end|>"], &["Hello <|", "en", "d|> more"]);
        assert_eq!(out, ["Hello ", "", "", ""]);
        assert_eq!(stop, Some(0));
    }

    #[test]
    fn partial_prefix_is_flushed() {
        let (out, stop) = run(&["STOP"], &["a ST", "OX b", " ST"]);
        assert_eq!(out, ["a ", "STOX b", " ", "ST"]);
        assert_eq!(stop, None);
    }

    #[test]
    fn overlapping_stops() {
        assert_eq!(joined(&["ab", "bc"], &["xa", "bc"]), ("x".into(), Some(0)));
        assert_eq!(joined(&["ab", "bc"], &["xb", "c"]), ("x".into(), Some(1)));
        assert_eq!(joined(&["bc", "ab"], &["xabc"]), ("x".into(), Some(1)));
    }

    #[test]
    fn stop_at_the_very_start() {
        let (out, stop) = run(&["Hi"], &["Hi", " there"]);
        assert_eq!(out, ["", "", ""]);
        assert_eq!(stop, Some(0));
    }

    #[test]
    fn multiple_stops_earliest_wins() {
        let stops = ["\n\n", "User:", "###"];
        assert_eq!(
            joined(&stops, &["one ### two User:"]),
            ("one ".into(), Some(2))
        );
        assert_eq!(joined(&stops, &["x", "\n", "\n###"]), ("x".into(), Some(0)));
        assert_eq!(
            joined(&stops, &["no stop here"]),
            ("no stop here".into(), None)
        );
    }

    #[test]
    fn longer_stop_starting_earlier_wins() {
        // "ab" completes first, but "xabc" starts earlier and may still complete.
        let stops = ["ab", "xabc"];
        assert_eq!(
            joined(&stops, &["1x", "a", "b", "c2"]),
            ("1".into(), Some(1))
        );
        assert_eq!(
            joined(&stops, &["1x", "a", "b", "d"]),
            ("1x".into(), Some(0))
        );
        assert_eq!(joined(&stops, &["1x", "a", "b"]), ("1x".into(), Some(0)));
        // Same start: the shorter one is reported.
        assert_eq!(joined(&["abc", "ab"], &["zabc"]), ("z".into(), Some(1)));
    }

    #[test]
    fn emoji_in_stops() {
        let (out, stop) = run(&["🛑end"], &["go 🛑", "e", "nd!"]);
        assert_eq!(out, ["go ", "", "", ""]);
        assert_eq!(stop, Some(0));
        // A held emoji that does not start a stop comes out whole.
        let (out, stop) = run(&["🛑x", "é"], &["a🛑", "y", "e\u{301}"]);
        assert_eq!(out.concat(), "a🛑ye\u{301}");
        assert_eq!(stop, None);
        assert_eq!(
            joined(&["é"], &["caf", "é au lait"]),
            ("caf".into(), Some(0))
        );
    }

    #[test]
    fn empty_stop_is_rejected() {
        let err = StopMatcher::new(["ok", ""]).expect_err("empty stop");
        assert!(matches!(err, RunnerError::Request(_)), "{err}");
    }

    #[test]
    fn no_stops_pass_through() {
        assert_eq!(run(&[], &["a", "b"]).0, ["a", "b", ""]);
    }

    #[test]
    fn nothing_after_a_stop() {
        let mut m = StopMatcher::new(["!"]).expect("valid stops");
        assert_eq!(m.push("a!b").text, "a");
        assert_eq!(m.stopped(), Some(0));
        assert_eq!(m.push("more"), StopOutput::default());
        assert_eq!(m.finish(), StopOutput::default());
    }

    /// The output does not depend on how the text is split into pieces, and
    /// equals the text up to the earliest stop.
    #[test]
    fn split_independent() {
        let texts = [
            "aabab🛑cabc",
            "xxabcab",
            "ab🛑🛑b",
            "ééé🛑a",
            "nothing",
            "cabcab",
        ];
        let stops = ["abc", "b🛑", "🛑🛑", "bca", "é🛑"];
        let mut seed = 0x2545_f491_u64;
        for text in texts {
            let expected = stops
                .iter()
                .filter_map(|s| text.find(s))
                .min()
                .map_or(text, |p| &text[..p]);
            let chars: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
            for _ in 0..200 {
                let mut pieces = Vec::new();
                let mut start = 0;
                for &i in &chars[1..] {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    if seed.is_multiple_of(3) {
                        pieces.push(&text[start..i]);
                        start = i;
                    }
                }
                pieces.push(&text[start..]);
                let (out, stop) = joined(&stops, &pieces);
                assert_eq!(out, expected, "{pieces:?}");
                assert_eq!(stop.is_some(), expected.len() < text.len(), "{pieces:?}");
            }
        }
    }
}
