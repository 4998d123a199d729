//! The in-sandbox agent of sessionbox: serves the OpenSandbox **execd** HTTP API for one
//! workspace, over a Unix socket or TCP.
//!
//! One protocol serves every runtime: our own `isolated` runtime talks to this agent over a Unix
//! socket with `sessionbox_execd::ExecdClient`, and the official OpenSandbox SDK talks to it over
//! HTTP as it would to upstream execd. Paths, headers, bodies and stream events come from
//! [`sessionbox_execd`] (`wire`, `types`), so client and server cannot drift apart.
//!
//! What the agent enforces:
//!
//! - **Confinement.** Every file operation and every command's working directory goes through
//!   [`sessionbox_fs::Workspace`]: the workspace path policy, then `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_MAGICLINKS)` beneath a descriptor of the root. `..`, absolute paths outside the
//!   root and links that lead out are refused; nothing is ever created outside. A leading `~`
//!   is the root (commands' `HOME`), as upstream's `~` is execd's home; `$NAME` is taken
//!   literally (upstream expands it, so a literal `$` fails there). Permission and ownership
//!   changes act on a descriptor of the inode found beneath the root; setuid, setgid and sticky
//!   bits are refused.
//! - **`/proxy/{port}/...`**: a reverse proxy to `127.0.0.1:{port}` inside the sandbox, behind
//!   the token check; execd's port 44772 and the agent's own port are served by the agent.
//! - **Processes.** Every command runs through [`sessionbox_process::run`]: `/bin/sh -c` in
//!   a new session (its own process group), `fchdir` into a directory descriptor, the base
//!   environment plus the request's `envs` (nothing of the agent's own environment, so never the
//!   access token), inherited descriptors closed, output capped while it streams. The group is
//!   killed on timeout, on interrupt, when a foreground client disconnects, and when the shell
//!   exits.
//! - **Access token.** When configured, every request must carry `X-EXECD-ACCESS-TOKEN`; it is
//!   compared in constant time ([`AccessToken::matches`]) and never echoed. A missing or wrong
//!   token gets 401 with upstream's body `{"error": "..."}`.
//! - **Bounded requests.** JSON bodies and uploads have size limits (413 with an
//!   `ErrorResponse` past them); malformed bodies are 400 and change nothing.
//!
//! ```no_run
//! # async fn demo() -> sessionbox_core::Result<()> {
//! use sessionbox_agent::{AgentConfig, Listen};
//! let mut config = AgentConfig::new("/workspace");
//! config.listen = Listen::Unix("/run/sessionbox/execd.sock".into());
//! sessionbox_agent::serve(config).await
//! # }
//! ```
//!
//! The crate's README lists the endpoints, the sessionbox extensions to the protocol, and what
//! is not supported.

mod archive;
mod background;
mod bash_session;
mod cli;
mod commands;
mod confine;
pub use confine::confined_exec;
mod egress_relay;
pub mod egress_sidecar;
mod files;
mod framing;
mod fs_ext;
mod init;
mod metrics;
mod proxy;
mod pty;
mod server;
mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

pub use cli::{Cli, run_cli};
pub use egress_relay::EgressRelay;
pub use server::Agent;
pub use sessionbox_core::Limits;
use sessionbox_core::{Error, MAX_OUTPUT_LIMIT, Result};
pub use sessionbox_execd::AccessToken;

pub use sessionbox_execd::agent_args::{
    AgentArgs, DEFAULT_LISTEN, DEFAULT_MAX_TERMINALS, DEFAULT_ROOT,
};
/// Default cap on what is forwarded of each of stdout and stderr per command: 16 MiB.
pub const DEFAULT_OUTPUT_CAP: usize = MAX_OUTPUT_LIMIT;
/// Default limit on a JSON request body: 8 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 8 * 1024 * 1024;
/// How many finished commands are remembered for status and logs (oldest forgotten first).
pub const DEFAULT_MAX_FINISHED_COMMANDS: usize = 1024;

/// Where the agent listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A TCP address (`tcp:HOST:PORT`); port 0 picks a free one ([`Agent::local_addr`] tells).
    Tcp(SocketAddr),
    /// A Unix socket path (`unix:/path`). A stale socket there is replaced; any other file is
    /// an error. The socket is made `0600`.
    Unix(PathBuf),
    /// An already bound, listening Unix socket inherited as this descriptor (socket
    /// activation). The agent takes ownership of it.
    Fd(RawFd),
}

impl Listen {
    /// Reads `unix:/path`, `tcp:HOST:PORT` (or a bare `HOST:PORT`), or `fd:N`.
    ///
    /// ```
    /// use sessionbox_agent::Listen;
    /// assert_eq!(Listen::parse("unix:/run/a.sock").unwrap(), Listen::Unix("/run/a.sock".into()));
    /// assert!(matches!(Listen::parse("tcp:127.0.0.1:0").unwrap(), Listen::Tcp(_)));
    /// assert!(Listen::parse("udp:1").is_err());
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the accepted forms.
    pub fn parse(s: &str) -> Result<Listen> {
        let bad = || {
            Error::InvalidRequest(format!(
                "cannot read listen address {s:?}: expected unix:/PATH, tcp:HOST:PORT or fd:N"
            ))
        };
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(bad());
            }
            return Ok(Listen::Unix(PathBuf::from(p)));
        }
        if let Some(n) = s.strip_prefix("fd:") {
            return n.parse().map(Listen::Fd).map_err(|_| bad());
        }
        let addr = s.strip_prefix("tcp:").unwrap_or(s);
        addr.parse().map(Listen::Tcp).map_err(|_| bad())
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Tcp(a) => write!(f, "tcp:{a}"),
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
            Listen::Fd(n) => write!(f, "fd:{n}"),
        }
    }
}

/// Everything the agent needs; [`AgentConfig::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Where to listen ([`DEFAULT_LISTEN`]).
    pub listen: Listen,
    /// The workspace directory. File operations and command working directories are confined to
    /// it; commands see it as `HOME`.
    pub root: PathBuf,
    /// The root as callers name it (absolute paths must lie inside it). `None`: `root` itself,
    /// made absolute.
    pub presented_root: Option<String>,
    /// The access token every request must carry; `None` for no check (upstream's default).
    pub token: Option<AccessToken>,
    /// Exit cleanly after this long with no request in progress and no command running; `None`
    /// never.
    pub idle_timeout: Option<Duration>,
    /// Limits of the file operations (see [`Limits`]).
    pub limits: Limits,
    /// Largest JSON request body, in bytes ([`DEFAULT_MAX_REQUEST_BYTES`]).
    pub max_request_bytes: usize,
    /// Largest `POST /files/upload` body, in bytes (default: `limits.max_file_bytes` + 1 MiB).
    pub max_upload_bytes: usize,
    /// Largest `PUT /sessionbox/v1/archive` body, in bytes (default
    /// [`sessionbox_execd::archive_ext::DEFAULT_MAX_ARCHIVE_BYTES`], 4 GiB).
    pub max_archive_bytes: u64,
    /// Default cap on what is forwarded (foreground) or kept (background logs) of each output
    /// stream, in bytes; a request may ask for less or more with `max_output_bytes`, up to
    /// [`MAX_OUTPUT_LIMIT`] ([`DEFAULT_OUTPUT_CAP`]).
    pub output_cap: usize,
    /// Time between `SIGTERM` and `SIGKILL` when a command's timeout runs out.
    pub kill_grace: Duration,
    /// Finished commands remembered for status and logs ([`DEFAULT_MAX_FINISHED_COMMANDS`]).
    pub max_finished_commands: usize,
    /// The egress relay, when the sandbox may reach the network through a gateway; `None`:
    /// no proxy (and, in a sandbox, no network).
    pub egress_relay: Option<EgressRelay>,
    /// Most terminals whose shell has not ended, at once ([`DEFAULT_MAX_TERMINALS`]); one more
    /// `POST /pty` is refused with 429.
    pub max_terminals: usize,
}

impl AgentConfig {
    /// The defaults, serving `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let limits = Limits::default();
        AgentConfig {
            listen: Listen::parse(DEFAULT_LISTEN).expect("the default listen address parses"),
            root: root.into(),
            presented_root: None,
            token: None,
            idle_timeout: None,
            limits,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_upload_bytes: usize::try_from(limits.max_file_bytes)
                .unwrap_or(usize::MAX)
                .saturating_add(1024 * 1024),
            max_archive_bytes: sessionbox_execd::archive_ext::DEFAULT_MAX_ARCHIVE_BYTES,
            output_cap: DEFAULT_OUTPUT_CAP,
            kill_grace: sessionbox_process::DEFAULT_KILL_GRACE,
            max_finished_commands: DEFAULT_MAX_FINISHED_COMMANDS,
            egress_relay: None,
            max_terminals: DEFAULT_MAX_TERMINALS,
        }
    }

    /// The presented root: [`AgentConfig::presented_root`], or `root` made absolute and
    /// normalised lexically.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when the root cannot be made absolute or is not valid UTF-8.
    pub fn effective_presented_root(&self) -> Result<String> {
        if let Some(p) = &self.presented_root {
            return Ok(p.clone());
        }
        let abs = std::path::absolute(&self.root).map_err(|e| {
            Error::InvalidRequest(format!(
                "cannot make the workspace root {} absolute: {e}",
                self.root.display()
            ))
        })?;
        let mut out = PathBuf::from("/");
        for c in abs.components() {
            match c {
                Component::Normal(n) => out.push(n),
                Component::ParentDir => {
                    out.pop();
                }
                _ => {}
            }
        }
        out.to_str().map(str::to_owned).ok_or_else(|| {
            Error::InvalidRequest(format!(
                "the workspace root {} is not valid UTF-8",
                Path::new(&out).display()
            ))
        })
    }
}

/// Binds the listener and serves until SIGTERM or SIGINT, or the idle timeout. Commands still
/// running then are killed (their process groups) before this returns.
///
/// # Errors
/// The workspace root cannot be opened (missing, not a directory, no `openat2`), or the
/// address cannot be bound.
pub async fn serve(config: AgentConfig) -> Result<()> {
    let agent = Agent::bind(config).await?;
    agent.run(termination_signal()).await
}

/// Like [`serve`], stopping when `shutdown` completes instead of on signals.
///
/// # Errors
/// As [`serve`].
pub async fn serve_with_shutdown(
    config: AgentConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    Agent::bind(config).await?.run(shutdown).await
}

/// Completes on SIGTERM or SIGINT (never, if the handlers cannot be installed).
pub async fn termination_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = i.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}
