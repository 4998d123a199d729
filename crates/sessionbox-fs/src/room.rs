//! Whether a restore can fit, checked before the workspace is emptied: a restore replaces the
//! whole workspace, so an archive whose files cannot fit even in the space the workspace's own
//! files free would otherwise leave the workspace empty but for part of the archive.

use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, FileType, OFlags};
use sessionbox_core::{ArchiveStats, Error, Result};

use crate::Workspace;
use crate::resolve::{RESOLVE_NO_LINKS, io_error, open_beneath};
use crate::walk::read_entries;

/// [`Error::TooLarge`] when `stats` (what an archive holds) cannot fit in the workspace: its
/// files' bytes are more than the file system's free space plus what the workspace's own files
/// take (freed by the restore), or its entries more than the free inodes plus the workspace's
/// own. The estimate is the lower bound of what the archive needs (its files' contents, not the
/// blocks around them), so a refusal is certain; a restore that passes may still find the disk
/// full near the edge.
pub(crate) fn check(ws: &Workspace, stats: &ArchiveStats) -> Result<()> {
    let fs = rustix::fs::fstatvfs(ws.root()).map_err(|e| io_error(e, "inspect", "."))?;
    let (used_bytes, used_inodes) = usage(ws)?;
    let free_bytes = fs.f_bavail.saturating_mul(fs.f_frsize);
    let room_bytes = free_bytes.saturating_add(used_bytes);
    let room_inodes = fs.f_favail.saturating_add(used_inodes);
    if stats.bytes > room_bytes {
        return Err(Error::TooLarge {
            what: format!(
                "the archive's {} bytes of files do not fit in the workspace ({room_bytes} bytes \
                 with its own files gone); nothing was changed: free space or restore a smaller \
                 snapshot",
                stats.bytes
            ),
            limit: u64::MAX,
        });
    }
    // A file system that counts no inodes (some report 0 of 0) is not held to them.
    if fs.f_files > 0 && stats.entries() > room_inodes {
        return Err(Error::TooLarge {
            what: format!(
                "the archive's {} entries do not fit in the workspace ({room_inodes} inodes with \
                 its own files gone); nothing was changed: free inodes or restore a smaller \
                 snapshot",
                stats.entries()
            ),
            limit: u64::MAX,
        });
    }
    Ok(())
}

/// The bytes (allocated blocks) and entries of everything beneath the workspace's root on its
/// own file system, walked without following links, one directory open at a time (a directory
/// that cannot be opened, too deep for a path, is not counted: the estimate stays a lower
/// bound of the room, so the check stays certain).
fn usage(ws: &Workspace) -> Result<(u64, u64)> {
    let open = |rel: &[u8]| -> rustix::io::Result<OwnedFd> {
        let rel: &[u8] = if rel.is_empty() { b"." } else { rel };
        open_beneath(
            ws.root(),
            std::ffi::OsStr::from_bytes(rel),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            RESOLVE_NO_LINKS,
        )
    };
    let root = open(b"").map_err(|e| io_error(e, "open", "."))?;
    let dev = rustix::fs::fstat(&root)
        .map_err(|e| io_error(e, "inspect", "."))?
        .st_dev;
    drop(root);
    let (mut bytes, mut entries) = (0u64, 0u64);
    let mut todo: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(rel) = todo.pop() {
        let Ok(dir) = open(&rel) else { continue };
        let Ok(Ok(names)) = read_entries(&dir, usize::MAX) else {
            continue;
        };
        for (name, kind) in names {
            let Ok(st) = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            if st.st_dev != dev {
                continue;
            }
            entries += 1;
            bytes = bytes.saturating_add(u64::try_from(st.st_blocks).unwrap_or(0) * 512);
            if kind == FileType::Directory {
                todo.push(crate::walk::join(&rel, name.as_bytes()));
            }
        }
    }
    Ok((bytes, entries))
}
