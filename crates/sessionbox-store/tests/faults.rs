//! The store when what it stands on fails: a PostgreSQL server restarted (`pg_ctl restart -m
//! fast` and `-m immediate`) or stopped under the store's feet, the disk under a SQLite store
//! full, and the clock moving backwards. Real PostgreSQL clusters of the tests' own (see
//! `support/pg.rs`: the shared server is never restarted), a real small file system.
//!
//! What must hold: a call during an outage fails with the typed `unavailable` error (never a
//! hang, never a panic, never a half-made record), or waits for a restart that takes less than
//! the store's connect patience and succeeds; after the outage the same `Store` works without
//! being made again; and a renewal never moves a record's expiry back.

#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "support/pg.rs"]
mod pg;

#[path = "faults/lost_answer.rs"]
mod lost_answer;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sessionbox_core::{ConversationRef, Error};
use sessionbox_store::{Clock, Lifecycle, Store};

fn t(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap()
}

fn conv(id: &str) -> ConversationRef {
    ConversationRef::parse("acme", id).unwrap()
}

fn ttl(ms: u64) -> Lifecycle {
    Lifecycle {
        idle_timeout: None,
        ttl: Some(Duration::from_millis(ms)),
        max_lifetime: None,
    }
}

/// The body of the renewal test, on one store.
fn renew_never_moves_back(store: &Store) {
    let c = conv("jump");
    store
        .get_or_create_with(&c, "host", t(10_000), &ttl(1_000))
        .unwrap();
    store.touch(&c.key, t(10_500)).unwrap();
    let r = store.get(&c.key).unwrap().unwrap();
    assert_eq!((r.last_used_at, r.expires_at), (t(10_500), Some(t(11_500))));
    // The clock jumped back by a minute: a renewal then keeps what the last one gave.
    store.touch(&c.key, t(-49_500)).unwrap();
    let r = store.get(&c.key).unwrap().unwrap();
    assert_eq!(
        (r.last_used_at, r.expires_at),
        (t(10_500), Some(t(11_500))),
        "a renewal at an earlier time moved the record back"
    );
    assert!(!r.is_expired(t(11_000)));
    // Forward again, past what the jump would have left: renewed from the new time.
    store.touch(&c.key, t(11_200)).unwrap();
    let r = store.get(&c.key).unwrap().unwrap();
    assert_eq!((r.last_used_at, r.expires_at), (t(11_200), Some(t(12_200))));
}

#[test]
fn sqlite_a_renewal_at_an_earlier_time_never_moves_last_use_or_expiry_back() {
    let dir = tempfile::tempdir().unwrap();
    renew_never_moves_back(&Store::open(&dir.path().join("s.db")).unwrap());
}

#[test]
fn postgresql_a_renewal_at_an_earlier_time_never_moves_last_use_or_expiry_back() {
    let Some(db) = pg::database() else { return };
    renew_never_moves_back(&Store::connect(&db.url).unwrap());
}

/// A clock a test moves.
#[derive(Debug)]
struct Moved(std::sync::Mutex<DateTime<Utc>>);

impl Clock for Moved {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap()
    }
}

#[test]
fn a_postgresql_store_reads_the_servers_clock_and_a_set_clock_replaces_it_for_every_clone() {
    let Some(db) = pg::database() else { return };
    let store = Store::connect(&db.url).unwrap();
    let mut c = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    let server_ms: i64 = c
        .query_one(
            "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
            &[],
        )
        .unwrap()
        .get(0);
    let ours = store.now().timestamp_millis();
    assert!(
        (ours - server_ms).abs() < 1_000,
        "the store's clock {ours} is not the server's {server_ms}"
    );
    // Carried forward with the monotonic clock between readings.
    std::thread::sleep(Duration::from_millis(200));
    assert!(store.now().timestamp_millis() >= ours + 200);
    // An injected clock decides for every clone, and for the records they write.
    let clone = store.clone();
    store.set_clock(Arc::new(Moved(std::sync::Mutex::new(t(5_000)))));
    assert_eq!(clone.now(), t(5_000));
    let cv = conv("clocked");
    let (r, _) = clone
        .get_or_create_with(&cv, "host", clone.now(), &ttl(1_000))
        .unwrap();
    assert!(clone.claim_for_destroy(&cv.key, r.generation).unwrap());
    assert_eq!(
        clone.get(&cv.key).unwrap().unwrap().state_since,
        Some(t(5_000))
    );
}

/// `n` threads each making and reading a record at once (several connections of the pool in
/// use, then idle). Returns how many succeeded and the errors of the others.
fn burst(store: &Store, tag: &str, n: usize) -> (usize, Vec<Error>) {
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (s, c) = (store.clone(), conv(&format!("{tag}-{i}")));
            std::thread::spawn(move || {
                let (r, _) = s.get_or_create(&c, "host", s.now())?;
                s.touch(&c.key, s.now())?;
                let back = s.get(&c.key)?.expect("just made");
                assert_eq!(back.generation, r.generation);
                Ok::<_, Error>(())
            })
        })
        .collect();
    let mut ok = 0;
    let mut errors = Vec::new();
    for h in handles {
        match h.join().unwrap() {
            Ok(()) => ok += 1,
            Err(e) => errors.push(e),
        }
    }
    (ok, errors)
}

/// One restart of `mode` under a store with a pool of idle connections, then a stop: what the
/// callers see.
fn restart_and_stop(cluster: &pg::OwnCluster, store: &Store, mode: &str) {
    let (ok, errors) = burst(store, &format!("before-{mode}"), 8);
    assert_eq!((ok, errors), (8, vec![]));

    // Restarted between calls: the pool's connections all died, yet the next calls succeed on
    // the same store (a dead idle connection is noticed before it is used).
    let t0 = Instant::now();
    cluster.restart(mode);
    eprintln!("pg_ctl restart -m {mode}: {:?}", t0.elapsed());
    let (ok, errors) = burst(store, &format!("after-{mode}"), 8);
    assert_eq!(
        (ok, errors),
        (8, vec![]),
        "calls right after a restart failed on dead pooled connections"
    );

    // Restarted while calls run: each call succeeds (it waited for the server), or fails as
    // `unavailable` with a message saying so; none hangs, none panics.
    let store2 = store.clone();
    let running = std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(4);
        let (mut ok, mut unavailable) = (0, 0);
        let mut i = 0;
        while Instant::now() < until {
            let started = Instant::now();
            let (n, errors) = burst(&store2, &format!("during-{i}"), 4);
            ok += n;
            for e in errors {
                assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
                assert!(e.to_string().contains("retry"), "{e}");
                unavailable += 1;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "a call hung for {:?}",
                started.elapsed()
            );
            i += 1;
        }
        (ok, unavailable)
    });
    std::thread::sleep(Duration::from_millis(500));
    cluster.restart(mode);
    let (ok, unavailable) = running.join().unwrap();
    eprintln!("restart -m {mode} under calls: {ok} succeeded, {unavailable} unavailable");
    assert!(ok > 0);

    // Stopped: a call fails as `unavailable` once the connect patience is spent, not later.
    cluster.stop("fast");
    let t0 = Instant::now();
    let e = store.get(&conv("down").key).unwrap_err();
    let waited = t0.elapsed();
    eprintln!("a call while PostgreSQL is down: {e} (after {waited:?})");
    assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
    assert!(e.to_string().contains("PostgreSQL store"), "{e}");
    assert!(
        !e.to_string().contains("postgres://"),
        "the URL leaked: {e}"
    );
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(8),
        "{waited:?}"
    );
    // A call made while it is down succeeds when it comes back within the patience.
    let s = store.clone();
    let waiting = std::thread::spawn(move || {
        let t0 = Instant::now();
        (s.get(&conv("before-fast-0").key), t0.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    cluster.start_again();
    let (r, waited) = waiting.join().unwrap();
    eprintln!("a call made while PostgreSQL was down, answered after {waited:?}");
    assert!(r.is_ok(), "{r:?}");
    // And the same store works as before.
    let (ok, errors) = burst(store, &format!("back-{mode}"), 8);
    assert_eq!((ok, errors), (8, vec![]));
}

#[test]
fn a_restarted_or_stopped_postgresql_fails_calls_as_unavailable_and_the_same_store_recovers() {
    let Some(cluster) = pg::OwnCluster::start() else {
        return;
    };
    let store = Store::connect(&cluster.url).unwrap();
    for mode in ["fast", "immediate"] {
        restart_and_stop(&cluster, &store, mode);
    }
    // Nothing half-made: every record that a call reported made is whole and active.
    for r in store.list(None).unwrap() {
        assert_eq!(
            r.state,
            sessionbox_store::ConversationState::Active,
            "{r:?}"
        );
        assert_eq!(r.runtime, "host");
    }
}

/// Mounts a tmpfs of `bytes` at `dir` (root only); unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, bytes: u64) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={bytes},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Fills the file system holding `dir` with `dir/filler` until it is full.
fn fill(dir: &std::path::Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    let chunk = vec![0xa5u8; 64 * 1024];
    loop {
        match f.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("{e}"),
        }
    }
    // The last partial chunks too.
    let small = [0u8; 512];
    while f.write_all(&small).is_ok() {}
    let _ = f.sync_all();
}

#[test]
fn a_full_disk_under_a_sqlite_store_fails_writes_as_unavailable_and_makes_no_half_record() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: mounting a small file system needs root (CI runs tests as root)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    let _fs = Tmpfs::mount(&mnt, 4 << 20);
    let store = Store::open(&mnt.join("store.db")).unwrap();
    for i in 0..20 {
        let c = conv(&format!("early-{i}"));
        store.get_or_create(&c, "host", store.now()).unwrap();
    }
    fill(&mnt);
    // Writes of every kind until the disk refuses: each is whole or refused as unavailable.
    let (mut made, mut refused) = (Vec::new(), 0);
    for i in 0..400 {
        let c = conv(&format!("late-{i}-{}", "x".repeat(100)));
        match store.get_or_create(&c, "host", store.now()) {
            Ok((r, true)) => made.push(r),
            Ok((_, false)) => panic!("a new id was found made"),
            Err(e) => {
                assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
                assert!(
                    e.to_string().contains("disk holding the store is full"),
                    "{e}"
                );
                assert!(
                    store.get(&c.key).unwrap().is_none(),
                    "a refused write left a record"
                );
                refused += 1;
            }
        }
        let early = conv(&format!("early-{}", i % 20));
        match store.touch(&early.key, store.now()) {
            Ok(()) | Err(Error::Unavailable(_)) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    eprintln!(
        "on a full disk: {} records made, {refused} refused as unavailable",
        made.len()
    );
    assert!(refused > 0, "the disk never refused a write");
    // Reads go on meanwhile.
    assert!(store.get(&conv("early-0").key).unwrap().is_some());
    // Space freed: the same store writes again, and what it said it made is there.
    std::fs::remove_file(mnt.join("filler")).unwrap();
    let c = conv("after");
    store.get_or_create(&c, "host", store.now()).unwrap();
    for r in &made {
        assert_eq!(store.get(&r.key).unwrap().unwrap().generation, r.generation);
    }
    assert_eq!(store.list(None).unwrap().len(), 20 + made.len() + 1);
    drop(store);
    // The file is a sound database.
    let check = rusqlite_check(&mnt.join("store.db"));
    assert_eq!(check, "ok");
}

/// `PRAGMA integrity_check` of the SQLite file at `path`.
fn rusqlite_check(path: &std::path::Path) -> String {
    let c = rusqlite::Connection::open(path).unwrap();
    c.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap()
}
