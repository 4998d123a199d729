//! The one error type of sessionbox.

use std::time::Duration;

use crate::ids::IdKind;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure a runtime, store or front end reports.
///
/// Each variant says what went wrong and, where there is one, what to do next. [`Error::code`]
/// gives a stable snake_case name for wire formats (HTTP, MCP, JSON reports). Messages never carry
/// file contents or secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A conversation or tenant id broke its rule. `value` is the input as given (escaped when
    /// displayed, cut to 80 characters), `rule` the rule it broke.
    #[error("invalid {kind} {}: {rule}", shown(value))]
    InvalidId {
        /// Which kind of id.
        kind: IdKind,
        /// The offending input.
        value: String,
        /// The rule, in words.
        rule: &'static str,
    },
    /// A path is malformed (empty, NUL byte, too long).
    #[error("invalid path {}: {reason}", shown(path))]
    InvalidPath {
        /// The offending input.
        path: String,
        /// Why it is invalid.
        reason: String,
    },
    /// A path resolves outside the conversation's workspace, lexically or through a link.
    #[error("path {} is outside the workspace: {reason}", shown(path))]
    OutsideWorkspace {
        /// The offending input.
        path: String,
        /// How it leaves (for example "'..' climbs above the workspace root").
        reason: String,
    },
    /// A request is malformed (bad timeout, bad environment name, empty edit string, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A file, directory or conversation does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// A file, directory or conversation already exists.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// Something is larger than its limit.
    #[error("{what} is too large: the limit is {limit} bytes")]
    TooLarge {
        /// What was too large ("file data", "request body", ...).
        what: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// An operation ran past its deadline.
    #[error("timed out after {} ms", .0.as_millis())]
    TimedOut(Duration),
    /// The request conflicts with the current state (an edit string that occurs twice, a hard
    /// link, a conversation owned by another runtime, a directory where a file was expected).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The runtime cannot run here. `hint` says what to do about it.
    #[error("runtime {runtime} is unavailable: {reason}; {hint}")]
    RuntimeUnavailable {
        /// The runtime's name.
        runtime: String,
        /// What is missing.
        reason: String,
        /// What to do next.
        hint: String,
    },
    /// A backend (file system, process, store, remote server) failed.
    #[error("backend error: {0}")]
    Backend(String),
}

impl Error {
    /// A stable, snake_case name of the variant, for wire formats and exit-code mapping.
    ///
    /// ```
    /// use sessionbox_core::Error;
    /// assert_eq!(Error::NotFound("a.txt".into()).code(), "not_found");
    /// ```
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidId { .. } => "invalid_id",
            Error::InvalidPath { .. } => "invalid_path",
            Error::OutsideWorkspace { .. } => "outside_workspace",
            Error::InvalidRequest(_) => "invalid_request",
            Error::NotFound(_) => "not_found",
            Error::AlreadyExists(_) => "already_exists",
            Error::TooLarge { .. } => "too_large",
            Error::TimedOut(_) => "timed_out",
            Error::Conflict(_) => "conflict",
            Error::RuntimeUnavailable { .. } => "runtime_unavailable",
            Error::Backend(_) => "backend_error",
        }
    }

    /// True for errors caused by the caller's input (ids, paths, requests): nothing was changed
    /// and retrying the same input fails the same way.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Error::InvalidId { .. }
                | Error::InvalidPath { .. }
                | Error::OutsideWorkspace { .. }
                | Error::InvalidRequest(_)
        )
    }

    /// Builds an [`Error::Backend`] from anything displayable.
    pub fn backend(e: impl std::fmt::Display) -> Self {
        Error::Backend(e.to_string())
    }
}

/// Shows user input escaped (so newlines and NULs are visible) and cut to 80 characters.
fn shown(s: &str) -> String {
    const MAX: usize = 80;
    let mut cut: String = s.chars().take(MAX).collect();
    if cut.len() < s.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_escapes_control_characters_and_cuts_long_input() {
        let e = Error::InvalidPath {
            path: format!("a\nb{}", "x".repeat(200)),
            reason: "r".into(),
        };
        let s = e.to_string();
        assert!(s.contains("a\\nb"), "{s}");
        assert!(s.len() < 200, "{s}");
    }
}
