//! Egress: the network policy of each tenant and conversation, and the gateway's verdicts.
//!
//! The store keeps a policy as the text and hash the caller gives (the egress crate owns its
//! meaning); it knows only its scope. A conversation's own policy wins over its tenant's; with
//! neither, the profile is `none`. Policies are kept by scope, so one can be set before the
//! conversation exists. Destroying a conversation removes its own policy and its verdicts
//! ([`Store::forget_conversation_egress`]): a new conversation of the same id starts with its
//! tenant's policy. The tenant's policy and the audit log stay.

use chrono::{DateTime, Utc};
use sessionbox_core::{ConversationKey, ConversationRef, Error, Result, TenantId};

use crate::db::{Db, Row};
use crate::retention::capped;
use crate::{Store, TxLock, time};

/// Whose policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyScope {
    /// Every conversation of the tenant without a policy of its own.
    Tenant(TenantId),
    /// One conversation.
    Conversation(ConversationRef),
}

impl PolicyScope {
    fn key(&self) -> String {
        match self {
            PolicyScope::Tenant(t) => format!("tenant:{}", t.as_str()),
            PolicyScope::Conversation(c) => c.key.as_str().to_owned(),
        }
    }
}

/// A stored policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPolicy {
    /// The tenant.
    pub tenant: TenantId,
    /// The conversation id, for a conversation's own policy.
    pub conversation_id: Option<String>,
    /// The policy's canonical text (JSON, as the egress crate writes it).
    pub policy: String,
    /// Its hash (64 hex digits).
    pub hash: String,
    /// When it was set.
    pub updated_at: DateTime<Utc>,
}

/// One verdict of the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressLogEntry {
    /// When it was decided.
    pub at: DateTime<Utc>,
    /// The tenant.
    pub tenant: TenantId,
    /// The conversation.
    pub conversation_key: ConversationKey,
    /// Allowed or denied.
    pub allowed: bool,
    /// `CONNECT` or the HTTP method.
    pub method: String,
    /// `host:port` as asked (never a path or query).
    pub target: String,
    /// The address connected to.
    pub address: Option<String>,
    /// The rule that allowed it, or why it was denied.
    pub rule: String,
    /// Bytes sent to the target.
    pub bytes_up: u64,
    /// Bytes received from it.
    pub bytes_down: u64,
    /// How long the connection lasted.
    pub duration_ms: u64,
    /// How it ended.
    pub end: Option<String>,
    /// How many identical verdicts this row stands for (at least 1): the gateway writes a
    /// flood of one verdict as one row. `at` is the first one's time; `bytes_up` and
    /// `bytes_down` are their sums, `duration_ms` the longest.
    pub count: u64,
}

/// A logged verdict with its sequence number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressLogRecord {
    /// Increasing with each entry.
    pub id: i64,
    /// The entry.
    pub entry: EgressLogEntry,
}

/// Which verdicts to read.
#[derive(Debug, Clone, Default)]
pub struct EgressLogFilter {
    /// Only this tenant's.
    pub tenant: Option<TenantId>,
    /// Only this conversation's.
    pub key: Option<ConversationKey>,
    /// Only at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// At most this many (the newest).
    pub limit: Option<usize>,
}

fn stored(r: &Row) -> Result<StoredPolicy> {
    Ok(StoredPolicy {
        tenant: r.text(0)?.parse()?,
        conversation_id: r.opt_text(1)?,
        policy: r.text(2)?,
        hash: r.text(3)?,
        updated_at: time(r.int(4)?)?,
    })
}

const POLICY_COLUMNS: &str = "tenant, conversation_id, policy, hash, updated_at";

impl Store {
    /// Sets (replaces) the policy of `scope`.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a hash that is not 64 hex digits; [`Error::Backend`] when
    /// the database fails.
    pub fn set_egress_policy(
        &self,
        scope: &PolicyScope,
        policy: &str,
        hash: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::InvalidRequest(
                "a policy hash is 64 hex digits".into(),
            ));
        }
        let (tenant, conv) = match scope {
            PolicyScope::Tenant(t) => (t.as_str(), None),
            PolicyScope::Conversation(c) => (c.tenant.as_str(), Some(c.id.as_str())),
        };
        self.read(|db| {
            db.execute(
                "set the egress policy",
                "INSERT INTO egress_policies (scope, tenant, conversation_id, policy, hash, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (scope) DO UPDATE SET policy = $4, hash = $5, updated_at = $6",
                &[
                    scope.key().into(),
                    tenant.into(),
                    conv.into(),
                    policy.into(),
                    hash.into(),
                    now.timestamp_millis().into(),
                ],
            )
        })?;
        Ok(())
    }

    /// The policy set for exactly `scope`, if any.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn egress_policy(&self, scope: &PolicyScope) -> Result<Option<StoredPolicy>> {
        self.read(|db| {
            db.query_opt(
                "read the egress policy",
                &format!("SELECT {POLICY_COLUMNS} FROM egress_policies WHERE scope = $1"),
                &[scope.key().into()],
            )?
            .as_ref()
            .map(stored)
            .transpose()
        })
    }

    /// The policy in force for a conversation: its own, else its tenant's, else `None` (the
    /// profile `none`).
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn effective_egress_policy(&self, conv: &ConversationRef) -> Result<Option<StoredPolicy>> {
        self.read(|db| {
            db.query_opt(
                "read the egress policy",
                &format!(
                    "SELECT {POLICY_COLUMNS} FROM egress_policies WHERE scope IN ($1, $2)
                     ORDER BY conversation_id IS NULL LIMIT 1"
                ),
                &[
                    conv.key.as_str().into(),
                    format!("tenant:{}", conv.tenant.as_str()).into(),
                ],
            )?
            .as_ref()
            .map(stored)
            .transpose()
        })
    }

    /// Every policy, of one tenant or all, tenants' first.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn egress_policies(&self, tenant: Option<&TenantId>) -> Result<Vec<StoredPolicy>> {
        self.read(|db| {
            db.query(
                "list the egress policies",
                &format!(
                    "SELECT {POLICY_COLUMNS} FROM egress_policies
                     WHERE (CAST($1 AS TEXT) IS NULL OR tenant = $1)
                     ORDER BY tenant, conversation_id IS NOT NULL, conversation_id"
                ),
                &[tenant.map(TenantId::as_str).into()],
            )?
            .iter()
            .map(stored)
            .collect()
        })
    }

    /// Appends a verdict to the egress log. Text fields are cut to
    /// [`MAX_LOG_TEXT`](crate::MAX_LOG_TEXT) characters; a `count` of 0 is stored as 1.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn log_egress(&self, e: &EgressLogEntry) -> Result<()> {
        self.read(|db| insert_verdict(db, e))
    }

    /// Appends `entries` to the egress log in one transaction: all or none (one commit for a
    /// whole window of a gateway's verdicts).
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn log_egress_many(&self, entries: &[EgressLogEntry]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        self.write("append to the egress log", TxLock::None, |db| {
            entries.iter().try_for_each(|e| insert_verdict(db, e))
        })
    }

    /// Verdicts matching `filter`, newest first.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails or a row is malformed.
    pub fn egress_log(&self, filter: &EgressLogFilter) -> Result<Vec<EgressLogRecord>> {
        let limit = filter
            .limit
            .map_or(i64::MAX, |n| i64::try_from(n).unwrap_or(i64::MAX));
        self.read(|db| {
            db.query(
                "read the egress log",
                "SELECT id, at, tenant, conversation_key, allowed, method, target, address, rule,
                        bytes_up, bytes_down, duration_ms, end_reason, count
                 FROM egress_log
                 WHERE (CAST($1 AS TEXT) IS NULL OR tenant = $1)
                   AND (CAST($2 AS TEXT) IS NULL OR conversation_key = $2)
                   AND (CAST($4 AS BIGINT) IS NULL OR at >= $4)
                 ORDER BY at DESC, id DESC LIMIT $3",
                &[
                    filter.tenant.as_ref().map(TenantId::as_str).into(),
                    filter.key.as_ref().map(ConversationKey::as_str).into(),
                    limit.into(),
                    filter.since.map(|t| t.timestamp_millis()).into(),
                ],
            )?
            .iter()
            .map(log_record)
            .collect()
        })
    }

    /// Removes the policy set for exactly `scope`; returns whether there was one. A
    /// conversation without its own policy falls back to its tenant's, a tenant without one to
    /// the profile `none`.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn clear_egress_policy(&self, scope: &PolicyScope) -> Result<bool> {
        let n = self.read(|db| {
            db.execute(
                "clear the egress policy",
                "DELETE FROM egress_policies WHERE scope = $1",
                &[scope.key().into()],
            )
        })?;
        Ok(n > 0)
    }
}

impl Store {
    /// Removes everything egress kept of one conversation: its own policy and its verdicts in
    /// the egress log (both at once). Called when the conversation is destroyed, so a new
    /// conversation of the same id starts with its tenant's policy and an empty log. Returns
    /// whether it had a policy of its own.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn forget_conversation_egress(&self, conv: &ConversationRef) -> Result<bool> {
        let scope = PolicyScope::Conversation(conv.clone());
        self.write(
            "forget the conversation's egress state",
            TxLock::Record(&conv.key),
            |db| {
                let n = db.execute(
                    "remove the conversation's egress policy",
                    "DELETE FROM egress_policies WHERE scope = $1",
                    &[scope.key().into()],
                )?;
                db.execute(
                    "remove the conversation's egress verdicts",
                    "DELETE FROM egress_log WHERE conversation_key = $1",
                    &[conv.key.as_str().into()],
                )?;
                Ok(n > 0)
            },
        )
    }
}

fn insert_verdict(db: &mut dyn Db, e: &EgressLogEntry) -> Result<()> {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    db.execute(
        "append to the egress log",
        "INSERT INTO egress_log (at, tenant, conversation_key, allowed, method, target,
           address, rule, bytes_up, bytes_down, duration_ms, end_reason, count)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        &[
            e.at.timestamp_millis().into(),
            e.tenant.as_str().into(),
            e.conversation_key.as_str().into(),
            i64::from(e.allowed).into(),
            capped(&e.method).into(),
            capped(&e.target).into(),
            e.address.as_deref().map(capped).into(),
            capped(&e.rule).into(),
            n(e.bytes_up).into(),
            n(e.bytes_down).into(),
            n(e.duration_ms).into(),
            e.end.as_deref().map(capped).into(),
            n(e.count.max(1)).into(),
        ],
    )
    .map(drop)
}

fn log_record(r: &Row) -> Result<EgressLogRecord> {
    let u = |i: usize| r.int(i).map(|v| v.max(0) as u64);
    Ok(EgressLogRecord {
        id: r.int(0)?,
        entry: EgressLogEntry {
            at: time(r.int(1)?)?,
            tenant: r.text(2)?.parse()?,
            conversation_key: ConversationKey::parse(&r.text(3)?)?,
            allowed: r.int(4)? != 0,
            method: r.text(5)?,
            target: r.text(6)?,
            address: r.opt_text(7)?,
            rule: r.text(8)?,
            bytes_up: u(9)?,
            bytes_down: u(10)?,
            duration_ms: u(11)?,
            end: r.opt_text(12)?,
            count: u(13)?.max(1),
        },
    })
}
