//! Atomic writes and edits.
//!
//! A write goes to an unnamed temporary file (`O_TMPFILE`) made in the target's own directory
//! descriptor, is synced, and only then gets a name: it is linked under a temporary name
//! `.NAME.sbx-tmp-<random>` (`linkat` through `/proc/self/fd`) and renamed over the target with
//! `renameat` (so a watcher of the directory sees a file moved into place, as for any atomic
//! write). Readers see the old or the new content, never a mix, and a writer killed while it
//! writes (an agent ended with `SIGKILL` mid-upload) leaves nothing behind: until the last two
//! calls the file has no name, and the kernel frees it with the writer's descriptor. Where the
//! file system cannot make an unnamed file, or `/proc` is not there to link one, the temporary
//! file is named from the start (`O_CREAT | O_EXCL`), as before: then a writer killed mid-write
//! leaves it. `renameat` replaces the directory entry itself: even if the target is swapped for a
//! link or a hard link after the checks below, the new content lands in the workspace
//! directory and nothing outside is modified.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use sessionbox_core::{EditRequest, EditResult, Error, Result, WorkspacePath};

use crate::resolve::{
    RESOLVE, RESOLVE_NO_LINKS, ensure_dirs, io_error, open_beneath, open_beneath_mode, open_parent,
    resolve_error, same_inode, stat_nlink, stat_size,
};
use crate::{Workspace, errno_of, too_large_file};

/// Permission bits of a file `write` creates (the process umask does not apply; they are set
/// with `fchmod`).
pub(crate) const NEW_FILE_MODE: u32 = 0o644;

/// The file a write or edit replaces: a directory descriptor beneath the root and one name in
/// it.
#[derive(Debug)]
pub(crate) struct Target {
    /// The directory holding the file (`O_PATH`).
    pub dir: OwnedFd,
    /// The file's name in `dir`.
    pub name: OsString,
    /// Its workspace-relative path, for messages (the link's target when written through a
    /// link).
    pub shown: String,
    /// Its metadata when it exists (always a regular file with one link).
    pub existing: Option<Stat>,
}

/// Finds the file a write or edit of `rel` replaces; with `create_parents`, missing parent
/// directories are created.
pub(crate) fn locate(ws: &Workspace, rel: &WorkspacePath, create_parents: bool) -> Result<Target> {
    let shown = rel.as_relative();
    let Some(name) = rel.file_name() else {
        return Err(Error::Conflict(
            "the workspace root is a directory, not a file".into(),
        ));
    };
    let dir = if create_parents {
        let parent = rel.parent().unwrap_or_default();
        ensure_dirs(ws.root(), &parent)?
    } else {
        open_parent(ws.root(), rel)?.0
    };
    let st = match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => {
            return Ok(Target {
                dir,
                name: name.into(),
                shown: shown.to_owned(),
                existing: None,
            });
        }
        Err(e) => return Err(io_error(e, "stat", shown)),
    };
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Symlink => through_link(ws, rel),
        _ => {
            check_replaceable(&st, shown)?;
            Ok(Target {
                dir,
                name: name.into(),
                shown: shown.to_owned(),
                existing: Some(st),
            })
        }
    }
}

/// Refuses anything but a regular file with exactly one link.
fn check_replaceable(st: &Stat, shown: &str) -> Result<()> {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {}
        FileType::Directory => {
            return Err(Error::Conflict(format!(
                "{shown} is a directory, not a file"
            )));
        }
        _ => return Err(Error::Conflict(format!("{shown} is not a regular file"))),
    }
    if stat_nlink(st) > 1 {
        return Err(Error::Conflict(format!(
            "{shown} has {} hard links; refusing to modify a file that may be shared with a path \
             outside the workspace",
            stat_nlink(st)
        )));
    }
    Ok(())
}

/// The final component of `rel` is a link: resolve it beneath the root. It must lead to an
/// existing regular file inside; that file's own directory entry becomes the target.
///
/// Its location is read from `/proc/self/fd` and then verified: the directory is re-opened
/// beneath the root without following any link, and the entry must be the very inode the link
/// resolved to. Anything unexpected is refused.
fn through_link(ws: &Workspace, rel: &WorkspacePath) -> Result<Target> {
    let shown = rel.as_relative();
    let fd = open_beneath(ws.root(), shown, OFlags::PATH | OFlags::CLOEXEC, RESOLVE).map_err(
        |e| match e {
            Errno::XDEV => Error::OutsideWorkspace {
                path: shown.to_owned(),
                reason: "it is a symbolic link that leads outside the workspace".to_owned(),
            },
            Errno::NOENT => Error::Conflict(format!(
                "{shown} is a symbolic link to a path that does not exist; write to a real path \
                 instead"
            )),
            e => resolve_error(e, shown),
        },
    )?;
    let st = rustix::fs::fstat(&fd).map_err(|e| io_error(e, "stat", shown))?;
    check_replaceable(&st, shown)?;
    let unlocatable = || {
        Error::Conflict(format!(
            "{shown} is a symbolic link whose target could not be located safely; write to the \
             target's path instead"
        ))
    };
    let root_host = fd_path(ws.root().as_raw_fd()).ok_or_else(unlocatable)?;
    let target_host = fd_path(fd.as_raw_fd()).ok_or_else(unlocatable)?;
    let rest = strip_components(&root_host, &target_host).ok_or_else(unlocatable)?;
    let (parent, name) = match rest.iter().rposition(|b| *b == b'/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (&b"."[..], &rest[..]),
    };
    if name.is_empty() {
        return Err(unlocatable());
    }
    let dir = open_beneath(
        ws.root(),
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        RESOLVE_NO_LINKS,
    )
    .map_err(|_| unlocatable())?;
    let st2 =
        rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|_| unlocatable())?;
    if !same_inode(&st, &st2) {
        return Err(unlocatable());
    }
    let shown = String::from_utf8_lossy(&rest).into_owned();
    check_replaceable(&st2, &shown)?;
    Ok(Target {
        dir,
        name: OsStr::from_bytes(name).to_owned(),
        shown,
        existing: Some(st2),
    })
}

/// The path the kernel reports for descriptor `fd`, or `None`.
fn fd_path(fd: i32) -> Option<Vec<u8>> {
    let link = rustix::fs::readlink(format!("/proc/self/fd/{fd}"), Vec::new()).ok()?;
    let bytes = link.into_bytes();
    bytes.starts_with(b"/").then_some(bytes)
}

/// `path` with the leading components equal to `root`'s removed, as `a/b/c`; `None` when
/// `path` is not strictly inside `root`.
fn strip_components(root: &[u8], path: &[u8]) -> Option<Vec<u8>> {
    let comps = |p: &[u8]| -> Vec<Vec<u8>> {
        p.split(|b| *b == b'/')
            .filter(|c| !c.is_empty())
            .map(<[u8]>::to_vec)
            .collect()
    };
    let root = comps(root);
    let path = comps(path);
    if path.len() <= root.len() || path[..root.len()] != root[..] {
        return None;
    }
    if path[root.len()..].iter().any(|c| c == b"." || c == b"..") {
        return None;
    }
    Some(path[root.len()..].join(&b'/'))
}

/// Replaces the target's content with `data` atomically, with permission bits `mode`: through
/// an unnamed temporary file where the file system makes one, else a named one (module
/// documentation). On any failure the temporary file is gone and the target is unchanged.
pub(crate) fn replace_contents(target: &Target, data: &[u8], mode: u32) -> Result<()> {
    if let Unnamed::Unsupported = write_unnamed(target, data, mode)? {
        let (tmp_name, fd) = create_temp(target)?;
        let result = fill_and_rename(target, &tmp_name, fd, data, mode);
        if result.is_err() {
            let _ = rustix::fs::unlinkat(&target.dir, &tmp_name, AtFlags::empty());
            return result;
        }
    }
    // Make the rename durable; a failure here does not undo the write.
    if let Ok(d) = open_beneath(
        target.dir.as_fd(),
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        RESOLVE_NO_LINKS,
    ) {
        let _ = rustix::fs::fsync(&d);
    }
    Ok(())
}

/// What [`write_unnamed`] did.
enum Unnamed {
    /// The new content is in place.
    Written,
    /// Nothing was changed: this file system (or a process without `/proc`) cannot write
    /// through an unnamed file; write through a named one.
    Unsupported,
}

/// Errors of `O_TMPFILE` and of a link through `/proc/self/fd` that mean "not here" rather than
/// a failure of this write: no unnamed files on this file system (`EOPNOTSUPP`; `EISDIR` or
/// `EINVAL` from kernels that predate them), no `/proc` (`ENOENT`), a link refused by a
/// security policy (`EPERM`, `EACCES`) or across mounts (`EXDEV`).
fn unsupported(e: Errno) -> bool {
    matches!(
        e,
        Errno::OPNOTSUPP
            | Errno::ISDIR
            | Errno::INVAL
            | Errno::NOENT
            | Errno::PERM
            | Errno::ACCESS
            | Errno::XDEV
    )
}

/// Writes `data` (mode `mode`) to an unnamed file in the target's directory, then gives it the
/// target's name (module documentation).
fn write_unnamed(target: &Target, data: &[u8], mode: u32) -> Result<Unnamed> {
    use std::os::fd::AsRawFd as _;
    let shown = target.shown.as_str();
    #[cfg(test)]
    if tests::named_only() {
        return Ok(Unnamed::Unsupported);
    }
    let fd = match open_beneath_mode(
        target.dir.as_fd(),
        ".",
        OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
        RESOLVE_NO_LINKS,
    ) {
        Ok(fd) => fd,
        Err(e) if unsupported(e) => return Ok(Unnamed::Unsupported),
        Err(e) => return Err(io_error(e, "create a temporary file for", shown)),
    };
    let file = fill(fd, data, mode, shown)?;
    #[cfg(test)]
    tests::maybe_fail()?;
    // The file's own descriptor, named through this process's `/proc`: linking it needs no
    // capability (`AT_EMPTY_PATH` would need `CAP_DAC_READ_SEARCH`).
    let source = format!("/proc/self/fd/{}", file.as_raw_fd());
    let link = |name: &OsStr| {
        rustix::fs::linkat(
            rustix::fs::CWD,
            source.as_str(),
            &target.dir,
            name,
            AtFlags::SYMLINK_FOLLOW,
        )
    };
    let mut linked = None;
    for _ in 0..16 {
        let tmp = temp_name(target);
        match link(&tmp) {
            Ok(()) => {
                linked = Some(tmp);
                break;
            }
            Err(Errno::EXIST) => continue,
            Err(e) if unsupported(e) => return Ok(Unnamed::Unsupported),
            Err(e) => return Err(io_error(e, "create a temporary file for", shown)),
        }
    }
    let Some(tmp) = linked else {
        return Err(colliding(shown));
    };
    drop(file);
    if let Err(e) = rustix::fs::renameat(&target.dir, &tmp, &target.dir, &target.name) {
        let _ = rustix::fs::unlinkat(&target.dir, &tmp, AtFlags::empty());
        return Err(io_error(e, "replace", shown));
    }
    Ok(Unnamed::Written)
}

/// Writes `data` to the new file `fd`, sets its permission bits and syncs it.
fn fill(fd: OwnedFd, data: &[u8], mode: u32, shown: &str) -> Result<File> {
    let mut file = File::from(fd);
    file.write_all(data)
        .map_err(|e| io_error(errno_of(&e), "write", shown))?;
    rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))
        .map_err(|e| io_error(e, "set permissions of", shown))?;
    file.sync_all()
        .map_err(|e| io_error(errno_of(&e), "sync", shown))?;
    Ok(file)
}

fn fill_and_rename(
    target: &Target,
    tmp_name: &OsStr,
    fd: OwnedFd,
    data: &[u8],
    mode: u32,
) -> Result<()> {
    let shown = target.shown.as_str();
    drop(fill(fd, data, mode, shown)?);
    #[cfg(test)]
    tests::maybe_fail()?;
    rustix::fs::renameat(&target.dir, tmp_name, &target.dir, &target.name)
        .map_err(|e| io_error(e, "replace", shown))
}

/// A fresh temporary name next to the target: `.NAME.sbx-tmp-<random>`, within `NAME_MAX`.
fn temp_name(target: &Target) -> OsString {
    const SUFFIX: &[u8] = b".sbx-tmp-";
    // Keep the whole name within NAME_MAX (255 bytes): 1 + name + suffix + 16 hex digits.
    let name = target.name.as_bytes();
    let name = &name[..name.len().min(255 - 1 - SUFFIX.len() - 16)];
    let mut tmp = Vec::with_capacity(255);
    tmp.push(b'.');
    tmp.extend_from_slice(name);
    tmp.extend_from_slice(SUFFIX);
    tmp.extend_from_slice(format!("{:016x}", random_u64()).as_bytes());
    OsString::from_vec(tmp)
}

fn colliding(shown: &str) -> Error {
    Error::Backend(format!(
        "cannot create a temporary file for {shown}: names kept colliding"
    ))
}

/// Creates a temporary file named as [`temp_name`] (mode `0o600`) next to the target.
fn create_temp(target: &Target) -> Result<(OsString, OwnedFd)> {
    for _ in 0..16 {
        let tmp = temp_name(target);
        match open_beneath_mode(
            target.dir.as_fd(),
            tmp.as_os_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
            RESOLVE_NO_LINKS,
        ) {
            Ok(fd) => return Ok((tmp, fd)),
            Err(Errno::EXIST) => continue,
            Err(e) => {
                return Err(io_error(e, "create a temporary file for", &target.shown));
            }
        }
    }
    Err(colliding(&target.shown))
}

/// A fresh random-enough number for temporary names (`O_EXCL` guarantees uniqueness; this only
/// makes collisions and guessing unlikely).
fn random_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

/// See [`Workspace::edit`].
pub(crate) fn edit(ws: &Workspace, path: &str, req: &EditRequest) -> Result<EditResult> {
    if req.old.is_empty() {
        return Err(Error::InvalidRequest(sessionbox_core::EDIT_EMPTY.into()));
    }
    let rel = ws.resolve(path)?;
    let shown = rel.as_relative();
    let target = locate(ws, &rel, false)?;
    let Some(st) = target.existing else {
        return Err(Error::NotFound(shown.to_owned()));
    };
    let limit = ws.limits().max_file_bytes;
    let data = read_target(&target, &st, limit)?;
    let old = req.old.as_bytes();
    let positions = find_all(&data, old);
    match (positions.len(), req.replace_all) {
        (0, _) => {
            return Err(Error::Conflict(format!(
                "{} in {shown}",
                sessionbox_core::EDIT_ABSENT
            )));
        }
        (1, _) | (_, true) => {}
        (n, false) => {
            return Err(Error::Conflict(format!(
                "{} {n} times in {shown}",
                sessionbox_core::EDIT_AMBIGUOUS
            )));
        }
    }
    let new = req.new.as_bytes();
    let mut out =
        Vec::with_capacity(data.len() - positions.len() * old.len() + positions.len() * new.len());
    let mut at = 0;
    for &p in &positions {
        out.extend_from_slice(&data[at..p]);
        out.extend_from_slice(new);
        at = p + old.len();
    }
    out.extend_from_slice(&data[at..]);
    if out.len() as u64 > limit {
        return Err(Error::TooLarge {
            what: format!("the edited {shown}"),
            limit,
        });
    }
    replace_contents(&target, &out, st.st_mode & 0o777)?;
    Ok(EditResult {
        replacements: positions.len(),
    })
}

/// Reads the target, checking it is still the inode that was located.
fn read_target(target: &Target, st: &Stat, limit: u64) -> Result<Vec<u8>> {
    let shown = target.shown.as_str();
    if stat_size(st) > limit {
        return Err(too_large_file(shown, limit));
    }
    let fd = open_beneath(
        target.dir.as_fd(),
        target.name.as_os_str(),
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        RESOLVE_NO_LINKS,
    )
    .map_err(|e| resolve_error(e, shown))?;
    let now = rustix::fs::fstat(&fd).map_err(|e| io_error(e, "stat", shown))?;
    if !same_inode(st, &now) {
        return Err(Error::Conflict(format!(
            "{shown} changed while it was being edited; try again"
        )));
    }
    check_replaceable(&now, shown)?;
    let mut data = Vec::new();
    File::from(fd)
        .take(limit.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| io_error(errno_of(&e), "read", shown))?;
    if data.len() as u64 > limit {
        return Err(too_large_file(shown, limit));
    }
    Ok(data)
}

/// Start offsets of the non-overlapping occurrences of `needle` (non-empty), left to right.
fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    if let (Ok(h), Ok(n)) = (std::str::from_utf8(hay), std::str::from_utf8(needle)) {
        return h.match_indices(n).map(|(i, _)| i).collect();
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i + needle.len() <= hay.len() {
        if hay[i..i + needle.len()] == *needle {
            out.push(i);
            i += needle.len();
        } else {
            i += 1;
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;

    use sessionbox_core::Limits;

    use super::*;

    thread_local! {
        static FAIL_BEFORE_RENAME: Cell<bool> = const { Cell::new(false) };
        static NAMED_ONLY: Cell<bool> = const { Cell::new(false) };
        static LISTED_BEFORE_NAMING: std::cell::RefCell<Option<(std::path::PathBuf, Vec<String>)>> =
            const { std::cell::RefCell::new(None) };
    }

    /// Fault injection: fails the write between the sync of the temporary file and the rename
    /// (or, for an unnamed one, the link). When a directory is being watched
    /// ([`LISTED_BEFORE_NAMING`]), lists it at that moment: what a writer killed there leaves.
    pub(crate) fn maybe_fail() -> Result<()> {
        LISTED_BEFORE_NAMING.with(|l| {
            if let Some((dir, seen)) = &mut *l.borrow_mut() {
                *seen = names(dir);
            }
        });
        if FAIL_BEFORE_RENAME.with(Cell::get) {
            return Err(Error::Backend("injected failure".into()));
        }
        Ok(())
    }

    /// Whether the write path through an unnamed file is turned off, to test the other one.
    pub(crate) fn named_only() -> bool {
        NAMED_ONLY.with(Cell::get)
    }

    fn names(dir: &std::path::Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_file_and_the_old_content() {
        a_failed_write_leaves_the_old_content(false);
    }

    #[test]
    fn a_failed_write_through_a_named_temporary_leaves_no_temporary_file_either() {
        NAMED_ONLY.with(|f| f.set(true));
        a_failed_write_leaves_the_old_content(true);
        NAMED_ONLY.with(|f| f.set(false));
    }

    /// A writer killed once the data is written and synced, before the file is named, leaves
    /// nothing in the directory: the temporary file has no name yet (the kernel frees it with
    /// the writer). Then the write completes: the new content in place, nothing else beside it.
    #[test]
    fn until_it_is_complete_a_write_leaves_no_name_in_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path(), "/workspace", Limits::default()).unwrap();
        ws.write("d/a.txt", b"old").unwrap();
        let dir = tmp.path().join("d");
        for (path, content) in [("d/a.txt", &b"replaced"[..]), ("d/new.txt", b"created")] {
            LISTED_BEFORE_NAMING.with(|l| *l.borrow_mut() = Some((dir.clone(), Vec::new())));
            ws.write(path, content).unwrap();
            let seen = LISTED_BEFORE_NAMING
                .with(|l| l.borrow_mut().take())
                .unwrap()
                .1;
            assert_eq!(seen, ["a.txt"], "{path}");
            assert_eq!(ws.read(path).unwrap(), content);
        }
        assert_eq!(names(&dir), ["a.txt", "new.txt"]);
        let mode = |p: &str| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(tmp.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!((mode("d/a.txt"), mode("d/new.txt")), (0o644, 0o644));
    }

    fn a_failed_write_leaves_the_old_content(named: bool) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path(), "/workspace", Limits::default()).unwrap();
        ws.write("d/a.txt", b"old").unwrap();
        FAIL_BEFORE_RENAME.with(|f| f.set(true));
        let r = ws.write("d/a.txt", b"new");
        let r2 = ws.write("d/b.txt", b"new");
        let r3 = ws.edit(
            "d/a.txt",
            &EditRequest {
                old: "old".into(),
                new: "x".into(),
                replace_all: false,
            },
        );
        FAIL_BEFORE_RENAME.with(|f| f.set(false));
        assert_eq!(r.unwrap_err().code(), "backend_error");
        assert_eq!(r2.unwrap_err().code(), "backend_error");
        assert_eq!(r3.unwrap_err().code(), "backend_error");
        assert_eq!(names(&tmp.path().join("d")), ["a.txt"], "named: {named}");
        assert_eq!(std::fs::read(tmp.path().join("d/a.txt")).unwrap(), b"old");
        // And without the fault, both paths write.
        ws.write("d/a.txt", b"new").unwrap();
        ws.write("d/b.txt", b"new").unwrap();
        assert_eq!(names(&tmp.path().join("d")), ["a.txt", "b.txt"]);
        assert_eq!(ws.read("d/a.txt").unwrap(), b"new");
    }

    #[test]
    fn temporary_names_fit_in_name_max() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path(), "/workspace", Limits::default()).unwrap();
        let long = "n".repeat(255);
        ws.write(&long, b"x").unwrap();
        assert_eq!(ws.read(&long).unwrap(), b"x");
        // Replaced, through a temporary name.
        ws.write(&long, b"y").unwrap();
        assert_eq!(ws.read(&long).unwrap(), b"y");
        assert_eq!(names(tmp.path()), [long]);
    }

    #[test]
    fn find_all_counts_non_overlapping_occurrences() {
        assert_eq!(find_all(b"aaaa", b"aa"), [0, 2]);
        assert_eq!(find_all(b"abcabc", b"bc"), [1, 4]);
        assert_eq!(find_all(b"\xff\xffa\xff", b"\xff"), [0, 1, 3]);
        assert!(find_all(b"abc", b"abcd").is_empty());
    }

    #[test]
    fn strip_components_requires_a_strict_component_prefix() {
        assert_eq!(
            strip_components(b"/tmp/ws", b"/tmp/ws/a/b").as_deref(),
            Some(&b"a/b"[..])
        );
        assert_eq!(strip_components(b"/tmp/ws", b"/tmp/ws-evil/a"), None);
        assert_eq!(strip_components(b"/tmp/ws", b"/tmp/ws"), None);
        assert_eq!(strip_components(b"/", b"/a").as_deref(), Some(&b"a"[..]));
    }
}
