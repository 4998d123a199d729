//! Resolution beneath the root descriptor with `openat2`, and the mapping of `errno` values to
//! [`Error`]s that name workspace-relative paths.

use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::fs::{Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;
use sessionbox_core::{Error, Result, WorkspacePath};

/// Follows links, but none may leave the starting directory, and no `/proc` magic links.
pub(crate) const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

/// As [`RESOLVE`], and no link is followed at all (for walks and for re-opening a path that was
/// already resolved).
pub(crate) const RESOLVE_NO_LINKS: ResolveFlags = RESOLVE.union(ResolveFlags::NO_SYMLINKS);

/// `openat2(dir, path, flags, mode, resolve)`, retried on `EAGAIN` (the kernel returns it for
/// `RESOLVE_BENEATH` when a concurrent rename may have raced with a `..` lookup) and `EINTR`.
pub(crate) fn open_beneath<P: rustix::path::Arg + Copy>(
    dir: BorrowedFd<'_>,
    path: P,
    flags: OFlags,
    resolve: ResolveFlags,
) -> rustix::io::Result<OwnedFd> {
    open_beneath_mode(dir, path, flags, Mode::empty(), resolve)
}

/// [`open_beneath`] with a creation mode.
pub(crate) fn open_beneath_mode<P: rustix::path::Arg + Copy>(
    dir: BorrowedFd<'_>,
    path: P,
    flags: OFlags,
    mode: Mode,
    resolve: ResolveFlags,
) -> rustix::io::Result<OwnedFd> {
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(dir, path, flags, mode, resolve) {
            Err(Errno::AGAIN | Errno::INTR) if tries < 64 => tries += 1,
            r => return r,
        }
    }
}

/// Maps an error of resolving `rel` (a workspace-relative path) beneath the root.
pub(crate) fn resolve_error(e: Errno, rel: &str) -> Error {
    match e {
        Errno::XDEV => Error::OutsideWorkspace {
            path: rel.to_owned(),
            reason: "a symbolic link in the path leads outside the workspace".to_owned(),
        },
        Errno::LOOP => Error::Conflict(format!(
            "{rel}: too many levels of symbolic links, or a link where none is allowed"
        )),
        Errno::NOTDIR => {
            Error::Conflict(format!("{rel}: a component of the path is not a directory"))
        }
        e => io_error(e, "open", rel),
    }
}

/// Maps an error of operation `op` on `rel`.
pub(crate) fn io_error(e: Errno, op: &str, rel: &str) -> Error {
    match e {
        Errno::NOENT => Error::NotFound(rel.to_owned()),
        Errno::EXIST => Error::AlreadyExists(rel.to_owned()),
        Errno::ISDIR => Error::Conflict(format!("{rel} is a directory")),
        Errno::NOTDIR => Error::Conflict(format!("{rel}: not a directory")),
        Errno::NOTEMPTY => Error::Conflict(format!("{rel} is a directory that is not empty")),
        Errno::LOOP => Error::Conflict(format!("{rel}: too many levels of symbolic links")),
        Errno::NAMETOOLONG => Error::InvalidPath {
            path: rel.to_owned(),
            reason: "a component is longer than the file system allows".to_owned(),
        },
        // The workspace's disk quota (its own file system full, bytes or inodes) or a full
        // disk: the same typed refusal as a file over its size limit.
        Errno::NOSPC | Errno::DQUOT => Error::TooLarge {
            what: format!(
                "cannot {op} {rel}: the workspace is full (no space or no inodes left under its disk quota); delete files to make room"
            ),
            limit: u64::MAX,
        },
        Errno::ACCESS | Errno::PERM => {
            Error::Backend(format!("cannot {op} {rel}: permission denied"))
        }
        e => Error::Backend(format!("cannot {op} {rel}: {e}")),
    }
}

/// Opens the directory `rel` (following inside links) as `O_PATH`.
pub(crate) fn open_dir(root: BorrowedFd<'_>, rel: &str) -> Result<OwnedFd> {
    open_beneath(
        root,
        rel,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        RESOLVE,
    )
    .map_err(|e| match e {
        Errno::NOTDIR => Error::Conflict(format!(
            "{rel} is not a directory (or a component of it is not)"
        )),
        e => resolve_error(e, rel),
    })
}

/// Opens the directory `rel`, creating it and its missing parents. Each component is created
/// with `mkdirat` in the descriptor of its parent (a single name, which `mkdirat` never follows)
/// and then re-opened from the root with `openat2` `RESOLVE_BENEATH`, so a link anywhere in the
/// path can never make a directory appear outside.
pub(crate) fn ensure_dirs(root: BorrowedFd<'_>, rel: &WorkspacePath) -> Result<OwnedFd> {
    ensure_dirs_created(root, rel).map(|(fd, _)| fd)
}

/// [`ensure_dirs`], also telling whether the last component was created by this call (`false`
/// when it already existed, also when another process created it meanwhile; `false` for the
/// root).
pub(crate) fn ensure_dirs_created(
    root: BorrowedFd<'_>,
    rel: &WorkspacePath,
) -> Result<(OwnedFd, bool)> {
    let mut cur = open_dir(root, ".")?;
    let mut created = false;
    let mut prefix = String::new();
    for comp in rel.components() {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(comp);
        created = false;
        match open_dir(root, &prefix) {
            Ok(fd) => cur = fd,
            Err(Error::NotFound(_)) => {
                match rustix::fs::mkdirat(&cur, comp, Mode::from_raw_mode(0o755)) {
                    Ok(()) => created = true,
                    Err(Errno::EXIST) => {}
                    Err(e) => return Err(io_error(e, "create directory", &prefix)),
                }
                cur = open_dir(root, &prefix).map_err(|e| match e {
                    Error::NotFound(_) => Error::Conflict(format!(
                        "{prefix} is a symbolic link to a directory that does not exist"
                    )),
                    e => e,
                })?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok((cur, created))
}

/// Opens the parent directory of `rel` (which must not be the root) without creating anything;
/// returns it with the final component.
pub(crate) fn open_parent<'a>(
    root: BorrowedFd<'_>,
    rel: &'a WorkspacePath,
) -> Result<(OwnedFd, &'a str)> {
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return Err(Error::Conflict("the workspace root itself".into()));
    };
    let dir = open_dir(root, parent.as_relative()).map_err(|e| match e {
        Error::NotFound(_) => Error::NotFound(rel.as_str().to_owned()),
        e => e,
    })?;
    Ok((dir, name))
}

/// `st_size` as `u64` (the field's type differs between architectures).
#[allow(clippy::unnecessary_cast)]
pub(crate) fn stat_size(st: &Stat) -> u64 {
    (st.st_size as i64).max(0) as u64
}

/// `st_mtime` as `i64`.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn stat_mtime(st: &Stat) -> i64 {
    st.st_mtime as i64
}

/// `st_nlink` as `u64`.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn stat_nlink(st: &Stat) -> u64 {
    st.st_nlink as u64
}

/// True when two stats name the same inode.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn same_inode(a: &Stat, b: &Stat) -> bool {
    a.st_dev as u64 == b.st_dev as u64 && a.st_ino as u64 == b.st_ino as u64
}
