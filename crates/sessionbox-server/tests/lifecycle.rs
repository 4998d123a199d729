//! Lifecycle and skills say what is true, over REST and MCP: a real server on 127.0.0.1:0 with
//! the `host` runtime, a real store, a one-second time to live and a skills directory holding a
//! skill that breaks a rule. MCP through the official Python SDK
//! (`tests/mcp_lifecycle_client.py`, which fails on any warning the SDK logs).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use reqwest::StatusCode;
use sessionbox_core::{Runtime, TenantId};
use sessionbox_local::host::{HostConfig, HostRuntime};
use sessionbox_manager::Manager;
use sessionbox_server::{AppState, ServerConfig};
use sessionbox_skills::{SkillLimits, Skills};
use sessionbox_store::{Lifecycle, LifecyclePolicy, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_conversations_and_broken_skills_are_reported_not_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let skills = dir.path().join("skills");
    for (name, front) in [
        ("hello", "name: hello\ndescription: Greets.\n"),
        (
            "broken",
            "name: Broken\ndescription: Breaks the name rule.\n",
        ),
    ] {
        std::fs::create_dir_all(skills.join(name)).unwrap();
        std::fs::write(
            skills.join(name).join("SKILL.md"),
            format!("---\n{front}---\nBody.\n"),
        )
        .unwrap();
    }
    let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
    let runtime: Arc<dyn Runtime> =
        Arc::new(HostRuntime::new(HostConfig::new(dir.path())).unwrap());
    let key = store
        .create_api_key(&TenantId::new("acme").unwrap(), None, Utc::now())
        .unwrap()
        .key;
    let tenants = BTreeMap::from([("acme".to_owned(), vec![skills.clone()])]);
    let manager = Manager::new(store.clone(), runtime)
        .with_skills(Skills::new(tenants, SkillLimits::default()))
        .with_lifecycle(LifecyclePolicy {
            default: Lifecycle {
                idle_timeout: None,
                ttl: Some(Duration::from_secs(1)),
                max_lifetime: None,
            },
            tenants: BTreeMap::new(),
        });
    let state = AppState::new(manager, ServerConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sessionbox_server::serve(listener, state, async {
        let _ = rx.await;
    }));
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    let json = |r: reqwest::Response| async move {
        let status = r.status();
        let header = r
            .headers()
            .get("sessionbox-previous-expired-at")
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = r.bytes().await.unwrap();
        let v: serde_json::Value = if bytes.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        (status, v, header)
    };

    // The skills: the broken one is left out, the listing works.
    let (status, v, _) = json(
        http.get(format!("{base}/v1/skills"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        serde_json::json!({"skills": [{"name": "hello", "description": "Greets."}]})
    );

    // Two conversations with a file each, then past their time to live.
    for id in ["old", "rest"] {
        let r = http
            .put(format!("{base}/v1/conversations/{id}/files/notes.txt"))
            .bearer_auth(&key)
            .body("before")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
    tokio::time::sleep(Duration::from_millis(1300)).await;

    // Shown as expired, before any garbage collection, in a list and alone.
    let (_, v, _) = json(
        http.get(format!("{base}/v1/conversations"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    let states: Vec<&str> = v["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["expired", "expired"], "{v}");
    let (_, v, _) = json(
        http.get(format!("{base}/v1/conversations/rest"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(v["state"], "expired", "{v}");
    // A read says it expired.
    let (status, v, _) = json(
        http.get(format!("{base}/v1/conversations/rest/files/notes.txt"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(v["message"].as_str().unwrap().contains("expired at"), "{v}");
    // The API's own advice: which requests make a new one.
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .ends_with("; exec, write, mkdir or POST /v1/conversations/{id} make a new one"),
        "{v}"
    );
    // The next exec makes a new conversation and says the old one expired.
    let (status, v, header) = json(
        http.post(format!("{base}/v1/conversations/rest/exec"))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(r#"{"command": "ls"}"#)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["stdout"], "", "the old files are there: {v}");
    let at = v["previous_expired_at"]
        .as_str()
        .expect("no previous_expired_at");
    assert_eq!(header.as_deref(), Some(at));
    // Once.
    let (_, v, header) = json(
        http.post(format!("{base}/v1/conversations/rest"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(
        v.get("previous_expired_at").is_none() && header.is_none(),
        "{v}"
    );

    // MCP, with the official SDK, on `old`.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_lifecycle_client.py");
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .args([script, &format!("{base}/mcp"), &key])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the Python client finishes in time")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("OK"),
        "the Python client failed (run scripts/test, which installs the MCP SDK):\n{stdout}\n{stderr}"
    );
    assert!(
        !stderr.to_lowercase().contains("warning"),
        "the SDK warned:\n{stderr}"
    );
    // The broken skill is in the audit, with the rule.
    let log = store
        .audit_log(&sessionbox_store::AuditFilter::default())
        .unwrap();
    assert!(
        log.iter().any(|e| e.entry.operation == "skills"
            && e.entry
                .detail
                .as_deref()
                .is_some_and(|d| d.contains("skipped=broken (") && d.contains("invalid name"))),
        "no audit warning of the broken skill"
    );
    let _ = tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
}
