//! Lifecycle and garbage collection over the real `host` runtime and a real SQLite store:
//! expiry and renewal, orphans of every kind, a dry run, what is never touched, and renew racing
//! expiry (the OpenSandbox #1200 scenario).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use sessionbox_core::{ConversationRef, ExecRequest, Session};
use sessionbox_local::host::{HostConfig, HostRuntime};
use sessionbox_manager::{GcOptions, Manager};
use sessionbox_store::{ConversationState, Lifecycle, LifecyclePolicy, Store};

fn manager(dir: &std::path::Path, ttl: Option<Duration>) -> Manager {
    let store = Store::open(&dir.join("sessionbox.db")).unwrap();
    let runtime = HostRuntime::new(HostConfig::new(dir)).unwrap();
    Manager::new(store, Arc::new(runtime)).with_lifecycle(LifecyclePolicy {
        default: Lifecycle {
            idle_timeout: None,
            ttl,
            max_lifetime: None,
        },
        tenants: Default::default(),
    })
}

fn conv(id: &str) -> ConversationRef {
    ConversationRef::parse("default", id).unwrap()
}

const NOW: GcOptions = GcOptions {
    dry_run: false,
    grace: Duration::ZERO,
};

/// Every key the runtime holds state for has a record, and every record's workspace exists.
async fn consistent(m: &Manager) {
    let inventory: BTreeSet<_> = m
        .runtime()
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.key)
        .collect();
    let records: BTreeSet<_> = m
        .list(None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    if inventory != records {
        for k in inventory.symmetric_difference(&records) {
            let log = m
                .store()
                .audit_log(&sessionbox_store::AuditFilter {
                    key: Some(k.clone()),
                    ..Default::default()
                })
                .unwrap();
            for e in log.iter().rev() {
                eprintln!(
                    "{k:.8} {} {} {} {:?}",
                    e.entry.at.format("%S%.3f"),
                    e.entry.operation,
                    e.entry.outcome,
                    e.entry.detail
                );
            }
        }
    }
    assert_eq!(inventory, records, "runtime state and records differ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_conversation_is_destroyed_by_gc_and_a_used_one_is_renewed() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path(), Some(Duration::from_millis(400)));
    let (old, used) = (conv("old"), conv("used"));
    for c in [&old, &used] {
        let s = m.open(c).await.unwrap();
        s.write("f", b"x").await.unwrap();
        Box::new(s).close().await.unwrap();
    }
    let first = m
        .store()
        .get(&used.key)
        .unwrap()
        .unwrap()
        .expires_at
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let s = m.open(&used).await.unwrap(); // renews
    Box::new(s).close().await.unwrap();
    let renewed = m
        .store()
        .get(&used.key)
        .unwrap()
        .unwrap()
        .expires_at
        .unwrap();
    assert!(renewed > first, "use did not renew: {first} -> {renewed}");
    tokio::time::sleep(Duration::from_millis(250)).await;

    // `old` is past its expiry, `used` is not.
    let dry = m
        .collect_garbage(GcOptions {
            dry_run: true,
            ..NOW
        })
        .await
        .unwrap();
    assert_eq!(dry.expired.len(), 1, "{dry:?}");
    assert!(!dry.expired[0].removed);
    assert!(
        m.store().get(&old.key).unwrap().is_some(),
        "a dry run removed something"
    );

    let r = m.collect_garbage(NOW).await.unwrap();
    assert_eq!(r.expired.len(), 1, "{r:?}");
    assert!(r.expired[0].removed);
    assert_eq!(r.expired[0].conversation.as_deref(), Some("old"));
    assert!(m.store().get(&old.key).unwrap().is_none());
    assert!(!HostRuntime::workspace_path(d.path(), &old.key).exists());
    assert!(m.store().get(&used.key).unwrap().is_some());
    consistent(&m).await;
    // The expiry is audited.
    let log = m
        .store()
        .audit_log(&sessionbox_store::AuditFilter {
            key: Some(old.key.clone()),
            ..Default::default()
        })
        .unwrap();
    assert!(
        log.iter()
            .any(|e| e.entry.operation == "expire" && e.entry.outcome == "ok")
    );

    // An expired conversation opened again before any GC is a new, empty one.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let s = m.open(&used).await.unwrap();
    assert!(s.created(), "an expired conversation was resumed");
    assert_eq!(s.read("f").await.unwrap_err().code(), "not_found");
    Box::new(s).close().await.unwrap();
}

/// An expired conversation shows as expired before any collection; the next use of its id,
/// before or after the collection, makes a new one that says the old one expired (its files
/// are gone); one destroyed on purpose says nothing; a conversation's network policy and
/// egress log go with it when it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_use_of_an_expired_id_is_told_the_old_conversation_expired() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path(), Some(Duration::from_millis(300)));
    let (before_gc, after_gc, destroyed) = (conv("before-gc"), conv("after-gc"), conv("gone"));
    for c in [&before_gc, &after_gc, &destroyed] {
        let s = m.open(c).await.unwrap();
        assert!(s.previous_expired().is_none());
        s.write("f", b"x").await.unwrap();
        Box::new(s).close().await.unwrap();
    }
    m.store()
        .set_egress_policy(
            &sessionbox_store::PolicyScope::Conversation(after_gc.clone()),
            "P",
            &"a".repeat(64),
            Utc::now(),
        )
        .unwrap();
    let expires = m.store().get(&before_gc.key).unwrap().unwrap().expires_at;
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Shown as expired, not active, while its record waits for the collection.
    let listed = m.list(None).await.unwrap();
    assert!(
        listed.iter().all(|r| r.status(Utc::now()) == "expired"),
        "{listed:?}"
    );
    m.destroy(&destroyed).await.unwrap();

    // Opened again before any collection: a new conversation, and the notice.
    let s = m.open(&before_gc).await.unwrap();
    assert!(s.created());
    let n = s
        .previous_expired()
        .expect("no notice of the expired conversation");
    assert_eq!(Some(n.expired_at), expires);
    assert_eq!(n.conversation_id.as_str(), "before-gc");
    assert_eq!(s.read("f").await.unwrap_err().code(), "not_found");
    Box::new(s).close().await.unwrap();
    // Told once.
    let s = m.open(&before_gc).await.unwrap();
    assert!(s.previous_expired().is_none() && !s.created());
    Box::new(s).close().await.unwrap();

    // Collected first, opened after: still told; its policy did not survive it.
    let r = m.collect_garbage(NOW).await.unwrap();
    assert_eq!(r.expired.len(), 1, "{r:?}");
    assert!(
        m.store()
            .effective_egress_policy(&after_gc)
            .unwrap()
            .is_none(),
        "the expired conversation's policy survived it"
    );
    let s = m.open(&after_gc).await.unwrap();
    assert!(s.created());
    assert!(
        s.previous_expired().is_some(),
        "the notice did not outlive gc"
    );
    Box::new(s).close().await.unwrap();

    // Destroyed on purpose: a new conversation without a notice.
    let s = m.open(&destroyed).await.unwrap();
    assert!(s.created() && s.previous_expired().is_none());
    Box::new(s).close().await.unwrap();
}

/// `host` has no sandbox to stop (it keeps the default `Runtime::stop_idle`): a conversation
/// idle past its idle timeout is neither reported nor touched by a collection, dry or real,
/// and is not garbage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_conversation_on_a_runtime_without_idle_stops_is_left_alone() {
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(&d.path().join("sessionbox.db")).unwrap();
    let runtime = HostRuntime::new(HostConfig::new(d.path())).unwrap();
    let m = Manager::new(store, Arc::new(runtime)).with_lifecycle(LifecyclePolicy {
        default: Lifecycle {
            idle_timeout: Some(Duration::from_millis(100)),
            ttl: None,
            max_lifetime: None,
        },
        tenants: Default::default(),
    });
    let c = conv("idle");
    let s = m.open(&c).await.unwrap();
    s.write("f", b"kept").await.unwrap();
    Box::new(s).close().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let record = m.store().get(&c.key).unwrap().unwrap();
    assert!(
        Utc::now() - record.last_used_at >= chrono::Duration::milliseconds(100),
        "the conversation is not idle yet"
    );
    for dry_run in [true, false] {
        let r = m
            .collect_garbage(GcOptions { dry_run, ..NOW })
            .await
            .unwrap();
        assert!(r.idle_stopped.is_empty(), "{r:#?}");
        assert_eq!((r.found(), r.removed(), r.stopped()), (0, 0, 0), "{r:#?}");
    }
    let log = m
        .store()
        .audit_log(&sessionbox_store::AuditFilter {
            key: Some(c.key.clone()),
            ..Default::default()
        })
        .unwrap();
    assert!(log.iter().all(|e| e.entry.operation != "idle_stop"));
    let s = m.open(&c).await.unwrap();
    assert!(!s.created());
    assert_eq!(s.read("f").await.unwrap(), b"kept");
    Box::new(s).close().await.unwrap();
    consistent(&m).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_removes_orphans_dangling_and_stuck_records_and_touches_nothing_unlabelled() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path(), None);
    let ws = d.path().join("workspaces");

    // An orphan: a workspace with files and a running process, whose record is gone (a crash
    // between the runtime's open and the record, or a store restored from an older backup).
    let orphan = conv("orphan");
    let s = m.open(&orphan).await.unwrap();
    s.write("data", b"x").await.unwrap();
    s.exec(ExecRequest::new(
        "setsid sh -c 'echo $$ > daemon; exec sleep 300' > /dev/null 2>&1 < /dev/null & \
         while [ ! -s daemon ]; do sleep 0.01; done",
    ))
    .await
    .unwrap();
    Box::new(s).close().await.unwrap();
    assert!(m.store().delete(&orphan.key).unwrap());
    let procs = m.runtime().list().await.unwrap();
    let held = procs.iter().find(|c| c.key == orphan.key).unwrap();
    assert!(
        !held.processes.is_empty(),
        "the orphan's process is not seen"
    );

    // A dangling record: its workspace vanished.
    let dangling = conv("dangling");
    Box::new(m.open(&dangling).await.unwrap())
        .close()
        .await
        .unwrap();
    std::fs::remove_dir_all(HostRuntime::workspace_path(d.path(), &dangling.key)).unwrap();

    // A stuck record: left `destroying` by a destroyer that died.
    let stuck = conv("stuck");
    Box::new(m.open(&stuck).await.unwrap())
        .close()
        .await
        .unwrap();
    m.store()
        .set_state(&stuck.key, ConversationState::Destroying)
        .unwrap();

    // A live conversation, and things that are not labelled as sessionbox's: a directory and a
    // file in workspaces/ whose names are not conversation keys (one almost is), and a file
    // next to the store.
    let live = conv("live");
    Box::new(m.open(&live).await.unwrap())
        .close()
        .await
        .unwrap();
    let not_keys = [
        ws.join("notes"),
        ws.join("A".repeat(64)),
        ws.join(&orphan.key.as_str()[..63]),
    ];
    for p in &not_keys {
        std::fs::create_dir(p).unwrap();
        std::fs::write(p.join("keep"), b"mine").unwrap();
    }
    std::fs::write(ws.join("README"), b"mine").unwrap();
    std::fs::write(d.path().join("other.txt"), b"mine").unwrap();

    let dry = m
        .collect_garbage(GcOptions {
            dry_run: true,
            ..NOW
        })
        .await
        .unwrap();
    assert_eq!(
        (
            dry.orphans.len(),
            dry.dangling.len(),
            dry.stuck.len(),
            dry.expired.len()
        ),
        (1, 1, 1, 0),
        "{dry:#?}"
    );
    assert_eq!(dry.removed(), 0);
    assert!(HostRuntime::workspace_path(d.path(), &orphan.key).exists());
    // A grace period keeps recent records out of it.
    let graced = m
        .collect_garbage(GcOptions {
            dry_run: true,
            grace: Duration::from_secs(3600),
        })
        .await
        .unwrap();
    assert_eq!((graced.dangling.len(), graced.stuck.len()), (0, 0));

    let r = m.collect_garbage(NOW).await.unwrap();
    assert_eq!(r.found(), 3, "{r:#?}");
    assert_eq!(r.removed(), 3, "{r:#?}");
    assert!(!HostRuntime::workspace_path(d.path(), &orphan.key).exists());
    for pid in &held.processes {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "the orphan's process {pid} survived"
        );
    }
    assert!(m.store().get(&dangling.key).unwrap().is_none());
    assert!(m.store().get(&stuck.key).unwrap().is_none());
    assert!(!HostRuntime::workspace_path(d.path(), &stuck.key).exists());
    // The live conversation and everything unlabelled are untouched.
    assert!(m.store().get(&live.key).unwrap().is_some());
    assert!(HostRuntime::workspace_path(d.path(), &live.key).exists());
    for p in &not_keys {
        assert_eq!(std::fs::read(p.join("keep")).unwrap(), b"mine");
    }
    assert_eq!(std::fs::read(ws.join("README")).unwrap(), b"mine");
    assert_eq!(std::fs::read(d.path().join("other.txt")).unwrap(), b"mine");
    consistent(&m).await;

    let again = m.collect_garbage(NOW).await.unwrap();
    assert_eq!(again.found(), 0, "{again:#?}");
}

/// The OpenSandbox #1200 scenario: a renew lands at the moment the conversation expires. In
/// OpenSandbox the renew aborted the expiry timer without re-arming it, and with no periodic
/// sweep the sandbox ran on with its expiry in the past. Here the expiry lives in the store,
/// renew and expiry each decide in one conditional statement, an open that loses removes what
/// it made, and garbage collection is a periodic sweep over the store: whichever wins, after
/// the race every conversation is either alive with a future expiry or gone with nothing left
/// behind, and the next sweep (here by a fresh manager, as after a restart) finds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renew_racing_expiry_never_leaves_a_workspace_without_an_owner() {
    let d = tempfile::tempdir().unwrap();
    let ttl = Duration::from_millis(120);
    let m = manager(d.path(), Some(ttl));
    let (mut renewed, mut expired) = (0, 0);
    for round in 0..60 {
        let c = conv(&format!("race-{round}"));
        Box::new(m.open(&c).await.unwrap()).close().await.unwrap();
        // Wait until just about the expiry, then race a use against a collection.
        let expires = m.store().get(&c.key).unwrap().unwrap().expires_at.unwrap();
        let until = (expires - Utc::now()).to_std().unwrap_or_default();
        // From 4 ms before to 4 ms after it, so that either may win.
        let jitter = Duration::from_millis(round % 9);
        tokio::time::sleep((until + jitter).saturating_sub(Duration::from_millis(4))).await;
        let (m1, m2, c1) = (m.clone(), m.clone(), c.clone());
        let user = tokio::spawn(async move {
            match m1.open(&c1).await {
                Ok(s) => {
                    let r = s.exec(ExecRequest::new("echo hi > f")).await;
                    Box::new(s).close().await.unwrap();
                    r.is_ok()
                }
                Err(_) => false,
            }
        });
        // A realistic grace: a record made or claimed moments ago is not stuck or dangling.
        let gc = tokio::spawn(async move {
            m2.collect_garbage(GcOptions {
                dry_run: false,
                grace: Duration::from_secs(5),
            })
            .await
            .unwrap()
        });
        let used = user.await.unwrap();
        gc.await.unwrap();
        match m.store().get(&c.key).unwrap() {
            Some(r) => {
                renewed += 1;
                assert_eq!(r.state, ConversationState::Active, "round {round}");
                if used {
                    assert!(
                        HostRuntime::workspace_path(d.path(), &c.key)
                            .join("f")
                            .exists(),
                        "round {round}: an acknowledged write is gone"
                    );
                }
            }
            None => expired += 1,
        }
        consistent(&m).await;
    }
    eprintln!("renew won {renewed} times, expiry {expired} times");
    // A restarted manager's first sweep, once everything has expired, removes every
    // conversation and leaves nothing.
    tokio::time::sleep(ttl * 2).await;
    let fresh = manager(d.path(), Some(ttl));
    fresh.collect_garbage(NOW).await.unwrap();
    assert!(fresh.list(None).await.unwrap().is_empty());
    assert!(fresh.runtime().list().await.unwrap().is_empty());
    assert_eq!(fresh.collect_garbage(NOW).await.unwrap().found(), 0);
}
