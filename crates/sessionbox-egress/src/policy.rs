//! Network policies: what a conversation may reach. Pure: no I/O, no DNS.
//!
//! A [`Policy`] is `none` (no network, the default) or an allowlist of [`Rule`]s with deny rules
//! that win. A rule names a host ([`HostPattern`]: an exact domain, a `*.` wildcard that matches
//! on a dot boundary, or a CIDR) and optionally port ranges. Decisions come in two steps, in the
//! order the gateway takes them: [`Policy::check_name`] before any DNS lookup (a denied name is
//! never resolved), then [`Policy::check_addr`] for every address the connection could go to
//! (the permanently blocked set first, which no rule can open; then cloud fabric addresses, which
//! need a rule naming exactly them; then private and special-purpose blocks, which need an
//! explicit CIDR rule inside them: [`crate::ranges`]).
//!
//! This file is over 800 lines on purpose: it is the one policy decoder (parsing, normalising,
//! hashing and both decision steps over one set of types), and about 240 of its lines are the
//! unit tests that pin those decisions; splitting it would scatter one grammar across files.
//!
//! ```
//! use sessionbox_egress::policy::{Policy, Verdict};
//! let p = Policy::allowlist(&["*.pypi.org:443", "10.1.0.0/16"], &["evil.pypi.org"]).unwrap();
//! assert!(matches!(p.check_name("files.pypi.org", 443), Verdict::Allow { .. }));
//! assert!(matches!(p.check_name("evil.pypi.org", 443), Verdict::Deny { .. }));
//! assert!(matches!(p.check_name("pypi.org.evil.example", 443), Verdict::Deny { .. }));
//! ```

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

pub use crate::ranges::{Block, blocked, canonical, fabric, private, reserved};
use crate::ranges::{blocked_net, reserved_net};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// At most this many rules (allow and deny together) in one policy.
pub const MAX_RULES: usize = 256;

/// A policy that cannot be accepted, with the rule at fault and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, PolicyError> {
    Err(PolicyError(msg.into()))
}

/// The host part of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "value")]
pub enum HostPattern {
    /// Exactly this domain (lower case, no trailing dot).
    Domain(String),
    /// Any name strictly beneath this domain (`*.example.com` matches `a.example.com` and
    /// `a.b.example.com`, not `example.com` and not `badexample.com`).
    Wildcard(String),
    /// Addresses in this network (a single address is a /32 or /128).
    Cidr(IpNet),
}

/// An inclusive port range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortRange {
    /// First port.
    pub from: u16,
    /// Last port (inclusive).
    pub to: u16,
}

/// One allow or deny rule: a host pattern and, optionally, the ports it covers (all when empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// What hosts it covers.
    pub host: HostPattern,
    /// What ports it covers; empty for every port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortRange>,
}

/// A conversation's network profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "profile")]
pub enum Policy {
    /// No network at all (the default): the sandbox has no route, the gateway refuses all.
    #[default]
    None,
    /// Only what an allow rule covers and no deny rule covers.
    Allowlist {
        /// Allow rules.
        allow: Vec<Rule>,
        /// Deny rules; they win over allow rules.
        #[serde(default)]
        deny: Vec<Rule>,
    },
}

/// The outcome of a check, with the rule (as written) or the reason that decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed by this rule.
    Allow {
        /// The rule that allowed it.
        rule: String,
    },
    /// Refused, and why.
    Deny {
        /// Why (a deny rule, a blocked range, no rule).
        reason: String,
    },
}

impl Verdict {
    /// True for [`Verdict::Allow`].
    pub fn is_allow(&self) -> bool {
        matches!(self, Verdict::Allow { .. })
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.from == self.to {
            write!(f, "{}", self.from)
        } else {
            write!(f, "{}-{}", self.from, self.to)
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match &self.host {
            HostPattern::Domain(d) => d.clone(),
            HostPattern::Wildcard(d) => format!("*.{d}"),
            HostPattern::Cidr(IpNet::V6(n)) if !self.ports.is_empty() => format!("[{n}]"),
            HostPattern::Cidr(n) => n.to_string(),
        };
        f.write_str(&host)?;
        if !self.ports.is_empty() {
            let ports: Vec<String> = self.ports.iter().map(ToString::to_string).collect();
            write!(f, ":{}", ports.join(","))?;
        }
        Ok(())
    }
}

/// Checks that `name` is a bare host name: ASCII letters, digits, `-` and `_`, dot-separated
/// labels of 1 to 63 characters, at most 253 in all, not all-numeric in its last label (that
/// would be an address spelling). Returns it lower-cased without a trailing dot.
///
/// # Errors
/// [`PolicyError`] naming the problem.
pub fn normalize_domain(name: &str) -> Result<String, PolicyError> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.len() > 253 {
        return err(format!(
            "{name:?} is not a host name: it must have 1 to 253 characters"
        ));
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return err(format!(
                "{name:?} is not a host name: each dot-separated label needs 1 to 63 characters"
            ));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return err(format!(
                "{name:?} is not a bare host name: only letters, digits, '-' and '_' may appear \
                 between dots (write internationalized names in their xn-- form)"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return err(format!(
                "{name:?} is not a host name: a label cannot start or end with '-'"
            ));
        }
    }
    let last = name.rsplit('.').next().unwrap_or(name);
    if last.bytes().all(|b| b.is_ascii_digit())
        || (last.len() > 2
            && last[..2].eq_ignore_ascii_case("0x")
            && last[2..].bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return err(format!(
            "{name:?} looks like a numeric address, not a host name: write an address as a \
             dotted quad or a CIDR"
        ));
    }
    Ok(name.to_ascii_lowercase())
}

fn parse_ports(s: &str, rule: &str) -> Result<Vec<PortRange>, PolicyError> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let p = |x: &str| -> Result<u16, PolicyError> {
            match x.parse::<u16>() {
                Ok(n) if n > 0 && x.bytes().all(|c| c.is_ascii_digit()) => Ok(n),
                _ => err(format!(
                    "rule {rule:?}: {x:?} is not a port (1-65535); write ports as 443, 8000-8100 \
                     or 80,443"
                )),
            }
        };
        let (from, to) = (p(a)?, p(b)?);
        if from > to {
            return err(format!(
                "rule {rule:?}: the port range {from}-{to} is empty; write the lower port first"
            ));
        }
        out.push(PortRange { from, to });
    }
    Ok(out)
}

impl FromStr for Rule {
    type Err = PolicyError;

    /// Parses `HOST[:PORTS]`: `example.com`, `*.example.com:443`, `10.0.0.0/8`,
    /// `192.0.2.7:8000-8100`, `2001:db8::/32`, `[2001:db8::/32]:443`, `[2001:db8::1]:80,443`.
    fn from_str(s: &str) -> Result<Self, PolicyError> {
        let rule = s.trim();
        if rule.is_empty() {
            return err("an empty rule: write a domain, *.domain or a CIDR, optionally :PORTS");
        }
        // Split host and ports. A bracketed IPv6 host may carry ports; an unbracketed one with
        // more than one ':' is all host.
        let (host, ports) = if let Some(rest) = rule.strip_prefix('[') {
            let Some((h, after)) = rest.split_once(']') else {
                return err(format!("rule {rule:?}: a '[' without its ']'"));
            };
            match after {
                "" => (h, None),
                _ => match after.strip_prefix(':') {
                    Some(p) => (h, Some(p)),
                    None => return err(format!("rule {rule:?}: after ']' only :PORTS may follow")),
                },
            }
        } else if rule.matches(':').count() == 1 {
            let (h, p) = rule.split_once(':').unwrap_or((rule, ""));
            (h, Some(p))
        } else {
            (rule, None)
        };
        let ports = match ports {
            Some(p) => parse_ports(p, rule)?,
            None => Vec::new(),
        };
        let host = if let Ok(net) = IpNet::from_str(host) {
            HostPattern::Cidr(net.trunc())
        } else if let Ok(ip) = IpAddr::from_str(host) {
            HostPattern::Cidr(IpNet::from(ip))
        } else if let Some(base) = host.strip_prefix("*.") {
            HostPattern::Wildcard(
                normalize_domain(base).map_err(|e| PolicyError(format!("rule {rule:?}: {e}")))?,
            )
        } else if host.contains('*') {
            return err(format!(
                "rule {rule:?}: '*' may only stand alone as the first label ('*.example.com')"
            ));
        } else if host.contains('/') {
            return err(format!(
                "rule {rule:?}: {host:?} is not a CIDR; write it as 10.0.0.0/8 or 2001:db8::/32"
            ));
        } else {
            HostPattern::Domain(
                normalize_domain(host).map_err(|e| PolicyError(format!("rule {rule:?}: {e}")))?,
            )
        };
        Ok(Rule { host, ports })
    }
}

impl Rule {
    fn covers_port(&self, port: u16) -> bool {
        self.ports.is_empty() || self.ports.iter().any(|r| (r.from..=r.to).contains(&port))
    }

    fn covers_name(&self, name: &str, port: u16) -> bool {
        let hit = match &self.host {
            HostPattern::Domain(d) => d == name,
            HostPattern::Wildcard(d) => name
                .strip_suffix(d.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            HostPattern::Cidr(_) => false,
        };
        hit && self.covers_port(port)
    }

    /// Whether the rule names exactly one address (a `/32` or `/128` CIDR).
    fn is_exact(&self) -> bool {
        matches!(&self.host, HostPattern::Cidr(n) if n.prefix_len() == n.max_prefix_len())
    }

    fn covers_addr(&self, ip: IpAddr, port: u16) -> bool {
        match &self.host {
            HostPattern::Cidr(net) => net.contains(&ip) && self.covers_port(port),
            _ => false,
        }
    }
}

impl Policy {
    /// An allowlist from rule strings ([`Rule::from_str`]), validated.
    ///
    /// # Errors
    /// [`PolicyError`] naming the first bad rule.
    pub fn allowlist(allow: &[&str], deny: &[&str]) -> Result<Policy, PolicyError> {
        let parse = |v: &[&str]| {
            v.iter()
                .map(|r| r.parse())
                .collect::<Result<Vec<Rule>, _>>()
        };
        let p = Policy::Allowlist {
            allow: parse(allow)?,
            deny: parse(deny)?,
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks the policy: at least one allow rule, at most [`MAX_RULES`] rules, and no allow
    /// rule that lies wholly in the permanently blocked set (it could never allow anything).
    ///
    /// # Errors
    /// [`PolicyError`] naming the rule at fault and what to do.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let Policy::Allowlist { allow, deny } = self else {
            return Ok(());
        };
        if allow.is_empty() {
            return err("an allowlist needs at least one --allow rule; use --none for no network");
        }
        if allow.len() + deny.len() > MAX_RULES {
            return err(format!("at most {MAX_RULES} rules in a policy"));
        }
        for r in allow {
            if let Some(why) = match &r.host {
                HostPattern::Cidr(net) => blocked_net(net),
                _ => None,
            } {
                return err(format!(
                    "rule {r}: {why} addresses can never be allowed (the permanently blocked \
                     set: loopback, unspecified, link-local, multicast, broadcast); remove it"
                ));
            }
            let localhost = match &r.host {
                HostPattern::Domain(d) | HostPattern::Wildcard(d) => {
                    d == "localhost" || d.ends_with(".localhost")
                }
                HostPattern::Cidr(_) => false,
            };
            if localhost {
                return err(format!(
                    "rule {r}: localhost names loopback, which can never be allowed; remove it"
                ));
            }
        }
        Ok(())
    }

    /// True for [`Policy::None`].
    pub fn is_none(&self) -> bool {
        matches!(self, Policy::None)
    }

    /// The profile's name: `none` or `allowlist`.
    pub fn profile(&self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::Allowlist { .. } => "allowlist",
        }
    }

    /// The allow and deny rules as written (`*.pypi.org:443`), which [`Policy::allowlist`]
    /// reads back to the same policy; both empty for `none`.
    pub fn rule_strings(&self) -> (Vec<String>, Vec<String>) {
        match self {
            Policy::None => (Vec::new(), Vec::new()),
            Policy::Allowlist { allow, deny } => (
                allow.iter().map(ToString::to_string).collect(),
                deny.iter().map(ToString::to_string).collect(),
            ),
        }
    }

    /// A policy from its canonical JSON ([`Policy::to_json`], as stored), validated as a new
    /// one would be.
    ///
    /// # Errors
    /// [`PolicyError`] when the text does not parse or the policy breaks a rule.
    pub fn from_json(text: &str) -> Result<Policy, PolicyError> {
        let p: Policy = serde_json::from_str(text)
            .map_err(|e| PolicyError(format!("a stored policy does not parse: {e}")))?;
        p.validate()?;
        Ok(p)
    }

    /// The canonical JSON form (what is stored and hashed).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The policy hash: hex SHA-256 of the canonical JSON, naming the effective policy (16 hex
    /// digits are shown to people; tokens carry all 64).
    pub fn hash(&self) -> String {
        let d = Sha256::digest(self.to_json().as_bytes());
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The rules, one per line, `allow RULE` or `deny RULE`; `none` for no network.
    pub fn describe(&self) -> String {
        match self {
            Policy::None => "none (no network)".into(),
            Policy::Allowlist { allow, deny } => {
                let mut lines: Vec<String> = allow.iter().map(|r| format!("allow {r}")).collect();
                lines.extend(deny.iter().map(|r| format!("deny  {r}")));
                lines.join("\n")
            }
        }
    }

    /// Step 1, before any DNS lookup: may this name (already a validated, lower-case bare host
    /// name) be resolved and connected to on `port`? Deny rules win; a name no allow rule
    /// covers is refused, and never resolved.
    pub fn check_name(&self, name: &str, port: u16) -> Verdict {
        let Policy::Allowlist { allow, deny } = self else {
            return Verdict::Deny {
                reason: "profile none: no network".into(),
            };
        };
        if name == "localhost" || name.ends_with(".localhost") {
            return Verdict::Deny {
                reason: "localhost is loopback (permanently blocked)".into(),
            };
        }
        if let Some(r) = deny.iter().find(|r| r.covers_name(name, port)) {
            return Verdict::Deny {
                reason: format!("deny rule {r}"),
            };
        }
        match allow.iter().find(|r| r.covers_name(name, port)) {
            Some(r) => Verdict::Allow {
                rule: r.to_string(),
            },
            None => Verdict::Deny {
                reason: format!("no allow rule covers {name} port {port}"),
            },
        }
    }

    /// Step 2: may the connection go to `ip:port`? `by_name` is the rule that allowed the name
    /// (step 1), or `None` for a numeric host. Order: the permanently blocked set (no rule opens
    /// it), deny rules, cloud fabric addresses ([`fabric`]: only an allow rule naming exactly the
    /// address opens one), private and special-purpose blocks ([`reserved`]: only an allow CIDR
    /// rule inside the block opens them, whatever name led there), then an allow CIDR rule or
    /// the name's rule.
    pub fn check_addr(&self, ip: IpAddr, port: u16, by_name: Option<&str>) -> Verdict {
        self.check_addr_from(ip, port, by_name, false)
    }

    /// [`Policy::check_addr`] for a gateway that knows whether `ip` is an address of its own
    /// host (`host_local`: assigned to one of the host's interfaces, whatever its range). Such
    /// an address reaches the host itself (its SSH, databases, the gateway), so after the
    /// permanently blocked set and deny rules it needs an allow rule naming exactly that
    /// address (`192.0.2.2/32`, `[2001:db8::2/128]`, optionally with ports); no wider CIDR and
    /// no domain opens it.
    pub fn check_addr_from(
        &self,
        ip: IpAddr,
        port: u16,
        by_name: Option<&str>,
        host_local: bool,
    ) -> Verdict {
        let Policy::Allowlist { allow, deny } = self else {
            return Verdict::Deny {
                reason: "profile none: no network".into(),
            };
        };
        let ip = canonical(ip);
        if let Some(why) = blocked(ip) {
            return Verdict::Deny {
                reason: format!("{ip} is {why} (permanently blocked)"),
            };
        }
        if let Some(r) = deny.iter().find(|r| r.covers_addr(ip, port)) {
            return Verdict::Deny {
                reason: format!("deny rule {r}"),
            };
        }
        if host_local {
            return match allow
                .iter()
                .find(|r| r.covers_addr(ip, port) && r.is_exact())
            {
                Some(r) => Verdict::Allow {
                    rule: r.to_string(),
                },
                None => Verdict::Deny {
                    reason: format!(
                        "{ip} is an address of the gateway's own host; it needs an allow rule \
                         naming exactly it"
                    ),
                },
            };
        }
        if let Some(what) = fabric(ip) {
            return match allow
                .iter()
                .find(|r| r.covers_addr(ip, port) && r.is_exact())
            {
                Some(r) => Verdict::Allow {
                    rule: r.to_string(),
                },
                None => Verdict::Deny {
                    reason: format!(
                        "{ip} is a cloud fabric address ({what}); it needs an allow rule naming \
                         exactly it"
                    ),
                },
            };
        }
        if let Some(block) = reserved(ip) {
            return match allow.iter().find(|r| {
                r.covers_addr(ip, port)
                    && matches!(&r.host, HostPattern::Cidr(n) if reserved_net(n) == Some(block))
            }) {
                Some(r) => Verdict::Allow {
                    rule: r.to_string(),
                },
                None => Verdict::Deny {
                    reason: format!(
                        "{ip} is {} ({}); it needs an explicit allow rule inside {}",
                        block.kind, block.net, block.net
                    ),
                },
            };
        }
        if let Some(r) = allow.iter().find(|r| r.covers_addr(ip, port)) {
            return Verdict::Allow {
                rule: r.to_string(),
            };
        }
        match by_name {
            Some(rule) => Verdict::Allow {
                rule: rule.to_owned(),
            },
            None => Verdict::Deny {
                reason: format!("no allow rule covers {ip} port {port}"),
            },
        }
    }
}

/// Keeps the `ipnet` types in the public API nameable without a direct dependency.
pub type Net = IpNet;
/// IPv4 network.
pub type Net4 = Ipv4Net;
/// IPv6 network.
pub type Net6 = Ipv6Net;

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn rules_parse_and_print_back() {
        for (input, shown) in [
            ("Example.COM", "example.com"),
            ("example.com.", "example.com"),
            ("*.example.com:443", "*.example.com:443"),
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("10.1.2.3/8", "10.0.0.0/8"),
            ("192.0.2.7:8000-8100", "192.0.2.7/32:8000-8100"),
            ("2001:db8::/32", "2001:db8::/32"),
            ("[2001:db8::1]:80,443", "[2001:db8::1/128]:80,443"),
        ] {
            let r: Rule = input.parse().unwrap();
            assert_eq!(r.to_string(), shown, "{input}");
            assert_eq!(
                r.to_string().parse::<Rule>().unwrap(),
                r,
                "{input} round trip"
            );
        }
    }

    #[test]
    fn bad_rules_are_refused_with_the_rule_named() {
        for bad in [
            "",
            "*",
            "*example.com",
            "a.*.example.com",
            "example.com:0",
            "example.com:70000",
            "example.com:443-80",
            "exa mple.com",
            "evil.example%23.allowed.example",
            "evil.example#.allowed.example",
            "user@example.com",
            "10.0.0.0/33",
            "127.1",
            "0x7f.1",
            "-bad.example",
            "[2001:db8::1",
        ] {
            let e = bad.parse::<Rule>().unwrap_err();
            assert!(!e.0.is_empty(), "{bad}");
        }
    }

    #[test]
    fn allow_rules_inside_the_blocked_set_are_refused() {
        for r in [
            "127.0.0.0/8",
            "127.0.0.1",
            "169.254.169.254",
            "169.254.0.0/16",
            "::1",
            "0.0.0.0",
            "224.0.0.0/4",
            "255.255.255.255",
            "fe80::/10",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "localhost",
            "*.localhost",
        ] {
            let e = Policy::allowlist(&[r], &[]).unwrap_err();
            assert!(e.0.contains("never be allowed"), "{r}: {e}");
        }
        assert!(Policy::allowlist(&[], &[]).is_err());
    }

    #[test]
    fn wildcard_matches_on_a_dot_boundary_only() {
        let p = Policy::allowlist(&["*.allowed.example"], &[]).unwrap();
        assert!(p.check_name("api.allowed.example", 443).is_allow());
        assert!(p.check_name("a.b.allowed.example", 443).is_allow());
        assert!(!p.check_name("allowed.example", 443).is_allow());
        assert!(!p.check_name("notallowed.example", 443).is_allow());
        assert!(!p.check_name("evilallowed.example", 443).is_allow());
        assert!(!p.check_name("allowed.example.evil.example", 443).is_allow());
    }

    #[test]
    fn deny_wins_and_ports_restrict() {
        let p = Policy::allowlist(
            &["*.example.com:443", "203.0.113.0/24"],
            &["bad.example.com", "203.0.113.9"],
        )
        .unwrap();
        assert!(p.check_name("ok.example.com", 443).is_allow());
        assert!(!p.check_name("ok.example.com", 80).is_allow());
        assert!(!p.check_name("bad.example.com", 443).is_allow());
        assert!(p.check_addr(ip("203.0.113.8"), 1, None).is_allow());
        assert!(!p.check_addr(ip("203.0.113.9"), 1, None).is_allow());
        assert!(!p.check_addr(ip("8.8.4.4"), 1, None).is_allow());
        // A name's rule allows its (public) answers.
        assert!(
            p.check_addr(ip("8.8.4.4"), 443, Some("*.example.com:443"))
                .is_allow()
        );
    }

    #[test]
    fn an_address_of_the_gateways_host_needs_a_rule_naming_exactly_it() {
        let ip: IpAddr = "192.0.2.2".parse().unwrap();
        let wide =
            Policy::allowlist(&["0.0.0.0/0", "192.0.2.0/24:8080", "*.example.com"], &[]).unwrap();
        assert!(
            wide.check_addr(ip, 8080, None).is_allow(),
            "not local: the /24 opens it"
        );
        assert!(!wide.check_addr_from(ip, 8080, None, true).is_allow());
        assert!(
            !wide
                .check_addr_from(ip, 443, Some("*.example.com"), true)
                .is_allow(),
            "a name resolving to the host's address"
        );
        let exact = Policy::allowlist(&["192.0.2.2/32:8080"], &[]).unwrap();
        assert!(exact.check_addr_from(ip, 8080, None, true).is_allow());
        assert!(!exact.check_addr_from(ip, 22, None, true).is_allow());
        let denied = Policy::allowlist(&["192.0.2.2/32"], &["192.0.2.2/32:22"]).unwrap();
        assert!(!denied.check_addr_from(ip, 22, None, true).is_allow());
    }

    #[test]
    fn private_ranges_need_a_rule_inside_them() {
        let broad = Policy::allowlist(&["0.0.0.0/0", "::/0", "*.corp.example"], &[]).unwrap();
        for a in [
            "10.0.0.5",
            "192.168.1.10",
            "100.64.0.1",
            "172.16.0.1",
            "fd00::1",
            "::ffff:10.0.0.5",
        ] {
            assert!(!broad.check_addr(ip(a), 443, None).is_allow(), "{a}");
            assert!(
                !broad
                    .check_addr(ip(a), 443, Some("*.corp.example"))
                    .is_allow(),
                "{a} by name"
            );
        }
        assert!(broad.check_addr(ip("8.8.8.8"), 443, None).is_allow());
        let explicit = Policy::allowlist(&["10.0.0.0/8", "fd00::/8"], &[]).unwrap();
        assert!(explicit.check_addr(ip("10.0.0.5"), 443, None).is_allow());
        assert!(explicit.check_addr(ip("fd00::1"), 443, None).is_allow());
        assert!(
            !explicit
                .check_addr(ip("192.168.1.10"), 443, None)
                .is_allow()
        );
    }

    #[test]
    fn special_purpose_blocks_need_a_rule_inside_them_and_fabric_an_exact_one() {
        let broad = Policy::allowlist(&["0.0.0.0/0", "::/0", "*.example.com"], &[]).unwrap();
        for a in [
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "198.18.0.1",
            "192.88.99.1",
            "2001:db8::1",
            "2001::1",
            "3fff::1",
            "::ffff:198.18.0.1",
            "168.63.129.16",
            "100.100.100.200",
            "fd00:ec2::254",
            "fd20:ce::254",
            "192.0.0.192",
        ] {
            assert!(!broad.check_addr(ip(a), 443, None).is_allow(), "{a}");
            assert!(
                !broad
                    .check_addr(ip(a), 443, Some("*.example.com"))
                    .is_allow(),
                "{a} by name"
            );
        }
        let inside =
            Policy::allowlist(&["198.18.0.0/24", "2001:db8::/48", "100.64.0.0/10"], &[]).unwrap();
        assert!(inside.check_addr(ip("198.18.0.9"), 443, None).is_allow());
        assert!(!inside.check_addr(ip("198.19.0.9"), 443, None).is_allow());
        assert!(inside.check_addr(ip("2001:db8::5"), 443, None).is_allow());
        let v = inside.check_addr(ip("100.100.100.200"), 80, None);
        assert!(
            matches!(&v, Verdict::Deny { reason } if reason.contains("fabric")),
            "a rule inside its private block does not open a fabric address: {v:?}"
        );
        let exact = Policy::allowlist(&["168.63.129.16/32:80"], &[]).unwrap();
        assert!(exact.check_addr(ip("168.63.129.16"), 80, None).is_allow());
        assert!(!exact.check_addr(ip("168.63.129.16"), 443, None).is_allow());
        assert!(broad.check_addr(ip("8.8.8.8"), 443, None).is_allow());
        let v = broad.check_addr(ip("198.18.0.1"), 443, None);
        assert!(
            matches!(&v, Verdict::Deny { reason } if reason.contains("198.18.0.0/15") && reason.contains("benchmarking")),
            "{v:?}"
        );
    }

    #[test]
    fn the_blocked_set_wins_over_every_rule_in_every_form() {
        let p = Policy::allowlist(&["0.0.0.0/0", "::/0"], &[]).unwrap();
        for a in [
            "127.0.0.1",
            "127.255.255.254",
            "0.0.0.0",
            "0.1.2.3",
            "169.254.169.254",
            "224.0.0.1",
            "239.255.255.250",
            "255.255.255.255",
            "240.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a9fe:a9fe",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
        ] {
            let v = p.check_addr(ip(a), 80, Some("x"));
            assert!(
                matches!(&v, Verdict::Deny { reason } if reason.contains("permanently")),
                "{a}: {v:?}"
            );
        }
    }

    #[test]
    fn profile_none_refuses_everything() {
        let p = Policy::None;
        assert!(!p.check_name("example.com", 443).is_allow());
        assert!(!p.check_addr(ip("8.8.8.8"), 443, None).is_allow());
    }

    #[test]
    fn the_hash_names_the_policy() {
        let a = Policy::allowlist(&["a.example"], &[]).unwrap();
        let b = Policy::allowlist(&["a.example"], &[]).unwrap();
        let c = Policy::allowlist(&["b.example"], &[]).unwrap();
        assert_eq!(a.hash(), b.hash());
        assert_ne!(a.hash(), c.hash());
        assert_ne!(a.hash(), Policy::None.hash());
        assert_eq!(a.hash().len(), 64);
        let back: Policy = serde_json::from_str(&a.to_json()).unwrap();
        assert_eq!(back, a);
    }

    #[test]
    fn rules_print_back_to_the_same_policy_and_stored_text_is_validated() {
        let p = Policy::allowlist(
            &["*.pypi.org:443", "10.1.0.0/16", "[2001:db8::/32]:80,443"],
            &["evil.pypi.org"],
        )
        .unwrap();
        let (allow, deny) = p.rule_strings();
        let a: Vec<&str> = allow.iter().map(String::as_str).collect();
        let d: Vec<&str> = deny.iter().map(String::as_str).collect();
        assert_eq!(Policy::allowlist(&a, &d).unwrap(), p);
        assert_eq!(p.profile(), "allowlist");
        assert_eq!(Policy::None.profile(), "none");
        assert_eq!(Policy::None.rule_strings(), (vec![], vec![]));
        assert_eq!(Policy::from_json(&p.to_json()).unwrap(), p);
        // Text that parses but would never pass validation is refused, not trusted.
        let blocked = r#"{"profile":"allowlist","allow":[{"host":{"kind":"cidr","value":"127.0.0.0/8"}}],"deny":[]}"#;
        assert!(Policy::from_json(blocked).is_err());
        assert!(Policy::from_json("{").is_err());
    }
}
