//! Validation of the execd endpoint an OpenSandbox server returns.
//!
//! The rule (`shared/cases/endpoint-urls.json`): an endpoint is trusted only if it is the
//! server proxy of the same sandbox and port on the same origin as the lifecycle server, or —
//! when direct endpoints were asked for — a URL whose host is in a configured allowlist.
//! Scheme-less endpoints inherit the lifecycle scheme. Nothing is repaired: whitespace or control
//! characters anywhere, backslashes, userinfo, a query, a fragment, non-ASCII, percent-encoded
//! dots, another sandbox id, another port or another origin are refused. Only documented
//! response headers are kept.

use std::collections::BTreeMap;

use reqwest::Url;

use crate::error::OpenSandboxError;

/// Headers the server documents for an endpoint, and the port each belongs to (`None`: any).
pub const DOCUMENTED_HEADERS: &[(&str, Option<u16>)] = &[
    // The egress sidecar's auth token (port 18080).
    ("OPENSANDBOX-EGRESS-AUTH", Some(18080)),
    // execd's access token.
    ("X-EXECD-ACCESS-TOKEN", Some(crate::lifecycle::EXECD_PORT)),
    // Gateway routing header of direct endpoints.
    ("OpenSandbox-Ingress-To", None),
];

/// How endpoints are judged.
#[derive(Debug, Clone)]
pub struct EndpointPolicy {
    /// The lifecycle server's origin.
    pub lifecycle: Url,
    /// True when server-proxied endpoints were asked for: only those are accepted.
    pub use_server_proxy: bool,
    /// Hosts a direct endpoint may name (used when `use_server_proxy` is false).
    pub direct_hosts: Vec<String>,
}

/// An endpoint that passed [`validate_endpoint`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedEndpoint {
    /// The base URL of the service (`http://host:port/v1/sandboxes/ID/proxy/PORT`), without a
    /// trailing slash.
    pub url: String,
    /// Documented headers to send with every request to it.
    pub headers: BTreeMap<String, String>,
}

/// Escapes control characters, backslashes and non-ASCII so a hostile string is shown, not
/// interpreted, in a message.
pub fn printable(s: &str) -> String {
    s.chars().flat_map(char::escape_default).collect()
}

/// Judges `endpoint` (and its `headers`) returned for `port` of sandbox `sandbox_id`.
///
/// ```
/// use sessionbox_opensandbox::endpoint::{EndpointPolicy, validate_endpoint};
/// let policy = EndpointPolicy {
///     lifecycle: "http://127.0.0.1:8080/".parse().unwrap(),
///     use_server_proxy: true,
///     direct_hosts: vec![],
/// };
/// let ok = validate_endpoint(&policy, "abc", 44772,
///     "127.0.0.1:8080/v1/sandboxes/abc/proxy/44772", &Default::default()).unwrap();
/// assert_eq!(ok.url, "http://127.0.0.1:8080/v1/sandboxes/abc/proxy/44772");
/// assert!(validate_endpoint(&policy, "abc", 44772,
///     "evil.example:8080/v1/sandboxes/abc/proxy/44772", &Default::default()).is_err());
/// ```
///
/// # Errors
/// [`OpenSandboxError::UntrustedEndpoint`] naming the rule broken.
pub fn validate_endpoint(
    policy: &EndpointPolicy,
    sandbox_id: &str,
    port: u16,
    endpoint: &str,
    headers: &BTreeMap<String, String>,
) -> Result<ValidatedEndpoint, OpenSandboxError> {
    let reject = |reason: &str| OpenSandboxError::UntrustedEndpoint {
        endpoint: printable(&crate::lifecycle::truncate(endpoint, 200)),
        reason: reason.to_owned(),
    };
    if endpoint.is_empty() {
        return Err(reject("it is empty"));
    }
    if endpoint
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(reject("it holds whitespace or control characters"));
    }
    if !endpoint.is_ascii() {
        return Err(reject("it holds non-ASCII characters"));
    }
    if endpoint.contains('\\') {
        return Err(reject("it holds a backslash"));
    }
    if endpoint.to_ascii_lowercase().contains("%2e") {
        return Err(reject("it holds a percent-encoded dot"));
    }
    if endpoint.contains('?') || endpoint.contains('#') {
        return Err(reject("it carries a query or fragment"));
    }
    // Before parsing, which would silently resolve them.
    if endpoint.split('/').any(|seg| seg == "." || seg == "..") {
        return Err(reject("its path holds dot segments"));
    }
    let with_scheme = if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("{}://{endpoint}", policy.lifecycle.scheme())
    };
    let url = Url::parse(&with_scheme).map_err(|_| reject("it does not parse as a URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(reject("its scheme is not http or https"));
    }
    if !url.username().is_empty() || url.password().is_some() || with_scheme.contains('@') {
        return Err(reject("it carries userinfo"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(reject("it carries a query or fragment"));
    }
    let path = url.path().trim_end_matches('/');
    if policy.use_server_proxy {
        let same_origin = url.scheme() == policy.lifecycle.scheme()
            && url.host_str() == policy.lifecycle.host_str()
            && url.port_or_known_default() == policy.lifecycle.port_or_known_default();
        if !same_origin {
            return Err(reject(
                "it is not on the lifecycle server's origin (scheme, host and port)",
            ));
        }
        let tail = format!("/sandboxes/{sandbox_id}/proxy/{port}");
        let prefix_ok = path
            .strip_suffix(&tail)
            .is_some_and(|prefix| prefix.is_empty() || prefix == "/v1");
        if !prefix_ok {
            return Err(reject(&format!(
                "its path is not the server proxy of this sandbox and port ([/v1]{tail})"
            )));
        }
    } else {
        let host = url.host_str().unwrap_or_default();
        if !policy
            .direct_hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(host))
        {
            return Err(reject(
                "it is a direct endpoint whose host is not in the configured allowlist",
            ));
        }
    }
    let mut kept = BTreeMap::new();
    for (name, value) in headers {
        let documented = DOCUMENTED_HEADERS
            .iter()
            .any(|(h, p)| h.eq_ignore_ascii_case(name) && p.is_none_or(|p| p == port));
        if !documented {
            return Err(reject(&format!(
                "it comes with the undocumented header {:?}",
                printable(&crate::lifecycle::truncate(name, 60))
            )));
        }
        if value.chars().any(|c| c.is_control()) || !value.is_ascii() {
            return Err(reject(
                "a header value holds control or non-ASCII characters",
            ));
        }
        kept.insert(name.clone(), value.clone());
    }
    let mut base = url.as_str().trim_end_matches('/').to_owned();
    if base.is_empty() {
        base = url.to_string();
    }
    Ok(ValidatedEndpoint {
        url: base,
        headers: kept,
    })
}
