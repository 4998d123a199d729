//! sessionbox's background-command extension of the execd API.
//!
//! Upstream's background commands keep one combined log (`GET /command/{id}/logs`), cannot be
//! listed, and report neither the signal that ended them nor how much they wrote. A sessionbox
//! agent also serves these routes, over the same registry of commands as `POST /command`:
//!
//! | Route | Answer |
//! |---|---|
//! | `POST /sessionbox/v1/commands` (a [`RunCommandRequest`]; `background` is implied) | 201, [`BackgroundCommand`] |
//! | `GET /sessionbox/v1/commands` | 200, `[BackgroundCommand]`, oldest first |
//! | `GET /sessionbox/v1/commands/{id}` | 200, [`BackgroundCommand`] |
//! | `GET /sessionbox/v1/commands/{id}/output?stdout=N&stderr=M&max_bytes=B&wait_ms=W` | 200, [`OutputResponse`] |
//! | `DELETE /sessionbox/v1/commands/{id}` | 200, [`BackgroundCommand`] once it has ended |
//! | `POST /sessionbox/v1/commands/{id}/stdin` (raw bytes, at most [`MAX_STDIN_BYTES`](sessionbox_core::MAX_STDIN_BYTES)) | 200, [`StdinWrite`] |
//! | `DELETE /sessionbox/v1/commands/{id}/stdin` | 204: closed (also when it was) |
//!
//! `stdin` takes writes for a command started with `keep_stdin_open` (409 `conflict` for one
//! that was not, whose stdin is closed, or that has ended): as much as the command reads within
//! [`STDIN_WRITE_WAIT`](sessionbox_core::STDIN_WRITE_WAIT), answered in `written`, with
//! `timed_out` when the rest was not taken.
//!
//! `output` answers the bytes of each stream from its offset (at most `max_bytes` of each,
//! default and most [`MAX_OUTPUT_CHUNK`](sessionbox_core::MAX_OUTPUT_CHUNK)), base64 in JSON; when there is nothing past both
//! offsets and the command runs, it waits up to `wait_ms` (at most [`MAX_OUTPUT_WAIT`](sessionbox_core::MAX_OUTPUT_WAIT)) for new
//! output or the end. An offset past the bytes kept so far is refused (`invalid_request`).
//! Errors are
//! [`ErrorResponse`](crate::types::ErrorResponse)s whose `code` is
//! [`FS_ERROR_PREFIX`](crate::fs_ext::FS_ERROR_PREFIX) and a [`sessionbox_core::Error::code`]
//! (`busy` with 429 past the agent's limit of running background commands, `not_found` with
//! 404), so the caller rebuilds the same typed error.

use serde::{Deserialize, Serialize};
#[cfg(doc)]
use sessionbox_core::StdinWrite;
use sessionbox_core::{BackgroundCommand, CommandOutput, ExecRequest};

use crate::RunCommandRequest;

/// The extension's collection route.
pub const COMMANDS_PATH: &str = "/sessionbox/v1/commands";

/// Query names of the output route.
pub mod output_query {
    /// Bytes of stdout already read.
    pub const STDOUT: &str = "stdout";
    /// Bytes of stderr already read.
    pub const STDERR: &str = "stderr";
    /// Most bytes answered of each stream.
    pub const MAX_BYTES: &str = "max_bytes";
    /// Milliseconds to wait for something new.
    pub const WAIT_MS: &str = "wait_ms";
}

/// `/sessionbox/v1/commands/{id}`.
pub fn command_path(id: &str) -> String {
    format!("{COMMANDS_PATH}/{id}")
}

/// `/sessionbox/v1/commands/{id}/stdin`.
pub fn stdin_path(id: &str) -> String {
    format!("{COMMANDS_PATH}/{id}/stdin")
}

/// `/sessionbox/v1/commands/{id}/output`.
pub fn output_path(id: &str) -> String {
    format!("{COMMANDS_PATH}/{id}/output")
}

/// The answer of the output route: [`CommandOutput`] with the bytes in base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputResponse {
    /// The command's status when the output was read.
    pub command: BackgroundCommand,
    /// Where `stdout` starts.
    pub stdout_offset: u64,
    /// stdout from `stdout_offset` on (base64, standard alphabet, padded).
    #[serde(with = "crate::b64::bytes")]
    pub stdout: Vec<u8>,
    /// Where `stderr` starts.
    pub stderr_offset: u64,
    /// stderr from `stderr_offset` on (base64).
    #[serde(with = "crate::b64::bytes")]
    pub stderr: Vec<u8>,
}

impl From<CommandOutput> for OutputResponse {
    fn from(o: CommandOutput) -> Self {
        OutputResponse {
            command: o.command,
            stdout_offset: o.stdout_offset,
            stdout: o.stdout,
            stderr_offset: o.stderr_offset,
            stderr: o.stderr,
        }
    }
}

impl From<OutputResponse> for CommandOutput {
    fn from(o: OutputResponse) -> Self {
        CommandOutput {
            command: o.command,
            stdout_offset: o.stdout_offset,
            stdout: o.stdout,
            stderr_offset: o.stderr_offset,
            stderr: o.stderr,
        }
    }
}

/// The wire request for `request`, whose working directory the caller has already checked and
/// presented (`cwd`): shell, timeout, output cap, environment, stdin.
pub fn run_request(request: &ExecRequest, cwd: String) -> RunCommandRequest {
    let mut run = RunCommandRequest::shell(request.command.clone())
        .cwd(cwd)
        .timeout(request.timeout)
        .max_output_bytes(request.output_limit as u64)
        .background(true);
    for (k, v) in &request.env {
        run = run.env(k, v);
    }
    if let Some(stdin) = &request.stdin {
        run = run.stdin(stdin.clone());
    }
    run.keep_stdin_open = request.keep_stdin_open;
    run
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn output_round_trips_with_exact_bytes() {
        let mut c = BackgroundCommand::started("ab12", "x", 5);
        c.status = Some(sessionbox_core::ExitStatus::Signal(9));
        let o = OutputResponse {
            command: c,
            stdout_offset: 3,
            stdout: vec![0, 0xff, b'\n', 0xe2, 0x82],
            stderr_offset: 0,
            stderr: vec![],
        };
        let json = serde_json::to_string(&o).unwrap();
        assert!(json.contains(r#""stdout":"AP8K4oI=""#), "{json}");
        assert!(json.contains(r#""status":{"signal":9}"#), "{json}");
        let back: OutputResponse = serde_json::from_str(&json).unwrap();
        assert_eq!(back, o);
        let core: CommandOutput = back.into();
        assert_eq!(core.stdout_next(), 8);
    }

    #[test]
    fn the_wire_request_is_background_and_keeps_everything() {
        let r = ExecRequest::new("echo hi")
            .env("A", "b")
            .stdin(b"in".to_vec())
            .output_limit(7)
            .timeout(Duration::from_secs(9));
        let w = run_request(&r, "/workspace/sub".into());
        assert!(w.background);
        assert_eq!(w.cwd.as_deref(), Some("/workspace/sub"));
        assert_eq!(w.timeout_ms, Some(9000));
        assert_eq!(w.max_output_bytes, Some(7));
        assert_eq!(w.stdin.as_deref(), Some(&b"in"[..]));
        assert_eq!(w.envs.unwrap()["A"], "b");
        assert_eq!(command_path("ab"), "/sessionbox/v1/commands/ab");
    }
}
