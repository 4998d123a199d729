//! Finding a conversation's running agent or launching its sandbox, under the conversation's
//! lock: the run directory, the agent's command line, the record (`sandbox.json`), and ending
//! what an earlier sandbox left. The gateway beside it is `gateway`'s.
//!
//! The directory is asked from async code only: the network policy before the lock is taken,
//! the uid, idle timeout and skills only when nothing answers and a sandbox is to be launched;
//! the file work runs on blocking threads in between.

use std::fs::{self, File};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sessionbox_core::{ConversationKey, ConversationRef, Error, Result};
use sessionbox_execd::agent_args::AgentArgs;
use sessionbox_sandbox::{self as sandbox, SandboxSpec, SandboxStdio};

use super::gateway::{bind_gateway_socket, kill_gateway, spawn_gateway};
use super::{
    AGENT_EXE, EGRESS_DIR, EGRESS_PROXY, IsolatedRuntime, SandboxInfo, WORKSPACE, blocking,
};
use crate::host::create_private_dir_all;
use crate::log_relay;

/// A sandbox launched less than this long ago is starting, not hung: it is given time to answer
/// rather than replaced.
pub(super) const STARTING_GRACE: Duration = Duration::from_secs(10);

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What a launch needs to know about the recorded conversation, asked of the directory once
/// (from async code) before the launch goes to a blocking thread.
pub(super) struct Facts {
    /// The host uid (and gid) it runs as.
    pub(super) uid: u32,
    /// How long its agent waits for a request before it stops.
    pub(super) idle_timeout: Duration,
    /// The read-only binds presenting its skills, when skills are configured.
    pub(super) skill_binds: Option<Vec<(PathBuf, PathBuf)>>,
}

/// The host name of `key`'s sandbox.
pub(super) fn hostname_of(key: &ConversationKey) -> String {
    format!("sbx-{}", key.short())
}

/// Where a sandbox lives on the host and what names it: a conversation's, or a warm pool
/// slot's until it is bound.
pub(super) struct Place {
    /// The host directory bound at `/workspace` (a volume's mount point with a disk quota).
    pub(super) workspace: PathBuf,
    /// The workspace's disk image, with a disk quota.
    pub(super) image: PathBuf,
    /// The name of its cgroups.
    pub(super) cgroup: String,
    /// Its UTS host name.
    pub(super) hostname: String,
}

/// What [`IsolatedRuntime::find_or_lock`] found: a running agent (and whether it is starting),
/// or nothing that answers, with the conversation's lock held for the launch.
enum Found {
    Running(RunDir, bool),
    Vacant(RunDir, File),
}

/// A sandbox ready to launch: its spec and descriptors, and what is recorded about it.
pub(super) struct Launch {
    spec: SandboxSpec,
    stdio: SandboxStdio,
    /// The gateway's listening socket, when the conversation may reach the network.
    gateway_listener: Option<UnixListener>,
    network: bool,
    skills: Option<Vec<String>>,
}

impl IsolatedRuntime {
    /// Finds the conversation's running agent or launches one; returns the socket path and
    /// whether this call launched it. With `replace`, an agent that accepts connections but did
    /// not answer a ping (stopped, wedged) is ended and replaced, unless it was launched moments
    /// ago (then it is starting).
    ///
    /// With `resume` (a session held across a stop), only a conversation that still exists is
    /// served: one destroyed meanwhile is not created again (checked under the lock, which
    /// destroy holds until the workspace is gone).
    pub(super) async fn ensure_agent(
        &self,
        conversation: &ConversationRef,
        replace: bool,
        resume: bool,
    ) -> Result<(RunDir, bool)> {
        let network = match &self.egress {
            Some(_) => self.directory.network(conversation).await?.allows_network,
            None => false,
        };
        let (this, key) = (self.clone(), conversation.key.clone());
        let found = blocking(move || this.find_or_lock(&key, network, replace, resume)).await?;
        let (run_dir, lock) = match found {
            Found::Running(run_dir, starting) => return Ok((run_dir, starting)),
            Found::Vacant(run_dir, lock) => (run_dir, lock),
        };
        // Held across these calls: another opener waits for this launch instead of racing it.
        // A new conversation whose sandbox would be like a warm pool's takes one (its lock is
        // released when the bound run directory replaces this one).
        let lock = match self.bind_from_pool(conversation, network, lock).await? {
            Ok(run_dir) => return Ok((run_dir, true)),
            Err(lock) => lock,
        };
        let facts = self.facts(&conversation.key).await?;
        let (this, key) = (self.clone(), conversation.key.clone());
        blocking(move || {
            let run = this.run_dir(&key);
            // Nothing answers: end whatever is left of an earlier sandbox, then launch.
            kill_recorded(&run);
            let place = this.place_of(&key);
            let launch = this.build_spec(&place, &run, &run_dir, network, facts)?;
            this.launch_and_record(Some(&key), &run, launch)?;
            drop(lock);
            Ok((run_dir, true))
        })
        .await
    }

    /// Under the conversation's lock: its running agent, if one may be kept, else the lock
    /// (still held) for a launch. Blocks.
    fn find_or_lock(
        &self,
        key: &ConversationKey,
        network: bool,
        replace: bool,
        resume: bool,
    ) -> Result<Found> {
        let run = self.run_dir(key);
        let destroyed = || Error::NotFound(format!("conversation {} was destroyed", key.short()));
        if resume && !run.is_dir() {
            return Err(destroyed());
        }
        let (run_dir, lock) = loop {
            create_private_dir_all(&run)?;
            let run_dir = RunDir::open(&run)?;
            let lock = lock_file(&run.join("lock"))?;
            // A warm pool's run directory may have replaced this one while this call waited
            // for the lock (a bind exchanges them): then the lock and directory held are the
            // old ones, and the conversation's are taken again.
            if run_dir.is(&run) {
                break (run_dir, lock);
            }
        };
        // A clone that died while it had this conversation stopped and frozen.
        super::clone::recover_pause(&run, &self.workspace_dir(key));
        if resume && !self.workspace_dir(key).is_dir() {
            return Err(destroyed());
        }
        Ok(match find_running(&run, &run_dir, network, replace) {
            Some(starting) => {
                // Its gateway may have ended while it ran: started again under the lock.
                if network && let Some(mut record) = read_record(&run) {
                    self.restart_gateway(key, &run, &run_dir, &mut record)?;
                }
                Found::Running(run_dir, starting)
            }
            None => Found::Vacant(run_dir, lock),
        })
    }

    /// What the launch of `key`'s sandbox needs from the directory: its uid (the caller's own
    /// without root), its idle timeout (the configured one when it has none of its own) and,
    /// with skills, their binds.
    pub(super) async fn facts(&self, key: &ConversationKey) -> Result<Facts> {
        let euid = rustix::process::geteuid();
        let uid = if euid.is_root() {
            self.directory
                .sandbox_uid(key, self.config.uids.clone())
                .await?
        } else {
            euid.as_raw()
        };
        let idle_timeout = match self.directory.idle_timeout(key).await {
            Ok(own) => own.unwrap_or(self.config.idle_timeout),
            Err(e) => {
                // As before the directory: the default applies when it cannot be read.
                tracing::warn!("cannot read the idle timeout of {}: {e}", key.short());
                self.config.idle_timeout
            }
        };
        let skill_binds = match self.skills {
            true => Some(self.directory.skill_binds(key).await?),
            false => None,
        };
        Ok(Facts {
            uid,
            idle_timeout,
            skill_binds,
        })
    }

    /// Where `key`'s sandbox lives: its workspace, disk image, cgroup name and host name.
    pub(super) fn place_of(&self, key: &ConversationKey) -> Place {
        Place {
            workspace: self.workspace_dir(key),
            image: self.disk_image(key),
            cgroup: self.cgroup_name(key),
            hostname: hostname_of(key),
        }
    }

    /// The name of `key`'s cgroups: at most 64 characters (160 bits of the key are plenty to
    /// tell conversations apart), distinct per data directory.
    pub(super) fn cgroup_name(&self, key: &ConversationKey) -> String {
        format!("sessionbox-{}-{}", self.instance, &key.as_str()[..40])
    }

    /// Prepares the workspace for the conversation's uid, binds the agent's socket (and the
    /// gateway's, with `network`) and builds the sandbox's spec: binds, skills, the agent's
    /// command line ([`AgentArgs`]) and its log.
    pub(super) fn build_spec(
        &self,
        place: &Place,
        run: &Path,
        run_dir: &RunDir,
        network: bool,
        facts: Facts,
    ) -> Result<Launch> {
        self.check_limits()?;
        let uid = facts.uid;
        let workspace = place.workspace.clone();
        if let Some(quota) = self.config.disk.filter(|_| self.disk_quota_applies()) {
            super::disk::ensure_volume(&workspace, &place.image, quota, uid)?;
        }
        prepare_workspace(&workspace, uid)?;
        let socket = run_dir.socket();
        let _ = fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket)
            .map_err(|e| Error::Backend(format!("cannot bind the agent socket: {e}")))?;
        let mut spec = SandboxSpec::new(&workspace, uid, uid, place.cgroup.clone(), AGENT_EXE);
        spec.hostname = place.hostname.clone();
        spec.limits = self.config.sandbox.clone();
        spec.ro_binds = vec![(self.config.exe.clone(), PathBuf::from(AGENT_EXE))];
        let mut skills = None;
        if let Some(binds) = facts.skill_binds {
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
            idle_timeout: facts.idle_timeout.as_secs().max(1),
            limits: Some(self.config.limits),
            ..AgentArgs::default()
        };
        spec.env = vec![("SESSIONBOX_LOG".to_owned(), "warn".to_owned())];
        let gateway_listener = if network {
            let dir = run.join("egress");
            let inside = PathBuf::from(EGRESS_DIR);
            let listener = bind_gateway_socket(&dir, run_dir, uid)?;
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
        // The agent's stderr goes through a relay that rotates `agent.log` at its cap.
        let log = log_relay::spawn(
            &self.config.exe,
            &run.join("agent.log"),
            self.config.log_max_bytes,
        )?;
        let stdio = SandboxStdio {
            stdin: Stdio::null(),
            stdout: Stdio::null(),
            stderr: log,
            passed_fd: Some(OwnedFd::from(listener)),
        };
        Ok(Launch {
            spec,
            stdio,
            gateway_listener,
            network,
            skills,
        })
    }

    /// Launches the sandbox (and its gateway, which needs the conversation's `key`), records
    /// it in `sandbox.json` and lets it outlive this process; a reaper thread collects the
    /// monitor when it ends.
    pub(super) fn launch_and_record(
        &self,
        key: Option<&ConversationKey>,
        run: &Path,
        launch: Launch,
    ) -> Result<()> {
        let handle = sandbox::launch_with(&launch.spec, &self.config.exe, &[], launch.stdio)?;
        let gateway_pid = match (launch.gateway_listener, &self.egress, key) {
            (Some(listener), Some(wiring), Some(key)) => {
                match spawn_gateway(
                    &self.config.exe,
                    &wiring.gateway_args,
                    &wiring.gateway_env,
                    listener,
                    key,
                    handle.monitor_pid(),
                    log_relay::spawn(
                        &self.config.exe,
                        &run.join("egress.log"),
                        self.config.log_max_bytes,
                    )?,
                    &handle.cgroup_paths(),
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
            network: launch.network,
            gateway_pid,
            pid_namespace: handle.pid_namespace(),
            skills: launch.skills,
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
        Ok(())
    }
}

/// `Some(starting)` when the conversation's agent accepts connections and may be kept: it was
/// launched with the same network profile and either `replace` is not asked or it is still
/// starting. `None`: launch a new one.
fn find_running(run: &Path, run_dir: &RunDir, network: bool, replace: bool) -> Option<bool> {
    if !agent_answers(&run_dir.socket()) {
        return None;
    }
    let record = read_record(run);
    let starting = record.as_ref().is_some_and(|r| {
        now_ms().saturating_sub(r.launched_ms) < STARTING_GRACE.as_millis() as u64
    });
    // A sandbox launched with the other network profile is replaced (between `none` and an
    // allowlist); changes within an allowlist need no relaunch.
    let same_network = record.as_ref().is_none_or(|r| r.network == network);
    (same_network && (!replace || starting)).then_some(starting)
}

/// A run directory held by a descriptor, so that its socket has a short path
/// (`/proc/self/fd/N/agent.sock`) however long the data directory is: a Unix socket path may
/// hold at most 107 bytes, and `<data dir>/run/<64 hex>/agent.sock` does not fit under a default
/// data directory such as `/root/.local/share/sessionbox`.
#[derive(Debug, Clone)]
pub(super) struct RunDir(Arc<OwnedFd>);

impl RunDir {
    pub(super) fn open(dir: &Path) -> Result<Self> {
        use rustix::fs::{Mode, OFlags};
        rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map(|fd| RunDir(Arc::new(fd)))
        .map_err(|e| Error::Backend(format!("cannot open {}: {e}", dir.display())))
    }

    /// True when `path` is the directory this holds (same device and inode): it was not
    /// renamed away or replaced since it was opened.
    pub(super) fn is(&self, path: &Path) -> bool {
        match (rustix::fs::fstat(&*self.0), rustix::fs::stat(path)) {
            (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
            _ => false,
        }
    }

    /// The agent's socket, valid while this value lives (in this process).
    pub(super) fn socket(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}/agent.sock", self.0.as_raw_fd()))
    }
}

pub(super) fn lock_file(path: &Path) -> Result<File> {
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
pub(super) fn agent_answers(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

pub(super) fn read_record(run: &Path) -> Option<SandboxInfo> {
    let data = fs::read(run.join("sandbox.json")).ok()?;
    serde_json::from_slice(&data).ok()
}

/// Kills every process of the recorded sandbox and removes its cgroups; returns how many
/// processes were killed.
pub(super) fn kill_recorded(run: &Path) -> usize {
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
pub(super) fn prepare_workspace(dir: &Path, uid: u32) -> Result<()> {
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

/// Writes `data` to `path` through a temporary file and a rename. A full disk is
/// [`Error::Unavailable`] (without the host path), and leaves no temporary file.
pub(super) fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, data)
        .and_then(|()| fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = fs::remove_file(&tmp);
            crate::host::data_dir_error(&format!("cannot write {}", path.display()), &e)
        })
}
