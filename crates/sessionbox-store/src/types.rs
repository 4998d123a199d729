//! Records the store keeps and the filters to read them.

use std::fmt;
use std::str::FromStr;

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
    /// When it may be reclaimed; `None` for never.
    pub expires_at: Option<DateTime<Utc>>,
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
