//! Folding a command's events into its result.

use std::time::{Duration, Instant};

use crate::types::{EventError, EventType, RunCommandRequest, ServerStreamEvent};
use crate::wire;

/// The collected result of `POST /command`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandOutcome {
    /// Command id from the `init` event (use it for status, logs and interrupt).
    pub id: Option<String>,
    /// All standard output, in order: the exact bytes from a server that honoured
    /// [`crate::OutputEncoding::Base64`], else the events' text.
    pub stdout: Vec<u8>,
    /// All standard error, in order (as `stdout`).
    pub stderr: Vec<u8>,
    /// Exit code of a foreground command: 0 on `execution_complete`, the integer in
    /// `error.evalue` on `error`, `None` when `evalue` is not a number (the command did not
    /// start) and always `None` for a background command (as the SDK's
    /// `infer_foreground_exit_code`).
    pub exit_code: Option<i32>,
    /// Server-measured run time from `execution_complete.execution_time`.
    pub execution_time: Option<Duration>,
    /// Client-measured time from sending the request to the terminal event.
    pub elapsed: Duration,
    /// The command was killed at its `timeout`: either the server said so
    /// ([`wire::COMMAND_TIMEOUT_ERROR`]), or a timeout was requested and the command died of
    /// SIGKILL (upstream reports exit code `-1`, a shell `137`) no earlier than that timeout.
    pub timed_out: bool,
    /// The terminal `error` event's details, if the stream ended with one.
    pub error: Option<EventError>,
    /// The request ran in the background: the stream only confirmed the start.
    pub background: bool,
    /// The signal that ended the command, when a sessionbox server said so in its terminal
    /// event's [`CommandEndExtension`](crate::types::CommandEndExtension) (upstream reports
    /// only exit code `-1`).
    pub signal: Option<i32>,
    /// The command was interrupted (sessionbox servers only).
    pub interrupted: bool,
    /// The server discarded standard output past its cap (sessionbox servers only).
    pub stdout_truncated: bool,
    /// The server discarded standard error past its cap (sessionbox servers only).
    pub stderr_truncated: bool,
}

impl CommandOutcome {
    /// The outcome as a `Session::exec` result, each stream cut at `output_limit` bytes.
    /// `where_` names the sandbox in the error (for example `""` or `" in sandbox ID"`).
    ///
    /// # Errors
    /// [`sessionbox_core::Error::Backend`] when the command did not start (an `error` event
    /// with no exit code, no signal and no timeout).
    pub fn into_exec_result(
        self,
        output_limit: usize,
        where_: &str,
    ) -> sessionbox_core::Result<sessionbox_core::ExecResult> {
        use sessionbox_core::ExitStatus;
        if let (None, Some(e)) = (self.exit_code, &self.error)
            && self.signal.is_none()
            && !self.timed_out
        {
            return Err(sessionbox_core::Error::Backend(format!(
                "the command did not start{where_}: {} {}",
                e.ename, e.evalue
            )));
        }
        let status = match (self.signal, self.exit_code) {
            (Some(s), _) => ExitStatus::Signal(s),
            (None, Some(c)) if c >= 0 => ExitStatus::Code(c),
            // Upstream reports a kill at the timeout as -1.
            _ => ExitStatus::Signal(9),
        };
        let mut stdout = self.stdout;
        let mut stderr = self.stderr;
        stdout.truncate(output_limit);
        stderr.truncate(output_limit);
        Ok(sessionbox_core::ExecResult {
            status,
            stdout,
            stderr,
            stdout_truncated: self.stdout_truncated,
            stderr_truncated: self.stderr_truncated,
            timed_out: self.timed_out,
            duration: self.execution_time.unwrap_or(self.elapsed),
        })
    }
}

impl CommandOutcome {
    /// Standard output as text (bytes that are not UTF-8 become U+FFFD).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Standard error as text (bytes that are not UTF-8 become U+FFFD).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// True when a foreground command exited 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// Builds a [`CommandOutcome`] from events, for callers that consume the stream themselves.
#[derive(Debug, Clone)]
pub struct OutcomeCollector {
    outcome: CommandOutcome,
    timeout: Option<Duration>,
    started: Instant,
    terminal: bool,
}

impl OutcomeCollector {
    /// A collector for `request`, timing from now.
    pub fn new(request: &RunCommandRequest) -> Self {
        OutcomeCollector {
            outcome: CommandOutcome {
                background: request.background,
                ..Default::default()
            },
            timeout: request.timeout_ms.map(Duration::from_millis),
            started: Instant::now(),
            terminal: false,
        }
    }

    /// Takes one event into account.
    pub fn apply(&mut self, event: &ServerStreamEvent) {
        if event.is_terminal()
            && let Some(ext) = &event.extension
        {
            let o = &mut self.outcome;
            o.signal = ext.signal;
            o.interrupted = ext.interrupted;
            o.stdout_truncated = ext.stdout_truncated;
            o.stderr_truncated = ext.stderr_truncated;
        }
        let o = &mut self.outcome;
        match &event.kind {
            EventType::Init => o.id = event.text.clone(),
            EventType::Stdout => o.stdout.extend_from_slice(event.output()),
            EventType::Stderr => o.stderr.extend_from_slice(event.output()),
            EventType::ExecutionComplete => {
                self.terminal = true;
                o.elapsed = self.started.elapsed();
                o.execution_time = event
                    .execution_time_ms
                    .and_then(|ms| u64::try_from(ms).ok())
                    .map(Duration::from_millis);
                if !o.background {
                    o.exit_code = Some(0);
                }
            }
            EventType::Error => {
                self.terminal = true;
                o.elapsed = self.started.elapsed();
                let err = event.error.clone().unwrap_or_default();
                if !o.background {
                    o.exit_code = err.exit_code();
                }
                let killed = matches!(err.exit_code(), Some(-1 | 137));
                o.timed_out = err.ename == wire::COMMAND_TIMEOUT_ERROR
                    || event.extension.is_some_and(|x| x.timed_out)
                    || (killed && !o.interrupted && self.timeout.is_some_and(|t| o.elapsed >= t));
                o.error = Some(err);
            }
            _ => {}
        }
    }

    /// True once a terminal event was applied.
    pub fn is_complete(&self) -> bool {
        self.terminal
    }

    /// The outcome so far.
    pub fn finish(self) -> CommandOutcome {
        self.outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_events() {
        let req = RunCommandRequest::shell("x");
        let mut c = OutcomeCollector::new(&req);
        for e in [
            ServerStreamEvent::init("id1"),
            ServerStreamEvent::stdout("a"),
            ServerStreamEvent::stderr("b"),
            ServerStreamEvent::stdout("c"),
            ServerStreamEvent::execution_complete(Duration::from_millis(7)),
        ] {
            c.apply(&e);
        }
        assert!(c.is_complete());
        let o = c.finish();
        assert_eq!(o.id.as_deref(), Some("id1"));
        assert_eq!(
            (o.stdout.as_slice(), o.stderr.as_slice()),
            (&b"ac"[..], &b"b"[..])
        );
        assert_eq!(o.exit_code, Some(0));
        assert!(o.success());
        assert_eq!(o.execution_time, Some(Duration::from_millis(7)));
        assert!(!o.timed_out);
    }

    #[test]
    fn error_exit_codes_and_timeouts() {
        let req = RunCommandRequest::shell("x");
        let mut c = OutcomeCollector::new(&req);
        c.apply(&ServerStreamEvent::exit_error(3, vec![]));
        let o = c.finish();
        assert_eq!(o.exit_code, Some(3));
        assert!(!o.timed_out);

        let mut c = OutcomeCollector::new(&req);
        c.apply(&ServerStreamEvent::start_error(
            "fork/exec /bin/nope: no such file",
        ));
        assert_eq!(c.finish().exit_code, None);

        let mut c = OutcomeCollector::new(&req);
        c.apply(&ServerStreamEvent::timeout_error(
            137,
            Duration::from_secs(1),
        ));
        let o = c.finish();
        assert!(o.timed_out);
        assert_eq!(o.exit_code, Some(137));

        // Upstream style: SIGKILL at the deadline reports -1.
        let req = RunCommandRequest::shell("x").timeout(Duration::from_millis(1));
        let mut c = OutcomeCollector::new(&req);
        std::thread::sleep(Duration::from_millis(2));
        c.apply(&ServerStreamEvent::exit_error(-1, vec![]));
        assert!(c.finish().timed_out);
    }

    #[test]
    fn the_sessionbox_extension_is_read() {
        use crate::types::CommandEndExtension;
        let req = RunCommandRequest::shell("x");
        let mut c = OutcomeCollector::new(&req);
        let ext = CommandEndExtension {
            signal: Some(9),
            interrupted: true,
            stdout_truncated: true,
            ..Default::default()
        };
        let e = ServerStreamEvent::exit_error(-1, vec![]).with_extension(ext);
        // Through the wire and back.
        let e: ServerStreamEvent = serde_json::from_slice(&e.to_frame()).unwrap();
        c.apply(&e);
        let o = c.finish();
        assert_eq!(o.exit_code, Some(-1));
        assert_eq!(o.signal, Some(9));
        assert!(o.interrupted && o.stdout_truncated && !o.stderr_truncated && !o.timed_out);
        // Absent extension: nothing is invented.
        let v = serde_json::to_value(ServerStreamEvent::exit_error(1, vec![])).unwrap();
        assert!(v.get("sessionbox").is_none());
    }

    #[test]
    fn background_commands_have_no_exit_code() {
        let req = RunCommandRequest::shell("sleep 9").background(true);
        let mut c = OutcomeCollector::new(&req);
        c.apply(&ServerStreamEvent::init("bg"));
        c.apply(&ServerStreamEvent::execution_complete(Duration::ZERO));
        let o = c.finish();
        assert!(o.background);
        assert_eq!(o.exit_code, None);
        assert_eq!(o.id.as_deref(), Some("bg"));
    }
}
