//! The wall clock jumps, backwards and forwards, under a live conversation of the `isolated`
//! runtime with a background command running. The system clock cannot be moved here (other
//! tests share the machine), so the store's clock is: every lifecycle decision (expiry,
//! renewal, garbage collection) is made by it (`sessionbox_store::clock`), and a test injects
//! one with `Store::set_clock`. The sandbox, the commands' timeouts and the agent's idle timer
//! run on the monotonic clock, which no jump moves.
//!
//! What must hold: a backward jump and its correction do not shorten the conversation's life
//! (a renewal during the jump never moves its expiry back; before this rule, the correction
//! expired it at once and garbage collection killed its background command); a forward jump
//! past its time to live does not kill a foreground command that is running (garbage
//! collection leaves a conversation in use); and expiry then follows the store's clock, as
//! documented: the next collection destroys it, and the next open makes it anew, saying so.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sessionbox_core::{ExecRequest, OpenMode, Session};
use sessionbox_manager::GcOptions;
use sessionbox_store::{Clock, Lifecycle, LifecyclePolicy};

use super::needs_root;
use crate::support::{Env, bounded, sh, text};

/// The real wall clock moved by an offset the test sets.
#[derive(Debug, Default)]
struct Jumping(AtomicI64);

impl Jumping {
    fn jump_to(&self, offset: chrono::Duration) {
        self.0.store(offset.num_milliseconds(), Ordering::SeqCst);
    }
}

impl Clock for Jumping {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + chrono::Duration::milliseconds(self.0.load(Ordering::SeqCst))
    }
}

const TTL: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wall_clock_jumps_neither_kill_running_commands_nor_shorten_a_conversations_life() {
    needs_root!();
    bounded(240, async {
        let env = Env::new(30);
        let clock = Arc::new(Jumping::default());
        env.manager.store().set_clock(clock.clone());
        let manager = env.manager.clone().with_lifecycle(LifecyclePolicy {
            default: Lifecycle {
                idle_timeout: Some(Duration::from_secs(30)),
                ttl: Some(TTL),
                max_lifetime: None,
            },
            ..LifecyclePolicy::default()
        });
        let store = manager.store().clone();
        let conv = Env::conv("jumpy");
        let gc = || {
            manager.collect_garbage(GcOptions {
                dry_run: false,
                grace: Duration::ZERO,
            })
        };
        let session = manager.open(&conv).await.unwrap();
        let bg = session
            .spawn(
                ExecRequest::new("sleep 25; echo done > bg.txt").timeout(Duration::from_secs(90)),
            )
            .await
            .unwrap();
        let expiry = |s: &sessionbox_store::Store| {
            s.get(&conv.key)
                .unwrap()
                .expect("the record")
                .expires_at
                .unwrap()
        };
        let given = expiry(&store);

        // A day back. Uses renew the conversation meanwhile; none moves its expiry back.
        clock.jump_to(-chrono::Duration::days(1));
        for _ in 0..3 {
            let held = manager
                .open_for(&conv, OpenMode::ExistingOnly)
                .await
                .unwrap();
            assert_eq!(text(&sh(&*held, "echo used").await.stdout), "used\n");
        }
        assert!(
            expiry(&store) >= given,
            "a renewal during the backward jump moved the expiry back: {} < {given}",
            expiry(&store)
        );
        let report = gc().await.unwrap();
        assert_eq!(report.found(), 0, "{report:?}");

        // The clock corrected: the conversation lives on, its background command too.
        clock.jump_to(chrono::Duration::zero());
        let report = gc().await.unwrap();
        assert_eq!(report.found(), 0, "the correction expired it: {report:?}");
        let status = session.command(&bg.id).await.unwrap();
        assert!(status.running, "{status:?}");

        // A day forward, past its time to live, while a foreground command runs: the command is
        // neither timed out nor killed (a collection leaves a conversation in use alone).
        let held = manager
            .open_for(&conv, OpenMode::ExistingOnly)
            .await
            .unwrap();
        clock.jump_to(chrono::Duration::days(1));
        let running = tokio::spawn(async move {
            let r = held
                .exec(ExecRequest::new("sleep 4; echo fg").timeout(Duration::from_secs(30)))
                .await;
            drop(held);
            r
        });
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let report = gc().await.unwrap();
        assert_eq!(report.expired.len(), 1, "{report:?}");
        assert!(!report.expired[0].removed, "{report:?}");
        assert!(
            report.expired[0]
                .note
                .as_deref()
                .is_some_and(|n| n.contains("in use")),
            "{report:?}"
        );
        let r = running.await.unwrap().unwrap();
        assert_eq!(
            (text(&r.stdout).as_str(), r.shell_exit_code()),
            ("fg\n", 0),
            "{r:?}"
        );
        assert!(session.command(&bg.id).await.unwrap().running);

        // Then expiry follows the store's clock, as documented: by it the conversation expired,
        // so the next collection destroys it and the next open makes it anew, saying so.
        let report = gc().await.unwrap();
        assert_eq!(
            (
                report.expired.len(),
                report.expired.first().map(|i| i.removed)
            ),
            (1, Some(true)),
            "{report:?}"
        );
        assert!(store.get(&conv.key).unwrap().is_none());
        let again = manager.open(&conv).await.unwrap();
        assert!(again.created());
        let notice = again.previous_expired().expect("told that it expired");
        assert!(notice.expired_at <= notice.destroyed_at, "{notice:?}");
        assert_eq!(text(&sh(&again, "ls").await.stdout), "");
        drop((session, again));
        manager.destroy(&conv).await.unwrap();
    })
    .await;
}
