//! The init's last steps before it forks the program: capabilities dropped, `no_new_privs`,
//! Landlock, seccomp, then a check of the result in `/proc/self/status`. The program inherits
//! all of it.

use std::collections::BTreeMap;

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

use super::child::{Failure, Layer, Step};
use super::mounts::DEVICES;

const HINT_CAPS: &str =
    "this is a sessionbox bug or a very unusual kernel; report it with `sessionbox doctor` output";
const HINT_LANDLOCK: &str = "boot Linux 5.13 or later with CONFIG_SECURITY_LANDLOCK=y and `landlock` in the lsm= boot parameter (`sessionbox doctor` shows the ABI found)";
const HINT_SECCOMP: &str =
    "run on a kernel with CONFIG_SECCOMP_FILTER=y (x86_64, aarch64 or riscv64)";

/// The file-system access rights handled (denied unless a rule allows them): those of Landlock
/// ABI 5 (Linux 6.10), which include truncation, cross-directory renames and device ioctls.
const FS_ABI: ABI = ABI::V5;
/// Scopes (ABI 6, Linux 6.12): no signals to, and no abstract UNIX sockets of, processes outside
/// the sandbox.
const SCOPE_ABI: ABI = ABI::V6;

/// What a kernel without Landlock scopes (before ABI 6, Linux 6.12) leaves open.
pub(crate) const NO_SCOPES: &str = "without scopes (ABI 6, Linux 6.12), a command can signal (stop, kill) the sandbox's agent and init";

/// Directories where everything is allowed.
pub(crate) const WRITABLE: [&str; 3] = ["/workspace", "/tmp", "/dev/shm"];

/// Drops every capability, sets `no_new_privs`, applies Landlock and seccomp, and checks the
/// result. Returns how Landlock was applied.
pub(crate) fn apply() -> Step<String> {
    drop_capabilities()?;
    rustix::thread::set_no_new_privs(true).layer("no_new_privs", "prctl", HINT_CAPS)?;
    let landlock = landlock()?;
    seccomp()?;
    verify()?;
    Ok(landlock)
}

fn drop_capabilities() -> Step<()> {
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63);
    // Bounding set first: dropping from it needs CAP_SETPCAP, which goes with the rest below.
    for cap in 0..=last {
        // SAFETY: prctl(PR_CAPBSET_DROP, cap) takes integers only.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            // EINVAL: a capability this kernel does not know.
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(Failure::new(
                    "capabilities",
                    format!("PR_CAPBSET_DROP({cap}): {e}"),
                    HINT_CAPS,
                ));
            }
        }
    }
    rustix::thread::clear_ambient_capability_set().layer(
        "capabilities",
        "clear the ambient set",
        HINT_CAPS,
    )?;
    let none = rustix::thread::CapabilitySet::empty();
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: none,
            permitted: none,
            inheritable: none,
        },
    )
    .layer("capabilities", "capset to empty sets", HINT_CAPS)
}

fn landlock() -> Step<String> {
    const L: &str = "landlock";
    let all = AccessFs::from_all(FS_ABI);
    let read = AccessFs::from_read(FS_ABI);
    let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
    let fd = |p: &str| PathFd::new(p).layer(L, format!("open {p}"), HINT_LANDLOCK);
    let mut ruleset = landlock::Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .layer(L, "handle file-system access", HINT_LANDLOCK)?
        .scope(Scope::from_all(SCOPE_ABI))
        .layer(L, "scope signals and abstract sockets", HINT_LANDLOCK)?
        .create()
        .layer(L, "create the ruleset", HINT_LANDLOCK)?
        // Read and execute everything visible...
        .add_rule(PathBeneath::new(fd("/")?, read))
        .layer(L, "allow reading /", HINT_LANDLOCK)?;
    // ...write only beneath the writable directories...
    for p in WRITABLE {
        ruleset = ruleset.add_rule(PathBeneath::new(fd(p)?, all)).layer(
            L,
            format!("allow writing {p}"),
            HINT_LANDLOCK,
        )?;
    }
    // ...and to the character devices.
    for name in DEVICES {
        let p = format!("/dev/{name}");
        if std::path::Path::new(&p).exists() {
            ruleset = ruleset.add_rule(PathBeneath::new(fd(&p)?, device)).layer(
                L,
                format!("allow writing {p}"),
                HINT_LANDLOCK,
            )?;
        }
    }
    ruleset = ruleset
        .add_rule(PathBeneath::new(fd("/dev/pts")?, device))
        .layer(L, "allow terminals in /dev/pts", HINT_LANDLOCK)?;
    let status = ruleset
        .restrict_self()
        .layer(L, "restrict self", HINT_LANDLOCK)?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok("fully enforced".into()),
        RulesetStatus::PartiallyEnforced => Ok(format!(
            "partially enforced (the kernel lacks some rights of Landlock ABI {} or the scopes of ABI {}: {:?}; {})",
            FS_ABI as i32, SCOPE_ABI as i32, status.landlock, NO_SCOPES
        )),
        RulesetStatus::NotEnforced => Err(Failure::new(
            L,
            "the kernel does not enforce Landlock",
            HINT_LANDLOCK,
        )),
    }
}

/// Syscalls that fail with EPERM whatever their arguments.
fn denied_syscalls() -> Vec<i64> {
    #[allow(unused_mut)]
    let mut v = vec![
        // Debugging and reading other processes.
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
        libc::SYS_process_madvise,
        // Mounts and namespaces (the old and the new mount API).
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_mount_setattr,
        libc::SYS_open_by_handle_at,
        // Kernel keyrings.
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        // Large kernel attack surface.
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_userfaultfd,
        libc::SYS_fanotify_init,
        // Kernel and machine administration.
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_syslog,
        libc::SYS_vhangup,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        libc::SYS_iopl,
        libc::SYS_ioperm,
        libc::SYS_uselib,
        libc::SYS_lookup_dcookie,
        // Per-process LDT entries: a rarely needed, bug-prone interface (Docker refuses it too).
        libc::SYS_modify_ldt,
    ]);
    v
}

/// Namespace flags refused in clone(2). (CLONE_NEWTIME shares its bit with CSIGNAL in clone(2),
/// where the kernel does not accept it; clone3, where it works, fails with ENOSYS below, and
/// unshare with EPERM.)
const CLONE_NS_FLAGS: [u64; 7] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// An ioctl request number as a filter operand (its C type differs between libcs).
#[allow(clippy::unnecessary_cast)]
fn ioctl_nr(request: libc::Ioctl) -> u64 {
    request as u64
}

fn cond(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, v: u64) -> Step<SeccompCondition> {
    SeccompCondition::new(arg, len, op, v).layer("seccomp", "build a condition", HINT_CAPS)
}

fn rule(conds: Vec<SeccompCondition>) -> Step<SeccompRule> {
    SeccompRule::new(conds).layer("seccomp", "build a rule", HINT_CAPS)
}

/// The filters, in the order they are installed.
pub(crate) fn filters() -> Step<Vec<BpfProgram>> {
    use SeccompCmpArgLen::{Dword, Qword};
    use SeccompCmpOp::{Eq, MaskedEq, Ne};
    const S: &str = "seccomp";
    let arch: TargetArch =
        std::env::consts::ARCH
            .try_into()
            .layer(S, "unsupported architecture", HINT_SECCOMP)?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in denied_syscalls() {
        rules.insert(nr, Vec::new());
    }
    // socket(2) with any family but AF_UNIX, AF_INET, AF_INET6 (no netlink, packet, vsock, ...).
    rules.insert(
        libc::SYS_socket,
        vec![rule(vec![
            cond(0, Dword, Ne, libc::AF_UNIX as u64)?,
            cond(0, Dword, Ne, libc::AF_INET as u64)?,
            cond(0, Dword, Ne, libc::AF_INET6 as u64)?,
        ])?],
    );
    // Terminal input injection (bubblewrap CVE-2017-5226) and console ioctls. The kernel reads
    // the request as 32 bits, so only the low 32 bits are compared.
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, Dword, Eq, ioctl_nr(libc::TIOCSTI))?])?,
            rule(vec![cond(1, Dword, Eq, ioctl_nr(libc::TIOCLINUX))?])?,
        ],
    );
    // clone(2) creating namespaces.
    let mut clone_rules = Vec::new();
    for f in CLONE_NS_FLAGS {
        clone_rules.push(rule(vec![cond(0, Qword, MaskedEq(f), f)?])?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    let eperm = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .layer(S, "build the filter", HINT_CAPS)?;
    // clone3 passes its flags in memory, which seccomp cannot read: ENOSYS makes libc fall back
    // to clone(2), whose flags are filtered above.
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .layer(S, "build the clone3 filter", HINT_CAPS)?;
    let mut out = vec![
        eperm.try_into().layer(S, "compile the filter", HINT_CAPS)?,
        clone3
            .try_into()
            .layer(S, "compile the filter", HINT_CAPS)?,
    ];
    if arch == TargetArch::x86_64 {
        out.push(x32_filter());
    }
    Ok(out)
}

/// On x86_64, x32 system calls (numbers with bit 30 set) would bypass the rules above, which
/// compare exact numbers: they fail with ENOSYS. (The filters above already kill any other
/// architecture, such as i386 through `int 0x80`.)
fn x32_filter() -> BpfProgram {
    const LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS
    const JEQ_K: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE_K: u16 = 0x05 | 0x30; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    const X32_BIT: u32 = 0x4000_0000;
    let f = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        f(LD_W_ABS, 0, 0, 4),              // A = seccomp_data.arch
        f(JEQ_K, 0, 3, AUDIT_ARCH_X86_64), // not x86_64: allow (other filters decide)
        f(LD_W_ABS, 0, 0, 0),              // A = seccomp_data.nr
        f(JGE_K, 0, 1, X32_BIT),           // x32 number?
        f(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        f(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

fn seccomp() -> Step<()> {
    for f in filters()? {
        seccompiler::apply_filter(&f).layer("seccomp", "install the filter", HINT_SECCOMP)?;
    }
    Ok(())
}

/// Reads back what the kernel now enforces for this process.
fn verify() -> Step<()> {
    let status = std::fs::read_to_string("/proc/self/status").layer(
        "capabilities",
        "read /proc/self/status",
        HINT_CAPS,
    )?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
            .unwrap_or_default()
    };
    for set in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        let v = field(set);
        if u64::from_str_radix(&v, 16) != Ok(0) {
            return Err(Failure::new(
                "capabilities",
                format!("{set} is {v:?} after dropping every capability"),
                HINT_CAPS,
            ));
        }
    }
    if field("NoNewPrivs:") != "1" {
        return Err(Failure::new("no_new_privs", "not set", HINT_CAPS));
    }
    if field("Seccomp:") != "2" {
        return Err(Failure::new(
            "seccomp",
            "no filter is in force",
            HINT_SECCOMP,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_compile_for_this_architecture() {
        let f = filters().unwrap();
        assert!(f.len() >= 2);
        assert!(f.iter().all(|p| !p.is_empty() && p.len() < 4096));
    }
}
