//! What this machine can enforce, checked without launching a sandbox (for `sessionbox doctor`).

use std::io;

use serde::{Deserialize, Serialize};

use super::cgroup::{self, Version};
use super::child::{HINT_USERNS, NAMESPACES};
use super::{SandboxLimits, confine};

/// Whether one layer can be enforced here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerState {
    /// The layer works on this machine.
    Enforced,
    /// The layer cannot be applied here: launching a sandbox fails until it is fixed.
    Missing,
}

/// One layer's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerStatus {
    /// The layer, e.g. `user namespace`, `landlock`, `cgroup memory`.
    pub layer: String,
    /// Whether it can be enforced.
    pub state: LayerState,
    /// What was found (a version, a path, an error).
    pub detail: String,
    /// What to do when it is missing.
    pub hint: Option<String>,
}

impl LayerStatus {
    fn ok(layer: &str, detail: impl Into<String>) -> Self {
        LayerStatus {
            layer: layer.into(),
            state: LayerState::Enforced,
            detail: detail.into(),
            hint: None,
        }
    }

    fn missing(layer: &str, detail: impl Into<String>, hint: &str) -> Self {
        LayerStatus {
            layer: layer.into(),
            state: LayerState::Missing,
            detail: detail.into(),
            hint: Some(hint.into()),
        }
    }
}

/// Clones a child into new namespaces (`flags`), which exits at once. Safe to call from a
/// multithreaded process: the child only calls `_exit`.
pub(crate) fn try_clone(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: clone(2) without CLONE_VM behaves like fork(2). The child runs nothing but _exit(2),
    // which is async-signal-safe, so it is sound even when the caller has other threads.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if r == 0 {
        // SAFETY: see above.
        unsafe { libc::_exit(0) };
    }
    let pid = rustix::process::Pid::from_raw(r as i32).expect("clone returned a positive pid");
    let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
    Ok(())
}

/// Whether a user namespace can be created with the conversation's uid as its owner, as the
/// monitor's helper does as root (effective ids switched, capabilities kept): tried with uid and
/// gid 65534 in a child that exits at once. Without root the owner is the caller, nothing to
/// try.
fn owner_probe() -> LayerStatus {
    const LAYER: &str = "user namespace owner";
    if !rustix::process::geteuid().is_root() {
        return LayerStatus::ok(
            LAYER,
            "not root: the namespace is owned by the caller's own uid, which is the conversation's",
        );
    }
    const NOBODY: libc::c_long = 65534;
    const KEEP: libc::c_long = -1;
    // SAFETY: fork(2) in a possibly multithreaded process: the child makes only raw system calls
    // (prctl, setresgid, setresuid, unshare, _exit), which are async-signal-safe, and touches no
    // memory but its own stack.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: see above; every call takes integers only.
        unsafe {
            let code = if libc::prctl(
                libc::PR_SET_SECUREBITS,
                libc::SECBIT_NO_SETUID_FIXUP as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                1
            } else if libc::syscall(libc::SYS_setresgid, KEEP, NOBODY, KEEP) != 0
                || libc::syscall(libc::SYS_setresuid, KEEP, NOBODY, KEEP) != 0
            {
                2
            } else if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                3
            } else {
                0
            };
            libc::_exit(code);
        }
    }
    if pid < 0 {
        return LayerStatus::missing(
            LAYER,
            format!("fork failed: {}", io::Error::last_os_error()),
            "free process slots and retry",
        );
    }
    let status = rustix::process::Pid::from_raw(pid).and_then(|p| {
        rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty())
            .ok()
            .flatten()
            .and_then(|(_, s)| s.exit_status())
    });
    match status {
        Some(0) => LayerStatus::ok(
            LAYER,
            "each sandbox's user namespace is owned by its conversation's uid: its per-user counts (inotify, pending signals, ...) are charged to that uid, not root",
        ),
        other => LayerStatus::missing(
            LAYER,
            format!(
                "creating a user namespace with effective uid 65534 failed ({})",
                match other {
                    Some(1) => "prctl(PR_SET_SECUREBITS)",
                    Some(2) => "setresuid/setresgid",
                    Some(3) => "unshare(CLONE_NEWUSER)",
                    _ => "the probe did not finish",
                }
            ),
            HINT_USERNS,
        ),
    }
}

/// The kernel's Landlock ABI version (0 when Landlock is unavailable).
fn landlock_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) reads no memory and returns the ABI
    // version (or -1 with errno).
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    r.max(0)
}

/// Probes every layer. Namespaces are tried by cloning a child that exits at once; cgroups by
/// creating and removing a probe cgroup; nothing is left behind.
pub fn probe() -> Vec<LayerStatus> {
    let mut out = Vec::new();
    for (name, flag) in NAMESPACES {
        let flags = if flag == libc::CLONE_NEWUSER {
            flag
        } else {
            libc::CLONE_NEWUSER | flag
        };
        out.push(match try_clone(flags) {
            Ok(()) => LayerStatus::ok(name, "clone succeeds"),
            Err(e) => LayerStatus::missing(
                name,
                format!("clone failed: {e}"),
                if flag == libc::CLONE_NEWUSER {
                    HINT_USERNS
                } else {
                    "run on a kernel with this namespace type enabled (CONFIG_*_NS=y)"
                },
            ),
        });
    }

    out.push(owner_probe());

    // mount_setattr(2): read-only recursive binds.
    // SAFETY: with an invalid descriptor and null pointers the kernel fails early (EBADF/EINVAL)
    // without touching memory; only ENOSYS matters here.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            -1,
            std::ptr::null::<libc::c_char>(),
            0,
            std::ptr::null::<libc::c_void>(),
            0usize,
        )
    };
    let e = io::Error::last_os_error();
    out.push(if r < 0 && e.raw_os_error() == Some(libc::ENOSYS) {
        LayerStatus::missing(
            "read-only binds",
            "mount_setattr(2) is not implemented",
            "run on Linux 5.12 or later",
        )
    } else {
        LayerStatus::ok("read-only binds", "mount_setattr(2) is available")
    });

    let abi = landlock_abi();
    out.push(match abi {
        0 => LayerStatus::missing(
            "landlock",
            "Landlock is not available",
            "boot Linux 5.13 or later with CONFIG_SECURITY_LANDLOCK=y and `landlock` in the lsm= boot parameter",
        ),
        1..=4 => LayerStatus::ok(
            "landlock",
            format!("ABI {abi}: partially enforced (writes are confined; truncation or device ioctls need ABI 5, Linux 6.10; {})", confine::NO_SCOPES),
        ),
        5 => LayerStatus::ok(
            "landlock",
            format!("ABI {abi}: partially enforced (writes are confined; {})", confine::NO_SCOPES),
        ),
        _ => LayerStatus::ok(
            "landlock",
            format!("ABI {abi}: fully enforced (signals and abstract UNIX sockets scoped: commands cannot signal the agent)"),
        ),
    });

    // SAFETY: prctl(PR_GET_SECCOMP) takes integers only.
    let mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    let action = libc::SECCOMP_RET_ERRNO;
    // SAFETY: SECCOMP_GET_ACTION_AVAIL reads one u32 from a pointer to a live local.
    let avail = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0,
            &action as *const u32,
        )
    };
    out.push(match (mode >= 0 && avail == 0, confine::filters()) {
        (true, Ok(f)) => LayerStatus::ok(
            "seccomp",
            format!(
                "filter mode available; {} filters compile for {}",
                f.len(),
                std::env::consts::ARCH
            ),
        ),
        (false, _) => LayerStatus::missing(
            "seccomp",
            "seccomp filter mode is not available",
            "run on a kernel with CONFIG_SECCOMP_FILTER=y",
        ),
        (true, Err(f)) => LayerStatus::missing("seccomp", f.reason, f.hint),
    });

    let (found, missing) = cgroup::discover();
    for c in missing {
        out.push(LayerStatus::missing(
            &format!("cgroup {c}"),
            "the controller is not mounted (cgroup v1) nor enabled (cgroup v2)",
            "mount the controller, or run on a host that has it",
        ));
    }
    let name = format!("sessionbox-probe-{}", std::process::id());
    let created = cgroup::Cgroups::create(&name, &SandboxLimits::default());
    for l in &found {
        let version = match l.version {
            Version::V1 => "v1",
            Version::V2 => "v2",
        };
        let layer = format!("cgroup {}", l.controller);
        out.push(match &created {
            Ok(cg) => {
                let dir = cg
                    .paths()
                    .into_iter()
                    .find(|p| p.starts_with(&l.mount))
                    .map(|p| {
                        p.parent()
                            .map(|p| p.display().to_string())
                            .unwrap_or_default()
                    })
                    .unwrap_or_default();
                LayerStatus::ok(
                    &layer,
                    format!("cgroup {version}; sandboxes are created in {dir}"),
                )
            }
            Err(e) => LayerStatus::missing(
                &layer,
                format!(
                    "cgroup {version} at {}: {}",
                    l.mount.display(),
                    match e {
                        sessionbox_core::Error::RuntimeUnavailable { reason, .. } => reason.clone(),
                        e => e.to_string(),
                    }
                ),
                cgroup::HINT_WRITE,
            ),
        });
    }
    if let Ok(cg) = created {
        let _ = cg.remove();
    }
    out
}
