//! Records the store keeps and the filters to read them.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sessionbox_core::{ConversationId, ConversationKey, Error, TenantId};

/// Where a conversation is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConversationState {
    /// In use; sessions may open it.
    Active,
    /// Being torn down: its sandbox and workspace are being removed. The record is deleted when
    /// that is done; a record left in this state means the teardown should be retried.
    Destroying,
}

impl ConversationState {
    /// The name stored in SQL: `active` or `destroying`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConversationState::Active => "active",
            ConversationState::Destroying => "destroying",
        }
    }
}

impl fmt::Display for ConversationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ConversationState {
    type Err = Error;

    /// Parses `active` or `destroying`.
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "active" => Ok(ConversationState::Active),
            "destroying" => Ok(ConversationState::Destroying),
            other => Err(Error::Backend(format!(
                "unknown conversation state {other:?} in the store"
            ))),
        }
    }
}

/// One conversation as stored: a row of `conversations`.
///
/// Times are kept as whole unix milliseconds, so anything finer is dropped on the way in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationRecord {
    /// Primary key: `ConversationKey::derive(&tenant, &conversation_id)`.
    pub key: ConversationKey,
    /// The tenant.
    pub tenant: TenantId,
    /// The caller's id within the tenant.
    pub conversation_id: ConversationId,
    /// The runtime that owns it: `host`, `isolated`, `aio` or `opensandbox`. Fixed for the
    /// record's life.
    pub runtime: String,
    /// The runtime's own id for the conversation's sandbox (container id, sandbox id), if any.
    pub sandbox_ref: Option<String>,
    /// Where it is in its life.
    pub state: ConversationState,
    /// When the record was made.
    pub created_at: DateTime<Utc>,
    /// When it was last used (see [`crate::Store::touch`]).
    pub last_used_at: DateTime<Utc>,
    /// When it expires: garbage collection destroys it from then on, and no use renews it.
    /// `None` for never. Each use moves it to `last use + ttl`, never past `created_at +
    /// max_lifetime`.
    pub expires_at: Option<DateTime<Utc>>,
    /// How long its sandbox may sit idle before it stops (the workspace stays); `None` for the
    /// runtime's default.
    pub idle_timeout: Option<Duration>,
    /// How long it lives unused: each use renews `expires_at` to `now + ttl`. `None` for no
    /// renewal window.
    pub ttl: Option<Duration>,
    /// How long it may live at most from creation, however much it is used. `None` for no
    /// bound.
    pub max_lifetime: Option<Duration>,
    /// Tells this record from an earlier or later one of the same key: a conversation destroyed
    /// and made again gets a new generation. A holder of a session compares it to know the
    /// conversation it opened still exists.
    pub generation: i64,
    /// When its state last changed (for `destroying`: when the destroy was claimed). `None`
    /// for records from before this was kept.
    pub state_since: Option<DateTime<Utc>>,
}

impl ConversationRecord {
    /// Refuses a record owned by another runtime than `runtime`: a conversation is used (and
    /// destroyed) by the runtime that made it.
    ///
    /// # Errors
    /// [`sessionbox_core::Error::Conflict`] naming both runtimes.
    pub fn check_runtime(&self, runtime: &str) -> sessionbox_core::Result<()> {
        if self.runtime == runtime {
            return Ok(());
        }
        Err(sessionbox_core::Error::Conflict(format!(
            "conversation {}/{} belongs to the {} runtime; destroy it first to use it with the \
             {runtime} runtime",
            self.tenant, self.conversation_id, self.runtime
        )))
    }

    /// True when it has expired at `now` (garbage collection destroys it; it is not renewed).
    pub fn is_expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|e| e <= now)
    }

    /// What the conversation is at `now`, as front ends show it: `active`, `expired` (an
    /// active record past its expiry: its next use, or garbage collection, destroys it, and
    /// its files are gone then) or `destroying`.
    pub fn status(&self, now: DateTime<Utc>) -> &'static str {
        match self.state {
            ConversationState::Active if self.is_expired(now) => "expired",
            state => state.as_str(),
        }
    }
}

/// The lifecycle a conversation is created with: how long its sandbox may idle, how long it
/// lives unused, and how long it may live at all. Stored with the record (the store is the
/// source of truth), so a change of configuration applies to conversations created after it.
///
/// ```
/// use std::time::Duration;
/// use sessionbox_store::Lifecycle;
///
/// let l = Lifecycle {
///     idle_timeout: Some(Duration::from_secs(600)),
///     ttl: Some(Duration::from_secs(7 * 24 * 3600)),
///     max_lifetime: Some(Duration::from_secs(30 * 24 * 3600)),
/// };
/// assert!(l.is_bounded());
/// assert!(!Lifecycle::default().is_bounded());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifecycle {
    /// The sandbox stops after this long without a request; the workspace stays. `None`: the
    /// runtime's default.
    pub idle_timeout: Option<Duration>,
    /// The conversation expires this long after its last use (renewed on every use). `None`:
    /// no expiry from disuse.
    pub ttl: Option<Duration>,
    /// The conversation expires this long after its creation at the latest. `None`: no bound.
    pub max_lifetime: Option<Duration>,
}

impl Lifecycle {
    /// True when conversations under it ever expire.
    pub fn is_bounded(&self) -> bool {
        self.ttl.is_some() || self.max_lifetime.is_some()
    }
}

/// The lifecycle of each tenant: a default and per-tenant overrides (each field of an override
/// that is unset falls back to the default's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LifecyclePolicy {
    /// For tenants without an override.
    pub default: Lifecycle,
    /// Per tenant.
    pub tenants: BTreeMap<TenantId, Lifecycle>,
}

impl LifecyclePolicy {
    /// The lifecycle of `tenant`.
    pub fn for_tenant(&self, tenant: &TenantId) -> Lifecycle {
        let d = self.default;
        match self.tenants.get(tenant) {
            None => d,
            Some(t) => Lifecycle {
                idle_timeout: t.idle_timeout.or(d.idle_timeout),
                ttl: t.ttl.or(d.ttl),
                max_lifetime: t.max_lifetime.or(d.max_lifetime),
            },
        }
    }
}

/// One entry of the audit log, as appended by [`crate::Store::audit`].
///
/// **`detail` must never hold file contents, command output, environment values or secrets**:
/// a path, a command's exit code or an error message is fine. Callers enforce this; the store
/// writes what it is given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When it happened (whole unix milliseconds are kept).
    pub at: DateTime<Utc>,
    /// The tenant it happened in.
    pub tenant: TenantId,
    /// The conversation, when it was about one. Not a foreign key: entries outlive their
    /// conversation.
    pub conversation_key: Option<ConversationKey>,
    /// What was done: `open`, `exec`, `write`, `destroy`, ...
    pub operation: String,
    /// `ok`, or the [`Error::code`] of the failure (`outside_workspace`, ...).
    pub outcome: String,
    /// A short, secret-free note (see above).
    pub detail: Option<String>,
}

/// An [`AuditEntry`] as read back, with its row id (increasing in append order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// The row id.
    pub id: i64,
    /// The entry.
    #[serde(flatten)]
    pub entry: AuditEntry,
}

/// Which audit entries [`crate::Store::audit_log`] returns. The default returns all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Only this tenant's entries.
    pub tenant: Option<TenantId>,
    /// Only this conversation's entries.
    pub key: Option<ConversationKey>,
    /// Only entries at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// At most this many (the newest).
    pub limit: Option<usize>,
}
