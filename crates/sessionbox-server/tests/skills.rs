//! The `skill` tool over REST and MCP: a real server on 127.0.0.1:0 with the `host` runtime, a
//! real store and a real skills directory; MCP through the official Python SDK
//! (`tests/mcp_skills_client.py`). A key sees only its tenant's skills.

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
use sessionbox_store::Store;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_skill_tool_lists_and_loads_the_tenants_skills_over_rest_and_mcp() {
    let dir = tempfile::tempdir().unwrap();
    let skills = dir.path().join("skills");
    std::fs::create_dir_all(skills.join("hello/scripts")).unwrap();
    std::fs::write(
        skills.join("hello/SKILL.md"),
        "---\nname: hello\ndescription: Greets from a script.\n---\nRun scripts/hi.sh.\n",
    )
    .unwrap();
    std::fs::write(skills.join("hello/scripts/hi.sh"), "echo hi from skill\n").unwrap();
    let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
    let runtime: Arc<dyn Runtime> =
        Arc::new(HostRuntime::new(HostConfig::new(dir.path())).unwrap());
    let acme = store
        .create_api_key(&TenantId::new("acme").unwrap(), None, Utc::now())
        .unwrap()
        .key;
    let other = store
        .create_api_key(&TenantId::new("other").unwrap(), None, Utc::now())
        .unwrap()
        .key;
    let tenants = BTreeMap::from([("acme".to_owned(), vec![skills.clone()])]);
    let manager = Manager::new(store.clone(), runtime.clone())
        .with_skills(Skills::new(tenants, SkillLimits::default()));
    let state = AppState::new(manager, ServerConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sessionbox_server::serve(listener, state, async {
        let _ = rx.await;
    }));
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    let get = |key: &str, path: &str| http.get(format!("{base}{path}")).bearer_auth(key).send();
    let json = |r: reqwest::Response| async move {
        let status = r.status();
        let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        (status, v)
    };

    let (status, v) = json(get(&acme, "/v1/skills").await.unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        serde_json::json!({"skills": [{"name": "hello", "description": "Greets from a script."}]})
    );
    let (status, v) = json(
        get(&acme, "/v1/conversations/c1/skills/hello")
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let loaded = v.clone();
    let key = sessionbox_core::ConversationRef::parse("acme", "c1")
        .unwrap()
        .key;
    assert_eq!(
        v["base_path"],
        format!("{}/.skills/hello", runtime.presented_root(&key))
    );
    assert_eq!(v["body"], "Run scripts/hi.sh.\n");
    // Loading does not create the conversation.
    assert!(store.get(&key).unwrap().is_none());

    // Another tenant has none of them; bad and unknown names are refused.
    let (_, v) = json(get(&other, "/v1/skills").await.unwrap()).await;
    assert_eq!(v, serde_json::json!({"skills": []}));
    for (key, path, status, code) in [
        (
            &other,
            "/v1/conversations/c1/skills/hello",
            404,
            "not_found",
        ),
        (&acme, "/v1/conversations/c1/skills/nope", 404, "not_found"),
        (
            &acme,
            "/v1/conversations/c1/skills/Bad_Name",
            400,
            "invalid_request",
        ),
        (
            &acme,
            "/v1/conversations/..x/skills/hello",
            400,
            "invalid_id",
        ),
    ] {
        let (s, v) = json(get(key, path).await.unwrap()).await;
        assert_eq!(
            (s.as_u16(), v["code"].as_str()),
            (status, Some(code)),
            "{path}: {v}"
        );
    }
    let r = http.get(format!("{base}/v1/skills")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    // The OpenAPI document has both routes.
    let (_, doc) = json(
        http.get(format!("{base}/v1/openapi.json"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(doc["paths"]["/v1/skills"]["get"].is_object());
    assert!(doc["paths"]["/v1/conversations/{id}/skills/{name}"]["get"].is_object());
    // ... and the documented shapes are the served ones.
    let props = |schema: &str| {
        let mut p: Vec<String> = doc["components"]["schemas"][schema]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("no schema {schema}"))
            .keys()
            .cloned()
            .collect();
        p.sort();
        p
    };
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    let (_, listed) = json(get(&acme, "/v1/skills").await.unwrap()).await;
    assert_eq!(keys(&listed), props("SkillsView"));
    assert_eq!(keys(&listed["skills"][0]), props("SkillSummary"));
    assert_eq!(keys(&loaded), props("SkillView"));

    // MCP, with the official SDK.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_skills_client.py");
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .args([script, &format!("{base}/mcp"), &acme])
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
    let _ = tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
}
