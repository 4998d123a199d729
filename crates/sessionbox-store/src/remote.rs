//! The remote sandbox of each conversation of a remote runtime (`opensandbox`).
//!
//! One row per conversation key: the server's sandbox id and the expiry sessionbox set on it.
//! The row is created insert-if-absent, so of concurrent first opens exactly one sandbox is
//! recorded; the losers delete the sandboxes they made. Replacing and forgetting compare the
//! sandbox id, so a caller holding a stale id never overwrites or removes a newer one.

use chrono::{DateTime, Utc};
use sessionbox_core::{ConversationKey, Error, RemoteSandbox, Result};

use crate::db::Row;
use crate::{Store, TxLock, time};

const COLUMNS: &str = "conversation_key, runtime, sandbox_id, created_at, expires_at";

fn row(r: &Row) -> Result<RemoteSandbox> {
    Ok(RemoteSandbox {
        key: ConversationKey::parse(&r.text(0)?)?,
        runtime: r.text(1)?,
        sandbox_id: r.text(2)?,
        created_at: time(r.int(3)?)?,
        expires_at: r.opt_int(4)?.map(time).transpose()?,
    })
}

impl Store {
    /// Records `sandbox_id` as the remote sandbox of `key` unless one is recorded already.
    /// Returns the recorded sandbox and whether it is the one given: of concurrent callers,
    /// exactly one wins; the others get the winner's record and must delete their own sandbox.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for an empty runtime or sandbox id; [`Error::Backend`].
    pub fn insert_remote_sandbox(
        &self,
        key: &ConversationKey,
        runtime: &str,
        sandbox_id: &str,
        expires_at: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<(RemoteSandbox, bool)> {
        if runtime.is_empty() || sandbox_id.is_empty() {
            return Err(Error::InvalidRequest(
                "the runtime name and the sandbox id must not be empty".into(),
            ));
        }
        self.write("record the remote sandbox", TxLock::Record(key), |db| {
            let inserted = db.execute(
                "record the remote sandbox",
                "INSERT INTO remote_sandboxes (conversation_key, runtime, sandbox_id, created_at,
                     expires_at)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                &[
                    key.as_str().into(),
                    runtime.into(),
                    sandbox_id.into(),
                    now.timestamp_millis().into(),
                    expires_at.map(|t| t.timestamp_millis()).into(),
                ],
            )?;
            let record = db
                .query_opt(
                    "read the remote sandbox",
                    &format!("SELECT {COLUMNS} FROM remote_sandboxes WHERE conversation_key = $1"),
                    &[key.as_str().into()],
                )?
                .ok_or_else(|| Error::Backend("the remote sandbox record vanished".into()))?;
            Ok((row(&record)?, inserted == 1))
        })
    }

    /// The remote sandbox recorded for `key`, or `None`.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails or the row is malformed.
    pub fn remote_sandbox(&self, key: &ConversationKey) -> Result<Option<RemoteSandbox>> {
        self.read(|db| {
            db.query_opt(
                "read the remote sandbox",
                &format!("SELECT {COLUMNS} FROM remote_sandboxes WHERE conversation_key = $1"),
                &[key.as_str().into()],
            )?
            .as_ref()
            .map(row)
            .transpose()
        })
    }

    /// Every remote sandbox recorded by `runtime`.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails or a row is malformed.
    pub fn remote_sandboxes(&self, runtime: &str) -> Result<Vec<RemoteSandbox>> {
        self.read(|db| {
            db.query(
                "list remote sandboxes",
                &format!(
                    "SELECT {COLUMNS} FROM remote_sandboxes WHERE runtime = $1
                     ORDER BY conversation_key"
                ),
                &[runtime.into()],
            )?
            .iter()
            .map(row)
            .collect()
        })
    }

    /// Replaces the recorded sandbox `old_id` of `key` by `new_id` (a vanished sandbox replaced
    /// by a fresh one). Returns false, changing nothing, when `old_id` is no longer the recorded
    /// one (another process replaced or removed it first).
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn replace_remote_sandbox(
        &self,
        key: &ConversationKey,
        old_id: &str,
        new_id: &str,
        expires_at: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let n = self.read(|db| {
            db.execute(
                "replace the remote sandbox",
                "UPDATE remote_sandboxes SET sandbox_id = $3, created_at = $4, expires_at = $5
                 WHERE conversation_key = $1 AND sandbox_id IN ($2, $3)",
                &[
                    key.as_str().into(),
                    old_id.into(),
                    new_id.into(),
                    now.timestamp_millis().into(),
                    expires_at.map(|t| t.timestamp_millis()).into(),
                ],
            )
        })?;
        Ok(n == 1)
    }

    /// Sets the expiry of the recorded sandbox `sandbox_id` of `key`. Returns false when that
    /// sandbox is no longer the recorded one.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn set_remote_sandbox_expiry(
        &self,
        key: &ConversationKey,
        sandbox_id: &str,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<bool> {
        let n = self.read(|db| {
            db.execute(
                "set the remote sandbox's expiry",
                "UPDATE remote_sandboxes SET expires_at = $3
                 WHERE conversation_key = $1 AND sandbox_id = $2",
                &[
                    key.as_str().into(),
                    sandbox_id.into(),
                    expires_at.map(|t| t.timestamp_millis()).into(),
                ],
            )
        })?;
        Ok(n == 1)
    }

    /// Forgets the remote sandbox of `key`, only if it is still `sandbox_id`. Returns false
    /// when there was nothing (or something else) recorded, so forgetting twice is fine.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn delete_remote_sandbox(&self, key: &ConversationKey, sandbox_id: &str) -> Result<bool> {
        let n = self.read(|db| {
            db.execute(
                "forget the remote sandbox",
                "DELETE FROM remote_sandboxes WHERE conversation_key = $1 AND sandbox_id = $2",
                &[key.as_str().into(), sandbox_id.into()],
            )
        })?;
        Ok(n == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use sessionbox_core::{ConversationId, TenantId};

    fn key(id: &str) -> ConversationKey {
        ConversationKey::derive(
            &TenantId::new("t").unwrap(),
            &ConversationId::new(id).unwrap(),
        )
    }

    fn at(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(s, 0).unwrap()
    }

    #[test]
    fn first_insert_wins_and_later_ones_get_the_winner() {
        let store = Store::open_in_memory().unwrap();
        let k = key("a");
        let (r, won) = store
            .insert_remote_sandbox(&k, "opensandbox", "sb-1", Some(at(100)), at(1))
            .unwrap();
        assert!(won);
        assert_eq!(r.sandbox_id, "sb-1");
        let (r, won) = store
            .insert_remote_sandbox(&k, "opensandbox", "sb-2", None, at(2))
            .unwrap();
        assert!(!won);
        assert_eq!(r.sandbox_id, "sb-1");
        assert_eq!(r.expires_at, Some(at(100)));
    }

    #[test]
    fn replace_and_delete_compare_the_sandbox_id() {
        let store = Store::open_in_memory().unwrap();
        let k = key("a");
        store
            .insert_remote_sandbox(&k, "opensandbox", "sb-1", None, at(1))
            .unwrap();
        assert!(
            !store
                .replace_remote_sandbox(&k, "sb-0", "sb-9", None, at(2))
                .unwrap()
        );
        assert!(
            store
                .replace_remote_sandbox(&k, "sb-1", "sb-2", Some(at(5)), at(2))
                .unwrap()
        );
        assert!(
            !store
                .set_remote_sandbox_expiry(&k, "sb-1", Some(at(9)))
                .unwrap()
        );
        assert!(
            store
                .set_remote_sandbox_expiry(&k, "sb-2", Some(at(9)))
                .unwrap()
        );
        assert_eq!(
            store.remote_sandbox(&k).unwrap().unwrap().expires_at,
            Some(at(9))
        );
        assert_eq!(store.remote_sandboxes("opensandbox").unwrap().len(), 1);
        assert!(store.remote_sandboxes("aio").unwrap().is_empty());
        assert!(!store.delete_remote_sandbox(&k, "sb-1").unwrap());
        assert!(store.delete_remote_sandbox(&k, "sb-2").unwrap());
        assert!(!store.delete_remote_sandbox(&k, "sb-2").unwrap());
        assert!(store.remote_sandbox(&k).unwrap().is_none());
    }
}
