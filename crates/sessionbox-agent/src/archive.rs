//! `GET` and `PUT /sessionbox/v1/archive`: the workspace as one tar (see
//! [`sessionbox_execd::archive_ext`]). The archive rules are `sessionbox-fs`'s
//! ([`sessionbox_fs::Workspace::archive`], [`sessionbox_fs::Workspace::restore`]); this module
//! streams them over HTTP and pauses the background commands while an archive is taken.
//!
//! A restore's body is spooled to [`sessionbox_fs::Workspace::spool_file`]: an unnamed file on
//! the workspace's own file system (no name, so nothing in the workspace sees it, freed when
//! closed), because the sandbox's `/tmp` is a small memory-backed tmpfs. Its bytes count
//! against the disk quota while the restore runs.

use std::io::Write;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use rustix::process::{Pid, Signal};
use sessionbox_core::Error;
use sessionbox_execd::archive_ext::ARCHIVE_CONTENT_TYPE;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::commands::Registry;
use crate::fs_ext::typed_error;
use crate::server::AppState;

/// Size of each piece of the archive sent.
const CHUNK: usize = 256 * 1024;
/// Pieces written ahead of the client at most (memory held: `CHUNK` times this).
const AHEAD: usize = 4;

/// The running background commands' process groups, stopped (`SIGSTOP`) from creation until
/// drop, when they get `SIGCONT`: whatever ends the archive (done, failed, client gone).
pub(crate) struct Paused(Vec<Pid>);

impl Paused {
    pub(crate) fn background(commands: &Registry) -> Paused {
        let mut groups = Vec::new();
        for c in commands.background_commands() {
            let g = c.group.load(std::sync::atomic::Ordering::SeqCst);
            if let Some(pid) = Pid::from_raw(g).filter(|_| c.lock().running)
                && rustix::process::kill_process_group(pid, Signal::STOP).is_ok()
            {
                groups.push(pid);
            }
        }
        Paused(groups)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        for g in &self.0 {
            let _ = rustix::process::kill_process_group(*g, Signal::CONT);
        }
    }
}

/// Writes pieces of the archive into the response body's channel, from a blocking task.
struct ChannelWriter {
    tx: mpsc::Sender<std::io::Result<Bytes>>,
    buf: Vec<u8>,
    state: Arc<AppState>,
}

impl ChannelWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.state.activity.touch();
        self.tx.blocking_send(Ok(piece)).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
        })
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// `GET /sessionbox/v1/archive`.
pub(crate) async fn take(State(state): State<Arc<AppState>>) -> Response {
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(AHEAD);
    let paused = Paused::background(&state.commands);
    let writer = ChannelWriter {
        tx: tx.clone(),
        buf: Vec::with_capacity(CHUNK),
        state: state.clone(),
    };
    let ws = state.ws.clone();
    tokio::task::spawn_blocking(move || {
        let _paused = paused;
        if let Err(e) = ws.archive(writer) {
            tracing::warn!(error = %e, "taking the workspace archive failed");
            // Cuts the body short: the client sees a broken transfer.
            let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|piece| (piece, rx))
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, ARCHIVE_CONTENT_TYPE)],
        Body::from_stream(body),
    )
        .into_response()
}

fn too_large(limit: u64) -> Error {
    Error::TooLarge {
        what: "the archive".into(),
        limit,
    }
}

/// `PUT /sessionbox/v1/archive`.
pub(crate) async fn restore(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let limit = state.config.max_archive_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return typed_error(&too_large(limit));
    }
    let ws = state.ws.clone();
    let spool = match tokio::task::spawn_blocking(move || ws.spool_file()).await {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => return typed_error(&e),
        Err(e) => return typed_error(&Error::Backend(format!("spooling failed: {e}"))),
    };
    let mut file = tokio::fs::File::from_std(spool);
    let mut body = req.into_body().into_data_stream();
    let mut got: u64 = 0;
    // A spooling failure (the workspace full) is answered once the body is read whole: a
    // client still sending would see the early answer as a broken pipe, not the typed error.
    let mut failed: Option<Error> = None;
    while let Some(piece) = body.next().await {
        let piece = match piece {
            Ok(p) => p,
            Err(e) => {
                return typed_error(&Error::InvalidRequest(format!(
                    "could not read the archive: {e}"
                )));
            }
        };
        got += piece.len() as u64;
        if got > limit {
            return typed_error(&too_large(limit));
        }
        if failed.is_none()
            && let Err(e) = file.write_all(&piece).await
        {
            failed = Some(spool_error(&e));
        }
        state.activity.touch();
    }
    if let Some(e) = failed {
        return typed_error(&e);
    }
    if let Err(e) = file.flush().await {
        return typed_error(&spool_error(&e));
    }
    let mut file = file.into_std().await;
    let ws = state.ws.clone();
    match tokio::task::spawn_blocking(move || ws.restore(&mut file)).await {
        Ok(Ok(stats)) => axum::Json(stats).into_response(),
        Ok(Err(e)) => typed_error(&e),
        Err(e) => typed_error(&Error::Backend(format!("the restore failed: {e}"))),
    }
}

fn spool_error(e: &std::io::Error) -> Error {
    use rustix::io::Errno;
    let full = e
        .raw_os_error()
        .is_some_and(|n| n == Errno::NOSPC.raw_os_error() || n == Errno::DQUOT.raw_os_error());
    if full {
        Error::TooLarge {
            what: "the archive, received into the workspace's disk quota before it is \
                   restored (no space left); delete files to make room"
                .into(),
            limit: u64::MAX,
        }
    } else {
        Error::Backend(format!("cannot spool the archive: {e}"))
    }
}
