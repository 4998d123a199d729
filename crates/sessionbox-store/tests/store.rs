//! The store against real SQLite files in temporary directories and real PostgreSQL databases
//! (see `support/pg.rs`). Every behaviour that both backends share is one test body run on
//! each: `sqlite::NAME` and `postgres::NAME`.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them); support modules are `pub` for the files that use them,
// and a test binary has no public API.
#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "support/pg.rs"]
mod pg;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sessionbox_core::{ConversationRef, TenantId};
use sessionbox_store::{
    AuditEntry, AuditFilter, BootstrapState, ConversationState, EgressLogEntry, EgressLogFilter,
    Lifecycle, OrphanClaim, PolicyScope, SCHEMA_VERSION, Store,
};

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

/// Not a test by itself: the body of [`two_processes_racing_on_a_first_call_make_one_record`]'s
/// child processes. Without the environment variable it does nothing.
/// Where a test's store lives: a SQLite file in a temporary directory, or a PostgreSQL database
/// of its own. [`Fx::open`] opens another `Store` on it (another connection, as another process
/// or replica would).
#[derive(Clone)]
struct Fx(Arc<FxInner>);

enum FxInner {
    Sqlite(tempfile::TempDir),
    Postgres(pg::TestDb),
}

impl Fx {
    fn sqlite() -> Fx {
        Fx(Arc::new(FxInner::Sqlite(tempfile::tempdir().unwrap())))
    }

    fn postgres() -> Option<Fx> {
        pg::database().map(|d| Fx(Arc::new(FxInner::Postgres(d))))
    }

    fn open(&self) -> Store {
        match &*self.0 {
            FxInner::Sqlite(dir) => Store::open(&db(dir)).unwrap(),
            FxInner::Postgres(d) => Store::connect(&d.url).unwrap(),
        }
    }
}

/// In `both! { GROUP; fn NAME(fx) { ... } ... }`, each function becomes the tests
/// `GROUP::sqlite::NAME` and `GROUP::postgresql::NAME`.
macro_rules! both {
    ($group:ident; $(fn $name:ident($fx:ident) $body:block)*) => {
        mod $group {
            #[allow(unused_imports)]
            use super::*;
            mod sqlite {
                #[allow(unused_imports)]
                use super::*;
                $(#[test] fn $name() { let $fx = Fx::sqlite(); $body })*
            }
            mod postgresql {
                #[allow(unused_imports)]
                use super::*;
                $(#[test] fn $name() { let Some($fx) = Fx::postgres() else { return }; $body })*
            }
        }
    };
}

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

const CHILD_AUDIT_DB: &str = "SESSIONBOX_STORE_TEST_CHILD_AUDIT_DB";

/// Not a test by itself: the body of
/// [`an_acknowledged_audit_entry_outlives_a_kill_9_of_its_process`]'s child, which appends
/// audit entries and says so after each, until it is killed. Without the environment variable
/// it does nothing.
#[test]
fn child_audit_until_killed() {
    use std::io::Write;
    let Ok(path) = std::env::var(CHILD_AUDIT_DB) else {
        return;
    };
    let store = Store::open(Path::new(&path)).unwrap();
    let c = conv("acme", "crash");
    let mut out = std::io::stdout();
    for i in 0.. {
        let mut e = entry(i, &c, "exec", "ok");
        e.detail = Some(format!("n={i}"));
        store.audit(&e).unwrap();
        writeln!(out, "acked {i}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn an_acknowledged_audit_entry_outlives_a_kill_9_of_its_process() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let path = db(&dir);
    Store::open(&path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_audit_until_killed", "--nocapture"])
        .env(CHILD_AUDIT_DB, &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut acked = None;
    let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines {
        let line = line.unwrap();
        if let Some(n) = line.strip_prefix("acked ") {
            let n: i64 = n.parse().unwrap();
            acked = Some(n);
            if n == 200 {
                // SIGKILL while it keeps appending: no destructor, no close, no checkpoint.
                child.kill().unwrap();
                break;
            }
        }
    }
    child.wait().unwrap();
    assert_eq!(acked, Some(200), "the child stopped before 200 entries");
    let log = Store::open(&path)
        .unwrap()
        .audit_log(&AuditFilter::default())
        .unwrap();
    let kept: std::collections::BTreeSet<String> =
        log.iter().filter_map(|r| r.entry.detail.clone()).collect();
    for i in 0..=200 {
        assert!(
            kept.contains(&format!("n={i}")),
            "acknowledged entry {i} is gone"
        );
    }
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

// ---- On both backends. ----

both! {
    records;

    fn sixteen_connections_racing_on_a_first_call_make_one_record(fx) {
        let barrier = Arc::new(Barrier::new(16));
        let handles: Vec<_> = (0..16)
            .map(|_| {
                let (fx, barrier) = (fx.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait(); // open at once too: the schema is made under the race
                    let store = fx.open();
                    store
                        .get_or_create(&conv("acme", "race"), "host", Utc::now())
                        .unwrap()
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|(_, created)| *created).count(), 1);
        assert!(results.iter().all(|(r, _)| *r == results[0].0));
        assert_eq!(fx.open().list(None).unwrap().len(), 1);
    }

    fn a_new_record_has_the_documented_shape_and_a_second_call_returns_it(fx) {
        let store = fx.open();
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

    fn two_tenants_with_one_conversation_id_get_two_records(fx) {
        let store = fx.open();
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

    fn another_runtime_is_a_conflict_naming_the_owner(fx) {
        let store = fx.open();
        let c = conv("acme", "c1");
        store.get_or_create(&c, "host", t(1)).unwrap();
        let err = store.get_or_create(&c, "isolated", t(2)).unwrap_err();
        assert_eq!(err.code(), "conflict");
        let msg = err.to_string();
        assert!(msg.contains("host") && msg.contains("destroy"), "{msg}");
        assert_eq!(store.get(&c.key).unwrap().unwrap().runtime, "host");
    }

    fn bad_input_to_get_or_create_is_refused(fx) {
        let store = fx.open();
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

    fn setters_change_one_field_and_refuse_unknown_conversations(fx) {
        let store = fx.open();
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

    fn delete_is_idempotent_and_list_filters_by_tenant_most_recent_first(fx) {
        let store = fx.open();
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

    fn audit_log_reads_newest_first_filters_and_survives_delete(fx) {
        let store = fx.open();
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

    fn sandbox_uids_are_unique_stable_reused_and_bounded(fx) {
        let store = fx.open();
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

    fn sixteen_connections_allocating_at_once_get_distinct_uids(fx) {
        let setup = fx.open();
        for i in 0..16 {
            setup
                .get_or_create(&conv("acme", &format!("c{i}")), "isolated", t(1))
                .unwrap();
        }
        let barrier = Arc::new(Barrier::new(16));
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let (fx, barrier) = (fx.clone(), barrier.clone());
                thread::spawn(move || {
                    let store = fx.open();
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

    fn a_reserved_uid_is_no_conversations_until_bound_and_then_only_its(fx) {
        let store = fx.open();
        let keys: Vec<_> = (0..3)
            .map(|i| {
                let c = conv("acme", &format!("r{i}"));
                store.get_or_create(&c, "isolated", t(1)).unwrap();
                c.key
            })
            .collect();
        let range = 6000..6003;
        assert_eq!(store.reserve_uid("pool:a", range.clone(), t(2)).unwrap(), 6000);
        assert_eq!(store.reserve_uid("pool:a", range.clone(), t(3)).unwrap(), 6000, "the same");
        // A conversation never gets a reserved uid.
        assert_eq!(store.allocate_uid(&keys[0], range.clone()).unwrap(), 6001);
        assert_eq!(store.reserve_uid("pool:b", range.clone(), t(2)).unwrap(), 6002);
        assert_eq!(store.allocate_uid(&keys[2], range.clone()).unwrap_err().code(), "conflict");
        // Bound: the conversation's, the reservation gone.
        assert_eq!(store.bind_reserved_uid("pool:a", &keys[1]).unwrap(), 6000);
        assert_eq!(store.allocate_uid(&keys[1], range.clone()).unwrap(), 6000);
        let held: Vec<_> = store.uid_reservations().unwrap().into_iter().map(|r| r.0).collect();
        assert_eq!(held, ["pool:b"]);
        // Not twice, not to a conversation that has a uid, not to one that does not exist.
        assert_eq!(store.bind_reserved_uid("pool:a", &keys[2]).unwrap_err().code(), "not_found");
        assert_eq!(store.bind_reserved_uid("pool:b", &keys[0]).unwrap_err().code(), "conflict");
        let gone = conv("acme", "nope").key;
        assert_eq!(store.bind_reserved_uid("pool:b", &gone).unwrap_err().code(), "not_found");
        assert_eq!(store.reserve_uid("", range.clone(), t(2)).unwrap_err().code(), "invalid_request");
        // Released: free again.
        assert!(store.release_uid("pool:b").unwrap());
        assert!(!store.release_uid("pool:b").unwrap());
        assert_eq!(store.allocate_uid(&keys[2], range.clone()).unwrap(), 6002);
        // A deleted conversation frees the uid it was bound.
        store.delete(&keys[1]).unwrap();
        assert_eq!(store.reserve_uid("pool:c", range, t(4)).unwrap(), 6000);
    }

}

// ---- Egress policies and verdicts, skill bootstraps, on both backends. ----

both! {
    egress_and_skills;
    fn a_conversation_policy_wins_over_its_tenant_policy(fx) {
        let s = fx.open();
        let conv = ConversationRef::parse("acme", "chat-1").unwrap();
        let other = ConversationRef::parse("acme", "chat-2").unwrap();
        let h = |c: char| c.to_string().repeat(64);
        assert_eq!(s.effective_egress_policy(&conv).unwrap(), None);
        s.set_egress_policy(
            &PolicyScope::Tenant(conv.tenant.clone()),
            "T",
            &h('a'),
            Utc::now(),
        )
        .unwrap();
        assert_eq!(
            s.effective_egress_policy(&conv).unwrap().unwrap().policy,
            "T"
        );
        s.set_egress_policy(
            &PolicyScope::Conversation(conv.clone()),
            "C",
            &h('b'),
            Utc::now(),
        )
        .unwrap();
        assert_eq!(
            s.effective_egress_policy(&conv).unwrap().unwrap().policy,
            "C"
        );
        assert_eq!(
            s.effective_egress_policy(&other).unwrap().unwrap().policy,
            "T"
        );
        s.set_egress_policy(
            &PolicyScope::Conversation(conv.clone()),
            "C2",
            &h('c'),
            Utc::now(),
        )
        .unwrap();
        assert_eq!(
            s.effective_egress_policy(&conv).unwrap().unwrap().hash,
            h('c')
        );
        assert_eq!(s.egress_policies(None).unwrap().len(), 2);
        // Removing the conversation's own policy falls back to the tenant's, once.
        let own = PolicyScope::Conversation(conv.clone());
        assert!(s.clear_egress_policy(&own).unwrap());
        assert!(!s.clear_egress_policy(&own).unwrap());
        assert_eq!(
            s.effective_egress_policy(&conv).unwrap().unwrap().policy,
            "T"
        );
        s.set_egress_policy(&own, "C2", &h('c'), Utc::now()).unwrap();
        assert!(
            s.set_egress_policy(
                &PolicyScope::Tenant(conv.tenant.clone()),
                "T",
                "short",
                Utc::now()
            )
            .is_err()
        );
    }

    fn verdicts_are_logged_per_conversation_and_read_newest_first(fx) {
        let s = fx.open();
        let a = ConversationRef::parse("acme", "a").unwrap();
        let b = ConversationRef::parse("acme", "b").unwrap();
        for (conv, allowed, target) in [
            (&a, true, "x:443"),
            (&b, false, "y:443"),
            (&a, false, "z:80"),
        ] {
            s.log_egress(&EgressLogEntry {
                at: Utc::now(),
                tenant: conv.tenant.clone(),
                conversation_key: conv.key.clone(),
                allowed,
                method: "CONNECT".into(),
                target: target.into(),
                address: allowed.then(|| "203.0.113.1:443".into()),
                rule: "r".into(),
                bytes_up: 5,
                bytes_down: u64::MAX,
                duration_ms: 1,
                end: None,
                count: 1,
            })
            .unwrap();
        }
        let log = s
            .egress_log(&EgressLogFilter {
                key: Some(a.key.clone()),
                ..Default::default()
            })
            .unwrap();
        let targets: Vec<&str> = log.iter().map(|r| r.entry.target.as_str()).collect();
        assert_eq!(targets, ["z:80", "x:443"]);
        assert_eq!(log[1].entry.bytes_down, i64::MAX as u64);
        assert_eq!(s.egress_log(&EgressLogFilter::default()).unwrap().len(), 3);
    }

    fn forgetting_a_conversations_egress_removes_its_policy_and_verdicts_only(fx) {
        let s = fx.open();
        let a = ConversationRef::parse("acme", "a").unwrap();
        let b = ConversationRef::parse("acme", "b").unwrap();
        let h = |c: char| c.to_string().repeat(64);
        let tenant = PolicyScope::Tenant(a.tenant.clone());
        s.set_egress_policy(&tenant, "T", &h('a'), Utc::now()).unwrap();
        for c in [&a, &b] {
            s.set_egress_policy(&PolicyScope::Conversation(c.clone()), "C", &h('b'), Utc::now())
                .unwrap();
            s.log_egress(&EgressLogEntry {
                at: Utc::now(),
                tenant: c.tenant.clone(),
                conversation_key: c.key.clone(),
                allowed: true,
                method: "CONNECT".into(),
                target: "x:443".into(),
                address: None,
                rule: "r".into(),
                bytes_up: 0,
                bytes_down: 0,
                duration_ms: 0,
                end: None,
                count: 1,
            })
            .unwrap();
        }
        assert!(s.forget_conversation_egress(&a).unwrap());
        assert!(!s.forget_conversation_egress(&a).unwrap(), "twice");
        // a falls back to its tenant's policy, with an empty log; b and the tenant keep theirs.
        assert_eq!(s.effective_egress_policy(&a).unwrap().unwrap().policy, "T");
        assert_eq!(s.effective_egress_policy(&b).unwrap().unwrap().policy, "C");
        let log = |c: &ConversationRef| {
            s.egress_log(&EgressLogFilter {
                key: Some(c.key.clone()),
                ..Default::default()
            })
            .unwrap()
            .len()
        };
        assert_eq!((log(&a), log(&b)), (0, 1));
        assert!(s.egress_policy(&tenant).unwrap().is_some());
    }

    fn a_bootstrap_is_claimed_once_per_digest_and_again_after_a_failure_or_when_stale(fx) {
        let store = fx.open();
        let conv = ConversationRef::new(TenantId::new("t").unwrap(), "c".parse().unwrap());
        let now = Utc::now();
        let stale = chrono::Duration::minutes(15);
        let k = &conv.key;
        assert!(
            store.claim_bootstrap(k, "s", "d1", now, stale).is_err(),
            "no conversation yet"
        );
        store.get_or_create(&conv, "host", now).unwrap();
        assert!(store.claim_bootstrap(k, "s", "d1", now, stale).unwrap());
        assert!(
            !store.claim_bootstrap(k, "s", "d1", now, stale).unwrap(),
            "running"
        );
        store.finish_bootstrap(k, "s", 0, now).unwrap();
        assert!(
            !store.claim_bootstrap(k, "s", "d1", now, stale).unwrap(),
            "done"
        );
        assert!(
            store.claim_bootstrap(k, "s", "d2", now, stale).unwrap(),
            "skill changed"
        );
        store.finish_bootstrap(k, "s", 3, now).unwrap();
        let r = &store.bootstraps(k).unwrap()[0];
        assert_eq!(
            (r.state, r.exit_code, r.runs),
            (BootstrapState::Failed, Some(3), 2)
        );
        // Finished again (the statement repeated after its answer was lost): the run counts once.
        store.finish_bootstrap(k, "s", 0, now).unwrap();
        let r = &store.bootstraps(k).unwrap()[0];
        assert_eq!(
            (r.state, r.exit_code, r.runs),
            (BootstrapState::Failed, Some(3), 2),
            "a finished bootstrap was finished twice"
        );
        assert!(
            store.claim_bootstrap(k, "s", "d2", now, stale).unwrap(),
            "failed: again"
        );
        let later = now + chrono::Duration::minutes(16);
        assert!(
            store.claim_bootstrap(k, "s", "d2", later, stale).unwrap(),
            "stale claim"
        );
        store.delete(k).unwrap();
        assert!(
            store.bootstraps(k).unwrap().is_empty(),
            "rows go with the conversation"
        );
    }
}

// ---- Lifecycle, on both backends. ----

fn policy(ttl_ms: Option<u64>, max_ms: Option<u64>) -> Lifecycle {
    Lifecycle {
        idle_timeout: Some(Duration::from_secs(60)),
        ttl: ttl_ms.map(Duration::from_millis),
        max_lifetime: max_ms.map(Duration::from_millis),
    }
}

both! {
    lifecycle;

    fn a_new_record_keeps_its_lifecycle_and_expires_at_the_nearer_bound(fx) {
        let store = fx.open();
        let c = conv("acme", "life");
        let (r, _) = store
            .get_or_create_with(&c, "host", t(1_000), &policy(Some(500), Some(10_000)))
            .unwrap();
        assert_eq!(r.expires_at, Some(t(1_500)));
        assert_eq!(r.ttl, Some(Duration::from_millis(500)));
        assert_eq!(r.max_lifetime, Some(Duration::from_millis(10_000)));
        assert_eq!(r.idle_timeout, Some(Duration::from_secs(60)));
        assert!(r.generation >= 0);
        let c2 = conv("acme", "capped");
        let (r2, _) = store
            .get_or_create_with(&c2, "host", t(1_000), &policy(Some(5_000), Some(2_000)))
            .unwrap();
        assert_eq!(r2.expires_at, Some(t(3_000)));
        assert_ne!(r.generation, r2.generation);
        let (none, _) = store
            .get_or_create_with(&conv("acme", "forever"), "host", t(1), &Lifecycle::default())
            .unwrap();
        assert_eq!((none.expires_at, none.ttl, none.max_lifetime), (None, None, None));
    }

    fn use_renews_up_to_the_maximum_lifetime_and_not_after_expiry(fx) {
        let store = fx.open();
        let c = conv("acme", "renew");
        store
            .get_or_create_with(&c, "host", t(0), &policy(Some(1_000), Some(2_500)))
            .unwrap();
        store.touch(&c.key, t(900)).unwrap();
        assert_eq!(store.get(&c.key).unwrap().unwrap().expires_at, Some(t(1_900)));
        store.touch(&c.key, t(1_800)).unwrap();
        // Capped by created_at + max_lifetime.
        assert_eq!(store.get(&c.key).unwrap().unwrap().expires_at, Some(t(2_500)));
        // Expired: not renewed, and said so.
        let err = store.touch(&c.key, t(2_500)).unwrap_err();
        assert_eq!(err.code(), "not_found");
        assert!(err.to_string().contains("expired"), "{err}");
        let r = store.get(&c.key).unwrap().unwrap();
        assert_eq!((r.expires_at, r.last_used_at), (Some(t(2_500)), t(1_800)));
        assert!(r.is_expired(t(2_500)) && !r.is_expired(t(2_499)));
    }

    fn claiming_an_expired_conversation_stops_renewal_and_a_live_one_is_not_claimed(fx) {
        let store = fx.open();
        let c = conv("acme", "claim");
        store
            .get_or_create_with(&c, "host", t(0), &policy(Some(1_000), None))
            .unwrap();
        assert!(!store.claim_expired(&c.key, t(999)).unwrap());
        assert!(store.claim_expired(&c.key, t(1_000)).unwrap());
        assert!(!store.claim_expired(&c.key, t(1_000)).unwrap(), "claimed twice");
        assert_eq!(store.touch(&c.key, t(1_001)).unwrap_err().code(), "busy");
        assert_eq!(
            store.get(&c.key).unwrap().unwrap().state,
            ConversationState::Destroying
        );
    }

    fn an_expired_notice_is_taken_once_forgotten_and_pruned(fx) {
        let store = fx.open();
        let c = conv("acme", "noticed");
        let (r, _) = store
            .get_or_create_with(&c, "host", t(0), &policy(Some(1_000), None))
            .unwrap();
        assert_eq!(r.status(t(999)), "active");
        assert_eq!(r.status(t(1_000)), "expired");
        assert!(store.take_expired_notice(&c.key).unwrap().is_none());
        store.note_expired(&r, t(5_000)).unwrap();
        let other = fx.open();
        let n = other.expired_notice(&c.key).unwrap().unwrap();
        assert_eq!(
            (n.tenant.as_str(), n.conversation_id.as_str(), n.expired_at, n.destroyed_at),
            ("acme", "noticed", t(1_000), t(5_000))
        );
        // Taken once, by one of two stores.
        let got = [store.take_expired_notice(&c.key).unwrap(), other.take_expired_notice(&c.key).unwrap()];
        assert_eq!(got.iter().filter(|g| g.is_some()).count(), 1);
        store.note_expired(&r, t(5_000)).unwrap();
        assert!(store.forget_expired_notice(&c.key).unwrap());
        assert!(!store.forget_expired_notice(&c.key).unwrap());
        store.note_expired(&r, t(5_000)).unwrap();
        assert_eq!(store.prune_expired_notices(t(5_000)).unwrap(), 0);
        assert_eq!(store.prune_expired_notices(t(5_001)).unwrap(), 1);
        assert!(store.expired_notice(&c.key).unwrap().is_none());
        let claimed = store.claim_expired(&c.key, t(1_000)).unwrap();
        assert!(claimed);
        assert_eq!(store.get(&c.key).unwrap().unwrap().status(t(1_000)), "destroying");
    }

    fn renew_racing_expiry_has_exactly_one_winner(fx) {
        // Many rounds of a renew and a claim at the instant of expiry, from two connections:
        // either the renew moved the expiry on and the claim failed, or the claim won and the
        // renew was refused. Never both, never neither.
        let (a, b) = (fx.open(), fx.open());
        for i in 0..40 {
            let c = conv("acme", &format!("race-{i}"));
            a.get_or_create_with(&c, "host", t(0), &policy(Some(1_000), None)).unwrap();
            let barrier = Arc::new(Barrier::new(2));
            let (k1, k2, b1, b2) = (c.key.clone(), c.key.clone(), barrier.clone(), barrier);
            let (s1, s2) = (a.clone(), b.clone());
            let renew = thread::spawn(move || {
                b1.wait();
                s1.touch(&k1, t(999)).is_ok()
            });
            let claim = thread::spawn(move || {
                b2.wait();
                s2.claim_expired(&k2, t(1_000)).unwrap()
            });
            let (renewed, claimed) = (renew.join().unwrap(), claim.join().unwrap());
            assert!(renewed != claimed, "round {i}: renewed={renewed} claimed={claimed}");
            let r = a.get(&c.key).unwrap().unwrap();
            assert_eq!(r.state == ConversationState::Destroying, claimed, "round {i}");
        }
    }

    fn an_orphan_claim_holds_off_a_new_record_until_released(fx) {
        let store = fx.open();
        let c = conv("acme", "orphan");
        assert_eq!(store.claim_orphan(&c.key, t(1)).unwrap(), OrphanClaim::Claimed);
        let err = store.get_or_create(&c, "host", t(2)).unwrap_err();
        assert_eq!(err.code(), "busy");
        assert!(store.get(&c.key).unwrap().is_none());
        store.release_orphan(&c.key).unwrap();
        let (r, created) = store.get_or_create(&c, "host", t(3)).unwrap();
        assert!(created);
        assert_eq!(store.claim_orphan(&c.key, t(4)).unwrap(), OrphanClaim::HasRecord);
        assert!(store.claim_for_destroy(&c.key, r.generation).unwrap());
        assert!(!store.claim_for_destroy(&c.key, r.generation + 1).unwrap());
    }

    fn a_held_conversation_waits_for_its_holder_across_stores(fx) {
        // Two stores on one database stand for two processes (or replicas).
        let (a, b) = (fx.open(), fx.open());
        let key = conv("acme", "held").key;
        let other = conv("acme", "free").key;
        let held = a.lock_conversation(&key).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let k = key.clone();
        let waiter = thread::spawn(move || {
            let _l = b.lock_conversation(&k).unwrap();
            tx.send(Utc::now()).unwrap();
        });
        thread::sleep(Duration::from_millis(300));
        assert!(rx.try_recv().is_err(), "the second holder did not wait");
        let released = Utc::now();
        drop(held);
        let got = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(got >= released);
        waiter.join().unwrap();
        // Another conversation is not held up (unless it shares a stripe, which these do not).
        let _x = a.lock_conversation(&key).unwrap();
        let _y = fx.open().lock_conversation(&other).unwrap();
    }
}

// ---- PostgreSQL only. ----

/// The synchronous PostgreSQL client cannot run on a thread that drives async tasks; the store
/// steps off the runtime itself, so a front end calling it from a task (the egress gateway's
/// policy lookups, a skill bind) does not panic. Eight tasks on a two-worker runtime connect,
/// write and read at once, then the store is dropped inside the runtime.
#[test]
fn a_postgres_store_works_when_called_from_async_tasks() {
    let Some(fx) = Fx::postgres() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let inner = fx.clone(); // the test database itself is dropped outside the runtime
    rt.block_on(async move {
        let store = inner.open();
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let s = store.clone();
                tokio::spawn(async move {
                    let c = conv("acme", &format!("async-{i}"));
                    s.get_or_create(&c, "host", Utc::now()).unwrap();
                    s.audit(&entry(1, &c, "exec", "ok")).unwrap();
                    s.get(&c.key).unwrap().unwrap().conversation_id
                })
            })
            .collect();
        for (i, t) in tasks.into_iter().enumerate() {
            assert_eq!(t.await.unwrap().as_str(), format!("async-{i}"));
        }
        assert_eq!(store.list(None).unwrap().len(), 8);
        drop(store);
    });
}

#[test]
fn postgres_replicas_migrating_at_once_make_one_schema() {
    let Some(d) = pg::database() else { return };
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (url, barrier) = (d.url.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                Store::connect(&url).unwrap().schema_version().unwrap()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), SCHEMA_VERSION);
    }
    let mut c = postgres::Client::connect(&d.url, postgres::NoTls).unwrap();
    let rows = c
        .query("SELECT version FROM sessionbox_schema", &[])
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, i64>(0), i64::from(SCHEMA_VERSION));
}

#[test]
fn a_postgres_store_from_a_newer_version_is_refused() {
    let Some(d) = pg::database() else { return };
    Store::connect(&d.url).unwrap();
    let mut c = postgres::Client::connect(&d.url, postgres::NoTls).unwrap();
    c.execute(
        "UPDATE sessionbox_schema SET version = $1",
        &[&i64::from(SCHEMA_VERSION + 1)],
    )
    .unwrap();
    let err = Store::connect(&d.url).unwrap_err();
    assert!(err.to_string().contains("newer"), "{err}");
}

#[test]
fn a_postgres_password_never_appears_in_an_error() {
    let secret = "hunter2-do-not-print";
    // Nothing listens on port 1.
    let err = Store::connect(&format!("postgres://sb:{secret}@127.0.0.1:1/sb")).unwrap_err();
    let msg = err.to_string();
    assert!(!msg.contains(secret), "{msg}");
    assert!(msg.contains("127.0.0.1:1/sb"), "{msg}");
    let err = Store::connect(&format!("postgres://sb:{secret}@127.0.0.1:notaport/sb")).unwrap_err();
    assert!(!err.to_string().contains(secret), "{err}");
    assert_eq!(err.code(), "invalid_request");
    let err = Store::open_configured(Some(&format!("mysql://sb:{secret}@h/db")), Path::new("x"))
        .unwrap_err();
    assert!(!err.to_string().contains(secret), "{err}");
}

// ---- SQLite backup and restore. ----

#[test]
fn a_backup_taken_while_another_connection_writes_restores_every_committed_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = db(&dir);
    let store = Store::open(&path).unwrap();
    for i in 0..50 {
        store
            .get_or_create(&conv("acme", &format!("b{i}")), "host", t(i))
            .unwrap();
    }
    // A writer on its own connection keeps committing while the backup runs.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let committed = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let writer = {
        let (path, stop, committed) = (path.clone(), stop.clone(), committed.clone());
        thread::spawn(move || {
            let w = Store::open(&path).unwrap();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                w.get_or_create(&conv("acme", &format!("w{n}")), "host", t(n))
                    .unwrap();
                n += 1;
                committed.store(n, std::sync::atomic::Ordering::SeqCst);
            }
            n
        })
    };
    // The backup starts once the writer is committing (on a loaded machine its first commit
    // can take longer than any fixed pause).
    while committed.load(std::sync::atomic::Ordering::SeqCst) < 1 {
        thread::sleep(Duration::from_millis(5));
    }
    let backup = dir.path().join("backup.db");
    store.backup(&backup).unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let written = writer.join().unwrap();
    assert!(written > 0);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&backup).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // A second backup to the same file is refused rather than overwriting it.
    assert_eq!(store.backup(&backup).unwrap_err().code(), "invalid_request");

    // The backup is a consistent store on its own: every record before it began, a prefix of
    // the writer's.
    let copy = Store::open(&backup).unwrap();
    let listed = copy.list(None).unwrap();
    let ws: Vec<i64> = listed
        .iter()
        .filter_map(|r| {
            r.conversation_id
                .as_str()
                .strip_prefix('w')
                .map(|n| n.parse().unwrap())
        })
        .collect();
    assert_eq!(listed.len() - ws.len(), 50);
    let max = ws.iter().copied().max().unwrap_or(-1);
    assert_eq!(
        ws.len() as i64,
        max + 1,
        "the backup holds a gap in the writer's records"
    );

    // Restore into the live store: it reads as the backup did.
    let key = store
        .create_api_key(&TenantId::new("acme").unwrap(), None, Utc::now())
        .unwrap();
    store.restore(&backup).unwrap();
    assert_eq!(store.list(None).unwrap(), listed);
    assert_eq!(
        store.verify_api_key(&key.key, Utc::now()).unwrap(),
        sessionbox_store::KeyCheck::Invalid,
        "made after the backup"
    );
    assert_eq!(Store::open(&path).unwrap().list(None).unwrap(), listed);
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
}

#[test]
fn restoring_something_that_is_not_a_store_backup_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&db(&dir)).unwrap();
    store
        .get_or_create(&conv("acme", "keep"), "host", t(1))
        .unwrap();
    let junk = dir.path().join("junk");
    std::fs::write(&junk, b"not a database at all, not even close to one").unwrap();
    assert_eq!(store.restore(&junk).unwrap_err().code(), "invalid_request");
    let empty = dir.path().join("empty.db");
    rusqlite::Connection::open(&empty)
        .unwrap()
        .execute_batch("CREATE TABLE t (x)")
        .unwrap();
    assert_eq!(store.restore(&empty).unwrap_err().code(), "invalid_request");
    assert_eq!(store.list(None).unwrap().len(), 1);
}

// ---- The warm pool of a remote runtime, on both backends. ----

fn slot(name: &str, tenant: &str, sandbox: &str, created: i64) -> sessionbox_store::RemotePoolSlot {
    sessionbox_store::RemotePoolSlot {
        runtime: "opensandbox".into(),
        tenant: tenant.into(),
        slot: name.into(),
        sandbox_id: sandbox.into(),
        created_at: t(created),
        expires_at: Some(t(created + 1_000)),
    }
}

both! {
    pool_slots;
    fn a_bind_takes_the_oldest_slot_of_its_tenant_once_and_records_it(fx) {
        let store = fx.open();
        store.add_pool_slot(&slot("a.2", "acme", "sb-2", 20)).unwrap();
        store.add_pool_slot(&slot("a.1", "acme", "sb-1", 10)).unwrap();
        store.add_pool_slot(&slot("b.1", "beta", "sb-3", 5)).unwrap();
        assert_eq!(store.add_pool_slot(&slot("a.1", "acme", "sb-9", 1)).unwrap_err().code(), "conflict");
        assert_eq!(store.add_pool_slot(&slot("a/1", "acme", "sb-9", 1)).unwrap_err().code(), "invalid_request");
        assert_eq!(store.add_pool_slot(&slot(&"x".repeat(64), "acme", "sb-9", 1)).unwrap_err().code(), "invalid_request");
        let names = |s: &Store| s.pool_slots("opensandbox").unwrap().into_iter().map(|s| s.slot).collect::<Vec<_>>();
        assert_eq!(names(&store), ["b.1", "a.1", "a.2"]);
        assert!(store.pool_slots("aio").unwrap().is_empty());

        let k1 = conv("acme", "c1").key;
        let got = store.bind_pool_slot("opensandbox", "acme", &k1, t(30)).unwrap().unwrap();
        assert_eq!((got.slot.as_str(), got.sandbox_id.as_str()), ("a.1", "sb-1"));
        let rec = store.remote_sandbox(&k1).unwrap().unwrap();
        assert_eq!((rec.sandbox_id.as_str(), rec.expires_at), ("sb-1", Some(t(1_010))));
        assert_eq!(names(&store), ["b.1", "a.2"]);
        // A conversation with a sandbox takes nothing.
        assert!(store.bind_pool_slot("opensandbox", "acme", &k1, t(31)).unwrap().is_none());
        assert_eq!(names(&store), ["b.1", "a.2"]);
        assert_eq!(store.remote_sandbox(&k1).unwrap().unwrap().sandbox_id, "sb-1");
        // Another tenant's slot is never given.
        let k2 = conv("acme", "c2").key;
        assert_eq!(store.bind_pool_slot("opensandbox", "acme", &k2, t(32)).unwrap().unwrap().slot, "a.2");
        let k3 = conv("acme", "c3").key;
        assert!(store.bind_pool_slot("opensandbox", "acme", &k3, t(33)).unwrap().is_none());
        assert!(store.remote_sandbox(&k3).unwrap().is_none());
        // Expiry and removal.
        assert!(store.set_pool_slot_expiry("opensandbox", "b.1", Some(t(9_000))).unwrap());
        assert!(!store.set_pool_slot_expiry("opensandbox", "a.1", Some(t(9_000))).unwrap());
        assert_eq!(store.pool_slots("opensandbox").unwrap()[0].expires_at, Some(t(9_000)));
        assert!(!store.remove_pool_slot("aio", "b.1").unwrap());
        assert!(store.remove_pool_slot("opensandbox", "b.1").unwrap());
        assert!(!store.remove_pool_slot("opensandbox", "b.1").unwrap());
        assert!(names(&store).is_empty());
    }

    fn concurrent_binds_never_take_one_slot_twice(fx) {
        let store = fx.open();
        for i in 0..6 {
            store.add_pool_slot(&slot(&format!("s.{i}"), "acme", &format!("sb-{i}"), i)).unwrap();
        }
        let barrier = Arc::new(Barrier::new(10));
        let handles: Vec<_> = (0..10)
            .map(|i| {
                let (fx, barrier) = (fx.clone(), barrier.clone());
                thread::spawn(move || {
                    let store = fx.open();
                    let key = conv("acme", &format!("race{i}")).key;
                    barrier.wait();
                    let got = store.bind_pool_slot("opensandbox", "acme", &key, t(100)).unwrap();
                    (key, got)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let mut taken: Vec<String> = results.iter().filter_map(|(_, s)| s.as_ref().map(|s| s.slot.clone())).collect();
        taken.sort();
        assert_eq!(taken, (0..6).map(|i| format!("s.{i}")).collect::<Vec<_>>(), "each slot exactly once");
        for (key, got) in &results {
            let rec = store.remote_sandbox(key).unwrap();
            assert_eq!(rec.map(|r| r.sandbox_id), got.as_ref().map(|s| s.sandbox_id.clone()));
        }
        assert!(store.pool_slots("opensandbox").unwrap().is_empty());
    }
}
