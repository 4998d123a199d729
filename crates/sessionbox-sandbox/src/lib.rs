//! Launching one program inside a fresh per-conversation Linux sandbox.
//!
//! The sandbox is built by a re-executed launcher, never inside the calling (multithreaded,
//! tokio) process:
//!
//! 1. [`launch`] (parent, host side) validates the [`SandboxSpec`], creates the conversation's
//!    cgroups and writes the limits, spawns `init_exe init_args...` with a control socket as
//!    descriptor 3, puts that process in the cgroups, then sends it the spec as one JSON line.
//! 2. [`init_main`] in that process (the *monitor*, single-threaded, still in the host
//!    namespaces) has a helper create the sandbox's user namespace with the conversation's uid as
//!    its owner (so the kernel charges the sandbox's per-user counts to that uid, not root),
//!    writes its `uid_map`/`gid_map` from outside, joins it, clones the sandbox's *init* into
//!    fresh mount, PID, IPC, UTS, network and cgroup namespaces, and waits for it.
//! 3. The init (PID 1 inside) builds the new root on a tmpfs, pivots into it, takes the
//!    sandbox identity, drops every capability, sets `no_new_privs`, applies Landlock and seccomp
//!    to itself, and forks the program, which execs with a clean descriptor table in
//!    `/workspace`. The init reaps every child; when the program exits it kills the rest and
//!    exits with the program's status.
//!
//! One descriptor of the caller (a listening socket, [`SandboxStdio::passed_fd`]) can be handed
//! to the program, at [`PASSED_FD`]; no other descriptor reaches it.
//!
//! What each layer enforces, and what it does not, is in the crate's `README.md`.
//!
//! This file is over 800 lines on purpose: it is the crate's whole public surface (the spec and
//! its validation, the launcher, the handle and the inventory helpers), cohesive and read
//! together; each mechanism is a module of its own.
//!
//! Every layer is required: when one cannot be applied, [`launch`] fails with an
//! [`Error::RuntimeUnavailable`] naming the layer and saying what to do. [`probe`] reports what
//! the machine supports without launching anything.

mod cgroup;
mod child;
mod confine;
mod limits;
mod mounts;
mod probe;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Component, Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sessionbox_core::{Error, ExitStatus, Result, validate_env_name};

pub use child::init_main;
pub use limits::{
    Decision, LimitsReport, UidMapping, check_limits, decide, delegation_steps, limits_report,
};
pub use probe::{LayerState, LayerStatus, probe};

/// Name of the runtime reported in errors.
const RUNTIME: &str = "isolated";

/// The descriptor on which [`init_main`] finds its control socket.
pub const INIT_FD: i32 = 3;

/// Environment variable [`launch`] sets for the init process (to `"3"`, [`INIT_FD`]); its
/// presence tells [`init_main`] it was started by [`launch`]. [`is_init_invocation`] checks it.
pub const INIT_FD_ENV: &str = "SESSIONBOX_SANDBOX_INIT_FD";

/// The descriptor at which the program finds the socket passed in [`SandboxStdio::passed_fd`]
/// (not close-on-exec). Without one, nothing is open there. The program's environment does not
/// say whether one was passed: the caller tells the program, through [`SandboxSpec::env`] or its
/// arguments, when it passes one.
pub const PASSED_FD: i32 = 4;

/// Environment variable [`launch`] sets for the init process (to `"4"`, [`PASSED_FD`]) when it
/// passes a descriptor there; without it the monitor closes [`PASSED_FD`] like every other
/// inherited descriptor. Not in the program's environment.
const PASSED_FD_ENV: &str = "SESSIONBOX_SANDBOX_PASSED_FD";

/// The uid every sandbox runs as inside (mapped to [`SandboxSpec::uid`] on the host).
pub const INSIDE_UID: u32 = 1000;
/// The gid every sandbox runs as inside (mapped to [`SandboxSpec::gid`] on the host).
pub const INSIDE_GID: u32 = 1000;
/// Where the workspace appears inside.
pub const WORKSPACE_DIR: &str = "/workspace";

/// How long [`launch`] waits for the sandbox to report ready.
pub const LAUNCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Inside paths that belong to the sandbox's own layout: a read-only bind may not be placed on or
/// beneath them.
const RESERVED_INSIDE: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/etc",
    "/dev",
    "/proc",
    "/tmp",
    "/workspace",
];

/// How a sandbox's memory, process and CPU limits are enforced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LimitMode {
    /// cgroups (`pids.max`, memory, CPU quota) for the whole sandbox, plus the rlimits. Needs
    /// root, or a cgroup delegated to the caller; [`launch`] fails otherwise. The default.
    #[default]
    Cgroup,
    /// rlimits only, per process: `RLIMIT_AS` (`memory_bytes`), `RLIMIT_NPROC` (`nproc`),
    /// `RLIMIT_CPU` (`cpu_secs`) and `RLIMIT_FSIZE`, with the other rlimits. No cgroup is made:
    /// the sandbox as a whole has no memory or CPU bound (see the sandbox README). Chosen
    /// explicitly, for a caller without root and without a delegated cgroup.
    Rlimit,
}

impl LimitMode {
    /// `cgroup` or `rlimit`, as written in configuration.
    pub fn name(self) -> &'static str {
        match self {
            LimitMode::Cgroup => "cgroup",
            LimitMode::Rlimit => "rlimit",
        }
    }
}

/// Resource limits of one sandbox. Every limit is enforced; none may be zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SandboxLimits {
    /// How the limits are enforced: cgroups (default) or rlimits only.
    pub mode: LimitMode,
    /// Most processes and threads at once (cgroup `pids.max`), counting the init. Default 512.
    pub pids: u64,
    /// Memory in bytes, page cache and tmpfs included (cgroup `memory.limit_in_bytes` and
    /// `memory.memsw.limit_in_bytes`, or `memory.max` and `memory.swap.max = 0`). Default 2 GiB.
    pub memory_bytes: u64,
    /// CPU time in CPUs (cgroup CFS quota per 100 ms period). Default 1.0.
    pub cpu: f64,
    /// Open descriptors per process (`RLIMIT_NOFILE`). Default 1024.
    pub nofile: u64,
    /// Largest file a process may write, in bytes (`RLIMIT_FSIZE`). Default 1 GiB.
    pub fsize: u64,
    /// Processes of the sandbox user (`RLIMIT_NPROC`). Default 512.
    pub nproc: u64,
    /// Size of each of the `/tmp` and `/dev/shm` tmpfs, in bytes (their pages also count against
    /// `memory_bytes`). Default 512 MiB.
    pub tmpfs_bytes: u64,
    /// CPU seconds one process may use (`RLIMIT_CPU`, soft and hard), only with
    /// [`LimitMode::Rlimit`] (where no CPU quota holds): past it the kernel kills the process.
    /// Default 3600.
    pub cpu_secs: u64,
    /// Pseudo-terminals the sandbox may hold at once: the `max` of its own devpts instance.
    /// The kernel's pool beyond its reserve for the host (`kernel.pty.max` less
    /// `kernel.pty.reserve`, 3072 by default) is shared by every devpts instance, so without a
    /// maximum one sandbox could take every terminal of every other. Default 16.
    pub ptys: u64,
    /// Bytes of TCP socket buffers the sandbox may hold at once. The kernel's TCP memory is
    /// one pool for the whole host (`net.ipv4.tcp_mem`), past whose thresholds every TCP
    /// connection of the host (other sandboxes, the server, its store) is squeezed and then
    /// refused memory; on cgroup v1 a memory cgroup does not count socket buffers unless told
    /// to (`memory.kmem.tcp.limit_in_bytes`, set to this), so without it one sandbox's loopback
    /// connections could take that pool whole beside its memory limit. cgroup v2 counts socket
    /// buffers in `memory.max`. Default 256 MiB: a quarter of it already stalled 256 busy
    /// tunnels through the conversation's own egress gateway (whose sockets count here too).
    pub tcp_bytes: u64,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            pids: 512,
            memory_bytes: 2 << 30,
            cpu: 1.0,
            nofile: 1024,
            fsize: 1 << 30,
            nproc: 512,
            tmpfs_bytes: 512 << 20,
            mode: LimitMode::Cgroup,
            cpu_secs: 3600,
            ptys: 16,
            tcp_bytes: 256 << 20,
        }
    }
}

/// Everything one sandbox is made of. Sent to the init process as JSON over its control socket
/// (never on its command line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Host directory bind-mounted read-write at `/workspace`. The caller creates it, owned by
    /// `uid`:`gid`, mode 0700.
    pub workspace: PathBuf,
    /// Host uid of this conversation. When the caller is root it is mapped to [`INSIDE_UID`];
    /// otherwise it must be the caller's own uid.
    pub uid: u32,
    /// Host gid of this conversation; mapped to [`INSIDE_GID`] (see `uid`).
    pub gid: u32,
    /// Host name inside (1-63 characters: ASCII letters, digits, `-`, `.`).
    pub hostname: String,
    /// Leaf name of the sandbox's cgroups, e.g. `sessionbox-<key12>` (ASCII letters, digits,
    /// `-`, `_`, `.`; not starting with `.`).
    pub cgroup: String,
    /// Resource limits.
    #[serde(default)]
    pub limits: SandboxLimits,
    /// Extra read-only binds, `(host path, inside path)`, for example the `sessionbox` executable
    /// at `/.sessionbox/sessionbox`. The inside path is absolute, normalised, and not on or beneath
    /// `/`, `/usr`, `/bin`, `/sbin`, `/lib`, `/lib64`, `/etc`, `/dev`, `/proc`, `/tmp` or
    /// `/workspace`.
    #[serde(default)]
    pub ro_binds: Vec<(PathBuf, PathBuf)>,
    /// The program to exec, as a path inside the sandbox.
    pub program: PathBuf,
    /// Its arguments (without `argv[0]`, which is `program`).
    #[serde(default)]
    pub args: Vec<String>,
    /// Its whole environment: nothing else is passed on.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// cgroup v1 directories the monitor moves itself into, first thing, by writing `0` to
    /// their `tasks` files. Set by [`launch_with`]; whatever a caller puts here is replaced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub join_cgroups: Vec<PathBuf>,
}

impl SandboxSpec {
    /// A spec with default limits, no extra binds, no arguments and an empty environment; the
    /// host name is `sessionbox`.
    pub fn new(
        workspace: impl Into<PathBuf>,
        uid: u32,
        gid: u32,
        cgroup: impl Into<String>,
        program: impl Into<PathBuf>,
    ) -> Self {
        SandboxSpec {
            workspace: workspace.into(),
            uid,
            gid,
            hostname: "sessionbox".into(),
            cgroup: cgroup.into(),
            limits: SandboxLimits::default(),
            ro_binds: Vec::new(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            join_cgroups: Vec::new(),
        }
    }

    /// Checks everything that can be checked without touching the host.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] saying which field is wrong.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidRequest(m));
        if !self.workspace.is_absolute() {
            return bad(format!(
                "the sandbox workspace {:?} is not an absolute path",
                self.workspace
            ));
        }
        let h = self.hostname.as_bytes();
        if h.is_empty()
            || h.len() > 63
            || !h
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.'))
        {
            return bad(format!(
                "the sandbox host name {:?} must be 1-63 ASCII letters, digits, '-' or '.'",
                self.hostname
            ));
        }
        let c = self.cgroup.as_bytes();
        if c.is_empty()
            || c.len() > 64
            || c[0] == b'.'
            || !c
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        {
            return bad(format!(
                "the sandbox cgroup name {:?} must be 1-64 ASCII letters, digits, '-', '_' or '.', not starting with '.'",
                self.cgroup
            ));
        }
        let l = &self.limits;
        if l.pids < 4
            || l.nproc < 4
            || l.memory_bytes < (16 << 20)
            || l.nofile < 16
            || l.fsize == 0
            || l.tmpfs_bytes < (1 << 20)
            || !(l.cpu.is_finite() && l.cpu >= 0.01)
            || l.cpu_secs == 0
            || !(1..=4096).contains(&l.ptys)
            || l.tcp_bytes < (1 << 20)
        {
            return bad(format!(
                "sandbox limits out of range (pids and nproc >= 4, memory >= 16 MiB, nofile >= 16, fsize > 0, tmpfs >= 1 MiB, cpu >= 0.01, cpu_secs > 0, ptys 1 to 4096, tcp >= 1 MiB): {l:?}"
            ));
        }
        for (host, inside) in &self.ro_binds {
            if !host.is_absolute() {
                return bad(format!(
                    "read-only bind source {host:?} is not an absolute path"
                ));
            }
            check_inside_path(inside)?;
        }
        for (i, (_, a)) in self.ro_binds.iter().enumerate() {
            for (_, b) in &self.ro_binds[i + 1..] {
                if a.starts_with(b) || b.starts_with(a) {
                    return bad(format!(
                        "read-only bind targets {a:?} and {b:?} overlap (one is on or beneath the other)"
                    ));
                }
            }
        }
        if !is_normal_absolute(&self.program) {
            return bad(format!(
                "the sandbox program {:?} must be an absolute, normalised path inside the sandbox",
                self.program
            ));
        }
        let nul = |s: &str| s.contains('\0');
        if self.args.iter().any(|a| nul(a)) || nul(&self.program.to_string_lossy()) {
            return bad("a sandbox program argument contains a NUL byte".into());
        }
        for (name, value) in &self.env {
            validate_env_name(name)?;
            if nul(value) {
                return bad(format!(
                    "the value of environment variable {name} contains a NUL byte"
                ));
            }
        }
        Ok(())
    }

    /// The spec with host paths canonicalised (links resolved), so the init can open them
    /// before it changes anything.
    fn resolved(&self) -> Result<SandboxSpec> {
        let canon = |p: &Path, what: &str| {
            std::fs::canonicalize(p).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Error::NotFound(format!("{what} {p:?}")),
                _ => Error::Backend(format!("cannot resolve {what} {p:?}: {e}")),
            })
        };
        let mut spec = self.clone();
        spec.workspace = canon(&self.workspace, "sandbox workspace")?;
        if spec.workspace == Path::new("/") || !spec.workspace.is_dir() {
            return Err(Error::InvalidRequest(format!(
                "the sandbox workspace {:?} is not a directory (other than /)",
                self.workspace
            )));
        }
        for (host, _) in &mut spec.ro_binds {
            *host = canon(host, "read-only bind source")?;
        }
        Ok(spec)
    }
}

/// True for `/a/b` (no `.`, `..`, empty or trailing components), false for `/` itself.
fn is_normal_absolute(p: &Path) -> bool {
    let s = p.to_string_lossy();
    p.is_absolute()
        && s.len() > 1
        && !s.ends_with('/')
        && !s.contains("//")
        && p.components()
            .skip(1)
            .all(|c| matches!(c, Component::Normal(_)))
}

fn check_inside_path(inside: &Path) -> Result<()> {
    if !is_normal_absolute(inside) {
        return Err(Error::InvalidRequest(format!(
            "read-only bind target {inside:?} must be an absolute, normalised path other than /"
        )));
    }
    if let Some(r) = RESERVED_INSIDE
        .iter()
        .find(|r| inside.starts_with(Path::new(r)))
    {
        return Err(Error::InvalidRequest(format!(
            "read-only bind target {inside:?} is on or beneath {r}, which the sandbox lays out itself"
        )));
    }
    Ok(())
}

/// Where the sandboxed program's standard streams go, and the one other descriptor it gets.
#[derive(Debug)]
pub struct SandboxStdio {
    /// Standard input (default: `/dev/null`).
    pub stdin: Stdio,
    /// Standard output (default: inherited from the caller).
    pub stdout: Stdio,
    /// Standard error (default: inherited from the caller).
    pub stderr: Stdio,
    /// A socket handed to the program at [`PASSED_FD`] (default: none), meant for a listening
    /// socket the program accepts on (systemd socket activation style): for example a UNIX
    /// socket the caller bound in a directory the sandbox cannot see or write, so the host path
    /// stays the caller's. [`launch_with`] refuses any other kind of descriptor (a directory
    /// or file descriptor would reach the host file system past the sandbox's mounts). It
    /// consumes the caller's descriptor (keep a [`OwnedFd::try_clone`] to go on using it); the
    /// monitor and the init close their copies once the next process has it. The open file is
    /// shared, so its status flags (`O_NONBLOCK`) are the caller's.
    pub passed_fd: Option<OwnedFd>,
}

impl Default for SandboxStdio {
    fn default() -> Self {
        SandboxStdio {
            stdin: Stdio::null(),
            stdout: Stdio::inherit(),
            stderr: Stdio::inherit(),
            passed_fd: None,
        }
    }
}

/// What the child side reports over the control socket, one JSON object per line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "report", rename_all = "snake_case")]
enum Report {
    /// From the monitor: the host pid of the sandbox's init.
    Pid { pid: u32 },
    /// From the init: every layer is in place and the program was executed. `pid_ns` is the
    /// inode of its PID namespace.
    Ready {
        landlock: String,
        #[serde(default)]
        pid_ns: Option<u64>,
    },
    /// A layer could not be applied.
    Error {
        layer: String,
        reason: String,
        hint: String,
    },
}

/// A running sandbox. Dropping it kills the sandbox (see [`SandboxHandle::kill`]).
#[derive(Debug)]
pub struct SandboxHandle {
    monitor: Mutex<Child>,
    monitor_pid: u32,
    init_pid: u32,
    /// The inode of the sandbox's PID namespace (`/proc/<init>/ns/pid`), read once it is ready.
    pid_ns: Option<u64>,
    cgroups: cgroup::Cgroups,
    landlock: String,
    stdio: Mutex<(Option<ChildStdin>, Option<ChildStdout>, Option<ChildStderr>)>,
}

/// Parent side: launches `spec.program` in a new sandbox, with `/dev/null` as its stdin and the
/// caller's stdout and stderr. See [`launch_with`].
///
/// # Errors
/// See [`launch_with`].
pub fn launch(spec: &SandboxSpec, init_exe: &Path, init_args: &[String]) -> Result<SandboxHandle> {
    launch_with(spec, init_exe, init_args, SandboxStdio::default())
}

/// Parent side: spawns `init_exe init_args...` (in production the current executable with a
/// hidden subcommand that calls [`init_main`]; in tests a test-support binary), puts it in the
/// sandbox's cgroups, hands it the spec and waits until the sandbox reports that the program was
/// executed (at most [`LAUNCH_TIMEOUT`]). Blocking: call it from `spawn_blocking` in async code.
/// The program's standard streams are `stdio`'s, and `stdio.passed_fd`, if any, is open in it at
/// [`PASSED_FD`].
///
/// # Errors
/// - [`Error::InvalidRequest`] for a bad spec, or a `stdio.passed_fd` that is not a socket;
///   [`Error::NotFound`] for a missing host path.
/// - [`Error::AlreadyExists`] when the spec's cgroup exists with processes in it.
/// - [`Error::RuntimeUnavailable`] naming the layer (user namespace, cgroup memory, landlock,
///   ...) that could not be applied, and what to do about it.
/// - [`Error::TimedOut`] when the sandbox did not report within [`LAUNCH_TIMEOUT`].
/// - [`Error::Backend`] when the init cannot be started or exits without a report.
///
/// Nothing is left behind on error: processes are killed and cgroups removed.
pub fn launch_with(
    spec: &SandboxSpec,
    init_exe: &Path,
    init_args: &[String],
    stdio: SandboxStdio,
) -> Result<SandboxHandle> {
    spec.validate()?;
    // Moved above every descriptor the child must end up with, so that placing them (at
    // INIT_FD and PASSED_FD, after Command has set up 0, 1 and 2) never overwrites one with
    // another, whatever numbers they had here.
    let high = |fd: &OwnedFd, what: &str| {
        rustix::io::fcntl_dupfd_cloexec(fd, PASSED_FD + 1)
            .map_err(|e| Error::Backend(format!("cannot duplicate the {what}: {e}")))
    };
    let passed = match &stdio.passed_fd {
        None => None,
        Some(fd) => {
            if let Err(e) = rustix::net::sockopt::socket_type(fd) {
                return Err(Error::InvalidRequest(format!(
                    "the descriptor to pass to the sandboxed program must be a socket: {e}"
                )));
            }
            Some(high(fd, "descriptor to pass to the sandbox")?)
        }
    };
    let mut spec = spec.resolved()?;
    let cgroups = match spec.limits.mode {
        LimitMode::Cgroup => cgroup::Cgroups::create(&spec.cgroup, &spec.limits)?,
        // rlimits only: the init sets them; the PID namespace is what kills the sandbox.
        LimitMode::Rlimit => cgroup::Cgroups::none(),
    };
    // The monitor joins the v1 hierarchies itself: a single-threaded process writing `0` to
    // `tasks` moves without the kernel's threadgroup lock, whose first use after a pause waits
    // for an RCU grace period (about 10 ms, measured by `sessionbox bench`). Writing its pid to
    // `cgroup.procs` from here takes that lock; v2 directories are still joined that way.
    spec.join_cgroups = cgroups.v1_paths();

    let pair = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| Error::Backend(format!("cannot create the sandbox control socket: {e}")))
    .and_then(|(ours, theirs)| Ok((ours, high(&theirs, "sandbox control socket")?)));
    let (ours, theirs) = match pair {
        Ok(p) => p,
        Err(e) => {
            let _ = cgroups.remove();
            return Err(e);
        }
    };

    let mut cmd = Command::new(init_exe);
    cmd.args(init_args)
        .env_clear()
        .env(INIT_FD_ENV, INIT_FD.to_string())
        .stdin(stdio.stdin)
        .stdout(stdio.stdout)
        .stderr(stdio.stderr);
    if passed.is_some() {
        cmd.env(PASSED_FD_ENV, PASSED_FD.to_string());
    }
    let theirs_raw = theirs.as_raw_fd();
    let passed_raw = passed.as_ref().map(AsRawFd::as_raw_fd);
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // calls are allowed. It captures integers and makes at most two raw dup2 system calls; it
    // allocates nothing and touches no shared state. `theirs` and `passed` stay open in the
    // parent until `spawn` returns, so the descriptors are valid in the child, and both are
    // above PASSED_FD, so neither dup2 replaces the other's source. dup2 clears close-on-exec
    // on the new descriptor.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(theirs_raw, INIT_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(p) = passed_raw
                && libc::dup2(p, PASSED_FD) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut monitor = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = cgroups.remove();
            return Err(Error::Backend(format!(
                "cannot start the sandbox init {init_exe:?}: {e}"
            )));
        }
    };
    drop(theirs);
    // The monitor has its copy: the caller's is closed (as documented on `passed_fd`).
    drop(passed);
    drop(stdio.passed_fd);
    // From here on, failure kills what was started and removes the cgroups.
    let fail = |monitor: &mut Child, e: Error| -> Error {
        let _ = monitor.kill();
        cgroups.kill_all();
        let _ = monitor.wait();
        let _ = cgroups.remove();
        e
    };
    if let Err(e) = cgroups.add_process_v2(monitor.id()) {
        return Err(fail(&mut monitor, e));
    }
    let started = Instant::now();
    let mut stream = UnixStream::from(ours);
    let mut line = serde_json::to_string(&spec).map_err(Error::backend)?;
    line.push('\n');
    // A write error means the init died: its reports and exit status tell why.
    let _ = stream
        .write_all(line.as_bytes())
        .and_then(|()| stream.shutdown(std::net::Shutdown::Write));

    let mut reader = BufReader::new(stream);
    let mut init_pid = None;
    let (landlock, reported_ns) = loop {
        let left = LAUNCH_TIMEOUT.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(fail(&mut monitor, Error::TimedOut(LAUNCH_TIMEOUT)));
        }
        let _ = reader.get_ref().set_read_timeout(Some(left));
        let mut buf = String::new();
        match reader.read_line(&mut buf) {
            Ok(0) => {
                let status = wait_briefly(&mut monitor);
                return Err(fail(
                    &mut monitor,
                    Error::Backend(format!(
                        "the sandbox init {init_exe:?} exited before the sandbox was ready ({status}); `sessionbox doctor` checks what this machine supports"
                    )),
                ));
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(fail(
                    &mut monitor,
                    Error::Backend(format!("reading the sandbox control socket failed: {e}")),
                ));
            }
        }
        match serde_json::from_str::<Report>(buf.trim_end()) {
            Ok(Report::Pid { pid }) => init_pid = Some(pid),
            Ok(Report::Ready { landlock, pid_ns }) => break (landlock, pid_ns),
            Ok(Report::Error {
                layer,
                reason,
                hint,
            }) => {
                return Err(fail(
                    &mut monitor,
                    Error::RuntimeUnavailable {
                        runtime: RUNTIME.into(),
                        reason: format!("sandbox layer {layer}: {reason}"),
                        hint,
                    },
                ));
            }
            Err(_) => {
                return Err(fail(
                    &mut monitor,
                    Error::Backend(format!(
                        "the sandbox init {init_exe:?} sent an unexpected report {:?}; is it an init entry point of this sessionbox version?",
                        buf.trim_end()
                    )),
                ));
            }
        }
    };
    let Some(init_pid) = init_pid else {
        return Err(fail(
            &mut monitor,
            Error::Backend("the sandbox reported ready without its init's pid".into()),
        ));
    };
    // The limits hold only if the monitor (and so everything it started) is in every cgroup.
    // A monitor that has already exited is no exception: a short program can end before this
    // check runs (seen on a loaded machine), and a zombie's `/proc/PID/cgroup` names the root of
    // every hierarchy while its cgroups' `cgroup.procs` are empty. Nothing of the sandbox is
    // left to contain then; its exit status stays in `monitor` (`try_wait` keeps it for `wait`).
    let exited = |monitor: &mut Child| matches!(monitor.try_wait(), Ok(Some(_)));
    if !cgroups.is_empty() && !cgroups.holds(monitor.id()) && !exited(&mut monitor) {
        let id = monitor.id();
        return Err(fail(
            &mut monitor,
            Error::Backend(format!(
                "the sandbox monitor {} is not in all of its cgroups: {:?}; in {:?}",
                id,
                cgroups
                    .paths()
                    .iter()
                    .map(|p| (p.clone(), std::fs::read_to_string(p.join("cgroup.procs"))))
                    .collect::<Vec<_>>(),
                std::fs::read_to_string(format!("/proc/{id}/cgroup"))
            )),
        ));
    }
    let stdio = (
        monitor.stdin.take(),
        monitor.stdout.take(),
        monitor.stderr.take(),
    );
    tracing::debug!(init_pid, elapsed = ?started.elapsed(), cgroup = %spec.cgroup, "sandbox ready");
    let pid_ns = reported_ns.or_else(|| pid_namespace(init_pid));
    if cgroups.is_empty() && pid_ns.is_none() {
        // Without cgroups the namespace is the only handle on the sandbox's processes.
        return Err(fail(
            &mut monitor,
            Error::Backend(format!(
                "the sandbox did not report its PID namespace (init {init_pid})"
            )),
        ));
    }
    Ok(SandboxHandle {
        monitor_pid: monitor.id(),
        monitor: Mutex::new(monitor),
        init_pid,
        pid_ns,
        cgroups,
        landlock,
        stdio: Mutex::new(stdio),
    })
}

/// Waits up to 2 s for `child` and describes how it ended.
fn wait_briefly(child: &mut Child) -> String {
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return s.to_string(),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => return "still running".into(),
            Err(e) => return format!("cannot wait for it: {e}"),
        }
    }
}

/// The inode of `pid`'s PID namespace (`/proc/PID/ns/pid`), which tells a sandbox's processes
/// apart from every other (and a recycled pid from the sandbox's init). `None` when the
/// process is gone or not ours to inspect.
pub fn pid_namespace(pid: u32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

/// Host pids of every process in the PID namespace with inode `ns` (see [`pid_namespace`]),
/// found in `/proc`. Without root the sandbox's init is not among them (it is not dumpable, so
/// not the caller's to inspect); every process it started is.
pub fn namespace_processes(ns: u64) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| pid_namespace(*p) == Some(ns))
        .collect();
    out.sort_unstable();
    out
}

/// Ends a sandbox that has no cgroups (rlimit-only limits) through its PID namespace:
/// `SIGKILL` to its init, when `init_pid` is still the init of namespace `ns` (so a recycled pid
/// is left alone), after which the kernel kills every other process of the namespace; then
/// waits (at most 10 s) until none is left. Returns how many processes the namespace held.
pub fn kill_namespace(init_pid: u32, ns: u64) -> usize {
    let found = namespace_processes(ns);
    // Still the init: its namespace says so, or (without root, when that cannot be read) a
    // process of the namespace is its child (every process of it descends from the init).
    let is_init = pid_namespace(init_pid) == Some(ns)
        || found.iter().any(|p| parent_pid(*p) == Some(init_pid));
    if is_init && let Some(pid) = rustix::process::Pid::from_raw(init_pid as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let left = namespace_processes(ns);
        if left.is_empty() || Instant::now() >= until {
            break;
        }
        // A process that outlived its init's kill (it never does: the kernel zaps the
        // namespace) is killed too.
        for p in left {
            if let Some(pid) = rustix::process::Pid::from_raw(p as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    found.len() + usize::from(is_init && !found.contains(&init_pid))
}

/// The parent pid of `pid`, from `/proc/PID/stat` (readable for any process).
fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses; it ends at the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// True when this process was started by [`launch`] as a sandbox init, so `main` should call
/// [`init_main`] before anything else (before starting any thread).
pub fn is_init_invocation() -> bool {
    std::env::var_os(INIT_FD_ENV).is_some()
}

fn exit_status(s: std::process::ExitStatus) -> ExitStatus {
    match (s.code(), s.signal()) {
        (Some(c), _) => ExitStatus::Code(c),
        (None, Some(sig)) => ExitStatus::Signal(sig),
        (None, None) => ExitStatus::Code(-1),
    }
}

impl SandboxHandle {
    /// Host pid of the sandbox's init (PID 1 inside).
    pub fn pid(&self) -> u32 {
        self.init_pid
    }

    /// Host pid of the monitor: the process [`launch`] spawned, which waits for the init outside
    /// the sandbox and exits with its status.
    pub fn monitor_pid(&self) -> u32 {
        self.monitor_pid
    }

    /// The inode of the sandbox's PID namespace (see [`pid_namespace`]).
    pub fn pid_namespace(&self) -> Option<u64> {
        self.pid_ns
    }

    /// The sandbox's cgroup directories (one per cgroup v1 hierarchy, or one cgroup v2
    /// directory; none with [`LimitMode::Rlimit`]).
    pub fn cgroup_paths(&self) -> Vec<PathBuf> {
        self.cgroups.paths()
    }

    /// How Landlock was applied: `fully enforced` or `partially enforced (...)`.
    pub fn landlock_status(&self) -> &str {
        &self.landlock
    }

    /// Host pids of every process in the sandbox's cgroups now (the monitor included); without
    /// cgroups ([`LimitMode::Rlimit`]), of every process in its PID namespace (the monitor,
    /// outside it, is not counted).
    pub fn processes(&self) -> Vec<u32> {
        if self.cgroups.is_empty() {
            return self.pid_ns.map(namespace_processes).unwrap_or_default();
        }
        self.cgroups.pids().into_iter().collect()
    }

    /// Takes the program's stdin, stdout and stderr pipes, when [`launch_with`] was given
    /// [`Stdio::piped`] for them.
    pub fn take_stdio(&self) -> (Option<ChildStdin>, Option<ChildStdout>, Option<ChildStderr>) {
        let mut s = self.stdio.lock().unwrap_or_else(|e| e.into_inner());
        (s.0.take(), s.1.take(), s.2.take())
    }

    /// Kills every process in the sandbox's cgroups (without cgroups: its PID namespace, see
    /// [`kill_namespace`]), waits until they are empty, reaps the monitor and removes the
    /// cgroups. Returns how many processes were killed (found in the
    /// cgroups while killing). Killing a sandbox that already ended succeeds and returns 0.
    ///
    /// # Errors
    /// [`Error::Backend`] when processes remain after 10 s or a cgroup cannot be removed.
    pub fn kill(&self) -> Result<usize> {
        let killed = if self.cgroups.is_empty() {
            self.pid_ns
                .map_or(0, |ns| kill_namespace(self.init_pid, ns))
        } else {
            self.cgroups.kill_all()
        };
        {
            let mut m = self.monitor.lock().unwrap_or_else(|e| e.into_inner());
            let _ = m.kill();
            let _ = m.wait();
        }
        let left: BTreeSet<u32> = if self.cgroups.is_empty() {
            self.processes().into_iter().collect()
        } else {
            self.cgroups.pids()
        };
        if !left.is_empty() {
            return Err(Error::Backend(format!(
                "processes {left:?} are still in the sandbox cgroups after SIGKILL"
            )));
        }
        self.cgroups.remove()?;
        Ok(killed)
    }

    /// Sends `signal` to the init, which forwards `SIGTERM`, `SIGINT`, `SIGHUP`, `SIGQUIT`,
    /// `SIGUSR1` and `SIGUSR2` to the program (other signals to the init are ignored, `SIGKILL`
    /// ends the whole sandbox).
    ///
    /// # Errors
    /// [`Error::Backend`] when the init is gone or the signal invalid.
    pub fn signal(&self, signal: i32) -> Result<()> {
        let pid = rustix::process::Pid::from_raw(self.init_pid as i32)
            .ok_or_else(|| Error::Backend("no init pid".into()))?;
        let sig = rustix::process::Signal::from_named_raw(signal)
            .ok_or_else(|| Error::Backend(format!("invalid signal {signal}")))?;
        rustix::process::kill_process(pid, sig)
            .map_err(|e| Error::Backend(format!("cannot signal the sandbox init: {e}")))
    }

    /// Waits for the sandbox to end: the monitor exits with the program's exit code, or
    /// 128 + the signal that killed the program ([`ExitStatus::Code`] either way);
    /// [`ExitStatus::Signal`] means the monitor itself was killed. The cgroups are left for
    /// [`SandboxHandle::kill`] (or drop) to remove.
    ///
    /// # Errors
    /// [`Error::Backend`] when waiting fails.
    pub fn wait(&self) -> Result<ExitStatus> {
        let mut m = self.monitor.lock().unwrap_or_else(|e| e.into_inner());
        m.wait()
            .map(exit_status)
            .map_err(|e| Error::Backend(format!("cannot wait for the sandbox: {e}")))
    }

    /// Like [`SandboxHandle::wait`], giving up after `timeout` (returns `None` then).
    ///
    /// # Errors
    /// [`Error::Backend`] when waiting fails.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let until = Instant::now() + timeout;
        loop {
            let r = {
                let mut m = self.monitor.lock().unwrap_or_else(|e| e.into_inner());
                m.try_wait()
                    .map_err(|e| Error::Backend(format!("cannot wait for the sandbox: {e}")))?
            };
            if let Some(s) = r {
                return Ok(Some(exit_status(s)));
            }
            if Instant::now() >= until {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for SandboxHandle {
    fn drop(&mut self) {
        if let Err(e) = self.kill() {
            tracing::warn!(error = %e, "could not tear a sandbox down");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxSpec {
        SandboxSpec::new("/srv/ws", 61000, 61000, "sessionbox-abc", "/bin/sh")
    }

    #[test]
    fn a_default_spec_is_valid_and_round_trips_through_json() {
        let s = spec();
        s.validate().unwrap();
        let json = serde_json::to_string(&s).unwrap();
        assert!(!json.contains('\n'));
        assert_eq!(serde_json::from_str::<SandboxSpec>(&json).unwrap(), s);
        assert_eq!(s.limits.pids, 512);
        assert_eq!(s.limits.memory_bytes, 2 << 30);
    }

    #[test]
    fn bad_specs_are_refused_with_the_field_named() {
        type Tweak = fn(&mut SandboxSpec);
        let cases: Vec<(Tweak, &str)> = vec![
            (|s| s.workspace = "rel".into(), "workspace"),
            (|s| s.hostname = "a b".into(), "host name"),
            (|s| s.hostname = String::new(), "host name"),
            (|s| s.cgroup = "../x".into(), "cgroup"),
            (|s| s.cgroup = ".hidden".into(), "cgroup"),
            (|s| s.cgroup = "a/b".into(), "cgroup"),
            (|s| s.program = "sh".into(), "program"),
            (|s| s.program = "/bin/../sh".into(), "program"),
            (|s| s.limits.pids = 1, "limits"),
            (|s| s.limits.cpu = f64::NAN, "limits"),
            (|s| s.limits.memory_bytes = 1024, "limits"),
            (|s| s.args = vec!["a\0b".into()], "NUL"),
            (|s| s.env = vec![("A-B".into(), "x".into())], "environment"),
            (|s| s.ro_binds = vec![("rel".into(), "/x".into())], "source"),
            (|s| s.ro_binds = vec![("/a".into(), "/".into())], "target"),
            (
                |s| s.ro_binds = vec![("/a".into(), "/x/../y".into())],
                "target",
            ),
            (
                |s| s.ro_binds = vec![("/a".into(), "/usr/x".into())],
                "/usr",
            ),
            (
                |s| s.ro_binds = vec![("/a".into(), "/workspace".into())],
                "/workspace",
            ),
            (
                |s| s.ro_binds = vec![("/a".into(), "/proc/x".into())],
                "/proc",
            ),
            (
                |s| {
                    s.ro_binds = vec![
                        ("/a".into(), "/opt/a".into()),
                        ("/b".into(), "/opt/a/b".into()),
                    ]
                },
                "overlap",
            ),
        ];
        for (tweak, word) in cases {
            let mut s = spec();
            tweak(&mut s);
            let e = s.validate().unwrap_err();
            assert!(matches!(e, Error::InvalidRequest(_)), "{e}");
            assert!(e.to_string().contains(word), "{word}: {e}");
        }
        let mut s = spec();
        s.ro_binds = vec![
            ("/a".into(), "/.sessionbox/sessionbox".into()),
            ("/b".into(), "/opt/tool".into()),
        ];
        s.validate().unwrap();
    }
}
