//! Sandbox uids: each recorded conversation holds one uid of a range until its record goes.

use std::ops::Range;

use sessionbox_core::{ConversationKey, Error, Result};

use crate::conversations::{not_found, select};
use crate::{Store, TxLock, pg};

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
                let taken = db.query(
                    "read the sandbox uids",
                    "SELECT uid FROM sandbox_uids WHERE uid >= $1 AND uid < $2 ORDER BY uid",
                    &[i64::from(range.start).into(), i64::from(range.end).into()],
                )?;
                let mut next = i64::from(range.start);
                for r in &taken {
                    if r.int(0)? != next {
                        break;
                    }
                    next += 1;
                }
                if next >= i64::from(range.end) {
                    return Err(Error::Conflict(format!(
                        "all {} sandbox uids in {}..{} are in use; destroy idle conversations or \
                         widen the range",
                        range.end - range.start,
                        range.start,
                        range.end
                    )));
                }
                db.execute(
                    "allocate a sandbox uid",
                    "INSERT INTO sandbox_uids (uid, conversation_key) VALUES ($1, $2)",
                    &[next.into(), key.as_str().into()],
                )?;
                u32::try_from(next).map_err(Error::backend)
            },
        )
    }
}
