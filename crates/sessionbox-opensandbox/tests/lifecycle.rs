//! Lifecycle on the real OpenSandbox server: the OpenSandbox #1200 scenario (a renew landing as
//! the expiry fires left a sandbox running, with its expiry in the past and nothing to reap it)
//! through sessionbox's manager, whose store holds the expiry and whose garbage collection
//! polls instead of relying on timers; and the idle timeout (garbage collection pauses an idle
//! conversation's sandbox, the next open resumes it).

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use common::*;
use sessionbox_core::{ConversationKey, ConversationRef, ExecRequest, Runtime, Session};
use sessionbox_manager::{GcItem, GcOptions, Manager};
use sessionbox_opensandbox::{OpenSandboxRuntime, SandboxState};
use sessionbox_store::{AuditFilter, Lifecycle, LifecyclePolicy, Store};

/// Sandboxes of this instance on the server whose conversation has no record: must be none.
async fn ownerless(m: &Manager) -> Vec<String> {
    let records: BTreeSet<ConversationKey> = m
        .list(None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    m.runtime()
        .list()
        .await
        .unwrap()
        .into_iter()
        .filter(|c| !records.contains(&c.key))
        .map(|c| c.key.short().to_owned())
        .collect()
}

/// Each round a conversation with a 2 s time to live is used (open + exec, which renews) just as
/// a collection runs at its expiry. Whoever wins, no sandbox on the server is left without a
/// record, a conversation that was used lives on with its expiry moved forward, and once every
/// conversation has expired one collection (by a manager with no state but the store, as after
/// a restart) reaps them all: nothing of this instance is left on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renew_racing_expiry_never_leaves_a_sandbox_without_an_owner() {
    let Some((domain, key)) = server() else {
        return;
    };
    let (rt, store) = runtime(&domain, key, "renew-race");
    let runtime: Arc<dyn Runtime> = Arc::new(rt);
    let policy = LifecyclePolicy {
        default: Lifecycle {
            idle_timeout: None,
            ttl: Some(Duration::from_secs(2)),
            max_lifetime: None,
        },
        tenants: Default::default(),
    };
    let m = Manager::new(store.clone(), runtime.clone()).with_lifecycle(policy.clone());
    let (mut lived, mut reaped) = (0, 0);
    for round in 0..6u64 {
        let c = conv(&format!("race-{round}"));
        let s = m.open(&c).await.unwrap();
        assert!(
            s.exec(ExecRequest::new("echo 1 > f"))
                .await
                .unwrap()
                .success()
        );
        Box::new(s).close().await.unwrap();
        let expires = store.get(&c.key).unwrap().unwrap().expires_at.unwrap();
        let until = (expires - Utc::now()).to_std().unwrap_or_default();
        // Land the two within a few milliseconds either side of the expiry.
        let jitter = Duration::from_millis(round * 3);
        tokio::time::sleep((until + jitter).saturating_sub(Duration::from_millis(8))).await;
        let (m1, m2, c1) = (m.clone(), m.clone(), c.clone());
        let user = tokio::spawn(async move {
            let s = m1.open(&c1).await.ok()?;
            let r = s.exec(ExecRequest::new("echo 2 >> f")).await;
            Box::new(s).close().await.ok()?;
            r.ok().filter(|r| r.success())
        });
        let gc = tokio::spawn(async move {
            m2.collect_garbage(GcOptions {
                dry_run: false,
                grace: Duration::from_secs(30),
            })
            .await
            .unwrap()
        });
        let used = user.await.unwrap().is_some();
        gc.await.unwrap();
        let left = ownerless(&m).await;
        assert!(
            left.is_empty(),
            "round {round}: sandboxes without an owner: {left:?}"
        );
        match store.get(&c.key).unwrap() {
            Some(r) => {
                lived += 1;
                if used {
                    assert!(
                        r.expires_at.unwrap() > expires,
                        "round {round}: not renewed"
                    );
                }
            }
            None => reaped += 1,
        }
    }
    eprintln!("lived {lived}, reaped {reaped}");
    // Every conversation expires; a manager with no state but the store reaps them all.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let remaining = m.list(None).await.unwrap().len();
    let fresh = Manager::new(store.clone(), runtime.clone()).with_lifecycle(policy);
    let r = fresh
        .collect_garbage(GcOptions {
            dry_run: false,
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(r.removed(), remaining, "{r:#?}");
    assert!(fresh.list(None).await.unwrap().is_empty());
    let inventory = runtime.list().await.unwrap();
    assert!(
        inventory.is_empty(),
        "left on the server: {:?}",
        inventory.iter().map(|c| c.key.short()).collect::<Vec<_>>()
    );
}

/// The server's state of the sandbox the store maps `c` to.
async fn server_state(rt: &OpenSandboxRuntime, c: &ConversationRef) -> SandboxState {
    let id = rt
        .sandbox_id(&c.key)
        .await
        .unwrap()
        .expect("a mapped sandbox");
    rt.client().get(&id).await.unwrap().status.state
}

/// Waits (up to 10 s) for the server to report `want` for `c`'s sandbox; returns the last
/// state seen.
async fn wait_for_state(
    rt: &OpenSandboxRuntime,
    c: &ConversationRef,
    want: SandboxState,
) -> SandboxState {
    let mut state = server_state(rt, c).await;
    for _ in 0..100 {
        if state == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        state = server_state(rt, c).await;
    }
    state
}

/// Opens `c`, reads `f`, closes: a use, which moves its last use to now.
async fn use_now(m: &Manager, c: &ConversationRef) -> Vec<u8> {
    let s = m.open(c).await.unwrap();
    let data = s.read("f").await.unwrap();
    Box::new(s).close().await.unwrap();
    data
}

fn names(items: &[GcItem]) -> Vec<&str> {
    items
        .iter()
        .filter_map(|i| i.conversation.as_deref())
        .collect()
}

/// The idle timeout on `opensandbox`: a conversation idle past it has its sandbox paused by
/// garbage collection (a dry run only reports it), keeps its record and workspace, is not
/// taken for an orphan or a dangling record while paused, and the next open resumes it with
/// its files. A conversation used just before the collection, one whose lock a request holds,
/// and one with a command running are left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_sandbox_is_paused_by_gc_and_resumed_with_its_files_by_the_next_open() {
    let Some((domain, key)) = server() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A store on disk: conversation locks need one.
    let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
    let rt = runtime_in(&domain, key, "idle", store.clone());
    let runtime: Arc<dyn Runtime> = Arc::new(rt.clone());
    let m = Manager::new(store.clone(), runtime).with_lifecycle(LifecyclePolicy {
        default: Lifecycle {
            idle_timeout: Some(Duration::from_secs(1)),
            ttl: None,
            max_lifetime: None,
        },
        tenants: Default::default(),
    });
    let (quiet, recent, held) = (conv("idle-quiet"), conv("idle-recent"), conv("idle-held"));
    for c in [&quiet, &recent, &held] {
        let s = m.open(c).await.unwrap();
        s.write("f", c.id.as_str().as_bytes()).await.unwrap();
        Box::new(s).close().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A request holds `held` (as the CLI and the server do for each operation).
    let lock = {
        let (s, k) = (store.clone(), held.key.clone());
        tokio::task::spawn_blocking(move || s.lock_conversation(&k))
            .await
            .unwrap()
            .unwrap()
    };

    // A dry run reports the idle ones and pauses nothing.
    use_now(&m, &recent).await;
    let dry = m
        .collect_garbage(GcOptions {
            dry_run: true,
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
    let mut listed = names(&dry.idle_stopped);
    listed.sort_unstable();
    assert_eq!(listed, ["idle-held", "idle-quiet"], "{dry:#?}");
    assert!(dry.idle_stopped.iter().all(|i| !i.removed), "{dry:#?}");
    assert_eq!((dry.found(), dry.stopped()), (0, 0), "{dry:#?}");
    for c in [&quiet, &recent, &held] {
        assert_eq!(
            server_state(&rt, c).await,
            SandboxState::Running,
            "{}",
            c.id
        );
    }

    // The real run pauses the idle one nobody holds.
    use_now(&m, &recent).await;
    let r = m
        .collect_garbage(GcOptions {
            dry_run: false,
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!((r.found(), r.removed(), r.stopped()), (0, 0, 1), "{r:#?}");
    let item = |id: &str| {
        r.idle_stopped
            .iter()
            .find(|i| i.conversation.as_deref() == Some(id))
    };
    assert!(item("idle-quiet").unwrap().removed, "{r:#?}");
    let skipped = item("idle-held").unwrap();
    assert!(
        !skipped.removed && skipped.note.as_deref().unwrap().contains("in use"),
        "{r:#?}"
    );
    assert!(item("idle-recent").is_none(), "{r:#?}");
    assert_eq!(
        wait_for_state(&rt, &quiet, SandboxState::Paused).await,
        SandboxState::Paused
    );
    assert_eq!(server_state(&rt, &recent).await, SandboxState::Running);
    assert_eq!(server_state(&rt, &held).await, SandboxState::Running);
    let audit = store
        .audit_log(&AuditFilter {
            key: Some(quiet.key.clone()),
            ..Default::default()
        })
        .unwrap();
    assert!(
        audit
            .iter()
            .any(|e| e.entry.operation == "idle_stop" && e.entry.outcome == "ok"),
        "no idle_stop in the audit log"
    );

    // Paused is neither garbage nor something to stop again; the record stays.
    use_now(&m, &recent).await;
    let again = m
        .collect_garbage(GcOptions {
            dry_run: false,
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(again.found(), 0, "{again:#?}");
    assert!(
        !names(&again.idle_stopped).contains(&"idle-quiet"),
        "{again:#?}"
    );
    assert!(store.get(&quiet.key).unwrap().is_some());
    assert_eq!(server_state(&rt, &quiet).await, SandboxState::Paused);

    // Once the request is over, the next collection pauses `held` too.
    drop(lock);
    use_now(&m, &recent).await;
    let later = m
        .collect_garbage(GcOptions {
            dry_run: false,
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(names(&later.idle_stopped), ["idle-held"], "{later:#?}");
    assert_eq!(later.stopped(), 1, "{later:#?}");

    // The next open resumes the paused sandbox with its files.
    let s = m.open(&quiet).await.unwrap();
    assert!(!s.state_lost());
    assert_eq!(s.read("f").await.unwrap(), b"idle-quiet");
    assert!(
        s.exec(ExecRequest::new("test \"$(cat f)\" = idle-quiet"))
            .await
            .unwrap()
            .success()
    );
    Box::new(s).close().await.unwrap();
    assert_eq!(server_state(&rt, &quiet).await, SandboxState::Running);
    assert_eq!(use_now(&m, &held).await, b"idle-held");

    // A command running through this process keeps its sandbox running past the idle timeout.
    let s = m.open(&recent).await.unwrap();
    let command = tokio::spawn(async move {
        let r = s.exec(ExecRequest::new("sleep 3; cat f")).await.unwrap();
        Box::new(s).close().await.unwrap();
        r
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let busy = m
        .collect_garbage(GcOptions {
            dry_run: false,
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
    assert!(
        !names(&busy.idle_stopped).contains(&"idle-recent"),
        "{busy:#?}"
    );
    assert_eq!(server_state(&rt, &recent).await, SandboxState::Running);
    let r = command.await.unwrap();
    assert!(r.success() && r.stdout == b"idle-recent", "{r:?}");

    // A paused sandbox is destroyed like any other; nothing is left on the server.
    let paused = m
        .collect_garbage(GcOptions {
            dry_run: false,
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
    assert!(paused.stopped() >= 1, "{paused:#?}");
    for c in [&quiet, &recent, &held] {
        m.destroy(c).await.unwrap();
    }
    assert!(m.list(None).await.unwrap().is_empty());
    assert_nothing_left(&rt).await;
}

/// Memory on `opensandbox`: the agent reads its container's cgroup, so a conversation's
/// memory is its own container's charge against the `memory` resource limit (256Mi here), not
/// the host's; another conversation's container is charged none of it; a paused sandbox is
/// reported as not measured and stays paused (measuring never resumes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_use_is_the_containers_cgroup_charge_and_a_paused_sandbox_is_not_woken() {
    let Some((domain, key)) = server() else {
        return;
    };
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
    let rt = runtime_in(&domain, key, "memory", store.clone());
    let (a, b) = (conv("mem-held"), conv("mem-quiet"));
    for (c, command) in [
        // /dev/shm is a tmpfs: its pages stay charged to the container until removed.
        (
            &a,
            "dd if=/dev/zero of=/dev/shm/held bs=1048576 count=48 2>/dev/null && echo held",
        ),
        (&b, "echo quiet"),
    ] {
        let s = rt.open(c).await.unwrap();
        let r = s.exec(ExecRequest::new(command)).await.unwrap();
        assert_eq!(r.shell_exit_code(), 0, "{r:?}");
        Box::new(s).close().await.unwrap();
    }
    let held = rt.memory_usage(&a.key).await.unwrap().expect("measured");
    assert_eq!(
        held.measured,
        sessionbox_core::MemoryMeasure::Cgroup,
        "{held:?}"
    );
    assert_eq!(held.bytes_limit, Some(256 * MIB), "{held:?}");
    assert!(
        held.bytes_used >= 48 * MIB && held.bytes_used < 256 * MIB,
        "{held:?}"
    );
    let quiet = rt.memory_usage(&b.key).await.unwrap().expect("measured");
    assert!(quiet.bytes_used < 48 * MIB, "{quiet:?} beside {held:?}");

    assert!(rt.stop_idle(&b.key).await.unwrap(), "paused");
    assert_eq!(
        wait_for_state(&rt, &b, SandboxState::Paused).await,
        SandboxState::Paused
    );
    assert_eq!(rt.memory_usage(&b.key).await.unwrap(), None);
    assert_eq!(server_state(&rt, &b).await, SandboxState::Paused);

    for c in [&a, &b] {
        rt.destroy(&c.key).await.unwrap();
    }
    assert_nothing_left(&rt).await;
}
