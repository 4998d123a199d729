//! Files: byte-exact write and download, listing, glob and grep.

use std::fmt;
use std::time::Duration;

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
        let mut d = self
            .download_stream(path, limit, self.request_timeout, false)
            .await?;
        let mut out = Vec::new();
        while let Some(chunk) = d.chunk().await? {
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    /// `GET /v1/file/download`, streamed: the response once its status is known, to be read
    /// chunk by chunk with [`Download::chunk`], refusing more than `limit` bytes in all.
    /// `timeout` bounds the whole transfer. With `abort_on_change`, the server is asked
    /// (`change_policy=abort`) to cut the transfer short if the file changes meanwhile, which
    /// then fails as a broken transfer rather than handing out a mixed file.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn download_stream(
        &self,
        path: &str,
        limit: u64,
        timeout: Duration,
        abort_on_change: bool,
    ) -> Result<Download, AioError> {
        let route = "v1/file/download";
        let mut url = self.url(route);
        url.query_pairs_mut().append_pair("path", path);
        if abort_on_change {
            url.query_pairs_mut().append_pair("change_policy", "abort");
        }
        let resp = self
            .http
            .get(url)
            .timeout(timeout)
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
        Ok(Download {
            client: self.clone(),
            resp,
            limit,
            received: 0,
        })
    }

    /// `POST /v1/file/upload` (multipart, streamed): writes the bytes `data` yields to `path`
    /// and returns the size the server reports. The length need not be known beforehand
    /// (the body is sent chunked); an error from `data` aborts the request. `timeout` bounds
    /// the whole transfer.
    ///
    /// # Errors
    /// [`AioError::Protocol`] when the server names another file than `path`; see
    /// [`AioError`].
    pub async fn upload<S>(&self, path: &str, data: S, timeout: Duration) -> Result<u64, AioError>
    where
        S: futures::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static,
    {
        let route = "v1/file/upload";
        let name = path.rsplit('/').next().unwrap_or("upload").to_owned();
        let part = reqwest::multipart::Part::stream(reqwest::Body::wrap_stream(data))
            .file_name(name)
            .mime_str("application/octet-stream")
            .map_err(|e| AioError::Protocol {
                route: route.into(),
                reason: format!("cannot build the upload: {e}"),
            })?;
        let form = reqwest::multipart::Form::new()
            .text("path", path.to_owned())
            .part("file", part);
        let resp = self
            .http
            .post(self.url(route))
            .timeout(timeout)
            .multipart(form)
            .send()
            .await
            .map_err(|e| self.unreachable(route, e))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| self.unreachable(route, e))?;
        let data = decode_envelope(route, status, &bytes)?;
        #[derive(Deserialize)]
        struct Uploaded {
            file_path: String,
            file_size: u64,
        }
        let up: Uploaded = serde_json::from_value(data).map_err(|e| AioError::Protocol {
            route: route.into(),
            reason: format!("the data does not match the spec: {e}"),
        })?;
        if up.file_path != path {
            return Err(AioError::Protocol {
                route: route.into(),
                reason: format!("the server wrote {:?}, not {path:?}", up.file_path),
            });
        }
        Ok(up.file_size)
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

/// A download under way ([`AioClient::download_stream`]).
pub struct Download {
    client: AioClient,
    resp: reqwest::Response,
    limit: u64,
    received: u64,
}

impl fmt::Debug for Download {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Download")
            .field("limit", &self.limit)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

impl Download {
    /// The next chunk, `None` at the end.
    ///
    /// # Errors
    /// [`AioError::TooLarge`] once more than the limit has come; [`AioError::Unreachable`]
    /// for a broken transfer.
    pub async fn chunk(&mut self) -> Result<Option<bytes::Bytes>, AioError> {
        let route = "v1/file/download";
        let chunk = self
            .resp
            .chunk()
            .await
            .map_err(|e| self.client.unreachable(route, e))?;
        if let Some(c) = &chunk {
            self.received += c.len() as u64;
            if self.received > self.limit {
                return Err(AioError::TooLarge {
                    route: route.into(),
                    limit: self.limit,
                });
            }
        }
        Ok(chunk)
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.received
    }
}
