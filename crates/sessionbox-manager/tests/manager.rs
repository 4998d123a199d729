//! The manager over the real `host` runtime and a real SQLite store.

use std::sync::Arc;

use sessionbox_core::{ConversationRef, ExecRequest, Session};
use sessionbox_local::host::{HostConfig, HostRuntime};
use sessionbox_manager::Manager;
use sessionbox_store::{AuditFilter, Store};

fn manager(dir: &std::path::Path) -> Manager {
    let store = Store::open(&dir.join("sessionbox.db")).unwrap();
    let runtime = HostRuntime::new(HostConfig::new(dir)).unwrap();
    Manager::new(store, Arc::new(runtime))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_opens_in_one_process_make_one_record_and_one_workspace() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let conv = ConversationRef::parse("default", "race").unwrap();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let m = m.clone();
            let conv = conv.clone();
            tokio::spawn(async move { m.open(&conv).await.unwrap().created() })
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        created += usize::from(t.await.unwrap());
    }
    assert_eq!(created, 1);
    assert_eq!(m.list(None).await.unwrap().len(), 1);
    assert_eq!(
        std::fs::read_dir(d.path().join("workspaces"))
            .unwrap()
            .count(),
        1
    );
}

#[tokio::test]
async fn operations_are_audited_without_contents_or_commands() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let conv = ConversationRef::parse("acme", "c1").unwrap();
    let s = m.open(&conv).await.unwrap();
    s.write("secret.txt", b"TOPSECRET-CONTENT").await.unwrap();
    let r = s
        .exec(ExecRequest::new("echo TOPSECRET-COMMAND"))
        .await
        .unwrap();
    assert!(r.success());
    let refused = s.read("../escape").await.unwrap_err();
    assert_eq!(refused.code(), "outside_workspace");
    Box::new(s).close().await.unwrap();
    m.destroy(&conv).await.unwrap();

    let log = m
        .store()
        .audit_log(&AuditFilter {
            key: Some(conv.key.clone()),
            ..Default::default()
        })
        .unwrap();
    let ops: Vec<(String, String)> = log
        .iter()
        .rev()
        .map(|r| (r.entry.operation.clone(), r.entry.outcome.clone()))
        .collect();
    let want = [
        ("open", "ok"),
        ("write", "ok"),
        ("exec", "ok"),
        ("read", "outside_workspace"),
        ("close", "ok"),
        ("destroy", "ok"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(ops, want);
    for r in &log {
        let detail = r.entry.detail.clone().unwrap_or_default();
        assert!(!detail.contains("TOPSECRET"), "{detail}");
    }
    // The audit log outlives the conversation.
    assert!(m.list(None).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_conversation_resumes_its_files_after_close() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let conv = ConversationRef::parse("default", "resume").unwrap();
    let s = m.open(&conv).await.unwrap();
    assert!(s.created());
    s.write("a.txt", b"kept").await.unwrap();
    Box::new(s).close().await.unwrap();
    let m2 = manager(d.path());
    let s = m2.open(&conv).await.unwrap();
    assert!(!s.created());
    assert_eq!(s.read("a.txt").await.unwrap(), b"kept");
}

/// A write to a path ending in '/' (a directory's name) is refused and makes nothing: a file
/// of that name was written before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_to_a_directory_path_is_refused_and_makes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let conv = ConversationRef::parse("default", "slash").unwrap();
    let s = m.open(&conv).await.unwrap();
    let e = s.write("dir/", b"x").await.unwrap_err();
    assert_eq!(e.code(), "invalid_path", "{e}");
    assert_eq!(s.stat("dir").await.unwrap_err().code(), "not_found");
    s.write("dir/f", b"x").await.unwrap();
    let e = s.write("dir/", b"y").await.unwrap_err();
    assert_eq!(e.code(), "invalid_path", "{e}");
    assert_eq!(s.read("dir/f").await.unwrap(), b"x");
}

#[tokio::test]
async fn destroy_through_another_runtime_is_refused_and_removes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(&d.path().join("sessionbox.db")).unwrap();
    let conv = ConversationRef::parse("default", "owned").unwrap();
    // Recorded as belonging to `isolated`; this manager serves `host`.
    store
        .get_or_create(&conv, "isolated", chrono::Utc::now())
        .unwrap();
    let m = Manager::new(
        store,
        Arc::new(HostRuntime::new(HostConfig::new(d.path())).unwrap()),
    );
    let err = m.destroy(&conv).await.unwrap_err();
    assert_eq!(err.code(), "conflict");
    assert!(
        err.to_string().contains("belongs to the isolated runtime"),
        "{err}"
    );
    assert_eq!(m.list(None).await.unwrap().len(), 1);
}

/// `destroy` ends it all: the conversation's own network policy and its egress verdicts go
/// with it, and a new conversation of the same id starts with its tenant's policy.
#[tokio::test]
async fn destroy_removes_the_conversations_policy_and_egress_log() {
    use sessionbox_store::{EgressLogEntry, EgressLogFilter, PolicyScope};
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let conv = ConversationRef::parse("acme", "net").unwrap();
    let (tenant_hash, own_hash) = ("a".repeat(64), "b".repeat(64));
    let store = m.store();
    store
        .set_egress_policy(
            &PolicyScope::Tenant(conv.tenant.clone()),
            "TENANT",
            &tenant_hash,
            chrono::Utc::now(),
        )
        .unwrap();
    store
        .set_egress_policy(
            &PolicyScope::Conversation(conv.clone()),
            "OWN",
            &own_hash,
            chrono::Utc::now(),
        )
        .unwrap();
    let s = m.open(&conv).await.unwrap();
    Box::new(s).close().await.unwrap();
    store
        .log_egress(&EgressLogEntry {
            at: chrono::Utc::now(),
            tenant: conv.tenant.clone(),
            conversation_key: conv.key.clone(),
            allowed: true,
            method: "CONNECT".into(),
            target: "api.example.com:443".into(),
            address: None,
            rule: "api.example.com:443".into(),
            bytes_up: 1,
            bytes_down: 1,
            duration_ms: 1,
            end: None,
            count: 1,
        })
        .unwrap();
    m.destroy(&conv).await.unwrap();
    let s = m.open(&conv).await.unwrap();
    assert!(s.created());
    Box::new(s).close().await.unwrap();
    let p = store.effective_egress_policy(&conv).unwrap().unwrap();
    assert_eq!(
        p.hash, tenant_hash,
        "the new conversation inherited the old allowlist"
    );
    let log = store
        .egress_log(&EgressLogFilter {
            key: Some(conv.key.clone()),
            ..Default::default()
        })
        .unwrap();
    assert!(log.is_empty(), "{log:?}");
    assert!(
        store
            .egress_policy(&PolicyScope::Tenant(conv.tenant.clone()))
            .unwrap()
            .is_some(),
        "the tenant's policy went too"
    );
}
