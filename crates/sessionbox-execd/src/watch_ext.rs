//! sessionbox's watch extension of the execd API: an event stream of what changes beneath a
//! directory of the workspace.
//!
//! `GET /sessionbox/v1/watch?path=DIR` ([`WATCH_PATH`]; `path` defaults to the workspace root)
//! answers `200` with `Content-Type: text/event-stream`: Server-Sent Events, one
//! [`WatchEvent`] as JSON per `data:` line ([`frame`]), a `: keepalive` comment every
//! [`KEEPALIVE_INTERVAL`] so a proxy in front never sees a quiet response. The first event is
//! `ready`; the stream ends after an `ended` event, or when the client goes away. Errors before
//! the stream starts are [`ErrorResponse`](crate::types::ErrorResponse)s whose `code` is
//! [`FS_ERROR_PREFIX`](crate::fs_ext::FS_ERROR_PREFIX) and a [`sessionbox_core::Error::code`]
//! (`busy` with 429 past [`MAX_WATCH_STREAMS`](sessionbox_core::MAX_WATCH_STREAMS), `not_found`,
//! `outside_workspace`, `conflict` for a path that is not a directory).
//!
//! [`WatchParser`] reads such a stream back (it ignores comments, `event:` and `id:` lines).

use std::time::Duration;

use sessionbox_core::WatchEvent;

/// The extension's route.
pub const WATCH_PATH: &str = "/sessionbox/v1/watch";

/// Query name of the watched directory.
pub const PATH_QUERY: &str = "path";

/// How often a quiet watch stream carries a keepalive comment.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// The keepalive comment.
pub const KEEPALIVE_FRAME: &[u8] = b": keepalive\n\n";

/// Longest line [`WatchParser`] accepts (an event is a few paths of at most 4 KiB each).
pub const MAX_WATCH_LINE_BYTES: usize = 64 * 1024;

/// `GET` path and query of a watch of `dir` (a workspace path).
pub fn watch_target(dir: &str) -> String {
    let q: String = form_query(dir);
    format!("{WATCH_PATH}?{PATH_QUERY}={q}")
}

fn form_query(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One event as an SSE frame: `data: {json}\n\n`.
pub fn frame(event: &WatchEvent) -> Vec<u8> {
    let mut out = b"data: ".to_vec();
    // Serialising an enum of strings, numbers and booleans cannot fail.
    out.extend_from_slice(&serde_json::to_vec(event).unwrap_or_default());
    out.extend_from_slice(b"\n\n");
    out
}

/// Reads [`WatchEvent`]s from SSE bytes as they arrive.
#[derive(Debug, Default)]
pub struct WatchParser {
    buf: Vec<u8>,
}

impl WatchParser {
    /// Takes more bytes; answers the events completed by them.
    ///
    /// # Errors
    /// A line longer than [`MAX_WATCH_LINE_BYTES`], or a `data:` line that is not a
    /// [`WatchEvent`] (the message names the line's start).
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<WatchEvent>, String> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=end).collect();
            let line = line.strip_suffix(b"\n").unwrap_or(&line);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(data) = line.strip_prefix(b"data:") {
                let data = data.strip_prefix(b" ").unwrap_or(data);
                let event = serde_json::from_slice(data).map_err(|e| {
                    let shown = String::from_utf8_lossy(&data[..data.len().min(80)]);
                    format!("a watch event is not valid ({e}): {shown}")
                })?;
                events.push(event);
            }
        }
        if self.buf.len() > MAX_WATCH_LINE_BYTES {
            return Err(format!(
                "a watch stream line is longer than {MAX_WATCH_LINE_BYTES} bytes"
            ));
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_parse_back_in_any_cut() {
        let events = [
            WatchEvent::Created {
                path: "/workspace/a b".into(),
                dir: false,
            },
            WatchEvent::Overflow,
        ];
        let mut all = Vec::new();
        for e in &events {
            all.extend(frame(e));
            all.extend_from_slice(KEEPALIVE_FRAME);
        }
        for cut in 0..all.len() {
            let mut p = WatchParser::default();
            let mut got = p.push(&all[..cut]).unwrap();
            got.extend(p.push(&all[cut..]).unwrap());
            assert_eq!(got, events, "cut {cut}");
        }
        assert_eq!(
            watch_target("/workspace/a b&c"),
            "/sessionbox/v1/watch?path=/workspace/a%20b%26c"
        );
    }

    #[test]
    fn bad_and_endless_lines_are_refused() {
        assert!(
            WatchParser::default()
                .push(b"data: {\"kind\":\"nope\"}\n")
                .is_err()
        );
        let long = vec![b'x'; MAX_WATCH_LINE_BYTES + 1];
        assert!(WatchParser::default().push(&long).is_err());
    }
}
