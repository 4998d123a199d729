//! Every case of `shared/cases/endpoint-urls.json` (copied into `tests/cases/`), table-driven,
//! plus the whole kind of each fault.

use std::collections::BTreeMap;

use sessionbox_opensandbox::endpoint::{EndpointPolicy, validate_endpoint};

fn cases() -> serde_json::Value {
    serde_json::from_str(include_str!("cases/endpoint-urls.json")).unwrap()
}

fn proxy_policy(lifecycle: &str) -> EndpointPolicy {
    EndpointPolicy {
        lifecycle: format!("{lifecycle}/").parse().unwrap(),
        use_server_proxy: true,
        direct_hosts: vec![],
        direct_lifecycle_host: false,
    }
}

#[test]
fn every_shared_endpoint_case_gets_its_verdict() {
    let c = cases();
    let policy = proxy_policy(c["lifecycle"].as_str().unwrap());
    let id = c["sandbox_id"].as_str().unwrap();
    let port = c["port"].as_u64().unwrap() as u16;
    let cases = c["cases"].as_array().unwrap();
    assert!(cases.len() >= 12);
    for case in cases {
        let endpoint = case["endpoint"].as_str().unwrap();
        let accept = case["expect"] == "accept";
        let got = validate_endpoint(&policy, id, port, endpoint, &BTreeMap::new());
        assert_eq!(
            got.is_ok(),
            accept,
            "{endpoint:?} ({}): {got:?}",
            case["why"]
        );
        if let Ok(v) = got {
            assert_eq!(
                v.url,
                format!("http://127.0.0.1:8080/v1/sandboxes/{id}/proxy/{port}")
            );
        }
    }
}

#[test]
fn every_shared_header_case_gets_its_verdict() {
    let c = cases();
    let policy = proxy_policy(c["lifecycle"].as_str().unwrap());
    let id = c["sandbox_id"].as_str().unwrap();
    for case in c["headers"].as_array().unwrap() {
        let port = case["port"].as_u64().unwrap() as u16;
        let headers: BTreeMap<String, String> =
            serde_json::from_value(case["returned"].clone()).unwrap();
        let endpoint = format!("127.0.0.1:8080/v1/sandboxes/{id}/proxy/{port}");
        let got = validate_endpoint(&policy, id, port, &endpoint, &headers);
        let accept = case["expect"].as_str().unwrap().starts_with("accept");
        assert_eq!(got.is_ok(), accept, "{case}: {got:?}");
    }
}

#[test]
fn each_fault_kind_is_refused_wherever_it_appears() {
    let policy = proxy_policy("http://127.0.0.1:8080");
    let id = "abc";
    let good = "http://127.0.0.1:8080/v1/sandboxes/abc/proxy/44772";
    let none = BTreeMap::new();
    assert!(validate_endpoint(&policy, id, 44772, good, &none).is_ok());
    assert!(
        validate_endpoint(
            &policy,
            id,
            44772,
            "127.0.0.1:8080/sandboxes/abc/proxy/44772",
            &none
        )
        .is_ok()
    );
    // Control characters and whitespace, at every position.
    for bad_char in ['\t', '\n', '\r', '\0', ' ', '\u{7f}', '\u{85}', '\u{a0}'] {
        for at in [0, 7, 20, good.len()] {
            let mut s = good.to_owned();
            s.insert(at, bad_char);
            assert!(
                validate_endpoint(&policy, id, 44772, &s, &none).is_err(),
                "{s:?}"
            );
        }
    }
    for bad in [
        "http://127.0.0.1:8080/v1/sandboxes/abc/proxy/44772/%2e%2e/x",
        "http://127.0.0.1:8080/v1/sandboxes/abc/proxy/44772/%2E",
        "http://127.0.0.1:8080/v1/sandboxes/abc/../abc/proxy/44772",
        "http://127.0.0.1:8080/v1/sandboxes/abc/proxy/44772/./",
        "http://127.0.0.1:8080/v1/sandboxes/abc/proxy/44772?",
        "http://127.0.0.1:8080/v1/sandboxes/abc/proxy/44772#",
        "http://user@127.0.0.1:8080/v1/sandboxes/abc/proxy/44772",
        "http://:pw@127.0.0.1:8080/v1/sandboxes/abc/proxy/44772",
        "http://127.0.0.1:8080/v1/sandboxes/ab/proxy/44772",
        "http://127.0.0.1:8080/v1/sandboxes/abcd/proxy/44772",
        "http://127.0.0.1:8080/v1/sandboxes/abc/proxy/4477",
        "http://127.0.0.1:8080/v2/sandboxes/abc/proxy/44772",
        "http://127.0.0.1:8080/evil/v1/sandboxes/abc/proxy/44772",
        "http://127.0.0.1:8081/v1/sandboxes/abc/proxy/44772",
        "http://localhost:8080/v1/sandboxes/abc/proxy/44772",
        "ftp://127.0.0.1:8080/v1/sandboxes/abc/proxy/44772",
        "http://127.0.0.1:8080/v1/sandboxes/abc/proxy/44772/é",
        "http://127.0.0.1:8080\\v1/sandboxes/abc/proxy/44772",
        "",
    ] {
        assert!(
            validate_endpoint(&policy, id, 44772, bad, &none).is_err(),
            "{bad:?}"
        );
    }
}

#[test]
fn direct_endpoints_need_an_allowlisted_host() {
    let mut policy = proxy_policy("http://127.0.0.1:8080");
    policy.use_server_proxy = false;
    let none = BTreeMap::new();
    let direct = "127.0.0.1:41234/proxy/44772";
    assert!(validate_endpoint(&policy, "abc", 44772, direct, &none).is_err());
    policy.direct_hosts = vec!["127.0.0.1".into()];
    assert!(validate_endpoint(&policy, "abc", 44772, direct, &none).is_ok());
    assert!(validate_endpoint(&policy, "abc", 44772, "10.0.0.9:41234/proxy/44772", &none).is_err());
}

#[test]
fn errors_show_hostile_endpoints_escaped() {
    let policy = proxy_policy("http://127.0.0.1:8080");
    let e = validate_endpoint(
        &policy,
        "abc",
        44772,
        "http://127.0.0.1:8080/v1/sandboxes/abc/proxy/44772/\r\nX-Injected: 1",
        &BTreeMap::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(!e.contains('\r') && !e.contains('\n'), "{e:?}");
}

#[test]
fn direct_endpoints_on_the_lifecycle_host_only_when_trusted() {
    let mut policy = proxy_policy("http://127.0.0.1:8080");
    policy.use_server_proxy = false;
    let none = BTreeMap::new();
    // What the 1.1.1 server answers in bridge mode: any mapped port of the lifecycle host.
    let direct = "127.0.0.1:41234/proxy/44772";
    assert!(validate_endpoint(&policy, "abc", 44772, direct, &none).is_err());
    policy.direct_lifecycle_host = true;
    let ok = validate_endpoint(&policy, "abc", 44772, direct, &none).unwrap();
    assert_eq!(ok.url, "http://127.0.0.1:41234/proxy/44772");
    // Host mode: no path.
    assert!(validate_endpoint(&policy, "abc", 44772, "127.0.0.1:44772", &none).is_ok());
    for bad in [
        // Another address, even on loopback; a name that resolves to the lifecycle host.
        "127.0.0.2:41234/proxy/44772",
        "localhost:41234/proxy/44772",
        "evil.example:41234/proxy/44772",
        // Another route, or another port's proxy.
        "127.0.0.1:41234/proxy/8080",
        "127.0.0.1:41234/v1/sandboxes/abc/proxy/44772",
        "127.0.0.1:41234/elsewhere",
        "127.0.0.1:41234/proxy/44772/../../x",
        "http://127.0.0.1@evil.example:41234/proxy/44772",
    ] {
        assert!(
            validate_endpoint(&policy, "abc", 44772, bad, &none).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn direct_allowlist_entries_are_names_addresses_or_blocks() {
    let mut policy = proxy_policy("http://127.0.0.1:8080");
    policy.use_server_proxy = false;
    policy.direct_hosts = vec![
        "172.17.0.0/16".into(),
        "sandbox-host.internal".into(),
        "fd00::/8".into(),
        "10.1.2.3".into(),
        "not-a-block/99".into(),
    ];
    let none = BTreeMap::new();
    for ok in [
        "172.17.0.2:44772",
        "172.17.255.254:41000/proxy/44772",
        "SANDBOX-HOST.internal:41000/proxy/44772",
        "[fd12::1]:41000/proxy/44772",
        "10.1.2.3:41000/proxy/44772",
    ] {
        assert!(
            validate_endpoint(&policy, "abc", 44772, ok, &none).is_ok(),
            "{ok}"
        );
    }
    for bad in [
        "172.18.0.2:44772",
        "10.1.2.4:41000/proxy/44772",
        "[fe80::1]:41000/proxy/44772",
        "sandbox-host.internal.evil.example:41000/proxy/44772",
        "evil-sandbox-host.internal:41000/proxy/44772",
        // The lifecycle host is not trusted unless asked for.
        "127.0.0.1:41000/proxy/44772",
    ] {
        assert!(
            validate_endpoint(&policy, "abc", 44772, bad, &none).is_err(),
            "{bad}"
        );
    }
}
