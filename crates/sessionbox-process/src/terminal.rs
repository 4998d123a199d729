//! A shell on a pseudo-terminal, started the way [`crate::run`] starts a command.
//!
//! [`spawn_terminal`] opens a new pseudo-terminal pair (`/dev/ptmx`, so the devpts instance of
//! the caller's mount namespace and its `max=` bound), and starts `bash --noprofile --norc`
//! (or `/bin/sh` without bash; `-c COMMAND` when a command is given) with the terminal as its
//! stdin, stdout, stderr and controlling terminal, in a new session, with the same clean
//! environment, `fchdir`, close-on-exec sweep and Landlock scope as a command. The caller keeps
//! the master side; [`kill_session`] ends everything the shell started, whatever process
//! group it is in (an interactive shell gives each job its own).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;
use std::process::Stdio;

use rustix::process::{Pid, Signal};
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;
use sessionbox_core::{Error, Result, base_environment};
use tokio::process::{Child, Command};

use crate::{FALLBACK_MAX_FD, enter_scope, mark_inherited_fds_cloexec, scope_ruleset};

/// `TERM` a terminal's shell gets.
pub const TERMINAL_TERM: &str = "xterm-256color";

/// What [`spawn_terminal`] starts, and where.
#[derive(Debug, Clone, Copy)]
pub struct TerminalSpawn<'a> {
    /// `None`: an interactive shell; `Some(c)`: `bash -c c` (or `sh -c c`).
    pub command: Option<&'a str>,
    /// Environment added to [`base_environment`] (whose `TERM` becomes [`TERMINAL_TERM`]).
    pub env: &'a BTreeMap<String, String>,
    /// A directory descriptor opened beneath the workspace; the child `fchdir`s to it.
    pub cwd: BorrowedFd<'a>,
    /// `HOME` as the shell sees the workspace.
    pub home: &'a str,
    /// Initial window size: columns, rows (each at least 1).
    pub size: (u16, u16),
}

/// A started terminal: the master side and the shell.
#[derive(Debug)]
pub struct Terminal {
    /// The master side (close-on-exec, blocking): what the shell prints is read from it, its
    /// input written to it, its window size set on it.
    pub master: OwnedFd,
    /// The shell. Not killed on drop: use [`kill_session`] with [`Terminal::session`].
    pub child: Child,
    /// The shell's session (and process group) id: its pid.
    pub session: Pid,
}

/// Starts a shell on a new pseudo-terminal as the [module docs](self) say.
///
/// # Errors
/// [`Error::InvalidRequest`] for a zero window size; [`Error::Backend`] when no terminal can be
/// opened (every one of the devpts instance's `max=` in use shows as "No space left on
/// device") or the shell cannot be started.
pub fn spawn_terminal(t: TerminalSpawn<'_>) -> Result<Terminal> {
    let (cols, rows) = t.size;
    if cols == 0 || rows == 0 {
        return Err(Error::InvalidRequest(
            "a terminal needs at least one column and one row".into(),
        ));
    }
    let fail = |what: &str, e: io::Error| Error::Backend(format!("cannot {what}: {e}"));
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
            .map_err(|e| fail("open a pseudo-terminal (/dev/ptmx)", e.into()))?;
    rustix::pty::grantpt(&master).map_err(|e| fail("grant the pseudo-terminal", e.into()))?;
    rustix::pty::unlockpt(&master).map_err(|e| fail("unlock the pseudo-terminal", e.into()))?;
    // The peer by descriptor (Linux 4.13), not by a path in /dev/pts that another devpts
    // instance could shadow.
    let slave = rustix::pty::ioctl_tiocgptpeer(
        &master,
        OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC,
    )
    .map_err(|e| fail("open the terminal's peer", e.into()))?;
    rustix::termios::tcsetwinsize(
        &master,
        Winsize {
            ws_col: cols,
            ws_row: rows,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )
    .map_err(|e| fail("set the window size", e.into()))?;

    let shell = if Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    let mut cmd = Command::new(shell);
    if shell == "/bin/bash" {
        cmd.args(["--noprofile", "--norc"]);
    }
    if let Some(c) = t.command {
        cmd.arg("-c").arg(c);
    }
    let mut env = base_environment(t.home);
    env.insert("TERM".into(), TERMINAL_TERM.into());
    env.extend(t.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let stdio = || -> Result<Stdio> {
        Ok(Stdio::from(slave.try_clone().map_err(|e| {
            fail("duplicate the terminal's descriptor", e)
        })?))
    };
    cmd.env_clear()
        .envs(env)
        .stdin(stdio()?)
        .stdout(stdio()?)
        .stderr(stdio()?)
        .kill_on_drop(false);
    let cwd_fd: RawFd = t.cwd.as_raw_fd();
    let fallback_max_fd = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(FALLBACK_MAX_FD)
        .min(FALLBACK_MAX_FD) as RawFd;
    let scope_fd: Option<RawFd> = scope_ruleset().map(|fd| fd.as_raw_fd());
    // SAFETY: as in `run`: the closure runs in the forked child before exec and makes only raw
    // system calls (setsid, ioctl(TIOCSCTTY) on descriptor 0, which std has already made the
    // terminal's peer, fchdir, close_range/fcntl, prctl, landlock_restrict_self); it captures
    // three integers, allocates nothing and takes no lock. `cwd_fd` stays open for the spawn
    // (`t.cwd` borrows it), `scope_fd` is owned by a static that is never dropped.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::setsid()?;
            rustix::process::ioctl_tiocsctty(BorrowedFd::borrow_raw(0))?;
            rustix::process::fchdir(BorrowedFd::borrow_raw(cwd_fd))?;
            mark_inherited_fds_cloexec(fallback_max_fd)?;
            if let Some(fd) = scope_fd {
                enter_scope(fd)?;
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| fail(&format!("start {shell} on the terminal"), e))?;
    drop(cmd);
    drop(slave);
    let session = child
        .id()
        .and_then(|id| Pid::from_raw(id as i32))
        .ok_or_else(|| Error::Backend("the terminal's shell has no pid".into()))?;
    Ok(Terminal {
        master,
        child,
        session,
    })
}

/// Sets the window size of the terminal whose master is `master` (the kernel then sends
/// `SIGWINCH` to its foreground process group).
///
/// # Errors
/// [`Error::InvalidRequest`] for a zero size; [`Error::Backend`] when the ioctl fails.
pub fn set_window_size(master: impl AsFd, cols: u16, rows: u16) -> Result<()> {
    if cols == 0 || rows == 0 {
        return Err(Error::InvalidRequest(
            "a terminal needs at least one column and one row".into(),
        ));
    }
    rustix::termios::tcsetwinsize(
        master,
        Winsize {
            ws_col: cols,
            ws_row: rows,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )
    .map_err(|e| Error::Backend(format!("cannot set the window size: {e}")))
}

/// Sends `sig` to the foreground process group of the terminal whose master is `master`
/// (what the terminal's interrupt character does), or to `session`'s group when the
/// terminal has none.
pub fn signal_foreground(master: impl AsFd, session: Pid, sig: Signal) {
    let group = rustix::termios::tcgetpgrp(master).unwrap_or(session);
    let _ = rustix::process::kill_process_group(group, sig);
}

/// Sends `SIGKILL` to every process of session `session` (read from `/proc/PID/stat`), each
/// process group included; returns how many processes were signalled. Processes that left the
/// session with `setsid` are not found (a terminal's shell is killed with its group either way).
pub fn kill_session(session: Pid) -> usize {
    let _ = rustix::process::kill_process_group(session, Signal::KILL);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut n = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
            .and_then(Pid::from_raw)
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let sid = after
            .split_whitespace()
            .nth(3)
            .and_then(|s| s.parse::<i32>().ok());
        if sid == Some(session.as_raw_nonzero().get())
            && rustix::process::kill_process(pid, Signal::KILL).is_ok()
        {
            n += 1;
        }
    }
    n
}

/// The wait status as a terminal reports it: the exit code, or 128 + the signal.
#[must_use]
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => -1,
    }
}
