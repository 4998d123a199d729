//! Network policies and the egress log over REST, and the read-only MCP `network` tool: a real
//! server on 127.0.0.1:0 with the `host` runtime and a real SQLite store; MCP through the
//! official Python SDK (`tests/mcp_network_client.py`). Verdicts are appended with the store's
//! own `log_egress`, as the gateway's store-backed control does (the whole path, gateway
//! included, runs in `crates/sessionbox/tests/egress.rs`).

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them).
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use reqwest::{Client, Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};
use sessionbox_core::{ConversationRef, Runtime, TenantId};
use sessionbox_egress::Policy;
use sessionbox_local::host::{HostConfig, HostRuntime};
use sessionbox_manager::Manager;
use sessionbox_server::{AppState, ServerConfig};
use sessionbox_store::{AuditFilter, EgressLogEntry, PolicyScope, Store};

struct Server {
    base: String,
    http: Client,
    store: Store,
    dir: tempfile::TempDir,
    acme: String,
    other: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Server {
    async fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
        let runtime: Arc<dyn Runtime> =
            Arc::new(HostRuntime::new(HostConfig::new(dir.path())).unwrap());
        let key = |t: &str| {
            store
                .create_api_key(&TenantId::new(t).unwrap(), None, Utc::now())
                .unwrap()
                .key
        };
        let (acme, other) = (key("acme"), key("other"));
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
        tokio::spawn(sessionbox_server::serve(listener, state, async {
            let _ = rx.await;
        }));
        Server {
            base: format!("http://{addr}"),
            http: Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            store,
            dir,
            acme,
            other,
            stop: Some(tx),
        }
    }

    fn req(&self, key: &str, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key)
    }

    async fn call(
        &self,
        key: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut r = self.req(key, method, path);
        if let Some(b) = body {
            r = r
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&b).unwrap());
        }
        let r = r.send().await.unwrap();
        let status = r.status();
        let bytes = r.bytes().await.unwrap();
        let v = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
        (status, v)
    }

    fn workspaces(&self) -> usize {
        std::fs::read_dir(self.dir.path().join("workspaces"))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

fn conv(tenant: &str, id: &str) -> ConversationRef {
    ConversationRef::parse(tenant, id).unwrap()
}

/// Appends a verdict as the gateway's store-backed control does.
fn log(store: &Store, c: &ConversationRef, allowed: bool, target: &str, rule: &str, secs_ago: i64) {
    store
        .log_egress(&EgressLogEntry {
            at: Utc::now() - chrono::Duration::seconds(secs_ago),
            tenant: c.tenant.clone(),
            conversation_key: c.key.clone(),
            allowed,
            method: "CONNECT".into(),
            target: target.into(),
            address: allowed.then(|| "203.0.113.7:443".into()),
            rule: rule.into(),
            bytes_up: if allowed { 120 } else { 0 },
            bytes_down: if allowed { 4096 } else { 0 },
            duration_ms: 15,
            end: allowed.then(|| "closed".into()),
            count: 1,
        })
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn policies_are_set_shown_and_removed_per_tenant_and_conversation_without_creating_it() {
    let s = Server::start().await;
    let k = s.acme.clone();
    let none_hash = Policy::None.hash();

    // Nothing set: the default, `none`.
    let (st, v) = s.call(&k, Method::GET, "/v1/policy", None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        json!({"source": "default", "profile": "none", "allow": [], "deny": [], "hash": none_hash, "updated_at": null})
    );
    let (_, v) = s
        .call(&k, Method::GET, "/v1/conversations/chat-1/policy", None)
        .await;
    assert_eq!(v["source"], "default");

    // The tenant's policy applies to its conversations.
    let tenant_body =
        json!({"profile": "allowlist", "allow": ["*.pypi.org:443", "files.pythonhosted.org:443"]});
    let (st, v) = s
        .call(&k, Method::PUT, "/v1/policy", Some(tenant_body))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let tenant_policy =
        Policy::allowlist(&["*.pypi.org:443", "files.pythonhosted.org:443"], &[]).unwrap();
    assert_eq!(v["source"], "tenant");
    assert_eq!(v["profile"], "allowlist");
    assert_eq!(
        v["allow"],
        json!(["*.pypi.org:443", "files.pythonhosted.org:443"])
    );
    assert_eq!(v["hash"], tenant_policy.hash());
    assert!(v["updated_at"].is_string());
    let (_, v) = s
        .call(&k, Method::GET, "/v1/conversations/chat-1/policy", None)
        .await;
    assert_eq!(
        (v["source"].as_str(), v["hash"].as_str()),
        (Some("tenant"), Some(tenant_policy.hash().as_str()))
    );

    // A conversation's own policy wins; the store holds exactly what the gateway will read.
    let body = json!({"profile": "allowlist", "allow": ["api.example.com:443", "[2001:db8::/32]:80,443"], "deny": ["*.ads.example.com"]});
    let (st, v) = s
        .call(
            &k,
            Method::PUT,
            "/v1/conversations/chat-1/policy",
            Some(body),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let own = Policy::allowlist(
        &["api.example.com:443", "[2001:db8::/32]:80,443"],
        &["*.ads.example.com"],
    )
    .unwrap();
    assert_eq!(v["source"], "conversation");
    assert_eq!(v["deny"], json!(["*.ads.example.com"]));
    assert_eq!(v["hash"], own.hash());
    let c1 = conv("acme", "chat-1");
    let stored = s.store.effective_egress_policy(&c1).unwrap().unwrap();
    assert_eq!(Policy::from_json(&stored.policy).unwrap(), own);
    assert_eq!(stored.hash, own.hash());
    // Another conversation still gets the tenant's.
    let (_, v) = s
        .call(&k, Method::GET, "/v1/conversations/chat-2/policy", None)
        .await;
    assert_eq!(v["source"], "tenant");
    // `none` for one conversation overrides an allowlist of the tenant.
    let (_, v) = s
        .call(
            &k,
            Method::PUT,
            "/v1/conversations/chat-2/policy",
            Some(json!({"profile": "none"})),
        )
        .await;
    assert_eq!(
        (v["source"].as_str(), v["profile"].as_str()),
        (Some("conversation"), Some("none"))
    );
    assert_eq!(v["hash"], none_hash);

    // Setting a policy neither opened nor created the conversations.
    assert!(s.store.get(&c1.key).unwrap().is_none());
    assert!(s.store.get(&conv("acme", "chat-2").key).unwrap().is_none());
    assert_eq!(s.workspaces(), 0);

    // DELETE of the conversation's policy: the tenant's applies again.
    let (st, v) = s
        .call(&k, Method::DELETE, "/v1/conversations/chat-1/policy", None)
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (v["source"].as_str(), v["hash"].as_str()),
        (Some("tenant"), Some(tenant_policy.hash().as_str()))
    );
    assert_eq!(
        s.store
            .egress_policy(&PolicyScope::Conversation(c1.clone()))
            .unwrap(),
        None
    );
    // Twice is fine.
    let (st, _) = s
        .call(&k, Method::DELETE, "/v1/conversations/chat-1/policy", None)
        .await;
    assert_eq!(st, StatusCode::OK);
    // DELETE of the tenant's: back to the default profile `none`.
    let (st, v) = s.call(&k, Method::DELETE, "/v1/policy", None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (v["source"].as_str(), v["profile"].as_str()),
        (Some("default"), Some("none"))
    );
    let (_, v) = s
        .call(&k, Method::GET, "/v1/conversations/chat-1/policy", None)
        .await;
    assert_eq!(v["source"], "default");
    assert_eq!(s.store.effective_egress_policy(&c1).unwrap(), None);

    // Every call is audited as http.policy_* with the key id.
    let audit = s.store.audit_log(&AuditFilter::default()).unwrap();
    for op in ["http.policy_get", "http.policy_set", "http.policy_delete"] {
        assert!(
            audit.iter().any(|e| e.entry.operation == op
                && e.entry.outcome == "ok"
                && e.entry
                    .detail
                    .as_deref()
                    .is_some_and(|d| d.starts_with("key=") && !d.starts_with("key=-"))),
            "{op}: {audit:?}"
        );
    }
    assert!(audit.iter().any(|e| e.entry.operation == "http.policy_set"
        && e.entry.conversation_key.as_ref() == Some(&c1.key)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_rules_are_422_naming_the_rule_malformed_json_400_and_nothing_is_stored() {
    let s = Server::start().await;
    let k = s.acme.clone();
    for path in ["/v1/policy", "/v1/conversations/chat-1/policy"] {
        for rule in [
            "169.254.169.254",
            "10.0.0.0/8:99999",
            "*.",
            "127.1",
            "localhost",
            "evil.example/path",
            "a@b.example",
            "*.*.example",
            "0x7f.1",
        ] {
            let (st, v) = s
                .call(
                    &k,
                    Method::PUT,
                    path,
                    Some(json!({"profile": "allowlist", "allow": ["ok.example", rule]})),
                )
                .await;
            assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{path} {rule}: {v}");
            assert_eq!(v["code"], "invalid_request");
            assert!(v["message"].as_str().unwrap().contains(rule), "{rule}: {v}");
        }
        // A bad deny rule is named too.
        let (st, v) = s
            .call(
                &k,
                Method::PUT,
                path,
                Some(json!({"profile": "allowlist", "allow": ["ok.example"], "deny": ["[::1"]})),
            )
            .await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(v["message"].as_str().unwrap().contains("[::1"), "{v}");
        // Shapes that are not a policy.
        for body in [
            json!({"profile": "allowlist"}),
            json!({"profile": "allowlist", "allow": []}),
            json!({"profile": "none", "allow": ["ok.example"]}),
            json!({"profile": "open"}),
            json!({"allow": ["ok.example"]}),
            json!({"profile": "none", "extra": 1}),
            json!({"profile": "allowlist", "allow": "ok.example"}),
        ] {
            let (st, v) = s.call(&k, Method::PUT, path, Some(body.clone())).await;
            assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
            assert_eq!(v["code"], "invalid_request");
        }
        // Malformed JSON.
        let r = s
            .req(&k, Method::PUT, path)
            .header("content-type", "application/json")
            .body("{\"profile\": ")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        assert_eq!(v["code"], "invalid_request");
    }
    // An invalid conversation id is 400 and stores nothing.
    let (st, v) = s
        .call(
            &k,
            Method::PUT,
            "/v1/conversations/..%2Fx/policy",
            Some(json!({"profile": "none"})),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(s.store.egress_policies(None).unwrap().is_empty());
    // Without a key: 401.
    let r = s
        .http
        .get(format!("{}/v1/policy", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_never_reads_or_sets_another_tenants_policy_or_verdicts() {
    let s = Server::start().await;
    let (acme, other) = (s.acme.clone(), s.other.clone());
    let body = json!({"profile": "allowlist", "allow": ["acme.example:443"]});
    s.call(&acme, Method::PUT, "/v1/policy", Some(body.clone()))
        .await;
    s.call(
        &acme,
        Method::PUT,
        "/v1/conversations/shared/policy",
        Some(body),
    )
    .await;
    let acme_hash = Policy::allowlist(&["acme.example:443"], &[])
        .unwrap()
        .hash();

    // The other tenant, with the same conversation id, sees only defaults ...
    let (_, v) = s.call(&other, Method::GET, "/v1/policy", None).await;
    assert_eq!(v["source"], "default");
    let (_, v) = s
        .call(&other, Method::GET, "/v1/conversations/shared/policy", None)
        .await;
    assert_eq!(v["source"], "default");
    // ... and its writes and deletes land on its own scopes only.
    let wide = json!({"profile": "allowlist", "allow": ["0.0.0.0/0"]});
    let (st, _) = s
        .call(
            &other,
            Method::PUT,
            "/v1/conversations/shared/policy",
            Some(wide.clone()),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    s.call(&other, Method::PUT, "/v1/policy", Some(wide)).await;
    s.call(
        &other,
        Method::DELETE,
        "/v1/conversations/shared/policy",
        None,
    )
    .await;
    s.call(&other, Method::DELETE, "/v1/policy", None).await;
    let (_, v) = s
        .call(&acme, Method::GET, "/v1/conversations/shared/policy", None)
        .await;
    assert_eq!(
        (v["source"].as_str(), v["hash"].as_str()),
        (Some("conversation"), Some(acme_hash.as_str()))
    );
    let (_, v) = s.call(&acme, Method::GET, "/v1/policy", None).await;
    assert_eq!(v["hash"], acme_hash);
    let acme_shared = conv("acme", "shared");
    assert_eq!(
        s.store
            .effective_egress_policy(&acme_shared)
            .unwrap()
            .unwrap()
            .hash,
        acme_hash
    );

    // Verdicts: each key sees its own tenant's only.
    let other_shared = conv("other", "shared");
    log(
        &s.store,
        &acme_shared,
        true,
        "acme.example:443",
        "acme.example:443",
        5,
    );
    log(
        &s.store,
        &other_shared,
        false,
        "evil.example:443",
        "no allow rule",
        4,
    );
    for (key, mine, theirs) in [
        (&acme, "acme.example:443", "evil.example:443"),
        (&other, "evil.example:443", "acme.example:443"),
    ] {
        for path in ["/v1/egress-log", "/v1/conversations/shared/egress-log"] {
            let (st, v) = s.call(key, Method::GET, path, None).await;
            assert_eq!(st, StatusCode::OK, "{v}");
            let targets: Vec<&str> = v["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["target"].as_str().unwrap())
                .collect();
            assert_eq!(targets, [mine], "{path}: {v}");
            assert!(!v.to_string().contains(theirs));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_egress_log_is_newest_first_per_conversation_with_since_and_limit() {
    let s = Server::start().await;
    let k = s.acme.clone();
    // A conversation that exists (its id is shown in the tenant-wide log) and one that does not.
    s.call(&k, Method::POST, "/v1/conversations/a", None).await;
    let (a, b) = (conv("acme", "a"), conv("acme", "b"));
    log(
        &s.store,
        &a,
        true,
        "www.allowed.test:443",
        "*.allowed.test:443",
        7200,
    );
    log(
        &s.store,
        &b,
        false,
        "denied.test:80",
        "no allow rule covers denied.test",
        60,
    );
    log(
        &s.store,
        &a,
        false,
        "169.254.169.254:80",
        "169.254.169.254 is link-local (permanently blocked)",
        30,
    );

    let (st, v) = s.call(&k, Method::GET, "/v1/egress-log", None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let entries = v["entries"].as_array().unwrap();
    let targets: Vec<&str> = entries
        .iter()
        .map(|e| e["target"].as_str().unwrap())
        .collect();
    assert_eq!(
        targets,
        [
            "169.254.169.254:80",
            "denied.test:80",
            "www.allowed.test:443"
        ]
    );
    assert_eq!(entries[0]["conversation_id"], "a");
    assert_eq!(entries[0]["conversation_key"], a.key.as_str());
    assert_eq!(
        entries[1]["conversation_id"],
        Value::Null,
        "b has no record"
    );
    assert_eq!(entries[2]["verdict"], "allowed");
    assert_eq!(entries[2]["bytes_down"], 4096);
    assert_eq!(entries[2]["address"], "203.0.113.7:443");
    assert_eq!(entries[2]["end"], "closed");
    assert_eq!(entries[0]["verdict"], "denied");

    let (_, v) = s
        .call(&k, Method::GET, "/v1/conversations/a/egress-log", None)
        .await;
    let targets: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["target"].as_str().unwrap())
        .collect();
    assert_eq!(targets, ["169.254.169.254:80", "www.allowed.test:443"]);
    assert!(
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["conversation_id"] == "a")
    );
    let (_, v) = s
        .call(
            &k,
            Method::GET,
            "/v1/conversations/a/egress-log?limit=1",
            None,
        )
        .await;
    assert_eq!(v["entries"].as_array().unwrap().len(), 1);
    let (_, v) = s
        .call(&k, Method::GET, "/v1/egress-log?since=1h", None)
        .await;
    assert_eq!(v["entries"].as_array().unwrap().len(), 2);
    let since = (Utc::now() - chrono::Duration::seconds(45)).to_rfc3339();
    let (_, v) = s
        .call(
            &k,
            Method::GET,
            &format!("/v1/egress-log?since={}", since.replace('+', "%2B")),
            None,
        )
        .await;
    assert_eq!(v["entries"].as_array().unwrap().len(), 1, "{v}");
    for bad in ["limit=0", "limit=1001", "limit=x", "since=yesterday"] {
        let (st, v) = s
            .call(&k, Method::GET, &format!("/v1/egress-log?{bad}"), None)
            .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    // A parameter the route does not take is the wrong shape, as an unknown JSON field is.
    let (st, v) = s.call(&k, Method::GET, "/v1/egress-log?nope=1", None).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    // Reading a log opens and creates nothing.
    let (st, _) = s
        .call(&k, Method::GET, "/v1/conversations/never/egress-log", None)
        .await;
    assert_eq!(st, StatusCode::OK);
    assert!(s.store.get(&conv("acme", "never").key).unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_network_tool_shows_the_policy_and_verdicts_and_no_tool_changes_the_policy() {
    let s = Server::start().await;
    let k = s.acme.clone();
    let body = json!({"profile": "allowlist", "allow": ["*.allowed.test:443"], "deny": ["evil.allowed.test"]});
    let (_, v) = s
        .call(
            &k,
            Method::PUT,
            "/v1/conversations/agent/policy",
            Some(body),
        )
        .await;
    let hash = v["hash"].as_str().unwrap().to_owned();
    let agent = conv("acme", "agent");
    log(
        &s.store,
        &agent,
        true,
        "www.allowed.test:443",
        "*.allowed.test:443",
        20,
    );
    log(
        &s.store,
        &agent,
        false,
        "evil.allowed.test:443",
        "deny rule evil.allowed.test",
        10,
    );
    let before = s.store.egress_policies(None).unwrap();

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_network_client.py");
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .args([script, &format!("{}/mcp", s.base), &k, "agent", &hash])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the Python client finishes in time")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("OK"),
        "the Python client failed (run scripts/test, which installs the MCP SDK):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // After every tool was called with arguments that ask to widen the policy, the store holds
    // exactly the policies it held before.
    assert_eq!(s.store.egress_policies(None).unwrap(), before);
    let (_, v) = s
        .call(&k, Method::GET, "/v1/conversations/agent/policy", None)
        .await;
    assert_eq!(v["hash"], hash);
    // The `network` tool opened nothing: the fresh conversation it was asked about has no record.
    assert!(s.store.get(&conv("acme", "fresh").key).unwrap().is_none());
    let audit = s.store.audit_log(&AuditFilter::default()).unwrap();
    assert!(
        audit
            .iter()
            .any(|e| e.entry.operation == "mcp.network" && e.entry.outcome == "ok")
    );
}
