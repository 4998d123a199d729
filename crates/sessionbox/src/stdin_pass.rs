//! `exec --stdin` in the foreground: this process's stdin passed on to the command as it is
//! read, so a command reading it sees each piece before the producer has finished (a pipe, or
//! lines typed at a terminal).
//!
//! The command runs as a background command with its stdin kept open
//! ([`sessionbox_core::ExecRequest::keep_stdin_open`]): stdin is read in pieces on a thread of
//! its own and written to the command's stdin as each arrives (end of input closes it), while
//! its output is followed and written byte for byte, each stream to its own, until it ends; the
//! exit code is the command's (124 after its timeout, 128+N for signal N). Ctrl-C kills it.
//! Memory stays bounded: at most [`QUEUED`] pieces of [`PIECE`] bytes wait between reading and
//! writing, and a command that does not read makes the reading wait (back-pressure), never
//! the queue grow. On `host` and `aio`, which cannot keep a stdin open, stdin is read whole
//! first, before anything is created (at most 1 MiB); should a runtime refuse all the same,
//! [`exec`] answers `None` and the caller does that then.

use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use sessionbox_core::{Error, ExecRequest, OutputRequest, Session};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// Bytes read from stdin at once.
const PIECE: usize = 64 * 1024;
/// Pieces read ahead of the command.
const QUEUED: usize = 4;

/// Runs `request` with stdin passed through; `None` when the runtime cannot keep a stdin open
/// (nothing was started, nothing read).
pub(crate) async fn exec(
    s: &sessionbox_manager::Conversation,
    request: &ExecRequest,
) -> anyhow::Result<Option<ExitCode>> {
    let started = s.spawn(request.clone().keep_stdin_open()).await;
    let command = match started {
        Ok(c) => c,
        Err(Error::RuntimeUnavailable { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let id = command.id;
    let (tx, mut rx) = mpsc::channel::<std::io::Result<Vec<u8>>>(QUEUED);
    std::thread::spawn(move || {
        let mut input = std::io::stdin().lock();
        let mut buf = vec![0u8; PIECE];
        loop {
            let piece = match input.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => Ok(buf[..n].to_vec()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
            let failed = piece.is_err();
            if tx.blocking_send(piece).is_err() || failed {
                break;
            }
        }
    });
    let feed = async {
        while let Some(piece) = rx.recv().await {
            let piece = piece.context("cannot read stdin")?;
            let mut at = 0;
            while at < piece.len() {
                match s.write_stdin(&id, &piece[at..]).await {
                    // The command does not read yet: keep offering the rest.
                    Ok(w) => at += usize::try_from(w.written).unwrap_or(piece.len()),
                    // It ended or stopped reading: the rest of stdin has nowhere to go.
                    Err(Error::Conflict(_)) => return Ok(()),
                    Err(e) => return Err(anyhow::Error::from(e)),
                }
            }
        }
        match s.close_stdin(&id).await {
            Ok(()) | Err(Error::Conflict(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    };
    let follow = async {
        let mut read = OutputRequest::from_start();
        read.wait = Duration::from_secs(20);
        // Written without blocking the runtime's thread, so that a reader of this output who
        // is slow never stops stdin from being fed meanwhile.
        let (mut so, mut se) = (tokio::io::stdout(), tokio::io::stderr());
        loop {
            let o = s.command_output(&id, read).await?;
            so.write_all(&o.stdout).await?;
            so.flush().await?;
            se.write_all(&o.stderr).await?;
            read.stdout_from = o.stdout_next();
            read.stderr_from = o.stderr_next();
            if o.complete() {
                return Ok::<_, anyhow::Error>(o.command);
            }
        }
    };
    let followed = async {
        // Stdin failing (a read error, the runtime refusing a write) ends the feeding, not
        // the command: its output is still followed to its end.
        let (fed, ended) = tokio::join!(feed, follow);
        if let Err(e) = fed {
            sessionbox::warn!("stdin was not passed on in full: {e:#}");
        }
        ended
    };
    let ended = tokio::select! {
        r = followed => r?,
        _ = tokio::signal::ctrl_c() => {
            let _ = s.kill_command(&id).await;
            return Ok(Some(ExitCode::from(130)));
        }
    };
    for (cut, name) in [
        (ended.stdout_truncated, "stdout"),
        (ended.stderr_truncated, "stderr"),
    ] {
        if cut {
            sessionbox::warn!(
                "the command's {name} was cut at {} bytes (--output-limit) and the rest \
                 discarded; for more, write it to a file in the workspace and `sessionbox read` it",
                request.output_limit
            );
        }
    }
    if ended.timed_out {
        sessionbox::warn!("the command timed out and was killed");
    }
    let code = ended.shell_exit_code().unwrap_or(1);
    Ok(Some(ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1))))
}

/// All of stdin, for a runtime that cannot keep one open: at most
/// [`sessionbox_core::MAX_STDIN_BYTES`] (one byte more, for the request's check to refuse
/// naming the limit).
pub(crate) fn read_all() -> anyhow::Result<Vec<u8>> {
    let max = sessionbox_core::MAX_STDIN_BYTES as u64 + 1;
    let mut buf = Vec::new();
    std::io::stdin()
        .lock()
        .take(max)
        .read_to_end(&mut buf)
        .context("cannot read stdin")?;
    Ok(buf)
}
