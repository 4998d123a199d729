//! File operations confined to one workspace directory.
//!
//! A [`Workspace`] holds a descriptor of the workspace root (`O_PATH | O_DIRECTORY`) and never
//! looks at the host path again. Every operation:
//!
//! 1. passes the caller's path through the workspace path policy ([`WorkspacePath::resolve`]):
//!    relative paths start at the root, absolute ones are accepted only inside the presented
//!    root, `..` above the root is refused, empty paths and NUL bytes are invalid;
//! 2. resolves the normalised path beneath the root descriptor with `openat2(2)` and
//!    `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`, so symbolic links that stay inside are followed
//!    and any component that would leave (an absolute link, a `..` link, a link to a sibling
//!    workspace) is refused by the kernel with [`Error::OutsideWorkspace`];
//! 3. acts through descriptors from then on (`*at` calls on a directory descriptor and a single
//!    component), so a directory renamed or replaced by a link while the operation runs cannot
//!    redirect it outside.
//!
//! Writes are atomic (temporary file in the same directory, `fsync`, `renameat`), refuse files
//! with more than one hard link, and never follow a final-component link that leads out.
//! Directory walks (`list`, `glob`, `grep`, recursive `remove`) never follow links.
//!
//! [`remove_tree`] removes a directory tree (a conversation's workspace, on `destroy`) and
//! recursive [`Workspace::remove`] uses the same walk: it never follows a link, never enters a
//! mount point, and holds a bounded number of descriptors whatever the depth, so a command that
//! builds a tree deeper than the descriptor limit cannot make it impossible to remove.
//!
//! Everything here is synchronous; async callers use `spawn_blocking`. [`Workspace`] is
//! `Send + Sync` and every method takes `&self`. It needs Linux 5.6 or later (`openat2`).
//!
//! Error messages name workspace-relative paths, never the host path of the workspace.

mod archive;
mod perm;
mod resolve;
mod room;
mod tree;
mod walk;
mod write;

pub use perm::PERMISSION_BITS;
pub use tree::remove_tree;

/// Checks every entry of a tar archive read from `archive` against the restore rules of
/// `sessionbox_core`'s snapshot module (kinds, absolute paths, `..`, paths through a link or a
/// file of the archive, paths given twice, the entry limit) and counts what it holds; reads
/// nothing else and changes nothing.
///
/// # Errors
/// [`Error::InvalidRequest`] naming the first entry at fault, or when `archive` is not a tar.
pub fn check_archive<R: std::io::Read>(archive: R) -> Result<ArchiveStats> {
    archive::check(archive)
}

/// The pattern checks, now in `sessionbox_core::patterns` (one implementation, used by the
/// walks here too); re-exported for the callers that name them here.
pub use sessionbox_core::patterns::{check_glob, check_grep};

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use sessionbox_core::{
    ArchiveStats, DirEntry, EditRequest, EditResult, Error, FileKind, FileStat, GrepMatch,
    GrepRequest, Limits, Result, WorkspacePath,
};

use crate::resolve::{RESOLVE, io_error, open_beneath, resolve_error, stat_mtime, stat_size};

/// A workspace directory, held by descriptor, with the limits that apply to it.
///
/// See the [crate documentation](crate) for what is enforced.
#[derive(Debug)]
pub struct Workspace {
    root: OwnedFd,
    presented_root: String,
    limits: Limits,
    expand_home: bool,
}

impl Workspace {
    /// Opens the existing directory `dir` as the workspace root. Callers see it as
    /// `presented_root` (absolute, for example `/workspace`, or the host directory itself for the
    /// `host` runtime): absolute paths given to the other methods must lie inside it.
    ///
    /// `dir` is trusted (it comes from the runtime, not from a caller); links in it are followed
    /// once, here.
    ///
    /// # Errors
    /// - [`Error::InvalidRequest`]: `presented_root` is not absolute, has a `.` or `..`
    ///   component, or contains a NUL byte.
    /// - [`Error::NotFound`] / [`Error::Conflict`]: `dir` does not exist / is not a directory.
    /// - [`Error::RuntimeUnavailable`]: the kernel lacks `openat2` (Linux < 5.6) or a seccomp
    ///   filter forbids it.
    /// - [`Error::Backend`]: any other failure.
    pub fn open(dir: &Path, presented_root: &str, limits: Limits) -> Result<Workspace> {
        if !presented_root.starts_with('/')
            || presented_root.contains('\0')
            || presented_root.split('/').any(|c| c == "." || c == "..")
        {
            return Err(Error::InvalidRequest(format!(
                "the presented workspace root {presented_root:?} must be an absolute, normalised \
                 path"
            )));
        }
        let trimmed = presented_root.trim_end_matches('/');
        let presented_root = if trimmed.is_empty() { "/" } else { trimmed }.to_owned();
        let root = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::NOENT => Error::NotFound(format!("workspace directory {presented_root}")),
            Errno::NOTDIR => Error::Conflict(format!(
                "workspace directory {presented_root} is not a directory"
            )),
            e => Error::Backend(format!(
                "cannot open workspace directory {presented_root}: {e}"
            )),
        })?;
        // Probe openat2 once, so a kernel without it fails here with a clear message rather than
        // on the first file operation.
        match rustix::fs::openat2(
            &root,
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(_) => {}
            Err(e @ (Errno::NOSYS | Errno::PERM)) => {
                return Err(Error::RuntimeUnavailable {
                    runtime: "sessionbox-fs".into(),
                    reason: format!("the openat2 system call is unavailable ({e})"),
                    hint: "workspace file operations need Linux 5.6 or later, and a seccomp \
                           profile that allows openat2"
                        .into(),
                });
            }
            Err(e) => return Err(Error::backend(format!("openat2 probe failed: {e}"))),
        }
        Ok(Workspace {
            root,
            presented_root,
            limits,
            expand_home: false,
        })
    }

    /// Makes [`Workspace::resolve`] (and so every method) read a leading `~` as the presented
    /// root: `~` is the root and `~/a` is `a`, as a shell whose `HOME` is the root would. `~user`
    /// and a `~` anywhere else stay literal, and the result passes the path policy as usual, so
    /// `~/../x` is still refused.
    ///
    /// With this on, a path already resolved must be passed back presented
    /// ([`WorkspacePath::presented`]), not relative: a top-level entry literally named `~` would
    /// otherwise be read as the root.
    #[must_use]
    pub fn with_home_expansion(mut self) -> Workspace {
        self.expand_home = true;
        self
    }

    /// The workspace root as callers see it (absolute, without a trailing slash).
    pub fn presented_root(&self) -> &str {
        &self.presented_root
    }

    /// The limits that apply to this workspace's operations.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Applies the workspace path policy ([`WorkspacePath::resolve`] with the presented root).
    /// Looks at no file.
    ///
    /// # Errors
    /// [`Error::InvalidPath`] (empty, NUL byte, too long) or [`Error::OutsideWorkspace`]
    /// (absolute outside the presented root, `..` above the root).
    pub fn resolve(&self, path: &str) -> Result<WorkspacePath> {
        if self.expand_home {
            let rest = if path == "~" {
                Some("")
            } else {
                path.strip_prefix("~/")
            };
            if let Some(rest) = rest {
                let root = self.presented_root.trim_end_matches('/');
                return WorkspacePath::resolve(&self.presented_root, &format!("{root}/{rest}"));
            }
        }
        WorkspacePath::resolve(&self.presented_root, path)
    }

    /// Opens a directory beneath the root, for a command's working directory (use it with
    /// `fchdir`). The descriptor is `O_PATH | O_DIRECTORY | O_CLOEXEC`; links that stay inside
    /// are followed.
    ///
    /// # Errors
    /// Path policy errors; [`Error::OutsideWorkspace`] when a link leads out;
    /// [`Error::NotFound`]; [`Error::Conflict`] when the path is not a directory.
    pub fn open_dir(&self, path: &str) -> Result<OwnedFd> {
        let rel = self.resolve(path)?;
        resolve::open_dir(self.root.as_fd(), rel.as_relative())
    }

    /// Reads a whole regular file. Links that stay inside are followed. A FIFO never blocks.
    ///
    /// # Errors
    /// Path policy errors; [`Error::OutsideWorkspace`] when a link leads out;
    /// [`Error::NotFound`]; [`Error::Conflict`] for a directory or anything that is not a
    /// regular file; [`Error::TooLarge`] above [`Limits::max_file_bytes`].
    pub fn read(&self, path: &str) -> Result<Vec<u8>> {
        let rel = self.resolve(path)?;
        let shown = rel.as_relative();
        let (file, st) = self.open_regular(shown)?;
        let limit = self.limits.max_file_bytes;
        if stat_size(&st) > limit {
            return Err(too_large_file(shown, limit));
        }
        let mut data = Vec::with_capacity(usize::try_from(stat_size(&st)).unwrap_or(0));
        file.take(limit.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|e| io_error(errno_of(&e), "read", shown))?;
        if data.len() as u64 > limit {
            return Err(too_large_file(shown, limit));
        }
        Ok(data)
    }

    /// Reads at most `len` bytes of a regular file starting at byte `offset` (for HTTP range
    /// requests). Fewer bytes come back at the end of the file, none past it. `len` is capped at
    /// [`Limits::max_file_bytes`]; the file itself may be larger than that limit.
    ///
    /// # Errors
    /// As [`Workspace::read`], without [`Error::TooLarge`].
    pub fn read_range(&self, path: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let rel = self.resolve(path)?;
        let shown = rel.as_relative();
        let (file, st) = self.open_regular(shown)?;
        let want = len
            .min(self.limits.max_file_bytes)
            .min(stat_size(&st).saturating_sub(offset));
        let mut buf = vec![0u8; usize::try_from(want).unwrap_or(usize::MAX)];
        let mut got = 0usize;
        while got < buf.len() {
            match file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(errno_of(&e), "read", shown)),
            }
        }
        buf.truncate(got);
        Ok(buf)
    }

    /// Writes a whole file atomically: an unnamed temporary file (`O_TMPFILE`) in the same
    /// directory, `fsync`, then named `.NAME.sbx-tmp-<random>` and renamed over the target with
    /// `renameat` (where the file system has no unnamed files, the temporary file is named
    /// from the start); on failure the temporary file is removed and the target is untouched,
    /// and a writer killed before the last two calls leaves no file behind. Missing parent directories are created (mode
    /// `0o755` before umask), each beneath the root.
    ///
    /// Permission bits (`0o777`) of an existing file are kept; a new file gets `0o644`. Owner,
    /// extended attributes and setuid/setgid/sticky bits are not carried over. When the final
    /// component is a link that resolves inside to an existing regular file, that file is
    /// replaced and the link stays.
    ///
    /// # Errors
    /// Path policy errors; [`Error::OutsideWorkspace`] when any component (the final one
    /// included, even when its target does not exist) is a link that leads out;
    /// [`Error::Conflict`] for the root, a directory, a non-regular file, a file with more than
    /// one hard link, a dangling in-workspace link, or a parent that is not a directory;
    /// [`Error::TooLarge`] when `data` is above [`Limits::max_file_bytes`].
    pub fn write(&self, path: &str, data: &[u8]) -> Result<()> {
        self.write_with_mode(path, data, None)
    }

    /// [`Workspace::write`], with the permission bits of the new content given: `Some(mode)`
    /// (at most [`PERMISSION_BITS`]) is set on the temporary file before it is renamed into
    /// place, so the file never appears with other bits; `None` keeps an existing file's bits
    /// and gives a new one `0o644`, as [`Workspace::write`].
    ///
    /// # Errors
    /// As [`Workspace::write`]; [`Error::InvalidRequest`] for a mode with setuid, setgid or
    /// sticky bits (nothing is written).
    pub fn write_with_mode(&self, path: &str, data: &[u8], mode: Option<u32>) -> Result<()> {
        let rel = self.resolve(path)?;
        if let Some(m) = mode {
            perm::check_mode(m, rel.as_relative())?;
        }
        if data.len() as u64 > self.limits.max_file_bytes {
            return Err(Error::TooLarge {
                what: format!("data for {}", rel.as_relative()),
                limit: self.limits.max_file_bytes,
            });
        }
        let target = write::locate(self, &rel, true)?;
        let mode = mode.unwrap_or_else(|| {
            target
                .existing
                .map(|st| st.st_mode & 0o777)
                .unwrap_or(write::NEW_FILE_MODE)
        });
        write::replace_contents(&target, data, mode)
    }

    /// Replaces an exact string in a file, then writes it atomically as [`Workspace::write`]
    /// does. Occurrences are counted as non-overlapping byte matches.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when `old` is empty; [`Error::Conflict`] when `old` does not
    /// occur, or occurs more than once without `replace_all` (the message gives the count); as
    /// [`Workspace::write`] otherwise, with [`Error::NotFound`] for a missing file and
    /// [`Error::TooLarge`] when the file or the result is above [`Limits::max_file_bytes`].
    pub fn edit(&self, path: &str, edit: &EditRequest) -> Result<EditResult> {
        write::edit(self, path, edit)
    }

    /// Lists a directory, sorted by name. Entries' links are not followed (a link is reported as
    /// [`FileKind::Symlink`] with the link's own size); the directory named by `path` may be
    /// reached through a link that stays inside.
    ///
    /// # Errors
    /// Path policy errors; [`Error::OutsideWorkspace`]; [`Error::NotFound`];
    /// [`Error::Conflict`] when `path` is not a directory; [`Error::TooLarge`] when it has more
    /// than [`Limits::max_entries`] entries.
    pub fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        let rel = self.resolve(path)?;
        walk::list(self, &rel)
    }

    /// Workspace-relative paths of the non-directory entries (files, links, others) matching a
    /// glob (`globset` syntax; `*` stays within a component, `**` crosses them), sorted. The
    /// walk never follows links. An absolute pattern must start with the presented root, which
    /// is stripped.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for an empty or malformed pattern; [`Error::OutsideWorkspace`]
    /// for a pattern with a `..` component or absolute outside the root; [`Error::TooLarge`]
    /// for more than [`Limits::max_entries`] matches.
    pub fn glob(&self, pattern: &str) -> Result<Vec<String>> {
        walk::glob(self, pattern)
    }

    /// Searches file contents line by line with a regular expression (`regex` crate syntax).
    /// Walks `req.path` (default: the root) without following links; skips binary files (a NUL
    /// byte in the first 8 KiB) and files above [`Limits::max_grep_file_bytes`]; stops at
    /// `req.max_matches` (capped at [`Limits::max_matches`]). Matches come in path order.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad regular expression or glob; path errors for
    /// `req.path` as [`Workspace::stat`]; [`Error::TooLarge`] when `req.path` names one file
    /// above the grep limit.
    pub fn grep(&self, req: &GrepRequest) -> Result<Vec<GrepMatch>> {
        walk::grep(self, req)
    }

    /// Metadata of one path; links that stay inside are followed.
    ///
    /// # Errors
    /// Path policy errors; [`Error::OutsideWorkspace`] when a link leads out;
    /// [`Error::NotFound`] (also for a dangling link); [`Error::Conflict`] when a parent is not
    /// a directory.
    pub fn stat(&self, path: &str) -> Result<FileStat> {
        let rel = self.resolve(path)?;
        let fd = open_beneath(
            self.root.as_fd(),
            rel.as_relative(),
            OFlags::PATH | OFlags::CLOEXEC,
            RESOLVE,
        )
        .map_err(|e| resolve_error(e, rel.as_relative()))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io_error(e, "stat", rel.as_relative()))?;
        Ok(FileStat {
            path: rel.presented(&self.presented_root),
            kind: kind_of(FileType::from_raw_mode(st.st_mode)),
            size: stat_size(&st),
            mode: st.st_mode & 0o7777,
            modified_unix: stat_mtime(&st),
        })
    }

    /// Removes a file, a link (the link itself, never its target) or a directory (`recursive`
    /// for a non-empty one). The recursive walk is [`remove_tree`]'s: it never follows links,
    /// never enters a mount point, and holds a bounded number of descriptors whatever the depth.
    ///
    /// # Errors
    /// Path policy errors; [`Error::Conflict`] for the root, a non-empty directory without
    /// `recursive`, a mount point inside the directory, or entries that kept appearing while it
    /// was removed; [`Error::OutsideWorkspace`] when a parent component is a link that leads
    /// out; [`Error::NotFound`].
    pub fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        let rel = self.resolve(path)?;
        walk::remove(self, &rel, recursive)
    }

    /// Creates a directory and its parents, each beneath the root; succeeds when it exists as a
    /// directory (also through a link that stays inside).
    ///
    /// # Errors
    /// Path policy errors; [`Error::OutsideWorkspace`] when a component is a link that leads
    /// out (nothing is created outside); [`Error::Conflict`] when a component exists and is not
    /// a directory.
    pub fn mkdir(&self, path: &str) -> Result<()> {
        let rel = self.resolve(path)?;
        resolve::ensure_dirs(self.root.as_fd(), &rel).map(drop)
    }

    /// [`Workspace::mkdir`], then, only when the last component was created by this call, sets
    /// its permission bits to `mode` (exactly, whatever the umask) and its owner and group to
    /// `uid`/`gid` (`None`: unchanged). Parents created on the way get `0o755` before umask; an
    /// existing directory is left as it is. Returns whether the last component was created.
    ///
    /// # Errors
    /// As [`Workspace::mkdir`]; [`Error::InvalidRequest`] for a `mode` beyond
    /// [`PERMISSION_BITS`] (checked before anything is created) or an ownership change the
    /// process may not make (the directory then exists with its mode set).
    pub fn mkdir_with(
        &self,
        path: &str,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<bool> {
        let rel = self.resolve(path)?;
        let shown = rel.as_relative();
        if let Some(m) = mode {
            perm::check_mode(m, shown)?;
        }
        let (fd, created) = resolve::ensure_dirs_created(self.root.as_fd(), &rel)?;
        if created {
            let st = rustix::fs::fstat(&fd).map_err(|e| resolve::io_error(e, "stat", shown))?;
            perm::chown_fd(fd.as_fd(), uid, gid, shown)?;
            if let Some(m) = mode {
                perm::chmod_fd(fd.as_fd(), &st, m, shown, || Err(Errno::NOTDIR))?;
            }
        }
        Ok(created)
    }

    /// Sets the permission bits (`mode`, at most [`PERMISSION_BITS`]) and the owner and group
    /// (numeric ids) of an existing regular file or directory; `None` leaves that part
    /// unchanged. Links that stay inside are followed (a link's own mode cannot be changed on
    /// Linux); the change is made through a descriptor of the inode found beneath the root, so a
    /// path swapped meanwhile cannot redirect it. Ownership is changed first, then the mode, so
    /// the mode ends up exactly as asked.
    ///
    /// # Errors
    /// Path policy errors; [`Error::OutsideWorkspace`] when a link leads out;
    /// [`Error::NotFound`]; [`Error::InvalidRequest`] for setuid, setgid or sticky bits (nothing
    /// is changed) and for a change the process may not make (`EPERM`: another user's file, or
    /// giving a file away without being root); [`Error::Conflict`] for anything but a regular
    /// file or a directory, and for a file with more than one hard link.
    pub fn set_permissions(
        &self,
        path: &str,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<()> {
        let rel = self.resolve(path)?;
        let shown = rel.as_relative();
        if let Some(m) = mode {
            perm::check_mode(m, shown)?;
        }
        let (fd, st) = perm::open_target(self.root.as_fd(), &rel)?;
        perm::chown_fd(fd.as_fd(), uid, gid, shown)?;
        if let Some(m) = mode {
            perm::chmod_fd(
                fd.as_fd(),
                &st,
                m,
                shown,
                perm::reopen_file(self.root.as_fd(), shown),
            )?;
        }
        Ok(())
    }

    /// Renames `from` to `to` (both inside), creating `to`'s missing parents. A link is moved as
    /// a link. An existing file at `to` is replaced, as `rename(2)` does.
    ///
    /// # Errors
    /// Path policy errors for either path; [`Error::OutsideWorkspace`] when a parent of either
    /// is a link that leads out; [`Error::NotFound`] when `from` does not exist;
    /// [`Error::Conflict`] for the root, moving a directory into itself, a non-empty directory
    /// at `to`, a file/directory mismatch, or a move across file systems.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let from = self.resolve(from)?;
        let to = self.resolve(to)?;
        walk::rename(self, &from, &to)
    }

    /// Writes a tar archive of the whole workspace to `out` (see `sessionbox_core`'s snapshot
    /// rules): paths relative to the root, regular files, directories and links (never
    /// followed); other kinds, and other file systems mounted inside, are left out and counted
    /// in [`ArchiveStats::skipped`]. The walk never leaves the workspace.
    ///
    /// # Errors
    /// [`Error::Backend`] when `out` fails; an I/O error reading the workspace;
    /// [`Error::TooLarge`] past [`sessionbox_core::MAX_ARCHIVE_ENTRIES`] entries.
    pub fn archive<W: std::io::Write>(&self, out: W) -> Result<ArchiveStats> {
        archive::write(self, out)
    }

    /// Replaces the workspace's whole contents with the tar archive in `archive` (read from
    /// its start, twice). Every entry is checked first ([`check_archive`]); nothing is removed
    /// unless all pass. Then the root is emptied (the root itself is kept) and the entries are
    /// written beneath it, never through a link. Owners are not restored: the files belong to
    /// this process's user.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for an archive that breaks a rule (nothing changed);
    /// [`Error::TooLarge`] when its files cannot fit, even in the room the workspace's own files
    /// free (nothing changed), or when the file system turns out full while it is written, near
    /// that edge (the workspace then holds part of the archive); [`Error::Conflict`] when a
    /// mount point inside cannot be removed.
    pub fn restore(&self, archive: &mut File) -> Result<ArchiveStats> {
        archive::restore(self, archive)
    }

    /// An unnamed temporary file (`O_TMPFILE`) on the workspace's file system, for spooling an
    /// archive before it is restored: no name in any directory, so no listing or walk sees it,
    /// and its space is freed when it is closed, whatever happens. Its bytes count against the
    /// workspace's disk quota while it is open. Where the file system cannot make one, it is
    /// made in the process's temporary directory instead.
    ///
    /// # Errors
    /// An I/O error when neither can be made.
    pub fn spool_file(&self) -> Result<File> {
        let flags = OFlags::RDWR | OFlags::TMPFILE | OFlags::CLOEXEC;
        let mode = Mode::from_raw_mode(0o600);
        match rustix::fs::openat(&self.root, c".", flags, mode) {
            Ok(fd) => Ok(File::from(fd)),
            Err(_) => rustix::fs::open(std::env::temp_dir(), flags, mode)
                .map(File::from)
                .map_err(|e| io_error(e, "create a temporary file for", "the archive")),
        }
    }

    pub(crate) fn root(&self) -> std::os::fd::BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Opens `rel` (following inside links) for reading and checks it is a regular file.
    fn open_regular(&self, rel: &str) -> Result<(File, rustix::fs::Stat)> {
        let fd = open_beneath(
            self.root.as_fd(),
            rel,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            RESOLVE,
        )
        .map_err(|e| resolve_error(e, rel))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io_error(e, "stat", rel))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Ok((File::from(fd), st)),
            FileType::Directory => Err(Error::Conflict(format!(
                "{rel} is a directory, not a file; use ls"
            ))),
            _ => Err(Error::Conflict(format!("{rel} is not a regular file"))),
        }
    }
}

pub(crate) fn kind_of(t: FileType) -> FileKind {
    match t {
        FileType::RegularFile => FileKind::File,
        FileType::Directory => FileKind::Directory,
        FileType::Symlink => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

pub(crate) fn too_large_file(rel: &str, limit: u64) -> Error {
    Error::TooLarge {
        what: format!("file {rel}"),
        limit,
    }
}

pub(crate) fn errno_of(e: &std::io::Error) -> Errno {
    e.raw_os_error()
        .map(Errno::from_raw_os_error)
        .unwrap_or(Errno::IO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Workspace>();
    }
}
