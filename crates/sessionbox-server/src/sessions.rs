//! Open sessions kept between requests, one per conversation, so that a request on a warm
//! conversation pays neither the store's open transaction nor the runtime's open (for
//! `isolated`: lock, sandbox record, agent connection, liveness ping).
//!
//! A cached session is only ever used while its conversation's turn is held (see
//! `queue.rs`), so no two requests share one. Destroy takes the session out before it tears
//! the conversation down. At most `max` sessions are kept; past that the least recently used
//! one is closed. The store's `last_used_at` is touched at most once per [`TOUCH_EVERY`] for a
//! cached conversation (every use is still in the audit log).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sessionbox_core::{ConversationKey, Session};
use sessionbox_manager::Conversation;

/// How often a cached conversation's `last_used_at` is written.
pub(crate) const TOUCH_EVERY: Duration = Duration::from_secs(1);

/// A session at rest, with when it was last used and when its record was last touched.
pub(crate) struct Cached {
    pub conv: Conversation,
    pub used: Instant,
    pub touched: Instant,
}

/// The cache. Cheap operations under a std mutex (never held across an await).
pub(crate) struct Sessions {
    map: Mutex<HashMap<ConversationKey, Cached>>,
    max: usize,
}

impl Sessions {
    /// A cache of at most `max` sessions (0 keeps none).
    pub(crate) fn new(max: usize) -> Self {
        Sessions {
            map: Mutex::default(),
            max,
        }
    }

    /// Takes the conversation's session out, if one is kept.
    pub(crate) fn take(&self, key: &ConversationKey) -> Option<Cached> {
        self.map.lock().expect("sessions lock").remove(key)
    }

    /// Keeps `c` for `key`; returns the sessions to close (the one evicted, or `c` itself when
    /// nothing is kept).
    pub(crate) fn put(&self, key: ConversationKey, c: Cached) -> Vec<Conversation> {
        if self.max == 0 {
            return vec![c.conv];
        }
        let mut map = self.map.lock().expect("sessions lock");
        let mut out = Vec::new();
        if map.len() >= self.max && !map.contains_key(&key) {
            let oldest = map
                .iter()
                .min_by_key(|(_, v)| v.used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest
                && let Some(v) = map.remove(&k)
            {
                out.push(v.conv);
            }
        }
        if let Some(old) = map.insert(key, c) {
            out.push(old.conv);
        }
        out
    }

    /// How many sessions are kept.
    pub(crate) fn len(&self) -> usize {
        self.map.lock().expect("sessions lock").len()
    }
}

/// Closes sessions that left the cache, logging failures.
pub(crate) async fn close_all(sessions: Vec<Conversation>) {
    for s in sessions {
        if let Err(e) = Box::new(s).close().await {
            tracing::warn!(error = %e, "closing a conversation session failed");
        }
    }
}
