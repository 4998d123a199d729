//! The command event-stream parser: bytes in, [`ServerStreamEvent`]s out. Pure, no I/O.
//!
//! # Framing rules (and where each comes from)
//!
//! - Upstream execd writes each event as compact JSON followed by `\n\n`, with **no** `data:`
//!   prefix (`writeSingleEvent` in execd's `sse.go`), although it declares `text/event-stream`.
//!   Standard SSE (`data: {...}\n\n`) is accepted as well: the SDK (`adapters/sse.py`) accepts
//!   both, and so must we.
//! - An event ends at a blank line (`\n\n`, `\r\n\r\n`, or a line of only spaces and tabs). A line
//!   that completes a JSON object ends the event at once, without waiting for the blank line, so
//!   a terminal event is seen as soon as its line is in.
//! - Lines starting with `:` are SSE comments and are ignored; so are the other SSE fields
//!   (`event:`, `id:`, `retry:`, and any other `name:` line outside a bare-JSON block).
//! - `data:` lines of one event are joined with `\n` (SSE rule); one leading space after the
//!   colon is dropped.
//! - Chunks may split anywhere, including inside a UTF-8 sequence or a `\r\n`.
//! - The stream is over at the first terminal event: `execution_complete`, or `error` whose
//!   `evalue` carries the exit code (`runCommand` in execd sends exactly one of them, last).
//!   Everything after it is ignored unparsed, because upstream keeps the response open about one
//!   second after the last event (`time.Sleep(ApiGracefulShutdownTimeout)` in `RunCommand`), and
//!   a proxy may append anything. A client returns at the terminal event, not at EOF.
//! - A stream that ends before a terminal event is an error ([`StreamError::MissingTerminal`]):
//!   the command's result is unknown.
//! - An event that is not valid JSON with a `type` is an error ([`StreamError::Malformed`])
//!   before the terminal event. The SDK logs and skips such events; we prefer to fail loudly,
//!   because neither upstream nor our server ever sends one.

use crate::types::ServerStreamEvent;

/// Largest single event accepted by default (64 MiB).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 64 * 1024 * 1024;

/// Why a command event stream could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The body ended before `execution_complete` or `error`.
    #[error(
        "the command event stream ended without a terminal event (execution_complete or error) \
         after {events} event(s); the command's result is unknown"
    )]
    MissingTerminal {
        /// Events read before the end.
        events: usize,
    },
    /// An event was not a JSON object with a `type`.
    #[error("malformed event in the command event stream: {reason}; it starts with {snippet:?}")]
    Malformed {
        /// The JSON error.
        reason: String,
        /// The first bytes of the event, lossily decoded.
        snippet: String,
    },
    /// One event was larger than the limit.
    #[error("an event in the command event stream is larger than {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
}

/// Incremental parser for the body of `POST /command`.
///
/// Feed it chunks with [`push`](Self::push) as they arrive and call [`finish`](Self::finish) at
/// end of body. After the terminal event [`is_done`](Self::is_done) is true and further input is
/// ignored.
///
/// ```
/// use sessionbox_execd::{EventStreamParser, EventType};
/// let mut p = EventStreamParser::new();
/// let mut events = p.push(b"{\"type\":\"stdout\",\"text\":\"hi\\n\"}\n\n{\"type\":\"exec").unwrap();
/// events.extend(p.push(b"ution_complete\",\"execution_time\":3}\n\ngarbage").unwrap());
/// assert_eq!(events.len(), 2);
/// assert_eq!(events[1].kind, EventType::ExecutionComplete);
/// assert!(p.is_done());
/// ```
#[derive(Debug, Clone)]
pub struct EventStreamParser {
    /// The current, not yet terminated line.
    line: Vec<u8>,
    /// Data of the current event.
    data: Vec<u8>,
    /// The current event is bare JSON (every line is data), not SSE fields.
    raw: bool,
    /// The current event has at least one data line.
    has_data: bool,
    /// No line has been completed yet (a UTF-8 BOM may lead the first one).
    first_line: bool,
    done: bool,
    events: usize,
    max_event_bytes: usize,
}

impl Default for EventStreamParser {
    fn default() -> Self {
        Self::new()
    }
}

impl EventStreamParser {
    /// A parser with [`DEFAULT_MAX_EVENT_BYTES`].
    pub fn new() -> Self {
        Self::with_max_event_bytes(DEFAULT_MAX_EVENT_BYTES)
    }

    /// A parser that rejects events larger than `max` bytes.
    pub fn with_max_event_bytes(max: usize) -> Self {
        EventStreamParser {
            line: Vec::new(),
            data: Vec::new(),
            raw: false,
            has_data: false,
            first_line: true,
            done: false,
            events: 0,
            max_event_bytes: max,
        }
    }

    /// True once the terminal event has been returned.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Events returned so far.
    pub fn events_seen(&self) -> usize {
        self.events
    }

    /// Feeds one chunk and returns the events it completes (the terminal one last, if present).
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<ServerStreamEvent>, StreamError> {
        let mut out = Vec::new();
        let mut rest = chunk;
        while !self.done {
            let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
                self.line.extend_from_slice(rest);
                if self.line.len() + self.data.len() > self.max_event_bytes {
                    return Err(StreamError::TooLarge {
                        limit: self.max_event_bytes,
                    });
                }
                break;
            };
            self.line.extend_from_slice(&rest[..nl]);
            rest = &rest[nl + 1..];
            let line = std::mem::take(&mut self.line);
            // The same bound as for a line still arriving, so where the chunks end never
            // changes whether a long line is refused.
            if line.len() + self.data.len() > self.max_event_bytes {
                return Err(StreamError::TooLarge {
                    limit: self.max_event_bytes,
                });
            }
            self.line_complete(&line, &mut out)?;
        }
        Ok(out)
    }

    /// Ends the input: parses what is left and fails with [`StreamError::MissingTerminal`] when
    /// no terminal event was seen. A last event cut short reads as a missing terminal event too.
    pub fn finish(&mut self) -> Result<Vec<ServerStreamEvent>, StreamError> {
        let mut out = Vec::new();
        let mut flush = |p: &mut Self| -> Result<(), StreamError> {
            if !p.done && !p.line.is_empty() {
                let line = std::mem::take(&mut p.line);
                p.line_complete(&line, &mut out)?;
            }
            if !p.done {
                p.dispatch(&mut out)?;
            }
            Ok(())
        };
        match flush(self) {
            Ok(()) | Err(StreamError::Malformed { .. }) => {}
            Err(e) => return Err(e),
        }
        if !self.done {
            return Err(StreamError::MissingTerminal {
                events: self.events,
            });
        }
        Ok(out)
    }

    /// Parses a whole body at once: every event up to and including the terminal one.
    pub fn parse_all(body: &[u8]) -> Result<Vec<ServerStreamEvent>, StreamError> {
        let mut p = Self::new();
        let mut events = p.push(body)?;
        events.extend(p.finish()?);
        Ok(events)
    }

    fn line_complete(
        &mut self,
        line: &[u8],
        out: &mut Vec<ServerStreamEvent>,
    ) -> Result<(), StreamError> {
        let mut line = line.strip_suffix(b"\r").unwrap_or(line);
        if std::mem::take(&mut self.first_line) {
            line = line.strip_prefix("\u{feff}".as_bytes()).unwrap_or(line);
        }
        if line.iter().all(|b| matches!(b, b' ' | b'\t')) {
            return self.dispatch(out);
        }
        if self.raw {
            self.data.push(b'\n');
            self.data.extend_from_slice(line);
            return self.try_dispatch_early(out);
        }
        if line[0] == b':' {
            return Ok(()); // SSE comment
        }
        let first = line.iter().copied().find(|b| !matches!(b, b' ' | b'\t'));
        if !self.has_data && matches!(first, Some(b'{' | b'[')) {
            // Bare JSON, upstream's framing: the whole block is data.
            self.raw = true;
            self.has_data = true;
            self.data.extend_from_slice(line);
            return self.try_dispatch_early(out);
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        if field == b"data" {
            if self.has_data {
                self.data.push(b'\n');
            }
            self.has_data = true;
            self.data.extend_from_slice(value);
            return self.try_dispatch_early(out);
        }
        // `event:`, `id:`, `retry:` and unknown fields carry nothing we use.
        Ok(())
    }

    /// Ends the event early when its data is already one complete JSON object.
    fn try_dispatch_early(&mut self, out: &mut Vec<ServerStreamEvent>) -> Result<(), StreamError> {
        if self.data.len() > self.max_event_bytes {
            return Err(StreamError::TooLarge {
                limit: self.max_event_bytes,
            });
        }
        let ends_like_object = self
            .data
            .iter()
            .rev()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|&b| b == b'}');
        if ends_like_object && serde_json::from_slice::<serde::de::IgnoredAny>(&self.data).is_ok() {
            return self.dispatch(out);
        }
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<ServerStreamEvent>) -> Result<(), StreamError> {
        let data = std::mem::take(&mut self.data);
        self.raw = false;
        self.has_data = false;
        if data.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(());
        }
        let event: ServerStreamEvent =
            serde_json::from_slice(&data).map_err(|e| StreamError::Malformed {
                reason: e.to_string(),
                snippet: String::from_utf8_lossy(&data[..data.len().min(120)]).into_owned(),
            })?;
        self.events += 1;
        if event.is_terminal() {
            self.done = true;
            self.line.clear();
        }
        out.push(event);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::EventType;

    const UPSTREAM: &str = concat!(
        r#"{"type":"init","text":"cmd-1","timestamp":1}"#,
        "\n\n",
        r#"{"type":"stdout","text":"héllo\n","timestamp":2}"#,
        "\n\n",
        r#"{"type":"ping","text":"pong","timestamp":3}"#,
        "\n\n",
        r#"{"type":"stderr","text":"oops\n","timestamp":4}"#,
        "\n\n",
        r#"{"type":"execution_complete","execution_time":12,"timestamp":5}"#,
        "\n\n",
    );

    fn kinds(events: &[ServerStreamEvent]) -> Vec<&str> {
        events.iter().map(|e| e.kind.as_str()).collect()
    }

    fn parse_split(body: &[u8], at: usize) -> Result<Vec<ServerStreamEvent>, StreamError> {
        let mut p = EventStreamParser::new();
        let mut ev = p.push(&body[..at])?;
        ev.extend(p.push(&body[at..])?);
        ev.extend(p.finish()?);
        Ok(ev)
    }

    fn parse_bytewise(body: &[u8]) -> Result<Vec<ServerStreamEvent>, StreamError> {
        let mut p = EventStreamParser::new();
        let mut ev = Vec::new();
        for b in body {
            ev.extend(p.push(std::slice::from_ref(b))?);
        }
        ev.extend(p.finish()?);
        Ok(ev)
    }

    fn sse(body: &str) -> String {
        body.split("\n\n")
            .filter(|b| !b.is_empty())
            .map(|b| format!("data: {b}\n\n"))
            .collect()
    }

    #[test]
    fn upstream_bare_json_framing() {
        let ev = EventStreamParser::parse_all(UPSTREAM.as_bytes()).unwrap();
        assert_eq!(
            kinds(&ev),
            ["init", "stdout", "ping", "stderr", "execution_complete"]
        );
        assert_eq!(ev[1].text.as_deref(), Some("héllo\n"));
        assert_eq!(ev[4].execution_time_ms, Some(12));
    }

    #[test]
    fn sse_data_prefix_framing() {
        let body = sse(UPSTREAM);
        assert!(body.starts_with("data: {"));
        let ev = EventStreamParser::parse_all(body.as_bytes()).unwrap();
        assert_eq!(ev.len(), 5);
        // Without the optional space, with CRLF line ends.
        let body = UPSTREAM
            .split("\n\n")
            .filter(|b| !b.is_empty())
            .map(|b| format!("data:{b}\r\n\r\n"))
            .collect::<String>();
        assert_eq!(
            EventStreamParser::parse_all(body.as_bytes()).unwrap().len(),
            5
        );
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let expected = EventStreamParser::parse_all(UPSTREAM.as_bytes()).unwrap();
        let mixed = format!(
            ": hello\n\n{}\r\nevent: message\nid: 7\nretry: 100\ndata: {}\r\n\r\n{}",
            UPSTREAM.split("\n\n").next().unwrap(),
            r#"{"type":"stdout","text":"héllo\n","timestamp":2}"#,
            &UPSTREAM[UPSTREAM.find(r#"{"type":"ping""#).unwrap()..],
        );
        for body in [UPSTREAM.to_string(), sse(UPSTREAM), mixed] {
            let body = body.as_bytes();
            for at in 0..=body.len() {
                let ev = parse_split(body, at).unwrap_or_else(|e| panic!("split at {at}: {e}"));
                assert_eq!(ev, expected, "split at {at}");
            }
            assert_eq!(parse_bytewise(body).unwrap(), expected);
        }
    }

    #[test]
    fn comments_and_other_fields_are_ignored() {
        let body = concat!(
            ": keep-alive\n",
            "retry: 3000\n\n",
            "event: stdout\n",
            "id: 1\n",
            "data: {\"type\":\"stdout\",\"text\":\"a\"}\n\n",
            ":\n\n",
            "event: done\n\n",
            "data: {\"type\":\"error\",\"error\":{\"ename\":\"CommandExecError\",\"evalue\":\"2\"}}\n\n",
        );
        let ev = EventStreamParser::parse_all(body.as_bytes()).unwrap();
        assert_eq!(kinds(&ev), ["stdout", "error"]);
        assert_eq!(ev[1].error.as_ref().unwrap().exit_code(), Some(2));
    }

    #[test]
    fn multi_line_data_is_joined() {
        let body = "data: {\"type\":\"stdout\",\ndata:  \"text\":\"x\"}\n\ndata: {\"type\":\"execution_complete\"}\n\n";
        let ev = EventStreamParser::parse_all(body.as_bytes()).unwrap();
        assert_eq!(ev[0].text.as_deref(), Some("x"));
        // Pretty-printed bare JSON spanning lines.
        let body = "{\n  \"type\": \"execution_complete\",\n  \"execution_time\": 1\n}\n\n";
        let ev = EventStreamParser::parse_all(body.as_bytes()).unwrap();
        assert_eq!(ev[0].kind, EventType::ExecutionComplete);
    }

    #[test]
    fn stops_at_the_terminal_event_and_ignores_garbage_after_it() {
        let body = format!(
            "{}{{\"type\":\"stdout\",\"text\":\"late\"}}\n\nnot json at all \u{0} {{{{\n\n",
            UPSTREAM
        );
        for at in 0..=body.len() {
            let ev = parse_split(body.as_bytes(), at).unwrap();
            assert_eq!(ev.len(), 5, "split at {at}");
            assert_eq!(ev.last().unwrap().kind, EventType::ExecutionComplete);
        }
        let mut p = EventStreamParser::new();
        let ev = p.push(UPSTREAM.as_bytes()).unwrap();
        assert!(p.is_done());
        assert_eq!(ev.len(), 5);
        assert!(p.push(b"\xff\xfe garbage {{{").unwrap().is_empty());
        assert!(p.finish().unwrap().is_empty());
    }

    #[test]
    fn terminal_event_is_seen_before_its_blank_line() {
        let mut p = EventStreamParser::new();
        let ev = p
            .push(b"{\"type\":\"error\",\"error\":{\"ename\":\"CommandExecError\",\"evalue\":\"1\"}}\n")
            .unwrap();
        assert_eq!(ev.len(), 1);
        assert!(p.is_done());
        let mut p = EventStreamParser::new();
        let ev = p
            .push(b"data: {\"type\":\"execution_complete\"}\n")
            .unwrap();
        assert_eq!(ev.len(), 1);
        assert!(p.is_done());
    }

    #[test]
    fn missing_terminal_event_is_an_error() {
        let body = UPSTREAM.replace("execution_complete", "stdout");
        let err = EventStreamParser::parse_all(body.as_bytes()).unwrap_err();
        assert_eq!(err, StreamError::MissingTerminal { events: 5 });
        assert!(err.to_string().contains("without a terminal event"));
        assert_eq!(
            EventStreamParser::parse_all(b"").unwrap_err(),
            StreamError::MissingTerminal { events: 0 }
        );
        // Cut in the middle of the terminal event.
        let cut = &UPSTREAM[..UPSTREAM.len() - 10];
        assert_eq!(
            EventStreamParser::parse_all(cut.as_bytes()).unwrap_err(),
            StreamError::MissingTerminal { events: 4 }
        );
    }

    #[test]
    fn final_event_without_trailing_blank_line_counts() {
        let body = UPSTREAM.trim_end();
        assert_eq!(
            EventStreamParser::parse_all(body.as_bytes()).unwrap().len(),
            5
        );
    }

    #[test]
    fn malformed_and_oversized_events_are_errors() {
        let err = EventStreamParser::parse_all(b"data: {\"text\":\"no type\"}\n\n").unwrap_err();
        assert!(matches!(err, StreamError::Malformed { .. }), "{err}");
        let err = EventStreamParser::parse_all(b"data: hello\n\n").unwrap_err();
        assert!(matches!(err, StreamError::Malformed { .. }), "{err}");
        let mut p = EventStreamParser::with_max_event_bytes(16);
        let err = p.push(&[b'x'; 17]).unwrap_err();
        assert_eq!(err, StreamError::TooLarge { limit: 16 });
    }

    /// Found by the `event_stream` fuzz target: a line longer than the limit was refused when
    /// it arrived in pieces and let through when it arrived whole.
    #[test]
    fn a_long_line_is_refused_however_the_body_is_cut() {
        let mut body = vec![b'x'; 300];
        body.extend_from_slice(b"\n\n");
        body.extend_from_slice(UPSTREAM.as_bytes());
        let parse = |chunks: &[&[u8]]| {
            let mut p = EventStreamParser::with_max_event_bytes(256);
            let mut ev = Vec::new();
            for c in chunks {
                ev.extend(p.push(c)?);
            }
            ev.extend(p.finish()?);
            Ok::<_, StreamError>(ev)
        };
        let whole = parse(&[&body]);
        assert_eq!(whole, Err(StreamError::TooLarge { limit: 256 }));
        for at in [1, 200, 300, 301] {
            assert_eq!(parse(&[&body[..at], &body[at..]]), whole, "cut at {at}");
        }
        // Under the limit, the same line is an ignored field line, cut or not.
        let mut p = EventStreamParser::with_max_event_bytes(400);
        assert_eq!(p.push(&body).unwrap().len(), 5);
    }

    #[test]
    fn bom_and_blank_whitespace_lines() {
        let body = format!("\u{feff}{}", UPSTREAM.replace("\n\n", "\n \t\n"));
        assert_eq!(
            EventStreamParser::parse_all(body.as_bytes()).unwrap().len(),
            5
        );
    }
}
