//! The PostgreSQL backend: a small pool of synchronous `postgres` clients, and advisory locks.
//!
//! Every [`crate::Store`] call already runs on a blocking thread (`spawn_blocking`), so the
//! synchronous client fits: it blocks that thread, never an async worker. Connections are made
//! on demand and kept idle for reuse (at most [`MAX_IDLE`]); a connection that broke is dropped.
//!
//! **Outages** (the server restarting, a network cut): a failure that is the connection's, not
//! the statement's, is [`Error::Unavailable`] (503 at the HTTP API), never a hang or a panic,
//! and it empties the pool, whose connections died with the one that failed. A call that meets
//! such a failure on a connection taken from the pool (idle, so its session ended before the
//! call began: the server was restarted meanwhile) is run again once on a new connection when
//! that is safe: a read (`read`), or a transaction whose `BEGIN` failed (nothing of it ran). So
//! the first calls after a restart do not fail on dead connections. A connection that cannot be
//! made is tried again for up to [`CONNECT_PATIENCE`] (a restart takes about a second), so a
//! call that arrives while the server restarts is mostly delayed, not refused. Nothing else is
//! tried again once a statement was sent: whether it took effect is unknown, and the caller is
//! told.
//!
//! An operation's advisory lock ([`crate::Store::lock_conversation`]) lives on its connection:
//! a server restart ends that session and releases the lock while the operation still runs.
//! Within one `serve` the server's own per-conversation queue still orders operations; across
//! replicas two operations of one conversation may then overlap once, during the restart.
//!
//! Locks that span an operation ([`crate::Store::lock_conversation`]) hold a session-level
//! advisory lock on a connection of their own for as long as the guard lives; PostgreSQL drops
//! it with the session if the process dies. The guard's `Drop` may run on an async worker, where
//! a synchronous client must not block, so the unlock is handed to one background thread.
//!
//! The URL (which may hold a password) is parsed once and never logged or put in an error: the
//! errors name the host, port and database only.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use postgres::{Client, Config, NoTls};

use crate::pg_tls;
use sessionbox_core::{Error, Result};

/// Idle connections kept for reuse.
const MAX_IDLE: usize = 16;

/// How long a connection that cannot be made (the server down or starting up) is tried again
/// before the call fails with [`Error::Unavailable`].
pub(crate) const CONNECT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3);

/// The limit on one connection attempt when the URL sets none (`connect_timeout`): an
/// unreachable host fails the call instead of holding it for the kernel's TCP timeout.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Advisory lock classes (the first key of PostgreSQL's two-key advisory locks). Classes keep
/// the store's locks apart from each other and from anything else in the database.
pub(crate) const CLASS_OPERATION: i32 = 0x5342_0001; // held for a whole operation
pub(crate) const CLASS_RECORD: i32 = 0x5342_0002; // held by one transaction on a record
pub(crate) const CLASS_GLOBAL: i32 = 0x5342_0003; // migrations, uid allocation
pub(crate) const CLASS_TENANT: i32 = 0x5342_0004; // held by one transaction on a tenant's records

/// Second keys of [`CLASS_GLOBAL`].
pub(crate) const GLOBAL_MIGRATE: i32 = 1;
pub(crate) const GLOBAL_UIDS: i32 = 2;
pub(crate) const GLOBAL_POOL: i32 = 3;

pub(crate) struct PgBackend {
    config: Config,
    /// TLS as the URL's `sslmode` asks (`None`: plain).
    tls: Option<pg_tls::MakeRustls>,
    /// `host:port/db`, for messages.
    pub(crate) label: String,
    idle: Arc<Mutex<Vec<Client>>>,
    unlocker: Mutex<Option<mpsc::Sender<Unlock>>>,
}

/// True when `e` is the connection's failure (closed, reset, refused, the server shutting down
/// or starting up, out of connections), not the statement's: the server may well take the
/// same statement on a new connection.
pub(crate) fn is_outage(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        // Class 08: connection exception; 57P01-57P03: admin shutdown, crash shutdown,
        // cannot connect now; class 53: insufficient resources (disk full, out of memory, too
        // many connections).
        return code.code().starts_with("08")
            || code.code().starts_with("53")
            || [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
            ]
            .contains(code);
    }
    if e.is_closed() {
        return true;
    }
    // An I/O error anywhere in its causes: reset, refused, broken pipe, timed out.
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.is::<std::io::Error>() {
            return true;
        }
        cause = c.source();
    }
    let text = e.to_string();
    text.starts_with("error connecting to server") || text.starts_with("timeout waiting")
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

impl Drop for PgBackend {
    /// Closes the idle connections on a thread of its own: closing a synchronous client blocks,
    /// and the last `Store` may well be dropped on a thread that drives async tasks.
    fn drop(&mut self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|e| e.into_inner()));
        if !idle.is_empty() {
            let _ = std::thread::spawn(move || drop(idle)).join();
        }
    }
}

struct Unlock {
    client: Client,
    class: i32,
    id: i32,
}

/// Maps a PostgreSQL error to [`Error::Backend`] saying what could not be done. The server's
/// message is kept (it never holds the password); parameter values are not in it.
///
/// A failure of the connection ([`is_outage`]) is [`Error::Unavailable`] instead: nothing of the
/// call is known to have happened, and the same call may succeed once the server is back.
pub(crate) fn pg_error(doing: &str) -> impl FnOnce(postgres::Error) -> Error + '_ {
    move |e| {
        let detail = e
            .as_db_error()
            .map_or_else(|| e.to_string(), |d| d.message().to_owned());
        if is_outage(&e) {
            return Error::Unavailable(format!(
                "could not {doing}: the PostgreSQL store cannot be reached ({detail}); retry \
                 when it is back"
            ));
        }
        Error::Backend(format!("could not {doing}: {detail}"))
    }
}

impl PgBackend {
    /// Parses `url` (`postgres://` or `postgresql://`, or a `key=value` string) and connects
    /// once to check it.
    ///
    /// `sslmode` and `sslrootcert` in it choose TLS (see [`crate::pg_tls`]).
    pub(crate) fn connect(url: &str) -> Result<PgBackend> {
        let (url, tls) = pg_tls::split_url(url)?;
        let tls_mode = tls.mode;
        let mut config: Config = url.parse().map_err(|_| {
            Error::InvalidRequest(
                "the PostgreSQL store URL is not valid; expected \
                 postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
                    .into(),
            )
        })?;
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .map(|h| match h {
                postgres::config::Host::Tcp(h) => h.clone(),
                postgres::config::Host::Unix(p) => p.display().to_string(),
            })
            .collect();
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let label = format!(
            "{}:{port}/{}",
            hosts.first().map_or("localhost", String::as_str),
            config.get_dbname().unwrap_or("")
        );
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let tls = pg_tls::client_config(&tls)?.map(pg_tls::MakeRustls);
        config.ssl_mode(match tls_mode {
            pg_tls::SslMode::Absent | pg_tls::SslMode::Prefer => postgres::config::SslMode::Prefer,
            pg_tls::SslMode::Disable => postgres::config::SslMode::Disable,
            _ => postgres::config::SslMode::Require,
        });
        let backend = PgBackend {
            config,
            tls,
            label,
            idle: Arc::default(),
            unlocker: Mutex::new(None),
        };
        let client = off_async(|| backend.new_client())?;
        backend.give_back(client);
        Ok(backend)
    }

    /// A new connection, tried again for up to [`CONNECT_PATIENCE`] while the server cannot be
    /// reached (an attempt that failed sent nothing, so trying again is safe).
    fn new_client(&self) -> Result<Client> {
        let deadline = std::time::Instant::now() + CONNECT_PATIENCE;
        let mut pause = std::time::Duration::from_millis(50);
        loop {
            match self.connect_once() {
                Err(e @ Error::Unavailable(_)) if std::time::Instant::now() + pause > deadline => {
                    return Err(e);
                }
                Err(Error::Unavailable(_)) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(500));
                }
                other => return other,
            }
        }
    }

    fn connect_once(&self) -> Result<Client> {
        let connected = match &self.tls {
            Some(tls) => self.config.connect(tls.clone()),
            None => self.config.connect(NoTls),
        };
        connected.map_err(|e| {
            // The causes too: a TLS failure says why only there ("invalid peer certificate:
            // UnknownIssuer"). None of them holds the URL or its password.
            let mut detail = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                let more = c.to_string();
                if !detail.contains(&more) {
                    detail = format!("{detail}: {more}");
                }
                cause = c.source();
            }
            let message = format!(
                "could not connect to the PostgreSQL store at {}: {detail}",
                self.label
            );
            if is_outage(&e) {
                Error::Unavailable(format!("{message}; retry when it is back"))
            } else {
                Error::Backend(message)
            }
        })
    }

    /// An idle connection, else a new one.
    fn take(&self) -> Result<Client> {
        self.take_marked().map(|(c, _)| c)
    }

    /// [`PgBackend::take`], saying whether the connection came from the pool (`true`) or is new.
    fn take_marked(&self) -> Result<(Client, bool)> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(c) if !c.is_closed() => Ok((c, true)),
            _ => self.new_client().map(|c| (c, false)),
        }
    }

    /// Forgets every idle connection: one failed for the connection's sake, so the others,
    /// made before the same outage, are most likely dead too.
    fn flush_idle(&self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|e| e.into_inner()));
        drop(idle);
    }

    fn give_back(&self, client: Client) {
        give_back(&self.idle, client);
    }

    /// Runs `f` on a pooled connection. An outage ([`Error::Unavailable`]) empties the pool.
    pub(crate) fn with_client<T>(&self, f: impl FnOnce(&mut Client) -> Result<T>) -> Result<T> {
        off_async(|| {
            let mut client = self.take()?;
            let out = f(&mut client);
            self.after(client, &out);
            out
        })
    }

    /// [`PgBackend::with_client`] for a call that may run twice (a read, or a statement whose
    /// effect is the same when repeated): when a connection from the pool turns out dead (an
    /// outage error), `f` runs once more on a new connection.
    pub(crate) fn with_client_again<T>(&self, f: impl Fn(&mut Client) -> Result<T>) -> Result<T> {
        off_async(|| {
            let (mut client, pooled) = self.take_marked()?;
            let out = f(&mut client);
            self.after(client, &out);
            if !(pooled && matches!(out, Err(Error::Unavailable(_)))) {
                return out;
            }
            let mut client = self.new_client()?;
            let out = f(&mut client);
            self.after(client, &out);
            out
        })
    }

    /// Runs `f` with a transaction begun on a pooled connection (`f` commits it, or drops it
    /// to roll back). When `BEGIN` fails for the connection's sake on a connection from the
    /// pool, nothing has run: it is begun again on a new connection.
    pub(crate) fn with_transaction<T>(
        &self,
        f: impl FnOnce(postgres::Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        off_async(|| {
            let (mut client, mut again) = self.take_marked()?;
            let mut f = Some(f);
            let out = loop {
                match client.transaction() {
                    Ok(tx) => match f.take() {
                        Some(f) => break f(tx),
                        None => break Err(Error::Backend("a transaction ran twice".into())),
                    },
                    Err(e) => {
                        let e = pg_error("start a transaction")(e);
                        if !(again && matches!(e, Error::Unavailable(_))) {
                            break Err(e);
                        }
                    }
                }
                // BEGIN failed on a dead connection from the pool: a new one.
                self.flush_idle();
                again = false;
                client = self.new_client()?;
            };
            self.after(client, &out);
            out
        })
    }

    /// Gives `client` back to the pool, unless `out` is an outage: then the pool is emptied
    /// and `client` dropped.
    fn after<T>(&self, client: Client, out: &Result<T>) {
        if matches!(out, Err(Error::Unavailable(_))) {
            self.flush_idle();
        } else {
            self.give_back(client);
        }
    }

    /// [`PgBackend::lock`] without waiting: `None` when another session holds it.
    pub(crate) fn try_lock(self: &Arc<Self>, class: i32, id: i32) -> Result<Option<PgLock>> {
        off_async(|| self.try_lock_now(class, id))
    }

    fn try_lock_now(self: &Arc<Self>, class: i32, id: i32) -> Result<Option<PgLock>> {
        let (client, got) = self.lock_on_live_client(|c| {
            c.query_one("SELECT pg_try_advisory_lock($1, $2)", &[&class, &id])
                .map(|row| row.get::<_, bool>(0))
                .map_err(pg_error("try the conversation's lock"))
        })?;
        if !got {
            self.give_back(client);
            return Ok(None);
        }
        Ok(Some(self.guard(client, class, id)))
    }

    /// Runs `lock` (which takes a session-level lock, or tries to) on a pooled connection, and
    /// once more on a new connection when the pooled one turned out dead: a lock taken on a
    /// dead session was released with it, so taking it again is safe.
    fn lock_on_live_client<T>(
        &self,
        lock: impl Fn(&mut Client) -> Result<T>,
    ) -> Result<(Client, T)> {
        let (mut client, pooled) = self.take_marked()?;
        match lock(&mut client) {
            Ok(v) => Ok((client, v)),
            Err(Error::Unavailable(_)) if pooled => {
                self.flush_idle();
                let mut client = self.new_client()?;
                let v = lock(&mut client).inspect_err(|e| self.after_error(e))?;
                Ok((client, v))
            }
            Err(e) => {
                self.after_error(&e);
                Err(e)
            }
        }
    }

    fn guard(self: &Arc<Self>, client: Client, class: i32, id: i32) -> PgLock {
        let unlocker = {
            let mut slot = self.unlocker.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert_with(|| start_unlocker(self.idle.clone()))
                .clone()
        };
        PgLock {
            client: Some(client),
            class,
            id,
            unlocker,
        }
    }

    /// Takes the session-level advisory lock `(class, id)` on a connection of its own; it is
    /// released when the guard drops.
    pub(crate) fn lock(self: &Arc<Self>, class: i32, id: i32) -> Result<PgLock> {
        off_async(|| self.lock_now(class, id))
    }

    fn lock_now(self: &Arc<Self>, class: i32, id: i32) -> Result<PgLock> {
        let (client, ()) = self.lock_on_live_client(|c| {
            c.execute("SELECT pg_advisory_lock($1, $2)", &[&class, &id])
                .map(drop)
                .map_err(pg_error("take the conversation's lock"))
        })?;
        Ok(self.guard(client, class, id))
    }

    /// Empties the pool after an outage.
    fn after_error(&self, e: &Error) {
        if matches!(e, Error::Unavailable(_)) {
            self.flush_idle();
        }
    }
}

fn give_back(idle: &Mutex<Vec<Client>>, client: Client) {
    if client.is_closed() {
        return;
    }
    let mut idle = idle.lock().unwrap_or_else(|e| e.into_inner());
    if idle.len() < MAX_IDLE {
        idle.push(client);
    }
}

/// The thread that releases advisory locks for guards dropped anywhere (also on async workers).
fn start_unlocker(idle: Arc<Mutex<Vec<Client>>>) -> mpsc::Sender<Unlock> {
    let (tx, rx) = mpsc::channel::<Unlock>();
    let spawned = std::thread::Builder::new()
        .name("sessionbox-pg-unlock".into())
        .spawn(move || {
            for mut u in rx {
                match u
                    .client
                    .execute("SELECT pg_advisory_unlock($1, $2)", &[&u.class, &u.id])
                {
                    Ok(_) => give_back(&idle, u.client),
                    // Closing the session releases every lock it holds.
                    Err(e) => tracing::warn!(
                        error = %e,
                        "releasing a PostgreSQL advisory lock failed; its session is closed instead"
                    ),
                }
            }
        });
    // Without the thread, the receiver is gone and every client sent is dropped: closing a
    // session releases its locks, so nothing stays locked.
    drop(spawned);
    tx
}

/// A held session-level advisory lock.
pub(crate) struct PgLock {
    client: Option<Client>,
    class: i32,
    id: i32,
    unlocker: mpsc::Sender<Unlock>,
}

impl Drop for PgLock {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            // If the thread is gone, the client is dropped: its session closes, and the lock
            // with it.
            let _ = self.unlocker.send(Unlock {
                client,
                class: self.class,
                id: self.id,
            });
        }
    }
}

/// The server's clock now (`clock_timestamp()`, not the transaction's start).
pub(crate) fn server_time(client: &mut Client) -> Result<chrono::DateTime<chrono::Utc>> {
    let ms: i64 = client
        .query_one(
            "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
            &[],
        )
        .map_err(pg_error("read the server's clock"))?
        .get(0);
    crate::time(ms)
}

/// The second key of a conversation's advisory locks: 32 bits of its key (two conversations
/// sharing them only wait for each other).
pub(crate) fn key_id(key: &sessionbox_core::ConversationKey) -> i32 {
    let hex = &key.as_str()[..8];
    u32::from_str_radix(hex, 16).unwrap_or(0) as i32
}

/// The second key of a tenant's advisory locks: 32 bits of the SHA-256 of its id (two tenants
/// sharing them only wait for each other).
pub(crate) fn tenant_id(tenant: &sessionbox_core::TenantId) -> i32 {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(tenant.as_str().as_bytes());
    i32::from_be_bytes([d[0], d[1], d[2], d[3]])
}

/// Runs `f`, which uses the synchronous PostgreSQL client. That client drives each call on a
/// runtime of its own, which tokio refuses on a thread that is running async tasks ("cannot
/// start a runtime from within a runtime"). On a worker of a multi-threaded tokio runtime, `f`
/// therefore runs under [`tokio::task::block_in_place`], which leaves the runtime's context for
/// the call and lets the other tasks move to other workers. Anywhere else (plain threads,
/// `spawn_blocking`) it runs as is. Callers on a current-thread runtime must still move store
/// calls off it (`spawn_blocking`), as they do for SQLite.
fn off_async<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
