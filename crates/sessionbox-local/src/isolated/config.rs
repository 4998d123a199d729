//! The `isolated` runtime's settings ([`IsolatedConfig`]), its egress wiring, and what it
//! records about a launched sandbox ([`SandboxInfo`]).

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sessionbox_core::Limits;
use sessionbox_sandbox::{self as sandbox, SandboxLimits};

use super::disk::DiskQuota;

/// How the `isolated` runtime lets a conversation reach the network through the egress
/// gateway. Without it (the default) no sandbox has a route anywhere.
///
/// When the conversation's policy in force lets it out at launch
/// ([`sessionbox_core::Directory::network`], asked on every open; a sandbox launched the other
/// way is replaced), the runtime binds a Unix socket in the conversation's run directory
/// (`egress/gateway.sock`, owned by the conversation's uid, the directory bound read-only into
/// the sandbox), starts `exe gateway_args --listen-fd 3 --conversation-key KEY --watch-pid
/// MONITOR` outside the sandbox's namespaces but in its cgroups (its memory, threads and CPU
/// are the sandbox's) with that socket and `gateway_env`, and starts the agent with a
/// relay from [`EGRESS_PROXY`](super::EGRESS_PROXY) to the socket. The sandbox's network
/// namespace still has only loopback: the relay is its only way out, and the gateway decides.
#[derive(Clone)]
pub struct EgressWiring {
    /// Arguments that make `exe` the gateway (`["egress-gateway"]` for `sessionbox`).
    pub gateway_args: Vec<String>,
    /// The gateway's environment besides `SESSIONBOX_LOG` (which it inherits): what it needs
    /// to reach the same store as the caller. Secrets such as a store URL belong here, never
    /// in `gateway_args`.
    pub gateway_env: Vec<(OsString, OsString)>,
}

impl fmt::Debug for EgressWiring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The values may be secrets: only the names are shown.
        let env: Vec<_> = self.gateway_env.iter().map(|(k, _)| k).collect();
        f.debug_struct("EgressWiring")
            .field("gateway_args", &self.gateway_args)
            .field("gateway_env", &env)
            .finish()
    }
}

/// Settings of the `isolated` runtime. [`IsolatedConfig::new`] gives every default; the
/// setters (or the public fields) change the rest.
#[derive(Debug, Clone)]
pub struct IsolatedConfig {
    /// The data directory (workspaces and run directories live beneath it).
    pub data_dir: PathBuf,
    /// File-operation limits, enforced by the agent.
    pub limits: Limits,
    /// Sandbox limits (PIDs, memory, CPU, descriptors, file size).
    pub sandbox: SandboxLimits,
    /// The agent stops after this long without a request (the workspace stays), for
    /// conversations without an idle timeout of their own
    /// ([`sessionbox_core::Directory::idle_timeout`]).
    pub idle_timeout: Duration,
    /// The `sessionbox` executable: re-executed as the sandbox init, bound inside as the agent.
    pub exe: PathBuf,
    /// Arguments that make `exe` the agent (`["agent"]` for `sessionbox`).
    pub agent_args: Vec<String>,
    /// The host uids conversations run as when running as root, each given by
    /// [`sessionbox_core::Directory::sandbox_uid`] from this range.
    pub uids: Range<u32>,
    /// The disk quota of every conversation's workspace (its own loop-mounted ext4 volume, see
    /// [`DiskQuota`]), applied when running as root; `None`: no quota, workspaces share the
    /// data directory's file system (only the per-file size limit holds).
    pub disk: Option<DiskQuota>,
    /// Bytes at which the host's `agent.log` and `egress.log` of a conversation are rotated
    /// to `.1` (one kept) by their [`log_relay`](crate::log_relay): each takes at most twice
    /// this on the host. At least [`log_relay::MIN_MAX_BYTES`](crate::log_relay::MIN_MAX_BYTES).
    pub log_max_bytes: u64,
    /// The warm pool: how many launched, empty sandboxes are kept ready per tenant, bound to a
    /// conversation on its first use (see the `pool` module). Empty (the default): no pool.
    pub pool: PoolSizes,
}

pub use sessionbox_core::PoolSizes;

impl IsolatedConfig {
    /// The first host uid given to a conversation by default (`[isolated] uid_base`).
    pub const DEFAULT_UID_BASE: u32 = 3_000_000;
    /// How many host uids conversations get by default (`[isolated] uid_count`).
    pub const DEFAULT_UID_COUNT: u32 = 65_536;
    /// How long an agent waits for a request before it stops, by default.
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
    /// Bytes at which a conversation's host logs are rotated, by default (`[isolated]
    /// log_max_bytes`): 8 MiB.
    pub const DEFAULT_LOG_MAX_BYTES: u64 = 8 * 1024 * 1024;
    /// The arguments that make the `sessionbox` executable the agent.
    pub const DEFAULT_AGENT_ARGS: &'static [&'static str] = &["agent"];

    /// The settings for `data_dir` and the `sessionbox` executable `exe`, with every default:
    /// default file and sandbox limits, [`Self::DEFAULT_IDLE_TIMEOUT`],
    /// [`Self::DEFAULT_AGENT_ARGS`], host uids from [`Self::uid_range`]`(None, None)` and the
    /// default [`DiskQuota`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// use sessionbox_local::isolated::IsolatedConfig;
    ///
    /// let uids = IsolatedConfig::uid_range(None, Some(64));
    /// assert_eq!(uids, 3_000_000..3_000_064);
    /// let config = IsolatedConfig::new("/var/lib/sessionbox", "/usr/bin/sessionbox")
    ///     .with_uids(uids)
    ///     .with_idle_timeout(Duration::from_secs(30));
    /// assert_eq!(config.agent_args, ["agent"]);
    /// ```
    pub fn new(data_dir: impl Into<PathBuf>, exe: impl Into<PathBuf>) -> Self {
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
            uids: Self::uid_range(None, None),
            disk: Some(DiskQuota::default()),
            log_max_bytes: Self::DEFAULT_LOG_MAX_BYTES,
            pool: PoolSizes::default(),
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

    /// Sets the warm pool's sizes ([`PoolSizes`]).
    #[must_use]
    pub fn with_pool(mut self, pool: PoolSizes) -> Self {
        self.pool = pool;
        self
    }

    /// Sets the disk quota of each conversation (`None`: none).
    #[must_use]
    pub fn with_disk(mut self, disk: Option<DiskQuota>) -> Self {
        self.disk = disk;
        self
    }

    /// Sets the host uids conversations are given (see [`Self::uid_range`]).
    #[must_use]
    pub fn with_uids(mut self, uids: Range<u32>) -> Self {
        self.uids = uids;
        self
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
    /// The egress gateway serving it: outside the sandbox's namespaces, inside its cgroups
    /// (so among [`SandboxInfo::processes`]).
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
