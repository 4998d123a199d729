//! Commands: the request a caller sends and the result it gets back.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Default time a command may run: 120 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest time a command may be given: 600 s.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// Default cap on each of stdout and stderr: 1 MiB. Output past it is read and discarded.
pub const DEFAULT_OUTPUT_LIMIT: usize = 1024 * 1024;
/// Largest cap a caller may ask for per stream: 16 MiB.
pub const MAX_OUTPUT_LIMIT: usize = 16 * 1024 * 1024;
/// Largest command line: 64 KiB. Linux refuses one argument over 128 KiB (`E2BIG`), and some
/// runtimes wrap the command before it runs; a longer script goes in a file or on stdin.
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// Largest environment a caller may add, `NAME=VALUE` for each variable together: 64 KiB (the
/// kernel limits each one to 128 KiB and all of them, with the command, to `ARG_MAX`).
pub const MAX_ENV_BYTES: usize = 64 * 1024;
/// Largest stdin: 1 MiB (it travels in the request to the sandbox's agent). Larger input goes
/// in a file.
pub const MAX_STDIN_BYTES: usize = 1024 * 1024;
/// `PATH` of the base environment.
pub const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A shell command to run in a conversation's workspace, as `/bin/sh -c COMMAND`.
///
/// ```
/// use std::time::Duration;
/// use sessionbox_core::ExecRequest;
/// let req = ExecRequest::new("ls -la")
///     .cwd("src")
///     .env("RUST_LOG", "debug")
///     .timeout(Duration::from_secs(30));
/// assert!(req.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// The command line, given to `/bin/sh -c`.
    pub command: String,
    /// Working directory: a workspace path (see [`crate::WorkspacePath`]); `None` is the root.
    pub cwd: Option<String>,
    /// Variables added to the base environment (see [`base_environment`]). The caller's own
    /// environment is never passed on.
    pub env: BTreeMap<String, String>,
    /// How long the command may run before its whole process group is killed.
    #[serde(with = "duration_secs")]
    pub timeout: Duration,
    /// Bytes written to the command's stdin, which is then closed; `None` gives `/dev/null`.
    pub stdin: Option<Vec<u8>>,
    /// Cap on each of stdout and stderr, in bytes; output past it is discarded as it streams.
    pub output_limit: usize,
    /// Background commands only ([`crate::Session::spawn`]): the command's stdin is a pipe kept
    /// open, written with [`crate::Session::write_stdin`] and closed with
    /// [`crate::Session::close_stdin`] (or when the command ends). Not with `stdin`.
    #[serde(default)]
    pub keep_stdin_open: bool,
}

impl ExecRequest {
    /// A request with the defaults: workspace root, base environment, [`DEFAULT_TIMEOUT`], no
    /// stdin, [`DEFAULT_OUTPUT_LIMIT`].
    pub fn new(command: impl Into<String>) -> Self {
        ExecRequest {
            command: command.into(),
            cwd: None,
            env: BTreeMap::new(),
            timeout: DEFAULT_TIMEOUT,
            stdin: None,
            output_limit: DEFAULT_OUTPUT_LIMIT,
            keep_stdin_open: false,
        }
    }

    /// Keeps the command's stdin open for live writes (background commands; see
    /// [`ExecRequest::keep_stdin_open`]).
    pub fn keep_stdin_open(mut self) -> Self {
        self.keep_stdin_open = true;
        self
    }

    /// Sets the working directory.
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Adds one environment variable.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets stdin.
    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(data.into());
        self
    }

    /// Sets the per-stream output cap.
    pub fn output_limit(mut self, bytes: usize) -> Self {
        self.output_limit = bytes;
        self
    }

    /// Checks everything that can be checked without a workspace.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for an empty command or one with a NUL byte, a zero timeout or
    /// one above [`MAX_TIMEOUT`], an output limit of zero or above [`MAX_OUTPUT_LIMIT`], or a bad
    /// environment name or value; [`Error::TooLarge`] naming the limit for a command over
    /// [`MAX_COMMAND_BYTES`], an environment over [`MAX_ENV_BYTES`] or stdin over
    /// [`MAX_STDIN_BYTES`].
    pub fn validate(&self) -> Result<(), Error> {
        if self.command.len() > MAX_COMMAND_BYTES {
            return Err(Error::TooLarge {
                what: "the command".into(),
                limit: MAX_COMMAND_BYTES as u64,
            });
        }
        let env_bytes: usize = self.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
        if env_bytes > MAX_ENV_BYTES {
            return Err(Error::TooLarge {
                what: "the environment (NAME=VALUE of every variable together)".into(),
                limit: MAX_ENV_BYTES as u64,
            });
        }
        if self
            .stdin
            .as_ref()
            .is_some_and(|d| d.len() > MAX_STDIN_BYTES)
        {
            return Err(Error::TooLarge {
                what: "stdin".into(),
                limit: MAX_STDIN_BYTES as u64,
            });
        }
        if self.keep_stdin_open && self.stdin.is_some() {
            return Err(Error::InvalidRequest(
                "give either stdin bytes or keep_stdin_open, not both (write the bytes to the \
                 open stdin instead)"
                    .into(),
            ));
        }
        if self.command.trim().is_empty() {
            return Err(Error::InvalidRequest("the command is empty".into()));
        }
        if self.command.contains('\0') {
            return Err(Error::InvalidRequest(
                "the command contains a NUL byte".into(),
            ));
        }
        if self.timeout < Duration::from_millis(1) || self.timeout > MAX_TIMEOUT {
            return Err(Error::InvalidRequest(format!(
                "the timeout must be between 1 ms and {} s",
                MAX_TIMEOUT.as_secs()
            )));
        }
        if self.output_limit == 0 || self.output_limit > MAX_OUTPUT_LIMIT {
            return Err(Error::InvalidRequest(format!(
                "the output limit must be between 1 and {MAX_OUTPUT_LIMIT} bytes"
            )));
        }
        for (name, value) in &self.env {
            validate_env_name(name)?;
            if value.contains('\0') {
                return Err(Error::InvalidRequest(format!(
                    "the value of environment variable {name} contains a NUL byte"
                )));
            }
        }
        Ok(())
    }
}

/// Checks an environment variable name: `[A-Za-z_][A-Za-z0-9_]*`, at most 256 bytes.
///
/// # Errors
/// [`Error::InvalidRequest`] naming the variable.
pub fn validate_env_name(name: &str) -> Result<(), Error> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 256
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidRequest(format!(
            "environment variable name {name:?} must match [A-Za-z_][A-Za-z0-9_]* (at most 256 bytes)"
        )))
    }
}

/// The fixed environment every command starts from: `PATH`, `HOME` (the workspace as the command
/// sees it), `LANG=C.UTF-8`, `TERM=dumb`. Nothing of the caller's environment is added.
///
/// ```
/// let env = sessionbox_core::base_environment("/workspace");
/// assert_eq!(env["HOME"], "/workspace");
/// assert_eq!(env.len(), 4);
/// ```
pub fn base_environment(home: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("PATH".to_owned(), BASE_PATH.to_owned()),
        ("HOME".to_owned(), home.to_owned()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ("TERM".to_owned(), "dumb".to_owned()),
    ])
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitStatus {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal.
    Signal(i32),
}

/// What a command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResult {
    /// How it ended. After a timeout this is the signal that ended it.
    pub status: ExitStatus,
    /// Its stdout, at most the request's output limit.
    pub stdout: Vec<u8>,
    /// Its stderr, at most the request's output limit.
    pub stderr: Vec<u8>,
    /// True when stdout went past the limit and the rest was discarded.
    pub stdout_truncated: bool,
    /// True when stderr went past the limit and the rest was discarded.
    pub stderr_truncated: bool,
    /// True when the timeout ended it.
    pub timed_out: bool,
    /// Wall time from spawn to the end of its output.
    #[serde(with = "duration_secs")]
    pub duration: Duration,
}

impl ExecResult {
    /// The exit code a shell would report: the code; 128 + the signal; 124 after a timeout (as
    /// `timeout(1)` does).
    ///
    /// ```
    /// use std::time::Duration;
    /// use sessionbox_core::{ExecResult, ExitStatus};
    /// let mut r = ExecResult { status: ExitStatus::Signal(9), stdout: vec![], stderr: vec![],
    ///     stdout_truncated: false, stderr_truncated: false, timed_out: false,
    ///     duration: Duration::ZERO };
    /// assert_eq!(r.shell_exit_code(), 137);
    /// r.timed_out = true;
    /// assert_eq!(r.shell_exit_code(), 124);
    /// ```
    pub fn shell_exit_code(&self) -> i32 {
        if self.timed_out {
            return 124;
        }
        match self.status {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128 + s,
        }
    }

    /// True when it exited with code 0 and did not time out.
    pub fn success(&self) -> bool {
        !self.timed_out && self.status == ExitStatus::Code(0)
    }
}

/// One of a command's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    /// Standard output (fd 1).
    Stdout,
    /// Standard error (fd 2).
    Stderr,
}

/// Where [`crate::Session::exec_stream`] hands output while a command runs: called with the
/// stream and the next bytes of it (a chunk may end inside a UTF-8 sequence). It is called from
/// the exec future, never concurrently, and should return quickly (queue the bytes, do not
/// block).
///
/// ```
/// use sessionbox_core::{ExecSink, OutputStream};
/// let mut out = Vec::new();
/// let mut collect = |s: OutputStream, b: &[u8]| if s == OutputStream::Stdout { out.extend_from_slice(b) };
/// let sink: ExecSink<'_> = &mut collect;
/// sink(OutputStream::Stdout, b"hi");
/// assert_eq!(out, b"hi");
/// ```
pub type ExecSink<'a> = &'a mut (dyn FnMut(OutputStream, &[u8]) + Send);

/// Hands output to an [`ExecSink`] up to a per-stream cap and no further: what runtimes use to
/// keep [`crate::Session::exec_stream`]'s contract (the chunks of a stream are exactly the bytes
/// kept in the result).
///
/// ```
/// use sessionbox_core::{CappedSink, OutputStream};
/// let mut seen = Vec::new();
/// let mut f = |_: OutputStream, b: &[u8]| seen.extend_from_slice(b);
/// let mut capped = CappedSink::new(&mut f, 4);
/// capped.push(OutputStream::Stdout, b"abc");
/// capped.push(OutputStream::Stdout, b"def");
/// capped.push(OutputStream::Stderr, b"x");
/// drop(capped);
/// assert_eq!(seen, b"abcdx");
/// ```
pub struct CappedSink<'s, 'a> {
    sink: &'s mut (dyn FnMut(OutputStream, &[u8]) + Send + 'a),
    limit: usize,
    sent: [usize; 2],
}

impl std::fmt::Debug for CappedSink<'_, '_> {
    /// Shows the cap and the bytes passed so far per stream; the sink is a closure.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CappedSink")
            .field("limit", &self.limit)
            .field("sent", &self.sent)
            .finish_non_exhaustive()
    }
}

impl<'s, 'a> CappedSink<'s, 'a> {
    /// Wraps `sink`, passing at most `limit` bytes of each stream.
    pub fn new(sink: &'s mut (dyn FnMut(OutputStream, &[u8]) + Send + 'a), limit: usize) -> Self {
        CappedSink {
            sink,
            limit,
            sent: [0, 0],
        }
    }

    /// Passes on as much of `chunk` as still fits under the cap of `stream`.
    pub fn push(&mut self, stream: OutputStream, chunk: &[u8]) {
        let i = stream as usize;
        let room = self.limit.saturating_sub(self.sent[i]);
        let n = chunk.len().min(room);
        if n > 0 {
            self.sent[i] += n;
            (self.sink)(stream, &chunk[..n]);
        }
    }
}

/// Serialises a [`Duration`] as fractional seconds.
mod duration_secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_parts_are_too_large_naming_the_limit() {
        let at = |n: usize| "a".repeat(n);
        for (req, limit) in [
            (
                ExecRequest::new(at(MAX_COMMAND_BYTES + 1)),
                MAX_COMMAND_BYTES,
            ),
            (
                ExecRequest::new("true").env("A", at(MAX_ENV_BYTES)),
                MAX_ENV_BYTES,
            ),
            (
                ExecRequest::new("true").stdin(at(MAX_STDIN_BYTES + 1)),
                MAX_STDIN_BYTES,
            ),
        ] {
            let e = req.validate().unwrap_err();
            assert_eq!(e.code(), "too_large");
            assert!(
                e.to_string().contains(&format!("limit is {limit} bytes")),
                "{e}"
            );
        }
        assert!(ExecRequest::new(at(MAX_COMMAND_BYTES)).validate().is_ok());
        assert!(
            ExecRequest::new("true")
                .stdin(at(MAX_STDIN_BYTES))
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn bad_requests_are_refused_with_a_reason() {
        let bad = [
            ExecRequest::new(""),
            ExecRequest::new("   "),
            ExecRequest::new("a\0b"),
            ExecRequest::new("true").timeout(Duration::ZERO),
            ExecRequest::new("true").timeout(Duration::from_micros(100)),
            ExecRequest::new("true").timeout(MAX_TIMEOUT + Duration::from_millis(1)),
            ExecRequest::new("true").output_limit(0),
            ExecRequest::new("true").output_limit(MAX_OUTPUT_LIMIT + 1),
            ExecRequest::new("true").env("1X", "v"),
            ExecRequest::new("true").env("A=B", "v"),
            ExecRequest::new("true").env("", "v"),
            ExecRequest::new("true").env("X", "a\0b"),
        ];
        for r in bad {
            assert_eq!(r.validate().unwrap_err().code(), "invalid_request", "{r:?}");
        }
        assert!(
            ExecRequest::new("true")
                .timeout(MAX_TIMEOUT)
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn results_round_trip_through_json() {
        let r = ExecResult {
            status: ExitStatus::Code(3),
            stdout: b"out".to_vec(),
            stderr: vec![],
            stdout_truncated: true,
            stderr_truncated: false,
            timed_out: false,
            duration: Duration::from_millis(1500),
        };
        let back: ExecResult = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.shell_exit_code(), 3);
    }
}
