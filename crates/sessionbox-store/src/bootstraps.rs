//! Skill bootstrap runs: one row per conversation and skill, so a skill's bootstrap command runs
//! once per conversation however often it is resumed, from however many processes.
//!
//! A caller claims the run ([`Store::claim_bootstrap`]) before running the command and records
//! how it ended ([`Store::finish_bootstrap`]). A claim is granted when there is no row yet, when
//! the last run failed, when the skill changed (another digest), or when a claim is older than
//! the caller's stale bound (its process died while running it). Rows go with the conversation.

use chrono::{DateTime, Utc};
use rusqlite::{OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use sessionbox_core::{ConversationKey, Error, Result};

use crate::{Store, check, not_found_key, sql_error, time};

/// Where a bootstrap run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BootstrapState {
    /// Claimed and running (or its runner died; see the stale bound).
    Running,
    /// Ran and exited 0.
    Ok,
    /// Ran and failed; the next open runs it again.
    Failed,
}

impl BootstrapState {
    fn as_str(self) -> &'static str {
        match self {
            BootstrapState::Running => "running",
            BootstrapState::Ok => "ok",
            BootstrapState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Result<Self> {
        match s {
            "running" => Ok(BootstrapState::Running),
            "ok" => Ok(BootstrapState::Ok),
            "failed" => Ok(BootstrapState::Failed),
            other => Err(Error::Backend(format!("unknown bootstrap state {other:?}"))),
        }
    }
}

/// One conversation's bootstrap of one skill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapRecord {
    /// The skill's name.
    pub skill: String,
    /// The skill's content digest when it was last claimed.
    pub digest: String,
    /// Where the run is.
    pub state: BootstrapState,
    /// The command's exit code, once it ended.
    pub exit_code: Option<i32>,
    /// How many runs ended (ok or failed).
    pub runs: u32,
    /// When the row last changed.
    pub updated_at: DateTime<Utc>,
}

impl Store {
    /// Claims the bootstrap of `skill` (at `digest`) in conversation `key`; true when the caller
    /// must run it now. See the module documentation for when a claim is granted.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such conversation; [`Error::Backend`] when SQLite
    /// fails.
    pub fn claim_bootstrap(
        &self,
        key: &ConversationKey,
        skill: &str,
        digest: &str,
        now: DateTime<Utc>,
        stale_after: chrono::Duration,
    ) -> Result<bool> {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql_error("start a transaction"))?;
        let row: Option<(String, String, i64)> = tx
            .query_row(
                "SELECT digest, state, updated_at FROM skill_bootstraps
                 WHERE conversation_key = ?1 AND skill = ?2",
                params![key.as_str(), skill],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(sql_error("read a bootstrap record"))?;
        let claim = match &row {
            None => true,
            Some((d, state, at)) => {
                let state = BootstrapState::parse(state)?;
                d != digest
                    || state == BootstrapState::Failed
                    || (state == BootstrapState::Running
                        && *at < (now - stale_after).timestamp_millis())
            }
        };
        if !claim {
            return Ok(false);
        }
        let n = tx
            .execute(
                "INSERT INTO skill_bootstraps (conversation_key, skill, digest, state, updated_at)
                 SELECT ?1, ?2, ?3, 'running', ?4 WHERE EXISTS
                   (SELECT 1 FROM conversations WHERE key = ?1)
                 ON CONFLICT (conversation_key, skill) DO UPDATE
                   SET digest = excluded.digest, state = 'running', exit_code = NULL,
                       updated_at = excluded.updated_at",
                params![key.as_str(), skill, digest, now.timestamp_millis()],
            )
            .map_err(sql_error("claim a bootstrap"))?;
        if n == 0 {
            return Err(not_found_key(key));
        }
        tx.commit().map_err(sql_error("commit a bootstrap claim"))?;
        Ok(true)
    }

    /// Records how a claimed bootstrap ended.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn finish_bootstrap(
        &self,
        key: &ConversationKey,
        skill: &str,
        exit_code: i32,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let state = if exit_code == 0 {
            BootstrapState::Ok
        } else {
            BootstrapState::Failed
        };
        self.conn()
            .execute(
                "UPDATE skill_bootstraps SET state = ?3, exit_code = ?4, runs = runs + 1,
                   updated_at = ?5
                 WHERE conversation_key = ?1 AND skill = ?2",
                params![
                    key.as_str(),
                    skill,
                    state.as_str(),
                    exit_code,
                    now.timestamp_millis()
                ],
            )
            .map_err(sql_error("record a bootstrap"))?;
        Ok(())
    }

    /// The bootstrap records of conversation `key`, by skill name.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn bootstraps(&self, key: &ConversationKey) -> Result<Vec<BootstrapRecord>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT skill, digest, state, exit_code, runs, updated_at FROM skill_bootstraps
                 WHERE conversation_key = ?1 ORDER BY skill",
            )
            .map_err(sql_error("read bootstrap records"))?;
        let rows = stmt
            .query_map([key.as_str()], |r| {
                Ok(BootstrapRecord {
                    skill: r.get(0)?,
                    digest: r.get(1)?,
                    state: check(2, BootstrapState::parse(&r.get::<_, String>(2)?))?,
                    exit_code: r.get(3)?,
                    runs: r.get(4)?,
                    updated_at: time(r, 5)?,
                })
            })
            .map_err(sql_error("read bootstrap records"))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(sql_error("read bootstrap records"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sessionbox_core::{ConversationRef, TenantId};

    #[test]
    fn a_bootstrap_is_claimed_once_per_digest_and_again_after_a_failure_or_when_stale() {
        let store = Store::open_in_memory().unwrap();
        let conv = ConversationRef::new(TenantId::new("t").unwrap(), "c".parse().unwrap());
        let now = Utc::now();
        let stale = chrono::Duration::minutes(15);
        let k = &conv.key;
        assert!(
            store.claim_bootstrap(k, "s", "d1", now, stale).is_err(),
            "no conversation yet"
        );
        store.get_or_create(&conv, "host", now).unwrap();
        assert!(store.claim_bootstrap(k, "s", "d1", now, stale).unwrap());
        assert!(
            !store.claim_bootstrap(k, "s", "d1", now, stale).unwrap(),
            "running"
        );
        store.finish_bootstrap(k, "s", 0, now).unwrap();
        assert!(
            !store.claim_bootstrap(k, "s", "d1", now, stale).unwrap(),
            "done"
        );
        assert!(
            store.claim_bootstrap(k, "s", "d2", now, stale).unwrap(),
            "skill changed"
        );
        store.finish_bootstrap(k, "s", 3, now).unwrap();
        let r = &store.bootstraps(k).unwrap()[0];
        assert_eq!(
            (r.state, r.exit_code, r.runs),
            (BootstrapState::Failed, Some(3), 2)
        );
        assert!(
            store.claim_bootstrap(k, "s", "d2", now, stale).unwrap(),
            "failed: again"
        );
        let later = now + chrono::Duration::minutes(16);
        assert!(
            store.claim_bootstrap(k, "s", "d2", later, stale).unwrap(),
            "stale claim"
        );
        store.delete(k).unwrap();
        assert!(
            store.bootstraps(k).unwrap().is_empty(),
            "rows go with the conversation"
        );
    }
}
