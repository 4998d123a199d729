//! Lifecycle and garbage collection on the `isolated` runtime, observed from the host: renew
//! racing expiry (the OpenSandbox #1200 scenario) never leaves a sandbox without an owner; an
//! orphaned sandbox (running agent and processes, no record) is found and ended; a dry run
//! touches nothing; the CLI shows lifecycle times, and backs up and restores the store.
//!
//! They need root (CI runs them as root); without it each prints SKIPPED and passes.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::Utc;
use sessionbox_core::{ConversationKey, Runtime, Session};
use sessionbox_manager::GcOptions;
use sessionbox_store::{Lifecycle, LifecyclePolicy};

use support::*;

use crate::support;

macro_rules! needs_root {
    () => {
        if !is_root() {
            eprintln!("SKIPPED: isolated runtime tests need root (CI runs them as root)");
            return;
        }
    };
}

/// Host processes in the sandboxes of keys that have no record: must be none.
async fn ownerless_processes(
    env: &Env,
    m: &sessionbox_manager::Manager,
) -> Vec<(String, Vec<u32>)> {
    let records: BTreeSet<ConversationKey> = m
        .list(None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    env.runtime
        .list()
        .await
        .unwrap()
        .into_iter()
        .filter(|c| !records.contains(&c.key))
        .map(|c| (c.key.short().to_owned(), c.processes))
        .collect()
}

/// OpenSandbox #1200: a renew landing as the expiry fires left a sandbox running with its
/// expiry in the past and nothing to reap it. Here, on real sandboxes: each round a
/// conversation with a 300 ms time to live is used (open + exec, which renews) exactly as a
/// collection runs at its expiry. Whoever wins, no sandbox process is left without a record, a
/// conversation that lives has its expiry in the future, and a collection by a second manager
/// (as after a restart, with no state but the store) reaps every expired one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renew_racing_expiry_never_leaves_a_sandbox_without_an_owner() {
    needs_root!();
    bounded(180, async {
        let env = Env::new(30);
        let policy = LifecyclePolicy {
            default: Lifecycle {
                idle_timeout: None,
                ttl: Some(Duration::from_millis(300)),
                max_lifetime: None,
            },
            tenants: Default::default(),
        };
        let m = env.manager.clone().with_lifecycle(policy.clone());
        let (mut lived, mut reaped) = (0, 0);
        for round in 0..16u64 {
            let c = Env::conv(&format!("race-{round}"));
            let s = m.open(&c).await.unwrap();
            assert!(sh(&s, "echo 1 > f").await.success());
            Box::new(s).close().await.unwrap();
            let expires = m.store().get(&c.key).unwrap().unwrap().expires_at.unwrap();
            let until = (expires - Utc::now()).to_std().unwrap_or_default();
            let jitter = Duration::from_millis(round % 7);
            tokio::time::sleep((until + jitter).saturating_sub(Duration::from_millis(3))).await;
            let (m1, m2, c1) = (m.clone(), m.clone(), c.clone());
            let user = tokio::spawn(async move {
                let s = m1.open(&c1).await.ok()?;
                let r = s
                    .exec(sessionbox_core::ExecRequest::new("echo 2 >> f"))
                    .await;
                Box::new(s).close().await.ok()?;
                r.ok().filter(|r| r.success())
            });
            let gc = tokio::spawn(async move {
                m2.collect_garbage(GcOptions {
                    dry_run: false,
                    grace: Duration::from_secs(10),
                })
                .await
                .unwrap()
            });
            let used = user.await.unwrap().is_some();
            gc.await.unwrap();
            let left = ownerless_processes(&env, &m).await;
            assert!(
                left.is_empty(),
                "round {round}: sandboxes without an owner: {left:?}"
            );
            match m.store().get(&c.key).unwrap() {
                Some(r) => {
                    lived += 1;
                    if used {
                        assert!(
                            r.expires_at.unwrap() > expires,
                            "round {round}: not renewed"
                        );
                    }
                }
                None => {
                    reaped += 1;
                    assert!(!env.workspace(&c.key).exists(), "round {round}");
                }
            }
        }
        eprintln!("lived {lived}, reaped {reaped}");
        // A second manager over the same data directory, once all have expired: it reaps them
        // all from the store alone, and nothing of theirs is left running.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let remaining = m.list(None).await.unwrap().len();
        let (m2, _) = env.another_manager();
        let m2 = m2.with_lifecycle(policy);
        let r = m2
            .collect_garbage(GcOptions {
                dry_run: false,
                grace: Duration::ZERO,
            })
            .await
            .unwrap();
        assert_eq!(r.removed(), remaining, "{r:#?}");
        assert_eq!(r.found(), remaining, "{r:#?}");
        assert!(m2.list(None).await.unwrap().is_empty());
        let inventory = env.runtime.list().await.unwrap();
        assert!(inventory.is_empty(), "{inventory:?}");
    })
    .await;
}

/// An orphaned sandbox: its agent and a daemon run, its record is gone. A dry run reports it
/// (with its processes) and leaves it running; a collection ends every process in its cgroups
/// and removes its workspace and run directory; a second collection finds nothing. A live
/// conversation next to it keeps its sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_orphaned_sandbox_is_reported_then_ended_and_a_live_one_is_kept() {
    needs_root!();
    bounded(120, async {
        let env = Env::new(30);
        let live = env.open("live").await;
        assert!(sh(&live, "echo live > f").await.success());
        let orphan = env.open("orphan").await;
        let key = orphan.key().clone();
        assert!(
            sh(
                &orphan,
                "setsid sh -c 'echo $$ > daemon; exec sleep 1000' > /dev/null 2>&1 < /dev/null & \
                 while [ ! -s daemon ]; do sleep 0.01; done"
            )
            .await
            .success()
        );
        drop(orphan);
        let rec = env.record(&key);
        assert!(env.manager.store().delete(&key).unwrap());

        let dry = env
            .manager
            .collect_garbage(GcOptions {
                dry_run: true,
                grace: Duration::ZERO,
            })
            .await
            .unwrap();
        assert_eq!(dry.orphans.len(), 1, "{dry:#?}");
        assert!(dry.orphans[0].processes >= 2, "{dry:#?}");
        assert!(
            rec.agent().is_some_and(|a| a.alive()),
            "a dry run ended the sandbox"
        );

        let r = env
            .manager
            .collect_garbage(GcOptions {
                dry_run: false,
                grace: Duration::ZERO,
            })
            .await
            .unwrap();
        assert_eq!(r.orphans.len(), 1);
        assert!(r.orphans[0].removed, "{r:#?}");
        assert!(
            eventually(5.0, || rec.members().is_empty()).await,
            "processes of the orphan survived"
        );
        assert!(!env.workspace(&key).exists());
        assert!(!env.run_dir(&key).exists());
        let again = env
            .manager
            .collect_garbage(GcOptions {
                dry_run: true,
                grace: Duration::ZERO,
            })
            .await
            .unwrap();
        assert_eq!(again.found(), 0, "{again:#?}");
        assert_eq!(text(&sh(&live, "cat f").await.stdout), "live\n");
        drop(live);
        env.manager.destroy(&Env::conv("live")).await.unwrap();
    })
    .await;
}

/// The CLI: `conversations` shows the lifecycle (from `[lifecycle]` and a tenant override),
/// `gc --dry-run` reports an expired conversation and `gc` removes it, `backup` copies the store
/// and `restore` brings a destroyed conversation's record back (and `gc` then sees its missing
/// workspace as dangling).
#[test]
fn the_cli_shows_lifecycle_times_collects_expired_conversations_and_backs_up_the_store() {
    needs_root!();
    let env = Env::new(30);
    std::fs::create_dir_all(&env.data).unwrap();
    std::fs::write(
        env.data.join("sessionbox.toml"),
        format!(
            "[isolated]\nuid_base = {}\nuid_count = {}\n[lifecycle]\nidle_timeout_secs = 45\n\
             ttl_secs = 3600\n[lifecycle.tenants.brief]\nttl_secs = 1\nmax_lifetime_secs = 2\n",
            env.uids.start,
            env.uids.len()
        ),
    )
    .unwrap();
    let ok = |args: &[&str]| {
        let out = env.cli(args, &[]);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    ok(&["exec", "-c", "keeper", "--", "echo k > f"]);
    ok(&[
        "--tenant",
        "brief",
        "exec",
        "-c",
        "short",
        "--",
        "echo s > f",
    ]);
    let table = ok(&["conversations", "--all-tenants"]);
    assert!(
        table.contains("EXPIRES") && table.contains("TTL"),
        "{table}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["conversations", "--all-tenants", "--json"])).unwrap();
    let by_id = |id: &str| {
        json.as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .unwrap()
            .clone()
    };
    let (k, s) = (by_id("keeper"), by_id("short"));
    assert_eq!(
        (k["idle_timeout_secs"].as_u64(), k["ttl_secs"].as_u64()),
        (Some(45), Some(3600))
    );
    assert_eq!(k["max_lifetime_secs"], serde_json::Value::Null);
    assert_eq!(
        (
            s["idle_timeout_secs"].as_u64(),
            s["ttl_secs"].as_u64(),
            s["max_lifetime_secs"].as_u64()
        ),
        (Some(45), Some(1), Some(2))
    );
    assert!(s["expires_at"].is_string());

    let backup = env.data.parent().unwrap().join("backup.db");
    ok(&["backup", backup.to_str().unwrap()]);

    std::thread::sleep(Duration::from_millis(1200));
    let dry = ok(&["gc", "--dry-run"]);
    assert!(
        dry.contains("1 expired") && dry.contains("brief/short"),
        "{dry}"
    );
    let short_ws = |env: &Env| {
        let key = sessionbox_core::ConversationKey::derive(
            &sessionbox_core::TenantId::new("brief").unwrap(),
            &sessionbox_core::ConversationId::new("short").unwrap(),
        );
        env.workspace(&key)
    };
    assert!(short_ws(&env).exists(), "a dry run removed a workspace");
    let done = ok(&["gc"]);
    assert!(done.contains("1 removed"), "{done}");
    assert!(!short_ws(&env).exists());
    let list = ok(&["conversations", "--all-tenants"]);
    assert!(list.contains("keeper") && !list.contains("short"), "{list}");

    // Restore the backup: the record of `short` is back, its workspace is not; gc sees it as
    // expired (it is past its expiry) and removes the record.
    ok(&["restore", backup.to_str().unwrap()]);
    let list = ok(&["conversations", "--all-tenants"]);
    assert!(list.contains("short"), "{list}");
    let r = ok(&["gc", "--grace-secs", "0"]);
    assert!(r.contains("1 removed"), "{r}");
    assert_eq!(
        text(&env.cli(&["read", "-c", "keeper", "f"], &[]).stdout),
        "k\n"
    );
    // Backing up onto an existing file is refused.
    let out = env.cli(&["backup", backup.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    ok(&["destroy", "-c", "keeper"]);
}
