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
    #[error("{}", with_subject("invalid path", path, reason))]
    InvalidPath {
        /// The offending input.
        path: String,
        /// Why it is invalid.
        reason: String,
    },
    /// A path resolves outside the conversation's workspace, lexically or through a link.
    #[error("{}", outside(path, reason))]
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
    #[error("{}", too_large(what, *limit))]
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
    /// A server refused the caller's credentials (a missing, unknown or revoked API key).
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// Too many requests are waiting for the same conversation; retry later.
    #[error("busy: {0}")]
    Busy(String),
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
            Error::Unauthorized(_) => "unauthorized",
            Error::Busy(_) => "busy",
            Error::Backend(_) => "backend_error",
        }
    }

    /// Rebuilds an error that crossed a wire as its [`code`](Self::code) and display text, so a
    /// remote agent's refusal is the same typed error on this side. Details that the variant's
    /// fields held are kept in the message; an unknown code becomes [`Error::Backend`].
    ///
    /// ```
    /// use sessionbox_core::Error;
    /// let e = Error::from_code("outside_workspace", "path \"../x\" is outside the workspace");
    /// assert_eq!(e.code(), "outside_workspace");
    /// let e = Error::from_code("conflict", "conflict: `old` occurs 2 times");
    /// assert_eq!(e.to_string(), "conflict: `old` occurs 2 times");
    /// ```
    pub fn from_code(code: &str, message: &str) -> Self {
        // The text is the remote error's Display, which already starts with the kind ("conflict:
        // ..."): keep it once.
        let m = [
            "invalid request: ",
            "not found: ",
            "already exists: ",
            "conflict: ",
            "unauthorized: ",
            "busy: ",
            "backend error: ",
        ]
        .iter()
        .find_map(|p| message.strip_prefix(p))
        .unwrap_or(message)
        .to_owned();
        match code {
            "invalid_id" | "invalid_request" => Error::InvalidRequest(m),
            "invalid_path" => Error::InvalidPath {
                path: String::new(),
                reason: m,
            },
            "outside_workspace" => Error::OutsideWorkspace {
                path: String::new(),
                reason: m,
            },
            "not_found" => Error::NotFound(m),
            "already_exists" => Error::AlreadyExists(m),
            "too_large" => Error::Backend(m).into_too_large(),
            "timed_out" => Error::TimedOut(Duration::ZERO),
            "conflict" => Error::Conflict(m),
            "unauthorized" => Error::Unauthorized(m),
            "busy" => Error::Busy(m),
            _ => Error::Backend(m),
        }
    }

    fn into_too_large(self) -> Self {
        match self {
            Error::Backend(m) => Error::TooLarge {
                what: m,
                limit: u64::MAX,
            },
            e => e,
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

/// `"{what} is too large: ..."`; a rebuilt error (limit `u64::MAX`) shows its message alone.
fn too_large(what: &str, limit: u64) -> String {
    if limit == u64::MAX {
        what.to_owned()
    } else {
        format!("{what} is too large: the limit is {limit} bytes")
    }
}

/// `"{what} {path:?}: {reason}"`, or just the reason for an error rebuilt from the wire (where
/// the reason already names the path).
fn with_subject(what: &str, path: &str, reason: &str) -> String {
    if path.is_empty() {
        reason.to_owned()
    } else {
        format!("{what} {}: {reason}", shown(path))
    }
}

fn outside(path: &str, reason: &str) -> String {
    if path.is_empty() {
        reason.to_owned()
    } else {
        format!("path {} is outside the workspace: {reason}", shown(path))
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
