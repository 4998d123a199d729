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
    /// The caller's credentials are valid but do not allow this request: an API key limited to
    /// other conversations, to reading, or to conversation routes. The message names the rule.
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// Too many requests are waiting for the same conversation; retry later.
    #[error("busy: {0}")]
    Busy(String),
    /// A backend (file system, process, store, remote server) failed.
    #[error("backend error: {0}")]
    Backend(String),
    /// A service the operation needs cannot serve it now: the store cannot be reached (a
    /// PostgreSQL server restarting, a network outage) or cannot take a write (the disk holding
    /// it is full). The same request may succeed once the service is back; the message says
    /// what is out of service. What failed was not done (a transaction is rolled back), except
    /// when a connection broke after a commit was sent: then the commit may have taken effect.
    #[error("unavailable: {0}")]
    Unavailable(String),
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
            Error::Forbidden(_) => "forbidden",
            Error::Busy(_) => "busy",
            Error::Backend(_) => "backend_error",
            Error::Unavailable(_) => "unavailable",
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
            "forbidden: ",
            "busy: ",
            "backend error: ",
            "unavailable: ",
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
            "forbidden" => Error::Forbidden(m),
            "busy" => Error::Busy(m),
            "unavailable" => Error::Unavailable(m),
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

/// How every runtime words an edit whose text to replace is empty ([`Error::InvalidRequest`]).
/// Library messages name no field or flag: each front end adds advice in its own words (see
/// [`Error::refusal`] and [`Error::with_advice`]).
pub const EDIT_EMPTY: &str = "the text to replace is empty";
/// The start of an edit's [`Error::Conflict`] when the text does not occur: `"{EDIT_ABSENT} in
/// PATH"`.
pub const EDIT_ABSENT: &str = "the text to replace does not occur";
/// The start of an edit's [`Error::Conflict`] when the text occurs more than once and not every
/// occurrence is to be replaced: `"{EDIT_AMBIGUOUS} N times in PATH"`.
pub const EDIT_AMBIGUOUS: &str = "the text to replace occurs";
/// What follows the path in a remove's [`Error::Conflict`] when a directory is not empty and
/// the remove is not recursive: `"PATH {DIRECTORY_NOT_EMPTY}"`.
pub const DIRECTORY_NOT_EMPTY: &str = "is a directory that is not empty";

/// A refusal that a front end explains in its own words (a flag, a field, a tool argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// An edit's text to replace is empty.
    EditEmpty,
    /// An edit's text to replace does not occur in the file.
    EditAbsent,
    /// An edit's text to replace occurs more than once and not every occurrence was asked for.
    EditAmbiguous,
    /// A directory to remove is not empty and the remove was not recursive.
    DirectoryNotEmpty,
}

impl Error {
    /// Which [`Refusal`] this is, if any: read from the words every runtime uses
    /// ([`EDIT_EMPTY`], [`EDIT_ABSENT`], [`EDIT_AMBIGUOUS`], [`DIRECTORY_NOT_EMPTY`]), so it
    /// holds for an error that crossed a wire too.
    ///
    /// ```
    /// use sessionbox_core::{Error, Refusal};
    /// let e = Error::Conflict("d is a directory that is not empty".into());
    /// assert_eq!(e.refusal(), Some(Refusal::DirectoryNotEmpty));
    /// ```
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Error::InvalidRequest(m) if m.contains(EDIT_EMPTY) => Some(Refusal::EditEmpty),
            Error::Conflict(m) if m.contains(EDIT_ABSENT) => Some(Refusal::EditAbsent),
            Error::Conflict(m) if m.contains(EDIT_AMBIGUOUS) => Some(Refusal::EditAmbiguous),
            Error::Conflict(m) if m.contains(DIRECTORY_NOT_EMPTY) => {
                Some(Refusal::DirectoryNotEmpty)
            }
            _ => None,
        }
    }

    /// The same error with `advice` after its message (`"...; advice"`): how a front end says
    /// what to do in its own words. Variants without a free message are returned unchanged.
    ///
    /// ```
    /// use sessionbox_core::Error;
    /// let e = Error::Conflict("d is a directory that is not empty".into());
    /// let e = e.with_advice("pass --recursive to remove it");
    /// assert_eq!(e.to_string(), "conflict: d is a directory that is not empty; pass --recursive to remove it");
    /// ```
    pub fn with_advice(self, advice: &str) -> Self {
        let add = |m: String| format!("{m}; {advice}");
        match self {
            Error::InvalidRequest(m) => Error::InvalidRequest(add(m)),
            Error::NotFound(m) => Error::NotFound(add(m)),
            Error::AlreadyExists(m) => Error::AlreadyExists(add(m)),
            Error::Conflict(m) => Error::Conflict(add(m)),
            Error::Busy(m) => Error::Busy(add(m)),
            Error::Unavailable(m) => Error::Unavailable(add(m)),
            e => e,
        }
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

    #[test]
    fn unavailable_crosses_a_wire_as_itself() {
        let e = Error::Unavailable("the store cannot be reached".into());
        assert_eq!(e.code(), "unavailable");
        let back = Error::from_code(e.code(), &e.to_string());
        assert_eq!(back, e);
        assert_eq!(
            back.with_advice("retry").to_string(),
            "unavailable: the store cannot be reached; retry"
        );
    }
}
