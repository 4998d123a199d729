//! The `opensandbox` runtime: one OpenSandbox sandbox (a container) per conversation.
//!
//! Each sandbox runs sessionbox's agent as its execd (the server's `runtime.execd_image` is
//! `sessionbox/execd:local`, see `scripts/opensandbox-up`), and every operation is an execd
//! request through the server's proxy (`/v1/sandboxes/{id}/proxy/44772`), made by
//! `sessionbox-execd`'s client: the same protocol, and the same agent, as the `isolated` runtime.
//!
//! State:
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

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sessionbox_core::{
    CappedSink, ConversationKey, ConversationRef, DestroyReport, DirEntry, Directory, EditRequest,
    EditResult, Error, ExecRequest, ExecResult, ExecSink, FileStat, GrepMatch, GrepRequest, Result,
    Runtime, RuntimeConversation, RuntimeInfo, Session, WorkspacePath,
};
use sessionbox_egress::Policy;
pub use sessionbox_egress::token::GatewayAccess;
use sessionbox_execd::fs_ext::{FsRequest, FsResponse, FsSession};
use sessionbox_execd::{Endpoint, ExecdClient, RunCommandRequest};

use crate::error::OpenSandboxError;
use crate::lifecycle::{
    ClientConfig, CreateSandbox, EXECD_PORT, ListFilter, OpenSandboxClient, SandboxState,
};
use crate::metadata::Metadata;

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
    /// only the gateway's host for an allowlist (the gateway must then be named by a host
    /// name: the sidecar matches names), nothing for `none` or without a gateway. Needs a
    /// server with OpenSandbox's egress sidecar; one without it refuses the create, which
    /// fails with [`Error::RuntimeUnavailable`].
    pub network_policy: bool,
    /// The egress gateway: with it, commands of a conversation whose policy is an allowlist
    /// get the proxy variables with a fresh token.
    pub gateway: Option<GatewayAccess>,
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
}

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
}

/// How many operations (commands, file operations) of each conversation are running through
/// this process's sessions right now; a conversation with any is not paused as idle.
#[derive(Debug, Clone, Default)]
struct InUse(Arc<Mutex<HashMap<ConversationKey, usize>>>);

impl InUse {
    /// Counts one operation of `key` until the guard is dropped.
    fn enter(&self, key: &ConversationKey) -> InUseGuard {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_insert(0) += 1;
        InUseGuard {
            map: self.clone(),
            key: key.clone(),
        }
    }

    fn any(&self, key: &ConversationKey) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .is_some_and(|n| *n > 0)
    }
}

/// One running operation; see [`InUse::enter`].
struct InUseGuard {
    map: InUse,
    key: ConversationKey,
}

impl Drop for InUseGuard {
    fn drop(&mut self) {
        let mut map = self.map.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
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

impl OpenSandboxRuntime {
    /// The boundary this runtime gives, in one sentence.
    pub const BOUNDARY: &'static str = "an OpenSandbox sandbox (a container on the server's Docker or Kubernetes) per conversation, running sessionbox's agent as execd; the boundary is the server's container runtime and its settings";

    /// A runtime asking `directory` for the conversation-to-sandbox map and the network policy
    /// in force (`sessionbox_manager::StoreDirectory` answers from the store).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a malformed server address, instance name, or a timeout
    /// under 60 s.
    pub fn new(config: OpenSandboxConfig, directory: Arc<dyn Directory>) -> Result<Self> {
        let client = OpenSandboxClient::new(config.client.clone()).map_err(to_core_error)?;
        if !crate::metadata::is_valid_value(&config.instance) || config.instance.is_empty() {
            return Err(Error::InvalidRequest(format!(
                "the OpenSandbox instance name {:?} must be 1-63 of A-Z a-z 0-9 . _ - starting \
                 and ending with a letter or digit",
                config.instance
            )));
        }
        if config.timeout.as_secs() < crate::lifecycle::MIN_TIMEOUT_SECS {
            return Err(Error::InvalidRequest(format!(
                "the OpenSandbox sandbox timeout must be at least {} s",
                crate::lifecycle::MIN_TIMEOUT_SECS
            )));
        }
        if let (true, Some(g)) = (config.egress.network_policy, &config.egress.gateway)
            && g.host_name().is_none()
        {
            return Err(Error::InvalidRequest(format!(
                "network_policy needs the egress gateway named by a host name, not the \
                 address {}: OpenSandbox's egress sidecar matches names only; give the \
                 gateway a name the sandboxes resolve, or turn off the network_policy setting",
                g.address()
            )));
        }
        Ok(OpenSandboxRuntime {
            client,
            directory,
            config: Arc::new(config),
            in_use: InUse::default(),
        })
    }

    /// The lifecycle client.
    pub fn client(&self) -> &OpenSandboxClient {
        &self.client
    }

    /// The metadata every sandbox of this installation carries.
    pub fn instance_metadata(&self) -> Metadata {
        let mut m = Metadata::new();
        m.insert(LABEL_MANAGED, "true").expect("a constant label");
        m.insert(LABEL_INSTANCE, &self.config.instance)
            .expect("checked in new");
        m
    }

    /// Every sandbox on the server that this installation made (by metadata), whether or not
    /// the store still maps a conversation to it.
    ///
    /// # Errors
    /// Lifecycle failures.
    pub async fn server_inventory(&self) -> Result<Vec<crate::Sandbox>> {
        let filter = ListFilter {
            metadata: self.instance_metadata(),
            states: Vec::new(),
        };
        self.client.list(&filter).await.map_err(to_core_error)
    }

    /// The sandbox id the store maps `key` to, if any.
    ///
    /// # Errors
    /// Store failures.
    pub async fn sandbox_id(&self, key: &ConversationKey) -> Result<Option<String>> {
        self.directory
            .remote_sandbox(key)
            .await
            .map(|r| r.map(|r| r.sandbox_id))
    }

    /// The expiry the store holds for `key`'s sandbox (the source of truth).
    ///
    /// # Errors
    /// Store failures.
    pub async fn recorded_expiry(&self, key: &ConversationKey) -> Result<Option<DateTime<Utc>>> {
        self.directory
            .remote_sandbox(key)
            .await
            .map(|r| r.and_then(|r| r.expires_at))
    }

    /// `now + timeout`, in whole milliseconds (what the store keeps).
    fn expiry_from_now(&self) -> DateTime<Utc> {
        let t = Utc::now()
            + chrono::Duration::from_std(self.config.timeout).unwrap_or(chrono::Duration::zero());
        DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or(t)
    }

    /// The `networkPolicy` a new sandbox of `conversation` gets, with its [`LABEL_NETWORK`]
    /// value; `None` when the option is off.
    async fn network_policy(
        &self,
        conversation: &ConversationRef,
    ) -> Result<Option<(serde_json::Value, &'static str)>> {
        if !self.config.egress.network_policy {
            return Ok(None);
        }
        let policy = policy_in_force(&*self.directory, conversation).await?;
        let gateway = self
            .config
            .egress
            .gateway
            .as_ref()
            .and_then(GatewayAccess::host_name);
        Ok(Some(match gateway {
            Some(host) if !policy.is_none() => (
                sessionbox_egress::opensandbox::gateway_only(&policy, host)
                    .map_err(|e| Error::InvalidRequest(e.to_string()))?,
                "gateway",
            ),
            _ => (sessionbox_egress::opensandbox::deny_all(), "none"),
        }))
    }

    async fn create_sandbox(
        &self,
        conversation: &ConversationRef,
    ) -> Result<(String, DateTime<Utc>)> {
        let key = &conversation.key;
        let mut metadata = self.instance_metadata();
        metadata
            .insert(LABEL_CONVERSATION, &conversation_label(key))
            .map_err(to_core_error)?;
        let network_policy = match self.network_policy(conversation).await? {
            Some((policy, label)) => {
                metadata
                    .insert(LABEL_NETWORK, label)
                    .map_err(to_core_error)?;
                Some(policy)
            }
            None => None,
        };
        let request = CreateSandbox {
            image: self.config.image.clone(),
            entrypoint: self.config.entrypoint.clone(),
            timeout: Some(self.config.timeout),
            metadata,
            resource_limits: self.config.resource_limits.clone(),
            env: BTreeMap::new(),
            network_policy,
        };
        let expires = self.expiry_from_now();
        match self.client.create(&request).await {
            Ok(s) => Ok((s.id, s.expires_at.unwrap_or(expires))),
            Err(e) => {
                // A create that timed out or failed mid-way may still have made a sandbox:
                // find it by its labels and delete it, so nothing leaks.
                match e {
                    // The server may still be making it: keep looking for a while.
                    OpenSandboxError::Timeout { .. } | OpenSandboxError::Connect { .. } => {
                        self.sweep_until_quiet(key).await;
                    }
                    OpenSandboxError::Api { .. } => {
                        self.sweep_unrecorded(key).await;
                    }
                    _ => {}
                }
                Err(to_core_error(e))
            }
        }
    }

    /// After a create whose answer was lost: sweeps every half second until nothing
    /// unrecorded has been seen for three seconds (or twenty seconds passed), so a sandbox the
    /// server finished making after we gave up is deleted too.
    async fn sweep_until_quiet(&self, key: &ConversationKey) {
        let start = Instant::now();
        let mut quiet_since = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if self.sweep_unrecorded(key).await > 0 {
                quiet_since = Instant::now();
            } else if quiet_since.elapsed() >= Duration::from_secs(3) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Deletes the sandboxes labelled for `key` that the store does not map to it; returns
    /// how many it found.
    async fn sweep_unrecorded(&self, key: &ConversationKey) -> usize {
        let recorded = self.sandbox_id(key).await.ok().flatten();
        let mut metadata = self.instance_metadata();
        if metadata
            .insert(LABEL_CONVERSATION, &conversation_label(key))
            .is_err()
        {
            return 0;
        }
        let filter = ListFilter {
            metadata,
            states: Vec::new(),
        };
        let mut n = 0;
        if let Ok(found) = self.client.list(&filter).await {
            for s in found {
                if Some(&s.id) != recorded.as_ref() {
                    n += 1;
                    let _ = self.client.delete(&s.id).await;
                }
            }
        }
        n
    }

    /// Finds or makes the conversation's sandbox: `(sandbox id, whether a vanished one was
    /// replaced)`.
    async fn ensure_sandbox(&self, conversation: &ConversationRef) -> Result<(String, bool)> {
        let key = &conversation.key;
        let mut lost = false;
        for _ in 0..5 {
            let recorded = self.directory.remote_sandbox(key).await?;
            let Some(record) = recorded else {
                let (id, expires) = self.create_sandbox(conversation).await?;
                let inserted = self
                    .directory
                    .record_remote_sandbox(key, RUNTIME_NAME, &id, Some(expires))
                    .await;
                match inserted {
                    Ok((_, true)) => return Ok((id, lost)),
                    Ok((winner, false)) => {
                        // Another open won: delete only our own sandbox, by id, and use theirs.
                        tracing::debug!(ours = %id, theirs = %winner.sandbox_id, "lost the create race");
                        let _ = self.client.delete(&id).await;
                        continue;
                    }
                    Err(e) => {
                        let _ = self.client.delete(&id).await;
                        return Err(e);
                    }
                }
            };
            match self.client.get(&record.sandbox_id).await {
                Ok(s) if !s.status.state.is_final() => {
                    self.check_network_label(conversation, &s).await;
                    if matches!(s.status.state, SandboxState::Paused | SandboxState::Pausing) {
                        self.resume(&s.id).await?;
                    }
                    self.renew_if_due(key, &record.sandbox_id, record.expires_at)
                        .await?;
                    return Ok((record.sandbox_id, lost));
                }
                Ok(_) | Err(OpenSandboxError::NotFound { .. }) => {
                    // Vanished: expired, deleted elsewhere, or failed. Replace it.
                    tracing::warn!(
                        sandbox = %record.sandbox_id,
                        "the conversation's sandbox vanished; starting a fresh one (its files are lost)"
                    );
                    let _ = self.client.delete(&record.sandbox_id).await;
                    let (id, expires) = self.create_sandbox(conversation).await?;
                    let replaced = self
                        .directory
                        .replace_remote_sandbox(key, &record.sandbox_id, &id, Some(expires))
                        .await;
                    match replaced {
                        Ok(true) => return Ok((id, true)),
                        Ok(false) => {
                            let _ = self.client.delete(&id).await;
                            lost = true;
                            continue;
                        }
                        Err(e) => {
                            let _ = self.client.delete(&id).await;
                            return Err(e);
                        }
                    }
                }
                Err(e) => return Err(to_core_error(e)),
            }
        }
        Err(Error::Backend(
            "the conversation's sandbox kept changing under concurrent opens; retry".into(),
        ))
    }

    /// A sandbox keeps the `networkPolicy` it was created with. When the conversation's
    /// profile has since switched (its label no longer matches), this says so in the log: a
    /// switch to `none` is still enforced by the gateway (which refuses everything under
    /// `none`), a switch to an allowlist reaches a sandbox made afterwards (destroy the
    /// conversation to get one).
    async fn check_network_label(&self, conversation: &ConversationRef, s: &crate::Sandbox) {
        let Some(have) = s.metadata.get(LABEL_NETWORK) else {
            return;
        };
        if let Ok(Some((_, want))) = self.network_policy(conversation).await
            && have != want
        {
            tracing::warn!(
                sandbox = %s.id,
                created_with = %have,
                now = %want,
                "the conversation's network profile changed since its sandbox was created; \
                 the sandbox keeps its networkPolicy until it is replaced"
            );
        }
    }

    /// Renews the sandbox to `now + timeout` when half the timeout has passed since the last
    /// renewal, or when the store holds no expiry. The store's expiry is written first-hand.
    async fn renew_if_due(
        &self,
        key: &ConversationKey,
        id: &str,
        recorded: Option<DateTime<Utc>>,
    ) -> Result<()> {
        let half = chrono::Duration::from_std(self.config.timeout / 2).unwrap_or_default();
        let due = recorded.is_none_or(|t| t - Utc::now() < half);
        if !due {
            return Ok(());
        }
        self.renew(key, id).await.map(drop)
    }

    /// Renews `key`'s sandbox `id` to `now + timeout` on the server and in the store.
    async fn renew(&self, key: &ConversationKey, id: &str) -> Result<DateTime<Utc>> {
        let target = self.expiry_from_now();
        self.client.renew(id, target).await.map_err(to_core_error)?;
        self.directory
            .set_remote_sandbox_expiry(key, id, Some(target))
            .await?;
        Ok(target)
    }

    /// Resumes a paused sandbox. A 409 (it is not paused: another open resumed it meanwhile)
    /// is fine when the sandbox is now running or resuming.
    async fn resume(&self, id: &str) -> Result<()> {
        match self.client.resume(id).await {
            Ok(()) => Ok(()),
            Err(e @ OpenSandboxError::Api { status: 409, .. }) => match self.client.get(id).await {
                Ok(s)
                    if matches!(
                        s.status.state,
                        SandboxState::Running | SandboxState::Resuming
                    ) =>
                {
                    Ok(())
                }
                _ => Err(to_core_error(e)),
            },
            Err(e) => Err(to_core_error(e)),
        }
    }

    /// The mapped sandbox of `key` when the server says it is running: what an idle stop
    /// would pause. `None` for no mapping, a sandbox gone, or one in any other state.
    async fn running_sandbox(&self, key: &ConversationKey) -> Result<Option<String>> {
        let Some(id) = self.sandbox_id(key).await? else {
            return Ok(None);
        };
        match self.client.get(&id).await {
            Ok(s) if s.status.state == SandboxState::Running => Ok(Some(id)),
            Ok(_) | Err(OpenSandboxError::NotFound { .. }) => Ok(None),
            Err(e) => Err(to_core_error(e)),
        }
    }

    /// Renews `key`'s sandbox now, whatever its recorded expiry; returns the new expiry.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the store maps no sandbox to `key`; lifecycle failures.
    pub async fn renew_now(&self, key: &ConversationKey) -> Result<DateTime<Utc>> {
        let id = self
            .sandbox_id(key)
            .await?
            .ok_or_else(|| Error::NotFound("the conversation has no OpenSandbox sandbox".into()))?;
        self.renew(key, &id).await
    }

    /// How many background commands the agent of the running sandbox `id` runs now (its
    /// `GET /sessionbox/v1/commands`), `None` for none. Garbage collection asks before it
    /// pauses a sandbox: the commands are owned by the agent, not by this process, so only
    /// the agent knows.
    ///
    /// # Errors
    /// [`Error::Backend`] when the agent cannot be reached or answers badly.
    async fn running_background(&self, id: &str) -> Result<Option<usize>> {
        let client = self.connect(id).await?;
        let commands = client.background_commands().await.map_err(|e| {
            Error::Backend(format!(
                "cannot ask the agent of sandbox {id} whether a background command runs: {e}"
            ))
        })?;
        let n = commands.iter().filter(|c| c.running).count();
        Ok((n > 0).then_some(n))
    }

    async fn connect(&self, id: &str) -> Result<ExecdClient> {
        let endpoint = self
            .client
            .endpoint(id, EXECD_PORT)
            .await
            .map_err(to_core_error)?;
        let mut builder = ExecdClient::builder(Endpoint::Http(endpoint.url.clone()))
            .connect_timeout(self.config.client.connect_timeout);
        if let Some((_, token)) = endpoint
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("X-EXECD-ACCESS-TOKEN"))
        {
            builder = builder.token(token.clone());
        }
        let client = builder.build().map_err(Error::from)?;
        // Create answers once the container started, not when execd inside answers.
        let deadline = Instant::now() + self.config.ready_timeout;
        let mut wait = Duration::from_millis(20);
        loop {
            match tokio::time::timeout(Duration::from_secs(5), client.ping()).await {
                Ok(Ok(())) => return Ok(client),
                Ok(Err(e)) if Instant::now() >= deadline => {
                    return Err(Error::Backend(format!(
                        "the sandbox's execd did not answer within {:?}: {e}",
                        self.config.ready_timeout
                    )));
                }
                Err(_) if Instant::now() >= deadline => {
                    return Err(Error::TimedOut(self.config.ready_timeout));
                }
                _ => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(250));
                }
            }
        }
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
        let (id, state_lost) = self.ensure_sandbox(conversation).await?;
        let client = match self.connect(&id).await {
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
            self.directory.forget_remote_sandbox(key, &id).await?;
            report.workspace_removed = report.sandbox_removed;
        }
        // Sandboxes labelled for this conversation that were never recorded (a creator that
        // died between create and record) go too.
        self.sweep_unrecorded(key).await;
        Ok(report)
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
        let Some(id) = self.running_sandbox(key).await? else {
            return Ok(false);
        };
        if let Some(n) = self.running_background(&id).await? {
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
        let Some(id) = self.running_sandbox(key).await? else {
            return Ok(false);
        };
        Ok(self.running_background(&id).await?.is_none())
    }
}

/// The policy in force for `conversation`, as the directory answers it (and the gateway reads
/// it): the egress crate's policy, from the canonical text the directory already decoded once.
async fn policy_in_force(
    directory: &dyn Directory,
    conversation: &ConversationRef,
) -> Result<Policy> {
    let network = directory.network(conversation).await?;
    Policy::from_json(&network.json).map_err(|e| {
        Error::Backend(format!(
            "the network policy of conversation {} cannot be used: {e}; set it again",
            conversation.id
        ))
    })
}

/// An open `opensandbox` conversation: an execd client of its sandbox, through the server
/// proxy.
struct OpenSandboxSession {
    key: ConversationKey,
    conversation: ConversationRef,
    sandbox_id: String,
    client: ExecdClient,
    state_lost: bool,
    directory: Arc<dyn Directory>,
    gateway: Option<GatewayAccess>,
    in_use: InUse,
}

impl OpenSandboxSession {
    /// Runs a command through the agent's event stream (exact bytes), handing output to `sink`
    /// as it arrives when there is one.
    async fn run(&self, request: ExecRequest, sink: Option<ExecSink<'_>>) -> Result<ExecResult> {
        request.validate()?;
        let _in_use = self.in_use.enter(&self.key);
        let cwd = checked(request.cwd.as_deref().unwrap_or("."))?;
        // The caller's own variables win over the gateway's (as on the isolated runtime).
        let mut run = RunCommandRequest::for_exec(&request, cwd);
        if let Some(gateway) = &self.gateway {
            // The policy in force now; a fresh token for this command alone.
            let policy = policy_in_force(&*self.directory, &self.conversation).await?;
            let ttl = request.timeout + TOKEN_MARGIN;
            for (k, v) in gateway.command_env(self.key.as_str(), &policy, ttl) {
                run = run.env_default(k, v);
            }
        }
        let sink = sink.map(|s| std::sync::Mutex::new(CappedSink::new(s, request.output_limit)));
        let out = self
            .client
            .run_command_with(&run, |event| {
                if let (Some(sink), Some((stream, bytes))) = (&sink, event.output_stream()) {
                    sink.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(stream, bytes);
                }
            })
            .await
            .map_err(Error::from)?;
        out.into_exec_result(
            request.output_limit,
            &format!(" in sandbox {}", self.sandbox_id),
        )
    }

    async fn send_fs(&self, request: FsRequest) -> Result<FsResponse> {
        let _in_use = self.in_use.enter(&self.key);
        self.client.fs(&request).await.map_err(Error::from)
    }

    /// Starts a background command on the agent (see `sessionbox_execd::commands_ext`), with
    /// the same environment as a foreground one: the gateway's proxy with a token for this
    /// command, then the caller's variables.
    async fn spawn_background(
        &self,
        request: ExecRequest,
    ) -> Result<sessionbox_core::BackgroundCommand> {
        request.validate()?;
        let _in_use = self.in_use.enter(&self.key);
        let cwd = checked(request.cwd.as_deref().unwrap_or("."))?;
        let mut run = sessionbox_execd::commands_ext::run_request(&request, cwd);
        if let Some(gateway) = &self.gateway {
            let policy = policy_in_force(&*self.directory, &self.conversation).await?;
            let ttl = request.timeout + TOKEN_MARGIN;
            let mut env: BTreeMap<String, String> = gateway
                .command_env(self.key.as_str(), &policy, ttl)
                .into_iter()
                .collect();
            env.extend(request.env.clone());
            run.envs = Some(env);
        }
        self.client
            .spawn_background(&run)
            .await
            .map_err(Error::from)
    }
}

/// Checks a path here, before anything is sent (the agent checks it again beneath its root).
fn checked(path: &str) -> Result<String> {
    WorkspacePath::resolve(WORKSPACE, path).map(|p| p.presented(WORKSPACE))
}

#[async_trait]
impl FsSession for OpenSandboxSession {
    fn presented_root(&self) -> &str {
        WORKSPACE
    }

    async fn fs(&self, request: FsRequest) -> Result<FsResponse> {
        self.send_fs(request).await
    }
}

#[async_trait]
impl Session for OpenSandboxSession {
    fn key(&self) -> &ConversationKey {
        &self.key
    }

    fn workspace_root(&self) -> &str {
        WORKSPACE
    }

    fn state_lost(&self) -> bool {
        self.state_lost
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecResult> {
        self.run(request, None).await
    }

    async fn exec_stream(&self, request: ExecRequest, sink: ExecSink<'_>) -> Result<ExecResult> {
        self.run(request, Some(sink)).await
    }

    async fn read(&self, path: &str) -> Result<Vec<u8>> {
        self.fs_read(path).await
    }

    async fn write(&self, path: &str, data: &[u8]) -> Result<()> {
        self.fs_write(path, data).await
    }

    async fn edit(&self, path: &str, edit: &EditRequest) -> Result<EditResult> {
        self.fs_edit(path, edit).await
    }

    async fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        self.fs_list(path).await
    }

    async fn glob(&self, pattern: &str) -> Result<Vec<String>> {
        self.fs_glob(pattern).await
    }

    async fn grep(&self, request: &GrepRequest) -> Result<Vec<GrepMatch>> {
        self.fs_grep(request).await
    }

    async fn stat(&self, path: &str) -> Result<FileStat> {
        self.fs_stat(path).await
    }

    async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        self.fs_remove(path, recursive).await
    }

    async fn mkdir(&self, path: &str) -> Result<()> {
        self.fs_mkdir(path).await
    }

    async fn spawn(&self, request: ExecRequest) -> Result<sessionbox_core::BackgroundCommand> {
        self.spawn_background(request).await
    }

    async fn commands(&self) -> Result<Vec<sessionbox_core::BackgroundCommand>> {
        let _in_use = self.in_use.enter(&self.key);
        self.client.background_commands().await.map_err(Error::from)
    }

    async fn command(&self, id: &str) -> Result<sessionbox_core::BackgroundCommand> {
        sessionbox_core::validate_command_id(id)?;
        let _in_use = self.in_use.enter(&self.key);
        self.client
            .background_command(id)
            .await
            .map_err(Error::from)
    }

    async fn command_output(
        &self,
        id: &str,
        read: sessionbox_core::OutputRequest,
    ) -> Result<sessionbox_core::CommandOutput> {
        sessionbox_core::validate_command_id(id)?;
        read.validate()?;
        let _in_use = self.in_use.enter(&self.key);
        self.client
            .background_output(id, read)
            .await
            .map_err(Error::from)
    }

    async fn kill_command(&self, id: &str) -> Result<sessionbox_core::BackgroundCommand> {
        sessionbox_core::validate_command_id(id)?;
        let _in_use = self.in_use.enter(&self.key);
        self.client.kill_background(id).await.map_err(Error::from)
    }

    async fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
