//! Bounded logs: aggregated egress rows, text fields cut on write, and pruning by age and by a
//! per-tenant row cap, on real SQLite files and real PostgreSQL databases (see
//! `support/pg.rs`). Every body runs on each backend: `sqlite::NAME` and `postgresql::NAME`.

#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "support/pg.rs"]
mod pg;

use std::time::Duration;

use chrono::{DateTime, Utc};
use sessionbox_core::ConversationRef;
use sessionbox_store::{
    AuditEntry, AuditFilter, EgressLogEntry, EgressLogFilter, LogRetention, MAX_LOG_TEXT,
    PRUNE_BATCH, Store,
};

enum Fx {
    Sqlite(tempfile::TempDir),
    Postgres(pg::TestDb),
}

impl Fx {
    fn open(&self) -> Store {
        match self {
            Fx::Sqlite(dir) => Store::open(&dir.path().join("store.db")).unwrap(),
            Fx::Postgres(d) => Store::connect(&d.url).unwrap(),
        }
    }
}

macro_rules! both {
    ($($(#[$meta:meta])* fn $name:ident($fx:ident) $body:block)*) => {
        mod sqlite {
            #[allow(unused_imports)]
            use super::*;
            $($(#[$meta])* #[test] fn $name() {
                let $fx = Fx::Sqlite(tempfile::tempdir().unwrap());
                $body
            })*
        }
        mod postgresql {
            #[allow(unused_imports)]
            use super::*;
            $($(#[$meta])* #[test] fn $name() {
                let Some(d) = pg::database() else { return };
                let $fx = Fx::Postgres(d);
                $body
            })*
        }
    };
}

fn t(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap()
}

fn verdict(c: &ConversationRef, at: i64, target: &str, count: u64) -> EgressLogEntry {
    EgressLogEntry {
        at: t(at),
        tenant: c.tenant.clone(),
        conversation_key: c.key.clone(),
        allowed: false,
        method: "CONNECT".into(),
        target: target.into(),
        address: None,
        rule: "no allow rule covers it".into(),
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: 0,
        end: None,
        count,
    }
}

fn audit(c: &ConversationRef, at: i64, detail: &str) -> AuditEntry {
    AuditEntry {
        at: t(at),
        tenant: c.tenant.clone(),
        conversation_key: Some(c.key.clone()),
        operation: "exec".into(),
        outcome: "ok".into(),
        detail: Some(detail.into()),
    }
}

fn egress_of(s: &Store, c: &ConversationRef) -> Vec<i64> {
    s.egress_log(&EgressLogFilter {
        key: Some(c.key.clone()),
        ..Default::default()
    })
    .unwrap()
    .iter()
    .map(|r| r.entry.at.timestamp_millis())
    .collect()
}

fn audit_of(s: &Store, c: &ConversationRef) -> Vec<i64> {
    s.audit_log(&AuditFilter {
        key: Some(c.key.clone()),
        ..Default::default()
    })
    .unwrap()
    .iter()
    .map(|r| r.entry.at.timestamp_millis())
    .collect()
}

const DAY_MS: i64 = 86_400_000;

both! {
    /// A row stands for many verdicts; attacker-sized text (a 100 000-character CONNECT target,
    /// an audit detail as long) is cut to MAX_LOG_TEXT characters, not stored whole.
    fn a_row_keeps_its_count_and_no_field_keeps_unbounded_input(fx) {
        let s = fx.open();
        let a = ConversationRef::parse("acme", "a").unwrap();
        let huge = "x".repeat(100_000);
        s.log_egress_many(&[verdict(&a, 1_000, "one:443", 4_999), verdict(&a, 2_000, &huge, 0)])
            .unwrap();
        s.log_egress_many(&[]).unwrap();
        let log = s.egress_log(&EgressLogFilter::default()).unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!((log[1].entry.target.as_str(), log[1].entry.count), ("one:443", 4_999));
        assert_eq!(log[0].entry.count, 1, "a count of 0 is stored as 1");
        assert_eq!(log[0].entry.target.chars().count(), MAX_LOG_TEXT);
        assert!(log[0].entry.target.ends_with('…'));
        s.audit(&audit(&a, 1_000, &huge)).unwrap();
        let rec = s.audit_log(&AuditFilter::default()).unwrap();
        assert_eq!(rec[0].entry.detail.as_ref().unwrap().chars().count(), MAX_LOG_TEXT);
    }

    /// Both logs: rows past their age go, then each tenant keeps only its newest rows up to its
    /// cap; another tenant under its cap keeps everything. More than one batch of old rows
    /// goes, and a second prune finds nothing.
    fn prune_removes_rows_past_retention_and_beyond_each_tenants_cap_oldest_first(fx) {
        let s = fx.open();
        let a = ConversationRef::parse("acme", "a").unwrap();
        let b = ConversationRef::parse("other", "b").unwrap();
        let now = 100 * DAY_MS;
        // a: more than a batch of rows 40 days old, and 50 from the last hour; b: 5 recent.
        let old = PRUNE_BATCH as i64 + 7;
        let rows: Vec<_> = (0..old).map(|i| verdict(&a, now - 40 * DAY_MS + i, "o:1", 1)).collect();
        s.log_egress_many(&rows).unwrap();
        let recent: Vec<_> = (0..50).map(|i| verdict(&a, now - 3_600_000 + i * 1_000, "r:1", 1)).collect();
        s.log_egress_many(&recent).unwrap();
        let rb: Vec<_> = (0..5).map(|i| verdict(&b, now - 1_000 + i, "b:1", 1)).collect();
        s.log_egress_many(&rb).unwrap();
        for i in 0..30 {
            s.audit(&audit(&a, now - 100 * DAY_MS + i, "old")).unwrap();
            s.audit(&audit(&a, now - 1_000 + i, "new")).unwrap();
            s.audit(&audit(&b, now - 1_000 + i, "new")).unwrap();
        }
        let retention = LogRetention {
            egress_max_age: Duration::from_secs(30 * 86_400),
            egress_max_rows: 20,
            audit_max_age: Duration::from_secs(90 * 86_400),
            audit_max_rows: 25,
        };
        let pruned = s.prune_logs(&retention, t(now)).unwrap();
        assert_eq!(pruned.egress_expired, old as u64);
        assert_eq!(pruned.egress_over_cap, 30);
        assert_eq!((pruned.audit_expired, pruned.audit_over_cap), (30, 5 + 5));
        // a keeps its 20 newest verdicts, b all 5; a and b their 25 newest audit records.
        let ea = egress_of(&s, &a);
        assert_eq!(ea.len(), 20);
        assert_eq!(ea.last(), Some(&(now - 3_600_000 + 30 * 1_000)), "the oldest went first");
        assert_eq!(egress_of(&s, &b).len(), 5);
        let aa = audit_of(&s, &a);
        assert_eq!(aa.len(), 25);
        assert!(aa.iter().all(|&at| at >= now - 1_000 + 5));
        assert_eq!(audit_of(&s, &b).len(), 25);
        assert_eq!(s.prune_logs(&retention, t(now)).unwrap().total(), 0);
    }
}
