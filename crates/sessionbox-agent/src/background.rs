//! Background commands: what the agent keeps of them, and sessionbox's extension routes
//! (see [`sessionbox_execd::commands_ext`]) to start, list, read, follow and kill them, and to
//! write to and close the stdin of one started with `keep_stdin_open`.
//!
//! A background command started by either route (`POST /command` with `background: true`, as
//! upstream, or `POST /sessionbox/v1/commands`) lives in the agent's registry, runs until it
//! ends or its timeout, and keeps its stdout and stderr apart, each up to its output cap, in a
//! [`Log`] that also remembers the order in which pieces were read: upstream's combined log
//! (`GET /command/{id}/logs`, a byte cursor into both streams interleaved) is rebuilt from it,
//! so upstream clients see what they always saw.
//!
//! Bounds: at most [`MAX_RUNNING_COMMANDS`] background commands run at once (one more is
//! refused with 429, on both routes); finished commands are forgotten oldest first past the
//! registry's count or past [`MAX_FINISHED_BYTES`] of output kept together.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sessionbox_core::{
    BackgroundCommand, CommandOutput, Error, ExitStatus, MAX_OUTPUT_CHUNK, MAX_RUNNING_COMMANDS,
    MAX_STDIN_BYTES, OutputRequest, STDIN_WRITE_WAIT,
};
use sessionbox_execd::RunCommandRequest;
use sessionbox_execd::commands_ext::{OutputResponse, output_query};
use sessionbox_execd::fs_ext::FS_ERROR_PREFIX;
use sessionbox_process::LiveStdin;
use tokio::sync::Notify;

use crate::commands::{Command, CommandState, build_exec};
use crate::fs_ext::typed_error;
use crate::server::{ApiError, AppState, json_body, query_one, query_pairs};

/// Most bytes of output the finished background commands keep together (64 MiB); past it the
/// oldest finished ones are forgotten.
pub(crate) const MAX_FINISHED_BYTES: usize = 64 * 1024 * 1024;

/// How long a kill waits for the killed command to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(15);

/// A background command's output: both streams apart, and the order their pieces were read.
#[derive(Default)]
pub(crate) struct Log {
    streams: [Vec<u8>; 2],
    /// Runs of one stream in the order read (adjacent runs of a stream merged): rebuilds the
    /// combined log of upstream's route.
    runs: Vec<(usize, usize)>,
    truncated: [bool; 2],
    changed: Arc<Notify>,
}

impl Log {
    /// Appends `data` to stream `i` (0 stdout, 1 stderr); `truncated` says the stream went past
    /// its cap. Wakes whoever waits for output.
    pub(crate) fn push(&mut self, i: usize, data: &[u8], truncated: bool) {
        self.streams[i].extend_from_slice(data);
        self.truncated[i] |= truncated;
        match self.runs.last_mut() {
            Some((s, n)) if *s == i => *n += data.len(),
            _ => self.runs.push((i, data.len())),
        }
        self.wake();
    }

    /// Wakes whoever waits for output or for the end.
    pub(crate) fn wake(&self) {
        self.changed.notify_waiters();
    }

    /// Bytes kept of both streams together.
    pub(crate) fn len(&self) -> usize {
        self.streams[0].len() + self.streams[1].len()
    }

    /// Upstream's combined log from byte `cursor` on (empty past its end).
    pub(crate) fn combined_from(&self, cursor: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len().saturating_sub(cursor));
        let (mut at, mut pos) = (0usize, [0usize; 2]);
        for &(i, n) in &self.runs {
            let run = &self.streams[i][pos[i]..pos[i] + n];
            pos[i] += n;
            if at + n > cursor {
                out.extend_from_slice(&run[cursor.saturating_sub(at)..]);
            }
            at += n;
        }
        out
    }
}

/// 429 past the limit of running background commands.
pub(crate) fn too_many(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        busy_code(),
        format!(
            "{limit} background commands already run in this sandbox; wait for one to end or \
             kill one (finished commands do not count)"
        ),
    )
}

/// `SESSIONBOX::busy`, built from the shared prefix.
fn busy_code() -> &'static str {
    const CODE: &str = "SESSIONBOX::busy";
    debug_assert!(CODE.starts_with(FS_ERROR_PREFIX));
    CODE
}

fn millis(t: chrono::DateTime<chrono::Utc>) -> u64 {
    u64::try_from(t.timestamp_millis()).unwrap_or(0)
}

/// The command's status as the extension reports it.
fn status_of(cmd: &Command, st: &CommandState) -> BackgroundCommand {
    let end = st.end.unwrap_or_default();
    let status = if st.running {
        None
    } else {
        match (end.signal, st.exit_code) {
            (Some(s), _) => Some(ExitStatus::Signal(s)),
            (None, Some(c)) => Some(ExitStatus::Code(c)),
            (None, None) => None,
        }
    };
    BackgroundCommand {
        id: cmd.id.clone(),
        command: cmd.content.clone(),
        running: st.running,
        status,
        timed_out: end.timed_out,
        killed: end.interrupted,
        started_at_ms: millis(cmd.started_at),
        finished_at_ms: st.finished_at.map(millis),
        stdout_bytes: st.log.streams[0].len() as u64,
        stderr_bytes: st.log.streams[1].len() as u64,
        stdout_truncated: st.log.truncated[0] || end.stdout_truncated,
        stderr_truncated: st.log.truncated[1] || end.stderr_truncated,
        // A start failure; an interrupt or timeout is said by `killed` and `timed_out`.
        error: st.error.clone().filter(|_| st.exit_code.is_none()),
    }
}

fn status(cmd: &Command) -> BackgroundCommand {
    status_of(cmd, &cmd.lock())
}

/// The background command `id`, or a typed 404.
fn find(state: &AppState, id: &str) -> Result<Arc<Command>, Error> {
    state
        .commands
        .get(id)
        .filter(|c| c.background)
        .ok_or_else(|| {
            Error::NotFound(format!(
                "no background command {id:?} (a sandbox's background commands end with its \
                 agent: one that stopped, idle or killed, took them with it; finished ones are \
                 forgotten past a bound)"
            ))
        })
}

/// Waits until `done` holds for the command's state, or `deadline`; returns what `answer`
/// makes of the state then.
async fn wait_for<T>(
    cmd: &Command,
    deadline: tokio::time::Instant,
    done: impl Fn(&CommandState) -> bool,
    answer: impl Fn(&CommandState) -> T,
) -> T {
    loop {
        let changed = cmd.lock().log.changed.clone();
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let st = cmd.lock();
            if done(&st) || tokio::time::Instant::now() >= deadline {
                return answer(&st);
            }
        }
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// `POST /sessionbox/v1/commands`: starts a background command; 201 with its status.
pub(crate) async fn spawn(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let started = async {
        let mut request: RunCommandRequest = json_body(&state, req).await?;
        request.background = true;
        let (exec, cwd) = build_exec(&state, &request)?;
        let cmd = Command::background(&exec.command, exec.keep_stdin_open);
        state
            .commands
            .insert_background(cmd.clone(), MAX_RUNNING_COMMANDS)?;
        tracing::debug!(id = %cmd.id, "background command started");
        crate::commands::spawn_background(&state, cmd.clone(), exec, cwd);
        Ok::<_, ApiError>(cmd)
    }
    .await;
    match started {
        Ok(cmd) => (StatusCode::CREATED, axum::Json(status(&cmd))).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /sessionbox/v1/commands`.
pub(crate) async fn list(State(state): State<Arc<AppState>>) -> Response {
    let all: Vec<BackgroundCommand> = state
        .commands
        .background_commands()
        .iter()
        .map(|c| status(c))
        .collect();
    axum::Json(all).into_response()
}

/// `GET /sessionbox/v1/commands/{id}`.
pub(crate) async fn get(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match find(&state, &id) {
        Ok(cmd) => axum::Json(status(&cmd)).into_response(),
        Err(e) => typed_error(&e),
    }
}

/// `DELETE /sessionbox/v1/commands/{id}`: kills it and answers once it has ended (at once
/// when it had).
pub(crate) async fn kill(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    let cmd = match find(&state, &id) {
        Ok(c) => c,
        Err(e) => return typed_error(&e),
    };
    cmd.interrupt("killed through the sessionbox commands extension");
    let deadline = tokio::time::Instant::now() + KILL_WAIT;
    let now = wait_for(&cmd, deadline, |st| !st.running, |st| status_of(&cmd, st)).await;
    axum::Json(now).into_response()
}

/// The live stdin of background command `id`, or a typed 404 or 409.
fn stdin_of(state: &AppState, id: &str) -> Result<(Arc<Command>, LiveStdin), Error> {
    let cmd = find(state, id)?;
    let stdin = cmd.stdin.clone().ok_or_else(|| {
        Error::Conflict(format!(
            "background command {id} was not started with its stdin kept open \
             (keep_stdin_open)"
        ))
    })?;
    Ok((cmd, stdin))
}

/// `POST /sessionbox/v1/commands/{id}/stdin`: writes the raw body (at most
/// [`MAX_STDIN_BYTES`]) to the command's stdin, as much as it reads within
/// [`STDIN_WRITE_WAIT`].
pub(crate) async fn write_stdin(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    let (_cmd, stdin) = match stdin_of(&state, &id) {
        Ok(s) => s,
        Err(e) => return typed_error(&e),
    };
    let data = match crate::server::read_body(req, MAX_STDIN_BYTES).await {
        Ok(d) => d,
        Err(e) if e.status == StatusCode::PAYLOAD_TOO_LARGE => {
            return typed_error(&Error::TooLarge {
                what: "a write to stdin".into(),
                limit: MAX_STDIN_BYTES as u64,
            });
        }
        Err(e) => return typed_error(&Error::InvalidRequest(e.message)),
    };
    match stdin.write(&data, STDIN_WRITE_WAIT).await {
        Ok(w) => {
            state.activity.touch();
            axum::Json(w).into_response()
        }
        Err(e) => typed_error(&e),
    }
}

/// `DELETE /sessionbox/v1/commands/{id}/stdin`: closes it; 204 (also when it was closed or
/// the command has ended).
pub(crate) async fn close_stdin(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Response {
    match stdin_of(&state, &id) {
        Ok((_cmd, stdin)) => {
            stdin.close().await;
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => typed_error(&e),
    }
}

/// Reads an optional unsigned number from the query; a typed 400 when it is not one.
fn number(pairs: &[(String, String)], name: &str, default: u64) -> Result<u64, Error> {
    match query_one(pairs, name) {
        None => Ok(default),
        Some(v) => v.trim().parse().map_err(|_| {
            Error::InvalidRequest(format!(
                "query parameter {name} must be an unsigned number, not {v:?}"
            ))
        }),
    }
}

/// `GET /sessionbox/v1/commands/{id}/output?stdout=&stderr=&max_bytes=&wait_ms=`.
pub(crate) async fn output(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    let pairs = query_pairs(&req);
    let read = (|| {
        Ok::<_, Error>(OutputRequest {
            stdout_from: number(&pairs, output_query::STDOUT, 0)?,
            stderr_from: number(&pairs, output_query::STDERR, 0)?,
            max_bytes: usize::try_from(number(
                &pairs,
                output_query::MAX_BYTES,
                MAX_OUTPUT_CHUNK as u64,
            )?)
            .unwrap_or(usize::MAX),
            wait: Duration::from_millis(number(&pairs, output_query::WAIT_MS, 0)?),
        })
    })();
    let read = match read {
        Ok(r) => r,
        Err(e) => return typed_error(&e),
    };
    if let Err(e) = read.validate() {
        return typed_error(&e);
    }
    let cmd = match find(&state, &id) {
        Ok(c) => c,
        Err(e) => return typed_error(&e),
    };
    let from =
        [read.stdout_from, read.stderr_from].map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    {
        let st = cmd.lock();
        for (i, name) in ["stdout", "stderr"].into_iter().enumerate() {
            let len = st.log.streams[i].len();
            if from[i] > len {
                return typed_error(&Error::InvalidRequest(format!(
                    "{name} offset {} is past the {len} bytes written so far",
                    from[i]
                )));
            }
        }
    }
    let deadline = tokio::time::Instant::now() + read.wait;
    let out = wait_for(
        &cmd,
        deadline,
        |st| !st.running || (0..2).any(|i| st.log.streams[i].len() > from[i]),
        |st| {
            let piece = |i: usize| {
                let s = &st.log.streams[i];
                let start = from[i].min(s.len());
                let end = start.saturating_add(read.max_bytes).min(s.len());
                (start as u64, s[start..end].to_vec())
            };
            let ((stdout_offset, stdout), (stderr_offset, stderr)) = (piece(0), piece(1));
            CommandOutput {
                command: status_of(&cmd, st),
                stdout_offset,
                stdout,
                stderr_offset,
                stderr,
            }
        },
    )
    .await;
    axum::Json(OutputResponse::from(out)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_combined_log_is_rebuilt_in_the_order_read() {
        let mut log = Log::default();
        log.push(0, b"ab", false);
        log.push(1, b"XY", false);
        log.push(0, b"c", false);
        log.push(0, b"d", true);
        assert_eq!(log.len(), 6);
        assert_eq!(log.combined_from(0), b"abXYcd");
        for cut in 0..=7 {
            assert_eq!(log.combined_from(cut), b"abXYcd"[cut.min(6)..], "cut {cut}");
        }
        assert_eq!(log.streams, [b"abcd".to_vec(), b"XY".to_vec()]);
        assert_eq!(
            log.runs.len(),
            3,
            "adjacent pieces of one stream are merged"
        );
        assert!(log.truncated[0] && !log.truncated[1]);
    }
}
