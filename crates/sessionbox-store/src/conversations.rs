//! Conversation records: create (insert-if-absent), read, renew, claim, delete and list.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sessionbox_core::{ConversationKey, ConversationRef, Error, Result, TenantId};

use crate::db::{Db, Row, Val};
use crate::{ConversationRecord, ConversationState, Lifecycle, Store, TxLock, keys, time};

/// What [`Store::claim_orphan`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrphanClaim {
    /// No record exists: the key is claimed, and no record can be made for it until
    /// [`Store::release_orphan`].
    Claimed,
    /// A record exists: not an orphan.
    HasRecord,
}

/// How long [`Store::get_or_create_with`] keeps trying to learn whether a transaction whose
/// answer was lost committed: a PostgreSQL restart takes a second or two, and every read
/// already waits up to 3 s for a connection.
const LOST_COMMIT_PATIENCE: Duration = Duration::from_secs(6);

const RECORD_COLUMNS: &str = "key, tenant, conversation_id, runtime, sandbox_ref, state, \
                              created_at, last_used_at, expires_at, idle_timeout_ms, ttl_ms, \
                              max_lifetime_ms, generation, state_since";

impl Store {
    /// Returns the conversation's record, creating it (state `active`, created and last used at
    /// `now`, no sandbox, no expiry) when there is none. The boolean is true when this call made
    /// it: of any number of concurrent first calls, from threads or processes, exactly one sees
    /// `true`. An existing record is returned as it is (not touched; it may be `destroying`, or
    /// expired).
    ///
    /// # Errors
    /// As [`Store::get_or_create_with`].
    pub fn get_or_create(
        &self,
        conv: &ConversationRef,
        runtime: &str,
        now: DateTime<Utc>,
    ) -> Result<(ConversationRecord, bool)> {
        self.get_or_create_with(conv, runtime, now, &Lifecycle::default())
    }

    /// [`Store::get_or_create`] with the lifecycle a new record gets: its idle timeout, time to
    /// live and maximum lifetime are stored, and `expires_at` is set from them. An existing
    /// record keeps its own.
    ///
    /// # Errors
    /// - [`Error::Conflict`] when the conversation exists under another runtime: it must be
    ///   destroyed before it can use `runtime`.
    /// - [`Error::Busy`] when garbage collection is clearing what an earlier conversation of
    ///   this key left behind (retry in a moment).
    /// - [`Error::InvalidRequest`] when `runtime` is empty or `conv.key` is not derived from
    ///   its tenant and id.
    /// - [`Error::Backend`] when the database fails.
    pub fn get_or_create_with(
        &self,
        conv: &ConversationRef,
        runtime: &str,
        now: DateTime<Utc>,
        lifecycle: &Lifecycle,
    ) -> Result<(ConversationRecord, bool)> {
        if runtime.is_empty() {
            return Err(Error::InvalidRequest("the runtime name is empty".into()));
        }
        if conv.key != ConversationKey::derive(&conv.tenant, &conv.id) {
            return Err(Error::InvalidRequest(
                "the conversation key does not match its tenant and id".into(),
            ));
        }
        let now_ms = now.timestamp_millis();
        let ms = |d: Option<Duration>| d.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let (idle, ttl, max) = (
            ms(lifecycle.idle_timeout),
            ms(lifecycle.ttl),
            ms(lifecycle.max_lifetime),
        );
        let expires = [ttl, max]
            .into_iter()
            .flatten()
            .map(|d| now_ms.saturating_add(d))
            .min();
        let generation = random_generation()?;
        let made = self.write(
            "commit the conversation record",
            TxLock::Record(&conv.key),
            |db| {
                let inserted = db.execute(
                    "create the conversation record",
                    "INSERT INTO conversations (key, tenant, conversation_id, runtime, sandbox_ref,
                         state, created_at, last_used_at, expires_at, idle_timeout_ms, ttl_ms,
                         max_lifetime_ms, generation)
                     SELECT CAST($1 AS TEXT), CAST($2 AS TEXT), CAST($3 AS TEXT),
                            CAST($4 AS TEXT), NULL, 'active', CAST($5 AS BIGINT),
                            CAST($5 AS BIGINT), CAST($6 AS BIGINT), CAST($7 AS BIGINT),
                            CAST($8 AS BIGINT), CAST($9 AS BIGINT), CAST($10 AS BIGINT)
                     WHERE NOT EXISTS (SELECT 1 FROM gc_claims WHERE key = $1)
                     ON CONFLICT DO NOTHING",
                    &[
                        conv.key.as_str().into(),
                        conv.tenant.as_str().into(),
                        conv.id.as_str().into(),
                        runtime.into(),
                        now_ms.into(),
                        expires.into(),
                        idle.into(),
                        ttl.into(),
                        max.into(),
                        generation.into(),
                    ],
                )?;
                let Some(record) = select(db, &conv.key)? else {
                    if inserted == 0 {
                        return Err(Error::Busy(format!(
                            "conversation {}/{} is being cleaned up after an earlier one of the \
                             same id; retry in a moment",
                            conv.tenant, conv.id
                        )));
                    }
                    return Err(Error::Backend(format!(
                        "conversation {}/{} is stored under another key than {}",
                        conv.tenant, conv.id, conv.key
                    )));
                };
                record.check_runtime(runtime)?;
                Ok((record, inserted == 1))
            },
        );
        match made {
            Err(Error::Unavailable(why)) => self.settle_lost_commit(conv, runtime, generation, why),
            made => made,
        }
    }

    /// After the connection failed during [`Store::get_or_create_with`]'s transaction, finds out
    /// whether it committed: a server that ends (`pg_ctl restart -m immediate`, a crash, a cut
    /// network) may have made the record and lost only its answer. Left unknown, a record made
    /// that way stays without its workspace, since its caller was told the open failed.
    ///
    /// The record is read again while the store stays unavailable, for up to
    /// [`LOST_COMMIT_PATIENCE`]. A record of `generation` is this call's: it is returned as made
    /// here. Another record is returned as found. No record means nothing was made, and the
    /// outage is returned. Still unavailable after the patience, the outage is returned, and
    /// a record made meanwhile is left to garbage collection (a record without its workspace,
    /// unused past the grace, is `dangling`).
    fn settle_lost_commit(
        &self,
        conv: &ConversationRef,
        runtime: &str,
        generation: i64,
        why: String,
    ) -> Result<(ConversationRecord, bool)> {
        let until = std::time::Instant::now() + LOST_COMMIT_PATIENCE;
        let mut pause = Duration::from_millis(50);
        loop {
            match self.get(&conv.key) {
                Ok(Some(record)) => {
                    record.check_runtime(runtime)?;
                    let mine = record.generation == generation;
                    return Ok((record, mine));
                }
                Ok(None) => return Err(Error::Unavailable(why)),
                Err(Error::Unavailable(_)) if std::time::Instant::now() + pause < until => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(Error::Unavailable(_)) => return Err(Error::Unavailable(why)),
                Err(e) => return Err(e),
            }
        }
    }

    /// The record of `key`, or `None`.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails or the stored row is malformed.
    pub fn get(&self, key: &ConversationKey) -> Result<Option<ConversationRecord>> {
        self.read(|db| select(db, key))
    }

    /// Records a use at `now` and renews the conversation: `last_used_at` moves to `now` (never
    /// back), and `expires_at` to `now + ttl` (never past `created_at + max_lifetime`, and never
    /// back either) when the conversation has a time to live. Neither moves back: a `now` from
    /// a clock that jumped backwards cannot shorten a life an earlier renewal gave.
    ///
    /// A conversation that has expired, or is being destroyed, is not renewed: renewing and
    /// expiring decide in one statement each, so exactly one of a racing renew and a garbage
    /// collection's [`Store::claim_expired`] wins.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such conversation, or it has expired;
    /// [`Error::Busy`] when it is being destroyed; [`Error::Backend`].
    pub fn touch(&self, key: &ConversationKey, now: DateTime<Utc>) -> Result<()> {
        let now_ms = now.timestamp_millis();
        let n = self.read(|db| {
            db.execute(
                "renew the conversation",
                "UPDATE conversations SET
                     last_used_at = CASE WHEN last_used_at > $2 THEN last_used_at ELSE $2 END,
                     expires_at = CASE
                         WHEN ttl_ms IS NULL THEN expires_at
                         WHEN max_lifetime_ms IS NOT NULL
                              AND created_at + max_lifetime_ms < $2 + ttl_ms
                             THEN created_at + max_lifetime_ms
                         WHEN expires_at IS NOT NULL AND expires_at > $2 + ttl_ms
                             THEN expires_at
                         ELSE $2 + ttl_ms END
                 WHERE key = $1 AND state = 'active' AND (expires_at IS NULL OR expires_at > $2)",
                &[key.as_str().into(), now_ms.into()],
            )
        })?;
        if n == 1 {
            return Ok(());
        }
        match self.get(key)? {
            None => Err(not_found(key)),
            Some(r) if r.state == ConversationState::Destroying => Err(Error::Busy(format!(
                "conversation {} is being destroyed",
                r.conversation_id
            ))),
            Some(r) => Err(Error::NotFound(format!(
                "conversation {} expired at {}",
                r.conversation_id,
                r.expires_at.map_or_else(String::new, |t| t
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            ))),
        }
    }

    /// Claims an expired conversation for destruction: sets its state to `destroying` if, at
    /// `now`, it is `active` and expired. True when this call claimed it; a racing
    /// [`Store::touch`] that renewed it first makes this false. The claimer destroys the
    /// runtime's side and then [`Store::delete`]s the record.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn claim_expired(&self, key: &ConversationKey, now: DateTime<Utc>) -> Result<bool> {
        self.write(
            "claim the expired conversation",
            TxLock::Record(key),
            |db| {
                Ok(db.execute(
                    "claim the expired conversation",
                    "UPDATE conversations SET state = 'destroying', state_since = $2
                 WHERE key = $1 AND state = 'active' AND expires_at IS NOT NULL
                   AND expires_at <= $2",
                    &[key.as_str().into(), now.timestamp_millis().into()],
                )? == 1)
            },
        )
    }

    /// Claims the conversation of generation `generation` for destruction: sets its state to
    /// `destroying` if that record still exists (whatever its state). True when it did.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn claim_for_destroy(&self, key: &ConversationKey, generation: i64) -> Result<bool> {
        let now = self.now().timestamp_millis();
        self.write("claim the conversation", TxLock::Record(key), |db| {
            Ok(db.execute(
                "claim the conversation",
                "UPDATE conversations SET state = 'destroying',
                     state_since = CASE WHEN state = 'destroying' THEN state_since ELSE $3 END
                 WHERE key = $1 AND generation = $2",
                &[key.as_str().into(), generation.into(), now.into()],
            )? == 1)
        })
    }

    /// Deletes the record of `key` only if it is still generation `generation` (a destroyer
    /// never deletes a record made after the one it destroyed). True when it did.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn delete_generation(&self, key: &ConversationKey, generation: i64) -> Result<bool> {
        let n = self.write(
            "delete the conversation record",
            TxLock::Record(key),
            |db| {
                db.execute(
                    "delete the conversation record",
                    "DELETE FROM conversations WHERE key = $1 AND generation = $2",
                    &[key.as_str().into(), generation.into()],
                )
            },
        )?;
        Ok(n > 0)
    }

    /// Claims a key that has runtime state but no record (an orphan), so that no record can be
    /// made for it while garbage collection removes that state: [`Store::get_or_create`] says
    /// [`Error::Busy`] until [`Store::release_orphan`].
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn claim_orphan(&self, key: &ConversationKey, now: DateTime<Utc>) -> Result<OrphanClaim> {
        self.write("claim the orphan", TxLock::Record(key), |db| {
            if select(db, key)?.is_some() {
                return Ok(OrphanClaim::HasRecord);
            }
            db.execute(
                "claim the orphan",
                "INSERT INTO gc_claims (key, claimed_at) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[key.as_str().into(), now.timestamp_millis().into()],
            )?;
            Ok(OrphanClaim::Claimed)
        })
    }

    /// Ends a [`Store::claim_orphan`] claim.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn release_orphan(&self, key: &ConversationKey) -> Result<()> {
        self.read(|db| {
            db.execute(
                "release the orphan",
                "DELETE FROM gc_claims WHERE key = $1",
                &[key.as_str().into()],
            )
            .map(drop)
        })
    }

    /// Sets (or with `None` clears) the runtime's id for the conversation's sandbox.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such conversation; [`Error::Backend`].
    pub fn set_sandbox_ref(&self, key: &ConversationKey, sandbox_ref: Option<&str>) -> Result<()> {
        self.update(key, "sandbox_ref = $2", sandbox_ref.into())
    }

    /// Sets the conversation's state.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such conversation; [`Error::Backend`].
    pub fn set_state(&self, key: &ConversationKey, state: ConversationState) -> Result<()> {
        self.update(
            key,
            &format!(
                "state = $2, state_since = CASE WHEN state = $2 THEN state_since ELSE {} END",
                self.now().timestamp_millis()
            ),
            state.as_str().into(),
        )
    }

    /// Sets (or with `None` clears) when the conversation expires.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such conversation; [`Error::Backend`].
    pub fn set_expiry(
        &self,
        key: &ConversationKey,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<()> {
        self.update(
            key,
            "expires_at = $2",
            expires_at.map(|t| t.timestamp_millis()).into(),
        )
    }

    /// Deletes the conversation's record and its sandbox uid; audit entries stay. Returns
    /// false when there was no record (so deleting twice is fine).
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn delete(&self, key: &ConversationKey) -> Result<bool> {
        let n = self.write(
            "delete the conversation record",
            TxLock::Record(key),
            |db| {
                db.execute(
                    "delete the conversation record",
                    "DELETE FROM conversations WHERE key = $1",
                    &[key.as_str().into()],
                )
            },
        )?;
        Ok(n > 0)
    }

    /// Every conversation, or only `tenant`'s, most recently used first.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails or a stored row is malformed.
    pub fn list(&self, tenant: Option<&TenantId>) -> Result<Vec<ConversationRecord>> {
        self.read(|db| {
            db.query(
                "list conversations",
                &format!(
                    "SELECT {RECORD_COLUMNS} FROM conversations
                     WHERE CAST($1 AS TEXT) IS NULL OR tenant = $1
                     ORDER BY last_used_at DESC, key"
                ),
                &[tenant.map(TenantId::as_str).into()],
            )?
            .iter()
            .map(record)
            .collect()
        })
    }

    /// Runs `UPDATE conversations SET {set} WHERE key = $1` with `$2 = value`.
    fn update(&self, key: &ConversationKey, set: &str, value: Val) -> Result<()> {
        let n = self.read(|db| {
            db.execute(
                "update the conversation record",
                &format!("UPDATE conversations SET {set} WHERE key = $1"),
                &[key.as_str().into(), value.clone()],
            )
        })?;
        if n == 0 {
            return Err(not_found(key));
        }
        Ok(())
    }
}

fn random_generation() -> Result<i64> {
    let b = keys::random::<8>()?;
    Ok(i64::from_le_bytes(b) & i64::MAX)
}

pub(crate) fn select(db: &mut dyn Db, key: &ConversationKey) -> Result<Option<ConversationRecord>> {
    db.query_opt(
        "read the conversation record",
        &format!("SELECT {RECORD_COLUMNS} FROM conversations WHERE key = $1"),
        &[key.as_str().into()],
    )?
    .as_ref()
    .map(record)
    .transpose()
}

pub(crate) fn not_found_key(key: &ConversationKey) -> Error {
    not_found(key)
}

pub(crate) fn not_found(key: &ConversationKey) -> Error {
    Error::NotFound(format!("conversation {key}"))
}

fn duration(ms: Option<i64>) -> Option<Duration> {
    ms.map(|v| Duration::from_millis(u64::try_from(v).unwrap_or(0)))
}

/// Reads a row of [`RECORD_COLUMNS`].
fn record(r: &Row) -> Result<ConversationRecord> {
    Ok(ConversationRecord {
        key: ConversationKey::parse(&r.text(0)?)?,
        tenant: r.text(1)?.parse()?,
        conversation_id: r.text(2)?.parse()?,
        runtime: r.text(3)?,
        sandbox_ref: r.opt_text(4)?,
        state: r.text(5)?.parse()?,
        created_at: time(r.int(6)?)?,
        last_used_at: time(r.int(7)?)?,
        expires_at: r.opt_int(8)?.map(time).transpose()?,
        idle_timeout: duration(r.opt_int(9)?),
        ttl: duration(r.opt_int(10)?),
        max_lifetime: duration(r.opt_int(11)?),
        generation: r.int(12)?,
        state_since: r.opt_int(13)?.map(time).transpose()?,
    })
}
