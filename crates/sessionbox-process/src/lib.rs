//! Running one shell command as a host process, the way every runtime that runs commands on
//! Linux must.
//!
//! [`run`] starts `/bin/sh -c COMMAND` with:
//! - a clean environment: [`base_environment`] plus the request's additions, nothing of the
//!   caller's;
//! - a new session (so a new process group, led by the shell, and no controlling terminal);
//! - its working directory set by `fchdir` on a directory descriptor the caller opened beneath the
//!   workspace, never by a path string;
//! - every inherited descriptor above 2 marked close-on-exec, so none leaks into the command;
//! - stdin fed from the request (written while output is read), a pipe kept open for writes
//!   from outside ([`run_live`], [`LiveStdin`]), or `/dev/null`;
//! - stdout and stderr read concurrently, each kept up to the request's output limit and drained
//!   (discarded) past it, so memory stays bounded whatever the command prints;
//! - a timeout that sends `SIGTERM` to the whole process group, then `SIGKILL` after a grace;
//! - whatever is left in the group sent `SIGKILL` as soon as the shell exits (normally, or during
//!   the grace), so nothing outlives the call; output already in the pipes is then read for at
//!   most [`DRAIN_DEADLINE`], in case a process that left the group still holds a pipe open;
//! - when the caller runs with `no_new_privs` (as everything in a sandbox does: the in-sandbox
//!   agent) and the kernel has Landlock scopes (ABI 6, Linux 6.12), a Landlock domain of its own,
//!   nested in the caller's, that restricts no file access but scopes signals and abstract UNIX
//!   sockets: the command and its descendants can signal each other, not the caller (the agent),
//!   its other processes or anything else outside, and cannot connect to abstract sockets created
//!   outside; Landlock also keeps it from `ptrace`-style access (`/proc/PID/mem`) to them. A
//!   command therefore cannot stop or kill the agent, but neither can it signal what an earlier
//!   command left running. Without `no_new_privs` (a host runtime run by a person) nothing
//!   changes: setting it would stop set-uid programs such as `sudo` in the commands. On a kernel
//!   without scopes, commands run without the domain ([`command_scoping`] says which).
//!
//! [`spawn_terminal`] starts a shell on a pseudo-terminal the same way (see [`terminal`]).
//!
//! [`processes_under`] and [`kill_all`] find and kill host processes still working in a
//! directory, for tearing a workspace down.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

pub mod memory;
mod stdin;
pub use memory::{memory_charge, resident_bytes};
pub use stdin::LiveStdin;

use rustix::process::{Pid, Signal};
use sessionbox_core::{Error, ExecRequest, ExecResult, ExitStatus, Result, base_environment};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{ChildStdin, Command};
use tokio::time::{Instant, sleep_until};

pub mod terminal;
pub use terminal::{
    TERMINAL_TERM, Terminal, TerminalSpawn, kill_session, set_window_size, signal_foreground,
    spawn_terminal,
};

/// Default time between `SIGTERM` and `SIGKILL` when a command times out: 2 s.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(2);

/// How long output is still read after the shell exited and its process group was killed: 200 ms.
/// Only a process that left the group (say with `setsid`) can hold a pipe open past that; its
/// output is then abandoned rather than waited for.
pub const DRAIN_DEADLINE: Duration = Duration::from_millis(200);

/// Size of each read from a pipe, in bytes (the chunk size [`run`]'s `on_output` sees at most).
const READ_CHUNK: usize = 64 * 1024;

/// Highest descriptor marked close-on-exec one by one when the kernel lacks `close_range`
/// (before Linux 5.11).
const FALLBACK_MAX_FD: u64 = 1 << 20;

/// What [`run`] runs, and where.
#[derive(Debug, Clone, Copy)]
pub struct Spawn<'a> {
    /// The command, environment additions, timeout, stdin and per-stream output limit. [`run`]
    /// validates it again.
    pub request: &'a ExecRequest,
    /// A directory descriptor opened beneath the workspace; the child `fchdir`s to it before
    /// `exec`. It need not be close-on-exec: the child marks it so.
    pub cwd: BorrowedFd<'a>,
    /// `HOME` as the command sees the workspace (for example `/workspace`, or the host path).
    pub home: &'a str,
    /// Time between `SIGTERM` and `SIGKILL` to the process group when the timeout expires. The
    /// grace ends early when the shell exits: the rest of the group gets `SIGKILL` then.
    pub kill_grace: Duration,
    /// Where to publish the command's process group while it runs (the shell's pid, which
    /// leads it), so a caller can signal it (pause and resume it); set back to 0 when the shell
    /// has exited. `None`: not published.
    pub group: Option<&'a std::sync::atomic::AtomicI32>,
}

impl<'a> Spawn<'a> {
    /// A spawn with [`DEFAULT_KILL_GRACE`].
    pub fn new(request: &'a ExecRequest, cwd: BorrowedFd<'a>, home: &'a str) -> Self {
        Spawn {
            request,
            cwd,
            home,
            kill_grace: DEFAULT_KILL_GRACE,
            group: None,
        }
    }
}

/// One of the command's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// Standard output (fd 1).
    Stdout,
    /// Standard error (fd 2).
    Stderr,
}

/// A sink for output as it arrives: called with the stream and a chunk of bytes (see [`run`]).
pub type OnOutput<'a> = &'a mut (dyn FnMut(Stream, &[u8]) + Send);

/// Runs `/bin/sh -c COMMAND` as described in the [module docs](self) and waits for it and its
/// output.
///
/// `on_output`, when given, receives every chunk of output as it is read (up to 64 KiB each,
/// before the output limit is applied), so a server can stream it; it is called from this future,
/// never concurrently, and should return quickly.
///
/// The result's `status` is how the shell ended: its exit code, or the signal that killed it
/// (after a timeout, usually `SIGTERM` or `SIGKILL`, with `timed_out` set). `duration` runs from
/// spawn to the end of output. If this future is dropped before it completes, the process group
/// is sent `SIGKILL`.
///
/// # Errors
/// - [`Error::InvalidRequest`] when the request fails [`ExecRequest::validate`].
/// - [`Error::Backend`] when the command cannot be started (no `/bin/sh`, `cwd` not a directory,
///   no process slots, ...) or waiting for it fails.
pub async fn run(spawn: Spawn<'_>, on_output: Option<OnOutput<'_>>) -> Result<ExecResult> {
    run_with(spawn, on_output, None).await
}

/// As [`run`], with the command's stdin a pipe kept open: `stdin` takes writes while the command
/// runs (the request's `stdin` bytes, if any, are not used), and is closed when it ends.
///
/// # Errors
/// As [`run`].
pub async fn run_live(
    spawn: Spawn<'_>,
    on_output: Option<OnOutput<'_>>,
    stdin: &LiveStdin,
) -> Result<ExecResult> {
    run_with(spawn, on_output, Some(stdin)).await
}

async fn run_with(
    spawn: Spawn<'_>,
    mut on_output: Option<OnOutput<'_>>,
    live: Option<&LiveStdin>,
) -> Result<ExecResult> {
    let _ended = stdin::EndGuard(live.cloned());
    let req = spawn.request;
    req.validate()?;
    let limit = req.output_limit;

    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(&req.command)
        .env_clear()
        .envs(base_environment(spawn.home))
        .envs(&req.env)
        .stdin(if req.stdin.is_some() || live.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let cwd_fd: RawFd = spawn.cwd.as_raw_fd();
    let fallback_max_fd = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(FALLBACK_MAX_FD)
        .min(FALLBACK_MAX_FD) as RawFd;
    // Built before the fork: the child may not allocate.
    let scope_fd: Option<RawFd> = scope_ruleset().map(|fd| fd.as_raw_fd());
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // calls are allowed. It captures three integers and makes only raw system calls: setsid,
    // fchdir, close_range, fcntl, prctl and landlock_restrict_self (rustix issues these as
    // direct system calls or plain libc wrappers; libc::syscall and libc::prctl are thin
    // wrappers). It allocates nothing, takes no lock and touches no shared state; errors are
    // returned as `io::Error::from_raw_os_error` or `last_os_error`, which do not allocate.
    // `cwd_fd` stays open for the whole spawn because `spawn.cwd` borrows it for longer than this
    // function; `scope_fd` is owned by a static that is never dropped.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::setsid()?;
            rustix::process::fchdir(BorrowedFd::borrow_raw(cwd_fd))?;
            mark_inherited_fds_cloexec(fallback_max_fd)?;
            if let Some(fd) = scope_fd {
                enter_scope(fd)?;
            }
            Ok(())
        });
    }

    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::Backend(format!("could not start /bin/sh -c for the command: {e}")))?;
    let group = child.id().and_then(|id| Pid::from_raw(id as i32));
    let _published = Published::new(spawn.group, group);
    let mut guard = GroupGuard(group);
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    if let (Some(live), Some(pipe)) = (live, live.and_then(|_| stdin.take())) {
        live.open(pipe);
    }
    let stdin_data: &[u8] = req.stdin.as_deref().unwrap_or_default();
    let mut stdin_pos = 0;

    let mut out = Capped::new(limit);
    let mut err = Capped::new(limit);
    let mut out_buf = vec![0u8; READ_CHUNK];
    let mut err_buf = vec![0u8; READ_CHUNK];

    let timeout_at = started + req.timeout;
    let mut status: Option<std::process::ExitStatus> = None;
    // Set when the timeout sent SIGTERM: when SIGKILL follows.
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    // Set once the shell is gone and its group killed: when to stop waiting for output.
    let mut drain_until: Option<Instant> = None;

    if stdin_data.is_empty() {
        stdin = None;
    }

    while status.is_none() || stdout.is_some() || stderr.is_some() {
        tokio::select! {
            r = write_some(&mut stdin, &stdin_data[stdin_pos..]), if stdin.is_some() => {
                match r {
                    Ok(n) if n > 0 => {
                        stdin_pos += n;
                        if stdin_pos == stdin_data.len() {
                            stdin = None;
                        }
                    }
                    // Zero bytes or an error (EPIPE: the command stopped reading): give up on it.
                    _ => stdin = None,
                }
            }
            r = read_some(&mut stdout, &mut out_buf), if stdout.is_some() => {
                match r {
                    Ok(n) if n > 0 => {
                        if let Some(f) = on_output.as_mut() {
                            f(Stream::Stdout, &out_buf[..n]);
                        }
                        out.push(&out_buf[..n]);
                    }
                    _ => stdout = None,
                }
            }
            r = read_some(&mut stderr, &mut err_buf), if stderr.is_some() => {
                match r {
                    Ok(n) if n > 0 => {
                        if let Some(f) = on_output.as_mut() {
                            f(Stream::Stderr, &err_buf[..n]);
                        }
                        err.push(&err_buf[..n]);
                    }
                    _ => stderr = None,
                }
            }
            r = child.wait(), if status.is_none() => {
                let s = r.map_err(|e| Error::Backend(format!("could not wait for the command: {e}")))?;
                status = Some(s);
                stdin = None;
                if let Some(live) = live {
                    live.ended();
                }
                // Nothing of the command may outlive the shell (after a timeout too: the grace
                // ends when the shell does).
                signal_group(group, Signal::KILL);
                killed = true;
                drain_until = Some(Instant::now() + DRAIN_DEADLINE);
            }
            _ = sleep_until(timeout_at), if status.is_none() && kill_at.is_none() => {
                tracing::debug!(timeout = ?req.timeout, "command timed out; sending SIGTERM to its process group");
                signal_group(group, Signal::TERM);
                kill_at = Some(Instant::now() + spawn.kill_grace);
            }
            _ = sleep_until(kill_at.unwrap_or(timeout_at)), if kill_at.is_some() && !killed => {
                signal_group(group, Signal::KILL);
                killed = true;
            }
            _ = sleep_until(drain_until.unwrap_or(timeout_at)), if drain_until.is_some() => {
                tracing::debug!("a process outside the command's group still holds its output open; not waiting for it");
                break;
            }
        }
    }

    // The loop ends only after the shell exited, when the group was killed; `guard` is disarmed.
    guard.0 = None;
    let duration = started.elapsed();

    let status = status.expect("the loop ends only after the shell exited");
    let status = match (status.code(), status.signal()) {
        (Some(c), _) => ExitStatus::Code(c),
        (None, Some(sig)) => ExitStatus::Signal(sig),
        (None, None) => return Err(Error::Backend(format!("unexpected wait status {status}"))),
    };
    Ok(ExecResult {
        status,
        stdout: out.data,
        stderr: err.data,
        stdout_truncated: out.truncated,
        stderr_truncated: err.truncated,
        timed_out: kill_at.is_some(),
        duration,
    })
}

/// Whether [`run`] puts commands in a Landlock domain of their own that scopes signals and
/// abstract UNIX sockets (see the [module docs](self)): the calling thread runs with
/// `no_new_privs` and the kernel has Landlock ABI 6 or later.
pub fn command_scoping() -> bool {
    scope_ruleset().is_some()
}

/// The Landlock ruleset commands enter, created once per process: no file-system or network
/// access handled, signals and abstract UNIX sockets scoped. `None` when the calling thread lacks
/// `no_new_privs` or the kernel lacks scopes.
fn scope_ruleset() -> Option<&'static OwnedFd> {
    static RULESET: OnceLock<Option<OwnedFd>> = OnceLock::new();
    if !rustix::thread::no_new_privs().unwrap_or(false) {
        return None;
    }
    RULESET
        .get_or_init(|| {
            use landlock::{ABI, Access, CompatLevel, Compatible, Ruleset, RulesetAttr, Scope};
            let created = Ruleset::default()
                .set_compatibility(CompatLevel::HardRequirement)
                .scope(Scope::from_all(ABI::V6))
                .and_then(|r| r.create());
            match created {
                Ok(r) => Option::<OwnedFd>::from(r),
                Err(e) => {
                    tracing::debug!(error = %e, "no Landlock scopes on this kernel: commands can signal the caller");
                    None
                }
            }
        })
        .as_ref()
}

/// In the forked child: enters the scoping domain of `ruleset`. `no_new_privs` is set first (the
/// caller already has it; [`scope_ruleset`] checked), as `landlock_restrict_self` requires.
/// Async-signal-safe: two system calls.
fn enter_scope(ruleset: RawFd) -> io::Result<()> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1) takes integers only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: landlock_restrict_self(2) takes a descriptor (a ruleset that stays open: see
    // `run`) and flags; it touches no memory of this process.
    if unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Marks every descriptor from 3 up close-on-exec. Runs in the forked child: async-signal-safe.
fn mark_inherited_fds_cloexec(fallback_max_fd: RawFd) -> io::Result<()> {
    // SAFETY: close_range(2) with CLOSE_RANGE_CLOEXEC only changes descriptor flags; it takes
    // three integer arguments and touches no memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EINVAL)) {
        return Err(e);
    }
    // Before Linux 5.11: one by one, up to the descriptor limit.
    for fd in 3..fallback_max_fd {
        // SAFETY: fcntl on a descriptor that may not exist is harmless (EBADF, ignored); the
        // borrow lasts for this one call.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let _ = rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC);
    }
    Ok(())
}

/// Writes some of `data` to the pipe; waits forever when there is none (the branch is disabled).
async fn write_some(pipe: &mut Option<ChildStdin>, data: &[u8]) -> io::Result<usize> {
    match pipe {
        Some(p) => p.write(data).await,
        None => std::future::pending().await,
    }
}

/// Reads a chunk from the pipe; waits forever when there is none (the branch is disabled).
async fn read_some<R: AsyncRead + Unpin>(
    pipe: &mut Option<R>,
    buf: &mut [u8],
) -> io::Result<usize> {
    match pipe {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Output kept up to a limit; the rest counted as truncated.
struct Capped {
    data: Vec<u8>,
    limit: usize,
    truncated: bool,
}

impl Capped {
    fn new(limit: usize) -> Self {
        Capped {
            data: Vec::new(),
            limit,
            truncated: false,
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        let room = self.limit - self.data.len();
        if chunk.len() > room {
            self.truncated = true;
        }
        self.data.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
}

/// Sends `sig` to the process group led by the shell, ignoring "no such group".
fn signal_group(group: Option<Pid>, sig: Signal) {
    if let Some(g) = group {
        let _ = rustix::process::kill_process_group(g, sig);
    }
}

/// The process group published in [`Spawn::group`] while the command runs; 0 again on drop.
struct Published<'a>(Option<&'a std::sync::atomic::AtomicI32>);

impl<'a> Published<'a> {
    fn new(slot: Option<&'a std::sync::atomic::AtomicI32>, group: Option<Pid>) -> Self {
        if let (Some(s), Some(g)) = (slot, group) {
            s.store(
                g.as_raw_nonzero().get(),
                std::sync::atomic::Ordering::SeqCst,
            );
        }
        Published(slot)
    }
}

impl Drop for Published<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.0 {
            s.store(0, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// Sends `SIGKILL` to the group on drop unless disarmed, so a cancelled [`run`] leaves nothing.
struct GroupGuard(Option<Pid>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        signal_group(self.0, Signal::KILL);
    }
}

/// Pids of the host processes whose working directory or root directory is `dir` or beneath it,
/// compared component-wise (`/a/bc` is not beneath `/a/b`), read from `/proc/PID/cwd` and
/// `/proc/PID/root`. The calling process is left out.
///
/// `dir` is canonicalised first when it exists. Processes whose links cannot be read (gone
/// meanwhile, or another user's without the privilege to look) are skipped; so is everything
/// when `/proc` cannot be read. Pids are in `/proc`'s order. Every process is under `/`.
pub fn processes_under(dir: &Path) -> Vec<u32> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let link =
            |name: &str| -> Option<PathBuf> { std::fs::read_link(entry.path().join(name)).ok() };
        let inside = |p: Option<PathBuf>| p.is_some_and(|p| p.starts_with(&dir));
        if inside(link("cwd")) || inside(link("root")) {
            pids.push(pid);
        }
    }
    pids
}

/// Sends `SIGKILL` to each pid and, when it leads a process group, to that group; returns how
/// many of `pids` were signalled (a pid counts once when it or its group was).
///
/// Pids 0 and 1, pids above `i32::MAX`, the calling process and the caller's own process group
/// are never signalled. Pids already gone are skipped.
pub fn kill_all(pids: &[u32]) -> usize {
    let me = std::process::id();
    let my_group = rustix::process::getpgrp();
    let mut signalled = 0;
    for &raw in pids {
        if raw <= 1 || raw == me {
            continue;
        }
        let Some(pid) = i32::try_from(raw).ok().and_then(Pid::from_raw) else {
            continue;
        };
        let mut hit = false;
        if rustix::process::getpgid(Some(pid)).is_ok_and(|g| g == pid && g != my_group) {
            hit |= rustix::process::kill_process_group(pid, Signal::KILL).is_ok();
        }
        hit |= rustix::process::kill_process(pid, Signal::KILL).is_ok();
        if hit {
            signalled += 1;
        }
    }
    signalled
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    /// The kernel's Landlock ABI (0 without Landlock).
    fn landlock_abi() -> i64 {
        // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) reads no
        // memory and returns the ABI version (or -1).
        let r = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<libc::c_void>(),
                0usize,
                1u32,
            )
        };
        r.max(0)
    }

    /// Runs `command` from a fresh thread (with `no_new_privs` set on it when `nnp`), in a
    /// temporary directory, while this process listens on the abstract UNIX socket named
    /// `$SOCKET` in the command's environment; returns whether commands are scoped, and the
    /// command's stdout.
    fn run_on_thread(command: &'static str, nnp: bool) -> (bool, String) {
        std::thread::spawn(move || {
            use std::os::linux::net::SocketAddrExt;
            let name = format!("sessionbox-test-{}-{nnp}", std::process::id());
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
            let _listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
            if nnp {
                // Per thread: only this thread (and what it forks) has it.
                rustix::thread::set_no_new_privs(true).unwrap();
            }
            let dir = tempfile::tempdir().unwrap();
            let cwd = std::fs::File::open(dir.path()).unwrap();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut req = ExecRequest::new(command);
            req.env.insert("SOCKET".into(), name);
            let r = rt
                .block_on(run(Spawn::new(&req, cwd.as_fd(), "/w"), None))
                .unwrap();
            (
                command_scoping(),
                String::from_utf8_lossy(&r.stdout).into_owned(),
            )
        })
        .join()
        .unwrap()
    }

    /// Signals the caller (harmlessly: `SIGCONT`) and a child of its own, and connects to the
    /// caller's abstract socket.
    const SIGNALS: &str = "kill -CONT $PPID 2>/dev/null; echo caller $?; \
        sleep 30 & kill $!; echo child $?; wait $!; echo waited $?; \
        perl -MSocket -e 'socket(my $s, PF_UNIX, SOCK_STREAM, 0) or die; \
          print connect($s, pack_sockaddr_un(\"\\0$ENV{SOCKET}\")) ? \"abstract ok\\n\" : \"abstract $!\\n\"'";

    #[test]
    fn with_no_new_privs_a_command_can_signal_its_children_but_not_its_caller() {
        if landlock_abi() < 6 {
            let (scoped, out) = run_on_thread(SIGNALS, true);
            assert!(!scoped);
            assert_eq!(out, "caller 0\nchild 0\nwaited 143\nabstract ok\n");
            eprintln!("SKIPPED: no Landlock scopes on this kernel (ABI < 6)");
            return;
        }
        let (scoped, out) = run_on_thread(SIGNALS, true);
        assert!(scoped);
        assert_eq!(
            out,
            "caller 1\nchild 0\nwaited 143\nabstract Operation not permitted\n"
        );
    }

    #[test]
    fn without_no_new_privs_commands_are_not_scoped() {
        if rustix::thread::no_new_privs().unwrap() {
            eprintln!("SKIPPED: the test runs with no_new_privs");
            return;
        }
        let (scoped, out) = run_on_thread(SIGNALS, false);
        assert!(!scoped);
        assert_eq!(out, "caller 0\nchild 0\nwaited 143\nabstract ok\n");
    }
}
