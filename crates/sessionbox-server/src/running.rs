//! The sessions of the foreground commands running now, which reads of the same conversation
//! use instead of waiting behind them.
//!
//! A request takes its conversation's turn (`queue.rs`) for the whole of its operation, so a
//! read sent while a command runs for minutes would wait for minutes. A foreground command
//! publishes its session here for as long as it runs ([`Running::publish`]); a read, list,
//! stat, glob or grep of that conversation ([`Operation::reads_only`]) that finds it here runs
//! on that session at once, without a turn, beside the command ([`Running::reader`]). The
//! command's turn and cross-process hold stay in force for both, so nothing else (a write, an
//! edit, another command, a destroy) can start meanwhile, and those keep their arrival order.
//! A read that finds no running command takes its turn as before.
//!
//! At most `max` reads share one command's session at once (the queue's bound; past it
//! `busy`). When the command ends, its session is withdrawn first, then its request waits for
//! the reads already running before it keeps or closes the session ([`exclusive`]).
//!
//! [`Operation::reads_only`]: sessionbox_core::Operation::reads_only

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sessionbox_core::{ConversationKey, Error, Result};
use sessionbox_manager::Conversation;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// A running command's session and the places for reads beside it.
struct Entry {
    conv: Arc<Conversation>,
    readers: Arc<Semaphore>,
}

/// The published sessions, by conversation. Cheap operations under a std mutex (never held
/// across an await).
#[derive(Default)]
pub(crate) struct Running {
    map: Mutex<HashMap<ConversationKey, Entry>>,
    /// Woken at every publication: a read waiting for its turn looks again (the command that
    /// holds the turn may have published its session meanwhile).
    published: Notify,
}

/// A session published by [`Running::publish`]; withdrawn when dropped.
pub(crate) struct Published {
    running: Arc<Running>,
    key: ConversationKey,
    conv: Weak<Conversation>,
}

impl Drop for Published {
    fn drop(&mut self) {
        let mut map = self.running.map.lock().unwrap_or_else(|e| e.into_inner());
        if map
            .get(&self.key)
            .is_some_and(|e| std::ptr::eq(Arc::as_ptr(&e.conv), self.conv.as_ptr()))
        {
            map.remove(&self.key);
        }
    }
}

/// A read's use of a running command's session; its place is given back when dropped.
pub(crate) struct Reader {
    pub(crate) conv: Arc<Conversation>,
    _place: OwnedSemaphorePermit,
}

impl Running {
    /// Publishes `conv` as `key`'s running command's session, with room for `max` reads at
    /// once beside it, until the returned guard drops.
    pub(crate) fn publish(
        self: &Arc<Self>,
        key: &ConversationKey,
        conv: &Arc<Conversation>,
        max: usize,
    ) -> Published {
        let entry = Entry {
            conv: conv.clone(),
            readers: Arc::new(Semaphore::new(max.max(1))),
        };
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), entry);
        self.published.notify_waiters();
        Published {
            running: self.clone(),
            key: key.clone(),
            conv: Arc::downgrade(conv),
        }
    }

    /// The running command's session of `key` for one read: `None` when no command of it runs
    /// in this server now.
    ///
    /// # Errors
    /// [`Error::Busy`] when `max` reads already share it.
    pub(crate) fn reader(&self, key: &ConversationKey) -> Result<Option<Reader>> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = map.get(key) else {
            return Ok(None);
        };
        let place = entry.readers.clone().try_acquire_owned().map_err(|_| {
            Error::Busy(
                "too many reads of this conversation run beside its command; retry later".into(),
            )
        })?;
        Ok(Some(Reader {
            conv: entry.conv.clone(),
            _place: place,
        }))
    }
}

impl Running {
    /// Resolves at the next publication of any conversation's session (see
    /// [`Running::reader`]); enable it before looking, so that none is missed.
    pub(crate) fn next_publication(&self) -> tokio::sync::futures::Notified<'_> {
        self.published.notified()
    }
}

/// How often [`exclusive`] looks again while reads still use the session.
const READERS_POLL: Duration = Duration::from_millis(1);

/// The session alone again, once every read that shared it has ended (it must be withdrawn
/// first, so that no new one starts).
pub(crate) async fn exclusive(mut conv: Arc<Conversation>) -> Conversation {
    loop {
        match Arc::try_unwrap(conv) {
            Ok(conv) => return conv,
            Err(shared) => {
                conv = shared;
                tokio::time::sleep(READERS_POLL).await;
            }
        }
    }
}
