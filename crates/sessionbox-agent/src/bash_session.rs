//! Upstream execd's bash sessions (`/session`, see [`sessionbox_execd::bash_session`]): each run
//! is one command through [`sessionbox_process::run`] (so confined, bounded and killed like any
//! command), in bash when the sandbox has it, given the session's exported variables and
//! working directory; after the command, a trailer prints them back between markers that carry
//! a random nonce of the run (so output cannot forge them), and the agent keeps them for the
//! next run. A command that `exit`s skips the trailer, and the state stays as it was (as
//! upstream).
//!
//! Bounds: at most [`MAX_SESSIONS`] sessions (429 past it), one run at a time per session (a
//! second waits), at most [`MAX_VALUE_BYTES`] per kept value and [`MAX_STATE_BYTES`] of state
//! in all (the rest is dropped), output capped as a command's.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use sessionbox_core::{ExecRequest, ExitStatus, MAX_TIMEOUT};
use sessionbox_execd::ServerStreamEvent;
use sessionbox_execd::bash_session::{
    CreateSessionRequest, CreateSessionResponse, RunInSessionRequest,
};
use sessionbox_execd::wire::{self, error_code};
use sessionbox_process::{Spawn, Stream as OutStream};
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio_util::sync::CancellationToken;

use crate::commands::EventBody;
use crate::server::{ApiError, AppState, parse_json, read_body};

/// Most bash sessions an agent keeps.
pub(crate) const MAX_SESSIONS: usize = 32;
/// Longest exported value kept across runs: 8 KiB (upstream's).
pub(crate) const MAX_VALUE_BYTES: usize = 8 * 1024;
/// Most bytes of variables and working directory a session keeps (and reads back after a run).
pub(crate) const MAX_STATE_BYTES: usize = 64 * 1024;
/// Variables never carried across runs (prompts, and what the agent sets itself).
const NOT_KEPT: [&str; 8] = [
    "PS1",
    "PS2",
    "PS3",
    "PS4",
    "PROMPT_COMMAND",
    "PWD",
    "OLDPWD",
    "SHLVL",
];

/// Every session of this agent.
pub(crate) struct BashSessions {
    inner: Mutex<HashMap<String, Arc<BashSession>>>,
    /// Runs in progress (activity for the idle timeout).
    running: AtomicUsize,
}

impl BashSessions {
    pub(crate) fn new() -> Self {
        BashSessions {
            inner: Mutex::new(HashMap::new()),
            running: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<BashSession>>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs in progress.
    pub(crate) fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Ends every run in progress (the agent is stopping).
    pub(crate) fn cancel_all(&self) {
        for s in self.lock().values() {
            s.cancel.cancel();
        }
    }
}

struct BashSession {
    /// Where runs start: a workspace path, checked again at each run.
    base_cwd: String,
    state: Mutex<Kept>,
    /// One run at a time.
    turn: tokio::sync::Mutex<()>,
    /// Cancelled when the session is deleted.
    cancel: CancellationToken,
}

#[derive(Default)]
struct Kept {
    env: BTreeMap<String, String>,
    /// The working directory the last run ended in (any directory of the sandbox).
    pwd: Option<String>,
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        error_code::CONTEXT_NOT_FOUND,
        format!("bash session {id} not found"),
    )
}

fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).unwrap_or_default();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `POST /session`.
pub(crate) async fn create(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let result = async {
        let bytes = read_body(req, state.config.max_request_bytes).await?;
        let body: CreateSessionRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
            CreateSessionRequest::default()
        } else {
            parse_json(&bytes)?
        };
        let cwd = body.cwd.unwrap_or_else(|| ".".to_owned());
        state.ws.open_dir(&cwd).map_err(ApiError::from)?;
        let mut map = state.bash_sessions.lock();
        if map.len() >= MAX_SESSIONS {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "SESSIONBOX::busy",
                format!(
                    "{MAX_SESSIONS} bash sessions already exist in this sandbox; delete one \
                     (DELETE /session/{{id}})"
                ),
            ));
        }
        let id = random_hex(16);
        map.insert(
            id.clone(),
            Arc::new(BashSession {
                base_cwd: cwd,
                state: Mutex::new(Kept::default()),
                turn: tokio::sync::Mutex::new(()),
                cancel: CancellationToken::new(),
            }),
        );
        Ok(axum::Json(CreateSessionResponse { session_id: id }).into_response())
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// `DELETE /session/{id}`.
pub(crate) async fn remove(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let s = state
        .bash_sessions
        .lock()
        .remove(&id)
        .ok_or_else(|| not_found(&id))?;
    s.cancel.cancel();
    Ok(crate::server::ok_empty())
}

/// Single-quotes `s` for a POSIX shell.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r#"'"'"'"#))
}

fn valid_name(k: &str) -> bool {
    let mut chars = k.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The script of one run: the kept state, the command, the trailer.
fn script(kept: &Kept, command: &str, cd_to_kept: bool, nonce: &str) -> String {
    let mut s = String::new();
    for (k, v) in &kept.env {
        s.push_str(&format!("export {k}={}\n", quote(v)));
    }
    if cd_to_kept && let Some(p) = &kept.pwd {
        s.push_str(&format!("cd -- {} 2>/dev/null\n", quote(p)));
    }
    s.push_str(command);
    s.push('\n');
    s.push_str(&format!(
        "__sbx_rc=$?\nprintf '\\n%s\\n' 'SBX-ENV-{nonce}'\nenv -0\nprintf '\\n%s\\n' \
         'SBX-END-{nonce}'\nprintf 'SBX-PWD-{nonce}%s\\n' \"$PWD\"\nexit $__sbx_rc\n"
    ));
    s
}

/// Splits a run's stdout into lines for events, taking the trailer's block out.
struct Trailer {
    nonce: String,
    pending: Vec<u8>,
    /// Inside the variables block: its bytes so far.
    env: Option<Vec<u8>>,
    found_env: Option<Vec<u8>>,
    pwd: Option<String>,
}

impl Trailer {
    fn new(nonce: String) -> Self {
        Trailer {
            nonce,
            pending: Vec::new(),
            env: None,
            found_env: None,
            pwd: None,
        }
    }

    /// The output lines `data` completes (markers and the block left out).
    fn push(&mut self, data: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(data);
        let mut out = Vec::new();
        while let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=i).collect();
            self.line(&line[..line.len() - 1], &mut out);
        }
        // A line without end grows no further than a command's output chunk.
        if self.env.is_none() && self.pending.len() > 64 * 1024 {
            let rest = std::mem::take(&mut self.pending);
            out.push(String::from_utf8_lossy(&rest).into_owned());
        }
        out
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<String>) {
        let text = String::from_utf8_lossy(line);
        let text = text.strip_suffix('\r').unwrap_or(&text);
        if let Some(env) = &mut self.env {
            if text == format!("SBX-END-{}", self.nonce) {
                self.found_env = self.env.take();
            } else if env.len() < MAX_STATE_BYTES {
                env.extend_from_slice(line);
                env.push(b'\n');
            }
            return;
        }
        if text == format!("SBX-ENV-{}", self.nonce) {
            self.env = Some(Vec::new());
        } else if let Some(p) = text.strip_prefix(&format!("SBX-PWD-{}", self.nonce)) {
            self.pwd = Some(p.to_owned());
        } else {
            out.push(text.to_owned());
        }
    }

    fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() || self.env.is_some() {
            return None;
        }
        let rest = std::mem::take(&mut self.pending);
        Some(String::from_utf8_lossy(&rest).into_owned())
    }

    /// The variables the trailer printed (`env -0`: NUL-separated `NAME=value`), bounded.
    fn variables(&self) -> Option<BTreeMap<String, String>> {
        let raw = self.found_env.as_ref()?;
        let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
        let mut env = BTreeMap::new();
        let mut total = 0;
        for entry in raw.split(|&b| b == 0) {
            let entry = entry.strip_prefix(b"\n").unwrap_or(entry);
            let Ok(entry) = std::str::from_utf8(entry) else {
                continue;
            };
            let Some((k, v)) = entry.split_once('=') else {
                continue;
            };
            if !valid_name(k) || NOT_KEPT.contains(&k) || v.len() > MAX_VALUE_BYTES {
                continue;
            }
            total += k.len() + v.len();
            if total > MAX_STATE_BYTES {
                break;
            }
            env.insert(k.to_owned(), v.to_owned());
        }
        Some(env)
    }
}

/// `POST /session/{id}/run`: the command's event stream.
pub(crate) async fn run(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    let result = async {
        let session = state
            .bash_sessions
            .lock()
            .get(&id)
            .cloned()
            .ok_or_else(|| not_found(&id))?;
        let bytes = read_body(req, state.config.max_request_bytes).await?;
        let body: RunInSessionRequest = parse_json(&bytes)?;
        if body.command.trim().is_empty() {
            return Err(ApiError::bad_request("a command is required"));
        }
        let timeout = match body.timeout {
            None | Some(0) => MAX_TIMEOUT,
            Some(ms) if u128::from(ms) > MAX_TIMEOUT.as_millis() => {
                return Err(ApiError::bad_request(format!(
                    "timeout {ms} ms is above the agent's limit of {} ms",
                    MAX_TIMEOUT.as_millis()
                )));
            }
            Some(ms) => Duration::from_millis(ms),
        };
        let cwd = state
            .ws
            .open_dir(body.cwd.as_deref().unwrap_or(&session.base_cwd))
            .map_err(ApiError::from)?;
        let (tx, rx) = unbounded_channel::<Bytes>();
        let _ = tx.send(Bytes::from(ServerStreamEvent::init(id.clone()).to_frame()));
        let cancel = session.cancel.child_token();
        let guard = cancel.clone().drop_guard();
        let st = state.clone();
        tokio::spawn(async move {
            let _turn = session.turn.lock().await;
            st.bash_sessions.running.fetch_add(1, Ordering::SeqCst);
            execute(&st, &session, body, timeout, cwd, tx, cancel).await;
            st.bash_sessions.running.fetch_sub(1, Ordering::SeqCst);
            st.activity.touch();
        });
        let mut response = (
            StatusCode::OK,
            Body::from_stream(EventBody::new(rx, Some(guard))),
        )
            .into_response();
        let h = response.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(wire::EVENT_STREAM_CONTENT_TYPE),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        Ok(response)
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn execute(
    state: &AppState,
    session: &BashSession,
    body: RunInSessionRequest,
    timeout: Duration,
    cwd: std::os::fd::OwnedFd,
    tx: UnboundedSender<Bytes>,
    cancel: CancellationToken,
) {
    let nonce = random_hex(12);
    let text = {
        let kept = session.state.lock().unwrap_or_else(|e| e.into_inner());
        script(&kept, &body.command, body.cwd.is_none(), &nonce)
    };
    let command = if std::path::Path::new("/bin/bash").exists() {
        format!("exec /bin/bash --noprofile --norc -c {}", quote(&text))
    } else {
        text
    };
    let mut exec = ExecRequest::new(command)
        .timeout(timeout)
        .output_limit(state.config.output_cap);
    if let Some(relay) = &state.config.egress_relay {
        exec.env.extend(relay.proxy_env());
    }
    let started = Instant::now();
    let mut trailer = Trailer::new(nonce);
    let send = |e: ServerStreamEvent| {
        let _ = tx.send(Bytes::from(e.to_frame()));
    };
    let outcome = {
        let mut on_output = |s: OutStream, data: &[u8]| match s {
            OutStream::Stdout => {
                for line in trailer.push(data) {
                    if !line.is_empty() {
                        send(ServerStreamEvent::stdout(line));
                    }
                }
            }
            OutStream::Stderr => {
                let text = String::from_utf8_lossy(data);
                for line in text.split_inclusive('\n') {
                    let line = line.trim_end_matches(['\n', '\r']);
                    if !line.is_empty() {
                        send(ServerStreamEvent::stderr(line.to_owned()));
                    }
                }
            }
        };
        let spawn = Spawn {
            request: &exec,
            cwd: cwd.as_fd(),
            home: &state.presented_root,
            kill_grace: state.config.kill_grace,
            group: None,
        };
        tokio::select! {
            r = sessionbox_process::run(spawn, Some(&mut on_output)) => Some(r),
            _ = cancel.cancelled() => None,
        }
    };
    if let Some(line) = trailer.finish() {
        send(ServerStreamEvent::stdout(line));
    }
    if let Some(env) = trailer.variables() {
        let mut kept = session.state.lock().unwrap_or_else(|e| e.into_inner());
        kept.env = env;
        if let Some(p) = trailer.pwd.take().filter(|p| p.len() < 4096) {
            kept.pwd = Some(p);
        }
    }
    let event = match outcome {
        None => ServerStreamEvent::exit_error(-1, vec!["interrupted".into()]),
        Some(Err(e)) => ServerStreamEvent::start_error(format!("the command could not start: {e}")),
        Some(Ok(r)) if r.timed_out => ServerStreamEvent::timeout_error(-1, timeout),
        Some(Ok(r)) => match r.status {
            ExitStatus::Code(0) => ServerStreamEvent::execution_complete(started.elapsed()),
            ExitStatus::Code(c) => {
                ServerStreamEvent::exit_error(c, vec![format!("command exited with code {c}")])
            }
            ExitStatus::Signal(s) => {
                ServerStreamEvent::exit_error(-1, vec![format!("killed by signal {s}")])
            }
        },
    };
    send(event);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trailer_is_taken_out_and_read_back() {
        let mut t = Trailer::new("n1".into());
        let mut lines =
            t.push(b"hello\nSBX-ENV-n1 is not a marker\n\nSBX-ENV-n1\nA=1\0B=two\nlines\0");
        lines.extend(t.push(b"PS1=x\0\nSBX-END-n1\nSBX-PWD-n1/workspace/sub\n"));
        assert_eq!(lines, ["hello", "SBX-ENV-n1 is not a marker", ""]);
        let env = t.variables().unwrap();
        assert_eq!(env.get("A").map(String::as_str), Some("1"));
        assert_eq!(env.get("B").map(String::as_str), Some("two\nlines"));
        assert!(!env.contains_key("PS1"));
        assert_eq!(t.pwd.as_deref(), Some("/workspace/sub"));
        assert_eq!(quote("it's"), r#"'it'"'"'s'"#);
    }
}
