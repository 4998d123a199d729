//! Previews: a port that a command in a conversation's sandbox listens on, reached from
//! outside through the server, never by opening the sandbox's network to the host.
//!
//! - `ANY /v1/conversations/{id}/ports/{port}/{path}`, with the caller's key (an HTTP client,
//!   an SDK);
//! - `POST /v1/conversations/{id}/previews` issues a signed link, `/v1/previews/{token}/`,
//!   that reaches that one port of that one conversation until it expires, with no key (a
//!   browser; the token is in the path, so the page's relative links carry it).
//!
//! Both relay to the agent's `/proxy/{port}/{path}` (HTTP, and WebSocket by upgrade) with the
//! caller's credentials removed: the program in the sandbox never sees a key or a link token.
//! The page is served from the API's own origin, so every response carries
//! `Content-Security-Policy: sandbox ...` without `allow-same-origin`: its scripts run in an
//! opaque origin and cannot call the API or read another preview with the browser's help.
//! Each request or tunnel holds one of the conversation's relay slots
//! ([`crate::ServerConfig::max_relays_per_conversation`]).

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sessionbox_core::{ConversationRef, Error, Operation};
use sessionbox_egress::token::PreviewClaims;
use utoipa::ToSchema;

use super::{conversation_of, on_conversation};
use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::{JsonBody, PathArgs};
use crate::openapi::ConversationErrors;
use crate::relay;
use crate::views::ErrorBody;

/// Request headers never passed to the program: the caller's credentials, the browser's
/// cookies and referrer (the API's origin is shared by every preview, and a link's referrer
/// holds its token), and addresses a client may forge.
const NOT_PASSED: [&str; 8] = [
    "authorization",
    "x-api-key",
    "cookie",
    "referer",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-real-ip",
    "forwarded",
];

/// Response headers never passed to the browser: state a page would set on the API's origin,
/// which every other preview and the API share.
/// (`service-worker-allowed` would let a worker script from a preview claim a scope beyond
/// it, such as the dashboard's `/ui/`.)
const NOT_RETURNED: [&str; 3] = ["set-cookie", "clear-site-data", "service-worker-allowed"];

/// The policy every preview response carries: the page's scripts run, in an opaque origin.
const PREVIEW_CSP: &str =
    "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads";

/// Default lifetime of a preview link, in seconds (15 minutes).
pub(crate) const DEFAULT_LINK_TTL_SECS: u64 = 15 * 60;
/// Longest lifetime of a preview link, in seconds (24 hours).
pub(crate) const MAX_LINK_TTL_SECS: u64 = 24 * 60 * 60;

/// A port as a preview accepts it: decimal, 1 to 65535, and not the agent's own (44772),
/// whose API runs commands: a preview (or a link, which needs no key) must never be a way to
/// it past the turn, the budget and the audit.
fn port_of(s: &str) -> Result<u16, Error> {
    let valid = !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit());
    let port = valid
        .then(|| s.parse::<u16>().ok())
        .flatten()
        .filter(|p| *p != 0)
        .ok_or_else(|| {
            Error::InvalidRequest(format!("invalid port {s:?}: give a number from 1 to 65535"))
        })?;
    if port == sessionbox_execd::wire::DEFAULT_PORT {
        return Err(Error::InvalidRequest(format!(
            "port {port} is the sandbox's agent, which no preview reaches; serve the app on \
             another port"
        )));
    }
    Ok(port)
}

/// Relays `request` to `port` of `conv`, in one of its relay slots; `prefix` (the path the
/// app is served under) goes to the app as `X-Forwarded-Prefix` when it holds no secret.
async fn relay_to(
    state: &AppState,
    conv: &ConversationRef,
    port: u16,
    rest: Option<&str>,
    prefix: Option<String>,
    created_must_be: Option<i64>,
    mut request: Request,
) -> Result<Response, Error> {
    // A preview is never a service worker's script: registered from a page of this origin, it
    // would see every later request of that page, the API key included.
    if request.headers().contains_key("service-worker") {
        return Err(Error::Forbidden(
            "a preview is never a service worker's script".into(),
        ));
    }
    let slot = state.relays.slot(&conv.key, created_must_be.is_some())?;
    let (link, created) = relay::agent_link_of(state, conv, Operation::Attach, "previews").await?;
    if created_must_be.is_some_and(|c| c != created) {
        // The link's conversation was destroyed; this one was made again under its id.
        return Err(gone(conv));
    }
    let path = sessionbox_execd::wire::proxy_path(port, rest.unwrap_or(""), request.uri().query());
    relay::without(request.headers_mut(), &NOT_PASSED);
    if let Some(prefix) = prefix.and_then(|p| HeaderValue::from_str(&p).ok()) {
        request
            .headers_mut()
            .insert(HeaderName::from_static("x-forwarded-prefix"), prefix);
    }
    let mut response = relay::forward(&link, &path, request, slot).await?;
    let headers = response.headers_mut();
    relay::without(headers, &NOT_RETURNED);
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(PREVIEW_CSP),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    Ok(response)
}

/// The answer for a link whose conversation is gone (destroyed, perhaps made again since).
fn gone(conv: &ConversationRef) -> Error {
    Error::NotFound(format!(
        "conversation {} of this link no longer exists; ask for a new link",
        conv.id
    ))
}

/// An answer for a relay that failed: the agent unreachable is 502, the rest as usual.
fn relay_error(error: Error) -> ApiError {
    let unreachable = matches!(error, Error::Backend(_));
    let mut answer = ApiError::from(error);
    if unreachable {
        answer.status = StatusCode::BAD_GATEWAY;
    }
    answer
}

/// A preview with the caller's key: `/v1/conversations/{id}/ports/{port}[/{path}]`. The
/// conversation must exist; a port nothing listens on answers 502 from the agent.
#[utoipa::path(get, path = "/v1/conversations/{id}/ports/{port}/{path}", tag = "previews",
    operation_id = "preview",
    params(("id" = String, Path, description = "conversation id"),
           ("port" = u16, Path, description = "port a command in the sandbox listens on, 1 to 65535"),
           ("path" = String, Path, description = "path on that port")),
    responses((status = 200, description = "what the program on the port answered (any status, any method, WebSocket upgrades too)", content_type = "*/*"),
              (status = 400, description = "invalid input", body = ErrorBody),
              (status = 404, description = "no such conversation", body = ErrorBody),
              (status = 429, description = "too many relays open to this conversation", body = ErrorBody),
              (status = 502, description = "nothing answers on that port", body = ErrorBody),
              (status = 503, description = "the runtime runs no agent", body = ErrorBody)))]
pub(crate) async fn by_key(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(params): PathArgs<HashMap<String, String>>,
    request: Request,
) -> Response {
    let id = params.get("id").cloned().unwrap_or_default();
    on_conversation(&principal, "preview", &id, async |conv| {
        let port_text = params.get("port").map(String::as_str).unwrap_or_default();
        let port = port_of(port_text)?;
        let prefix = format!("/v1/conversations/{id}/ports/{port}");
        let Some(rest) = slash_rest(request.uri().path(), &prefix) else {
            // Relative links resolve under the prefix only with its trailing slash.
            return Ok(Redirect::permanent(&format!("{prefix}/")).into_response());
        };
        let rest = rest.to_owned();
        relay_to(
            &state,
            &conv,
            port,
            Some(&rest),
            Some(prefix),
            None,
            request,
        )
        .await
        .map_err(relay_error)
    })
    .await
}

/// The request path after `prefix` and its `/` (the `/` itself included in none of it);
/// `None` when the path is the prefix without its slash.
fn slash_rest<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    path.strip_prefix(prefix)?.strip_prefix('/')
}

/// A preview through a signed link: `/v1/previews/{token}/{path}`, no key. The link's claims
/// (tenant, conversation, port, expiry) decide everything; an expired or forged link is 401.
#[utoipa::path(get, path = "/v1/previews/{token}/{path}", tag = "previews",
    operation_id = "preview_by_link", security(()),
    params(("token" = String, Path, description = "the link's token, from create_preview_link"),
           ("path" = String, Path, description = "path on the port")),
    responses((status = 200, description = "what the program on the port answered (any status, any method, WebSocket upgrades too)", content_type = "*/*"),
              (status = 401, description = "the link is forged, malformed or expired", body = ErrorBody),
              (status = 404, description = "the conversation no longer exists", body = ErrorBody),
              (status = 429, description = "too many relays open to this conversation", body = ErrorBody),
              (status = 502, description = "nothing answers on that port", body = ErrorBody)))]
pub(crate) async fn by_link(
    State(state): State<AppState>,
    PathArgs(params): PathArgs<HashMap<String, String>>,
    request: Request,
) -> Response {
    let token = params.get("token").cloned().unwrap_or_default();
    let result = async {
        let Some(key) = &state.config.preview_key else {
            return Err(ApiError::unauthorized(
                "this server issues no preview links (it has no preview key)",
            ));
        };
        let claims = key
            .verify_preview(&token, now_secs(&state))
            .map_err(|e| ApiError::unauthorized(format!("the preview link is not valid: {e}")))?;
        // The link works only while the key that made it does (not revoked, not expired).
        if let Some(id) = claims.key_id.clone() {
            let record = state.manager.store().run(move |s| s.api_key(&id)).await?;
            let live = record.is_some_and(|k| k.is_accepted_at(state.manager.store().now()));
            if !live {
                return Err(ApiError::unauthorized(
                    "the preview link is not valid: the key that made it was revoked or expired",
                ));
            }
        }
        let principal = Principal::unrestricted(sessionbox_core::TenantId::new(&claims.tenant)?);
        let conv = conversation_of(&principal, &claims.conversation)?;
        let prefix = format!("/v1/previews/{token}");
        let Some(rest) = slash_rest(request.uri().path(), &prefix) else {
            return Ok(Redirect::permanent(&format!("{prefix}/")).into_response());
        };
        let rest = rest.to_owned();
        port_of(&claims.port.to_string())?;
        relay_to(
            &state,
            &conv,
            claims.port,
            Some(&rest),
            None,
            Some(claims.created),
            request,
        )
        .await
        .map_err(relay_error)
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// Seconds since the Unix epoch now, by the store's clock: preview links and terminal
/// tickets are signed with their expiry and may be checked by another replica, so every
/// replica reads their times from the one clock they share (see `sessionbox_store::clock`).
pub(crate) fn now_secs(state: &AppState) -> u64 {
    u64::try_from(state.manager.store().now().timestamp()).unwrap_or(0)
}

/// A request for a preview link.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PreviewLinkRequest {
    /// The port in the sandbox, 1 to 65535.
    port: u16,
    /// How long the link works, in seconds (default 900, at most 86400).
    #[serde(default)]
    ttl_secs: Option<u64>,
}

/// A preview link.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PreviewLinkView {
    /// The link's path on this server (`/v1/previews/TOKEN/`): open it in a browser, no key.
    /// Whoever holds it reaches this port of this conversation until it expires.
    pub(crate) path: String,
    /// The port it reaches.
    pub(crate) port: u16,
    /// When it stops working (RFC 3339).
    pub(crate) expires_at: DateTime<Utc>,
}

/// Issues a preview link for one port of a conversation that exists.
///
/// # Errors
/// `invalid_request` for a port of 0 or a lifetime of 0 or past 24 hours; `not_found`; 503
/// when the server has no preview key or the runtime runs no agent.
pub(crate) async fn issue_link(
    state: &AppState,
    principal: &Principal,
    conv: &ConversationRef,
    port: u16,
    ttl_secs: Option<u64>,
) -> Result<PreviewLinkView, Error> {
    port_of(&port.to_string())?;
    let ttl = ttl_secs.unwrap_or(DEFAULT_LINK_TTL_SECS);
    if ttl == 0 || ttl > MAX_LINK_TTL_SECS {
        return Err(Error::InvalidRequest(format!(
            "ttl_secs must be from 1 to {MAX_LINK_TTL_SECS} (24 hours), not {ttl}"
        )));
    }
    let Some(key) = &state.config.preview_key else {
        return Err(Error::RuntimeUnavailable {
            runtime: state.manager.runtime().info().name,
            reason: "this server has no preview key, so it issues no preview links".into(),
            hint: "start the server with a data directory it may write its preview key to".into(),
        });
    };
    // The conversation must exist and its runtime give previews at all.
    let (_, created) = relay::agent_link_of(state, conv, Operation::Attach, "previews").await?;
    // A link never outlives the key that made it.
    let mut expires = now_secs(state).saturating_add(ttl);
    if let Some(at) = principal.expires_at {
        expires = expires.min(u64::try_from(at.timestamp()).unwrap_or(0));
    }
    let token = key.issue_preview(&PreviewClaims {
        tenant: conv.tenant.as_str().to_owned(),
        conversation: conv.id.as_str().to_owned(),
        port,
        created,
        expires,
        key_id: principal.key_id.clone(),
    });
    Ok(PreviewLinkView {
        path: format!("/v1/previews/{token}/"),
        port,
        expires_at: DateTime::from_timestamp(expires as i64, 0).unwrap_or_default(),
    })
}

/// Issues a signed link to a port of the conversation's sandbox.
#[utoipa::path(post, path = "/v1/conversations/{id}/previews", tag = "previews",
    operation_id = "create_preview_link",
    params(("id" = String, Path, description = "conversation id")),
    request_body = PreviewLinkRequest,
    responses((status = 200, body = PreviewLinkView), ConversationErrors))]
pub(crate) async fn link(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    JsonBody(body): JsonBody<PreviewLinkRequest>,
) -> Response {
    on_conversation(&principal, "preview_link", &id, async |conv| {
        let view = issue_link(&state, &principal, &conv, body.port, body.ttl_secs).await?;
        Ok(Json(view).into_response())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_parse_as_decimal_from_1_to_65535() {
        assert_eq!(port_of("1").unwrap(), 1);
        assert_eq!(port_of("65535").unwrap(), 65535);
        for bad in [
            "0",
            "65536",
            "-1",
            "+80",
            "80a",
            "",
            " 80",
            "000080000",
            "44772",
        ] {
            assert!(port_of(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_rest_of_a_preview_path_needs_the_prefix_and_its_slash() {
        let p = "/v1/conversations/a/ports/80";
        assert_eq!(
            slash_rest("/v1/conversations/a/ports/80/x/y", p),
            Some("x/y")
        );
        assert_eq!(slash_rest("/v1/conversations/a/ports/80/", p), Some(""));
        assert_eq!(slash_rest("/v1/conversations/a/ports/80", p), None);
        assert_eq!(
            sessionbox_execd::wire::proxy_path(80, "x", Some("q=1")),
            "/proxy/80/x?q=1"
        );
    }
}
