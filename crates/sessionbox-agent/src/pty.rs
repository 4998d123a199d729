//! Interactive terminals: upstream execd's `/pty` routes and WebSocket
//! ([`sessionbox_execd::pty`] has the wire format).
//!
//! A session is created by `POST /pty` (working directory checked then); its shell starts on
//! the first WebSocket, through [`sessionbox_process::spawn_terminal`], so it runs exactly as a
//! command does (same user, environment, working directory confinement, Landlock scope), and
//! everything it started is killed ([`sessionbox_process::kill_session`]) when it exits, when
//! the session is deleted and when the agent stops. One client holds a session at a time (409
//! for another, unless it asks to take over). The shell survives its client: a reconnection
//! replays what was missed from the session's replay buffer.
//!
//! Bounds: at most [`crate::AgentConfig::max_terminals`] sessions whose shell has not ended
//! (one more is 429); ended sessions are kept for their status up to as many again, oldest
//! forgotten first; each keeps at most [`REPLAY_BYTES`] of output; a client message is at most
//! [`MAX_MESSAGE_BYTES`]; output waits for a slow client (the shell blocks) rather than
//! queueing without end.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use rustix::process::{Pid, Signal};
use sessionbox_execd::pty::{
    self, ClientFrame, CreatePtyRequest, CreatePtyResponse, PtyStatus, ServerFrame, channel, code,
};
use sessionbox_execd::wire::error_code;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::server::{ApiError, AppState, parse_json, query_one, query_pairs, read_body};

/// Output each session keeps for replay: 1 MiB (upstream's size); older bytes are forgotten.
pub(crate) const REPLAY_BYTES: usize = 1 << 20;
/// Largest WebSocket message a client may send: 1 MiB.
pub(crate) const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Size of each read from the terminal.
const READ_CHUNK: usize = 32 * 1024;
/// Chunks queued for the attached client before the reader waits for it.
const SINK_DEPTH: usize = 16;
/// How long a takeover waits for the holder to let go.
const TAKEOVER_WAIT: Duration = Duration::from_secs(5);
/// WebSocket pings to the client, so idle proxies keep the connection.
const PING_EVERY: Duration = Duration::from_secs(30);
/// After the shell exits and its session is killed, how long output still in the terminal is
/// read before it is abandoned.
const DRAIN_WAIT: Duration = Duration::from_secs(1);
/// The first window size, until the client sends one.
const INITIAL_SIZE: (u16, u16) = (80, 24);

/// Every session of this agent.
pub(crate) struct Terminals {
    inner: Mutex<HashMap<String, Arc<Term>>>,
    max: usize,
    seq: AtomicU64,
}

impl Terminals {
    pub(crate) fn new(max: usize) -> Self {
        Terminals {
            inner: Mutex::new(HashMap::new()),
            max,
            seq: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Term>>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sessions whose shell runs with a client attached (activity for the idle timeout). A
    /// detached shell does not keep the agent up: a terminal whose client vanished without
    /// deleting it cannot pin the sandbox forever.
    pub(crate) fn running(&self) -> usize {
        self.lock()
            .values()
            .filter(|t| t.is_running() && t.lock_holder().is_some())
            .count()
    }

    fn get(&self, id: &str) -> Option<Arc<Term>> {
        self.lock().get(id).cloned()
    }

    /// Kills every session's processes (the agent is stopping).
    pub(crate) fn kill_all(&self) {
        let all: Vec<_> = self.lock().values().cloned().collect();
        for t in all {
            t.kill();
        }
    }
}

/// One session.
struct Term {
    id: String,
    seq: u64,
    /// Until the shell starts: its working directory and command.
    pending: Mutex<Option<(OwnedFd, Option<String>)>>,
    out: Mutex<Out>,
    proc_: Mutex<Proc>,
    /// `Some(code)` once the shell ended and its output was read.
    done: watch::Sender<Option<i32>>,
    /// The client holding the session: its generation and how to evict it.
    holder: Mutex<Option<(u64, CancellationToken)>>,
}

#[derive(Default)]
struct Out {
    replay: Replay,
    /// The attached client's queue.
    sink: Option<mpsc::Sender<Bytes>>,
}

#[derive(Default)]
struct Proc {
    master: Option<Arc<AsyncFd<OwnedFd>>>,
    session: Option<Pid>,
}

/// The last [`REPLAY_BYTES`] of output and how many bytes were ever written.
#[derive(Default)]
struct Replay {
    buf: VecDeque<u8>,
    total: u64,
}

impl Replay {
    fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        self.buf.extend(data);
        let excess = self.buf.len().saturating_sub(REPLAY_BYTES);
        self.buf.drain(..excess);
    }

    /// The bytes from absolute offset `since` (clamped to the oldest kept), and the offset of
    /// the first one.
    fn read_from(&self, since: u64) -> (Vec<u8>, u64) {
        let oldest = self.total - self.buf.len() as u64;
        let from = since.clamp(oldest, self.total);
        let skip = (from - oldest) as usize;
        (self.buf.iter().skip(skip).copied().collect(), from)
    }
}

impl Term {
    fn lock_proc(&self) -> MutexGuard<'_, Proc> {
        self.proc_.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_out(&self) -> MutexGuard<'_, Out> {
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_holder(&self) -> MutexGuard<'_, Option<(u64, CancellationToken)>> {
        self.holder.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ended(&self) -> bool {
        self.done.borrow().is_some()
    }

    fn is_running(&self) -> bool {
        self.lock_proc().session.is_some() && !self.ended()
    }

    fn kill(&self) {
        let session = self.lock_proc().session;
        if let Some(s) = session {
            sessionbox_process::kill_session(s);
        }
        let never_started = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some();
        if never_started {
            let _ = self.done.send(Some(-1));
        }
    }

    /// Starts the shell unless it runs or ran.
    fn start(self: &Arc<Self>, state: &AppState) -> Result<(), String> {
        let Some((cwd, command)) = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return Ok(());
        };
        let mut env = std::collections::BTreeMap::new();
        if let Some(relay) = &state.config.egress_relay {
            env.extend(relay.proxy_env());
        }
        let t = sessionbox_process::spawn_terminal(sessionbox_process::TerminalSpawn {
            command: command.as_deref(),
            env: &env,
            cwd: cwd.as_fd(),
            home: &state.presented_root,
            size: INITIAL_SIZE,
        })
        .map_err(|e| {
            let _ = self.done.send(Some(-1));
            e.to_string()
        })?;
        let registered = rustix::io::ioctl_fionbio(&t.master, true)
            .map_err(std::io::Error::from)
            .and_then(|()| {
                // SAFETY: an `OwnedFd` owns its descriptor: it stays open, and the same one,
                // until the `AsyncFd` (which owns the `OwnedFd`) is dropped.
                unsafe { AsyncFd::register(t.master) }.map_err(std::io::Error::from)
            });
        let master = match registered {
            Ok(m) => Arc::new(m),
            Err(e) => {
                sessionbox_process::kill_session(t.session);
                let _ = self.done.send(Some(-1));
                return Err(format!("cannot watch the terminal: {e}"));
            }
        };
        {
            let mut p = self.lock_proc();
            p.master = Some(master.clone());
            p.session = Some(t.session);
        }
        let reader = tokio::spawn(read_output(self.clone(), master));
        let me = self.clone();
        let mut child = t.child;
        let session = t.session;
        tokio::spawn(async move {
            let status = child.wait().await;
            sessionbox_process::kill_session(session);
            let mut reader = reader;
            if tokio::time::timeout(DRAIN_WAIT, &mut reader).await.is_err() {
                tracing::debug!("a process outside the terminal's session holds it open");
                reader.abort();
            }
            let code = status
                .map(sessionbox_process::terminal::exit_code)
                .unwrap_or(-1);
            me.lock_proc().master = None;
            let _ = me.done.send(Some(code));
        });
        Ok(())
    }

    async fn write_input(&self, mut data: &[u8]) -> std::io::Result<()> {
        let master = self.lock_proc().master.clone();
        let Some(master) = master else {
            return Err(std::io::Error::other("the terminal has ended"));
        };
        while !data.is_empty() {
            let mut guard = master.writable().await?;
            match guard.try_io(|fd| rustix::io::write(fd.get_ref(), data).map_err(Into::into)) {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    fn resize(&self, cols: u16, rows: u16) {
        if let Some(m) = self.lock_proc().master.clone() {
            let _ = sessionbox_process::set_window_size(m.get_ref(), cols, rows);
        }
    }

    fn signal(&self, name: &str) -> bool {
        let Some(sig) = signal_by_name(name) else {
            return false;
        };
        let p = self.lock_proc();
        if let (Some(m), Some(s)) = (&p.master, p.session) {
            sessionbox_process::signal_foreground(m.get_ref(), s, sig);
        }
        true
    }
}

/// Reads the terminal until it closes, into the replay buffer and to the attached client.
async fn read_output(term: Arc<Term>, master: Arc<AsyncFd<OwnedFd>>) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = {
            let Ok(mut guard) = master.readable().await else {
                return;
            };
            match guard.try_io(|fd| rustix::io::read(fd.get_ref(), &mut buf).map_err(Into::into)) {
                Ok(Ok(0)) | Ok(Err(_)) => return, // EIO: every holder of the peer is gone
                Ok(Ok(n)) => n,
                Err(_would_block) => continue,
            }
        };
        let chunk = Bytes::copy_from_slice(&buf[..n]);
        let sink = {
            let mut out = term.lock_out();
            out.replay.push(&chunk);
            out.sink.clone()
        };
        if let Some(s) = sink {
            // Waits for a slow client; a gone one fails at once (the bytes stay in the replay).
            let _ = s.send(chunk).await;
        }
    }
}

fn signal_by_name(name: &str) -> Option<Signal> {
    let n = name.trim().to_ascii_uppercase();
    let n = n.strip_prefix("SIG").unwrap_or(&n);
    Some(match n {
        "INT" => Signal::INT,
        "TERM" => Signal::TERM,
        "KILL" => Signal::KILL,
        "HUP" => Signal::HUP,
        "QUIT" => Signal::QUIT,
        "TSTP" => Signal::TSTP,
        "CONT" => Signal::CONT,
        "STOP" => Signal::STOP,
        "USR1" => Signal::USR1,
        "USR2" => Signal::USR2,
        "WINCH" => Signal::WINCH,
        _ => return None,
    })
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        error_code::CONTEXT_NOT_FOUND,
        format!("pty session {id} not found"),
    )
}

fn new_id() -> String {
    let mut b = [0u8; 16];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).unwrap_or_default();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `POST /pty`: a new session (201 `{"session_id"}`); 429 past the limit.
pub(crate) async fn create(State(state): State<Arc<AppState>>, req: Request) -> Response {
    match create_inner(state, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn create_inner(state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    let bytes = read_body(req, state.config.max_request_bytes).await?;
    let body: CreatePtyRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        CreatePtyRequest::default()
    } else {
        parse_json(&bytes)?
    };
    if body.command.as_deref().is_some_and(|c| c.contains('\0')) {
        return Err(ApiError::bad_request("the command contains a NUL byte"));
    }
    let cwd = state
        .ws
        .open_dir(body.cwd.as_deref().unwrap_or("."))
        .map_err(ApiError::from)?;
    let terms = &state.terminals;
    let mut map = terms.lock();
    let live = map.values().filter(|t| !t.ended()).count();
    if live >= terms.max {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "SESSIONBOX::busy",
            format!(
                "{} terminals are already open in this sandbox; close one (DELETE /pty/{{id}}) \
                 or let its shell exit",
                terms.max
            ),
        ));
    }
    // Ended sessions are kept for their status, up to `max` of them, oldest forgotten first.
    let mut ended: Vec<(u64, String)> = map
        .values()
        .filter(|t| t.ended())
        .map(|t| (t.seq, t.id.clone()))
        .collect();
    if ended.len() >= terms.max {
        ended.sort();
        for (_, id) in &ended[..=ended.len() - terms.max] {
            map.remove(id);
        }
    }
    let id = new_id();
    let (done, _) = watch::channel(None);
    map.insert(
        id.clone(),
        Arc::new(Term {
            id: id.clone(),
            seq: terms.seq.fetch_add(1, Ordering::Relaxed),
            pending: Mutex::new(Some((cwd, body.command))),
            out: Mutex::new(Out::default()),
            proc_: Mutex::new(Proc::default()),
            done,
            holder: Mutex::new(None),
        }),
    );
    Ok((
        StatusCode::CREATED,
        axum::Json(CreatePtyResponse { session_id: id }),
    )
        .into_response())
}

/// `GET /pty/{id}`.
pub(crate) async fn status(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<axum::Json<PtyStatus>, ApiError> {
    let t = state.terminals.get(&id).ok_or_else(|| not_found(&id))?;
    let output_offset = t.lock_out().replay.total;
    Ok(axum::Json(PtyStatus {
        session_id: id,
        running: t.is_running(),
        output_offset,
    }))
}

/// `DELETE /pty/{id}`: kills the shell and everything it started, and forgets the session (an
/// attached client gets the `exit` frame).
pub(crate) async fn remove(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let t = state
        .terminals
        .lock()
        .remove(&id)
        .ok_or_else(|| not_found(&id))?;
    t.kill();
    Ok(crate::server::ok_empty())
}

/// `GET /pty/{id}/ws`.
pub(crate) async fn socket(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    let Some(term) = state.terminals.get(&id) else {
        return not_found(&id).into_response();
    };
    let pairs = query_pairs(&req);
    let takeover = query_one(&pairs, pty::query::TAKEOVER) == Some("1");
    let since = query_one(&pairs, pty::query::SINCE)
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    if query_one(&pairs, pty::query::PTY) == Some("0") {
        return ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            error_code::NOT_SUPPORTED,
            "pipe mode (pty=0) is not supported by this agent; leave pty out for a terminal",
        )
        .into_response();
    }
    if term.lock_holder().is_some() && !takeover {
        return ApiError::new(
            StatusCode::CONFLICT,
            code::ALREADY_CONNECTED,
            format!("another client is already connected to pty session {id}"),
        )
        .into_response();
    }
    let (mut parts, _body) = req.into_parts();
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &state).await {
        Ok(u) => u,
        Err(e) => return e.into_response(),
    };
    upgrade
        .max_message_size(MAX_MESSAGE_BYTES)
        .max_frame_size(MAX_MESSAGE_BYTES)
        .on_upgrade(move |ws| attached(state, term, ws, since, takeover))
}

/// Takes the holder's place (evicting the current one when `takeover`), or `None`.
async fn hold(term: &Term, takeover: bool) -> Option<(u64, CancellationToken)> {
    static GENERATION: AtomicU64 = AtomicU64::new(1);
    let gen_ = GENERATION.fetch_add(1, Ordering::Relaxed);
    let token = CancellationToken::new();
    let deadline = tokio::time::Instant::now() + TAKEOVER_WAIT;
    loop {
        {
            let mut h = term.lock_holder();
            match &*h {
                None => {
                    *h = Some((gen_, token.clone()));
                    return Some((gen_, token));
                }
                Some((_, other)) if takeover => other.cancel(),
                Some(_) => return None,
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn attached(
    state: Arc<AppState>,
    term: Arc<Term>,
    mut ws: WebSocket,
    since: u64,
    takeover: bool,
) {
    let Some((gen_, cancel)) = hold(&term, takeover).await else {
        let f = ServerFrame::error(
            code::ALREADY_CONNECTED,
            format!(
                "another client is already connected to pty session {}",
                term.id
            ),
        );
        let _ = send_json(&mut ws, &f).await;
        let _ = ws.send(Message::Close(None)).await;
        return;
    };
    if let Err(e) = term.start(&state) {
        let _ = send_json(&mut ws, &ServerFrame::error(code::START_FAILED, e)).await;
        let _ = ws.send(Message::Close(None)).await;
    } else {
        converse(&term, &mut ws, since, &cancel).await;
    }
    let mut h = term.lock_holder();
    if h.as_ref().is_some_and(|(g, _)| *g == gen_) {
        *h = None;
    }
}

async fn send_json(ws: &mut WebSocket, f: &ServerFrame) -> Result<(), axum::Error> {
    let text = serde_json::to_string(f).unwrap_or_default();
    ws.send(Message::Text(text.into())).await
}

async fn close(ws: &mut WebSocket, code: u16, reason: &'static str) {
    let _ = ws
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        })))
        .await;
}

/// The attached client's life: replay, `connected`, then output, input and control frames
/// until the shell ends, the client goes or another takes over.
async fn converse(term: &Term, ws: &mut WebSocket, since: u64, cancel: &CancellationToken) {
    let (tx, mut rx) = mpsc::channel::<Bytes>(SINK_DEPTH);
    let (snapshot, offset) = {
        let mut out = term.lock_out();
        out.sink = Some(tx.clone());
        out.replay.read_from(since)
    };
    drop(tx);
    let detach = || {
        let mut out = term.lock_out();
        out.sink = None;
    };
    if !snapshot.is_empty()
        && ws
            .send(Message::Binary(pty::replay_frame(offset, &snapshot).into()))
            .await
            .is_err()
    {
        return detach();
    }
    if send_json(ws, &ServerFrame::connected(&term.id, "pty"))
        .await
        .is_err()
    {
        return detach();
    }
    let mut done = term.done.subscribe();
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                close(ws, pty::CLOSE_TAKEN_OVER, code::TAKEN_OVER).await;
                break;
            }
            Some(chunk) = rx.recv() => {
                if ws.send(Message::Binary(pty::binary_frame(channel::STDOUT, &chunk).into())).await.is_err() {
                    break;
                }
            }
            code = ended(&mut done) => {
                // The reader finished before the end was published: what is queued is the rest.
                while let Ok(chunk) = rx.try_recv() {
                    if ws.send(Message::Binary(pty::binary_frame(channel::STDOUT, &chunk).into())).await.is_err() {
                        return detach();
                    }
                }
                let _ = send_json(ws, &ServerFrame::exit(code)).await;
                close(ws, 1000, "process exited").await;
                break;
            }
            msg = ws.recv() => {
                let Some(Ok(msg)) = msg else { break };
                match msg {
                    Message::Binary(b) => {
                        if b.first() == Some(&channel::STDIN)
                            && let Err(e) = term.write_input(&b[1..]).await
                        {
                            let _ = send_json(ws, &ServerFrame::error(code::STDIN_WRITE_FAILED, e.to_string())).await;
                            break;
                        }
                    }
                    Message::Text(t) => {
                        let Ok(f) = serde_json::from_str::<ClientFrame>(t.as_str()) else { continue };
                        if !control(term, ws, f).await {
                            break;
                        }
                    }
                    Message::Close(_) => break,
                    Message::Ping(_) | Message::Pong(_) => {}
                }
            }
            _ = ping.tick() => {
                if ws.send(Message::Ping(Bytes::new())).await.is_err() {
                    break;
                }
            }
        }
    }
    detach();
}

/// The shell's exit code once the session ended.
async fn ended(done: &mut watch::Receiver<Option<i32>>) -> i32 {
    match done.wait_for(Option::is_some).await {
        Ok(c) => c.unwrap_or(-1),
        Err(_) => -1,
    }
}

/// Handles a JSON frame; `false` ends the connection.
async fn control(term: &Term, ws: &mut WebSocket, f: ClientFrame) -> bool {
    match f.kind.as_str() {
        "stdin" => {
            if let Err(e) = term.write_input(f.data.as_bytes()).await {
                let _ = send_json(
                    ws,
                    &ServerFrame::error(code::STDIN_WRITE_FAILED, e.to_string()),
                )
                .await;
                return false;
            }
        }
        "resize" => {
            if let Some((cols, rows)) = f.window_size() {
                term.resize(cols, rows);
            }
        }
        "signal" => {
            if !term.signal(&f.signal) {
                let msg = format!("unknown signal {:?}", f.signal);
                let _ = send_json(ws, &ServerFrame::error(code::INVALID_FRAME, msg)).await;
            }
        }
        "ping" => {
            let _ = send_json(ws, &ServerFrame::pong()).await;
        }
        other => {
            let msg = format!("unknown frame type {other:?}");
            let _ = send_json(ws, &ServerFrame::error(code::INVALID_FRAME, msg)).await;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_keeps_the_last_bytes_and_their_offsets() {
        let mut r = Replay::default();
        r.push(b"hello ");
        assert_eq!(r.read_from(0), (b"hello ".to_vec(), 0));
        assert_eq!(r.read_from(2), (b"llo ".to_vec(), 2));
        assert_eq!(r.read_from(99), (Vec::new(), 6));
        let big = vec![b'x'; REPLAY_BYTES];
        r.push(&big);
        assert_eq!(r.buf.len(), REPLAY_BYTES);
        let (data, from) = r.read_from(0);
        assert_eq!((data.len(), from), (REPLAY_BYTES, 6));
    }
}
