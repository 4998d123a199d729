//! Open sessions kept between requests, one per conversation, so that a request on a warm
//! conversation pays neither the store's open transaction nor the runtime's open (for
//! `isolated`: lock, sandbox record, agent connection, liveness ping).
//!
//! A cached session is only ever used while its conversation's turn is held (see
//! `queue.rs`), so no two requests share one. Destroy takes the session out before it tears
//! the conversation down. At most `max` sessions are kept; past that the least recently used
//! one is closed. Whether a kept session may still be used, and how often its record is
//! renewed, is the manager's to say ([`sessionbox_manager::Manager::revalidate`]).
//!
//! A network policy change made through the API ([`Sessions::invalidate`]) closes the kept
//! sessions it concerns and makes every session in use at that moment close instead of being
//! kept: the next request opens the conversation through the runtime again, which is where a
//! runtime applies a profile change (the `isolated` runtime relaunches a sandbox switched
//! between `none` and an allowlist). A change made elsewhere (another replica, the CLI) is
//! caught when a kept session is taken: it is used only while the policy in force still has the
//! hash it was opened under ([`Conversation::policy_hash`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use sessionbox_core::{ConversationKey, ConversationRef, Session};
use sessionbox_manager::Conversation;

/// A session at rest, with when it was last used.
pub(crate) struct Cached {
    pub conv: Conversation,
    pub used: Instant,
}

/// The cache. Cheap operations under a std mutex (never held across an await).
pub(crate) struct Sessions {
    map: Mutex<HashMap<ConversationKey, Cached>>,
    max: usize,
    /// Increased by each [`Sessions::invalidate`]; a session opened under an older value is
    /// not kept.
    generation: AtomicU64,
}

impl Sessions {
    /// A cache of at most `max` sessions (0 keeps none).
    pub(crate) fn new(max: usize) -> Self {
        Sessions {
            map: Mutex::default(),
            max,
            generation: AtomicU64::new(0),
        }
    }

    /// The current generation: read it before opening a session, give it back to
    /// [`Sessions::put`].
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Takes out every kept session whose conversation `concerns` (to be closed by the
    /// caller), and makes the sessions in use now close instead of being kept when their
    /// request ends.
    pub(crate) fn invalidate(
        &self,
        concerns: impl Fn(&ConversationRef) -> bool,
    ) -> Vec<Conversation> {
        let mut map = self.map.lock().expect("sessions lock");
        self.generation.fetch_add(1, Ordering::SeqCst);
        let gone: Vec<ConversationKey> = map
            .iter()
            .filter(|(_, c)| concerns(c.conv.conversation()))
            .map(|(k, _)| k.clone())
            .collect();
        gone.into_iter()
            .filter_map(|k| map.remove(&k))
            .map(|c| c.conv)
            .collect()
    }

    /// Takes the conversation's session out, if one is kept.
    pub(crate) fn take(&self, key: &ConversationKey) -> Option<Cached> {
        self.map.lock().expect("sessions lock").remove(key)
    }

    /// Keeps `c` for `key`; returns the sessions to close (the one evicted, or `c` itself when
    /// nothing is kept, or when it was opened before an invalidation: `generation` is what
    /// [`Sessions::generation`] said before it was opened).
    pub(crate) fn put(
        &self,
        key: ConversationKey,
        c: Cached,
        generation: u64,
    ) -> Vec<Conversation> {
        if self.max == 0 {
            return vec![c.conv];
        }
        let mut map = self.map.lock().expect("sessions lock");
        if generation != self.generation() {
            return vec![c.conv];
        }
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
