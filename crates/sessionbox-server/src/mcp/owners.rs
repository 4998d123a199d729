//! Which tenant owns each MCP session id, and how many sessions a tenant may have open.
//!
//! rmcp's session manager knows session ids, not keys: by itself any key that learns an id can
//! use or end that session. So every session this server opens is bound here to the tenant
//! whose key sent its `initialize`, and [`super::admit`] answers a request that names a session
//! of another tenant (or one this map does not know) with 404, as if the id did not exist,
//! before rmcp sees it.
//!
//! The map stays bounded: an entry goes when its session ends through a DELETE, when rmcp
//! answers 404 for it (it ended on its own, after rmcp's keep-alive), and, when a tenant is at
//! its limit, entries whose session rmcp no longer knows are pruned before a new one is
//! refused. A tenant has at most `max_per_tenant` sessions open (and opening) at once, and a
//! narrowed key (limited to conversations, or read-only) at most a quarter of them, so such a
//! key, given to one user or agent, cannot take every place of its tenant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use sessionbox_core::{ConversationId, Error, TenantId};

/// Session ids by owner, sessions being opened, and rmcp's session manager they track.
pub(crate) struct Owners {
    /// rmcp's sessions (shared with the MCP service).
    pub(crate) manager: Arc<LocalSessionManager>,
    max_per_tenant: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Session id to the tenant that opened it.
    owners: HashMap<String, TenantId>,
    /// Session id to its conversation: named when it opened, or made for it (`/mcp/new`).
    conversations: HashMap<String, ConversationId>,
    /// `initialize` requests in flight, per tenant (they count against the limit).
    opening: HashMap<TenantId, usize>,
    /// Session id to the narrowed key that opened it.
    keys: HashMap<String, String>,
    /// `initialize` requests in flight, per narrowed key.
    opening_keys: HashMap<String, usize>,
}

impl State {
    fn count(&self, tenant: &TenantId) -> usize {
        self.owners.values().filter(|t| *t == tenant).count()
            + self.opening.get(tenant).copied().unwrap_or(0)
    }

    fn count_key(&self, key: &str) -> usize {
        self.keys.values().filter(|k| *k == key).count()
            + self.opening_keys.get(key).copied().unwrap_or(0)
    }
}

/// A place for one session being opened by a tenant; [`Opening::bind`] records the session id
/// rmcp gave it, dropping it gives the place back.
pub(crate) struct Opening {
    owners: Arc<Owners>,
    tenant: TenantId,
    /// The narrowed key opening it, if it is one.
    key: Option<String>,
}

impl Owners {
    /// No sessions yet; at most `max_per_tenant` per tenant.
    pub(crate) fn new(max_per_tenant: usize) -> Self {
        Owners {
            manager: Arc::default(),
            max_per_tenant,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True when session `id` was opened by `tenant`.
    pub(crate) fn owned_by(&self, id: &str, tenant: &TenantId) -> bool {
        self.lock().owners.get(id) == Some(tenant)
    }

    /// Forgets session `id` (it ended).
    pub(crate) fn forget(&self, id: &str) {
        let mut state = self.lock();
        state.owners.remove(id);
        state.conversations.remove(id);
        state.keys.remove(id);
    }

    /// The conversation of session `id`: named when it was opened, or made for it.
    pub(crate) fn conversation_of(&self, id: &str) -> Option<ConversationId> {
        self.lock().conversations.get(id).cloned()
    }

    /// Sessions `tenant` has open or is opening, as far as this map knows.
    pub(crate) fn count(&self, tenant: &TenantId) -> usize {
        self.lock().count(tenant)
    }

    /// Most sessions one narrowed key may have open.
    pub(crate) fn max_per_narrowed_key(&self) -> usize {
        (self.max_per_tenant / 4).max(1)
    }

    /// Admits one more session of `tenant`, opened with `narrowed_key` (the id of a key
    /// limited to conversations or to reading, else `None`), pruning first the sessions rmcp
    /// has closed on its own when a limit is reached.
    ///
    /// # Errors
    /// [`Error::Busy`] naming the limit when `tenant`, or the key, has that many sessions open.
    pub(crate) async fn open(
        self: &Arc<Self>,
        tenant: &TenantId,
        narrowed_key: Option<&str>,
    ) -> Result<Opening, Error> {
        if self.try_open(tenant, narrowed_key).is_none() {
            self.prune(tenant).await;
        }
        if let Some(key) = narrowed_key
            && self.lock().count_key(key) >= self.max_per_narrowed_key()
        {
            return Err(Error::Busy(format!(
                "this API key (limited to some conversations or to reading) has {} MCP \
                 sessions open, a quarter of [serve] max_mcp_sessions_per_tenant; end one \
                 (DELETE /mcp with its Mcp-Session-Id) or wait for an idle one to expire",
                self.max_per_narrowed_key()
            )));
        }
        self.try_open(tenant, narrowed_key).ok_or_else(|| {
            Error::Busy(format!(
                "[serve] max_mcp_sessions_per_tenant = {} reached: this tenant has that many MCP \
                 sessions open; end one (DELETE /mcp with its Mcp-Session-Id) or wait for an idle \
                 one to expire",
                self.max_per_tenant
            ))
        })
    }

    fn try_open(self: &Arc<Self>, tenant: &TenantId, key: Option<&str>) -> Option<Opening> {
        let mut state = self.lock();
        if state.count(tenant) >= self.max_per_tenant
            || key.is_some_and(|k| state.count_key(k) >= self.max_per_narrowed_key())
        {
            return None;
        }
        *state.opening.entry(tenant.clone()).or_default() += 1;
        if let Some(k) = key {
            *state.opening_keys.entry(k.to_owned()).or_default() += 1;
        }
        Some(Opening {
            owners: self.clone(),
            tenant: tenant.clone(),
            key: key.map(str::to_owned),
        })
    }

    /// Forgets the sessions of `tenant` that rmcp no longer knows (closed after its keep-alive).
    async fn prune(&self, tenant: &TenantId) {
        let ids: Vec<String> = self
            .lock()
            .owners
            .iter()
            .filter(|(_, t)| *t == tenant)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            let known = self
                .manager
                .has_session(&Arc::from(id.as_str()))
                .await
                .unwrap_or(true);
            if !known {
                self.forget(&id);
            }
        }
    }
}

impl Opening {
    /// Records that the session being opened got `id`, and its conversation: every later
    /// request of the session must be on that one.
    pub(crate) fn bind(self, id: &str, conversation: ConversationId) {
        let mut state = self.owners.lock();
        state.owners.insert(id.to_owned(), self.tenant.clone());
        state.conversations.insert(id.to_owned(), conversation);
        if let Some(k) = &self.key {
            state.keys.insert(id.to_owned(), k.clone());
        }
        drop(state);
        // `self` drops here: the place counted while opening is now the session's.
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        let mut state = self.owners.lock();
        if let Some(n) = state.opening.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                state.opening.remove(&self.tenant);
            }
        }
        if let Some(k) = &self.key
            && let Some(n) = state.opening_keys.get_mut(k)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                state.opening_keys.remove(k);
            }
        }
    }
}
