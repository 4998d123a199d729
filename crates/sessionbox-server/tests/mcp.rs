//! MCP over streamable HTTP end to end: a real server on 127.0.0.1:0 with the `host` runtime
//! and a real SQLite store, driven by the official MCP Python SDK (`mcp` from PyPI, installed
//! by `scripts/test`) through `tests/mcp_client.py`.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them).
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use reqwest::StatusCode;
use sessionbox_core::{Runtime, TenantId};
use sessionbox_local::host::{HostConfig, HostRuntime};
use sessionbox_manager::Manager;
use sessionbox_server::{AppState, ServerConfig};
use sessionbox_store::{AuditFilter, Store};

const INSTALL_HINT: &str = "run scripts/test (which installs it) or `python3 -m pip install mcp`";

fn check_sdk() {
    let out = Command::new("python3")
        .args(["-c", "import mcp.client.streamable_http"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 ({e}); {INSTALL_HINT}"));
    assert!(
        out.status.success(),
        "the MCP Python SDK is missing: {}; {INSTALL_HINT}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Runs the Python client `script` of this directory with `args`; it must print OK last.
async fn run_client(script: &str, args: &[&str]) {
    let script = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .arg(&script)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the Python client finishes in time")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("OK"),
        "the Python client {script} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdk_uses_the_tools_in_separate_conversations() {
    check_sdk();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
    let runtime: Arc<dyn Runtime> =
        Arc::new(HostRuntime::new(HostConfig::new(dir.path())).unwrap());
    let key = store
        .create_api_key(&TenantId::new("acme").unwrap(), Some("test"), Utc::now())
        .unwrap()
        .key;
    let state = AppState::new(
        Manager::new(store.clone(), runtime),
        ServerConfig {
            // As `serve` has: the tools list `preview` only with a key to sign links.
            preview_key: Some(sessionbox_egress::token::TokenKey::from_bytes([9; 32])),
            ..ServerConfig::default()
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sessionbox_server::serve(listener, state, async {
        let _ = rx.await;
    }));
    let url = format!("http://{addr}/mcp");

    // Refusals at the HTTP level carry the JSON error body.
    let client = reqwest::Client::new();
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    for (key, conv, status) in [
        ("sbk_wrong", Some("alice"), StatusCode::UNAUTHORIZED),
        (key.as_str(), None, StatusCode::BAD_REQUEST),
        (key.as_str(), Some("../x"), StatusCode::BAD_REQUEST),
    ] {
        let mut r = client
            .post(&url)
            .bearer_auth(key)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(init);
        if let Some(c) = conv {
            r = r.header("x-conversation-id", c);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), status, "key {key} conversation {conv:?}");
        let body: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        assert!(body["code"].is_string(), "{body}");
    }

    run_client("mcp_client.py", &[&url, &key, env!("CARGO_PKG_VERSION")]).await;

    // Every tool call is audited by the manager and as `mcp.*` with the key.
    let audit = store.audit_log(&AuditFilter::default()).unwrap();
    assert!(
        audit
            .iter()
            .any(|e| e.entry.operation == "mcp.write" && e.entry.outcome == "ok"),
        "{audit:?}"
    );
    assert!(
        audit
            .iter()
            .any(|e| e.entry.operation == "mcp.read" && e.entry.outcome == "not_found"),
        "{audit:?}"
    );
    // Listing resources did not make the conversation it listed.
    assert!(
        !store
            .list(None)
            .unwrap()
            .iter()
            .any(|r| r.conversation_id.as_str() == "never-made")
    );
    let _ = tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
}

/// One MCP request: POST `body` to `url` with `key`, in `session` if given. Returns the status,
/// the `Mcp-Session-Id` the answer names, and the body (an event stream's `data:` lines joined,
/// or the JSON as sent).
async fn mcp_post(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    session: Option<&str>,
    body: &str,
) -> (StatusCode, Option<String>, String) {
    let mut r = client
        .post(url)
        .bearer_auth(key)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-03-26")
        .header("x-conversation-id", "owned")
        .body(body.to_owned());
    if let Some(id) = session {
        r = r.header("mcp-session-id", id);
    }
    let r = r.send().await.unwrap();
    let status = r.status();
    let id = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = String::from_utf8_lossy(&r.bytes().await.unwrap()).into_owned();
    (status, id, text)
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
const CALL: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"bash","arguments":{"command":"echo owned-$((6*7))"}}}"#;

/// Opens an MCP session with `key`; its id.
async fn mcp_open(client: &reqwest::Client, url: &str, key: &str) -> String {
    let (st, id, text) = mcp_post(client, url, key, None, INITIALIZE).await;
    assert_eq!(st, StatusCode::OK, "{text}");
    let id = id.expect("a session id");
    let (st, _, text) = mcp_post(client, url, key, Some(&id), INITIALIZED).await;
    assert!(st.is_success(), "{st} {text}");
    id
}

/// Attack: tenant B's key uses or ends an MCP session that tenant A's key opened (its
/// `Mcp-Session-Id` leaked). B's `tools/call` and `DELETE` with A's id are 404, as for an
/// unknown id, and change nothing: A's session still works, and A's DELETE ends it (204), after
/// which the id is unknown to A too and nothing of it is kept. Second attack: one key opens
/// session after session; past `max_mcp_sessions_per_tenant` the next `initialize` is 429
/// naming the limit, while another tenant still opens its own, and an ended session gives its
/// place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_session_belongs_to_the_tenant_that_opened_it_and_a_tenant_has_a_bounded_number() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
    let runtime: Arc<dyn Runtime> =
        Arc::new(HostRuntime::new(HostConfig::new(dir.path())).unwrap());
    let key = |tenant: &str| {
        store
            .create_api_key(&TenantId::new(tenant).unwrap(), Some("test"), Utc::now())
            .unwrap()
            .key
    };
    let (alice, bob) = (key("alice"), key("bob"));
    let state = AppState::new(
        Manager::new(store.clone(), runtime),
        ServerConfig {
            max_mcp_sessions_per_tenant: 3,
            ..ServerConfig::default()
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sessionbox_server::serve(listener, state.clone(), async {
        let _ = rx.await;
    }));
    let url = format!("http://{addr}/mcp");
    let client = reqwest::Client::new();
    let (alice_t, bob_t) = (
        TenantId::new("alice").unwrap(),
        TenantId::new("bob").unwrap(),
    );

    let a = mcp_open(&client, &url, &alice).await;
    // B with A's session id: 404 for a call and for DELETE, with the JSON error body.
    let (st, _, text) = mcp_post(&client, &url, &bob, Some(&a), CALL).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["code"], "not_found", "{v}");
    assert!(!text.contains("owned-42"), "{text}");
    let r = client
        .delete(&url)
        .bearer_auth(&bob)
        .header("x-conversation-id", "owned")
        .header("mcp-session-id", &a)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // B's own session does not see A's either.
    let b = mcp_open(&client, &url, &bob).await;
    assert_ne!(a, b);
    // A's session still works.
    let (st, _, text) = mcp_post(&client, &url, &alice, Some(&a), CALL).await;
    assert_eq!(st, StatusCode::OK, "{text}");
    assert!(text.contains("owned-42"), "{text}");
    assert_eq!(state.mcp_sessions_of(&alice_t), 1);

    // Past the limit, 429 naming it; B is not held back.
    let a2 = mcp_open(&client, &url, &alice).await;
    let _a3 = mcp_open(&client, &url, &alice).await;
    let (st, id, text) = mcp_post(&client, &url, &alice, None, INITIALIZE).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{text}");
    assert!(id.is_none());
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["code"], "busy", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("max_mcp_sessions_per_tenant = 3"),
        "{v}"
    );
    let _b2 = mcp_open(&client, &url, &bob).await;
    assert_eq!(state.mcp_sessions_of(&bob_t), 2);

    // A's DELETE ends its session: 204, then the id is unknown, and a place is free again.
    for id in [&a, &a2] {
        let r = client
            .delete(&url)
            .bearer_auth(&alice)
            .header("x-conversation-id", "owned")
            .header("mcp-session-id", id.as_str())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
    assert_eq!(state.mcp_sessions_of(&alice_t), 1);
    let (st, _, text) = mcp_post(&client, &url, &alice, Some(&a), CALL).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{text}");
    let _a4 = mcp_open(&client, &url, &alice).await;
    assert_eq!(state.mcp_sessions_of(&alice_t), 2);

    let _ = tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
}

/// The conversation named in the URL (`/mcp/conversations/{id}`, for connectors that take a
/// URL alone) and a conversation of each session's own (`/mcp/new`, so a desktop client's
/// chats never share a workspace), through the official Python SDK with no conversation
/// header; then at the HTTP level: `/mcp/new` names the conversation it made in
/// `X-Conversation-Id`, which the REST API then finds, and a path and a header that disagree
/// are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_named_in_the_path_or_made_per_session() {
    check_sdk();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
    let runtime: Arc<dyn Runtime> =
        Arc::new(HostRuntime::new(HostConfig::new(dir.path())).unwrap());
    let key = store
        .create_api_key(&TenantId::new("acme").unwrap(), Some("test"), Utc::now())
        .unwrap()
        .key;
    let state = AppState::new(
        Manager::new(store.clone(), runtime),
        ServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sessionbox_server::serve(listener, state, async {
        let _ = rx.await;
    }));
    let base = format!("http://{addr}");

    run_client("mcp_routes_client.py", &[&base, &key]).await;

    let client = reqwest::Client::new();
    let post = |url: String, session: Option<String>, body: &'static str| {
        let mut r = client
            .post(url)
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-03-26")
            .body(body);
        if let Some(s) = session {
            r = r.header("mcp-session-id", s);
        }
        r.send()
    };
    let new = format!("{base}/mcp/new");
    let r = post(new.clone(), None, INITIALIZE).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let made = r.headers()["x-conversation-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let session = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    assert!(made.starts_with("mcp-") && made.len() == 20, "{made}");
    let r = post(new.clone(), Some(session.clone()), INITIALIZED)
        .await
        .unwrap();
    assert!(r.status().is_success());
    let r = post(new.clone(), Some(session.clone()), CALL)
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let text = r.text().await.unwrap();
    assert!(text.contains("owned-42"), "{text}");
    // The same conversation through REST: the session's command ran there.
    let listed = client
        .get(format!("{base}/v1/conversations/{made}"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(
        listed.status(),
        StatusCode::OK,
        "the made conversation exists"
    );
    // Another session at /mcp/new gets another conversation.
    let r = post(new.clone(), None, INITIALIZE).await.unwrap();
    let other = r.headers()["x-conversation-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_ne!(other, made);
    // A path and a header that name different conversations: refused, JSON body.
    let r = client
        .post(format!("{base}/mcp/conversations/alice"))
        .bearer_auth(&key)
        .header("x-conversation-id", "bob")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(INITIALIZE)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert!(v["message"].as_str().unwrap().contains("different"), "{v}");
    // An invalid id in the path: refused, nothing made.
    let r = client
        .post(format!("{base}/mcp/conversations/..%2Fx"))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(INITIALIZE)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // A session stays on its conversation: the /mcp/new session, sent to another conversation
    // by path or header, is refused and nothing runs there.
    for (url, header) in [
        (format!("{base}/mcp/conversations/elsewhere"), None),
        (format!("{base}/mcp"), Some("elsewhere")),
    ] {
        let mut r = client
            .post(&url)
            .bearer_auth(&key)
            .header("mcp-session-id", &session)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(h) = header {
            r = r.header("x-conversation-id", h);
        }
        let r = r.body(CALL).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{url}");
        let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("belongs to conversation"),
            "{v}"
        );
    }
    let r = client
        .get(format!("{base}/v1/conversations/elsewhere"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "nothing ran elsewhere");
    // /mcp/new with a conversation header: refused, the header would be ignored.
    let r = client
        .post(&new)
        .bearer_auth(&key)
        .header("x-conversation-id", "chat-42")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(INITIALIZE)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // A 401 names the scheme (RFC 9110: every 401 carries WWW-Authenticate).
    let r = client
        .post(&new)
        .bearer_auth("sbk_wrong")
        .body(INITIALIZE)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(
        r.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Bearer"),
        "{:?}",
        r.headers()
    );
    let _ = tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
}
