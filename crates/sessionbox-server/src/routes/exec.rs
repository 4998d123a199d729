//! `POST /v1/conversations/{id}/exec`: a command, answered as JSON, as an event stream, or in
//! the background; and the event-stream plumbing the command logs share.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use sessionbox_core::{
    BackgroundCommand, ConversationRef, Error, ExecRequest, ExecResult, Operation, OutputStream,
    Session,
};
use tokio::sync::mpsc;

use super::on_conversation;
use crate::AppState;
use crate::auth::Principal;
use crate::budget::Reservation;
use crate::commands::{self, CommandView};
use crate::conversation::{Opened, notify_expired};
use crate::error::ApiError;
use crate::extract::{JsonBody, PathArgs};
use crate::output::{OutputText, Utf8Chunker};
use crate::views::{ErrorBody, ExitStatusView};

/// `POST /v1/conversations/{id}/exec`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecBody {
    /// The command line, run as `/bin/sh -c COMMAND`.
    command: String,
    /// Working directory, a workspace path; default the workspace root.
    #[serde(default)]
    cwd: Option<String>,
    /// Variables added to the base environment.
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// 1-600000; default 120000.
    #[serde(default)]
    timeout_ms: Option<u64>,
    /// Text for stdin.
    #[serde(default)]
    stdin: Option<String>,
    /// Bytes for stdin, base64 (standard alphabet, padded).
    #[serde(default)]
    stdin_base64: Option<String>,
    /// Cap on each of stdout and stderr, in bytes (1-16777216; default 1048576).
    #[serde(default)]
    output_limit: Option<usize>,
    /// Run in the background: answer 202 with a command id at once (see
    /// `.../commands/{cmd}`). The command does not hold the conversation's turn.
    #[serde(default)]
    background: bool,
    /// With `background`: keep the command's stdin open, written with `POST
    /// .../commands/{cmd}/stdin` and closed with `DELETE .../commands/{cmd}/stdin` (runtimes
    /// `isolated` and `opensandbox`). Not with `stdin` or `stdin_base64`.
    #[serde(default)]
    keep_stdin_open: bool,
}

/// What a command did. `stdout`/`stderr` are text (invalid UTF-8 replaced by U+FFFD); when the
/// bytes were not valid UTF-8, `stdout_base64`/`stderr_base64` hold them exactly.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ExecResult)]
pub(crate) struct ExecView {
    /// As a shell reports it: the code, 128 + signal, 124 after a timeout.
    exit_code: i32,
    status: ExitStatusView,
    stdout: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    stdout_base64: Option<String>,
    stderr: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    stderr_base64: Option<String>,
    stdout_truncated: bool,
    stderr_truncated: bool,
    timed_out: bool,
    duration_ms: u64,
    /// Set when this request created the conversation because the last one of its id expired:
    /// when that one expired. Its files are gone; this one started empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_expired_at: Option<DateTime<Utc>>,
}

impl ExecView {
    /// The view of `result`, which it consumes (its output is moved, not copied, when it is
    /// text).
    fn of(mut result: ExecResult, previous_expired_at: Option<DateTime<Utc>>) -> Self {
        let stdout = OutputText::from_vec(std::mem::take(&mut result.stdout));
        let stderr = OutputText::from_vec(std::mem::take(&mut result.stderr));
        ExecView {
            exit_code: result.shell_exit_code(),
            status: result.status.into(),
            stdout: stdout.text,
            stdout_base64: stdout.base64,
            stderr: stderr.text,
            stderr_base64: stderr.base64,
            stdout_truncated: result.stdout_truncated,
            stderr_truncated: result.stderr_truncated,
            timed_out: result.timed_out,
            duration_ms: millis(result.duration),
            previous_expired_at,
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// How a streamed command ended: the `exit` event's data.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ExecExit {
    /// As a shell reports it: the code, 128 + signal, 124 after a timeout.
    exit_code: i32,
    status: ExitStatusView,
    /// True when stdout went past the output limit and the rest was discarded.
    stdout_truncated: bool,
    /// True when stderr went past the output limit and the rest was discarded.
    stderr_truncated: bool,
    /// True when the timeout ended it.
    timed_out: bool,
    /// Wall time from spawn to the end of its output, in milliseconds.
    duration_ms: u64,
}

impl From<&ExecResult> for ExecExit {
    fn from(result: &ExecResult) -> Self {
        ExecExit {
            exit_code: result.shell_exit_code(),
            status: result.status.into(),
            stdout_truncated: result.stdout_truncated,
            stderr_truncated: result.stderr_truncated,
            timed_out: result.timed_out,
            duration_ms: millis(result.duration),
        }
    }
}

fn exec_request(
    state: &AppState,
    conv: &ConversationRef,
    body: ExecBody,
) -> Result<ExecRequest, Error> {
    let mut request = ExecRequest::new(body.command);
    if let Some(cwd) = body.cwd {
        state.manager.check_path(conv, &cwd)?;
        request.cwd = Some(cwd);
    }
    request.env = body.env;
    if let Some(ms) = body.timeout_ms {
        request.timeout = Duration::from_millis(ms);
    }
    if let Some(limit) = body.output_limit {
        request.output_limit = limit;
    }
    request.stdin = match (body.stdin, body.stdin_base64) {
        (Some(_), Some(_)) => {
            return Err(Error::InvalidRequest(
                "give stdin or stdin_base64, not both".into(),
            ));
        }
        (Some(text), None) => Some(text.into_bytes()),
        (None, Some(encoded)) => Some(
            BASE64
                .decode(encoded.as_bytes())
                .map_err(|e| Error::InvalidRequest(format!("stdin_base64 is not base64: {e}")))?,
        ),
        (None, None) => None,
    };
    if body.keep_stdin_open && !body.background {
        return Err(Error::InvalidRequest(
            "keep_stdin_open needs background: true (a foreground command's stdin is stdin or \
             stdin_base64)"
                .into(),
        ));
    }
    request.keep_stdin_open = body.keep_stdin_open;
    request.validate()?;
    Ok(request)
}

/// Runs a shell command in the conversation's workspace (creating the conversation).
///
/// Three ways to get its result:
/// - JSON (default): `200` with the whole result once the command has ended.
/// - `Accept: text/event-stream`: `200` with server-sent events as the command runs: `stdout`
///   and `stderr` (data: `OutputText`, chunks in the order written, never split inside a
///   character), then one `exit` (data: `ExecExit`), or one `error` (data: `Error`) when it
///   could not run. Closing the stream kills the command.
/// - `"background": true`: `202` with the command's status (`BackgroundCommand`) at once; poll
///   `.../commands/{cmd}` and `.../commands/{cmd}/logs`, kill with `DELETE .../commands/{cmd}`.
#[utoipa::path(post, path = "/v1/conversations/{id}/exec", tag = "exec", params(("id" = String, Path, description = "conversation id"),
           ("Accept" = Option<String>, Header, description = "text/event-stream: stream the output as server-sent events")),
    request_body = ExecBody,
    responses((status = 200, description = "the command ran (whatever its exit code); with Accept: text/event-stream, the events `stdout`/`stderr` (OutputText), `exit` (ExecExit) or `error` (Error)",
               content((ExecView = "application/json"), (String = "text/event-stream"))),
              (status = 202, description = "started in the background", body = CommandView),
              (status = 400, description = "invalid input", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 404, description = "no such conversation or file", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large, or output_limit so large that its output (2 × output_limit) is above an output budget", body = ErrorBody),
              (status = 422, description = "JSON of the wrong shape", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full, too many background commands run in it, or the tenant's or the server's output budget is reserved (`[serve] max_output_bytes_per_tenant`, `max_output_bytes_total`; the message names the limit)", body = ErrorBody)))]
pub(crate) async fn exec(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<ExecBody>,
) -> Response {
    let background = body.background;
    let stream = !background && wants_event_stream(&headers);
    on_conversation(&principal, "exec", &id, async |conv| {
        let request = exec_request(&state, &conv, body)?;
        // The output's budget first: a refusal opens and creates nothing.
        let reservation = state.budget.reserve(&conv.tenant, request.output_limit)?;
        if stream {
            let opened = state.open(&conv, Operation::Exec).await?;
            // Bad input is a JSON error, as without the stream: a missing working directory is
            // known before the first event is sent.
            if let Some(cwd) = &request.cwd {
                let st = opened.conv.stat(cwd).await?;
                if st.kind != sessionbox_core::FileKind::Directory {
                    return Err(Error::InvalidRequest(format!(
                        "the working directory {cwd:?} is not a directory"
                    ))
                    .into());
                }
            }
            state.metrics.execs.with_label_values(&["stream"]).inc();
            let previous_expired_at = opened.previous_expired_at();
            return Ok(notify_expired(
                event_stream(opened, request, reservation),
                previous_expired_at,
            ));
        }
        let operation = if background {
            Operation::Spawn
        } else {
            Operation::Exec
        };
        let (ran, previous_expired_at) = state
            .with_conversation(&conv, operation, async |opened| {
                let ran = if background {
                    state.metrics.execs.with_label_values(&["background"]).inc();
                    // The runtime owns the command from here; it does not hold the turn.
                    Ran::Background(opened.conv.spawn(request).await)
                } else {
                    state.metrics.execs.with_label_values(&["json"]).inc();
                    Ran::Finished(opened.conv.exec(request).await)
                };
                (ran, opened.previous_expired_at())
            })
            .await?;
        let response = match ran {
            Ran::Background(command) => {
                let command = command?;
                commands::started(&state, &conv, &command, reservation);
                (StatusCode::ACCEPTED, Json(CommandView::from(&command))).into_response()
            }
            Ran::Finished(result) => {
                // The output stays counted until the client has taken the answer.
                crate::budget::held_json(
                    &state.budget,
                    &conv.tenant,
                    &ExecView::of(result?, previous_expired_at),
                    Some(reservation),
                )
            }
        };
        Ok(notify_expired(response, previous_expired_at))
    })
    .await
}

/// What a JSON or background exec got from the runtime.
enum Ran {
    Background(sessionbox_core::Result<BackgroundCommand>),
    Finished(sessionbox_core::Result<ExecResult>),
}

/// True when the client asked for server-sent events.
pub(crate) fn wants_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|media| {
            media
                .split(';')
                .next()
                .is_some_and(|kind| kind.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

/// How often an exec event stream carries a `: keepalive` comment while nothing else is sent.
pub(crate) const SSE_KEEPALIVE: Duration = Duration::from_secs(5);

/// `events` as a server-sent event stream, with a `: keepalive`
/// comment every [`SSE_KEEPALIVE`] while the command is quiet (for proxies in front of the
/// server that give up on a silent response; the OpenSandbox server's own waits 180 s).
pub(crate) fn sse_response(events: impl Stream<Item = Event> + Send + 'static) -> Response {
    let events = events.map(Ok::<_, Infallible>);
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(SSE_KEEPALIVE).text("keepalive"))
        .into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// An event named `name` with `data` as JSON (none when `data` does not serialise).
pub(crate) fn event(name: &str, data: impl Serialize) -> Option<Event> {
    Event::default().event(name).json_data(data).ok()
}

/// The data of an `error` event.
pub(crate) fn error_event(error: Error) -> Option<Event> {
    let error = ApiError::from(error);
    event(
        "error",
        ErrorBody {
            code: error.code.to_owned(),
            message: error.message,
        },
    )
}

/// Runs the command of `opened` in a task that sends its output as server-sent events; the
/// turn and `reservation` (the output's budget) are held until the command ends. When the client goes away, the exec future is dropped,
/// which kills the command's process group.
fn event_stream(opened: Opened, request: ExecRequest, reservation: Reservation) -> Response {
    let (sender, receiver) = mpsc::unbounded_channel::<Event>();
    tokio::spawn(async move {
        // Held until the command has ended and its last event is queued.
        let _reservation = reservation;
        let send = |sender: &mpsc::UnboundedSender<Event>, event: Option<Event>| {
            if let Some(event) = event {
                let _ = sender.send(event);
            }
        };
        let mut chunkers = [Utf8Chunker::default(), Utf8Chunker::default()];
        let names = ["stdout", "stderr"];
        let outcome = {
            let sink_sender = sender.clone();
            let chunkers = &mut chunkers;
            // Memory stays bounded: the runtime hands over at most `output_limit` bytes of
            // each stream (16 MiB at most), whatever the client's pace.
            let mut sink = move |stream: OutputStream, bytes: &[u8]| {
                let i = stream as usize;
                if let Some(text) = chunkers[i].push(bytes) {
                    send(&sink_sender, event(names[i], text));
                }
            };
            let run = opened.conv.exec_stream(request, &mut sink);
            tokio::select! {
                result = run => Some(result),
                () = sender.closed() => None,
            }
        };
        for (i, chunker) in chunkers.iter_mut().enumerate() {
            if let Some(text) = chunker.finish() {
                send(&sender, event(names[i], text));
            }
        }
        match outcome {
            Some(Ok(result)) => send(&sender, event("exit", ExecExit::from(&result))),
            Some(Err(error)) => send(&sender, error_event(error)),
            None => tracing::debug!("the client closed the event stream; the command was killed"),
        }
        // The session is kept and the turn given back before the stream ends.
        opened.finish().await;
        drop(sender);
    });
    sse_response(futures::stream::unfold(
        receiver,
        |mut receiver| async move { receiver.recv().await.map(|event| (event, receiver)) },
    ))
}
