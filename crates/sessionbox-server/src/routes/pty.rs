//! `GET /v1/conversations/{id}/pty`: a terminal in the conversation's sandbox, as a WebSocket.
//!
//! The server opens the conversation (creating it; [`Operation::Terminal`], so beside a
//! running command), asks its agent for a new terminal session in the working directory the
//! `cwd` query names (checked as a workspace path first), and tunnels the caller's WebSocket to
//! the agent's, unchanged: the frames are upstream execd's (see the crate README). When the
//! tunnel closes the agent's session is deleted, which kills the shell and everything it
//! started. The conversation's turn is not held meanwhile.

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde::Deserialize;
use sessionbox_core::{Error, Operation};
use sessionbox_execd::pty::{CreatePtyRequest, socket_path};

use super::on_conversation;
use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::{PathArgs, QueryArgs};
use crate::openapi::ConversationErrors;
use crate::relay;

/// The query of the terminal route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PtyQuery {
    /// The shell's working directory; default the workspace root.
    #[serde(default)]
    cwd: Option<String>,
}

/// A terminal in the conversation's sandbox, over a WebSocket (creates the conversation).
///
/// Upgrade with `Connection: Upgrade`, `Upgrade: websocket`. On the socket, upstream execd's
/// frames: a JSON `{"type":"connected"}` first; output as binary frames `0x01` + bytes;
/// input as binary frames `0x00` + bytes; JSON text frames `{"type":"resize","cols":C,"rows":R}`,
/// `{"type":"signal","signal":"SIGINT"}`, `{"type":"ping"}`; when the shell ends a JSON
/// `{"type":"exit","exit_code":N}` (N is 128 + the signal for a killed shell) and a normal
/// close. Closing the socket ends the shell and everything it started. A runtime without
/// terminals (`aio`) answers 503 `runtime_unavailable`; past the sandbox's limit of
/// terminals, 429 `busy`.
#[utoipa::path(get, path = "/v1/conversations/{id}/pty", tag = "exec",
    params(("id" = String, Path, description = "conversation id"),
           ("cwd" = Option<String>, Query, description = "the shell's working directory; default the workspace root")),
    responses((status = 101, description = "switching to the terminal's WebSocket"),
              (status = 426, description = "not a WebSocket upgrade", body = crate::views::ErrorBody),
              ConversationErrors))]
pub(crate) async fn pty(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    QueryArgs(query): QueryArgs<PtyQuery>,
    request: Request,
) -> Response {
    on_conversation(&principal, "pty", &id, async |conv| {
        let upgrade = request
            .headers()
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        if !upgrade {
            return Err(ApiError::new(
                StatusCode::UPGRADE_REQUIRED,
                "upgrade_required",
                "this route is a WebSocket: send Connection: Upgrade and Upgrade: websocket",
            ));
        }
        let cwd = match &query.cwd {
            Some(c) => Some(state.manager.check_path(&conv, c)?.as_relative().to_owned()),
            None => None,
        };
        // A terminal holds one of the conversation's relay places for its whole life.
        let slot = state.relays.slot(&conv.key, false)?;
        let link = relay::agent_link(&state, &conv, Operation::Terminal, "terminals").await?;
        let session = link
            .create_terminal(&CreatePtyRequest { cwd, command: None })
            .await
            .map_err(Error::from)?;
        let cleanup = {
            let link = link.clone();
            let session = session.clone();
            async move {
                if let Err(e) = link.delete_terminal(&session).await
                    && e.status() != Some(404)
                {
                    tracing::warn!(error = %e, "could not end a terminal's session in its agent");
                }
            }
        };
        let mut request = request;
        relay::without(
            request.headers_mut(),
            &["authorization", "x-api-key", "cookie"],
        );
        let response = relay::forward_then(&link, &socket_path(&session), request, slot, cleanup)
            .await
            .map_err(|e| match e {
                Error::Backend(m) => Error::Backend(format!("the sandbox's agent: {m}")),
                e => e,
            })?;
        Ok(response)
    })
    .await
}
