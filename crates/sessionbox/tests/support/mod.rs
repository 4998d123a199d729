//! Host-side helpers shared by the isolated-runtime test files: a data directory with a store,
//! manager and `isolated` runtime built as the CLI builds them, and readers of `/proc`, cgroups
//! and the runtime's `sandbox.json`.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sessionbox::config::FileConfig;
use sessionbox::runtime::{self, BuildOptions};
use sessionbox_core::{ConversationKey, ConversationRef, ExecRequest, ExecResult, Session};
use sessionbox_local::isolated::{IsolatedRuntime, SandboxInfo};
use sessionbox_manager::{Conversation, Manager};
use sessionbox_sandbox::SandboxLimits;
use sessionbox_store::Store;

pub const EXE: &str = env!("CARGO_BIN_EXE_sessionbox");

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A name no other test, run or process uses.
pub fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    format!(
        "sbx{tag}{}x{}x{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Host uids for one data directory that no other data directory uses, in this process or
/// another (the CLI's default range starts at 3 000 000), so that a host process's uid
/// tells which conversation it belongs to.
fn uid_range() -> Range<u32> {
    static N: AtomicU32 = AtomicU32::new(0);
    let slot = N.fetch_add(1, Ordering::SeqCst) % 64;
    let base = 20_000_000 + (std::process::id() % 50_000) * 4096 + slot * 64;
    base..base + 64
}

/// Fails the test when `f` does not finish within `secs` (dropping it, which cleans up).
pub async fn bounded<T>(secs: u64, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), f).await {
        Ok(v) => v,
        Err(_) => panic!("the test did not finish within its bound of {secs} s"),
    }
}

/// Waits up to `secs` for `f` to hold.
pub async fn eventually(secs: f64, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `sh -c CMD` in a session, 60 s at most; panics when the call itself fails.
pub async fn sh(s: &dyn Session, cmd: &str) -> ExecResult {
    s.exec(ExecRequest::new(cmd).timeout(Duration::from_secs(60)))
        .await
        .unwrap_or_else(|e| panic!("exec {cmd:?} failed: {e}"))
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One data directory: store, runtime and manager, as `sessionbox` builds them.
pub struct Env {
    _dir: tempfile::TempDir,
    pub data: PathBuf,
    pub uids: Range<u32>,
    pub idle_secs: u64,
    pub limits: SandboxLimits,
    /// `[isolated] disk_bytes` and `disk_inodes`, when the test sets them.
    pub disk: Option<(u64, u64)>,
    /// `[isolated] pool_size`, when the test sets it.
    pub pool: usize,
    pub manager: Manager,
    pub runtime: Arc<IsolatedRuntime>,
}

impl Env {
    pub fn new(idle_secs: u64) -> Env {
        Env::with_limits(idle_secs, SandboxLimits::default())
    }

    pub fn with_limits(idle_secs: u64, limits: SandboxLimits) -> Env {
        Env::with_disk(idle_secs, limits, None)
    }

    /// With `[isolated] disk_bytes` and `disk_inodes` set to `disk`.
    pub fn with_disk(idle_secs: u64, limits: SandboxLimits, disk: Option<(u64, u64)>) -> Env {
        Env::with_pool(idle_secs, limits, disk, 0)
    }

    /// With `[isolated] pool_size = pool` as well.
    pub fn with_pool(
        idle_secs: u64,
        limits: SandboxLimits,
        disk: Option<(u64, u64)>,
        pool: usize,
    ) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let uids = uid_range();
        let (manager, runtime) = build(&data, uids.clone(), idle_secs, limits.clone(), disk, pool);
        Env {
            _dir: dir,
            data,
            uids,
            idle_secs,
            limits,
            disk,
            pool,
            manager,
            runtime,
        }
    }

    /// Another store, runtime and manager over the same data directory: what a restarted
    /// manager (or a second process) builds.
    pub fn another_manager(&self) -> (Manager, Arc<IsolatedRuntime>) {
        self.another_manager_with_pool(self.pool)
    }

    /// [`Env::another_manager`] with another pool size.
    pub fn another_manager_with_pool(&self, pool: usize) -> (Manager, Arc<IsolatedRuntime>) {
        build(
            &self.data,
            self.uids.clone(),
            self.idle_secs,
            self.limits.clone(),
            self.disk,
            pool,
        )
    }

    /// [`Env::another_manager`] with another disk quota.
    pub fn another_manager_with_disk(
        &self,
        disk: Option<(u64, u64)>,
    ) -> (Manager, Arc<IsolatedRuntime>) {
        build(
            &self.data,
            self.uids.clone(),
            self.idle_secs,
            self.limits.clone(),
            disk,
            self.pool,
        )
    }

    pub fn conv(id: &str) -> ConversationRef {
        ConversationRef::parse("default", id).expect("valid id")
    }

    pub async fn open(&self, id: &str) -> Conversation {
        self.manager
            .open(&Env::conv(id))
            .await
            .unwrap_or_else(|e| panic!("open {id}: {e}"))
    }

    pub fn run_dir(&self, key: &ConversationKey) -> PathBuf {
        self.data.join("run").join(key.as_str())
    }

    pub fn workspace(&self, key: &ConversationKey) -> PathBuf {
        use sessionbox_core::Runtime;
        PathBuf::from(self.runtime.workspace_location(key))
    }

    pub fn record(&self, key: &ConversationKey) -> Record {
        Record::read(&self.run_dir(key)).expect("the runtime recorded the sandbox")
    }

    /// The conversation's host uid: the owner of its workspace.
    pub fn uid(&self, key: &ConversationKey) -> u32 {
        std::fs::metadata(self.workspace(key))
            .expect("workspace")
            .uid()
    }

    /// Runs the real `sessionbox` binary on this data directory (its configuration gives
    /// the same idle timeout and uid range as this runtime).
    pub fn cli(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        self.write_config();
        let mut cmd = Command::new(EXE);
        cmd.arg("--data-dir")
            .arg(&self.data)
            .args(args)
            .env_remove("SESSIONBOX_RUNTIME")
            .env_remove("SESSIONBOX_TENANT")
            .stdin(Stdio::null());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.output().expect("run sessionbox")
    }

    pub fn cli_command(&self, args: &[&str]) -> Command {
        self.write_config();
        let mut cmd = Command::new(EXE);
        cmd.arg("--data-dir")
            .arg(&self.data)
            .args(args)
            .env_remove("SESSIONBOX_RUNTIME")
            .env_remove("SESSIONBOX_TENANT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn write_config(&self) {
        let path = self.data.join("sessionbox.toml");
        if !path.exists() {
            std::fs::create_dir_all(&self.data).unwrap();
            std::fs::write(
                &path,
                config_toml(
                    &self.uids,
                    self.idle_secs,
                    &self.limits,
                    self.disk,
                    self.pool,
                ),
            )
            .unwrap();
        }
    }
}

/// The `sessionbox.toml` giving this idle timeout, uid range, limits and disk quota.
fn config_toml(
    uids: &Range<u32>,
    idle_secs: u64,
    limits: &SandboxLimits,
    disk: Option<(u64, u64)>,
    pool: usize,
) -> String {
    let disk = disk.map_or_else(String::new, |(bytes, inodes)| {
        format!("disk_bytes = {bytes}\ndisk_inodes = {inodes}\n")
    });
    format!(
        "[isolated]\nidle_timeout_secs = {}\nuid_base = {}\nuid_count = {}\npids = {}\nmemory_bytes = {}\ncpu = {}\npool_size = {pool}\n{disk}",
        idle_secs,
        uids.start,
        uids.len(),
        limits.pids,
        limits.memory_bytes,
        limits.cpu,
    )
}

/// The store, manager and runtime over `data`, built as the CLI builds them
/// ([`sessionbox::runtime::isolated_config`] from the same `sessionbox.toml` the CLI is given),
/// with every sandbox limit of `sandbox` (the file holds only some of them).
fn build(
    data: &Path,
    uids: Range<u32>,
    idle_secs: u64,
    sandbox: SandboxLimits,
    disk: Option<(u64, u64)>,
    pool: usize,
) -> (Manager, Arc<IsolatedRuntime>) {
    let store = Store::open(&data.join("sessionbox.db")).expect("store");
    let file: FileConfig = toml::from_str(&config_toml(&uids, idle_secs, &sandbox, disk, pool))
        .expect("a valid configuration");
    let options = BuildOptions::new(PathBuf::from(EXE));
    let config = runtime::isolated_config(&file, data, &options.exe)
        .unwrap()
        .with_sandbox(sandbox);
    let runtime =
        Arc::new(runtime::isolated_with(config, &store, data, &options).expect("runtime"));
    (Manager::new(store, runtime.clone()), runtime)
}

impl Drop for Env {
    /// The safety net when a test fails half-way: ends every sandbox recorded here.
    fn drop(&mut self) {
        if let Ok(rd) = std::fs::read_dir(self.data.join("run")) {
            for e in rd.flatten() {
                if let Some(r) = Record::read(&e.path()) {
                    r.kill_all();
                }
            }
        }
        // And every warm-pool sandbox, with its volume.
        if let Ok(rd) = std::fs::read_dir(self.data.join("pool")) {
            for e in rd.flatten() {
                if let Some(r) = Record::read(&e.path()) {
                    r.kill_all();
                }
                let ws = e.path().join("workspace");
                let _ = rustix::mount::unmount(&ws, rustix::mount::UnmountFlags::DETACH);
            }
        }
        unmount_workspaces(&self.data);
    }
}

/// What the runtime recorded in `run/<key>/sandbox.json` ([`SandboxInfo`]), the part the tests
/// read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub monitor: u32,
    pub init: u32,
    pub cgroups: Vec<PathBuf>,
}

impl Record {
    pub fn read(run: &Path) -> Option<Record> {
        let info: SandboxInfo =
            serde_json::from_slice(&std::fs::read(run.join("sandbox.json")).ok()?).ok()?;
        Some(Record {
            monitor: info.monitor_pid,
            init: info.init_pid,
            cgroups: info.cgroups,
        })
    }

    /// The cgroup name, the same in every hierarchy.
    pub fn name(&self) -> String {
        self.cgroups[0]
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }

    /// The directory in the hierarchy of `controller` (`pids`, `memory`, `cpu`).
    pub fn cgroup(&self, controller: &str) -> PathBuf {
        self.cgroups
            .iter()
            .find(|c| {
                c.components().any(|p| {
                    p.as_os_str()
                        .to_string_lossy()
                        .split(',')
                        .any(|x| x == controller)
                })
            })
            .or_else(|| (self.cgroups.len() == 1).then(|| &self.cgroups[0]))
            .unwrap_or_else(|| panic!("no {controller} cgroup in {:?}", self.cgroups))
            .clone()
    }

    /// Pids in the cgroups' `cgroup.procs`.
    pub fn procs(&self) -> BTreeSet<u32> {
        self.cgroups
            .iter()
            .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|s| {
                s.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect()
    }

    /// Live host processes whose `/proc/PID/cgroup` names this sandbox's cgroup.
    pub fn members(&self) -> Vec<Proc> {
        let name = self.name();
        processes()
            .into_iter()
            .filter(|p| p.in_cgroup(&name))
            .collect()
    }

    /// The agent: the init's child running `sessionbox agent`.
    pub fn agent(&self) -> Option<Proc> {
        processes()
            .into_iter()
            .find(|p| p.ppid == self.init && p.cmdline.contains(" agent "))
    }

    pub fn kill_all(&self) {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let pids = self.procs();
            if pids.is_empty() || Instant::now() > until {
                break;
            }
            for p in pids {
                if let Some(pid) = rustix::process::Pid::from_raw(p as i32) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        reap(self.monitor);
        for d in &self.cgroups {
            let until = Instant::now() + Duration::from_secs(2);
            while d.exists() && std::fs::remove_dir(d).is_err() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// Collects `pid` if it is an exited child of this process (a monitor launched here).
pub fn reap(pid: u32) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::NOHANG);
    }
}

/// One host process, from `/proc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    pub pid: u32,
    pub ppid: u32,
    /// Real uid.
    pub uid: u32,
    pub state: char,
    /// Start time in clock ticks after boot: with the pid, names one process for good.
    pub start: u64,
    pub cmdline: String,
    pub cgroup: String,
    pub tracer: u32,
    /// Kernel flags (`PF_*`).
    pub flags: u64,
}

impl Proc {
    pub fn in_cgroup(&self, name: &str) -> bool {
        self.cgroup
            .lines()
            .any(|l| l.rsplit('/').next() == Some(name))
    }

    /// The inode of one of its namespaces (`user`, `mnt`, `pid`, ...).
    pub fn ns(&self, kind: &str) -> Option<PathBuf> {
        std::fs::read_link(format!("/proc/{}/ns/{kind}", self.pid)).ok()
    }

    /// True once it has begun to exit (`PF_EXITING`): the kernel has already taken it out
    /// of its cgroups and it runs no more user code.
    pub fn exiting(&self) -> bool {
        self.flags & 0x4 != 0
    }

    /// True while this very process (pid and start time) exists and has not exited.
    pub fn alive(&self) -> bool {
        proc_info(self.pid).is_some_and(|p| p.start == self.start && p.state != 'Z')
    }

    /// True while this very process has an entry in `/proc` (running or a zombie).
    pub fn exists(&self) -> bool {
        proc_info(self.pid).is_some_and(|p| p.start == self.start)
    }
}

pub fn proc_info(pid: u32) -> Option<Proc> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split(' ').collect();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u32>().ok())
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    Some(Proc {
        pid,
        ppid: f.get(1)?.parse().ok()?,
        uid: field("Uid:")?,
        state: f.first()?.chars().next()?,
        start: f.get(19)?.parse().ok()?,
        cmdline: String::from_utf8_lossy(&cmdline)
            .replace('\0', " ")
            .trim_end()
            .to_owned(),
        // Unreadable once the process is gone: then it is not reported at all.
        cgroup: std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?,
        tracer: field("TracerPid:").unwrap_or(0),
        flags: f.get(6)?.parse().ok()?,
    })
}

/// Every live (not zombie) process on the host.
pub fn processes() -> Vec<Proc> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(proc_info)
        .filter(|p| p.state != 'Z')
        .collect()
}

/// Live host processes that belong to a conversation: in its cgroup or running as its uid.
pub fn conversation_processes(cgroup_name: &str, uid: u32) -> Vec<Proc> {
    processes()
        .into_iter()
        .filter(|p| p.in_cgroup(cgroup_name) || p.uid == uid)
        .collect()
}

/// Every path beneath `dir` with what it is (a link's target, a file's contents), for
/// before/after comparisons.
pub fn tree(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            let what = if m.is_symlink() {
                format!("link -> {:?}", std::fs::read_link(&p).unwrap_or_default())
            } else if m.is_dir() {
                stack.push(p.clone());
                "dir".to_owned()
            } else if m.len() > 1 << 20 {
                // A large file (a workspace's disk image: 1 GiB, sparse) by its size only.
                format!("file nlink={} {} bytes", m.nlink(), m.len())
            } else {
                let data = std::fs::read(&p).unwrap_or_default();
                format!("file nlink={} {:?}", m.nlink(), text(&data))
            };
            out.insert(p, what);
        }
    }
    out
}

/// Detaches every workspace volume (disk quota) mounted beneath `data`'s `workspaces`, so that a
/// test's temporary directory leaves no mount behind (destroy unmounts them too; this is the
/// safety net, for conversations a test did not destroy).
pub fn unmount_workspaces(data: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let workspaces = data.join("workspaces");
    let Ok(workspaces) = std::fs::canonicalize(&workspaces) else {
        return;
    };
    for line in mounts.lines() {
        // Field 5 is the mount point (spaces escaped as \040; ours have none).
        if let Some(point) = line.split(' ').nth(4).map(Path::new)
            && point.parent() == Some(workspaces.as_path())
        {
            let _ = rustix::mount::unmount(point, rustix::mount::UnmountFlags::DETACH);
        }
    }
}
