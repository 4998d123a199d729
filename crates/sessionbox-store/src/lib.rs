//! The conversation store of sessionbox: which conversations exist, which runtime owns each,
//! the audit log, and per-conversation sandbox uids.
//!
//! One [`Store`] has one of two backends, with the same semantics:
//!
//! - **SQLite** ([`Store::open`]): one file (WAL mode, foreign keys on, a [`BUSY_TIMEOUT`] wait
//!   for locks), so several processes on one machine — a CLI and a server — can share it. Every
//!   write runs in one IMMEDIATE transaction. [`Store::backup`] copies it online.
//! - **PostgreSQL** ([`Store::connect`], a `postgres://` URL): shared by several server
//!   replicas. Writes that decide something (create, claim, allocate) take a transaction-level
//!   advisory lock on the conversation (or a global one), so replicas decide one at a time.
//!
//! Either way, two processes racing to create one conversation make exactly one record, and a
//! crash mid-operation leaves the previous state. [`Store::lock_conversation`] holds a
//! conversation for a whole operation across processes (and, with PostgreSQL, replicas).
//!
//! The schema is an append-only list of numbered migrations (see [`SCHEMA_VERSION`]), each in
//! both dialects; opening an older database upgrades it, opening a newer one is refused.
//!
//! The API is sync and backend-neutral (no SQL in it). Async callers use `spawn_blocking` (the
//! PostgreSQL client blocks its thread). Every error is a [`sessionbox_core::Error`]: database
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

mod bootstraps;
mod db;
mod egress;
mod expired;
mod keys;
mod pg;
mod remote;
mod schema;
mod types;

use std::fs::{DirBuilder, File, OpenOptions};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rusqlite::{Connection, ErrorCode, TransactionBehavior};
use sessionbox_core::{ConversationKey, ConversationRef, Error, Result, TenantId};

use crate::db::{Db, Lite, Pg, Row, Val};
use crate::pg::PgBackend;

pub use bootstraps::{BootstrapRecord, BootstrapState};
pub use egress::{EgressLogEntry, EgressLogFilter, EgressLogRecord, PolicyScope, StoredPolicy};
pub use expired::ExpiredNotice;
pub use keys::{API_KEY_PREFIX, ApiKeyRecord, NewApiKey};
pub use remote::RemoteSandbox;
pub use schema::SCHEMA_VERSION;
pub use types::{
    AuditEntry, AuditFilter, AuditRecord, ConversationRecord, ConversationState, Lifecycle,
    LifecyclePolicy,
};

/// How long an operation waits for another connection's lock before failing: 10 s.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment variable naming a PostgreSQL store (`postgres://...`), read by the CLI.
pub const STORE_URL_ENV: &str = "SESSIONBOX_STORE_URL";

/// The conversation store. Cheap to clone (clones share one connection or pool); `Send + Sync`.
#[derive(Debug, Clone)]
pub struct Store {
    backend: Backend,
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
    Global(i32),
}

/// A conversation held for one operation by [`Store::lock_conversation`]; released on drop.
#[must_use = "the conversation is held only while the guard lives"]
pub struct ConversationLock {
    _inner: LockInner,
}

enum LockInner {
    None,
    File(#[allow(dead_code)] File),
    Pg(#[allow(dead_code)] Box<pg::PgLock>),
}

impl std::fmt::Debug for ConversationLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConversationLock")
    }
}

/// What [`Store::claim_orphan`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrphanClaim {
    /// No record exists: the key is claimed, and no record can be made for it until
    /// [`Store::release_orphan`].
    Claimed,
    /// A record exists: not an orphan.
    HasRecord,
}

const RECORD_COLUMNS: &str = "key, tenant, conversation_id, runtime, sandbox_ref, state, \
                              created_at, last_used_at, expires_at, idle_timeout_ms, ttl_ms, \
                              max_lifetime_ms, generation, state_since";

/// How many lock files stripe the conversations of a SQLite store.
const LOCK_STRIPES: usize = 4096;

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
        Ok(Store {
            backend: Backend::Postgres(backend),
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
        schema::migrate(&mut conn)?;
        Ok(Store {
            backend: Backend::Sqlite {
                conn: Arc::new(Mutex::new(conn)),
                path,
            },
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
            Backend::Postgres(pg) => pg.with_client(schema::version_pg),
        }
    }

    /// Runs `f` outside a transaction.
    fn read<T>(&self, f: impl FnOnce(&mut dyn Db) -> Result<T>) -> Result<T> {
        match &self.backend {
            Backend::Sqlite { conn, .. } => f(&mut Lite(&lock(conn))),
            Backend::Postgres(pg) => pg.with_client(|c| f(&mut Pg(c))),
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
            Backend::Postgres(pg) => pg.with_client(|c| {
                let mut tx = c
                    .transaction()
                    .map_err(pg::pg_error("start a transaction"))?;
                let (class, id) = match tx_lock {
                    TxLock::None => (0, 0),
                    TxLock::Record(key) => (pg::CLASS_RECORD, pg::key_id(key)),
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

    /// Holds `key` for one operation across threads, processes and (with PostgreSQL) replicas:
    /// a second caller waits until the guard drops. Blocks; async callers use `spawn_blocking`.
    ///
    /// With SQLite it is an exclusive `flock` on one of [`LOCK_STRIPES`] files beside the
    /// database (`locks/`), so two conversations may share a stripe and wait for each other;
    /// an in-memory store holds nothing across processes (and returns at once). With
    /// PostgreSQL it is a session-level advisory lock on a connection of its own, released
    /// with the session if the process dies.
    ///
    /// Not reentrant: a holder that asks again for the same conversation waits forever.
    ///
    /// # Errors
    /// [`Error::Backend`] when the lock cannot be taken.
    pub fn lock_conversation(&self, key: &ConversationKey) -> Result<ConversationLock> {
        let inner = match &self.backend {
            Backend::Sqlite { path: None, .. } => LockInner::None,
            Backend::Sqlite {
                path: Some(path), ..
            } => {
                let f = stripe_file(path, key)?;
                rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
                    .map_err(|e| Error::Backend(format!("cannot lock a stripe: {e}")))?;
                LockInner::File(f)
            }
            Backend::Postgres(pg) => {
                LockInner::Pg(Box::new(pg.lock(pg::CLASS_OPERATION, pg::key_id(key))?))
            }
        };
        Ok(ConversationLock { _inner: inner })
    }

    /// [`Store::lock_conversation`] without waiting: `None` when another holder has it.
    ///
    /// # Errors
    /// [`Error::Backend`] when the lock cannot be tried.
    pub fn try_lock_conversation(&self, key: &ConversationKey) -> Result<Option<ConversationLock>> {
        let inner = match &self.backend {
            Backend::Sqlite { path: None, .. } => LockInner::None,
            Backend::Sqlite {
                path: Some(path), ..
            } => {
                let f = stripe_file(path, key)?;
                match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                    Ok(()) => LockInner::File(f),
                    Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
                    Err(e) => return Err(Error::Backend(format!("cannot lock a stripe: {e}"))),
                }
            }
            Backend::Postgres(pg) => match pg.try_lock(pg::CLASS_OPERATION, pg::key_id(key))? {
                Some(l) => LockInner::Pg(Box::new(l)),
                None => return Ok(None),
            },
        };
        Ok(Some(ConversationLock { _inner: inner }))
    }

    /// Returns the conversation's record, creating it (state `active`, created and last used at
    /// `now`, no sandbox, no expiry) when there is none. The boolean is true when this call made
    /// it: of any number of concurrent first calls, from threads or processes, exactly one sees
    /// `true`. An existing record is returned as it is (not touched; it may be `destroying`, or
    /// expired).
    ///
    /// # Errors
    /// As [`Store::get_or_create_with`].
    pub fn get_or_create(
        &self,
        conv: &ConversationRef,
        runtime: &str,
        now: DateTime<Utc>,
    ) -> Result<(ConversationRecord, bool)> {
        self.get_or_create_with(conv, runtime, now, &Lifecycle::default())
    }

    /// [`Store::get_or_create`] with the lifecycle a new record gets: its idle timeout, time to
    /// live and maximum lifetime are stored, and `expires_at` is set from them. An existing
    /// record keeps its own.
    ///
    /// # Errors
    /// - [`Error::Conflict`] when the conversation exists under another runtime: it must be
    ///   destroyed before it can use `runtime`.
    /// - [`Error::Busy`] when garbage collection is clearing what an earlier conversation of
    ///   this key left behind (retry in a moment).
    /// - [`Error::InvalidRequest`] when `runtime` is empty or `conv.key` is not derived from
    ///   its tenant and id.
    /// - [`Error::Backend`] when the database fails.
    pub fn get_or_create_with(
        &self,
        conv: &ConversationRef,
        runtime: &str,
        now: DateTime<Utc>,
        lifecycle: &Lifecycle,
    ) -> Result<(ConversationRecord, bool)> {
        if runtime.is_empty() {
            return Err(Error::InvalidRequest("the runtime name is empty".into()));
        }
        if conv.key != ConversationKey::derive(&conv.tenant, &conv.id) {
            return Err(Error::InvalidRequest(
                "the conversation key does not match its tenant and id".into(),
            ));
        }
        let now_ms = now.timestamp_millis();
        let ms = |d: Option<Duration>| d.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let (idle, ttl, max) = (
            ms(lifecycle.idle_timeout),
            ms(lifecycle.ttl),
            ms(lifecycle.max_lifetime),
        );
        let expires = [ttl, max]
            .into_iter()
            .flatten()
            .map(|d| now_ms.saturating_add(d))
            .min();
        let generation = random_generation()?;
        self.write(
            "commit the conversation record",
            TxLock::Record(&conv.key),
            |db| {
                let inserted = db.execute(
                    "create the conversation record",
                    "INSERT INTO conversations (key, tenant, conversation_id, runtime, sandbox_ref,
                         state, created_at, last_used_at, expires_at, idle_timeout_ms, ttl_ms,
                         max_lifetime_ms, generation)
                     SELECT CAST($1 AS TEXT), CAST($2 AS TEXT), CAST($3 AS TEXT),
                            CAST($4 AS TEXT), NULL, 'active', CAST($5 AS BIGINT),
                            CAST($5 AS BIGINT), CAST($6 AS BIGINT), CAST($7 AS BIGINT),
                            CAST($8 AS BIGINT), CAST($9 AS BIGINT), CAST($10 AS BIGINT)
                     WHERE NOT EXISTS (SELECT 1 FROM gc_claims WHERE key = $1)
                     ON CONFLICT DO NOTHING",
                    &[
                        conv.key.as_str().into(),
                        conv.tenant.as_str().into(),
                        conv.id.as_str().into(),
                        runtime.into(),
                        now_ms.into(),
                        expires.into(),
                        idle.into(),
                        ttl.into(),
                        max.into(),
                        generation.into(),
                    ],
                )?;
                let Some(record) = select(db, &conv.key)? else {
                    if inserted == 0 {
                        return Err(Error::Busy(format!(
                            "conversation {}/{} is being cleaned up after an earlier one of the \
                             same id; retry in a moment",
                            conv.tenant, conv.id
                        )));
                    }
                    return Err(Error::Backend(format!(
                        "conversation {}/{} is stored under another key than {}",
                        conv.tenant, conv.id, conv.key
                    )));
                };
                if record.runtime != runtime {
                    return Err(Error::Conflict(format!(
                        "conversation {}/{} belongs to the {} runtime; destroy it first to use it \
                         with the {runtime} runtime",
                        conv.tenant, conv.id, record.runtime
                    )));
                }
                Ok((record, inserted == 1))
            },
        )
    }

    /// The record of `key`, or `None`.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails or the stored row is malformed.
    pub fn get(&self, key: &ConversationKey) -> Result<Option<ConversationRecord>> {
        self.read(|db| select(db, key))
    }

    /// Records a use at `now` and renews the conversation: `last_used_at` moves to `now` (never
    /// back), and `expires_at` to `now + ttl` (never past `created_at + max_lifetime`) when the
    /// conversation has a time to live.
    ///
    /// A conversation that has expired, or is being destroyed, is not renewed: renewing and
    /// expiring decide in one statement each, so exactly one of a racing renew and a garbage
    /// collection's [`Store::claim_expired`] wins.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such conversation, or it has expired;
    /// [`Error::Busy`] when it is being destroyed; [`Error::Backend`].
    pub fn touch(&self, key: &ConversationKey, now: DateTime<Utc>) -> Result<()> {
        let now_ms = now.timestamp_millis();
        let n = self.read(|db| {
            db.execute(
                "renew the conversation",
                "UPDATE conversations SET
                     last_used_at = CASE WHEN last_used_at > $2 THEN last_used_at ELSE $2 END,
                     expires_at = CASE
                         WHEN ttl_ms IS NULL THEN expires_at
                         WHEN max_lifetime_ms IS NOT NULL
                              AND created_at + max_lifetime_ms < $2 + ttl_ms
                             THEN created_at + max_lifetime_ms
                         ELSE $2 + ttl_ms END
                 WHERE key = $1 AND state = 'active' AND (expires_at IS NULL OR expires_at > $2)",
                &[key.as_str().into(), now_ms.into()],
            )
        })?;
        if n == 1 {
            return Ok(());
        }
        match self.get(key)? {
            None => Err(not_found(key)),
            Some(r) if r.state == ConversationState::Destroying => Err(Error::Busy(format!(
                "conversation {} is being destroyed",
                r.conversation_id
            ))),
            Some(r) => Err(Error::NotFound(format!(
                "conversation {} expired at {}",
                r.conversation_id,
                r.expires_at.map_or_else(String::new, |t| t
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            ))),
        }
    }

    /// Claims an expired conversation for destruction: sets its state to `destroying` if, at
    /// `now`, it is `active` and expired. True when this call claimed it; a racing
    /// [`Store::touch`] that renewed it first makes this false. The claimer destroys the
    /// runtime's side and then [`Store::delete`]s the record.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn claim_expired(&self, key: &ConversationKey, now: DateTime<Utc>) -> Result<bool> {
        self.write(
            "claim the expired conversation",
            TxLock::Record(key),
            |db| {
                Ok(db.execute(
                    "claim the expired conversation",
                    "UPDATE conversations SET state = 'destroying', state_since = $2
                 WHERE key = $1 AND state = 'active' AND expires_at IS NOT NULL
                   AND expires_at <= $2",
                    &[key.as_str().into(), now.timestamp_millis().into()],
                )? == 1)
            },
        )
    }

    /// Claims the conversation of generation `generation` for destruction: sets its state to
    /// `destroying` if that record still exists (whatever its state). True when it did.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn claim_for_destroy(&self, key: &ConversationKey, generation: i64) -> Result<bool> {
        let now = Utc::now().timestamp_millis();
        self.write("claim the conversation", TxLock::Record(key), |db| {
            Ok(db.execute(
                "claim the conversation",
                "UPDATE conversations SET state = 'destroying',
                     state_since = CASE WHEN state = 'destroying' THEN state_since ELSE $3 END
                 WHERE key = $1 AND generation = $2",
                &[key.as_str().into(), generation.into(), now.into()],
            )? == 1)
        })
    }

    /// Deletes the record of `key` only if it is still generation `generation` (a destroyer
    /// never deletes a record made after the one it destroyed). True when it did.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn delete_generation(&self, key: &ConversationKey, generation: i64) -> Result<bool> {
        let n = self.write(
            "delete the conversation record",
            TxLock::Record(key),
            |db| {
                db.execute(
                    "delete the conversation record",
                    "DELETE FROM conversations WHERE key = $1 AND generation = $2",
                    &[key.as_str().into(), generation.into()],
                )
            },
        )?;
        Ok(n > 0)
    }

    /// Claims a key that has runtime state but no record (an orphan), so that no record can be
    /// made for it while garbage collection removes that state: [`Store::get_or_create`] says
    /// [`Error::Busy`] until [`Store::release_orphan`].
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn claim_orphan(&self, key: &ConversationKey, now: DateTime<Utc>) -> Result<OrphanClaim> {
        self.write("claim the orphan", TxLock::Record(key), |db| {
            if select(db, key)?.is_some() {
                return Ok(OrphanClaim::HasRecord);
            }
            db.execute(
                "claim the orphan",
                "INSERT INTO gc_claims (key, claimed_at) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[key.as_str().into(), now.timestamp_millis().into()],
            )?;
            Ok(OrphanClaim::Claimed)
        })
    }

    /// Ends a [`Store::claim_orphan`] claim.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn release_orphan(&self, key: &ConversationKey) -> Result<()> {
        self.read(|db| {
            db.execute(
                "release the orphan",
                "DELETE FROM gc_claims WHERE key = $1",
                &[key.as_str().into()],
            )
            .map(drop)
        })
    }

    /// Sets (or with `None` clears) the runtime's id for the conversation's sandbox.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such conversation; [`Error::Backend`].
    pub fn set_sandbox_ref(&self, key: &ConversationKey, sandbox_ref: Option<&str>) -> Result<()> {
        self.update(key, "sandbox_ref = $2", sandbox_ref.into())
    }

    /// Sets the conversation's state.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such conversation; [`Error::Backend`].
    pub fn set_state(&self, key: &ConversationKey, state: ConversationState) -> Result<()> {
        self.update(
            key,
            &format!(
                "state = $2, state_since = CASE WHEN state = $2 THEN state_since ELSE {} END",
                Utc::now().timestamp_millis()
            ),
            state.as_str().into(),
        )
    }

    /// Sets (or with `None` clears) when the conversation expires.
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
            "expires_at = $2",
            expires_at.map(|t| t.timestamp_millis()).into(),
        )
    }

    /// Deletes the conversation's record and its sandbox uid; audit entries stay. Returns
    /// false when there was no record (so deleting twice is fine).
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn delete(&self, key: &ConversationKey) -> Result<bool> {
        let n = self.write(
            "delete the conversation record",
            TxLock::Record(key),
            |db| {
                db.execute(
                    "delete the conversation record",
                    "DELETE FROM conversations WHERE key = $1",
                    &[key.as_str().into()],
                )
            },
        )?;
        Ok(n > 0)
    }

    /// Every conversation, or only `tenant`'s, most recently used first.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails or a stored row is malformed.
    pub fn list(&self, tenant: Option<&TenantId>) -> Result<Vec<ConversationRecord>> {
        self.read(|db| {
            db.query(
                "list conversations",
                &format!(
                    "SELECT {RECORD_COLUMNS} FROM conversations
                     WHERE CAST($1 AS TEXT) IS NULL OR tenant = $1
                     ORDER BY last_used_at DESC, key"
                ),
                &[tenant.map(TenantId::as_str).into()],
            )?
            .iter()
            .map(record)
            .collect()
        })
    }

    /// Appends an entry to the audit log.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn audit(&self, entry: &AuditEntry) -> Result<()> {
        self.read(|db| insert_audit(db, entry))
    }

    /// Appends `entries` to the audit log in one transaction: all or none.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn audit_many(&self, entries: &[AuditEntry]) -> Result<()> {
        self.write("append to the audit log", TxLock::None, |db| {
            entries.iter().try_for_each(|e| insert_audit(db, e))
        })
    }

    /// How often each operation ran on conversation `key` since `since` (its creation), from
    /// the audit log: `(operation, count)` pairs sorted by operation. Only the manager's
    /// operation records are counted, not the front ends' `http.*` and `mcp.*` records.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
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
    /// [`Error::Backend`] when the database fails or a stored row is malformed.
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

    /// The conversation's sandbox uid: the one it already has, else the lowest uid in `range`
    /// that no other conversation holds. A uid stays with its conversation until the record is
    /// deleted, then it is free again.
    ///
    /// # Errors
    /// - [`Error::InvalidRequest`] when `range` is empty.
    /// - [`Error::NotFound`] when there is no such conversation.
    /// - [`Error::Conflict`] when every uid in `range` is taken.
    /// - [`Error::Backend`] when the database fails.
    pub fn allocate_uid(&self, key: &ConversationKey, range: Range<u32>) -> Result<u32> {
        if range.is_empty() {
            return Err(Error::InvalidRequest(format!(
                "the sandbox uid range {}..{} is empty",
                range.start, range.end
            )));
        }
        let held = self.read(|db| {
            db.query_opt(
                "read the sandbox uid",
                "SELECT uid FROM sandbox_uids WHERE conversation_key = $1",
                &[key.as_str().into()],
            )?
            .map(|r| r.int(0))
            .transpose()
        })?;
        if let Some(uid) = held {
            return u32::try_from(uid).map_err(Error::backend);
        }
        self.write(
            "allocate a sandbox uid",
            TxLock::Global(pg::GLOBAL_UIDS),
            |db| {
                if let Some(r) = db.query_opt(
                    "read the sandbox uid",
                    "SELECT uid FROM sandbox_uids WHERE conversation_key = $1",
                    &[key.as_str().into()],
                )? {
                    return u32::try_from(r.int(0)?).map_err(Error::backend);
                }
                if select(db, key)?.is_none() {
                    return Err(not_found(key));
                }
                let taken = db.query(
                    "read the sandbox uids",
                    "SELECT uid FROM sandbox_uids WHERE uid >= $1 AND uid < $2 ORDER BY uid",
                    &[i64::from(range.start).into(), i64::from(range.end).into()],
                )?;
                let mut next = i64::from(range.start);
                for r in &taken {
                    if r.int(0)? != next {
                        break;
                    }
                    next += 1;
                }
                if next >= i64::from(range.end) {
                    return Err(Error::Conflict(format!(
                        "all {} sandbox uids in {}..{} are in use; destroy idle conversations or \
                         widen the range",
                        range.end - range.start,
                        range.start,
                        range.end
                    )));
                }
                db.execute(
                    "allocate a sandbox uid",
                    "INSERT INTO sandbox_uids (uid, conversation_key) VALUES ($1, $2)",
                    &[next.into(), key.as_str().into()],
                )?;
                u32::try_from(next).map_err(Error::backend)
            },
        )
    }

    /// Copies the SQLite store to `dest` with SQLite's online backup API, while other
    /// connections (a running server) keep reading and writing: the copy is a consistent
    /// snapshot. `dest` must not exist; it is made with mode 0600.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a PostgreSQL store (use `pg_dump`) or an existing `dest`;
    /// [`Error::Backend`] when the copy fails.
    pub fn backup(&self, dest: &Path) -> Result<()> {
        let Backend::Sqlite { conn, .. } = &self.backend else {
            return Err(Error::InvalidRequest(
                "backup copies a SQLite store; back up a PostgreSQL store with pg_dump".into(),
            ));
        };
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        options.open(dest).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                Error::InvalidRequest(format!(
                    "{} exists; give a new file for the backup",
                    dest.display()
                ))
            } else {
                Error::Backend(format!("cannot create {}: {e}", dest.display()))
            }
        })?;
        let mut out = Connection::open(dest).map_err(sql_error("open the backup file"))?;
        let conn = lock(conn);
        {
            let backup = rusqlite::backup::Backup::new(&conn, &mut out)
                .map_err(sql_error("start the backup"))?;
            backup
                .run_to_completion(256, Duration::from_millis(5), None)
                .map_err(sql_error("copy the store"))?;
        }
        drop(conn);
        // The copy is a plain (rollback-journal) file, complete on its own.
        out.pragma_update(None, "journal_mode", "DELETE")
            .map_err(sql_error("finish the backup file"))?;
        Ok(())
    }

    /// Replaces the SQLite store's contents with the backup at `src` (made by
    /// [`Store::backup`]), with SQLite's online backup API. The backup is checked first: it
    /// must be a sessionbox store whose schema this build understands; it is migrated after the
    /// copy. Run it with no server using the store: conversations recorded since the backup
    /// are forgotten (their workspaces become orphans that `sessionbox gc` reports and removes).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a PostgreSQL store or a file that is not a sessionbox
    /// store; [`Error::Backend`] when the copy fails.
    pub fn restore(&self, src: &Path) -> Result<()> {
        let Backend::Sqlite { conn, .. } = &self.backend else {
            return Err(Error::InvalidRequest(
                "restore replaces a SQLite store; restore a PostgreSQL store with pg_restore or \
                 psql"
                    .into(),
            ));
        };
        let from = Connection::open_with_flags(src, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| {
                Error::InvalidRequest(format!("cannot open the backup {}: {e}", src.display()))
            })?;
        let version: u32 = from
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| {
                Error::InvalidRequest(format!("{} is not a SQLite database: {e}", src.display()))
            })?;
        let has_table: bool = from
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'conversations')",
                [],
                |r| r.get(0),
            )
            .map_err(sql_error("inspect the backup"))?;
        if version == 0 || !has_table {
            return Err(Error::InvalidRequest(format!(
                "{} is not a sessionbox store backup",
                src.display()
            )));
        }
        if version > SCHEMA_VERSION {
            return Err(schema_too_new(version));
        }
        let mut conn = lock(conn);
        {
            let backup = rusqlite::backup::Backup::new(&from, &mut conn)
                .map_err(sql_error("start the restore"))?;
            backup
                .run_to_completion(256, Duration::from_millis(5), None)
                .map_err(sql_error("copy the backup into the store"))?;
        }
        conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
            .map_err(sql_error("switch to WAL mode"))?;
        schema::migrate(&mut conn)
    }

    /// Runs `UPDATE conversations SET {set} WHERE key = $1` with `$2 = value`.
    fn update(&self, key: &ConversationKey, set: &str, value: Val) -> Result<()> {
        let n = self.read(|db| {
            db.execute(
                "update the conversation record",
                &format!("UPDATE conversations SET {set} WHERE key = $1"),
                &[key.as_str().into(), value],
            )
        })?;
        if n == 0 {
            return Err(not_found(key));
        }
        Ok(())
    }
}

fn schema_too_new(version: u32) -> Error {
    Error::InvalidRequest(format!(
        "the backup's schema version is {version}, newer than the {SCHEMA_VERSION} this \
         sessionbox understands; restore it with a newer sessionbox"
    ))
}

/// The connection. A panic while it was held cannot leave a transaction open (dropping a
/// `Transaction` rolls it back), so a poisoned lock is safe to take.
fn lock(conn: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    conn.lock().unwrap_or_else(|e| e.into_inner())
}

/// The lock file of `key`'s stripe beside the SQLite file at `path`.
fn stripe_file(path: &Path, key: &ConversationKey) -> Result<File> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join("locks");
    create_private_dir(&dir)?;
    let stripe = usize::from_str_radix(&key.as_str()[..4], 16).unwrap_or(0) % LOCK_STRIPES;
    let file = dir.join(format!("{stripe:03x}"));
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&file)
        .map_err(|e| Error::Backend(format!("cannot open the lock {}: {e}", file.display())))
}

fn create_private_dir(dir: &Path) -> Result<()> {
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

fn random_generation() -> Result<i64> {
    let b = keys::random::<8>()?;
    Ok(i64::from_le_bytes(b) & i64::MAX)
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
            entry.operation.as_str().into(),
            entry.outcome.as_str().into(),
            entry.detail.clone().into(),
        ],
    )
    .map(drop)
}

fn select(db: &mut dyn Db, key: &ConversationKey) -> Result<Option<ConversationRecord>> {
    db.query_opt(
        "read the conversation record",
        &format!("SELECT {RECORD_COLUMNS} FROM conversations WHERE key = $1"),
        &[key.as_str().into()],
    )?
    .as_ref()
    .map(record)
    .transpose()
}

pub(crate) fn not_found_key(key: &ConversationKey) -> Error {
    not_found(key)
}

fn not_found(key: &ConversationKey) -> Error {
    Error::NotFound(format!("conversation {key}"))
}

fn duration(ms: Option<i64>) -> Option<Duration> {
    ms.map(|v| Duration::from_millis(u64::try_from(v).unwrap_or(0)))
}

/// Reads a row of [`RECORD_COLUMNS`].
fn record(r: &Row) -> Result<ConversationRecord> {
    Ok(ConversationRecord {
        key: ConversationKey::parse(&r.text(0)?)?,
        tenant: r.text(1)?.parse()?,
        conversation_id: r.text(2)?.parse()?,
        runtime: r.text(3)?,
        sandbox_ref: r.opt_text(4)?,
        state: r.text(5)?.parse()?,
        created_at: time(r.int(6)?)?,
        last_used_at: time(r.int(7)?)?,
        expires_at: r.opt_int(8)?.map(time).transpose()?,
        idle_timeout: duration(r.opt_int(9)?),
        ttl: duration(r.opt_int(10)?),
        max_lifetime: duration(r.opt_int(11)?),
        generation: r.int(12)?,
        state_since: r.opt_int(13)?.map(time).transpose()?,
    })
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
