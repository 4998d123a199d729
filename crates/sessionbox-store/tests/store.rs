//! The store against real SQLite files in temporary directories.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sessionbox_core::{ConversationRef, TenantId};
use sessionbox_store::{AuditEntry, AuditFilter, ConversationState, SCHEMA_VERSION, Store};

const CHILD_DB: &str = "SESSIONBOX_STORE_TEST_CHILD_DB";
const CHILD_START: &str = "SESSIONBOX_STORE_TEST_CHILD_START_MS";

fn t(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap()
}

fn conv(tenant: &str, id: &str) -> ConversationRef {
    ConversationRef::parse(tenant, id).unwrap()
}

fn db(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("state").join("store.db")
}

fn entry(at: i64, c: &ConversationRef, op: &str, outcome: &str) -> AuditEntry {
    AuditEntry {
        at: t(at),
        tenant: c.tenant.clone(),
        conversation_key: Some(c.key.clone()),
        operation: op.into(),
        outcome: outcome.into(),
        detail: None,
    }
}

#[test]
fn sixteen_connections_racing_on_a_first_call_make_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = db(&dir);
    let barrier = Arc::new(Barrier::new(16));
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let (path, barrier) = (path.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait(); // open at once too: the schema is made under the race
                let store = Store::open(&path).unwrap();
                store
                    .get_or_create(&conv("acme", "race"), "host", Utc::now())
                    .unwrap()
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(results.iter().filter(|(_, created)| *created).count(), 1);
    assert!(results.iter().all(|(r, _)| *r == results[0].0));
    assert_eq!(Store::open(&path).unwrap().list(None).unwrap().len(), 1);
}

/// Not a test by itself: the body of [`two_processes_racing_on_a_first_call_make_one_record`]'s
/// child processes. Without the environment variable it does nothing.
#[test]
fn child_get_or_create() {
    let Ok(path) = std::env::var(CHILD_DB) else {
        return;
    };
    let store = Store::open(Path::new(&path)).unwrap();
    let start: i64 = std::env::var(CHILD_START).unwrap().parse().unwrap();
    while Utc::now().timestamp_millis() < start {
        thread::sleep(Duration::from_millis(1));
    }
    let (_, created) = store
        .get_or_create(&conv("acme", "race"), "host", Utc::now())
        .unwrap();
    println!("created={created}");
}

#[test]
fn two_processes_racing_on_a_first_call_make_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = db(&dir);
    Store::open(&path).unwrap();
    let start = Utc::now().timestamp_millis() + 1500;
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "child_get_or_create", "--nocapture"])
                .env(CHILD_DB, &path)
                .env(CHILD_START, start.to_string())
                .output()
        })
        .map(|o| o.unwrap())
        .collect();
    let mut created = 0;
    for out in &children {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        assert!(stdout.contains("created="), "{stdout}");
        created += stdout.matches("created=true").count();
    }
    assert_eq!(created, 1);
    assert_eq!(Store::open(&path).unwrap().list(None).unwrap().len(), 1);
}

#[test]
fn a_new_record_has_the_documented_shape_and_a_second_call_returns_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&db(&dir)).unwrap();
    let c = conv("acme", "c1");
    let (r, created) = store.get_or_create(&c, "isolated", t(1_000)).unwrap();
    assert!(created);
    assert_eq!(
        (&r.key, &r.tenant, &r.conversation_id),
        (&c.key, &c.tenant, &c.id)
    );
    assert_eq!(r.runtime, "isolated");
    assert_eq!(r.sandbox_ref, None);
    assert_eq!(r.state, ConversationState::Active);
    assert_eq!(
        (r.created_at, r.last_used_at, r.expires_at),
        (t(1_000), t(1_000), None)
    );
    let (again, created) = store.get_or_create(&c, "isolated", t(2_000)).unwrap();
    assert!(!created);
    assert_eq!(again, r);
    assert_eq!(store.get(&c.key).unwrap(), Some(r));
}

#[test]
fn two_tenants_with_one_conversation_id_get_two_records() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&db(&dir)).unwrap();
    let (a, _) = store
        .get_or_create(&conv("acme", "c1"), "host", t(1))
        .unwrap();
    let (b, created) = store
        .get_or_create(&conv("globex", "c1"), "host", t(1))
        .unwrap();
    assert!(created);
    assert_ne!(a.key, b.key);
    assert_eq!(store.list(None).unwrap().len(), 2);
}

#[test]
fn another_runtime_is_a_conflict_naming_the_owner() {
    let store = Store::open_in_memory().unwrap();
    let c = conv("acme", "c1");
    store.get_or_create(&c, "host", t(1)).unwrap();
    let err = store.get_or_create(&c, "isolated", t(2)).unwrap_err();
    assert_eq!(err.code(), "conflict");
    let msg = err.to_string();
    assert!(msg.contains("host") && msg.contains("destroy"), "{msg}");
    assert_eq!(store.get(&c.key).unwrap().unwrap().runtime, "host");
}

#[test]
fn bad_input_to_get_or_create_is_refused() {
    let store = Store::open_in_memory().unwrap();
    let mut c = conv("acme", "c1");
    assert_eq!(
        store.get_or_create(&c, "", t(1)).unwrap_err().code(),
        "invalid_request"
    );
    c.key = conv("acme", "c2").key;
    assert_eq!(
        store.get_or_create(&c, "host", t(1)).unwrap_err().code(),
        "invalid_request"
    );
    assert!(store.list(None).unwrap().is_empty());
}

#[test]
fn setters_change_one_field_and_refuse_unknown_conversations() {
    let store = Store::open_in_memory().unwrap();
    let c = conv("acme", "c1");
    store.get_or_create(&c, "aio", t(1_000)).unwrap();
    store.touch(&c.key, t(5_000)).unwrap();
    store.touch(&c.key, t(4_000)).unwrap(); // never back
    store.set_sandbox_ref(&c.key, Some("box-42")).unwrap();
    store
        .set_state(&c.key, ConversationState::Destroying)
        .unwrap();
    store.set_expiry(&c.key, Some(t(9_000))).unwrap();
    let r = store.get(&c.key).unwrap().unwrap();
    assert_eq!(r.last_used_at, t(5_000));
    assert_eq!(r.created_at, t(1_000));
    assert_eq!(r.sandbox_ref.as_deref(), Some("box-42"));
    assert_eq!(r.state, ConversationState::Destroying);
    assert_eq!(r.expires_at, Some(t(9_000)));
    store.set_sandbox_ref(&c.key, None).unwrap();
    store.set_expiry(&c.key, None).unwrap();
    let r = store.get(&c.key).unwrap().unwrap();
    assert_eq!((r.sandbox_ref, r.expires_at), (None, None));

    let other = conv("acme", "nope").key;
    assert!(store.get(&other).unwrap().is_none());
    for err in [
        store.touch(&other, t(1)).unwrap_err(),
        store.set_sandbox_ref(&other, Some("x")).unwrap_err(),
        store
            .set_state(&other, ConversationState::Active)
            .unwrap_err(),
        store.set_expiry(&other, None).unwrap_err(),
    ] {
        assert_eq!(err.code(), "not_found");
    }
}

#[test]
fn delete_is_idempotent_and_list_filters_by_tenant_most_recent_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&db(&dir)).unwrap();
    for (tenant, id, at) in [("acme", "a", 1), ("acme", "b", 2), ("globex", "a", 3)] {
        store
            .get_or_create(&conv(tenant, id), "host", t(at))
            .unwrap();
    }
    store.touch(&conv("acme", "a").key, t(10)).unwrap();
    let acme = TenantId::new("acme").unwrap();
    let ids: Vec<_> = store
        .list(Some(&acme))
        .unwrap()
        .into_iter()
        .map(|r| r.conversation_id.to_string())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(store.list(None).unwrap().len(), 3);

    let key = conv("acme", "a").key;
    assert!(store.delete(&key).unwrap());
    assert!(!store.delete(&key).unwrap());
    assert!(store.get(&key).unwrap().is_none());
    assert_eq!(store.list(Some(&acme)).unwrap().len(), 1);
}

#[test]
fn audit_log_reads_newest_first_filters_and_survives_delete() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&db(&dir)).unwrap();
    let (a, b) = (conv("acme", "a"), conv("globex", "b"));
    store.get_or_create(&a, "host", t(1)).unwrap();
    store.audit(&entry(10, &a, "open", "ok")).unwrap();
    let mut denied = entry(20, &a, "write", "outside_workspace");
    denied.detail = Some("../etc/passwd".into());
    store.audit(&denied).unwrap();
    store.audit(&entry(15, &b, "exec", "ok")).unwrap();
    store
        .audit(&AuditEntry {
            conversation_key: None,
            ..entry(30, &a, "list", "ok")
        })
        .unwrap();

    let all = store.audit_log(&AuditFilter::default()).unwrap();
    let ops: Vec<_> = all.iter().map(|r| r.entry.operation.as_str()).collect();
    assert_eq!(ops, ["list", "write", "exec", "open"]);
    assert_eq!(all[1].entry, denied);

    let by_key = AuditFilter {
        key: Some(a.key.clone()),
        ..AuditFilter::default()
    };
    assert_eq!(store.audit_log(&by_key).unwrap().len(), 2);
    let by_tenant = AuditFilter {
        tenant: Some(a.tenant.clone()),
        limit: Some(2),
        ..AuditFilter::default()
    };
    let ops: Vec<_> = store
        .audit_log(&by_tenant)
        .unwrap()
        .into_iter()
        .map(|r| r.entry.operation)
        .collect();
    assert_eq!(ops, ["list", "write"]);
    // `since` is inclusive: the entry at exactly 20 is in, the one at 15 is not.
    let since = AuditFilter {
        since: Some(entry(20, &a, "x", "ok").at),
        ..AuditFilter::default()
    };
    let ops: Vec<_> = store
        .audit_log(&since)
        .unwrap()
        .into_iter()
        .map(|r| r.entry.operation)
        .collect();
    assert_eq!(ops, ["list", "write"]);

    assert!(store.delete(&a.key).unwrap());
    store.audit(&entry(40, &a, "destroy", "ok")).unwrap();
    assert_eq!(store.audit_log(&by_key).unwrap().len(), 3);
}

#[test]
fn sandbox_uids_are_unique_stable_reused_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&db(&dir)).unwrap();
    let keys: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|id| {
            let c = conv("acme", id);
            store.get_or_create(&c, "isolated", t(1)).unwrap();
            c.key
        })
        .collect();
    let range = 5000..5003;
    let uids: Vec<_> = keys[..3]
        .iter()
        .map(|k| store.allocate_uid(k, range.clone()).unwrap())
        .collect();
    assert_eq!(uids, [5000, 5001, 5002]);
    assert_eq!(store.allocate_uid(&keys[1], range.clone()).unwrap(), 5001);

    let err = store.allocate_uid(&keys[3], range.clone()).unwrap_err();
    assert_eq!(err.code(), "conflict");
    assert!(err.to_string().contains("5000..5003"), "{err}");

    store.delete(&keys[1]).unwrap();
    assert_eq!(store.allocate_uid(&keys[3], range.clone()).unwrap(), 5001);

    let gone = conv("acme", "nope").key;
    assert_eq!(
        store.allocate_uid(&gone, range.clone()).unwrap_err().code(),
        "not_found"
    );
    assert_eq!(
        store.allocate_uid(&keys[0], 7..7).unwrap_err().code(),
        "invalid_request"
    );
}

#[test]
fn sixteen_connections_allocating_at_once_get_distinct_uids() {
    let dir = tempfile::tempdir().unwrap();
    let path = db(&dir);
    let setup = Store::open(&path).unwrap();
    for i in 0..16 {
        setup
            .get_or_create(&conv("acme", &format!("c{i}")), "isolated", t(1))
            .unwrap();
    }
    let barrier = Arc::new(Barrier::new(16));
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let (path, barrier) = (path.clone(), barrier.clone());
            thread::spawn(move || {
                let store = Store::open(&path).unwrap();
                let key = conv("acme", &format!("c{i}")).key;
                barrier.wait();
                let uid = store.allocate_uid(&key, 100..200).unwrap();
                assert_eq!(store.allocate_uid(&key, 100..200).unwrap(), uid);
                uid
            })
        })
        .collect();
    let mut uids: Vec<u32> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    uids.sort();
    assert_eq!(uids, (100..116).collect::<Vec<_>>());
}

#[test]
fn open_makes_a_private_directory_and_file_in_wal_mode() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new").join("deeper").join("store.db");
    Store::open(&path).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    assert_eq!(mode(&path), 0o600);
    let raw = rusqlite::Connection::open(&path).unwrap();
    let journal: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(journal, "wal");
}

#[test]
fn reopening_an_up_to_date_store_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = db(&dir);
    let store = Store::open(&path).unwrap();
    let c = conv("acme", "c1");
    store.get_or_create(&c, "host", t(1)).unwrap();
    drop(store);
    let raw = rusqlite::Connection::open(&path).unwrap();
    let changes = |raw: &rusqlite::Connection| -> i64 {
        raw.query_row("PRAGMA data_version", [], |r| r.get(0))
            .unwrap()
    };
    let before = changes(&raw);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert!(store.get(&c.key).unwrap().is_some());
    assert_eq!(changes(&raw), before, "reopening wrote to the database");
}

#[test]
fn a_store_from_a_newer_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = db(&dir);
    Store::open(&path).unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    let err = Store::open(&path).unwrap_err();
    assert_eq!(err.code(), "backend_error");
    let msg = err.to_string();
    assert!(
        msg.contains("newer") && msg.contains("upgrade sessionbox"),
        "{msg}"
    );
}

#[test]
fn store_is_clone_send_sync() {
    fn check<T: Clone + Send + Sync + 'static>() {}
    check::<Store>();
}
