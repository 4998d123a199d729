//! The `isolated` runtime's settings ([`IsolatedConfig`]), the hooks it asks about recorded
//! conversations, its egress wiring, and what it records about a launched sandbox
//! ([`SandboxInfo`]).

use std::fmt;
use std::fs;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sessionbox_core::{ConversationKey, Limits, Result};
use sessionbox_sandbox::{self as sandbox, SandboxLimits};

/// Tells whether a conversation may reach the network (see [`EgressWiring::network`]).
pub type NetworkCheck = Arc<dyn Fn(&ConversationKey) -> Result<bool> + Send + Sync>;

/// How the `isolated` runtime lets a conversation reach the network through the egress
/// gateway. Without it (the default) no sandbox has a route anywhere.
///
/// When `network` says yes for a conversation at launch, the runtime binds a Unix socket in the
/// conversation's run directory (`egress/gateway.sock`, owned by the conversation's uid, the
/// directory bound read-only into the sandbox), starts `exe gateway_args --listen-fd 3
/// --conversation-key KEY --watch-pid MONITOR` outside the sandbox with that socket, and starts
/// the agent with a relay from [`EGRESS_PROXY`](super::EGRESS_PROXY) to the socket. The sandbox's network namespace
/// still has only loopback: the relay is its only way out, and the gateway decides.
#[derive(Clone)]
pub struct EgressWiring {
    /// True when the conversation may reach the network (its profile is an allowlist); asked on
    /// every open. A sandbox launched the other way is replaced.
    pub network: NetworkCheck,
    /// Arguments that make `exe` the gateway (`["egress-gateway"]` for `sessionbox`).
    pub gateway_args: Vec<String>,
}

impl fmt::Debug for EgressWiring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EgressWiring")
            .field("gateway_args", &self.gateway_args)
            .finish_non_exhaustive()
    }
}

/// Allocates the host uid (and gid) a conversation runs as; called with the key of a recorded
/// conversation. The store provides it (unique while the conversation exists).
pub type UidAllocator = Arc<dyn Fn(&ConversationKey) -> Result<u32> + Send + Sync>;

/// The idle timeout of one conversation's sandbox, when it has its own (the store keeps one
/// per conversation, from its tenant's lifecycle); `None` uses [`IsolatedConfig::idle_timeout`].
pub type IdleTimeoutLookup = Arc<dyn Fn(&ConversationKey) -> Option<Duration> + Send + Sync>;

/// Gives the read-only binds `(host directory, inside path)` that present a conversation's
/// skills, called with the key of a recorded conversation each time its sandbox is launched
/// (the skills crate provides them: snapshots bound at `/skills/<name>`).
pub type SkillBinds =
    Arc<dyn Fn(&ConversationKey) -> Result<Vec<(PathBuf, PathBuf)>> + Send + Sync>;

/// [`SkillBinds`] with a `Debug` for the runtime's.
#[derive(Clone)]
pub(super) struct SkillBindsHook(pub(super) SkillBinds);

impl fmt::Debug for SkillBindsHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SkillBinds")
    }
}

/// Settings of the `isolated` runtime. [`IsolatedConfig::new`] gives every default; the
/// setters (or the public fields) change the rest.
#[derive(Clone)]
pub struct IsolatedConfig {
    /// The data directory (workspaces and run directories live beneath it).
    pub data_dir: PathBuf,
    /// File-operation limits, enforced by the agent.
    pub limits: Limits,
    /// Sandbox limits (PIDs, memory, CPU, descriptors, file size).
    pub sandbox: SandboxLimits,
    /// The agent stops after this long without a request (the workspace stays).
    pub idle_timeout: Duration,
    /// The `sessionbox` executable: re-executed as the sandbox init, bound inside as the agent.
    pub exe: PathBuf,
    /// Arguments that make `exe` the agent (`["agent"]` for `sessionbox`).
    pub agent_args: Vec<String>,
    /// Host uid per conversation, used when running as root.
    pub allocate_uid: UidAllocator,
    /// Per-conversation idle timeouts, looked up when a sandbox is launched.
    pub idle_timeout_of: Option<IdleTimeoutLookup>,
}

impl IsolatedConfig {
    /// The first host uid given to a conversation by default (`[isolated] uid_base`).
    pub const DEFAULT_UID_BASE: u32 = 3_000_000;
    /// How many host uids conversations get by default (`[isolated] uid_count`).
    pub const DEFAULT_UID_COUNT: u32 = 65_536;
    /// How long an agent waits for a request before it stops, by default.
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
    /// The arguments that make the `sessionbox` executable the agent.
    pub const DEFAULT_AGENT_ARGS: &'static [&'static str] = &["agent"];

    /// The settings for `data_dir` and the `sessionbox` executable `exe`, with every default:
    /// default file and sandbox limits, [`Self::DEFAULT_IDLE_TIMEOUT`],
    /// [`Self::DEFAULT_AGENT_ARGS`], no per-conversation idle timeouts, and host uids from
    /// `allocate_uid`, which is given the range [`Self::uid_range`]`(None, None)` by callers
    /// that keep the defaults.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// use sessionbox_local::isolated::IsolatedConfig;
    ///
    /// let uids = IsolatedConfig::uid_range(None, Some(64));
    /// assert_eq!(uids, 3_000_000..3_000_064);
    /// let config = IsolatedConfig::new("/var/lib/sessionbox", "/usr/bin/sessionbox", Arc::new(
    ///     move |_key| Ok(uids.start),
    /// ))
    /// .with_idle_timeout(Duration::from_secs(30));
    /// assert_eq!(config.agent_args, ["agent"]);
    /// ```
    pub fn new(
        data_dir: impl Into<PathBuf>,
        exe: impl Into<PathBuf>,
        allocate_uid: UidAllocator,
    ) -> Self {
        IsolatedConfig {
            data_dir: data_dir.into(),
            limits: Limits::default(),
            sandbox: SandboxLimits::default(),
            idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
            exe: exe.into(),
            agent_args: Self::DEFAULT_AGENT_ARGS
                .iter()
                .map(|a| (*a).to_owned())
                .collect(),
            allocate_uid,
            idle_timeout_of: None,
        }
    }

    /// The host uids to allocate conversations from: `count` uids from `base`, each
    /// defaulting ([`Self::DEFAULT_UID_BASE`], [`Self::DEFAULT_UID_COUNT`]); the range ends at
    /// `u32::MAX` at most.
    #[must_use]
    pub fn uid_range(base: Option<u32>, count: Option<u32>) -> Range<u32> {
        let base = base.unwrap_or(Self::DEFAULT_UID_BASE);
        base..base.saturating_add(count.unwrap_or(Self::DEFAULT_UID_COUNT))
    }

    /// Sets the file-operation limits.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Sets the sandbox limits.
    #[must_use]
    pub fn with_sandbox(mut self, sandbox: SandboxLimits) -> Self {
        self.sandbox = sandbox;
        self
    }

    /// Sets the idle timeout of conversations that have none of their own.
    #[must_use]
    pub fn with_idle_timeout(mut self, idle_timeout: Duration) -> Self {
        self.idle_timeout = idle_timeout;
        self
    }

    /// Sets the arguments that make `exe` the agent.
    #[must_use]
    pub fn with_agent_args(mut self, args: Vec<String>) -> Self {
        self.agent_args = args;
        self
    }

    /// Looks each conversation's own idle timeout up when its sandbox is launched.
    #[must_use]
    pub fn with_idle_timeout_of(mut self, lookup: IdleTimeoutLookup) -> Self {
        self.idle_timeout_of = Some(lookup);
        self
    }
}

impl fmt::Debug for IsolatedConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IsolatedConfig")
            .field("data_dir", &self.data_dir)
            .field("limits", &self.limits)
            .field("sandbox", &self.sandbox)
            .field("idle_timeout", &self.idle_timeout)
            .field("exe", &self.exe)
            .finish_non_exhaustive()
    }
}

/// What the launching process records about a conversation's sandbox (in its private run
/// directory) so that any other process can find, inventory and end it; read it with
/// [`IsolatedRuntime::sandbox_info`](super::IsolatedRuntime::sandbox_info).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SandboxInfo {
    /// The sandbox's monitor: the host process that launched the init and waits for it.
    pub monitor_pid: u32,
    /// The sandbox's init (pid 1 inside), as a host pid.
    pub init_pid: u32,
    /// The sandbox's cgroup in each hierarchy (empty with rlimit-only limits).
    pub cgroups: Vec<PathBuf>,
    /// When it was launched, in milliseconds since the Unix epoch.
    #[serde(default)]
    pub launched_ms: u64,
    /// Launched with the egress relay (its profile let it out).
    #[serde(default)]
    pub network: bool,
    /// The egress gateway serving it, outside the sandbox.
    #[serde(default)]
    pub gateway_pid: Option<u32>,
    /// The inode of its PID namespace: without cgroups (rlimit-only limits) the way to find
    /// and kill its processes.
    #[serde(default)]
    pub pid_namespace: Option<u64>,
    /// The names of the skills bound at `/skills/<name>` when it was launched (`None`: launched
    /// without skills configured, or by a build that did not record them).
    #[serde(default)]
    pub skills: Option<Vec<String>>,
}

impl SandboxInfo {
    /// The sandbox's live processes (host pids, sorted): those in its cgroups, or without
    /// cgroups those in its PID namespace.
    #[must_use]
    pub fn processes(&self) -> Vec<u32> {
        if self.cgroups.is_empty() {
            return self
                .pid_namespace
                .map(sandbox::namespace_processes)
                .unwrap_or_default();
        }
        let mut pids: Vec<u32> = self
            .cgroups
            .iter()
            .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|s| {
                s.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }
}
