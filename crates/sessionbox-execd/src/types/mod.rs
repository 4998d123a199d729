//! Request and response bodies of the execd API, as serde types.
//!
//! Field names and optionality follow what the released `opensandbox==1.1.1` SDK sends and
//! accepts, which is the oracle where it differs from `execd-api.yaml`. Deserialization is lenient
//! (unknown fields are ignored, `null` reads as absent) so that both the upstream daemon and our
//! own server are understood; serialization omits absent fields, as upstream's Go `omitempty` does.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::wire;

mod files;

pub use files::{
    ErrorResponse, FileInfo, FileMetadata, FileType, Metrics, Permission, RenameFileItem,
    ReplaceFileContentItem, ReplaceFileContentResult, UploadFile, mode_from_wire, mode_to_wire,
};

/// Body of `POST /command` (`RunCommandRequest`).
///
/// Exactly one of `command` (shell text, run with `bash -c` upstream) and `argv` (an executable
/// and its literal arguments, SDK 1.1.1 only, not in the YAML) is set. Absent fields are left out
/// of the JSON, as the SDK does; `background` is sent only when true.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunCommandRequest {
    /// Shell text to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Executable and arguments, not shell-expanded (SDK 1.1.1: `argv`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// Working directory. Upstream expands `$NAME`, `${NAME}` and a leading `~` in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Run detached: the stream ends right after `init` and `execution_complete`, and the output
    /// is read with `GET /command/{id}/logs`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub background: bool,
    /// Deadline in **milliseconds** (spec: "Maximum allowed execution time in milliseconds"; the
    /// SDK sends `int(timedelta.total_seconds() * 1000)`). Absent means no deadline. Upstream
    /// rejects values below 1.
    #[serde(default, rename = "timeout", skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Unix user id to run as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Unix group id to run as; upstream requires `uid` with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// Environment variables added to the command's environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envs: Option<BTreeMap<String, String>>,
    /// sessionbox extension, not in the SDK or the YAML: the most bytes of each of stdout and
    /// stderr the server forwards (the rest is read and discarded, and the terminal event's
    /// [`CommandEndExtension`] says so). Upstream ignores unknown fields, so sending it there is
    /// harmless. Absent: the server's default (16 MiB for sessionbox-agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// sessionbox extension: bytes written to the command's stdin, which is then closed (base64,
    /// standard alphabet, in JSON). Absent: stdin is `/dev/null`. Upstream ignores it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::b64::optional"
    )]
    pub stdin: Option<Vec<u8>>,
    /// sessionbox extension: how the server frames `stdout`/`stderr` events. Absent: as
    /// upstream does (text, one event per line; bytes that are not UTF-8 cannot be carried).
    /// [`OutputEncoding::Base64`]: each event carries the exact bytes read, in
    /// [`ServerStreamEvent::bytes`], as they arrive. Upstream ignores the field (and then
    /// frames as it always does); a sessionbox agent refuses a value it does not know (400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_encoding: Option<OutputEncoding>,
    /// sessionbox extension, background commands only: the command's stdin is a pipe kept
    /// open, written with `POST /sessionbox/v1/commands/{id}/stdin` and closed with `DELETE` on
    /// it (see [`crate::commands_ext`]). Not with `stdin`. Upstream ignores it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub keep_stdin_open: bool,
}

/// How a sessionbox server carries command output in stream events (see
/// [`RunCommandRequest::output_encoding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputEncoding {
    /// The exact bytes, base64 (standard alphabet, padded) in the event's `bytes` field, in
    /// chunks as the server read them.
    Base64,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl RunCommandRequest {
    /// A foreground request for shell text.
    pub fn shell(command: impl Into<String>) -> Self {
        RunCommandRequest {
            command: Some(command.into()),
            ..Default::default()
        }
    }

    /// A foreground request for an executable and its arguments.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RunCommandRequest {
            argv: Some(argv.into_iter().map(Into::into).collect()),
            ..Default::default()
        }
    }

    /// Sets the working directory.
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Sets the deadline (sent in whole milliseconds, at least 1).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = Some((timeout.as_millis().min(u64::MAX as u128) as u64).max(1));
        self
    }

    /// Caps what the server forwards of each output stream (a sessionbox extension; see
    /// [`RunCommandRequest::max_output_bytes`]).
    pub fn max_output_bytes(mut self, bytes: u64) -> Self {
        self.max_output_bytes = Some(bytes);
        self
    }

    /// Gives the command these bytes on stdin (a sessionbox extension; see
    /// [`RunCommandRequest::stdin`]).
    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(data.into());
        self
    }

    /// The request a sessionbox runtime sends for `exec`, running in `cwd` (a path the agent
    /// resolves beneath its root): shell text, exact output, its timeout, output cap,
    /// environment and stdin.
    pub fn for_exec(exec: &sessionbox_core::ExecRequest, cwd: impl Into<String>) -> Self {
        let mut run = Self::shell(exec.command.clone())
            .exact_output()
            .cwd(cwd)
            .timeout(exec.timeout)
            .max_output_bytes(exec.output_limit as u64);
        for (k, v) in &exec.env {
            run = run.env(k, v);
        }
        if let Some(stdin) = &exec.stdin {
            run = run.stdin(stdin.clone());
        }
        run
    }

    /// Adds an environment variable unless the request already sets it (the caller's own
    /// variables win over ones a runtime adds).
    pub fn env_default(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.envs
            .get_or_insert_with(BTreeMap::new)
            .entry(name.into())
            .or_insert_with(|| value.into());
        self
    }

    /// Asks for the exact bytes of the output (a sessionbox extension; see
    /// [`RunCommandRequest::output_encoding`]).
    pub fn exact_output(mut self) -> Self {
        self.output_encoding = Some(OutputEncoding::Base64);
        self
    }

    /// Runs the command detached.
    pub fn background(mut self, background: bool) -> Self {
        self.background = background;
        self
    }

    /// Adds one environment variable.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.envs
            .get_or_insert_with(BTreeMap::new)
            .insert(name.into(), value.into());
        self
    }

    /// Checks the rules both sides agree on: exactly one of `command` and `argv`, a non-blank
    /// command, a non-empty `argv[0]` without NUL bytes, `gid` only with `uid`, `timeout >= 1`.
    pub fn validate(&self) -> Result<(), String> {
        match (&self.command, &self.argv) {
            (Some(_), Some(_)) => return Err("give either command or argv, not both".into()),
            (None, None) => return Err("a command or argv is required".into()),
            (Some(c), None) if c.trim().is_empty() => return Err("command is empty".into()),
            (None, Some(argv)) => {
                if argv.first().is_none_or(|a| a.is_empty()) {
                    return Err("argv needs a non-empty executable".into());
                }
                if argv.iter().any(|a| a.contains('\0')) {
                    return Err("argv must not contain NUL bytes".into());
                }
            }
            _ => {}
        }
        if self.gid.is_some() && self.uid.is_none() {
            return Err("uid is required when gid is given".into());
        }
        if self.timeout_ms == Some(0) {
            return Err("timeout must be at least 1 ms".into());
        }
        Ok(())
    }
}

/// The `type` of a [`ServerStreamEvent`]. Unknown types are kept as [`EventType::Other`] and
/// ignored by the collector, so a newer server does not break an older client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EventType {
    /// First event; `text` is the command id.
    Init,
    /// Status text (code interpreter).
    Status,
    /// Terminal for commands: `error.evalue` is the exit code, or why the command did not start.
    Error,
    /// A piece of standard output in `text`.
    Stdout,
    /// A piece of standard error in `text`.
    Stderr,
    /// A rich result in `results` (code interpreter).
    Result,
    /// Terminal: the command exited 0 (or, for a background command, started).
    ExecutionComplete,
    /// Cell number in `execution_count` (code interpreter).
    ExecutionCount,
    /// Keep-alive, every 3 s upstream; `text` is `pong`.
    Ping,
    /// Any other type.
    Other(String),
}

impl EventType {
    /// The wire name.
    pub fn as_str(&self) -> &str {
        match self {
            EventType::Init => "init",
            EventType::Status => "status",
            EventType::Error => "error",
            EventType::Stdout => "stdout",
            EventType::Stderr => "stderr",
            EventType::Result => "result",
            EventType::ExecutionComplete => "execution_complete",
            EventType::ExecutionCount => "execution_count",
            EventType::Ping => "ping",
            EventType::Other(s) => s,
        }
    }

    /// Reads a wire name.
    pub fn parse(s: &str) -> Self {
        match s {
            "init" => EventType::Init,
            "status" => EventType::Status,
            "error" => EventType::Error,
            "stdout" => EventType::Stdout,
            "stderr" => EventType::Stderr,
            "result" => EventType::Result,
            "execution_complete" => EventType::ExecutionComplete,
            "execution_count" => EventType::ExecutionCount,
            "ping" => EventType::Ping,
            other => EventType::Other(other.to_owned()),
        }
    }

    /// True for the events that end a command's stream: `execution_complete` and `error`
    /// (upstream sends exactly one of them, last; see `runCommand` in execd).
    pub fn is_terminal(&self) -> bool {
        matches!(self, EventType::ExecutionComplete | EventType::Error)
    }
}

impl Serialize for EventType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EventType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(EventType::parse(&s))
    }
}

/// One event of a command's stream (`ServerStreamEvent`).
///
/// The SDK requires `type` and `timestamp` (its `EventNode` model), so a server must always send
/// both; the constructors below do. When reading, only `type` is required.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerStreamEvent {
    /// What the event is.
    #[serde(rename = "type")]
    pub kind: EventType,
    /// Output text, the command id (`init`) or `pong` (`ping`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// sessionbox extension on `stdout`/`stderr` events of a request that asked for
    /// [`OutputEncoding::Base64`]: the exact bytes of this piece (base64 on the wire), instead
    /// of `text`. Upstream never sends it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::b64::optional"
    )]
    pub bytes: Option<Vec<u8>>,
    /// Cell number (code interpreter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_count: Option<i64>,
    /// Run time in milliseconds, on `execution_complete` (wire name `execution_time`).
    #[serde(
        default,
        rename = "execution_time",
        skip_serializing_if = "Option::is_none"
    )]
    pub execution_time_ms: Option<i64>,
    /// When the event was made, in Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
    /// Rich results by MIME type (code interpreter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<serde_json::Map<String, serde_json::Value>>,
    /// Error details, on `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<EventError>,
    /// sessionbox extension on the terminal event (wire name `sessionbox`): how the command
    /// really ended. The SDK and upstream ignore unknown fields; upstream never sends it.
    #[serde(
        default,
        rename = "sessionbox",
        skip_serializing_if = "Option::is_none"
    )]
    pub extension: Option<CommandEndExtension>,
}

/// What a sessionbox server adds to a command's terminal event (wire name `sessionbox`), so
/// that a client can tell apart what upstream folds into exit code `-1`.
///
/// ```json
/// {"type":"error","timestamp":1,"error":{"ename":"CommandExecError","evalue":"-1","traceback":[]},
///  "sessionbox":{"signal":9,"interrupted":true,"stdout_truncated":true}}
/// ```
///
/// Absent fields are `None`/`false`. A command killed by a signal keeps upstream's `evalue`
/// `-1`; `signal` names the signal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandEndExtension {
    /// The signal that ended the shell, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The command's `timeout` ran out and the server killed its process group.
    #[serde(default, skip_serializing_if = "is_false")]
    pub timed_out: bool,
    /// The command was interrupted (`DELETE /command`) and its process group killed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub interrupted: bool,
    /// Standard output went past the forwarded cap; the rest was discarded.
    #[serde(default, skip_serializing_if = "is_false")]
    pub stdout_truncated: bool,
    /// Standard error went past the forwarded cap; the rest was discarded.
    #[serde(default, skip_serializing_if = "is_false")]
    pub stderr_truncated: bool,
}

impl ServerStreamEvent {
    /// An event of `kind` stamped with the current time and nothing else.
    pub fn new(kind: EventType) -> Self {
        ServerStreamEvent {
            kind,
            text: None,
            bytes: None,
            execution_count: None,
            execution_time_ms: None,
            timestamp: Some(now_millis()),
            results: None,
            error: None,
            extension: None,
        }
    }

    /// Attaches the sessionbox extension (meant for the terminal event).
    pub fn with_extension(mut self, extension: CommandEndExtension) -> Self {
        self.extension = Some(extension);
        self
    }

    /// `init` carrying the command id.
    pub fn init(command_id: impl Into<String>) -> Self {
        Self::new(EventType::Init).with_text(command_id)
    }

    /// A piece of standard output.
    pub fn stdout(text: impl Into<String>) -> Self {
        Self::new(EventType::Stdout).with_text(text)
    }

    /// A piece of standard error.
    pub fn stderr(text: impl Into<String>) -> Self {
        Self::new(EventType::Stderr).with_text(text)
    }

    /// A piece of standard output or error as exact bytes (the [`OutputEncoding::Base64`]
    /// framing); `stdout` false means standard error.
    pub fn output_bytes(stdout: bool, data: &[u8]) -> Self {
        let mut e = Self::new(if stdout {
            EventType::Stdout
        } else {
            EventType::Stderr
        });
        e.bytes = Some(data.to_vec());
        e
    }

    /// The output this event carries: its exact `bytes` when present, else its `text` as
    /// UTF-8. Empty for events without output.
    pub fn output(&self) -> &[u8] {
        match (&self.bytes, &self.text) {
            (Some(b), _) => b,
            (None, Some(t)) => t.as_bytes(),
            (None, None) => &[],
        }
    }

    /// The output stream and bytes of a `stdout`/`stderr` event; `None` for other events.
    pub fn output_stream(&self) -> Option<(sessionbox_core::OutputStream, &[u8])> {
        let stream = match self.kind {
            EventType::Stdout => sessionbox_core::OutputStream::Stdout,
            EventType::Stderr => sessionbox_core::OutputStream::Stderr,
            _ => return None,
        };
        Some((stream, self.output()))
    }

    /// Keep-alive, as upstream sends it.
    pub fn ping() -> Self {
        Self::new(EventType::Ping).with_text("pong")
    }

    /// Terminal success event.
    pub fn execution_complete(elapsed: Duration) -> Self {
        let mut e = Self::new(EventType::ExecutionComplete);
        e.execution_time_ms = Some(elapsed.as_millis().min(i64::MAX as u128) as i64);
        e
    }

    /// Terminal event of a command that exited with a non-zero `code` (upstream: ename
    /// `CommandExecError`, evalue the decimal code).
    pub fn exit_error(code: i32, traceback: Vec<String>) -> Self {
        Self::error_event(wire::COMMAND_EXEC_ERROR, code.to_string(), traceback)
    }

    /// Terminal event of a command killed at its deadline: ename [`wire::COMMAND_TIMEOUT_ERROR`],
    /// evalue the exit code, so SDK clients still read an exit code.
    pub fn timeout_error(code: i32, timeout: Duration) -> Self {
        Self::error_event(
            wire::COMMAND_TIMEOUT_ERROR,
            code.to_string(),
            vec![format!("timed out after {} ms", timeout.as_millis())],
        )
    }

    /// Terminal event of a command that could not start; `message` is not a number, so clients
    /// report no exit code.
    pub fn start_error(message: impl Into<String>) -> Self {
        let message = message.into();
        Self::error_event(wire::COMMAND_EXEC_ERROR, message.clone(), vec![message])
    }

    fn error_event(ename: &str, evalue: String, traceback: Vec<String>) -> Self {
        let mut e = Self::new(EventType::Error);
        e.error = Some(EventError {
            ename: ename.to_owned(),
            evalue,
            traceback,
        });
        e
    }

    fn with_text(mut self, text: impl Into<String>) -> Self {
        self.text = Some(text.into());
        self
    }

    /// True for `execution_complete` and `error`.
    pub fn is_terminal(&self) -> bool {
        self.kind.is_terminal()
    }

    /// The event as upstream frames it: compact JSON followed by one blank line.
    pub fn to_frame(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec(self).expect("a stream event always serializes");
        out.extend_from_slice(wire::EVENT_SEPARATOR);
        out
    }
}

/// The current time in Unix milliseconds.
pub fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis().min(i64::MAX as u128) as i64)
        .unwrap_or(0)
}

/// `error` of a [`ServerStreamEvent`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventError {
    /// Error name; upstream commands use `CommandExecError`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub ename: String,
    /// Error value: for a command that ran, its exit code as decimal text.
    #[serde(default, deserialize_with = "null_as_default")]
    pub evalue: String,
    /// Trace lines. Upstream Go sends `null` for none; a single string is accepted too (the SDK
    /// normalizes both).
    #[serde(default, deserialize_with = "lenient_lines")]
    pub traceback: Vec<String>,
}

impl EventError {
    /// The exit code carried in `evalue`, if it is an integer (the SDK does `int(evalue)`).
    pub fn exit_code(&self) -> Option<i32> {
        self.evalue.trim().parse().ok()
    }
}

pub(super) fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

pub(super) fn lenient_lines<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(match v {
        serde_json::Value::Null => Vec::new(),
        serde_json::Value::Array(items) => items
            .into_iter()
            .map(|i| match i {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            })
            .collect(),
        serde_json::Value::String(s) => vec![s],
        other => vec![other.to_string()],
    })
}

/// Body of `GET /command/status/{id}` (`CommandStatusResponse`).
///
/// Times are RFC 3339 text as sent (upstream: Go's `time.Time`); they are kept as text so that
/// nothing is lost in a round trip.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandStatus {
    /// Command id.
    #[serde(default, deserialize_with = "null_as_default")]
    pub id: String,
    /// The command text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Whether it still runs.
    #[serde(default, deserialize_with = "null_as_default")]
    pub running: bool,
    /// Exit code once finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Start time, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// Finish time, RFC 3339; absent while running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

/// Answer of `GET /command/{id}/logs`: the text body and the `EXECD-COMMANDS-TAIL-CURSOR` header.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandLogs {
    /// Combined stdout and stderr after the requested cursor.
    pub content: String,
    /// Cursor for the next call; `None` when the header was missing or not a number.
    pub cursor: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn run_command_request_serializes_like_the_sdk() {
        let r = RunCommandRequest::shell("ls").cwd("/w");
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"command": "ls", "cwd": "/w"})
        );
        let r = RunCommandRequest::shell("sleep 9")
            .background(true)
            .timeout(Duration::from_secs(2))
            .env("A", "1");
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"command": "sleep 9", "background": true, "timeout": 2000, "envs": {"A": "1"}})
        );
        let r = RunCommandRequest::argv(["python3", "-c", "print(1)"]);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"argv": ["python3", "-c", "print(1)"]})
        );
    }

    #[test]
    fn run_command_request_validation() {
        assert!(RunCommandRequest::shell("true").validate().is_ok());
        assert!(RunCommandRequest::shell("  ").validate().is_err());
        assert!(RunCommandRequest::default().validate().is_err());
        assert!(RunCommandRequest::argv([""]).validate().is_err());
        assert!(RunCommandRequest::argv(["a\0"]).validate().is_err());
        let mut r = RunCommandRequest::shell("x");
        r.gid = Some(1);
        assert!(r.validate().is_err());
    }

    #[test]
    fn events_read_upstream_shapes() {
        let e: ServerStreamEvent = serde_json::from_str(
            r#"{"type":"error","timestamp":1,"error":{"ename":"CommandExecError","evalue":"3","traceback":null}}"#,
        )
        .unwrap();
        assert!(e.is_terminal());
        let err = e.error.unwrap();
        assert_eq!(err.exit_code(), Some(3));
        assert!(err.traceback.is_empty());

        let e: ServerStreamEvent =
            serde_json::from_str(r#"{"type":"fancy","eid":4,"text":null}"#).unwrap();
        assert_eq!(e.kind, EventType::Other("fancy".into()));
        assert_eq!(e.text, None);

        let err: EventError =
            serde_json::from_str(r#"{"ename":null,"evalue":"x","traceback":"one"}"#).unwrap();
        assert_eq!(err.traceback, vec!["one".to_string()]);
        assert_eq!(err.exit_code(), None);
    }

    #[test]
    fn event_constructors_always_stamp_and_frame_as_upstream() {
        let e = ServerStreamEvent::exit_error(2, vec![]);
        let frame = e.to_frame();
        assert!(frame.ends_with(b"}\n\n"));
        let v: serde_json::Value = serde_json::from_slice(&frame).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["evalue"], "2");
        assert!(v["timestamp"].is_i64());
        let c = ServerStreamEvent::execution_complete(Duration::from_millis(15));
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["execution_time"], 15);
    }

    #[test]
    fn modes_are_octal_digits() {
        assert_eq!(mode_to_wire(0o755), 755);
        assert_eq!(mode_to_wire(0o4750), 4750);
        assert_eq!(mode_from_wire(644), Some(0o644));
        assert_eq!(mode_from_wire(800), None);
    }

    #[test]
    fn file_info_and_friends() {
        let f: FileInfo = serde_json::from_value(json!({
            "path": "/w/a", "type": "weird", "size": 3, "modified_at": "2025-01-01T00:00:00Z",
            "created_at": "2025-01-01T00:00:00Z", "owner": "u", "group": "g", "mode": 644
        }))
        .unwrap();
        assert_eq!(f.kind, Some(FileType::Other));
        assert_eq!(
            serde_json::to_value(FileMetadata::new("/w/a")).unwrap(),
            json!({"path": "/w/a", "owner": null, "group": null, "mode": 755})
        );
        assert_eq!(
            serde_json::to_value(Permission::mode(700)).unwrap(),
            json!({"mode": 700})
        );
        let r: ReplaceFileContentResult = serde_json::from_str(r#"{"replacedCount":2}"#).unwrap();
        assert_eq!(r.replaced_count, 2);
        let e: ErrorResponse = serde_json::from_str(r#"{"error":"Unauthorized"}"#).unwrap();
        assert_eq!(e.error, "Unauthorized");
        let s: CommandStatus = serde_json::from_str(
            r#"{"id":"c1","running":false,"exit_code":0,"started_at":"2025-12-22T09:08:05Z"}"#,
        )
        .unwrap();
        assert_eq!(s.exit_code, Some(0));
    }
}
