//! Background commands: what a runtime reports about a command that runs on after the call that
//! started it (see [`crate::Session::spawn`]).
//!
//! A background command is owned where it runs (a sandbox's agent, or the runtime's own
//! supervisor for `host`), never by the process that asked for it: a restarted front end lists,
//! reads and kills the commands a previous one started.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::exec::ExitStatus;

/// Most background commands that may run at once in one conversation; one more is refused with
/// [`Error::Busy`]. A finished command does not count.
pub const MAX_RUNNING_COMMANDS: usize = 16;

/// Longest a [`crate::Session::command_output`] call may wait for new output: 30 s.
pub const MAX_OUTPUT_WAIT: Duration = Duration::from_secs(30);

/// Most bytes one [`crate::Session::command_output`] call returns of each stream: 4 MiB.
pub const MAX_OUTPUT_CHUNK: usize = 4 * 1024 * 1024;

/// Longest command id: 64 bytes.
pub const MAX_COMMAND_ID_BYTES: usize = 64;

/// A background command, running or finished, as the runtime that runs it reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackgroundCommand {
    /// The command's id within its conversation (see [`validate_command_id`]).
    pub id: String,
    /// The command line it runs (`/bin/sh -c COMMAND`).
    pub command: String,
    /// True until the command has ended.
    pub running: bool,
    /// How it ended; `None` while it runs or when it could not start. A killed command (see
    /// `killed`) reports the signal that ended it.
    pub status: Option<ExitStatus>,
    /// True when its timeout ended it.
    pub timed_out: bool,
    /// True when it was killed on request ([`crate::Session::kill_command`], or its
    /// conversation being destroyed).
    pub killed: bool,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// When it ended, in milliseconds since the Unix epoch; `None` while it runs.
    pub finished_at_ms: Option<u64>,
    /// Bytes of stdout kept so far (at most its output limit).
    pub stdout_bytes: u64,
    /// Bytes of stderr kept so far (at most its output limit).
    pub stderr_bytes: u64,
    /// True when stdout went past the output limit and the rest was discarded.
    pub stdout_truncated: bool,
    /// True when stderr went past the output limit and the rest was discarded.
    pub stderr_truncated: bool,
    /// Why it could not run (or how the runtime lost it), when that happened.
    pub error: Option<String>,
}

impl BackgroundCommand {
    /// The exit code a shell would report once it has ended (as
    /// [`crate::ExecResult::shell_exit_code`]: the code, 128 + the signal, 124 after a timeout);
    /// `None` while it runs or when it could not start.
    ///
    /// ```
    /// use sessionbox_core::{BackgroundCommand, ExitStatus};
    /// let mut c = BackgroundCommand::started("c1", "sleep 9", 0);
    /// assert_eq!(c.shell_exit_code(), None);
    /// c.running = false;
    /// c.status = Some(ExitStatus::Signal(9));
    /// assert_eq!(c.shell_exit_code(), Some(137));
    /// ```
    pub fn shell_exit_code(&self) -> Option<i32> {
        if self.running {
            return None;
        }
        if self.timed_out {
            return Some(124);
        }
        self.status.map(|s| match s {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128 + s,
        })
    }

    /// A command that has just started: running, no output yet.
    pub fn started(id: impl Into<String>, command: impl Into<String>, started_at_ms: u64) -> Self {
        BackgroundCommand {
            id: id.into(),
            command: command.into(),
            running: true,
            status: None,
            timed_out: false,
            killed: false,
            started_at_ms,
            finished_at_ms: None,
            stdout_bytes: 0,
            stderr_bytes: 0,
            stdout_truncated: false,
            stderr_truncated: false,
            error: None,
        }
    }

    /// Milliseconds from start to end, or to `now_ms` while it runs.
    pub fn duration_ms(&self, now_ms: u64) -> u64 {
        self.finished_at_ms
            .unwrap_or(now_ms)
            .saturating_sub(self.started_at_ms)
    }
}

/// Output of a background command read from two byte offsets (see
/// [`crate::Session::command_output`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandOutput {
    /// The command's status when the output was read: when it says the command has ended, the
    /// bytes read reach the end of what it kept unless `max_bytes` cut them.
    pub command: BackgroundCommand,
    /// Where `stdout` starts in the command's stdout (the offset asked for, or the bytes kept
    /// when the offset asked for was past them).
    pub stdout_offset: u64,
    /// Bytes of stdout from `stdout_offset` on, exactly as written.
    pub stdout: Vec<u8>,
    /// Where `stderr` starts in the command's stderr (as `stdout_offset`).
    pub stderr_offset: u64,
    /// Bytes of stderr from `stderr_offset` on, exactly as written.
    pub stderr: Vec<u8>,
}

impl CommandOutput {
    /// The stdout offset to read from next.
    pub fn stdout_next(&self) -> u64 {
        self.stdout_offset + self.stdout.len() as u64
    }

    /// The stderr offset to read from next.
    pub fn stderr_next(&self) -> u64 {
        self.stderr_offset + self.stderr.len() as u64
    }

    /// True when nothing more will come from these offsets on: the command has ended and both
    /// streams were read to the end of what it kept.
    pub fn complete(&self) -> bool {
        !self.command.running
            && self.stdout_next() >= self.command.stdout_bytes
            && self.stderr_next() >= self.command.stderr_bytes
    }
}

/// What to read of a background command's output: offsets into each stream, a bound on the
/// bytes returned, and how long to wait for something new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputRequest {
    /// Bytes of stdout already read: the answer starts there.
    pub stdout_from: u64,
    /// Bytes of stderr already read: the answer starts there.
    pub stderr_from: u64,
    /// Most bytes returned of each stream (at most [`MAX_OUTPUT_CHUNK`]); 0 reads the status
    /// alone.
    pub max_bytes: usize,
    /// How long to wait, when there is nothing past both offsets and the command still runs,
    /// for new output or its end (at most [`MAX_OUTPUT_WAIT`]); zero answers at once.
    pub wait: Duration,
}

impl OutputRequest {
    /// Everything from the start, at most [`MAX_OUTPUT_CHUNK`] bytes of each stream, no wait.
    pub fn from_start() -> Self {
        OutputRequest {
            stdout_from: 0,
            stderr_from: 0,
            max_bytes: MAX_OUTPUT_CHUNK,
            wait: Duration::ZERO,
        }
    }

    /// Checks the bounds.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sessionbox_core::OutputRequest;
    /// assert!(OutputRequest::from_start().validate().is_ok());
    /// let mut r = OutputRequest::from_start();
    /// r.wait = Duration::from_secs(31);
    /// assert_eq!(r.validate().unwrap_err().code(), "invalid_request");
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for `max_bytes` above [`MAX_OUTPUT_CHUNK`] or `wait` above
    /// [`MAX_OUTPUT_WAIT`].
    pub fn validate(&self) -> Result<(), Error> {
        if self.max_bytes > MAX_OUTPUT_CHUNK {
            return Err(Error::InvalidRequest(format!(
                "max_bytes {} is above the limit of {MAX_OUTPUT_CHUNK} bytes per read",
                self.max_bytes
            )));
        }
        if self.wait > MAX_OUTPUT_WAIT {
            return Err(Error::InvalidRequest(format!(
                "a read may wait at most {} ms for output, not {} ms",
                MAX_OUTPUT_WAIT.as_millis(),
                self.wait.as_millis()
            )));
        }
        Ok(())
    }
}

/// Checks a background command id: 1 to [`MAX_COMMAND_ID_BYTES`] bytes of `[A-Za-z0-9_-]`.
/// Runtimes make ids of this form; a front end checks one before it opens a conversation, so a
/// malformed id creates nothing (and never becomes part of a path).
///
/// ```
/// assert!(sessionbox_core::validate_command_id("0f3a-b_2").is_ok());
/// assert!(sessionbox_core::validate_command_id("../x").is_err());
/// ```
///
/// # Errors
/// [`Error::InvalidRequest`] naming the id.
pub fn validate_command_id(id: &str) -> Result<(), Error> {
    let ok = !id.is_empty()
        && id.len() <= MAX_COMMAND_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        let shown: String = id.chars().take(80).collect();
        Err(Error::InvalidRequest(format!(
            "command id {shown:?} must be 1 to {MAX_COMMAND_ID_BYTES} characters of \
             [A-Za-z0-9_-]"
        )))
    }
}

/// The error of a runtime that cannot run background commands (the default of the
/// [`crate::Session`] methods).
pub fn background_unsupported(runtime: &str) -> Error {
    Error::RuntimeUnavailable {
        runtime: runtime.to_owned(),
        reason: "this runtime cannot run background commands".into(),
        hint: "run the command in the foreground, or use the isolated, host, aio or \
               opensandbox runtime"
            .into(),
    }
}

/// Longest a write to a background command's stdin waits for the command to read (the pipe
/// holds 64 KiB): 10 s. What is written by then is reported; the rest is not written.
pub const STDIN_WRITE_WAIT: Duration = Duration::from_secs(10);

/// What a write to a background command's stdin did ([`crate::Session::write_stdin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StdinWrite {
    /// Bytes the pipe took, from the start of the data.
    pub written: u64,
    /// The command did not read the rest within [`STDIN_WRITE_WAIT`]; it was not written.
    pub timed_out: bool,
}

/// The refusal of live stdin by a runtime that cannot keep a command's stdin open.
pub fn live_stdin_unsupported(runtime: &str) -> Error {
    Error::RuntimeUnavailable {
        runtime: runtime.to_owned(),
        reason: "this runtime cannot keep a background command's stdin open".into(),
        hint: "give the command its stdin when it starts, or use the isolated or opensandbox \
               runtime"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_ids_are_checked() {
        for bad in ["", "a/b", "..", "a b", "é", &"x".repeat(65), "a\0"] {
            assert_eq!(
                validate_command_id(bad).unwrap_err().code(),
                "invalid_request",
                "{bad:?}"
            );
        }
        for good in [
            "a",
            "0123456789abcdef0123456789abcdef",
            &"x".repeat(64),
            "A-_9",
        ] {
            assert!(validate_command_id(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn exit_codes_as_a_shell_reports_them() {
        let mut c = BackgroundCommand::started("a", "x", 10);
        assert_eq!(c.duration_ms(15), 5);
        c.running = false;
        c.finished_at_ms = Some(12);
        assert_eq!(c.duration_ms(99), 2);
        assert_eq!(c.shell_exit_code(), None, "could not start");
        c.status = Some(ExitStatus::Code(3));
        assert_eq!(c.shell_exit_code(), Some(3));
        c.timed_out = true;
        assert_eq!(c.shell_exit_code(), Some(124));
    }

    #[test]
    fn output_is_complete_only_at_the_end_of_an_ended_command() {
        let mut c = BackgroundCommand::started("a", "x", 0);
        c.stdout_bytes = 4;
        let mut o = CommandOutput {
            command: c,
            stdout_offset: 1,
            stdout: b"bcd".to_vec(),
            stderr_offset: 0,
            stderr: vec![],
        };
        assert_eq!((o.stdout_next(), o.stderr_next()), (4, 0));
        assert!(!o.complete(), "still running");
        o.command.running = false;
        assert!(o.complete());
        o.stdout.pop();
        assert!(!o.complete(), "a byte is left");
    }

    #[test]
    fn read_bounds_are_checked() {
        let mut r = OutputRequest::from_start();
        r.max_bytes = MAX_OUTPUT_CHUNK + 1;
        assert!(r.validate().is_err());
        r.max_bytes = 0;
        r.wait = MAX_OUTPUT_WAIT;
        assert!(r.validate().is_ok());
    }
}
