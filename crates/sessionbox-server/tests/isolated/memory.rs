//! `GET /v1/conversations/{id}` reports the sandbox's memory: its memory cgroup's charge
//! against the sandbox's limit, per conversation.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sessionbox_sandbox::SandboxLimits;

use super::{Server, body};

const MIB: u64 = 1 << 20;

async fn memory(s: &Server, id: &str) -> Value {
    let (st, v) = body(
        s.req(Method::GET, &format!("/v1/conversations/{id}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    v["memory"].clone()
}

fn used(m: &Value) -> u64 {
    m["bytes_used"].as_u64().unwrap_or(0)
}

/// A command that holds 96 MiB shows in its own conversation's memory, charged to its cgroup
/// against the sandbox's limit, and not in another conversation's; the charge falls when the
/// command ends.
pub(crate) async fn memory_use_is_the_sandboxs_cgroup_charge_against_its_limit() {
    let s = Server::start().await;
    for id in ["mem-a", "mem-b"] {
        let (st, v) = body(
            s.json(
                Method::POST,
                &format!("/v1/conversations/{id}/exec"),
                &json!({"command": "true"}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }
    let idle = memory(&s, "mem-b").await;
    assert_eq!(idle["measured"], "cgroup", "{idle}");
    assert_eq!(
        idle["bytes_limit"].as_u64(),
        Some(SandboxLimits::default().memory_bytes),
        "{idle}"
    );
    assert!(used(&idle) > 0 && used(&idle) < 64 * MIB, "{idle}");

    let (st, v) = body(
        s.json(
            Method::POST,
            "/v1/conversations/mem-a/exec",
            &json!({
                "command": "python3 -c 'import time; b = b\"x\" * (96 << 20); print(len(b), flush=True); time.sleep(120)'",
                "background": true,
            }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{v}");
    let command = v["id"].as_str().unwrap().to_owned();
    let seen = until_memory(&s, "mem-a", |m| used(m) >= 96 * MIB).await;
    assert!(used(&seen) >= 96 * MIB, "the 96 MiB never showed: {seen}");
    assert!(
        used(&seen) < SandboxLimits::default().memory_bytes,
        "{seen}"
    );
    // The other conversation's sandbox is charged nothing of it.
    let other = memory(&s, "mem-b").await;
    assert!(used(&other) < 64 * MIB, "{other}");

    let (st, v) = body(
        s.req(
            Method::DELETE,
            &format!("/v1/conversations/mem-a/commands/{command}"),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert!(st.is_success(), "{st} {v}");
    let after = until_memory(&s, "mem-a", |m| used(m) < 64 * MIB).await;
    assert!(
        used(&after) < 64 * MIB,
        "the charge did not fall after the command ended: {after}"
    );
}

/// `id`'s memory once `done` holds of it, or the last one read after 30 s.
async fn until_memory(s: &Server, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let m = memory(s, id).await;
        if done(&m) || Instant::now() > end {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
