//! The conversation store of sessionbox: which conversations exist, which runtime owns each,
//! the audit log, per-conversation sandbox uids, and the records of workspace snapshots and
//! templates (the archives themselves are files the manager keeps).
//!
//! One [`Store`] has one of two backends, with the same semantics:
//!
//! - **SQLite** ([`Store::open`]): one file (WAL mode, foreign keys on, a [`BUSY_TIMEOUT`] wait
//!   for locks), so several processes on one machine — a CLI and a server — can share it. Every
//!   write runs in one IMMEDIATE transaction. [`Store::backup`] copies it online.
//! - **PostgreSQL** ([`Store::connect`], a `postgres://` URL): shared by several server
//!   replicas. Writes that decide something (create, claim, allocate) take a transaction-level
//!   advisory lock on the conversation (or on its tenant, or a global one), so replicas decide
//!   one at a time.
//!
//! Either way, two processes racing to create one conversation make exactly one record, and a
//! crash mid-operation leaves the previous state. [`Store::lock_conversation`] holds a
//! conversation for a whole operation across processes (and, with PostgreSQL, replicas).
//!
//! The schema is an append-only list of numbered migrations (see [`SCHEMA_VERSION`]), each in
//! both dialects; opening an older database upgrades it, opening a newer one is refused.
//!
//! The API is sync and backend-neutral (no SQL in it). Async callers go through [`Store::run`],
//! which moves a call off the async runtime (the PostgreSQL client blocks its thread too). Every error is a [`sessionbox_core::Error`]: database
//! failures become [`Error::Backend`] naming what was being done, never a password.
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

mod audit;
mod backup;
mod bootstraps;
pub mod clock;
mod conversations;
mod db;
mod egress;
mod expired;
mod keys;
mod locks;
mod pg;
mod pg_tls;
mod pool;
mod remote;
mod retention;
mod schema;
mod snapshots;
mod types;
mod uids;

use std::fs::{DirBuilder, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rusqlite::{Connection, ErrorCode, TransactionBehavior};
use sessionbox_core::{ConversationKey, Error, Result, TenantId};

use crate::db::{Db, Lite, Pg};
use crate::pg::PgBackend;

pub(crate) use conversations::not_found_key;

pub use bootstraps::{BootstrapRecord, BootstrapState};
pub use clock::{Clock, SystemClock};
pub use conversations::OrphanClaim;
pub use egress::{EgressLogEntry, EgressLogFilter, EgressLogRecord, PolicyScope, StoredPolicy};
pub use expired::ExpiredNotice;
pub use keys::{API_KEY_PREFIX, ApiKeyRecord, KeyCheck, KeyOptions, NewApiKey};
pub use locks::ConversationLock;
pub use retention::{LogRetention, LogsPruned, MAX_LOG_TEXT, PRUNE_BATCH};
pub use schema::SCHEMA_VERSION;
/// A conversation's remote sandbox, as recorded (core's type, so runtimes see it without the store).
pub use sessionbox_core::{RemotePoolSlot, RemoteSandbox};
pub use snapshots::{MAX_SNAPSHOT_ID_BYTES, SnapshotRecord};
pub use types::{
    AuditEntry, AuditFilter, AuditRecord, ConversationRecord, ConversationState, Lifecycle,
    LifecyclePolicy,
};

/// How long an operation waits for another connection's lock before failing: 10 s.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Prepared statements a SQLite connection keeps (more than the store has).
const STATEMENT_CACHE: usize = 256;
/// Pages of write-ahead log after which a commit checkpoints it (see `Store::setup`).
const WAL_CHECKPOINT_PAGES: i64 = 128;
/// The write-ahead log's file is cut back to this after a checkpoint, bytes.
const WAL_LIMIT_BYTES: i64 = 1 << 20;

/// The environment variable naming a PostgreSQL store (`postgres://...`), read by the CLI.
pub const STORE_URL_ENV: &str = "SESSIONBOX_STORE_URL";

/// The conversation store. Cheap to clone (clones share one connection or pool); `Send + Sync`.
#[derive(Debug, Clone)]
pub struct Store {
    backend: Backend,
    /// The store's clock (see [`clock`]), shared by every clone.
    clock: clock::SharedClock,
}

#[derive(Debug, Clone)]
enum Backend {
    Sqlite {
        conn: Arc<Mutex<Connection>>,
        /// The file, `None` in memory.
        path: Option<PathBuf>,
    },
    Postgres(Arc<PgBackend>),
}

/// What a write transaction locks first (PostgreSQL only; SQLite's IMMEDIATE transactions are
/// serialized anyway).
enum TxLock<'a> {
    None,
    Record(&'a ConversationKey),
    Tenant(&'a TenantId),
    Global(i32),
}

impl Store {
    /// Opens the SQLite store at `path`, creating its parent directories (mode 0700) and the
    /// file (mode 0600) when missing, and migrating the schema to [`SCHEMA_VERSION`].
    ///
    /// # Errors
    /// [`Error::Backend`] when the directory or file cannot be made or opened, when the schema
    /// is newer than this build, or when a migration fails.
    pub fn open(path: &Path) -> Result<Store> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            create_private_dir(dir)?;
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
        Store::setup(conn, Some(path.to_owned()))
    }

    /// A private store in memory, for tests. Clones share it; it is gone when the last is
    /// dropped.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn open_in_memory() -> Result<Store> {
        let conn = Connection::open_in_memory().map_err(sql_error("open a store in memory"))?;
        Store::setup(conn, None)
    }

    /// Connects to the PostgreSQL store at `url` (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB`,
    /// or a `key=value` connection string) and migrates its schema to [`SCHEMA_VERSION`].
    /// Replicas connecting at once migrate once. The URL is never logged nor put in an error.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a malformed URL; [`Error::Backend`] when the server cannot
    /// be reached, the schema is newer than this build, or a migration fails.
    pub fn connect(url: &str) -> Result<Store> {
        let backend = Arc::new(PgBackend::connect(url)?);
        backend.with_client(schema::migrate_pg)?;
        let clock = clock::ServerClock::new(backend.clone())?;
        Ok(Store {
            backend: Backend::Postgres(backend),
            clock: clock::SharedClock::new(Arc::new(clock)),
        })
    }

    /// The store `url` names when it is given (a `postgres://` or `postgresql://` URL), else
    /// the SQLite file `sqlite_path`.
    ///
    /// # Errors
    /// As [`Store::connect`] and [`Store::open`]; [`Error::InvalidRequest`] for a URL of
    /// another scheme.
    pub fn open_configured(url: Option<&str>, sqlite_path: &Path) -> Result<Store> {
        match url.filter(|u| !u.is_empty()) {
            None => Store::open(sqlite_path),
            Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => {
                Store::connect(u)
            }
            Some(_) => Err(Error::InvalidRequest(
                "the store URL must start with postgres:// or postgresql:// (leave it unset for \
                 the SQLite store in the data directory)"
                    .into(),
            )),
        }
    }

    fn setup(mut conn: Connection, path: Option<PathBuf>) -> Result<Store> {
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
        // Every commit waits for the disk (the write-ahead log synced), except the audit log's
        // (see `Store::write_unsynced`).
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sql_error("set the commit durability"))?;
        // The last connection to close leaves the write-ahead log as it is instead of copying
        // it into the database and syncing both (two disk syncs on every one-off CLI call).
        // Nothing is less durable: every commit is in the synced log, which the next opener
        // reads. That opener first rebuilds the log's index from the whole log, so the log is
        // kept short: a checkpoint every WAL_CHECKPOINT_PAGES pages (SQLite's default, 1000
        // pages, made each one-off open read up to 4 MiB), and the file cut back to
        // WAL_LIMIT_BYTES after one. A copy of the database file alone is then not a backup:
        // `sessionbox backup` is.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .map_err(sql_error("keep the log on close"))?;
        conn.pragma_update(None, "wal_autocheckpoint", WAL_CHECKPOINT_PAGES)
            .map_err(sql_error("set the checkpoint interval"))?;
        conn.query_row(
            &format!("PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}"),
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(sql_error("limit the log's size"))?;
        schema::migrate(&mut conn)?;
        // Every statement the store runs stays prepared (rusqlite keeps 16 by default, fewer
        // than the store has, so a busy server would parse some again on every call).
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        Ok(Store {
            backend: Backend::Sqlite {
                conn: Arc::new(Mutex::new(conn)),
                path,
            },
            clock: clock::SharedClock::new(Arc::new(SystemClock)),
        })
    }

    /// True when the store is shared between machines (PostgreSQL): another replica may change
    /// any record at any time, so nothing read from it may be cached as still true.
    pub fn is_shared(&self) -> bool {
        matches!(self.backend, Backend::Postgres(_))
    }

    /// `sqlite FILE`, `sqlite (memory)` or `postgresql HOST:PORT/DB` (never a password).
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Sqlite { path: Some(p), .. } => format!("sqlite {}", p.display()),
            Backend::Sqlite { path: None, .. } => "sqlite (memory)".to_owned(),
            Backend::Postgres(pg) => format!("postgresql {}", pg.label),
        }
    }

    /// The schema version of the database; [`SCHEMA_VERSION`] after a successful open unless
    /// another process has since upgraded it.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn schema_version(&self) -> Result<u32> {
        match &self.backend {
            Backend::Sqlite { conn, .. } => lock(conn)
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .map_err(sql_error("read the schema version")),
            Backend::Postgres(pg) => pg.with_client_again(schema::version_pg),
        }
    }

    /// Runs `f` outside a transaction. `f` may run twice with PostgreSQL (once more on a new
    /// connection when one from the pool turned out dead, see `pg`): it reads, or makes a
    /// change that is the same when made again.
    fn read<T>(&self, f: impl Fn(&mut dyn Db) -> Result<T>) -> Result<T> {
        match &self.backend {
            Backend::Sqlite { conn, .. } => f(&mut Lite(&lock(conn))),
            Backend::Postgres(pg) => pg.with_client_again(|c| f(&mut Pg(c))),
        }
    }

    /// Runs `f` in one write transaction (IMMEDIATE in SQLite; in PostgreSQL after taking
    /// `lock`), committed when `f` succeeds and rolled back when it fails.
    fn write<T>(
        &self,
        doing: &str,
        tx_lock: TxLock<'_>,
        f: impl FnOnce(&mut dyn Db) -> Result<T>,
    ) -> Result<T> {
        match &self.backend {
            Backend::Sqlite { conn, .. } => {
                let mut conn = lock(conn);
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(sql_error("start a transaction"))?;
                let out = f(&mut Lite(&tx))?;
                tx.commit().map_err(sql_error(doing))?;
                Ok(out)
            }
            Backend::Postgres(pg) => pg.with_transaction(|mut tx| {
                let (class, id) = match tx_lock {
                    TxLock::None => (0, 0),
                    TxLock::Record(key) => (pg::CLASS_RECORD, pg::key_id(key)),
                    TxLock::Tenant(tenant) => (pg::CLASS_TENANT, pg::tenant_id(tenant)),
                    TxLock::Global(id) => (pg::CLASS_GLOBAL, id),
                };
                if class != 0 {
                    tx.execute("SELECT pg_advisory_xact_lock($1, $2)", &[&class, &id])
                        .map_err(pg::pg_error("lock the record"))?;
                }
                let out = f(&mut Pg(&mut tx))?;
                tx.commit().map_err(pg::pg_error(doing))?;
                Ok(out)
            }),
        }
    }

    /// Runs `f` in one write transaction whose commit does not wait for the disk: for records
    /// a machine's power loss may take back, but a crash of this process may not (the audit
    /// log).
    ///
    /// SQLite: `synchronous = NORMAL` for this commit alone (every other commit is `FULL`, the
    /// write-ahead log synced before it returns). The commit is in the write-ahead log when
    /// this returns, so it outlives a crash or `kill -9` of this process like any other (SQLite
    /// recovers committed transactions from the log whatever the setting); only a power loss
    /// or kernel crash before the next synced commit (any other write, or a checkpoint, syncs
    /// the log up to its end) can take it back, in order, never a record older than the last
    /// synced commit. The saving is the `fsync` of every operation's record (0.3 ms on the
    /// bench's disk against 0.01 ms for the insert).
    ///
    /// PostgreSQL: a plain transaction ([`Store::write`] without a lock), synced by the server.
    fn write_unsynced<T>(
        &self,
        doing: &str,
        f: impl FnOnce(&mut dyn Db) -> Result<T>,
    ) -> Result<T> {
        match &self.backend {
            Backend::Sqlite { conn, .. } => {
                let mut conn = lock(conn);
                conn.pragma_update(None, "synchronous", "NORMAL")
                    .map_err(sql_error("relax the commit durability"))?;
                let out = (|| {
                    let tx = conn
                        .transaction_with_behavior(TransactionBehavior::Immediate)
                        .map_err(sql_error("start a transaction"))?;
                    let out = f(&mut Lite(&tx))?;
                    tx.commit().map_err(sql_error(doing))?;
                    Ok(out)
                })();
                // Back to synced commits before anything else uses the connection, whatever
                // `f` did.
                conn.pragma_update(None, "synchronous", "FULL")
                    .map_err(sql_error("restore the commit durability"))?;
                out
            }
            Backend::Postgres(_) => self.write(doing, TxLock::None, f),
        }
    }

    /// Runs the blocking store call `f` off the async runtime (on tokio's blocking pool) and
    /// waits for it: the one place that moves store work off async threads. Every store call
    /// blocks its thread (SQLite, and the PostgreSQL client too), so async code wraps each
    /// call, or a few that belong together, in one `run`. `f` gets a clone of this store
    /// (clones share one connection or pool).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> sessionbox_core::Result<()> {
    /// use chrono::Utc;
    /// use sessionbox_core::ConversationRef;
    /// use sessionbox_store::Store;
    ///
    /// let store = Store::open_in_memory()?;
    /// let conv = ConversationRef::parse("acme", "thread-1")?;
    /// let key = conv.key.clone();
    /// store.run(move |s| s.get_or_create(&conv, "host", Utc::now())).await?;
    /// let record = store.run(move |s| s.get(&key)).await?;
    /// assert_eq!(record.unwrap().runtime, "host");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// What `f` returns; [`Error::Backend`] when the task panicked or was cancelled.
    pub fn run<T, F>(&self, f: F) -> impl Future<Output = Result<T>> + Send + 'static
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> Result<T> + Send + 'static,
    {
        let store = self.clone();
        async move {
            tokio::task::spawn_blocking(move || f(&store))
                .await
                .map_err(|e| Error::Backend(format!("a store task failed: {e}")))?
        }
    }
}

/// The connection. A panic while it was held cannot leave a transaction open (dropping a
/// `Transaction` rolls it back), so a poisoned lock is safe to take.
fn lock(conn: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    conn.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn create_private_dir(dir: &Path) -> Result<()> {
    let mut builder = DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|e| {
        Error::Backend(format!(
            "could not create the store directory {}: {e}",
            dir.display()
        ))
    })
}

/// Unix milliseconds as a time.
pub(crate) fn time(ms: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| Error::Backend(format!("time {ms} ms is out of range")))
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Maps a SQLite error to [`Error::Backend`] saying what could not be done. The message holds
/// SQLite's own text (never parameter values); a lock held past [`BUSY_TIMEOUT`] gets a hint.
/// A full disk is [`Error::Unavailable`]: the transaction was rolled back, nothing changed, and
/// the same call succeeds once space is freed.
pub(crate) fn sql_error(doing: &str) -> impl FnOnce(rusqlite::Error) -> Error + '_ {
    move |e| {
        if e.sqlite_error_code() == Some(ErrorCode::DiskFull) {
            return Error::Unavailable(format!(
                "could not {doing}: the disk holding the store is full; free space on it"
            ));
        }
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

    #[test]
    fn a_full_disk_is_unavailable_not_a_backend_failure() {
        let full = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(13), None);
        let e = sql_error("commit")(full);
        assert_eq!(e.code(), "unavailable", "{e}");
        assert!(
            e.to_string().contains("disk holding the store is full"),
            "{e}"
        );
    }
}
