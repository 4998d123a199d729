//! The `opensandbox` runtime: one OpenSandbox sandbox (a container) per conversation.
//!
//! Each sandbox runs sessionbox's agent as its execd (the server's `runtime.execd_image` is
//! `sessionbox/execd:local`, see `scripts/opensandbox-up`), and every operation is an execd
//! request straight to the agent at the server's direct endpoint when it is allowlisted and
//! answers, else through the server's proxy (`/v1/sandboxes/{id}/proxy/44772`), made by
//! `sessionbox-execd`'s client: the same protocol, and the same agent, as the `isolated` runtime.
//!
//! State, kept through the [`Directory`] the runtime is given (the store, in production):
//! - the store maps the conversation key to its sandbox id, recorded insert-if-absent: of
//!   concurrent first opens, one sandbox wins and each loser deletes its own sandbox, by id;
//! - the store holds the expiry sessionbox set (the source of truth: OpenSandbox #1200); every
//!   open renews the sandbox to `now + timeout` once half of the timeout has passed;
//! - sandbox metadata carries `sessionbox.managed=true`, `sessionbox.instance=<instance>` and
//!   `sessionbox.conversation=<first 62 hex digits of the key>`: at most 63 characters, as the
//!   real server requires; the full key stays in the store.
//!
//! A sandbox that vanished (expired, deleted elsewhere, failed) is found on the next open and
//! replaced by a fresh one; [`Session::state_lost`] tells the caller that the files are gone.
//!
//! Idle timeout: garbage collection pauses the sandbox of a conversation idle past its idle
//! timeout ([`Runtime::stop_idle`]); the next open resumes it, files intact. A paused sandbox
//! keeps its memory on the server but no CPU, stays in the store's map (so it is neither an
//! orphan nor dangling), and still expires at its `timeout` like a running one. A sandbox with
//! a command or file operation running through this process, or whose agent runs a background
//! command (the agent is asked, `GET /sessionbox/v1/commands`, before each pause), is not
//! paused: [`Runtime::stop_idle`] answers [`Error::Busy`] and [`Runtime::can_stop_idle`]
//! `false`.
//!
//! Network ([`EgressOptions`]): by default a sandbox's network is whatever the server's
//! container network gives it, and sessionbox's policy does not bind it. With
//! [`EgressOptions::network_policy`], each sandbox is created with a `networkPolicy` derived
//! from the conversation's policy in force (an allowlist: only the gateway's host; `none`:
//! nothing), for the server's egress sidecar to enforce; a server that cannot enforce it
//! refuses the create, and the conversation fails with a typed error rather than run open.
//! With [`EgressOptions::gateway`], every command of a conversation whose policy is an
//! allowlist gets `HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY` pointing at the gateway with a token
//! signed for this conversation and policy hash, issued for that command alone and valid for
//! its timeout plus [`TOKEN_MARGIN`]. The token travels only in the command's environment
//! (execd's per-command `envs`): never a log line, an error or the audit.
//!
//! Files: this one holds the configuration, the runtime and its [`Runtime`] implementation;
//! `sandbox.rs` finds, makes, renews, resumes and sweeps the conversation's sandbox on the
//! server; `pool.rs` keeps the warm pool of sandboxes made ahead and binds them to new
//! conversations; `direct.rs` reaches its agent, straight or through the proxy; `session.rs` is the open conversation ([`Session`]) and the count of operations in
//! use that keeps an idle stop away from a busy sandbox.

mod direct;
mod pool;
mod sandbox;
mod session;

pub use self::direct::{AgentPath, DirectMode};
pub use self::pool::LABEL_POOL;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sessionbox_core::{
    CappedSink, ConversationKey, ConversationRef, DestroyReport, DirEntry, Directory, EditRequest,
    EditResult, Error, ExecRequest, ExecResult, ExecSink, FileStat, GrepMatch, GrepRequest,
    PoolSizes, Result, Runtime, RuntimeConversation, RuntimeInfo, Session, WorkspacePath,
};
use sessionbox_egress::Policy;
pub use sessionbox_egress::token::GatewayAccess;
use sessionbox_execd::fs_ext::{FsRequest, FsResponse, FsSession};
use sessionbox_execd::{Endpoint, ExecdClient, ExecdError, RunCommandRequest};

use crate::error::OpenSandboxError;
use crate::lifecycle::{
    ClientConfig, CreateSandbox, EXECD_PORT, ListFilter, OpenSandboxClient, SandboxState,
};
use crate::metadata::Metadata;

use self::session::{InUse, OpenSandboxSession};

/// The runtime's name, in the store and in reports.
pub const RUNTIME_NAME: &str = "opensandbox";
/// The workspace as commands in the sandbox see it.
pub const WORKSPACE: &str = "/workspace";
/// Metadata key marking a sandbox as sessionbox's.
pub const LABEL_MANAGED: &str = "sessionbox.managed";
/// Metadata key naming the sessionbox installation (store) that made a sandbox.
pub const LABEL_INSTANCE: &str = "sessionbox.instance";
/// Metadata key carrying the first 62 hex digits of the conversation key.
pub const LABEL_CONVERSATION: &str = "sessionbox.conversation";
/// The image sandboxes run by default (built by `scripts/opensandbox-up`).
pub const DEFAULT_IMAGE: &str = "sessionbox/sandbox:local";
/// How long an unused sandbox lives by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How long a new sandbox's execd has to answer `/ping` by default.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Metadata key recording the `networkPolicy` a sandbox was created with: `gateway` (only the
/// gateway) or `none` (nothing). Absent when none was sent.
pub const LABEL_NETWORK: &str = "sessionbox.network";
/// How much longer than its command's timeout a proxy token is valid. A command's process
/// group ends with it, so nothing of it needs the token later.
pub const TOKEN_MARGIN: Duration = Duration::from_secs(60);

/// How the runtime's sandboxes reach the network. The default sends no `networkPolicy` and
/// gives commands no proxy: the sandbox's network is the server's, unrestricted by
/// sessionbox.
#[derive(Debug, Clone, Default)]
pub struct EgressOptions {
    /// Create each sandbox with a `networkPolicy` from the conversation's policy in force:
    /// only the gateway (its `HOST:PORT`) for an allowlist, nothing for
    /// `none` or without a gateway. Needs a server with an egress sidecar image: sessionbox's
    /// own (`sessionbox/egress:local`, built by `scripts/opensandbox-up`) enforces it on
    /// connections; upstream's matches bare names only and so blocks the gateway too. A server
    /// without a sidecar image refuses the create, which fails with
    /// [`Error::RuntimeUnavailable`].
    pub network_policy: bool,
    /// The egress gateway: with it, commands of a conversation whose policy is an allowlist
    /// get the proxy variables with a fresh token.
    pub gateway: Option<GatewayAccess>,
}

/// Disk volumes for the sandboxes' `/workspace` and `/tmp`, on the host of the server's Docker
/// engine (which must be the host sessionbox runs on, and whose server allows their directory
/// in `[storage] allowed_host_paths`): the disk quota, enforced by the kernel of that host. The
/// binary gives `sessionbox_local::host_volumes::HostVolumes`; this crate knows only the trait.
pub trait WorkspaceVolumes: Send + Sync + std::fmt::Debug {
    /// Makes and mounts the conversation's volume when needed (idempotent, blocking); returns
    /// the host directories to bind at `/workspace` and at `/tmp`.
    ///
    /// # Errors
    /// When the volume cannot be made or mounted.
    fn prepare(&self, key: &ConversationKey) -> Result<(std::path::PathBuf, std::path::PathBuf)>;
    /// Unmounts and removes the conversation's volume (blocking); true when there was one.
    ///
    /// # Errors
    /// When the unmount or removal fails.
    fn remove(&self, key: &ConversationKey) -> Result<bool>;
    /// What the conversation's volume holds and allows; `None` without one.
    fn usage(&self, key: &ConversationKey) -> Option<sessionbox_core::DiskUsage>;
}

/// Settings of the `opensandbox` runtime.
#[derive(Debug, Clone)]
pub struct OpenSandboxConfig {
    /// The lifecycle client's settings (server, API key, deadlines, proxy, allowlist).
    pub client: ClientConfig,
    /// The image sandboxes run.
    pub image: String,
    /// The sandbox's entry process.
    pub entrypoint: Vec<String>,
    /// How long a sandbox lives after its last use (renewed on use; at least 60 s).
    pub timeout: Duration,
    /// How long a new sandbox's execd has to answer.
    pub ready_timeout: Duration,
    /// Resource limits of each sandbox (`cpu`, `memory`), as the server reads them.
    pub resource_limits: BTreeMap<String, String>,
    /// Names this sessionbox installation in sandbox metadata (`[A-Za-z0-9._-]`, 1-63), so
    /// that two installations sharing a server never touch each other's sandboxes.
    pub instance: String,
    /// Network: `networkPolicy` on create, and the egress gateway's proxy for commands.
    pub egress: EgressOptions,
    /// The disk quota: with volumes, each sandbox's `/workspace` and `/tmp` are its
    /// conversation's volume, bound from the host (files then outlive a sandbox that vanished,
    /// until the conversation is destroyed); without, they are the container's own layer,
    /// unlimited.
    pub volumes: Option<Arc<dyn WorkspaceVolumes>>,
    /// The key the agents' access tokens derive from
    /// ([`sessionbox_egress::token::TokenKey::agent_token`]; the binary derives it from the API
    /// key, which every replica shares): with it, each sandbox is created
    /// with `EXECD_ACCESS_TOKEN` (which the agent takes and removes from its environment, so no
    /// command sees it) and every request carries it, so another container on the server's
    /// network cannot use a sandbox's agent. Without it, the agent takes any request that
    /// reaches it (the server's network is then the only guard).
    pub agent_key: Option<sessionbox_egress::token::TokenKey>,
    /// Whether commands and file operations go straight to the sandbox's agent at the
    /// server's direct endpoint (default [`DirectMode::Auto`]; see `direct.rs`).
    pub direct: DirectMode,
    /// How long the probe of a direct endpoint may take (its `/ping`, connect included), and
    /// the connect timeout of direct connections (default [`DEFAULT_DIRECT_PROBE_TIMEOUT`]).
    pub direct_probe_timeout: Duration,
    /// The warm pool: how many created, empty sandboxes each tenant keeps ready, bound to a
    /// new conversation on its first open (see `pool.rs`). Empty (the default): no pool. Not
    /// used with [`OpenSandboxConfig::volumes`].
    pub pool: PoolSizes,
    /// How old a pool-labelled sandbox of this instance that the store does not record must be
    /// before [`OpenSandboxRuntime::prune_pool`] deletes it (younger ones may be slots being
    /// made: created, not yet recorded). Default [`DEFAULT_POOL_UNRECORDED_GRACE`]; keep it
    /// above the create timeout plus the ready timeout.
    pub pool_unrecorded_grace: Duration,
}

/// How old an unrecorded pool sandbox must be before it is deleted, by default: the default
/// create timeout (120 s) plus the default ready timeout (60 s), with room to spare.
pub const DEFAULT_POOL_UNRECORDED_GRACE: Duration = Duration::from_secs(300);

/// How long a direct endpoint's probe may take by default.
pub const DEFAULT_DIRECT_PROBE_TIMEOUT: Duration = Duration::from_millis(500);

impl OpenSandboxConfig {
    /// Defaults: [`DEFAULT_IMAGE`] running `tail -f /dev/null`, [`DEFAULT_TIMEOUT`],
    /// [`DEFAULT_READY_TIMEOUT`], 1 CPU and 2 GiB (the 1.1.1 server requires
    /// `resourceLimits`: without them create is a 422).
    pub fn new(client: ClientConfig, instance: impl Into<String>) -> Self {
        OpenSandboxConfig {
            client,
            image: DEFAULT_IMAGE.into(),
            entrypoint: vec!["tail".into(), "-f".into(), "/dev/null".into()],
            timeout: DEFAULT_TIMEOUT,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            resource_limits: BTreeMap::from([
                ("cpu".to_owned(), "1".to_owned()),
                ("memory".to_owned(), "2Gi".to_owned()),
            ]),
            instance: instance.into(),
            egress: EgressOptions::default(),
            volumes: None,
            agent_key: None,
            direct: DirectMode::Auto,
            direct_probe_timeout: DEFAULT_DIRECT_PROBE_TIMEOUT,
            pool: PoolSizes::default(),
            pool_unrecorded_grace: DEFAULT_POOL_UNRECORDED_GRACE,
        }
    }
}

/// The `opensandbox` runtime. See the module documentation.
#[derive(Clone)]
pub struct OpenSandboxRuntime {
    client: OpenSandboxClient,
    directory: Arc<dyn Directory>,
    config: Arc<OpenSandboxConfig>,
    in_use: InUse,
    paths: self::direct::Paths,
    /// Serialises this process's refills of the warm pools.
    pool_refill: Arc<tokio::sync::Mutex<()>>,
}

/// Converts a lifecycle failure into the one error type, keeping the server's words.
pub fn to_core_error(e: OpenSandboxError) -> Error {
    match e {
        OpenSandboxError::InvalidInput(m) => Error::InvalidRequest(m),
        OpenSandboxError::Timeout { after, .. } => Error::TimedOut(after),
        e @ (OpenSandboxError::Connect { .. } | OpenSandboxError::Unhealthy { .. }) => {
            Error::RuntimeUnavailable {
                runtime: RUNTIME_NAME.into(),
                reason: e.to_string(),
                hint: "start an OpenSandbox server, or point the opensandbox endpoint at a \
                       running one"
                    .into(),
            }
        }
        e @ OpenSandboxError::Unauthorized { .. } => Error::Unauthorized(e.to_string()),
        OpenSandboxError::NetworkPolicyUnsupported {
            status,
            code,
            message,
        } => Error::RuntimeUnavailable {
            runtime: RUNTIME_NAME.into(),
            reason: format!(
                "the server cannot enforce the sandbox's network policy (it answered {status} \
                 {code}: {message})"
            ),
            hint: "install OpenSandbox's egress sidecar image on the server and name it in the \
                   server's configuration ([egress] image; Docker runtime with network_mode = \
                   \"bridge\"), or turn off the opensandbox network_policy setting \
                   (then sandboxes get the server's network as it is and \
                   sessionbox's policy does not bind them)"
                .into(),
        },
        e @ OpenSandboxError::NotFound { .. } => Error::NotFound(e.to_string()),
        e => Error::Backend(e.to_string()),
    }
}

fn conversation_label(key: &ConversationKey) -> String {
    key.as_str()[..62].to_owned()
}

impl std::fmt::Debug for OpenSandboxRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenSandboxRuntime")
            .field("client", &self.client)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Runtime for OpenSandboxRuntime {
    fn info(&self) -> RuntimeInfo {
        RuntimeInfo {
            name: RUNTIME_NAME.into(),
            endpoint: Some(
                self.client
                    .origin()
                    .as_str()
                    .trim_end_matches('/')
                    .to_owned(),
            ),
            version: None,
            boundary: Self::BOUNDARY.into(),
        }
    }

    fn presented_root(&self, _key: &ConversationKey) -> String {
        WORKSPACE.to_owned()
    }

    /// Not a path anything can reach: each sandbox has its own `/workspace`. This names the
    /// workspace of `key` as an absolute path outside `/workspace`, so that the isolation
    /// experiment can check that aiming at it is refused before any request.
    fn workspace_location(&self, key: &ConversationKey) -> String {
        format!("/opensandbox/{key}/workspace")
    }

    async fn open(&self, conversation: &ConversationRef) -> Result<Box<dyn Session>> {
        let key = conversation.key.clone();
        let (id, state_lost, subject) = self.ensure_sandbox(conversation).await?;
        let client = match self.connect(&id, &subject).await {
            Ok(c) => c,
            Err(e) => return Err(e),
        };
        Ok(Box::new(OpenSandboxSession {
            key,
            conversation: conversation.clone(),
            sandbox_id: id,
            client,
            state_lost,
            directory: self.directory.clone(),
            gateway: self.config.egress.gateway.clone(),
            in_use: self.in_use.clone(),
        }))
    }

    async fn destroy(&self, key: &ConversationKey) -> Result<DestroyReport> {
        let mut report = DestroyReport::default();
        if let Some(id) = self.sandbox_id(key).await? {
            report.sandbox_removed = self.client.delete(&id).await.map_err(to_core_error)?;
            self.paths.forget(&id);
            self.directory.forget_remote_sandbox(key, &id).await?;
            report.workspace_removed = report.sandbox_removed;
        }
        // Sandboxes labelled for this conversation that were never recorded (a creator that
        // died between create and record) go too.
        self.sweep_unrecorded(key).await;
        if let Some(volumes) = self.config.volumes.clone() {
            let k = key.clone();
            let had = tokio::task::spawn_blocking(move || volumes.remove(&k))
                .await
                .map_err(|e| Error::Backend(format!("the volume removal panicked: {e}")))??;
            report.workspace_removed |= had;
        }
        Ok(report)
    }

    async fn disk_usage(
        &self,
        key: &ConversationKey,
    ) -> Result<Option<sessionbox_core::DiskUsage>> {
        Ok(self.config.volumes.as_ref().and_then(|v| v.usage(key)))
    }

    /// The charge of the sandbox's container cgroup against its memory limit, as its agent
    /// reads it (`GET /sessionbox/v1/memory`); `None` when the sandbox is not running (a
    /// paused one is not resumed to be measured) or its agent cannot read its cgroup.
    ///
    /// # Errors
    /// Lifecycle failures; [`Error::Backend`] when the agent cannot be reached.
    async fn memory_usage(
        &self,
        key: &ConversationKey,
    ) -> Result<Option<sessionbox_core::MemoryUsage>> {
        let Some((id, subject)) = self.running_sandbox(key).await? else {
            return Ok(None);
        };
        let client = self.connect(&id, &subject).await?;
        client.memory_usage().await.map_err(|e| {
            Error::Backend(format!(
                "cannot ask the agent of sandbox {id} for its memory use: {e}"
            ))
        })
    }

    async fn list(&self) -> Result<Vec<RuntimeConversation>> {
        let records = self.directory.remote_sandboxes(RUNTIME_NAME).await?;
        Ok(records
            .into_iter()
            .map(|r| RuntimeConversation {
                key: r.key,
                processes: Vec::new(),
            })
            .collect())
    }

    /// Pauses the conversation's sandbox when the server says it is running and its agent has
    /// no background command running; the next [`Runtime::open`] resumes it. `false` for no
    /// sandbox, one gone, or one not running (already paused, pausing, resuming, starting).
    ///
    /// # Errors
    /// [`Error::Busy`] while a command or file operation of the conversation runs through
    /// this process, or while the sandbox's agent runs a background command (it is asked
    /// first: a pause would freeze the command); the agent's error when it cannot be asked;
    /// lifecycle failures otherwise (the server unreachable:
    /// [`Error::RuntimeUnavailable`]; a refused pause: [`Error::Backend`] with the server's
    /// words).
    async fn stop_idle(&self, key: &ConversationKey) -> Result<bool> {
        if self.in_use.any(key) {
            return Err(Error::Busy(
                "a command or file operation is running in its sandbox; left running".into(),
            ));
        }
        let Some((id, subject)) = self.running_sandbox(key).await? else {
            return Ok(false);
        };
        if let Some(n) = self.running_background(&id, &subject).await? {
            return Err(Error::Busy(format!(
                "{n} background command(s) run in its sandbox; left running"
            )));
        }
        match self.client.pause(&id).await {
            Ok(()) => {
                tracing::debug!(sandbox = %id, "paused an idle sandbox");
                Ok(true)
            }
            Err(OpenSandboxError::NotFound { .. }) => Ok(false),
            // 409: no longer running (paused by another collector, or on its way out).
            Err(e @ OpenSandboxError::Api { status: 409, .. }) => {
                match self.client.get(&id).await {
                    Ok(s) if s.status.state != SandboxState::Running => Ok(false),
                    Err(OpenSandboxError::NotFound { .. }) => Ok(false),
                    _ => Err(to_core_error(e)),
                }
            }
            Err(e) => Err(to_core_error(e)),
        }
    }

    async fn can_stop_idle(&self, key: &ConversationKey) -> Result<bool> {
        if self.in_use.any(key) {
            return Ok(false);
        }
        let Some((id, subject)) = self.running_sandbox(key).await? else {
            return Ok(false);
        };
        Ok(self.running_background(&id, &subject).await?.is_none())
    }

    async fn refill_pool(&self, tenant: &sessionbox_core::TenantId) -> Result<usize> {
        OpenSandboxRuntime::refill_pool(self, tenant).await
    }

    async fn prune_pool(&self, drain: bool) -> Result<usize> {
        OpenSandboxRuntime::prune_pool(self, drain).await
    }
}
