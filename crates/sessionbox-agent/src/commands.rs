//! `POST /command`, `DELETE /command`, `GET /command/status/{id}`, `GET /command/{id}/logs`.
//!
//! A foreground command's response is its event stream: `init` (the command id), `stdout` and
//! `stderr` pieces as they are read, then exactly one terminal event (`execution_complete`, or
//! `error` whose `evalue` is the exit code), after which the body ends at once. Dropping the
//! response (the client went away) kills the command's process group.
//!
//! A background command's stream is `init` then `execution_complete` at once; it runs on,
//! its combined output kept in memory (each stream up to the cap) for
//! `GET /command/{id}/logs`, whose cursor is a byte offset into that output (as upstream).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use futures::Stream;
use sessionbox_core::{ExecRequest, ExitStatus, MAX_OUTPUT_LIMIT, MAX_TIMEOUT};
use sessionbox_execd::wire::{self, error_code, query};
use sessionbox_execd::{
    CommandEndExtension, CommandStatus, OutputEncoding, RunCommandRequest, ServerStreamEvent,
};
use sessionbox_process::{self as process, Spawn, Stream as OutStream};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use crate::framing::LineFramer;
use crate::server::{ApiError, AppState, json_body, ok_empty, query_one, query_pairs};

/// One command, running or finished.
pub(crate) struct Command {
    pub(crate) id: String,
    pub(crate) content: String,
    pub(crate) background: bool,
    pub(crate) started_at: DateTime<Utc>,
    /// When it started on the monotonic clock: its end is `started_at` plus the time it ran,
    /// so a wall-clock jump while it runs does not change its reported duration.
    started: std::time::Instant,
    cancel: CancellationToken,
    state: Mutex<CommandState>,
    /// Its stdin, when it was started with `keep_stdin_open`.
    pub(crate) stdin: Option<process::LiveStdin>,
    /// Its process group while it runs (0 before it starts and after it ended).
    pub(crate) group: std::sync::atomic::AtomicI32,
}

#[derive(Default)]
pub(crate) struct CommandState {
    pub(crate) running: bool,
    pub(crate) exit_code: Option<i32>,
    pub(crate) error: Option<String>,
    pub(crate) finished_at: Option<DateTime<Utc>>,
    /// Why it was cancelled, set before cancelling.
    cancel_reason: Option<String>,
    /// Background commands: stdout and stderr, apart and in the order read.
    pub(crate) log: crate::background::Log,
    /// How it ended, once it has (signal, timeout, interrupt, truncation).
    pub(crate) end: Option<CommandEndExtension>,
}

impl Command {
    /// The time it ends if it ends now: its start plus the monotonic time it ran.
    fn finished_at_now(&self) -> DateTime<Utc> {
        chrono::Duration::from_std(self.started.elapsed())
            .ok()
            .and_then(|d| self.started_at.checked_add_signed(d))
            .unwrap_or(self.started_at)
    }

    /// A command that starts now, running.
    pub(crate) fn new(content: &str, background: bool) -> Arc<Command> {
        Arc::new(Command {
            id: new_id(),
            content: content.to_owned(),
            background,
            started_at: Utc::now(),
            started: std::time::Instant::now(),
            cancel: CancellationToken::new(),
            state: Mutex::new(CommandState {
                running: true,
                ..Default::default()
            }),
            stdin: None,
            group: std::sync::atomic::AtomicI32::new(0),
        })
    }

    /// A background command that starts now, with its stdin kept open when `keep_stdin_open`.
    pub(crate) fn background(content: &str, keep_stdin_open: bool) -> Arc<Command> {
        let mut cmd = Command::new(content, true);
        if let Some(c) = Arc::get_mut(&mut cmd).filter(|_| keep_stdin_open) {
            c.stdin = Some(process::LiveStdin::new());
        }
        cmd
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, CommandState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Kills it (its process group) with `reason`, unless it already finished.
    pub(crate) fn interrupt(&self, reason: &str) {
        {
            let mut st = self.lock();
            if !st.running {
                return;
            }
            st.cancel_reason.get_or_insert_with(|| reason.to_owned());
        }
        self.cancel.cancel();
    }

    fn status(&self) -> CommandStatus {
        let st = self.lock();
        CommandStatus {
            id: self.id.clone(),
            content: Some(self.content.clone()),
            running: st.running,
            exit_code: st.exit_code,
            error: st.error.clone(),
            started_at: Some(rfc3339(self.started_at)),
            finished_at: st.finished_at.map(rfc3339),
        }
    }
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Every command the agent knows: running ones, and the most recent finished ones.
pub(crate) struct Registry {
    inner: Mutex<RegistryInner>,
    running: AtomicUsize,
    tasks: TaskTracker,
    max_finished: usize,
}

#[derive(Default)]
struct RegistryInner {
    map: HashMap<String, Arc<Command>>,
    /// Finished commands, oldest first, with the bytes of output each keeps.
    finished: VecDeque<(String, usize)>,
    /// The bytes of output the finished commands keep, together.
    finished_bytes: usize,
}

impl Registry {
    pub(crate) fn new(max_finished: usize) -> Self {
        Registry {
            inner: Mutex::new(RegistryInner::default()),
            running: AtomicUsize::new(0),
            tasks: TaskTracker::new(),
            max_finished: max_finished.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RegistryInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commands running now.
    pub(crate) fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    pub(crate) fn get(&self, id: &str) -> Option<Arc<Command>> {
        self.lock().map.get(id).cloned()
    }

    /// Every background command remembered, oldest first.
    pub(crate) fn background_commands(&self) -> Vec<Arc<Command>> {
        let mut all: Vec<Arc<Command>> = self
            .lock()
            .map
            .values()
            .filter(|c| c.background)
            .cloned()
            .collect();
        all.sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
        all
    }

    fn insert(&self, cmd: Arc<Command>) {
        self.running.fetch_add(1, Ordering::SeqCst);
        self.lock().map.insert(cmd.id.clone(), cmd);
    }

    /// Inserts a background command unless `limit` background commands already run.
    pub(crate) fn insert_background(
        &self,
        cmd: Arc<Command>,
        limit: usize,
    ) -> Result<(), ApiError> {
        let mut inner = self.lock();
        let running = inner
            .map
            .values()
            .filter(|c| c.background && c.lock().running)
            .count();
        if running >= limit {
            return Err(crate::background::too_many(limit));
        }
        self.running.fetch_add(1, Ordering::SeqCst);
        inner.map.insert(cmd.id.clone(), cmd);
        Ok(())
    }

    fn finished(&self, id: &str) {
        let mut inner = self.lock();
        let cmd = inner.map.get(id).cloned();
        let bytes = cmd.as_ref().map_or(0, |c| c.lock().log.len());
        inner.finished.push_back((id.to_owned(), bytes));
        inner.finished_bytes += bytes;
        // Bounded in number and in bytes kept (the newest finished command always stays).
        while inner.finished.len() > self.max_finished
            || (inner.finished_bytes > crate::background::MAX_FINISHED_BYTES
                && inner.finished.len() > 1)
        {
            if let Some((old, n)) = inner.finished.pop_front() {
                inner.map.remove(&old);
                inner.finished_bytes -= n;
            }
        }
        drop(inner);
        self.running.fetch_sub(1, Ordering::SeqCst);
        if let Some(c) = cmd {
            c.lock().log.wake();
        }
    }

    /// Kills every running command.
    pub(crate) fn cancel_all(&self, reason: &str) {
        let all: Vec<Arc<Command>> = self.lock().map.values().cloned().collect();
        for c in all {
            c.interrupt(reason);
        }
    }

    /// Waits (at most `limit`) for every command task to end.
    pub(crate) async fn wait_all(&self, limit: Duration) {
        self.tasks.close();
        let _ = tokio::time::timeout(limit, self.tasks.wait()).await;
    }
}

/// A fresh, unguessable command id (128 random bits, hex).
fn new_id() -> String {
    let mut b = [0u8; 16];
    let mut filled = 0;
    while filled < b.len() {
        match rustix::rand::getrandom(&mut b[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => {
                // No getrandom: fall back to the hasher's per-process random keys and the time.
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u128(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_nanos(),
                );
                b[..8].copy_from_slice(&h.finish().to_le_bytes());
                break;
            }
        }
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `argv` as shell text that runs it without expansion: `exec 'a' 'b'`.
fn argv_to_shell(argv: &[String]) -> String {
    let mut out = String::from("exec");
    for a in argv {
        out.push(' ');
        out.push('\'');
        out.push_str(&a.replace('\'', "'\\''"));
        out.push('\'');
    }
    out
}

/// Turns the wire request into what the process runner takes, checking everything first.
pub(crate) fn build_exec(
    state: &AppState,
    req: &RunCommandRequest,
) -> Result<(ExecRequest, OwnedFd), ApiError> {
    req.validate()
        .map_err(|m| ApiError::bad_request(format!("invalid request, validation error: {m}")))?;
    let text = match (&req.command, &req.argv) {
        (Some(c), _) => c.clone(),
        (None, Some(argv)) => argv_to_shell(argv),
        (None, None) => return Err(ApiError::bad_request("a command or argv is required")),
    };
    let me_uid = rustix::process::geteuid().as_raw();
    let me_gid = rustix::process::getegid().as_raw();
    if req.uid.is_some_and(|u| u != me_uid) || req.gid.is_some_and(|g| g != me_gid) {
        return Err(ApiError::bad_request(format!(
            "running a command as another user or group is not supported by this agent (it \
             runs as uid {me_uid}, gid {me_gid}); leave uid and gid out"
        )));
    }
    let timeout = match req.timeout_ms {
        None => MAX_TIMEOUT,
        Some(ms) if u128::from(ms) > MAX_TIMEOUT.as_millis() => {
            return Err(ApiError::bad_request(format!(
                "timeout {ms} ms is above the agent's limit of {} ms; run longer jobs in steps",
                MAX_TIMEOUT.as_millis()
            )));
        }
        Some(ms) => Duration::from_millis(ms),
    };
    let cap = match req.max_output_bytes {
        None => state.config.output_cap,
        Some(n) if n == 0 || n > MAX_OUTPUT_LIMIT as u64 => {
            return Err(ApiError::bad_request(format!(
                "max_output_bytes must be between 1 and {MAX_OUTPUT_LIMIT}"
            )));
        }
        Some(n) => n as usize,
    };
    let mut exec = ExecRequest::new(text).timeout(timeout).output_limit(cap);
    if let Some(relay) = &state.config.egress_relay {
        exec.env.extend(relay.proxy_env());
    }
    if let Some(envs) = &req.envs {
        exec.env
            .extend(envs.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    exec.stdin = req.stdin.clone();
    exec.keep_stdin_open = req.keep_stdin_open;
    exec.validate().map_err(ApiError::from)?;
    let cwd = state
        .ws
        .open_dir(req.cwd.as_deref().unwrap_or("."))
        .map_err(ApiError::from)?;
    Ok((exec, cwd))
}

/// `POST /command`.
pub(crate) async fn run_command(State(state): State<Arc<AppState>>, req: Request) -> Response {
    match start(state, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn start(state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    let request: RunCommandRequest = json_body(&state, req).await?;
    let (exec, cwd) = build_exec(&state, &request)?;
    let cmd = Arc::new(Command {
        id: new_id(),
        content: exec.command.clone(),
        background: request.background,
        started_at: Utc::now(),
        started: std::time::Instant::now(),
        cancel: CancellationToken::new(),
        state: Mutex::new(CommandState {
            running: true,
            ..Default::default()
        }),
        stdin: exec.keep_stdin_open.then(process::LiveStdin::new),
        group: std::sync::atomic::AtomicI32::new(0),
    });
    if request.keep_stdin_open && !request.background {
        return Err(ApiError::bad_request(
            "keep_stdin_open is for background commands (a foreground command's stdin is its \
             request's stdin)",
        ));
    }
    if request.background {
        state
            .commands
            .insert_background(cmd.clone(), sessionbox_core::MAX_RUNNING_COMMANDS)?;
    } else {
        state.commands.insert(cmd.clone());
    }
    tracing::debug!(id = %cmd.id, background = cmd.background, "command started");

    let (tx, rx) = unbounded_channel::<Bytes>();
    let _ = tx.send(Bytes::from(
        ServerStreamEvent::init(cmd.id.clone()).to_frame(),
    ));
    let guard = if request.background {
        let _ = tx.send(Bytes::from(
            ServerStreamEvent::execution_complete(Duration::ZERO).to_frame(),
        ));
        drop(tx);
        state
            .commands
            .tasks
            .spawn(execute(state.clone(), cmd.clone(), exec, cwd, None, false));
        None
    } else {
        state.commands.tasks.spawn(execute(
            state.clone(),
            cmd.clone(),
            exec,
            cwd,
            Some(tx),
            request.output_encoding == Some(OutputEncoding::Base64),
        ));
        Some(cmd.cancel.clone().drop_guard())
    };
    let body = Body::from_stream(EventBody::new(rx, guard));
    let mut response = (StatusCode::OK, body).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(wire::EVENT_STREAM_CONTENT_TYPE),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

/// The response body of `POST /command`: frames until the task drops its sender. Dropping it
/// (the client went away) cancels a foreground command, which kills its process group.
///
/// It carries a `ping` event every [`KEEPALIVE_INTERVAL`] (the first right after `init`), as
/// upstream does, so that a proxy in front (the OpenSandbox server's gives up after 180 s without a
/// byte) never sees a quiet response.
pub(crate) struct EventBody {
    rx: UnboundedReceiver<Bytes>,
    keepalive: tokio::time::Interval,
    _guard: Option<DropGuard>,
}

/// How often a command's event stream carries a `ping` event while nothing else is sent
/// (upstream execd: every 3 s).
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(3);

impl EventBody {
    pub(crate) fn new(rx: UnboundedReceiver<Bytes>, guard: Option<DropGuard>) -> Self {
        // The first `ping` right after `init`, then one every interval, as upstream.
        let mut keepalive = tokio::time::interval(KEEPALIVE_INTERVAL);
        keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        EventBody {
            rx,
            keepalive,
            _guard: guard,
        }
    }
}

impl Stream for EventBody {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(frame)) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.keepalive.poll_tick(cx) {
                Poll::Ready(_) => {
                    Poll::Ready(Some(Ok(Bytes::from(ServerStreamEvent::ping().to_frame()))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

/// Where a command's output goes: stream events (foreground) or its log (background), each
/// stream capped.
struct OutputSink<'a> {
    cmd: &'a Command,
    tx: Option<&'a UnboundedSender<Bytes>>,
    cap: usize,
    kept: [usize; 2],
    truncated: [bool; 2],
    /// The client asked for the exact bytes ([`OutputEncoding::Base64`]): events carry them
    /// as read. Otherwise, events carry text as upstream frames it (one event per line).
    exact: bool,
    lines: [LineFramer; 2],
}

impl OutputSink<'_> {
    fn push(&mut self, stream: OutStream, data: &[u8]) {
        let i = match stream {
            OutStream::Stdout => 0,
            OutStream::Stderr => 1,
        };
        let room = self.cap - self.kept[i];
        if data.len() > room {
            self.truncated[i] = true;
        }
        let data = &data[..data.len().min(room)];
        if data.is_empty() {
            return;
        }
        self.kept[i] += data.len();
        match self.tx {
            Some(tx) if self.exact => {
                let event = ServerStreamEvent::output_bytes(i == 0, data);
                let _ = tx.send(Bytes::from(event.to_frame()));
            }
            Some(tx) => {
                for text in self.lines[i].push(data) {
                    self.send(i, text, tx);
                }
            }
            None => self.cmd.lock().log.push(i, data, self.truncated[i]),
        }
    }

    fn send(&self, i: usize, text: String, tx: &UnboundedSender<Bytes>) {
        if text.is_empty() {
            return;
        }
        let event = if i == 0 {
            ServerStreamEvent::stdout(text)
        } else {
            ServerStreamEvent::stderr(text)
        };
        let _ = tx.send(Bytes::from(event.to_frame()));
    }

    fn flush(&mut self) {
        if let Some(tx) = self.tx {
            for i in 0..2 {
                if let Some(text) = self.lines[i].finish() {
                    self.send(i, text, tx);
                }
            }
        }
    }
}

/// Runs background command `cmd` (already in the registry) in a task of the registry.
pub(crate) fn spawn_background(
    state: &Arc<AppState>,
    cmd: Arc<Command>,
    exec: ExecRequest,
    cwd: OwnedFd,
) {
    state
        .commands
        .tasks
        .spawn(execute(state.clone(), cmd, exec, cwd, None, false));
}

/// Runs one command to its end and records how it ended; for a foreground command, sends the
/// terminal event and then drops the sender, which ends the response body.
async fn execute(
    state: Arc<AppState>,
    cmd: Arc<Command>,
    exec: ExecRequest,
    cwd: OwnedFd,
    tx: Option<UnboundedSender<Bytes>>,
    exact: bool,
) {
    let mut sink = OutputSink {
        cmd: &cmd,
        tx: tx.as_ref(),
        cap: exec.output_limit,
        kept: [0, 0],
        truncated: [false, false],
        exact,
        lines: [LineFramer::default(), LineFramer::default()],
    };
    let outcome = {
        let mut on_output = |s: OutStream, data: &[u8]| sink.push(s, data);
        let spawn = Spawn {
            request: &exec,
            cwd: cwd.as_fd(),
            home: &state.presented_root,
            kill_grace: state.config.kill_grace,
            group: Some(&cmd.group),
        };
        let run = async {
            match &cmd.stdin {
                Some(stdin) => process::run_live(spawn, Some(&mut on_output), stdin).await,
                None => process::run(spawn, Some(&mut on_output)).await,
            }
        };
        tokio::select! {
            r = run => Some(r),
            // Dropping `run` kills the whole process group.
            _ = cmd.cancel.cancelled() => None,
        }
    };
    sink.flush();
    let mut ext = CommandEndExtension {
        stdout_truncated: sink.truncated[0],
        stderr_truncated: sink.truncated[1],
        ..Default::default()
    };
    let (exit_code, error, event) = match outcome {
        None => {
            let reason = cmd
                .lock()
                .cancel_reason
                .clone()
                .unwrap_or_else(|| "the client disconnected".to_owned());
            ext.signal = Some(rustix::process::Signal::KILL.as_raw());
            ext.interrupted = true;
            let event = ServerStreamEvent::exit_error(-1, vec![format!("interrupted: {reason}")]);
            (Some(-1), Some(format!("interrupted: {reason}")), event)
        }
        Some(Err(e)) => {
            let message = format!("the command could not start: {e}");
            (
                None,
                Some(message.clone()),
                ServerStreamEvent::start_error(message),
            )
        }
        Some(Ok(result)) => {
            if let ExitStatus::Signal(s) = result.status {
                ext.signal = Some(s);
            }
            if result.timed_out {
                ext.timed_out = true;
                let message = format!("timed out after {} ms", exec.timeout.as_millis());
                (
                    Some(-1),
                    Some(message),
                    ServerStreamEvent::timeout_error(-1, exec.timeout),
                )
            } else {
                match result.status {
                    ExitStatus::Code(0) => (
                        Some(0),
                        None,
                        ServerStreamEvent::execution_complete(result.duration),
                    ),
                    ExitStatus::Code(c) => {
                        (Some(c), None, ServerStreamEvent::exit_error(c, Vec::new()))
                    }
                    ExitStatus::Signal(s) => {
                        let message = format!("killed by signal {s}");
                        (
                            Some(-1),
                            Some(message.clone()),
                            ServerStreamEvent::exit_error(-1, vec![message]),
                        )
                    }
                }
            }
        }
    };
    {
        let mut st = cmd.lock();
        st.running = false;
        st.exit_code = exit_code;
        st.error = error;
        st.finished_at = Some(cmd.finished_at_now());
        st.end = Some(ext);
    }
    state.commands.finished(&cmd.id);
    state.activity.touch();
    tracing::debug!(id = %cmd.id, ?exit_code, "command finished");
    if let Some(tx) = tx {
        let event = if ext == CommandEndExtension::default() {
            event
        } else {
            event.with_extension(ext)
        };
        let _ = tx.send(Bytes::from(event.to_frame()));
    }
}

/// `DELETE /command?id=`: kills the command's process group. 404 for an unknown id; a finished
/// command is left as it is (200).
pub(crate) async fn interrupt_command(
    State(state): State<Arc<AppState>>,
    req: Request,
) -> Response {
    let pairs = query_pairs(&req);
    let Some(id) = query_one(&pairs, query::ID).filter(|s| !s.is_empty()) else {
        return ApiError::missing_query(query::ID).into_response();
    };
    match state.commands.get(id) {
        Some(cmd) => {
            cmd.interrupt("interrupted by DELETE /command");
            ok_empty()
        }
        None => unknown(id).into_response(),
    }
}

fn unknown(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        error_code::INVALID_REQUEST_BODY,
        format!("command not found: {id}"),
    )
}

/// `GET /command/status/{id}`.
pub(crate) async fn command_status(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Response {
    match state.commands.get(&id) {
        Some(cmd) => axum::Json(cmd.status()).into_response(),
        None => unknown(&id).into_response(),
    }
}

/// `GET /command/{id}/logs?cursor=`: a background command's output from byte `cursor` (0 when
/// absent or not a number, as upstream), with the next cursor in `EXECD-COMMANDS-TAIL-CURSOR`.
pub(crate) async fn command_logs(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    let pairs = query_pairs(&req);
    let cursor: usize = query_one(&pairs, query::CURSOR)
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or(0);
    let Some(cmd) = state.commands.get(&id) else {
        return unknown(&id).into_response();
    };
    if !cmd.background {
        return ApiError::bad_request(format!(
            "command {id} is not running in background; its output was in its event stream"
        ))
        .into_response();
    }
    let (chunk, next) = {
        let st = cmd.lock();
        (Bytes::from(st.log.combined_from(cursor)), st.log.len())
    };
    let mut response = (StatusCode::OK, chunk).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(wire::TAIL_CURSOR_HEADER, HeaderValue::from(next as u64));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_is_quoted_literally() {
        assert_eq!(
            argv_to_shell(&["echo".into(), "it's $HOME".into()]),
            "exec 'echo' 'it'\\''s $HOME'"
        );
    }

    #[test]
    fn ids_are_random_hex() {
        let a = new_id();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, new_id());
    }
}
