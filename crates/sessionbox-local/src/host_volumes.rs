//! Disk volumes on this host for sandboxes that run elsewhere on it: the `opensandbox` runtime's
//! disk quota when sessionbox and the Docker engine under the OpenSandbox server share a host.
//!
//! Each conversation gets the same kind of volume as an `isolated` workspace (a sparse ext4
//! image loop-mounted, see `isolated/disk.rs`): `<dir>/<key>.img` mounted at `<dir>/<key>`,
//! holding `workspace/` (owned by the sandbox user) and `tmp/` (1777). The runtime binds the
//! two into the sandbox at `/workspace` and `/tmp` through the create request's host volumes,
//! so every write there, by a command or by the agent, is counted by the kernel against the
//! conversation's bytes and inodes, and a write past them fails with `ENOSPC`. The server must
//! allow `<dir>` (`[storage] allowed_host_paths`); `scripts/opensandbox-up` does.
//!
//! A step runs under an exclusive `flock` of `<dir>/<key>.lock`, so concurrent opens of one
//! conversation (in this process or another) never make or mount a volume twice. A volume
//! outlives its sandbox (a sandbox that vanished is replaced with the files still there) until
//! [`HostVolumes::remove`] (the conversation's destroy).

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sessionbox_core::{ConversationKey, DiskUsage, Error, Result};

use crate::isolated::DiskQuota;
use crate::isolated::disk;

/// The volumes of one installation, in one host directory.
#[derive(Debug, Clone)]
pub struct HostVolumes {
    dir: PathBuf,
    quota: DiskQuota,
    uid: u32,
}

/// What [`HostVolumes::prepare`] made ready: the host directories to bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedVolume {
    /// Bind at `/workspace`.
    pub workspace: PathBuf,
    /// Bind at `/tmp`.
    pub tmp: PathBuf,
}

impl HostVolumes {
    /// Volumes of `quota` in `dir` (absolute; made 0700 when missing), their `workspace/`
    /// owned by `uid` (the sandbox's user).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a relative `dir`.
    pub fn new(dir: PathBuf, quota: DiskQuota, uid: u32) -> Result<Self> {
        if !dir.is_absolute() {
            return Err(Error::InvalidRequest(format!(
                "the volume directory {} must be an absolute path",
                dir.display()
            )));
        }
        Ok(HostVolumes { dir, quota, uid })
    }

    /// The directory the volumes live in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn paths(&self, key: &ConversationKey) -> (PathBuf, PathBuf, PathBuf) {
        let mount = self.dir.join(key.as_str());
        (
            disk::image_path(&self.dir, key.as_str()),
            mount,
            self.dir.join(format!("{}.lock", key.as_str())),
        )
    }

    fn locked<T>(&self, key: &ConversationKey, f: impl FnOnce() -> Result<T>) -> Result<T> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| Error::Backend(format!("cannot make {}: {e}", self.dir.display())))?;
        let (_, _, lock) = self.paths(key);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock)
            .map_err(|e| Error::Backend(format!("cannot open {}: {e}", lock.display())))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| Error::Backend(format!("cannot lock {}: {e}", lock.display())))?;
        f()
    }

    /// Makes (when absent) and mounts (when not mounted) the conversation's volume, with its
    /// `workspace/` and `tmp/`. Blocking (`mkfs.ext4` and `mount`, about 70-100 ms the first
    /// time); idempotent.
    ///
    /// # Errors
    /// [`Error::RuntimeUnavailable`] without root, `mkfs.ext4` or loop devices;
    /// [`Error::Backend`] when a step fails.
    pub fn prepare(&self, key: &ConversationKey) -> Result<PreparedVolume> {
        if !rustix::process::geteuid().is_root() {
            return Err(Error::RuntimeUnavailable {
                runtime: "opensandbox".into(),
                reason: "a disk quota needs a loop-mounted volume, which only root can mount"
                    .into(),
                hint: "run sessionbox as root on the Docker host, or leave [opensandbox] \
                       disk_bytes unset (then the disk is not limited)"
                    .into(),
            });
        }
        self.locked(key, || {
            let (image, mount, _) = self.paths(key);
            disk::ensure_volume(&mount, &image, self.quota, 0)?;
            // The volume's root stays root's; the sandbox user gets `workspace/`, everyone
            // `tmp/` (sticky), as a root file system has them.
            fs::set_permissions(&mount, fs::Permissions::from_mode(0o755))
                .map_err(|e| Error::Backend(format!("cannot set up the volume: {e}")))?;
            let workspace = mount.join("workspace");
            let tmp = mount.join("tmp");
            for (d, mode) in [(&workspace, 0o755), (&tmp, 0o1777)] {
                match fs::create_dir(d) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(Error::Backend(format!("cannot set up the volume: {e}"))),
                }
                fs::set_permissions(d, fs::Permissions::from_mode(mode))
                    .map_err(|e| Error::Backend(format!("cannot set up the volume: {e}")))?;
            }
            let uid = rustix::fs::Uid::from_raw(self.uid);
            let gid = rustix::fs::Gid::from_raw(self.uid);
            rustix::fs::chown(&workspace, Some(uid), Some(gid))
                .map_err(|e| Error::Backend(format!("cannot set up the volume: {e}")))?;
            Ok(PreparedVolume { workspace, tmp })
        })
    }

    /// Unmounts and removes the conversation's volume; true when there was one.
    ///
    /// # Errors
    /// [`Error::Backend`] when the unmount or the removal fails (a sandbox still using the
    /// volume does not stop it: its own mount keeps the file system until it ends).
    pub fn remove(&self, key: &ConversationKey) -> Result<bool> {
        if !self.dir.exists() {
            return Ok(false);
        }
        self.locked(key, || {
            let (image, mount, lock) = self.paths(key);
            let had = disk::remove_volume(&mount, &image)?;
            let _ = fs::remove_dir(&mount);
            let _ = fs::remove_file(&lock);
            Ok(had)
        })
    }

    /// What the conversation's volume holds and allows; `None` when it is not mounted.
    pub fn usage(&self, key: &ConversationKey) -> Option<DiskUsage> {
        disk::usage(&self.dir.join(key.as_str()))
    }
}
