//! A container's PID 1 that reaps: what `confined-exec` becomes when the kernel made it the
//! first process of its PID namespace (an OpenSandbox container, whose bootstrap `exec`s it).
//!
//! Every process whose parent exits is re-parented to PID 1, and only PID 1 can reap it. A
//! main process that never calls `wait` (the default `tail -f /dev/null`) leaves each such
//! orphan a zombie that holds its process id until the container ends: a conversation whose
//! background commands leave orphans would use up its PIDs limit for good. This init runs the
//! main program as its child instead, reaps every child it is given, forwards the signals a
//! container is stopped with to the program, and exits with the program's status (128 + the
//! signal number when a signal ended it), like `tini` or `docker run --init`. When PID 1 exits
//! the kernel kills the rest of the namespace.
//!
//! It runs after the confinement is applied, so it holds no more than its commands do.

use std::ffi::OsString;
use std::process::{Command, ExitCode};

use rustix::process::{Pid, Signal, WaitOptions};
use tokio::signal::unix::{SignalKind, signal};

/// The signals passed on to the program: those a container runtime stops a container with, and
/// those a user sends it to reload or dump.
const FORWARDED: [(SignalKind, Signal); 6] = [
    (SignalKind::terminate(), Signal::TERM),
    (SignalKind::interrupt(), Signal::INT),
    (SignalKind::hangup(), Signal::HUP),
    (SignalKind::quit(), Signal::QUIT),
    (SignalKind::user_defined1(), Signal::USR1),
    (SignalKind::user_defined2(), Signal::USR2),
];

/// Runs `program` with `args` as a child and stays PID 1 until it exits; returns its status.
/// 127 when there is no such program, 126 when it cannot be started otherwise, 1 when the
/// init's own signal handling cannot be set up (then the program is not started, or is killed
/// at once: it never runs unreaped).
pub(crate) fn run(program: &OsString, args: impl Iterator<Item = OsString>) -> ExitCode {
    let supervised = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .and_then(|rt| rt.block_on(start_and_supervise(program, args)));
    match supervised {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("sessionbox-agent confined-exec: as PID 1: {e}");
            ExitCode::from(1)
        }
    }
}

/// Installs the handlers, then starts `program`, forwards [`FORWARDED`] to it and reaps every
/// child until it is reaped. The handlers come first: PID 1 ignores a signal it has no handler
/// for, so a stop signal sent while the program starts would otherwise be lost; one that
/// arrives before the program exists waits in its stream and is passed on once it does.
async fn start_and_supervise(
    program: &OsString,
    args: impl Iterator<Item = OsString>,
) -> std::io::Result<u8> {
    // The SIGCHLD handler before the child too: a child that ends at once is reaped by the
    // first pass below, not waited for.
    let mut child_exited = signal(SignalKind::child())?;
    let mut streams = Vec::with_capacity(FORWARDED.len());
    for (kind, sig) in FORWARDED {
        streams.push((signal(kind)?, sig));
    }
    // `std` starts the child with an empty signal mask and default dispositions (exec resets
    // handled signals), so the handlers above are this process's alone.
    let child = match Command::new(program).args(args).spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!(
                "sessionbox-agent confined-exec: cannot run {}: {e}",
                program.to_string_lossy()
            );
            // As shells and other inits say it: 127 when there is no such program.
            return Ok(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let program = Pid::from_child(&child);
    // The child is reaped below by pid, never through `child.wait()`.
    drop(child);
    for (mut stream, sig) in streams {
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                let _ = rustix::process::kill_process(program, sig);
            }
        });
    }
    loop {
        if let Some(code) = reap(program) {
            return Ok(code);
        }
        if child_exited.recv().await.is_none() {
            let _ = rustix::process::kill_process(program, Signal::KILL);
            return Err(std::io::Error::other("the SIGCHLD stream ended"));
        }
    }
}

/// Reaps every child that has exited (one signal may stand for several); `program`'s exit
/// code once it is among them.
fn reap(program: Pid) -> Option<u8> {
    loop {
        match rustix::process::wait(WaitOptions::NOHANG) {
            Ok(Some((pid, status))) if pid == program => {
                let code = status
                    .exit_status()
                    .or_else(|| status.terminating_signal().map(|s| 128 + s))
                    .unwrap_or(1);
                return Some(u8::try_from(code).unwrap_or(1));
            }
            Ok(Some(_)) | Err(rustix::io::Errno::INTR) => {}
            // Nothing more has exited for now (None), or no child is left at all (ECHILD:
            // the program was reaped by someone else, which cannot happen to PID 1's child).
            Ok(None) => return None,
            Err(_) => return Some(1),
        }
    }
}
