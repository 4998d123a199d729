//! The conversation store of sessionbox: which conversations exist, which runtime owns each,
//! the audit log, and per-conversation sandbox uids.
//!
//! One [`Store`] wraps one SQLite file (WAL mode, foreign keys on, a [`BUSY_TIMEOUT`] wait for
//! locks), so several processes — a CLI and a server — can share it. Every write runs in one
//! IMMEDIATE transaction: two processes racing to create one conversation make exactly one
//! record, and a crash mid-operation leaves the previous state.
//!
//! The schema is an append-only list of migrations tracked with `PRAGMA user_version` (see
//! [`SCHEMA_VERSION`]); opening an older database upgrades it, opening a newer one is refused.
//!
//! The API is sync and backend-neutral (no SQL in it), so a PostgreSQL store can offer the same
//! methods. Async callers use `spawn_blocking`. Every error is a [`sessionbox_core::Error`]:
//! SQLite failures become [`Error::Backend`] naming what was being done.
//!
//! ```
//! use chrono::Utc;
//! use sessionbox_core::ConversationRef;
//! use sessionbox_store::Store;
//!
//! let store = Store::open_in_memory()?;
//! let conv = ConversationRef::parse("acme", "thread-1")?;
//! let (record, created) = store.get_or_create(&conv, "host", Utc::now())?;
//! assert!(created);
//! assert_eq!(store.get(&record.key)?.unwrap().runtime, "host");
//! # Ok::<(), sessionbox_core::Error>(())
//! ```

mod bootstraps;
mod egress;
mod keys;
mod remote;
mod schema;
mod types;

use std::fs::{DirBuilder, OpenOptions};
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rusqlite::types::Type;
use rusqlite::{Connection, ErrorCode, OptionalExtension, Row, TransactionBehavior, params};
use sessionbox_core::{ConversationKey, ConversationRef, Error, Result, TenantId};

pub use bootstraps::{BootstrapRecord, BootstrapState};
pub use egress::{EgressLogEntry, EgressLogFilter, EgressLogRecord, PolicyScope, StoredPolicy};
pub use keys::{API_KEY_PREFIX, ApiKeyRecord, NewApiKey};
pub use remote::RemoteSandbox;
pub use schema::SCHEMA_VERSION;
pub use types::{AuditEntry, AuditFilter, AuditRecord, ConversationRecord, ConversationState};

/// How long an operation waits for another connection's lock before failing: 10 s.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The conversation store. Cheap to clone (clones share one connection); `Send + Sync`.
#[derive(Debug, Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
}

const RECORD_COLUMNS: &str = "key, tenant, conversation_id, runtime, sandbox_ref, state, \
                              created_at, last_used_at, expires_at";

impl Store {
    /// Opens the store at `path`, creating its parent directories (mode 0700) and the file
    /// (mode 0600) when missing, and migrating the schema to [`SCHEMA_VERSION`].
    ///
    /// # Errors
    /// [`Error::Backend`] when the directory or file cannot be made or opened, when the schema
    /// is newer than this build, or when a migration fails.
    pub fn open(path: &Path) -> Result<Store> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let mut builder = DirBuilder::new();
            builder.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            builder.create(dir).map_err(|e| {
                Error::Backend(format!(
                    "could not create the store directory {}: {e}",
                    dir.display()
                ))
            })?;
        }
        let mut options = OpenOptions::new();
        options.create(true).append(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        options.open(path).map_err(|e| {
            Error::Backend(format!(
                "could not create the store file {}: {e}",
                path.display()
            ))
        })?;
        let conn = Connection::open(path).map_err(sql_error(&format!(
            "open the store file {}",
            path.display()
        )))?;
        Store::setup(conn)
    }

    /// A private store in memory, for tests. Clones share it; it is gone when the last is
    /// dropped.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn open_in_memory() -> Result<Store> {
        let conn = Connection::open_in_memory().map_err(sql_error("open a store in memory"))?;
        Store::setup(conn)
    }

    fn setup(mut conn: Connection) -> Result<Store> {
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(sql_error("set the busy timeout"))?;
        conn.pragma_update(None, "foreign_keys", true)
            .map_err(sql_error("turn on foreign keys"))?;
        // Persistent in the file (in memory it stays "memory"). Switching a new file can fail
        // with SQLITE_BUSY at once, without waiting, while another connection opens it too.
        let deadline = Instant::now() + BUSY_TIMEOUT;
        while let Err(e) =
            conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
        {
            if !is_busy(&e) || Instant::now() >= deadline {
                return Err(sql_error("switch to WAL mode")(e));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        schema::migrate(&mut conn)?;
        Ok(Store {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// The schema version of the database (`PRAGMA user_version`); [`SCHEMA_VERSION`] after a
    /// successful open unless another process has since upgraded it.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn schema_version(&self) -> Result<u32> {
        self.conn()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(sql_error("read the schema version"))
    }

    /// Returns the conversation's record, creating it (state `active`, created and last used at
    /// `now`, no sandbox, no expiry) when there is none. The boolean is true when this call made
    /// it: of any number of concurrent first calls, from threads or processes, exactly one sees
    /// `true`. An existing record is returned as it is (not touched; it may be `destroying`).
    ///
    /// # Errors
    /// - [`Error::Conflict`] when the conversation exists under another runtime: it must be
    ///   destroyed before it can use `runtime`.
    /// - [`Error::InvalidRequest`] when `runtime` is empty or `conv.key` is not derived from
    ///   its tenant and id.
    /// - [`Error::Backend`] when SQLite fails.
    pub fn get_or_create(
        &self,
        conv: &ConversationRef,
        runtime: &str,
        now: DateTime<Utc>,
    ) -> Result<(ConversationRecord, bool)> {
        if runtime.is_empty() {
            return Err(Error::InvalidRequest("the runtime name is empty".into()));
        }
        if conv.key != ConversationKey::derive(&conv.tenant, &conv.id) {
            return Err(Error::InvalidRequest(
                "the conversation key does not match its tenant and id".into(),
            ));
        }
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql_error("start a transaction"))?;
        let inserted = tx
            .execute(
                "INSERT INTO conversations (key, tenant, conversation_id, runtime, sandbox_ref,
                     state, created_at, last_used_at, expires_at)
                 VALUES (?1, ?2, ?3, ?4, NULL, 'active', ?5, ?5, NULL)
                 ON CONFLICT DO NOTHING",
                params![
                    conv.key.as_str(),
                    conv.tenant.as_str(),
                    conv.id.as_str(),
                    runtime,
                    now.timestamp_millis()
                ],
            )
            .map_err(sql_error("create the conversation record"))?;
        let record = select(&tx, &conv.key)?.ok_or_else(|| {
            Error::Backend(format!(
                "conversation {}/{} is stored under another key than {}",
                conv.tenant, conv.id, conv.key
            ))
        })?;
        if record.runtime != runtime {
            return Err(Error::Conflict(format!(
                "conversation {}/{} belongs to the {} runtime; destroy it first to use it with \
                 the {runtime} runtime",
                conv.tenant, conv.id, record.runtime
            )));
        }
        tx.commit()
            .map_err(sql_error("commit the conversation record"))?;
        Ok((record, inserted == 1))
    }

    /// The record of `key`, or `None`.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails or the stored row is malformed.
    pub fn get(&self, key: &ConversationKey) -> Result<Option<ConversationRecord>> {
        select(&self.conn(), key)
    }

    /// Sets the conversation's last use to `now`; never moves it back.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such conversation; [`Error::Backend`].
    pub fn touch(&self, key: &ConversationKey, now: DateTime<Utc>) -> Result<()> {
        self.update(
            key,
            "last_used_at = max(last_used_at, ?2)",
            now.timestamp_millis(),
        )
    }

    /// Sets (or with `None` clears) the runtime's id for the conversation's sandbox.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such conversation; [`Error::Backend`].
    pub fn set_sandbox_ref(&self, key: &ConversationKey, sandbox_ref: Option<&str>) -> Result<()> {
        self.update(key, "sandbox_ref = ?2", sandbox_ref)
    }

    /// Sets the conversation's state.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such conversation; [`Error::Backend`].
    pub fn set_state(&self, key: &ConversationKey, state: ConversationState) -> Result<()> {
        self.update(key, "state = ?2", state.as_str())
    }

    /// Sets (or with `None` clears) when the conversation may be reclaimed.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such conversation; [`Error::Backend`].
    pub fn set_expiry(
        &self,
        key: &ConversationKey,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<()> {
        self.update(
            key,
            "expires_at = ?2",
            expires_at.map(|t| t.timestamp_millis()),
        )
    }

    /// Deletes the conversation's record and its sandbox uid; audit entries stay. Returns
    /// false when there was no record (so deleting twice is fine).
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn delete(&self, key: &ConversationKey) -> Result<bool> {
        let n = self
            .conn()
            .execute("DELETE FROM conversations WHERE key = ?1", [key.as_str()])
            .map_err(sql_error("delete the conversation record"))?;
        Ok(n > 0)
    }

    /// Every conversation, or only `tenant`'s, most recently used first.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails or a stored row is malformed.
    pub fn list(&self, tenant: Option<&TenantId>) -> Result<Vec<ConversationRecord>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(&format!(
                "SELECT {RECORD_COLUMNS} FROM conversations WHERE ?1 IS NULL OR tenant = ?1
                 ORDER BY last_used_at DESC, key"
            ))
            .map_err(sql_error("list conversations"))?;
        let rows = stmt
            .query_map([tenant.map(TenantId::as_str)], record)
            .map_err(sql_error("list conversations"))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(sql_error("list conversations"))
    }

    /// Appends an entry to the audit log.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn audit(&self, entry: &AuditEntry) -> Result<()> {
        self.conn()
            .execute(
                "INSERT INTO audit (at, tenant, conversation_key, operation, outcome, detail)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    entry.at.timestamp_millis(),
                    entry.tenant.as_str(),
                    entry.conversation_key.as_ref().map(ConversationKey::as_str),
                    entry.operation,
                    entry.outcome,
                    entry.detail
                ],
            )
            .map_err(sql_error("append to the audit log"))?;
        Ok(())
    }

    /// Appends `entries` to the audit log in one transaction: all or none.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn audit_many(&self, entries: &[AuditEntry]) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql_error("start a transaction"))?;
        {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO audit (at, tenant, conversation_key, operation, outcome, detail)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(sql_error("append to the audit log"))?;
            for entry in entries {
                stmt.execute(params![
                    entry.at.timestamp_millis(),
                    entry.tenant.as_str(),
                    entry.conversation_key.as_ref().map(ConversationKey::as_str),
                    entry.operation,
                    entry.outcome,
                    entry.detail
                ])
                .map_err(sql_error("append to the audit log"))?;
            }
        }
        tx.commit().map_err(sql_error("append to the audit log"))
    }

    /// How often each operation ran on conversation `key` since `since` (its creation), from
    /// the audit log: `(operation, count)` pairs sorted by operation. Only the manager's
    /// operation records are counted, not the front ends' `http.*` and `mcp.*` records.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn operation_counts(
        &self,
        key: &ConversationKey,
        since: DateTime<Utc>,
    ) -> Result<Vec<(String, u64)>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(
                "SELECT operation, COUNT(*) FROM audit
                 WHERE conversation_key = ?1 AND at >= ?2
                   AND operation NOT LIKE 'http.%' AND operation NOT LIKE 'mcp.%'
                 GROUP BY operation ORDER BY operation",
            )
            .map_err(sql_error("count the conversation's operations"))?;
        let rows = stmt
            .query_map(params![key.as_str(), since.timestamp_millis()], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?.max(0) as u64))
            })
            .map_err(sql_error("count the conversation's operations"))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(sql_error("count the conversation's operations"))
    }

    /// Audit entries matching `filter`, newest first (by time, then by append order).
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails or a stored row is malformed.
    pub fn audit_log(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>> {
        let limit = filter
            .limit
            .map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT id, at, tenant, conversation_key, operation, outcome, detail FROM audit
                 WHERE (?1 IS NULL OR tenant = ?1) AND (?2 IS NULL OR conversation_key = ?2)
                   AND (?4 IS NULL OR at >= ?4)
                 ORDER BY at DESC, id DESC LIMIT ?3",
            )
            .map_err(sql_error("read the audit log"))?;
        let rows = stmt
            .query_map(
                params![
                    filter.tenant.as_ref().map(TenantId::as_str),
                    filter.key.as_ref().map(ConversationKey::as_str),
                    limit,
                    filter.since.map(|t| t.timestamp_millis())
                ],
                audit_record,
            )
            .map_err(sql_error("read the audit log"))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(sql_error("read the audit log"))
    }

    /// The conversation's sandbox uid: the one it already has, else the lowest uid in `range`
    /// that no other conversation holds. A uid stays with its conversation until the record is
    /// deleted, then it is free again.
    ///
    /// # Errors
    /// - [`Error::InvalidRequest`] when `range` is empty.
    /// - [`Error::NotFound`] when there is no such conversation.
    /// - [`Error::Conflict`] when every uid in `range` is taken.
    /// - [`Error::Backend`] when SQLite fails.
    pub fn allocate_uid(&self, key: &ConversationKey, range: Range<u32>) -> Result<u32> {
        if range.is_empty() {
            return Err(Error::InvalidRequest(format!(
                "the sandbox uid range {}..{} is empty",
                range.start, range.end
            )));
        }
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql_error("start a transaction"))?;
        let held: Option<u32> = tx
            .query_row(
                "SELECT uid FROM sandbox_uids WHERE conversation_key = ?1",
                [key.as_str()],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql_error("read the sandbox uid"))?;
        if let Some(uid) = held {
            return Ok(uid);
        }
        if select(&tx, key)?.is_none() {
            return Err(not_found(key));
        }
        let mut next = range.start;
        {
            let mut stmt = tx
                .prepare("SELECT uid FROM sandbox_uids WHERE uid >= ?1 AND uid < ?2 ORDER BY uid")
                .map_err(sql_error("read the sandbox uids"))?;
            let taken = stmt
                .query_map([range.start, range.end], |r| r.get::<_, u32>(0))
                .map_err(sql_error("read the sandbox uids"))?;
            for uid in taken {
                if uid.map_err(sql_error("read the sandbox uids"))? != next {
                    break;
                }
                next += 1;
            }
        }
        if next >= range.end {
            return Err(Error::Conflict(format!(
                "all {} sandbox uids in {}..{} are in use; destroy idle conversations or widen \
                 the range",
                range.end - range.start,
                range.start,
                range.end
            )));
        }
        tx.execute(
            "INSERT INTO sandbox_uids (uid, conversation_key) VALUES (?1, ?2)",
            params![next, key.as_str()],
        )
        .map_err(sql_error("allocate a sandbox uid"))?;
        tx.commit().map_err(sql_error("allocate a sandbox uid"))?;
        Ok(next)
    }

    /// Runs `UPDATE conversations SET {set} WHERE key = ?1` with `?2 = value`.
    fn update(&self, key: &ConversationKey, set: &str, value: impl rusqlite::ToSql) -> Result<()> {
        let n = self
            .conn()
            .execute(
                &format!("UPDATE conversations SET {set} WHERE key = ?1"),
                params![key.as_str(), value],
            )
            .map_err(sql_error("update the conversation record"))?;
        if n == 0 {
            return Err(not_found(key));
        }
        Ok(())
    }

    /// The connection. A panic while it was held cannot leave a transaction open (dropping a
    /// `Transaction` rolls it back), so a poisoned lock is safe to take.
    pub(crate) fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn select(conn: &Connection, key: &ConversationKey) -> Result<Option<ConversationRecord>> {
    conn.query_row(
        &format!("SELECT {RECORD_COLUMNS} FROM conversations WHERE key = ?1"),
        [key.as_str()],
        record,
    )
    .optional()
    .map_err(sql_error("read the conversation record"))
}

pub(crate) fn not_found_key(key: &ConversationKey) -> Error {
    not_found(key)
}

fn not_found(key: &ConversationKey) -> Error {
    Error::NotFound(format!("conversation {key}"))
}

/// Reads a row of [`RECORD_COLUMNS`].
fn record(r: &Row<'_>) -> rusqlite::Result<ConversationRecord> {
    Ok(ConversationRecord {
        key: check(0, ConversationKey::parse(&r.get::<_, String>(0)?))?,
        tenant: check(1, r.get::<_, String>(1)?.parse())?,
        conversation_id: check(2, r.get::<_, String>(2)?.parse())?,
        runtime: r.get(3)?,
        sandbox_ref: r.get(4)?,
        state: check(5, r.get::<_, String>(5)?.parse())?,
        created_at: time(r, 6)?,
        last_used_at: time(r, 7)?,
        expires_at: r
            .get::<_, Option<i64>>(8)?
            .map(|_| time(r, 8))
            .transpose()?,
    })
}

fn audit_record(r: &Row<'_>) -> rusqlite::Result<AuditRecord> {
    Ok(AuditRecord {
        id: r.get(0)?,
        entry: AuditEntry {
            at: time(r, 1)?,
            tenant: check(2, r.get::<_, String>(2)?.parse())?,
            conversation_key: r
                .get::<_, Option<String>>(3)?
                .map(|k| check(3, ConversationKey::parse(&k)))
                .transpose()?,
            operation: r.get(4)?,
            outcome: r.get(5)?,
            detail: r.get(6)?,
        },
    })
}

/// Reads column `i` (unix milliseconds) as a time.
pub(crate) fn time(r: &Row<'_>, i: usize) -> rusqlite::Result<DateTime<Utc>> {
    let ms: i64 = r.get(i)?;
    check(
        i,
        DateTime::from_timestamp_millis(ms)
            .ok_or_else(|| Error::Backend(format!("time {ms} ms is out of range"))),
    )
}

/// Turns a malformed stored value into a rusqlite conversion error for column `i`.
pub(crate) fn check<T>(i: usize, value: Result<T>) -> rusqlite::Result<T> {
    value.map_err(|e| rusqlite::Error::FromSqlConversionFailure(i, Type::Text, Box::new(e)))
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Maps a SQLite error to [`Error::Backend`] saying what could not be done. The message holds
/// SQLite's own text (never parameter values); a lock held past [`BUSY_TIMEOUT`] gets a hint.
pub(crate) fn sql_error(doing: &str) -> impl FnOnce(rusqlite::Error) -> Error + '_ {
    move |e| {
        if is_busy(&e) {
            Error::Backend(format!(
                "could not {doing}: the store stayed locked by another connection for more than \
                 {} s; retry, or look for a stuck sessionbox process holding it",
                BUSY_TIMEOUT.as_secs()
            ))
        } else {
            Error::Backend(format!("could not {doing}: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_held_past_the_timeout_gets_a_hint() {
        let busy = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(5), None);
        let msg = sql_error("commit")(busy).to_string();
        assert!(
            msg.contains("could not commit") && msg.contains("stuck"),
            "{msg}"
        );
        let other = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(11), None);
        assert!(!sql_error("commit")(other).to_string().contains("stuck"));
    }
}
