//! Interactive terminals: upstream execd's PTY session API and its WebSocket frames.
//!
//! Source: upstream execd (`components/execd/PTY.md`, `pkg/web/model/pty.go`,
//! `pkg/web/model/pty_ws.go`, `pkg/web/controller/pty_ws.go`).
//!
//! - `POST /pty` with [`CreatePtyRequest`] (body optional) answers 201 [`CreatePtyResponse`];
//!   the shell starts on the first WebSocket, not here.
//! - `GET /pty/{id}` answers [`PtyStatus`]; `DELETE /pty/{id}` ends the session.
//! - `GET /pty/{id}/ws` upgrades to a WebSocket. Query: [`query::SINCE`] (replay from this byte
//!   offset), [`query::TAKEOVER`] `=1` (evict the current holder instead of a 409),
//!   [`query::PTY`] `=0` (pipe mode).
//! - On the socket: the server first sends a [`channel::REPLAY`] binary frame when there is
//!   buffered output past `since`, then a JSON [`ServerFrame`] of type `connected`. Output is
//!   binary frames whose first byte is the channel ([`channel::STDOUT`], [`channel::STDERR`] in
//!   pipe mode); the client sends stdin as [`channel::STDIN`] + bytes and JSON [`ClientFrame`]s
//!   (`resize`, `signal`, `ping`, `stdin`). When the shell ends: a `exit` frame with
//!   `exit_code`, then a normal close.

use serde::{Deserialize, Serialize};

/// `POST /pty`.
pub const PTY: &str = "/pty";

/// `/pty/{id}` (status, delete).
#[must_use]
pub fn session_path(id: &str) -> String {
    format!("{PTY}/{id}")
}

/// `/pty/{id}/ws` (the WebSocket), without a query.
#[must_use]
pub fn socket_path(id: &str) -> String {
    format!("{PTY}/{id}/ws")
}

/// Query names of the WebSocket route.
pub mod query {
    /// `pty=0`: pipe mode (stdout and stderr apart, no terminal).
    pub const PTY: &str = "pty";
    /// `since=N`: replay buffered output from byte offset `N` (default 0: all that is kept).
    pub const SINCE: &str = "since";
    /// `takeover=1`: close the current holder (code [`super::CLOSE_TAKEN_OVER`]) and attach.
    pub const TAKEOVER: &str = "takeover";
}

/// The first byte of every binary frame.
pub mod channel {
    /// Client to server: raw bytes for the terminal's input.
    pub const STDIN: u8 = 0x00;
    /// Server to client: raw terminal output (in PTY mode, stdout and stderr together).
    pub const STDOUT: u8 = 0x01;
    /// Server to client: stderr in pipe mode.
    pub const STDERR: u8 = 0x02;
    /// Server to client: replayed output; 8 bytes of big-endian byte offset, then the bytes.
    pub const REPLAY: u8 = 0x03;
}

/// Close code sent to a client whose session another client took over (reason
/// [`code::TAKEN_OVER`]).
pub const CLOSE_TAKEN_OVER: u16 = 4001;

/// Error codes of `error` frames and of the routes' error bodies.
pub mod code {
    /// The session ended or was deleted.
    pub const SESSION_GONE: &str = "SESSION_GONE";
    /// The shell could not be started.
    pub const START_FAILED: &str = "START_FAILED";
    /// Writing the client's input to the terminal failed.
    pub const STDIN_WRITE_FAILED: &str = "STDIN_WRITE_FAILED";
    /// A text frame of an unknown type.
    pub const INVALID_FRAME: &str = "INVALID_FRAME";
    /// Another client holds the session (409 before the upgrade).
    pub const ALREADY_CONNECTED: &str = "ALREADY_CONNECTED";
    /// Another client took the session over.
    pub const TAKEN_OVER: &str = "TAKEN_OVER";
    /// Anything else.
    pub const RUNTIME_ERROR: &str = "RUNTIME_ERROR";
}

/// The body of `POST /pty` (every field optional; an empty body is accepted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatePtyRequest {
    /// Working directory of the shell (inside the workspace; default: the workspace root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Run this with `bash -c` instead of an interactive shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

/// The answer to `POST /pty` (201).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatePtyResponse {
    /// The new session's id.
    pub session_id: String,
}

/// The answer to `GET /pty/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyStatus {
    /// The session's id.
    pub session_id: String,
    /// Whether its shell runs now.
    pub running: bool,
    /// Bytes of output produced so far (the `since` that replays nothing).
    pub output_offset: u64,
}

/// A JSON text frame from the client.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientFrame {
    /// `resize`, `signal`, `ping` or `stdin`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `stdin`: UTF-8 text for the terminal's input.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub data: String,
    /// `resize`: columns (ignored unless both sizes are 1 to 65535: [`ClientFrame::window_size`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cols: u32,
    /// `resize`: rows.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rows: u32,
    /// `signal`: a name such as `SIGINT` (or `INT`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signal: String,
}

impl ClientFrame {
    /// A `resize` frame.
    #[must_use]
    pub fn resize(cols: u16, rows: u16) -> Self {
        ClientFrame {
            kind: "resize".into(),
            cols: cols.into(),
            rows: rows.into(),
            ..ClientFrame::default()
        }
    }

    /// The size a `resize` frame asks for, `(cols, rows)`. `None` for any other frame, and for
    /// a size that is 0 or larger than a terminal's 16 bits: the server ignores such a frame.
    #[must_use]
    pub fn window_size(&self) -> Option<(u16, u16)> {
        if self.kind != "resize" {
            return None;
        }
        match (u16::try_from(self.cols), u16::try_from(self.rows)) {
            (Ok(cols @ 1..), Ok(rows @ 1..)) => Some((cols, rows)),
            _ => None,
        }
    }

    /// A `signal` frame.
    #[must_use]
    pub fn signal(name: &str) -> Self {
        ClientFrame {
            kind: "signal".into(),
            signal: name.into(),
            ..ClientFrame::default()
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A JSON text frame from the server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerFrame {
    /// `connected`, `exit`, `pong` or `error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `connected`: the session's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// `connected`: `pty` or `pipe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// `exit`: the shell's exit code, or 128 + the signal that killed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// `error`: what went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `error`: one of [`code`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

impl ServerFrame {
    /// The `connected` frame.
    #[must_use]
    pub fn connected(session_id: &str, mode: &str) -> Self {
        ServerFrame {
            kind: "connected".into(),
            session_id: Some(session_id.into()),
            mode: Some(mode.into()),
            ..ServerFrame::default()
        }
    }

    /// The `exit` frame.
    #[must_use]
    pub fn exit(code: i32) -> Self {
        ServerFrame {
            kind: "exit".into(),
            exit_code: Some(code),
            ..ServerFrame::default()
        }
    }

    /// An `error` frame.
    #[must_use]
    pub fn error(code: &str, message: impl Into<String>) -> Self {
        ServerFrame {
            kind: "error".into(),
            code: Some(code.into()),
            error: Some(message.into()),
            ..ServerFrame::default()
        }
    }

    /// The `pong` answer to a `ping` frame.
    #[must_use]
    pub fn pong() -> Self {
        ServerFrame {
            kind: "pong".into(),
            ..ServerFrame::default()
        }
    }
}

/// A binary frame for channel `channel`: the channel byte, then `data`.
#[must_use]
pub fn binary_frame(channel: u8, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(1 + data.len());
    v.push(channel);
    v.extend_from_slice(data);
    v
}

/// A [`channel::REPLAY`] frame: the channel byte, `offset` as 8 big-endian bytes, `data`.
#[must_use]
pub fn replay_frame(offset: u64, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + data.len());
    v.push(channel::REPLAY);
    v.extend_from_slice(&offset.to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// A server binary frame taken apart: `(channel, offset, data)`; the offset is `Some` for a
/// replay frame only. `None` for an empty frame or a replay frame shorter than its header.
#[must_use]
pub fn parse_server_binary(frame: &[u8]) -> Option<(u8, Option<u64>, &[u8])> {
    let (&ch, rest) = frame.split_first()?;
    if ch == channel::REPLAY {
        let head: [u8; 8] = rest.get(..8)?.try_into().ok()?;
        return Some((ch, Some(u64::from_be_bytes(head)), &rest[8..]));
    }
    Some((ch, None, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_upstreams() {
        assert_eq!(
            serde_json::to_string(&ClientFrame::resize(120, 40)).unwrap(),
            r#"{"type":"resize","cols":120,"rows":40}"#
        );
        assert_eq!(
            serde_json::to_string(&ServerFrame::exit(0)).unwrap(),
            r#"{"type":"exit","exit_code":0}"#
        );
        let f = replay_frame(7, b"ab");
        assert_eq!(f, [3, 0, 0, 0, 0, 0, 0, 0, 7, b'a', b'b']);
        assert_eq!(parse_server_binary(&f), Some((3, Some(7), &b"ab"[..])));
        assert_eq!(parse_server_binary(&[3, 1]), None);
        let c: ClientFrame =
            serde_json::from_str(r#"{"type":"signal","signal":"SIGINT"}"#).unwrap();
        assert_eq!(c, ClientFrame::signal("SIGINT"));
    }

    #[test]
    fn only_a_resize_to_a_real_size_has_a_window_size() {
        assert_eq!(ClientFrame::resize(120, 40).window_size(), Some((120, 40)));
        for (cols, rows) in [(0, 40), (120, 0), (65_536, 40), (120, u32::MAX)] {
            let f = ClientFrame {
                cols,
                rows,
                ..ClientFrame::resize(1, 1)
            };
            assert_eq!(f.window_size(), None, "{cols}x{rows}");
        }
        let not_resize = ClientFrame {
            cols: 80,
            rows: 24,
            ..ClientFrame::signal("INT")
        };
        assert_eq!(not_resize.window_size(), None);
    }
}
