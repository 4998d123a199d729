//! The audit log: one entry per operation on a conversation (operation and outcome; never file
//! contents, commands or secrets). Every text field is cut to
//! [`MAX_LOG_TEXT`](crate::MAX_LOG_TEXT) characters as it is written, so no record carries
//! unbounded input; [`Store::prune_logs`] bounds the log by age and rows per tenant.
//!
//! Durability: an entry is committed before [`Store::audit`] returns, so no crash or kill of
//! the process that wrote it loses it. With SQLite its commit does not wait for the disk (every
//! operation writes one, and an `fsync` per operation was most of an audited exec's overhead):
//! a power loss or kernel crash may take back the entries committed after the store's last
//! synced commit (every other write is synced, and syncs the log before it too).

use chrono::{DateTime, Utc};
use sessionbox_core::{ConversationKey, Result, TenantId};

use crate::db::{Db, Row};
use crate::retention::capped;
use crate::{AuditEntry, AuditFilter, AuditRecord, Store, time};

impl Store {
    /// Appends an entry to the audit log. When this returns the entry is committed: it outlives
    /// a crash or kill of this process. With SQLite the commit does not wait for the disk, so a
    /// power loss may take back the entries written since the store's last synced commit (see
    /// the module documentation).
    ///
    /// # Errors
    /// [`Error::Backend`](sessionbox_core::Error::Backend) when the database fails.
    pub fn audit(&self, entry: &AuditEntry) -> Result<()> {
        self.write_unsynced("append to the audit log", |db| insert_audit(db, entry))
    }

    /// Appends `entries` to the audit log in one transaction: all or none, committed as
    /// [`Store::audit`] commits.
    ///
    /// # Errors
    /// [`Error::Backend`](sessionbox_core::Error::Backend) when the database fails.
    pub fn audit_many(&self, entries: &[AuditEntry]) -> Result<()> {
        self.write_unsynced("append to the audit log", |db| {
            entries.iter().try_for_each(|e| insert_audit(db, e))
        })
    }

    /// How often each operation ran on conversation `key` since `since` (its creation), from
    /// the audit log: `(operation, count)` pairs sorted by operation. Only the manager's
    /// operation records are counted, not the front ends' `http.*` and `mcp.*` records.
    ///
    /// # Errors
    /// [`Error::Backend`](sessionbox_core::Error::Backend) when the database fails.
    pub fn operation_counts(
        &self,
        key: &ConversationKey,
        since: DateTime<Utc>,
    ) -> Result<Vec<(String, u64)>> {
        self.read(|db| {
            db.query(
                "count the conversation's operations",
                "SELECT operation, COUNT(*) FROM audit
                 WHERE conversation_key = $1 AND at >= $2
                   AND operation NOT LIKE 'http.%' AND operation NOT LIKE 'mcp.%'
                 GROUP BY operation ORDER BY operation",
                &[key.as_str().into(), since.timestamp_millis().into()],
            )?
            .iter()
            .map(|r| Ok((r.text(0)?, r.int(1)?.max(0) as u64)))
            .collect()
        })
    }

    /// Audit entries matching `filter`, newest first (by time, then by append order).
    ///
    /// # Errors
    /// [`Error::Backend`](sessionbox_core::Error::Backend) when the database fails or a stored row is malformed.
    pub fn audit_log(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>> {
        let limit = filter
            .limit
            .map_or(i64::MAX, |n| i64::try_from(n).unwrap_or(i64::MAX));
        self.read(|db| {
            db.query(
                "read the audit log",
                "SELECT id, at, tenant, conversation_key, operation, outcome, detail FROM audit
                 WHERE (CAST($1 AS TEXT) IS NULL OR tenant = $1)
                   AND (CAST($2 AS TEXT) IS NULL OR conversation_key = $2)
                   AND (CAST($4 AS BIGINT) IS NULL OR at >= $4)
                 ORDER BY at DESC, id DESC LIMIT $3",
                &[
                    filter.tenant.as_ref().map(TenantId::as_str).into(),
                    filter.key.as_ref().map(ConversationKey::as_str).into(),
                    limit.into(),
                    filter.since.map(|t| t.timestamp_millis()).into(),
                ],
            )?
            .iter()
            .map(audit_record)
            .collect()
        })
    }
}

fn insert_audit(db: &mut dyn Db, entry: &AuditEntry) -> Result<()> {
    db.execute(
        "append to the audit log",
        "INSERT INTO audit (at, tenant, conversation_key, operation, outcome, detail)
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[
            entry.at.timestamp_millis().into(),
            entry.tenant.as_str().into(),
            entry
                .conversation_key
                .as_ref()
                .map(ConversationKey::as_str)
                .into(),
            capped(&entry.operation).into(),
            capped(&entry.outcome).into(),
            entry.detail.as_deref().map(capped).into(),
        ],
    )
    .map(drop)
}

fn audit_record(r: &Row) -> Result<AuditRecord> {
    Ok(AuditRecord {
        id: r.int(0)?,
        entry: AuditEntry {
            at: time(r.int(1)?)?,
            tenant: r.text(2)?.parse()?,
            conversation_key: r
                .opt_text(3)?
                .map(|k| ConversationKey::parse(&k))
                .transpose()?,
            operation: r.text(4)?,
            outcome: r.text(5)?,
            detail: r.opt_text(6)?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backend, lock};

    /// The connection's `PRAGMA synchronous`: 2 is FULL, 1 NORMAL.
    fn synchronous(store: &Store) -> i64 {
        match &store.backend {
            Backend::Sqlite { conn, .. } => lock(conn)
                .query_row("PRAGMA synchronous", [], |r| r.get(0))
                .unwrap(),
            Backend::Postgres(_) => unreachable!("a SQLite store"),
        }
    }

    #[test]
    fn an_audit_commit_leaves_every_other_commit_synced() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        assert_eq!(synchronous(&store), 2);
        let e = AuditEntry {
            at: Utc::now(),
            tenant: TenantId::new("t").unwrap(),
            conversation_key: None,
            operation: "exec".into(),
            outcome: "ok".into(),
            detail: None,
        };
        store.audit(&e).unwrap();
        assert_eq!(synchronous(&store), 2);
        store.audit_many(&[e.clone(), e]).unwrap();
        assert_eq!(synchronous(&store), 2);
        assert_eq!(store.audit_log(&AuditFilter::default()).unwrap().len(), 3);
    }
}
