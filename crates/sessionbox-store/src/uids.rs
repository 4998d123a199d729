//! Sandbox uids: each recorded conversation holds one uid of a range until its record goes,
//! and a warm pool's sandbox holds one, reserved under the pool slot's name, until it is bound
//! to a conversation (the uid moves to it) or released.

use std::ops::Range;

use chrono::{DateTime, Utc};
use sessionbox_core::{ConversationKey, Error, Result};

use crate::conversations::{not_found, select};
use crate::db::Db;
use crate::{Store, TxLock, pg};

/// The lowest uid of `range` that neither a conversation holds nor a pool slot reserves.
fn lowest_free(db: &mut dyn Db, range: &Range<u32>) -> Result<i64> {
    let (start, end) = (i64::from(range.start), i64::from(range.end));
    let taken = db.query(
        "read the sandbox uids",
        "SELECT uid FROM sandbox_uids WHERE uid >= $1 AND uid < $2 \
         UNION SELECT uid FROM sandbox_uid_reservations WHERE uid >= $1 AND uid < $2 \
         ORDER BY uid",
        &[start.into(), end.into()],
    )?;
    let mut next = start;
    for r in &taken {
        if r.int(0)? != next {
            break;
        }
        next += 1;
    }
    if next >= end {
        return Err(Error::Conflict(format!(
            "all {} sandbox uids in {}..{} are in use; destroy idle conversations or \
             widen the range",
            range.end - range.start,
            range.start,
            range.end
        )));
    }
    Ok(next)
}

/// A pool slot's name as the reservations table takes it: 1 to 128 bytes.
fn check_holder(holder: &str) -> Result<()> {
    if holder.is_empty() || holder.len() > 128 {
        return Err(Error::InvalidRequest(format!(
            "a uid reservation's holder must be 1 to 128 bytes, not {}",
            holder.len()
        )));
    }
    Ok(())
}

impl Store {
    /// The conversation's sandbox uid: the one it already has, else the lowest uid in `range`
    /// that no other conversation holds. A uid stays with its conversation until the record is
    /// deleted, then it is free again.
    ///
    /// # Errors
    /// - [`Error::InvalidRequest`] when `range` is empty.
    /// - [`Error::NotFound`] when there is no such conversation.
    /// - [`Error::Conflict`] when every uid in `range` is taken.
    /// - [`Error::Backend`] when the database fails.
    pub fn allocate_uid(&self, key: &ConversationKey, range: Range<u32>) -> Result<u32> {
        if range.is_empty() {
            return Err(Error::InvalidRequest(format!(
                "the sandbox uid range {}..{} is empty",
                range.start, range.end
            )));
        }
        let held = self.read(|db| {
            db.query_opt(
                "read the sandbox uid",
                "SELECT uid FROM sandbox_uids WHERE conversation_key = $1",
                &[key.as_str().into()],
            )?
            .map(|r| r.int(0))
            .transpose()
        })?;
        if let Some(uid) = held {
            return u32::try_from(uid).map_err(Error::backend);
        }
        self.write(
            "allocate a sandbox uid",
            TxLock::Global(pg::GLOBAL_UIDS),
            |db| {
                if let Some(r) = db.query_opt(
                    "read the sandbox uid",
                    "SELECT uid FROM sandbox_uids WHERE conversation_key = $1",
                    &[key.as_str().into()],
                )? {
                    return u32::try_from(r.int(0)?).map_err(Error::backend);
                }
                if select(db, key)?.is_none() {
                    return Err(not_found(key));
                }
                let next = lowest_free(db, &range)?;
                db.execute(
                    "allocate a sandbox uid",
                    "INSERT INTO sandbox_uids (uid, conversation_key) VALUES ($1, $2)",
                    &[next.into(), key.as_str().into()],
                )?;
                u32::try_from(next).map_err(Error::backend)
            },
        )
    }

    /// Reserves the lowest free uid of `range` for the pool slot `holder` (a warm sandbox
    /// launched before any conversation owns it), or returns the uid it already reserves. No
    /// conversation is given a reserved uid ([`Store::allocate_uid`] skips them).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for an empty range or a holder outside 1 to 128 bytes;
    /// [`Error::Conflict`] when every uid in `range` is taken; [`Error::Backend`].
    pub fn reserve_uid(&self, holder: &str, range: Range<u32>, now: DateTime<Utc>) -> Result<u32> {
        check_holder(holder)?;
        if range.is_empty() {
            return Err(Error::InvalidRequest(format!(
                "the sandbox uid range {}..{} is empty",
                range.start, range.end
            )));
        }
        self.write(
            "reserve a sandbox uid",
            TxLock::Global(pg::GLOBAL_UIDS),
            |db| {
                if let Some(r) = db.query_opt(
                    "read the uid reservation",
                    "SELECT uid FROM sandbox_uid_reservations WHERE holder = $1",
                    &[holder.into()],
                )? {
                    return u32::try_from(r.int(0)?).map_err(Error::backend);
                }
                let next = lowest_free(db, &range)?;
                db.execute(
                    "reserve a sandbox uid",
                    "INSERT INTO sandbox_uid_reservations (uid, holder, reserved_at) \
                     VALUES ($1, $2, $3)",
                    &[next.into(), holder.into(), now.timestamp_millis().into()],
                )?;
                u32::try_from(next).map_err(Error::backend)
            },
        )
    }

    /// Moves the uid `holder` reserves to the conversation `key`, in one transaction: from then
    /// on it is the conversation's uid ([`Store::allocate_uid`] returns it) and the reservation
    /// is gone. Returns the uid.
    ///
    /// # Errors
    /// - [`Error::NotFound`] when `holder` reserves nothing, or there is no such conversation.
    /// - [`Error::Conflict`] when the conversation already holds a uid (a bind is only for a
    ///   conversation whose sandbox was never launched).
    /// - [`Error::Backend`] when the database fails.
    pub fn bind_reserved_uid(&self, holder: &str, key: &ConversationKey) -> Result<u32> {
        check_holder(holder)?;
        self.write(
            "bind a reserved sandbox uid",
            TxLock::Global(pg::GLOBAL_UIDS),
            |db| {
                let Some(r) = db.query_opt(
                    "read the uid reservation",
                    "SELECT uid FROM sandbox_uid_reservations WHERE holder = $1",
                    &[holder.into()],
                )?
                else {
                    return Err(Error::NotFound(format!("no uid is reserved for {holder}")));
                };
                let uid = r.int(0)?;
                if select(db, key)?.is_none() {
                    return Err(not_found(key));
                }
                if db
                    .query_opt(
                        "read the sandbox uid",
                        "SELECT uid FROM sandbox_uids WHERE conversation_key = $1",
                        &[key.as_str().into()],
                    )?
                    .is_some()
                {
                    return Err(Error::Conflict(format!(
                        "conversation {} already has a sandbox uid",
                        key.short()
                    )));
                }
                db.execute(
                    "bind a reserved sandbox uid",
                    "DELETE FROM sandbox_uid_reservations WHERE holder = $1",
                    &[holder.into()],
                )?;
                db.execute(
                    "bind a reserved sandbox uid",
                    "INSERT INTO sandbox_uids (uid, conversation_key) VALUES ($1, $2)",
                    &[uid.into(), key.as_str().into()],
                )?;
                u32::try_from(uid).map_err(Error::backend)
            },
        )
    }

    /// Drops `holder`'s reservation (its pool slot was removed); true when there was one.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad holder; [`Error::Backend`].
    pub fn release_uid(&self, holder: &str) -> Result<bool> {
        check_holder(holder)?;
        self.write(
            "release a sandbox uid",
            TxLock::Global(pg::GLOBAL_UIDS),
            |db| {
                Ok(db.execute(
                    "release a sandbox uid",
                    "DELETE FROM sandbox_uid_reservations WHERE holder = $1",
                    &[holder.into()],
                )? > 0)
            },
        )
    }

    /// Every reservation: holder, uid and when it was made, oldest first (for garbage
    /// collection of reservations whose pool slot is gone).
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn uid_reservations(&self) -> Result<Vec<(String, u32, DateTime<Utc>)>> {
        self.read(|db| {
            db.query(
                "read the uid reservations",
                "SELECT holder, uid, reserved_at FROM sandbox_uid_reservations \
                 ORDER BY reserved_at, holder",
                &[],
            )?
            .iter()
            .map(|r| {
                Ok((
                    r.text(0)?,
                    u32::try_from(r.int(1)?).map_err(Error::backend)?,
                    crate::time(r.int(2)?)?,
                ))
            })
            .collect()
        })
    }
}
