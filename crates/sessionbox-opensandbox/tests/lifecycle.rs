//! Lifecycle on the real OpenSandbox server: the OpenSandbox #1200 scenario (a renew landing as
//! the expiry fires left a sandbox running, with its expiry in the past and nothing to reap it)
//! through sessionbox's manager, whose store holds the expiry and whose garbage collection
//! polls instead of relying on timers.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use common::*;
use sessionbox_core::{ConversationKey, ExecRequest, Runtime, Session};
use sessionbox_manager::{GcOptions, Manager};
use sessionbox_store::{Lifecycle, LifecyclePolicy};

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
