//! The workspace path policy.
//!
//! Rule (`shared/cases/workspace-paths.json`): paths given to file operations and to the exec
//! working directory are resolved inside the conversation's workspace. Relative paths start at the
//! workspace root; an absolute path is accepted only when it lies inside the workspace as the
//! runtime presents it (for example `/workspace` in an isolated sandbox, the host directory for
//! the `host` runtime). Containment is decided component by component, never by string prefix
//! (CVE-2025-53110: `/workspace-evil` is not inside `/workspace`).
//!
//! This module decides containment lexically. It does not look at the file system: symbolic links
//! are the business of the runtime, which resolves the normalised path beneath a descriptor of the
//! workspace (`openat2` with `RESOLVE_BENEATH`), so a link never leads out either.

use std::fmt;

use crate::error::Error;

/// The longest path accepted, in bytes (Linux `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;

/// A path inside a workspace, normalised: no `.`, no `..`, no empty components, relative to the
/// workspace root. The root itself is the empty path.
///
/// ```
/// use sessionbox_core::WorkspacePath;
/// let p = WorkspacePath::resolve("/workspace", "./a/../b.txt").unwrap();
/// assert_eq!(p.as_str(), "b.txt");
/// assert_eq!(p.presented("/workspace"), "/workspace/b.txt");
/// assert!(WorkspacePath::resolve("/workspace", "/workspace-evil/x").is_err());
/// assert!(WorkspacePath::resolve("/workspace", "a/../../x").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct WorkspacePath {
    rel: String,
}

impl WorkspacePath {
    /// The workspace root itself.
    pub fn root() -> Self {
        WorkspacePath { rel: String::new() }
    }

    /// Resolves `input` against the workspace whose root is presented as `root` (an absolute,
    /// normalised path such as `/workspace`).
    ///
    /// # Errors
    /// - [`Error::InvalidPath`]: `input` is empty, contains a NUL byte, or is longer than
    ///   [`MAX_PATH_BYTES`].
    /// - [`Error::OutsideWorkspace`]: `input` is absolute and not inside `root`, or a `..`
    ///   climbs above the root.
    pub fn resolve(root: &str, input: &str) -> Result<Self, Error> {
        if input.is_empty() {
            return Err(invalid(
                input,
                "the path is empty; use \".\" for the workspace root",
            ));
        }
        if input.contains('\0') {
            return Err(invalid(input, "the path contains a NUL byte"));
        }
        if input.len() > MAX_PATH_BYTES {
            return Err(invalid(
                input,
                &format!("the path is longer than {MAX_PATH_BYTES} bytes"),
            ));
        }
        let rest = if input.starts_with('/') {
            match strip_root(root, input) {
                Some(rest) => rest,
                None => {
                    return Err(Error::OutsideWorkspace {
                        path: input.to_owned(),
                        reason: format!(
                            "an absolute path must lie inside the workspace {root}; use a path relative to it"
                        ),
                    });
                }
            }
        } else {
            input
        };
        let mut parts: Vec<&str> = Vec::new();
        for c in rest.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    if parts.pop().is_none() {
                        return Err(Error::OutsideWorkspace {
                            path: input.to_owned(),
                            reason: "'..' climbs above the workspace root".to_owned(),
                        });
                    }
                }
                c => parts.push(c),
            }
        }
        Ok(WorkspacePath {
            rel: parts.join("/"),
        })
    }

    /// The normalised relative path; empty for the root.
    pub fn as_str(&self) -> &str {
        &self.rel
    }

    /// The path for `openat`-style calls: `.` for the root, else [`as_str`](Self::as_str).
    pub fn as_relative(&self) -> &str {
        if self.rel.is_empty() { "." } else { &self.rel }
    }

    /// True for the workspace root.
    pub fn is_root(&self) -> bool {
        self.rel.is_empty()
    }

    /// The components, outermost first; none for the root.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.rel.split('/').filter(|c| !c.is_empty())
    }

    /// The last component; `None` for the root.
    pub fn file_name(&self) -> Option<&str> {
        if self.rel.is_empty() {
            None
        } else {
            self.rel.rsplit('/').next()
        }
    }

    /// The parent directory; `None` for the root.
    pub fn parent(&self) -> Option<WorkspacePath> {
        if self.rel.is_empty() {
            return None;
        }
        Some(WorkspacePath {
            rel: match self.rel.rfind('/') {
                Some(i) => self.rel[..i].to_owned(),
                None => String::new(),
            },
        })
    }

    /// Appends one component.
    ///
    /// # Errors
    /// [`Error::InvalidPath`] when `name` is empty, `.`, `..`, or contains `/` or NUL.
    pub fn join(&self, name: &str) -> Result<WorkspacePath, Error> {
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
            return Err(invalid(name, "not a single path component"));
        }
        Ok(WorkspacePath {
            rel: if self.rel.is_empty() {
                name.to_owned()
            } else {
                format!("{}/{}", self.rel, name)
            },
        })
    }

    /// The path as the runtime presents it under `root` (for example `/workspace/a/b`).
    pub fn presented(&self, root: &str) -> String {
        let root = root.trim_end_matches('/');
        if self.rel.is_empty() {
            if root.is_empty() {
                "/".into()
            } else {
                root.to_owned()
            }
        } else {
            format!("{root}/{}", self.rel)
        }
    }
}

impl fmt::Display for WorkspacePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_relative())
    }
}

/// Strips `root` from the absolute `input` component-wise; `None` when `input` is not inside.
fn strip_root<'a>(root: &str, input: &'a str) -> Option<&'a str> {
    let mut rest = input;
    for want in root.split('/').filter(|c| !c.is_empty() && *c != ".") {
        rest = rest.trim_start_matches('/');
        // Skip "." components of the input before comparing.
        while let Some(r) = rest
            .strip_prefix("./")
            .or(if rest == "." { Some("") } else { None })
        {
            rest = r.trim_start_matches('/');
        }
        let (head, tail) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if head != want {
            return None;
        }
        rest = tail;
    }
    Some(rest)
}

fn invalid(path: &str, reason: &str) -> Error {
    Error::InvalidPath {
        path: path.to_owned(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Cases {
        workspace: String,
        cases: Vec<Case>,
        exec_cwd_cases: Vec<CwdCase>,
    }
    #[derive(Deserialize)]
    struct Case {
        path: String,
        expect: String,
    }
    #[derive(Deserialize)]
    struct CwdCase {
        cwd: String,
    }

    fn cases() -> Cases {
        serde_json::from_str(include_str!("../tests/cases/workspace-paths.json")).unwrap()
    }

    #[test]
    fn every_shared_workspace_path_case_is_classified_as_expected() {
        let c = cases();
        for case in c.cases {
            let got = WorkspacePath::resolve(&c.workspace, &case.path);
            match case.expect.as_str() {
                "inside" | "not-outside" => {
                    let p = got.unwrap_or_else(|e| panic!("{:?}: {e}", case.path));
                    assert!(!p.components().any(|c| c == ".." || c == "."));
                }
                "outside" => assert_eq!(
                    got.as_ref().map_err(Error::code).unwrap_err(),
                    "outside_workspace",
                    "{:?}",
                    case.path
                ),
                "error" => assert_eq!(
                    got.as_ref().map_err(Error::code).unwrap_err(),
                    "invalid_path",
                    "{:?}",
                    case.path
                ),
                other => panic!("unknown expectation {other}"),
            }
        }
    }

    #[test]
    fn every_shared_exec_cwd_case_is_refused() {
        let c = cases();
        for case in c.exec_cwd_cases {
            assert!(
                WorkspacePath::resolve(&c.workspace, &case.cwd).is_err(),
                "{}",
                case.cwd
            );
        }
    }

    #[test]
    fn containment_is_by_component_for_every_sibling_spelling() {
        for root in ["/workspace", "/workspace/", "/data/workspaces/ab12"] {
            let r = root.trim_end_matches('/');
            for bad in [
                format!("{r}-evil/x"),
                format!("{r}evil"),
                format!("{r}./x"),
                format!("{r}/../x"),
                format!("{r}/a/../../x"),
                "/".to_owned(),
                "//".to_owned(),
            ] {
                assert!(WorkspacePath::resolve(root, &bad).is_err(), "{root} {bad}");
            }
            for good in [
                r.to_string(),
                format!("{r}/"),
                format!("{r}//a"),
                format!("{r}/./a/./b"),
                format!("{r}/a/.."),
            ] {
                assert!(WorkspacePath::resolve(root, &good).is_ok(), "{root} {good}");
            }
        }
    }

    #[test]
    fn dot_dot_never_climbs_above_the_root_at_any_depth() {
        for depth in 0..6 {
            let down = "d/".repeat(depth);
            let up = "../".repeat(depth + 1);
            assert!(WorkspacePath::resolve("/w", &format!("{down}{up}x")).is_err());
            let same = "../".repeat(depth);
            assert_eq!(
                WorkspacePath::resolve("/w", &format!("{down}{same}x"))
                    .unwrap()
                    .as_str(),
                "x"
            );
        }
    }

    #[test]
    fn backslashes_and_odd_names_are_ordinary_characters() {
        let p = WorkspacePath::resolve("/workspace", "foo\\..\\..\\x").unwrap();
        assert_eq!(p.components().count(), 1);
        assert_eq!(
            WorkspacePath::resolve("/w", "....").unwrap().as_str(),
            "...."
        );
        assert_eq!(WorkspacePath::resolve("/w", "...").unwrap().as_str(), "...");
    }

    #[test]
    fn too_long_paths_are_invalid() {
        let long = "a/".repeat(MAX_PATH_BYTES);
        assert_eq!(
            WorkspacePath::resolve("/w", &long).unwrap_err().code(),
            "invalid_path"
        );
    }

    #[test]
    fn parent_join_and_presentation() {
        let p = WorkspacePath::resolve("/w", "a/b/c").unwrap();
        assert_eq!(p.file_name(), Some("c"));
        assert_eq!(p.parent().unwrap().as_str(), "a/b");
        assert_eq!(p.parent().unwrap().join("d").unwrap().as_str(), "a/b/d");
        assert!(p.join("..").is_err());
        assert!(p.join("x/y").is_err());
        assert_eq!(WorkspacePath::root().presented("/w"), "/w");
        assert_eq!(WorkspacePath::root().as_relative(), ".");
        assert!(WorkspacePath::root().parent().is_none());
    }
}
