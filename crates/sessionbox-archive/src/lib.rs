//! The workspace archive format of sessionbox snapshots (the rules are in
//! [`sessionbox_core::ArchiveStats`]'s module): [`check`] reads a whole archive and says whether
//! it keeps every rule, counting what it holds, before anything acts on it.
//!
//! Architecture invariant: pure over a reader. This crate knows no workspace, runtime, store or
//! wire; what writes an archive out of a workspace and into one is the file layer's
//! (`sessionbox-fs`), which follows the same rules.
//!
//! ```
//! let mut b = tar::Builder::new(Vec::new());
//! let mut h = tar::Header::new_ustar();
//! h.set_entry_type(tar::EntryType::Regular);
//! h.set_size(2);
//! h.set_mode(0o644);
//! b.append_data(&mut h, "notes/a.txt", &b"hi"[..])?;
//! let archive = b.into_inner()?;
//! let stats = sessionbox_archive::check(&archive[..])?;
//! assert_eq!((stats.files, stats.bytes), (1, 2));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use sessionbox_core::{ArchiveStats, Error, MAX_ARCHIVE_ENTRIES, MAX_PATH_BYTES, Result};

/// Longest name of one path component, in bytes (Linux's `NAME_MAX`).
const MAX_NAME_BYTES: usize = 255;

/// What a path of the archive was, for the rules on later entries beneath it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    File,
    Directory,
    Link,
}

/// Reads the whole archive from `reader` and checks every entry against the snapshot rules:
/// relative paths without `..` (a leading `./` is accepted and ignored, and so is the root
/// entry `.`), regular files, directories and symbolic links only, no path beneath a link or
/// a file of the archive, no path twice, at most [`MAX_ARCHIVE_ENTRIES`] entries, names
/// within Linux's limits.
///
/// # Errors
/// [`Error::InvalidRequest`] naming the first entry that breaks a rule, or saying the stream is
/// not a tar archive.
pub fn check<R: Read>(reader: R) -> Result<ArchiveStats> {
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| invalid(format!("the archive cannot be read: {e}")))?;
    let mut stats = ArchiveStats::default();
    let mut seen: HashMap<PathBuf, Seen> = HashMap::new();
    for entry in entries {
        let entry = entry.map_err(|e| invalid(format!("the archive cannot be read: {e}")))?;
        let raw = entry
            .path()
            .map_err(|e| invalid(format!("an entry's path cannot be read: {e}")))?
            .into_owned();
        let Some(path) = normalized(&raw)? else {
            continue; // the root itself
        };
        let kind = match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => Seen::File,
            tar::EntryType::Directory => Seen::Directory,
            tar::EntryType::Symlink => Seen::Link,
            other => {
                return Err(invalid(format!(
                    "entry {} is a {} ({other:?}): only regular files, directories and symbolic links may be restored",
                    path.display(),
                    kind_name(other)
                )));
            }
        };
        if stats.entries() >= MAX_ARCHIVE_ENTRIES {
            return Err(invalid(format!(
                "the archive holds more than {MAX_ARCHIVE_ENTRIES} entries"
            )));
        }
        for parent in path.ancestors().skip(1) {
            if parent.as_os_str().is_empty() {
                break;
            }
            match seen.get(parent) {
                Some(Seen::Link) => {
                    return Err(invalid(format!(
                        "entry {} lies beneath {}, a symbolic link of the archive: it could be written outside the workspace",
                        path.display(),
                        parent.display()
                    )));
                }
                Some(Seen::File) => {
                    return Err(invalid(format!(
                        "entry {} lies beneath {}, a regular file of the archive",
                        path.display(),
                        parent.display()
                    )));
                }
                Some(Seen::Directory) | None => {}
            }
        }
        if seen.insert(path.clone(), kind).is_some() {
            return Err(invalid(format!(
                "entry {} appears twice in the archive",
                path.display()
            )));
        }
        match kind {
            Seen::File => {
                stats.files += 1;
                stats.bytes += entry.size();
            }
            Seen::Directory => stats.directories += 1,
            Seen::Link => {
                let target = entry
                    .link_name()
                    .map_err(|e| invalid(format!("link {} cannot be read: {e}", path.display())))?;
                match target {
                    Some(t) if !t.as_os_str().is_empty() => {
                        if t.as_os_str().len() > MAX_PATH_BYTES {
                            return Err(invalid(format!(
                                "link {} points at a path longer than {MAX_PATH_BYTES} bytes",
                                path.display()
                            )));
                        }
                    }
                    _ => {
                        return Err(invalid(format!("link {} has no target", path.display())));
                    }
                }
                stats.links += 1;
            }
        }
    }
    Ok(stats)
}

/// `raw` without a leading `./`, checked: `None` for the root itself.
fn normalized(raw: &Path) -> Result<Option<PathBuf>> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::CurDir => {}
            Component::Normal(name) => {
                if name.len() > MAX_NAME_BYTES {
                    return Err(invalid(format!(
                        "entry {} has a name longer than {MAX_NAME_BYTES} bytes",
                        raw.display()
                    )));
                }
                out.push(name);
            }
            Component::ParentDir => {
                return Err(invalid(format!(
                    "entry {} climbs out with '..'",
                    raw.display()
                )));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(invalid(format!(
                    "entry {} is an absolute path: archive paths are relative to the workspace",
                    raw.display()
                )));
            }
        }
    }
    if out.as_os_str().len() > MAX_PATH_BYTES {
        return Err(invalid(format!(
            "entry {} is longer than {MAX_PATH_BYTES} bytes",
            raw.display()
        )));
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

fn kind_name(t: tar::EntryType) -> &'static str {
    match t {
        tar::EntryType::Link => "hard link",
        tar::EntryType::Char => "character device",
        tar::EntryType::Block => "block device",
        tar::EntryType::Fifo => "fifo",
        _ => "kind of entry this format does not restore",
    }
}

fn invalid(message: String) -> Error {
    Error::InvalidRequest(format!("invalid workspace archive: {message}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: tar::EntryType, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h
    }

    /// An archive of (path, kind, data or link target), names written raw into the header
    /// (so hostile ones are not cleaned by the builder).
    fn archive(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, kind, data) in entries {
            let size = if *kind == tar::EntryType::Regular {
                data.len() as u64
            } else {
                0
            };
            let mut h = header(*kind, size);
            {
                let name = &mut h.as_old_mut().name;
                name[..path.len()].copy_from_slice(path.as_bytes());
            }
            if matches!(*kind, tar::EntryType::Symlink | tar::EntryType::Link) {
                let link = &mut h.as_old_mut().linkname;
                link[..data.len()].copy_from_slice(data.as_bytes());
            }
            h.set_cksum();
            let body: &[u8] = if *kind == tar::EntryType::Regular {
                data.as_bytes()
            } else {
                &[]
            };
            b.append(&h, body).unwrap();
        }
        b.into_inner().unwrap()
    }

    use tar::EntryType::{Directory as D, Regular as F, Symlink as L};

    #[test]
    fn a_plain_archive_is_counted() {
        let a = archive(&[
            ("./", D, ""),
            ("./src/", D, ""),
            ("./src/main.rs", F, "fn main() {}"),
            ("empty", F, ""),
            ("up", L, "../../etc/passwd"),
        ]);
        let s = check(&a[..]).unwrap();
        assert_eq!(
            s,
            ArchiveStats {
                bytes: 12,
                files: 2,
                directories: 1,
                links: 1,
                skipped: 0
            }
        );
    }

    #[test]
    fn each_hostile_entry_is_refused_naming_it() {
        for (entries, says) in [
            (vec![("/etc/passwd", F, "x")], "absolute"),
            (vec![("a/../../x", F, "x")], "'..'"),
            (vec![("l", L, "/tmp"), ("l/file", F, "x")], "symbolic link"),
            (vec![("f", F, "x"), ("f/g", F, "x")], "regular file"),
            (vec![("h", tar::EntryType::Link, "f")], "hard link"),
            (vec![("d", tar::EntryType::Char, "")], "character device"),
            (vec![("p", tar::EntryType::Fifo, "")], "fifo"),
            (vec![("x", F, "1"), ("x", F, "2")], "twice"),
            (vec![("l", L, "")], "no target"),
        ] {
            let a = archive(&entries);
            let e = check(&a[..]).unwrap_err();
            assert_eq!(e.code(), "invalid_request", "{entries:?}");
            assert!(e.to_string().contains(says), "{entries:?}: {e}");
        }
    }

    #[test]
    fn a_stream_that_is_not_tar_is_refused() {
        let e = check(&b"this is not a tar archive, just some text that goes on"[..]);
        // A short text is read as a truncated header or as no entries; either way nothing is
        // accepted as a file.
        match e {
            Ok(s) => assert_eq!(s.entries(), 0),
            Err(e) => assert_eq!(e.code(), "invalid_request"),
        }
        let e = check(&vec![0x41u8; 2048][..]).unwrap_err();
        assert_eq!(e.code(), "invalid_request");
    }
}
