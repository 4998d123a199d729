//! The direct path to a sandbox's agent against the real server: used when the server's
//! direct endpoint is allowlisted and answers (the server's proxy sees none of the requests),
//! the proxy when it does not answer, and a direct endpoint outside the allowlist refused with
//! a typed error before anything is sent to it.
//!
//! The fallback and hostile cases need a server that answers the endpoints call differently
//! from the real one: a relay in front of the real server passes every request through
//! unchanged except the `use_server_proxy=false` endpoint answer, which it replaces.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use common::*;
use sessionbox_core::{ExecRequest, Runtime};
use sessionbox_opensandbox::{AgentPath, DirectMode, EXECD_PORT, OpenSandboxError};
use tokio::net::TcpListener;

fn agent_key() -> sessionbox_egress::token::TokenKey {
    sessionbox_egress::token::TokenKey::from_bytes([7; 32])
}

/// The server's access log (scripts/opensandbox-up's state directory).
fn server_log() -> std::path::PathBuf {
    let state = std::env::var("OPENSANDBOX_STATE").unwrap_or_else(|_| {
        let cache = std::env::var("XDG_CACHE_HOME")
            .unwrap_or_else(|_| format!("{}/.cache", std::env::var("HOME").unwrap()));
        format!("{cache}/sessionbox/opensandbox")
    });
    std::path::Path::new(&state).join("server.log")
}

/// How many requests the server's proxy served for sandbox `id`, by its access log.
fn proxied_requests(id: &str) -> usize {
    let log = std::fs::read_to_string(server_log()).expect("the server's log");
    let needle = format!("/sandboxes/{id}/proxy/");
    log.lines()
        .filter(|l| l.contains("uvicorn.access") && l.contains(&needle))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commands_and_files_go_straight_to_the_agent() {
    let Some((domain, key)) = server() else {
        return;
    };
    let (rt, _store) = runtime_with(&domain, key.clone(), "direct", |c| {
        c.agent_key = Some(agent_key());
    });
    let a = conv("direct-a");
    let s = rt.open(&a).await.unwrap();
    let id = rt.sandbox_id(&a.key).await.unwrap().unwrap();
    let Some(AgentPath::Direct { url }) = rt.agent_path(&id) else {
        panic!("not direct: {:?}", rt.agent_path(&id));
    };
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert!(url.ends_with("/proxy/44772"), "{url}");

    let before = proxied_requests(&id);
    for i in 0..5 {
        let r = s
            .exec(ExecRequest::new(format!("echo run-{i}")))
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&r.stdout), format!("run-{i}\n"));
    }
    s.write("d.txt", b"direct").await.unwrap();
    assert_eq!(s.read("d.txt").await.unwrap(), b"direct");
    drop(s);
    // A second open probes again and stays direct.
    let s = rt.open(&a).await.unwrap();
    assert_eq!(s.read("d.txt").await.unwrap(), b"direct");
    drop(s);
    // Give the server a moment to flush its log, then: not one request through its proxy.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(proxied_requests(&id), before, "requests crossed the proxy");

    // The direct port takes only requests with the conversation's token.
    let anonymous = reqwest::Client::new()
        .get(format!("{url}/ping"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);

    // With direct = "off", the same sandbox is reached through the proxy.
    let (off, _store2) = runtime_with(&domain, key, "direct-off", |c| {
        c.direct = DirectMode::Off;
        c.agent_key = Some(agent_key());
    });
    let b = conv("direct-off");
    let s = off.open(&b).await.unwrap();
    let id_b = off.sandbox_id(&b.key).await.unwrap().unwrap();
    let before = proxied_requests(&id_b);
    let r = s.exec(ExecRequest::new("echo via-proxy")).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "via-proxy\n");
    assert!(matches!(
        off.agent_path(&id_b),
        Some(AgentPath::Proxy { .. })
    ));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(proxied_requests(&id_b) > before, "the proxy saw nothing");
    drop(s);

    rt.destroy(&a.key).await.unwrap();
    off.destroy(&b.key).await.unwrap();
    assert_eq!(rt.agent_path(&id), None);
    assert_nothing_left(&rt).await;
    assert_nothing_left(&off).await;
}

/// What the relay answers to `GET .../endpoints/44772?use_server_proxy=false`.
#[derive(Clone)]
struct Relay {
    upstream: String,
    own: String,
    direct_answer: String,
    http: reqwest::Client,
}

async fn relay(State(r): State<Arc<Relay>>, req: Request) -> Response {
    let path_q = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    if path_q.contains(&format!("/endpoints/{EXECD_PORT}"))
        && path_q.contains("use_server_proxy=false")
    {
        let body = serde_json::json!({ "endpoint": r.direct_answer }).to_string();
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
    }
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let mut out = r
        .http
        .request(parts.method, format!("{}{path_q}", r.upstream))
        .body(body);
    for (k, v) in &parts.headers {
        if k != "host" && k != "content-length" {
            out = out.header(k, v);
        }
    }
    let resp = out.send().await.unwrap();
    let mut b = Response::builder().status(resp.status());
    for (k, v) in resp.headers() {
        if k != "content-length" && k != "transfer-encoding" {
            b = b.header(k, v);
        }
    }
    let bytes = resp.bytes().await.unwrap();
    // Proxied endpoints name the origin the server saw: make them the relay's.
    let text = String::from_utf8_lossy(&bytes).replace(
        r.upstream.trim_start_matches("http://"),
        r.own.trim_start_matches("http://"),
    );
    b.body(Body::from(text)).unwrap()
}

/// A relay to the real server at `upstream` answering `direct_answer` for direct endpoints.
async fn start_relay(upstream: &str, direct_answer: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let own = format!("http://{}", listener.local_addr().unwrap());
    let state = Arc::new(Relay {
        upstream: upstream.trim_end_matches('/').to_owned(),
        own: own.clone(),
        direct_answer,
        http: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
    });
    let app = axum::Router::new().fallback(relay).with_state(state);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    own
}

/// A listener counting the connections it accepts (and holding them).
async fn counting_listener(addr: &str) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind(addr).await.unwrap();
    let local = listener.local_addr().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(sock);
        }
    });
    (local, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_direct_endpoint_falls_back_to_the_proxy() {
    let Some((domain, key)) = server() else {
        return;
    };
    // Allowlisted (the lifecycle host, 127.0.0.1), but nothing listens there.
    let closed = sessionbox_test_support::free_port();
    let origin = start_relay(&domain, format!("127.0.0.1:{closed}/proxy/44772")).await;
    let (rt, _store) = runtime_with(&origin, key, "direct-fallback", |c| {
        c.agent_key = Some(agent_key());
    });
    let a = conv("fallback");
    let s = rt.open(&a).await.unwrap();
    let r = s.exec(ExecRequest::new("echo fell-back")).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "fell-back\n");
    let id = rt.sandbox_id(&a.key).await.unwrap().unwrap();
    match rt.agent_path(&id) {
        Some(AgentPath::Proxy { reason }) => {
            assert!(reason.contains("did not answer"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    drop(s);
    // The verdict is remembered: the next open goes through the proxy without a probe.
    let s = rt.open(&a).await.unwrap();
    s.write("f.txt", b"ok").await.unwrap();
    drop(s);
    rt.destroy(&a.key).await.unwrap();
    assert_nothing_left(&rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_direct_endpoint_outside_the_allowlist_is_refused_and_sees_nothing() {
    let Some((domain, key)) = server() else {
        return;
    };
    // Another loopback address, and a name that resolves to the allowed address: neither is
    // the lifecycle host, and neither is in direct_hosts.
    let (other, other_hits) = counting_listener("127.0.0.2:0").await;
    let (named, named_hits) = counting_listener("127.0.0.1:0").await;
    for (answer, hits) in [
        (format!("{other}/proxy/44772"), &other_hits),
        (
            format!("localhost:{}/proxy/44772", named.port()),
            &named_hits,
        ),
        (
            format!("http://evil.example:{}/proxy/44772", named.port()),
            &named_hits,
        ),
    ] {
        let origin = start_relay(&domain, answer.clone()).await;
        let (rt, _store) = runtime_with(&origin, key.clone(), "direct-hostile", |c| {
            c.agent_key = Some(agent_key());
        });
        let a = conv("hostile");
        let s = rt.open(&a).await.unwrap();
        let r = s.exec(ExecRequest::new("echo safe")).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&r.stdout), "safe\n");
        let id = rt.sandbox_id(&a.key).await.unwrap().unwrap();
        match rt.agent_path(&id) {
            Some(AgentPath::Proxy { reason }) => {
                assert!(reason.contains("allowlist"), "{answer}: {reason}");
            }
            other => panic!("{answer}: {other:?}"),
        }
        // The client's own answer is the typed refusal.
        let e = rt
            .client()
            .direct_endpoint(&id, EXECD_PORT, true)
            .await
            .unwrap_err();
        assert!(
            matches!(e, OpenSandboxError::UntrustedEndpoint { .. }),
            "{answer}: {e:?}"
        );
        drop(s);
        rt.destroy(&a.key).await.unwrap();
        assert_nothing_left(&rt).await;
        assert_eq!(hits.load(Ordering::SeqCst), 0, "{answer} was contacted");
    }
}
