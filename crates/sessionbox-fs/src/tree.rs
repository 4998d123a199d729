//! Removing a directory tree with a bounded number of descriptors, whatever its depth.
//!
//! The walk keeps one frame per level (the entry's name and its device and inode numbers), but
//! a directory stream only for the deepest [`MAX_OPEN_DIRS`] levels: descending past that closes
//! the shallowest stream. Climbing back to a level whose stream was closed re-opens it as `..`
//! of the level below, accepted only when its device and inode numbers are those recorded on
//! the way down (the very directory that was entered; directories have no hard links). When they
//! differ, or `..` cannot be opened, the tree changed meanwhile: the path is walked again by
//! name from the top, each component checked the same way, and the walk resumes from the deepest
//! level that is still in place.
//!
//! Every directory is opened with one component relative to its parent's descriptor and
//! `O_NOFOLLOW | O_DIRECTORY` plus `openat2`'s `RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`: a link
//! is never entered (it is unlinked), and no other file system mounted inside is entered (the
//! removal fails with `EXDEV` instead). Every removal is `unlinkat` on a descriptor and a single
//! name, so a component swapped for a link mid-way can only make a removal act on the link.
//!
//! Entries created while the tree is removed are handled by reading a directory again when
//! removing it fails with `ENOTEMPTY`, at most [`MAX_PASSES`] times per directory.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

/// Directory streams held open at most (the deepest levels of the walk); the walk itself holds
/// at most two more descriptors at a time.
pub(crate) const MAX_OPEN_DIRS: usize = 32;
/// How many times one directory is read again because entries appeared in it while it was
/// being emptied, before giving up with `ENOTEMPTY`.
pub(crate) const MAX_PASSES: u32 = 128;
/// How many times the walk starts again from the top, or re-walks a path by name, because the
/// tree was renamed under it, before giving up with `ENOTEMPTY`.
const MAX_RESTARTS: u32 = 1024;

/// Whether the directory being removed may itself be a mount point (its contents are removed,
/// then removing it fails with `EBUSY`). Below it, mount points are never entered.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Top {
    MayBeMountPoint,
    SameMount,
}

/// Removes the directory `dir` and everything beneath it, holding a bounded number of file
/// descriptors whatever the depth of the tree: at most 32 directory streams plus three others,
/// where [`std::fs::remove_dir_all`] holds one per level and fails with `EMFILE` on a tree
/// deeper than the descriptor limit (a sandboxed command can build one in a loop of `mkdir` and
/// `chdir`).
///
/// Returns `Ok(true)` when something existed at `dir` (and is gone now), `Ok(false)` when
/// nothing did (`dir` or its parent missing).
///
/// - **Links are never followed.** A link inside the tree is unlinked, not entered; when `dir`
///   itself is a link, the link is removed and its target untouched; so is any other
///   non-directory at `dir`. Links in the parent of `dir` are followed (the path is trusted).
/// - **Nothing outside is ever removed**, even when a directory of the tree is swapped for a
///   link mid-way: every directory is opened relative to its parent's descriptor, one component
///   at a time with `O_NOFOLLOW`, and every removal is `unlinkat` on a descriptor. A directory
///   of the tree moved *out* of it by another process while the removal holds it may lose its
///   contents (as with `remove_dir_all`); with a workspace that is its own mount that is
///   impossible.
/// - **Mount points are not crossed**: a file system mounted inside the tree (not `dir` itself)
///   is never entered; the removal fails with `EXDEV` (`ErrorKind::CrossesDevices`).
/// - **Concurrent writers**: a directory that gains entries while it is being emptied is read
///   again, at most 128 times; then the removal fails with `ENOTEMPTY`.
/// - **Permissions**: a directory that cannot be read, searched or modified (mode `0`, `0o500`)
///   gets `u+rwx` (by descriptor, on the directory itself, never through a link) and the
///   operation is retried; when that is not allowed either, the error is returned. The parent of
///   `dir` is never changed.
///
/// Needs `openat2` (Linux 5.6) to refuse mount points; without it (`ENOSYS`) directories are
/// opened with `openat(O_NOFOLLOW)` and mount points are not detected.
///
/// # Errors
/// The first failure that retrying does not cure, as the `errno` of the failed call (for
/// example `EACCES`, `EBUSY` when `dir` is a mount point, `EXDEV` for a mount inside, `EROFS`).
/// `InvalidInput` when `dir` names no entry (`/`, ending in `..`). The tree may then be partly
/// removed.
pub fn remove_tree(dir: &Path) -> std::io::Result<bool> {
    let Some(name) = dir.file_name() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} names no directory entry to remove", dir.display()),
        ));
    };
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let base = match rustix::fs::open(
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let name = cstring(name)?;
    remove_at(base.as_fd(), &name, Top::MayBeMountPoint).map_err(Into::into)
}

fn cstring(name: &OsStr) -> std::io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path contains a NUL byte",
        )
    })
}

/// Removes the entry `name` of the directory `base`: a directory with everything beneath it, or
/// anything else (a link, a file) by unlinking it. `Ok(false)` when there was nothing.
pub(crate) fn remove_at(base: BorrowedFd<'_>, name: &CStr, top: Top) -> rustix::io::Result<bool> {
    let mut walk = Walk {
        base,
        top_no_xdev: top == Top::SameMount,
        stack: Vec::new(),
        open: 0,
        restarts: 0,
        top_passes: 0,
        done: false,
    };
    let mut existed = false;
    loop {
        if walk.done {
            return Ok(true);
        }
        if walk.stack.is_empty() {
            match open_dir_entry(base, name, walk.top_no_xdev) {
                Ok(fd) => {
                    existed = true;
                    walk.push(name.to_owned(), fd)?;
                }
                Err(Errno::NOENT) => return Ok(existed),
                Err(Errno::NOTDIR | Errno::LOOP) => match unlink(base, name) {
                    Ok(()) => return Ok(true),
                    Err(Errno::NOENT) => return Ok(existed),
                    // A directory again since it was looked at.
                    Err(Errno::ISDIR) => walk.restarted()?,
                    Err(e) => return Err(e),
                },
                Err(e) => return Err(e),
            }
        }
        walk.run()?;
    }
}

struct Frame {
    /// The entry's name in its parent (the previous frame, or the walk's base).
    name: CString,
    dev: u64,
    ino: u64,
    /// Open for the deepest [`MAX_OPEN_DIRS`] frames only.
    dir: Option<Dir>,
    passes: u32,
    made_writable: bool,
}

struct Walk<'a> {
    base: BorrowedFd<'a>,
    top_no_xdev: bool,
    stack: Vec<Frame>,
    /// How many frames hold a stream: always the last `open` ones.
    open: usize,
    restarts: u32,
    /// Passes of the top directory, which survive restarts from the top.
    top_passes: u32,
    /// The top directory was removed.
    done: bool,
}

impl Walk<'_> {
    fn restarted(&mut self) -> rustix::io::Result<()> {
        self.restarts += 1;
        if self.restarts > MAX_RESTARTS {
            return Err(Errno::NOTEMPTY);
        }
        Ok(())
    }

    fn no_xdev(&self, level: usize) -> bool {
        level > 0 || self.top_no_xdev
    }

    /// Enters the directory `fd`, the entry `name` of the deepest frame (or the top), closing the
    /// shallowest stream when more than [`MAX_OPEN_DIRS`] would be open.
    fn push(&mut self, name: CString, fd: OwnedFd) -> rustix::io::Result<()> {
        let st = rustix::fs::fstat(&fd)?;
        let (dev, ino) = ids(&st);
        self.stack.push(Frame {
            name,
            dev,
            ino,
            dir: Some(Dir::new(fd)?),
            passes: 0,
            made_writable: false,
        });
        self.open += 1;
        if self.open > MAX_OPEN_DIRS {
            let shallowest = self.stack.len() - self.open;
            self.stack[shallowest].dir = None;
            self.open -= 1;
        }
        Ok(())
    }

    fn pop(&mut self) {
        self.stack.pop();
        self.open -= 1;
    }

    /// Processes entries until the stack is empty (the top was removed, `done`, or must be
    /// opened again).
    fn run(&mut self) -> rustix::io::Result<()> {
        while let Some(frame) = self.stack.last_mut() {
            let dir = frame
                .dir
                .as_mut()
                .expect("the deepest frame holds its stream");
            let (name, ft) = match dir.read() {
                None => {
                    self.remove_deepest()?;
                    continue;
                }
                Some(Err(e)) => return Err(e),
                Some(Ok(entry)) => (entry.file_name().to_owned(), entry.file_type()),
            };
            if name.as_bytes() == b"." || name.as_bytes() == b".." {
                continue;
            }
            self.remove_entry(name, ft)?;
        }
        Ok(())
    }

    /// Removes a non-directory entry of the deepest frame, or enters a directory.
    fn remove_entry(&mut self, name: CString, ft: FileType) -> rustix::io::Result<()> {
        let level = self.stack.len() - 1;
        if ft != FileType::Directory && ft != FileType::Unknown {
            match self.unlink_in(level, &name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => return Ok(()),
                Err(Errno::ISDIR) => {} // a directory now: enter it
                Err(e) => return Err(e),
            }
        }
        let opened = match open_dir_entry(self.fd_of(level), &name, true) {
            // This directory cannot be searched (mode 0o600): make it searchable.
            Err(Errno::ACCESS) if self.make_writable(level) => {
                open_dir_entry(self.fd_of(level), &name, true)
            }
            r => r,
        };
        match opened {
            Ok(child) => self.push(name, child),
            Err(Errno::NOENT) => Ok(()),
            // Not a directory (a link, a file), or not any more.
            Err(Errno::NOTDIR | Errno::LOOP) => {
                match self.unlink_in(level, &name, AtFlags::empty()) {
                    // A directory again: reading this one again finds it.
                    Ok(()) | Err(Errno::NOENT | Errno::ISDIR) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// The deepest frame's stream is at its end: remove the directory from its parent.
    fn remove_deepest(&mut self) -> rustix::io::Result<()> {
        let level = self.stack.len() - 1;
        if level > 0 && self.stack[level - 1].dir.is_none() && !self.reopen_parent(level)? {
            return Ok(()); // the stack was cut back to what is still in place
        }
        let name = self.stack[level].name.clone();
        let result = if level == 0 {
            rustix::fs::unlinkat(self.base, &name, AtFlags::REMOVEDIR)
        } else {
            self.unlink_in(level - 1, &name, AtFlags::REMOVEDIR)
        };
        match result {
            // Removed, or renamed away meanwhile: the parent's own removal reads it again when
            // the directory is still in it.
            Ok(()) | Err(Errno::NOENT) => {
                self.pop();
                if level == 0 {
                    self.done = true;
                }
                Ok(())
            }
            Err(Errno::NOTEMPTY | Errno::EXIST) => {
                // Either entries appeared, or the name now belongs to another directory.
                let parent = if level == 0 {
                    self.base
                } else {
                    self.fd_of(level - 1)
                };
                let frame = &self.stack[level];
                let same = rustix::fs::statat(parent, &name, AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| ids(&st) == (frame.dev, frame.ino));
                if same {
                    let passes = if level == 0 {
                        self.top_passes += 1;
                        self.top_passes
                    } else {
                        self.stack[level].passes += 1;
                        self.stack[level].passes
                    };
                    if passes > MAX_PASSES {
                        return Err(Errno::NOTEMPTY);
                    }
                    if let Some(dir) = self.stack[level].dir.as_mut() {
                        dir.rewind();
                    }
                } else {
                    // Ours was moved: forget it; the parent is read again and removes whatever
                    // is at that name now.
                    self.restarted()?;
                    self.pop();
                    if let Some(parent) = self.stack.last_mut().and_then(|f| f.dir.as_mut()) {
                        parent.rewind();
                    }
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Opens the stream of frame `level - 1` (closed) as `..` of frame `level` (open). Returns
    /// `false` when the tree changed and the stack was cut back instead.
    fn reopen_parent(&mut self, level: usize) -> rustix::io::Result<bool> {
        debug_assert_eq!(self.open, 1);
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let up = match open_at(self.fd_of(level), c"..", flags, true) {
            // This directory cannot be searched (mode 0o600, and empty: nothing was unlinked).
            Err(Errno::ACCESS) if self.make_writable(level) => {
                open_at(self.fd_of(level), c"..", flags, true)
            }
            r => r,
        };
        let parent = &self.stack[level - 1];
        if let Ok(fd) = up
            && rustix::fs::fstat(&fd).is_ok_and(|st| ids(&st) == (parent.dev, parent.ino))
        {
            self.stack[level - 1].dir = Some(Dir::new(fd)?);
            self.open += 1;
            return Ok(true);
        }
        self.rewalk(level - 1)
    }

    /// Opens frame `upto` again by walking the recorded names from the base, each directory
    /// checked against its recorded device and inode. When one is no longer in place, the stack
    /// is cut back to its parent, which is read again (or to nothing: the walk starts again from
    /// the top).
    fn rewalk(&mut self, upto: usize) -> rustix::io::Result<bool> {
        self.restarted()?;
        let mut cur: Option<OwnedFd> = None;
        for level in 0..=upto {
            let parent = cur.as_ref().map_or(self.base, |fd| fd.as_fd());
            let frame = &self.stack[level];
            let next = open_dir_entry(parent, &frame.name, self.no_xdev(level))
                .ok()
                .filter(|fd| {
                    rustix::fs::fstat(fd).is_ok_and(|st| ids(&st) == (frame.dev, frame.ino))
                });
            match next {
                Some(fd) => cur = Some(fd),
                None => {
                    self.stack.truncate(level);
                    self.open = 0;
                    if let (Some(fd), Some(frame)) = (cur, self.stack.last_mut()) {
                        frame.dir = Some(Dir::new(fd)?);
                        self.open = 1;
                    }
                    return Ok(false);
                }
            }
        }
        let fd = cur.expect("at least one level was opened");
        self.stack[upto].dir = Some(Dir::new(fd)?);
        self.open += 1;
        Ok(true)
    }

    /// The descriptor of an open frame.
    fn fd_of(&self, level: usize) -> BorrowedFd<'_> {
        self.stack[level]
            .dir
            .as_ref()
            .and_then(|d| d.fd().ok())
            .expect("the frame holds its stream")
    }

    /// `unlinkat` in the directory of frame `level`; on `EACCES`/`EPERM`, gives that directory
    /// `u+rwx` once and tries again.
    fn unlink_in(&mut self, level: usize, name: &CStr, flags: AtFlags) -> rustix::io::Result<()> {
        match rustix::fs::unlinkat(self.fd_of(level), name, flags) {
            Err(e @ (Errno::ACCESS | Errno::PERM)) => {
                if !self.make_writable(level) {
                    return Err(e);
                }
                rustix::fs::unlinkat(self.fd_of(level), name, flags)
            }
            r => r,
        }
    }

    /// Gives the directory of frame `level` `u+rwx`, once per frame. `true` when it did (an
    /// operation that failed for lack of permission is worth retrying).
    fn make_writable(&mut self, level: usize) -> bool {
        if self.stack[level].made_writable {
            return false;
        }
        self.stack[level].made_writable = true;
        make_owner_rwx(self.fd_of(level)).is_ok()
    }
}

fn unlink(dir: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<()> {
    rustix::fs::unlinkat(dir, name, AtFlags::empty())
}

#[allow(clippy::unnecessary_cast)]
fn ids(st: &Stat) -> (u64, u64) {
    (st.st_dev as u64, st.st_ino as u64)
}

/// Adds `u+rwx` to the directory open as `fd` (a real descriptor of it, so no link is involved).
fn make_owner_rwx(fd: BorrowedFd<'_>) -> rustix::io::Result<()> {
    let st = rustix::fs::fstat(fd)?;
    rustix::fs::fchmod(fd, Mode::from_raw_mode((st.st_mode & 0o7777) | 0o700))
}

/// Opens the directory entry `name` of `dir` for reading, never following a link
/// (`ENOTDIR`/`ELOOP` for a link or a non-directory) and, with `no_xdev`, never entering a mount
/// point (`EXDEV`). A directory that cannot be opened for lack of permission gets `u+rwx` first,
/// through an `O_PATH` descriptor of the directory itself (via `/proc/self/fd`).
fn open_dir_entry(dir: BorrowedFd<'_>, name: &CStr, no_xdev: bool) -> rustix::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match open_at(dir, name, flags, no_xdev) {
        Err(Errno::ACCESS) => {
            let path = open_at(
                dir,
                name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                no_xdev,
            )?;
            let st = rustix::fs::fstat(&path)?;
            if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                return Err(Errno::NOTDIR);
            }
            rustix::fs::chmod(
                format!("/proc/self/fd/{}", path.as_raw_fd()).as_str(),
                Mode::from_raw_mode((st.st_mode & 0o7777) | 0o700),
            )
            .map_err(|_| Errno::ACCESS)?;
            open_at(dir, name, flags, no_xdev)
        }
        r => r,
    }
}

/// Set once `openat2` turned out to be missing (`ENOSYS`).
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// `openat2(dir, name, flags, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS [| RESOLVE_NO_XDEV])`,
/// or `openat` where `openat2` is unavailable.
fn open_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: OFlags,
    no_xdev: bool,
) -> rustix::io::Result<OwnedFd> {
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        let mut resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        if no_xdev {
            resolve |= ResolveFlags::NO_XDEV;
        }
        let mut tries = 0;
        loop {
            match rustix::fs::openat2(dir, name, flags, Mode::empty(), resolve) {
                Err(Errno::AGAIN | Errno::INTR) if tries < 64 => tries += 1,
                Err(Errno::NOSYS) => {
                    NO_OPENAT2.store(true, Ordering::Relaxed);
                    break;
                }
                // A seccomp filter that forbids openat2: try openat for this call.
                Err(Errno::PERM) => break,
                r => return r,
            }
        }
    }
    rustix::fs::openat(dir, name, flags, Mode::empty())
}
