//! Validation of the execd endpoint an OpenSandbox server returns.
//!
//! The rule (`shared/cases/endpoint-urls.json`): an endpoint is trusted only if it is the
//! server proxy of the same sandbox and port on the same origin as the lifecycle server, or —
//! when direct endpoints were asked for — a URL whose host is in the allowlist and whose path is
//! empty or `/proxy/{port}` (what the 1.1.1 server answers in host and bridge mode).
//!
//! The direct allowlist is explicit: the configured `direct_hosts` (a host name, compared
//! case-insensitively and exactly, or an IP address or CIDR block such as `172.17.0.0/16`,
//! matched against IP literals only, never against a name that might resolve into it), plus,
//! when [`EndpointPolicy::direct_lifecycle_host`] is set (the runtime's `direct = "auto"`), the
//! lifecycle server's own host. Why that host may be trusted by default: every request to it
//! already carries the API key, and the agent tokens sent on direct requests are derived from
//! that key, so a direct endpoint on that host tells it nothing it could not compute; and a
//! hostile server gains nothing either, since it already sees every proxied request. What the
//! rule prevents is a server (hostile or confused) pointing sessionbox, with an agent token, at
//! any *other* host: a name that merely resolves to an allowed address, a neighbouring address
//! or another network is refused before any connection is made.
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
    /// Hosts a direct endpoint may name (used when `use_server_proxy` is false): host names
    /// (exact, case-insensitive), IP addresses, or CIDR blocks (`10.0.0.0/8`, `fd00::/8`)
    /// that match IP literals only.
    pub direct_hosts: Vec<String>,
    /// Also accept direct endpoints on the lifecycle server's own host (any port). See the
    /// module documentation for why that is safe.
    pub direct_lifecycle_host: bool,
}

/// Whether `host` of a direct endpoint is allowed by `entry` of an allowlist: a CIDR block or
/// an IP address matches an IP literal inside it, anything else is a host name compared
/// exactly (ASCII case-insensitive).
fn host_allowed(entry: &str, host: &url::Host<&str>) -> bool {
    use std::net::IpAddr;
    let entry = entry.trim();
    let ip = match host {
        url::Host::Ipv4(a) => Some(IpAddr::V4(*a)),
        url::Host::Ipv6(a) => Some(IpAddr::V6(*a)),
        url::Host::Domain(_) => None,
    };
    let (net, bits) = match entry.split_once('/') {
        Some((n, b)) => match (n.parse::<IpAddr>(), b.parse::<u8>()) {
            (Ok(n), Ok(b)) => (n, Some(b)),
            // A malformed block matches nothing.
            _ => return false,
        },
        None => match entry.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(n) => (n, None),
            Err(_) => {
                return matches!(host, url::Host::Domain(d) if d.eq_ignore_ascii_case(entry));
            }
        },
    };
    let Some(ip) = ip else {
        return false;
    };
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let b = u32::from(bits.unwrap_or(32).min(32));
            let mask = if b == 0 { 0 } else { u32::MAX << (32 - b) };
            bits.is_none_or(|b| b <= 32) && (u32::from(n) & mask) == (u32::from(a) & mask)
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let b = u32::from(bits.unwrap_or(128).min(128));
            let mask = if b == 0 { 0 } else { u128::MAX << (128 - b) };
            bits.is_none_or(|b| b <= 128) && (u128::from(n) & mask) == (u128::from(a) & mask)
        }
        _ => false,
    }
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
///     direct_lifecycle_host: false,
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
        let Some(host) = url.host() else {
            return Err(reject("it names no host"));
        };
        let lifecycle_host = policy.direct_lifecycle_host
            && policy
                .lifecycle
                .host()
                .is_some_and(|h| h.to_string().eq_ignore_ascii_case(&host.to_string()));
        if !lifecycle_host && !policy.direct_hosts.iter().any(|h| host_allowed(h, &host)) {
            return Err(reject(
                "it is a direct endpoint whose host is not in the configured allowlist",
            ));
        }
        if !(path.is_empty() || path == format!("/proxy/{port}")) {
            return Err(reject(&format!(
                "its path is neither empty nor the agent's own proxy route (/proxy/{port})"
            )));
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
