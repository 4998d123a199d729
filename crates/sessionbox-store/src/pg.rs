//! The PostgreSQL backend: a small pool of synchronous `postgres` clients, and advisory locks.
//!
//! Every [`crate::Store`] call already runs on a blocking thread (`spawn_blocking`), so the
//! synchronous client fits: it blocks that thread, never an async worker. Connections are made
//! on demand and kept idle for reuse (at most [`MAX_IDLE`]); a connection that broke is dropped.
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
pub(crate) fn pg_error(doing: &str) -> impl FnOnce(postgres::Error) -> Error + '_ {
    move |e| {
        let detail = e
            .as_db_error()
            .map_or_else(|| e.to_string(), |d| d.message().to_owned());
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

    fn new_client(&self) -> Result<Client> {
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
            Error::Backend(format!(
                "could not connect to the PostgreSQL store at {}: {detail}",
                self.label
            ))
        })
    }

    fn take(&self) -> Result<Client> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(c) if !c.is_closed() => Ok(c),
            _ => self.new_client(),
        }
    }

    fn give_back(&self, client: Client) {
        give_back(&self.idle, client);
    }

    /// Runs `f` on a pooled connection.
    pub(crate) fn with_client<T>(&self, f: impl FnOnce(&mut Client) -> Result<T>) -> Result<T> {
        off_async(|| {
            let mut client = self.take()?;
            let out = f(&mut client);
            self.give_back(client);
            out
        })
    }

    /// [`PgBackend::lock`] without waiting: `None` when another session holds it.
    pub(crate) fn try_lock(self: &Arc<Self>, class: i32, id: i32) -> Result<Option<PgLock>> {
        off_async(|| self.try_lock_now(class, id))
    }

    fn try_lock_now(self: &Arc<Self>, class: i32, id: i32) -> Result<Option<PgLock>> {
        let mut client = self.take()?;
        let got: bool = client
            .query_one("SELECT pg_try_advisory_lock($1, $2)", &[&class, &id])
            .map_err(pg_error("try the conversation's lock"))?
            .get(0);
        if !got {
            self.give_back(client);
            return Ok(None);
        }
        Ok(Some(self.guard(client, class, id)))
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
        let mut client = self.take()?;
        client
            .execute("SELECT pg_advisory_lock($1, $2)", &[&class, &id])
            .map_err(pg_error("take the conversation's lock"))?;
        Ok(self.guard(client, class, id))
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
