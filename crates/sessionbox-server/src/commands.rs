//! Background commands: `POST .../exec` with `"background": true`, and `.../commands`.
//!
//! **Design:** a background command is owned where it runs, never by this server: the
//! conversation's runtime starts it ([`Session::spawn`]: the sandbox's agent for `isolated` and
//! `opensandbox`, a detached supervisor for `host`) and answers for it (list, status, output
//! from byte offsets, kill). So a command outlives the server process that started it: a
//! restarted server (or another replica) lists it, reads it and kills it. The runtime also
//! enforces the limit on *running* commands (a finished command frees its slot) and keeps
//! finished ones bounded. Destroying a conversation kills its commands with it (the runtime's
//! destroy), without waiting for each.
//!
//! What this server keeps is only what the `background_commands_running` gauge and the output
//! budget need: the commands it knows to run (those it started, and those a list or status
//! showed running since it started), each watched by a task that long-polls the runtime until
//! the command ends, and, for those it started, the output bytes reserved for them
//! ([`crate::budget`]), given back when the command is seen to end, is killed, or its
//! conversation is destroyed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sessionbox_core::{
    BackgroundCommand, CommandOutput, ConversationKey, ConversationRef, Error, Operation,
    OutputRequest, Session,
};

use crate::AppState;
use crate::budget::Reservation;
use crate::output::{OutputText, incomplete_tail};
use crate::views::{ErrorBody, ExitStatusView};

/// How long one poll of a watcher waits for the command's end.
const WATCH_WAIT: Duration = Duration::from_secs(25);
/// Pause after a watcher's poll that returned because of new output (not the end), so that a
/// chatty command costs at most one poll a second.
const WATCH_PAUSE: Duration = Duration::from_secs(1);

/// Running commands of one conversation by id, with the output reserved for those this server
/// started.
type Running = HashMap<String, Option<Reservation>>;

/// The background commands this server knows to run, by conversation (for the gauge and the
/// output budget).
#[derive(Default)]
pub(crate) struct Commands {
    running: Mutex<HashMap<ConversationKey, Running>>,
}

impl Commands {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ConversationKey, Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Background commands running now, as far as this server knows.
    pub(crate) fn running(&self) -> usize {
        self.lock().values().map(HashMap::len).sum()
    }

    /// Records what a runtime answered about commands of `conv`: a running one not watched yet
    /// gets a watcher; an ended one is forgotten.
    pub(crate) fn observe(
        &self,
        state: &AppState,
        conv: &ConversationRef,
        seen: &[BackgroundCommand],
    ) {
        self.observe_reserved(state, conv, seen, None);
    }

    /// As [`Commands::observe`]; `reservation` (for the first of `seen`, which this server has
    /// just started) is kept while that command runs, and dropped at once when it has ended.
    fn observe_reserved(
        &self,
        state: &AppState,
        conv: &ConversationRef,
        seen: &[BackgroundCommand],
        mut reservation: Option<Reservation>,
    ) {
        for c in seen {
            let reserved = reservation.take();
            if c.running {
                let new = {
                    let mut map = self.lock();
                    let commands = map.entry(conv.key.clone()).or_default();
                    match commands.get_mut(&c.id) {
                        Some(slot) => {
                            if slot.is_none() {
                                *slot = reserved;
                            }
                            false
                        }
                        None => {
                            commands.insert(c.id.clone(), reserved);
                            true
                        }
                    }
                };
                if new {
                    tokio::spawn(watch(state.clone(), conv.clone(), c.id.clone()));
                }
            } else {
                self.ended(&conv.key, &c.id);
            }
        }
    }

    /// Forgets command `id` of `key`, giving its reserved output back.
    fn ended(&self, key: &ConversationKey, id: &str) {
        let reservation = {
            let mut map = self.lock();
            let Some(commands) = map.get_mut(key) else {
                return;
            };
            let reservation = commands.remove(id);
            if commands.is_empty() {
                map.remove(key);
            }
            reservation
        };
        // Released outside this lock (the budget has its own).
        drop(reservation);
    }

    /// Forgets every command of `key` (the conversation is being destroyed: the runtime kills
    /// them; their watchers end on their next poll), giving their reserved output back.
    pub(crate) fn end_conversation(&self, key: &ConversationKey) {
        let gone = self.lock().remove(key);
        drop(gone);
    }

    fn watched(&self, key: &ConversationKey, id: &str) -> bool {
        self.lock().get(key).is_some_and(|s| s.contains_key(id))
    }
}

/// Follows command `id` of `conv` until it ends (or the conversation goes), then forgets it.
/// Opens a session of its own (without creating the conversation) and holds no turn while it
/// waits.
async fn watch(state: AppState, conv: ConversationRef, id: String) {
    let opened = match state.open(&conv, Operation::CommandOutput).await {
        Ok(opened) => opened.detach().await,
        Err(error) => {
            tracing::debug!(%error, "cannot watch a background command");
            state.commands.ended(&conv.key, &id);
            return;
        }
    };
    let mut failures = 0;
    let (mut out, mut err) = (0, 0);
    while state.commands.watched(&conv.key, &id) {
        let read = OutputRequest {
            stdout_from: out,
            stderr_from: err,
            max_bytes: 0,
            wait: WATCH_WAIT,
        };
        match opened.command_output(&id, read).await {
            Ok(o) if !o.command.running => break,
            Ok(o) => {
                failures = 0;
                (out, err) = (o.command.stdout_bytes, o.command.stderr_bytes);
                tokio::time::sleep(WATCH_PAUSE).await;
            }
            Err(Error::NotFound(_)) => break,
            Err(e) => {
                failures += 1;
                if failures >= 3 {
                    tracing::debug!(error = %e, "stopped watching a background command");
                    break;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
    state.commands.ended(&conv.key, &id);
    if let Err(e) = Box::new(opened).close().await {
        tracing::debug!(error = %e, "closing a watcher's session failed");
    }
}

fn from_millis(ms: u64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(i64::MAX)).unwrap_or_default()
}

/// A background command as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = BackgroundCommand)]
pub(crate) struct CommandView {
    /// The command's id, for `.../commands/{cmd}`.
    id: String,
    /// The command line it runs.
    command: String,
    /// True until the command has ended.
    running: bool,
    /// As a shell reports it (the code, 128 + signal, 124 after a timeout); `null` while it
    /// runs or when it could not run.
    exit_code: Option<i32>,
    /// How it ended; `null` while it runs or when it could not run. A killed command reports
    /// the signal that ended it.
    status: Option<ExitStatusView>,
    /// True when its timeout ended it.
    timed_out: bool,
    /// True when it was killed through the API (or its conversation destroyed).
    killed: bool,
    /// Bytes of stdout kept so far (at most the output limit).
    stdout_bytes: u64,
    /// Bytes of stderr kept so far (at most the output limit).
    stderr_bytes: u64,
    /// True when stdout went past the output limit and the rest was discarded.
    stdout_truncated: bool,
    /// True when stderr went past the output limit and the rest was discarded.
    stderr_truncated: bool,
    /// When it started.
    started_at: DateTime<Utc>,
    /// When it ended; `null` while it runs.
    finished_at: Option<DateTime<Utc>>,
    /// Milliseconds from start to end (or to now, while it runs).
    duration_ms: u64,
    /// Why it could not run, when it could not: `{"code", "message"}`.
    #[schema(value_type = Option<ErrorBody>)]
    error: Option<serde_json::Value>,
}

impl From<&BackgroundCommand> for CommandView {
    fn from(c: &BackgroundCommand) -> Self {
        let now = u64::try_from(Utc::now().timestamp_millis()).unwrap_or(0);
        CommandView {
            id: c.id.clone(),
            command: c.command.clone(),
            running: c.running,
            exit_code: c.shell_exit_code(),
            status: c.status.map(ExitStatusView::from),
            timed_out: c.timed_out,
            killed: c.killed,
            stdout_bytes: c.stdout_bytes,
            stderr_bytes: c.stderr_bytes,
            stdout_truncated: c.stdout_truncated,
            stderr_truncated: c.stderr_truncated,
            started_at: from_millis(c.started_at_ms),
            finished_at: c.finished_at_ms.map(from_millis),
            duration_ms: c.duration_ms(now),
            error: c
                .error
                .as_ref()
                .map(|m| serde_json::json!({"code": "backend_error", "message": m})),
        }
    }
}

/// A conversation's background commands.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = BackgroundCommandList)]
pub(crate) struct CommandListView {
    /// Running commands and the most recent finished ones, oldest first.
    commands: Vec<CommandView>,
}

impl CommandListView {
    pub(crate) fn of(all: &[BackgroundCommand]) -> Self {
        CommandListView {
            commands: all.iter().map(CommandView::from).collect(),
        }
    }
}

/// Output of a background command from the requested offsets on.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct CommandLogsView {
    /// stdout from `stdout_offset` on.
    stdout: OutputText,
    /// stderr from `stderr_offset` on.
    stderr: OutputText,
    /// Pass as `stdout_offset` next time (bytes).
    stdout_next_offset: u64,
    /// Pass as `stderr_offset` next time (bytes).
    stderr_next_offset: u64,
    /// True until the command has ended: more output may come.
    running: bool,
    /// True when stdout went past the output limit and the rest was discarded.
    stdout_truncated: bool,
    /// True when stderr went past the output limit and the rest was discarded.
    stderr_truncated: bool,
    /// The command's exit code once it has ended (as in `BackgroundCommand`).
    exit_code: Option<i32>,
}

impl CommandLogsView {
    /// The view of `o`. While the command runs, a character not complete yet at the end of a
    /// stream is held back (it comes next time); the next offsets say so. When such a piece
    /// is all there is, it is sent as it is (with its exact bytes in `base64`), so that a
    /// client polling for new output never gets the same empty answer again and again.
    pub(crate) fn of(o: &CommandOutput) -> Self {
        let running = o.command.running;
        let part = |bytes: &[u8], offset: u64| {
            let mut part = bytes;
            let whole = part.len() - incomplete_tail(part);
            if running && whole > 0 {
                part = &part[..whole];
            }
            (OutputText::of(part), offset + part.len() as u64)
        };
        let (stdout, stdout_next_offset) = part(&o.stdout, o.stdout_offset);
        let (stderr, stderr_next_offset) = part(&o.stderr, o.stderr_offset);
        CommandLogsView {
            stdout,
            stderr,
            stdout_next_offset,
            stderr_next_offset,
            running,
            stdout_truncated: o.command.stdout_truncated,
            stderr_truncated: o.command.stderr_truncated,
            exit_code: o.command.shell_exit_code(),
        }
    }
}

/// Starts watching a command this server has just started, keeping `reservation` (its output
/// budget) until it ends.
pub(crate) fn started(
    state: &AppState,
    conv: &ConversationRef,
    cmd: &BackgroundCommand,
    reservation: Reservation,
) {
    state
        .commands
        .observe_reserved(state, conv, std::slice::from_ref(cmd), Some(reservation));
}

/// Most requests that wait on background command output at once (SSE follows and JSON long
/// polls) in one conversation; one more is refused (429 `busy`).
pub const MAX_WAITERS_PER_CONVERSATION: usize = 8;
/// Most such waiting requests at once in the whole server.
pub const MAX_WAITERS: usize = 256;

/// Counts the requests that wait on background command output, per conversation and in
/// total, so that followers (which hold no conversation turn) cannot pile up without bound.
#[derive(Default)]
pub(crate) struct Waiters {
    counts: Mutex<(HashMap<ConversationKey, usize>, usize)>,
}

/// One admitted waiting request; dropping it gives its place back.
pub(crate) struct WaiterGuard {
    waiters: std::sync::Arc<Waiters>,
    key: ConversationKey,
}

impl Waiters {
    /// Admits one more waiting request of `key`.
    ///
    /// # Errors
    /// [`Error::Busy`] naming the limit that is reached.
    pub(crate) fn enter(
        self: &std::sync::Arc<Self>,
        key: &ConversationKey,
    ) -> Result<WaiterGuard, Error> {
        let mut g = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let (per, total) = &mut *g;
        if *total >= MAX_WAITERS {
            return Err(Error::Busy(format!(
                "{MAX_WAITERS} requests already wait on command output in this server; try \
                 again later"
            )));
        }
        let n = per.entry(key.clone()).or_default();
        if *n >= MAX_WAITERS_PER_CONVERSATION {
            return Err(Error::Busy(format!(
                "{MAX_WAITERS_PER_CONVERSATION} requests already follow or wait on command \
                 output in this conversation; close one first"
            )));
        }
        *n += 1;
        *total += 1;
        Ok(WaiterGuard {
            waiters: self.clone(),
            key: key.clone(),
        })
    }
}

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        let mut g = self
            .waiters
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (per, total) = &mut *g;
        *total = total.saturating_sub(1);
        if let Some(n) = per.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use sessionbox_core::{BackgroundCommand, CommandOutput};

    use super::CommandLogsView;

    fn running(stdout: &[u8]) -> CommandOutput {
        CommandOutput {
            command: BackgroundCommand::started("c", "x", 0),
            stdout_offset: 5,
            stdout: stdout.to_vec(),
            stderr_offset: 0,
            stderr: Vec::new(),
        }
    }

    #[test]
    fn an_unfinished_character_waits_unless_it_is_all_there_is() {
        // After text, the first byte of the euro sign waits for the rest.
        let v = CommandLogsView::of(&running(b"ab\xe2\x82"));
        assert_eq!((v.stdout.text.as_str(), v.stdout_next_offset), ("ab", 7));
        // Alone, it is sent as it is (exact in base64), and the offset moves on: a poller
        // never gets the same empty answer forever.
        let v = CommandLogsView::of(&running(b"\xe2\x82"));
        assert_eq!(v.stdout_next_offset, 7);
        assert_eq!(v.stdout.base64.as_deref(), Some("4oI="));
    }
}
