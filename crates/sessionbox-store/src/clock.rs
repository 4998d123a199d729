//! The store's clock: the one time every lifecycle decision about a stored record is made by.
//!
//! Expiry and renewal of conversations, idle stops by garbage collection, API key expiry,
//! stuck-destroy detection, and the times written into records are all comparisons of times
//! that several processes write and read (a CLI beside a server, replicas of a server), so they
//! must come from one clock those processes share: **the store's**.
//!
//! - **SQLite**: the machine's wall clock ([`SystemClock`]). Every process sharing the file runs
//!   on this machine and reads the same clock; a jump of it is a jump of the store's time.
//! - **PostgreSQL**: the server's clock (`ServerClock`), read when the store is connected and
//!   again every [`RESYNC_EVERY`], and carried forward in between with this process's monotonic
//!   clock. A replica whose own wall clock is wrong, or jumps, decides as the others do; a jump
//!   of the database server's clock is seen within [`RESYNC_EVERY`].
//!
//! Persisted expiry is wall-clock time by nature (a conversation expires an hour of real time
//! after its last use, whichever process looks): a forward jump of the store's clock expires
//! what its new time says has expired, since no process can tell a corrected clock from real
//! time having passed. What a backward jump could do wrong is prevented where the time is
//! written: a renewal never moves a record's last use or expiry back ([`Store::touch`]).
//!
//! Timers inside one process (a command's timeout, an agent's idle timeout, how often a kept
//! session is renewed, queue and connection deadlines) never use this clock: they use the
//! monotonic clock (`Instant`, tokio's timers), which no wall-clock jump moves.
//!
//! Tests inject a clock with [`Store::set_clock`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::Store;
use crate::pg::PgBackend;

/// How often a PostgreSQL store's clock is read from the server again.
pub const RESYNC_EVERY: Duration = Duration::from_secs(30);

/// A source of the current wall-clock time for the store's decisions (see the [module
/// documentation](self)).
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The time now.
    fn now(&self) -> DateTime<Utc>;
}

/// The machine's wall clock (`CLOCK_REALTIME`): a SQLite store's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// The clock a [`Store`] and its clones share, which [`Store::set_clock`] replaces for all.
#[derive(Debug, Clone)]
pub(crate) struct SharedClock(Arc<RwLock<Arc<dyn Clock>>>);

impl SharedClock {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        SharedClock(Arc::new(RwLock::new(clock)))
    }

    fn now(&self) -> DateTime<Utc> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).now()
    }

    fn set(&self, clock: Arc<dyn Clock>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = clock;
    }
}

/// A PostgreSQL server's clock: its time when last read, plus the monotonic time elapsed since.
/// Reading it never blocks: a read older than [`RESYNC_EVERY`] starts a new read on a thread
/// of its own (one at a time), and the old one goes on meanwhile (also while the server
/// cannot be reached).
#[derive(Debug)]
pub(crate) struct ServerClock {
    pg: Arc<PgBackend>,
    anchor: Arc<Mutex<(DateTime<Utc>, Instant)>>,
    syncing: Arc<AtomicBool>,
}

impl ServerClock {
    /// Reads the server's clock once (blocking: called while connecting).
    pub(crate) fn new(pg: Arc<PgBackend>) -> sessionbox_core::Result<Self> {
        let server = pg.with_client(crate::pg::server_time)?;
        Ok(ServerClock {
            pg,
            anchor: Arc::new(Mutex::new((server, Instant::now()))),
            syncing: Arc::default(),
        })
    }

    fn resync(&self) {
        if self.syncing.swap(true, Ordering::SeqCst) {
            return;
        }
        let (pg, anchor, syncing) = (self.pg.clone(), self.anchor.clone(), self.syncing.clone());
        let spawned = std::thread::Builder::new()
            .name("sessionbox-pg-clock".into())
            .spawn(move || {
                match pg.with_client(crate::pg::server_time) {
                    Ok(server) => {
                        *anchor.lock().unwrap_or_else(|e| e.into_inner()) = (server, Instant::now());
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the PostgreSQL store's clock; going on from its last reading");
                        // Not again at once: the next call after a pause tries.
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
                syncing.store(false, Ordering::SeqCst);
            });
        if spawned.is_err() {
            self.syncing.store(false, Ordering::SeqCst);
        }
    }
}

impl Clock for ServerClock {
    fn now(&self) -> DateTime<Utc> {
        let (server, at) = *self.anchor.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = at.elapsed();
        if elapsed >= RESYNC_EVERY {
            self.resync();
        }
        chrono::Duration::from_std(elapsed)
            .ok()
            .and_then(|d| server.checked_add_signed(d))
            .unwrap_or(server)
    }
}

impl Store {
    /// The store's time now: what every lifecycle decision about a stored record is made by
    /// (see the [`clock`](self) module): the machine's wall clock for SQLite, the server's
    /// clock for PostgreSQL. Never blocks.
    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Replaces the store's clock, for this store and every clone of it (made before or
    /// after): for tests that move time, and tools that must decide by another clock.
    pub fn set_clock(&self, clock: Arc<dyn Clock>) {
        self.clock.set(clock);
    }
}
