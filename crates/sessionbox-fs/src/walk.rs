//! Directory walks (`list`, `glob`, `grep`), `remove` and `rename`.
//!
//! Walks open every directory with `openat2` and `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`
//! relative to the walk's starting directory, and classify entries with `statat(...,
//! AT_SYMLINK_NOFOLLOW)` when `getdents` does not say: a link is never followed into a
//! directory, and a directory swapped for a link mid-walk is skipped, not entered.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::Read;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType, OFlags};
use rustix::io::Errno;
use sessionbox_core::{DirEntry, Error, GrepMatch, GrepRequest, Result, WorkspacePath, patterns};

use crate::resolve::{
    RESOLVE, RESOLVE_NO_LINKS, ensure_dirs, io_error, open_beneath, open_parent, resolve_error,
    stat_mtime, stat_size,
};
use crate::{Workspace, errno_of, kind_of, tree};

/// Bytes inspected for a NUL to call a file binary.
const BINARY_PROBE: usize = 8 * 1024;
/// Longest line `grep` returns, in bytes.
const MAX_LINE: usize = 4 * 1024;

/// Reads the names and types of a directory's entries (without `.` and `..`), classifying
/// unknown types with `statat` (no link followed). Stops with `Err(count)` once more than
/// `max` entries were seen.
pub(crate) fn read_entries(
    fd: &OwnedFd,
    max: usize,
) -> rustix::io::Result<Result<Vec<(CString, FileType)>, usize>> {
    let mut dir = Dir::read_from(fd)?;
    let mut out = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        if out.len() == max {
            return Ok(Err(max + 1));
        }
        let mut ft = entry.file_type();
        if ft == FileType::Unknown {
            match rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => ft = FileType::from_raw_mode(st.st_mode),
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(e),
            }
        }
        out.push((name.to_owned(), ft));
    }
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(Ok(out))
}

/// See [`Workspace::list`].
pub(crate) fn list(ws: &Workspace, rel: &WorkspacePath) -> Result<Vec<DirEntry>> {
    let shown = rel.as_relative();
    let fd = open_beneath(
        ws.root(),
        shown,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        RESOLVE,
    )
    .map_err(|e| match e {
        Errno::NOTDIR => Error::Conflict(format!("{shown} is not a directory")),
        e => resolve_error(e, shown),
    })?;
    let max = ws.limits().max_entries;
    let names = read_entries(&fd, max)
        .map_err(|e| io_error(e, "list", shown))?
        .map_err(|_| too_many(format!("the listing of {shown}"), max))?;
    let mut out = Vec::with_capacity(names.len());
    for (name, _) in names {
        let st = match rustix::fs::statat(&fd, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => continue, // removed meanwhile
            Err(e) => return Err(io_error(e, "stat an entry of", shown)),
        };
        out.push(DirEntry {
            name: name.to_string_lossy().into_owned(),
            kind: kind_of(FileType::from_raw_mode(st.st_mode)),
            size: stat_size(&st),
            modified_unix: stat_mtime(&st),
        });
    }
    Ok(out)
}

fn too_many(what: String, limit: usize) -> Error {
    // The limit counts entries, not bytes: said in `what`, so the message names no unit of
    // its own (`u64::MAX`).
    Error::TooLarge {
        what: format!("{what} is too large: more than {limit} entries"),
        limit: u64::MAX,
    }
}

/// Walks the tree below `start` (a directory descriptor whose workspace-relative path is
/// `prefix`, empty for the root) depth first in name order, calling `visit` with each
/// non-directory entry's path relative to `start`, its workspace-relative path, and its type.
/// Links are reported, never followed.
fn walk(
    start: BorrowedFd<'_>,
    prefix: &[u8],
    mut visit: impl FnMut(&[u8], &[u8], FileType) -> Result<ControlFlow<()>>,
) -> Result<()> {
    enum Item {
        Dir(Vec<u8>),
        Other(Vec<u8>, FileType),
    }
    let mut stack = vec![Item::Dir(Vec::new())];
    while let Some(item) = stack.pop() {
        match item {
            Item::Other(sub, ft) => {
                let shown = join(prefix, &sub);
                if visit(&sub, &shown, ft)?.is_break() {
                    return Ok(());
                }
            }
            Item::Dir(sub) => {
                let path: &[u8] = if sub.is_empty() { b"." } else { &sub };
                let fd = match open_beneath(
                    start,
                    path,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    RESOLVE_NO_LINKS,
                ) {
                    Ok(fd) => fd,
                    // Removed, or replaced by a file or a link, since it was listed; or nested
                    // deeper than a path can name.
                    Err(
                        Errno::NOENT
                        | Errno::NOTDIR
                        | Errno::LOOP
                        | Errno::XDEV
                        | Errno::NAMETOOLONG,
                    ) => continue,
                    Err(e) => return Err(io_error(e, "open", &lossy(&join(prefix, &sub)))),
                };
                let entries = read_entries(&fd, usize::MAX)
                    .map_err(|e| io_error(e, "list", &lossy(&join(prefix, &sub))))?
                    .unwrap_or_default();
                for (name, ft) in entries.into_iter().rev() {
                    let child = join(&sub, name.as_bytes());
                    stack.push(if ft == FileType::Directory {
                        Item::Dir(child)
                    } else {
                        Item::Other(child, ft)
                    });
                }
            }
        }
    }
    Ok(())
}

pub(crate) fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    if a.is_empty() {
        return b.to_vec();
    }
    let mut v = Vec::with_capacity(a.len() + 1 + b.len());
    v.extend_from_slice(a);
    v.push(b'/');
    v.extend_from_slice(b);
    v
}

pub(crate) fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn normalize_pattern(ws: &Workspace, pattern: &str) -> Result<String> {
    patterns::normalize_glob(ws.presented_root(), pattern)
}

/// See [`Workspace::glob`].
pub(crate) fn glob(ws: &Workspace, pattern: &str) -> Result<Vec<String>> {
    let norm = normalize_pattern(ws, pattern)?;
    let matcher = patterns::glob_matcher(&norm)?;
    // Start the walk at the longest literal directory prefix of the pattern, opened without
    // following any link (as the walk itself would not).
    let comps: Vec<&str> = norm.split('/').collect();
    let literal = comps[..comps.len() - 1]
        .iter()
        .take_while(|c| !c.contains(['*', '?', '[', ']', '{', '}', '\\']))
        .copied()
        .collect::<Vec<_>>()
        .join("/");
    let start = match open_beneath(
        ws.root(),
        if literal.is_empty() { "." } else { &literal },
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        RESOLVE_NO_LINKS,
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::XDEV) => return Ok(Vec::new()),
        Err(e) => return Err(io_error(e, "open", &literal)),
    };
    let max = ws.limits().max_entries;
    let mut out = Vec::new();
    walk(start.as_fd(), literal.as_bytes(), |_, shown, ft| {
        if ft != FileType::Directory && matcher.is_match(Path::new(OsStr::from_bytes(shown))) {
            if out.len() == max {
                return Err(too_many(format!("the matches of {pattern:?}"), max));
            }
            out.push(lossy(shown));
        }
        Ok(ControlFlow::Continue(()))
    })?;
    out.sort();
    Ok(out)
}

/// See [`Workspace::grep`].
pub(crate) fn grep(ws: &Workspace, req: &GrepRequest) -> Result<Vec<GrepMatch>> {
    let re = patterns::grep_regex(req)?;
    let filter = match &req.glob {
        Some(g) => Some(patterns::glob_matcher(&normalize_pattern(ws, g)?)?),
        None => None,
    };
    let limits = ws.limits();
    let max = req
        .max_matches
        .unwrap_or(limits.max_matches)
        .min(limits.max_matches);
    let mut out = Vec::new();
    let rel = match &req.path {
        Some(p) => ws.resolve(p)?,
        None => WorkspacePath::root(),
    };
    let shown = rel.as_relative();
    let fd = open_beneath(
        ws.root(),
        shown,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        RESOLVE,
    )
    .map_err(|e| resolve_error(e, shown))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| io_error(e, "stat", shown))?;
    if max == 0 {
        return Ok(out);
    }
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {
            if stat_size(&st) > limits.max_grep_file_bytes {
                return Err(Error::TooLarge {
                    what: format!("file {shown} (for grep)"),
                    limit: limits.max_grep_file_bytes,
                });
            }
            grep_file(
                File::from(fd),
                shown.as_bytes(),
                &re,
                limits.max_grep_file_bytes,
                max,
                &mut out,
            )?;
        }
        FileType::Directory => {
            walk(fd.as_fd(), rel.as_str().as_bytes(), |sub, shown, ft| {
                if ft != FileType::RegularFile {
                    return Ok(ControlFlow::Continue(()));
                }
                if let Some(f) = &filter
                    && !f.is_match(Path::new(OsStr::from_bytes(shown)))
                {
                    return Ok(ControlFlow::Continue(()));
                }
                let Ok(file) = open_beneath(
                    fd.as_fd(),
                    sub,
                    OFlags::RDONLY
                        | OFlags::NOFOLLOW
                        | OFlags::NONBLOCK
                        | OFlags::NOCTTY
                        | OFlags::CLOEXEC,
                    RESOLVE_NO_LINKS,
                ) else {
                    return Ok(ControlFlow::Continue(())); // gone or replaced meanwhile
                };
                match rustix::fs::fstat(&file) {
                    Ok(st)
                        if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
                            && stat_size(&st) <= limits.max_grep_file_bytes => {}
                    _ => return Ok(ControlFlow::Continue(())),
                }
                grep_file(
                    File::from(file),
                    shown,
                    &re,
                    limits.max_grep_file_bytes,
                    max,
                    &mut out,
                )?;
                Ok(if out.len() >= max {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                })
            })?;
        }
        _ => {
            return Err(Error::Conflict(format!(
                "{shown} is not a file or directory"
            )));
        }
    }
    Ok(out)
}

/// Appends the matching lines of one file, unless it is binary or grew past `limit`.
fn grep_file(
    file: File,
    shown: &[u8],
    re: &regex::bytes::Regex,
    limit: u64,
    max: usize,
    out: &mut Vec<GrepMatch>,
) -> Result<()> {
    let mut data = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| io_error(errno_of(&e), "read", &lossy(shown)))?;
    if data.len() as u64 > limit || data[..data.len().min(BINARY_PROBE)].contains(&0) {
        return Ok(());
    }
    let body = data.strip_suffix(b"\n").unwrap_or(&data);
    if body.is_empty() && data.is_empty() {
        return Ok(());
    }
    for (i, line) in body.split(|b| *b == b'\n').enumerate() {
        if out.len() >= max {
            break;
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if re.is_match(line) {
            out.push(GrepMatch {
                path: lossy(shown),
                line_number: i as u64 + 1,
                line: cut_line(line),
            });
        }
    }
    Ok(())
}

/// Lossy UTF-8 of `line`, cut to at most [`MAX_LINE`] bytes on a character boundary.
fn cut_line(line: &[u8]) -> String {
    let mut s = String::from_utf8_lossy(&line[..line.len().min(MAX_LINE)]).into_owned();
    if s.len() > MAX_LINE {
        let mut end = MAX_LINE;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// See [`Workspace::remove`].
pub(crate) fn remove(ws: &Workspace, rel: &WorkspacePath, recursive: bool) -> Result<()> {
    let shown = rel.as_relative();
    if rel.is_root() {
        return Err(Error::Conflict(
            "refusing to remove the workspace root".into(),
        ));
    }
    let (dir, name) = open_parent(ws.root(), rel)?;
    let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| io_error(e, "stat", shown))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return rustix::fs::unlinkat(&dir, name, AtFlags::empty())
            .map_err(|e| io_error(e, "remove", shown));
    }
    if !recursive {
        return rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR).map_err(|e| match e {
            Errno::NOTEMPTY | Errno::EXIST => {
                Error::Conflict(format!("{shown} {}", sessionbox_core::DIRECTORY_NOT_EMPTY))
            }
            e => io_error(e, "remove", shown),
        });
    }
    let cname = CString::new(name).map_err(|_| Error::InvalidPath {
        path: shown.to_owned(),
        reason: "the path contains a NUL byte".into(),
    })?;
    match tree::remove_at(dir.as_fd(), &cname, tree::Top::SameMount) {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::NotFound(shown.to_owned())),
        Err(Errno::XDEV) => Err(Error::Conflict(format!(
            "{shown} contains a mount point; it was not entered"
        ))),
        Err(e) => Err(io_error(e, "remove", shown)),
    }
}

/// See [`Workspace::rename`].
pub(crate) fn rename(ws: &Workspace, from: &WorkspacePath, to: &WorkspacePath) -> Result<()> {
    let (f, t) = (from.as_relative(), to.as_relative());
    if from.is_root() || to.is_root() {
        return Err(Error::Conflict(
            "cannot rename the workspace root or rename onto it".into(),
        ));
    }
    let (from_dir, from_name) = open_parent(ws.root(), from)?;
    rustix::fs::statat(&from_dir, from_name, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| io_error(e, "stat", f))?;
    let to_parent = to.parent().unwrap_or_default();
    let to_dir = ensure_dirs(ws.root(), &to_parent)?;
    let to_name = to.file_name().unwrap_or_default();
    rustix::fs::renameat(&from_dir, from_name, &to_dir, to_name).map_err(|e| match e {
        Errno::INVAL => Error::Conflict(format!("cannot move {f} into itself ({t})")),
        Errno::NOTEMPTY | Errno::EXIST => {
            Error::Conflict(format!("{t} is a directory that is not empty"))
        }
        Errno::ISDIR => Error::Conflict(format!("{t} is a directory and {f} is not")),
        Errno::NOTDIR => Error::Conflict(format!("{f} is a directory and {t} is not")),
        Errno::XDEV => Error::Conflict(format!(
            "cannot move {f} to {t}: they are on different file systems"
        )),
        Errno::NOENT => Error::NotFound(f.to_owned()),
        e => io_error(e, "rename", f),
    })
}
