//! Snapshot records and templates, on real SQLite files and real PostgreSQL databases (see
//! `support/pg.rs`). Every body runs on each backend: `sqlite::NAME` and `postgresql::NAME`.

#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "support/pg.rs"]
mod pg;

use std::sync::{Arc, Barrier};
use std::thread;

use chrono::{DateTime, Utc};
use sessionbox_core::{ConversationId, ConversationRef, Error, TenantId};
use sessionbox_store::{SCHEMA_VERSION, SnapshotRecord, Store};

/// The schema version before snapshots (migration 12 made their tables).
const BEFORE_SNAPSHOTS: u32 = 11;

/// Where a test's store lives; [`Fx::open`] opens another `Store` on it (another connection,
/// as another process or replica would).
#[derive(Clone)]
struct Fx(Arc<FxInner>);

enum FxInner {
    Sqlite(tempfile::TempDir),
    Postgres(pg::TestDb),
}

impl Fx {
    fn open(&self) -> Store {
        match &*self.0 {
            FxInner::Sqlite(dir) => Store::open(&dir.path().join("store.db")).unwrap(),
            FxInner::Postgres(d) => Store::connect(&d.url).unwrap(),
        }
    }

    /// Takes the database back to the schema before snapshots, as an older sessionbox left it
    /// (valid while migration 13, scoped keys, is the newest).
    fn downgrade_to_before_snapshots(&self) {
        assert_eq!(SCHEMA_VERSION, BEFORE_SNAPSHOTS + 2, "adjust this test");
        let drop = "DROP TABLE snapshot_templates; DROP TABLE snapshots;
            ALTER TABLE api_keys DROP COLUMN conversation;
            ALTER TABLE api_keys DROP COLUMN id_prefix;
            ALTER TABLE api_keys DROP COLUMN read_only;
            ALTER TABLE api_keys DROP COLUMN expires_at;";
        match &*self.0 {
            FxInner::Sqlite(dir) => {
                let raw = rusqlite::Connection::open(dir.path().join("store.db")).unwrap();
                raw.execute_batch(drop).unwrap();
                raw.pragma_update(None, "user_version", BEFORE_SNAPSHOTS)
                    .unwrap();
            }
            FxInner::Postgres(d) => {
                let mut raw = postgres::Client::connect(&d.url, postgres::NoTls).unwrap();
                raw.batch_execute(drop).unwrap();
                raw.execute(
                    "UPDATE sessionbox_schema SET version = $1",
                    &[&i64::from(BEFORE_SNAPSHOTS)],
                )
                .unwrap();
            }
        }
    }
}

macro_rules! both {
    ($(fn $name:ident($fx:ident) $body:block)*) => {
        mod sqlite {
            #[allow(unused_imports)]
            use super::*;
            $(#[test] fn $name() {
                let $fx = Fx(Arc::new(FxInner::Sqlite(tempfile::tempdir().unwrap())));
                $body
            })*
        }
        mod postgresql {
            #[allow(unused_imports)]
            use super::*;
            $(#[test] fn $name() {
                let Some(d) = pg::database() else { return };
                let $fx = Fx(Arc::new(FxInner::Postgres(d)));
                $body
            })*
        }
    };
}

fn t(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap()
}

fn tenant(s: &str) -> TenantId {
    TenantId::new(s).unwrap()
}

/// A snapshot `name` of `tenant` with id `id`, `stored` bytes on disk, taken at `created`.
fn snap(id: &str, tenant_: &str, name: &str, stored: u64, created: i64) -> SnapshotRecord {
    SnapshotRecord {
        id: id.into(),
        tenant: tenant(tenant_),
        name: name.into(),
        origin: Some(ConversationId::new("thread-1").unwrap()),
        runtime: "host".into(),
        bytes: 10 * stored,
        files: 3,
        directories: 2,
        links: 1,
        stored_bytes: stored,
        created_at: t(created),
        expires_at: None,
    }
}

fn expiring(mut s: SnapshotRecord, at: i64) -> SnapshotRecord {
    s.expires_at = Some(t(at));
    s
}

fn ids(store: &Store) -> Vec<String> {
    store.snapshot_ids().unwrap().into_iter().collect()
}

fn names(v: &[SnapshotRecord]) -> Vec<&str> {
    v.iter().map(|s| s.name.as_str()).collect()
}

both! {
    fn a_snapshot_is_created_read_listed_and_deleted(fx) {
        let store = fx.open();
        let acme = tenant("acme");
        let newer = snap("id2", "acme", "newer", 200, 2_000);
        let mut older = expiring(snap("id1", "acme", "older", 100, 1_000), 9_000);
        older.origin = None;
        older.runtime = "import".into();
        store.create_snapshot(&newer, None).unwrap();
        store.create_snapshot(&older, None).unwrap();
        store.create_snapshot(&snap("id3", "globex", "older", 50, 500), None).unwrap();

        assert_eq!(store.snapshot(&acme, "older").unwrap(), Some(older.clone()));
        assert_eq!(store.snapshot(&acme, "newer").unwrap(), Some(newer.clone()));
        assert_eq!(store.snapshot(&acme, "absent").unwrap(), None);
        assert_eq!(store.snapshot(&acme, "../bad").unwrap(), None);
        // Oldest first, the tenant's own only.
        assert_eq!(store.snapshots(&acme).unwrap(), vec![older.clone(), newer.clone()]);
        assert_eq!(names(&store.snapshots(&tenant("globex")).unwrap()), ["older"]);
        assert!(store.snapshots(&tenant("initech")).unwrap().is_empty());
        assert_eq!(store.snapshot_usage(&acme).unwrap(), (300, 2));
        assert_eq!(store.snapshot_usage(&tenant("initech")).unwrap(), (0, 0));
        assert_eq!(ids(&store), ["id1", "id2", "id3"]);

        // Another connection sees the same.
        assert_eq!(fx.open().snapshot(&acme, "older").unwrap(), Some(older.clone()));

        assert_eq!(store.delete_snapshot(&acme, "older").unwrap(), Some(older));
        assert_eq!(store.delete_snapshot(&acme, "older").unwrap(), None);
        assert_eq!(store.snapshot(&acme, "older").unwrap(), None);
        assert_eq!(store.snapshots(&acme).unwrap(), vec![newer]);
        assert_eq!(store.snapshot_usage(&acme).unwrap(), (200, 1));
        assert_eq!(ids(&store), ["id2", "id3"]);
        // The other tenant's snapshot of the same name stays.
        assert!(store.snapshot(&tenant("globex"), "older").unwrap().is_some());
    }

    fn a_taken_name_is_refused_and_changes_nothing(fx) {
        let store = fx.open();
        let acme = tenant("acme");
        let first = snap("id1", "acme", "base", 100, 1_000);
        store.create_snapshot(&first, None).unwrap();
        let err = store
            .create_snapshot(&snap("id2", "acme", "base", 5, 2_000), None)
            .unwrap_err();
        assert!(matches!(err, Error::AlreadyExists(_)), "{err}");
        assert!(err.to_string().contains("base"), "{err}");
        assert_eq!(store.snapshot(&acme, "base").unwrap(), Some(first.clone()));
        assert_eq!(store.snapshot_usage(&acme).unwrap(), (100, 1));
        assert_eq!(ids(&store), ["id1"]);

        // The same name in another tenant is another snapshot.
        store.create_snapshot(&snap("id2", "globex", "base", 5, 2_000), None).unwrap();

        // An id in use (whatever the tenant) is refused too, and changes nothing.
        let err = store
            .create_snapshot(&snap("id1", "initech", "other", 5, 3_000), None)
            .unwrap_err();
        assert!(matches!(err, Error::Conflict(_)), "{err}");
        assert_eq!(store.snapshot(&tenant("initech"), "other").unwrap(), None);
        assert_eq!(store.snapshot(&acme, "base").unwrap(), Some(first));
        assert_eq!(ids(&store), ["id1", "id2"]);
    }

    fn bad_names_ids_and_counts_are_refused(fx) {
        let store = fx.open();
        for name in ["", "../x", ".hidden", "a/b", "a b", &"x".repeat(65)] {
            let err = store
                .create_snapshot(&snap("id1", "acme", name, 1, 1), None)
                .unwrap_err();
            assert_eq!(err.code(), "invalid_request", "{name:?}: {err}");
        }
        for id in ["", "../x", "ABC", "a.b", &"x".repeat(65)] {
            let err = store
                .create_snapshot(&snap(id, "acme", "base", 1, 1), None)
                .unwrap_err();
            assert_eq!(err.code(), "invalid_request", "{id:?}: {err}");
        }
        let mut huge = snap("id1", "acme", "base", 1, 1);
        huge.bytes = u64::MAX;
        assert_eq!(store.create_snapshot(&huge, None).unwrap_err().code(), "invalid_request");
        let mut no_runtime = snap("id1", "acme", "base", 1, 1);
        no_runtime.runtime = String::new();
        assert_eq!(
            store.create_snapshot(&no_runtime, None).unwrap_err().code(),
            "invalid_request"
        );
        assert!(ids(&store).is_empty());
    }

    fn the_cap_counts_each_tenant_s_stored_bytes(fx) {
        let store = fx.open();
        let acme = tenant("acme");
        let cap = Some(1_000);
        store.create_snapshot(&snap("a1", "acme", "one", 400, 1), cap).unwrap();
        // Exactly at the cap is accepted.
        store.create_snapshot(&snap("a2", "acme", "two", 600, 2), cap).unwrap();
        assert_eq!(store.snapshot_usage(&acme).unwrap(), (1_000, 2));
        // One byte over is refused, and nothing is recorded.
        let err = store
            .create_snapshot(&snap("a3", "acme", "three", 1, 3), cap)
            .unwrap_err();
        match &err {
            Error::TooLarge { what, limit } => {
                assert_eq!((what.as_str(), *limit), ("the tenant's snapshots", 1_000));
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert_eq!(store.snapshot(&acme, "three").unwrap(), None);
        assert_eq!(store.snapshot_usage(&acme).unwrap(), (1_000, 2));
        assert_eq!(ids(&store), ["a1", "a2"]);
        // A zero-byte archive still fits; without a cap anything does.
        store.create_snapshot(&snap("a4", "acme", "empty", 0, 4), cap).unwrap();
        store.create_snapshot(&snap("a5", "acme", "uncapped", 5_000, 5), None).unwrap();

        // Another tenant is counted on its own: the whole cap, and not a byte more.
        store.create_snapshot(&snap("g1", "globex", "all", 1_000, 1), cap).unwrap();
        let err = store
            .create_snapshot(&snap("i1", "initech", "over", 1_001, 1), cap)
            .unwrap_err();
        assert_eq!(err.code(), "too_large");
        assert_eq!(store.snapshot_usage(&tenant("initech")).unwrap(), (0, 0));
        // Room comes back with a delete.
        store.delete_snapshot(&tenant("globex"), "all").unwrap();
        store.create_snapshot(&snap("g2", "globex", "again", 1_000, 2), cap).unwrap();
    }

    fn eight_connections_racing_for_one_name_make_one_record(fx) {
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (fx, barrier) = (fx.clone(), barrier.clone());
                thread::spawn(move || {
                    let store = fx.open();
                    barrier.wait();
                    store.create_snapshot(&snap(&format!("id{i}"), "acme", "race", 10, i), None)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "{results:?}");
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Ok(()) | Err(Error::AlreadyExists(_)))),
            "{results:?}"
        );
        let store = fx.open();
        assert_eq!(store.snapshots(&tenant("acme")).unwrap().len(), 1);
        assert_eq!(store.snapshot_ids().unwrap().len(), 1);
    }

    fn eight_connections_racing_under_the_cap_never_pass_it(fx) {
        // Room for three of the eight.
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (fx, barrier) = (fx.clone(), barrier.clone());
                thread::spawn(move || {
                    let store = fx.open();
                    barrier.wait();
                    store.create_snapshot(
                        &snap(&format!("id{i}"), "acme", &format!("s{i}"), 100, i),
                        Some(350),
                    )
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 3, "{results:?}");
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Ok(()) | Err(Error::TooLarge { limit: 350, .. }))),
            "{results:?}"
        );
        assert_eq!(fx.open().snapshot_usage(&tenant("acme")).unwrap(), (300, 3));
    }

    fn expired_snapshots_skip_the_ones_templates_pin(fx) {
        let store = fx.open();
        let acme = tenant("acme");
        store.create_snapshot(&expiring(snap("a", "acme", "a", 1, 1), 10), None).unwrap();
        store.create_snapshot(&expiring(snap("b", "acme", "b", 1, 1), 20), None).unwrap();
        store.create_snapshot(&expiring(snap("c", "acme", "c", 1, 1), 30), None).unwrap();
        store.create_snapshot(&snap("d", "acme", "d", 1, 1), None).unwrap();
        store.create_snapshot(&expiring(snap("e", "globex", "e", 1, 1), 5), None).unwrap();
        store.set_template(&acme, "pinned", "b").unwrap();

        assert!(store.expired_snapshots(t(4)).unwrap().is_empty());
        // Across tenants, soonest expired first; at the expiry is expired; b is pinned.
        assert_eq!(names(&store.expired_snapshots(t(25)).unwrap()), ["e", "a"]);
        assert_eq!(names(&store.expired_snapshots(t(30)).unwrap()), ["e", "a", "c"]);
        assert_eq!(names(&store.expired_snapshots(t(1 << 50)).unwrap()), ["e", "a", "c"]);

        // A delete by id takes only a snapshot still expired and unpinned.
        assert_eq!(store.delete_expired_snapshot("c", t(29)).unwrap(), None);
        assert_eq!(store.delete_expired_snapshot("b", t(30)).unwrap(), None);
        assert_eq!(store.delete_expired_snapshot("d", t(1 << 50)).unwrap(), None);
        assert_eq!(store.delete_expired_snapshot("absent", t(30)).unwrap(), None);
        assert_eq!(store.delete_expired_snapshot("c", t(30)).unwrap().unwrap().name, "c");
        assert_eq!(ids(&store), ["a", "b", "d", "e"]);

        // Unpinned, it expires like the rest.
        assert!(store.remove_template(&acme, "pinned").unwrap());
        assert_eq!(names(&store.expired_snapshots(t(30)).unwrap()), ["e", "a", "b"]);
        for s in store.expired_snapshots(t(30)).unwrap() {
            assert_eq!(store.delete_snapshot(&s.tenant, &s.name).unwrap(), Some(s));
        }
        assert_eq!(ids(&store), ["d"]);
    }

    fn a_snapshot_a_template_names_cannot_be_deleted(fx) {
        let store = fx.open();
        let acme = tenant("acme");
        let base = snap("id1", "acme", "base", 100, 1);
        store.create_snapshot(&base, None).unwrap();
        store.set_template(&acme, "python", "base").unwrap();
        store.set_template(&acme, "default", "base").unwrap();
        let err = store.delete_snapshot(&acme, "base").unwrap_err();
        assert!(matches!(err, Error::Conflict(_)), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("templates default, python"), "{msg}");
        assert!(!msg.to_lowercase().contains("foreign key"), "{msg}");
        assert_eq!(store.snapshot(&acme, "base").unwrap(), Some(base.clone()));

        assert!(store.remove_template(&acme, "python").unwrap());
        let msg = store.delete_snapshot(&acme, "base").unwrap_err().to_string();
        assert!(msg.contains("template default;"), "{msg}");
        assert!(store.remove_template(&acme, "default").unwrap());
        assert_eq!(store.delete_snapshot(&acme, "base").unwrap(), Some(base));
    }

    fn templates_are_set_replaced_and_removed(fx) {
        let store = fx.open();
        let acme = tenant("acme");
        let one = snap("id1", "acme", "one", 1, 1);
        let two = snap("id2", "acme", "two", 2, 2);
        store.create_snapshot(&one, None).unwrap();
        store.create_snapshot(&two, None).unwrap();
        store.create_snapshot(&snap("id3", "globex", "theirs", 3, 3), None).unwrap();

        assert_eq!(store.template(&acme, "py").unwrap(), None);
        assert!(store.templates(&acme).unwrap().is_empty());
        store.set_template(&acme, "py", "one").unwrap();
        store.set_template(&acme, "node", "one").unwrap();
        assert_eq!(store.template(&acme, "py").unwrap(), Some(one.clone()));
        // Replaced.
        store.set_template(&acme, "py", "two").unwrap();
        assert_eq!(store.template(&acme, "py").unwrap(), Some(two.clone()));
        assert_eq!(
            store.templates(&acme).unwrap(),
            [("node".to_owned(), "one".to_owned()), ("py".to_owned(), "two".to_owned())]
        );
        // The old snapshot is no longer pinned by it (only by node now).
        assert!(store.remove_template(&acme, "node").unwrap());
        assert_eq!(store.delete_snapshot(&acme, "one").unwrap(), Some(one));

        // A template names a snapshot of its own tenant that exists.
        let err = store.set_template(&acme, "x", "absent").unwrap_err();
        assert!(matches!(err, Error::NotFound(_)), "{err}");
        let err = store.set_template(&acme, "x", "theirs").unwrap_err();
        assert!(matches!(err, Error::NotFound(_)), "{err}");
        let err = store.set_template(&acme, "../x", "two").unwrap_err();
        assert_eq!(err.code(), "invalid_request");
        // A failed replace leaves the template as it was.
        assert_eq!(store.set_template(&acme, "py", "absent").unwrap_err().code(), "not_found");
        assert_eq!(store.template(&acme, "py").unwrap(), Some(two.clone()));
        assert!(store.templates(&tenant("globex")).unwrap().is_empty());
        assert_eq!(store.template(&tenant("globex"), "py").unwrap(), None);

        assert!(store.remove_template(&acme, "py").unwrap());
        assert!(!store.remove_template(&acme, "py").unwrap());
        assert!(!store.remove_template(&acme, "../x").unwrap());
        assert_eq!(store.template(&acme, "py").unwrap(), None);
        assert!(store.templates(&acme).unwrap().is_empty());
        assert_eq!(store.delete_snapshot(&acme, "two").unwrap(), Some(two));
    }

    fn a_store_from_before_snapshots_is_upgraded_and_keeps_its_records(fx) {
        let store = fx.open();
        let c = ConversationRef::parse("acme", "c1").unwrap();
        store.get_or_create(&c, "host", t(1)).unwrap();
        drop(store);
        fx.downgrade_to_before_snapshots();

        let store = fx.open();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(store.get(&c.key).unwrap().unwrap().runtime, "host");
        let s = snap("id1", "acme", "base", 1, 1);
        store.create_snapshot(&s, Some(10)).unwrap();
        store.set_template(&c.tenant, "t", "base").unwrap();
        assert_eq!(store.template(&c.tenant, "t").unwrap(), Some(s));
        // And reopening changes nothing more.
        assert_eq!(fx.open().schema_version().unwrap(), SCHEMA_VERSION);
    }
}
