//! Skill bootstrap runs: one row per conversation and skill, so a skill's bootstrap command runs
//! once per conversation however often it is resumed, from however many processes.
//!
//! A caller claims the run ([`Store::claim_bootstrap`]) before running the command and records
//! how it ended ([`Store::finish_bootstrap`]). A claim is granted when there is no row yet, when
//! the last run failed, when the skill changed (another digest), or when a claim is older than
//! the caller's stale bound (its process died while running it). Rows go with the conversation.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sessionbox_core::{ConversationKey, Error, Result};

use crate::{Store, TxLock, not_found_key, time};

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
    /// [`Error::NotFound`] when there is no such conversation; [`Error::Backend`] when the
    /// database fails.
    pub fn claim_bootstrap(
        &self,
        key: &ConversationKey,
        skill: &str,
        digest: &str,
        now: DateTime<Utc>,
        stale_after: chrono::Duration,
    ) -> Result<bool> {
        self.write("claim a bootstrap", TxLock::Record(key), |db| {
            let row = db.query_opt(
                "read a bootstrap record",
                "SELECT digest, state, updated_at FROM skill_bootstraps
                 WHERE conversation_key = $1 AND skill = $2",
                &[key.as_str().into(), skill.into()],
            )?;
            let claim = match &row {
                None => true,
                Some(r) => {
                    let state = BootstrapState::parse(&r.text(1)?)?;
                    r.text(0)? != digest
                        || state == BootstrapState::Failed
                        || (state == BootstrapState::Running
                            && r.int(2)? < (now - stale_after).timestamp_millis())
                }
            };
            if !claim {
                return Ok(false);
            }
            // The casts tell PostgreSQL the parameters' types in the SELECT list.
            let n = db.execute(
                "claim a bootstrap",
                "INSERT INTO skill_bootstraps (conversation_key, skill, digest, state, updated_at)
                 SELECT CAST($1 AS TEXT), CAST($2 AS TEXT), CAST($3 AS TEXT), 'running',
                        CAST($4 AS BIGINT)
                 WHERE EXISTS (SELECT 1 FROM conversations WHERE key = $1)
                 ON CONFLICT (conversation_key, skill) DO UPDATE
                   SET digest = excluded.digest, state = 'running', exit_code = NULL,
                       updated_at = excluded.updated_at",
                &[
                    key.as_str().into(),
                    skill.into(),
                    digest.into(),
                    now.timestamp_millis().into(),
                ],
            )?;
            if n == 0 {
                return Err(not_found_key(key));
            }
            Ok(true)
        })
    }

    /// Records how a claimed bootstrap ended. Only a `running` claim is finished, so the
    /// statement run again (a connection lost with its answer) counts the run once.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
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
        self.read(|db| {
            db.execute(
                "record a bootstrap",
                "UPDATE skill_bootstraps SET state = $3, exit_code = $4, runs = runs + 1,
                   updated_at = $5
                 WHERE conversation_key = $1 AND skill = $2 AND state = 'running'",
                &[
                    key.as_str().into(),
                    skill.into(),
                    state.as_str().into(),
                    i64::from(exit_code).into(),
                    now.timestamp_millis().into(),
                ],
            )
        })?;
        Ok(())
    }

    /// The bootstrap records of conversation `key`, by skill name.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails or a row is malformed.
    pub fn bootstraps(&self, key: &ConversationKey) -> Result<Vec<BootstrapRecord>> {
        self.read(|db| {
            db.query(
                "read bootstrap records",
                "SELECT skill, digest, state, exit_code, runs, updated_at FROM skill_bootstraps
                 WHERE conversation_key = $1 ORDER BY skill",
                &[key.as_str().into()],
            )?
            .iter()
            .map(|r| {
                Ok(BootstrapRecord {
                    skill: r.text(0)?,
                    digest: r.text(1)?,
                    state: BootstrapState::parse(&r.text(2)?)?,
                    exit_code: r.opt_int(3)?.map(|c| i32::try_from(c).unwrap_or(i32::MIN)),
                    runs: u32::try_from(r.int(4)?.max(0)).unwrap_or(u32::MAX),
                    updated_at: time(r.int(5)?)?,
                })
            })
            .collect()
        })
    }
}
