//! The sandbox's file system, built by the init in its new mount namespace: a tmpfs root with
//! read-only binds of the system directories, a generated minimal `/etc`, a private `/dev`, its
//! own `/proc`, tmpfs `/tmp`, the workspace at `/workspace` and the spec's read-only binds; then
//! `pivot_root` into it, the old root detached, and the root made read-only.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, symlink};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

use super::child::{Failure, Layer, Step};
use super::{INSIDE_GID, INSIDE_UID, SandboxSpec, WORKSPACE_DIR};

const LAYER: &str = "filesystem";
const HINT: &str = "run on Linux 5.12 or later (mount_setattr), with /tmp (or /mnt) present on the host and /proc not over-mounted (mounting a fresh procfs is refused when the host's /proc has masked paths, as in some containers: run sessionbox with a fully visible /proc)";
const HINT_PATH: &str =
    "check that the path exists and that sessionbox (root, or its user) can open it";

/// System directories bound read-only (or recreated as links, when they are links on the host).
const SYSTEM: [&str; 5] = ["usr", "bin", "sbin", "lib", "lib64"];
/// Host `/etc` entries copied (files, links) when present. Nothing secret: no shadow, no keys.
const ETC_COPIED: [&str; 8] = [
    "ld.so.cache",
    "ld.so.conf",
    "localtime",
    "timezone",
    "os-release",
    "protocols",
    "services",
    "debian_version",
];
/// Host `/etc` directories bound read-only when present.
const ETC_BOUND: [&str; 2] = ["ld.so.conf.d", "alternatives"];
/// Host character devices bound into `/dev` (`tty` is optional).
pub(crate) const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// `/proc` files hidden behind `/dev/null`.
const PROC_MASKED_FILES: [&str; 6] = [
    "kcore",
    "keys",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "sysrq-trigger",
];
/// `/proc` directories hidden behind an empty read-only tmpfs.
const PROC_MASKED_DIRS: [&str; 3] = ["acpi", "scsi", "asound"];
/// `/proc` directories made read-only.
const PROC_READ_ONLY: [&str; 4] = ["sys", "irq", "bus", "fs"];
/// Largest `/etc` file copied: 4 MiB.
const MAX_ETC_FILE: u64 = 4 << 20;

enum Entry {
    Dir(OwnedFd),
    File(Vec<u8>),
    Symlink(PathBuf),
}

/// Host objects opened (`O_PATH`) or read before the init changes identity or mounts anything.
pub(crate) struct Sources {
    workspace: OwnedFd,
    system: Vec<(&'static str, Entry)>,
    etc: Vec<(&'static str, Entry)>,
    devices: Vec<(&'static str, OwnedFd)>,
    ro_binds: Vec<(PathBuf, OwnedFd, bool)>,
}

fn open_path(p: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        p,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Where a host object is, as a source for mount(2): the fd's magic link.
fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

impl Sources {
    pub(crate) fn open(spec: &SandboxSpec) -> Step<Sources> {
        let workspace = open_path(&spec.workspace).layer(
            LAYER,
            format!("cannot open the workspace {:?}", spec.workspace),
            HINT_PATH,
        )?;
        if !std::fs::metadata(fd_path(&workspace)).is_ok_and(|m| m.is_dir()) {
            return Err(Failure::new(
                LAYER,
                format!("the workspace {:?} is not a directory", spec.workspace),
                HINT_PATH,
            ));
        }
        let mut system = Vec::new();
        for name in SYSTEM {
            let host = Path::new("/").join(name);
            let Ok(meta) = std::fs::symlink_metadata(&host) else {
                if name == "usr" {
                    return Err(Failure::new(LAYER, "the host has no /usr", HINT_PATH));
                }
                continue;
            };
            let entry = if meta.file_type().is_symlink() {
                Entry::Symlink(std::fs::read_link(&host).layer(
                    LAYER,
                    format!("readlink {host:?}"),
                    HINT_PATH,
                )?)
            } else if meta.is_dir() {
                Entry::Dir(open_path(&host).layer(LAYER, format!("open {host:?}"), HINT_PATH)?)
            } else {
                continue;
            };
            system.push((name, entry));
        }
        let mut etc = Vec::new();
        for name in ETC_COPIED.iter().chain(ETC_BOUND.iter()) {
            let host = Path::new("/etc").join(name);
            let Ok(meta) = std::fs::symlink_metadata(&host) else {
                continue;
            };
            let entry = if meta.file_type().is_symlink() {
                match std::fs::read_link(&host) {
                    Ok(t) => Entry::Symlink(t),
                    Err(_) => continue,
                }
            } else if meta.is_dir() && ETC_BOUND.contains(name) {
                match open_path(&host) {
                    Ok(fd) => Entry::Dir(fd),
                    Err(_) => continue,
                }
            } else if meta.is_file() && meta.len() <= MAX_ETC_FILE && ETC_COPIED.contains(name) {
                match std::fs::read(&host) {
                    Ok(b) => Entry::File(b),
                    Err(_) => continue,
                }
            } else {
                continue;
            };
            etc.push((*name, entry));
        }
        let mut devices = Vec::new();
        for name in DEVICES {
            let host = Path::new("/dev").join(name);
            let is_char = std::fs::metadata(&host).is_ok_and(|m| m.file_type().is_char_device());
            if !is_char {
                if name == "tty" {
                    continue;
                }
                return Err(Failure::new(
                    LAYER,
                    format!("the host has no character device {host:?}"),
                    HINT_PATH,
                ));
            }
            devices.push((
                name,
                open_path(&host).layer(LAYER, format!("open {host:?}"), HINT_PATH)?,
            ));
        }
        let mut ro_binds = Vec::new();
        for (host, inside) in &spec.ro_binds {
            let fd = open_path(host).layer(
                LAYER,
                format!("cannot open the read-only bind source {host:?}"),
                HINT_PATH,
            )?;
            let is_dir = std::fs::metadata(fd_path(&fd)).is_ok_and(|m| m.is_dir());
            ro_binds.push((inside.clone(), fd, is_dir));
        }
        Ok(Sources {
            workspace,
            system,
            etc,
            devices,
            ro_binds,
        })
    }
}

/// mount_setattr(2) on `path` (and every mount beneath it): sets `attrs` (MOUNT_ATTR_*).
fn set_attrs(path: &Path, attrs: u64) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    let attr = libc::mount_attr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr reads `size` bytes from `&attr`, a fully initialised mount_attr that
    // lives across the call, and a NUL-terminated path from `c`, which also outlives it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            (libc::AT_RECURSIVE | libc::AT_NO_AUTOMOUNT) as libc::c_uint,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

const RO: u64 = libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;

/// Binds `fd` (recursively) at `target` and sets `attrs` on the whole bound tree.
fn bind(fd: &OwnedFd, target: &Path, attrs: u64, what: &str) -> Step<()> {
    rustix::mount::mount_bind_recursive(fd_path(fd).as_str(), target).layer(
        LAYER,
        format!("bind {what} at {target:?}"),
        HINT,
    )?;
    set_attrs(target, attrs).layer(LAYER, format!("mount_setattr on {target:?}"), HINT)
}

fn tmpfs(target: &Path, flags: MountFlags, data: &str, what: &str) -> Step<()> {
    let data = CString::new(data).expect("no NUL in tmpfs options");
    rustix::mount::mount("tmpfs", target, "tmpfs", flags, data.as_c_str()).layer(
        LAYER,
        format!("mount a tmpfs for {what} at {target:?}"),
        HINT,
    )
}

fn mkdir(p: &Path, mode: u32) -> Step<()> {
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(p)
        .layer(LAYER, format!("mkdir {p:?}"), HINT)
}

fn write_file(p: &Path, data: &[u8]) -> Step<()> {
    std::fs::write(p, data).layer(LAYER, format!("write {p:?}"), HINT)
}

fn link(target: &Path, at: &Path) -> Step<()> {
    symlink(target, at).layer(LAYER, format!("symlink {at:?}"), HINT)
}

/// The generated `/etc` files: the sandbox user and group, loopback host names, no DNS.
fn generated_etc(hostname: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "passwd",
            format!(
                "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n\
                 sandbox:x:{INSIDE_UID}:{INSIDE_GID}:sessionbox sandbox:{WORKSPACE_DIR}:/bin/sh\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        (
            "group",
            format!("root:x:0:\nsandbox:x:{INSIDE_GID}:\nnogroup:x:65534:\n"),
        ),
        (
            "hosts",
            format!(
                "127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
            ),
        ),
        ("hostname", format!("{hostname}\n")),
        ("resolv.conf", String::new()),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n".into(),
        ),
    ]
}

/// Builds the new root and pivots into it. The host objects in `sources` are closed on return.
pub(crate) fn build(sources: Sources, spec: &SandboxSpec) -> Step<()> {
    // Nothing done here propagates back to the host (or in from it).
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .layer(LAYER, "make / private", HINT)?;

    // Stage the new root on a tmpfs over a host directory (hidden only in this namespace; the
    // sources are open descriptors, so nothing they need is hidden).
    let staging = ["/tmp", "/mnt", "/var/tmp"]
        .into_iter()
        .map(Path::new)
        .find(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        .ok_or_else(|| {
            Failure::new(
                LAYER,
                "no /tmp, /mnt or /var/tmp to stage the new root on",
                HINT,
            )
        })?;
    let root = staging;
    tmpfs(
        root,
        MountFlags::NOSUID | MountFlags::NODEV,
        "mode=0755,size=16m",
        "the new root",
    )?;
    let at = |p: &str| root.join(p.trim_start_matches('/'));

    // System directories, read-only.
    for (name, entry) in &sources.system {
        match entry {
            Entry::Dir(fd) => {
                mkdir(&at(name), 0o755)?;
                bind(fd, &at(name), RO, &format!("/{name}"))?;
            }
            Entry::Symlink(t) => link(t, &at(name))?,
            Entry::File(_) => {}
        }
    }

    // A minimal /etc.
    mkdir(&at("etc"), 0o755)?;
    for (name, data) in generated_etc(&spec.hostname) {
        write_file(&at(&format!("etc/{name}")), data.as_bytes())?;
    }
    for (name, entry) in &sources.etc {
        let p = at(&format!("etc/{name}"));
        match entry {
            Entry::File(data) => write_file(&p, data)?,
            Entry::Symlink(t) => link(t, &p)?,
            Entry::Dir(fd) => {
                mkdir(&p, 0o755)?;
                bind(fd, &p, RO, &format!("/etc/{name}"))?;
            }
        }
    }

    // A private /dev.
    mkdir(&at("dev"), 0o755)?;
    for (name, fd) in &sources.devices {
        let p = at(&format!("dev/{name}"));
        write_file(&p, b"")?;
        bind(
            fd,
            &p,
            libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC,
            &format!("/dev/{name}"),
        )?;
    }
    mkdir(&at("dev/pts"), 0o755)?;
    // Its own instance with a maximum: the kernel's terminal pool is shared by all instances.
    let pts_opts = CString::new(format!(
        "newinstance,ptmxmode=0666,mode=0620,max={}",
        spec.limits.ptys
    ))
    .expect("no NUL");
    rustix::mount::mount(
        "devpts",
        at("dev/pts"),
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        pts_opts.as_c_str(),
    )
    .layer(LAYER, "mount devpts at /dev/pts", HINT)?;
    link(Path::new("pts/ptmx"), &at("dev/ptmx"))?;
    mkdir(&at("dev/shm"), 0o755)?;
    tmpfs(
        &at("dev/shm"),
        MountFlags::NOSUID | MountFlags::NODEV,
        &format!("mode=1777,size={}", spec.limits.tmpfs_bytes),
        "/dev/shm",
    )?;
    link(Path::new("/proc/self/fd"), &at("dev/fd"))?;
    for (i, name) in ["stdin", "stdout", "stderr"].iter().enumerate() {
        link(
            Path::new(&format!("/proc/self/fd/{i}")),
            &at(&format!("dev/{name}")),
        )?;
    }

    // /proc of the sandbox's own PID namespace (this process is its PID 1).
    mkdir(&at("proc"), 0o555)?;
    rustix::mount::mount(
        "proc",
        at("proc"),
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        None,
    )
    .layer(LAYER, "mount /proc for the new PID namespace", HINT)?;
    // The user namespace's own limits, while /proc/sys is still writable.
    super::child::limit_user_namespace(&at("proc"))?;
    mask_proc(&at("proc"), &at("dev/null"))?;

    // /tmp.
    mkdir(&at("tmp"), 0o1777)?;
    tmpfs(
        &at("tmp"),
        MountFlags::NOSUID | MountFlags::NODEV,
        &format!("mode=1777,size={}", spec.limits.tmpfs_bytes),
        "/tmp",
    )?;

    // The workspace, read-write.
    mkdir(&at(WORKSPACE_DIR), 0o755)?;
    bind(
        &sources.workspace,
        &at(WORKSPACE_DIR),
        libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
        "the workspace",
    )?;

    // The spec's read-only binds.
    for (inside, fd, is_dir) in &sources.ro_binds {
        let p = at(&inside.to_string_lossy());
        if let Some(parent) = p.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .layer(LAYER, format!("mkdir -p {parent:?}"), HINT)?;
        }
        if *is_dir {
            mkdir(&p, 0o755)?;
        } else {
            write_file(&p, b"")?;
        }
        bind(fd, &p, RO, &format!("{inside:?}"))?;
    }
    drop(sources);

    // Into the new root; the old one is detached (with every mount beneath it).
    std::env::set_current_dir(root).layer(LAYER, "chdir to the new root", HINT)?;
    rustix::process::pivot_root(".", ".").layer(LAYER, "pivot_root", HINT)?;
    rustix::mount::unmount(".", UnmountFlags::DETACH).layer(LAYER, "detach the old root", HINT)?;
    std::env::set_current_dir("/").layer(LAYER, "chdir /", HINT)?;
    // The root tmpfs itself becomes read-only: only /workspace, /tmp and /dev/shm are writable.
    rustix::mount::mount_remount(
        "/",
        MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
        "",
    )
    .layer(LAYER, "remount / read-only", HINT)?;
    verify_layout()
}

/// Hides sensitive `/proc` entries, as container runtimes do.
fn mask_proc(proc: &Path, null: &Path) -> Step<()> {
    for name in PROC_MASKED_FILES {
        let p = proc.join(name);
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_file()) {
            rustix::mount::mount_bind(null, &p).layer(LAYER, format!("mask {p:?}"), HINT)?;
        }
    }
    for name in PROC_MASKED_DIRS {
        let p = proc.join(name);
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
            tmpfs(
                &p,
                MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                "size=4k,mode=0555",
                "a masked /proc directory",
            )?;
        }
    }
    for name in PROC_READ_ONLY {
        let p = proc.join(name);
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
            rustix::mount::mount_bind_recursive(&p, &p).layer(
                LAYER,
                format!("bind {p:?} over itself"),
                HINT,
            )?;
            set_attrs(&p, RO | libc::MOUNT_ATTR_NOEXEC).layer(
                LAYER,
                format!("make {p:?} read-only"),
                HINT,
            )?;
        }
    }
    Ok(())
}

/// Checks the finished layout from inside: the workspace is there, the root is read-only.
fn verify_layout() -> Step<()> {
    if !Path::new(WORKSPACE_DIR).is_dir() {
        return Err(Failure::new(
            LAYER,
            "the workspace is missing after pivot_root",
            HINT,
        ));
    }
    let st = rustix::fs::statvfs("/").layer(LAYER, "statvfs /", HINT)?;
    if !st.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) {
        return Err(Failure::new(LAYER, "the new root is not read-only", HINT));
    }
    Ok(())
}
