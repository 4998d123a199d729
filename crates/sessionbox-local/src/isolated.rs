//! The `isolated` runtime: one Linux sandbox per conversation, run by our execd-compatible agent.
//!
//! On first use of a conversation the runtime binds a Unix socket in a root-only run directory,
//! launches the sandbox ([`sessionbox_sandbox`]) with the `sessionbox` binary bound read-only inside
//! and started as the agent, and hands it the listening socket. Every operation is then an execd
//! request over that socket ([`sessionbox_execd`]). The agent stays warm between calls and
//! between processes (a CLI call, the server): whoever asks first launches it, under a
//! per-conversation lock, and the others connect to it. It stops itself after an idle period; the
//! workspace stays and the next use launches it again.
//!
//! Layout beneath the data directory:
//! - `workspaces/<key>`: the workspace, 0700, owned by the conversation's own host uid (as root).
//! - `run/<key>/`: 0700, root's: `lock`, `agent.sock`, `sandbox.json` (cgroups, pids),
//!   `agent.log` (the agent's stderr).

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File};
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sessionbox_core::{BackgroundCommand, CommandOutput, OutputRequest, validate_command_id};
use sessionbox_core::{
    CappedSink, ConversationKey, ConversationRef, DestroyReport, DirEntry, EditRequest, EditResult,
    Error, ExecRequest, ExecResult, ExecSink, FileStat, GrepMatch, GrepRequest, Limits, Result,
    Runtime, RuntimeConversation, RuntimeInfo, Session, WorkspacePath,
};
use sessionbox_egress::GatewayArgs;
use sessionbox_execd::agent_args::AgentArgs;
use sessionbox_execd::fs_ext::{FsRequest, FsResponse, FsSession};
use sessionbox_execd::{ExecdClient, RunCommandRequest};

use crate::host::create_private_dir_all;
use sessionbox_sandbox::{self as sandbox, SandboxLimits, SandboxSpec, SandboxStdio};

/// The workspace as commands in the sandbox see it.
pub const WORKSPACE: &str = "/workspace";
/// How long a running agent has to answer a liveness ping.
const PING_TIMEOUT: Duration = Duration::from_secs(2);
/// Where the `sessionbox` binary is bound inside the sandbox.
const AGENT_EXE: &str = "/.sessionbox/sessionbox";
/// Where the conversation's egress directory (holding the gateway's socket) is bound inside.
const EGRESS_DIR: &str = "/.sessionbox/egress";
/// The proxy address commands get, on the sandbox's own loopback (served by the agent's relay).
pub const EGRESS_PROXY: &str = "127.0.0.1:3128";

/// Tells whether a conversation may reach the network (see [`EgressWiring::network`]).
pub type NetworkCheck = Arc<dyn Fn(&ConversationKey) -> Result<bool> + Send + Sync>;

/// How the `isolated` runtime lets a conversation reach the network through the egress
/// gateway. Without it (the default) no sandbox has a route anywhere.
///
/// When `network` says yes for a conversation at launch, the runtime binds a Unix socket in the
/// conversation's run directory (`egress/gateway.sock`, owned by the conversation's uid, the
/// directory bound read-only into the sandbox), starts `exe gateway_args --listen-fd 3
/// --conversation-key KEY --watch-pid MONITOR` outside the sandbox with that socket, and starts
/// the agent with a relay from [`EGRESS_PROXY`] to the socket. The sandbox's network namespace
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

/// Where mounted skills appear inside the sandbox.
pub const SKILLS_ROOT: &str = "/skills";

#[derive(Clone)]
struct SkillBindsHook(SkillBinds);

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
/// [`IsolatedRuntime::sandbox_info`].
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

/// A sandbox launched less than this long ago is starting, not hung: it is given time to answer
/// rather than replaced.
const STARTING_GRACE: Duration = Duration::from_secs(10);

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The `isolated` runtime. See the module documentation.
#[derive(Debug, Clone)]
pub struct IsolatedRuntime {
    config: IsolatedConfig,
    workspaces: PathBuf,
    run: PathBuf,
    /// Distinguishes this data directory's cgroups from another's (cgroup names are global).
    instance: String,
    /// The egress wiring, if conversations may reach the network.
    egress: Option<EgressWiring>,
    /// Skills bound read-only at `/skills/<name>`, when configured.
    skill_binds: Option<SkillBindsHook>,
    /// The environment the egress gateway is started with besides `SESSIONBOX_LOG`
    /// ([`IsolatedRuntime::with_gateway_env`]); `None`: [`inherited_gateway_env`].
    gateway_env: Option<Vec<(OsString, OsString)>>,
}

impl IsolatedRuntime {
    /// The boundary this runtime gives, in one sentence.
    pub const BOUNDARY: &'static str = "a Linux sandbox per conversation: own user, mount, PID, IPC, UTS, network and cgroup namespaces, its own host uid, read-only system directories, landlock, seccomp, cgroup limits, no network";

    /// Creates the data directory's `workspaces` and `run` directories, after checking that the
    /// sandbox limits can hold here ([`sandbox::check_limits`]).
    ///
    /// # Errors
    /// [`Error::RuntimeUnavailable`] when the limits are cgroups (the default) and no cgroup can
    /// be made (without root: none is delegated to the caller), saying how to delegate one or
    /// choose rlimit-only limits. [`Error::Backend`] when the directories cannot be created.
    pub fn new(config: IsolatedConfig) -> Result<Self> {
        sandbox::check_limits(&config.sandbox)?;
        let workspaces = config.data_dir.join("workspaces");
        let run = config.data_dir.join("run");
        create_private_dir_all(&workspaces)?;
        create_private_dir_all(&run)?;
        let canon = |p: &Path| {
            fs::canonicalize(p)
                .map_err(|e| Error::Backend(format!("cannot resolve {}: {e}", p.display())))
        };
        let run = canon(&run)?;
        let instance = {
            use sha2::Digest;
            let digest = sha2::Sha256::digest(run.as_os_str().as_encoded_bytes());
            digest[..6].iter().map(|b| format!("{b:02x}")).collect()
        };
        Ok(IsolatedRuntime {
            workspaces: canon(&workspaces)?,
            run,
            instance,
            config,
            egress: None,
            skill_binds: None,
            gateway_env: None,
        })
    }

    /// Lets conversations whose profile allows it reach the network through the egress
    /// gateway (see [`EgressWiring`]).
    #[must_use]
    pub fn with_egress(mut self, egress: EgressWiring) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Starts each conversation's egress gateway with `env` (besides `SESSIONBOX_LOG`) instead
    /// of [`inherited_gateway_env`]: what the gateway needs to reach the same store as the
    /// caller (the data directory and configuration file are in
    /// [`EgressWiring::gateway_args`]; secrets such as a store URL belong here, never on a
    /// command line).
    #[must_use]
    pub fn with_gateway_env(mut self, env: Vec<(OsString, OsString)>) -> Self {
        self.gateway_env = Some(env);
        self
    }

    /// The environment the gateway gets besides `SESSIONBOX_LOG`.
    fn gateway_env(&self) -> Vec<(OsString, OsString)> {
        self.gateway_env
            .clone()
            .unwrap_or_else(inherited_gateway_env)
    }

    /// Presents each conversation's skills read-only at `/skills/<name>`: `binds` is asked for
    /// them whenever a sandbox is launched (a running sandbox keeps the binds it started with
    /// until it stops when idle). Without it nothing is mounted at `/skills`.
    #[must_use]
    pub fn with_skill_binds(mut self, binds: SkillBinds) -> Self {
        self.skill_binds = Some(SkillBindsHook(binds));
        self
    }

    /// [`Self::BOUNDARY`] as it holds for this process: without root every conversation runs
    /// as the caller's own uid, and rlimit-only limits are per process.
    fn boundary(&self) -> String {
        let mut b = Self::BOUNDARY.to_owned();
        if !rustix::process::geteuid().is_root() {
            b = b.replace(
                "its own host uid",
                "the caller's own host uid (not root: one uid for every conversation)",
            );
        }
        if self.config.sandbox.mode == sandbox::LimitMode::Rlimit {
            b = b.replace(
                "cgroup limits",
                "per-process rlimits only (no cgroup: no memory, process or CPU bound for the sandbox as a whole)",
            );
        }
        b
    }

    /// What was recorded about the conversation's sandbox when it was last launched, or `None`
    /// when it has none (never launched, ended and cleaned up, or destroyed). The sandbox may
    /// have stopped on its own since (idle): [`SandboxInfo::processes`] is then empty.
    pub fn sandbox_info(&self, key: &ConversationKey) -> Option<SandboxInfo> {
        read_record(&self.run_dir(key))
    }

    /// The path of the conversation's agent socket. It may be longer than a Unix socket path
    /// can be (107 bytes) under a long data directory; the runtime itself connects through a
    /// descriptor of the run directory.
    pub fn agent_socket(&self, key: &ConversationKey) -> PathBuf {
        self.run_dir(key).join("agent.sock")
    }

    fn workspace_dir(&self, key: &ConversationKey) -> PathBuf {
        self.workspaces.join(key.as_str())
    }

    fn run_dir(&self, key: &ConversationKey) -> PathBuf {
        self.run.join(key.as_str())
    }

    /// Finds the conversation's running agent or launches one; returns the socket path and
    /// whether this call launched it. With `replace`, an agent that accepts connections but did
    /// not answer a ping (stopped, wedged) is ended and replaced, unless it was launched moments
    /// ago (then it is starting).
    ///
    /// With `resume` (a session held across a stop), only a conversation that still exists is
    /// served: one destroyed meanwhile is not created again (checked under the lock, which
    /// destroy holds until the workspace is gone).
    fn ensure_agent(
        &self,
        key: &ConversationKey,
        replace: bool,
        resume: bool,
    ) -> Result<(RunDir, bool)> {
        let run = self.run_dir(key);
        let destroyed = || Error::NotFound(format!("conversation {} was destroyed", key.short()));
        if resume && !run.is_dir() {
            return Err(destroyed());
        }
        create_private_dir_all(&run)?;
        let run_dir = RunDir::open(&run)?;
        let socket = run_dir.socket();
        let lock = lock_file(&run.join("lock"))?;
        if resume && !self.workspace_dir(key).is_dir() {
            return Err(destroyed());
        }
        let network = match &self.egress {
            Some(e) => (e.network)(key)?,
            None => false,
        };
        if agent_answers(&socket) {
            let record = read_record(&run);
            let starting = record.as_ref().is_some_and(|r| {
                now_ms().saturating_sub(r.launched_ms) < STARTING_GRACE.as_millis() as u64
            });
            // A sandbox launched with the other network profile is replaced (between `none`
            // and an allowlist); changes within an allowlist need no relaunch.
            let same_network = record.as_ref().is_none_or(|r| r.network == network);
            if same_network && (!replace || starting) {
                drop(lock);
                return Ok((run_dir, starting));
            }
        }
        // Nothing answers: end whatever is left of an earlier sandbox, then launch.
        kill_recorded(&run);
        let uid = if rustix::process::geteuid().is_root() {
            (self.config.allocate_uid)(key)?
        } else {
            rustix::process::geteuid().as_raw()
        };
        let workspace = self.workspace_dir(key);
        prepare_workspace(&workspace, uid)?;
        let _ = fs::remove_file(&socket);
        let listener = std::os::unix::net::UnixListener::bind(&socket)
            .map_err(|e| Error::Backend(format!("cannot bind the agent socket: {e}")))?;
        let mut spec = SandboxSpec::new(
            &workspace,
            uid,
            uid,
            // At most 64 characters: 160 bits of the key are plenty to tell conversations apart.
            format!("sessionbox-{}-{}", self.instance, &key.as_str()[..40]),
            AGENT_EXE,
        );
        spec.hostname = format!("sbx-{}", key.short());
        spec.limits = self.config.sandbox.clone();
        spec.ro_binds = vec![(self.config.exe.clone(), PathBuf::from(AGENT_EXE))];
        let mut skills = None;
        if let Some(SkillBindsHook(binds)) = &self.skill_binds {
            let binds = binds(key)?;
            skills = Some(
                binds
                    .iter()
                    .filter_map(|(_, inside)| inside.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
                    .collect(),
            );
            spec.ro_binds.extend(binds);
        }
        let mut agent = AgentArgs {
            listen_fd: Some(sandbox::PASSED_FD),
            root: PathBuf::from(WORKSPACE),
            idle_timeout: self
                .config
                .idle_timeout_of
                .as_ref()
                .and_then(|f| f(key))
                .unwrap_or(self.config.idle_timeout)
                .as_secs()
                .max(1),
            limits: Some(self.config.limits),
            ..AgentArgs::default()
        };
        spec.env = vec![("SESSIONBOX_LOG".to_owned(), "warn".to_owned())];
        let gateway_listener = if network {
            let dir = run.join("egress");
            let inside = PathBuf::from(EGRESS_DIR);
            let listener = bind_gateway_socket(&dir, &run_dir, uid)?;
            spec.ro_binds.push((dir, inside.clone()));
            agent.egress_listen = Some(EGRESS_PROXY.parse().map_err(Error::backend)?);
            agent.egress_socket = Some(inside.join("gateway.sock"));
            Some(listener)
        } else {
            None
        };
        spec.args = self.config.agent_args.clone();
        spec.args.extend(
            agent
                .to_argv()
                .into_iter()
                .map(|a| a.to_string_lossy().into_owned()),
        );
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(run.join("agent.log"))
            .map_err(|e| Error::Backend(format!("cannot open the agent log: {e}")))?;
        let stdio = SandboxStdio {
            stdin: std::process::Stdio::null(),
            stdout: std::process::Stdio::null(),
            stderr: std::process::Stdio::from(log),
            passed_fd: Some(OwnedFd::from(listener)),
        };
        let handle = sandbox::launch_with(&spec, &self.config.exe, &[], stdio)?;
        let gateway_pid = match (gateway_listener, &self.egress) {
            (Some(listener), Some(wiring)) => {
                match spawn_gateway(
                    &self.config.exe,
                    &wiring.gateway_args,
                    &self.gateway_env(),
                    listener,
                    key,
                    handle.monitor_pid(),
                    &run,
                ) {
                    Ok(pid) => Some(pid),
                    Err(e) => {
                        drop(handle); // kills the sandbox
                        return Err(e);
                    }
                }
            }
            _ => None,
        };
        let record = SandboxInfo {
            monitor_pid: handle.monitor_pid(),
            init_pid: handle.pid(),
            cgroups: handle.cgroup_paths(),
            launched_ms: now_ms(),
            network,
            gateway_pid,
            pid_namespace: handle.pid_namespace(),
            skills,
        };
        write_atomic(
            &run.join("sandbox.json"),
            &serde_json::to_vec(&record).map_err(Error::backend)?,
        )?;
        // The sandbox outlives this handle (and this process): it is found again through
        // sandbox.json and ends itself when idle.
        let monitor = handle.monitor_pid();
        std::mem::forget(handle);
        // The monitor is this process's child: collect it when the sandbox ends on its own
        // (idle stop, crash), so that a long-lived manager does not keep one zombie per
        // sandbox that ended.
        let _ = std::thread::Builder::new()
            .name("sandbox-reaper".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                if let Some(pid) = rustix::process::Pid::from_raw(monitor as i32) {
                    let _ =
                        rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
                }
            });
        drop(lock);
        Ok((run_dir, true))
    }
}

/// A run directory held by a descriptor, so that its socket has a short path
/// (`/proc/self/fd/N/agent.sock`) however long the data directory is: a Unix socket path may
/// hold at most 107 bytes, and `<data dir>/run/<64 hex>/agent.sock` does not fit under a default
/// data directory such as `/root/.local/share/sessionbox`.
#[derive(Debug, Clone)]
struct RunDir(Arc<OwnedFd>);

impl RunDir {
    fn open(dir: &Path) -> Result<Self> {
        use rustix::fs::{Mode, OFlags};
        rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map(|fd| RunDir(Arc::new(fd)))
        .map_err(|e| Error::Backend(format!("cannot open {}: {e}", dir.display())))
    }

    /// The agent's socket, valid while this value lives (in this process).
    fn socket(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}/agent.sock", self.0.as_raw_fd()))
    }
}

fn lock_file(path: &Path) -> Result<File> {
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::Backend(format!("cannot open {}: {e}", path.display())))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| Error::Backend(format!("cannot lock {}: {e}", path.display())))?;
    Ok(f)
}

/// True when something accepts connections on `socket` (an agent that is up, or starting: the
/// socket is bound before the agent is launched, so a connection waits in the backlog).
fn agent_answers(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

fn read_record(run: &Path) -> Option<SandboxInfo> {
    let data = fs::read(run.join("sandbox.json")).ok()?;
    serde_json::from_slice(&data).ok()
}

/// Binds the conversation's gateway socket: `dir` (root's, 0711, bound read-only into the
/// sandbox) holds `gateway.sock`, owned by the sandbox's uid with mode 0600, so only that uid
/// (and root) can connect. The host never connects to anything in it.
fn bind_gateway_socket(
    dir: &Path,
    run_dir: &RunDir,
    uid: u32,
) -> Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    create_private_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o711))
        .map_err(|e| Error::Backend(format!("cannot set up the egress directory: {e}")))?;
    let path = run_dir
        .socket()
        .with_file_name("egress")
        .join("gateway.sock");
    let _ = fs::remove_file(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path)
        .map_err(|e| Error::Backend(format!("cannot bind the egress gateway socket: {e}")))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::Backend(format!("cannot set up the egress gateway socket: {e}")))?;
    if rustix::process::geteuid().is_root() {
        let id = rustix::process::Uid::from_raw(uid);
        let gid = rustix::process::Gid::from_raw(uid);
        rustix::fs::chown(&path, Some(id), Some(gid)).map_err(|e| {
            Error::Backend(format!("cannot give the egress socket to uid {uid}: {e}"))
        })?;
    }
    Ok(listener)
}

/// The gateway's environment when the caller gave none ([`IsolatedRuntime::with_gateway_env`]):
/// `SESSIONBOX_HOME` and `SESSIONBOX_STORE_URL` as this process has them, so that the gateway
/// (the `sessionbox` binary) reads policies from the same store.
///
/// COMPATIBILITY DEFAULT (issue #17): the only place this crate names the binary's variables.
/// The CLI is to pass its own environment with `with_gateway_env`; then this goes.
pub fn inherited_gateway_env() -> Vec<(OsString, OsString)> {
    ["SESSIONBOX_HOME", "SESSIONBOX_STORE_URL"]
        .into_iter()
        .filter_map(|name| std::env::var_os(name).map(|v| (OsString::from(name), v)))
        .collect()
}

/// Starts the conversation's gateway outside the sandbox, in a session of its own, with the
/// listening socket as descriptor 3; it exits when the sandbox's monitor does. Its stderr goes
/// to `run/<key>/egress.log`.
fn spawn_gateway(
    exe: &Path,
    args: &[String],
    env: &[(OsString, OsString)],
    listener: std::os::unix::net::UnixListener,
    key: &ConversationKey,
    monitor_pid: u32,
    run: &Path,
) -> Result<u32> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    // Above 3, so that the dup2 below never replaces its own source.
    let fd = rustix::io::fcntl_dupfd_cloexec(&listener, 10)
        .map_err(|e| Error::Backend(format!("cannot pass the egress socket: {e}")))?;
    let raw = fd.as_raw_fd();
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(run.join("egress.log"))
        .map_err(|e| Error::Backend(format!("cannot open the egress log: {e}")))?;
    let gateway = GatewayArgs::conversation(3, key.as_str(), i32::try_from(monitor_pid).ok());
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args)
        .args(gateway.to_argv())
        .env_clear()
        .env(
            "SESSIONBOX_LOG",
            std::env::var("SESSIONBOX_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(log));
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    // SAFETY: runs in the forked child before exec: only async-signal-safe calls (setsid,
    // dup2) on integers captured by value; `fd` stays open in the parent until spawn returns.
    // dup2 clears close-on-exec on descriptor 3.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if libc::dup2(raw, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| Error::Backend(format!("cannot start the egress gateway: {e}")))?;
    drop(fd);
    drop(listener);
    let pid = child.id();
    // Collect it when it exits, so that a long-lived manager keeps no zombie.
    let _ = std::thread::Builder::new()
        .name("gateway-reaper".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut child = child;
            let _ = child.wait();
        });
    Ok(pid)
}

/// Kills the recorded gateway, if it is still the process recorded (its command line names
/// the conversation's key: a recycled pid is left alone).
fn kill_gateway(record: &SandboxInfo, run: &Path) {
    let Some(pid) = record.gateway_pid else {
        return;
    };
    let Some(key) = run.file_name().and_then(|k| k.to_str()) else {
        return;
    };
    let ours = fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == key.as_bytes()));
    if ours && let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
}

/// Kills every process of the recorded sandbox and removes its cgroups; returns how many
/// processes were killed.
fn kill_recorded(run: &Path) -> usize {
    let Some(record) = read_record(run) else {
        return 0;
    };
    kill_gateway(&record, run);
    if record.cgroups.is_empty() {
        // No cgroups (rlimit-only limits): the init's PID namespace holds every process.
        let killed = record
            .pid_namespace
            .map_or(0, |ns| sandbox::kill_namespace(record.init_pid, ns));
        if let Some(pid) = rustix::process::Pid::from_raw(record.monitor_pid as i32) {
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG);
        }
        let _ = fs::remove_file(run.join("sandbox.json"));
        return killed;
    }
    let mut killed = std::collections::BTreeSet::new();
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let pids = record.processes();
        if pids.is_empty() || Instant::now() > until {
            break;
        }
        for p in pids {
            if p == std::process::id() || p <= 1 {
                continue;
            }
            if let Some(pid) = rustix::process::Pid::from_raw(p as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                killed.insert(p);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // The monitor lives outside the cgroups' namespaces but inside the cgroups; reap it if it
    // is our child (it is not, after this process restarted: then init reaps it).
    if let Some(pid) = rustix::process::Pid::from_raw(record.monitor_pid as i32) {
        let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG);
    }
    for d in &record.cgroups {
        let until = Instant::now() + Duration::from_secs(2);
        while fs::remove_dir(d).is_err() && d.exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let _ = fs::remove_file(run.join("sandbox.json"));
    killed.len()
}

/// Creates the workspace (0700) and gives it to `uid` when running as root.
fn prepare_workspace(dir: &Path, uid: u32) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::Backend(format!("cannot create the workspace: {e}"))),
    }
    let meta = fs::symlink_metadata(dir)
        .map_err(|e| Error::Backend(format!("cannot inspect the workspace: {e}")))?;
    if !meta.is_dir() {
        return Err(Error::Backend("the workspace is not a directory".into()));
    }
    if rustix::process::geteuid().is_root() {
        use std::os::unix::fs::MetadataExt;
        if meta.uid() != uid || meta.gid() != uid {
            let id = rustix::process::Uid::from_raw(uid);
            let gid = rustix::process::Gid::from_raw(uid);
            rustix::fs::chown(dir, Some(id), Some(gid)).map_err(|e| {
                Error::Backend(format!("cannot give the workspace to uid {uid}: {e}"))
            })?;
        }
    }
    Ok(())
}

fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, data)
        .and_then(|()| fs::rename(&tmp, path))
        .map_err(|e| Error::Backend(format!("cannot write {}: {e}", path.display())))
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Backend(format!("a blocking task failed: {e}")))?
}

#[async_trait]
impl Runtime for IsolatedRuntime {
    fn info(&self) -> RuntimeInfo {
        RuntimeInfo {
            name: "isolated".into(),
            endpoint: None,
            version: None,
            boundary: self.boundary(),
        }
    }

    fn presented_root(&self, _key: &ConversationKey) -> String {
        WORKSPACE.to_owned()
    }

    fn mounted_skills(&self) -> Option<String> {
        self.skill_binds.as_ref().map(|_| SKILLS_ROOT.to_owned())
    }

    fn present_skills(&self, key: &ConversationKey) -> Option<Vec<String>> {
        self.skill_binds.as_ref()?;
        let run = self.run_dir(key);
        let record = read_record(&run)?;
        // Only a sandbox that runs holds its skills; a stopped one mounts them afresh.
        let dir = RunDir::open(&run).ok()?;
        agent_answers(&dir.socket())
            .then_some(record.skills)
            .flatten()
    }

    fn workspace_location(&self, key: &ConversationKey) -> String {
        self.workspace_dir(key).to_string_lossy().into_owned()
    }

    async fn open(&self, conversation: &ConversationRef) -> Result<Box<dyn Session>> {
        let key = conversation.key.clone();
        let mut replace = false;
        loop {
            let this = self.clone();
            let k = key.clone();
            let (run_dir, launched) =
                blocking(move || this.ensure_agent(&k, replace, false)).await?;
            let endpoint = sessionbox_execd::Endpoint::Unix(run_dir.socket());
            // A short deadline for the liveness ping: an agent that accepts but does not answer
            // (stopped by a signal, wedged) is replaced instead of hanging every call.
            let probe = ExecdClient::builder(endpoint.clone())
                .request_timeout(Some(PING_TIMEOUT))
                .build()
                .map_err(Error::from)?;
            let deadline = Instant::now() + STARTING_GRACE;
            let mut refused = false;
            let answered = loop {
                match probe.ping().await {
                    Ok(()) => break true,
                    // The socket is bound before the agent is launched, so a starting agent
                    // never refuses a connection: one that does has died (crashed, killed)
                    // after ensure_agent found it, and is replaced.
                    Err(sessionbox_execd::ExecdError::Connect { .. }) => {
                        refused = true;
                        break false;
                    }
                    Err(_) if launched && Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    Err(_) => break false,
                }
            };
            if answered {
                let client = ExecdClient::builder(endpoint)
                    .request_timeout(Some(Duration::from_secs(120)))
                    .build()
                    .map_err(Error::from)?;
                return Ok(Box::new(IsolatedSession {
                    key,
                    client,
                    runtime: self.clone(),
                    run_dir,
                }));
            }
            if (launched && !refused) || replace {
                return Err(Error::Backend(format!(
                    "the sandbox agent did not answer; see {}",
                    self.run_dir(&key).join("agent.log").display()
                )));
            }
            replace = true;
        }
    }

    async fn destroy(&self, key: &ConversationKey) -> Result<DestroyReport> {
        let run = self.run_dir(key);
        let workspace = self.workspace_dir(key);
        blocking(move || {
            let mut report = DestroyReport::default();
            // Held until the workspace is gone, so that a session held across this destroy
            // finds it gone rather than launching the conversation again.
            let mut lock = None;
            if run.exists() {
                lock = Some(lock_file(&run.join("lock"))?);
                let had = read_record(&run).is_some();
                report.processes_killed = kill_recorded(&run);
                report.sandbox_removed = had;
            }
            match fs::symlink_metadata(&workspace) {
                Ok(_) => {
                    sessionbox_fs::remove_tree(&workspace)
                        .map_err(|e| Error::Backend(format!("cannot remove the workspace: {e}")))?;
                    report.workspace_removed = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::Backend(format!("cannot inspect the workspace: {e}"))),
            }
            if lock.is_some() {
                sessionbox_fs::remove_tree(&run)
                    .map_err(|e| Error::Backend(format!("cannot remove the run directory: {e}")))?;
            }
            drop(lock);
            Ok(report)
        })
        .await
    }

    async fn list(&self) -> Result<Vec<RuntimeConversation>> {
        let workspaces = self.workspaces.clone();
        let run = self.run.clone();
        blocking(move || {
            let mut keys = std::collections::BTreeSet::new();
            for dir in [&workspaces, &run] {
                let entries = fs::read_dir(dir)
                    .map_err(|e| Error::Backend(format!("cannot list {}: {e}", dir.display())))?;
                for entry in entries.flatten() {
                    if let Some(k) = entry
                        .file_name()
                        .to_str()
                        .and_then(|n| ConversationKey::parse(n).ok())
                    {
                        keys.insert(k);
                    }
                }
            }
            Ok(keys
                .into_iter()
                .map(|key| {
                    let processes = read_record(&run.join(key.as_str()))
                        .map(|r| r.processes())
                        .unwrap_or_default();
                    RuntimeConversation { key, processes }
                })
                .collect())
        })
        .await
    }
}

/// An open `isolated` conversation: an execd client of its agent.
struct IsolatedSession {
    key: ConversationKey,
    client: ExecdClient,
    /// Launches the agent again when it stopped (idle timeout, crash) while this session was
    /// held.
    runtime: IsolatedRuntime,
    /// Keeps the socket's short path valid.
    run_dir: RunDir,
}

impl IsolatedSession {
    /// Runs a command through the agent's event stream, handing stdout and stderr events to
    /// `sink` as they arrive (capped at the request's output limit).
    async fn run(&self, request: ExecRequest, sink: Option<ExecSink<'_>>) -> Result<ExecResult> {
        request.validate()?;
        let cwd = checked(request.cwd.as_deref().unwrap_or("."))?;
        let run = RunCommandRequest::for_exec(&request, cwd);
        let taken = std::sync::atomic::AtomicBool::new(false);
        // `relaunching` may build the call twice (the first never reached an agent, so nothing
        // was handed over): the sink is shared through a lock, uncontended.
        let sink = sink.map(|s| std::sync::Mutex::new(CappedSink::new(s, request.output_limit)));
        // When this future is dropped mid-command (a caller that went away, a killed background
        // command), the agent is told to kill the command: closing the connection alone is
        // noticed only when the command next writes.
        let mut interrupt = InterruptOnDrop {
            client: self.client.clone(),
            id: std::sync::Mutex::new(None),
            armed: true,
        };
        let out = self
            .relaunching(
                || {
                    self.client.run_command_with(&run, |event| {
                        taken.store(true, std::sync::atomic::Ordering::SeqCst);
                        if event.kind == sessionbox_execd::EventType::Init {
                            *interrupt.id.lock().unwrap_or_else(|e| e.into_inner()) =
                                event.text.clone();
                        }
                        if let (Some(sink), Some((stream, bytes))) = (&sink, event.output_stream())
                        {
                            sink.lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(stream, bytes);
                        }
                    })
                },
                || taken.load(std::sync::atomic::Ordering::SeqCst),
            )
            .await;
        interrupt.armed = false;
        let out = out?;
        out.into_exec_result(request.output_limit, "")
    }

    async fn send_fs(&self, request: FsRequest) -> Result<FsResponse> {
        self.relaunching(|| self.client.fs(&request), || false)
            .await
    }

    /// Runs `call`. When nothing accepts the connection, the request reached no agent (it
    /// stopped while this session was held): launch it again, unless the conversation was
    /// destroyed meanwhile, and retry once.
    ///
    /// `taken` says whether the agent is known to have taken the request (a command whose
    /// first event arrived): then a broken connection means the agent died while serving it,
    /// and it is not sent again.
    async fn relaunching<T, F>(&self, call: impl Fn() -> F, taken: impl Fn() -> bool) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<T, sessionbox_execd::ExecdError>>,
    {
        match call().await {
            // Nothing accepted the connection, or a pooled connection was closed under the
            // request because the agent exited (idle stop) just then: in both cases the agent
            // never took the request.
            Err(
                e @ (sessionbox_execd::ExecdError::Connect { .. }
                | sessionbox_execd::ExecdError::Transport { .. }),
            ) if self.runtime.workspace_dir(&self.key).is_dir() => {
                let socket = self.run_dir.socket();
                if matches!(e, sessionbox_execd::ExecdError::Transport { .. })
                    && (taken() || agent_answers(&socket))
                {
                    return Err(Error::from(e));
                }
                let runtime = self.runtime.clone();
                let key = self.key.clone();
                blocking(move || runtime.ensure_agent(&key, false, true)).await?;
                call().await.map_err(Error::from)
            }
            r => r.map_err(Error::from),
        }
    }
}

/// Asks the agent to kill a command when dropped while armed (see `IsolatedSession::run`).
struct InterruptOnDrop {
    client: ExecdClient,
    /// The command's id, from its `init` event.
    id: std::sync::Mutex<Option<String>>,
    armed: bool,
}

impl Drop for InterruptOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let id = self.id.lock().unwrap_or_else(|e| e.into_inner()).take();
        let (Some(id), Ok(rt)) = (id, tokio::runtime::Handle::try_current()) else {
            return;
        };
        let client = self.client.clone();
        rt.spawn(async move {
            if let Err(e) = client.interrupt_command(&id).await {
                tracing::debug!(error = %e, "could not interrupt an abandoned command");
            }
        });
    }
}

/// Checks a path here, before anything is sent (the agent checks it again beneath its root).
fn checked(path: &str) -> Result<String> {
    WorkspacePath::resolve(WORKSPACE, path).map(|p| p.presented(WORKSPACE))
}

#[async_trait]
impl FsSession for IsolatedSession {
    fn presented_root(&self) -> &str {
        WORKSPACE
    }

    async fn fs(&self, request: FsRequest) -> Result<FsResponse> {
        self.send_fs(request).await
    }
}

#[async_trait]
impl Session for IsolatedSession {
    fn key(&self) -> &ConversationKey {
        &self.key
    }

    fn workspace_root(&self) -> &str {
        WORKSPACE
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

    // Background commands are the agent's (see `sessionbox_execd::commands_ext`): they live
    // as long as the sandbox, whoever opened it.

    async fn spawn(&self, request: ExecRequest) -> Result<BackgroundCommand> {
        request.validate()?;
        let cwd = checked(request.cwd.as_deref().unwrap_or("."))?;
        let run = sessionbox_execd::commands_ext::run_request(&request, cwd);
        self.relaunching(|| self.client.spawn_background(&run), || false)
            .await
    }

    async fn commands(&self) -> Result<Vec<BackgroundCommand>> {
        self.relaunching(|| self.client.background_commands(), || false)
            .await
    }

    async fn command(&self, id: &str) -> Result<BackgroundCommand> {
        validate_command_id(id)?;
        self.relaunching(|| self.client.background_command(id), || false)
            .await
    }

    async fn command_output(&self, id: &str, read: OutputRequest) -> Result<CommandOutput> {
        validate_command_id(id)?;
        read.validate()?;
        self.relaunching(|| self.client.background_output(id, read), || false)
            .await
    }

    async fn kill_command(&self, id: &str) -> Result<BackgroundCommand> {
        validate_command_id(id)?;
        self.relaunching(|| self.client.kill_background(id), || false)
            .await
    }

    async fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(dir: &Path) -> IsolatedRuntime {
        let config = IsolatedConfig::new(dir, "/bin/true", Arc::new(|_| Ok(4_000_000)))
            .with_sandbox(SandboxLimits {
                mode: sandbox::LimitMode::Rlimit,
                ..SandboxLimits::default()
            });
        IsolatedRuntime::new(config).unwrap()
    }

    #[test]
    fn the_defaults_are_those_of_the_configuration_file() {
        let config = IsolatedConfig::new("/d", "/e", Arc::new(|_| Ok(1)));
        assert_eq!(config.idle_timeout, Duration::from_secs(600));
        assert_eq!(config.agent_args, ["agent"]);
        assert!(config.idle_timeout_of.is_none());
        assert_eq!(IsolatedConfig::uid_range(None, None), 3_000_000..3_065_536);
        assert_eq!(IsolatedConfig::uid_range(Some(10), Some(5)), 10..15);
        assert_eq!(
            IsolatedConfig::uid_range(Some(u32::MAX - 1), None),
            u32::MAX - 1..u32::MAX
        );
    }

    #[test]
    fn sandbox_info_reads_what_the_launch_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(dir.path());
        let key = ConversationKey::parse(&"ab".repeat(32)).unwrap();
        assert_eq!(rt.sandbox_info(&key), None);
        let info = SandboxInfo {
            monitor_pid: 7,
            init_pid: 8,
            cgroups: vec![PathBuf::from("/sys/fs/cgroup/x")],
            launched_ms: 9,
            network: true,
            gateway_pid: Some(10),
            pid_namespace: None,
            skills: Some(vec!["s".into()]),
        };
        create_private_dir_all(&rt.run_dir(&key)).unwrap();
        write_atomic(
            &rt.run_dir(&key).join("sandbox.json"),
            &serde_json::to_vec(&info).unwrap(),
        )
        .unwrap();
        assert_eq!(rt.sandbox_info(&key), Some(info));
        assert!(rt.agent_socket(&key).ends_with("agent.sock"));
    }
}
