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
//!   With a disk quota (the default as root) it is the mount point of the conversation's own
//!   ext4 volume `disks/<key>.img`, whose size and inode count are the quota (see `disk`).
//! - `run/<key>/`: 0700, root's: `lock`, `agent.sock`, `sandbox.json` (cgroups, pids),
//!   `agent.log` (the agent's stderr, rotated to `agent.log.1` at `log_max_bytes` by a
//!   [`log_relay`](crate::log_relay)), `egress.log` likewise for the gateway.
//!
//! What the runtime needs to know about a recorded conversation (its host uid, idle timeout,
//! skills and network policy) it asks the [`Directory`] it is given, from async code before it
//! goes to a blocking thread, and at most once per open.
//!
//! The code: `config` (settings, egress wiring, [`SandboxInfo`]), `launch` (finding a running
//! agent or launching one, the run directory), `gateway` (the egress gateway: its socket, its
//! start, and its start again when it ended while the sandbox runs), `session` (an open
//! conversation over execd).

mod clone;
mod config;
pub(crate) mod disk;
mod gateway;
mod launch;
mod pool;
mod session;
mod uid_claim;

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sessionbox_core::{
    ConversationKey, ConversationRef, DestroyReport, Directory, DiskUsage, Error, MemoryMeasure,
    MemoryUsage, Result, Runtime, RuntimeConversation, RuntimeInfo, Session,
};
use sessionbox_execd::ExecdClient;
use sessionbox_sandbox as sandbox;

pub use self::config::{EgressWiring, IsolatedConfig, PoolSizes, SandboxInfo};
pub use self::disk::{DiskQuota, probe as probe_disk_quota};
use self::launch::{RunDir, STARTING_GRACE, agent_answers, kill_recorded, lock_file, read_record};
use self::session::IsolatedSession;
pub use self::uid_claim::{REGISTRY as UID_REGISTRY, overlapping_claims};
use crate::host::create_private_dir_all;

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
/// Where mounted skills appear inside the sandbox.
pub const SKILLS_ROOT: &str = "/skills";

/// The `isolated` runtime. See the module documentation.
#[derive(Clone)]
pub struct IsolatedRuntime {
    config: IsolatedConfig,
    /// What it asks about recorded conversations (uid, idle timeout, skills, network).
    directory: Arc<dyn Directory>,
    workspaces: PathBuf,
    /// The workspaces' disk images (`<key>.img`), with a disk quota.
    disks: PathBuf,
    run: PathBuf,
    /// Distinguishes this data directory's cgroups from another's (cgroup names are global).
    instance: String,
    /// The egress wiring, if conversations may reach the network.
    egress: Option<EgressWiring>,
    /// Skills bound read-only at `/skills/<name>` ([`IsolatedRuntime::with_skills`]).
    skills: bool,
    /// Serialises this process's refills of the warm pool (see `pool`).
    pool_refill: Arc<tokio::sync::Mutex<()>>,
    /// Whether the sandbox limits can hold here ([`sandbox::check_limits`]), asked before this
    /// process's first launch: a call that only uses a running sandbox (most CLI calls) does
    /// not make and remove a probe cgroup.
    limits_checked: Arc<std::sync::OnceLock<Result<()>>>,
}

impl fmt::Debug for IsolatedRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IsolatedRuntime")
            .field("config", &self.config)
            .field("workspaces", &self.workspaces)
            .field("run", &self.run)
            .field("instance", &self.instance)
            .field("egress", &self.egress)
            .field("skills", &self.skills)
            .finish_non_exhaustive()
    }
}

impl IsolatedRuntime {
    /// The boundary this runtime gives, in one sentence.
    pub const BOUNDARY: &'static str = "a Linux sandbox per conversation: own user, mount, PID, IPC, UTS, network and cgroup namespaces, its own host uid, read-only system directories, landlock, seccomp, cgroup limits, a disk quota (its own file system), no network";

    /// The runtime with `config`, asking `directory` about recorded conversations (the
    /// manager's `StoreDirectory` over the store). Creates the data directory's `workspaces`
    /// and `run` directories. Whether the sandbox limits can hold here is checked before the
    /// first launch ([`IsolatedRuntime::check_limits`]), not here: most one-off calls use a
    /// sandbox that runs already.
    ///
    /// # Errors
    /// [`Error::Backend`] when the directories cannot be created.
    pub fn new(config: IsolatedConfig, directory: Arc<dyn Directory>) -> Result<Self> {
        let workspaces = config.data_dir.join("workspaces");
        let run = config.data_dir.join("run");
        let disks = config.data_dir.join("disks");
        create_private_dir_all(&workspaces)?;
        if config.disk.is_some() && rustix::process::geteuid().is_root() {
            create_private_dir_all(&disks)?;
        }
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
            disks,
            run,
            instance,
            config,
            directory,
            egress: None,
            skills: false,
            pool_refill: Arc::default(),
            limits_checked: Arc::default(),
        })
    }

    /// Whether the sandbox limits can hold here ([`sandbox::check_limits`]: with cgroups, the
    /// default, a probe cgroup is made and removed), asked once per process; every launch asks
    /// first, and a long-lived front end may ask at its start.
    ///
    /// # Errors
    /// [`Error::RuntimeUnavailable`] when the limits are cgroups and no cgroup can be made
    /// (without root: none is delegated to the caller), saying how to delegate one or choose
    /// rlimit-only limits.
    pub fn check_limits(&self) -> Result<()> {
        self.limits_checked
            .get_or_init(|| sandbox::check_limits(&self.config.sandbox))
            .clone()
    }

    /// Lets conversations whose profile allows it reach the network through the egress
    /// gateway (see [`EgressWiring`]).
    #[must_use]
    pub fn with_egress(mut self, egress: EgressWiring) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Presents each conversation's skills read-only at `/skills/<name>`: the directory is
    /// asked for their binds ([`Directory::skill_binds`]) whenever a sandbox is launched (a
    /// running sandbox keeps the binds it started with until it stops when idle). Without it
    /// nothing is mounted at `/skills`.
    #[must_use]
    pub fn with_skills(mut self) -> Self {
        self.skills = true;
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
        match self.config.disk {
            None => {
                b = b.replace(
                    "a disk quota (its own file system)",
                    "no disk quota (turned off: workspaces share the host's disk)",
                );
            }
            Some(_) if !self.disk_quota_applies() => {
                b = b.replace(
                    "a disk quota (its own file system)",
                    "no disk quota (not root: workspaces share the host's disk)",
                );
            }
            Some(_) => {}
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

    /// True when workspaces get their disk quota: one is configured and this process is root
    /// (mounting a volume needs it).
    fn disk_quota_applies(&self) -> bool {
        self.config.disk.is_some() && rustix::process::geteuid().is_root()
    }

    /// The disk image of `key`'s workspace.
    fn disk_image(&self, key: &ConversationKey) -> PathBuf {
        disk::image_path(&self.disks, key.as_str())
    }

    fn workspace_dir(&self, key: &ConversationKey) -> PathBuf {
        self.workspaces.join(key.as_str())
    }

    fn run_dir(&self, key: &ConversationKey) -> PathBuf {
        self.run.join(key.as_str())
    }
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
        self.skills.then(|| SKILLS_ROOT.to_owned())
    }

    fn present_skills(&self, key: &ConversationKey) -> Option<Vec<String>> {
        if !self.skills {
            return None;
        }
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
            let (run_dir, launched) = self.ensure_agent(conversation, replace, false).await?;
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
                    conversation: conversation.clone(),
                    client,
                    runtime: self.clone(),
                    run_dir,
                    gateway: std::sync::Mutex::default(),
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
        let image = self.disk_image(key);
        blocking(move || {
            let mut report = DestroyReport::default();
            // Held until the workspace is gone, so that a session held across this destroy
            // finds it gone rather than launching the conversation again.
            let mut lock = None;
            if run.exists() {
                lock = Some(lock_file(&run.join("lock"))?);
                // Thawed before its processes are killed and its volume unmounted: a frozen
                // file system would keep them, and the volume, forever.
                clone::recover_pause(&run, &workspace);
                let had = read_record(&run).is_some();
                report.processes_killed = kill_recorded(&run);
                report.sandbox_removed = had;
            }
            // The volume first (a detached unmount: the files go with the image), then the
            // mount point or a workspace without a volume.
            if disk::remove_volume(&workspace, &image)? {
                report.workspace_removed = true;
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

    async fn refill_pool(&self, tenant: &sessionbox_core::TenantId) -> Result<usize> {
        IsolatedRuntime::refill_pool(self, tenant).await
    }

    async fn prune_pool(&self, drain: bool) -> Result<usize> {
        IsolatedRuntime::prune_pool(self, drain).await
    }

    fn clones(&self) -> Option<&dyn sessionbox_core::WorkspaceClones> {
        Some(self)
    }

    async fn disk_usage(&self, key: &ConversationKey) -> Result<Option<DiskUsage>> {
        if !self.disk_quota_applies() {
            return Ok(None);
        }
        let workspace = self.workspace_dir(key);
        blocking(move || Ok(disk::usage(&workspace))).await
    }

    /// The sandbox's memory cgroup charge against its limit; with rlimit-only limits (no
    /// cgroup) the resident memory of its processes, unbounded as a whole. `None` when no
    /// sandbox runs (its record is gone, or lists no live process).
    async fn memory_usage(&self, key: &ConversationKey) -> Result<Option<MemoryUsage>> {
        let run = self.run_dir(key);
        blocking(move || {
            let Some(info) = read_record(&run) else {
                return Ok(None);
            };
            if let Some(charge) = sessionbox_process::memory_charge(&info.cgroups) {
                return Ok(Some(charge));
            }
            let pids = info.processes();
            Ok((!pids.is_empty()).then(|| MemoryUsage {
                bytes_used: sessionbox_process::resident_bytes(&pids),
                bytes_limit: None,
                measured: MemoryMeasure::Processes,
            }))
        })
        .await
    }

    async fn list(&self) -> Result<Vec<RuntimeConversation>> {
        let workspaces = self.workspaces.clone();
        let run = self.run.clone();
        let disks = self.disks.clone();
        blocking(move || {
            let mut keys = std::collections::BTreeSet::new();
            for dir in [&workspaces, &run, &disks] {
                let entries = match fs::read_dir(dir) {
                    Ok(entries) => entries,
                    // No disk quota was ever used here.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir == &disks => continue,
                    Err(e) => {
                        return Err(Error::Backend(format!(
                            "cannot list {}: {e}",
                            dir.display()
                        )));
                    }
                };
                for entry in entries.flatten() {
                    // A disk image left by a destroy that did not finish counts too.
                    if let Some(k) = entry
                        .file_name()
                        .to_str()
                        .map(|n| n.strip_suffix(".img").unwrap_or(n))
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

#[cfg(test)]
mod tests {
    use std::ops::Range;

    use chrono::{DateTime, Utc};
    use sessionbox_core::{NetworkPolicy, RemoteSandbox};
    use sessionbox_sandbox::SandboxLimits;

    use super::launch::write_atomic;
    use super::*;

    /// A directory that records nothing: no network, the first uid of the range, no idle
    /// timeout or skills of a conversation's own, no remote sandboxes.
    struct Nothing;

    #[async_trait]
    impl Directory for Nothing {
        async fn network(&self, _: &ConversationRef) -> Result<NetworkPolicy> {
            Ok(NetworkPolicy {
                json: r#"{"profile":"none"}"#.into(),
                hash: None,
                allows_network: false,
            })
        }
        async fn sandbox_uid(&self, _: &ConversationKey, range: Range<u32>) -> Result<u32> {
            Ok(range.start)
        }
        async fn idle_timeout(&self, _: &ConversationKey) -> Result<Option<Duration>> {
            Ok(None)
        }
        async fn skill_binds(&self, _: &ConversationKey) -> Result<Vec<(PathBuf, PathBuf)>> {
            Ok(Vec::new())
        }
        async fn remote_sandbox(&self, _: &ConversationKey) -> Result<Option<RemoteSandbox>> {
            Ok(None)
        }
        async fn remote_sandboxes(&self, _: &str) -> Result<Vec<RemoteSandbox>> {
            Ok(Vec::new())
        }
        async fn record_remote_sandbox(
            &self,
            _: &ConversationKey,
            _: &str,
            _: &str,
            _: Option<DateTime<Utc>>,
        ) -> Result<(RemoteSandbox, bool)> {
            Err(Error::Backend("no remote sandboxes here".into()))
        }
        async fn replace_remote_sandbox(
            &self,
            _: &ConversationKey,
            _: &str,
            _: &str,
            _: Option<DateTime<Utc>>,
        ) -> Result<bool> {
            Ok(false)
        }
        async fn set_remote_sandbox_expiry(
            &self,
            _: &ConversationKey,
            _: &str,
            _: Option<DateTime<Utc>>,
        ) -> Result<bool> {
            Ok(false)
        }
        async fn forget_remote_sandbox(&self, _: &ConversationKey, _: &str) -> Result<bool> {
            Ok(false)
        }
    }

    fn runtime(dir: &Path) -> IsolatedRuntime {
        let config = IsolatedConfig::new(dir, "/bin/true")
            .with_uids(4_000_000..4_000_001)
            .with_sandbox(SandboxLimits {
                mode: sandbox::LimitMode::Rlimit,
                ..SandboxLimits::default()
            });
        IsolatedRuntime::new(config, Arc::new(Nothing)).unwrap()
    }

    #[test]
    fn the_defaults_are_those_of_the_configuration_file() {
        let config = IsolatedConfig::new("/d", "/e");
        assert_eq!(config.idle_timeout, Duration::from_secs(600));
        assert_eq!(config.agent_args, ["agent"]);
        assert_eq!(config.uids, IsolatedConfig::uid_range(None, None));
        assert_eq!(IsolatedConfig::uid_range(None, None), 3_000_000..3_065_536);
        assert_eq!(IsolatedConfig::uid_range(Some(10), Some(5)), 10..15);
        assert_eq!(
            IsolatedConfig::uid_range(Some(u32::MAX - 1), None),
            u32::MAX - 1..u32::MAX
        );
    }

    #[test]
    fn a_disk_quota_is_on_by_default_and_out_of_range_values_are_refused() {
        let config = IsolatedConfig::new("/d", "/e");
        assert_eq!(config.disk, Some(DiskQuota::default()));
        assert_eq!(
            DiskQuota::default(),
            DiskQuota::new(1 << 30, 100_000).unwrap()
        );
        for (bytes, inodes) in [(1 << 20, 100), (64 << 20, 10), (64 << 20, 1 << 20)] {
            let e = DiskQuota::new(bytes, inodes).unwrap_err();
            assert_eq!(e.code(), "invalid_request", "{e}");
        }
        assert!(DiskQuota::new(DiskQuota::MIN_BYTES, DiskQuota::MIN_INODES).is_ok());
    }

    #[tokio::test]
    async fn a_conversation_without_its_own_idle_timeout_gets_the_configured_one() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(dir.path());
        let key = ConversationKey::parse(&"cd".repeat(32)).unwrap();
        let facts = rt.facts(&key).await.unwrap();
        assert_eq!(facts.idle_timeout, IsolatedConfig::DEFAULT_IDLE_TIMEOUT);
        assert_eq!(
            facts.skill_binds, None,
            "no skills configured: none asked for"
        );
        if rustix::process::geteuid().is_root() {
            assert_eq!(facts.uid, 4_000_000);
        }
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
