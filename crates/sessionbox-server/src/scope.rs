//! Which routes a scoped API key may call: the middleware [`authorize`], one table of routes
//! ([`rule`]), and nothing else.
//!
//! Every route that needs a key is classed here by its template and method:
//!
//! - a **conversation route** (`/v1/conversations/{id}/...`) reads or changes the conversation
//!   `{id}`, which the key must reach; a read-only key may only read;
//! - a **tenant-wide route** (snapshots, policies, the egress log, metrics, and every route
//!   this table does not name) reaches every conversation's data, so a key limited to some
//!   conversations is refused it;
//! - a **shared route** (the skill catalogue, the template list, a fork of a template) reaches
//!   what the tenant chose to share, and any of its keys may read it;
//! - the conversation list and MCP check the scope themselves: the list shows only the
//!   conversations the key reaches, and MCP checks the conversation of each session and the
//!   tools of a read-only key (`mcp::admit`).
//!
//! Three handlers check what a body names: a fork's new conversation must be one the key
//! reaches, and a restore's snapshot must have been taken of one (`routes::snapshots`).
//!
//! A refusal is 403 `forbidden` whose message names the rule, and is audited as
//! `http.refused` with the key's id and the route.

use axum::extract::{MatchedPath, RawPathParams, Request, State};
use axum::http::Method;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sessionbox_core::{ConversationId, ConversationRef, Error, KeyScope};
use sessionbox_store::AuditEntry;

use crate::AppState;
use crate::auth::{Principal, authenticate};
use crate::error::ApiError;

/// Whether a route only reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Reads files, listings, output or records.
    Read,
    /// Runs, writes, makes, destroys or reaches a program in the sandbox.
    Write,
}

/// How a route is checked against a key's scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Needs no key (health, the OpenAPI document, signed preview links).
    Public,
    /// Acts on the conversation named by the path's `{id}`.
    Conversation(Access),
    /// Reaches the whole tenant.
    Tenant(Access),
    /// Reaches what the tenant shares with all of its keys.
    Shared(Access),
    /// Checked by its handler: the conversation list (filtered), the audit trail.
    List,
    /// MCP: checked per session and per tool.
    Mcp,
}

const CONVERSATION: &str = "/v1/conversations/{id}";

/// The rule of the route `template` (axum's matched path) for `method`. A route this table
/// does not name is tenant-wide: a key limited to conversations is refused it until someone
/// classes it here.
pub(crate) fn rule(template: &str, method: &Method) -> Rule {
    let reads = matches!(*method, Method::GET | Method::HEAD);
    let by_method = if reads { Access::Read } else { Access::Write };
    if let Some(tail) = template.strip_prefix(CONVERSATION) {
        let access = match tail {
            // A search: its pattern comes in a body.
            "/grep" => Access::Read,
            // A terminal runs commands; a preview's program may change anything.
            "/pty" | "/pty/tickets" | "/previews" => Access::Write,
            t if t.starts_with("/ports/") => Access::Write,
            // A network policy restrains the conversation: whoever the key was given to must
            // not be able to widen it (the MCP tools cannot either).
            "/policy" if !reads => return Rule::Tenant(Access::Write),
            _ => by_method,
        };
        return Rule::Conversation(access);
    }
    match template {
        "/healthz" | "/readyz" | "/v1/openapi.json" => Rule::Public,
        // The dashboard's files: they hold no data; the page sends a key on each API call.
        "/ui" | "/ui/" | "/ui/{*path}" => Rule::Public,
        t if t.starts_with("/v1/previews/{token}") => Rule::Public,
        // The list is filtered by its handler; the audit trail is checked by its handler (one
        // conversation the key reaches, or the whole tenant's with an unlimited key).
        "/v1/conversations" | "/v1/audit" => Rule::List,
        "/v1/whoami" => Rule::Shared(Access::Read),
        "/v1/skills" | "/v1/templates" => Rule::Shared(by_method),
        "/v1/templates/{name}/fork" => Rule::Shared(Access::Write),
        "/mcp" | "/mcp/new" | "/mcp/conversations/{id}" => Rule::Mcp,
        _ => Rule::Tenant(by_method),
    }
}

/// Middleware: authenticates every request of a route that needs a key, refuses what the key's
/// scope does not allow (403, audited), and leaves the [`Principal`] for the handler.
pub(crate) async fn authorize(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(template) = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
    else {
        // No route matched: the fallback answers 404 without a key.
        return next.run(req).await;
    };
    let rule = rule(&template, req.method());
    if rule == Rule::Public {
        return next.run(req).await;
    }
    let (mut parts, body) = req.into_parts();
    let principal = match ticket_principal(&state, &mut parts, &template).await {
        Some(found) => found,
        None => authenticate(&parts, &state).await,
    };
    let principal = match principal {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    if !principal.scope.is_full() {
        let route = format!("{} {template}", parts.method);
        let id = conversation_in_path(&mut parts, &state).await;
        if let Err(e) = permits(&principal.scope, rule, id.as_ref(), &route) {
            if e.code() == "forbidden" {
                let key = match id {
                    Some(Ok(id)) => Some(ConversationRef::new(principal.tenant.clone(), id).key),
                    _ => None,
                };
                refused(&state, &principal, key, &route);
            }
            return ApiError::from(e).into_response();
        }
    }
    parts.extensions.insert(principal);
    next.run(Request::from_parts(parts, body)).await
}

/// The terminal route, which also takes a ticket in place of a key.
const TERMINAL: &str = "/v1/conversations/{id}/pty";

/// The caller a terminal ticket names (`GET .../pty?ticket=`), limited to the ticket's one
/// conversation; `None` when this is not the terminal route or there is no ticket. A ticket
/// opens one terminal: a second use is refused.
async fn ticket_principal(
    state: &AppState,
    parts: &mut Parts,
    template: &str,
) -> Option<Result<Principal, ApiError>> {
    use std::collections::HashMap;
    if template != TERMINAL {
        return None;
    }
    let query = axum::extract::Query::<HashMap<String, String>>::try_from_uri(&parts.uri).ok()?;
    let ticket = query.0.get("ticket")?;
    // Only a WebSocket upgrade spends a ticket: a plain request with one is refused before
    // anything is looked at, so such requests cannot fill the set of used tickets.
    let upgrade = parts
        .headers
        .get(axum::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade {
        return Some(Err(ApiError::new(
            axum::http::StatusCode::UPGRADE_REQUIRED,
            "upgrade_required",
            "a terminal ticket opens only the terminal's WebSocket: send Connection: Upgrade \
             and Upgrade: websocket",
        )));
    }
    let refused = |why: &str| {
        Some(Err(ApiError::unauthorized(format!(
            "the terminal ticket is not valid: {why}; ask for a new one \
             (POST /v1/conversations/{{id}}/pty/tickets)"
        ))))
    };
    let Some(key) = &state.config.preview_key else {
        return refused("this server issues none");
    };
    let now = crate::routes::preview::now_secs(state);
    let claims = match key.verify_terminal(ticket, now) {
        Ok(c) => c,
        Err(e) => return refused(&e.to_string()),
    };
    let in_path = match conversation_in_path(parts, state).await {
        Some(Ok(id)) => id,
        _ => return refused("the path names no valid conversation"),
    };
    if in_path.as_str() != claims.conversation {
        return refused("it was issued for another conversation");
    }
    // The key it was issued to must still be accepted (not revoked, not expired).
    if let Some(id) = claims.key_id.clone() {
        let record = match state.manager.store().run(move |s| s.api_key(&id)).await {
            Ok(r) => r,
            Err(e) => return Some(Err(e.into())),
        };
        let live = record.is_some_and(|k| k.is_accepted_at(state.manager.store().now()));
        if !live {
            return refused("the key it was issued to was revoked or expired");
        }
    }
    if !state.use_ticket(&claims.nonce, claims.expires, now) {
        return refused("it was used already");
    }
    let tenant = match sessionbox_core::TenantId::new(&claims.tenant) {
        Ok(t) => t,
        Err(_) => return refused("it names no valid tenant"),
    };
    Some(Ok(Principal {
        tenant,
        key_id: claims.key_id,
        expires_at: None,
        scope: KeyScope {
            conversations: sessionbox_core::ConversationScope::One(in_path),
            read_only: false,
        },
    }))
}

/// 16 random hex digits (a terminal ticket's nonce, the tail of an id `/mcp/new` makes).
///
/// # Errors
/// [`Error::Backend`] when the kernel gives no random bytes.
pub(crate) fn nonce() -> Result<String, Error> {
    use std::io::Read;
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::Backend(format!("cannot read random bytes: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The `{id}` of the route's path, parsed; `None` when the route has none.
async fn conversation_in_path(
    parts: &mut Parts,
    state: &AppState,
) -> Option<Result<ConversationId, Error>> {
    use axum::extract::FromRequestParts;
    let params = RawPathParams::from_request_parts(parts, state).await.ok()?;
    params
        .iter()
        .find(|(name, _)| *name == "id")
        .map(|(_, value)| ConversationId::new(value))
}

/// Whether `scope` allows a route of `rule` on the conversation `id` of its path.
fn permits(
    scope: &KeyScope,
    rule: Rule,
    id: Option<&Result<ConversationId, Error>>,
    route: &str,
) -> Result<(), Error> {
    let write = |access: Access| match access {
        Access::Read => Ok(()),
        Access::Write => scope.check_write(route),
    };
    match rule {
        Rule::Public | Rule::List | Rule::Mcp => Ok(()),
        Rule::Conversation(access) => {
            let id = match id {
                Some(Ok(id)) => id,
                Some(Err(e)) => return Err(e.clone()),
                None => {
                    return Err(Error::Forbidden(format!(
                        "{route} names no conversation; this API key is limited to {}",
                        scope.conversations
                    )));
                }
            };
            scope.check_conversation(id)?;
            write(access)
        }
        Rule::Tenant(access) => {
            scope.check_tenant_wide(route)?;
            write(access)
        }
        Rule::Shared(access) => write(access),
    }
}

/// Audits a refusal: `http.refused`, outcome `forbidden`, the key and the route.
pub(crate) fn refused(
    state: &AppState,
    principal: &Principal,
    key: Option<sessionbox_core::ConversationKey>,
    route: &str,
) {
    state.audit.record(AuditEntry {
        at: state.manager.store().now(),
        tenant: principal.tenant.clone(),
        conversation_key: key,
        operation: "http.refused".to_owned(),
        outcome: "forbidden".to_owned(),
        detail: Some(format!(
            "key={} scope={} route={route}",
            principal.key_id.as_deref().unwrap_or("-"),
            principal.scope
        )),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use sessionbox_core::ConversationScope;

    #[test]
    fn routes_are_classed_by_template_and_method() {
        let get = Method::GET;
        let post = Method::POST;
        let c = |t: &str| format!("{CONVERSATION}{t}");
        assert_eq!(
            rule(&c("/files/{*path}"), &get),
            Rule::Conversation(Access::Read)
        );
        assert_eq!(
            rule(&c("/files/{*path}"), &Method::PUT),
            Rule::Conversation(Access::Write)
        );
        assert_eq!(rule(&c("/grep"), &post), Rule::Conversation(Access::Read));
        assert_eq!(rule(&c("/exec"), &post), Rule::Conversation(Access::Write));
        assert_eq!(rule(&c("/pty"), &get), Rule::Conversation(Access::Write));
        assert_eq!(
            rule(&c("/pty/tickets"), &post),
            Rule::Conversation(Access::Write)
        );
        assert_eq!(
            rule(&c("/ports/{port}/{*rest}"), &get),
            Rule::Conversation(Access::Write)
        );
        assert_eq!(rule(&c("/policy"), &get), Rule::Conversation(Access::Read));
        assert_eq!(
            rule(&c("/policy"), &Method::PUT),
            Rule::Tenant(Access::Write)
        );
        assert_eq!(
            rule(CONVERSATION, &Method::DELETE),
            Rule::Conversation(Access::Write)
        );
        assert_eq!(rule("/v1/conversations", &get), Rule::List);
        assert_eq!(rule("/v1/snapshots", &get), Rule::Tenant(Access::Read));
        assert_eq!(
            rule("/v1/templates/{name}/fork", &post),
            Rule::Shared(Access::Write)
        );
        assert_eq!(rule("/v1/previews/{token}/{*rest}", &post), Rule::Public);
        assert_eq!(rule("/mcp/new", &post), Rule::Mcp);
        assert_eq!(
            rule("/v1/some-future-route", &get),
            Rule::Tenant(Access::Read)
        );
    }

    #[test]
    fn a_scoped_key_is_refused_what_its_scope_does_not_reach() {
        let id = |s: &str| Some(Ok(ConversationId::new(s).unwrap()));
        let one = KeyScope {
            conversations: ConversationScope::One(ConversationId::new("a").unwrap()),
            read_only: true,
        };
        let read = Rule::Conversation(Access::Read);
        let write = Rule::Conversation(Access::Write);
        assert!(permits(&one, read, id("a").as_ref(), "GET x").is_ok());
        for (rule, conv) in [
            (read, id("b")),
            (write, id("a")),
            (Rule::Tenant(Access::Read), None),
            (Rule::Shared(Access::Write), None),
            (read, None),
        ] {
            let e = permits(&one, rule, conv.as_ref(), "GET x").unwrap_err();
            assert_eq!(e.code(), "forbidden", "{rule:?}");
        }
        let bad = Some(ConversationId::new("../x"));
        assert_eq!(
            permits(&one, read, bad.as_ref(), "GET x")
                .unwrap_err()
                .code(),
            "invalid_id"
        );
        assert!(permits(&one, Rule::Shared(Access::Read), None, "GET x").is_ok());
        let full = KeyScope::default();
        assert!(permits(&full, Rule::Tenant(Access::Write), None, "PUT x").is_ok());
    }
}
