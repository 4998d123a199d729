//! A policy as an OpenSandbox `networkPolicy` (the sandbox-lifecycle create request's field,
//! enforced by OpenSandbox's egress sidecar).
//!
//! Two ways to use it, in order of preference:
//!
//! 1. **Only the gateway** ([`gateway_only`]): `defaultAction: deny` and one `allow` rule for the
//!    gateway, `HOST:PORT` (sessionbox's own sidecar enforces the address and that port alone;
//!    upstream's, which matches bare names, matches nothing and so fails closed). The sandbox gets `HTTPS_PROXY=http://sessionbox:TOKEN@GATEWAY:PORT`
//!    with a short-lived token ([`crate::token`]), and every decision (names before DNS, every
//!    answer, the permanently blocked set, CIDRs, ports, the log) is the gateway's.
//! 2. **Direct mapping** ([`direct`]): the policy's domain rules as sidecar rules (deny rules
//!    first: the sidecar evaluates in order). What the sidecar cannot express is returned in
//!    [`Mapping::not_expressible`] so the caller can refuse or warn.
//!
//! The limit of upstream's own sidecar, stated plainly: its `networkPolicy` targets are FQDNs and
//! `*.` wildcards only (IP/CIDR "not yet supported"), it has no ports, and in its default `dns`
//! enforcement mode it filters DNS answers, not connections: a program that connects to an IP
//! literal is not stopped unless it runs in `dns+nft` mode. sessionbox builds its own sidecar
//! (`sessionbox-agent egress-sidecar`, image `sessionbox/egress:local` from
//! `scripts/opensandbox-up`), which installs an nftables table in the sandbox's network
//! namespace before the sandbox starts: addresses, CIDR blocks and names resolved at start, the
//! gateway's port only, IPv4 and IPv6, default deny. It is tested against the real server.

use serde_json::{Value, json};

use crate::policy::{HostPattern, Policy};

/// A `networkPolicy` and what of the policy it could not express.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapping {
    /// The `networkPolicy` JSON object for the create request.
    pub network_policy: Value,
    /// Rules (as written) the sidecar cannot enforce: CIDRs, port restrictions.
    pub not_expressible: Vec<String>,
}

/// Deny everything: no rule, `defaultAction: deny` (what [`gateway_only`] gives for
/// `Policy::None`, and what a sandbox with no gateway to reach gets).
pub fn deny_all() -> Value {
    json!({"defaultAction": "deny", "egress": []})
}

/// Deny everything but the gateway at `gateway` (`HOST:PORT`, IPv6 in brackets), as one rule
/// whose target is that address (the server accepts any target text; sessionbox's sidecar
/// reads the port as a restriction to it). `Policy::None` gives deny-all with no rule.
///
/// # Errors
/// When `gateway` is not `HOST:PORT`.
pub fn gateway_only(policy: &Policy, gateway: &str) -> Result<Value, crate::PolicyError> {
    let host = crate::target::parse_authority(gateway)?.to_string();
    Ok(match policy {
        Policy::None => deny_all(),
        Policy::Allowlist { .. } => json!({
            "defaultAction": "deny",
            "egress": [{"action": "allow", "target": host}],
        }),
    })
}

/// The policy's domain rules as sidecar rules, deny first; see the module documentation.
pub fn direct(policy: &Policy) -> Mapping {
    let mut egress = Vec::new();
    let mut not_expressible = Vec::new();
    if let Policy::Allowlist { allow, deny } = policy {
        for (action, rules) in [("deny", deny), ("allow", allow)] {
            for r in rules {
                let target = match &r.host {
                    HostPattern::Domain(d) => d.clone(),
                    HostPattern::Wildcard(d) => format!("*.{d}"),
                    HostPattern::Cidr(_) => {
                        not_expressible.push(format!("{action} {r}"));
                        continue;
                    }
                };
                if !r.ports.is_empty() {
                    not_expressible.push(format!("{action} {r} (ports)"));
                }
                egress.push(json!({"action": action, "target": target}));
            }
        }
    }
    Mapping {
        network_policy: json!({"defaultAction": "deny", "egress": egress}),
        not_expressible,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_only_allows_just_the_gateway() {
        let p = Policy::allowlist(&["*.pypi.org"], &[]).unwrap();
        assert_eq!(
            gateway_only(&p, "egress.internal.example:3128").unwrap(),
            json!({"defaultAction": "deny", "egress": [{"action": "allow", "target": "egress.internal.example:3128"}]})
        );
        assert_eq!(
            gateway_only(&Policy::None, "egress.internal.example:3128").unwrap(),
            deny_all()
        );
        assert_eq!(deny_all()["egress"], json!([]));
        assert_eq!(deny_all()["defaultAction"], "deny");
        assert_eq!(
            gateway_only(&p, "10.0.0.1:3128").unwrap()["egress"][0]["target"],
            "10.0.0.1:3128",
            "sessionbox's sidecar enforces addresses and ports"
        );
        assert_eq!(
            gateway_only(&p, "[2001:db8::1]:3128").unwrap()["egress"][0]["target"],
            "[2001:db8::1]:3128"
        );
        assert!(gateway_only(&p, "not a host").is_err());
        assert!(gateway_only(&p, "10.0.0.1").is_err(), "the port is needed");
    }

    #[test]
    fn direct_mapping_puts_deny_first_and_reports_what_it_cannot_express() {
        let p = Policy::allowlist(
            &["*.pypi.org", "api.example.com:443", "203.0.113.0/24"],
            &["evil.pypi.org"],
        )
        .unwrap();
        let m = direct(&p);
        assert_eq!(
            m.network_policy,
            json!({"defaultAction": "deny", "egress": [
                {"action": "deny", "target": "evil.pypi.org"},
                {"action": "allow", "target": "*.pypi.org"},
                {"action": "allow", "target": "api.example.com"},
            ]})
        );
        assert_eq!(
            m.not_expressible,
            vec!["allow api.example.com:443 (ports)", "allow 203.0.113.0/24"]
        );
    }
}
