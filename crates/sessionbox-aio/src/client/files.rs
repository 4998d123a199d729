//! Files: byte-exact write and download, listing, glob and grep.

use base64::Engine as _;
use reqwest::Method;
use serde::Deserialize;

use super::envelope::{decode_envelope, shorten};
use super::types::{FileGlobResult, FileListResult};
use super::{AioClient, AioError, FileGrepRequest, FileGrepResult, FileInfo, GlobFileInfo};

impl AioClient {
    /// `POST /v1/file/write` with base64: writes `data` to `path` byte for byte.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn write_file(&self, path: &str, data: &[u8]) -> Result<(), AioError> {
        let body = serde_json::json!({
            "file": path,
            "content": base64::engine::general_purpose::STANDARD.encode(data),
            "encoding": "base64",
        });
        #[derive(Deserialize)]
        struct Written {
            #[serde(default)]
            bytes_written: Option<u64>,
        }
        let w: Written = self
            .call(
                Method::POST,
                "v1/file/write",
                Some(&body),
                self.request_timeout,
            )
            .await?;
        match w.bytes_written {
            Some(n) if n != data.len() as u64 => Err(AioError::Protocol {
                route: "v1/file/write".into(),
                reason: format!("{n} bytes written of {}", data.len()),
            }),
            _ => Ok(()),
        }
    }

    /// `GET /v1/file/download`: the file's bytes, refusing more than `limit`.
    ///
    /// # Errors
    /// [`AioError::TooLarge`] past `limit`; see [`AioError`].
    pub async fn download(&self, path: &str, limit: u64) -> Result<Vec<u8>, AioError> {
        let route = "v1/file/download";
        let mut url = self.url(route);
        url.query_pairs_mut().append_pair("path", path);
        let mut resp = self
            .http
            .get(url)
            .timeout(self.request_timeout)
            .send()
            .await
            .map_err(|e| self.unreachable(route, e))?;
        let status = resp.status();
        if !status.is_success() {
            let bytes = resp.bytes().await.map_err(|e| self.unreachable(route, e))?;
            decode_envelope(route, status, &bytes)?;
            return Err(AioError::Http {
                route: route.into(),
                status: status.as_u16(),
                message: shorten(&String::from_utf8_lossy(&bytes)),
            });
        }
        let mut out = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.unreachable(route, e))? {
            if (out.len() + chunk.len()) as u64 > limit {
                return Err(AioError::TooLarge {
                    route: route.into(),
                    limit,
                });
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    /// `POST /v1/file/list` of one directory (not recursive, hidden files included).
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn list(&self, path: &str) -> Result<Vec<FileInfo>, AioError> {
        let body = serde_json::json!({"path": path, "recursive": false, "show_hidden": true,
            "include_size": true, "sort_by": "name"});
        let r: FileListResult = self
            .call(
                Method::POST,
                "v1/file/list",
                Some(&body),
                self.request_timeout,
            )
            .await?;
        Ok(r.files)
    }

    /// `POST /v1/file/glob` under `path`; hidden files included, files only. Returns the
    /// matches and whether `max` cut them.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn glob(
        &self,
        path: &str,
        pattern: &str,
        max: u64,
    ) -> Result<(Vec<GlobFileInfo>, bool), AioError> {
        let body = serde_json::json!({"path": path, "pattern": pattern, "include_hidden": true,
            "files_only": true, "include_metadata": false, "max_results": max.clamp(1, 50_000),
            "sort_by": "path"});
        let r: FileGlobResult = self
            .call(
                Method::POST,
                "v1/file/glob",
                Some(&body),
                self.request_timeout,
            )
            .await?;
        Ok((r.files, r.truncated))
    }

    /// `POST /v1/file/grep`.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn grep(&self, req: &FileGrepRequest) -> Result<FileGrepResult, AioError> {
        self.call(
            Method::POST,
            "v1/file/grep",
            Some(req),
            self.request_timeout,
        )
        .await
    }
}
