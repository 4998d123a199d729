//! Scoped and expiring API keys end to end: a real server on 127.0.0.1:0 with the `host`
//! runtime and a real SQLite store. Every route of the OpenAPI document (and the MCP routes) is
//! called with keys that must not reach it, and each test checks what the attack would have
//! changed (another conversation's file, the list of conversations), not just the status.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them).
#![allow(clippy::unwrap_used)]

mod support;

use chrono::Utc;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sessionbox_core::{ConversationId, ConversationScope, KeyScope};
use sessionbox_store::{AuditFilter, KeyOptions};
use support::{Server, acme};

/// `template` with its parameters filled: the conversation `id`, and plausible values of the
/// others.
fn fill(template: &str, id: &str) -> String {
    template
        .replace("{id}", id)
        .replace("{cmd}", "c1")
        .replace("{port}", "8080")
        .replace("{name}", "snap")
        .replace("{token}", "not-a-token")
        .replace("{path}", "a.txt")
}

fn is_public(template: &str) -> bool {
    matches!(template, "/healthz" | "/readyz" | "/v1/openapi.json")
        || template.starts_with("/v1/previews/{token}")
}

/// Sends `method path` with `key`, a small JSON body, and the MCP headers an initialize needs.
async fn call(s: &Server, key: &str, method: &Method, path: &str) -> (StatusCode, Value) {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let mut r = s
        .req(key, method.clone(), path)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if path == "/mcp" {
        r = r.header("x-conversation-id", "bob");
    }
    if *method != Method::GET && *method != Method::DELETE {
        r = r.body(init.to_string());
    }
    let r = r.send().await.unwrap();
    let status = r.status();
    let streams = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.contains("event-stream") || t.contains("ndjson"));
    if status.is_success() && streams {
        // A watch or an MCP stream: the status is the answer; the stream is dropped.
        return (status, Value::Null);
    }
    let bytes = r.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// One JSON-RPC request to an MCP session, its answer read from the event stream.
async fn mcp(
    s: &Server,
    key: &str,
    path: &str,
    session: Option<&str>,
    body: Value,
) -> (Option<String>, Value) {
    let mut r = s
        .req(key, Method::POST, path)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-03-26");
    if let Some(id) = session {
        r = r.header("mcp-session-id", id);
    }
    let r = r.body(body.to_string()).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let session = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = r.text().await.unwrap();
    let answer = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("id").is_some())
        .unwrap_or(Value::Null);
    (session, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_for_one_conversation_reaches_no_route_of_another_and_no_tenant_route() {
    let s = Server::start().await;
    s.put("alice", "a.txt", "alice's\n").await;
    s.put("bob", "a.txt", "bob's secret\n").await;
    let alice = s.key(
        ConversationScope::One(ConversationId::new("alice").unwrap()),
        false,
    );
    // The attack: every route, called with alice's key on bob's conversation (or on the
    // tenant), with the body of a valid request where one is needed.
    let mut refused = 0;
    for (method, template) in s.routes().await {
        if is_public(&template) {
            continue;
        }
        let path = fill(&template, "bob");
        let (status, body) = call(&s, &alice, &method, &path).await;
        let allowed_anyway = matches!(
            template.as_str(),
            // Shared with every key of the tenant, or filtered by the handler.
            "/v1/conversations" | "/v1/skills" | "/v1/templates" | "/v1/whoami"
        );
        if allowed_anyway {
            assert!(status.is_success(), "{method} {path}: {status} {body}");
            continue;
        }
        if template == "/v1/templates/{name}/fork" {
            // Shared: the handler checks the fork's target (below, with a valid body).
            assert!(!status.is_success(), "{method} {path}: {status} {body}");
            continue;
        }
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {body}");
        assert_eq!(body["code"], "forbidden", "{method} {path}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains("limited to conversation \"alice\""),
            "{method} {path}: the refusal names the rule: {message}"
        );
        refused += 1;
    }
    assert!(refused > 45, "{refused}");
    // Nothing of bob's changed, nothing was made, and alice's key lists only alice.
    assert_eq!(s.text("bob", "a.txt").await, "bob's secret\n");
    assert_eq!(s.listed(&s.admin).await, ["alice", "bob"]);
    assert_eq!(s.listed(&alice).await, ["alice"]);
    // Alice's own conversation works, and a fork to another id is refused.
    let (status, _) = call(
        &s,
        &alice,
        &Method::GET,
        "/v1/conversations/alice/files/a.txt",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let r = s
        .req(&alice, Method::POST, "/v1/conversations/alice/fork")
        .header("content-type", "application/json")
        .body(json!({"to": "mallory"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(s.listed(&s.admin).await, ["alice", "bob"]);
    // Each refusal is audited with the key and the route.
    s.state.flush_audit().await;
    let audit = s.store.audit_log(&AuditFilter::default()).unwrap();
    // (The middleware's as `http.refused` with the scope; a handler's, such as the audit
    // trail's, under its own operation.)
    let forbidden = audit
        .iter()
        .filter(|e| e.entry.outcome == "forbidden")
        .count();
    assert!(forbidden >= refused, "{forbidden} audited of {refused}");
    let refusals: Vec<_> = audit
        .iter()
        .filter(|e| e.entry.operation == "http.refused")
        .collect();
    assert!(refusals.len() + 5 >= refused, "{}", refusals.len());
    assert!(refusals.iter().all(|e| {
        let d = e.entry.detail.as_deref().unwrap_or("");
        e.entry.outcome == "forbidden" && d.contains("scope=conversation \"alice\"")
    }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_key_reads_everything_and_changes_nothing() {
    let s = Server::start().await;
    s.put("alice", "a.txt", "before\n").await;
    let reader = s.key(ConversationScope::All, true);
    for (method, template) in s.routes().await {
        if is_public(&template) {
            continue;
        }
        let path = fill(&template, "alice");
        let (status, body) = call(&s, &reader, &method, &path).await;
        let reads = matches!(method, Method::GET | Method::HEAD)
            && !template.ends_with("/pty")
            && !template.contains("/ports/")
            || template.ends_with("/grep")
            || template.starts_with("/mcp");
        if reads {
            assert_ne!(status, StatusCode::FORBIDDEN, "{method} {path}: {body}");
        } else {
            assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {body}");
            let message = body["message"].as_str().unwrap();
            assert!(message.contains("read-only"), "{method} {path}: {message}");
        }
    }
    assert_eq!(s.text("alice", "a.txt").await, "before\n");
    assert_eq!(s.listed(&s.admin).await, ["alice"]);

    // Over MCP it is offered only the reading tools, and a writing one is refused.
    let path = "/mcp/conversations/alice";
    let (session, _) = mcp(
        &s,
        &reader,
        path,
        None,
        json!({"jsonrpc": "2.0", "id": 1,
        "method": "initialize", "params": {"protocolVersion": "2025-03-26",
        "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
    )
    .await;
    let session = session.unwrap();
    let _ = s
        .req(&reader, Method::POST, path)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &session)
        .body(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string())
        .send()
        .await
        .unwrap();
    let (_, listed) = mcp(
        &s,
        &reader,
        path,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    )
    .await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"read") && names.contains(&"grep"),
        "{names:?}"
    );
    for writing in ["bash", "write", "edit", "preview"] {
        assert!(!names.contains(&writing), "{names:?}");
    }
    let (_, called) = mcp(
        &s,
        &reader,
        path,
        Some(&session),
        json!({"jsonrpc": "2.0",
        "id": 3, "method": "tools/call", "params": {"name": "write",
        "arguments": {"path": "a.txt", "content": "changed"}}}),
    )
    .await;
    assert_eq!(called["result"]["isError"], true, "{called}");
    assert!(called.to_string().contains("read-only"), "{called}");
    let (_, read) = mcp(
        &s,
        &reader,
        path,
        Some(&session),
        json!({"jsonrpc": "2.0",
        "id": 4, "method": "tools/call", "params": {"name": "read",
        "arguments": {"path": "a.txt"}}}),
    )
    .await;
    assert!(read.to_string().contains("before"), "{read}");
    assert_eq!(s.text("alice", "a.txt").await, "before\n");
    // It reads the file.
    let r = s
        .req(&reader, Method::GET, "/v1/conversations/alice/files/a.txt")
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "before\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_key_makes_and_reaches_only_ids_with_its_prefix() {
    let s = Server::start().await;
    s.put("team-b-1", "a.txt", "team b\n").await;
    let team = s.key(ConversationScope::prefix("team-a-").unwrap(), false);
    let r = s
        .req(&team, Method::PUT, "/v1/conversations/team-a-1/files/a.txt")
        .body("team a\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    for id in ["team-b-1", "team-a", "TEAM-a-1"] {
        let r = s
            .req(
                &team,
                Method::PUT,
                &format!("/v1/conversations/{id}/files/x"),
            )
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{id}");
    }
    assert_eq!(s.text("team-b-1", "a.txt").await, "team b\n");
    assert_eq!(s.listed(&team).await, ["team-a-1"]);

    // A fork stays within the prefix.
    let r = s
        .req(&team, Method::POST, "/v1/conversations/team-a-1/fork")
        .header("content-type", "application/json")
        .body(json!({"to": "team-b-2"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = s
        .req(&team, Method::POST, "/v1/conversations/team-a-1/fork")
        .header("content-type", "application/json")
        .body(json!({"to": "team-a-2"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(s.text("team-a-2", "a.txt").await, "team a\n");

    // A restore may use a snapshot of one of its conversations, not of another's.
    for (id, name) in [("team-a-1", "snap-a"), ("team-b-1", "snap-b")] {
        let r = s
            .req(
                &s.admin,
                Method::POST,
                &format!("/v1/conversations/{id}/snapshots"),
            )
            .header("content-type", "application/json")
            .body(json!({"name": name}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "{id}");
    }
    let restore = |name: &'static str| {
        s.req(&team, Method::POST, "/v1/conversations/team-a-2/restore")
            .header("content-type", "application/json")
            .body(json!({"snapshot": name}).to_string())
            .send()
    };
    // Another conversation's snapshot is answered as an absent one.
    assert_eq!(
        restore("snap-b").await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(s.text("team-a-2", "a.txt").await, "team a\n");
    assert_eq!(restore("snap-a").await.unwrap().status(), StatusCode::OK);
    // The snapshots themselves are the tenant's: not listed to this key.
    let r = s
        .req(&team, Method::GET, "/v1/snapshots")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    // `/mcp/new` makes its conversation under the prefix.
    let (status, _) = call(&s, &team, &Method::POST, "/mcp/new").await;
    assert_eq!(status, StatusCode::OK);
    let r = s
        .req(&team, Method::POST, "/mcp/new")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-03-26", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    let made = r.headers()["x-conversation-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(made.starts_with("team-a-mcp-"), "{made}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_for_one_conversation_cannot_open_mcp_sessions_elsewhere() {
    let s = Server::start().await;
    let alice = s.key(
        ConversationScope::One(ConversationId::new("alice").unwrap()),
        false,
    );
    for path in ["/mcp/new", "/mcp/conversations/bob", "/mcp"] {
        let (status, body) = call(&s, &alice, &Method::POST, path).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert_eq!(body["code"], "forbidden", "{path}: {body}");
    }
    let (_, body) = call(&s, &alice, &Method::POST, "/mcp/new").await;
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("/mcp/conversations/alice"),
        "the refusal says what to use: {body}"
    );
    let (status, body) = call(&s, &alice, &Method::POST, "/mcp/conversations/alice").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(s.listed(&s.admin).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_key_is_refused_with_401_naming_when() {
    let s = Server::start().await;
    let now = Utc::now();
    let options = KeyOptions {
        label: None,
        scope: KeyScope::default(),
        expires_at: Some(now - chrono::Duration::seconds(1)),
    };
    let expired = s
        .store
        .create_scoped_api_key(&acme(), &options, now - chrono::Duration::hours(1))
        .unwrap();
    let (status, body) = call(&s, &expired.key, &Method::GET, "/v1/conversations").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("expired at"), "{message}");
    let (status, _) = call(&s, &expired.key, &Method::POST, "/mcp/new").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(s.listed(&s.admin).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowed_key_takes_at_most_a_quarter_of_its_tenants_mcp_sessions() {
    let s = Server::start_with(sessionbox_server::ServerConfig {
        max_mcp_sessions_per_tenant: 8,
        ..Default::default()
    })
    .await;
    let reader = s.key(ConversationScope::All, true);
    let s = &s;
    let open =
        |key: String| async move { call(s, &key, &Method::POST, "/mcp/conversations/alice").await };
    for _ in 0..2 {
        let (status, body) = open(reader.clone()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    // The attack: a read-only key given to one user tries to take every MCP place of the
    // tenant. Its third is refused, and the tenant's full key still gets the rest.
    let (status, body) = open(reader.clone()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("a quarter"),
        "{body}"
    );
    for _ in 0..6 {
        let (status, body) = open(s.admin.clone()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (status, _) = open(s.admin.clone()).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "the tenant's own limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowed_key_cannot_get_around_its_conversations_network_policy() {
    let s = Server::start().await;
    let put = |key: &str, path: &str, body: Value| {
        s.req(key, Method::PUT, path)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let post = |key: &str, path: &str, body: Value| {
        s.req(key, Method::POST, path)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    // The operator: the tenant may reach one host; team-a-1 nothing at all.
    let r = put(
        &s.admin,
        "/v1/policy",
        json!({"profile": "allowlist", "allow": ["example.com:443"]}),
    )
    .await
    .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    s.put("team-a-1", "a.txt", "a\n").await;
    let r = put(
        &s.admin,
        "/v1/conversations/team-a-1/policy",
        json!({"profile": "none"}),
    )
    .await
    .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let sr = &s;
    let policy_of = |id: &'static str| async move {
        let r = sr
            .req(
                &sr.admin,
                Method::GET,
                &format!("/v1/conversations/{id}/policy"),
            )
            .send()
            .await
            .unwrap();
        serde_json::from_str::<Value>(&r.text().await.unwrap()).unwrap()
    };

    // The attack, with a key for team-a-*: fork the restrained conversation into a new id,
    // which would start under the tenant's wider policy. The fork keeps the origin's own.
    let team = s.key(ConversationScope::prefix("team-a-").unwrap(), false);
    let r = post(
        &team,
        "/v1/conversations/team-a-1/fork",
        json!({"to": "team-a-9"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let forked = policy_of("team-a-9").await;
    assert_eq!(forked["source"], "conversation", "{forked}");
    assert_eq!(forked["profile"], "none", "{forked}");

    // With a key for team-a-1 alone: destroy it and use the id again, which would start under
    // the tenant's policy. Refused while it has its own; nothing was destroyed.
    let one = s.key(
        ConversationScope::One(ConversationId::new("team-a-1").unwrap()),
        false,
    );
    let r = s
        .req(&one, Method::DELETE, "/v1/conversations/team-a-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let body: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("network policy of its own"),
        "{body}"
    );
    assert_eq!(s.text("team-a-1", "a.txt").await, "a\n");
    assert_eq!(policy_of("team-a-1").await["profile"], "none");

    // A template's fork must land in the key's scope too.
    let r = post(
        &s.admin,
        "/v1/conversations/team-a-1/snapshots",
        json!({"name": "base-snap"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = put(
        &s.admin,
        "/v1/templates/base",
        json!({"snapshot": "base-snap"}),
    )
    .await
    .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let r = post(&team, "/v1/templates/base/fork", json!({"to": "carol"}))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = post(&team, "/v1/templates/base/fork", json!({"to": "team-a-5"}))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let ids = s.listed(&s.admin).await;
    assert!(!ids.contains(&"carol".to_owned()), "{ids:?}");
    // A restore of a snapshot the key may not see is answered as an absent one.
    s.put("bob", "b.txt", "b\n").await;
    let r = post(
        &s.admin,
        "/v1/conversations/bob/snapshots",
        json!({"name": "bob-snap2"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = post(
        &team,
        "/v1/conversations/team-a-9/restore",
        json!({"snapshot": "bob-snap2"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let body = r.text().await.unwrap();
    assert!(!body.contains("bob\""), "the origin is not named: {body}");
}
