//! [`LiveStdin`]: a running command's stdin kept open for writes from outside ([`crate::run_live`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sessionbox_core::{Error, Result, StdinWrite};
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::time::{Instant, timeout_at};

/// The write end of a command's stdin, shared by whoever may write to it. Cloning shares it.
///
/// Until [`crate::run_live`] has started the command it is not open; after the command ends,
/// or after [`LiveStdin::close`], writes are refused with [`Error::Conflict`].
#[derive(Debug, Clone, Default)]
pub struct LiveStdin {
    state: Arc<Mutex<Pipe>>,
    /// One write at a time, in order.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Wakes a write waiting for the command to start.
    started: Arc<tokio::sync::Notify>,
}

#[derive(Debug, Default)]
enum Pipe {
    #[default]
    Starting,
    /// Open; `None` while a write has it.
    Open(Option<ChildStdin>),
    Closed,
    /// The command ended, or stopped reading (the pipe broke).
    Ended,
}

impl LiveStdin {
    /// A stdin not open yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pipe> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called by the runner once the command runs.
    pub(crate) fn open(&self, pipe: ChildStdin) {
        let mut st = self.lock();
        if matches!(*st, Pipe::Starting) {
            *st = Pipe::Open(Some(pipe));
        }
        drop(st);
        self.started.notify_waiters();
    }

    /// Called by the runner when the command has ended: later writes are refused.
    pub(crate) fn ended(&self) {
        let mut st = self.lock();
        if !matches!(*st, Pipe::Closed) {
            *st = Pipe::Ended;
        }
        drop(st);
        self.started.notify_waiters();
    }

    /// True while writes are taken (open, or not started yet).
    pub fn is_open(&self) -> bool {
        matches!(*self.lock(), Pipe::Starting | Pipe::Open(_))
    }

    /// Writes `data`, as much as the command reads within `wait` (after waiting for any write
    /// before it), from the start and in order.
    ///
    /// # Errors
    /// [`Error::Conflict`] when the stdin is closed, the command has ended or stopped reading
    /// (the message says how many bytes went in first), or has not started.
    pub async fn write(&self, data: &[u8], wait: Duration) -> Result<StdinWrite> {
        let deadline = Instant::now() + wait;
        let Ok(_turn) = timeout_at(deadline, self.turn.lock()).await else {
            return Ok(StdinWrite {
                written: 0,
                timed_out: true,
            });
        };
        // A write right after the start may come before the command runs: wait for it.
        loop {
            let started = self.started.notified();
            tokio::pin!(started);
            started.as_mut().enable();
            if !matches!(*self.lock(), Pipe::Starting) {
                break;
            }
            if timeout_at(deadline, started).await.is_err() {
                break;
            }
        }
        let mut pipe = {
            let mut st = self.lock();
            match &mut *st {
                Pipe::Open(p) => p
                    .take()
                    .ok_or_else(|| Error::Backend("two writes to one stdin at once".into()))?,
                Pipe::Starting => {
                    return Err(Error::Conflict("the command has not started yet".into()));
                }
                Pipe::Closed => return Err(Error::Conflict("its stdin is closed".into())),
                Pipe::Ended => {
                    return Err(Error::Conflict(
                        "the command has ended; its stdin is closed".into(),
                    ));
                }
            }
        };
        let mut written = 0usize;
        let mut outcome = Ok(false);
        while written < data.len() {
            match timeout_at(deadline, pipe.write(&data[written..])).await {
                Err(_) => {
                    outcome = Ok(true);
                    break;
                }
                Ok(Ok(0)) => break,
                Ok(Ok(n)) => written += n,
                Ok(Err(e)) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        if outcome.is_ok() {
            // Written bytes reach the command now, not when the pipe is closed.
            let _ = timeout_at(deadline, pipe.flush()).await;
        }
        let mut st = self.lock();
        match outcome {
            Ok(timed_out) => {
                if let Pipe::Open(slot) = &mut *st {
                    *slot = Some(pipe);
                }
                Ok(StdinWrite {
                    written: written as u64,
                    timed_out,
                })
            }
            Err(e) => {
                *st = Pipe::Ended;
                Err(Error::Conflict(format!(
                    "the command stopped reading its stdin ({e}) after {written} bytes of this \
                     write"
                )))
            }
        }
    }

    /// Closes it: the command reads end of file. Closing what is closed, or a stdin of a
    /// command that has ended, does nothing. Waits for a write in progress first.
    pub async fn close(&self) {
        let _turn = self.turn.lock().await;
        let mut st = self.lock();
        if matches!(*st, Pipe::Open(_) | Pipe::Starting) {
            *st = Pipe::Closed;
        }
    }
}

/// Marks a live stdin ended when the run ends, however it ends.
pub(crate) struct EndGuard(pub(crate) Option<LiveStdin>);

impl Drop for EndGuard {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            s.ended();
        }
    }
}
