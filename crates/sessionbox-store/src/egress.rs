//! Egress: the network policy of each tenant and conversation, and the gateway's verdicts.
//!
//! The store keeps a policy as the text and hash the caller gives (the egress crate owns its
//! meaning); it knows only its scope. A conversation's own policy wins over its tenant's; with
//! neither, the profile is `none`. Policies are kept by scope, so one can be set before the
//! conversation exists, and it stays after `destroy` (like the audit and egress logs).

use chrono::{DateTime, Utc};
use rusqlite::{OptionalExtension, Row, params};
use sessionbox_core::{ConversationKey, ConversationRef, Error, Result, TenantId};

use crate::{Store, check, sql_error, time};

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

fn stored(r: &Row<'_>) -> rusqlite::Result<StoredPolicy> {
    Ok(StoredPolicy {
        tenant: check(0, r.get::<_, String>(0)?.parse())?,
        conversation_id: r.get(1)?,
        policy: r.get(2)?,
        hash: r.get(3)?,
        updated_at: time(r, 4)?,
    })
}

const POLICY_COLUMNS: &str = "tenant, conversation_id, policy, hash, updated_at";

impl Store {
    /// Sets (replaces) the policy of `scope`.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a hash that is not 64 hex digits; [`Error::Backend`] when
    /// SQLite fails.
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
        self.conn()
            .execute(
                "INSERT INTO egress_policies (scope, tenant, conversation_id, policy, hash, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (scope) DO UPDATE SET policy = ?4, hash = ?5, updated_at = ?6",
                params![scope.key(), tenant, conv, policy, hash, now.timestamp_millis()],
            )
            .map_err(sql_error("set the egress policy"))?;
        Ok(())
    }

    /// The policy set for exactly `scope`, if any.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn egress_policy(&self, scope: &PolicyScope) -> Result<Option<StoredPolicy>> {
        self.conn()
            .query_row(
                &format!("SELECT {POLICY_COLUMNS} FROM egress_policies WHERE scope = ?1"),
                [scope.key()],
                stored,
            )
            .optional()
            .map_err(sql_error("read the egress policy"))
    }

    /// The policy in force for a conversation: its own, else its tenant's, else `None` (the
    /// profile `none`).
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn effective_egress_policy(&self, conv: &ConversationRef) -> Result<Option<StoredPolicy>> {
        self.conn()
            .query_row(
                &format!(
                    "SELECT {POLICY_COLUMNS} FROM egress_policies WHERE scope IN (?1, ?2)
                     ORDER BY conversation_id IS NULL LIMIT 1"
                ),
                params![
                    conv.key.as_str(),
                    format!("tenant:{}", conv.tenant.as_str())
                ],
                stored,
            )
            .optional()
            .map_err(sql_error("read the egress policy"))
    }

    /// Every policy, of one tenant or all, tenants' first.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn egress_policies(&self, tenant: Option<&TenantId>) -> Result<Vec<StoredPolicy>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(&format!(
                "SELECT {POLICY_COLUMNS} FROM egress_policies WHERE (?1 IS NULL OR tenant = ?1)
                 ORDER BY tenant, conversation_id IS NOT NULL, conversation_id"
            ))
            .map_err(sql_error("list the egress policies"))?;
        let rows = stmt
            .query_map([tenant.map(TenantId::as_str)], stored)
            .map_err(sql_error("list the egress policies"))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(sql_error("list the egress policies"))
    }

    /// Appends a verdict to the egress log.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn log_egress(&self, e: &EgressLogEntry) -> Result<()> {
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.conn()
            .execute(
                "INSERT INTO egress_log (at, tenant, conversation_key, allowed, method, target,
                   address, rule, bytes_up, bytes_down, duration_ms, end_reason)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                params![
                    e.at.timestamp_millis(),
                    e.tenant.as_str(),
                    e.conversation_key.as_str(),
                    e.allowed,
                    e.method,
                    e.target,
                    e.address,
                    e.rule,
                    n(e.bytes_up),
                    n(e.bytes_down),
                    n(e.duration_ms),
                    e.end
                ],
            )
            .map_err(sql_error("append to the egress log"))?;
        Ok(())
    }

    /// Verdicts matching `filter`, newest first.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails or a row is malformed.
    pub fn egress_log(&self, filter: &EgressLogFilter) -> Result<Vec<EgressLogRecord>> {
        let limit = filter
            .limit
            .map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT id, at, tenant, conversation_key, allowed, method, target, address, rule,
                        bytes_up, bytes_down, duration_ms, end_reason
                 FROM egress_log
                 WHERE (?1 IS NULL OR tenant = ?1) AND (?2 IS NULL OR conversation_key = ?2)
                   AND (?4 IS NULL OR at >= ?4)
                 ORDER BY at DESC, id DESC LIMIT ?3",
            )
            .map_err(sql_error("read the egress log"))?;
        let rows = stmt
            .query_map(
                params![
                    filter.tenant.as_ref().map(TenantId::as_str),
                    filter.key.as_ref().map(ConversationKey::as_str),
                    limit,
                    filter.since.map(|t| t.timestamp_millis())
                ],
                |r| {
                    let u = |i: usize| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
                    Ok(EgressLogRecord {
                        id: r.get(0)?,
                        entry: EgressLogEntry {
                            at: time(r, 1)?,
                            tenant: check(2, r.get::<_, String>(2)?.parse())?,
                            conversation_key: check(
                                3,
                                ConversationKey::parse(&r.get::<_, String>(3)?),
                            )?,
                            allowed: r.get(4)?,
                            method: r.get(5)?,
                            target: r.get(6)?,
                            address: r.get(7)?,
                            rule: r.get(8)?,
                            bytes_up: u(9)?,
                            bytes_down: u(10)?,
                            duration_ms: u(11)?,
                            end: r.get(12)?,
                        },
                    })
                },
            )
            .map_err(sql_error("read the egress log"))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(sql_error("read the egress log"))
    }

    /// Removes the policy set for exactly `scope`; returns whether there was one. A
    /// conversation without its own policy falls back to its tenant's, a tenant without one to
    /// the profile `none`.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn clear_egress_policy(&self, scope: &PolicyScope) -> Result<bool> {
        let n = self
            .conn()
            .execute(
                "DELETE FROM egress_policies WHERE scope = ?1",
                [scope.key()],
            )
            .map_err(sql_error("clear the egress policy"))?;
        Ok(n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_policy_wins_over_its_tenant_policy() {
        let s = Store::open_in_memory().unwrap();
        let conv = ConversationRef::parse("acme", "chat-1").unwrap();
        let other = ConversationRef::parse("acme", "chat-2").unwrap();
        let h = |c: char| c.to_string().repeat(64);
        assert_eq!(s.effective_egress_policy(&conv).unwrap(), None);
        s.set_egress_policy(
            &PolicyScope::Tenant(conv.tenant.clone()),
            "T",
            &h('a'),
            Utc::now(),
        )
        .unwrap();
        assert_eq!(
            s.effective_egress_policy(&conv).unwrap().unwrap().policy,
            "T"
        );
        s.set_egress_policy(
            &PolicyScope::Conversation(conv.clone()),
            "C",
            &h('b'),
            Utc::now(),
        )
        .unwrap();
        assert_eq!(
            s.effective_egress_policy(&conv).unwrap().unwrap().policy,
            "C"
        );
        assert_eq!(
            s.effective_egress_policy(&other).unwrap().unwrap().policy,
            "T"
        );
        s.set_egress_policy(
            &PolicyScope::Conversation(conv.clone()),
            "C2",
            &h('c'),
            Utc::now(),
        )
        .unwrap();
        assert_eq!(
            s.effective_egress_policy(&conv).unwrap().unwrap().hash,
            h('c')
        );
        assert_eq!(s.egress_policies(None).unwrap().len(), 2);
        assert!(
            s.set_egress_policy(
                &PolicyScope::Tenant(conv.tenant.clone()),
                "T",
                "short",
                Utc::now()
            )
            .is_err()
        );
    }

    #[test]
    fn verdicts_are_logged_per_conversation_and_read_newest_first() {
        let s = Store::open_in_memory().unwrap();
        let a = ConversationRef::parse("acme", "a").unwrap();
        let b = ConversationRef::parse("acme", "b").unwrap();
        for (conv, allowed, target) in [
            (&a, true, "x:443"),
            (&b, false, "y:443"),
            (&a, false, "z:80"),
        ] {
            s.log_egress(&EgressLogEntry {
                at: Utc::now(),
                tenant: conv.tenant.clone(),
                conversation_key: conv.key.clone(),
                allowed,
                method: "CONNECT".into(),
                target: target.into(),
                address: allowed.then(|| "203.0.113.1:443".into()),
                rule: "r".into(),
                bytes_up: 5,
                bytes_down: u64::MAX,
                duration_ms: 1,
                end: None,
            })
            .unwrap();
        }
        let log = s
            .egress_log(&EgressLogFilter {
                key: Some(a.key.clone()),
                ..Default::default()
            })
            .unwrap();
        let targets: Vec<&str> = log.iter().map(|r| r.entry.target.as_str()).collect();
        assert_eq!(targets, ["z:80", "x:443"]);
        assert_eq!(log[1].entry.bytes_down, i64::MAX as u64);
        assert_eq!(s.egress_log(&EgressLogFilter::default()).unwrap().len(), 3);
    }
}
