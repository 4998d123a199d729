//! The HTTP server: listener, router, access-token check, activity tracking, errors and bodies.

use std::future::Future;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::de::DeserializeOwned;
use sessionbox_core::{Error, Result};
use sessionbox_execd::wire::{self, error_code};
use sessionbox_execd::{AccessToken, ErrorResponse};
use sessionbox_fs::Workspace;

use crate::commands::Registry;
use crate::metrics::CpuSampler;
use crate::{AgentConfig, Listen, commands, files, metrics};

/// How long [`Agent::run`] waits for killed commands to be reaped before returning.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// Shared by every handler.
pub(crate) struct AppState {
    /// The workspace, by descriptor.
    pub ws: Arc<Workspace>,
    /// The root as callers and commands see it (`HOME` of commands).
    pub presented_root: String,
    /// The access token, when one is required.
    pub token: Option<AccessToken>,
    /// Limits and defaults.
    pub config: AgentConfig,
    /// Running and finished commands.
    pub commands: Registry,
    /// Requests in progress and the time of the last activity, for the idle timeout.
    pub activity: Activity,
    /// CPU use between two `GET /metrics`.
    pub cpu: CpuSampler,
    /// Interactive terminals (`/pty`).
    pub terminals: crate::pty::Terminals,
    /// Bash sessions (`/session`).
    pub bash_sessions: crate::bash_session::BashSessions,
    /// Open watches (`/sessionbox/v1/watch`).
    pub watches: crate::watch::Watches,
}

/// Requests in progress and the last time anything happened.
pub(crate) struct Activity {
    in_flight: AtomicUsize,
    last: Mutex<Instant>,
}

impl Activity {
    fn new() -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            last: Mutex::new(Instant::now()),
        }
    }

    /// Records that something happened now.
    pub(crate) fn touch(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }
}

/// A bound agent, ready to [`run`](Agent::run).
pub struct Agent {
    /// The egress relay's listener and the gateway socket it relays to.
    relay: Option<(tokio::net::TcpListener, PathBuf)>,
    listener: AnyListener,
    state: Arc<AppState>,
    local_addr: String,
    socket_path: Option<PathBuf>,
}

enum AnyListener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("local_addr", &self.local_addr)
            .field("root", &self.state.presented_root)
            .field("token", &self.state.token)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Opens the workspace and binds the listener (nothing is served yet).
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::Conflict`] or [`Error::RuntimeUnavailable`] from opening
    /// the workspace; [`Error::InvalidRequest`] for an empty token or a bad configuration;
    /// [`Error::Backend`] when the address cannot be bound.
    pub async fn bind(config: AgentConfig) -> Result<Agent> {
        let presented_root = config.effective_presented_root()?;
        if config.token.as_ref().is_some_and(|t| t.expose().is_empty()) {
            return Err(Error::InvalidRequest(
                "the access token is empty; give a non-empty token or none".into(),
            ));
        }
        if config.output_cap == 0 || config.output_cap > sessionbox_core::MAX_OUTPUT_LIMIT {
            return Err(Error::InvalidRequest(format!(
                "the output cap must be between 1 and {} bytes",
                sessionbox_core::MAX_OUTPUT_LIMIT
            )));
        }
        // `~` is the root, as for upstream execd (commands get `HOME` = the root).
        let ws =
            Workspace::open(&config.root, &presented_root, config.limits)?.with_home_expansion();
        let (listener, local_addr, socket_path) = bind_listener(&config.listen)?;
        let relay = match &config.egress_relay {
            Some(r) => {
                let l = std::net::TcpListener::bind(r.listen).map_err(|e| {
                    Error::Backend(format!(
                        "cannot listen for the egress relay on {}: {e}",
                        r.listen
                    ))
                })?;
                l.set_nonblocking(true).map_err(Error::backend)?;
                Some((
                    tokio::net::TcpListener::from_std(l).map_err(Error::backend)?,
                    r.socket.clone(),
                ))
            }
            None => None,
        };
        let state = Arc::new(AppState {
            ws: Arc::new(ws),
            presented_root,
            token: config.token.clone(),
            commands: Registry::new(config.max_finished_commands),
            activity: Activity::new(),
            cpu: CpuSampler::new(),
            terminals: crate::pty::Terminals::new(config.max_terminals),
            bash_sessions: crate::bash_session::BashSessions::new(),
            watches: crate::watch::Watches::default(),
            config,
        });
        Ok(Agent {
            relay,
            listener,
            state,
            local_addr,
            socket_path,
        })
    }

    /// Where the agent listens: `tcp:HOST:PORT` (the real port when 0 was asked for) or
    /// `unix:PATH` (`unix:` alone for an inherited socket without a path).
    pub fn local_addr(&self) -> &str {
        &self.local_addr
    }

    /// Serves until `shutdown` completes or the idle timeout passes. Then stops accepting, kills
    /// every running command's process group (foreground streams end with their terminal
    /// event), waits for in-flight requests, and removes the Unix socket it created.
    ///
    /// # Errors
    /// [`Error::Backend`] when serving fails.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        let Agent {
            relay,
            listener,
            state,
            local_addr,
            socket_path,
        } = self;
        tracing::info!(listen = %local_addr, root = %state.presented_root, "sessionbox-agent serving");
        let own_port = local_addr
            .strip_prefix("tcp:")
            .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
            .map(|a| a.port());
        let app = router(state.clone(), own_port);
        let relay = relay.map(|(l, socket)| tokio::spawn(crate::egress_relay::run(l, socket)));
        let stopper = state.clone();
        let stop = async move {
            tokio::select! {
                _ = shutdown => tracing::info!("shutting down"),
                _ = idle_watch(stopper.clone()) => tracing::info!("idle timeout reached; shutting down"),
            }
            stopper.commands.cancel_all("the agent is shutting down");
            stopper.terminals.kill_all();
            stopper.bash_sessions.cancel_all();
            stopper.watches.stop_all();
        };
        let served = match listener {
            AnyListener::Tcp(l) => {
                // Small writes (a command's events) go out at once: with Nagle, each waited
                // for the client's delayed acknowledgement (about 40 ms per exec).
                use axum::serve::ListenerExt;
                let l = l.tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                });
                axum::serve(l, app).with_graceful_shutdown(stop).await
            }
            AnyListener::Unix(l) => axum::serve(l, app).with_graceful_shutdown(stop).await,
        };
        state.commands.cancel_all("the agent is shutting down");
        state.terminals.kill_all();
        state.commands.wait_all(SHUTDOWN_WAIT).await;
        if let Some(r) = relay {
            r.abort();
        }
        if let Some(p) = socket_path {
            let _ = std::fs::remove_file(p);
        }
        served.map_err(|e| Error::Backend(format!("serving {local_addr} failed: {e}")))
    }
}

fn bind_listener(listen: &Listen) -> Result<(AnyListener, String, Option<PathBuf>)> {
    let fail = |what: &str, e: std::io::Error| Error::Backend(format!("cannot {what}: {e}"));
    match listen {
        Listen::Tcp(addr) => {
            let l = std::net::TcpListener::bind(addr)
                .map_err(|e| fail(&format!("listen on tcp:{addr}"), e))?;
            l.set_nonblocking(true)
                .map_err(|e| fail("set the socket non-blocking", e))?;
            let local = l
                .local_addr()
                .map_err(|e| fail("read the bound address", e))?;
            let l = tokio::net::TcpListener::from_std(l)
                .map_err(|e| fail("register the listener", e))?;
            Ok((AnyListener::Tcp(l), format!("tcp:{local}"), None))
        }
        Listen::Unix(path) => {
            match std::fs::symlink_metadata(path) {
                Ok(m) if m.file_type().is_socket() => {
                    std::fs::remove_file(path).map_err(|e| {
                        fail(&format!("remove the stale socket {}", path.display()), e)
                    })?;
                }
                Ok(_) => {
                    return Err(Error::Conflict(format!(
                        "{} exists and is not a socket; remove it or choose another path",
                        path.display()
                    )));
                }
                Err(_) => {}
            }
            let l = std::os::unix::net::UnixListener::bind(path)
                .map_err(|e| fail(&format!("listen on unix:{}", path.display()), e))?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| fail("make the socket 0600", e))?;
            l.set_nonblocking(true)
                .map_err(|e| fail("set the socket non-blocking", e))?;
            let l = tokio::net::UnixListener::from_std(l)
                .map_err(|e| fail("register the listener", e))?;
            Ok((
                AnyListener::Unix(l),
                format!("unix:{}", path.display()),
                Some(path.clone()),
            ))
        }
        Listen::Fd(fd) => {
            if *fd < 3 {
                return Err(Error::InvalidRequest(format!(
                    "--listen-fd {fd} is a standard stream, not an inherited socket"
                )));
            }
            // SAFETY: the caller hands this descriptor over (socket activation); nothing else in
            // this process uses it. We check it is a listening Unix stream socket before use.
            let owned = unsafe { OwnedFd::from_raw_fd(*fd) };
            let addr = rustix::net::getsockname(&owned).map_err(|e| {
                Error::InvalidRequest(format!("descriptor {fd} is not a socket: {e}"))
            })?;
            if addr.address_family() != rustix::net::AddressFamily::UNIX {
                return Err(Error::InvalidRequest(format!(
                    "descriptor {fd} is not a Unix socket"
                )));
            }
            let accepting = rustix::net::sockopt::socket_acceptconn(&owned).unwrap_or(false);
            if !accepting {
                return Err(Error::InvalidRequest(format!(
                    "descriptor {fd} is not a listening socket"
                )));
            }
            rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)
                .map_err(|e| Error::Backend(format!("cannot mark descriptor {fd} CLOEXEC: {e}")))?;
            let l = std::os::unix::net::UnixListener::from(owned);
            l.set_nonblocking(true)
                .map_err(|e| fail("set the socket non-blocking", e))?;
            let shown = l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
                .unwrap_or_default();
            let l = tokio::net::UnixListener::from_std(l)
                .map_err(|e| fail("register the listener", e))?;
            Ok((AnyListener::Unix(l), format!("unix:{shown}"), None))
        }
    }
}

/// Completes once nothing has happened for the idle timeout (never without one).
async fn idle_watch(state: Arc<AppState>) {
    let Some(limit) = state.config.idle_timeout.filter(|d| !d.is_zero()) else {
        return std::future::pending().await;
    };
    let tick = (limit / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        tokio::time::sleep(tick).await;
        // A terminal whose shell runs with a client attached is activity; so is an open
        // watch (someone waiting for the workspace to change).
        let busy = state.activity.in_flight.load(Ordering::SeqCst) > 0
            || state.commands.running() > 0
            || state.terminals.running() > 0
            || state.bash_sessions.running() > 0
            || state.watches.open() > 0;
        if busy {
            state.activity.touch();
        } else if state.activity.idle_for() >= limit {
            return;
        }
    }
}

/// The agent's routes, with `/proxy/{port}/...` ([`crate::proxy`]) behind the same token check;
/// the proxy serves the agent's own port with a copy of the router without the proxy routes.
fn router(state: Arc<AppState>, own_port: Option<u16>) -> Router {
    let finish = |r: Router<Arc<AppState>>| {
        r.fallback(not_found)
            .layer(middleware::from_fn_with_state(state.clone(), check_token))
            .layer(middleware::from_fn_with_state(
                state.clone(),
                track_activity,
            ))
            .with_state(state.clone())
    };
    let internal = finish(api_routes());
    finish(api_routes().merge(crate::proxy::routes(internal, own_port)))
}

fn api_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(wire::PING, get(ping))
        .route(
            wire::COMMAND,
            post(commands::run_command).delete(commands::interrupt_command),
        )
        .route("/command/status/{id}", get(commands::command_status))
        .route("/command/{id}/logs", get(commands::command_logs))
        .route(wire::FILES_INFO, get(files::info))
        .route(wire::FILES, delete(files::remove_files))
        .route(wire::FILES_MOVE, post(files::move_files))
        .route(wire::FILES_PERMISSIONS, post(files::set_permissions))
        .route(wire::FILES_SEARCH, get(files::search))
        .route(wire::FILES_REPLACE, post(files::replace))
        .route(wire::FILES_UPLOAD, post(files::upload))
        .route(wire::FILES_DOWNLOAD, get(files::download))
        .route(wire::DIRECTORIES_LIST, get(files::list_directory))
        .route(
            wire::DIRECTORIES,
            post(files::make_dirs).delete(files::remove_dirs),
        )
        .route(wire::METRICS, get(metrics::metrics))
        .route(
            sessionbox_execd::memory_ext::MEMORY_PATH,
            get(metrics::memory),
        )
        .route(sessionbox_execd::pty::PTY, post(crate::pty::create))
        .route(
            "/pty/{id}",
            get(crate::pty::status).delete(crate::pty::remove),
        )
        .route("/pty/{id}/ws", get(crate::pty::socket))
        .route(
            sessionbox_execd::bash_session::SESSION,
            post(crate::bash_session::create),
        )
        .route("/session/{id}", delete(crate::bash_session::remove))
        .route("/session/{id}/run", post(crate::bash_session::run))
        .route(sessionbox_execd::fs_ext::FS_PATH, post(crate::fs_ext::fs))
        .route(
            sessionbox_execd::commands_ext::COMMANDS_PATH,
            post(crate::background::spawn).get(crate::background::list),
        )
        .route(
            "/sessionbox/v1/commands/{id}",
            get(crate::background::get).delete(crate::background::kill),
        )
        .route(
            "/sessionbox/v1/commands/{id}/output",
            get(crate::background::output),
        )
        .route(
            "/sessionbox/v1/commands/{id}/stdin",
            post(crate::background::write_stdin).delete(crate::background::close_stdin),
        )
        .route(
            sessionbox_execd::archive_ext::ARCHIVE_PATH,
            get(crate::archive::take).put(crate::archive::restore),
        )
        .route(
            sessionbox_execd::watch_ext::WATCH_PATH,
            get(crate::watch::watch),
        )
}

async fn ping() -> StatusCode {
    StatusCode::OK
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        error_code::NOT_SUPPORTED,
        "no such endpoint; see the sessionbox-agent README for the endpoints served",
    )
}

/// Counts the request as in flight until its response head is ready.
async fn track_activity(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    struct InFlight<'a>(&'a Activity);
    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            self.0.touch();
            self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
    state.activity.in_flight.fetch_add(1, Ordering::SeqCst);
    state.activity.touch();
    let _guard = InFlight(&state.activity);
    next.run(req).await
}

/// Refuses requests without the configured token (401, upstream's body; the presented value
/// is never echoed or logged).
async fn check_token(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(token) = &state.token {
        let ok = req
            .headers()
            .get(wire::ACCESS_TOKEN_HEADER)
            .is_some_and(|v| token.matches(v.as_bytes()));
        if !ok {
            let body = serde_json::json!({
                "error": format!(
                    "Unauthorized: invalid or missing header {}",
                    wire::ACCESS_TOKEN_HEADER
                ),
            });
            return (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
        }
    }
    next.run(req).await
}

/// An error answer: a status and an `ErrorResponse` body.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

/// Extension error codes (upstream has none for these); the status carries the kind too.
pub(crate) mod ext_code {
    /// A path resolves outside the workspace.
    pub(crate) const OUTSIDE_WORKSPACE: &str = "OUTSIDE_WORKSPACE";
    /// The request conflicts with the current state (exists, not a directory, ...).
    pub(crate) const CONFLICT: &str = "CONFLICT";
    /// A body, file or listing is above its limit.
    pub(crate) const TOO_LARGE: &str = "TOO_LARGE";
    /// A deadline passed.
    pub(crate) const TIMED_OUT: &str = "TIMED_OUT";
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400 `INVALID_REQUEST_BODY`.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            error_code::INVALID_REQUEST_BODY,
            message,
        )
    }

    /// 400 `MISSING_QUERY` for a required query parameter.
    pub(crate) fn missing_query(name: &str) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            error_code::MISSING_QUERY,
            format!("missing query parameter '{name}'"),
        )
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, code) = match &e {
            Error::OutsideWorkspace { .. } => {
                (StatusCode::BAD_REQUEST, ext_code::OUTSIDE_WORKSPACE)
            }
            e if e.is_invalid_input() => {
                (StatusCode::BAD_REQUEST, error_code::INVALID_REQUEST_BODY)
            }
            Error::NotFound(_) => (StatusCode::NOT_FOUND, error_code::FILE_NOT_FOUND),
            Error::AlreadyExists(_) | Error::Conflict(_) => {
                (StatusCode::CONFLICT, ext_code::CONFLICT)
            }
            Error::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, ext_code::TOO_LARGE),
            Error::TimedOut(_) => (StatusCode::GATEWAY_TIMEOUT, ext_code::TIMED_OUT),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, error_code::RUNTIME_ERROR),
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(ErrorResponse::new(self.code, self.message)),
        )
            .into_response()
    }
}

/// Reads a whole body of at most `limit` bytes; 413 past it (checked against `Content-Length`
/// first, then while reading, so chunked bodies are bounded too).
pub(crate) async fn read_body(req: Request, limit: usize) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ext_code::TOO_LARGE,
            format!("the request body is too large: the limit is {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match axum::body::to_bytes(req.into_body(), limit).await {
        Ok(b) => Ok(b),
        Err(e) if is_length_limit(&e) => Err(too_large()),
        Err(e) => Err(ApiError::bad_request(format!(
            "could not read the request body: {e}"
        ))),
    }
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Reads a JSON body bounded by the agent's request limit; 400 with the parser's message when
/// it is malformed.
pub(crate) async fn json_body<T: DeserializeOwned>(
    state: &AppState,
    req: Request,
) -> Result<T, ApiError> {
    let bytes = read_body(req, state.config.max_request_bytes).await?;
    parse_json(&bytes)
}

/// Parses JSON; 400 `INVALID_REQUEST_BODY` with upstream's wording and the parser's reason.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "error parsing request, MAYBE invalid body format: {e}"
        ))
    })
}

/// The query string's pairs, decoded (`+` is a space, as browsers and the SDK send it).
pub(crate) fn query_pairs(req: &Request) -> Vec<(String, String)> {
    form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// Every value of `name`.
pub(crate) fn query_all<'a>(pairs: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    pairs
        .iter()
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The first value of `name`.
pub(crate) fn query_one<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Runs blocking file work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            error_code::RUNTIME_ERROR,
            format!("a file operation failed: {e}"),
        )
    })?
}

/// An empty 200, as upstream answers operations without a result.
pub(crate) fn ok_empty() -> Response {
    (StatusCode::OK, Body::empty()).into_response()
}
