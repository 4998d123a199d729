//! sessionbox's HTTP API: REST under `/v1`, API keys and tenants, per-conversation ordering.
//!
//! [`router`] builds the axum application over a [`Manager`]; [`serve`] runs it on a listener
//! (plain TCP, or [`tls::TlsListener`] with a certificate reloaded while it runs) until a
//! shutdown signal; [`check_listen`] refuses to expose a server without keys and
//! [`check_transport`] one without TLS;
//! [`openapi`] is the OpenAPI 3.1 document (served at `/v1/openapi.json`), generated from the
//! handlers' annotations. Routes and shapes: the crate's README.
//!
//! - Every request but `/healthz` and `/readyz` carries an API key (`Authorization: Bearer KEY`
//!   or `X-API-Key: KEY`), which names its tenant: a key reaches only its tenant's conversations,
//!   so two tenants can use one conversation id apart. A loopback server with no valid key in the
//!   store runs *open*, as [`ServerConfig::open_tenant`]; creating the first key closes it.
//! - Operations on one conversation run one at a time in arrival order; different conversations
//!   run in parallel; more than [`ServerConfig::max_queue`] requests for one conversation get
//!   429.
//! - Command output is budgeted: each command reserves twice its `output_limit` until it ends,
//!   counted per tenant and in total ([`ServerConfig::max_output_bytes_per_tenant`],
//!   [`ServerConfig::max_output_bytes_total`]); past a limit new work gets 429 naming it.
//! - An MCP session id belongs to the tenant whose key opened it: another tenant's key gets 404
//!   for it; a tenant has at most [`ServerConfig::max_mcp_sessions_per_tenant`] open.
//! - Errors are `{"code", "message"}` with the [`sessionbox_core::Error::code`] (plus
//!   `unauthorized`, `busy`, `range_not_satisfiable`, `not_ready`): bad input is 400, 403, 404,
//!   409, 413 or 422, never 5xx.
//! - `POST .../exec` answers JSON, an event stream (`Accept: text/event-stream`: `stdout`,
//!   `stderr` and `exit` events as the command runs), or, with `"background": true`, 202 and a
//!   command id for `.../commands/{cmd}` (status, logs from an offset, kill). Background
//!   commands do not hold the conversation's turn and end when it is destroyed.
//! - `POST .../files` takes a multipart upload of several files; `GET /metrics` serves
//!   Prometheus metrics (with a key, like every route but `/healthz` and `/readyz`).
//! - Network policies (`/v1/policy`, `.../policy`) and the egress log are read and written
//!   over REST for the key's tenant; MCP only reads them (the `network` tool): no MCP tool
//!   changes a policy.
//! - Every call is audited twice: by the [`Manager`] per operation, and here as one `http.*`
//!   record with the key id, the status and the duration (never bodies, commands or keys).
//!
//! Architecture invariant: only this crate knows the HTTP and MCP wire formats of the
//! public API; it reaches conversations only through the [`Manager`].

mod audit;
mod auth;
mod budget;
mod commands;
mod connections;
mod conversation;
mod error;
mod extract;
mod mcp;
mod metrics;
mod openapi;
mod output;
mod policy;
mod queue;
mod relay;
mod routes;
mod running;
mod scope;
mod sessions;
mod skills;
pub mod tls;
mod views;

use std::future::Future;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::Arc;

use sessionbox_core::{Error, Result, TenantId};
use sessionbox_manager::Manager;

pub use auth::Principal;
pub use commands::{MAX_WAITERS, MAX_WAITERS_PER_CONVERSATION};
pub use error::{ApiError, status_of};
pub use mcp::serve_stdio;
pub use openapi::openapi;
pub use routes::doctor::{DOCTOR_MAX_AGE, DoctorProbe, DoctorReport};
pub use routes::router;

/// Settings of the server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest JSON request body, in bytes (default 8 MiB; exec stdin travels in it).
    pub max_json_bytes: usize,
    /// Largest file body of `PUT .../files/{path}`, and largest whole multipart body of
    /// `POST .../files`, in bytes (default 64 MiB).
    pub max_file_bytes: usize,
    /// Most requests holding or waiting for one conversation before 429 (default 64).
    pub max_queue: usize,
    /// Most conversation sessions kept open between requests (default 1024; 0 opens and
    /// closes one per request). A kept session spares a request the store's open transaction
    /// and the runtime's open.
    pub max_open_sessions: usize,
    /// The tenant of requests without a key while no valid key exists; `None` requires a key
    /// always. Only for loopback listeners (see [`check_listen`]).
    pub open_tenant: Option<TenantId>,
    /// Most bytes of command output one tenant's running commands and requests may have
    /// reserved at once, in bytes (default [`DEFAULT_MAX_OUTPUT_BYTES_PER_TENANT`], 256 MiB).
    /// A command reserves twice its `output_limit` (stdout and stderr) until it ends; past the
    /// limit new work is refused with 429 `busy` naming it.
    pub max_output_bytes_per_tenant: u64,
    /// Most bytes of command output all tenants together may have reserved at once, in bytes
    /// (default [`DEFAULT_MAX_OUTPUT_BYTES_TOTAL`], 1 GiB); past it, 429 `busy` naming it.
    pub max_output_bytes_total: u64,
    /// Most MCP sessions (`Mcp-Session-Id`) one tenant may have open at once (default
    /// [`DEFAULT_MAX_MCP_SESSIONS_PER_TENANT`]); one more `initialize` is refused with 429
    /// `busy`. A session ends with its DELETE or after rmcp's keep-alive (5 minutes idle).
    pub max_mcp_sessions_per_tenant: usize,
    /// The key that signs preview links (`POST .../previews`); `None` refuses to issue them
    /// (the key-authenticated `.../ports/{port}/...` route works without it). Replicas that
    /// should honour each other's links share the key.
    pub preview_key: Option<sessionbox_egress::token::TokenKey>,
    /// Most requests and tunnels relayed to one conversation's agent at once (previews,
    /// terminals, watches; default [`DEFAULT_MAX_RELAYS_PER_CONVERSATION`]); one more is
    /// refused with 429 `busy`.
    pub max_relays_per_conversation: usize,
    /// Most connections open at once (default [`DEFAULT_MAX_CONNECTIONS`]); one more is closed
    /// as soon as it is accepted.
    pub max_connections: usize,
    /// Most connections open at once from one IP address (default
    /// [`DEFAULT_MAX_CONNECTIONS_PER_SOURCE`]); behind a reverse proxy every client shares the
    /// proxy's address, so set it to `max_connections` there.
    pub max_connections_per_source: usize,
    /// How long a request's head (request line and headers) may take to arrive, from the
    /// connection's start or the previous response (default 15 s).
    pub header_read_timeout: std::time::Duration,
    /// Origins (`scheme://host[:port]`) whose pages may call the API from a browser (CORS);
    /// empty, the default, allows none: a browser then refuses to hand any page a response.
    /// Check them with [`check_cors_origin`].
    pub cors_origins: Vec<String>,
}

/// Checks one CORS origin as a browser sends it in `Origin`: `http` or `https`, a host, an
/// optional port, nothing else (no path, no trailing slash, no `*`).
///
/// # Errors
/// [`sessionbox_core::Error::InvalidRequest`] saying what is wrong.
pub fn check_cors_origin(origin: &str) -> sessionbox_core::Result<()> {
    let bad = |why: &str| {
        sessionbox_core::Error::InvalidRequest(format!(
            "the CORS origin {origin:?} {why}: give scheme://host[:port], as a browser sends it \
             in Origin (for example https://app.example.com)"
        ))
    };
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .ok_or_else(|| bad("is not http or https"))?;
    if rest.is_empty()
        || !rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
    {
        return Err(bad("has more than a host and a port"));
    }
    axum::http::HeaderValue::from_str(origin).map_err(|_| bad("is not a header value"))?;
    Ok(())
}

/// Default of [`ServerConfig::max_connections`]: 4096.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default of [`ServerConfig::max_connections_per_source`]: 1024, a quarter of the total.
pub const DEFAULT_MAX_CONNECTIONS_PER_SOURCE: usize = 1024;

/// Default of [`ServerConfig::max_relays_per_conversation`]: 32 (a browser opens about six
/// connections per host; a few tabs of a preview and a few terminals fit).
pub const DEFAULT_MAX_RELAYS_PER_CONVERSATION: usize = 32;

/// Default of [`ServerConfig::max_output_bytes_per_tenant`]: 256 MiB, room for 8 commands at
/// the largest `output_limit` (16 MiB, so 32 MiB each) or 128 at the default (1 MiB).
pub const DEFAULT_MAX_OUTPUT_BYTES_PER_TENANT: u64 = 256 * 1024 * 1024;
/// Default of [`ServerConfig::max_output_bytes_total`]: 1 GiB, four tenants at their limit.
pub const DEFAULT_MAX_OUTPUT_BYTES_TOTAL: u64 = 1024 * 1024 * 1024;
/// Default of [`ServerConfig::max_mcp_sessions_per_tenant`]: 256 (an idle session costs little,
/// but a key should not be able to open them without bound).
pub const DEFAULT_MAX_MCP_SESSIONS_PER_TENANT: usize = 256;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_json_bytes: 8 * 1024 * 1024,
            max_file_bytes: 64 * 1024 * 1024,
            max_queue: 64,
            max_open_sessions: 1024,
            open_tenant: None,
            max_output_bytes_per_tenant: DEFAULT_MAX_OUTPUT_BYTES_PER_TENANT,
            max_output_bytes_total: DEFAULT_MAX_OUTPUT_BYTES_TOTAL,
            max_mcp_sessions_per_tenant: DEFAULT_MAX_MCP_SESSIONS_PER_TENANT,
            preview_key: None,
            max_relays_per_conversation: DEFAULT_MAX_RELAYS_PER_CONVERSATION,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_source: DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
            header_read_timeout: std::time::Duration::from_secs(15),
            cors_origins: Vec::new(),
        }
    }
}

/// The shared state of the handlers: a cheap handle on one [`SharedState`].
#[derive(Debug, Clone)]
pub struct AppState(Arc<SharedState>);

/// What every handler of one server shares: the manager, the settings, and the server's own
/// bookkeeping (queues, kept sessions, background commands, audit writer, metrics).
pub struct SharedState {
    /// The manager every operation goes through.
    pub manager: Manager,
    /// The server's settings.
    pub config: ServerConfig,
    queues: Arc<queue::Queues>,
    commands: Arc<commands::Commands>,
    waiters: Arc<commands::Waiters>,
    budget: Arc<budget::OutputBudget>,
    mcp_sessions: Arc<mcp::Owners>,
    sessions: Arc<sessions::Sessions>,
    running: Arc<running::Running>,
    relays: Arc<relay::Relays>,
    audit: audit::AuditWriter,
    metrics: metrics::Metrics,
    /// Terminal tickets used, by nonce, with their expiry (seconds since the epoch): a ticket
    /// opens one terminal.
    tickets: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// The last garbage collection `serve` ran.
    last_gc: std::sync::Mutex<Option<routes::account::GcSummary>>,
    /// `sessionbox doctor`, when the front end gave a way to run it.
    doctor: routes::doctor::Doctor,
}

impl std::fmt::Debug for SharedState {
    /// The manager and the settings; the server's bookkeeping is left out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedState")
            .field("manager", &self.manager)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Deref for AppState {
    type Target = SharedState;
    fn deref(&self) -> &SharedState {
        &self.0
    }
}

impl AppState {
    /// State over `manager` with `config`. Starts the audit writer of `http.*` records on the
    /// current Tokio runtime, so it must be called within one.
    pub fn new(manager: Manager, config: ServerConfig) -> Self {
        AppState(Arc::new(SharedState {
            queues: Arc::default(),
            commands: Arc::default(),
            waiters: Arc::default(),
            budget: Arc::new(budget::OutputBudget::new(
                config.max_output_bytes_per_tenant,
                config.max_output_bytes_total,
            )),
            mcp_sessions: Arc::new(mcp::Owners::new(config.max_mcp_sessions_per_tenant)),
            sessions: Arc::new(sessions::Sessions::new(config.max_open_sessions)),
            running: Arc::default(),
            relays: Arc::new(relay::Relays::new(config.max_relays_per_conversation)),
            audit: audit::AuditWriter::start(manager.store().clone()),
            metrics: metrics::Metrics::new(),
            tickets: std::sync::Mutex::default(),
            last_gc: std::sync::Mutex::default(),
            doctor: routes::doctor::Doctor::default(),
            manager,
            config,
        }))
    }

    /// Gives the server a way to run `sessionbox doctor`'s checks, for
    /// `GET /v1/installation/doctor` (which answers `available: false` without one). Returns
    /// false, changing nothing, when one was given already.
    pub fn set_doctor(&self, probe: DoctorProbe) -> bool {
        self.doctor.set(probe)
    }

    /// Records the result of a garbage collection `serve` ran, for `GET /v1/installation`.
    pub fn record_gc(&self, result: &Result<sessionbox_manager::GcReport>) {
        let summary = match result {
            Ok(r) => routes::account::GcSummary {
                at: self.manager.store().now(),
                expired: r.expired.len(),
                stuck: r.stuck.len(),
                orphans: r.orphans.len(),
                dangling: r.dangling.len(),
                idle_stopped: r.idle_stopped.len(),
                snapshots_expired: r.snapshots_expired.len(),
                error: None,
            },
            Err(e) => routes::account::GcSummary {
                at: self.manager.store().now(),
                expired: 0,
                stuck: 0,
                orphans: 0,
                dangling: 0,
                idle_stopped: 0,
                snapshots_expired: 0,
                error: Some(e.to_string()),
            },
        };
        *self.last_gc.lock().unwrap_or_else(|e| e.into_inner()) = Some(summary);
    }

    /// The last garbage collection recorded.
    pub(crate) fn last_gc(&self) -> Option<routes::account::GcSummary> {
        self.last_gc
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Marks the terminal ticket `nonce` (valid until `expires`) used; false when it was
    /// already. Forgets tickets past their expiry, so the set holds at most a minute's.
    pub(crate) fn use_ticket(&self, nonce: &str, expires: u64, now: u64) -> bool {
        let mut used = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        used.retain(|_, e| *e > now);
        if used.len() >= 100_000 {
            // A minute's worth of tickets beyond any real use: refuse rather than grow.
            return false;
        }
        used.insert(nonce.to_owned(), expires).is_none()
    }

    /// Waits until every `http.*` audit record of the requests answered so far is written.
    /// [`serve`] does this when it stops.
    pub async fn flush_audit(&self) {
        self.audit.flush().await;
    }

    /// Conversation sessions kept open between requests now.
    pub fn open_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Conversations with requests in flight now.
    pub fn busy_conversations(&self) -> usize {
        self.queues.busy()
    }

    /// Background commands running now, in every conversation.
    pub fn background_commands_running(&self) -> usize {
        self.commands.running()
    }

    /// Bytes of command output reserved now by `tenant`'s running commands and requests (see
    /// [`ServerConfig::max_output_bytes_per_tenant`]).
    pub fn output_bytes_reserved_by(&self, tenant: &TenantId) -> u64 {
        self.budget.reserved_by(tenant)
    }

    /// Bytes of command output reserved now in the whole server.
    pub fn output_bytes_reserved(&self) -> u64 {
        self.budget.reserved()
    }

    /// MCP sessions open now for `tenant`, as far as this server knows.
    pub fn mcp_sessions_of(&self, tenant: &TenantId) -> usize {
        self.mcp_sessions.count(tenant)
    }
}

/// Refuses a listen address that is not loopback unless the store holds a valid API key.
///
/// # Errors
/// [`Error::InvalidRequest`] saying that a key must exist first (front ends add how to make
/// one); [`Error::Backend`] from the store.
pub fn check_listen(addr: &SocketAddr, store: &sessionbox_store::Store) -> Result<()> {
    if addr.ip().is_loopback() || store.has_api_keys()? {
        return Ok(());
    }
    Err(Error::InvalidRequest(format!(
        "refusing to listen on {addr}, which is not a loopback address, while no API key \
         exists; create an API key first"
    )))
}

/// Refuses a listen address that is not loopback when the server would speak plain HTTP
/// (`tls` false) unless `insecure_plain_http` says that is wanted (TLS is terminated in front
/// of it, say): API keys and workspace contents would cross the network in the clear.
///
/// # Errors
/// [`Error::InvalidRequest`] naming both ways out: a certificate and key, or the explicit
/// opt-out (front ends name their flags).
pub fn check_transport(addr: &SocketAddr, tls: bool, insecure_plain_http: bool) -> Result<()> {
    if tls || insecure_plain_http || addr.ip().is_loopback() {
        return Ok(());
    }
    Err(Error::InvalidRequest(format!(
        "refusing to serve plain HTTP on {addr}, which is not a loopback address: API keys \
         would cross the network in the clear; give a TLS certificate and key \
         (--tls-cert FILE --tls-key FILE, or [serve] tls_cert and tls_key), or, when TLS ends \
         in front of this server, say so with --insecure-plain-http ([serve] \
         insecure_plain_http = true)"
    )))
}

/// Serves `state` on `listener` (a [`tokio::net::TcpListener`], or a [`tls::TlsListener`])
/// until `shutdown` completes, then finishes the requests in flight. Connections are capped
/// in all and per source address, and a request's head must arrive within
/// [`ServerConfig::header_read_timeout`] (see the `connections` module).
///
/// # Errors
/// None today: accept errors are logged and retried; the `Result` keeps room for listener
/// failures.
pub async fn serve<L>(
    listener: L,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener<Addr = std::net::SocketAddr>,
{
    let caps = connections::Caps::new(
        state.config.max_connections,
        state.config.max_connections_per_source,
    );
    connections::serve(
        listener,
        router(state.clone()),
        caps,
        state.config.header_read_timeout,
        shutdown,
    )
    .await;
    state.flush_audit().await;
    Ok(())
}
