//! Workspace archives of an `aio` conversation
//! ([`sessionbox_core::Session::archive_workspace`] and
//! [`sessionbox_core::Session::restore_workspace`]), through the runtime's own operations: GNU tar run by a fixed
//! script in the container, and the archive streamed through `/v1/file/download` and
//! `/v1/file/upload`, never whole in memory.
//!
//! Taking one ([`scripts::ARCHIVE`]): the conversation's background commands are paused
//! (`SIGSTOP` to each running command's process group, `SIGCONT` after), GNU tar writes the
//! workspace to a temporary file in [`scripts::ARCHIVES_DIR`], and the download is rewritten
//! as it arrives into the canonical form ([`sessionbox_archive::rewrite_archive`]: relative
//! paths, the three kinds, no set-id bits, no owners) in a temporary file beside the caller's
//! `to`, renamed into place at the end. The container's file is removed either way.
//!
//! Restoring one ([`scripts::RESTORE`]): the caller's file is checked against every rule and
//! rewritten in the canonical form as it is uploaded, so the container's tar only ever reads
//! an archive this crate wrote; nothing in the container changes unless the whole archive
//! passed. The container then checks the upload's size and SHA-256, extracts it into a
//! staging directory, and only then replaces the workspace's contents (background commands
//! paused meanwhile).
//!
//! Boundary: the temporary files sit beside the workspaces, outside every workspace, in a
//! directory of mode 0700; but every command of every conversation runs as the same OS user,
//! so a concurrent process could read an archive while it exists there (it can read the
//! workspace itself anyway) or replace it. A replaced download is still checked entry by
//! entry on this side; a replaced upload is caught by the SHA-256 check, short of a
//! replacement between that check and tar's read. Trusted users only, as for the rest of the
//! runtime.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use sessionbox_archive::ArchiveSource;
use sessionbox_core::{ArchiveStats, Error, Result};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::client::CommandStatus;
use crate::scripts;

use super::session::AioSession;
use super::{run_command, unique};

/// How long the archive or restore script may run in the container, and how long one
/// transfer (download or upload) of an archive may take.
pub(crate) const ARCHIVE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Bytes handed to the upload at a time.
const UPLOAD_CHUNK: usize = 256 * 1024;

/// Chunks in flight between the network and the blocking rewrite.
const CHANNEL_DEPTH: usize = 8;

/// What a script answered: its fields after `ok`, or the code and detail of `err`.
enum Answer {
    Ok(Vec<String>),
    Err(String, String),
}

impl AioSession {
    /// `<root>/.sessionbox-archives/<key>.<unique>`, the stem of this operation's
    /// temporaries in the container.
    fn archive_stem(&self) -> String {
        format!(
            "{}/{}/{}.{}",
            self.runtime.root,
            scripts::ARCHIVES_DIR,
            self.key.as_str(),
            unique()
        )
    }

    fn commands_dir(&self) -> String {
        format!(
            "{}/{}/{}",
            self.runtime.root,
            scripts::COMMANDS_DIR,
            self.key.as_str()
        )
    }

    /// Runs an archive script under this conversation's session prefix (so destroying the
    /// conversation ends it) and parses its one-line answer.
    async fn archive_script(
        &self,
        script: &str,
        env: BTreeMap<String, String>,
        what: &str,
    ) -> Result<Answer> {
        let out = run_command(
            &self.runtime.client,
            Some(&self.key),
            script,
            "/",
            env,
            ARCHIVE_TIMEOUT,
            64 * 1024,
        )
        .await?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut f = text.lines().next().unwrap_or("").split('\t');
        match (out.status, f.next()) {
            (CommandStatus::Completed, Some("ok")) => {
                Ok(Answer::Ok(f.map(str::to_owned).collect()))
            }
            (CommandStatus::Completed, Some("err")) => Ok(Answer::Err(
                f.next().unwrap_or("").to_owned(),
                f.next().unwrap_or("").to_owned(),
            )),
            (status, _) => Err(Error::Backend(format!(
                "the {what} script did not finish ({status:?}, exit {:?}): {}",
                out.exit_code,
                String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .chars()
                    .take(300)
                    .collect::<String>()
            ))),
        }
    }

    /// After a failure: resumes the background commands and removes the temporaries.
    /// Best effort; a failure here is logged, not returned (the first error matters more).
    async fn cleanup(&self, tmp: &str, stage: Option<&str>) {
        let mut env = BTreeMap::from([
            ("SB_CMDS".to_owned(), self.commands_dir()),
            ("SB_TMP".to_owned(), tmp.to_owned()),
        ]);
        if let Some(s) = stage {
            env.insert("SB_STAGE".to_owned(), s.to_owned());
        }
        if let Err(e) = self.archive_script(scripts::CLEANUP, env, "cleanup").await {
            tracing::warn!(conversation = %self.key, error = %e, "cleaning up after an archive failed");
        }
    }

    /// [`sessionbox_core::Session::archive_workspace`] for `aio`.
    pub(super) async fn archive(&self, to: &Path, max_bytes: u64) -> Result<ArchiveStats> {
        let dir = match to.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if to.file_name().is_none() {
            return Err(Error::InvalidRequest(format!(
                "{} does not name a file to write the archive to",
                to.display()
            )));
        }
        let tmp = format!("{}.tar", self.archive_stem());
        let env = BTreeMap::from([
            ("SB_WS".to_owned(), self.ws.clone()),
            ("SB_TMP".to_owned(), tmp.clone()),
            ("SB_CMDS".to_owned(), self.commands_dir()),
        ]);
        let answer = match self.archive_script(scripts::ARCHIVE, env, "archive").await {
            Ok(a) => a,
            Err(e) => {
                self.cleanup(&tmp, None).await;
                return Err(e);
            }
        };
        let (size, sockets) = match answer {
            Answer::Ok(f) => match f.as_slice() {
                [size, sockets] => (
                    size.parse::<u64>().unwrap_or(u64::MAX),
                    sockets.parse::<u64>().unwrap_or(0),
                ),
                _ => {
                    self.cleanup(&tmp, None).await;
                    return Err(Error::Backend("the archive script answered badly".into()));
                }
            },
            Answer::Err(code, detail) => return Err(self.refused(&code, &detail, "archive")),
        };
        let limit = self.runtime.max_archive_bytes.min(max_bytes);
        let result = if size > limit {
            Err(Error::TooLarge {
                what: "the archive of the workspace".into(),
                limit,
            })
        } else {
            self.download_canonical(&tmp, &dir, to, limit).await
        };
        self.cleanup(&tmp, None).await;
        let mut stats = result?;
        stats.skipped += sockets;
        Ok(stats)
    }

    /// Streams the container's archive `tmp` through the canonical rewrite into a temporary
    /// file in `dir`, renamed to `to` once whole.
    async fn download_canonical(
        &self,
        tmp: &str,
        dir: &Path,
        to: &Path,
        limit: u64,
    ) -> Result<ArchiveStats> {
        let partial = sessionbox_core::temporary_archive(dir, "aio-archive");
        let (tx, rx) = mpsc::channel::<Bytes>(CHANNEL_DEPTH);
        let writing = partial.clone();
        let rewrite = tokio::task::spawn_blocking(move || -> Result<ArchiveStats> {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&writing)
                .map_err(|e| Error::Backend(format!("cannot create {}: {e}", writing.display())))?;
            let mut out = io::BufWriter::with_capacity(UPLOAD_CHUNK, file);
            let reader = ChannelReader {
                rx,
                current: Bytes::new(),
            };
            let stats =
                sessionbox_archive::rewrite_archive(reader, &mut out, ArchiveSource::Workspace)?;
            let file = out
                .into_inner()
                .map_err(|e| Error::Backend(format!("cannot write the archive: {e}")))?;
            file.sync_all()
                .map_err(|e| Error::Backend(format!("cannot write the archive: {e}")))?;
            Ok(stats)
        });
        let downloaded = async {
            let mut d = self
                .runtime
                .client
                .download_stream(tmp, limit, ARCHIVE_TIMEOUT, true)
                .await?;
            while let Some(chunk) = d.chunk().await? {
                // A closed channel means the rewrite stopped (the end marker, or an error it
                // reports itself).
                if tx.send(chunk).await.is_err() {
                    break;
                }
            }
            Ok::<_, crate::AioError>(())
        }
        .await;
        drop(tx);
        let rewritten = rewrite
            .await
            .map_err(|e| Error::Backend(format!("the archive rewrite failed: {e}")));
        let outcome = match (downloaded, rewritten) {
            (Err(e), _) => Err(match e {
                crate::AioError::TooLarge { limit, .. } => Error::TooLarge {
                    what: "the archive of the workspace".into(),
                    limit,
                },
                e => e.into(),
            }),
            (Ok(()), Err(e)) | (Ok(()), Ok(Err(e))) => Err(match e {
                Error::InvalidRequest(why) => Error::Backend(format!(
                    "the container's archive of the workspace cannot be used: {why}"
                )),
                e => e,
            }),
            (Ok(()), Ok(Ok(stats))) => tokio::fs::rename(&partial, to)
                .await
                .map(|()| stats)
                .map_err(|e| {
                    Error::Backend(format!("cannot move the archive to {}: {e}", to.display()))
                }),
        };
        if outcome.is_err() {
            let _ = tokio::fs::remove_file(&partial).await;
        }
        outcome
    }

    /// [`sessionbox_core::Session::restore_workspace`] for `aio`.
    pub(super) async fn restore(&self, from: &Path) -> Result<ArchiveStats> {
        let limit = self.runtime.max_archive_bytes;
        let file = std::fs::File::open(from).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => Error::NotFound(format!("archive {}", from.display())),
            _ => Error::Backend(format!("cannot open the archive {}: {e}", from.display())),
        })?;
        let meta = file
            .metadata()
            .map_err(|e| Error::Backend(format!("cannot read {}: {e}", from.display())))?;
        if !meta.is_file() {
            return Err(Error::InvalidRequest(format!(
                "{} is not a regular file",
                from.display()
            )));
        }
        if meta.len() > limit {
            return Err(Error::TooLarge {
                what: "the archive to restore".into(),
                limit,
            });
        }
        let stem = self.archive_stem();
        let tmp = format!("{stem}.tar");
        let stage = format!("{stem}.d");
        let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(CHANNEL_DEPTH);
        let check = tokio::task::spawn_blocking(move || {
            let mut out = ChannelWriter {
                tx,
                buf: Vec::with_capacity(UPLOAD_CHUNK),
                sha: Sha256::new(),
                written: 0,
                limit,
                over: false,
            };
            let result = sessionbox_archive::rewrite_archive(
                io::BufReader::new(file),
                &mut out,
                ArchiveSource::Restore,
            )
            .and_then(|stats| out.finish().map(|(sha, size)| (stats, sha, size)));
            let result = match result {
                Err(_) if out.over => Err(Error::TooLarge {
                    what: "the archive to restore (rewritten)".into(),
                    limit,
                }),
                r => r,
            };
            if result.is_err() {
                // Abort the upload: the container must not keep a partial archive.
                let _ = out
                    .tx
                    .blocking_send(Err(io::Error::other("the archive was refused")));
            }
            result
        });
        let body =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) });
        let uploaded = self
            .runtime
            .client
            .upload(&tmp, body, ARCHIVE_TIMEOUT)
            .await;
        let checked = check
            .await
            .map_err(|e| Error::Backend(format!("the archive check failed: {e}")))
            .and_then(|r| r);
        let (stats, sha, size) = match (checked, uploaded) {
            (Ok(c), Ok(n)) if n == c.2 => c,
            outcome => {
                self.cleanup(&tmp, None).await;
                return Err(match outcome {
                    (Ok(c), Ok(n)) => Error::Backend(format!(
                        "the AIO server stored {n} bytes of the {} sent",
                        c.2
                    )),
                    // A refused archive is the answer, whatever became of the upload it
                    // stopped.
                    (Err(e @ (Error::InvalidRequest(_) | Error::TooLarge { .. })), _) => e,
                    // Otherwise a failed upload explains a failed write.
                    (_, Err(e)) => e.into(),
                    (Err(e), Ok(_)) => e,
                });
            }
        };
        let env = BTreeMap::from([
            ("SB_WS".to_owned(), self.ws.clone()),
            ("SB_TMP".to_owned(), tmp.clone()),
            ("SB_SIZE".to_owned(), size.to_string()),
            ("SB_SHA256".to_owned(), sha),
            ("SB_STAGE".to_owned(), stage.clone()),
            ("SB_CMDS".to_owned(), self.commands_dir()),
        ]);
        match self.archive_script(scripts::RESTORE, env, "restore").await {
            Ok(Answer::Ok(_)) => Ok(stats),
            Ok(Answer::Err(code, detail)) => Err(self.refused(&code, &detail, "restore")),
            Err(e) => {
                self.cleanup(&tmp, Some(&stage)).await;
                Err(e)
            }
        }
    }

    /// The error for a script's refusal.
    fn refused(&self, code: &str, detail: &str, what: &str) -> Error {
        match code {
            "not_found" => Error::NotFound(detail.to_owned()),
            "busy" => Error::Conflict(format!(
                "background command {detail} is running and its process group is not recorded \
                 yet, so it cannot be paused for the {what}; wait for it to start or end, or \
                 kill it"
            )),
            "changed" if what == "archive" => Error::Conflict(format!(
                "a file of the workspace changed while it was archived (a process other than \
                 the conversation's background commands writes to it); try again: {detail}"
            )),
            "changed" => Error::Conflict(format!(
                "the uploaded archive changed in the container before it was extracted \
                 (another process replaced it); the workspace is unchanged, try again: {detail}"
            )),
            "tar" if what == "restore" => Error::Backend(format!(
                "GNU tar in the container could not extract the archive; the workspace is \
                 unchanged: {detail}"
            )),
            _ => Error::Backend(format!("the {what} failed in the container: {detail}")),
        }
    }
}

/// A blocking reader of the chunks a download sends; the end when the sender is gone.
struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.current = b,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// A blocking writer into an upload, hashing what it sends and refusing more than `limit`.
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
    sha: Sha256,
    written: u64,
    limit: u64,
    over: bool,
}

impl ChannelWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(UPLOAD_CHUNK),
        ));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the upload stopped"))
    }

    /// Sends what is left; the SHA-256 (hex) and size of everything sent.
    fn finish(&mut self) -> Result<(String, u64)> {
        self.send()
            .map_err(|e| Error::Backend(format!("cannot upload the archive: {e}")))?;
        let sha = std::mem::take(&mut self.sha).finalize();
        Ok((
            sha.iter().map(|b| format!("{b:02x}")).collect(),
            self.written,
        ))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.written + data.len() as u64 > self.limit {
            self.over = true;
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                "the archive is larger than the limit",
            ));
        }
        self.sha.update(data);
        self.written += data.len() as u64;
        self.buf.extend_from_slice(data);
        if self.buf.len() >= UPLOAD_CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_writer_hashes_what_it_sends_and_stops_at_its_limit() {
        let (tx, mut rx) = mpsc::channel(64);
        let mut w = ChannelWriter {
            tx,
            buf: Vec::new(),
            sha: Sha256::new(),
            written: 0,
            limit: 10,
            over: false,
        };
        w.write_all(b"abc").unwrap();
        let (sha, n) = w.finish().unwrap();
        assert_eq!(n, 3);
        assert_eq!(
            sha,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(rx.try_recv().unwrap().unwrap(), Bytes::from_static(b"abc"));
        assert!(w.write_all(&[0; 8]).is_err());
        assert!(w.over);
    }

    #[test]
    fn the_channel_reader_reads_chunks_across_boundaries() {
        let (tx, rx) = mpsc::channel(4);
        tx.try_send(Bytes::from_static(b"hel")).unwrap();
        tx.try_send(Bytes::from_static(b"lo")).unwrap();
        drop(tx);
        let mut r = ChannelReader {
            rx,
            current: Bytes::new(),
        };
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
    }
}
