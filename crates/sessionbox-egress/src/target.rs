//! What a request asks to reach: `host:port` from a CONNECT line or an absolute-form URL,
//! parsed the way a browser or libc would connect, so that the gateway classifies the address
//! the connection would really go to. Pure: no I/O.
//!
//! Numeric hosts in any spelling (`127.1`, `0x7f.1`, `017700000001`, `2130706433`, `0`,
//! `[::ffff:127.0.0.1]`) become the [`IpAddr`] they denote (WHATWG host parsing, the `url`
//! crate), and the gateway connects to exactly that address. Anything else must be a bare host
//! name ([`crate::policy::normalize_domain`]); percent-encoding, userinfo and other characters
//! are refused.

use std::net::IpAddr;

use crate::policy::{PolicyError, normalize_domain};

/// The host of a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A bare, lower-case host name (to be matched, then resolved by the gateway).
    Name(String),
    /// A numeric host: the address it denotes.
    Ip(IpAddr),
}

/// A host and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The host.
    pub host: Host,
    /// The port.
    pub port: u16,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.host {
            Host::Name(n) => write!(f, "{n}:{}", self.port),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]:{}", self.port),
            Host::Ip(a) => write!(f, "{a}:{}", self.port),
        }
    }
}

/// Parses a host as a connection would: numeric spellings become their address; names must be
/// bare host names.
///
/// # Errors
/// [`PolicyError`] when it is neither.
pub fn parse_host(host: &str) -> Result<Host, PolicyError> {
    if host.is_empty() {
        return Err(PolicyError("an empty host".into()));
    }
    if host
        .bytes()
        .any(|b| b == b'%' || b == b'@' || b <= b' ' || b >= 0x7f)
    {
        return Err(PolicyError(format!(
            "{host:?} is not a bare host name or address"
        )));
    }
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| PolicyError(format!("{host:?}: a '[' without its ']'")))?;
        return inner
            .parse::<std::net::Ipv6Addr>()
            .map(|a| Host::Ip(IpAddr::V6(a)))
            .map_err(|_| PolicyError(format!("{host:?} is not an IPv6 address")));
    }
    match url::Host::parse(host) {
        Ok(url::Host::Ipv4(a)) => Ok(Host::Ip(IpAddr::V4(a))),
        Ok(url::Host::Ipv6(a)) => Ok(Host::Ip(IpAddr::V6(a))),
        Ok(url::Host::Domain(d)) => {
            if d != host.to_ascii_lowercase() {
                // IDNA mapped it: the caller should use the xn-- form it maps to.
                return Err(PolicyError(format!(
                    "{host:?} is not a bare ASCII host name (write it as {d:?})"
                )));
            }
            normalize_domain(&d).map(Host::Name)
        }
        Err(e) => Err(PolicyError(format!("{host:?} is not a valid host: {e}"))),
    }
}

/// Parses `host:port` (the CONNECT request target).
///
/// # Errors
/// [`PolicyError`] for a missing or bad port, or a bad host.
pub fn parse_authority(authority: &str) -> Result<Target, PolicyError> {
    let (host, port) = authority
        .rsplit_once(':')
        .filter(|(h, _)| !h.is_empty() && (!h.contains(':') || h.ends_with(']')))
        .ok_or_else(|| PolicyError(format!("{authority:?} is not host:port")))?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0 && port.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| PolicyError(format!("{authority:?}: {port:?} is not a port")))?;
    Ok(Target {
        host: parse_host(host)?,
        port,
    })
}

/// The target of an absolute-form request (`GET http://host:port/path`), from the URI hyper
/// parsed out of the request line: only `http://`, no user information, port 80 when none is
/// given; the host as [`parse_host`] reads it.
///
/// # Errors
/// [`PolicyError`] for another scheme, a URI without a host, user information or a bad host.
pub fn absolute_target(uri: &hyper::Uri) -> Result<Target, PolicyError> {
    match uri.scheme_str() {
        Some("http") => {}
        Some(s) => {
            return Err(PolicyError(format!(
                "only http:// may be sent in absolute form ({s}:// goes through CONNECT)"
            )));
        }
        None => {
            return Err(PolicyError(
                "this is a proxy: send CONNECT host:port or an absolute http:// URL".into(),
            ));
        }
    }
    let authority = uri
        .authority()
        .ok_or_else(|| PolicyError("the URL has no host".into()))?;
    if authority.as_str().contains('@') {
        return Err(PolicyError("user information in the URL is refused".into()));
    }
    Ok(Target {
        host: parse_host(authority.host())?,
        port: authority.port_u16().unwrap_or(80),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_spellings_become_the_address_they_connect_to() {
        for (s, a) in [
            ("127.0.0.1", "127.0.0.1"),
            ("127.1", "127.0.0.1"),
            ("0x7f.1", "127.0.0.1"),
            ("017700000001", "127.0.0.1"),
            ("2130706433", "127.0.0.1"),
            ("0", "0.0.0.0"),
            ("0x7F000001", "127.0.0.1"),
            ("0177.0.0.1", "127.0.0.1"),
            ("[::1]", "::1"),
            ("[::fFFf:127.0.0.1]", "::ffff:127.0.0.1"),
        ] {
            assert_eq!(parse_host(s).unwrap(), Host::Ip(a.parse().unwrap()), "{s}");
        }
    }

    #[test]
    fn names_must_be_bare() {
        assert_eq!(
            parse_host("API.Example.com").unwrap(),
            Host::Name("api.example.com".into())
        );
        for bad in [
            "evil.example%23.allowed.example",
            "evil.example#.allowed.example",
            "user@allowed.example",
            "a b.example",
            "exa\u{0}mple.com",
            "bücher.example",
            "1.2.3.4.5",
            "[::1",
        ] {
            assert!(parse_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn authorities_need_a_port() {
        assert_eq!(parse_authority("a.example:443").unwrap().port, 443);
        assert_eq!(
            parse_authority("[::1]:80").unwrap().host,
            Host::Ip("::1".parse().unwrap())
        );
        for bad in [
            "a.example",
            "a.example:",
            "a.example:0",
            "a.example:x",
            ":80",
            "::1:80",
        ] {
            assert!(parse_authority(bad).is_err(), "{bad}");
        }
    }
}
