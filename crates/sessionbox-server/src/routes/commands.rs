//! `/v1/conversations/{id}/commands`: background commands: list, status, logs (polled or
//! followed live), kill. None of them creates the conversation.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sessionbox_core::{BackgroundCommand, Operation, OutputRequest, Session};
use sessionbox_manager::Conversation;
use tokio::sync::mpsc;

use super::exec::{error_event, event, sse_response, wants_event_stream};
use super::on_conversation;
use crate::AppState;
use crate::auth::Principal;
use crate::commands::{CommandListView, CommandLogsView, CommandView, WaiterGuard};
use crate::error::ApiError;
use crate::extract::{PathArgs, QueryArgs};
use crate::output::Utf8Chunker;
use crate::views::{Binary, ErrorBody};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LogsQuery {
    #[serde(default)]
    stdout_offset: Option<u64>,
    #[serde(default)]
    stderr_offset: Option<u64>,
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// Most bytes of each stream one logs answer (or one event-stream step) carries.
const LOGS_CHUNK: usize = 1024 * 1024;
/// How long one step of a followed stream waits for output.
const FOLLOW_WAIT: Duration = Duration::from_secs(15);
/// Events a follower may have read ahead of its client.
const FOLLOW_BUFFER: usize = 4;

/// A logs answer counted in the tenant's output budget until the client has taken it (a
/// refusal costs nothing: the output stays in the command's logs to read again).
///
/// # Errors
/// `busy` when the budget has no room for the answer now.
fn held_logs(
    state: &AppState,
    conv: &sessionbox_core::ConversationRef,
    output: &sessionbox_core::CommandOutput,
) -> Result<Response, ApiError> {
    let data = serde_json::to_vec(&CommandLogsView::of(output))
        .map_err(sessionbox_core::Error::backend)?;
    let reservation = state.budget.reserve_body(&conv.tenant, data.len())?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        crate::budget::held_body(data, vec![reservation]),
    )
        .into_response())
}

/// Checks a command id before anything is opened.
fn command_id(cmd: &str) -> Result<(), ApiError> {
    Ok(sessionbox_core::validate_command_id(cmd)?)
}

/// Runs `act`, which is `operation`, on command `cmd` of conversation `id` (which must exist),
/// audited as `audit_name`, and answers the command as `act` left it.
async fn one_command(
    state: &AppState,
    principal: &Principal,
    (audit_name, operation): (&'static str, Operation),
    id: &str,
    cmd: &str,
    act: impl AsyncFnOnce(&Conversation) -> sessionbox_core::Result<BackgroundCommand>,
) -> Response {
    on_conversation(principal, audit_name, id, async |conv| {
        command_id(cmd)?;
        let command = state
            .with_conversation(&conv, operation, async |opened| act(opened.conv).await)
            .await??;
        state
            .commands
            .observe(state, &conv, std::slice::from_ref(&command));
        Ok(Json(CommandView::from(&command)).into_response())
    })
    .await
}

/// Lists a conversation's background commands: running ones and the most recent finished
/// ones, oldest first. They belong to the runtime that runs them, so a restarted server lists
/// the commands an earlier one started.
#[utoipa::path(get, path = "/v1/conversations/{id}/commands", tag = "exec",
    operation_id = "list_commands",
    params(("id" = String, Path, description = "conversation id")),
    responses((status = 200, body = CommandListView), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 404, description = "no such conversation", body = ErrorBody),
              (status = 503, description = "the runtime cannot run background commands", body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
) -> Response {
    on_conversation(&principal, "commands", &id, async |conv| {
        let all = state
            .with_conversation(&conv, Operation::Commands, async |opened| {
                opened.conv.commands().await
            })
            .await??;
        state.commands.observe(&state, &conv, &all);
        Ok(Json(CommandListView::of(&all)).into_response())
    })
    .await
}

/// A background command's status: running, or how it ended.
#[utoipa::path(get, path = "/v1/conversations/{id}/commands/{cmd}", tag = "exec",
    operation_id = "command_status",
    params(("id" = String, Path, description = "conversation id"), ("cmd" = String, Path, description = "command id from the 202 of exec")),
    responses((status = 200, body = CommandView), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 404, description = "no such conversation or command", body = ErrorBody)))]
pub(crate) async fn status(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs((id, cmd)): PathArgs<(String, String)>,
) -> Response {
    one_command(
        &state,
        &principal,
        ("command_status", Operation::CommandStatus),
        &id,
        &cmd,
        async |session| session.command(&cmd).await,
    )
    .await
}

/// A background command's output from byte offsets on, stdout and stderr apart.
///
/// - JSON (default): the output past the offsets (at most 1 MiB of each stream; poll again from
///   the `*_next_offset` of the answer). With `wait_ms` (at most 30000), waits that long for
///   new output or the end when there is none yet (a long poll).
/// - `Accept: text/event-stream`: follows the command live from the offsets: `stdout` and
///   `stderr` events (data: `OutputText`, never split inside a character) as the command
///   writes, then one `exit` event (data: `BackgroundCommand`) once it has ended and all its
///   output was sent, or one `error` (data: `Error`). Keepalive comments while it is quiet.
///   Closing the stream leaves the command running.
///
/// Neither holds the conversation's turn while it waits.
#[utoipa::path(get, path = "/v1/conversations/{id}/commands/{cmd}/logs", tag = "exec",
    operation_id = "command_logs",
    params(("id" = String, Path, description = "conversation id"), ("cmd" = String, Path, description = "command id"),
           ("stdout_offset" = Option<u64>, Query, description = "bytes of stdout already read; default 0"),
           ("stderr_offset" = Option<u64>, Query, description = "bytes of stderr already read; default 0"),
           ("wait_ms" = Option<u64>, Query, description = "JSON only: wait up to this long (at most 30000) for new output; default 0"),
           ("Accept" = Option<String>, Header, description = "text/event-stream: follow the output as server-sent events until the command ends")),
    responses((status = 200, description = "the output, or with Accept: text/event-stream the events `stdout`/`stderr` (OutputText), `exit` (BackgroundCommand) or `error` (Error)",
               content((CommandLogsView = "application/json"), (String = "text/event-stream"))),
              (status = 400, description = "invalid input", body = ErrorBody),
              (status = 404, description = "no such conversation or command", body = ErrorBody),
              (status = 422, description = "an unknown query parameter", body = ErrorBody),
              (status = 429, description = "too many requests already follow or wait on command output", body = ErrorBody)))]
pub(crate) async fn logs(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs((id, cmd)): PathArgs<(String, String)>,
    headers: HeaderMap,
    QueryArgs(query): QueryArgs<LogsQuery>,
) -> Response {
    let follow = wants_event_stream(&headers);
    on_conversation(&principal, "command_logs", &id, async |conv| {
        command_id(&cmd)?;
        let read = OutputRequest {
            stdout_from: query.stdout_offset.unwrap_or(0),
            stderr_from: query.stderr_offset.unwrap_or(0),
            max_bytes: LOGS_CHUNK,
            wait: Duration::from_millis(query.wait_ms.unwrap_or(0)),
        };
        read.validate()?;
        if follow && query.wait_ms.is_some() {
            return Err(ApiError::bad_request(
                "wait_ms is for JSON polls; an event stream follows the command by itself",
            ));
        }
        // Waiting requests hold no turn of the conversation: they are counted instead.
        let waiter = if follow || !read.wait.is_zero() {
            Some(state.waiters.enter(&conv.key)?)
        } else {
            None
        };
        let opened = state.open(&conv, Operation::CommandOutput).await?;
        // Check the command exists before answering 200 (an event stream cannot say 404).
        let first = match opened.conv.command(&cmd).await {
            Ok(command) => command,
            Err(error) => {
                opened.finish().await;
                return Err(error.into());
            }
        };
        state
            .commands
            .observe(&state, &conv, std::slice::from_ref(&first));
        if follow {
            return Ok(follow_command(opened.detach().await, cmd, read, waiter));
        }
        if read.wait.is_zero() {
            let output = opened.conv.command_output(&cmd, read).await;
            opened.finish().await;
            return held_logs(&state, &conv, &output?);
        }
        let session = opened.detach().await;
        let output = session.command_output(&cmd, read).await;
        let _ = Box::new(session).close().await;
        drop(waiter);
        held_logs(&state, &conv, &output?)
    })
    .await
}

/// Follows command `id` on `session` from the offsets of `from` as server-sent events, until it
/// has ended and its output was sent, or the client goes away; then closes the session and
/// gives `waiter`'s place back.
///
/// The output is read only as fast as the client takes it: the channel to the response holds
/// a few events, and the next read waits for room, so a slow follower costs the server at most
/// a few chunks.
fn follow_command(
    session: Conversation,
    id: String,
    from: OutputRequest,
    waiter: Option<WaiterGuard>,
) -> Response {
    let (sender, receiver) = mpsc::channel::<Event>(FOLLOW_BUFFER);
    tokio::spawn(async move {
        let _waiter = waiter;
        async fn send(sender: &mpsc::Sender<Event>, event: Option<Event>) {
            if let Some(event) = event {
                let _ = sender.send(event).await;
            }
        }
        let mut chunkers = [Utf8Chunker::default(), Utf8Chunker::default()];
        let mut read = from;
        read.wait = FOLLOW_WAIT;
        loop {
            let step = tokio::select! {
                result = session.command_output(&id, read) => result,
                () = sender.closed() => break,
            };
            match step {
                Ok(output) => {
                    for (i, (name, bytes)) in
                        [("stdout", &output.stdout), ("stderr", &output.stderr)]
                            .into_iter()
                            .enumerate()
                    {
                        if let Some(text) = chunkers[i].push(bytes) {
                            send(&sender, event(name, text)).await;
                        }
                    }
                    read.stdout_from = output.stdout_next();
                    read.stderr_from = output.stderr_next();
                    if output.complete() {
                        for (i, name) in ["stdout", "stderr"].into_iter().enumerate() {
                            if let Some(text) = chunkers[i].finish() {
                                send(&sender, event(name, text)).await;
                            }
                        }
                        send(&sender, event("exit", CommandView::from(&output.command))).await;
                        break;
                    }
                }
                Err(error) => {
                    send(&sender, error_event(error)).await;
                    break;
                }
            }
        }
        let _ = Box::new(session).close().await;
        drop(sender);
    });
    sse_response(futures::stream::unfold(
        receiver,
        |mut receiver| async move { receiver.recv().await.map(|event| (event, receiver)) },
    ))
}

/// Kills a background command's process group and answers its final status once it has
/// ended; a command that had already ended is answered as it was, at once.
#[utoipa::path(delete, path = "/v1/conversations/{id}/commands/{cmd}", tag = "exec",
    operation_id = "kill_command",
    params(("id" = String, Path, description = "conversation id"), ("cmd" = String, Path, description = "command id")),
    responses((status = 200, description = "killed, or had ended", body = CommandView), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 404, description = "no such conversation or command", body = ErrorBody)))]
pub(crate) async fn kill(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs((id, cmd)): PathArgs<(String, String)>,
) -> Response {
    one_command(
        &state,
        &principal,
        ("command_kill", Operation::KillCommand),
        &id,
        &cmd,
        async |session| session.kill_command(&cmd).await,
    )
    .await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StdinQuery {
    #[serde(default)]
    close: Option<bool>,
}

/// How much of a write reached the command.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct StdinWriteView {
    /// Bytes the command's stdin took (all of the body).
    written: u64,
}

/// Writes the raw body (at most 1 MiB) to the stdin of a background command started with
/// `keep_stdin_open`, as the command reads it; `?close=true` closes it afterwards. A command
/// that does not read the whole body within 10 s (its pipe holds 64 KiB) makes the write
/// answer 504 `timed_out` naming how many bytes it took; the rest is not written, and its
/// stdin stays open.
#[utoipa::path(post, path = "/v1/conversations/{id}/commands/{cmd}/stdin", tag = "exec",
    operation_id = "write_command_stdin",
    params(("id" = String, Path, description = "conversation id"), ("cmd" = String, Path, description = "command id"),
           ("close" = Option<bool>, Query, description = "close stdin after writing")),
    request_body(content = Binary, content_type = "application/octet-stream"),
    responses((status = 200, description = "all of it written", body = StdinWriteView),
              (status = 400, description = "invalid input", body = ErrorBody),
              (status = 404, description = "no such conversation or command", body = ErrorBody),
              (status = 409, description = "not started with keep_stdin_open, its stdin closed, or it has ended", body = ErrorBody),
              (status = 413, description = "more than 1 MiB", body = ErrorBody),
              (status = 503, description = "the runtime cannot keep a stdin open (host, aio)", body = ErrorBody),
              (status = 504, description = "the command did not read it all within 10 s", body = ErrorBody)))]
pub(crate) async fn write_stdin(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs((id, cmd)): PathArgs<(String, String)>,
    QueryArgs(query): QueryArgs<StdinQuery>,
    body: axum::body::Body,
) -> Response {
    on_conversation(&principal, "command_stdin", &id, async |conv| {
        command_id(&cmd)?;
        let limit = sessionbox_core::MAX_STDIN_BYTES;
        let data = axum::body::to_bytes(body, limit).await.map_err(|_| {
            sessionbox_core::Error::TooLarge {
                what: "a write to stdin".into(),
                limit: limit as u64,
            }
        })?;
        let close = query.close.unwrap_or(false);
        let written = state
            .with_conversation(&conv, Operation::Attach, async |opened| {
                let w = opened.conv.write_stdin(&cmd, &data).await?;
                if close && !w.timed_out {
                    opened.conv.close_stdin(&cmd).await?;
                }
                Ok::<_, sessionbox_core::Error>(w)
            })
            .await??;
        if written.timed_out {
            return Err(ApiError::new(
                axum::http::StatusCode::GATEWAY_TIMEOUT,
                "timed_out",
                format!(
                    "the command read {} of {} bytes within {} s; the rest was not written \
                     and its stdin stays open",
                    written.written,
                    data.len(),
                    sessionbox_core::STDIN_WRITE_WAIT.as_secs()
                ),
            ));
        }
        Ok(Json(StdinWriteView {
            written: written.written,
        })
        .into_response())
    })
    .await
}

/// Closes the stdin of a background command started with `keep_stdin_open` (it reads end of
/// file); nothing to do when it was closed or the command has ended.
#[utoipa::path(delete, path = "/v1/conversations/{id}/commands/{cmd}/stdin", tag = "exec",
    operation_id = "close_command_stdin",
    params(("id" = String, Path, description = "conversation id"), ("cmd" = String, Path, description = "command id")),
    responses((status = 204, description = "closed"),
              (status = 400, description = "invalid input", body = ErrorBody),
              (status = 404, description = "no such conversation or command", body = ErrorBody),
              (status = 409, description = "not started with keep_stdin_open", body = ErrorBody),
              (status = 503, description = "the runtime cannot keep a stdin open (host, aio)", body = ErrorBody)))]
pub(crate) async fn close_stdin(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs((id, cmd)): PathArgs<(String, String)>,
) -> Response {
    on_conversation(&principal, "command_stdin_close", &id, async |conv| {
        command_id(&cmd)?;
        state
            .with_conversation(&conv, Operation::Attach, async |opened| {
                opened.conv.close_stdin(&cmd).await
            })
            .await??;
        Ok(axum::http::StatusCode::NO_CONTENT.into_response())
    })
    .await
}
