//! Relays to a conversation's agent: what the server passes through unchanged rather than
//! calls (a terminal's WebSocket, a preview of a port, a watch's event stream).
//!
//! The conversation is opened only to learn where its agent is ([`agent_link`], with
//! [`Operation::Terminal`] or [`Operation::Attach`], which run beside a foreground command);
//! the relay itself holds no turn, so a terminal open for an hour keeps no command, read or
//! write of the conversation waiting. A destroy ends the sandbox, and with it every relay.
//!
//! [`forward`] sends a request to the agent on a connection of its own and answers with the
//! agent's response: bodies stream both ways, and a `101 Switching Protocols` becomes a tunnel
//! between the caller's connection and the agent's until either closes. Hop-by-hop headers
//! are dropped both ways (`sessionbox_execd::hop`).

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use sessionbox_core::{ConversationRef, Error, Operation, Result, Session};
use sessionbox_execd::AgentLink;
use sessionbox_execd::hop::{set_upgrade, strip_hop_by_hop, upgrade_of};

use crate::AppState;

/// The link to `conv`'s agent, opened for `operation`; `what` names the relay in the refusal
/// of a runtime without an agent ("terminals", "previews", ...).
///
/// # Errors
/// Opening's (see [`AppState::with_conversation`]), and
/// [`sessionbox_core::no_agent`]'s when the runtime's sandboxes run no agent.
pub(crate) async fn agent_link(
    state: &AppState,
    conv: &ConversationRef,
    operation: Operation,
    what: &str,
) -> Result<AgentLink> {
    let access = state
        .with_conversation(conv, operation, async |opened| {
            // The agent stops when idle (isolated): a call through the session starts it again
            // before its endpoint is handed out. The answer itself does not matter.
            let _ = opened.conv.commands().await;
            opened.conv.agent()
        })
        .await?;
    let Some(access) = access else {
        return Err(sessionbox_core::no_agent(
            &state.manager.runtime().info().name,
            what,
        ));
    };
    AgentLink::new(access).map_err(Error::from)
}

/// Sends `request` to the agent at `agent_path` (path and query) and answers with the agent's
/// response, tunnelling an upgrade. `request`'s headers reach the agent without hop-by-hop
/// ones; the caller removes what the agent must not see (its credentials) first.
///
/// # Errors
/// The link's, when the agent cannot be reached (the caller's answer is then 502).
#[allow(dead_code)] // Until the terminal and preview routes relay through it.
pub(crate) async fn forward(
    link: &AgentLink,
    agent_path: &str,
    mut request: Request,
) -> Result<Response> {
    let upgrade = upgrade_of(request.headers());
    let caller_side = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut request));
    let (mut parts, body) = request.into_parts();
    parts.uri = agent_path.parse().map_err(|_| {
        Error::InvalidRequest("the relayed path is not a valid request target".into())
    })?;
    strip_hop_by_hop(&mut parts.headers);
    if let Some(u) = &upgrade {
        set_upgrade(&mut parts.headers, u.clone());
    }
    // A fresh request: the outer route's extensions (matched path, principal) stay here.
    let mut outgoing = axum::http::Request::new(body);
    *outgoing.method_mut() = parts.method;
    *outgoing.uri_mut() = parts.uri;
    *outgoing.headers_mut() = parts.headers;
    let mut response = link.send(outgoing).await.map_err(Error::from)?;

    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(caller_side) = caller_side else {
            return Err(Error::Backend(
                "the agent switched protocols without being asked to".into(),
            ));
        };
        let agent_side = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            let (Ok(caller), Ok(agent)) = tokio::join!(caller_side, agent_side) else {
                return;
            };
            let mut caller = TokioIo::new(caller);
            let mut agent = TokioIo::new(agent);
            let _ = tokio::io::copy_bidirectional(&mut caller, &mut agent).await;
        });
        let (mut parts, _) = response.into_parts();
        let upgrade = parts.headers.get(axum::http::header::UPGRADE).cloned();
        strip_hop_by_hop(&mut parts.headers);
        if let Some(u) = upgrade {
            set_upgrade(&mut parts.headers, u);
        }
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// Removes `names` (case-insensitive) from `headers`: what a relay's caller presented to the
/// server and the agent must not see.
#[allow(dead_code)] // As `forward`.
pub(crate) fn without(headers: &mut HeaderMap, names: &[&str]) {
    for name in names {
        headers.remove(*name);
    }
}
