//! Per-conversation ordering: one operation at a time per conversation, in arrival order.
//!
//! Each conversation key with work in flight has a fair (FIFO) `tokio::sync::Mutex` and a count
//! of the requests holding or waiting for it. A request past the bound is refused (429) at once;
//! the entry is dropped when its last request ends, so idle conversations cost nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sessionbox_core::ConversationKey;
use tokio::sync::OwnedMutexGuard;

/// A conversation's lock and how many requests hold or wait for it.
type Entry = (Arc<tokio::sync::Mutex<()>>, usize);

#[derive(Default)]
pub(crate) struct Queues {
    map: Mutex<HashMap<ConversationKey, Entry>>,
}

/// A place in a conversation's queue; counts until dropped (also when a waiting request is
/// cancelled).
struct Slot {
    queues: Arc<Queues>,
    key: ConversationKey,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut map = self.queues.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = map.get_mut(&self.key) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// The right to operate on one conversation; the next request's turn comes when it drops.
pub(crate) struct Turn {
    // Declared first: released before the slot stops counting.
    _guard: OwnedMutexGuard<()>,
    _slot: Slot,
}

impl Queues {
    /// Waits for `key`'s turn; `None` when `max` requests already hold or wait for it.
    pub(crate) async fn turn(self: &Arc<Self>, key: &ConversationKey, max: usize) -> Option<Turn> {
        let (lock, slot) = {
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            let entry = map
                .entry(key.clone())
                .or_insert_with(|| (Arc::new(tokio::sync::Mutex::new(())), 0));
            if entry.1 >= max {
                return None;
            }
            entry.1 += 1;
            (
                entry.0.clone(),
                Slot {
                    queues: self.clone(),
                    key: key.clone(),
                },
            )
        };
        let guard = lock.lock_owned().await;
        Some(Turn {
            _guard: guard,
            _slot: slot,
        })
    }

    /// Conversations with requests in flight (for tests and metrics).
    pub(crate) fn busy(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
