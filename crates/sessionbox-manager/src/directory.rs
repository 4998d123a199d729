//! [`StoreDirectory`]: the one implementation of [`Directory`], over the store and the egress
//! policy decoder; and [`effective_policy`], the one place a stored network policy is decoded.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sessionbox_core::{
    ConversationKey, ConversationRef, Directory, Error, NetworkPolicy, RemotePoolSlot,
    RemoteSandbox, Result,
};
use sessionbox_egress::Policy;
use sessionbox_skills::Skills;
use sessionbox_store::{Store, StoredPolicy};

/// The network policy in force for `conv` (its own, else its tenant's, else
/// [`Policy::None`]), read from `store` and decoded. Blocks (a store read): async callers use
/// [`Store::run`] or [`StoreDirectory::network`].
///
/// # Errors
/// [`Error::Backend`] when the store fails, or when the stored policy no longer decodes (the
/// message names the conversation and says to set it again).
pub fn effective_policy(store: &Store, conv: &ConversationRef) -> Result<Policy> {
    let stored = store.effective_egress_policy(conv)?;
    decode_policy(stored.as_ref())
}

/// Decodes a stored network policy (`None`: nothing stored, the profile `none`): the one
/// decoder, for [`effective_policy`], [`StoreDirectory`] and front ends that show a stored row.
///
/// # Errors
/// [`Error::Backend`] when the stored text no longer decodes; the message names whose policy
/// it is (the conversation's own, or its tenant's) and says to set it again.
pub fn decode_policy(stored: Option<&StoredPolicy>) -> Result<Policy> {
    match stored {
        None => Ok(Policy::None),
        Some(s) => Policy::from_json(&s.policy).map_err(|e| {
            let whose = match &s.conversation_id {
                Some(id) => format!("conversation {id}"),
                None => format!("tenant {}", s.tenant),
            };
            Error::Backend(format!(
                "the network policy of {whose} cannot be used: {e}; set it again"
            ))
        }),
    }
}

/// [`Directory`] over a [`Store`]: every answer is one store call (two for the skill binds,
/// which read the conversation's tenant first), made off the async runtime with
/// [`Store::run`]. Cheap to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> sessionbox_core::Result<()> {
/// use std::sync::Arc;
/// use sessionbox_core::{ConversationRef, Directory};
/// use sessionbox_manager::StoreDirectory;
/// use sessionbox_store::Store;
///
/// let directory: Arc<dyn Directory> = Arc::new(StoreDirectory::new(Store::open_in_memory()?));
/// let conv = ConversationRef::parse("acme", "thread-1")?;
/// assert!(!directory.network(&conv).await?.allows_network);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct StoreDirectory {
    store: Store,
    skills: Option<(Arc<Skills>, PathBuf)>,
}

impl std::fmt::Debug for StoreDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreDirectory")
            .field("store", &self.store.describe())
            .field("skills", &self.skills.as_ref().map(|(_, dir)| dir))
            .finish()
    }
}

impl StoreDirectory {
    /// Answers from `store`, with no skills to bind.
    pub fn new(store: Store) -> Self {
        StoreDirectory {
            store,
            skills: None,
        }
    }

    /// The same, binding `skills` from snapshots written beneath `snapshots` (see
    /// [`Skills::mount_binds`]).
    #[must_use]
    pub fn with_skills(mut self, skills: Skills, snapshots: PathBuf) -> Self {
        self.skills = Some((Arc::new(skills), snapshots));
        self
    }

    /// The store it answers from.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// [`effective_policy`] off the async runtime.
    ///
    /// # Errors
    /// As [`effective_policy`].
    pub async fn effective_policy(&self, conv: &ConversationRef) -> Result<Policy> {
        let conv = conv.clone();
        self.store.run(move |s| effective_policy(s, &conv)).await
    }
}

#[async_trait]
impl Directory for StoreDirectory {
    async fn network(&self, conversation: &ConversationRef) -> Result<NetworkPolicy> {
        let conv = conversation.clone();
        self.store
            .run(move |s| {
                let stored = s.effective_egress_policy(&conv)?;
                let policy = decode_policy(stored.as_ref())?;
                Ok(NetworkPolicy {
                    json: policy.to_json(),
                    hash: stored.map(|p| p.hash),
                    allows_network: !policy.is_none(),
                })
            })
            .await
    }

    async fn sandbox_uid(&self, key: &ConversationKey, range: Range<u32>) -> Result<u32> {
        let key = key.clone();
        self.store.run(move |s| s.allocate_uid(&key, range)).await
    }

    async fn reserve_pool_uid(&self, holder: &str, range: Range<u32>) -> Result<u32> {
        let holder = holder.to_owned();
        self.store
            .run(move |s| s.reserve_uid(&holder, range, s.now()))
            .await
    }

    async fn bind_pool_uid(&self, holder: &str, key: &ConversationKey) -> Result<u32> {
        let (holder, key) = (holder.to_owned(), key.clone());
        self.store
            .run(move |s| s.bind_reserved_uid(&holder, &key))
            .await
    }

    async fn release_pool_uid(&self, holder: &str) -> Result<bool> {
        let holder = holder.to_owned();
        self.store.run(move |s| s.release_uid(&holder)).await
    }

    async fn pool_uid_holders(&self) -> Result<Vec<String>> {
        self.store
            .run(|s| Ok(s.uid_reservations()?.into_iter().map(|r| r.0).collect()))
            .await
    }

    async fn idle_timeout(&self, key: &ConversationKey) -> Result<Option<Duration>> {
        let key = key.clone();
        self.store
            .run(move |s| Ok(s.get(&key)?.and_then(|r| r.idle_timeout)))
            .await
    }

    async fn skill_binds(&self, key: &ConversationKey) -> Result<Vec<(PathBuf, PathBuf)>> {
        let Some((skills, snapshots)) = self.skills.clone() else {
            return Ok(Vec::new());
        };
        let key = key.clone();
        self.store
            .run(move |s| {
                let record = s
                    .get(&key)?
                    .ok_or_else(|| Error::NotFound(format!("conversation {}", key.short())))?;
                // A faulty skill is left out (the manager reports it on each open).
                let (binds, _skipped) = skills.mount_binds(&record.tenant, &snapshots);
                Ok(binds)
            })
            .await
    }

    async fn remote_sandbox(&self, key: &ConversationKey) -> Result<Option<RemoteSandbox>> {
        let key = key.clone();
        self.store.run(move |s| s.remote_sandbox(&key)).await
    }

    async fn remote_sandboxes(&self, runtime: &str) -> Result<Vec<RemoteSandbox>> {
        let runtime = runtime.to_owned();
        self.store.run(move |s| s.remote_sandboxes(&runtime)).await
    }

    async fn record_remote_sandbox(
        &self,
        key: &ConversationKey,
        runtime: &str,
        sandbox_id: &str,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<(RemoteSandbox, bool)> {
        let (key, runtime, id) = (key.clone(), runtime.to_owned(), sandbox_id.to_owned());
        self.store
            .run(move |s| s.insert_remote_sandbox(&key, &runtime, &id, expires_at, s.now()))
            .await
    }

    async fn replace_remote_sandbox(
        &self,
        key: &ConversationKey,
        old: &str,
        new: &str,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<bool> {
        let (key, old, new) = (key.clone(), old.to_owned(), new.to_owned());
        self.store
            .run(move |s| s.replace_remote_sandbox(&key, &old, &new, expires_at, s.now()))
            .await
    }

    async fn set_remote_sandbox_expiry(
        &self,
        key: &ConversationKey,
        sandbox_id: &str,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<bool> {
        let (key, id) = (key.clone(), sandbox_id.to_owned());
        self.store
            .run(move |s| s.set_remote_sandbox_expiry(&key, &id, expires_at))
            .await
    }

    async fn forget_remote_sandbox(&self, key: &ConversationKey, sandbox_id: &str) -> Result<bool> {
        let (key, id) = (key.clone(), sandbox_id.to_owned());
        self.store
            .run(move |s| s.delete_remote_sandbox(&key, &id))
            .await
    }

    async fn add_remote_pool_slot(&self, slot: &RemotePoolSlot) -> Result<()> {
        let slot = slot.clone();
        self.store.run(move |s| s.add_pool_slot(&slot)).await
    }

    async fn bind_remote_pool_slot(
        &self,
        runtime: &str,
        tenant: &str,
        key: &ConversationKey,
    ) -> Result<Option<RemotePoolSlot>> {
        let (runtime, tenant, key) = (runtime.to_owned(), tenant.to_owned(), key.clone());
        self.store
            .run(move |s| s.bind_pool_slot(&runtime, &tenant, &key, s.now()))
            .await
    }

    async fn remove_remote_pool_slot(&self, runtime: &str, slot: &str) -> Result<bool> {
        let (runtime, slot) = (runtime.to_owned(), slot.to_owned());
        self.store
            .run(move |s| s.remove_pool_slot(&runtime, &slot))
            .await
    }

    async fn remote_pool_slots(&self, runtime: &str) -> Result<Vec<RemotePoolSlot>> {
        let runtime = runtime.to_owned();
        self.store.run(move |s| s.pool_slots(&runtime)).await
    }

    async fn set_remote_pool_slot_expiry(
        &self,
        runtime: &str,
        slot: &str,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<bool> {
        let (runtime, slot) = (runtime.to_owned(), slot.to_owned());
        self.store
            .run(move |s| s.set_pool_slot_expiry(&runtime, &slot, expires_at))
            .await
    }
}
