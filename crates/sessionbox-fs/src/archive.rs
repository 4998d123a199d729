//! Workspace archives: the tar of a whole workspace ([`Workspace::archive`]) and its restore
//! ([`Workspace::restore`]), following the rules of `sessionbox_core`'s snapshot module.
//!
//! Taking an archive walks the tree depth first in name order. Every directory is opened from
//! the root with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)`, so a link
//! is never entered and another file system mounted inside is not entered either (it is counted
//! as skipped, as is a path longer than 4,095 bytes, with what is beneath it); files are opened
//! in their directory's descriptor with `O_NOFOLLOW`, links read
//! with `readlinkat`. A file that changes size while it is read is stored with the size it had
//! when it was opened (cut, or padded with zeros), so the archive stays well formed.
//!
//! Restoring reads the archive twice. The first pass checks every entry and changes nothing:
//! only regular files, directories and links; no absolute path, no `..`, no path through a link
//! or a file of the archive, no path given twice (a directory may repeat), at most
//! [`MAX_ARCHIVE_ENTRIES`] entries. The second pass empties the workspace (the root itself is
//! kept: it may be a mount point; a mount point inside makes the restore fail) and writes the
//! entries: each parent directory opened or made one component at a time without following a
//! link or crossing a mount, files created `O_CREAT | O_EXCL | O_NOFOLLOW`, directories with
//! `mkdirat`, links with `symlinkat`. Modes (permission bits, set-id bits dropped) and
//! modification times are applied; directories' last, deepest first, so a read-only directory
//! is filled before it becomes read-only.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat, Timespec, Timestamps};
use rustix::io::Errno;
use sessionbox_core::{ArchiveStats, Error, MAX_ARCHIVE_ENTRIES, Result};
use tar::{EntryType, Header};

use crate::resolve::{RESOLVE_NO_LINKS, io_error, open_beneath, stat_mtime, stat_size};
use crate::walk::{join, lossy, read_entries};
use crate::{Workspace, errno_of, tree};

/// No link followed, nothing mounted inside entered.
const RESOLVE_WALK: ResolveFlags = RESOLVE_NO_LINKS.union(ResolveFlags::NO_XDEV);
/// Longest name the ustar header holds; longer paths and link targets get a PAX record.
const USTAR_NAME: usize = 100;
/// Longest path an archive entry may have, in bytes (the kernel's `PATH_MAX` less one).
const MAX_PATH: usize = 4095;
/// Longest component, in bytes.
const MAX_NAME: usize = 255;
/// Permission bits kept of a file's mode (set-id bits dropped).
const FILE_MODE_BITS: u32 = 0o777;
/// Permission bits kept of a directory's mode (set-id bits dropped, the sticky bit kept).
const DIR_MODE_BITS: u32 = 0o1777;

fn archive_io(e: &std::io::Error) -> Error {
    Error::Backend(format!("cannot write the archive: {e}"))
}

/// See [`Workspace::archive`].
pub(crate) fn write<W: Write>(ws: &Workspace, out: W) -> Result<ArchiveStats> {
    let mut b = tar::Builder::new(out);
    let mut stats = ArchiveStats::default();
    let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(dir) = stack.pop() {
        let path: &[u8] = if dir.is_empty() { b"." } else { &dir };
        let fd = match open_beneath(
            ws.root(),
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            RESOLVE_WALK,
        ) {
            Ok(fd) => fd,
            // Another file system mounted here: not entered.
            Err(Errno::XDEV) => {
                stats.skipped += 1;
                continue;
            }
            // Removed or replaced since it was listed.
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => continue,
            Err(e) => return Err(io_error(e, "open", &lossy(&dir))),
        };
        let shown = || lossy(&dir);
        if !dir.is_empty() {
            let st = rustix::fs::fstat(&fd).map_err(|e| io_error(e, "stat", &shown()))?;
            count(&mut stats, |s| s.directories += 1)?;
            let mut h = header(EntryType::Directory, &st, DIR_MODE_BITS);
            let mut name = dir.clone();
            name.push(b'/');
            append(&mut b, &mut h, &name, None, std::io::empty()).map_err(|e| archive_io(&e))?;
        }
        let entries = read_entries(&fd, usize::MAX)
            .map_err(|e| io_error(e, "list", &shown()))?
            .unwrap_or_default();
        let mut subdirs = Vec::new();
        for (name, ft) in entries {
            let child = join(&dir, name.as_bytes());
            // A path no archive entry may have (nor the kernel's calls take whole): left out
            // and counted, with everything beneath it.
            if child.len() > MAX_PATH {
                stats.skipped += 1;
                continue;
            }
            match ft {
                FileType::Directory => subdirs.push(child),
                FileType::RegularFile => add_file(&mut b, &mut stats, fd.as_fd(), &name, &child)?,
                FileType::Symlink => {
                    let target = match rustix::fs::readlinkat(&fd, &name, Vec::new()) {
                        Ok(t) => t,
                        // Gone, or not a link any more.
                        Err(Errno::NOENT | Errno::INVAL) => continue,
                        Err(e) => return Err(io_error(e, "read the link", &lossy(&child))),
                    };
                    let st = rustix::fs::statat(&fd, &name, AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(|e| io_error(e, "stat", &lossy(&child)))?;
                    count(&mut stats, |s| s.links += 1)?;
                    let mut h = header(EntryType::Symlink, &st, FILE_MODE_BITS);
                    h.set_mode(0o777);
                    append(
                        &mut b,
                        &mut h,
                        &child,
                        Some(target.as_bytes()),
                        std::io::empty(),
                    )
                    .map_err(|e| archive_io(&e))?;
                }
                _ => stats.skipped += 1,
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
    b.into_inner()
        .and_then(|mut w| w.flush())
        .map_err(|e| archive_io(&e))?;
    Ok(stats)
}

/// Adds one regular file, opened in its directory without following a link.
fn add_file<W: Write>(
    b: &mut tar::Builder<W>,
    stats: &mut ArchiveStats,
    dir: BorrowedFd<'_>,
    name: &CString,
    child: &[u8],
) -> Result<()> {
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        // Gone, or replaced by a link.
        Err(Errno::NOENT | Errno::LOOP) => return Ok(()),
        Err(e) => return Err(io_error(e, "open", &lossy(child))),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| io_error(e, "stat", &lossy(child)))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        stats.skipped += 1;
        return Ok(());
    }
    let size = stat_size(&st);
    count(stats, |s| {
        s.files += 1;
        s.bytes += size;
    })?;
    let mut h = header(EntryType::Regular, &st, FILE_MODE_BITS);
    h.set_size(size);
    // Exactly `size` bytes whatever the file does meanwhile: cut, or padded with zeros.
    let data = File::from(fd)
        .take(size)
        .chain(std::io::repeat(0))
        .take(size);
    append(b, &mut h, child, None, data).map_err(|e| {
        if e.raw_os_error().is_some() && e.kind() != std::io::ErrorKind::BrokenPipe {
            io_error(errno_of(&e), "read", &lossy(child))
        } else {
            archive_io(&e)
        }
    })
}

/// Counts an entry, refusing past [`MAX_ARCHIVE_ENTRIES`].
fn count(stats: &mut ArchiveStats, f: impl FnOnce(&mut ArchiveStats)) -> Result<()> {
    f(stats);
    if stats.entries() > MAX_ARCHIVE_ENTRIES {
        return Err(Error::TooLarge {
            what: format!(
                "the workspace's archive (more than {MAX_ARCHIVE_ENTRIES} files, directories \
                 and links)"
            ),
            limit: MAX_ARCHIVE_ENTRIES,
        });
    }
    Ok(())
}

fn header(kind: EntryType, st: &Stat, bits: u32) -> Header {
    let mut h = Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(st.st_mode & bits);
    h.set_mtime(u64::try_from(stat_mtime(st)).unwrap_or(0));
    h.set_uid(0);
    h.set_gid(0);
    h.set_size(0);
    h
}

/// Appends one entry, its path (and link target) in the ustar header when they fit, else in a
/// PAX extended header before it.
fn append<W: Write>(
    b: &mut tar::Builder<W>,
    h: &mut Header,
    path: &[u8],
    link: Option<&[u8]>,
    data: impl Read,
) -> std::io::Result<()> {
    let mut pax = Vec::new();
    if path.len() <= USTAR_NAME {
        h.as_old_mut().name[..path.len()].copy_from_slice(path);
    } else {
        pax_record(&mut pax, b"path", path);
        let short = &path[..USTAR_NAME];
        h.as_old_mut().name.copy_from_slice(short);
    }
    if let Some(target) = link {
        if target.len() <= USTAR_NAME {
            h.as_old_mut().linkname[..target.len()].copy_from_slice(target);
        } else {
            pax_record(&mut pax, b"linkpath", target);
            h.as_old_mut()
                .linkname
                .copy_from_slice(&target[..USTAR_NAME]);
        }
    }
    if !pax.is_empty() {
        let mut x = Header::new_ustar();
        x.set_entry_type(EntryType::XHeader);
        x.as_old_mut().name[..9].copy_from_slice(b"PaxHeader");
        x.set_mode(0o644);
        x.set_size(pax.len() as u64);
        x.set_cksum();
        b.append(&x, pax.as_slice())?;
    }
    h.set_cksum();
    b.append(h, data)
}

/// One PAX record: `LEN KEY=VALUE\n`, where LEN counts the whole record, itself included.
fn pax_record(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    let rest = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// What one archive entry is, once checked.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    File,
    Dir,
    Link,
}

fn refuse(what: impl std::fmt::Display) -> Error {
    Error::InvalidRequest(format!("the archive cannot be restored: {what}"))
}

fn not_tar(e: &std::io::Error) -> Error {
    refuse(format!("it is not a readable tar archive ({:?})", e.kind()))
}

/// The kind of an entry, `None` for one that holds no file (a PAX global header).
fn kind_of(et: EntryType, shown: &str) -> Result<Option<Kind>> {
    Ok(Some(match et {
        EntryType::Regular | EntryType::Continuous => Kind::File,
        EntryType::Directory => Kind::Dir,
        EntryType::Symlink => Kind::Link,
        EntryType::XGlobalHeader => return Ok(None),
        EntryType::Link => return Err(refuse(format!("{shown} is a hard link"))),
        other => {
            return Err(refuse(format!(
                "{shown} is not a file, a directory or a symbolic link ({other:?})"
            )));
        }
    }))
}

/// The entry's path relative to the root, `.` components and trailing slashes dropped; empty
/// for the root itself.
fn normalize(raw: &[u8]) -> Result<Vec<u8>> {
    let shown = || lossy(raw);
    if raw.starts_with(b"/") {
        return Err(refuse(format!("{} is an absolute path", shown())));
    }
    let mut out = Vec::with_capacity(raw.len());
    for comp in raw.split(|c| *c == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => return Err(refuse(format!("{} has a '..' component", shown()))),
            c if c.len() > MAX_NAME => {
                return Err(refuse(format!("{} has a component too long", shown())));
            }
            c => {
                if !out.is_empty() {
                    out.push(b'/');
                }
                out.extend_from_slice(c);
            }
        }
    }
    if out.len() > MAX_PATH {
        return Err(refuse(format!("{} is too long a path", shown())));
    }
    Ok(out)
}

/// See [`check`]: checks every entry of the archive read from its start; changes nothing.
pub(crate) fn check<R: Read>(archive: R) -> Result<ArchiveStats> {
    check_limited(archive, MAX_ARCHIVE_ENTRIES)
}

/// [`check`] with at most `max` entries.
fn check_limited<R: Read>(archive: R, max: u64) -> Result<ArchiveStats> {
    let mut ar = tar::Archive::new(archive);
    let mut stats = ArchiveStats::default();
    let mut seen: HashMap<Vec<u8>, Kind> = HashMap::new();
    for entry in ar.entries().map_err(|e| not_tar(&e))? {
        let entry = entry.map_err(|e| not_tar(&e))?;
        let raw = entry.path_bytes();
        let shown = lossy(&raw);
        let Some(kind) = kind_of(entry.header().entry_type(), &shown)? else {
            continue;
        };
        let path = normalize(&raw)?;
        if path.is_empty() {
            if kind == Kind::Dir {
                continue; // the root itself
            }
            return Err(refuse(format!("{shown:?} names the workspace root")));
        }
        if kind == Kind::Link {
            let target = entry.link_name_bytes().unwrap_or_default();
            if target.is_empty() || target.len() > MAX_PATH {
                return Err(refuse(format!(
                    "the link {shown} has an empty or too long target"
                )));
            }
        }
        for (i, _) in path.iter().enumerate().filter(|(_, c)| **c == b'/') {
            match seen.get(&path[..i]) {
                Some(Kind::Dir) => {}
                Some(Kind::Link) => {
                    return Err(refuse(format!(
                        "{shown} goes through the symbolic link {} of the archive",
                        lossy(&path[..i])
                    )));
                }
                Some(Kind::File) => {
                    return Err(refuse(format!(
                        "{shown} goes through the file {} of the archive",
                        lossy(&path[..i])
                    )));
                }
                None => {
                    seen.insert(path[..i].to_vec(), Kind::Dir);
                }
            }
        }
        match seen.get(&path) {
            None => {}
            Some(Kind::Dir) if kind == Kind::Dir => continue,
            Some(_) => return Err(refuse(format!("{shown} is given twice"))),
        }
        let size = entry.size();
        seen.insert(path, kind);
        match kind {
            Kind::File => {
                stats.files += 1;
                stats.bytes += size;
            }
            Kind::Dir => stats.directories += 1,
            Kind::Link => stats.links += 1,
        }
        if stats.entries() > max {
            return Err(refuse(format!("it holds more than {max} entries")));
        }
    }
    Ok(stats)
}

/// See [`Workspace::restore`].
pub(crate) fn restore(ws: &Workspace, archive: &mut File) -> Result<ArchiveStats> {
    let rewind = |f: &mut File| {
        f.seek(SeekFrom::Start(0))
            .map_err(|e| Error::Backend(format!("cannot read the archive: {e}")))
    };
    sessionbox_archive::check_extension_sizes(archive)?;
    rewind(archive)?;
    let stats = check(std::io::BufReader::new(&mut *archive))?;
    rewind(archive)?;
    // An archive that cannot fit is refused before anything is removed.
    crate::room::check(ws, &stats)?;
    empty_root(ws)?;
    let mut ar = tar::Archive::new(std::io::BufReader::new(&mut *archive));
    let mut parents = Parents::default();
    let mut dirs: Vec<(Vec<u8>, u32, u64)> = Vec::new();
    for entry in ar.entries().map_err(|e| not_tar(&e))? {
        let mut entry = entry.map_err(|e| not_tar(&e))?;
        let raw = entry.path_bytes().into_owned();
        let Some(kind) = kind_of(entry.header().entry_type(), &lossy(&raw))? else {
            continue;
        };
        let path = normalize(&raw)?;
        if path.is_empty() {
            continue;
        }
        let shown = lossy(&path);
        let (parent, name) = match path.iter().rposition(|c| *c == b'/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&path[..0], &path[..]),
        };
        let dir = parents.open(ws.root(), parent)?;
        let name = OsStr::from_bytes(name);
        let mode = entry.header().mode().unwrap_or(0o644);
        let mtime = entry.header().mtime().unwrap_or(0);
        match kind {
            Kind::Dir => {
                match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(io_error(e, "create directory", &shown)),
                }
                dirs.push((path.clone(), mode & DIR_MODE_BITS, mtime));
            }
            Kind::Link => {
                let target = entry.link_name_bytes().unwrap_or_default().into_owned();
                rustix::fs::symlinkat(OsStr::from_bytes(&target), dir, name)
                    .map_err(|e| io_error(e, "create the link", &shown))?;
            }
            Kind::File => {
                let fd = rustix::fs::openat(
                    dir,
                    name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| io_error(e, "create", &shown))?;
                let mut file = File::from(fd);
                std::io::copy(&mut entry, &mut file).map_err(|e| match e.raw_os_error() {
                    Some(_) => io_error(errno_of(&e), "write", &shown),
                    None => not_tar(&e),
                })?;
                rustix::fs::fchmod(&file, Mode::from_raw_mode(mode & FILE_MODE_BITS))
                    .map_err(|e| io_error(e, "set the mode of", &shown))?;
                set_mtime(file.as_fd(), mtime);
            }
        }
    }
    drop(parents);
    // Deepest (latest) first: a directory's own changes come after its children's.
    for (path, mode, mtime) in dirs.into_iter().rev() {
        let shown = lossy(&path);
        let fd = open_beneath(
            ws.root(),
            path.as_slice(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            RESOLVE_WALK,
        )
        .map_err(|e| io_error(e, "open", &shown))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
            .map_err(|e| io_error(e, "set the mode of", &shown))?;
        set_mtime(fd.as_fd(), mtime);
    }
    Ok(stats)
}

/// Best effort: a time the file system refuses leaves the time of the restore.
fn set_mtime(fd: BorrowedFd<'_>, mtime: u64) {
    let t = Timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(i64::MAX),
        tv_nsec: 0,
    };
    let _ = rustix::fs::futimens(
        fd,
        &Timestamps {
            last_access: t,
            last_modification: t,
        },
    );
}

/// Removes every entry of the root (not the root itself) without following a link or
/// entering a mount point.
fn empty_root(ws: &Workspace) -> Result<()> {
    let root = open_beneath(
        ws.root(),
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        RESOLVE_WALK,
    )
    .map_err(|e| io_error(e, "open", "."))?;
    let names = read_entries(&root, usize::MAX)
        .map_err(|e| io_error(e, "list", "."))?
        .unwrap_or_default();
    for (name, _) in names {
        let shown = name.to_string_lossy().into_owned();
        match tree::remove_at(root.as_fd(), &name, tree::Top::SameMount) {
            Ok(_) => {}
            Err(Errno::XDEV | Errno::BUSY) => {
                return Err(Error::Conflict(format!(
                    "{shown} is or contains a mount point; the workspace cannot be replaced"
                )));
            }
            Err(e) => return Err(io_error(e, "remove", &shown)),
        }
    }
    Ok(())
}

/// The parent directory of the entry being written, kept open while consecutive entries share
/// it; made one component at a time when missing.
#[derive(Default)]
struct Parents {
    last: Option<(Vec<u8>, OwnedFd)>,
}

impl Parents {
    fn open(&mut self, root: BorrowedFd<'_>, parent: &[u8]) -> Result<BorrowedFd<'_>> {
        let cached = self.last.as_ref().is_some_and(|(p, _)| p == parent);
        if !cached {
            let fd = make_dirs(root, parent)?;
            self.last = Some((parent.to_vec(), fd));
        }
        Ok(self
            .last
            .as_ref()
            .map(|(_, fd)| fd.as_fd())
            .expect("set above"))
    }
}

/// Opens `rel` (empty: the root), making missing directories `0o755` (before umask), one component at a time
/// beneath its parent's descriptor: never through a link, never across a mount.
fn make_dirs(root: BorrowedFd<'_>, rel: &[u8]) -> Result<OwnedFd> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut cur =
        open_beneath(root, ".", flags, RESOLVE_WALK).map_err(|e| io_error(e, "open", "."))?;
    if rel.is_empty() {
        return Ok(cur);
    }
    for (i, comp) in rel.split(|c| *c == b'/').enumerate() {
        let shown = || {
            lossy(
                &rel[..rel
                    .split(|c| *c == b'/')
                    .take(i + 1)
                    .map(|c| c.len() + 1)
                    .sum::<usize>()
                    - 1],
            )
        };
        let next = match open_beneath(cur.as_fd(), comp, flags, RESOLVE_WALK) {
            Err(Errno::NOENT) => {
                match rustix::fs::mkdirat(&cur, OsStr::from_bytes(comp), Mode::from_raw_mode(0o755))
                {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(io_error(e, "create directory", &shown())),
                }
                open_beneath(cur.as_fd(), comp, flags, RESOLVE_WALK)
            }
            r => r,
        };
        cur = next.map_err(|e| io_error(e, "open", &shown()))?;
    }
    Ok(cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(entries: &[(EntryType, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (kind, name) in entries {
            let mut h = Header::new_ustar();
            h.set_entry_type(*kind);
            h.as_old_mut().name[..name.len()].copy_from_slice(name);
            h.set_mode(0o644);
            h.set_size(0);
            h.set_cksum();
            b.append(&h, std::io::empty()).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn more_entries_than_the_limit_are_refused_and_the_limit_itself_passes() {
        let three = tar_of(&[
            (EntryType::Directory, b"d/"),
            (EntryType::Regular, b"d/a"),
            (EntryType::Regular, b"d/b"),
        ]);
        assert_eq!(check_limited(three.as_slice(), 3).unwrap().entries(), 3);
        let e = check_limited(three.as_slice(), 2).unwrap_err();
        assert_eq!(e.code(), "invalid_request", "{e}");
        assert!(e.to_string().contains("more than 2 entries"), "{e}");
    }

    #[test]
    fn paths_are_normalised_or_refused() {
        assert_eq!(normalize(b"./a//b/").unwrap(), b"a/b");
        assert_eq!(normalize(b"./").unwrap(), b"");
        for bad in [&b"/etc/passwd"[..], b"../x", b"a/../../x", b"a/.."] {
            assert_eq!(normalize(bad).unwrap_err().code(), "invalid_request");
        }
        let long = [b'x'; 256];
        assert!(normalize(&long).is_err());
    }

    #[test]
    fn a_directory_may_repeat_but_nothing_else_may() {
        let dirs = tar_of(&[(EntryType::Directory, b"d/"), (EntryType::Directory, b"d")]);
        assert_eq!(check(dirs.as_slice()).unwrap().directories, 1);
        let files = tar_of(&[(EntryType::Regular, b"f"), (EntryType::Regular, b"./f")]);
        assert!(check(files.as_slice()).is_err());
        let implicit = tar_of(&[(EntryType::Regular, b"d/f"), (EntryType::Symlink, b"d")]);
        assert!(check(implicit.as_slice()).is_err());
    }

    #[test]
    fn a_huge_extended_header_is_refused_before_it_is_read_and_pax_sizes_are_followed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.tar");
        // A PAX header of 1 MiB.
        let mut b = tar::Builder::new(Vec::new());
        let mut x = Header::new_ustar();
        x.set_entry_type(EntryType::XHeader);
        x.set_size(1 << 20);
        x.set_cksum();
        b.append(&x, std::io::repeat(b'a').take(1 << 20)).unwrap();
        std::fs::write(&path, b.into_inner().unwrap()).unwrap();
        let e = sessionbox_archive::check_extension_sizes(&File::open(&path).unwrap()).unwrap_err();
        assert_eq!(e.code(), "invalid_request", "{e}");

        // A small PAX header whose size record the walk follows: the huge GNU long name hidden
        // in what the header's own size field claims is data is still found.
        let mut pax = Vec::new();
        pax_record(&mut pax, b"size", b"0");
        let mut b = tar::Builder::new(Vec::new());
        let mut x = Header::new_ustar();
        x.set_entry_type(EntryType::XHeader);
        x.set_size(pax.len() as u64);
        x.set_cksum();
        b.append(&x, pax.as_slice()).unwrap();
        let mut f = Header::new_ustar();
        f.set_entry_type(EntryType::Regular);
        f.as_old_mut().name[..1].copy_from_slice(b"f");
        f.set_size(512);
        f.set_cksum();
        let mut l = Header::new_gnu();
        l.set_entry_type(EntryType::GNULongName);
        l.set_size(1 << 20);
        l.set_cksum();
        b.append(&f, l.as_bytes().as_slice()).unwrap();
        std::fs::write(&path, b.into_inner().unwrap()).unwrap();
        let e = sessionbox_archive::check_extension_sizes(&File::open(&path).unwrap()).unwrap_err();
        assert!(e.to_string().contains("extended header"), "{e}");
    }

    #[test]
    fn pax_records_count_their_own_length() {
        for n in [1usize, 5, 90, 94, 95, 96, 990, 995, 1000, 5000] {
            let mut out = Vec::new();
            pax_record(&mut out, b"path", &vec![b'a'; n]);
            let (len, _) = std::str::from_utf8(&out).unwrap().split_once(' ').unwrap();
            assert_eq!(len.parse::<usize>().unwrap(), out.len(), "{n}");
        }
    }

    #[test]
    fn an_archive_written_here_reads_back_with_long_paths_and_link_targets() {
        let dir = tempfile::tempdir().unwrap();
        let long = "d".repeat(120);
        std::fs::create_dir(dir.path().join(&long)).unwrap();
        std::fs::write(dir.path().join(&long).join("f"), b"x").unwrap();
        let target = "t".repeat(150);
        std::os::unix::fs::symlink(&target, dir.path().join("l")).unwrap();
        let ws = Workspace::open(dir.path(), "/w", sessionbox_core::Limits::default()).unwrap();
        let mut out = Vec::new();
        let stats = ws.archive(&mut out).unwrap();
        assert_eq!((stats.files, stats.directories, stats.links), (1, 1, 1));
        assert_eq!(check(out.as_slice()).unwrap(), stats);
        let mut ar = tar::Archive::new(out.as_slice());
        let mut seen = Vec::new();
        for e in ar.entries().unwrap() {
            let e = e.unwrap();
            seen.push((
                e.path_bytes().into_owned(),
                e.link_name_bytes().map(|l| l.into_owned()),
            ));
        }
        assert!(seen.contains(&(format!("{long}/f").into_bytes(), None)));
        assert!(seen.contains(&(b"l".to_vec(), Some(target.into_bytes()))));
    }

    /// A path longer than an entry may have (4,095 bytes) is left out with what is beneath
    /// it, counted as skipped: the archive is taken whole otherwise (it used to end half-way).
    #[test]
    fn a_path_past_the_longest_an_entry_may_have_is_left_out_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kept"), b"k").unwrap();
        // 30 directories of 200-byte names: 6,030 bytes, made one step at a time.
        let mut fd = rustix::fs::open(dir.path(), OFlags::DIRECTORY, Mode::empty()).unwrap();
        for _ in 0..30 {
            let name = "n".repeat(200);
            rustix::fs::mkdirat(&fd, name.as_str(), Mode::from_raw_mode(0o700)).unwrap();
            fd = rustix::fs::openat(&fd, name.as_str(), OFlags::DIRECTORY, Mode::empty()).unwrap();
        }
        let leaf = rustix::fs::openat(
            &fd,
            "leaf",
            OFlags::CREATE | OFlags::WRONLY,
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
        drop(leaf);
        let ws = Workspace::open(dir.path(), "/w", sessionbox_core::Limits::default()).unwrap();
        let mut out = Vec::new();
        let stats = ws.archive(&mut out).unwrap();
        // 20 directories fit (20 x 201 = 4,020 bytes); the 21st is left out with the rest.
        assert_eq!(
            (stats.files, stats.directories, stats.skipped),
            (1, 20, 1),
            "{stats:?}"
        );
        let read = check(out.as_slice()).unwrap();
        assert_eq!(
            (read.files, read.directories),
            (1, 20),
            "a whole archive: {read:?}"
        );
    }
}
