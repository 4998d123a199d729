//! MCP over streamable HTTP end to end: a real server on 127.0.0.1:0 with the `host` runtime
//! and a real SQLite store, driven by the official MCP Python SDK (`mcp` from PyPI, installed
//! by `scripts/test`) through `tests/mcp_client.py`.

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
        ServerConfig::default(),
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

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client.py");
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .args([script, &url, &key, env!("CARGO_PKG_VERSION")])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the Python client finishes in time")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("OK"),
        "the Python client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

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
    let _ = tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
}
