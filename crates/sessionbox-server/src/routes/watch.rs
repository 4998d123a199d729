//! `GET /v1/conversations/{id}/watch?path=DIR`: what changes beneath a directory of the
//! workspace, as server-sent events, read from the conversation's agent.
//!
//! The conversation is opened with [`Operation::Attach`] only to find its agent (it is not
//! created, and a running command does not hold the watch up); the watch holds no turn. The
//! agent bounds everything (watches per sandbox, directories per watch, events queued); the
//! server reads one event from it each time the client is ready for one, so a slow client
//! makes the agent drop events (and say `overflow`), never the server grow.

use axum::extract::State;
use axum::response::Response;
use futures::StreamExt;
use serde::Deserialize;
use sessionbox_core::{Error, Operation};

use super::exec::{error_event, event, sse_response};
use super::on_conversation;
use crate::AppState;
use crate::auth::Principal;
use crate::extract::{PathArgs, QueryArgs};
use crate::openapi::ConversationErrors;
use crate::relay::agent_link;
use crate::views::{WatchEventView, WatchStreamEvent};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WatchQuery {
    #[serde(default)]
    path: Option<String>,
}

/// Watches a directory: server-sent events named by their `kind` (`ready` first; `created`,
/// `modified`, `deleted`, `moved`, `overflow`, `limit`; `ended` last), data a `WatchEvent`.
/// Refused with 503 `runtime_unavailable` on runtimes whose conversations run no agent (`host`,
/// `aio`), 429 `busy` past 4 watches at once in one conversation.
#[utoipa::path(get, path = "/v1/conversations/{id}/watch", tag = "files",
    params(("id" = String, Path, description = "conversation id"),
           ("path" = Option<String>, Query, description = "the directory to watch; default the workspace root")),
    responses((status = 200, description = "server-sent events: `ready`, then `created`, `modified`, `deleted`, `moved`, `overflow`, `limit`, and `ended` last; each event's data is a WatchEvent",
               content((WatchStreamEvent = "text/event-stream"))),
              ConversationErrors))]
pub(crate) async fn watch(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    QueryArgs(query): QueryArgs<WatchQuery>,
) -> Response {
    on_conversation(&principal, "watch", &id, async |conv| {
        let path = query.path.unwrap_or_else(|| ".".to_owned());
        state.manager.check_path(&conv, &path)?;
        // A watch holds one of the conversation's relay places for as long as it is open.
        let slot = state.relays.slot(&conv.key, false)?;
        let link = agent_link(&state, &conv, Operation::Attach, "file watching").await?;
        let stream = link.watch(&path).await.map_err(Error::from)?;
        let events = futures::stream::unfold(Some(stream), |stream| async move {
            let mut stream = stream?;
            match stream.next().await {
                Ok(Some(e)) => {
                    let e = WatchEventView::from(e);
                    let name = kind_of(&e);
                    Some((event(name, e), Some(stream)))
                }
                Ok(None) => None,
                Err(e) => Some((error_event(Error::from(e)), None)),
            }
        })
        .filter_map(|e| async move { e })
        .map(move |e| {
            let _ = &slot;
            e
        });
        Ok(sse_response(events))
    })
    .await
}

/// The SSE event name of `e`: its `kind`.
fn kind_of(e: &WatchEventView) -> &'static str {
    match e {
        WatchEventView::Ready { .. } => "ready",
        WatchEventView::Created { .. } => "created",
        WatchEventView::Modified { .. } => "modified",
        WatchEventView::Deleted { .. } => "deleted",
        WatchEventView::Moved { .. } => "moved",
        WatchEventView::Overflow => "overflow",
        WatchEventView::Limit { .. } => "limit",
        WatchEventView::Ended { .. } => "ended",
    }
}
