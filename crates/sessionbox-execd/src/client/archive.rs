//! The workspace-archive endpoints of [`ExecdClient`] (see [`crate::archive_ext`]).

use std::path::Path;

use futures::StreamExt;
use reqwest::{Method, header};
use sessionbox_core::ArchiveStats;
use tokio::io::AsyncWriteExt;

use super::ExecdClient;
use crate::archive_ext::{ARCHIVE_CONTENT_TYPE, ARCHIVE_PATH, DEFAULT_MAX_ARCHIVE_BYTES};
use crate::error::ExecdError;

fn local(what: &str, path: &Path, e: &std::io::Error) -> ExecdError {
    ExecdError::InvalidRequest(format!("cannot {what} {}: {e}", path.display()))
}

impl ExecdClient {
    /// `GET /sessionbox/v1/archive`: writes the tar of the whole workspace to the local file
    /// `to` (created or truncated), streamed as it arrives, and counts what it holds from the
    /// archive itself (so [`ArchiveStats::skipped`] is 0: what the agent left out is not in
    /// it). The agent pauses its background commands meanwhile.
    ///
    /// The response head must come within the request timeout; the body has no overall
    /// deadline, but each piece must come within it, and at most `max_bytes` of it are taken:
    /// the agent runs inside a sandbox, so what it sends is bounded here, not by its word. A
    /// cut transfer is an error (the file then holds what arrived).
    ///
    /// # Errors
    /// [`ExecdError::InvalidRequest`] when `to` cannot be written or read back;
    /// [`ExecdError::TooLarge`] past `max_bytes`; the agent's refusal as
    /// [`ExecdError::Status`]; a transfer failure.
    pub async fn download_archive(
        &self,
        to: &Path,
        max_bytes: u64,
    ) -> Result<ArchiveStats, ExecdError> {
        const OP: &str = "download archive";
        let rb = self.request(Method::GET, self.url(ARCHIVE_PATH, &[]), false);
        let response = self.with_deadline(OP, self.send(OP, rb)).await?;
        let mut file = tokio::fs::File::create(to)
            .await
            .map_err(|e| local("create", to, &e))?;
        let mut body = response.bytes_stream();
        let mut taken: u64 = 0;
        loop {
            let next =
                match self.request_timeout {
                    Some(t) => tokio::time::timeout(t, body.next()).await.map_err(|_| {
                        ExecdError::Timeout {
                            operation: OP,
                            after: t,
                        }
                    })?,
                    None => body.next().await,
                };
            match next {
                None => break,
                Some(Ok(chunk)) => {
                    taken = taken.saturating_add(chunk.len() as u64);
                    if taken > max_bytes {
                        return Err(ExecdError::TooLarge {
                            what: "the workspace archive",
                            limit: max_bytes,
                        });
                    }
                    file.write_all(&chunk)
                        .await
                        .map_err(|e| local("write", to, &e))?;
                }
                Some(Err(e)) => return Err(self.transport_error(OP, e)),
            }
        }
        file.flush().await.map_err(|e| local("write", to, &e))?;
        drop(file);
        let path = to.to_path_buf();
        tokio::task::spawn_blocking(move || count_entries(&path))
            .await
            .map_err(|e| ExecdError::InvalidRequest(format!("counting the archive failed: {e}")))?
    }

    /// `PUT /sessionbox/v1/archive`: replaces the workspace's whole contents with the tar in
    /// the local file `from`, streamed as the body. The agent checks every entry before it
    /// removes anything.
    ///
    /// An archive above the agent's default limit
    /// ([`DEFAULT_MAX_ARCHIVE_BYTES`]) is refused before sending: a peer that refuses a body
    /// early closes the connection under it, which the sender sees as a broken pipe. The
    /// request has no overall deadline (restoring takes as long as writing the files).
    ///
    /// # Errors
    /// [`ExecdError::InvalidRequest`] when `from` cannot be read; [`ExecdError::TooLarge`];
    /// the agent's refusal as [`ExecdError::Status`] (`SESSIONBOX::invalid_request` for an
    /// archive that breaks a rule, `SESSIONBOX::too_large` for a full workspace).
    pub async fn upload_archive(&self, from: &Path) -> Result<ArchiveStats, ExecdError> {
        const OP: &str = "upload archive";
        let file = tokio::fs::File::open(from)
            .await
            .map_err(|e| local("open", from, &e))?;
        let len = file
            .metadata()
            .await
            .map_err(|e| local("read", from, &e))?
            .len();
        if len > DEFAULT_MAX_ARCHIVE_BYTES {
            return Err(ExecdError::TooLarge {
                what: "the archive",
                limit: DEFAULT_MAX_ARCHIVE_BYTES,
            });
        }
        let rb = self
            .request(Method::PUT, self.url(ARCHIVE_PATH, &[]), false)
            .header(header::CONTENT_TYPE, ARCHIVE_CONTENT_TYPE)
            .header(header::CONTENT_LENGTH, len)
            .body(reqwest::Body::from(file));
        let response = self.send(OP, rb).await?;
        self.json(OP, response).await
    }
}

/// Counts the entries of the tar archive in `path` (files, directories but the root, links).
fn count_entries(path: &Path) -> Result<ArchiveStats, ExecdError> {
    let bad = |e: std::io::Error| {
        ExecdError::InvalidRequest(format!(
            "the archive written to {} cannot be read back: {e}",
            path.display()
        ))
    };
    let file = std::fs::File::open(path).map_err(bad)?;
    let mut ar = tar::Archive::new(std::io::BufReader::new(file));
    let mut stats = ArchiveStats::default();
    for entry in ar.entries().map_err(bad)? {
        let entry = entry.map_err(bad)?;
        match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                stats.files += 1;
                stats.bytes += entry.size();
            }
            tar::EntryType::Directory => {
                let p = entry.path_bytes();
                if !p.split(|c| *c == b'/').all(|c| c.is_empty() || c == b".") {
                    stats.directories += 1;
                }
            }
            tar::EntryType::Symlink => stats.links += 1,
            _ => {}
        }
    }
    Ok(stats)
}
