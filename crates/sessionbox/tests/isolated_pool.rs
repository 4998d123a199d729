//! The `isolated` runtime's warm pool, on real sandboxes: a pooled sandbox bound to a new
//! conversation has that conversation's identity and nothing of the pool (uid, workspace,
//! mounts, environment, processes, `/tmp`, cgroups, host name), compared with a sandbox
//! launched for a conversation the ordinary way in the same data directory; a dead pooled
//! sandbox is never bound; draining the pool and destroying leave nothing, in the data
//! directory, the store or the process table.
//!
//! They need root (CI runs them as root); without it each prints SKIPPED and passes.

use std::collections::BTreeSet;
use std::path::Path;

use sessionbox_core::{Session as _, TenantId};
use sessionbox_sandbox::SandboxLimits;

use crate::support::*;

macro_rules! needs_root {
    () => {
        if !is_root() {
            eprintln!("SKIPPED: isolated runtime tests need root (CI runs them as root)");
            return;
        }
    };
}

/// What a command inside sees of its sandbox: uid, host name, environment, mount points (with
/// the root of each mount), the names of the processes other than the probe's own, `/tmp`.
const PROBE: &str = "echo uid=$(id -u); echo host=$(cat /proc/sys/kernel/hostname); \
     echo '--env'; env | sort; \
     echo '--mounts'; awk '{print $5, $4, $9}' /proc/self/mountinfo | sort; \
     echo '--procs'; for p in /proc/[0-9]*; do [ \"${p#/proc/}\" = \"$$\" ] || cat $p/comm 2>/dev/null; done | grep -v -e '^cat$' -e '^sort$' -e '^awk$' -e '^grep$' | sort; \
     echo '--tmp'; ls -A /tmp /dev/shm";

/// The pool's slots, made or being made (`.new-`).
fn all_slots(data: &Path) -> Vec<String> {
    std::fs::read_dir(data.join("pool"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The pool's slots whose sandbox is launched.
fn slots(data: &Path) -> Vec<String> {
    all_slots(data)
        .into_iter()
        .filter(|n| !n.starts_with(".new-"))
        .collect()
}

/// Host processes whose real uid is `uid`.
fn processes_of(uid: u32) -> Vec<u32> {
    processes()
        .into_iter()
        .filter(|p| p.uid == uid)
        .map(|p| p.pid)
        .collect()
}

/// `disk`: with or without a disk quota (a volume moved, or a directory renamed).
async fn bound_sandbox_is_the_conversations(disk: Option<(u64, u64)>) {
    let env = Env::with_pool(30, SandboxLimits::default(), disk, 1);
    let tenant = TenantId::new("default").unwrap();
    // An ordinary launch first (the pool is empty: nothing refills it yet).
    let plain = env.open(&unique("plain")).await;
    assert!(slots(&env.data).is_empty(), "nothing filled the pool yet");
    let plain_probe = text(&sh(&plain, PROBE).await.stdout);

    assert_eq!(env.runtime.refill_pool(&tenant).await.unwrap(), 1);
    let slot = slots(&env.data);
    assert_eq!(slot.len(), 1, "{slot:?}");
    let reservations = env.manager.store().uid_reservations().unwrap();
    assert_eq!(reservations.len(), 1, "{reservations:?}");
    let pool_uid = reservations[0].1;
    assert_eq!(env.runtime.refill_pool(&tenant).await.unwrap(), 0, "full");

    let pooled_id = unique("pooled");
    let pooled = env.open(&pooled_id).await;
    let key = pooled.key().clone();
    assert!(
        slots(&env.data).is_empty(),
        "the open took the pooled sandbox"
    );
    assert!(
        env.manager.store().uid_reservations().unwrap().is_empty(),
        "the reservation became the conversation's uid"
    );
    // Its uid is the conversation's: the store's, the workspace's owner, every process's.
    let uid = env
        .manager
        .store()
        .allocate_uid(&key, env.uids.clone())
        .unwrap();
    assert_eq!(uid, pool_uid);
    assert_eq!(env.uid(&key), uid);
    assert_ne!(uid, env.uid(plain.key()), "two conversations, two uids");
    let record = env.record(&key);
    // (The monitor, root's, stays outside the sandbox's namespaces but in its cgroups.)
    let inside: Vec<u32> = record
        .procs()
        .into_iter()
        .filter(|&p| p != record.monitor)
        .collect();
    assert!(inside.len() >= 2, "init and agent: {inside:?}");
    for p in inside {
        assert_eq!(proc_info(p).unwrap().uid, uid, "process {p}");
    }
    // Its cgroups are named for the conversation.
    assert!(
        record.name().ends_with(&key.as_str()[..40]),
        "{:?}",
        record.cgroups
    );
    // Inside: the same as an ordinary launch, but for the host name, which is its own.
    let probe = text(&sh(&pooled, PROBE).await.stdout);
    let host = |p: &str| {
        p.lines()
            .find_map(|l| l.strip_prefix("host=").map(str::to_owned))
            .unwrap()
    };
    assert_eq!(host(&probe), format!("sbx-{}", key.short()));
    // What differs between any two conversations: the host name, the loop device of the
    // volume, the key in the workspace's host path.
    let own = |p: &str, key: &sessionbox_core::ConversationKey| {
        p.lines()
            .filter(|l| !l.starts_with("host="))
            .map(|l| {
                let l = l.replace(key.as_str(), "KEY");
                match l.find("/dev/loop") {
                    Some(i) => format!("{}/dev/loop", &l[..i]),
                    None => l,
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        own(&probe, &key),
        own(&plain_probe, plain.key()),
        "the pooled sandbox differs from an ordinary one"
    );
    if disk.is_some() {
        assert!(
            probe.contains(&format!("/workspace {}", env.workspace(&key).display())),
            "the workspace mount is the conversation's directory: {probe}"
        );
    }
    assert!(!probe.contains("pool"), "{probe}");
    assert!(probe.contains("--tmp\n/dev/shm:\n\n/tmp:\n"), "{probe}");
    // Its workspace is the conversation's, on the host and inside, and the other's files are
    // not in it.
    assert!(sh(&pooled, "echo mine > f && mkdir d").await.success());
    assert_eq!(
        std::fs::read_to_string(env.workspace(&key).join("f")).unwrap(),
        "mine\n"
    );
    assert!(sh(&plain, "echo other > g").await.success());
    assert_eq!(
        text(&sh(&pooled, "ls -A").await.stdout),
        "d\nf\n",
        "only its own files"
    );
    let run = env.run_dir(&key);
    let run_files: BTreeSet<String> = std::fs::read_dir(&run)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for f in ["agent.sock", "sandbox.json", "lock"] {
        assert!(run_files.contains(f), "{run_files:?}");
    }
    assert!(!run_files.contains("workspace") && !run_files.contains("tenant"));
    // A second session reaches the same agent (no second launch).
    drop(pooled);
    let again = env.open(&pooled_id).await;
    assert_eq!(env.record(&key), record);
    drop(again);

    // Refilled, then drained: nothing of the pool remains.
    assert_eq!(env.runtime.refill_pool(&tenant).await.unwrap(), 1);
    let slot_uid = env.manager.store().uid_reservations().unwrap()[0].1;
    assert!(!processes_of(slot_uid).is_empty());
    assert_eq!(env.runtime.prune_pool(false).await.unwrap(), 0, "kept");
    assert_eq!(env.runtime.prune_pool(true).await.unwrap(), 1, "drained");
    assert!(all_slots(&env.data).is_empty());
    assert!(env.manager.store().uid_reservations().unwrap().is_empty());
    assert!(
        eventually(5.0, || processes_of(slot_uid).is_empty()).await,
        "the drained sandbox's processes: {:?}",
        processes_of(slot_uid)
    );
    // Destroyed: nothing of the bound conversation remains either.
    let plain_key = plain.key().clone();
    drop(plain);
    for k in [&key, &plain_key] {
        env.manager.runtime().destroy(k).await.unwrap();
        assert!(!env.workspace(k).exists() && !env.run_dir(k).exists());
    }
    assert!(
        eventually(5.0, || processes_of(uid).is_empty()).await,
        "left running: {:?}",
        processes_of(uid)
    );
    assert!(
        std::fs::read_dir(env.data.join("disks"))
            .map(|rd| rd.count())
            .unwrap_or(0)
            == 0,
        "no disk image is left"
    );
}

/// The bound sandbox of a new conversation has the conversation's uid, workspace (its own
/// volume), cgroups and host name, and inside it looks exactly like a sandbox launched for a
/// conversation the ordinary way: same environment, mounts, processes, empty `/tmp`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pooled_sandbox_bound_to_a_conversation_has_its_identity_and_nothing_of_the_pool() {
    needs_root!();
    bounded(120, bound_sandbox_is_the_conversations(None)).await;
}

/// The same without a disk quota: the pool's workspace directory is renamed to the
/// conversation's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_disk_quota_a_pooled_sandbox_gets_the_conversations_workspace_too() {
    needs_root!();
    bounded(120, bound_sandbox_is_the_conversations(Some((0, 0)))).await;
}

/// A pooled sandbox that died (killed) is never bound: the open launches one of its own, the
/// dead slot is removed and its uid reservation released. With a pool size of 0 nothing is
/// ever launched ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_pooled_sandbox_is_removed_not_bound_and_size_zero_is_no_pool() {
    needs_root!();
    bounded(120, async {
        let tenant = TenantId::new("default").unwrap();
        let off = Env::with_pool(30, SandboxLimits::default(), None, 0);
        assert_eq!(off.runtime.refill_pool(&tenant).await.unwrap(), 0);
        assert!(!off.data.join("pool").exists());

        let env = Env::with_pool(30, SandboxLimits::default(), None, 1);
        assert_eq!(env.runtime.refill_pool(&tenant).await.unwrap(), 1);
        let slot = env.data.join("pool").join(&slots(&env.data)[0]);
        let dead = Record::read(&slot).unwrap();
        dead.kill_all();
        assert!(eventually(5.0, || dead.procs().is_empty()).await);
        let conv = env.open(&unique("fresh")).await;
        assert!(sh(&conv, "true").await.success());
        assert_ne!(
            env.record(conv.key()).init,
            dead.init,
            "the dead sandbox was bound"
        );
        assert!(slots(&env.data).is_empty(), "the dead slot was removed");
        assert!(env.manager.store().uid_reservations().unwrap().is_empty());
        let key = conv.key().clone();
        drop(conv);
        env.manager.runtime().destroy(&key).await.unwrap();
    })
    .await;
}

/// A manager that refills (as `serve`'s does) fills the tenant's pool in the background after
/// an open that created a conversation, and the next new conversation takes that sandbox;
/// `maintain_pools` keeps it filled and a garbage collection with the pool turned off drains it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refilling_manager_keeps_the_pool_filled_after_each_new_conversation() {
    needs_root!();
    bounded(120, async {
        let env = Env::with_pool(30, SandboxLimits::default(), None, 1);
        let manager = env.manager.clone().with_pool_refill();
        let first = manager.open(&Env::conv(&unique("first"))).await.unwrap();
        assert!(
            eventually(20.0, || slots(&env.data).len() == 1).await,
            "the pool was not refilled: {:?}",
            slots(&env.data)
        );
        let pooled_init = Record::read(&env.data.join("pool").join(&slots(&env.data)[0]))
            .unwrap()
            .init;
        let second = manager.open(&Env::conv(&unique("second"))).await.unwrap();
        assert_eq!(
            env.record(second.key()).init,
            pooled_init,
            "took the pooled one"
        );
        assert!(
            eventually(20.0, || slots(&env.data).len() == 1).await,
            "refilled again"
        );
        let tenant = TenantId::new("default").unwrap();
        assert_eq!(manager.maintain_pools(&[tenant]).await.unwrap(), 0, "full");
        // With the pool turned off, garbage collection drains it.
        let (off, _) = env.another_manager_with_pool(0);
        let report = off
            .collect_garbage(sessionbox_manager::GcOptions::default())
            .await
            .unwrap();
        assert_eq!(report.pool_pruned, 1);
        assert!(all_slots(&env.data).is_empty());
        for c in [first, second] {
            let key = c.key().clone();
            drop(c);
            env.manager.runtime().destroy(&key).await.unwrap();
        }
    })
    .await;
}
