//! Operation locks: [`Store::lock_conversation`] holds a conversation for one whole operation
//! across threads, processes and (with PostgreSQL) replicas.

use std::fs::File;
use std::path::Path;

use sessionbox_core::{ConversationKey, Error, Result};

use crate::{Backend, Store, create_private_dir, pg};

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

/// How many lock files stripe the conversations of a SQLite store.
const LOCK_STRIPES: usize = 4096;

impl Store {
    /// Holds `key` for one operation across threads, processes and (with PostgreSQL) replicas:
    /// a second caller waits until the guard drops. Blocks; async callers use `spawn_blocking`.
    ///
    /// With SQLite it is an exclusive `flock` on one of 4,096 (`LOCK_STRIPES`) files beside the
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
        .map_err(|e| {
            let message = format!("cannot open the lock {}: {e}", file.display());
            // A stripe is made on first use: on a full disk, the store cannot take the call.
            match e.raw_os_error() {
                Some(c)
                    if c == rustix::io::Errno::NOSPC.raw_os_error()
                        || c == rustix::io::Errno::DQUOT.raw_os_error() =>
                {
                    Error::Unavailable(format!("{message}; free space on the store's disk"))
                }
                _ => Error::Backend(message),
            }
        })
}
