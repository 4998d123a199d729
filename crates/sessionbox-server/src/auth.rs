//! Who is calling: an API key (its tenant and scope) or, on a loopback server with no key at
//! all, the server's open tenant.
//!
//! [`crate::scope::authorize`] authenticates every request of a route that needs a key, checks
//! the key's scope against the route, and leaves the [`Principal`] in the request's extensions;
//! the `Principal` extractor of a handler takes it from there.

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::http::request::Parts;
use sessionbox_core::{KeyScope, TenantId};
use sessionbox_store::KeyCheck;

use crate::AppState;
use crate::error::ApiError;

/// The caller of a request: the tenant it acts in, the id of the key it showed and what that
/// key may reach.
#[derive(Debug, Clone)]
pub struct Principal {
    /// The tenant the request acts in (its key's tenant, or the open tenant).
    pub tenant: TenantId,
    /// `None` when the server runs open (loopback, no key configured).
    pub key_id: Option<String>,
    /// What the key may reach within the tenant; everything without a key.
    pub scope: KeyScope,
    /// When the key stops being accepted; `None` for never (or no key).
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl Principal {
    /// A caller with every right in `tenant` and no key (open mode, MCP over stdio, a preview
    /// link's own claims).
    pub(crate) fn unrestricted(tenant: TenantId) -> Self {
        Principal {
            tenant,
            key_id: None,
            scope: KeyScope::default(),
            expires_at: None,
        }
    }
}

/// The key a request carries: `Authorization: Bearer KEY` or `X-API-Key: KEY`. `Err` when a
/// header is there but unusable.
fn presented_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let bad = || ApiError::unauthorized("the API key header is malformed");
    if let Some(v) = headers.get(axum::http::header::AUTHORIZATION) {
        let v = v.to_str().map_err(|_| bad())?;
        let (scheme, key) = v.split_once(' ').ok_or_else(bad)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(ApiError::unauthorized(
                "only `Authorization: Bearer KEY` is accepted",
            ));
        }
        return Ok(Some(key.trim().to_owned()));
    }
    if let Some(v) = headers.get("x-api-key") {
        return Ok(Some(v.to_str().map_err(|_| bad())?.trim().to_owned()));
    }
    Ok(None)
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match parts.extensions.get::<Principal>() {
            Some(p) => Ok(p.clone()),
            None => authenticate(parts, state).await,
        }
    }
}

/// The caller of a request, from its key (or open mode); 401 or 403 when there is none.
pub(crate) async fn authenticate(parts: &Parts, state: &AppState) -> Result<Principal, ApiError> {
    let store = state.manager.store().clone();
    match presented_key(&parts.headers)? {
        Some(key) => {
            let found = store.run(move |s| s.verify_api_key(&key, s.now())).await?;
            match found {
                KeyCheck::Valid(record) => Ok(Principal {
                    tenant: record.tenant,
                    key_id: Some(record.id),
                    scope: record.scope,
                    expires_at: record.expires_at,
                }),
                KeyCheck::Expired(at) => Err(ApiError::unauthorized(format!(
                    "the API key expired at {}; create a new one",
                    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ))),
                KeyCheck::Invalid => Err(ApiError::unauthorized(
                    "the API key is not valid (unknown or revoked)",
                )),
            }
        }
        None => {
            let Some(tenant) = state.config.open_tenant.clone() else {
                return Err(ApiError::unauthorized(
                    "an API key is required: send `Authorization: Bearer KEY` or `X-API-Key: KEY`",
                ));
            };
            // Open only while no key exists: the first key created closes it.
            if store.run(|s| s.has_api_keys()).await? {
                return Err(ApiError::unauthorized(
                    "an API key is required: send `Authorization: Bearer KEY` or `X-API-Key: KEY`",
                ));
            }
            let mut headers = parts.headers.clone();
            if !headers.contains_key(axum::http::header::HOST)
                && let Some(a) = parts.uri.authority()
                && let Ok(v) = axum::http::HeaderValue::from_str(a.as_str())
            {
                // HTTP/2 names the host in the request's authority, not a Host header.
                headers.insert(axum::http::header::HOST, v);
            }
            if !from_loopback(&headers) {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    "without an API key this server answers only requests to a loopback \
                         host (Host: localhost, 127.0.0.1 or [::1]) from no other origin; create \
                         an API key and send it",
                ));
            }
            Ok(Principal::unrestricted(tenant))
        }
    }
}

/// True when a request may use open mode: its `Host` names a loopback host, and its `Origin`,
/// if any, is a loopback origin. Open mode trusts every local process, but not a web page: a
/// page whose name was rebound to 127.0.0.1 (DNS rebinding) sends its own name as `Host`, and a
/// page's cross-site form post carries its `Origin`; both are refused.
fn from_loopback(headers: &axum::http::HeaderMap) -> bool {
    let loopback_host = |authority: &str| {
        let host = match authority.rsplit_once(':') {
            // `[::1]:7070`, `127.0.0.1:7070`, `localhost:7070`; a bare IPv6 has no port here.
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':') => h,
            _ => authority,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    };
    let host_ok = headers
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .is_some_and(loopback_host);
    let origin_ok = match headers.get(axum::http::header::ORIGIN) {
        None => true,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|o| o.strip_prefix("http://").or(o.strip_prefix("https://")))
            .is_some_and(loopback_host),
    };
    host_ok && origin_ok
}

#[cfg(test)]
mod loopback_tests {
    use super::from_loopback;
    use axum::http::{HeaderMap, HeaderValue};

    fn headers(host: Option<&str>, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = host {
            h.insert("host", HeaderValue::from_str(v).unwrap());
        }
        if let Some(v) = origin {
            h.insert("origin", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn only_loopback_hosts_and_origins_use_open_mode() {
        for host in [
            "127.0.0.1:7070",
            "localhost:7070",
            "LOCALHOST",
            "[::1]:7070",
            "127.9.9.9",
        ] {
            assert!(from_loopback(&headers(Some(host), None)), "{host}");
            assert!(
                from_loopback(&headers(Some(host), Some("http://localhost:7070"))),
                "{host}"
            );
        }
        for host in [
            "evil.example",
            "evil.example:7070",
            "127.0.0.1.evil.example",
            "localhost.evil.example:7070",
            "10.0.0.1:7070",
            "[::2]:7070",
            "",
        ] {
            assert!(!from_loopback(&headers(Some(host), None)), "{host}");
        }
        assert!(!from_loopback(&headers(None, None)), "no Host");
        for origin in [
            "http://evil.example",
            "null",
            "file://",
            "http://127.0.0.1.evil.example",
        ] {
            assert!(
                !from_loopback(&headers(Some("127.0.0.1:7070"), Some(origin))),
                "{origin}"
            );
        }
    }
}
