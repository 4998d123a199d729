//! Permission bits and ownership of entries beneath the root.
//!
//! The entry is resolved once, with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` into an
//! `O_PATH` descriptor, and every change is made through that descriptor, so a path swapped for
//! a link after the lookup cannot redirect the change outside the workspace:
//!
//! - ownership: `fchownat(fd, "", AT_EMPTY_PATH)`, which acts on the descriptor's inode;
//! - permission bits: `fchmodat2(fd, "", AT_EMPTY_PATH)` (Linux 6.6 and later). Where that
//!   system call is missing or filtered, the inode is re-opened without `O_PATH` (a directory
//!   through `openat(fd, ".")`, a file beneath the root again, checked to be the same inode) and
//!   changed with `fchmod`. No `/proc` path is used.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use sessionbox_core::{Error, Result, WorkspacePath};

use crate::resolve::{RESOLVE, io_error, open_beneath, resolve_error, same_inode, stat_nlink};

/// The permission bits a caller may set: `rwx` for user, group and others. Setuid, setgid and
/// the sticky bit are refused.
pub const PERMISSION_BITS: u32 = 0o777;

/// Refuses a mode with bits outside [`PERMISSION_BITS`].
pub(crate) fn check_mode(mode: u32, shown: &str) -> Result<()> {
    if mode & !PERMISSION_BITS != 0 {
        return Err(Error::InvalidRequest(format!(
            "mode {mode:o} for {shown} has bits beyond rwxrwxrwx (setuid, setgid, sticky or \
             more); only permission bits (at most 777) may be set"
        )));
    }
    Ok(())
}

/// Opens `rel` (following links that stay inside) as `O_PATH` and checks it is a regular file
/// with one link or a directory.
pub(crate) fn open_target(root: BorrowedFd<'_>, rel: &WorkspacePath) -> Result<(OwnedFd, Stat)> {
    let shown = rel.as_relative();
    let fd = open_beneath(root, shown, OFlags::PATH | OFlags::CLOEXEC, RESOLVE)
        .map_err(|e| resolve_error(e, shown))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| io_error(e, "stat", shown))?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => {}
        FileType::RegularFile if stat_nlink(&st) <= 1 => {}
        FileType::RegularFile => {
            return Err(Error::Conflict(format!(
                "{shown} has {} hard links; refusing to change a file that may be shared with a \
                 path outside the workspace",
                stat_nlink(&st)
            )));
        }
        _ => {
            return Err(Error::Conflict(format!(
                "{shown} is not a regular file or a directory; only those can have their \
                 permissions or owner changed"
            )));
        }
    }
    Ok((fd, st))
}

/// Changes owner and group (`None`: unchanged) of the inode `fd` (an `O_PATH` descriptor).
pub(crate) fn chown_fd(
    fd: BorrowedFd<'_>,
    uid: Option<u32>,
    gid: Option<u32>,
    shown: &str,
) -> Result<()> {
    if uid.is_none() && gid.is_none() {
        return Ok(());
    }
    let owner = uid.map(rustix::fs::Uid::from_raw);
    let group = gid.map(rustix::fs::Gid::from_raw);
    rustix::fs::chownat(fd, "", owner, group, AtFlags::EMPTY_PATH).map_err(|e| match e {
        Errno::PERM => Error::InvalidRequest(format!(
            "cannot change the owner or group of {shown}: not permitted (only root may give a \
             file to another user, and an owner may only choose a group it belongs to)"
        )),
        Errno::INVAL => Error::InvalidRequest(format!(
            "cannot change the owner or group of {shown}: the user or group id is not valid here"
        )),
        e => io_error(e, "change the owner of", shown),
    })
}

/// Sets the permission bits of the inode `fd` (an `O_PATH` descriptor whose metadata is `st`).
/// `reopen` opens a regular file again beneath the root, for the `fchmod` fallback.
pub(crate) fn chmod_fd(
    fd: BorrowedFd<'_>,
    st: &Stat,
    mode: u32,
    shown: &str,
    reopen: impl FnOnce() -> rustix::io::Result<OwnedFd>,
) -> Result<()> {
    check_mode(mode, shown)?;
    let denied = |e: Errno| match e {
        Errno::PERM => Error::InvalidRequest(format!(
            "cannot change the permissions of {shown}: not permitted (it belongs to another user)"
        )),
        e => io_error(e, "change the permissions of", shown),
    };
    match fchmodat2_empty(fd, mode) {
        Ok(()) => return Ok(()),
        // Missing (before Linux 6.6), or refused by a seccomp filter that does not know it: try
        // `fchmod` on a real descriptor. A genuine EPERM comes back from that too.
        Err(Errno::NOSYS | Errno::PERM | Errno::INVAL | Errno::OPNOTSUPP) => {}
        Err(e) => return Err(denied(e)),
    }
    chmod_reopened(fd, st, mode, shown, reopen)
}

/// The `fchmod` fallback of [`chmod_fd`]: re-opens the inode without `O_PATH`.
fn chmod_reopened(
    fd: BorrowedFd<'_>,
    st: &Stat,
    mode: u32,
    shown: &str,
    reopen: impl FnOnce() -> rustix::io::Result<OwnedFd>,
) -> Result<()> {
    let denied = |e: Errno| match e {
        Errno::PERM => Error::InvalidRequest(format!(
            "cannot change the permissions of {shown}: not permitted (it belongs to another user)"
        )),
        e => io_error(e, "change the permissions of", shown),
    };
    let real = if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
        rustix::fs::openat(
            fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(denied)?
    } else {
        let f = reopen().map_err(|e| resolve_error(e, shown))?;
        let now = rustix::fs::fstat(&f).map_err(|e| io_error(e, "stat", shown))?;
        if !same_inode(st, &now) || FileType::from_raw_mode(now.st_mode) != FileType::RegularFile {
            return Err(Error::Conflict(format!(
                "{shown} changed while its permissions were being set; try again"
            )));
        }
        f
    };
    rustix::fs::fchmod(&real, Mode::from_raw_mode(mode)).map_err(denied)
}

/// `fchmodat2(fd, "", mode, AT_EMPTY_PATH)`: changes the mode of the inode an `O_PATH`
/// descriptor refers to (Linux 6.6 and later).
fn fchmodat2_empty(fd: BorrowedFd<'_>, mode: u32) -> rustix::io::Result<()> {
    // SAFETY: the arguments are a live descriptor borrowed for the duration of the call, a
    // pointer to a static NUL-terminated empty string, and plain integers; the system call reads
    // the string and writes no memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fchmodat2,
            fd.as_raw_fd() as libc::c_long,
            c"".as_ptr(),
            mode as libc::c_long,
            libc::AT_EMPTY_PATH as libc::c_long,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO))
    }
}

/// Re-opens a regular file beneath `root` for `fchmod` (never blocking, never a terminal).
pub(crate) fn reopen_file<'a>(
    root: BorrowedFd<'a>,
    rel: &'a str,
) -> impl FnOnce() -> rustix::io::Result<OwnedFd> + 'a {
    move || {
        let flags = OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        match open_beneath(root, rel, flags | OFlags::RDONLY, RESOLVE) {
            Err(Errno::ACCESS) => open_beneath(root, rel, flags | OFlags::WRONLY, RESOLVE),
            r => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::os::unix::fs::PermissionsExt;

    use sessionbox_core::Limits;

    use super::*;
    use crate::Workspace;

    fn mode_of(p: &std::path::Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn the_fchmod_fallback_sets_files_and_directories() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        std::fs::write(tmp.path().join("d/f"), b"x").unwrap();
        let ws = Workspace::open(tmp.path(), "/w", Limits::default()).unwrap();
        for (p, m) in [("d", 0o700), ("d/f", 0o640)] {
            let rel = ws.resolve(p).unwrap();
            let (fd, st) = open_target(ws.root(), &rel).unwrap();
            chmod_reopened(fd.as_fd(), &st, m, p, reopen_file(ws.root(), p)).unwrap();
            assert_eq!(mode_of(&tmp.path().join(p)), m, "{p}");
        }
        // A file replaced between the lookup and the re-open is refused.
        let rel = ws.resolve("d/f").unwrap();
        let (fd, st) = open_target(ws.root(), &rel).unwrap();
        std::fs::remove_file(tmp.path().join("d/f")).unwrap();
        std::fs::write(tmp.path().join("d/f"), b"other").unwrap();
        let e = chmod_reopened(fd.as_fd(), &st, 0o600, "d/f", reopen_file(ws.root(), "d/f"));
        assert_eq!(e.unwrap_err().code(), "conflict");
    }
}
