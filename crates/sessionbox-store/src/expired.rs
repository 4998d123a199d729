//! Notices of expired conversations: when a conversation expires and is destroyed, the store
//! keeps a short note (its id and when it expired) under its key, so that the next use of the
//! id, which makes a new, empty conversation, can tell the caller that the old one expired and
//! its files are gone, whether garbage collection or that use destroyed it.
//!
//! A notice is taken (read and removed) by the open that makes the new conversation
//! ([`Store::take_expired_notice`]); an explicit destroy removes it
//! ([`Store::forget_expired_notice`]): the caller ended that conversation on purpose. Garbage
//! collection removes notices older than its bound ([`Store::prune_expired_notices`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sessionbox_core::{ConversationId, ConversationKey, Result, TenantId};

use crate::db::Row;
use crate::{ConversationRecord, Store, TxLock, time};

/// A conversation that expired and was destroyed; its id, if used again, makes a new one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpiredNotice {
    /// Its key.
    pub key: ConversationKey,
    /// Its tenant.
    pub tenant: TenantId,
    /// Its id.
    pub conversation_id: ConversationId,
    /// When it expired (its `expires_at`).
    pub expired_at: DateTime<Utc>,
    /// When it was destroyed for that.
    pub destroyed_at: DateTime<Utc>,
}

fn notice(r: &Row) -> Result<ExpiredNotice> {
    Ok(ExpiredNotice {
        key: ConversationKey::parse(&r.text(0)?)?,
        tenant: r.text(1)?.parse()?,
        conversation_id: r.text(2)?.parse()?,
        expired_at: time(r.int(3)?)?,
        destroyed_at: time(r.int(4)?)?,
    })
}

const NOTICE_COLUMNS: &str = "key, tenant, conversation_id, expired_at, destroyed_at";

impl Store {
    /// Notes that `record` expired and is being destroyed at `now` (replacing an older note of
    /// its key). A record without an expiry time is noted as expired at `now`.
    ///
    /// # Errors
    /// [`sessionbox_core::Error::Backend`] when the database fails.
    pub fn note_expired(&self, record: &ConversationRecord, now: DateTime<Utc>) -> Result<()> {
        let expired_at = record.expires_at.unwrap_or(now).timestamp_millis();
        self.read(|db| {
            db.execute(
                "note the expired conversation",
                "INSERT INTO expired_conversations (key, tenant, conversation_id, expired_at,
                     destroyed_at)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (key) DO UPDATE SET tenant = $2, conversation_id = $3,
                     expired_at = $4, destroyed_at = $5",
                &[
                    record.key.as_str().into(),
                    record.tenant.as_str().into(),
                    record.conversation_id.as_str().into(),
                    expired_at.into(),
                    now.timestamp_millis().into(),
                ],
            )
        })?;
        Ok(())
    }

    /// The notice of `key`, removed: exactly one of several racing callers gets it.
    ///
    /// # Errors
    /// [`sessionbox_core::Error::Backend`] when the database fails or the row is malformed.
    pub fn take_expired_notice(&self, key: &ConversationKey) -> Result<Option<ExpiredNotice>> {
        self.write("take the expired notice", TxLock::Record(key), |db| {
            let Some(row) = db.query_opt(
                "read the expired notice",
                &format!("SELECT {NOTICE_COLUMNS} FROM expired_conversations WHERE key = $1"),
                &[key.as_str().into()],
            )?
            else {
                return Ok(None);
            };
            let n = db.execute(
                "remove the expired notice",
                "DELETE FROM expired_conversations WHERE key = $1",
                &[key.as_str().into()],
            )?;
            if n == 0 {
                return Ok(None);
            }
            notice(&row).map(Some)
        })
    }

    /// The notice of `key`, left in place.
    ///
    /// # Errors
    /// [`sessionbox_core::Error::Backend`] when the database fails or the row is malformed.
    pub fn expired_notice(&self, key: &ConversationKey) -> Result<Option<ExpiredNotice>> {
        self.read(|db| {
            db.query_opt(
                "read the expired notice",
                &format!("SELECT {NOTICE_COLUMNS} FROM expired_conversations WHERE key = $1"),
                &[key.as_str().into()],
            )?
            .as_ref()
            .map(notice)
            .transpose()
        })
    }

    /// Removes the notice of `key`, if any; true when there was one.
    ///
    /// # Errors
    /// [`sessionbox_core::Error::Backend`] when the database fails.
    pub fn forget_expired_notice(&self, key: &ConversationKey) -> Result<bool> {
        let n = self.read(|db| {
            db.execute(
                "remove the expired notice",
                "DELETE FROM expired_conversations WHERE key = $1",
                &[key.as_str().into()],
            )
        })?;
        Ok(n > 0)
    }

    /// Removes notices of conversations destroyed before `before`; returns how many.
    ///
    /// # Errors
    /// [`sessionbox_core::Error::Backend`] when the database fails.
    pub fn prune_expired_notices(&self, before: DateTime<Utc>) -> Result<u64> {
        let n = self.read(|db| {
            db.execute(
                "prune the expired notices",
                "DELETE FROM expired_conversations WHERE destroyed_at < $1",
                &[before.timestamp_millis().into()],
            )
        })?;
        Ok(n)
    }
}
