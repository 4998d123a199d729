//! Garbage collection: what should not exist any more, found by comparing the store (the
//! source of truth) with the runtime's inventory ([`Runtime::list`](sessionbox_core::Runtime::list)), and removed.
//!
//! Four kinds of garbage, each reported (with `dry_run`) or removed:
//!
//! - **expired**: an `active` record whose `expires_at` has passed. Claimed with
//!   [`Store::claim_expired`] (a renew that wins the race keeps it), then destroyed in the
//!   runtime, then the record deleted.
//! - **stuck**: a record left `destroying` for the grace period (its destroyer died or
//!   failed). Destroyed again, then deleted.
//! - **orphans**: runtime state (a workspace, a sandbox, processes) of a key with no record at
//!   all. The key is claimed ([`Store::claim_orphan`]) so no record is made meanwhile, then the
//!   runtime destroys it.
//! - **dangling**: an `active` record the runtime holds nothing for (its workspace vanished),
//!   unused for the grace period. It points at nothing: claimed, and deleted.
//!
//! And the logs: egress verdicts and audit records past the manager's retention or beyond a
//! tenant's row cap ([`Manager::with_log_retention`]) are pruned, oldest first, in bounded
//! batches ([`Store::prune_logs`]), reported in [`GcReport::logs_pruned`] (not in a dry run).
//!
//! And one kind that is not garbage:
//!
//! - **idle**: an `active`, unexpired record with an idle timeout (non-zero) whose last use is
//!   at least that long ago, whose runtime says it has something to stop
//!   ([`sessionbox_core::Runtime::can_stop_idle`]). Its sandbox is stopped
//!   ([`sessionbox_core::Runtime::stop_idle`]: `opensandbox` pauses it), its workspace and
//!   record stay, and the next open starts it again. Runtimes that stop idle sandboxes by
//!   themselves (`isolated`) or have none (`host`, `aio`) say there is nothing to stop, and
//!   are left alone. Reported in [`GcReport::idle_stopped`], never counted by
//!   [`GcReport::found`] or [`GcReport::removed`]; each stop is audited as `idle_stop`.
//!
//! What counts as runtime state is the runtime's inventory, which lists only what the runtime
//! labels as sessionbox's (for `host` and `isolated`, directories named by a conversation key
//! under the data directory's `workspaces/` and `run/`; for `aio`, the same under its root).
//! Nothing else is ever looked at, let alone removed. Records of another runtime are left
//! alone (that runtime's GC handles them).
//!
//! Each removal takes the conversation's operation lock without waiting
//! ([`Store::try_lock_conversation`]); a conversation in use is skipped this round (it is in
//! use, so it is neither orphaned nor idle) and looked at again on the next. Under the lock the
//! candidate is checked again before anything is removed or stopped: a request that used the
//! conversation after it was found (its record's last use moved) keeps its sandbox running.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sessionbox_core::{ConversationKey, ConversationRef, Error, Result, RuntimeConversation};
use sessionbox_store::{ConversationRecord, ConversationState, OrphanClaim, Store};

use crate::Manager;

/// How long the notice of an expired conversation is kept for the next use of its id: 30
/// days. A use after that makes a new conversation without saying that an old one expired.
pub const EXPIRED_NOTICE_DAYS: i64 = 30;

/// How a collection runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcOptions {
    /// Report, remove nothing.
    pub dry_run: bool,
    /// A record must have been unused this long before it counts as stuck or dangling (it may
    /// be being created or destroyed right now otherwise).
    pub grace: Duration,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            dry_run: false,
            grace: Duration::from_secs(60),
        }
    }
}

/// One thing garbage collection found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GcItem {
    /// The conversation key.
    pub key: String,
    /// Tenant and id, when a record names them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The conversation id, when a record names it (with `tenant`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    /// Host processes the runtime counted for it.
    pub processes: usize,
    /// True when it was removed; false in a dry run, or when it was skipped (see `note`).
    pub removed: bool,
    /// Why it was skipped or failed, if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What a collection found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    /// The runtime looked at.
    pub runtime: String,
    /// Nothing was removed.
    pub dry_run: bool,
    /// Expired conversations.
    pub expired: Vec<GcItem>,
    /// Records left `destroying`.
    pub stuck: Vec<GcItem>,
    /// Runtime state without a record.
    pub orphans: Vec<GcItem>,
    /// Records whose runtime state vanished.
    pub dangling: Vec<GcItem>,
    /// Idle conversations whose sandbox was stopped (paused), or in a dry run would be. Not
    /// garbage: the workspace and the record stay, and the next open starts the sandbox
    /// again. An item's `removed` says whether its sandbox was stopped by this collection.
    pub idle_stopped: Vec<GcItem>,
    /// Log rows pruned (past retention or beyond a tenant's cap); zero in a dry run.
    pub logs_pruned: sessionbox_store::LogsPruned,
    /// Warm-pool sandboxes removed: dead, half-made, or beyond their tenant's pool size
    /// ([`Runtime::prune_pool`]); zero in a dry run.
    ///
    /// [`Runtime::prune_pool`]: sessionbox_core::Runtime::prune_pool
    pub pool_pruned: usize,
    /// Snapshots past their retention (`tenant/name`), removed unless a dry run.
    pub snapshots_expired: Vec<String>,
    /// Snapshot files removed: archives no record names and stale temporary files (in a dry
    /// run, those that would be).
    pub snapshot_files_removed: usize,
}

impl GcReport {
    /// Garbage found, of every kind (idle sandboxes are not garbage: see
    /// [`GcReport::stopped`]).
    pub fn found(&self) -> usize {
        self.expired.len() + self.stuck.len() + self.orphans.len() + self.dangling.len()
    }

    /// Everything removed.
    pub fn removed(&self) -> usize {
        [&self.expired, &self.stuck, &self.orphans, &self.dangling]
            .iter()
            .flat_map(|v| v.iter())
            .filter(|i| i.removed)
            .count()
    }

    /// Idle sandboxes this collection stopped.
    pub fn stopped(&self) -> usize {
        self.idle_stopped.iter().filter(|i| i.removed).count()
    }
}

/// True when `r` has had its idle timeout (a non-zero one; zero means never) pass without use
/// at `now`.
fn is_idle(r: &ConversationRecord, now: DateTime<Utc>) -> bool {
    r.idle_timeout
        .filter(|t| !t.is_zero())
        .and_then(|t| chrono::Duration::from_std(t).ok())
        .is_some_and(|t| r.last_used_at + t <= now)
}

fn item(key: &ConversationKey, record: Option<&ConversationRecord>, processes: usize) -> GcItem {
    GcItem {
        key: key.to_string(),
        tenant: record.map(|r| r.tenant.to_string()),
        conversation: record.map(|r| r.conversation_id.to_string()),
        processes,
        removed: false,
        note: None,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Expired,
    Stuck,
    Orphan,
    Dangling,
    Idle,
}

impl Manager {
    /// Runs one garbage collection over this manager's runtime. See the [module
    /// documentation](self).
    ///
    /// # Errors
    /// When the runtime's inventory or the store cannot be read. A failure to remove one item
    /// is noted in the report, not returned.
    pub async fn collect_garbage(&self, options: GcOptions) -> Result<GcReport> {
        let ours = self.runtime.info().name;
        // The inventory first: anything the runtime holds at this point was recorded before
        // (records are made before the runtime opens), so a record missing from the listing
        // that follows was deleted, not not-yet-made.
        let inventory: BTreeMap<ConversationKey, RuntimeConversation> = self
            .runtime
            .list()
            .await?
            .into_iter()
            .map(|c| (c.key.clone(), c))
            .collect();
        let records = self.store.run(move |s| s.list(None)).await?;
        let now = self.store.now();
        let grace = chrono::Duration::from_std(options.grace).unwrap_or(chrono::Duration::MAX);
        let recorded: BTreeSet<&ConversationKey> = records.iter().map(|r| &r.key).collect();
        let procs = |k: &ConversationKey| inventory.get(k).map_or(0, |c| c.processes.len());

        let mut candidates: Vec<(Kind, ConversationKey, Option<ConversationRecord>)> = Vec::new();
        for r in records.iter().filter(|r| r.runtime == ours) {
            let idle_past_grace = now - r.last_used_at >= grace;
            let kind = match r.state {
                ConversationState::Active if r.is_expired(now) => Kind::Expired,
                ConversationState::Destroying if r.state_since.is_none_or(|t| now - t >= grace) => {
                    Kind::Stuck
                }
                ConversationState::Active if !inventory.contains_key(&r.key) && idle_past_grace => {
                    Kind::Dangling
                }
                ConversationState::Active if inventory.contains_key(&r.key) && is_idle(r, now) => {
                    Kind::Idle
                }
                _ => continue,
            };
            candidates.push((kind, r.key.clone(), Some(r.clone())));
        }
        for key in inventory.keys().filter(|k| !recorded.contains(k)) {
            candidates.push((Kind::Orphan, key.clone(), None));
        }

        let mut report = GcReport {
            runtime: ours,
            dry_run: options.dry_run,
            ..GcReport::default()
        };
        for (kind, key, record) in candidates {
            let mut it = item(&key, record.as_ref(), procs(&key));
            if kind == Kind::Idle {
                // The first look: only what the runtime would stop is a candidate at all.
                match self.runtime.can_stop_idle(&key).await {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        tracing::warn!(key = %key.short(), error = %e, "garbage collection could not ask the runtime about an idle sandbox");
                        it.note = Some(e.to_string());
                        report.idle_stopped.push(it);
                        continue;
                    }
                }
            }
            if !options.dry_run {
                match self.remove(kind, &key, record.as_ref()).await {
                    Ok(None) => it.removed = true,
                    Ok(Some(why)) => it.note = Some(why),
                    Err(e) => {
                        tracing::warn!(key = %key.short(), error = %e, "garbage collection could not remove an item");
                        it.note = Some(e.to_string());
                    }
                }
            }
            match kind {
                Kind::Expired => report.expired.push(it),
                Kind::Stuck => report.stuck.push(it),
                Kind::Orphan => report.orphans.push(it),
                Kind::Dangling => report.dangling.push(it),
                Kind::Idle => report.idle_stopped.push(it),
            }
        }
        if !options.dry_run {
            // Notices of expired conversations are kept for a while, for the next use of
            // their ids (see `Conversation::previous_expired`).
            let before = now - chrono::Duration::days(EXPIRED_NOTICE_DAYS);
            if let Err(e) = self
                .store
                .run(move |s| s.prune_expired_notices(before))
                .await
            {
                tracing::warn!(error = %e, "garbage collection could not prune expired notices");
            }
            match self.runtime.prune_pool(false).await {
                Ok(n) => report.pool_pruned = n,
                Err(e) => {
                    tracing::warn!(error = %e, "garbage collection could not prune the warm pool");
                }
            }
            let logs = self.logs;
            match self.store.run(move |s| s.prune_logs(&logs, now)).await {
                Ok(p) => report.logs_pruned = p,
                Err(e) => {
                    tracing::warn!(error = %e, "garbage collection could not prune the logs");
                }
            }
        }
        match self.collect_snapshot_garbage(options.dry_run).await {
            Ok((expired, files)) => {
                report.snapshots_expired = expired;
                report.snapshot_files_removed = files;
            }
            Err(e) => {
                tracing::warn!(error = %e, "garbage collection could not prune the snapshots");
            }
        }
        Ok(report)
    }

    /// Removes one candidate under its lock; `Some(reason)` when it was skipped.
    async fn remove(
        &self,
        kind: Kind,
        key: &ConversationKey,
        seen: Option<&ConversationRecord>,
    ) -> Result<Option<String>> {
        let k = key.clone();
        let Some(_lock) = self.store.run(move |s| s.try_lock_conversation(&k)).await? else {
            return Ok(Some("in use; left for the next collection".into()));
        };
        let k = key.clone();
        let now_record = self.store.run(move |s| s.get(&k)).await?;
        let same = |r: &ConversationRecord| seen.is_some_and(|s| s.generation == r.generation);
        match kind {
            Kind::Expired => {
                let Some(r) = now_record.filter(same) else {
                    return Ok(Some("gone already".into()));
                };
                let k = key.clone();
                if !self
                    .store
                    .run(move |s| s.claim_expired(&k, s.now()))
                    .await?
                {
                    return Ok(Some("renewed before it could be claimed".into()));
                }
                self.note_expired(&r).await;
                let conv = ConversationRef::new(r.tenant.clone(), r.conversation_id.clone());
                let result = self.finish_destroy(&conv, r.generation).await;
                let detail = result
                    .as_ref()
                    .ok()
                    .map(|o| format!("gc expired processes_killed={}", o.runtime.processes_killed));
                self.audit(&conv, "expire", &result, detail).await;
                result.map(|_| None)
            }
            Kind::Stuck => {
                let Some(r) = now_record
                    .filter(same)
                    .filter(|r| r.state == ConversationState::Destroying)
                else {
                    return Ok(Some("changed since it was found".into()));
                };
                let conv = ConversationRef::new(r.tenant.clone(), r.conversation_id.clone());
                let result = self.finish_destroy(&conv, r.generation).await;
                self.audit(&conv, "destroy", &result, Some("gc stuck".into()))
                    .await;
                result.map(|_| None)
            }
            Kind::Dangling => {
                let Some(r) = now_record
                    .filter(same)
                    .filter(|r| r.state == ConversationState::Active)
                else {
                    return Ok(Some("changed since it was found".into()));
                };
                if self.runtime.list().await?.iter().any(|c| &c.key == key) {
                    return Ok(Some("the runtime holds it now".into()));
                }
                let k = key.clone();
                let generation = r.generation;
                if !self
                    .store
                    .run(move |s| s.claim_for_destroy(&k, generation))
                    .await?
                {
                    return Ok(Some("changed since it was found".into()));
                }
                let conv = ConversationRef::new(r.tenant.clone(), r.conversation_id.clone());
                let result = self.finish_destroy(&conv, r.generation).await;
                self.audit(&conv, "destroy", &result, Some("gc dangling".into()))
                    .await;
                result.map(|_| None)
            }
            Kind::Orphan => {
                let k = key.clone();
                if self.store.run(move |s| s.claim_orphan(&k, s.now())).await?
                    == OrphanClaim::HasRecord
                {
                    return Ok(Some("a record was made for it meanwhile".into()));
                }
                let result = self.runtime.destroy(key).await;
                release(&self.store, key).await?;
                result.map(|_| None)
            }
            Kind::Idle => {
                // The second look, under the lock: a request that came in since the first
                // look moved the last use, and keeps its sandbox.
                let now = self.store.now();
                let Some(r) = now_record
                    .filter(same)
                    .filter(|r| r.state == ConversationState::Active && !r.is_expired(now))
                else {
                    return Ok(Some("changed since it was found".into()));
                };
                if !is_idle(&r, now) {
                    return Ok(Some("used since it was found".into()));
                }
                let conv = ConversationRef::new(r.tenant.clone(), r.conversation_id.clone());
                let result = self.runtime.stop_idle(key).await;
                let detail = format!(
                    "gc idle_for_secs={} idle_timeout_secs={}",
                    (now - r.last_used_at).num_seconds(),
                    r.idle_timeout.map_or(0, |t| t.as_secs())
                );
                match result {
                    Ok(true) => {
                        self.audit(&conv, "idle_stop", &Ok::<(), Error>(()), Some(detail))
                            .await;
                        Ok(None)
                    }
                    Ok(false) => Ok(Some("the runtime had nothing running to stop".into())),
                    // In use as the runtime sees it: not a failure, left for the next round.
                    Err(Error::Busy(why)) => Ok(Some(why)),
                    Err(e) => {
                        self.audit(&conv, "idle_stop", &Err::<(), _>(e.clone()), Some(detail))
                            .await;
                        Err(e)
                    }
                }
            }
        }
    }
}

async fn release(store: &Store, key: &ConversationKey) -> Result<()> {
    let k = key.clone();
    store
        .run(move |s| s.release_orphan(&k))
        .await
        .map_err(|e| Error::Backend(format!("could not release a cleaned key: {e}")))
}
