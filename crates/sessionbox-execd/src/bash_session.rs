//! Upstream execd's bash session API (`execd-api.yaml`: `createSession`, `runInSession`,
//! `deleteSession`): a shell state (exported variables, working directory) kept across runs.
//!
//! - `POST /session` with [`CreateSessionRequest`] (body optional) answers 200
//!   [`CreateSessionResponse`].
//! - `POST /session/{id}/run` with [`RunInSessionRequest`] answers the command event stream of
//!   `POST /command` (`init`, `stdout`/`stderr`, then `execution_complete` or `error`).
//! - `DELETE /session/{id}` ends the session (and a run in progress).

use serde::{Deserialize, Serialize};

/// `POST /session`.
pub const SESSION: &str = "/session";

/// `/session/{id}/run`.
#[must_use]
pub fn run_path(id: &str) -> String {
    format!("{SESSION}/{id}/run")
}

/// The body of `POST /session` (optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateSessionRequest {
    /// The session's working directory (a workspace path; default the root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// The answer to `POST /session`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateSessionResponse {
    /// The session's id.
    pub session_id: String,
}

/// The body of `POST /session/{id}/run`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInSessionRequest {
    /// Shell text, run by bash with the session's variables and working directory.
    pub command: String,
    /// This run's working directory instead of the session's (a workspace path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Milliseconds before the run is killed (0 or absent: the agent's limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
}
