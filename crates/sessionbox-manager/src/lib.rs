//! Conversation lifecycle: the one sequence every front end (CLI, HTTP, MCP) runs.
//!
//! [`Manager::open`] records the conversation in the store (insert-if-absent, so concurrent
//! first calls make one record), then asks the runtime for a session. The [`Conversation`] it
//! returns is itself a [`Session`]: every operation is passed to the runtime's session and
//! recorded in the audit log (operation and outcome; never file contents, commands or secrets).
//! [`Manager::destroy`] ends the conversation in the runtime, then deletes its record.
//! Over 800 lines on purpose: the audited [`Conversation`] forwards every `Session` method
//! beside the one open sequence it is made by; apart, neither reads alone.
//!
//! Lifecycle: a new record gets its tenant's [`Lifecycle`](sessionbox_store::Lifecycle) (see [`Manager::with_lifecycle`]);
//! every open renews it ([`Store::touch`]); an expired conversation is not renewed but
//! destroyed, by [`Manager::collect_garbage`] (see [`gc`]) or by the next open, which then makes
//! it afresh. An open that finds, after the runtime opened the conversation, that its record
//! was destroyed meanwhile (a renew that lost to expiry) removes what the runtime just made, so
//! no sandbox is left without an owner.
//!
//! With skills configured ([`Manager::with_skills`]), every open also delivers the tenant's
//! skills: a runtime that mounts them ([`Runtime::mounted_skills`]) has done so itself; for any
//! other the copies in the workspace are checked and brought up to date
//! ([`sessionbox_skills::sync_copies`]). Then each skill's bootstrap command runs if the store
//! says it has not run in this conversation (for this version of the skill).
//!
//! Architecture invariant: this crate knows no wire format and no runtime in particular; it sees
//! only the [`Runtime`] and [`Session`] traits, the store and the skills catalog.

mod directory;
pub mod gc;
mod open;
mod recover;
mod snapshots;

use std::sync::Arc;

use async_trait::async_trait;
use sessionbox_core::{
    ArchiveStats, BackgroundCommand, CommandOutput, ConversationKey, ConversationRef,
    DestroyReport, DirEntry, EditRequest, EditResult, Error, ExecRequest, ExecResult, ExecSink,
    FileStat, GrepMatch, GrepRequest, OutputRequest, Result, Runtime, Session, TenantId,
    WorkspacePath,
};
use sessionbox_skills::{Catalog, Delivery, Skills};
use sessionbox_store::{
    AuditEntry, ConversationRecord, ExpiredNotice, LifecyclePolicy, OrphanClaim, Store,
};

pub use directory::{StoreDirectory, decode_policy, effective_policy};
pub use gc::{GcItem, GcOptions, GcReport};
pub use open::{Held, TOUCH_EVERY};
pub use snapshots::{DEFAULT_TEMPLATE, ForkFrom, SnapshotConfig};

/// Snapshot operations one process runs at once (see `Manager::snapshot_slots`); one more is
/// refused as busy (never waited for: an operation may hold a conversation, and waiting for a
/// slot while holding one could wait forever on one that waits for the conversation). One tenant
/// may hold at most half of them.
const SNAPSHOT_SLOTS: usize = 4;

/// A bootstrap claimed this long ago whose end was never recorded (its process died) may be
/// claimed again.
const BOOTSTRAP_STALE_MINUTES: i64 = 15;

/// At most one warning per this long says that audit records could not be written.
const AUDIT_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Store plus runtime: opens, lists and destroys conversations, and audits what is done to them.
///
/// Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Manager {
    store: Store,
    runtime: Arc<dyn Runtime>,
    lifecycle: Arc<LifecyclePolicy>,
    skills: Arc<Skills>,
    logs: sessionbox_store::LogRetention,
    /// Tenants whose warm pool this process refills ([`Manager::with_pool_refill`]); `None`:
    /// it refills none.
    warm: Option<Arc<std::sync::Mutex<std::collections::BTreeSet<TenantId>>>>,
    /// Where snapshots are kept and their limits ([`Manager::with_snapshots`]); `None`: no
    /// snapshots.
    snapshots: Option<Arc<SnapshotConfig>>,
    /// Snapshot operations (take, restore, fork, template start, import) that may hold
    /// temporary archives at once in this process: each holds at most a few times
    /// `max_archive_bytes` of scratch disk, so this bounds what many conversations at once
    /// can make the host spend.
    /// At most half of them held by one tenant (`snapshots::slots`).
    snapshot_slots: Arc<snapshots::SnapshotSlots>,
    /// Records made by a first open that failed and that could not be removed then (the
    /// store was unavailable), by key, with their generation: removed by the next open of the
    /// key in this process or by a retry in the background (see `Manager::undo_later`).
    pending_undo: Arc<std::sync::Mutex<std::collections::BTreeMap<ConversationKey, i64>>>,
}

impl std::fmt::Debug for Manager {
    /// The store (as [`Store::describe`] names it) and the policies; the runtime is opaque.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("store", &self.store.describe())
            .field("lifecycle", &self.lifecycle)
            .field("skills", &self.skills)
            .finish_non_exhaustive()
    }
}

/// What [`Manager::destroy`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestroyOutcome {
    /// What the runtime removed.
    pub runtime: DestroyReport,
    /// True when a store record existed and was deleted.
    pub record_removed: bool,
}

impl DestroyOutcome {
    /// True when nothing existed to remove.
    pub fn nothing_removed(&self) -> bool {
        !self.record_removed
            && !self.runtime.workspace_removed
            && !self.runtime.sandbox_removed
            && self.runtime.processes_killed == 0
    }
}

impl Manager {
    /// Serves conversations of `runtime`, recorded in `store`.
    pub fn new(store: Store, runtime: Arc<dyn Runtime>) -> Self {
        Manager {
            store,
            runtime,
            lifecycle: Arc::default(),
            skills: Arc::default(),
            logs: sessionbox_store::LogRetention::default(),
            warm: None,
            snapshots: None,
            snapshot_slots: Arc::new(snapshots::SnapshotSlots::new(SNAPSHOT_SLOTS)),
            pending_undo: Arc::default(),
        }
    }

    /// Refills the runtime's warm pool ([`Runtime::refill_pool`]) in the background after
    /// every open that created a conversation, for its tenant, and remembers the tenant for
    /// [`Manager::maintain_pools`]. For long-lived processes (`serve`, `mcp`): a one-shot
    /// process would exit before the refill ends.
    #[must_use]
    pub fn with_pool_refill(mut self) -> Self {
        self.warm = Some(Arc::default());
        self
    }

    /// Refills the warm pools of `tenants` and of every tenant this process has opened a
    /// conversation for (with [`Manager::with_pool_refill`]), which also keeps pooled
    /// sandboxes from stopping when idle. Returns how many sandboxes were launched. Call it
    /// periodically (every minute or so).
    ///
    /// # Errors
    /// The first refill that fails (the others are still tried).
    pub async fn maintain_pools(&self, tenants: &[TenantId]) -> Result<usize> {
        let mut all: std::collections::BTreeSet<TenantId> = tenants.iter().cloned().collect();
        if let Some(warm) = &self.warm {
            all.extend(
                warm.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .cloned(),
            );
        }
        let (mut launched, mut first_error) = (0, None);
        for t in &all {
            match self.runtime.refill_pool(t).await {
                Ok(n) => launched += n,
                Err(e) => {
                    tracing::warn!(tenant = %t, error = %e, "cannot refill the warm pool");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(launched),
        }
    }

    /// After an open that created a conversation: refills its tenant's pool in the background.
    pub(crate) fn refill_after_create(&self, tenant: &TenantId) {
        let Some(warm) = &self.warm else {
            return;
        };
        warm.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(tenant.clone());
        let (runtime, tenant) = (self.runtime.clone(), tenant.clone());
        tokio::spawn(async move {
            if let Err(e) = runtime.refill_pool(&tenant).await {
                tracing::warn!(tenant = %tenant, error = %e, "cannot refill the warm pool");
            }
        });
    }

    /// How long and how much the egress and audit logs keep: what garbage collection prunes
    /// to (the default: [`sessionbox_store::LogRetention::default`]).
    pub fn with_log_retention(mut self, logs: sessionbox_store::LogRetention) -> Self {
        self.logs = logs;
        self
    }

    /// The same, creating conversations with `policy`'s lifecycle for their tenant.
    #[must_use]
    pub fn with_lifecycle(mut self, policy: LifecyclePolicy) -> Self {
        self.lifecycle = Arc::new(policy);
        self
    }

    /// The lifecycle policy new conversations get.
    pub fn lifecycle(&self) -> &LifecyclePolicy {
        &self.lifecycle
    }

    /// Delivers `skills` into every conversation it opens (see the module documentation).
    #[must_use]
    pub fn with_skills(mut self, skills: Skills) -> Self {
        self.skills = Arc::new(skills);
        self
    }

    /// The configured skills directories.
    pub fn skills(&self) -> &Skills {
        &self.skills
    }

    /// Discovers `tenant`'s skills now (an empty catalog when it has none). A skill that
    /// breaks a rule is left out and listed in [`Catalog::skipped`] with the rule; the server
    /// log gets a warning the first time this process sees each such fault.
    ///
    /// # Errors
    /// [`Error::Backend`] when the discovery task fails.
    pub async fn skill_catalog(&self, tenant: &TenantId) -> Result<Catalog> {
        if self.skills.roots(tenant).is_empty() {
            return Ok(Catalog::default());
        }
        let skills = self.skills.clone();
        let t = tenant.clone();
        let catalog = off_runtime(move || skills.catalog(&t)).await?;
        warn_skipped(tenant, &catalog);
        Ok(catalog)
    }

    /// The skills to announce to `conversation`'s model: its tenant's catalog, less those its
    /// running sandbox does not have (a runtime that mounts skills keeps those it started
    /// with: see [`Runtime::present_skills`]). A skill added meanwhile is announced once the
    /// sandbox has started again (after it stops when idle).
    ///
    /// # Errors
    /// As [`Manager::skill_catalog`].
    pub async fn announced_skills(&self, conversation: &ConversationRef) -> Result<Catalog> {
        let mut catalog = self.skill_catalog(&conversation.tenant).await?;
        if self.runtime.mounted_skills().is_some() {
            let runtime = self.runtime.clone();
            let key = conversation.key.clone();
            let present = off_runtime(move || runtime.present_skills(&key)).await?;
            if let Some(present) = present {
                catalog
                    .skills
                    .retain(|s| present.iter().any(|p| p == s.name()));
            }
        }
        Ok(catalog)
    }

    /// How `conversation` receives skills, hence where a skill's base directory is.
    pub fn skill_delivery(&self, conversation: &ConversationRef) -> Delivery {
        match self.runtime.mounted_skills() {
            Some(root) => Delivery::Mounted { root },
            None => Delivery::Copied {
                workspace_root: self.runtime.presented_root(&conversation.key),
            },
        }
    }

    /// The runtime.
    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.runtime
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Checks a caller's path for `conversation` without opening it (so bad input creates
    /// nothing).
    ///
    /// # Errors
    /// [`Error::InvalidPath`] or [`Error::OutsideWorkspace`].
    pub fn check_path(&self, conversation: &ConversationRef, path: &str) -> Result<WorkspacePath> {
        WorkspacePath::resolve(&self.runtime.presented_root(&conversation.key), path)
    }

    /// Destroys an expired conversation if this call can claim it (a renew may win instead).
    async fn destroy_expired(
        &self,
        conversation: &ConversationRef,
        record: &ConversationRecord,
    ) -> Result<()> {
        let key = conversation.key.clone();
        let claimed = self
            .store
            .run(move |s| s.claim_expired(&key, s.now()))
            .await?;
        if !claimed {
            return Ok(());
        }
        self.note_expired(record).await;
        let result = self.finish_destroy(conversation, record.generation).await;
        let detail = result.as_ref().ok().map(|o| {
            format!(
                "expired_at={} processes_killed={}",
                record
                    .expires_at
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                    .unwrap_or_default(),
                o.runtime.processes_killed
            )
        });
        self.audit(conversation, "expire", &result, detail).await;
        result.map(drop)
    }

    /// Removes the record of generation `generation`, made by an open whose runtime then
    /// failed, with anything the runtime may have left. Best effort: what the runtime cannot
    /// remove now (it may be unreachable) is labelled as the conversation's, and garbage
    /// collection removes it as an orphan once the record is gone.
    async fn undo_create(&self, key: &ConversationKey, generation: i64) {
        let k = key.clone();
        match self
            .finishing(move |s| s.claim_for_destroy(&k, generation))
            .await
        {
            Ok(true) => {}
            // Another call holds it now (a destroy, or a later record of the key).
            Ok(false) => return,
            Err(Error::Unavailable(_)) => {
                self.undo_later(key, generation);
                return;
            }
            Err(e) => {
                tracing::warn!("cannot remove the record of a failed first open: {e}");
                return;
            }
        }
        if let Err(e) = self.runtime.destroy(key).await {
            tracing::warn!("after a failed first open, the runtime could not clean up: {e}");
        }
        let k = key.clone();
        match self
            .finishing(move |s| s.delete_generation(&k, generation))
            .await
        {
            Ok(_) => {}
            Err(Error::Unavailable(_)) => self.delete_later(key, generation, None),
            Err(e) => tracing::warn!("cannot remove the record of a failed first open: {e}"),
        }
    }

    /// The runtime's teardown, then the record of generation `generation` (claimed
    /// `destroying` by the caller; a later record of the key is left alone), then what egress
    /// kept of the conversation (its own policy and its verdicts): a new conversation of the
    /// id starts with its tenant's policy.
    async fn finish_destroy(
        &self,
        conversation: &ConversationRef,
        generation: i64,
    ) -> Result<DestroyOutcome> {
        let key = &conversation.key;
        let runtime = self.runtime.destroy(key).await?;
        let k = key.clone();
        let record_removed = match self
            .finishing(move |s| s.delete_generation(&k, generation))
            .await
        {
            Ok(removed) => removed,
            Err(e @ Error::Unavailable(_)) => {
                self.delete_later(key, generation, Some(conversation.clone()));
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        if record_removed {
            self.forget_egress(conversation).await?;
        }
        Ok(DestroyOutcome {
            runtime,
            record_removed,
        })
    }

    /// Removes the conversation's own network policy and egress verdicts.
    async fn forget_egress(&self, conversation: &ConversationRef) -> Result<()> {
        let c = conversation.clone();
        self.finishing(move |s| s.forget_conversation_egress(&c).map(drop))
            .await
    }

    /// Keeps a notice that `record` expired, for the next use of its id. Best effort: a
    /// failure is logged (the destroy goes on).
    pub(crate) async fn note_expired(&self, record: &ConversationRecord) {
        let r = record.clone();
        if let Err(e) = self.store.run(move |s| s.note_expired(&r, s.now())).await {
            tracing::warn!(error = %e, "cannot keep the notice of an expired conversation");
        }
    }

    /// Brings the conversation's skills up to date and runs the bootstraps it has not run.
    /// Returns the audit detail.
    async fn deliver_skills(
        &self,
        conversation: &ConversationRef,
        session: &dyn Session,
    ) -> Result<String> {
        let catalog = self.skill_catalog(&conversation.tenant).await?;
        let delivery = self.skill_delivery(conversation);
        let mut detail = format!("skills={}", catalog.skills.len());
        if !catalog.skipped.is_empty() {
            // Left out, each with the rule it broke: the audit's warning.
            let skipped: Vec<String> = catalog
                .skipped
                .iter()
                .map(|k| format!("{} ({})", k.name(), k.error))
                .collect();
            detail.push_str(&format!(" skipped={}", skipped.join("; ")));
        }
        if matches!(delivery, Delivery::Copied { .. }) {
            let report = sessionbox_skills::sync_copies(session, &catalog).await?;
            if !report.copied.is_empty() {
                detail.push_str(&format!(" copied={}", report.copied.join(",")));
            }
            if !report.removed.is_empty() {
                detail.push_str(&format!(" removed={}", report.removed.join(",")));
            }
        }
        for skill in &catalog.skills {
            let Some(command) = skill.doc.bootstrap() else {
                continue;
            };
            let key = conversation.key.clone();
            let (name, digest) = (skill.doc.name.clone(), skill.digest.clone());
            let claimed = self
                .store
                .run(move |s| {
                    s.claim_bootstrap(
                        &key,
                        &name,
                        &digest,
                        s.now(),
                        chrono::Duration::minutes(BOOTSTRAP_STALE_MINUTES),
                    )
                })
                .await?;
            if !claimed {
                continue;
            }
            let base = delivery.base_path(skill.name());
            let run = sessionbox_skills::run_bootstrap(session, command, &base).await;
            // A run that could not start is recorded as failed (exit -1): the next open tries
            // again, as after a failing command.
            let code = run.as_ref().map_or(-1, ExecResult::shell_exit_code);
            let key = conversation.key.clone();
            let name = skill.doc.name.clone();
            self.store
                .run(move |s| s.finish_bootstrap(&key, &name, code, s.now()))
                .await?;
            let outcome = match &run {
                Ok(r) if r.success() => Ok(()),
                Ok(r) => Err(Error::Conflict(format!(
                    "the bootstrap of skill {} exited {}",
                    skill.name(),
                    r.shell_exit_code()
                ))),
                Err(e) => Err(e.clone()),
            };
            let d = format!("skill={} exit={code}", skill.name());
            self.audit(conversation, "skill.bootstrap", &outcome, Some(d))
                .await;
            if let Err(e) = &outcome {
                // Not fatal: the conversation opens without it, the next open runs it again.
                tracing::warn!(error = %e, "skill bootstrap failed");
            }
        }
        Ok(detail)
    }

    /// Ends `conversation`: its processes, sandbox, workspace and record. Idempotent.
    ///
    /// The record is marked `destroying` first, so no open makes a sandbox for it meanwhile;
    /// if the runtime fails, it stays so and garbage collection finishes the job.
    pub async fn destroy(&self, conversation: &ConversationRef) -> Result<DestroyOutcome> {
        let result = self.destroy_inner(conversation).await;
        let detail = result.as_ref().ok().map(|o| {
            format!(
                "processes_killed={} workspace_removed={} sandbox_removed={} record_removed={}",
                o.runtime.processes_killed,
                o.runtime.workspace_removed,
                o.runtime.sandbox_removed,
                o.record_removed
            )
        });
        self.audit(conversation, "destroy", &result, detail).await;
        result
    }

    async fn destroy_inner(&self, conversation: &ConversationRef) -> Result<DestroyOutcome> {
        let key = &conversation.key;
        // Destroyed on purpose: a later use of the id is not told it expired.
        let k = key.clone();
        self.store.run(move |s| s.forget_expired_notice(&k)).await?;
        // A conversation is destroyed by the runtime that holds it: another runtime would remove
        // the record and leave the sandbox running.
        let k = key.clone();
        let Some(record) = self.store.run(move |s| s.get(&k)).await? else {
            // No record: remove whatever the runtime holds for the key, with the key claimed
            // so that no record is made meanwhile.
            let k = key.clone();
            if self.store.run(move |s| s.claim_orphan(&k, s.now())).await? == OrphanClaim::HasRecord
            {
                return Err(Error::Busy(
                    "the conversation was created while it was being destroyed; retry".into(),
                ));
            }
            let runtime = self.runtime.destroy(key).await;
            let k = key.clone();
            self.store.run(move |s| s.release_orphan(&k)).await?;
            // A policy set for the id before it was ever used goes too: destroy ends it all.
            self.forget_egress(conversation).await?;
            return Ok(DestroyOutcome {
                runtime: runtime?,
                record_removed: false,
            });
        };
        let ours = self.runtime.info().name;
        if record.runtime != ours {
            return Err(Error::Conflict(format!(
                "conversation {} belongs to the {} runtime; destroy it with that runtime",
                record.conversation_id, record.runtime
            )));
        }
        let k = key.clone();
        let generation = record.generation;
        self.store
            .run(move |s| s.claim_for_destroy(&k, generation))
            .await?;
        self.finish_destroy(conversation, generation).await
    }

    /// The recorded conversations, of one tenant or all, most recently used first.
    pub async fn list(&self, tenant: Option<&TenantId>) -> Result<Vec<ConversationRecord>> {
        let tenant = tenant.cloned();
        self.store.run(move |s| s.list(tenant.as_ref())).await
    }

    async fn audit<T>(
        &self,
        conversation: &ConversationRef,
        operation: &str,
        outcome: &Result<T>,
        detail: Option<String>,
    ) {
        audit(&self.store, conversation, operation, outcome, detail).await;
    }
}

/// Logs a warning for each skill `catalog` left out, once per process and fault (every open
/// scans the skills again; the log need not repeat itself).
fn warn_skipped(tenant: &TenantId, catalog: &Catalog) {
    static WARNED: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    for k in &catalog.skipped {
        let fault = format!("{tenant}\n{}", k.error);
        let new = WARNED.lock().map(|mut w| w.insert(fault)).unwrap_or(true);
        if new {
            tracing::warn!(
                target: "sessionbox::skills",
                tenant = %tenant,
                skill = %k.name(),
                "skill left out: {}",
                k.error
            );
        }
    }
}

/// Appends one audit record. A failing audit write is logged, not returned: the operation it
/// describes has already happened.
async fn audit<T>(
    store: &Store,
    conversation: &ConversationRef,
    operation: &str,
    outcome: &Result<T>,
    detail: Option<String>,
) {
    audit_entry(
        store,
        &conversation.tenant,
        Some(&conversation.key),
        operation,
        outcome,
        detail,
    )
    .await;
}

/// [`audit`] of what belongs to a tenant and no conversation (its snapshots and templates).
async fn audit_tenant<T>(
    store: &Store,
    tenant: &TenantId,
    operation: &str,
    outcome: &Result<T>,
    detail: Option<String>,
) {
    audit_entry(store, tenant, None, operation, outcome, detail).await;
}

async fn audit_entry<T>(
    store: &Store,
    tenant: &TenantId,
    key: Option<&ConversationKey>,
    operation: &str,
    outcome: &Result<T>,
    detail: Option<String>,
) {
    let entry = AuditEntry {
        at: store.now(),
        tenant: tenant.clone(),
        conversation_key: key.cloned(),
        operation: operation.to_owned(),
        outcome: match outcome {
            Ok(_) => "ok".to_owned(),
            Err(e) => e.code().to_owned(),
        },
        detail,
    };
    if let Err(e) = store.run(move |s| s.audit(&entry)).await {
        // While the store is down or full every operation fails to audit: one line per
        // `AUDIT_WARN_EVERY` says so, with how many went unwritten since the last.
        static LAST: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
        static LOST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let lost = LOST.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t.elapsed() >= AUDIT_WARN_EVERY) {
            *last = Some(std::time::Instant::now());
            LOST.store(0, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(error = %e, records = lost, "audit records not written");
        }
    }
}

/// Runs blocking work that is not a store call (skills discovery, a runtime's file check) off
/// the async runtime. Store calls go through [`Store::run`].
async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Backend(format!("a blocking task failed: {e}")))
}

/// An open conversation: a runtime [`Session`] whose every operation is audited.
pub struct Conversation {
    session: Box<dyn Session>,
    conversation: ConversationRef,
    record: ConversationRecord,
    created: bool,
    previous_expired: Option<ExpiredNotice>,
    /// The hash of the network policy in force when it opened (`None`: none stored).
    policy_hash: Option<String>,
    store: Store,
    /// When its record was last renewed by this process (see [`Manager::revalidate`]).
    touched: std::sync::Mutex<std::time::Instant>,
    /// When this open created it from a runtime's clone: what the clone holds and where it
    /// came from (`snapshot=NAME` or `conversation=ID`).
    cloned: Option<(sessionbox_core::ArchiveStats, String)>,
}

impl std::fmt::Debug for Conversation {
    /// Which conversation, whether this open created it, and its policy hash; the runtime
    /// session is opaque.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conversation")
            .field("conversation", &self.conversation)
            .field("created", &self.created)
            .field("policy_hash", &self.policy_hash)
            .finish_non_exhaustive()
    }
}

impl Conversation {
    /// True when this open created the conversation (it did not exist before).
    pub fn created(&self) -> bool {
        self.created
    }

    /// When this open created the conversation anew because the last one of its id expired
    /// (destroyed by this open or, earlier, by garbage collection): that conversation, whose
    /// files are gone. Front ends tell the caller so.
    pub fn previous_expired(&self) -> Option<&ExpiredNotice> {
        self.previous_expired.as_ref()
    }

    /// The hash of the network policy in force when this conversation was opened (read before
    /// the runtime opened it; `None`: no policy stored, the profile `none`): what
    /// [`Manager::revalidate`] compares with the policy in force now.
    pub fn policy_hash(&self) -> Option<&str> {
        self.policy_hash.as_deref()
    }

    /// When this process last renewed the conversation's record: at the open, then by
    /// [`Manager::revalidate`].
    pub fn touched_at(&self) -> std::time::Instant {
        *self.touched.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn touched_now(&self) {
        *self.touched.lock().unwrap_or_else(|e| e.into_inner()) = std::time::Instant::now();
    }

    /// The store record as it was when opened.
    pub fn record(&self) -> &ConversationRecord {
        &self.record
    }

    /// Tenant, id and key.
    pub fn conversation(&self) -> &ConversationRef {
        &self.conversation
    }

    async fn audited<T>(&self, operation: &str, detail: Option<String>, r: Result<T>) -> Result<T> {
        audit(&self.store, &self.conversation, operation, &r, detail).await;
        r
    }
}

#[async_trait]
impl Session for Conversation {
    fn key(&self) -> &ConversationKey {
        self.session.key()
    }

    fn workspace_root(&self) -> &str {
        self.session.workspace_root()
    }

    fn state_lost(&self) -> bool {
        self.session.state_lost()
    }

    async fn agent(&self) -> Result<Option<sessionbox_core::AgentAccess>> {
        self.session.agent().await
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecResult> {
        let r = self.session.exec(request).await;
        self.audited("exec", exec_detail(&r), r).await
    }

    async fn exec_stream(&self, request: ExecRequest, sink: ExecSink<'_>) -> Result<ExecResult> {
        let r = self.session.exec_stream(request, sink).await;
        self.audited("exec", exec_detail(&r), r).await
    }

    async fn read(&self, path: &str) -> Result<Vec<u8>> {
        let r = self.session.read(path).await;
        self.audited("read", Some(path_detail(path)), r).await
    }

    async fn write(&self, path: &str, data: &[u8]) -> Result<()> {
        // A trailing slash names a directory: a file is never written there (the runtimes'
        // path rules would drop the slash and make a file of that name).
        let r = match path.ends_with('/') {
            true => Err(Error::InvalidPath {
                path: path.to_owned(),
                reason: "ends with '/', which names a directory: a file path has none".into(),
            }),
            false => self.session.write(path, data).await,
        };
        let detail = format!("{} bytes={}", path_detail(path), data.len());
        self.audited("write", Some(detail), r).await
    }

    async fn edit(&self, path: &str, edit: &EditRequest) -> Result<EditResult> {
        let r = self.session.edit(path, edit).await;
        self.audited("edit", Some(path_detail(path)), r).await
    }

    async fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        let r = self.session.list(path).await;
        self.audited("list", Some(path_detail(path)), r).await
    }

    async fn glob(&self, pattern: &str) -> Result<Vec<String>> {
        let r = self.session.glob(pattern).await;
        self.audited("glob", None, r).await
    }

    async fn grep(&self, request: &GrepRequest) -> Result<Vec<GrepMatch>> {
        let r = self.session.grep(request).await;
        self.audited("grep", None, r).await
    }

    async fn stat(&self, path: &str) -> Result<FileStat> {
        let r = self.session.stat(path).await;
        self.audited("stat", Some(path_detail(path)), r).await
    }

    async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        let r = self.session.remove(path, recursive).await;
        self.audited("remove", Some(path_detail(path)), r).await
    }

    async fn mkdir(&self, path: &str) -> Result<()> {
        let r = self.session.mkdir(path).await;
        self.audited("mkdir", Some(path_detail(path)), r).await
    }

    // Background commands: starting, listing, reading a status and killing are audited;
    // output reads are not (a follower polls them; the front end's own record of the request
    // says who read).

    async fn spawn(&self, request: ExecRequest) -> Result<BackgroundCommand> {
        let r = self.session.spawn(request).await;
        let detail = r.as_ref().ok().map(|c| format!("command={}", c.id));
        self.audited("exec_background", detail, r).await
    }

    async fn commands(&self) -> Result<Vec<BackgroundCommand>> {
        let r = self.session.commands().await;
        self.audited("commands", None, r).await
    }

    async fn command(&self, id: &str) -> Result<BackgroundCommand> {
        let r = self.session.command(id).await;
        self.audited("command_status", Some(format!("command={id}")), r)
            .await
    }

    async fn command_output(&self, id: &str, read: OutputRequest) -> Result<CommandOutput> {
        self.session.command_output(id, read).await
    }

    async fn kill_command(&self, id: &str) -> Result<BackgroundCommand> {
        let r = self.session.kill_command(id).await;
        self.audited("command_kill", Some(format!("command={id}")), r)
            .await
    }

    // Not audited: a pipe passed through is many writes (whose bytes are never recorded).
    async fn write_stdin(&self, id: &str, data: &[u8]) -> Result<sessionbox_core::StdinWrite> {
        self.session.write_stdin(id, data).await
    }

    async fn close_stdin(&self, id: &str) -> Result<()> {
        self.session.close_stdin(id).await
    }

    async fn archive_workspace(
        &self,
        to: &std::path::Path,
        max_bytes: u64,
    ) -> Result<ArchiveStats> {
        let r = self.session.archive_workspace(to, max_bytes).await;
        let detail = r.as_ref().ok().map(archive_detail);
        self.audited("archive", detail, r).await
    }

    async fn restore_workspace(&self, from: &std::path::Path) -> Result<ArchiveStats> {
        let r = self.session.restore_workspace(from).await;
        let detail = r.as_ref().ok().map(archive_detail);
        self.audited("restore", detail, r).await
    }

    async fn close(self: Box<Self>) -> Result<()> {
        let Conversation {
            session,
            conversation,
            store,
            ..
        } = *self;
        let r = session.close().await;
        audit(&store, &conversation, "close", &r, None).await;
        r
    }
}

/// What the audit log keeps of a command: exit code, timeout, duration. The command line is
/// not recorded: it may carry secrets.
fn exec_detail(r: &Result<ExecResult>) -> Option<String> {
    r.as_ref().ok().map(|r| {
        format!(
            "exit={} timed_out={} duration_ms={}",
            r.shell_exit_code(),
            r.timed_out,
            r.duration.as_millis()
        )
    })
}

/// What the audit log keeps of an archive: its counts.
fn archive_detail(s: &ArchiveStats) -> String {
    format!(
        "bytes={} files={} directories={} links={} skipped={}",
        s.bytes, s.files, s.directories, s.links, s.skipped
    )
}

/// A path for the audit log: escaped, cut to 256 characters.
fn path_detail(path: &str) -> String {
    let cut: String = path.chars().take(256).collect();
    format!("path={cut:?}")
}
