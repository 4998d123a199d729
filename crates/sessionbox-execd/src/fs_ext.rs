//! sessionbox's file-operation extension of the execd API.
//!
//! The execd API has no exact-string edit, no grep with line numbers and no atomic whole-file
//! write that keeps sessionbox's typed errors. A sessionbox agent therefore also serves one
//! extra route, [`FS_PATH`], taking an [`FsRequest`] and answering an [`FsResponse`], or an
//! [`ErrorResponse`](crate::types::ErrorResponse) whose `code` is [`FS_ERROR_PREFIX`] followed by
//! the [`sessionbox_core::Error::code`], so a refusal inside the sandbox (a link out, say) is the
//! same typed error on the caller's side. Upstream execd does not serve this route.

#[cfg(feature = "client")]
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sessionbox_core::{DirEntry, EditRequest, EditResult, FileStat, GrepMatch, GrepRequest};
#[cfg(feature = "client")]
use sessionbox_core::{Error, WorkspacePath};

/// The extension route: `POST` with an [`FsRequest`] JSON body.
pub const FS_PATH: &str = "/sessionbox/v1/fs";

/// Prefix of the `code` of an error answered by [`FS_PATH`]; the rest is a
/// [`sessionbox_core::Error::code`].
pub const FS_ERROR_PREFIX: &str = "SESSIONBOX::";

/// One file operation, as the `Session` trait names it. Paths are workspace paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FsRequest {
    /// Read a whole regular file.
    Read {
        /// The file.
        path: String,
    },
    /// Write a whole file atomically, creating parents.
    Write {
        /// The file.
        path: String,
        /// The contents, base64 (standard alphabet, padded) in JSON.
        #[serde(with = "crate::b64::bytes")]
        data: Vec<u8>,
    },
    /// Replace an exact string.
    Edit {
        /// The file.
        path: String,
        /// What to replace.
        edit: EditRequest,
    },
    /// List a directory.
    List {
        /// The directory.
        path: String,
    },
    /// Files matching a glob.
    Glob {
        /// The pattern.
        pattern: String,
    },
    /// Search file contents.
    Grep {
        /// The search.
        request: GrepRequest,
    },
    /// Metadata of a path.
    Stat {
        /// The path.
        path: String,
    },
    /// Remove a file, link or directory.
    Remove {
        /// The path.
        path: String,
        /// Remove a non-empty directory.
        recursive: bool,
    },
    /// Create a directory and its parents.
    Mkdir {
        /// The directory.
        path: String,
    },
}

/// The answer to an [`FsRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum FsResponse {
    /// File contents (for `read`), base64 in JSON.
    Data(#[serde(with = "crate::b64::bytes")] Vec<u8>),
    /// Done, nothing to return (`write`, `remove`, `mkdir`).
    Done,
    /// What an edit did.
    Edited(EditResult),
    /// Directory entries.
    Entries(Vec<DirEntry>),
    /// Workspace-relative paths.
    Paths(Vec<String>),
    /// Matching lines.
    Matches(Vec<GrepMatch>),
    /// Metadata.
    Stat(FileStat),
}

/// The `Session` file operations of a session whose agent serves this extension: each checks
/// its paths against the presented workspace root first (nothing is sent for a refused path),
/// sends one [`FsRequest`] through [`FsSession::fs`], and takes the one answer that fits. A
/// runtime implements [`FsSession::fs`] and [`FsSession::presented_root`] (and any retry or
/// relaunch around them) and forwards its `Session` methods here.
///
/// # Errors
/// [`Error::InvalidPath`] or [`Error::OutsideWorkspace`] for a refused path; the agent's typed
/// error; [`Error::Backend`] when the agent answers with the wrong kind of response.
#[cfg(feature = "client")]
#[async_trait]
pub trait FsSession: Send + Sync {
    /// The workspace root as commands see it (`/workspace`).
    fn presented_root(&self) -> &str;

    /// Sends one request to the agent.
    async fn fs(&self, request: FsRequest) -> sessionbox_core::Result<FsResponse>;

    /// A caller's path as a workspace path under [`FsSession::presented_root`].
    fn checked(&self, path: &str) -> sessionbox_core::Result<String> {
        let root = self.presented_root();
        WorkspacePath::resolve(root, path).map(|p| p.presented(root))
    }

    /// `Session::read`.
    async fn fs_read(&self, path: &str) -> sessionbox_core::Result<Vec<u8>> {
        let path = self.checked(path)?;
        match self.fs(FsRequest::Read { path }).await? {
            FsResponse::Data(d) => Ok(d),
            r => Err(unexpected("read", r)),
        }
    }

    /// `Session::write`.
    async fn fs_write(&self, path: &str, data: &[u8]) -> sessionbox_core::Result<()> {
        let path = self.checked(path)?;
        let data = data.to_vec();
        match self.fs(FsRequest::Write { path, data }).await? {
            FsResponse::Done => Ok(()),
            r => Err(unexpected("write", r)),
        }
    }

    /// `Session::edit`.
    async fn fs_edit(&self, path: &str, edit: &EditRequest) -> sessionbox_core::Result<EditResult> {
        let path = self.checked(path)?;
        let edit = edit.clone();
        match self.fs(FsRequest::Edit { path, edit }).await? {
            FsResponse::Edited(e) => Ok(e),
            r => Err(unexpected("edit", r)),
        }
    }

    /// `Session::list`.
    async fn fs_list(&self, path: &str) -> sessionbox_core::Result<Vec<DirEntry>> {
        let path = self.checked(path)?;
        match self.fs(FsRequest::List { path }).await? {
            FsResponse::Entries(e) => Ok(e),
            r => Err(unexpected("list", r)),
        }
    }

    /// `Session::glob`.
    async fn fs_glob(&self, pattern: &str) -> sessionbox_core::Result<Vec<String>> {
        let pattern = pattern.to_owned();
        match self.fs(FsRequest::Glob { pattern }).await? {
            FsResponse::Paths(p) => Ok(p),
            r => Err(unexpected("glob", r)),
        }
    }

    /// `Session::grep`.
    async fn fs_grep(&self, request: &GrepRequest) -> sessionbox_core::Result<Vec<GrepMatch>> {
        let mut request = request.clone();
        if let Some(p) = &request.path {
            request.path = Some(self.checked(p)?);
        }
        match self.fs(FsRequest::Grep { request }).await? {
            FsResponse::Matches(m) => Ok(m),
            r => Err(unexpected("grep", r)),
        }
    }

    /// `Session::stat`.
    async fn fs_stat(&self, path: &str) -> sessionbox_core::Result<FileStat> {
        let path = self.checked(path)?;
        match self.fs(FsRequest::Stat { path }).await? {
            FsResponse::Stat(s) => Ok(s),
            r => Err(unexpected("stat", r)),
        }
    }

    /// `Session::remove`.
    async fn fs_remove(&self, path: &str, recursive: bool) -> sessionbox_core::Result<()> {
        let path = self.checked(path)?;
        match self.fs(FsRequest::Remove { path, recursive }).await? {
            FsResponse::Done => Ok(()),
            r => Err(unexpected("remove", r)),
        }
    }

    /// `Session::mkdir`.
    async fn fs_mkdir(&self, path: &str) -> sessionbox_core::Result<()> {
        let path = self.checked(path)?;
        match self.fs(FsRequest::Mkdir { path }).await? {
            FsResponse::Done => Ok(()),
            r => Err(unexpected("mkdir", r)),
        }
    }
}

/// An answer of the wrong kind for `op`.
#[cfg(feature = "client")]
fn unexpected(op: &str, r: FsResponse) -> Error {
    Error::Backend(format!("the agent answered {op} with {r:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_responses_round_trip() {
        let reqs = [
            FsRequest::Write {
                path: "a/b.txt".into(),
                data: vec![0, 159, 146, 150, b'\n'],
            },
            FsRequest::Grep {
                request: GrepRequest::new("fn main"),
            },
            FsRequest::Remove {
                path: "x".into(),
                recursive: true,
            },
        ];
        for r in reqs {
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(
                serde_json::from_str::<FsRequest>(&json).unwrap(),
                r,
                "{json}"
            );
        }
        let resp = FsResponse::Data(vec![1, 2, 255]);
        let json = serde_json::to_string(&resp).unwrap();
        assert_eq!(json, r#"{"kind":"data","value":"AQL/"}"#);
        assert_eq!(serde_json::from_str::<FsResponse>(&json).unwrap(), resp);
        let done = serde_json::to_string(&FsResponse::Done).unwrap();
        assert_eq!(
            serde_json::from_str::<FsResponse>(&done).unwrap(),
            FsResponse::Done
        );
    }

    #[test]
    fn bad_base64_is_refused() {
        let bad = r#"{"op":"write","path":"a","data":"***"}"#;
        assert!(serde_json::from_str::<FsRequest>(bad).is_err());
    }
}
