//! Snapshots of conversation workspaces and templates.
//!
//! A snapshot is an archive file the manager keeps under its data directory, named by the
//! snapshot's id; the store keeps its record ([`SnapshotRecord`]): the tenant, a name unique
//! within the tenant, where it came from, what it holds and how much it takes on disk. A
//! template is a tenant's name for one of its snapshots ([`Store::set_template`]), and pins it:
//! deleting a snapshot a template names is refused ([`Error::Conflict`], backed by the
//! schema's foreign key), and retention never offers it ([`Store::expired_snapshots`]).
//!
//! Every write that decides something (a name still free, the tenant's snapshots within their
//! cap, a snapshot still there to be named) runs in one transaction; with PostgreSQL it first
//! takes an advisory lock on the tenant, so two replicas decide one at a time. Snapshots do not
//! go with the conversation they were taken from: `origin` is only a note.
//!
//! Lookups by a name that breaks the naming rule answer as for an absent one (`None`, `false`);
//! only writes refuse it.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sessionbox_core::{ConversationId, Error, Result, TenantId, validate_snapshot_name};

use crate::db::{Db, Row, Val, Violation};
use crate::{Store, TxLock, time};

/// Longest snapshot id, in bytes.
pub const MAX_SNAPSHOT_ID_BYTES: usize = 64;

/// A snapshot's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// Store-unique id chosen by the caller, naming the archive file: 1 to
    /// [`MAX_SNAPSHOT_ID_BYTES`] bytes of `a-z`, `0-9`, `_` and `-`, starting with a letter or
    /// digit (for example 26 characters of `a-z0-9`).
    pub id: String,
    /// The tenant it belongs to.
    pub tenant: TenantId,
    /// Unique within the tenant (the rules of [`sessionbox_core::validate_snapshot_name`]).
    pub name: String,
    /// The conversation it was taken from (an id of the tenant), `None` when imported.
    pub origin: Option<ConversationId>,
    /// The runtime it was taken on (`host`, `isolated`, ...), or `import`.
    pub runtime: String,
    /// Bytes of regular files' contents ([`sessionbox_core::ArchiveStats::bytes`]).
    pub bytes: u64,
    /// Regular files.
    pub files: u64,
    /// Directories.
    pub directories: u64,
    /// Symbolic links.
    pub links: u64,
    /// Size of the stored (compressed) archive file: what the per-tenant cap counts.
    pub stored_bytes: u64,
    /// When it was taken.
    pub created_at: DateTime<Utc>,
    /// When retention removes it; `None`: kept until deleted.
    pub expires_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "s.id, s.tenant, s.name, s.origin, s.runtime, s.bytes, s.files, \
                       s.directories, s.links, s.stored_bytes, s.created_at, s.expires_at";

/// Reads a row of [`COLUMNS`].
fn record(r: &Row) -> Result<SnapshotRecord> {
    Ok(SnapshotRecord {
        id: r.text(0)?,
        tenant: r.text(1)?.parse()?,
        name: r.text(2)?,
        origin: r.opt_text(3)?.map(|o| o.parse()).transpose()?,
        runtime: r.text(4)?,
        bytes: count(r, 5)?,
        files: count(r, 6)?,
        directories: count(r, 7)?,
        links: count(r, 8)?,
        stored_bytes: count(r, 9)?,
        created_at: time(r.int(10)?)?,
        expires_at: r.opt_int(11)?.map(time).transpose()?,
    })
}

fn count(r: &Row, i: usize) -> Result<u64> {
    let v = r.int(i)?;
    u64::try_from(v).map_err(|_| Error::Backend(format!("column {i} holds {v}, a negative count")))
}

/// `v` as a SQL integer; `what` names it in the error.
fn int(v: u64, what: &str) -> Result<Val> {
    i64::try_from(v).map(Val::Int).map_err(|_| {
        Error::InvalidRequest(format!("a snapshot's {what} must be below 2^63, not {v}"))
    })
}

fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= MAX_SNAPSHOT_ID_BYTES
        && id.as_bytes()[0].is_ascii_alphanumeric()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidRequest(format!(
            "snapshot id {id:?} must be 1 to {MAX_SNAPSHOT_ID_BYTES} bytes of a-z, 0-9, '_' and \
             '-', starting with a letter or a digit"
        )))
    }
}

fn select(db: &mut dyn Db, tenant: &TenantId, name: &str) -> Result<Option<SnapshotRecord>> {
    db.query_opt(
        "read a snapshot record",
        &format!("SELECT {COLUMNS} FROM snapshots s WHERE s.tenant = $1 AND s.name = $2"),
        &[tenant.as_str().into(), name.into()],
    )?
    .as_ref()
    .map(record)
    .transpose()
}

/// The names of the templates of `tenant` that name snapshot `name`, sorted.
fn pinned_by(db: &mut dyn Db, tenant: &TenantId, name: &str) -> Result<Vec<String>> {
    db.query(
        "find the templates naming a snapshot",
        "SELECT name FROM snapshot_templates WHERE tenant = $1 AND snapshot = $2 ORDER BY name",
        &[tenant.as_str().into(), name.into()],
    )?
    .iter()
    .map(|r| r.text(0))
    .collect()
}

fn pinned_error(tenant: &TenantId, name: &str, templates: &[String]) -> Error {
    let named = if templates.is_empty() {
        "a template".to_owned()
    } else {
        let list = templates.join(", ");
        if templates.len() == 1 {
            format!("template {list}")
        } else {
            format!("templates {list}")
        }
    };
    Error::Conflict(format!(
        "snapshot {name} of tenant {tenant} is named by {named}; remove the template or point \
         it at another snapshot first"
    ))
}

/// Deletes the snapshot `s` (read in this transaction), refused while a template names it.
fn delete(db: &mut dyn Db, s: &SnapshotRecord) -> Result<()> {
    let templates = pinned_by(db, &s.tenant, &s.name)?;
    if !templates.is_empty() {
        return Err(pinned_error(&s.tenant, &s.name, &templates));
    }
    match db.execute_checked(
        "delete a snapshot record",
        "DELETE FROM snapshots WHERE id = $1",
        &[s.id.as_str().into()],
    )? {
        Ok(_) => Ok(()),
        // The schema's backstop (ON DELETE RESTRICT); the check above, under the tenant's
        // lock, comes first.
        Err(_) => Err(pinned_error(&s.tenant, &s.name, &[])),
    }
}

impl Store {
    /// Records `s` if the tenant has no snapshot of that name and its snapshots' `stored_bytes`
    /// plus `s.stored_bytes` stay within `cap_bytes` (`None`: no cap), in one transaction
    /// (with PostgreSQL under an advisory lock on the tenant), so of two callers racing for a
    /// name, or for the last room under the cap, one wins.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad name or id, an empty runtime, or a count of 2^63 or
    /// more; [`Error::AlreadyExists`] when the tenant has a snapshot of that name;
    /// [`Error::TooLarge`] (`the tenant's snapshots`, the cap) when it would pass the cap;
    /// [`Error::Conflict`] when another snapshot has the id; [`Error::Backend`]. Nothing is
    /// recorded on any error.
    pub fn create_snapshot(&self, s: &SnapshotRecord, cap_bytes: Option<u64>) -> Result<()> {
        validate_snapshot_name(&s.name)?;
        check_id(&s.id)?;
        if s.runtime.is_empty() {
            return Err(Error::InvalidRequest(
                "a snapshot's runtime must not be empty".into(),
            ));
        }
        let params = [
            s.id.as_str().into(),
            s.tenant.as_str().into(),
            s.name.as_str().into(),
            s.origin.as_ref().map(|o| o.as_str()).into(),
            s.runtime.as_str().into(),
            int(s.bytes, "bytes")?,
            int(s.files, "file count")?,
            int(s.directories, "directory count")?,
            int(s.links, "link count")?,
            int(s.stored_bytes, "stored bytes")?,
            s.created_at.timestamp_millis().into(),
            s.expires_at.map(|t| t.timestamp_millis()).into(),
        ];
        self.write("record a snapshot", TxLock::Tenant(&s.tenant), |db| {
            if select(db, &s.tenant, &s.name)?.is_some() {
                return Err(Error::AlreadyExists(format!(
                    "snapshot {} of tenant {}",
                    s.name, s.tenant
                )));
            }
            let id_taken = db.query_opt(
                "look for a snapshot id",
                "SELECT 1 FROM snapshots WHERE id = $1",
                &[s.id.as_str().into()],
            )?;
            if id_taken.is_some() {
                return Err(Error::Conflict(format!(
                    "snapshot id {} is recorded already",
                    s.id
                )));
            }
            if let Some(cap) = cap_bytes {
                let (used, _) = usage(db, &s.tenant)?;
                if used
                    .checked_add(s.stored_bytes)
                    .is_none_or(|total| total > cap)
                {
                    return Err(Error::TooLarge {
                        what: "the tenant's snapshots".into(),
                        limit: cap,
                    });
                }
            }
            match db.execute_checked(
                "record a snapshot",
                "INSERT INTO snapshots (id, tenant, name, origin, runtime, bytes, files,
                     directories, links, stored_bytes, created_at, expires_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                &params,
            )? {
                Ok(_) => Ok(()),
                // The schema's backstop; the checks above, under the tenant's lock, come first.
                Err(_) => Err(Error::AlreadyExists(format!(
                    "snapshot {} of tenant {}, or a snapshot of id {}",
                    s.name, s.tenant, s.id
                ))),
            }
        })
    }

    /// The tenant's snapshot named `name`.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails or the row is malformed.
    pub fn snapshot(&self, tenant: &TenantId, name: &str) -> Result<Option<SnapshotRecord>> {
        self.read(|db| select(db, tenant, name))
    }

    /// The tenant's snapshots, oldest first.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails or a row is malformed.
    pub fn snapshots(&self, tenant: &TenantId) -> Result<Vec<SnapshotRecord>> {
        self.read(|db| {
            db.query(
                "list snapshot records",
                &format!(
                    "SELECT {COLUMNS} FROM snapshots s WHERE s.tenant = $1
                     ORDER BY s.created_at, s.name"
                ),
                &[tenant.as_str().into()],
            )?
            .iter()
            .map(record)
            .collect()
        })
    }

    /// Deletes the record of the tenant's snapshot `name` and returns it (the caller removes
    /// its archive file afterwards); `None` when there is none.
    ///
    /// # Errors
    /// [`Error::Conflict`] naming the templates that name it (nothing is deleted);
    /// [`Error::Backend`].
    pub fn delete_snapshot(&self, tenant: &TenantId, name: &str) -> Result<Option<SnapshotRecord>> {
        self.write("delete a snapshot record", TxLock::Tenant(tenant), |db| {
            let Some(s) = select(db, tenant, name)? else {
                return Ok(None);
            };
            delete(db, &s)?;
            Ok(Some(s))
        })
    }

    /// Snapshots whose `expires_at` is at or before `now`, across tenants, soonest expired
    /// first, for garbage collection. A snapshot a template names is never among them.
    /// Remove each with [`Store::delete_expired_snapshot`] (by id, so a snapshot made since
    /// under the same name is not taken for it), or [`Store::delete_snapshot`].
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails or a row is malformed.
    pub fn expired_snapshots(&self, now: DateTime<Utc>) -> Result<Vec<SnapshotRecord>> {
        self.read(|db| {
            db.query(
                "find expired snapshots",
                &format!(
                    "SELECT {COLUMNS} FROM snapshots s
                     WHERE s.expires_at IS NOT NULL AND s.expires_at <= $1
                       AND NOT EXISTS (SELECT 1 FROM snapshot_templates t
                                       WHERE t.tenant = s.tenant AND t.snapshot = s.name)
                     ORDER BY s.expires_at, s.id"
                ),
                &[now.timestamp_millis().into()],
            )?
            .iter()
            .map(record)
            .collect()
        })
    }

    /// Deletes the snapshot of id `id` if it is still expired at `now` and no template names
    /// it, and returns its record; `None`, deleting nothing, otherwise (absent, not expired,
    /// or pinned by a template since [`Store::expired_snapshots`] listed it).
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn delete_expired_snapshot(
        &self,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<SnapshotRecord>> {
        let by_id = |db: &mut dyn Db| {
            db.query_opt(
                "read a snapshot record",
                &format!("SELECT {COLUMNS} FROM snapshots s WHERE s.id = $1"),
                &[id.into()],
            )?
            .as_ref()
            .map(record)
            .transpose()
        };
        // The tenant, for its lock; read again under it.
        let Some(seen) = self.read(by_id)? else {
            return Ok(None);
        };
        self.write(
            "delete an expired snapshot record",
            TxLock::Tenant(&seen.tenant),
            |db| {
                let Some(s) = by_id(db)? else {
                    return Ok(None);
                };
                let expired = s.expires_at.is_some_and(|t| t <= now);
                if !expired || !pinned_by(db, &s.tenant, &s.name)?.is_empty() {
                    return Ok(None);
                }
                delete(db, &s)?;
                Ok(Some(s))
            },
        )
    }

    /// Every snapshot id in the store, so garbage collection can remove archive files that no
    /// record names.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn snapshot_ids(&self) -> Result<BTreeSet<String>> {
        self.read(|db| {
            db.query("list snapshot ids", "SELECT id FROM snapshots", &[])?
                .iter()
                .map(|r| r.text(0))
                .collect()
        })
    }

    /// The tenant's snapshots' total `stored_bytes`, and how many it has.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn snapshot_usage(&self, tenant: &TenantId) -> Result<(u64, u64)> {
        self.read(|db| usage(db, tenant))
    }

    /// Names the tenant's snapshot `snapshot` as its template `template`, replacing what a
    /// template of that name named before.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad template name; [`Error::NotFound`] when the tenant
    /// has no snapshot `snapshot`; [`Error::Backend`].
    pub fn set_template(&self, tenant: &TenantId, template: &str, snapshot: &str) -> Result<()> {
        validate_snapshot_name(template)?;
        let absent = || Error::NotFound(format!("snapshot {snapshot} of tenant {tenant}"));
        self.write("set a template", TxLock::Tenant(tenant), |db| {
            if select(db, tenant, snapshot)?.is_none() {
                return Err(absent());
            }
            match db.execute_checked(
                "set a template",
                "INSERT INTO snapshot_templates (tenant, name, snapshot) VALUES ($1, $2, $3)
                 ON CONFLICT (tenant, name) DO UPDATE SET snapshot = excluded.snapshot",
                &[tenant.as_str().into(), template.into(), snapshot.into()],
            )? {
                Ok(_) => Ok(()),
                // The schema's backstop (the foreign key); the check above comes first.
                Err(Violation::ForeignKey) => Err(absent()),
                Err(Violation::Unique) => Err(Error::Backend(
                    "could not set a template: a template of that name appeared meanwhile".into(),
                )),
            }
        })
    }

    /// Removes the tenant's template `template`; false when there is none.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn remove_template(&self, tenant: &TenantId, template: &str) -> Result<bool> {
        let n = self.write("remove a template", TxLock::Tenant(tenant), |db| {
            db.execute(
                "remove a template",
                "DELETE FROM snapshot_templates WHERE tenant = $1 AND name = $2",
                &[tenant.as_str().into(), template.into()],
            )
        })?;
        Ok(n == 1)
    }

    /// The snapshot the tenant's template `template` names, if there is such a template.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails or the row is malformed.
    pub fn template(&self, tenant: &TenantId, template: &str) -> Result<Option<SnapshotRecord>> {
        self.read(|db| {
            db.query_opt(
                "read a template",
                &format!(
                    "SELECT {COLUMNS} FROM snapshot_templates t
                     JOIN snapshots s ON s.tenant = t.tenant AND s.name = t.snapshot
                     WHERE t.tenant = $1 AND t.name = $2"
                ),
                &[tenant.as_str().into(), template.into()],
            )?
            .as_ref()
            .map(record)
            .transpose()
        })
    }

    /// The tenant's templates as (template name, snapshot name), by template name.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn templates(&self, tenant: &TenantId) -> Result<Vec<(String, String)>> {
        self.read(|db| {
            db.query(
                "list templates",
                "SELECT name, snapshot FROM snapshot_templates WHERE tenant = $1 ORDER BY name",
                &[tenant.as_str().into()],
            )?
            .iter()
            .map(|r| Ok((r.text(0)?, r.text(1)?)))
            .collect()
        })
    }
}

/// The tenant's snapshots' total stored bytes and count. (PostgreSQL's `SUM` of `BIGINT` is
/// `NUMERIC`: cast back.)
fn usage(db: &mut dyn Db, tenant: &TenantId) -> Result<(u64, u64)> {
    let r = db
        .query_opt(
            "add up a tenant's snapshots",
            "SELECT CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT), COUNT(*) FROM snapshots
             WHERE tenant = $1",
            &[tenant.as_str().into()],
        )?
        .ok_or_else(|| Error::Backend("adding up a tenant's snapshots returned no row".into()))?;
    Ok((count(&r, 0)?, count(&r, 1)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_plain_lowercase_file_names() {
        for ok in ["01jd3k8x9q2m4n5p6r7s8t9v0w", "a", "a-b_c", &"z".repeat(64)] {
            assert!(check_id(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "_a",
            "A",
            "a/b",
            "..",
            "a.b",
            "a b",
            &"z".repeat(65),
        ] {
            assert_eq!(
                check_id(bad).unwrap_err().code(),
                "invalid_request",
                "{bad}"
            );
        }
    }
}
