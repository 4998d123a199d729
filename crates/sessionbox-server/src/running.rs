//! The sessions of the foreground commands running now, which reads of the same conversation
//! use instead of waiting behind them.
//!
//! A request takes its conversation's turn (`queue.rs`) for the whole of its operation, so a
//! read sent while a command runs for minutes would wait for minutes. A foreground command
//! publishes its session here for as long as it runs ([`Running::publish`]); a read, list,
//! stat, glob or grep of that conversation ([`Operation::reads_only`]) that finds it here runs
//! on that session at once, without a turn of its own, beside the command
//! ([`Running::reader`]). The command's turn and cross-process hold ([`Order`]) are shared with
//! every such read and released only when the command's request and all of them have ended, so
//! nothing else (a write, an edit, another command, a destroy, another replica) can start
//! meanwhile, and those keep their arrival order. A read that finds no running command takes
//! its turn as before.
//!
//! At most [`READS_BESIDE_A_COMMAND`] reads share one command's session at once (past it
//! `busy`). When the command ends, its session is withdrawn first, then its request waits for
//! the reads already running ([`Published::end`]) before it keeps or closes the session.
//!
//! [`Operation::reads_only`]: sessionbox_core::Operation::reads_only

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use sessionbox_core::{ConversationKey, Error, Result};
use sessionbox_manager::Conversation;
use sessionbox_store::ConversationLock;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::queue::Turn;

/// Most reads that run beside one command at once: each may hold a whole file (up to the
/// runtime's file limit) in memory, so this bounds what one conversation's reads can make the
/// server hold while a command runs.
pub(crate) const READS_BESIDE_A_COMMAND: u32 = 4;

/// A request's cross-process hold and its turn, shared with the reads beside it: released (the
/// hold first) when the last of them ends, even when the command's request is cancelled
/// before its readers finish.
pub(crate) type Order = Arc<Mutex<(ConversationLock, Turn)>>;

/// A running command's session and the places for reads beside it.
struct Entry {
    conv: Arc<Conversation>,
    order: Order,
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
    readers: Arc<Semaphore>,
}

impl Published {
    /// Withdraws the session, then waits until every read that shared it has ended (each
    /// gives its place back last, after its session and its share of the [`Order`]).
    pub(crate) async fn end(self) {
        let readers = self.readers.clone();
        drop(self);
        // The semaphore is never closed, so this returns once every place is back.
        let _all = readers.acquire_many(READS_BESIDE_A_COMMAND).await;
    }
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

/// A read's use of a running command's session. Dropped in field order: the session, the
/// read's share of the command's [`Order`], then its place.
pub(crate) struct Reader {
    pub(crate) conv: Arc<Conversation>,
    _order: Order,
    _place: OwnedSemaphorePermit,
}

impl Running {
    /// Publishes `conv` as `key`'s running command's session, with its `order`, until the
    /// returned guard drops.
    pub(crate) fn publish(
        self: &Arc<Self>,
        key: &ConversationKey,
        conv: &Arc<Conversation>,
        order: &Order,
    ) -> Published {
        let readers = Arc::new(Semaphore::new(READS_BESIDE_A_COMMAND as usize));
        let entry = Entry {
            conv: conv.clone(),
            order: order.clone(),
            readers: readers.clone(),
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
            readers,
        }
    }

    /// The running command's session of `key` for one read: `None` when no command of it runs
    /// in this server now.
    ///
    /// # Errors
    /// [`Error::Busy`] when [`READS_BESIDE_A_COMMAND`] reads already share it.
    pub(crate) fn reader(&self, key: &ConversationKey) -> Result<Option<Reader>> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = map.get(key) else {
            return Ok(None);
        };
        let place = entry.readers.clone().try_acquire_owned().map_err(|_| {
            Error::Busy(format!(
                "{READS_BESIDE_A_COMMAND} reads of this conversation already run beside its command; retry later"
            ))
        })?;
        Ok(Some(Reader {
            conv: entry.conv.clone(),
            _order: entry.order.clone(),
            _place: place,
        }))
    }

    /// True while a foreground command of `key` has its session published.
    pub(crate) fn is_running(&self, key: &ConversationKey) -> bool {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.contains_key(key)
    }

    /// Resolves at the next publication of any conversation's session (see
    /// [`Running::reader`]); enable it before looking, so that none is missed.
    pub(crate) fn next_publication(&self) -> tokio::sync::futures::Notified<'_> {
        self.published.notified()
    }
}

/// The session alone again. Call it after [`Published::end`] (or on a session never
/// published), when no read holds it any more; until then it waits.
pub(crate) async fn exclusive(mut conv: Arc<Conversation>) -> Conversation {
    loop {
        match Arc::try_unwrap(conv) {
            Ok(conv) => return conv,
            Err(shared) => {
                conv = shared;
                tokio::task::yield_now().await;
            }
        }
    }
}
