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
use sessionbox_opensandbox::GatewayAccess;
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

/// The server as scripts/opensandbox-up sets it up runs sessionbox's egress sidecar for a
/// sandbox created with a `networkPolicy`. A conversation under `none` (the default profile)
/// with `network_policy` on gets a deny-all policy, labelled `none`: a command reaches nothing,
/// not a listener on the Docker bridge this test starts (which sees no connection), not a
/// public address; the sandbox's own agent still answers (its port is published through the
/// sidecar). Destroying the conversation removes the sidecar too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_none_a_sandbox_with_the_sidecar_reaches_nothing() {
    let Some((domain, key)) = server() else {
        return;
    };
    let bridge = sessionbox_test_support::docker_bridge();
    let listener = std::net::TcpListener::bind((bridge, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let (rt, _store) = runtime_with(&domain, key, "netpol-none", |c| {
        c.egress.network_policy = true;
    });
    let conv = conv("netpol-none");
    let sidecars = SIDECARS.lock().await;
    let s = rt.open(&conv).await.unwrap();
    drop(sidecars);
    let id = rt.sandbox_id(&conv.key).await.unwrap().unwrap();
    let sandbox = rt.client().get(&id).await.unwrap();
    assert_eq!(
        sandbox
            .metadata
            .get(sessionbox_opensandbox::LABEL_NETWORK)
            .map(String::as_str),
        Some("none")
    );
    // The sidecar admits the host on the agent's published port: the direct path works.
    assert!(
        matches!(
            rt.agent_path(&id),
            Some(sessionbox_opensandbox::AgentPath::Direct { .. })
        ),
        "{:?}",
        rt.agent_path(&id)
    );
    let out = sh(
        &*s,
        ExecRequest::new(format!(
            "nc -w 3 {bridge} {port} </dev/null; echo bridge=$?; \
             nc -w 3 1.1.1.1 443 </dev/null; echo public=$?; echo alive"
        )),
    )
    .await;
    assert!(
        out.contains("bridge=1") && out.contains("public=1") && out.ends_with("alive\n"),
        "{out}"
    );
    assert!(
        listener.accept().is_err(),
        "the bridge listener saw a connection"
    );
    drop(s);
    rt.destroy(&conv.key).await.unwrap();
    assert_nothing_left(&rt).await;
    let sidecars = std::process::Command::new("docker")
        .args([
            "ps",
            "-a",
            "-q",
            "--filter",
            &format!("name=sandbox-egress-{id}"),
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&sidecars.stdout).trim().is_empty(),
        "the sidecar outlived its sandbox"
    );
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
