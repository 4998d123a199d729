//! The agent confining itself, for containers that start it as root (OpenSandbox's docker
//! runtime runs the bootstrap, and so the agent, as the image's user, root): `--user` drops to
//! an unprivileged user with `no_new_privs`, an empty bounding set, and only the file-owner
//! capabilities its file API needs (see [`kept`]), which its commands lose when they `exec`;
//! `--writable` applies a Landlock ruleset that lets the agent and its commands write only
//! beneath the given directories.
//!
//! Both run in the main thread before any other thread exists: the raw `setresuid` family and
//! `landlock_restrict_self` act on the calling thread only, and every thread and process
//! started afterwards inherits what they set. Where a step cannot be applied the agent exits
//! naming it: it never serves with less confinement than it was asked for.

use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus,
};
use rustix::thread::{CapabilitySet, CapabilitySets};
use sessionbox_core::{Error, Result};

/// The Landlock ABI whose file-system rights the ruleset names (5: Linux 6.10, with
/// `IOCTL_DEV`); an older kernel enforces what it knows, which still covers writing, creating,
/// removing and renaming files (ABI 1).
const FS_ABI: ABI = ABI::V5;
/// Character devices commands may write besides their directories.
const DEVICES: [&str; 7] = ["null", "zero", "full", "random", "urandom", "tty", "ptmx"];

/// What the agent was asked to give up.
#[derive(Debug, Clone, Default)]
pub(crate) struct Confinement {
    /// Become this `(uid, gid)`.
    pub user: Option<(u32, u32)>,
    /// Write only beneath these (none: no Landlock ruleset).
    pub writable: Vec<PathBuf>,
}

/// Applies `c`: first Landlock (while the agent can still open every path it names), then the
/// user, then `no_new_privs`. Returns a line for the log.
///
/// # Errors
/// [`Error::RuntimeUnavailable`] naming the step that failed (not root, a kernel without
/// Landlock, a writable directory that does not exist).
pub(crate) fn apply(c: &Confinement) -> Result<String> {
    let mut done = Vec::new();
    // no_new_privs first: landlock_restrict_self without CAP_SYS_ADMIN needs it, and it is
    // wanted anyway.
    rustix::thread::set_no_new_privs(true).map_err(|e| fail("no_new_privs", e))?;
    done.push("no_new_privs".to_owned());
    if !c.writable.is_empty() {
        done.push(landlock(&c.writable)?);
    }
    if let Some((uid, gid)) = c.user {
        drop_to(uid, gid)?;
        done.push(format!(
            "uid {uid} gid {gid}, empty bounding set, keeping at most {:?} for file operations \
             (commands hold none)",
            kept()
        ));
    }
    Ok(done.join("; "))
}

fn fail(step: &str, e: impl std::fmt::Display) -> Error {
    Error::RuntimeUnavailable {
        runtime: "agent".into(),
        reason: format!("cannot confine the agent ({step}): {e}"),
        hint: "start the agent as root for --user, on Linux 5.13 or later with Landlock \
               enabled for --writable (and a seccomp profile that allows the landlock_* \
               system calls), or leave those options out"
            .into(),
    }
}

fn landlock(writable: &[PathBuf]) -> Result<String> {
    let all = AccessFs::from_all(FS_ABI);
    let read = AccessFs::from_read(FS_ABI);
    let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
    let ll = |e: landlock::RulesetError| fail("landlock", e);
    let fd = |p: &std::path::Path| {
        PathFd::new(p).map_err(|e| fail("landlock", format!("open {}: {e}", p.display())))
    };
    let mut ruleset = landlock::Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(ll)?
        .create()
        .map_err(ll)?
        .add_rule(PathBeneath::new(fd("/".as_ref())?, read))
        .map_err(ll)?;
    for dir in writable {
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd(dir)?, all))
            .map_err(ll)?;
    }
    for name in DEVICES {
        let p = PathBuf::from(format!("/dev/{name}"));
        if p.exists() {
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd(&p)?, device))
                .map_err(ll)?;
        }
    }
    if std::path::Path::new("/dev/pts").is_dir() {
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd("/dev/pts".as_ref())?, device))
            .map_err(ll)?;
    }
    let status = ruleset.restrict_self().map_err(ll)?;
    let dirs = writable
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(format!("landlock: writes only beneath {dirs}")),
        RulesetStatus::PartiallyEnforced => Ok(format!(
            "landlock (partially: the kernel lacks some rights of ABI {}): writes only beneath \
             {dirs}",
            FS_ABI as i32
        )),
        RulesetStatus::NotEnforced => Err(fail(
            "landlock",
            "the kernel (or the container's seccomp profile) does not enforce Landlock",
        )),
    }
}

/// The capabilities the agent keeps as `uid` for its own file operations (upstream's file API
/// sets owners, groups and modes, and reaches files of other owners beneath the workspace).
/// Commands never hold them: a process of a non-root user that `exec`s a file without file
/// capabilities (and `no_new_privs` makes the kernel ignore any) keeps nothing, and the ambient
/// set is empty.
/// Of these, the agent keeps those it holds when it starts (Docker's default set has no
/// `DAC_READ_SEARCH`, for one).
fn kept() -> CapabilitySet {
    CapabilitySet::CHOWN | CapabilitySet::FOWNER | CapabilitySet::DAC_OVERRIDE
}

/// Empties every capability set of the calling thread (and so of every thread and process it
/// starts afterwards): what a process that keeps no file API needs, such as the container's
/// init. Checked after it is applied.
///
/// # Errors
/// [`Error::RuntimeUnavailable`] when the sets cannot be emptied.
pub(crate) fn drop_all_capabilities() -> Result<()> {
    let none = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    rustix::thread::set_capabilities(None, none).map_err(|e| fail("capset", e))?;
    let have = rustix::thread::capabilities(None).map_err(|e| fail("capget", e))?;
    if !(have.effective.is_empty() && have.permitted.is_empty() && have.inheritable.is_empty()) {
        return Err(fail("capabilities", format!("{have:?} are left")));
    }
    Ok(())
}

/// Becomes `uid`/`gid` with no supplementary group, an empty bounding set and ambient set, and
/// only [`kept`] in the permitted and effective sets.
fn drop_to(uid: u32, gid: u32) -> Result<()> {
    let held = rustix::thread::capabilities(None)
        .map_err(|e| fail("capget", e))?
        .permitted;
    let keep = kept() & held;
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    // The bounding set first: dropping from it needs CAP_SETPCAP, lost with the uid below.
    for cap in 0..=last.min(63) {
        let one = CapabilitySet::from_bits_retain(1 << cap);
        match rustix::thread::remove_capability_from_bounding_set(one) {
            Ok(()) => {}
            // A capability this kernel does not know.
            Err(rustix::io::Errno::INVAL) => {}
            Err(e) => return Err(fail("capability bounding set", e)),
        }
    }
    let (u, g) = (
        rustix::process::Uid::from_raw(uid),
        rustix::process::Gid::from_raw(gid),
    );
    rustix::thread::set_thread_groups(&[]).map_err(|e| fail("setgroups", e))?;
    rustix::thread::set_thread_res_gid(g, g, g).map_err(|e| fail("setresgid", e))?;
    // Keep the permitted set across the change of uid, then cut it down to `kept`.
    rustix::thread::set_keep_capabilities(true).map_err(|e| fail("keepcaps", e))?;
    rustix::thread::set_thread_res_uid(u, u, u).map_err(|e| fail("setresuid", e))?;
    rustix::thread::set_keep_capabilities(false).map_err(|e| fail("keepcaps", e))?;
    rustix::thread::clear_ambient_capability_set().map_err(|e| fail("ambient set", e))?;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: keep,
            permitted: keep,
            inheritable: CapabilitySet::empty(),
        },
    )
    .map_err(|e| fail("capset", e))?;
    // Check rather than trust: a kernel that kept more is a failure.
    let have = rustix::thread::capabilities(None).map_err(|e| fail("capget", e))?;
    if have.permitted != keep || have.effective != keep || !have.inheritable.is_empty() {
        return Err(fail(
            "capabilities",
            format!("the sets are {have:?} after the drop, not just the file capabilities"),
        ));
    }
    if rustix::thread::capability_is_in_bounding_set(CapabilitySet::SYS_ADMIN).unwrap_or(true) {
        return Err(fail(
            "capability bounding set",
            "CAP_SYS_ADMIN is still in it",
        ));
    }
    if rustix::process::getuid() != u || rustix::process::geteuid() != u {
        return Err(fail("setresuid", "the uid did not change"));
    }
    Ok(())
}

/// `sessionbox-agent confined-exec [--user UID:GID] [--writable DIR]... -- PROGRAM [ARG]...`:
/// applies the same confinement as the agent's `--user` and `--writable`, then executes
/// `PROGRAM` in place (what a bootstrap runs its container's main process through, so that not
/// even that process keeps root). As PID 1 it runs `PROGRAM` as its child instead, holding no
/// capability, and reaps every orphan of the namespace (see `init.rs`). Exit code 2 for a bad
/// command line, 126 when the confinement or the `exec` fails (127 for a missing program as
/// PID 1); it never runs `PROGRAM` less confined than asked.
pub fn confined_exec(args: &[std::ffi::OsString]) -> std::process::ExitCode {
    use std::os::unix::process::CommandExt;
    let mut c = Confinement::default();
    let mut it = args.iter();
    let usage = |m: &str| {
        eprintln!(
            "sessionbox-agent confined-exec: {m}; usage: confined-exec [--user UID:GID] \
             [--writable DIR]... -- PROGRAM [ARG]..."
        );
        std::process::ExitCode::from(2)
    };
    loop {
        match it.next().and_then(|a| a.to_str()) {
            Some("--") => break,
            Some("--user") => {
                let Some((u, g)) = it
                    .next()
                    .and_then(|v| v.to_str())
                    .and_then(|v| v.split_once(':'))
                    .and_then(|(u, g)| Some((u.parse::<u32>().ok()?, g.parse::<u32>().ok()?)))
                    .filter(|(u, g)| *u != 0 && *g != 0)
                else {
                    return usage("--user needs UID:GID, neither 0");
                };
                c.user = Some((u, g));
            }
            Some("--writable") => match it.next() {
                Some(d) => c.writable.push(PathBuf::from(d)),
                None => return usage("--writable needs a directory"),
            },
            Some(other) => return usage(&format!("unknown option {other:?}")),
            None => return usage("no -- before the program"),
        }
    }
    let Some(program) = it.next() else {
        return usage("no program after --");
    };
    if let Err(e) = apply(&c) {
        eprintln!("sessionbox-agent confined-exec: {e}");
        return std::process::ExitCode::from(126);
    }
    if rustix::process::getpid().is_init() {
        // PID 1 of a container: stay, reap and forward signals (see `crate::init`), holding
        // not even the file-owner capabilities a program loses at `exec`.
        if let Err(e) = drop_all_capabilities() {
            eprintln!("sessionbox-agent confined-exec: {e}");
            return std::process::ExitCode::from(126);
        }
        return crate::init::run(program, it.cloned());
    }
    let e = std::process::Command::new(program).args(it).exec();
    eprintln!(
        "sessionbox-agent confined-exec: cannot run {}: {e}",
        program.to_string_lossy()
    );
    std::process::ExitCode::from(126)
}
