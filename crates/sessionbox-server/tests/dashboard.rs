//! What the dashboard needs from the server, end to end over HTTP (the pages themselves are
//! tested in a browser by `ui-src/test`): its files under a strict content security policy,
//! `whoami`, the audit trail, the installation, terminal tickets, and what one tenant may hold of
//! the server while it sends bodies: import slots, and uploads in its budget.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them).
#![allow(clippy::unwrap_used)]

mod support;

use reqwest::{Method, StatusCode};
use serde_json::Value;
use sessionbox_core::{ConversationId, ConversationScope};
use support::Server;

async fn json_of(r: reqwest::Response) -> (StatusCode, Value) {
    let status = r.status();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_is_served_without_a_key_under_a_strict_policy() {
    let s = Server::start().await;
    let r = s.client.get(format!("{}/ui", s.base)).send().await.unwrap();
    // reqwest follows the redirect to /ui/.
    assert_eq!(r.url().path(), "/ui/");
    assert_eq!(r.status(), StatusCode::OK);
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    for rule in [
        "default-src 'none'",
        "script-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(rule), "{csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let page = r.text().await.unwrap();
    // No inline script, and nothing from another address.
    assert!(!page.contains("<script>"), "inline script");
    for outside in ["http://", "https://", "//cdn"] {
        assert!(!page.contains(outside), "{outside} in index.html");
    }
    for bad in [
        "/ui/../Cargo.toml",
        "/ui/%2e%2e/Cargo.toml",
        "/ui/nothing.js",
    ] {
        let r = s
            .client
            .get(format!("{}{bad}", s.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoami_audit_and_installation_answer_for_the_key_and_its_tenant_only() {
    let s = Server::start().await;
    s.put("alice", "a.txt", "a\n").await;
    s.put("bob", "b.txt", "b\n").await;
    let (status, me) = json_of(
        s.req(&s.admin, Method::GET, "/v1/whoami")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(me["tenant"], "acme");
    assert!(me["key_id"].as_str().is_some_and(|k| k.len() == 16), "{me}");
    assert_eq!(me["scope"]["conversations"]["kind"], "all", "{me}");

    // The whole tenant's trail, newest first, naming conversations by id.
    let (status, all) = json_of(
        s.req(&s.admin, Method::GET, "/v1/audit?limit=1000")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{all}");
    let records = all["records"].as_array().unwrap();
    assert!(
        records
            .iter()
            .any(|r| r["conversation"] == "alice" && r["operation"] == "write")
    );
    assert!(records.iter().any(|r| r["conversation"] == "bob"));
    let at: Vec<&str> = records.iter().map(|r| r["at"].as_str().unwrap()).collect();
    assert!(at.windows(2).all(|w| w[0] >= w[1]), "newest first: {at:?}");
    assert!(!all.to_string().contains(&s.admin), "never the key itself");

    // One conversation's, and a key limited to alice reads alice's only.
    let alice = s.key(
        ConversationScope::One(ConversationId::new("alice").unwrap()),
        true,
    );
    let (status, mine) = json_of(
        s.req(&alice, Method::GET, "/v1/audit?conversation=alice")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{mine}");
    let mine = mine["records"].as_array().unwrap();
    assert!(!mine.is_empty() && mine.iter().all(|r| r["conversation"] == "alice"));
    for path in [
        "/v1/audit?conversation=bob",
        "/v1/audit",
        "/v1/installation",
        "/v1/installation/doctor",
    ] {
        let (status, body) = json_of(s.req(&alice, Method::GET, path).send().await.unwrap()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
    }
    for path in [
        "/v1/audit?limit=0",
        "/v1/audit?conversation=../x",
        "/v1/audit?nope=1",
    ] {
        let (status, body) =
            json_of(s.req(&s.admin, Method::GET, path).send().await.unwrap()).await;
        assert!(status.is_client_error(), "{path}: {status} {body}");
    }

    // The installation: this tenant's conversations, the runtime, checks that hold.
    s.state
        .record_gc(&s.state.manager.collect_garbage(Default::default()).await);
    let (status, inst) = json_of(
        s.req(&s.admin, Method::GET, "/v1/installation")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{inst}");
    assert_eq!(inst["runtime"], "host");
    assert_eq!(inst["store"], "sqlite");
    assert_eq!(inst["conversations"], 2);
    assert!(inst["gc"]["at"].is_string(), "{inst}");
    let checks = inst["checks"].as_array().unwrap();
    assert!(
        checks.len() == 2 && checks.iter().all(|c| c["ok"] == true),
        "{inst}"
    );
    // Another tenant counts its own.
    let other = s
        .store
        .create_api_key(
            &sessionbox_core::TenantId::new("globex").unwrap(),
            None,
            chrono::Utc::now(),
        )
        .unwrap()
        .key;
    let (_, inst) = json_of(
        s.req(&other, Method::GET, "/v1/installation")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(inst["conversations"], 0, "{inst}");
}

/// `GET /v1/installation/doctor` answers `available: false` on a server given no probe; with
/// one, runs it once for two requests (the report is kept), at once for concurrent ones, and
/// shows its problems and text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doctor_report_runs_on_demand_once_per_period() {
    let s = Server::start().await;
    let get = || async {
        json_of(
            s.req(&s.admin, Method::GET, "/v1/installation/doctor")
                .send()
                .await
                .unwrap(),
        )
        .await
    };
    let (status, none) = get().await;
    assert_eq!(status, StatusCode::OK, "{none}");
    assert_eq!(none["available"], false, "{none}");
    assert!(none["checked_at"].is_null(), "{none}");

    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    assert!(s.state.set_doctor(std::sync::Arc::new(move || {
        let counted = counted.clone();
        Box::pin(async move {
            let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            // Slow enough for the concurrent requests below to meet it running.
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            sessionbox_server::DoctorReport {
                ok: false,
                problems: vec!["cgroup memory  MISSING".into()],
                text: format!("sandbox layers\n  cgroup memory  MISSING\nrun {n}"),
            }
        })
    })));
    // A second probe is refused: the first stays.
    assert!(!s.state.set_doctor(std::sync::Arc::new(|| Box::pin(async {
        unreachable!("never run")
    }))));
    let (a, b) = tokio::join!(get(), get());
    let (c_status, c) = get().await;
    for (status, v) in [&a, &b, &(c_status, c.clone())] {
        assert_eq!(*status, StatusCode::OK, "{v}");
        assert_eq!(v["available"], true, "{v}");
        assert_eq!(v["ok"], false, "{v}");
        assert_eq!(
            v["problems"],
            serde_json::json!(["cgroup memory  MISSING"]),
            "{v}"
        );
        assert!(v["report"].as_str().unwrap().ends_with("run 1"), "{v}");
        assert_eq!(v["checked_at"], a.1["checked_at"], "{v}");
    }
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_ticket_opens_one_terminal_of_its_conversation_once() {
    let s = Server::start().await;
    s.put("alice", "a.txt", "a\n").await;
    let issue = |key: String, id: &'static str| {
        s.req(
            &key,
            Method::POST,
            &format!("/v1/conversations/{id}/pty/tickets"),
        )
        .header("content-type", "application/json")
        .body("{}")
        .send()
    };
    let (status, t) = json_of(issue(s.admin.clone(), "alice").await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "{t}");
    let ticket = t["ticket"].as_str().unwrap().to_owned();
    assert!(t["expires_at"].is_string());
    // Without a key, the ticket is the credential, and only a WebSocket upgrade spends it: a
    // plain request is 426 and leaves the ticket unused.
    let plain = s
        .client
        .get(format!(
            "{}/v1/conversations/alice/pty?ticket={}",
            s.base, ticket
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), StatusCode::UPGRADE_REQUIRED);
    // A WebSocket handshake's status: 401 for a refused ticket; another answer (this runtime
    // runs no agent, so 503) for one that passed.
    let open = |id: &str, ticket: &str| {
        let url = format!(
            "{}/v1/conversations/{id}/pty?ticket={ticket}",
            s.base.replace("http://", "ws://")
        );
        let addr = s.base.trim_start_matches("http://").to_owned();
        async move {
            use tokio_tungstenite::tungstenite::client::IntoClientRequest;
            let req = url.into_client_request().unwrap();
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            match tokio_tungstenite::client_async(req, stream).await {
                Ok(_) => StatusCode::SWITCHING_PROTOCOLS,
                Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
                    StatusCode::from_u16(r.status().as_u16()).unwrap()
                }
                Err(e) => panic!("{e}"),
            }
        }
    };
    assert_eq!(
        open("bob", &ticket).await,
        StatusCode::UNAUTHORIZED,
        "another conversation"
    );
    let first = open("alice", &ticket).await;
    assert_ne!(first, StatusCode::UNAUTHORIZED, "the ticket passed");
    assert_eq!(
        open("alice", &ticket).await,
        StatusCode::UNAUTHORIZED,
        "a second use"
    );
    // Forged or cut tickets.
    let mut forged = ticket.clone();
    forged.pop();
    for bad in [forged.as_str(), "sbxt1.e30.AAAA", "sbxp1.x.y"] {
        assert_eq!(open("alice", bad).await, StatusCode::UNAUTHORIZED, "{bad}");
    }
    // A ticket of a key revoked since is refused.
    let brief = s
        .store
        .create_api_key(&support::acme(), None, chrono::Utc::now())
        .unwrap();
    let (_, t) = json_of(issue(brief.key.clone(), "alice").await.unwrap()).await;
    let late = t["ticket"].as_str().unwrap().to_owned();
    s.store
        .revoke_api_key(&brief.record.id, chrono::Utc::now())
        .unwrap();
    assert_eq!(
        open("alice", &late).await,
        StatusCode::UNAUTHORIZED,
        "revoked key"
    );
    // Only a key that may open a terminal there gets one.
    let reader = s.key(ConversationScope::All, true);
    let (status, _) = json_of(issue(reader, "alice").await.unwrap()).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let bobs = s.key(
        ConversationScope::One(ConversationId::new("bob").unwrap()),
        false,
    );
    let (status, _) = json_of(issue(bobs, "alice").await.unwrap()).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = json_of(
        s.client
            .post(format!("{}/v1/conversations/alice/pty/tickets", s.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "no key");
}

/// The attack: a tenant starts imports and sends their bodies as slowly as it likes (a body
/// has no deadline). The server writes two imports at once; before, one tenant holding both
/// kept every other tenant's imports refused for as long as its uploads lasted. Now a tenant
/// writes one import at a time: its second is refused naming that, and another tenant's
/// import goes through while the slow one still waits for its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holding_a_slow_import_leaves_room_for_another_tenants_import() {
    use tokio::io::AsyncWriteExt;
    let s = Server::start().await;
    let other = s
        .store
        .create_api_key(
            &sessionbox_core::TenantId::new("other").unwrap(),
            None,
            chrono::Utc::now(),
        )
        .unwrap()
        .key;
    s.put("origin", "f.txt", "exported\n").await;
    let r = s
        .req(&s.admin, Method::POST, "/v1/conversations/origin/snapshots")
        .header("content-type", "application/json")
        .body(r#"{"name": "s1"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let archive = s
        .req(&s.admin, Method::GET, "/v1/snapshots/s1/archive")
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();

    // Two slow imports of acme: the head and a few bytes of a 1 MB body, then nothing.
    let mut slow = Vec::new();
    for name in ["slow1", "slow2"] {
        let mut c = tokio::net::TcpStream::connect(s.base.trim_start_matches("http://"))
            .await
            .unwrap();
        let head = format!(
            "PUT /v1/snapshots/{name}/archive HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
             Content-Length: 1000000\r\n\r\nabc",
            s.admin
        );
        c.write_all(head.as_bytes()).await.unwrap();
        slow.push(c);
    }
    // One of them is answered at once (refused), the other waits for its bytes: which one is
    // the server's order of the two connections, not the order they were sent in.
    let (mut first, mut second) = (slow.remove(0), slow.remove(0));
    let (mut buf1, mut buf2) = (vec![0u8; 1024], vec![0u8; 1024]);
    let answer = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        use tokio::io::AsyncReadExt;
        tokio::select! {
            n = first.read(&mut buf1) => String::from_utf8_lossy(&buf1[..n.unwrap()]).into_owned(),
            n = second.read(&mut buf2) => String::from_utf8_lossy(&buf2[..n.unwrap()]).into_owned(),
        }
    })
    .await
    .expect("one of acme's two imports is answered at once");
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(answer.contains("one at a time"), "{answer}");

    let r = s
        .req(&other, Method::PUT, "/v1/snapshots/mine/archive")
        .body(archive.to_vec())
        .send()
        .await
        .unwrap();
    let (status, v) = json_of(r).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["files"], 1, "{v}");
    drop((first, second));
}

/// The attack: a key sends many file uploads at once and holds each one unfinished. A file
/// body is read whole before it is written, so before the server held every one (20 uploads
/// of 60 MiB took it from 57 MiB to 3 GiB; a few hundred would have ended it for every
/// tenant). Now each upload's declared length is reserved in the tenant's output budget
/// before a byte is read: past it an upload is refused (429) unread, naming the limit, and
/// another tenant's upload goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_held_unfinished_count_in_the_tenants_budget_and_leave_others_room() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const MIB: u64 = 1 << 20;
    let s = Server::start_with(sessionbox_server::ServerConfig {
        max_output_bytes_per_tenant: 40 * MIB,
        ..Default::default()
    })
    .await;
    let other = s
        .store
        .create_api_key(
            &sessionbox_core::TenantId::new("other").unwrap(),
            None,
            chrono::Utc::now(),
        )
        .unwrap()
        .key;
    // Two uploads of 15 MiB each, sent in part and held: 30 MiB of acme's 40 reserved.
    let mut held = Vec::new();
    for i in 0..3 {
        let mut c = tokio::net::TcpStream::connect(s.base.trim_start_matches("http://"))
            .await
            .unwrap();
        let head = format!(
            "PUT /v1/conversations/up/files/f{i}.bin HTTP/1.1\r\nHost: x\r\nAuthorization: \
             Bearer {}\r\nContent-Length: {}\r\n\r\n",
            s.admin,
            15 * MIB
        );
        c.write_all(head.as_bytes()).await.unwrap();
        c.write_all(&vec![b'x'; 1 << 20]).await.unwrap();
        held.push(c);
    }
    // The third is answered at once, refused; the first two wait for their bytes.
    let mut answer = vec![0u8; 2048];
    let n = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        held[2].read(&mut answer),
    )
    .await
    .expect("the upload past the budget is answered at once")
    .unwrap();
    let text = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert!(text.starts_with("HTTP/1.1 429"), "{text}");
    assert!(text.contains("max_output_bytes_per_tenant"), "{text}");
    for c in &mut held[..2] {
        let r = tokio::time::timeout(std::time::Duration::from_millis(300), c.read(&mut answer));
        assert!(
            r.await.is_err(),
            "an upload within the budget is still being received"
        );
    }

    let r = s
        .req(&other, Method::PUT, "/v1/conversations/mine/files/f.bin")
        .body(vec![b'y'; (15 * MIB) as usize])
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    // Once acme's held uploads end, its budget is whole again.
    drop(held);
    let mut ok = false;
    for _ in 0..50 {
        let r = s
            .req(&s.admin, Method::PUT, "/v1/conversations/up/files/g.bin")
            .body(vec![b'z'; (30 * MIB) as usize])
            .send()
            .await
            .unwrap();
        if r.status().is_success() {
            ok = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(ok, "acme's budget came back once its uploads ended");
}
