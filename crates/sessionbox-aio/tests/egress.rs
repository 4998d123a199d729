//! Egress on the `aio` runtime, with real parts: the AIO test server runs the commands on this
//! host, a real egress gateway (`sessionbox_egress::Gateway`, token authentication) listens on
//! loopback, and the targets are HTTP servers in a network namespace this test creates, on
//! private addresses the policy names explicitly. No traffic goes anywhere else.
//!
//! Needs root (the namespace); CI runs it as root. Without root it is skipped with a note.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them); support modules are `pub` for the files that use them,
// and a test binary has no public API.
#![allow(clippy::unwrap_used, unreachable_pub)]

mod common;

#[path = "../../sessionbox-egress/tests/support/mod.rs"]
mod net;

use std::sync::Arc;
use std::time::Duration;

use common::Target;
use sessionbox_aio::AioEgress;
use sessionbox_core::{ConversationRef, ExecRequest, Runtime, Session};
use sessionbox_egress::token::{GatewayAccess, TokenKey};
use sessionbox_egress::{Auth, Gateway, GatewayConfig, Policy};
use sessionbox_manager::StoreDirectory;
use sessionbox_store::{PolicyScope, Store};

async fn out(s: &dyn Session, cmd: &str) -> (i32, String) {
    let r = s.exec(ExecRequest::new(cmd)).await.unwrap();
    (
        r.shell_exit_code(),
        String::from_utf8_lossy(&r.stdout).into_owned(),
    )
}

/// A conversation whose policy is an allowlist reaches its allowed target through the gateway
/// (its command got a proxy with a token of its own), and is refused a target outside the
/// allowlist, which never sees a connection; every verdict is logged for that conversation. A
/// conversation with the profile `none` gets no proxy variables at all, and a policy change
/// applies to the next command.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn allowlisted_commands_go_through_the_gateway_with_a_token_of_their_own() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: the test network needs root (CI runs this as root)");
        return;
    }
    let testnet = net::TestNet::new();
    let allowed = testnet.listen(0);
    let allowed_port = allowed.local_addr().unwrap().port();
    let (allowed_hits, heads) = net::http_server(allowed);
    let denied = testnet.listen(0);
    let denied_port = denied.local_addr().unwrap().port();
    let (denied_hits, _) = net::http_server(denied);

    // The gateway: token authentication with a key of the test's own; the policy it checks is
    // the one the runtime's directory gives (the same policy, stored for the conversation).
    let dir = tempfile::tempdir().unwrap();
    let key = TokenKey::load_or_create(&dir.path().join("egress.key")).unwrap();
    let control = Arc::new(net::TestControl::default());
    let gw = Gateway::new(
        GatewayConfig::default(),
        control.clone(),
        Auth::Token(key.clone()),
    )
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = l.local_addr().unwrap();
    tokio::spawn(async move { gw.serve_tcp(l).await });

    let allow = format!("{}:{allowed_port}", testnet.peer_ip);
    let policy = Policy::allowlist(&[&allow], &[]).unwrap();
    control.set(policy.clone());
    let conv = ConversationRef::parse("default", "egress-1").unwrap();
    let store = Store::open_in_memory().unwrap();
    let scope = PolicyScope::Conversation(conv.clone());
    store
        .set_egress_policy(
            &scope,
            &policy.to_json(),
            &policy.hash(),
            chrono::Utc::now(),
        )
        .unwrap();

    let target = Target::local(None);
    let runtime = target.runtime().with_egress(AioEgress {
        gateway: GatewayAccess::new(&proxy.to_string(), key).unwrap(),
        directory: Arc::new(StoreDirectory::new(store.clone())),
    });
    let s = runtime.open(&conv).await.unwrap();

    // Allowed: through the proxy (curl takes HTTP_PROXY with the token as its password).
    let url = format!("http://{}:{allowed_port}/hello", testnet.peer_ip);
    let (code, body) = out(&*s, &format!("curl -sS --max-time 10 {url}")).await;
    assert_eq!((code, body.as_str()), (0, "hello from /hello\n"));
    assert_eq!(allowed_hits.count(), 1);
    // The target saw the gateway's request, not the token.
    assert!(
        !heads.lock().unwrap()[0]
            .to_ascii_lowercase()
            .contains("proxy-authorization")
    );
    let e = control
        .ended(&format!("{}:{allowed_port}", testnet.peer_ip))
        .await;
    assert!(e.allowed, "{e:?}");
    assert_eq!(e.conversation, conv.key.as_str());

    // Outside the allowlist: refused at the gateway (403), the target never connected to.
    let url = format!("http://{}:{denied_port}/", testnet.peer_ip);
    let (_, status) = out(
        &*s,
        &format!("curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 {url}"),
    )
    .await;
    assert_eq!(status, "403");
    assert_eq!(denied_hits.count(), 0);
    let e = control
        .ended(&format!("{}:{denied_port}", testnet.peer_ip))
        .await;
    assert!(!e.allowed, "{e:?}");

    // A token is issued for each command and lives as long as that command may (its
    // timeout plus a margin): a short command and a long one carry different tokens.
    let proxy_of = |timeout: u64| {
        let mut r = ExecRequest::new("printf %s \"$HTTPS_PROXY\"");
        r.timeout = Duration::from_secs(timeout);
        r
    };
    let a = s.exec(proxy_of(5)).await.unwrap();
    let b = s.exec(proxy_of(300)).await.unwrap();
    let (a, b) = (
        String::from_utf8(a.stdout).unwrap(),
        String::from_utf8(b.stdout).unwrap(),
    );
    assert!(a.starts_with("http://sessionbox:sbx1."), "{a}");
    assert!(a.ends_with(&format!("@{proxy}")), "{a}");
    assert_ne!(
        a, b,
        "a token must be issued per command, for its own lifetime"
    );

    // Profile `none` from the next command on: no proxy variables at all.
    assert!(store.clear_egress_policy(&scope).unwrap());
    let (_, env) = out(&*s, "env | grep -i _proxy || true").await;
    assert_eq!(env, "", "the profile none gets no proxy");
    Box::new(s).close().await.unwrap();
    runtime.destroy(&conv.key).await.unwrap();
    // Keep the runtime's server alive to here.
    drop(target);
    tokio::time::sleep(Duration::from_millis(10)).await;
}
