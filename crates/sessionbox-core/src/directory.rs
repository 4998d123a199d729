//! [`Directory`]: what a runtime may ask about a recorded conversation, in one narrow interface.
//!
//! A runtime does not open the store. What it needs to know about a conversation that the
//! manager recorded (its sandbox uid, its idle timeout, its skills, the network policy in
//! force, the remote sandbox it was given) it asks a [`Directory`], which the manager
//! implements once over the store (`sessionbox_manager::StoreDirectory`). Tests give a runtime
//! any other implementation.
//!
//! Core does no I/O: the trait only names the questions. Its network answer is opaque here
//! ([`NetworkPolicy`]: the policy's canonical JSON and hash, decoded by the egress crate).

use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{ConversationKey, ConversationRef, Result};

/// The network policy in force for a conversation (its own, else its tenant's, else the
/// profile `none`), as a runtime receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkPolicy {
    /// The policy's canonical JSON, as the egress crate writes it
    /// (`sessionbox_egress::Policy::to_json`); the profile `none` when nothing is stored.
    pub json: String,
    /// The stored policy's hash (64 hex digits), `None` when no policy is stored (the profile
    /// `none` by default). A session opened under one hash is stale under another.
    pub hash: Option<String>,
    /// True when the policy lets the conversation reach the network at all (an allowlist),
    /// false for the profile `none`.
    pub allows_network: bool,
}

/// A conversation's remote sandbox (a remote runtime's sandbox id), as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteSandbox {
    /// The conversation's key.
    pub key: ConversationKey,
    /// The runtime that made it (`opensandbox`).
    pub runtime: String,
    /// The server's id of the sandbox.
    pub sandbox_id: String,
    /// When it was recorded.
    pub created_at: DateTime<Utc>,
    /// The expiry sessionbox last set on it (the source of truth); `None` for none.
    pub expires_at: Option<DateTime<Utc>>,
}

/// A sandbox of a remote runtime's warm pool, made before any conversation owns it, as
/// recorded: no conversation is mapped to it until a bind takes it
/// ([`Directory::bind_remote_pool_slot`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemotePoolSlot {
    /// The runtime that made it (`opensandbox`).
    pub runtime: String,
    /// The tenant whose pool it is in (a bind gives it only to this tenant's conversations).
    pub tenant: String,
    /// The slot's name (unique; 1-63 of `[A-Za-z0-9._-]`, as the runtime labels it).
    pub slot: String,
    /// The server's id of the sandbox.
    pub sandbox_id: String,
    /// When it was recorded.
    pub created_at: DateTime<Utc>,
    /// The expiry sessionbox last set on it; `None` for none.
    pub expires_at: Option<DateTime<Utc>>,
}

/// What a runtime may ask about (and, for its remote sandboxes, record of) a conversation the
/// manager recorded. Cheap to share (`Arc<dyn Directory>`); safe to call concurrently.
///
/// Every method may do I/O (a store round trip): call it from async code, or from a blocking
/// thread through the runtime handle's `block_on`.
#[async_trait]
pub trait Directory: Send + Sync {
    /// The network policy in force for `conversation` now.
    ///
    /// # Errors
    /// [`crate::Error::Backend`] when it cannot be read, or the stored policy no longer
    /// decodes (the message says to set it again).
    async fn network(&self, conversation: &ConversationRef) -> Result<NetworkPolicy>;

    /// The host uid (and gid) the conversation's sandbox runs as: the one it holds, else the
    /// lowest free uid in `range`. It stays the conversation's while its record exists.
    ///
    /// # Errors
    /// [`crate::Error::NotFound`] for a conversation not recorded; [`crate::Error::Conflict`]
    /// when every uid in `range` is taken; [`crate::Error::Backend`].
    async fn sandbox_uid(&self, key: &ConversationKey, range: Range<u32>) -> Result<u32>;

    /// Reserves a host uid of `range` for the warm pool slot `holder` (a sandbox launched
    /// before any conversation owns it): no conversation is given it while the reservation
    /// lasts. The same holder gets the same uid again.
    ///
    /// The default refuses ([`crate::Error::Conflict`]): a directory that cannot reserve uids
    /// gives a runtime no warm pool.
    ///
    /// # Errors
    /// [`crate::Error::Conflict`] when every uid in `range` is taken (or reservations are not
    /// supported); [`crate::Error::Backend`].
    async fn reserve_pool_uid(&self, holder: &str, range: Range<u32>) -> Result<u32> {
        let _ = (holder, range);
        Err(crate::Error::Conflict(
            "this directory cannot reserve sandbox uids for a warm pool".into(),
        ))
    }

    /// Gives the uid `holder` reserved to the conversation `key` (recorded, with no uid yet),
    /// in one step: from then on [`Directory::sandbox_uid`] answers it for `key`.
    ///
    /// # Errors
    /// [`crate::Error::NotFound`] when nothing is reserved for `holder` or `key` is not
    /// recorded; [`crate::Error::Conflict`] when `key` already has a uid;
    /// [`crate::Error::Backend`].
    async fn bind_pool_uid(&self, holder: &str, key: &ConversationKey) -> Result<u32> {
        let _ = (holder, key);
        Err(crate::Error::Conflict(
            "this directory cannot reserve sandbox uids for a warm pool".into(),
        ))
    }

    /// Drops `holder`'s reservation; true when there was one. The default has none.
    ///
    /// # Errors
    /// [`crate::Error::Backend`].
    async fn release_pool_uid(&self, holder: &str) -> Result<bool> {
        let _ = holder;
        Ok(false)
    }

    /// The holders of every reservation (for removing those whose slot is gone).
    ///
    /// # Errors
    /// [`crate::Error::Backend`].
    async fn pool_uid_holders(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// The conversation's own idle timeout (from its tenant's lifecycle when it was made);
    /// `None` when it has none or is not recorded (the runtime's default applies).
    ///
    /// # Errors
    /// [`crate::Error::Backend`].
    async fn idle_timeout(&self, key: &ConversationKey) -> Result<Option<Duration>>;

    /// The read-only binds `(host directory, inside path)` that present the conversation's
    /// skills in a sandbox launched now (snapshots bound beneath the runtime's skills root);
    /// empty when no skills are configured.
    ///
    /// # Errors
    /// [`crate::Error::NotFound`] for a conversation not recorded; [`crate::Error::Backend`].
    async fn skill_binds(&self, key: &ConversationKey) -> Result<Vec<(PathBuf, PathBuf)>>;

    /// The remote sandbox recorded for `key`, if any.
    ///
    /// # Errors
    /// [`crate::Error::Backend`].
    async fn remote_sandbox(&self, key: &ConversationKey) -> Result<Option<RemoteSandbox>>;

    /// Every remote sandbox recorded for `runtime` (a runtime's inventory).
    ///
    /// # Errors
    /// [`crate::Error::Backend`].
    async fn remote_sandboxes(&self, runtime: &str) -> Result<Vec<RemoteSandbox>>;

    /// Records `sandbox_id` as `key`'s remote sandbox unless one is recorded already: the
    /// recorded sandbox, and whether it is the one given (of concurrent callers exactly one
    /// wins; the others must delete their own sandbox and use the winner's).
    ///
    /// # Errors
    /// [`crate::Error::InvalidRequest`] for an empty runtime or id; [`crate::Error::Backend`].
    async fn record_remote_sandbox(
        &self,
        key: &ConversationKey,
        runtime: &str,
        sandbox_id: &str,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<(RemoteSandbox, bool)>;

    /// Replaces `key`'s remote sandbox `old` with `new` (a vanished sandbox replaced); false
    /// when `old` is no longer the one recorded (another caller replaced or removed it).
    ///
    /// # Errors
    /// [`crate::Error::Backend`].
    async fn replace_remote_sandbox(
        &self,
        key: &ConversationKey,
        old: &str,
        new: &str,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<bool>;

    /// Records the expiry sessionbox set on `key`'s remote sandbox `sandbox_id`; false when
    /// that sandbox is no longer the one recorded.
    ///
    /// # Errors
    /// [`crate::Error::Backend`].
    async fn set_remote_sandbox_expiry(
        &self,
        key: &ConversationKey,
        sandbox_id: &str,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<bool>;

    /// Forgets `key`'s remote sandbox `sandbox_id` (it was deleted); false when that sandbox
    /// was not the one recorded.
    ///
    /// # Errors
    /// [`crate::Error::Backend`].
    async fn forget_remote_sandbox(&self, key: &ConversationKey, sandbox_id: &str) -> Result<bool>;

    /// Records a ready slot of a remote runtime's warm pool.
    ///
    /// The default refuses ([`crate::Error::Conflict`]): a directory that cannot record slots
    /// gives a remote runtime no warm pool.
    ///
    /// # Errors
    /// [`crate::Error::InvalidRequest`] for an empty or malformed field;
    /// [`crate::Error::Conflict`] when the slot name is recorded already (or slots are not
    /// supported); [`crate::Error::Backend`].
    async fn add_remote_pool_slot(&self, slot: &RemotePoolSlot) -> Result<()> {
        let _ = slot;
        Err(crate::Error::Conflict(
            "this directory cannot record warm pool slots".into(),
        ))
    }

    /// Binds one slot of `tenant`'s pool of `runtime` to `key`, in one step: the slot (the
    /// oldest) leaves the pool and its sandbox becomes `key`'s remote sandbox, with the slot's
    /// expiry. `None` (nothing changed) when the pool is empty or `key` already has a remote
    /// sandbox. Of concurrent callers, no two get the same slot. The default has no pool.
    ///
    /// # Errors
    /// [`crate::Error::Backend`].
    async fn bind_remote_pool_slot(
        &self,
        runtime: &str,
        tenant: &str,
        key: &ConversationKey,
    ) -> Result<Option<RemotePoolSlot>> {
        let _ = (runtime, tenant, key);
        Ok(None)
    }

    /// Removes the slot `slot` of `runtime`'s pool; true when this call removed it (so the
    /// caller, and no one else, now owns its sandbox and deletes it). The default has none.
    ///
    /// # Errors
    /// [`crate::Error::Backend`].
    async fn remove_remote_pool_slot(&self, runtime: &str, slot: &str) -> Result<bool> {
        let _ = (runtime, slot);
        Ok(false)
    }

    /// Every slot of `runtime`'s pools (all tenants), oldest first. The default has none.
    ///
    /// # Errors
    /// [`crate::Error::Backend`].
    async fn remote_pool_slots(&self, runtime: &str) -> Result<Vec<RemotePoolSlot>> {
        let _ = runtime;
        Ok(Vec::new())
    }

    /// Records the expiry sessionbox set on the pooled sandbox of `slot`; false when the slot
    /// is no longer in the pool (bound or removed meanwhile). The default has none.
    ///
    /// # Errors
    /// [`crate::Error::Backend`].
    async fn set_remote_pool_slot_expiry(
        &self,
        runtime: &str,
        slot: &str,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<bool> {
        let _ = (runtime, slot, expires_at);
        Ok(false)
    }
}
