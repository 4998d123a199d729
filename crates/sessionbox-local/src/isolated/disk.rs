//! The disk quota of a conversation: its workspace is a file system of its own, an ext4 image
//! of `disk_bytes` with `disk_inodes` inodes, loop-mounted at `workspaces/<key>`.
//!
//! Layout beneath the data directory: `disks/<key>.img` (root's, 0600, sparse: it takes host
//! space only for what the conversation wrote, and gives it back when files are deleted: it is
//! mounted with `discard`) mounted at `workspaces/<key>` (`nodev,nosuid`),
//! whose root is the workspace (0700, the conversation's uid; `lost+found` removed).
//!
//! Why this mechanism: the kernel enforces both limits with no code of ours on the write path
//! (a write past the size fails with `ENOSPC`, a file past the inode count with `ENOSPC`, inside
//! the sandbox and through the agent's file API alike), and it needs nothing of the kernel but
//! loop devices and ext4. Project quotas on one shared file system (one project id per
//! conversation) would cost microseconds instead of the ~70 ms of `mkfs.ext4` and `mount` at a
//! conversation's creation, but they need a kernel built with `CONFIG_QUOTA`, and the kernels
//! sessionbox runs on here are not (XFS: "quota support not available in this kernel"; ext4:
//! "the kernel was not built with CONFIG_QUOTA"). btrfs qgroups bound bytes but not inodes.
//! The cost is paid once per conversation, not per sandbox launch: the volume stays mounted
//! while the workspace exists (a sandbox launched again after an idle stop finds it mounted),
//! is mounted again on first use after a reboot, and is unmounted and removed on destroy.
//!
//! Every step runs under the conversation's lock (the caller holds it), so two processes never
//! race to make or mount one volume. A workspace made before quotas were on (a plain
//! directory) is migrated: its files are copied into a new volume, which refuses clearly when
//! they exceed the quota and leaves the workspace as it was.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sessionbox_core::{DiskUsage, Error, Result};

/// The disk quota of every conversation: the size and inode count of its workspace's file
/// system. See the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskQuota {
    /// Bytes of the workspace's file system (its own metadata, about 4 MiB of journal and
    /// 256 bytes per inode, comes out of it: that much less is left for files).
    pub bytes: u64,
    /// Inodes of the workspace's file system: files, directories and links together (ext4
    /// rounds it to a multiple of 8 per block group: the file system gets at most 16 more per
    /// block group, 8 MiB of `bytes` under 512 MiB, else 128 MiB; never fewer).
    pub inodes: u64,
}

impl DiskQuota {
    /// 1 GiB by default: as much as one file could already hold (`RLIMIT_FSIZE`), enough for a
    /// repository checkout and its build, and a thousand conversations cannot take more than
    /// a terabyte of the host.
    pub const DEFAULT_BYTES: u64 = 1 << 30;
    /// 100 000 inodes by default: a large repository with its dependencies (a `node_modules`
    /// of a big project holds tens of thousands of files), while 200 000 files in 12 s, the
    /// attack seen, is refused at half of it.
    pub const DEFAULT_INODES: u64 = 100_000;
    /// The smallest quota: ext4 needs room for its journal and metadata.
    pub const MIN_BYTES: u64 = 16 << 20;
    /// The fewest inodes.
    pub const MIN_INODES: u64 = 64;

    /// `bytes` and `inodes`, checked.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] below [`Self::MIN_BYTES`] or [`Self::MIN_INODES`], or with
    /// more inodes than 1 per KiB of `bytes`.
    pub fn new(bytes: u64, inodes: u64) -> Result<Self> {
        if bytes < Self::MIN_BYTES {
            return Err(Error::InvalidRequest(format!(
                "a disk quota of {bytes} bytes is below the minimum of {} bytes (16 MiB); raise disk_bytes",
                Self::MIN_BYTES
            )));
        }
        if inodes < Self::MIN_INODES || inodes > bytes / 1024 {
            return Err(Error::InvalidRequest(format!(
                "a quota of {inodes} inodes must be between {} and one per KiB of disk_bytes ({})",
                Self::MIN_INODES,
                bytes / 1024
            )));
        }
        Ok(DiskQuota { bytes, inodes })
    }
}

impl Default for DiskQuota {
    fn default() -> Self {
        DiskQuota {
            bytes: Self::DEFAULT_BYTES,
            inodes: Self::DEFAULT_INODES,
        }
    }
}

/// Inodes ext4 keeps for itself (1 to 10, the root directory among them): not the
/// conversation's.
const RESERVED_INODES: u64 = 10;

/// True when `dir` is a mount point (its device differs from its parent's).
pub(crate) fn is_mounted(dir: &Path) -> bool {
    let (Ok(meta), Some(parent)) = (fs::symlink_metadata(dir), dir.parent()) else {
        return false;
    };
    fs::symlink_metadata(parent).is_ok_and(|p| meta.is_dir() && p.dev() != meta.dev())
}

fn backend(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Backend(format!("{what}: {e}"))
}

/// Runs a tool (`mkfs.ext4`, `mount`, `cp`); its stderr goes into the error.
fn run(tool: &str, args: &[&std::ffi::OsStr]) -> Result<()> {
    let out = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .map_err(|e| {
            Error::RuntimeUnavailable {
                runtime: "isolated".into(),
                reason: format!("cannot run {tool} for the disk quota: {e}"),
                hint: "install e2fsprogs and util-linux (mkfs.ext4, mount), or turn the disk quota off with disk_bytes = 0".into(),
            }
        })?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(Error::Backend(format!(
        "{tool} failed ({}): {}",
        out.status,
        err.trim()
    )))
}

/// Makes a sparse ext4 image of `quota` at `image`, its root owned by `uid`.
fn make_image(image: &Path, quota: DiskQuota, uid: u32) -> Result<()> {
    let _ = fs::remove_file(image);
    let f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(image)
        .map_err(|e| backend("cannot create the workspace's disk image", e))?;
    f.set_len(quota.bytes)
        .map_err(|e| backend("cannot size the workspace's disk image", e))?;
    drop(f);
    // mkfs.ext4 rounds the inodes of each block group to a multiple of 8, down as well as up:
    // 8 more per group make the count at least the quota (and at most 16 per group more). A
    // group is 8 MiB with the 1 KiB blocks of a file system under 512 MiB, else 128 MiB.
    let group: u64 = if quota.bytes < 512 << 20 {
        8 << 20
    } else {
        128 << 20
    };
    let groups = quota.bytes.div_ceil(group);
    let inodes = (quota.inodes + RESERVED_INODES + 8 * groups).to_string();
    let extended = format!("lazy_itable_init=1,lazy_journal_init=1,root_owner={uid}:{uid}");
    let mut args: Vec<&std::ffi::OsStr> = ["-q", "-F", "-t", "ext4", "-m", "0", "-N"]
        .iter()
        .map(std::ffi::OsStr::new)
        .collect();
    args.push(OsStr::new(&inodes));
    args.extend([OsStr::new("-E"), OsStr::new(&extended)]);
    if quota.bytes >= 64 << 20 {
        // A 4 MiB journal rather than mkfs's default (up to 64 MiB) that would come out of
        // the quota.
        args.extend([OsStr::new("-J"), OsStr::new("size=4")]);
    }
    args.push(image.as_os_str());
    run("mkfs.ext4", &args).inspect_err(|_| {
        let _ = fs::remove_file(image);
    })?;
    tag_quota(image, quota);
    Ok(())
}

/// The extended attribute of a disk image naming the quota it was made with.
const QUOTA_XATTR: &str = "user.sessionbox.quota";

fn quota_tag(quota: DiskQuota) -> String {
    format!("{} {}", quota.bytes, quota.inodes)
}

/// Records on `image` the quota it was made with (what [`made_with`] reads). A file system
/// without user extended attributes keeps none: its images are then never cloned.
pub(crate) fn tag_quota(image: &Path, quota: DiskQuota) {
    let _ = rustix::fs::setxattr(
        image,
        QUOTA_XATTR,
        quota_tag(quota).as_bytes(),
        rustix::fs::XattrFlags::empty(),
    );
}

/// True when `image` was made with `quota` (bytes and inodes), as recorded by [`tag_quota`]:
/// only such an image may be cloned for a conversation of `quota`.
pub(crate) fn made_with(image: &Path, quota: DiskQuota) -> bool {
    let mut buf = [0u8; 64];
    match rustix::fs::getxattr(image, QUOTA_XATTR, &mut buf[..]) {
        Ok(n) => buf.get(..n) == Some(quota_tag(quota).as_bytes()),
        Err(_) => false,
    }
}

fn mount(image: &Path, dir: &Path) -> Result<()> {
    run(
        "mount",
        &[
            "-t".as_ref(),
            "ext4".as_ref(),
            "-o".as_ref(),
            "loop,nodev,nosuid,noinit_itable,discard,errors=remount-ro".as_ref(),
            image.as_os_str(),
            dir.as_os_str(),
        ],
    )
}

/// Unmounts the volume at `dir`, detached (see the body).
pub(crate) fn unmount_volume(dir: &Path) -> Result<()> {
    unmount(dir)
}

/// Mounts the existing image `image` at `dir` (made if absent, 0700), as [`ensure_volume`]
/// mounts a workspace, leaving its root as it is in the image.
pub(crate) fn mount_new(image: &Path, dir: &Path) -> Result<()> {
    make_dir(dir)?;
    mount(image, dir)
}

/// `MOUNT_ATTR_IDMAP` (linux/mount.h): the mount's ids are mapped through a user namespace.
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
/// `mount_setattr(2)`'s number, the same on every architecture (the unified table since 5.12).
const SYS_MOUNT_SETATTR: libc::c_long = 442;

/// `struct mount_attr` (linux/mount.h).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A user namespace whose only ids are `from` inside and `to` outside (uid and gid alike),
/// held by a descriptor: what an idmapped mount maps through. Made by a short-lived child
/// (`sleep`) that unshares it; the child is ended once its namespace is held.
fn mapping_namespace(from: u32, to: u32) -> Result<std::os::fd::OwnedFd> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new("sleep");
    cmd.arg("60")
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: the closure runs in the forked child before exec; it makes one raw system call
    // (unshare(2), async-signal-safe) and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWUSER) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| backend("cannot make a user namespace for an idmapped workspace", e))?;
    // The pre-exec hook has run once spawn returns: the child is in its namespace.
    let pid = child.id();
    let held = (|| -> std::io::Result<fs::File> {
        fs::write(format!("/proc/{pid}/uid_map"), format!("{from} {to} 1\n"))?;
        fs::write(format!("/proc/{pid}/gid_map"), format!("{from} {to} 1\n"))?;
        fs::File::open(format!("/proc/{pid}/ns/user"))
    })();
    let _ = child.kill();
    let _ = child.wait();
    held.map(std::os::fd::OwnedFd::from)
        .map_err(|e| backend("cannot map the ids of an idmapped workspace", e))
}

/// Makes the volume mounted at `dir` show what its file system records as `from`'s (files and
/// groups) as `to`'s, and record what `to` creates as `from`'s: the plain mount is replaced by
/// an idmapped one (Linux 5.15 for ext4). A clone keeps its origin's owner on disk and needs
/// no walk over its files: this is what makes a clone of many files cost no more than one of
/// few. Ids other than `from` show as the overflow id (65534) and cannot be written as.
///
/// # Errors
/// [`Error::Backend`] when the kernel refuses a step (the plain mount then stays).
pub(crate) fn idmap_volume(dir: &Path, from: u32, to: u32) -> Result<()> {
    use rustix::mount::{MoveMountFlags, OpenTreeFlags};
    use std::os::fd::AsRawFd;
    let userns = mapping_namespace(from, to)?;
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        dir,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(|e| backend("cannot clone a workspace's mount", e))?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: u64::try_from(userns.as_raw_fd()).unwrap_or(u64::MAX),
    };
    // SAFETY: mount_setattr(2) reads `size_of::<MountAttr>()` bytes from `attr`, a live
    // `#[repr(C)]` struct laid out as the kernel's `struct mount_attr`; the path is an empty
    // C string with AT_EMPTY_PATH, naming `tree`, a descriptor open for the call.
    let r = unsafe {
        libc::syscall(
            SYS_MOUNT_SETATTR,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &raw const attr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r != 0 {
        return Err(backend(
            "cannot idmap a workspace's mount",
            std::io::Error::last_os_error(),
        ));
    }
    unmount(dir)?;
    rustix::mount::move_mount(
        &tree,
        c"",
        rustix::fs::CWD,
        dir,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| backend("cannot mount an idmapped workspace", e))
}

/// The owner the file system at `dir` records for its root (a plain mount shows it as it is).
pub(crate) fn recorded_owner(dir: &Path) -> Result<u32> {
    fs::symlink_metadata(dir)
        .map(|m| m.uid())
        .map_err(|e| backend("cannot inspect a workspace's volume", e))
}

/// Makes a sparse image of `quota` for a layer, its root `owner`'s (a clone of it is mounted
/// idmapped from `owner`).
pub(crate) fn make_layer_image(image: &Path, quota: DiskQuota, owner: u32) -> Result<()> {
    make_image(image, quota, owner)
}

fn unmount(dir: &Path) -> Result<()> {
    // Detached: a sandbox's mount namespace that is still going away may hold it; the loop
    // device goes when the last user does (mount's loop devices clear themselves).
    rustix::mount::unmount(dir, rustix::mount::UnmountFlags::DETACH)
        .map_err(|e| backend(&format!("cannot unmount {}", dir.display()), e))
}

fn make_dir(dir: &Path) -> Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(backend("cannot create the workspace", e)),
    }
}

fn is_empty_dir(dir: &Path) -> Result<bool> {
    Ok(fs::read_dir(dir)
        .map_err(|e| backend("cannot read the workspace", e))?
        .next()
        .is_none())
}

/// After a fresh mount: the root is the workspace (0700), without `lost+found`.
pub(crate) fn settle_root(dir: &Path) -> Result<()> {
    let _ = fs::remove_dir(dir.join("lost+found"));
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| backend("cannot set up the workspace", e))
}

/// Makes sure the workspace `dir` is the mounted volume `image` of `quota`, owned by `uid`:
/// mounted already (nothing to do), mounted again (after a reboot), made (a new conversation),
/// or migrated (a plain directory from before quotas). The caller holds the conversation's lock.
///
/// # Errors
/// [`Error::TooLarge`] when a workspace to migrate holds more than the quota (it is left as it
/// was); [`Error::RuntimeUnavailable`] when `mkfs.ext4` or `mount` is missing;
/// [`Error::Backend`] when a step fails.
pub(crate) fn ensure_volume(dir: &Path, image: &Path, quota: DiskQuota, uid: u32) -> Result<()> {
    if is_mounted(dir) {
        // A process that died between freezing it for a clone and thawing it would leave
        // every write of the conversation waiting.
        super::clone::thaw_if_frozen(dir);
        return Ok(());
    }
    if image.exists() {
        make_dir(dir)?;
        if !is_empty_dir(dir)? {
            return Err(Error::Conflict(format!(
                "the workspace {} holds files outside its disk volume {}; move them away, then retry",
                dir.display(),
                image.display()
            )));
        }
        mount(image, dir)?;
        // A clone keeps its origin's owner on disk: shown as this conversation's again.
        let owner = recorded_owner(dir)?;
        if owner != uid
            && rustix::process::geteuid().is_root()
            && let Err(e) = idmap_volume(dir, owner, uid)
        {
            let _ = unmount(dir);
            return Err(e);
        }
        return Ok(());
    }
    let legacy = fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) && !is_empty_dir(dir)?;
    let tmp = image.with_extension("img.tmp");
    make_image(&tmp, quota, uid)?;
    if legacy {
        migrate(dir, &tmp, quota)?;
    }
    fs::rename(&tmp, image).map_err(|e| backend("cannot keep the workspace's disk image", e))?;
    make_dir(dir)?;
    mount(image, dir)?;
    settle_root(dir)
}

/// Copies the plain directory `dir` into the new image `tmp` and leaves `dir` empty for the
/// mount. On failure the image goes and `dir` stays as it was.
fn migrate(dir: &Path, tmp: &Path, quota: DiskQuota) -> Result<()> {
    let staging = tmp.with_extension("migrate");
    make_dir(&staging)?;
    let copied = mount(tmp, &staging).and_then(|()| {
        settle_root(&staging)?;
        let mut from = dir.as_os_str().to_owned();
        from.push("/.");
        run(
            "cp",
            &["-a".as_ref(), from.as_os_str(), staging.as_os_str()],
        )
        .map_err(|e| match e {
            Error::Backend(m) if m.contains("No space left") => Error::TooLarge {
                what: format!(
                    "the workspace {} (made before disk quotas; left as it was: delete files or raise disk_bytes above {} bytes, disk_inodes above {})",
                    dir.display(),
                    quota.bytes,
                    quota.inodes
                ),
                limit: u64::MAX,
            },
            e => e,
        })
    });
    if is_mounted(&staging) {
        let _ = unmount(&staging);
    }
    let _ = fs::remove_dir(&staging);
    if let Err(e) = copied {
        let _ = fs::remove_file(tmp);
        return Err(e);
    }
    // The copy is complete: the old files go, the directory stays as the mount point.
    for entry in fs::read_dir(dir).map_err(|e| backend("cannot read the workspace", e))? {
        let path = entry
            .map_err(|e| backend("cannot read the workspace", e))?
            .path();
        sessionbox_fs::remove_tree(&path)
            .map_err(|e| backend("cannot remove a migrated file", e))?;
    }
    tracing::info!(
        "migrated the workspace {} into its disk volume",
        dir.display()
    );
    Ok(())
}

/// Unmounts and removes the volume of the workspace `dir` (its image `image`); true when there
/// was one. The mount point itself is left for the caller to remove.
pub(crate) fn remove_volume(dir: &Path, image: &Path) -> Result<bool> {
    let mounted = is_mounted(dir);
    if mounted {
        unmount(dir)?;
    }
    let had_image = match fs::remove_file(image) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(backend("cannot remove the workspace's disk image", e)),
    };
    let _ = fs::remove_file(image.with_extension("img.tmp"));
    Ok(mounted || had_image)
}

/// What the mounted volume at `dir` holds and allows, as the kernel counts it; `None` when it
/// is not mounted.
pub(crate) fn usage(dir: &Path) -> Option<DiskUsage> {
    if !is_mounted(dir) {
        return None;
    }
    let s = rustix::fs::statvfs(dir).ok()?;
    let block = s.f_frsize;
    Some(DiskUsage {
        bytes_used: s.f_blocks.saturating_sub(s.f_bfree) * block,
        bytes_limit: s.f_blocks * block,
        inodes_used: s.f_files.saturating_sub(s.f_ffree + RESERVED_INODES),
        inodes_limit: s.f_files.saturating_sub(RESERVED_INODES),
    })
}

/// Checks that a disk quota can be made here: makes, mounts, writes past and removes a 16 MiB
/// volume under `scratch`. `Ok` with what held, `Err` with why not.
pub fn probe(scratch: &Path) -> std::result::Result<String, String> {
    if !rustix::process::geteuid().is_root() {
        return Err("not root: no volume can be mounted, workspaces share the data directory's file system (only 1 GiB per file holds)".into());
    }
    let dir = scratch.join(format!("disk-probe-{}", std::process::id()));
    let image = dir.with_extension("img");
    let quota = DiskQuota::new(DiskQuota::MIN_BYTES, 256).map_err(|e| e.to_string())?;
    let result = (|| -> Result<String> {
        make_image(&image, quota, 0)?;
        make_dir(&dir)?;
        mount(&image, &dir)?;
        settle_root(&dir)?;
        let big = vec![0u8; (DiskQuota::MIN_BYTES + (1 << 20)) as usize];
        let refused = fs::write(dir.join("fill"), &big).is_err_and(|e| {
            e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT)
        });
        if !refused {
            return Err(Error::Backend(
                "a write past a 16 MiB volume was not refused".into(),
            ));
        }
        Ok("a loop-mounted ext4 volume per conversation (bytes and inodes); a write past a test volume failed with ENOSPC".into())
    })();
    let _ = remove_volume(&dir, &image);
    let _ = fs::remove_dir(&dir);
    result.map_err(|e| e.to_string())
}

/// The path of the image of the workspace `workspace` in `disks`.
pub(crate) fn image_path(disks: &Path, key: &str) -> PathBuf {
    disks.join(format!("{key}.img"))
}
