//! Child side: the monitor (the process [`super::launch`] spawned), the sandbox's init (PID 1
//! inside) and the program's last steps before `execve`.
//!
//! Every process here is single-threaded: [`init_main`] checks it before doing anything, so
//! `fork` and `clone` are safe and the forked children may allocate.
//!
//! Over 800 lines on purpose: it is one sequence (monitor, user namespace, init, program) whose
//! steps share the failure reporting and must be read in order; the mechanisms it applies live
//! in `mounts`, `confine`, `cgroup` and `limits`.

use std::ffi::CString;
use std::fmt::Display;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicI32, Ordering};

use rustix::process::{Pid, WaitOptions};

use super::{
    INIT_FD, INIT_FD_ENV, INSIDE_GID, INSIDE_UID, PASSED_FD, PASSED_FD_ENV, Report, SandboxSpec,
    WORKSPACE_DIR,
};
use super::{confine, mounts, probe};

/// Largest spec accepted on the control socket: 16 MiB.
const MAX_SPEC_BYTES: usize = 16 << 20;

/// The namespaces every sandbox gets.
pub(crate) const NAMESPACES: [(&str, libc::c_int); 7] = [
    ("user namespace", libc::CLONE_NEWUSER),
    ("mount namespace", libc::CLONE_NEWNS),
    ("pid namespace", libc::CLONE_NEWPID),
    ("network namespace", libc::CLONE_NEWNET),
    ("ipc namespace", libc::CLONE_NEWIPC),
    ("uts namespace", libc::CLONE_NEWUTS),
    ("cgroup namespace", libc::CLONE_NEWCGROUP),
];

pub(crate) const HINT_USERNS: &str = "run sessionbox as root, or allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1 on Debian kernels, kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu); inside a container, give it a seccomp/AppArmor profile that permits unshare(CLONE_NEWUSER) and setns";
const HINT_KERNEL: &str = "run on Linux 5.13 or later with namespaces, Landlock and seccomp enabled; `sessionbox doctor` lists what is missing";
const HINT_BUG: &str =
    "this is a sessionbox bug or a very unusual host; report it with `sessionbox doctor` output";

/// One layer that could not be applied: reported to the parent as [`Report::Error`].
#[derive(Debug)]
pub(crate) struct Failure {
    pub layer: &'static str,
    pub reason: String,
    pub hint: &'static str,
}

impl Failure {
    pub(crate) fn new(layer: &'static str, reason: impl Display, hint: &'static str) -> Self {
        Failure {
            layer,
            reason: reason.to_string(),
            hint,
        }
    }

    fn report(&self) -> Report {
        Report::Error {
            layer: self.layer.into(),
            reason: self.reason.clone(),
            hint: self.hint.into(),
        }
    }
}

pub(crate) type Step<T> = std::result::Result<T, Failure>;

/// Attaches a layer, a description and a hint to an error.
pub(crate) trait Layer<T> {
    fn layer(self, layer: &'static str, what: impl Display, hint: &'static str) -> Step<T>;
}

impl<T, E: Display> Layer<T> for std::result::Result<T, E> {
    fn layer(self, layer: &'static str, what: impl Display, hint: &'static str) -> Step<T> {
        self.map_err(|e| Failure::new(layer, format!("{what}: {e}"), hint))
    }
}

/// Sends one report line; errors (the parent went away) are ignored.
pub(crate) fn send(ctl: BorrowedFd<'_>, report: &Report) {
    let mut line = serde_json::to_string(report).unwrap_or_default();
    line.push('\n');
    write_all(ctl, line.as_bytes());
}

fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) {
    while !buf.is_empty() {
        // MSG_NOSIGNAL where it is a socket, so a vanished parent gives EPIPE, not SIGPIPE.
        let r = rustix::net::send(fd, buf, rustix::net::SendFlags::NOSIGNAL).or_else(|e| match e {
            rustix::io::Errno::NOTSOCK => rustix::io::write(fd, buf),
            e => Err(e),
        });
        match r {
            Ok(0) => return,
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return,
        }
    }
}

/// Child side: the body of the hidden init subcommand. Never returns: exits with the program's
/// status (128 + the signal when a signal ended it), or 1 after reporting a failure to
/// [`super::launch`], or 2 when it was not started by [`super::launch`].
///
/// Call it first thing in `main` when [`super::is_init_invocation`] is true, before any thread
/// is started (it refuses to run in a multithreaded process).
pub fn init_main() -> ! {
    if std::env::var_os(INIT_FD_ENV).as_deref() != Some(std::ffi::OsStr::new("3")) {
        eprintln!(
            "sessionbox: the sandbox init is an internal entry point; only sessionbox starts it"
        );
        std::process::exit(2);
    }
    // SAFETY: `launch` placed the control socket at descriptor 3 of this process and said so in
    // INIT_FD_ENV; nothing else in this freshly started process owns descriptor 3.
    let ctl = unsafe { OwnedFd::from_raw_fd(INIT_FD) };
    let mut ctl = Some(ctl);
    let code = match monitor(&mut ctl) {
        Ok(code) => code,
        Err(f) => {
            if let Some(c) = &ctl {
                send(c.as_fd(), &f.report());
            }
            1
        }
    };
    std::process::exit(code)
}

/// Marks (or closes) every descriptor from `from` up. Async-signal-safe.
pub(crate) fn close_fds_from(from: u32, cloexec_only: bool) -> io::Result<()> {
    let flags = if cloexec_only {
        libc::CLOSE_RANGE_CLOEXEC
    } else {
        0
    };
    // SAFETY: close_range(2) takes three integers and touches no memory. Closing descriptors this
    // process does not use is its intent: the callers own every descriptor at or above `from`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            from as libc::c_uint,
            libc::c_uint::MAX,
            flags,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EINVAL)) {
        return Err(e);
    }
    // Before Linux 5.11 (5.9 without CLOSE_RANGE_CLOEXEC): one by one up to the limit.
    let max = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1 << 20)
        .min(1 << 20) as i32;
    for fd in from as i32..max {
        if cloexec_only {
            // SAFETY: fcntl on a descriptor that may not exist is harmless (EBADF, ignored).
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        } else {
            // SAFETY: as above for close; see the ownership note on close_range.
            unsafe { libc::close(fd) };
        }
    }
    Ok(())
}

/// Number of threads of this process.
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count())
}

fn read_spec(ctl: BorrowedFd<'_>) -> Step<SandboxSpec> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match rustix::io::read(ctl, &mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.contains(&b'\n') {
                    break;
                }
                if buf.len() > MAX_SPEC_BYTES {
                    return Err(Failure::new("spec", "the spec is too large", HINT_BUG));
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(Failure::new(
                    "spec",
                    format!("cannot read it: {e}"),
                    HINT_BUG,
                ));
            }
        }
    }
    let line = buf.split(|b| *b == b'\n').next().unwrap_or_default();
    let spec: SandboxSpec =
        serde_json::from_slice(line).layer("spec", "cannot parse it", HINT_BUG)?;
    spec.validate().layer("spec", "invalid", HINT_BUG)?;
    Ok(spec)
}

/// The monitor: clones the init into its namespaces, maps its ids, waits for it.
fn monitor(ctl_slot: &mut Option<OwnedFd>) -> Step<i32> {
    fn ctl(slot: &Option<OwnedFd>) -> BorrowedFd<'_> {
        slot.as_ref().expect("the control socket is open").as_fd()
    }
    if thread_count() != 1 {
        return Err(Failure::new(
            "init",
            "the init entry point was called in a multithreaded process",
            "call sessionbox_sandbox::init_main first thing in main, before any thread starts",
        ));
    }
    // The descriptor `launch` passes for the program, when it says it passed one.
    let passed = match std::env::var_os(PASSED_FD_ENV) {
        None => None,
        Some(v) if v == *PASSED_FD.to_string() => {
            // SAFETY: fcntl(F_GETFD) takes integers only; it checks that the descriptor is open.
            if unsafe { libc::fcntl(PASSED_FD, libc::F_GETFD) } < 0 {
                return Err(Failure::new(
                    "descriptors",
                    format!(
                        "descriptor {PASSED_FD} to pass to the program is not open: {}",
                        io::Error::last_os_error()
                    ),
                    HINT_BUG,
                ));
            }
            // SAFETY: `launch` placed the descriptor to pass at PASSED_FD of this process and said
            // so in PASSED_FD_ENV; it is open (checked above) and nothing else in this freshly
            // started process owns it.
            Some(unsafe { OwnedFd::from_raw_fd(PASSED_FD) })
        }
        Some(v) => {
            return Err(Failure::new(
                "descriptors",
                format!("{PASSED_FD_ENV} is {v:?}, not {PASSED_FD}"),
                HINT_BUG,
            ));
        }
    };
    // Nothing else the spawner leaked may reach the sandbox.
    let keep = if passed.is_some() { PASSED_FD } else { INIT_FD };
    close_fds_from(keep as u32 + 1, false).layer(
        "descriptors",
        "cannot close inherited descriptors",
        HINT_KERNEL,
    )?;
    if let Some(p) = &passed {
        // Until the program's process clears it just before its execve.
        rustix::io::fcntl_setfd(p, rustix::io::FdFlags::CLOEXEC).layer(
            "descriptors",
            "cannot mark the passed descriptor close-on-exec",
            HINT_BUG,
        )?;
    }
    rustix::io::fcntl_setfd(ctl(ctl_slot), rustix::io::FdFlags::CLOEXEC).layer(
        "descriptors",
        "cannot mark the control socket close-on-exec",
        HINT_BUG,
    )?;
    // Own session: no controlling terminal of the caller, no signals from its terminal.
    let _ = rustix::process::setsid();
    let spec = read_spec(ctl(ctl_slot))?;
    // Join the sandbox's cgroup v1 hierarchies before anything else (see `launch_with`): `0` in
    // `tasks` moves this single thread, which is the whole process.
    for dir in &spec.join_cgroups {
        std::fs::write(dir.join("tasks"), "0").layer(
            "cgroup",
            format_args!("cannot join {}", dir.display()),
            HINT_BUG,
        )?;
    }

    let euid = rustix::process::geteuid();
    let egid = rustix::process::getegid();
    let root = euid.is_root();
    let (host_uid, host_gid) = if root {
        (spec.uid, spec.gid)
    } else {
        if spec.uid != euid.as_raw() || spec.gid != egid.as_raw() {
            return Err(Failure::new(
                "user namespace",
                format!(
                    "not running as root, so only the caller's own uid and gid ({}:{}) can be mapped, not {}:{}",
                    euid.as_raw(),
                    egid.as_raw(),
                    spec.uid,
                    spec.gid
                ),
                "run sessionbox as root, or give the caller's own uid and gid in the spec",
            ));
        }
        (euid.as_raw(), egid.as_raw())
    };
    if root {
        // The init inherits these; as root they can be dropped before anything else, so the
        // sandbox holds no host supplementary group.
        rustix::thread::set_thread_groups(&[]).layer(
            "identity",
            "cannot clear supplementary groups",
            HINT_BUG,
        )?;
    }

    // The user namespace first, owned by the conversation's uid (see `create_user_namespace`);
    // this process joins it, so the namespaces cloned next belong to it and the init starts in
    // it with this process's (unmapped) host identity and every capability there.
    let userns = create_user_namespace(root, host_uid, host_gid)?;
    // SAFETY: setns(2) takes a descriptor and a flag. This process is single-threaded (checked
    // above) and shares no file-system information, as joining a user namespace requires.
    if unsafe { libc::setns(userns.as_raw_fd(), libc::CLONE_NEWUSER) } != 0 {
        return Err(Failure::new(
            "user namespace",
            format!(
                "cannot join the sandbox's user namespace: {}",
                io::Error::last_os_error()
            ),
            HINT_USERNS,
        ));
    }
    drop(userns);

    let (sync_r, sync_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).layer(
        "init",
        "cannot create a pipe",
        HINT_BUG,
    )?;
    let flags = NAMESPACES
        .iter()
        .filter(|(_, n)| *n != libc::CLONE_NEWUSER)
        .fold(0, |f, (_, n)| f | n);
    // SAFETY: clone(2) without CLONE_VM, CLONE_THREAD or a new stack behaves like fork(2): the
    // child gets a copy of this process's memory and continues from here on the same (copied)
    // stack. This process is single-threaded (checked above), so no lock is held by another
    // thread and the child may run ordinary Rust code.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if ret < 0 {
        let e = io::Error::last_os_error();
        return Err(namespace_failure(e));
    }
    if ret == 0 {
        // The init: PID 1 of the new PID namespace.
        drop(sync_w);
        let ctl = ctl_slot.take().expect("the control socket is open");
        let code = init(ctl, sync_r, passed, &spec);
        std::process::exit(code);
    }
    let child = ret as i32;
    drop(sync_r);
    // The init has its copy.
    drop(passed);
    let child_pid = Pid::from_raw(child).expect("clone returned a positive pid");
    send(ctl(ctl_slot), &Report::Pid { pid: child as u32 });
    // Let the init go on (its reports follow the pid's); keep `sync_w` open while this process
    // lives, so the init sees it end.
    write_all(sync_w.as_fd(), b"x");
    *ctl_slot = None;
    loop {
        match rustix::process::waitpid(Some(child_pid), WaitOptions::empty()) {
            Ok(Some((_, status))) => {
                if let Some(code) = status.exit_status() {
                    return Ok(code);
                }
                if let Some(sig) = status.terminating_signal() {
                    return Ok(128 + sig);
                }
            }
            Ok(None) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return Ok(1),
        }
    }
}

/// Names the namespace a failed clone could not create, by trying each alone (this process is
/// in the sandbox's user namespace by then, with every capability there).
fn namespace_failure(e: io::Error) -> Failure {
    for (name, flag) in NAMESPACES {
        if flag == libc::CLONE_NEWUSER {
            continue;
        }
        if let Err(e) = probe::try_clone(flag) {
            return Failure::new(name, format!("clone({name}) failed: {e}"), HINT_KERNEL);
        }
    }
    Failure::new(
        "namespaces",
        format!("clone with the sandbox's namespaces failed: {e}"),
        HINT_KERNEL,
    )
}

/// Creates the sandbox's user namespace, owned by host `uid`/`gid`, maps [`INSIDE_UID`] and
/// [`INSIDE_GID`] to them, and returns a descriptor of it (`/proc/PID/ns/user`).
///
/// The kernel charges every per-user count of a user namespace (inotify instances and watches,
/// pending signals, message queue bytes, locked memory, processes, namespaces) up the chain of
/// its ancestors, and in the host's namespace to the namespace's *owner*: the effective uid of
/// the process that created it. Created by root, a sandbox would spend root's host-wide
/// allowance (128 inotify instances, for one) and could exhaust it for the whole host. So a
/// helper process creates it: forked from this one, it switches only its effective ids to the
/// conversation's (as root: the real and saved ids stay 0 and, with `SECBIT_NO_SETUID_FIXUP`,
/// so do its capabilities, which hosts that allow only privileged processes to create user
/// namespaces require), calls `unshare(CLONE_NEWUSER)`, and waits. This process, still in the
/// host's user namespace with its own privilege, writes the maps from outside and lets the
/// helper go. Without root the helper keeps the caller's ids, which are the conversation's.
///
/// The init is then cloned by this process after it joins the namespace (`setns`), so the init
/// starts with this process's host identity, not the conversation's: it opens the spec's host
/// paths as before, without needing search rights for the conversation's uid.
fn create_user_namespace(root: bool, uid: u32, gid: u32) -> Step<OwnedFd> {
    const L: &str = "user namespace";
    let pipe = || {
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).layer(
            "init",
            "cannot create a pipe",
            HINT_BUG,
        )
    };
    let (ready_r, ready_w) = pipe()?;
    let (hold_r, hold_w) = pipe()?;
    // SAFETY: this process is single-threaded (the monitor checked), so the child of fork(2) is
    // a complete copy; it makes only raw system calls and ends with _exit(2).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Failure::new(
            "init",
            format!("fork: {}", io::Error::last_os_error()),
            HINT_BUG,
        ));
    }
    if pid == 0 {
        drop(ready_r);
        drop(hold_w);
        let errno = unshare_as_owner(root, uid, gid);
        write_all(ready_w.as_fd(), &errno.to_ne_bytes());
        if errno == 0 {
            // Until the monitor has written the maps and holds a descriptor of the namespace:
            // it closes its end then (or dies).
            let mut b = [0u8; 1];
            while let Ok(1) | Err(rustix::io::Errno::INTR) = rustix::io::read(&hold_r, &mut b) {}
        }
        // SAFETY: _exit(2) ends this child without running the parent's atexit handlers.
        unsafe { libc::_exit(0) };
    }
    drop(ready_w);
    drop(hold_r);
    let helper = Pid::from_raw(pid).expect("fork returned a positive pid");
    let result = (|| {
        let mut b = [0u8; 4];
        let mut got = 0;
        while got < b.len() {
            match rustix::io::read(&ready_r, &mut b[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    return Err(Failure::new(
                        L,
                        format!("reading from the helper: {e}"),
                        HINT_BUG,
                    ));
                }
            }
        }
        if got < b.len() {
            return Err(Failure::new(L, "the helper creating it died", HINT_BUG));
        }
        let errno = i32::from_ne_bytes(b);
        if errno != 0 {
            return Err(Failure::new(
                L,
                format!(
                    "unshare(CLONE_NEWUSER) with effective uid {uid} and gid {gid} failed: {}",
                    io::Error::from_raw_os_error(errno)
                ),
                HINT_USERNS,
            ));
        }
        let ns = rustix::fs::open(
            format!("/proc/{pid}/ns/user"),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .layer(L, format!("cannot open /proc/{pid}/ns/user"), HINT_BUG)?;
        write_id_maps(pid, uid, gid)?;
        Ok(ns)
    })();
    drop(hold_w);
    let _ = rustix::process::waitpid(Some(helper), WaitOptions::empty());
    result
}

/// In the helper of [`create_user_namespace`]: takes `uid`/`gid` as effective ids (as root) and
/// creates a user namespace. Returns 0 or an errno. Only raw system calls.
fn unshare_as_owner(root: bool, uid: u32, gid: u32) -> i32 {
    let errno = || {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    const KEEP: libc::c_long = -1;
    if root {
        // SAFETY: prctl(PR_SET_SECUREBITS) and setresgid/setresuid(2) take integers only; -1
        // leaves an id unchanged. Raw system calls: they change this (only) thread.
        unsafe {
            if libc::prctl(
                libc::PR_SET_SECUREBITS,
                libc::SECBIT_NO_SETUID_FIXUP as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return errno();
            }
            if libc::syscall(libc::SYS_setresgid, KEEP, gid as libc::c_long, KEEP) != 0 {
                return errno();
            }
            if libc::syscall(libc::SYS_setresuid, KEEP, uid as libc::c_long, KEEP) != 0 {
                return errno();
            }
        }
    }
    // SAFETY: unshare(2) takes a flag.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER) } != 0 {
        return errno();
    }
    0
}

/// Writes `setgroups`, `uid_map` and `gid_map` of the user namespace of process `pid` (the
/// helper of [`create_user_namespace`]) from outside it.
fn write_id_maps(pid: i32, uid: u32, gid: u32) -> Step<()> {
    let w = |file: &str, data: String| -> Step<()> {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, data).layer(
            "user namespace",
            format!("cannot write {path}"),
            HINT_USERNS,
        )
    };
    // Required before gid_map without CAP_SETGID; as root it also keeps the sandbox from ever
    // calling setgroups(2).
    w("setgroups", "deny".into())?;
    w("uid_map", format!("{INSIDE_UID} {uid} 1\n"))?;
    w("gid_map", format!("{INSIDE_GID} {gid} 1\n"))?;
    Ok(())
}

/// Signals the init forwards to the program.
const FORWARDED: [libc::c_int; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Blocks (or unblocks) the [`FORWARDED`] signals in this process.
fn set_forwarded_blocked(blocked: bool) {
    // SAFETY: `set` is a local sigset_t initialised by sigemptyset before use and passed by
    // pointer for the duration of each call.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in FORWARDED {
            libc::sigaddset(&mut set, sig);
        }
        let how = if blocked {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        libc::sigprocmask(how, &set, std::ptr::null_mut());
    }
}

/// The program's pid, for forwarding signals from the init's handler.
static PROGRAM_PID: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    let pid = PROGRAM_PID.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe and takes two integers.
        unsafe { libc::kill(pid, sig) };
    }
}

/// The init, PID 1 inside: builds the sandbox, starts the program (handing it `passed`, which
/// is at [`PASSED_FD`]), reaps until it exits.
fn init(ctl: OwnedFd, sync: OwnedFd, passed: Option<OwnedFd>, spec: &SandboxSpec) -> i32 {
    let mut b = [0u8; 1];
    // Wait until the monitor has reported this process's pid; EOF means it failed (and reported
    // why).
    loop {
        match rustix::io::read(&sync, &mut b) {
            Ok(1) => break,
            Err(rustix::io::Errno::INTR) => {}
            _ => return 1,
        }
    }
    let landlock = match setup(&sync, spec) {
        Ok(l) => l,
        Err(f) => {
            send(ctl.as_fd(), &f.report());
            return 1;
        }
    };
    drop(sync);
    // Signals to forward are held from here until the handlers are in place, so one sent as soon
    // as `launch` returns is delivered, not dropped (PID 1 ignores signals it has no handler for).
    set_forwarded_blocked(true);
    let program = match start_program(ctl.as_fd(), passed, spec) {
        Ok(Some(pid)) => pid,
        Ok(None) => return 127,
        Err(f) => {
            send(ctl.as_fd(), &f.report());
            return 1;
        }
    };
    // The parent cannot always read it itself: without root, this process (not dumpable, its
    // memory still the host namespace's) is not the caller's to inspect.
    let pid_ns = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
    };
    send(ctl.as_fd(), &Report::Ready { landlock, pid_ns });
    drop(ctl);
    supervise(program)
}

/// Everything between the id maps and the program's fork, in order. Returns how Landlock was
/// applied.
fn setup(sync: &OwnedFd, spec: &SandboxSpec) -> Step<String> {
    // Host paths are opened first, with the identity the init was cloned with (the monitor's
    // host uid, unmapped here when it is root, and every capability in the new namespaces), so
    // the sandbox user never needs search rights on their parent directories.
    let sources = mounts::Sources::open(spec)?;

    // Identity. Capabilities survive: uid 0 is not mapped in this namespace, so the kernel sees
    // no root-to-nonroot transition; they are dropped explicitly in `confine::apply`.
    let gid = rustix::process::Gid::from_raw(INSIDE_GID);
    let uid = rustix::process::Uid::from_raw(INSIDE_UID);
    rustix::thread::set_thread_res_gid(gid, gid, gid).layer(
        "identity",
        "setresgid to the sandbox group",
        HINT_BUG,
    )?;
    rustix::thread::set_thread_res_uid(uid, uid, uid).layer(
        "identity",
        "setresuid to the sandbox user",
        HINT_BUG,
    )?;
    // Not dumpable: the sandbox's own processes (same uid) cannot open /proc/1/{mem,fd,root,..}.
    // SAFETY: prctl(PR_SET_DUMPABLE) takes integers only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(Failure::new(
            "identity",
            format!("prctl(PR_SET_DUMPABLE): {}", io::Error::last_os_error()),
            HINT_BUG,
        ));
    }
    // Die with the monitor (set after the id change, which clears it). Then check that the
    // monitor still lives: its end of `sync` is open exactly as long as it does.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL)).layer(
        "init",
        "prctl(PR_SET_PDEATHSIG)",
        HINT_BUG,
    )?;
    let mut fds = [rustix::event::PollFd::new(
        sync,
        rustix::event::PollFlags::IN,
    )];
    if rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default())).unwrap_or(0) > 0
        && fds[0].revents().contains(rustix::event::PollFlags::HUP)
    {
        return Err(Failure::new("init", "the monitor exited", HINT_BUG));
    }
    rustix::process::setsid().layer("init", "setsid", HINT_BUG)?;

    rustix::system::sethostname(spec.hostname.as_bytes()).layer(
        "uts namespace",
        "sethostname",
        HINT_KERNEL,
    )?;
    mounts::build(sources, spec)?;
    loopback_up().layer(
        "network namespace",
        "cannot bring the loopback interface up",
        HINT_KERNEL,
    )?;
    set_rlimits(spec)?;
    confine::apply()
}

/// `struct ifreq` as SIOCGIFFLAGS/SIOCSIFFLAGS use it: the name, then `ifr_flags` at the start of
/// the 24-byte union (40 bytes in all, as the kernel copies).
#[repr(C)]
struct IfreqFlags {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
const SIOCSIFFLAGS: libc::c_ulong = 0x8914;

/// Sets `IFF_UP` on `lo` in the (new, otherwise empty) network namespace.
fn loopback_up() -> io::Result<()> {
    let sock = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )?;
    let mut req = IfreqFlags {
        name: [0; 16],
        flags: 0,
        _pad: [0; 22],
    };
    req.name[..2].copy_from_slice(b"lo");
    // SAFETY: SIOCGIFFLAGS reads a NUL-terminated name from, and writes a c_short flags field
    // into, a `struct ifreq`. `req` is a fully initialised #[repr(C)] value of exactly
    // sizeof(struct ifreq) (40 bytes) with the name at offset 0 and the flags at offset 16, and it
    // lives across the call; `sock` is an open socket.
    if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCGIFFLAGS, &mut req as *mut IfreqFlags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    req.flags |= libc::IFF_UP as libc::c_short;
    // SAFETY: as above; SIOCSIFFLAGS only reads the name and the flags from `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCSIFFLAGS, &req as *const IfreqFlags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `RLIMIT_SIGPENDING`: signals queued at once for the sandbox user.
pub(crate) const SIGPENDING: u64 = 1024;
/// `RLIMIT_MSGQUEUE`: bytes of POSIX message queues (the kernel's default).
const MSGQUEUE_BYTES: u64 = 819_200;
/// `RLIMIT_MEMLOCK`: locked memory, 8 MiB (the usual default).
const MEMLOCK_BYTES: u64 = 8 << 20;

/// Limits of the sandbox's own user namespace (`/proc/sys/user`), which bound everything created
/// inside it whatever the host's: inotify instances and watches, and no namespace of any kind
/// (seccomp refuses creating them too).
pub(crate) const USERNS_LIMITS: [(&str, u64); 11] = [
    ("max_inotify_instances", 128),
    ("max_inotify_watches", 65_536),
    ("max_fanotify_groups", 0),
    ("max_user_namespaces", 0),
    ("max_mnt_namespaces", 0),
    ("max_pid_namespaces", 0),
    ("max_net_namespaces", 0),
    ("max_ipc_namespaces", 0),
    ("max_uts_namespaces", 0),
    ("max_cgroup_namespaces", 0),
    ("max_time_namespaces", 0),
];

/// Writes [`USERNS_LIMITS`] through `proc` (the sandbox's new procfs, before its `sys` is made
/// read-only). The values are per user namespace: these are the sandbox's own, which the init
/// may set while it holds `CAP_SYS_RESOURCE` there; the host's stay as they are, and still apply
/// on top, to the conversation's uid. A limit this kernel does not have is skipped; any other
/// failure fails the launch.
pub(crate) fn limit_user_namespace(proc: &std::path::Path) -> Step<()> {
    for (name, value) in USERNS_LIMITS {
        let path = proc.join("sys/user").join(name);
        match std::fs::write(&path, value.to_string()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Failure::new(
                    "user namespace limits",
                    format!("cannot set /proc/sys/user/{name} to {value}: {e}"),
                    HINT_KERNEL,
                ));
            }
        }
    }
    Ok(())
}

fn set_rlimits(spec: &SandboxSpec) -> Step<()> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let l = &spec.limits;
    let mut all = vec![
        (Resource::Nproc, "RLIMIT_NPROC", l.nproc),
        (Resource::Fsize, "RLIMIT_FSIZE", l.fsize),
        (Resource::Nofile, "RLIMIT_NOFILE", l.nofile),
        (Resource::Core, "RLIMIT_CORE", 0),
        (Resource::Sigpending, "RLIMIT_SIGPENDING", SIGPENDING),
        (Resource::Msgqueue, "RLIMIT_MSGQUEUE", MSGQUEUE_BYTES),
        (Resource::Memlock, "RLIMIT_MEMLOCK", MEMLOCK_BYTES),
    ];
    if l.mode == super::LimitMode::Rlimit {
        // No cgroup bounds memory or CPU: each process gets them instead.
        all.push((Resource::As, "RLIMIT_AS", l.memory_bytes));
        all.push((Resource::Cpu, "RLIMIT_CPU", l.cpu_secs));
    }
    for (res, name, want) in all {
        // Never above the current hard limit: raising it needs privilege in the host namespace.
        let v = getrlimit(res).maximum.map_or(want, |hard| want.min(hard));
        setrlimit(
            res,
            Rlimit {
                current: Some(v),
                maximum: Some(v),
            },
        )
        .layer("rlimits", format!("setrlimit({name}, {v})"), HINT_BUG)?;
    }
    Ok(())
}

/// The program, prepared before `fork` so the child only makes system calls.
struct Exec {
    path: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

fn cstring(s: impl Into<Vec<u8>>) -> Step<CString> {
    CString::new(s).layer("program", "argument with a NUL byte", HINT_BUG)
}

/// Forks the program, with `passed` (at [`PASSED_FD`]) open across its execve; this process's
/// copy is closed once the program's process has one. Returns its pid once it has executed,
/// `None` when it could not be executed (after reporting why on `ctl`).
fn start_program(
    ctl: BorrowedFd<'_>,
    passed: Option<OwnedFd>,
    spec: &SandboxSpec,
) -> Step<Option<i32>> {
    let path = cstring(spec.program.as_os_str().as_bytes())?;
    let mut argv = vec![path.clone()];
    for a in &spec.args {
        argv.push(cstring(a.as_bytes())?);
    }
    let mut envp = Vec::new();
    for (k, v) in &spec.env {
        envp.push(cstring(format!("{k}={v}"))?);
    }
    let exec = Exec { path, argv, envp };
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).layer(
        "init",
        "cannot create a pipe",
        HINT_BUG,
    )?;
    // SAFETY: this process is single-threaded (the monitor checked before cloning it), so the
    // child of fork(2) is a complete copy that may run ordinary code until it execs.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Failure::new(
            "init",
            format!("fork: {}", io::Error::last_os_error()),
            HINT_BUG,
        ));
    }
    if pid == 0 {
        drop(r);
        let f = exec_program(&exec, passed.is_some());
        let mut line = serde_json::to_string(&f.report()).unwrap_or_default();
        line.push('\n');
        write_all(w.as_fd(), line.as_bytes());
        // SAFETY: _exit(2) ends this child without running the parent's atexit handlers.
        unsafe { libc::_exit(127) };
    }
    drop(w);
    drop(passed);
    // EOF without a byte: the pipe was closed by a successful execve.
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match rustix::io::read(&r, &mut chunk) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
    }
    if out.is_empty() {
        return Ok(Some(pid));
    }
    write_all(ctl, &out);
    let _ = rustix::process::waitpid(Pid::from_raw(pid), WaitOptions::empty());
    Ok(None)
}

/// In the program's process: resets what must not be inherited and execs, keeping [`PASSED_FD`]
/// open when `keep_passed`. Returns only on failure.
fn exec_program(e: &Exec, keep_passed: bool) -> Failure {
    // Signal dispositions and mask back to defaults (Rust ignores SIGPIPE; that must not leak
    // into the program).
    for sig in 1..libc::SIGRTMAX() {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: resetting a disposition to SIG_DFL installs no handler.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
    // SAFETY: an empty, initialised set is passed by pointer for the duration of the call.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
    if let Err(err) = rustix::process::setsid() {
        return Failure::new("program", format!("setsid: {err}"), HINT_BUG);
    }
    if let Err(err) = std::env::set_current_dir(WORKSPACE_DIR) {
        return Failure::new(
            "program",
            format!("cannot enter {WORKSPACE_DIR}: {err}"),
            HINT_BUG,
        );
    }
    // Every descriptor above 2 is closed at exec (the report pipe included), but the passed one.
    if let Err(err) = close_fds_from(3, true) {
        return Failure::new("descriptors", format!("close_range: {err}"), HINT_KERNEL);
    }
    if keep_passed {
        // SAFETY: fcntl(F_SETFD) takes integers only; PASSED_FD is the passed descriptor, which
        // this process holds open (the init's `passed`, inherited through fork).
        if unsafe { libc::fcntl(PASSED_FD, libc::F_SETFD, 0) } < 0 {
            return Failure::new(
                "descriptors",
                format!(
                    "cannot keep the passed descriptor open: {}",
                    io::Error::last_os_error()
                ),
                HINT_BUG,
            );
        }
    }
    let mut argv: Vec<*const libc::c_char> = e.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = e.envp.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());
    // SAFETY: `path` is NUL-terminated; `argv` and `envp` are NULL-terminated arrays of pointers
    // to NUL-terminated strings, all owned by `e`, which outlives the call.
    unsafe { libc::execve(e.path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    let err = io::Error::last_os_error();
    Failure::new(
        "program",
        format!("cannot execute {:?}: {err}", e.path),
        "check that the program exists inside the sandbox (under /usr, /workspace or a read-only bind) and is executable",
    )
}

/// Reaps every child until the program exits; then kills everything left in the namespace,
/// reaps it, and returns the program's status as an exit code.
fn supervise(program: i32) -> i32 {
    PROGRAM_PID.store(program, Ordering::Relaxed);
    for sig in FORWARDED {
        // SAFETY: `sa` is fully initialised (zeroed, then the handler, flags and an empty mask);
        // the handler only calls kill(2), which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forward_signal as *const () as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    set_forwarded_blocked(false);
    let mut code = 1;
    loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, status))) => {
                if pid.as_raw_nonzero().get() == program {
                    code = status
                        .exit_status()
                        .or_else(|| status.terminating_signal().map(|s| 128 + s))
                        .unwrap_or(1);
                    break;
                }
            }
            Ok(None) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
    }
    PROGRAM_PID.store(0, Ordering::Relaxed);
    // Nothing outlives the program: kill(-1) from PID 1 reaches every other process in the
    // namespace.
    loop {
        // SAFETY: kill(2) with integers only.
        unsafe { libc::kill(-1, libc::SIGKILL) };
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
    }
    code
}
