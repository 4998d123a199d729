//! Bounded logs: how long the egress log and the audit log keep their rows, and how many one
//! tenant may have in each ([`LogRetention`]); [`Store::prune_logs`] removes what is past either
//! bound, oldest first, in bounded batches (each its own short statement, so a large prune never
//! holds the database for long), and text fields are cut to [`MAX_LOG_TEXT`] characters when a
//! row is written, so no log row carries unbounded input.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sessionbox_core::Result;

use crate::Store;
use crate::db::Db;

/// Longest text (in characters) a log field keeps: a method, target, rule, end reason,
/// operation, outcome or detail is cut to this, ending in `…`.
pub const MAX_LOG_TEXT: usize = 512;

/// Most rows one prune statement removes.
pub const PRUNE_BATCH: u64 = 5_000;

/// `s` cut to [`MAX_LOG_TEXT`] characters (with `…` in place of the rest).
pub(crate) fn capped(s: &str) -> String {
    if s.chars().count() <= MAX_LOG_TEXT {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(MAX_LOG_TEXT - 1).collect();
    out.push('…');
    out
}

/// How long and how much the logs keep, per tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRetention {
    /// Egress verdicts older than this are removed.
    pub egress_max_age: Duration,
    /// Most egress log rows one tenant keeps (its oldest go first).
    pub egress_max_rows: u64,
    /// Audit records older than this are removed.
    pub audit_max_age: Duration,
    /// Most audit records one tenant keeps (its oldest go first).
    pub audit_max_rows: u64,
}

impl LogRetention {
    /// Egress verdicts are kept 30 days by default (`[egress] log_retention_days`).
    pub const DEFAULT_EGRESS_DAYS: u64 = 30;
    /// At most 100 000 egress log rows per tenant by default (`[egress] log_max_rows`).
    pub const DEFAULT_EGRESS_ROWS: u64 = 100_000;
    /// Audit records are kept 90 days by default (`[audit] retention_days`).
    pub const DEFAULT_AUDIT_DAYS: u64 = 90;
    /// At most 1 000 000 audit records per tenant by default (`[audit] max_rows`).
    pub const DEFAULT_AUDIT_ROWS: u64 = 1_000_000;
}

impl Default for LogRetention {
    fn default() -> Self {
        let days = |d: u64| Duration::from_secs(d * 86_400);
        LogRetention {
            egress_max_age: days(Self::DEFAULT_EGRESS_DAYS),
            egress_max_rows: Self::DEFAULT_EGRESS_ROWS,
            audit_max_age: days(Self::DEFAULT_AUDIT_DAYS),
            audit_max_rows: Self::DEFAULT_AUDIT_ROWS,
        }
    }
}

/// What one prune removed, in rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LogsPruned {
    /// Egress log rows removed for their age.
    pub egress_expired: u64,
    /// Egress log rows removed because their tenant had more than its cap.
    pub egress_over_cap: u64,
    /// Audit records removed for their age.
    pub audit_expired: u64,
    /// Audit records removed because their tenant had more than its cap.
    pub audit_over_cap: u64,
}

impl LogsPruned {
    /// Every row removed.
    pub fn total(&self) -> u64 {
        self.egress_expired + self.egress_over_cap + self.audit_expired + self.audit_over_cap
    }
}

/// The two logs; the names are constants, never input.
#[derive(Clone, Copy)]
enum Log {
    Egress,
    Audit,
}

impl Log {
    fn table(self) -> &'static str {
        match self {
            Log::Egress => "egress_log",
            Log::Audit => "audit",
        }
    }
}

fn rows(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Store {
    /// Removes, from the egress log and the audit log, every row older than its log's maximum
    /// age at `now`, then, for each tenant over its log's row cap, its oldest rows beyond the
    /// cap (a tenant ends at or just under the cap: rows of the same millisecond as the last one
    /// removed go with it). Works in batches of [`PRUNE_BATCH`] rows, each its own statement.
    ///
    /// # Errors
    /// [`sessionbox_core::Error::Backend`] when the database fails; what earlier batches
    /// removed stays removed.
    pub fn prune_logs(&self, retention: &LogRetention, now: DateTime<Utc>) -> Result<LogsPruned> {
        let before = |age: Duration| {
            let age = chrono::Duration::from_std(age).unwrap_or(chrono::Duration::MAX);
            now.checked_sub_signed(age)
                .map_or(i64::MIN, |t| t.timestamp_millis())
        };
        Ok(LogsPruned {
            egress_expired: self.prune_age(Log::Egress, before(retention.egress_max_age))?,
            egress_over_cap: self.prune_cap(Log::Egress, retention.egress_max_rows)?,
            audit_expired: self.prune_age(Log::Audit, before(retention.audit_max_age))?,
            audit_over_cap: self.prune_cap(Log::Audit, retention.audit_max_rows)?,
        })
    }

    /// Rows of `log` at or older than `before_ms`, removed oldest first in batches.
    fn prune_age(&self, log: Log, before_ms: i64) -> Result<u64> {
        let t = log.table();
        let sql = format!(
            "DELETE FROM {t} WHERE id IN
               (SELECT id FROM {t} WHERE at < $1 ORDER BY at LIMIT $2)"
        );
        self.prune_batches(|db| {
            db.execute(
                "prune a log by age",
                &sql,
                &[before_ms.into(), rows(PRUNE_BATCH).into()],
            )
        })
    }

    /// Each tenant's rows of `log` beyond its newest `cap`, removed oldest first in batches.
    fn prune_cap(&self, log: Log, cap: u64) -> Result<u64> {
        let t = log.table();
        let over: Vec<String> = self.read(|db| {
            db.query(
                "find the tenants over a log's cap",
                &format!("SELECT tenant FROM {t} GROUP BY tenant HAVING COUNT(*) > $1"),
                &[rows(cap).into()],
            )?
            .iter()
            .map(|r| r.text(0))
            .collect()
        })?;
        let mut removed = 0;
        for tenant in over {
            // The time of the newest row beyond the cap: it and everything older goes.
            let Some(edge) = self.read(|db| {
                db.query_opt(
                    "find where a tenant's log passes its cap",
                    &format!(
                        "SELECT at FROM {t} WHERE tenant = $1
                         ORDER BY at DESC, id DESC LIMIT 1 OFFSET $2"
                    ),
                    &[tenant.as_str().into(), rows(cap).into()],
                )?
                .map(|r| r.int(0))
                .transpose()
            })?
            else {
                continue;
            };
            let sql = format!(
                "DELETE FROM {t} WHERE id IN
                   (SELECT id FROM {t} WHERE tenant = $1 AND at <= $2 ORDER BY at LIMIT $3)"
            );
            removed += self.prune_batches(|db| {
                db.execute(
                    "prune a tenant's log to its cap",
                    &sql,
                    &[
                        tenant.as_str().into(),
                        edge.into(),
                        rows(PRUNE_BATCH).into(),
                    ],
                )
            })?;
        }
        Ok(removed)
    }

    /// Runs `batch` (a statement removing at most [`PRUNE_BATCH`] rows) until it removes fewer.
    fn prune_batches(&self, batch: impl Fn(&mut dyn Db) -> Result<u64>) -> Result<u64> {
        let mut total = 0;
        loop {
            let n = self.read(&batch)?;
            total += n;
            if n < PRUNE_BATCH {
                return Ok(total);
            }
        }
    }
}
