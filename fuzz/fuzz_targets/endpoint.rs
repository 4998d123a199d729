//! The execd endpoint validator (`sessionbox_opensandbox::endpoint::validate_endpoint`): the
//! endpoint (URL and headers) an OpenSandbox server answers for a sandbox, which decides where
//! sessionbox sends commands and agent tokens.
//!
//! Input: a flags byte (lifecycle origin, server proxy or direct, the lifecycle host trusted
//! for direct endpoints, port), then `ENDPOINT \x1f SANDBOX_ID \x1f HEADER_NAME \x1f VALUE`.
//! Properties of an accepted endpoint:
//! - its URL is plain: ASCII, no whitespace, control characters, backslash, userinfo, query
//!   or fragment, scheme http or https;
//! - server proxy: it is on the lifecycle server's origin (scheme, host, port), so the API key
//!   and tokens go nowhere else, and its path is `[/v1]/sandboxes/{id}/proxy/{port}`;
//! - direct: its host is the lifecycle server's (when that is trusted) or matches the
//!   allowlist (checked here again, independently), and its path is empty or `/proxy/{port}`;
//! - every header kept is documented for that port;
//! - the accepted URL is a fixed point: validating it again gives the same answer.
#![no_main]

use std::collections::BTreeMap;
use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use sessionbox_fuzz::text_fields;
use sessionbox_opensandbox::endpoint::{DOCUMENTED_HEADERS, EndpointPolicy, validate_endpoint};
use url::Url;

const LIFECYCLES: &[&str] = &[
    "http://127.0.0.1:8080/",
    "https://osb.example/",
    "http://[::1]:8080/",
    "http://OSB.example:80/",
];
const PORTS: &[u16] = &[44772, 18080, 8080, 80];
const DIRECT_HOSTS: &[&str] = &[
    "172.17.0.0/16",
    "sandbox-host.example",
    "10.0.0.5",
    "fd00::/8",
];
const DEFAULT_ID: &str = "3f2b8c1e-6d4a-4f1b-9a7e-0c5d2e8f1a36";

/// The allowlist again: a name exactly (ASCII case-insensitive), an address or a block for IP
/// literals only.
fn allowed(host: &url::Host<&str>) -> bool {
    let ip = match host {
        url::Host::Domain(d) => return d.eq_ignore_ascii_case("sandbox-host.example"),
        url::Host::Ipv4(a) => IpAddr::V4(*a),
        url::Host::Ipv6(a) => IpAddr::V6(*a),
    };
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            (o[0] == 172 && o[1] == 17) || a == std::net::Ipv4Addr::new(10, 0, 0, 5)
        }
        IpAddr::V6(a) => a.segments()[0] >> 8 == 0xfd,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Some(f) = text_fields(rest, 4) else {
        return;
    };
    let (endpoint, id, hname, hvalue) = (f[0], f[1], f[2], f[3]);
    let id = if id.is_empty() { DEFAULT_ID } else { id };
    let lifecycle: Url = LIFECYCLES[usize::from(flags & 3)]
        .parse()
        .expect("lifecycle URL");
    let port = PORTS[usize::from(flags >> 2 & 3)];
    let policy = EndpointPolicy {
        lifecycle: lifecycle.clone(),
        use_server_proxy: flags & 0x10 == 0,
        direct_hosts: DIRECT_HOSTS.iter().map(|h| (*h).to_owned()).collect(),
        direct_lifecycle_host: flags & 0x20 != 0,
    };
    let mut headers = BTreeMap::new();
    if !hname.is_empty() {
        headers.insert(hname.to_owned(), hvalue.to_owned());
    }
    let Ok(v) = validate_endpoint(&policy, id, port, endpoint, &headers) else {
        return;
    };

    assert!(v.url.is_ascii(), "{endpoint:?} -> {:?}", v.url);
    assert!(
        !v.url
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '\\' | '?' | '#' | '@')),
        "{endpoint:?} -> {:?}",
        v.url
    );
    let url = Url::parse(&v.url).expect("an accepted endpoint parses");
    assert!(matches!(url.scheme(), "http" | "https"));
    assert!(url.username().is_empty() && url.password().is_none());
    assert!(url.query().is_none() && url.fragment().is_none());
    let path = url.path().trim_end_matches('/');
    if policy.use_server_proxy {
        assert_eq!(url.scheme(), lifecycle.scheme(), "{endpoint:?}");
        assert_eq!(url.host_str(), lifecycle.host_str(), "{endpoint:?}");
        assert_eq!(
            url.port_or_known_default(),
            lifecycle.port_or_known_default(),
            "{endpoint:?}"
        );
        let tail = format!("/sandboxes/{id}/proxy/{port}");
        assert!(
            path == tail || path == format!("/v1{tail}"),
            "{endpoint:?} -> path {path:?}"
        );
    } else {
        let host = url.host().expect("a direct endpoint names a host");
        let lifecycle_host = policy.direct_lifecycle_host
            && lifecycle
                .host()
                .is_some_and(|h| h.to_string().eq_ignore_ascii_case(&host.to_string()));
        assert!(
            lifecycle_host || allowed(&host),
            "{endpoint:?}: host {host} is not allowed"
        );
        assert!(
            path.is_empty() || path == format!("/proxy/{port}"),
            "{endpoint:?} -> {path:?}"
        );
    }
    for name in v.headers.keys() {
        assert!(
            DOCUMENTED_HEADERS
                .iter()
                .any(|(h, p)| h.eq_ignore_ascii_case(name) && p.is_none_or(|p| p == port)),
            "{name:?} kept for port {port}"
        );
    }
    let again = validate_endpoint(&policy, id, port, &v.url, &headers);
    assert_eq!(
        again.as_ref().ok(),
        Some(&v),
        "{endpoint:?} -> {:?} -> {again:?}",
        v.url
    );
});
