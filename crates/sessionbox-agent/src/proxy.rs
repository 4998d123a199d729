//! `/proxy/{port}/...`: upstream execd's reverse proxy to a port inside the sandbox.
//!
//! Every method on `/proxy/PORT` and `/proxy/PORT/REST` goes to `http://127.0.0.1:PORT/REST`
//! with the query string as sent. The route sits behind the access-token check like every other
//! route, so the proxy needs the token when the agent has one. Bodies stream both ways (nothing
//! is buffered), and an `Upgrade` (WebSocket) handshake that the target answers with `101` is
//! tunnelled in both directions until either side closes.
//!
//! The agent's own port is served internally, not dialled: `/proxy/44772/ping` is `/ping` of
//! this agent. That is what the OpenSandbox server hands to SDKs in bridge mode
//! (`host:mapped/proxy/44772`), and 44772 means execd whatever the agent listens on (a Unix
//! socket in our own sandbox, another TCP port in tests), so both 44772 and the agent's real
//! TCP port are routed to the agent's router with the `/proxy/PORT` prefix removed.
//!
//! Headers: hop-by-hop ones (`Connection` and those it names, `Keep-Alive`, `TE`, `Trailer`,
//! `Transfer-Encoding`, `Upgrade` outside a handshake, `Proxy-*`) are dropped both ways;
//! `Host` is passed as the client sent it; `X-Forwarded-Proto: http` is set and
//! `X-Forwarded-Host` removed, as upstream. Unlike upstream, the agent's access token header is
//! **not** passed on: the target is a program in the sandbox, which must not learn it.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use hyper_util::rt::TokioIo;
use sessionbox_execd::hop::{set_upgrade, strip_hop_by_hop, upgrade_of};
use sessionbox_execd::wire::{self, error_code};

use crate::server::ApiError;

/// Upstream execd's port; `/proxy/44772/...` is always this agent.
pub(crate) const EXECD_PORT: u16 = 44772;

/// How long dialling `127.0.0.1:PORT` may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the proxy routes need: the agent's own router (without the proxy routes) and its TCP
/// port, if it listens on one.
struct Proxy {
    internal: Router,
    own_port: Option<u16>,
}

/// The `/proxy` routes, for any state type. `internal` is the agent's router without these
/// routes (a nested `/proxy/44772/proxy/...` therefore answers 404).
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(
    internal: Router,
    own_port: Option<u16>,
) -> Router<S> {
    let proxy = Arc::new(Proxy { internal, own_port });
    let handler = move |req: Request| {
        let proxy = proxy.clone();
        async move { proxy.handle(req).await }
    };
    Router::new()
        .route("/proxy/", any(no_port))
        .route("/proxy/{port}", any(handler.clone()))
        .route("/proxy/{port}/", any(handler.clone()))
        .route("/proxy/{port}/{*rest}", any(handler))
}

async fn no_port() -> ApiError {
    ApiError::bad_request("port is required: use /proxy/PORT/PATH")
}

/// The port segment and the rest of the path (`/` when empty) of `/proxy/PORT[/REST]`.
fn split(path: &str) -> Option<(&str, &str)> {
    let after = path.strip_prefix("/proxy/")?;
    Some(match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, "/"),
    })
}

/// A port as the proxy accepts it: decimal, 1 to 65535.
fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u16>().ok().filter(|p| *p != 0)
}

impl Proxy {
    async fn handle(&self, req: Request) -> Response {
        let path = req.uri().path().to_owned();
        let Some((port, rest)) = split(&path) else {
            return ApiError::bad_request("port is required: use /proxy/PORT/PATH").into_response();
        };
        let Some(mut port) = parse_port(port) else {
            return ApiError::bad_request(format!(
                "invalid port {port:?} in /proxy/PORT: give a number from 1 to 65535"
            ))
            .into_response();
        };
        let mut rest = rest;
        // The server names this agent `host:mapped/proxy/44772` in bridge mode, so a relay
        // to another port through that name nests one proxy path: `/proxy/44772/proxy/PORT`
        // is `/proxy/PORT`. One level only: this agent through itself again is refused below.
        if self.is_own(port)
            && let Some((inner, inner_rest)) = split(rest)
            && let Some(inner) = parse_port(inner)
            && !self.is_own(inner)
        {
            port = inner;
            rest = inner_rest;
        }
        let target = match req.uri().query() {
            Some(q) => format!("{rest}?{q}"),
            None => rest.to_owned(),
        };
        let Ok(uri) = target.parse::<Uri>() else {
            return ApiError::bad_request("the proxied path is not a valid request target")
                .into_response();
        };
        if self.is_own(port) {
            // A fresh request, not this one with a new URI: the outer route's matched path
            // parameters (`{port}`, `{*rest}`) live in its extensions, and an inner route such
            // as `/command/status/{id}` would see them as extra parameters.
            // The connection's upgrade handle is carried over (a terminal's WebSocket through
            // `/proxy/44772/pty/{id}/ws`, the way the OpenSandbox server's direct endpoint
            // names the agent).
            let (mut parts, body) = req.into_parts();
            let mut inner = Request::new(body);
            *inner.method_mut() = parts.method;
            *inner.uri_mut() = uri;
            *inner.version_mut() = parts.version;
            *inner.headers_mut() = parts.headers;
            if let Some(on_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() {
                inner.extensions_mut().insert(on_upgrade);
            }
            return self.internal_call(inner).await;
        }
        forward(port, uri, req).await
    }

    /// True for a port that means this agent: 44772, or the port it listens on.
    fn is_own(&self, port: u16) -> bool {
        port == EXECD_PORT || Some(port) == self.own_port
    }

    /// Serves the request with the agent's own router.
    async fn internal_call(&self, req: Request) -> Response {
        use tower_service::Service;
        let mut svc = self.internal.clone();
        let ready =
            std::future::poll_fn(|cx| <Router as Service<Request>>::poll_ready(&mut svc, cx)).await;
        match ready {
            Ok(()) => match svc.call(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            },
            Err(never) => match never {},
        }
    }
}

/// 502 with the reason (the target is not listening, or broke the exchange).
fn bad_gateway(port: u16, why: impl std::fmt::Display) -> Response {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        error_code::RUNTIME_ERROR,
        format!("cannot proxy to 127.0.0.1:{port}: {why}"),
    )
    .into_response()
}

async fn forward(port: u16, uri: Uri, mut req: Request) -> Response {
    let stream = match tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return bad_gateway(port, e),
        Err(_) => return bad_gateway(port, "connecting timed out"),
    };
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(x) => x,
        Err(e) => return bad_gateway(port, e),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(port, error = %e, "proxied connection ended with an error");
        }
    });

    let upgrade = upgrade_of(req.headers());
    let client_side = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    parts.uri = uri;
    parts.version = axum::http::Version::HTTP_11;
    let headers = &mut parts.headers;
    strip_hop_by_hop(headers);
    headers.remove(wire::ACCESS_TOKEN_HEADER);
    headers.remove(HeaderName::from_static("x-forwarded-host"));
    headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static("http"),
    );
    if let Some(u) = &upgrade {
        set_upgrade(headers, u.clone());
    }
    let mut resp = match sender
        .send_request(axum::http::Request::from_parts(parts, body))
        .await
    {
        Ok(r) => r,
        Err(e) => return bad_gateway(port, e),
    };

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_side) = client_side else {
            return bad_gateway(port, "the target switched protocols without being asked to");
        };
        let backend_side = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            let (Ok(client), Ok(backend)) = tokio::join!(client_side, backend_side) else {
                return;
            };
            let mut client = TokioIo::new(client);
            let mut backend = TokioIo::new(backend);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut backend).await;
        });
        let (mut parts, _) = resp.into_parts();
        let upgrade = parts.headers.get(header::UPGRADE).cloned();
        strip_hop_by_hop(&mut parts.headers);
        if let Some(u) = upgrade {
            set_upgrade(&mut parts.headers, u);
        }
        return Response::from_parts(parts, Body::empty());
    }

    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Response::from_parts(parts, Body::new(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_ports_split_as_upstream() {
        assert_eq!(split("/proxy/8080"), Some(("8080", "/")));
        assert_eq!(split("/proxy/8080/"), Some(("8080", "/")));
        assert_eq!(split("/proxy/8080/a/b"), Some(("8080", "/a/b")));
        assert_eq!(split("/ping"), None);
        assert_eq!(parse_port("1"), Some(1));
        assert_eq!(parse_port("65535"), Some(65535));
        for bad in ["0", "65536", "-1", "+80", "80a", "", " 80"] {
            assert_eq!(parse_port(bad), None, "{bad:?}");
        }
    }
}
