//! The warm pool: sandboxes created before any conversation asks for one, each bound to a new
//! conversation on its first open, so that its cold start is one store transaction and one
//! server round trip instead of a create and the wait for its agent.
//!
//! (The 1.1.1 server's own pools, `/v1/pools` and `poolRef`, exist only on its Kubernetes
//! runtime; on the Docker runtime they answer 501/400, so sessionbox keeps its own.)
//!
//! A slot is a sandbox made like a conversation's but with no conversation label: the
//! instance's metadata plus [`LABEL_POOL`]` = <tenant tag>.<16 random hex digits>` (the tag is
//! 16 hex digits of the tenant's SHA-256; 33 characters in all), `networkPolicy` deny-all and
//! [`LABEL_NETWORK`]` = none` when [`EgressOptions::network_policy`] is on, the runtime's
//! timeout, and `EXECD_ACCESS_TOKEN = agent_token("pool:<slot>")`. The slot cannot know its
//! conversation, so its agent's token derives from the slot's name; [`OpenSandboxRuntime`]
//! derives the token of every later connection from the sandbox's [`LABEL_POOL`] label when it
//! has one (the open reads the sandbox anyway), so the agent needs no rebind and no new route,
//! and the token never leaves sessionbox. It is as secret as a conversation's: an HMAC under
//! the agent key, of a name that is not.
//!
//! The store records each ready slot (`remote_pool_slots`: runtime, tenant, slot, sandbox id,
//! expiry), so garbage collection and every replica see it. A slot is recorded only once its
//! agent answers `/ping`, so a bound slot serves at once.
//!
//! Binding, on the first open of a conversation (no remote sandbox recorded) that may take a
//! slot: [`Directory::bind_remote_pool_slot`] moves the tenant's oldest slot to the
//! conversation's record in one transaction (two binds never get one slot, and the sandbox is
//! recorded, as a slot or as the conversation's, at every moment); the server is asked whether
//! it still runs (if not, it is deleted, the record forgotten, and the next slot tried, then
//! the normal create); its expiry is renewed when due.
//!
//! Which conversations may take a slot: any whose sandbox would be created exactly like a
//! slot. The create depends on the conversation only through its network policy (with
//! `network_policy` on, a slot serves only conversations whose policy in force is `none`) and
//! its volume (with [`OpenSandboxConfig::volumes`] the pool is off: a slot cannot know which
//! conversation's volume to bind, and a bound volume cannot be moved under a running
//! container); skills and the idle timeout do not change a sandbox of this runtime. Nothing of
//! the pool remains in a bound sandbox: no command ever ran in it.
//!
//! Who fills it: [`OpenSandboxRuntime::refill_pool`] (after a bind, and every minute from a
//! long-lived process), which also renews slots whose expiry is within half the timeout and
//! forgets slots the server lost. [`OpenSandboxRuntime::prune_pool`] (garbage collection)
//! deletes dead and surplus slots (all with `drain`), and pool-labelled sandboxes of this
//! instance that the store records neither as slots nor as conversations' (a creator that died
//! between create and record) once they are older than
//! [`OpenSandboxConfig::pool_unrecorded_grace`].

use std::collections::{BTreeMap, HashSet};

use sessionbox_core::{RemotePoolSlot, TenantId};

use super::session::policy_in_force;
use super::*;

/// Metadata key naming a warm pool slot (`<tenant tag>.<random>`).
pub const LABEL_POOL: &str = "sessionbox.pool";

/// What a pool slot's agent token derives from.
pub(super) fn pool_subject(slot: &str) -> String {
    format!("pool:{slot}")
}

/// What the agent token of a sandbox of `key` with `metadata` derives from: its slot's name
/// when it came from the pool, else the conversation key.
pub(super) fn token_subject(key: &ConversationKey, metadata: &BTreeMap<String, String>) -> String {
    match metadata.get(LABEL_POOL) {
        Some(slot) => pool_subject(slot),
        None => key.as_str().to_owned(),
    }
}

/// The tag of `tenant`'s slots: 16 hex digits of its SHA-256.
fn tenant_tag(tenant: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(tenant.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// 16 random hex digits (from the kernel's random source), naming a slot.
fn random_hex() -> Result<String> {
    use std::io::Read;
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::Backend(format!("cannot read /dev/urandom: {e}")))?;
    Ok(b.iter().map(|b| format!("{b:02x}")).collect())
}

/// How many times a bind tries another slot after one the server lost.
const BIND_TRIES: usize = 3;

impl OpenSandboxRuntime {
    /// The pool size of `tenant` in force: 0 with volumes (module documentation).
    fn pool_size(&self, tenant: &str) -> usize {
        if self.config.volumes.is_some() {
            0
        } else {
            self.config.pool.of(tenant)
        }
    }

    /// True when `conversation` may take a slot: its tenant has a pool and its sandbox would
    /// be made exactly like a slot.
    async fn may_take_slot(&self, conversation: &ConversationRef) -> Result<bool> {
        if self.pool_size(conversation.tenant.as_str()) == 0 {
            return Ok(false);
        }
        if self.config.egress.network_policy
            && !policy_in_force(&*self.directory, conversation)
                .await?
                .is_none()
        {
            return Ok(false);
        }
        Ok(true)
    }

    /// Binds a slot of the tenant's pool to `conversation` (which has no remote sandbox yet)
    /// when it may take one: `(sandbox id, token subject)`, or `None` for the normal create.
    ///
    /// # Errors
    /// Store failures; lifecycle failures other than a slot found gone.
    pub(super) async fn bind_from_pool(
        &self,
        conversation: &ConversationRef,
    ) -> Result<Option<(String, String)>> {
        if !self.may_take_slot(conversation).await? {
            return Ok(None);
        }
        let key = &conversation.key;
        for _ in 0..BIND_TRIES {
            let slot = match self
                .directory
                .bind_remote_pool_slot(RUNTIME_NAME, conversation.tenant.as_str(), key)
                .await
            {
                Ok(Some(slot)) => slot,
                Ok(None) => return Ok(None),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot take a warm pool slot; creating a sandbox");
                    return Ok(None);
                }
            };
            match self.client.get(&slot.sandbox_id).await {
                Ok(s) if s.status.state == SandboxState::Running => {
                    self.renew_if_due(key, &slot.sandbox_id, slot.expires_at)
                        .await?;
                    tracing::debug!(sandbox = %slot.sandbox_id, "bound a warm pool slot");
                    return Ok(Some((slot.sandbox_id, pool_subject(&slot.slot))));
                }
                Ok(_) | Err(OpenSandboxError::NotFound { .. }) => {
                    tracing::warn!(
                        sandbox = %slot.sandbox_id,
                        "a warm pool slot's sandbox is gone or not running; not bound"
                    );
                    let _ = self.client.delete(&slot.sandbox_id).await;
                    self.paths.forget(&slot.sandbox_id);
                    self.directory
                        .forget_remote_sandbox(key, &slot.sandbox_id)
                        .await?;
                }
                Err(e) => {
                    // Recorded as the conversation's: its next open asks the server again.
                    return Err(to_core_error(e));
                }
            }
        }
        Ok(None)
    }

    /// Fills `tenant`'s pool up to its size: forgets (and deletes) slots the server no longer
    /// runs, renews slots whose expiry is within half the timeout, and creates the missing
    /// ones, each recorded once its agent answers. Returns how many it created. Concurrent
    /// calls in one process are serialised; two processes may overfill, which
    /// [`OpenSandboxRuntime::prune_pool`] trims.
    ///
    /// # Errors
    /// Store and lifecycle failures (the server unreachable, a create refused).
    pub async fn refill_pool(&self, tenant: &TenantId) -> Result<usize> {
        let size = self.pool_size(tenant.as_str());
        if size == 0 {
            return Ok(0);
        }
        let _one = self.pool_refill.lock().await;
        let slots = self.directory.remote_pool_slots(RUNTIME_NAME).await?;
        let mut live = 0;
        for slot in slots.iter().filter(|s| s.tenant == tenant.as_str()) {
            match self.client.get(&slot.sandbox_id).await {
                Ok(s) if s.status.state == SandboxState::Running => {
                    live += 1;
                    if let Err(e) = self.renew_slot_if_due(slot).await {
                        tracing::warn!(sandbox = %slot.sandbox_id, error = %e, "cannot renew a warm pool slot");
                    }
                }
                Ok(_) | Err(OpenSandboxError::NotFound { .. }) => {
                    self.remove_slot(slot).await?;
                }
                Err(e) => return Err(to_core_error(e)),
            }
        }
        let mut made = 0;
        for _ in live..size {
            self.make_slot(tenant).await?;
            made += 1;
        }
        Ok(made)
    }

    /// Renews a pooled sandbox to `now + timeout` when its recorded expiry is within half the
    /// timeout (or unknown).
    async fn renew_slot_if_due(&self, slot: &RemotePoolSlot) -> Result<()> {
        let half = chrono::Duration::from_std(self.config.timeout / 2).unwrap_or_default();
        if slot.expires_at.is_some_and(|t| t - Utc::now() >= half) {
            return Ok(());
        }
        let target = self.expiry_from_now();
        self.client
            .renew(&slot.sandbox_id, target)
            .await
            .map_err(to_core_error)?;
        self.directory
            .set_remote_pool_slot_expiry(RUNTIME_NAME, &slot.slot, Some(target))
            .await?;
        Ok(())
    }

    /// Takes `slot` out of the pool and, when this call did (no bind took it meanwhile),
    /// deletes its sandbox. True when it removed it.
    async fn remove_slot(&self, slot: &RemotePoolSlot) -> Result<bool> {
        if !self
            .directory
            .remove_remote_pool_slot(RUNTIME_NAME, &slot.slot)
            .await?
        {
            return Ok(false);
        }
        match self.client.delete(&slot.sandbox_id).await {
            Ok(_) | Err(OpenSandboxError::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(sandbox = %slot.sandbox_id, error = %e, "cannot delete a warm pool slot's sandbox; a later prune deletes it");
            }
        }
        self.paths.forget(&slot.sandbox_id);
        Ok(true)
    }

    /// Creates one slot of `tenant`'s pool, waits for its agent, and records it.
    async fn make_slot(&self, tenant: &TenantId) -> Result<()> {
        let name = format!("{}.{}", tenant_tag(tenant.as_str()), random_hex()?);
        let subject = pool_subject(&name);
        let mut metadata = self.instance_metadata();
        metadata.insert(LABEL_POOL, &name).map_err(to_core_error)?;
        let network_policy = if self.config.egress.network_policy {
            metadata
                .insert(LABEL_NETWORK, "none")
                .map_err(to_core_error)?;
            Some(sessionbox_egress::opensandbox::deny_all())
        } else {
            None
        };
        let request = CreateSandbox {
            volumes: Vec::new(),
            image: self.config.image.clone(),
            entrypoint: self.config.entrypoint.clone(),
            timeout: Some(self.config.timeout),
            metadata,
            resource_limits: self.config.resource_limits.clone(),
            env: match &self.config.agent_key {
                Some(k) => {
                    BTreeMap::from([("EXECD_ACCESS_TOKEN".to_owned(), k.agent_token(&subject))])
                }
                None => BTreeMap::new(),
            },
            network_policy,
        };
        let expires = self.expiry_from_now();
        let sandbox = match self.client.create(&request).await {
            Ok(s) => s,
            Err(e) => {
                // A create that failed mid-way may still have made it: delete it by its label
                // (a late one is left to prune_pool's sweep of unrecorded slots).
                self.delete_labelled(&name).await;
                return Err(to_core_error(e));
            }
        };
        let undo = |e: Error| async {
            let _ = self.client.delete(&sandbox.id).await;
            self.paths.forget(&sandbox.id);
            e
        };
        if let Err(e) = self.connect(&sandbox.id, &subject).await {
            return Err(undo(e).await);
        }
        let slot = RemotePoolSlot {
            runtime: RUNTIME_NAME.into(),
            tenant: tenant.as_str().to_owned(),
            slot: name,
            sandbox_id: sandbox.id.clone(),
            created_at: Utc::now(),
            expires_at: Some(sandbox.expires_at.unwrap_or(expires)),
        };
        if let Err(e) = self.directory.add_remote_pool_slot(&slot).await {
            return Err(undo(e).await);
        }
        tracing::debug!(sandbox = %sandbox.id, tenant = %tenant, "made a warm pool slot");
        Ok(())
    }

    /// Deletes the sandboxes of this instance labelled as the slot `name`.
    async fn delete_labelled(&self, name: &str) {
        let mut metadata = self.instance_metadata();
        if metadata.insert(LABEL_POOL, name).is_err() {
            return;
        }
        let filter = ListFilter {
            metadata,
            states: Vec::new(),
        };
        if let Ok(found) = self.client.list(&filter).await {
            for s in found {
                let _ = self.client.delete(&s.id).await;
            }
        }
    }

    /// Removes what the pools should not hold: slots whose sandbox the server no longer runs,
    /// slots beyond their tenant's size (the newest first; every slot with `drain`), and
    /// pool-labelled sandboxes of this instance recorded neither as a slot nor as a
    /// conversation's, once older than [`OpenSandboxConfig::pool_unrecorded_grace`] (younger
    /// ones may be slots being made). Returns how many sandboxes it removed.
    ///
    /// # Errors
    /// Store and lifecycle failures.
    pub async fn prune_pool(&self, drain: bool) -> Result<usize> {
        // The server first: a sandbox made after this list is not judged below.
        let inventory = self.server_inventory().await?;
        let running: HashSet<&str> = inventory
            .iter()
            .filter(|s| s.status.state == SandboxState::Running)
            .map(|s| s.id.as_str())
            .collect();
        let mut removed = 0;
        let mut kept: BTreeMap<String, usize> = BTreeMap::new();
        for slot in self.directory.remote_pool_slots(RUNTIME_NAME).await? {
            let count = kept.entry(slot.tenant.clone()).or_default();
            let keep = !drain
                && running.contains(slot.sandbox_id.as_str())
                && *count < self.pool_size(&slot.tenant);
            if keep {
                *count += 1;
            } else if self.remove_slot(&slot).await? {
                removed += 1;
            }
        }
        // Slots first, then conversations: a bind moves a sandbox from the one to the other
        // in one transaction, so read in this order it is seen in one of them.
        let pooled: HashSet<String> = self
            .directory
            .remote_pool_slots(RUNTIME_NAME)
            .await?
            .into_iter()
            .map(|s| s.sandbox_id)
            .collect();
        let bound: HashSet<String> = self
            .directory
            .remote_sandboxes(RUNTIME_NAME)
            .await?
            .into_iter()
            .map(|r| r.sandbox_id)
            .collect();
        let grace =
            chrono::Duration::from_std(self.config.pool_unrecorded_grace).unwrap_or_default();
        let now = Utc::now();
        for s in &inventory {
            if !s.metadata.contains_key(LABEL_POOL)
                || pooled.contains(&s.id)
                || bound.contains(&s.id)
                || s.created_at.is_some_and(|t| now - t < grace)
            {
                continue;
            }
            tracing::warn!(sandbox = %s.id, "deleting a warm pool sandbox the store does not record");
            match self.client.delete(&s.id).await {
                Ok(_) | Err(OpenSandboxError::NotFound { .. }) => removed += 1,
                Err(e) => tracing::warn!(sandbox = %s.id, error = %e, "cannot delete it"),
            }
            self.paths.forget(&s.id);
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_name_fits_a_label_and_carries_its_tenant() {
        let name = format!("{}.{}", tenant_tag("acme"), random_hex().unwrap());
        assert_eq!(name.len(), 33);
        assert!(crate::metadata::is_valid_value(&name));
        assert!(name.starts_with(&tenant_tag("acme")));
        assert_ne!(tenant_tag("acme"), tenant_tag("beta"));
        assert_ne!(random_hex().unwrap(), random_hex().unwrap());
    }

    #[test]
    fn the_token_subject_is_the_slot_when_labelled_else_the_key() {
        let key = ConversationKey::derive(
            &sessionbox_core::TenantId::new("t").unwrap(),
            &sessionbox_core::ConversationId::new("c").unwrap(),
        );
        let mut m = BTreeMap::new();
        assert_eq!(token_subject(&key, &m), key.as_str());
        m.insert(LABEL_POOL.to_owned(), "abc.def".to_owned());
        assert_eq!(token_subject(&key, &m), "pool:abc.def");
    }
}
