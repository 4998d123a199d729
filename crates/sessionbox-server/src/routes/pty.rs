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
use axum::response::{IntoResponse, Response};
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
    /// A ticket from `POST .../pty/tickets`, in place of the key (checked by
    /// `scope::authorize`, for browsers, which cannot send a key on a WebSocket).
    #[serde(default)]
    #[allow(dead_code)]
    ticket: Option<String>,
}

/// How long a terminal ticket is valid.
pub(crate) const TICKET_SECS: u64 = 60;

/// A terminal ticket.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct TicketView {
    /// Give it as `?ticket=` when opening the terminal's WebSocket; it opens one terminal of
    /// this conversation, once, until `expires_at`.
    ticket: String,
    /// When it stops being accepted (60 s after it was issued).
    expires_at: chrono::DateTime<chrono::Utc>,
}

/// A single-use ticket that opens this conversation's terminal (`GET .../pty?ticket=...`)
/// without a key on the WebSocket, for browsers. Issued to a key that may open a terminal
/// there; valid 60 s.
#[utoipa::path(post, path = "/v1/conversations/{id}/pty/tickets", tag = "exec",
    operation_id = "create_terminal_ticket",
    params(("id" = String, Path, description = "conversation id")),
    responses((status = 201, body = TicketView),
              (status = 503, description = "the server has no key to sign tickets with", body = crate::views::ErrorBody),
              ConversationErrors))]
pub(crate) async fn ticket(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
) -> Response {
    on_conversation(&principal, "pty_ticket", &id, async |conv| {
        let Some(key) = &state.config.preview_key else {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "runtime_unavailable",
                "this server has no key to sign terminal tickets with; start it with a data \
                 directory it may write its preview key to",
            ));
        };
        let now = crate::routes::preview::now_secs(&state);
        let expires = now + TICKET_SECS;
        let ticket = key.issue_terminal(&sessionbox_egress::token::TerminalClaims {
            tenant: conv.tenant.as_str().to_owned(),
            conversation: conv.id.as_str().to_owned(),
            key_id: principal.key_id.clone(),
            nonce: crate::scope::nonce()?,
            expires,
        });
        Ok((
            StatusCode::CREATED,
            axum::Json(TicketView {
                ticket,
                expires_at: chrono::DateTime::from_timestamp(expires as i64, 0).unwrap_or_default(),
            }),
        )
            .into_response())
    })
    .await
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
           ("cwd" = Option<String>, Query, description = "the shell's working directory; default the workspace root"),
           ("ticket" = Option<String>, Query, description = "a ticket from POST .../pty/tickets, in place of the key (browsers)")),
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
