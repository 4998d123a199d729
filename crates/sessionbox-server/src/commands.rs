//! Background commands: `POST .../exec` with `"background": true`.
//!
//! A background command is a server task that runs [`Session::exec_stream`] on its own session
//! of the conversation, outside the conversation's FIFO (it took its turn only to open the
//! conversation), and keeps what the command writes in two buffers bounded by the request's
//! output limit (the runtime discards the rest, and the buffers say so). The same code serves
//! every runtime: on `host` the command is a process group on this machine, on `isolated` a
//! command of the sandbox's agent on the event stream of one request.
//!
//! Killing a command drops its exec future: the runtime then kills the command's process group
//! (`host`: `SIGKILL` to the group; `isolated`: the agent kills it when the request is
//! interrupted or its connection closes). Destroying the conversation kills its commands first
//! and forgets them. Commands live as long as this server process: a restarted server knows
//! none of them (and the runtime killed them when their exec futures were dropped).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sessionbox_core::{
    ConversationKey, Error, ExecRequest, ExecResult, ExitStatus, OutputStream, Session,
};
use sessionbox_manager::Conversation;
use tokio::sync::{Notify, watch};

use crate::openapi::ExitStatusDoc;
use crate::output::{OutputText, incomplete_tail};

/// Most background commands running at once in one conversation; one more is refused (429).
pub const MAX_RUNNING_PER_CONVERSATION: usize = 16;
/// Most background commands remembered per conversation (running or finished); past it the
/// oldest finished one is forgotten.
pub const MAX_KEPT_PER_CONVERSATION: usize = 64;
/// How long a kill or a destroy waits for a command's task to end.
const END_WAIT: Duration = Duration::from_secs(10);

/// Every background command of this server, by conversation.
pub(crate) struct Commands {
    map: Mutex<HashMap<ConversationKey, Vec<Arc<Command>>>>,
    next: AtomicU64,
    /// Makes ids of one server run differ from another's.
    epoch: u64,
}

impl Default for Commands {
    fn default() -> Self {
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Commands {
            map: Mutex::default(),
            next: AtomicU64::new(1),
            epoch,
        }
    }
}

/// One background command.
pub(crate) struct Command {
    id: String,
    started_at: DateTime<Utc>,
    started: Instant,
    limit: usize,
    state: Mutex<State>,
    kill: Notify,
    done: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    finished_at: Option<DateTime<Utc>>,
    duration: Option<Duration>,
    result: Option<ExecResult>,
    killed: bool,
    error: Option<(&'static str, String)>,
}

/// A background command as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct CommandView {
    /// The command's id, for `.../commands/{cmd}`.
    id: String,
    /// True until the command has ended.
    running: bool,
    /// As a shell reports it (the code, 128 + signal, 124 after a timeout); `null` while it
    /// runs, when it was killed, or when it could not run.
    exit_code: Option<i32>,
    /// How it ended; `null` while it runs or when it was killed or could not run.
    #[schema(value_type = Option<ExitStatusDoc>)]
    status: Option<ExitStatus>,
    /// True when its timeout ended it.
    timed_out: bool,
    /// True when it was killed through the API (or its conversation destroyed).
    killed: bool,
    /// Bytes of stdout kept so far (at most the output limit).
    stdout_bytes: usize,
    /// Bytes of stderr kept so far (at most the output limit).
    stderr_bytes: usize,
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
    #[schema(value_type = Option<crate::openapi::ErrorBody>)]
    error: Option<serde_json::Value>,
}

/// Output of a background command from the requested offsets on.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct CommandLogsView {
    /// stdout from `stdout_offset` on.
    stdout: OutputText,
    /// stderr from `stderr_offset` on.
    stderr: OutputText,
    /// Pass as `stdout_offset` next time (bytes).
    stdout_next_offset: usize,
    /// Pass as `stderr_offset` next time (bytes).
    stderr_next_offset: usize,
    /// True until the command has ended: more output may come.
    running: bool,
    /// True when stdout went past the output limit and the rest was discarded.
    stdout_truncated: bool,
    /// True when stderr went past the output limit and the rest was discarded.
    stderr_truncated: bool,
}

impl Command {
    fn append(&self, stream: OutputStream, bytes: &[u8]) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let buf = match stream {
            OutputStream::Stdout => &mut st.stdout,
            OutputStream::Stderr => &mut st.stderr,
        };
        // The runtime passes at most the limit; this keeps the bound whatever it does.
        let room = self.limit.saturating_sub(buf.len());
        buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn finish(&self, outcome: Option<Result<ExecResult, Error>>) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.finished_at = Some(Utc::now());
        st.duration = Some(self.started.elapsed());
        match outcome {
            Some(Ok(r)) => {
                // The result is the authority on what was kept.
                st.stdout = r.stdout.clone();
                st.stderr = r.stderr.clone();
                st.result = Some(r);
            }
            Some(Err(e)) => st.error = Some((e.code(), e.to_string())),
            None => st.killed = true,
        }
        drop(st);
        let _ = self.done.send(true);
    }

    fn running(&self) -> bool {
        !*self.done.borrow()
    }

    /// Its status now.
    pub fn view(&self) -> CommandView {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let r = st.result.as_ref();
        let truncated = |t: fn(&ExecResult) -> bool, len: usize| r.map_or(len >= self.limit, t);
        CommandView {
            id: self.id.clone(),
            running: st.finished_at.is_none(),
            exit_code: r.map(ExecResult::shell_exit_code),
            status: r.map(|r| r.status),
            timed_out: r.is_some_and(|r| r.timed_out),
            killed: st.killed,
            stdout_bytes: st.stdout.len(),
            stderr_bytes: st.stderr.len(),
            stdout_truncated: truncated(|r| r.stdout_truncated, st.stdout.len()),
            stderr_truncated: truncated(|r| r.stderr_truncated, st.stderr.len()),
            started_at: self.started_at,
            finished_at: st.finished_at,
            duration_ms: st
                .duration
                .unwrap_or_else(|| self.started.elapsed())
                .as_millis()
                .try_into()
                .unwrap_or(u64::MAX),
            error: st
                .error
                .as_ref()
                .map(|(code, message)| serde_json::json!({"code": code, "message": message})),
        }
    }

    /// Output from byte offsets on.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for an offset past the bytes kept so far.
    pub fn logs(
        &self,
        stdout_offset: usize,
        stderr_offset: usize,
    ) -> Result<CommandLogsView, Error> {
        let view = self.view();
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let running = view.running;
        let slice = |buf: &[u8], offset: usize, name: &str| -> Result<(OutputText, usize), Error> {
            if offset > buf.len() {
                return Err(Error::InvalidRequest(format!(
                    "{name}_offset {offset} is past the {} bytes written so far",
                    buf.len()
                )));
            }
            let mut part = &buf[offset..];
            if running {
                // Hold back a character that is not complete yet: it comes next time.
                part = &part[..part.len() - incomplete_tail(part)];
            }
            Ok((OutputText::of(part), offset + part.len()))
        };
        let (stdout, stdout_next_offset) = slice(&st.stdout, stdout_offset, "stdout")?;
        let (stderr, stderr_next_offset) = slice(&st.stderr, stderr_offset, "stderr")?;
        Ok(CommandLogsView {
            stdout,
            stderr,
            stdout_next_offset,
            stderr_next_offset,
            running,
            stdout_truncated: view.stdout_truncated,
            stderr_truncated: view.stderr_truncated,
        })
    }

    /// Kills it (when it runs) and waits for its task to end.
    pub async fn kill(&self) {
        self.kill.notify_one();
        let mut done = self.done.subscribe();
        let _ = tokio::time::timeout(END_WAIT, done.wait_for(|d| *d)).await;
    }
}

impl Commands {
    /// Starts `request` in the background on `conversation` (which the task owns and closes at
    /// the end).
    ///
    /// # Errors
    /// `Err(None)` when [`MAX_RUNNING_PER_CONVERSATION`] commands already run there.
    pub fn start(
        self: &Arc<Self>,
        conversation: Conversation,
        request: ExecRequest,
    ) -> Result<Arc<Command>, usize> {
        let key = conversation.key().clone();
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let (done, _) = watch::channel(false);
        let command = Arc::new(Command {
            id: format!("cmd-{:x}-{n}", self.epoch),
            started_at: Utc::now(),
            started: Instant::now(),
            limit: request.output_limit,
            state: Mutex::default(),
            kill: Notify::new(),
            done,
        });
        {
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            let list = map.entry(key).or_default();
            if list.iter().filter(|c| c.running()).count() >= MAX_RUNNING_PER_CONVERSATION {
                return Err(MAX_RUNNING_PER_CONVERSATION);
            }
            if list.len() >= MAX_KEPT_PER_CONVERSATION {
                if let Some(i) = list.iter().position(|c| !c.running()) {
                    list.remove(i);
                }
            }
            list.push(command.clone());
        }
        let task = command.clone();
        tokio::spawn(async move {
            let outcome = {
                let sink_to = task.clone();
                let mut sink = move |s: OutputStream, b: &[u8]| sink_to.append(s, b);
                let run = conversation.exec_stream(request, &mut sink);
                tokio::select! {
                    r = run => Some(r),
                    // Dropping `run` kills the command's process group.
                    () = task.kill.notified() => None,
                }
            };
            task.finish(outcome);
            if let Err(e) = Box::new(conversation).close().await {
                tracing::warn!(error = %e, "closing a background command's session failed");
            }
        });
        Ok(command)
    }

    /// The command `id` of conversation `key`.
    pub fn get(&self, key: &ConversationKey, id: &str) -> Option<Arc<Command>> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key)?.iter().find(|c| c.id == id).cloned()
    }

    /// Kills every command of `key` and forgets them (the conversation is being destroyed).
    pub async fn end_conversation(&self, key: &ConversationKey) {
        let list = self
            .map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
            .unwrap_or_default();
        for c in list {
            c.kill().await;
        }
    }

    /// Background commands running now, in every conversation.
    pub fn running(&self) -> usize {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.values().flatten().filter(|c| c.running()).count()
    }
}
