//! Running with or without root: how the sandbox's uid is mapped, how its limits are enforced
//! (cgroups, or rlimits only), whether the `isolated` runtime may start, and what to do to give
//! a normal user cgroups. The runtime asks [`check_limits`] at startup; `sessionbox doctor`
//! prints [`limits_report`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sessionbox_core::{Error, Result};

use super::cgroup::{self, Version};
use super::{LimitMode, RUNTIME, SandboxLimits};

/// How a sandbox's identity maps to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UidMapping {
    /// As root: each conversation runs as a host uid of its own (from the store's allocator),
    /// mapped to uid 1000 inside; files it makes belong to that uid, and its per-user kernel
    /// counts are its own.
    PerConversation,
    /// Without root: an unprivileged user namespace can map only the caller, so every
    /// conversation runs as the caller's own host uid and gid (1000 inside). Conversations are
    /// still apart (mount, PID, network namespaces, landlock), but they share one host uid and
    /// its per-user allowances.
    Caller {
        /// The caller's uid.
        uid: u32,
        /// The caller's gid.
        gid: u32,
    },
}

/// What the runtime does with the configured [`LimitMode`] on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// cgroups can be made: memory, pids and CPU hold for each sandbox as a whole.
    Cgroups,
    /// rlimit-only limits were chosen: per process only.
    Rlimits,
    /// cgroups were asked for (the default) and cannot be made here: the runtime refuses to
    /// start rather than run with weaker limits nobody chose.
    Refuse,
}

/// The decision: rlimit-only limits when chosen; cgroups when asked for and usable; otherwise
/// refuse (never a silent fall-back to rlimits).
pub fn decide(mode: LimitMode, cgroups_usable: bool) -> Decision {
    match (mode, cgroups_usable) {
        (LimitMode::Rlimit, _) => Decision::Rlimits,
        (LimitMode::Cgroup, true) => Decision::Cgroups,
        (LimitMode::Cgroup, false) => Decision::Refuse,
    }
}

/// Everything `sessionbox doctor` says about privilege and limits.
#[derive(Debug, Clone)]
pub struct LimitsReport {
    /// Whether this process runs as root (effective uid 0).
    pub root: bool,
    /// How sandbox identities map to the host.
    pub mapping: UidMapping,
    /// The configured mode.
    pub mode: LimitMode,
    /// Where sandboxes' cgroups are made (one directory per hierarchy), or why none can be.
    pub cgroups: std::result::Result<Vec<PathBuf>, String>,
    /// What the runtime does.
    pub decision: Decision,
    /// The limits that hold, one line each (empty when the runtime refuses to start).
    pub holds: Vec<String>,
    /// Shell commands that delegate cgroups to this user (empty as root, who needs none).
    pub delegation: Vec<String>,
}

/// A probe cgroup name no other probe (of this or another process) is using.
fn probe_name() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "sessionbox-probe-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Tries to make (and removes) a sandbox cgroup: the directories it would be made in, or why
/// it cannot.
fn cgroups_usable() -> std::result::Result<Vec<PathBuf>, Error> {
    let cg = cgroup::Cgroups::create(&probe_name(), &SandboxLimits::default())?;
    let parents = cg
        .paths()
        .iter()
        .filter_map(|p| p.parent().map(Path::to_path_buf))
        .collect();
    let _ = cg.remove();
    Ok(parents)
}

fn mapping() -> UidMapping {
    let euid = rustix::process::geteuid();
    if euid.is_root() {
        UidMapping::PerConversation
    } else {
        UidMapping::Caller {
            uid: euid.as_raw(),
            gid: rustix::process::getegid().as_raw(),
        }
    }
}

/// Whether the `isolated` runtime may start with `limits` here: with [`LimitMode::Cgroup`]
/// (the default) a probe cgroup is made and removed; with [`LimitMode::Rlimit`] nothing is
/// checked.
///
/// # Errors
/// [`Error::RuntimeUnavailable`] when cgroups were asked for and cannot be made (without root:
/// no cgroup is delegated to the caller), saying how to delegate one or choose rlimit-only
/// limits.
pub fn check_limits(limits: &SandboxLimits) -> Result<()> {
    if limits.mode == LimitMode::Rlimit {
        return Ok(());
    }
    let probe = cgroups_usable();
    match decide(limits.mode, probe.is_ok()) {
        Decision::Refuse => Err(refusal(probe.err())),
        _ => Ok(()),
    }
}

fn refusal(cause: Option<Error>) -> Error {
    let cause = match cause {
        Some(Error::RuntimeUnavailable { reason, .. }) => reason,
        Some(e) => e.to_string(),
        None => "no cgroup can be made".into(),
    };
    let root = rustix::process::geteuid().is_root();
    Error::RuntimeUnavailable {
        runtime: RUNTIME.into(),
        reason: format!(
            "its limits are cgroups ([isolated] limits = \"cgroup\", the default) and {}: {cause}",
            if root {
                "none can be made here"
            } else {
                "this user has no delegated cgroup"
            }
        ),
        hint: if root {
            "mount the pids, memory and cpu controllers writable, or set [isolated] limits = \"rlimit\" in sessionbox.toml (per-process limits only); `sessionbox doctor` shows which limits hold".into()
        } else {
            "either delegate a cgroup to this user (`sessionbox doctor` prints the exact commands), or set [isolated] limits = \"rlimit\" in sessionbox.toml to run with per-process rlimits only (RLIMIT_AS, RLIMIT_NPROC, RLIMIT_CPU, RLIMIT_FSIZE: no memory, process or CPU bound for a sandbox as a whole), or run as root".into()
        },
    }
}

/// What holds under `decision` with `limits` (`version` names the cgroup version in use).
fn holds(decision: Decision, limits: &SandboxLimits, version: &str) -> Vec<String> {
    let l = limits;
    let per_process = format!(
        "per process: RLIMIT_FSIZE {} bytes, RLIMIT_NOFILE {}, RLIMIT_CORE 0, RLIMIT_SIGPENDING, RLIMIT_MSGQUEUE, RLIMIT_MEMLOCK",
        l.fsize, l.nofile
    );
    match decision {
        Decision::Cgroups => vec![
            format!(
                "memory: {} bytes for the whole sandbox (cgroup {version}; page cache and /tmp included, no swap)",
                l.memory_bytes
            ),
            format!(
                "TCP buffers: {} bytes for the whole sandbox ({})",
                match version {
                    "v1" => l.tcp_bytes.to_string(),
                    _ => "within the memory".into(),
                },
                match version {
                    "v1" =>
                        "cgroup v1 memory.kmem.tcp.limit_in_bytes: the host's TCP memory is one pool",
                    _ => "cgroup v2 counts socket buffers in memory.max",
                }
            ),
            format!(
                "processes: {} for the whole sandbox (cgroup {version} pids.max), and RLIMIT_NPROC {}",
                l.pids, l.nproc
            ),
            format!(
                "cpu: {} CPU(s) for the whole sandbox (cgroup {version} CPU quota)",
                l.cpu
            ),
            per_process,
        ],
        Decision::Rlimits => vec![
            format!(
                "memory: RLIMIT_AS {} bytes per process (address space, not the sandbox's total: several processes can each use that much; /tmp and /dev/shm, {} bytes each, are not counted)",
                l.memory_bytes, l.tmpfs_bytes
            ),
            format!(
                "processes: RLIMIT_NPROC {} (the sandbox user's processes in its own user namespace; no cgroup pids.max)",
                l.nproc
            ),
            format!(
                "cpu: RLIMIT_CPU {} s per process, then the kernel kills it (no CPU quota: a sandbox can keep every core busy)",
                l.cpu_secs
            ),
            "TCP buffers: not bounded per sandbox (only by the host's pool, net.ipv4.tcp_mem)"
                .into(),
            per_process,
        ],
        Decision::Refuse => Vec::new(),
    }
}

/// The exact commands an administrator runs (as root) to delegate cgroups to `uid`:`gid`,
/// for the hierarchies found here. Empty when no controller is mounted at all.
pub fn delegation_steps(uid: u32, gid: u32) -> Vec<String> {
    let (found, _) = cgroup::discover();
    let mounts: Vec<(Version, PathBuf)> = found.iter().fold(Vec::new(), |mut acc, l| {
        if !acc.iter().any(|(_, m)| *m == l.mount) {
            acc.push((l.version, l.mount.clone()));
        }
        acc
    });
    steps_for(uid, gid, &mounts)
}

/// [`delegation_steps`] for the given hierarchies (`(version, mount point)`, one per
/// hierarchy holding any of pids, memory, cpu).
fn steps_for(uid: u32, gid: u32, mounts: &[(Version, PathBuf)]) -> Vec<String> {
    let name = cgroup::delegated_name(uid);
    let mut out = Vec::new();
    let v1: Vec<String> = mounts
        .iter()
        .filter(|(v, _)| *v == Version::V1)
        .map(|(_, m)| m.join(&name).display().to_string())
        .collect();
    if !v1.is_empty() {
        out.push(format!("mkdir -p {}", v1.join(" ")));
        out.push(format!("chown -R {uid}:{gid} {}", v1.join(" ")));
        out.push(
            "# cgroup v1 directories are gone after a reboot: run both commands at boot (a systemd oneshot unit or rc.local)".into(),
        );
    }
    if let Some((_, m)) = mounts.iter().find(|(v, _)| *v == Version::V2) {
        let d = m.join(&name);
        let d = d.display();
        out.push(
            "# with systemd: run sessionbox in a delegated unit, e.g. `systemd-run --user --scope -p Delegate=yes sessionbox serve`, or a service with User= and Delegate=pids memory cpu (the user manager must delegate them: see its cgroup.controllers)".into(),
        );
        out.push("# without systemd, as root:".into());
        out.push(format!("mkdir -p {d}"));
        out.push(format!(
            "echo '+pids +memory +cpu' > {}/cgroup.subtree_control",
            m.display()
        ));
        out.push(format!(
            "chown {uid}:{gid} {d} {d}/cgroup.procs {d}/cgroup.subtree_control {d}/cgroup.threads"
        ));
        out.push(format!(
            "# then start sessionbox inside it (cgroup v2 moves a process only within a subtree its user may write): sh -c 'echo $$ > {d}/cgroup.procs && exec setpriv --reuid={uid} --regid={gid} --init-groups sessionbox serve'"
        ));
    }
    out
}

/// Probes this machine for `limits` (see [`LimitsReport`]). Makes and removes a probe cgroup.
pub fn limits_report(limits: &SandboxLimits) -> LimitsReport {
    let mapping = mapping();
    let root = mapping == UidMapping::PerConversation;
    let probe = cgroups_usable();
    let decision = decide(limits.mode, probe.is_ok());
    let version = {
        let (found, _) = cgroup::discover();
        if found.iter().any(|l| l.version == Version::V2) {
            "v2"
        } else {
            "v1"
        }
    };
    let delegation = match mapping {
        UidMapping::PerConversation => Vec::new(),
        UidMapping::Caller { uid, gid } => delegation_steps(uid, gid),
    };
    LimitsReport {
        root,
        mapping,
        mode: limits.mode,
        cgroups: probe.map_err(|e| match e {
            Error::RuntimeUnavailable { reason, .. } => reason,
            e => e.to_string(),
        }),
        decision,
        holds: holds(decision, limits, version),
        delegation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroups_are_used_when_asked_and_usable_and_never_replaced_silently() {
        assert_eq!(decide(LimitMode::Cgroup, true), Decision::Cgroups);
        assert_eq!(decide(LimitMode::Cgroup, false), Decision::Refuse);
        // rlimit-only is what was chosen: no cgroup even when one could be made.
        assert_eq!(decide(LimitMode::Rlimit, true), Decision::Rlimits);
        assert_eq!(decide(LimitMode::Rlimit, false), Decision::Rlimits);
    }

    #[test]
    fn the_refusal_says_how_to_delegate_or_choose_rlimits() {
        let e = refusal(None).to_string();
        assert!(e.contains("limits = \"rlimit\""), "{e}");
        assert!(e.contains("sessionbox doctor"), "{e}");
    }

    #[test]
    fn what_holds_names_each_limit_and_its_scope() {
        let l = SandboxLimits::default();
        let c = holds(Decision::Cgroups, &l, "v1").join("\n");
        assert!(
            c.contains("2147483648 bytes for the whole sandbox (cgroup v1"),
            "{c}"
        );
        assert!(c.contains("512 for the whole sandbox"), "{c}");
        assert!(c.contains("1 CPU(s)"), "{c}");
        assert!(c.contains("TCP buffers: 268435456 bytes"), "{c}");
        let v2 = holds(Decision::Cgroups, &l, "v2").join("\n");
        assert!(v2.contains("socket buffers in memory.max"), "{v2}");
        let r = holds(Decision::Rlimits, &l, "v1").join("\n");
        for want in [
            "RLIMIT_AS 2147483648 bytes per process",
            "RLIMIT_NPROC 512",
            "RLIMIT_CPU 3600 s per process",
            "RLIMIT_FSIZE 1073741824",
            "no CPU quota",
            "TCP buffers: not bounded",
        ] {
            assert!(r.contains(want), "{want}: {r}");
        }
        assert!(holds(Decision::Refuse, &l, "v1").is_empty());
    }

    #[test]
    fn delegation_steps_make_and_chown_a_directory_per_hierarchy() {
        let v1 = [
            (Version::V1, PathBuf::from("/sys/fs/cgroup/pids")),
            (Version::V1, PathBuf::from("/sys/fs/cgroup/memory")),
            (Version::V1, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")),
        ];
        let s = steps_for(1001, 1002, &v1);
        assert_eq!(
            s[0],
            "mkdir -p /sys/fs/cgroup/pids/sessionbox-1001 /sys/fs/cgroup/memory/sessionbox-1001 /sys/fs/cgroup/cpu,cpuacct/sessionbox-1001"
        );
        assert_eq!(
            s[1],
            "chown -R 1001:1002 /sys/fs/cgroup/pids/sessionbox-1001 /sys/fs/cgroup/memory/sessionbox-1001 /sys/fs/cgroup/cpu,cpuacct/sessionbox-1001"
        );
        let v2 = [(Version::V2, PathBuf::from("/sys/fs/cgroup"))];
        let s = steps_for(1001, 1001, &v2).join("\n");
        assert!(s.contains("Delegate=yes"), "{s}");
        assert!(
            s.contains("echo '+pids +memory +cpu' > /sys/fs/cgroup/cgroup.subtree_control"),
            "{s}"
        );
        assert!(s.contains("chown 1001:1001 /sys/fs/cgroup/sessionbox-1001 /sys/fs/cgroup/sessionbox-1001/cgroup.procs"), "{s}");
        assert!(steps_for(1001, 1001, &[]).is_empty());
    }
}
