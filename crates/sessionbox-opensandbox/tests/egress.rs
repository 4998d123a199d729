//! Network for the `opensandbox` runtime against a real `opensandbox-server` 1.1.1 on Docker
//! (scripts/opensandbox-up): what the server does with a `networkPolicy`, and the proxy
//! variables with a per-command token that commands get. The gateway itself, reached from a
//! sandbox, is tested through the real binary in `crates/sessionbox/tests/egress.rs`.

use crate::common;

use std::time::Duration;

use chrono::Utc;
use common::*;
use sessionbox_core::{ExecRequest, Runtime, Session};
use sessionbox_egress::Policy;
use sessionbox_egress::token::TokenKey;
use sessionbox_opensandbox::{
    CreateSandbox, GatewayAccess, ListFilter, Metadata, OpenSandboxError, OpenSandboxRuntime,
};
use sessionbox_store::{PolicyScope, Store};

async fn sh(s: &dyn Session, request: ExecRequest) -> String {
    let cmd = request.command.clone();
    let r = s.exec(request).await.unwrap();
    assert_eq!(
        r.shell_exit_code(),
        0,
        "{cmd}: {:?}",
        String::from_utf8_lossy(&r.stderr)
    );
    String::from_utf8(r.stdout).unwrap()
}

fn set_policy(store: &Store, conv: &sessionbox_core::ConversationRef, p: &Policy) {
    store
        .set_egress_policy(
            &PolicyScope::Conversation(conv.clone()),
            &p.to_json(),
            &p.hash(),
            Utc::now(),
        )
        .unwrap();
}

/// The exact answer of this server (no egress sidecar image configured, as
/// scripts/opensandbox-up sets it up) to a create that carries a `networkPolicy`, whatever the
/// policy; and the typed error the runtime turns it into, with nothing left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_without_the_egress_sidecar_refuses_a_network_policy_and_the_runtime_says_what_to_do()
 {
    let Some((domain, key)) = server() else {
        return;
    };
    let name = instance("netpol");
    let client = client(&domain, key.clone());
    let mut metadata = Metadata::new();
    metadata.insert("sessionbox.instance", &name).unwrap();
    let allowlist = Policy::allowlist(&["*.pypi.org:443"], &[]).unwrap();
    for policy in [
        sessionbox_egress::opensandbox::gateway_only(&allowlist, "egress.sessionbox.test").unwrap(),
        sessionbox_egress::opensandbox::deny_all(),
    ] {
        let mut req = CreateSandbox::new(
            "sessionbox/sandbox:local",
            vec!["tail".into(), "-f".into(), "/dev/null".into()],
        );
        req.timeout = Some(Duration::from_secs(120));
        req.metadata = metadata.clone();
        req.resource_limits.insert("cpu".into(), "1".into());
        req.resource_limits.insert("memory".into(), "256Mi".into());
        req.network_policy = Some(policy.clone());
        match client.create(&req).await {
            Err(OpenSandboxError::NetworkPolicyUnsupported {
                status,
                code,
                message,
            }) => {
                assert_eq!(status, 400, "{policy}");
                assert_eq!(code, "SANDBOX::INVALID_PARAMETER");
                assert_eq!(
                    message,
                    "egress.image must be configured when networkPolicy is provided."
                );
            }
            other => panic!("{policy}: {other:?}"),
        }
    }
    let filter = ListFilter {
        metadata,
        states: Vec::new(),
    };
    assert!(client.list(&filter).await.unwrap().is_empty());

    // The runtime with the option on: a typed error naming the way out, no sandbox, no record.
    let (rt, store) = runtime_with(&domain, key.clone(), "netpol-rt", |c| {
        c.egress.network_policy = true;
        c.egress.gateway = Some(
            GatewayAccess::new("egress.sessionbox.test:3128", TokenKey::from_bytes([9; 32]))
                .unwrap(),
        );
    });
    let conv = conv("netpol");
    set_policy(&store, &conv, &allowlist);
    let e = match rt.open(&conv).await {
        Err(e) => e,
        Ok(_) => panic!("a sandbox opened without the network policy it needs"),
    };
    assert_eq!(e.code(), "runtime_unavailable", "{e}");
    let text = e.to_string();
    for says in [
        "egress.image must be configured when networkPolicy is provided.",
        "network_policy setting",
        "egress sidecar image",
    ] {
        assert!(text.contains(says), "{says}: {text}");
    }
    assert!(rt.sandbox_id(&conv.key).await.unwrap().is_none());
    assert_nothing_left(&rt).await;

    // The sidecar matches names only: an address for the gateway is refused up front.
    let mut config = sessionbox_opensandbox::OpenSandboxConfig::new(
        client_config(&domain, key),
        instance("netpol-ip"),
    );
    config.egress.network_policy = true;
    config.egress.gateway =
        Some(GatewayAccess::new("172.17.0.1:3128", TokenKey::from_bytes([9; 32])).unwrap());
    let e =
        OpenSandboxRuntime::new(config, directory(Store::open_in_memory().unwrap())).unwrap_err();
    assert_eq!(e.code(), "invalid_request");
    assert!(e.to_string().contains("host name"), "{e}");
}

/// With a gateway, each command of an allowlisted conversation gets the proxy variables with
/// its own fresh token (conversation key, policy hash, expiry = its timeout + 60 s), through
/// execd's per-command `envs`; a conversation under `none` gets no proxy at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commands_get_a_fresh_proxy_token_for_an_allowlist_and_none_get_no_proxy() {
    let Some((domain, key)) = server() else {
        return;
    };
    let signing = TokenKey::from_bytes([7; 32]);
    let (rt, store) = runtime_with(&domain, key, "proxyenv", |c| {
        c.egress.gateway =
            Some(GatewayAccess::new("egress.sessionbox.test:3128", signing.clone()).unwrap());
    });
    let conv = conv("proxyenv");
    let s = rt.open(&conv).await.unwrap();
    assert_eq!(
        sh(s.as_ref(), ExecRequest::new("env | grep -ci proxy || true")).await,
        "0\n"
    );

    let policy = Policy::allowlist(&["*.pypi.org:443"], &[]).unwrap();
    set_policy(&store, &conv, &policy);
    let mut req =
        ExecRequest::new("echo \"$HTTPS_PROXY\"; echo \"$http_proxy\"; echo \"$NO_PROXY\"");
    req.timeout = Duration::from_secs(30);
    let now = Utc::now().timestamp() as u64;
    let out = sh(s.as_ref(), req.clone()).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(lines[0], lines[1]);
    assert_eq!(lines[2], "localhost,127.0.0.1,::1");
    let token = lines[0]
        .strip_prefix("http://sessionbox:")
        .and_then(|r| r.strip_suffix("@egress.sessionbox.test:3128"))
        .unwrap_or_else(|| panic!("{out}"));
    let claims = signing.verify(token, now).unwrap();
    assert_eq!(claims.conversation, conv.key.as_str());
    assert_eq!(claims.policy_hash, policy.hash());
    assert!(
        (now + 90..=now + 100).contains(&claims.expires),
        "30 s timeout + 60 s: {} vs now {now}",
        claims.expires
    );
    // Renewed on use: the next command gets its own token, valid from its own start.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let out = sh(s.as_ref(), req.clone()).await;
    let second = out.lines().next().unwrap().to_owned();
    assert_ne!(second, lines[0]);
    let token2 = second
        .strip_prefix("http://sessionbox:")
        .and_then(|r| r.strip_suffix("@egress.sessionbox.test:3128"))
        .unwrap();
    assert!(signing.verify(token2, now).unwrap().expires > claims.expires);
    // A policy change shows in the next token's hash (the gateway refuses older ones).
    let changed = Policy::allowlist(&["*.pypi.org:443"], &["evil.pypi.org"]).unwrap();
    set_policy(&store, &conv, &changed);
    let out = sh(s.as_ref(), req.clone()).await;
    let token3 = out
        .lines()
        .next()
        .unwrap()
        .strip_prefix("http://sessionbox:")
        .and_then(|r| r.strip_suffix("@egress.sessionbox.test:3128"))
        .unwrap()
        .to_owned();
    assert_eq!(
        signing.verify(&token3, now).unwrap().policy_hash,
        changed.hash()
    );
    // The caller's own variables win.
    let mut own = ExecRequest::new("echo \"$HTTPS_PROXY\"");
    own.env
        .insert("HTTPS_PROXY".into(), "http://proxy.example:8080".into());
    assert_eq!(sh(s.as_ref(), own).await, "http://proxy.example:8080\n");
    // Back to none: no proxy.
    set_policy(&store, &conv, &Policy::None);
    assert_eq!(
        sh(s.as_ref(), ExecRequest::new("env | grep -ci proxy || true")).await,
        "0\n"
    );
    s.close().await.unwrap();
    rt.destroy(&conv.key).await.unwrap();
    assert_nothing_left(&rt).await;
}
