//! Workspace clones: a fork or a template start made at the level of the workspace's disk
//! image instead of an archive streamed file by file.
//!
//! A workspace with a disk quota is an ext4 image (`disk`); a clone is a copy of such an
//! image, mounted as the new conversation's volume. Its source is either a live conversation's
//! image, frozen (`FIFREEZE`) while its blocks are copied so the copy is one consistent state,
//! or a *layer*: a snapshot laid out once as an image under `layers/<name>.img` (the manager
//! names layers after snapshot ids), made by restoring the snapshot's archive into a fresh
//! volume and giving every file to `nobody` (65534).
//!
//! The copy is a reflink (`FICLONE`) where the data directory's file system has them (XFS,
//! btrfs): milliseconds, and no space until either side writes. Elsewhere (ext4) only the
//! image's data extents are copied (`SEEK_DATA`/`SEEK_HOLE` and `copy_file_range`), in the
//! kernel: the holes stay holes, and the loop device's setup writes the copy out.
//!
//! No file of a clone is changed: its file system keeps recording its origin's owner, and the
//! volume is mounted *idmapped* (`mount_setattr(MOUNT_ATTR_IDMAP)`) from that owner to the new
//! conversation's uid, so its sandbox sees every file as its own and what it creates is
//! recorded as the same owner. A volume whose root's recorded owner is not its conversation's
//! uid is mounted that way again after a reboot (`disk::ensure_volume`). Measured on this
//! project's machine (ext4 host, 10,000 files of 10 KiB, 125 MiB of image): copy 44 ms,
//! loop setup and mount 80 ms (mostly writing the copy out); re-owning every file instead
//! took 140 ms more. On XFS the copy took 3 ms.
//!
//! Why not overlayfs: a lower layer shared by conversations would need the same idmapping
//! per conversation, its copied-up files would count against the volume only once written,
//! and a fork of a live conversation would still need a frozen copy of its upper layer. An
//! image copy keeps one rule for every workspace: a volume of its own, the quota enforced by
//! the kernel, removed whole on destroy.
//!
//! Only images of the configured quota are cloned: a workspace made under another quota (or
//! an image of another size) answers `None` and the caller uses an archive, so a clone never
//! carries an old limit into a new conversation.

use std::fs::{self, File};
use std::os::fd::AsFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use sessionbox_core::{ArchiveStats, ConversationKey, Error, Result, WorkspaceClones};

use super::disk;
use super::launch::lock_file;
use super::{IsolatedRuntime, blocking};
use crate::host::create_private_dir_all;

/// Layers kept at most: making one more removes the least recently used. Each is at most one
/// workspace's disk quota, so layers take at most this many quotas of the host's disk.
pub(crate) const MAX_LAYERS: usize = 16;

/// The owner a layer's file system records for every file (restored as root, then given to
/// it once): `nobody`, so that no image ever holds files of root's. A clone of a layer is
/// mounted idmapped from it to its conversation's uid.
const LAYER_OWNER: u32 = 65534;

/// A temporary file or mount point of an interrupted layer build is removed after this.
const STALE_BUILD: Duration = Duration::from_secs(600);

/// `FIFREEZE`, `_IOWR('X', 119, int)` (linux/fs.h): holds every write to a file system and
/// flushes it to its device.
const FIFREEZE: libc::c_ulong = 0xC004_5877;
/// `FITHAW`, `_IOWR('X', 120, int)`: releases a frozen file system.
const FITHAW: libc::c_ulong = 0xC004_5878;

fn backend(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Backend(format!("{what}: {e}"))
}

/// A frozen file system, thawed when dropped.
struct Frozen(File);

impl Frozen {
    /// Freezes the file system mounted at `dir`.
    fn new(dir: &Path) -> Result<Frozen> {
        let f = File::open(dir).map_err(|e| backend("cannot open a workspace to freeze", e))?;
        ioctl_int(&f, FIFREEZE).map_err(|e| backend("cannot freeze the workspace", e))?;
        Ok(Frozen(f))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Err(e) = ioctl_int(&self.0, FITHAW) {
            tracing::error!("cannot thaw a frozen workspace: {e}");
        }
    }
}

/// How long the processes of a conversation being cloned may take to stop.
const STOP_DEADLINE: Duration = Duration::from_secs(5);

/// The name, in a conversation's run directory, of the record of its processes stopped for
/// a clone: read back by [`recover_pause`] after a crash.
const PAUSED: &str = "paused";

/// The processes of a sandbox stopped (`SIGSTOP`) so its file system can be frozen:
/// continued (`SIGCONT`) when dropped, and the record of them removed.
///
/// Why stop them first: `FIFREEZE` waits for every write in progress, and a process can hold
/// one open as long as it likes (a `splice` from an empty pipe into a workspace file). A
/// stopped process is out of every system call that waits: a signal ends the wait, and the
/// call is restarted once it continues.
struct Paused {
    run: PathBuf,
    pids: Vec<u32>,
}

impl Paused {
    /// Stops every process of the sandbox recorded in `run` and waits until each is stopped
    /// (or gone). `Ok(None)` when they did not all stop within [`STOP_DEADLINE`] (one waiting
    /// in the kernel on a device): they are continued, and the caller does not freeze.
    fn new(run: &Path) -> Result<Option<Paused>> {
        let mut paused = Paused {
            run: run.to_path_buf(),
            pids: Vec::new(),
        };
        let Some(record) = super::launch::read_record(run) else {
            return Ok(Some(paused));
        };
        let deadline = std::time::Instant::now() + STOP_DEADLINE;
        loop {
            let fresh: Vec<u32> = record
                .processes()
                .into_iter()
                .filter(|&p| p > 1 && p != std::process::id() && !paused.pids.contains(&p))
                .collect();
            if !fresh.is_empty() {
                paused.pids.extend(&fresh);
                // Recorded before they are stopped: a crash from here on is recovered.
                let list: Vec<String> = paused.pids.iter().map(u32::to_string).collect();
                super::launch::write_atomic(&run.join(PAUSED), list.join("\n").as_bytes())?;
                for p in fresh {
                    signal(p, rustix::process::Signal::STOP);
                }
            } else if paused.pids.iter().all(|&p| stopped_or_gone(p)) {
                return Ok(Some(paused));
            }
            if std::time::Instant::now() > deadline {
                tracing::warn!(
                    "the processes of {} did not stop within {STOP_DEADLINE:?}: no clone",
                    run.display()
                );
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        for &p in &self.pids {
            signal(p, rustix::process::Signal::CONT);
        }
        let _ = fs::remove_file(self.run.join(PAUSED));
    }
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// True when process `pid` is stopped, traced, a zombie or gone (`/proc/<pid>/stat`'s state).
fn stopped_or_gone(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // The state follows the command name, which is in parentheses and may hold anything.
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    matches!(state, Some('T' | 't' | 'Z' | 'X') | None)
}

/// Undoes what a clone that died left of its origin `run` / `workspace` (its process was
/// killed between stopping the origin and continuing it): thaws the volume and continues the
/// processes it recorded that are still the sandbox's. The caller holds the conversation's
/// run-directory lock (a clone in progress holds it too, so it is never undone here).
pub(crate) fn recover_pause(run: &Path, workspace: &Path) {
    let Ok(list) = fs::read_to_string(run.join(PAUSED)) else {
        return;
    };
    thaw_if_frozen(workspace);
    let ours = super::launch::read_record(run)
        .map(|r| r.processes())
        .unwrap_or_default();
    for p in list.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
        if ours.contains(&p) {
            signal(p, rustix::process::Signal::CONT);
        }
    }
    let _ = fs::remove_file(run.join(PAUSED));
    tracing::warn!(
        "{}: undid the pause of a clone that did not finish",
        run.display()
    );
}

/// Thaws the file system at `dir` if it was left frozen (by a process that died between its
/// freeze and its thaw); nothing otherwise.
pub(crate) fn thaw_if_frozen(dir: &Path) {
    if let Ok(f) = File::open(dir) {
        // EINVAL when it is not frozen: that is the usual answer.
        let _ = ioctl_int(&f, FITHAW);
    }
}

/// `ioctl(fd, request, 0)` for the freeze requests, which take an int argument they ignore.
fn ioctl_int(f: &File, request: libc::c_ulong) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut arg: libc::c_int = 0;
    // SAFETY: `f` is an open descriptor for the call's duration; FIFREEZE and FITHAW read no
    // memory through the argument, and `arg` is a valid int that outlives the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), request, &mut arg) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// How [`copy_image`] copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Copied {
    Reflink,
    Extents,
}

/// Copies the image open as `src` to the new file `to` (0600): a reflink where the file
/// system can, else its data extents only (holes stay holes).
fn copy_image(src: &File, to: &Path) -> Result<Copied> {
    let dst = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(|e| backend("cannot create a cloned disk image", e))?;
    if rustix::fs::ioctl_ficlone(&dst, src).is_ok() {
        return Ok(Copied::Reflink);
    }
    let len = src
        .metadata()
        .map_err(|e| backend("cannot read a disk image", e))?
        .len();
    dst.set_len(len)
        .map_err(|e| backend("cannot size a cloned disk image", e))?;
    let mut pos = 0u64;
    while pos < len {
        let start = match rustix::fs::seek(src, rustix::fs::SeekFrom::Data(pos)) {
            Ok(p) => p,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(backend("cannot read a disk image's extents", e)),
        };
        let end = rustix::fs::seek(src, rustix::fs::SeekFrom::Hole(start))
            .map_err(|e| backend("cannot read a disk image's extents", e))?
            .min(len);
        let (mut off_in, mut off_out) = (start, start);
        while off_in < end {
            let want = usize::try_from(end - off_in).unwrap_or(usize::MAX);
            let n = rustix::fs::copy_file_range(
                src.as_fd(),
                Some(&mut off_in),
                dst.as_fd(),
                Some(&mut off_out),
                want,
            )
            .map_err(|e| backend("cannot copy a disk image", e))?;
            if n == 0 {
                return Err(Error::Backend(
                    "a disk image ended while it was copied".into(),
                ));
            }
        }
        pos = end;
    }
    Ok(Copied::Extents)
}

/// Counts what `root` holds, changing nothing.
fn count(root: &Path) -> Result<ArchiveStats> {
    walk(root, None)
}

/// Counts what `root` holds and, with `Some(uid)`, gives every entry to `uid`, never
/// following a link. Each directory is opened once and its entries read and changed relative
/// to it (no path walked per file). One directory is open at a time: the walk goes down with
/// `openat(name)` and back up with `openat("..")` (nothing else changes the tree meanwhile),
/// keeping only the names still to visit of each directory above, so its memory is bounded by
/// the names the volume holds, not by their paths.
fn walk(root: &Path, reown_to: Option<u32>) -> Result<ArchiveStats> {
    // Only counting is used now (layers are written as their owner); re-owning stays for a
    // volume whose files must change owner on disk.
    use rustix::fs::{AtFlags, FileType, Mode, OFlags};
    let fail = |what: &str, e: rustix::io::Errno| backend(what, std::io::Error::from(e));
    let (owner, group) = (
        reown_to.map(rustix::fs::Uid::from_raw),
        reown_to.map(rustix::fs::Gid::from_raw),
    );
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    // The entries of the directory open as `fd`, but `.` and `..`.
    let entries = |fd: &std::os::fd::OwnedFd| -> Result<Vec<(std::ffi::CString, FileType)>> {
        let mut dir = rustix::fs::Dir::read_from(fd).map_err(|e| fail("cannot read a clone", e))?;
        let mut v = Vec::new();
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(|e| fail("cannot read a clone", e))?;
            let name = entry.file_name();
            if name.to_bytes() != b"." && name.to_bytes() != b".." {
                v.push((name.to_owned(), entry.file_type()));
            }
        }
        Ok(v)
    };
    let mut cur = rustix::fs::open(root, dir_flags, Mode::empty())
        .map_err(|e| fail("cannot open a clone", e))?;
    if reown_to.is_some() {
        rustix::fs::fchown(&cur, owner, group).map_err(|e| fail("cannot re-own a clone", e))?;
    }
    let mut stats = ArchiveStats::default();
    let mut levels = vec![entries(&cur)?];
    while let Some(level) = levels.last_mut() {
        let Some((name, kind)) = level.pop() else {
            levels.pop();
            if !levels.is_empty() {
                cur = rustix::fs::openat(&cur, c"..", dir_flags, Mode::empty())
                    .map_err(|e| fail("cannot walk a clone", e))?;
            }
            continue;
        };
        if reown_to.is_some() {
            rustix::fs::chownat(&cur, &name, owner, group, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| fail("cannot re-own a clone", e))?;
        }
        let kind = match kind {
            FileType::Unknown => {
                let st = rustix::fs::statat(&cur, &name, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| fail("cannot read a clone", e))?;
                FileType::from_raw_mode(st.st_mode)
            }
            known => known,
        };
        match kind {
            FileType::Directory => {
                stats.directories += 1;
                cur = rustix::fs::openat(&cur, &name, dir_flags, Mode::empty())
                    .map_err(|e| fail("cannot open a directory of a clone", e))?;
                levels.push(entries(&cur)?);
            }
            FileType::RegularFile => {
                stats.files += 1;
                let st = rustix::fs::statat(&cur, &name, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| fail("cannot read a clone", e))?;
                stats.bytes += u64::try_from(st.st_size).unwrap_or(0);
            }
            FileType::Symlink => stats.links += 1,
            _ => stats.skipped += 1,
        }
    }
    Ok(stats)
}

/// A layer's name: 1 to 64 ASCII letters, digits, `-` or `_`.
fn check_layer_name(layer: &str) -> Result<()> {
    let ok = !layer.is_empty()
        && layer.len() <= 64
        && layer
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidRequest(format!(
            "a layer name is 1 to 64 ASCII letters, digits, '-' or '_', not {layer:?}"
        )))
    }
}

fn age(path: &Path) -> Option<Duration> {
    fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
}

/// Restores the plain tar `archive` into the directory open as `root`, with the file system
/// ids of `owner` (a thread of its own, whose `setfsuid`/`setfsgid` drop the capabilities
/// that override file permissions): every file is made as `owner`'s, and the restore can
/// write nowhere `owner` could not, though this process is root.
fn restore_as(
    owner: u32,
    root: &File,
    mut archive: File,
    limits: sessionbox_core::Limits,
) -> Result<ArchiveStats> {
    use std::os::fd::AsRawFd;
    // Reached through the descriptor: `owner` may not search the data directory above it.
    let path = PathBuf::from(format!("/proc/self/fd/{}", root.as_raw_fd()));
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                // SAFETY: setfsgid(2) and setfsuid(2) change only this thread's file system
                // ids (the thread ends with this closure); they take plain integers.
                unsafe {
                    libc::setfsgid(owner);
                    libc::setfsuid(owner);
                }
                sessionbox_fs::Workspace::open(&path, "/layer", limits)
                    .and_then(|ws| ws.restore(&mut archive))
            })
            .join()
            .unwrap_or_else(|_| Err(Error::Backend("a layer's restore panicked".into())))
    })
}

impl IsolatedRuntime {
    fn layers_dir(&self) -> PathBuf {
        self.config.data_dir.join("layers")
    }

    fn layer_image(&self, layer: &str) -> PathBuf {
        self.layers_dir().join(format!("{layer}.img"))
    }

    /// True when clones can be made here: workspaces are volumes (a disk quota, as root).
    fn clones_apply(&self) -> bool {
        self.disk_quota_applies()
    }

    /// The uid `to` runs as (the store allocates it on first use).
    async fn uid_of(&self, to: &ConversationKey) -> Result<u32> {
        self.directory
            .sandbox_uid(to, self.config.uids.clone())
            .await
    }

    /// Makes `to`'s volume a copy of the image `source` (the live workspace `frozen` is
    /// frozen meanwhile) and mounts it as `uid`'s: idmapped from the owner its file system
    /// records (no file is changed). Counts what it holds with `count_files`, else returns
    /// empty counts. `None` when `source` is absent or not an image of the configured quota.
    /// Blocks; takes `to`'s run-directory lock.
    fn clone_into(
        &self,
        source: &Path,
        frozen: Option<&Path>,
        to: &ConversationKey,
        uid: u32,
        count_files: bool,
    ) -> Result<Option<ArchiveStats>> {
        let Some(quota) = self.config.disk else {
            return Ok(None);
        };
        let src = match File::open(source) {
            Ok(f) => f,
            // Removed meanwhile (a layer evicted): the caller uses an archive.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(backend("cannot open a disk image to clone", e)),
        };
        if !disk::made_with(source, quota) {
            return Ok(None);
        }
        let run = self.run_dir(to);
        create_private_dir_all(&run)?;
        let _lock = lock_file(&run.join("lock"))?;
        let (workspace, image) = (self.workspace_dir(to), self.disk_image(to));
        let occupied = fs::symlink_metadata(&workspace).is_ok_and(|m| {
            !m.is_dir() || fs::read_dir(&workspace).is_ok_and(|mut d| d.next().is_some())
        });
        if image.exists() || disk::is_mounted(&workspace) || occupied {
            return Err(Error::Conflict(format!(
                "conversation {} has a workspace already: a clone makes a new one",
                to.short()
            )));
        }
        let tmp = image.with_extension("img.tmp");
        let _ = fs::remove_file(&tmp);
        let started = std::time::Instant::now();
        let copied = {
            let _frozen = frozen.map(Frozen::new).transpose()?;
            copy_image(&src, &tmp)
        };
        let made = copied.and_then(|how| {
            let copy = started.elapsed();
            disk::tag_quota(&tmp, quota);
            fs::rename(&tmp, &image).map_err(|e| backend("cannot keep a cloned disk image", e))?;
            disk::mount_new(&image, &workspace)?;
            let owner = disk::recorded_owner(&workspace)?;
            if owner != uid {
                disk::idmap_volume(&workspace, owner, uid)?;
            }
            // As every workspace's root (a live origin's may have been opened up).
            fs::set_permissions(&workspace, fs::Permissions::from_mode(0o700))
                .map_err(|e| backend("cannot set up a cloned workspace", e))?;
            let mount = started.elapsed();
            let stats = match count_files {
                true => count(&workspace)?,
                false => ArchiveStats::default(),
            };
            tracing::debug!(
                ?how,
                to = to.short(),
                copy_ms = copy.as_millis(),
                mount_ms = (mount - copy).as_millis(),
                count_ms = (started.elapsed() - mount).as_millis(),
                "cloned a workspace"
            );
            Ok(stats)
        });
        match made {
            Ok(stats) => Ok(Some(stats)),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                let _ = disk::remove_volume(&workspace, &image);
                let _ = fs::remove_dir(&workspace);
                Err(e)
            }
        }
    }

    /// Clones the live conversation `from` into `to`: under `from`'s run-directory lock, its
    /// processes stopped and its volume frozen while the image is copied. `None` when its
    /// processes would not stop. Blocks.
    fn clone_live(
        &self,
        from: &ConversationKey,
        to: &ConversationKey,
        uid: u32,
    ) -> Result<Option<ArchiveStats>> {
        let (run, origin) = (self.run_dir(from), self.workspace_dir(from));
        let _lock = lock_file(&run.join("lock"))?;
        recover_pause(&run, &origin);
        let Some(paused) = Paused::new(&run)? else {
            return Ok(None);
        };
        let r = self.clone_into(&self.disk_image(from), Some(&origin), to, uid, true);
        drop(paused);
        r
    }

    /// Builds layer `layer` from `tar`. Blocks.
    fn build_layer(&self, layer: &str, tar: &Path) -> Result<bool> {
        let Some(quota) = self.config.disk else {
            return Ok(false);
        };
        let dir = self.layers_dir();
        create_private_dir_all(&dir)?;
        self.sweep_layer_builds(&dir);
        let nonce = super::pool::random_hex()?;
        let tmp = dir.join(format!(".{layer}.{nonce}.img.tmp"));
        let staging = dir.join(format!(".{layer}.{nonce}.mnt"));
        let built = (|| -> Result<()> {
            disk::make_layer_image(&tmp, quota, LAYER_OWNER)?;
            disk::mount_new(&tmp, &staging)?;
            disk::settle_root(&staging)?;
            let archive = File::open(tar).map_err(|e| backend("cannot open an archive", e))?;
            let root = File::open(&staging).map_err(|e| backend("cannot open a layer", e))?;
            let restored = restore_as(LAYER_OWNER, &root, archive, self.config.limits);
            // The files reach the image before it is unmounted (a sandbox starting meanwhile
            // may hold a copy of this mount a moment longer).
            let _ = rustix::fs::syncfs(&root);
            drop(root);
            let unmounted = disk::unmount_volume(&staging);
            restored?;
            unmounted?;
            fs::rename(&tmp, self.layer_image(layer)).map_err(|e| backend("cannot keep a layer", e))
        })();
        if disk::is_mounted(&staging) {
            let _ = disk::unmount_volume(&staging);
        }
        let _ = fs::remove_dir(&staging);
        let _ = fs::remove_file(&tmp);
        built?;
        self.evict_layers(&dir);
        Ok(true)
    }

    /// Removes what interrupted layer builds left (older than [`STALE_BUILD`]).
    fn sweep_layer_builds(&self, dir: &Path) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') || age(&path).is_none_or(|a| a < STALE_BUILD) {
                continue;
            }
            if name.ends_with(".mnt") {
                if disk::is_mounted(&path) {
                    let _ = disk::unmount_volume(&path);
                }
                let _ = fs::remove_dir(&path);
            } else if name.ends_with(".img.tmp") {
                let _ = fs::remove_file(&path);
            }
        }
    }

    /// Keeps the [`MAX_LAYERS`] most recently used layers.
    fn evict_layers(&self, dir: &Path) {
        let mut layers: Vec<(SystemTime, PathBuf)> = match fs::read_dir(dir) {
            Ok(entries) => entries
                .flatten()
                .filter(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    !n.starts_with('.') && n.ends_with(".img")
                })
                .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
                .collect(),
            Err(_) => return,
        };
        if layers.len() <= MAX_LAYERS {
            return;
        }
        layers.sort();
        let surplus = layers.len() - MAX_LAYERS;
        for (_, path) in layers.into_iter().take(surplus) {
            if let Err(e) = fs::remove_file(&path) {
                tracing::warn!("cannot remove the layer {}: {e}", path.display());
            }
        }
    }
}

#[async_trait]
impl WorkspaceClones for IsolatedRuntime {
    fn mechanism(&self) -> String {
        let dir = self.layers_dir();
        let probe = (|| -> std::io::Result<bool> {
            create_private_dir_all(&dir).map_err(std::io::Error::other)?;
            let a = dir.join(format!(".probe-{}.a", std::process::id()));
            let b = a.with_extension("b");
            fs::write(&a, b"x")?;
            let src = File::open(&a)?;
            let dst = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&b)?;
            let reflink = rustix::fs::ioctl_ficlone(&dst, &src).is_ok();
            let _ = fs::remove_file(&a);
            let _ = fs::remove_file(&b);
            Ok(reflink)
        })();
        match probe {
            Ok(true) => "reflink: a clone shares its origin's blocks until either writes".into(),
            _ => "copy: the data directory's file system has no reflinks, so a clone copies the image's data extents (XFS or btrfs would share them)".into(),
        }
    }

    async fn clone_conversation(
        &self,
        from: &ConversationKey,
        to: &ConversationKey,
    ) -> Result<Option<ArchiveStats>> {
        let source = self.disk_image(from);
        let cloneable = self.clones_apply()
            && disk::is_mounted(&self.workspace_dir(from))
            && self
                .config
                .disk
                .is_some_and(|q| disk::made_with(&source, q));
        if !cloneable {
            return Ok(None);
        }
        let uid = self.uid_of(to).await?;
        let (this, from, to) = (self.clone(), from.clone(), to.clone());
        blocking(move || this.clone_live(&from, &to, uid)).await
    }

    async fn clone_layer(&self, layer: &str, to: &ConversationKey) -> Result<bool> {
        check_layer_name(layer)?;
        let source = self.layer_image(layer);
        let cloneable = self.clones_apply()
            && self
                .config
                .disk
                .is_some_and(|q| disk::made_with(&source, q));
        if !cloneable {
            return Ok(false);
        }
        let uid = self.uid_of(to).await?;
        let (this, to) = (self.clone(), to.clone());
        blocking(move || {
            // Used now: the last to be evicted.
            if let Ok(f) = File::options().write(true).open(&source) {
                let _ = f.set_modified(SystemTime::now());
            }
            this.clone_into(&source, None, &to, uid, false)
                .map(|c| c.is_some())
        })
        .await
    }

    async fn make_layer(&self, layer: &str, tar: &Path) -> Result<bool> {
        check_layer_name(layer)?;
        if !self.clones_apply() {
            return Ok(false);
        }
        let (this, layer, tar) = (self.clone(), layer.to_owned(), tar.to_path_buf());
        blocking(move || this.build_layer(&layer, &tar)).await
    }

    async fn layers(&self) -> Result<Vec<String>> {
        let dir = self.layers_dir();
        let this = self.clone();
        blocking(move || {
            this.sweep_layer_builds(&dir);
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(backend("cannot list the layers", e)),
            };
            let mut names: Vec<String> = entries
                .flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    let layer = n.strip_suffix(".img")?;
                    (!n.starts_with('.')).then(|| layer.to_owned())
                })
                .collect();
            names.sort();
            Ok(names)
        })
        .await
    }

    async fn remove_layer(&self, layer: &str) -> Result<bool> {
        check_layer_name(layer)?;
        let path = self.layer_image(layer);
        blocking(move || match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(backend("cannot remove a layer", e)),
        })
        .await
    }
}

#[cfg(test)]
mod tests;
