//! The file and directory endpoints of [`ExecdClient`].

use std::collections::BTreeMap;

use bytes::Bytes;
use reqwest::{Method, StatusCode, header};

use super::ExecdClient;
use crate::error::ExecdError;
use crate::fs_ext::{FS_PATH, FsRequest, FsResponse};
use crate::multipart;
use crate::types::{
    FileInfo, Permission, RenameFileItem, ReplaceFileContentItem, ReplaceFileContentResult,
    UploadFile,
};
use crate::wire::{self, query};

impl ExecdClient {
    /// `GET /files/info?path=...`: metadata by path.
    pub async fn files_info<I, S>(&self, paths: I) -> Result<BTreeMap<String, FileInfo>, ExecdError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        const OP: &str = "files info";
        let paths = collect_paths(paths)?;
        let q = path_query(&paths);
        let r = self
            .call(OP, Method::GET, wire::FILES_INFO, &q, |rb| rb)
            .await?;
        self.json_or_default(OP, r).await
    }

    /// `DELETE /files?path=...`: removes files (not directories).
    pub async fn remove_files<I, S>(&self, paths: I) -> Result<(), ExecdError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let paths = collect_paths(paths)?;
        let q = path_query(&paths);
        self.call("remove files", Method::DELETE, wire::FILES, &q, |rb| rb)
            .await
            .map(drop)
    }

    /// `POST /files/mv`: renames or moves files.
    pub async fn move_files(&self, items: &[RenameFileItem]) -> Result<(), ExecdError> {
        self.post_json("move files", wire::FILES_MOVE, &[], items)
            .await
            .map(drop)
    }

    /// `POST /files/permissions`: sets owner, group and mode by path.
    pub async fn chmod_files(
        &self,
        permissions: &BTreeMap<String, Permission>,
    ) -> Result<(), ExecdError> {
        self.post_json("set permissions", wire::FILES_PERMISSIONS, &[], permissions)
            .await
            .map(drop)
    }

    /// `GET /files/search?path=&pattern=`: files below `dir` matching a glob (`**` when `None`,
    /// which the SDK sends explicitly too).
    pub async fn search_files(
        &self,
        dir: &str,
        pattern: Option<&str>,
    ) -> Result<Vec<FileInfo>, ExecdError> {
        const OP: &str = "search files";
        let q = [
            (query::PATH, dir),
            (query::PATTERN, pattern.unwrap_or("**")),
        ];
        let r = self
            .call(OP, Method::GET, wire::FILES_SEARCH, &q, |rb| rb)
            .await?;
        self.json_or_default(OP, r).await
    }

    /// `POST /files/replace?verbose=true`: replaces text in files; returns the count per file
    /// (an empty map from a server that ignores `verbose`).
    pub async fn replace_content(
        &self,
        items: &BTreeMap<String, ReplaceFileContentItem>,
    ) -> Result<BTreeMap<String, ReplaceFileContentResult>, ExecdError> {
        const OP: &str = "replace content";
        if items.values().any(|i| i.old.is_empty()) {
            return Err(ExecdError::InvalidRequest(
                "the text to replace must not be empty".into(),
            ));
        }
        let r = self
            .post_json(OP, wire::FILES_REPLACE, &[(query::VERBOSE, "true")], items)
            .await?;
        self.json_or_default(OP, r).await
    }

    /// `POST /files/upload`: writes files (multipart, metadata and data parts paired by order,
    /// sent with a `Content-Length` so it also passes the OpenSandbox server proxy). Does
    /// nothing for an empty list, as the SDK.
    pub async fn upload(&self, files: &[UploadFile]) -> Result<(), ExecdError> {
        if files.is_empty() {
            return Ok(());
        }
        if files.iter().any(|f| f.metadata.path.is_empty()) {
            return Err(ExecdError::InvalidRequest("an upload path is empty".into()));
        }
        let body = multipart::encode_upload(files);
        let content_type = body.content_type();
        self.call(
            "upload files",
            Method::POST,
            wire::FILES_UPLOAD,
            &[],
            move |rb| {
                rb.header(header::CONTENT_TYPE, content_type)
                    .body(body.body)
            },
        )
        .await
        .map(drop)
    }

    /// `GET /files/download?path=`: the whole file.
    pub async fn download(&self, path: &str) -> Result<Bytes, ExecdError> {
        const OP: &str = "download file";
        let r = self
            .call(
                OP,
                Method::GET,
                wire::FILES_DOWNLOAD,
                &[(query::PATH, path)],
                |rb| rb,
            )
            .await?;
        self.body(OP, r).await
    }

    /// `GET /files/download?path=` with `Range: bytes=START-[END]` (`end` inclusive). A server
    /// that ignores the range and answers 200 with the whole file is cut down here.
    pub async fn download_range(
        &self,
        path: &str,
        start: u64,
        end: Option<u64>,
    ) -> Result<Bytes, ExecdError> {
        const OP: &str = "download range";
        if end.is_some_and(|e| e < start) {
            return Err(ExecdError::InvalidRequest(format!(
                "range end {} is before its start {start}",
                end.unwrap_or_default()
            )));
        }
        let range = match end {
            Some(e) => format!("bytes={start}-{e}"),
            None => format!("bytes={start}-"),
        };
        let r = self
            .call(
                OP,
                Method::GET,
                wire::FILES_DOWNLOAD,
                &[(query::PATH, path)],
                |rb| rb.header(header::RANGE, range),
            )
            .await?;
        let partial = r.status() == StatusCode::PARTIAL_CONTENT;
        let body = self.body(OP, r).await?;
        if partial {
            return Ok(body);
        }
        let len = body.len() as u64;
        let from = start.min(len) as usize;
        let to = end.map_or(len, |e| e.saturating_add(1).min(len)) as usize;
        Ok(body.slice(from..to))
    }

    /// `GET /files/download?path=&offset=&limit=`: `limit` lines (all when `None`) from line
    /// `offset` (1-based), as text.
    pub async fn download_lines(
        &self,
        path: &str,
        offset: u64,
        limit: Option<u64>,
    ) -> Result<String, ExecdError> {
        const OP: &str = "download lines";
        let offset = offset.max(1).to_string();
        let limit = limit.map(|l| l.to_string());
        let mut q = vec![(query::PATH, path), (query::OFFSET, offset.as_str())];
        if let Some(l) = &limit {
            q.push((query::LIMIT, l));
        }
        let r = self
            .call(OP, Method::GET, wire::FILES_DOWNLOAD, &q, |rb| rb)
            .await?;
        let body = self.body(OP, r).await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    // ----- directories -----

    /// `GET /directories/list?path=&depth=`: entries below `dir`, down to `depth` levels (the
    /// server's default, 1 = immediate children, when `None`; the SDK then sends no `depth`).
    pub async fn list_directory(
        &self,
        dir: &str,
        depth: Option<u32>,
    ) -> Result<Vec<FileInfo>, ExecdError> {
        const OP: &str = "list directory";
        let depth = depth.map(|d| d.to_string());
        let mut q = vec![(query::PATH, dir)];
        if let Some(d) = &depth {
            q.push((query::DEPTH, d.as_str()));
        }
        let r = self
            .call(OP, Method::GET, wire::DIRECTORIES_LIST, &q, |rb| rb)
            .await?;
        self.json_or_default(OP, r).await
    }

    /// `POST /directories`: creates directories with parents (`mkdir -p`).
    pub async fn make_dirs(&self, dirs: &BTreeMap<String, Permission>) -> Result<(), ExecdError> {
        self.post_json("make directories", wire::DIRECTORIES, &[], dirs)
            .await
            .map(drop)
    }

    /// `DELETE /directories?path=...`: removes directories recursively.
    pub async fn remove_dirs<I, S>(&self, paths: I) -> Result<(), ExecdError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let paths = collect_paths(paths)?;
        let q = path_query(&paths);
        self.call(
            "remove directories",
            Method::DELETE,
            wire::DIRECTORIES,
            &q,
            |rb| rb,
        )
        .await
        .map(drop)
    }
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

fn collect_paths<I, S>(paths: I) -> Result<Vec<String>, ExecdError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let paths: Vec<String> = paths.into_iter().map(|p| p.as_ref().to_owned()).collect();
    if paths.is_empty() {
        return Err(ExecdError::InvalidRequest(
            "at least one path is required".into(),
        ));
    }
    Ok(paths)
}

fn path_query(paths: &[String]) -> Vec<(&'static str, &str)> {
    paths.iter().map(|p| (query::PATH, p.as_str())).collect()
}
