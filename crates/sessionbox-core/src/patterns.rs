//! The glob and search patterns of `glob` and `grep`, checked and compiled in one place: the
//! file-system confinement crate compiles them to walk a workspace, and a runtime that hands
//! the operation to a remote server checks them first, with the same rules and messages.
//!
//! ```
//! use sessionbox_core::patterns::{check_glob, check_grep};
//! use sessionbox_core::GrepRequest;
//!
//! assert!(check_glob("/workspace", "src/**/*.rs").is_ok());
//! assert!(check_glob("/workspace", "../*").is_err());
//! assert!(check_grep("/workspace", &GrepRequest::new("fn (")).is_err());
//! ```

use globset::{GlobBuilder, GlobMatcher};

use crate::{Error, GrepRequest, Result, WorkspacePath};

/// A glob pattern as a workspace-relative pattern: no `..` component; an absolute pattern must
/// lie inside `presented_root`, which is stripped; `.` and empty components are dropped.
///
/// # Errors
/// [`Error::InvalidRequest`] for an empty pattern or one naming the root itself;
/// [`Error::OutsideWorkspace`] for a `..` component or a pattern outside the root.
pub fn normalize_glob(presented_root: &str, pattern: &str) -> Result<String> {
    if pattern.is_empty() {
        return Err(Error::InvalidRequest("the glob pattern is empty".into()));
    }
    if pattern.split('/').any(|c| c == "..") {
        return Err(Error::OutsideWorkspace {
            path: pattern.to_owned(),
            reason: "a glob pattern may not contain a '..' component".into(),
        });
    }
    let rel = WorkspacePath::resolve(presented_root, pattern)?;
    if rel.is_root() {
        return Err(Error::InvalidRequest(format!(
            "the glob pattern {pattern:?} names the workspace root; use for example \"**/*\""
        )));
    }
    Ok(rel.as_str().to_owned())
}

/// Compiles a normalised pattern ([`normalize_glob`]): `*` and `?` stop at `/`, `**` crosses
/// directories, `\` escapes.
///
/// # Errors
/// [`Error::InvalidRequest`] for a pattern that is not a valid glob.
pub fn glob_matcher(pattern: &str) -> Result<GlobMatcher> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| Error::InvalidRequest(format!("invalid glob pattern: {e}")))
}

/// Compiles a search's regular expression (on bytes, case-insensitive when asked).
///
/// # Errors
/// [`Error::InvalidRequest`] for an invalid regular expression.
pub fn grep_regex(req: &GrepRequest) -> Result<regex::bytes::Regex> {
    regex::bytes::RegexBuilder::new(&req.pattern)
        .case_insensitive(req.case_insensitive)
        .build()
        .map_err(|e| Error::InvalidRequest(format!("invalid regular expression: {e}")))
}

/// Checks a glob pattern as a workspace's `glob` would, without a workspace, so a front end or
/// a remote runtime can refuse bad input before it opens (and so creates) a conversation.
///
/// # Errors
/// As `glob` for the pattern: empty, a `..` component, outside the root, or not a valid glob.
pub fn check_glob(presented_root: &str, pattern: &str) -> Result<()> {
    glob_matcher(&normalize_glob(presented_root, pattern)?).map(drop)
}

/// Checks a search as a workspace's `grep` would, without a workspace (see [`check_glob`]).
///
/// # Errors
/// An invalid regular expression, glob filter or path.
pub fn check_grep(presented_root: &str, req: &GrepRequest) -> Result<()> {
    grep_regex(req)?;
    if let Some(g) = &req.glob {
        check_glob(presented_root, g)?;
    }
    if let Some(p) = &req.path {
        WorkspacePath::resolve(presented_root, p)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_globs_are_refused_with_their_reason() {
        assert_eq!(
            normalize_glob("/workspace", "/workspace/./a//*.rs").unwrap(),
            "a/*.rs"
        );
        assert_eq!(check_glob("/w", "").unwrap_err().code(), "invalid_request");
        assert_eq!(
            check_glob("/w", "a/../b").unwrap_err().code(),
            "outside_workspace"
        );
        assert_eq!(
            check_glob("/w", "/w").unwrap_err().code(),
            "invalid_request"
        );
        assert_eq!(
            check_glob("/w", "/etc/*").unwrap_err().code(),
            "outside_workspace"
        );
        assert_eq!(
            check_glob("/w", "a[").unwrap_err().code(),
            "invalid_request"
        );
        let m = glob_matcher("src/*.rs").unwrap();
        assert!(m.is_match("src/a.rs") && !m.is_match("src/b/a.rs"));
    }

    #[test]
    fn bad_searches_are_refused() {
        let mut req = GrepRequest::new("a(");
        assert!(check_grep("/w", &req).is_err());
        req.pattern = "A".into();
        req.case_insensitive = true;
        assert!(grep_regex(&req).unwrap().is_match(b"a"));
        req.glob = Some("../x".into());
        assert!(check_grep("/w", &req).is_err());
        req.glob = None;
        req.path = Some("/elsewhere".into());
        assert!(check_grep("/w", &req).is_err());
        req.path = Some("sub".into());
        assert!(check_grep("/w", &req).is_ok());
    }
}
