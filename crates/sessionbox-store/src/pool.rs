//! The warm pool of a remote runtime (`opensandbox`): sandboxes made ahead of the
//! conversations that will take them, one row per slot (its name, tenant, sandbox id, expiry).
//!
//! A bind takes the tenant's oldest slot and records its sandbox as the conversation's remote
//! sandbox in one transaction ([`Store::bind_pool_slot`]), so no two binds (in one process,
//! several processes or several PostgreSQL replicas) get the same slot and a taken slot is
//! never unrecorded in between. Removing a slot answers whether this call removed it, so of a
//! collector and a bind racing for one slot exactly one owns its sandbox afterwards.

use chrono::{DateTime, Utc};
use sessionbox_core::{ConversationKey, Error, RemotePoolSlot, Result};

use crate::db::Row;
use crate::{Store, TxLock, pg, time};

const COLUMNS: &str = "slot, runtime, tenant, sandbox_id, created_at, expires_at";

fn row(r: &Row) -> Result<RemotePoolSlot> {
    Ok(RemotePoolSlot {
        slot: r.text(0)?,
        runtime: r.text(1)?,
        tenant: r.text(2)?,
        sandbox_id: r.text(3)?,
        created_at: time(r.int(4)?)?,
        expires_at: r.opt_int(5)?.map(time).transpose()?,
    })
}

fn check(slot: &RemotePoolSlot) -> Result<()> {
    let name_ok = !slot.slot.is_empty()
        && slot.slot.len() <= 63
        && slot
            .slot
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !name_ok {
        return Err(Error::InvalidRequest(
            "a pool slot's name must be 1-63 of A-Z a-z 0-9 . _ -".into(),
        ));
    }
    if slot.runtime.is_empty() || slot.tenant.is_empty() || slot.sandbox_id.is_empty() {
        return Err(Error::InvalidRequest(
            "a pool slot's runtime, tenant and sandbox id must not be empty".into(),
        ));
    }
    Ok(())
}

impl Store {
    /// Records a ready pool slot.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a malformed slot name or an empty field;
    /// [`Error::Conflict`] when a slot of that name is recorded; [`Error::Backend`].
    pub fn add_pool_slot(&self, slot: &RemotePoolSlot) -> Result<()> {
        check(slot)?;
        let inserted = self.write(
            "record a pool slot",
            TxLock::Global(pg::GLOBAL_POOL),
            |db| {
                db.execute(
                    "record a pool slot",
                    "INSERT INTO remote_pool_slots (slot, runtime, tenant, sandbox_id, created_at,
                         expires_at)
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                    &[
                        slot.slot.as_str().into(),
                        slot.runtime.as_str().into(),
                        slot.tenant.as_str().into(),
                        slot.sandbox_id.as_str().into(),
                        slot.created_at.timestamp_millis().into(),
                        slot.expires_at.map(|t| t.timestamp_millis()).into(),
                    ],
                )
            },
        )?;
        if inserted == 1 {
            Ok(())
        } else {
            Err(Error::Conflict(format!(
                "the pool slot {} is recorded already",
                slot.slot
            )))
        }
    }

    /// Takes the oldest slot of `tenant`'s pool of `runtime` and records its sandbox as `key`'s
    /// remote sandbox (created `now`, with the slot's expiry), in one transaction. `None`,
    /// changing nothing, when the pool is empty or `key` has a remote sandbox already.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn bind_pool_slot(
        &self,
        runtime: &str,
        tenant: &str,
        key: &ConversationKey,
        now: DateTime<Utc>,
    ) -> Result<Option<RemotePoolSlot>> {
        self.write("bind a pool slot", TxLock::Global(pg::GLOBAL_POOL), |db| {
            let Some(found) = db.query_opt(
                "find a pool slot",
                &format!(
                    "SELECT {COLUMNS} FROM remote_pool_slots WHERE runtime = $1 AND tenant = $2
                     ORDER BY created_at, slot LIMIT 1"
                ),
                &[runtime.into(), tenant.into()],
            )?
            else {
                return Ok(None);
            };
            let slot = row(&found)?;
            let recorded = db.execute(
                "record the pooled sandbox",
                "INSERT INTO remote_sandboxes (conversation_key, runtime, sandbox_id, created_at,
                     expires_at)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                &[
                    key.as_str().into(),
                    runtime.into(),
                    slot.sandbox_id.as_str().into(),
                    now.timestamp_millis().into(),
                    slot.expires_at.map(|t| t.timestamp_millis()).into(),
                ],
            )?;
            if recorded == 0 {
                // The conversation has a sandbox: nothing was changed.
                return Ok(None);
            }
            let taken = db.execute(
                "take the pool slot",
                "DELETE FROM remote_pool_slots WHERE slot = $1",
                &[slot.slot.as_str().into()],
            )?;
            if taken != 1 {
                // Cannot happen under the pool's lock; the error rolls the record back.
                return Err(Error::Backend(
                    "the pool slot vanished while being bound".into(),
                ));
            }
            Ok(Some(slot))
        })
    }

    /// Removes the slot `slot` of `runtime`; true when this call removed it.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn remove_pool_slot(&self, runtime: &str, slot: &str) -> Result<bool> {
        let n = self.write(
            "remove a pool slot",
            TxLock::Global(pg::GLOBAL_POOL),
            |db| {
                db.execute(
                    "remove a pool slot",
                    "DELETE FROM remote_pool_slots WHERE runtime = $1 AND slot = $2",
                    &[runtime.into(), slot.into()],
                )
            },
        )?;
        Ok(n == 1)
    }

    /// Every slot of `runtime`, oldest first.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails or a row is malformed.
    pub fn pool_slots(&self, runtime: &str) -> Result<Vec<RemotePoolSlot>> {
        self.read(|db| {
            db.query(
                "list pool slots",
                &format!(
                    "SELECT {COLUMNS} FROM remote_pool_slots WHERE runtime = $1
                     ORDER BY created_at, slot"
                ),
                &[runtime.into()],
            )?
            .iter()
            .map(row)
            .collect()
        })
    }

    /// Sets the expiry of the pooled sandbox of `slot`; false when the slot is gone.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn set_pool_slot_expiry(
        &self,
        runtime: &str,
        slot: &str,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<bool> {
        let n = self.read(|db| {
            db.execute(
                "set a pool slot's expiry",
                "UPDATE remote_pool_slots SET expires_at = $3 WHERE runtime = $1 AND slot = $2",
                &[
                    runtime.into(),
                    slot.into(),
                    expires_at.map(|t| t.timestamp_millis()).into(),
                ],
            )
        })?;
        Ok(n == 1)
    }
}
