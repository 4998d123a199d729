//! The shared cases (`shared/cases/egress-targets.json`, copied to `tests/cases/`), table-driven:
//! every numeric target is classified by the address it connects to, and every allowlist case
//! matches as stated. The proxy forms are exercised against a running gateway in `gateway.rs`.

use sessionbox_egress::policy::{Policy, Verdict};
use sessionbox_egress::target::{Host, parse_host};

fn cases() -> serde_json::Value {
    serde_json::from_str(include_str!("cases/egress-targets.json")).unwrap()
}

/// What the policy says about connecting to `host` on port 443 (a name is checked first, then,
/// for a numeric host, the address it denotes).
fn verdict(policy: &Policy, host: &str) -> Verdict {
    match parse_host(host.trim_start_matches('[').trim_end_matches(']'))
        .or_else(|_| parse_host(host))
    {
        Err(e) => Verdict::Deny { reason: e.0 },
        Ok(Host::Name(n)) => policy.check_name(&n, 443),
        Ok(Host::Ip(ip)) => policy.check_addr(ip, 443, None),
    }
}

#[test]
fn every_numeric_target_is_classified_by_the_address_it_connects_to() {
    let c = cases();
    // The broadest public allowlist there is: it still opens neither blocked nor private
    // addresses.
    let broad = Policy::allowlist(&["0.0.0.0/0", "::/0"], &[]).unwrap();
    // Private ranges allowed explicitly.
    let private = Policy::allowlist(
        &["10.0.0.0/8", "192.168.0.0/16", "100.64.0.0/10", "0.0.0.0/0"],
        &[],
    )
    .unwrap();
    let targets = c["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 13);
    for t in targets {
        let host = t["host"].as_str().unwrap();
        let expect = t["expect"].as_str().unwrap();
        let v = verdict(&broad, host);
        assert!(!v.is_allow(), "{host}: {v:?}");
        let with_private = verdict(&private, host);
        match expect {
            "refuse" => assert!(
                matches!(&with_private, Verdict::Deny { reason } if reason.contains("permanently")),
                "{host} must be permanently blocked: {with_private:?}"
            ),
            "refuse unless private allowed" => {
                assert!(with_private.is_allow(), "{host}: {with_private:?}")
            }
            other => panic!("unknown expectation {other:?}"),
        }
    }
}

#[test]
fn every_allowlist_case_matches_as_stated() {
    let c = cases();
    for t in c["allowlist_matching"].as_array().unwrap() {
        let allow = t["allow"].as_str().unwrap();
        let host = t["host"].as_str().unwrap();
        let policy = Policy::allowlist(&[allow], &[]).unwrap();
        let v = verdict(&policy, host);
        match t["expect"].as_str().unwrap() {
            "allow" => assert!(v.is_allow(), "{allow} / {host}: {v:?}"),
            "deny" => assert!(!v.is_allow(), "{allow} / {host}: {v:?}"),
            other => panic!("unknown expectation {other:?}"),
        }
    }
}

#[test]
fn no_rule_can_allow_a_permanently_blocked_target() {
    // Each blocked target, written as an allow rule of its own, is refused by validation, and a
    // policy that allows everything public still refuses it.
    for host in [
        "127.0.0.1",
        "::1",
        "::ffff:127.0.0.1",
        "169.254.169.254",
        "224.0.0.1",
        "0.0.0.0",
    ] {
        let e = Policy::allowlist(&[host], &[]).unwrap_err();
        assert!(e.0.contains("never be allowed"), "{host}: {e}");
    }
}
