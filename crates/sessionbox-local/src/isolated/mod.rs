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
//!
//! The code: `config` (settings, hooks, [`SandboxInfo`]), `launch` (finding a running agent
//! or launching one, the run directory, the gateway), `session` (an open conversation over
//! execd).

mod config;
mod launch;
mod session;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sessionbox_core::{
    ConversationKey, ConversationRef, DestroyReport, Error, Result, Runtime, RuntimeConversation,
    RuntimeInfo, Session,
};
use sessionbox_execd::ExecdClient;
use sessionbox_sandbox as sandbox;

use self::config::SkillBindsHook;
pub use self::config::{
    EgressWiring, IdleTimeoutLookup, IsolatedConfig, NetworkCheck, SandboxInfo, SkillBinds,
    UidAllocator,
};
pub use self::launch::inherited_gateway_env;
use self::launch::{RunDir, STARTING_GRACE, agent_answers, kill_recorded, lock_file, read_record};
use self::session::IsolatedSession;
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sessionbox_sandbox::SandboxLimits;

    use super::launch::write_atomic;
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
