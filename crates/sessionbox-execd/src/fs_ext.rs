//! sessionbox's file-operation extension of the execd API.
//!
//! The execd API has no exact-string edit, no grep with line numbers and no atomic whole-file
//! write that keeps sessionbox's typed errors. A sessionbox agent therefore also serves one
//! extra route, [`FS_PATH`], taking an [`FsRequest`] and answering an [`FsResponse`], or an
//! [`ErrorResponse`](crate::types::ErrorResponse) whose `code` is [`FS_ERROR_PREFIX`] followed by
//! the [`sessionbox_core::Error::code`], so a refusal inside the sandbox (a link out, say) is the
//! same typed error on the caller's side. Upstream execd does not serve this route.

use serde::{Deserialize, Serialize};
use sessionbox_core::{DirEntry, EditRequest, EditResult, FileStat, GrepMatch, GrepRequest};

use crate::{ExecdClient, ExecdError};

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
        #[serde(with = "b64")]
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
    Data(#[serde(with = "b64")] Vec<u8>),
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

impl ExecdClient {
    /// `POST /sessionbox/v1/fs`: one file operation on a sessionbox agent.
    ///
    /// # Errors
    /// The agent's typed error rebuilt with [`sessionbox_core::Error::from_code`] (through
    /// `From<ExecdError>`); transport failures as [`ExecdError`].
    pub async fn fs(&self, request: &FsRequest) -> Result<FsResponse, ExecdError> {
        let r = self.post_json("fs", FS_PATH, &[], request).await?;
        self.json("fs", r).await
    }
}

mod b64 {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(data))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
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
