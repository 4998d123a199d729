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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures::StreamExt;
use hyper_util::rt::TokioIo;
use sessionbox_core::{ConversationKey, ConversationRef, Error, Operation, Result, Session};
use sessionbox_execd::AgentLink;
use sessionbox_execd::hop::{set_upgrade, strip_hop_by_hop, upgrade_of};

use crate::AppState;

/// How long the agent (and the program behind it, for a preview) may take to answer a relayed
/// request's head; then the relay ends with 504 and gives its place back.
const RESPONSE_HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How often a look for the agent's address retries while a running command's reader places
/// are taken (20 ms apart).
const BUSY_RETRIES: u32 = 50;

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
    agent_link_of(state, conv, operation, what)
        .await
        .map(|(link, _)| link)
}

/// [`agent_link`], with when the conversation's record was made (milliseconds since the
/// epoch): a conversation destroyed and made again under its id is another one.
///
/// # Errors
/// As [`agent_link`].
pub(crate) async fn agent_link_of(
    state: &AppState,
    conv: &ConversationRef,
    operation: Operation,
    what: &str,
) -> Result<(AgentLink, i64)> {
    // Beside a running command the look takes one of its few reader places for a moment;
    // a page loading its assets at once may find them taken, and need only wait that moment.
    let mut tries = 0;
    let access = loop {
        match state
            .with_conversation(conv, operation, async |opened| {
                let created = opened.conv.record().created_at.timestamp_millis();
                opened.conv.agent().await.map(|a| (a, created))
            })
            .await
        {
            Err(Error::Busy(_)) if tries < BUSY_RETRIES && state.running.is_running(&conv.key) => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            other => break other??,
        }
    };
    let (Some(access), created) = access else {
        return Err(sessionbox_core::no_agent(
            &state.manager.runtime().info().name,
            what,
        ));
    };
    Ok((AgentLink::new(access).map_err(Error::from)?, created))
}

/// Sends `request` to the agent at `agent_path` (path and query) and answers with the agent's
/// response, tunnelling an upgrade. `request`'s headers reach the agent without hop-by-hop
/// ones; the caller removes what the agent must not see (its credentials) first. `hold` (a
/// [`RelaySlot`], say) is kept until the response body ends or the tunnel closes.
///
/// # Errors
/// The link's, when the agent cannot be reached (the caller's answer is then 502).
pub(crate) async fn forward(
    link: &AgentLink,
    agent_path: &str,
    request: Request,
    hold: impl Send + Sync + 'static,
) -> Result<Response> {
    forward_then(link, agent_path, request, hold, async {}).await
}

/// [`forward`], then `after` once the exchange is over: when the tunnel closes after an
/// upgrade, at once otherwise (and when forwarding fails). For what a relay must clean up in
/// the agent (a terminal's session).
///
/// # Errors
/// As [`forward`].
pub(crate) async fn forward_then(
    link: &AgentLink,
    agent_path: &str,
    mut request: Request,
    hold: impl Send + Sync + 'static,
    after: impl Future<Output = ()> + Send + 'static,
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
    let sent = tokio::time::timeout(RESPONSE_HEAD_TIMEOUT, link.send(outgoing)).await;
    let mut response = match sent {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tokio::spawn(after);
            return Err(e.into());
        }
        Err(_) => {
            tokio::spawn(after);
            return Err(Error::TimedOut(RESPONSE_HEAD_TIMEOUT));
        }
    };

    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(caller_side) = caller_side else {
            tokio::spawn(after);
            return Err(Error::Backend(
                "the agent switched protocols without being asked to".into(),
            ));
        };
        let agent_side = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            if let (Ok(caller), Ok(agent)) = tokio::join!(caller_side, agent_side) {
                tunnel(TokioIo::new(caller), TokioIo::new(agent)).await;
            }
            after.await;
            drop(hold);
        });
        let (mut parts, _) = response.into_parts();
        let upgrade = parts.headers.get(axum::http::header::UPGRADE).cloned();
        strip_hop_by_hop(&mut parts.headers);
        if let Some(u) = upgrade {
            set_upgrade(&mut parts.headers, u);
        }
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    tokio::spawn(after);
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = http_body_util::BodyExt::into_data_stream(body).map(move |chunk| {
        let _ = &hold;
        chunk
    });
    Ok(Response::from_parts(parts, Body::from_stream(body)))
}

/// Passes bytes both ways between `caller` and `agent` until either side ends (end of stream
/// or an error): then both are closed. A WebSocket has no use for half a connection, and a
/// tunnel whose client went away must not stay open (with its relay place) until the program
/// in the sandbox happens to close its side.
async fn tunnel<C, A>(caller: C, agent: A)
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite,
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite,
{
    let (mut caller_in, mut caller_out) = tokio::io::split(caller);
    let (mut agent_in, mut agent_out) = tokio::io::split(agent);
    tokio::select! {
        _ = tokio::io::copy(&mut caller_in, &mut agent_out) => {}
        _ = tokio::io::copy(&mut agent_in, &mut caller_out) => {}
    }
}

/// Removes `names` (case-insensitive) from `headers`: what a relay's caller presented to the
/// server and the agent must not see.
pub(crate) fn without(headers: &mut HeaderMap, names: &[&str]) {
    for name in names {
        headers.remove(*name);
    }
}

/// The relays open to each conversation now, capped (see
/// [`crate::ServerConfig::max_relays_per_conversation`]); those opened through a preview link
/// (no key) may hold at most half of them, so a link's holder cannot take the places the
/// conversation's own terminals, watches and keyed previews need.
#[derive(Debug)]
pub(crate) struct Relays {
    max: usize,
    open: Arc<Mutex<HashMap<ConversationKey, Open>>>,
}

/// Relays open to one conversation: all of them, and those through a link.
#[derive(Debug, Default, Clone, Copy)]
struct Open {
    all: usize,
    by_link: usize,
}

/// One relay's place in its conversation's count, given back when dropped.
#[derive(Debug)]
pub(crate) struct RelaySlot {
    key: ConversationKey,
    by_link: bool,
    open: Arc<Mutex<HashMap<ConversationKey, Open>>>,
}

impl Relays {
    pub(crate) fn new(max: usize) -> Self {
        Relays {
            max: max.max(1),
            open: Arc::default(),
        }
    }

    /// Most relays through links at once per conversation: half the places, at least one.
    fn max_by_link(&self) -> usize {
        (self.max / 2).max(1)
    }

    /// A place for one more relay to `key`'s agent; `by_link` for a preview through a link.
    ///
    /// # Errors
    /// [`Error::Busy`] when the conversation has its most relays open, or its most through
    /// links.
    pub(crate) fn slot(&self, key: &ConversationKey, by_link: bool) -> Result<RelaySlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(key.clone()).or_default();
        if n.all >= self.max {
            return Err(Error::Busy(format!(
                "this conversation has {} previews, terminals and watches open, the most a \
                 server relays to one conversation; close one and retry",
                self.max
            )));
        }
        if by_link && n.by_link >= self.max_by_link() {
            return Err(Error::Busy(format!(
                "this conversation has {} previews open through links, the most links may \
                 hold; retry later",
                self.max_by_link()
            )));
        }
        n.all += 1;
        n.by_link += usize::from(by_link);
        Ok(RelaySlot {
            key: key.clone(),
            by_link,
            open: self.open.clone(),
        })
    }

    /// Relays open to `key` now.
    #[cfg(test)]
    pub(crate) fn open(&self, key: &ConversationKey) -> usize {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(key).map_or(0, |n| n.all)
    }
}

impl Drop for RelaySlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            n.all -= 1;
            n.by_link -= usize::from(self.by_link);
            if n.all == 0 {
                open.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_gets_at_most_its_relays_and_each_comes_back_when_dropped() {
        let relays = Relays::new(2);
        let a = ConversationRef::parse("t", "a").unwrap().key;
        let b = ConversationRef::parse("t", "b").unwrap().key;
        let one = relays.slot(&a, false).unwrap();
        let two = relays.slot(&a, false).unwrap();
        assert!(matches!(relays.slot(&a, false), Err(Error::Busy(_))));
        // Another conversation is not held back by the first.
        let other = relays.slot(&b, false).unwrap();
        drop(one);
        let three = relays.slot(&a, false).unwrap();
        assert_eq!(relays.open(&a), 2);
        drop((two, three, other));
        assert_eq!(relays.open(&a), 0);
        assert!(relays.open.lock().unwrap().is_empty());
    }

    #[test]
    fn links_hold_at_most_half_the_places_and_keys_keep_the_rest() {
        let relays = Relays::new(4);
        let a = ConversationRef::parse("t", "a").unwrap().key;
        let l1 = relays.slot(&a, true).unwrap();
        let l2 = relays.slot(&a, true).unwrap();
        assert!(matches!(relays.slot(&a, true), Err(Error::Busy(_))));
        let k1 = relays.slot(&a, false).unwrap();
        let k2 = relays.slot(&a, false).unwrap();
        assert!(matches!(relays.slot(&a, false), Err(Error::Busy(_))));
        drop(l1);
        let l3 = relays.slot(&a, true).unwrap();
        drop((l2, l3, k1, k2));
        assert_eq!(relays.open(&a), 0);
    }
}
