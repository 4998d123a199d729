//! Workspace archives: what a snapshot of a conversation is made of, and the rules every
//! runtime follows to take one and to restore one.
//!
//! An archive is a POSIX tar stream (ustar entries, PAX extended headers for long names), not
//! compressed, of the whole workspace with paths relative to its root (`src/main.rs`, never
//! `/workspace/src/main.rs` nor `./src/main.rs`). It holds regular files, directories and
//! symbolic links (stored as links, never followed); other kinds (sockets, fifos, devices),
//! other file systems mounted inside and paths longer than 4,095 bytes (with what is beneath
//! them) are skipped and counted in [`ArchiveStats::skipped`]. Modes keep their permission bits
//! (`0o7777` without set-id bits); owners are not kept: a restored file belongs to the
//! conversation it is restored into. Hard links are stored as separate files.
//!
//! Restoring replaces the workspace's whole contents. An archive is checked entry by entry
//! before anything is removed: an absolute path, a `..` component, a path through a link of
//! the archive, a kind other than the three above, or more than [`MAX_ARCHIVE_ENTRIES`]
//! entries refuses the whole restore with [`Error::InvalidRequest`] and the workspace is left
//! as it was. Entries are written beneath the workspace and never through a link.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Most entries (files, directories, links) one archive may hold: 1,000,000.
pub const MAX_ARCHIVE_ENTRIES: u64 = 1_000_000;

/// Longest snapshot or template name, in bytes.
pub const MAX_SNAPSHOT_NAME_BYTES: usize = 64;

/// What an archive of a workspace holds, as counted while it was written or read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveStats {
    /// Bytes of regular files' contents (not the archive's own size).
    pub bytes: u64,
    /// Regular files.
    pub files: u64,
    /// Directories, the root not counted.
    pub directories: u64,
    /// Symbolic links.
    pub links: u64,
    /// Entries left out: other kinds (sockets, fifos, devices), mounts inside, and paths
    /// longer than 4,095 bytes (each counted once, with what is beneath it).
    pub skipped: u64,
}

impl ArchiveStats {
    /// Every entry the archive holds: files, directories and links.
    pub fn entries(&self) -> u64 {
        self.files + self.directories + self.links
    }
}

/// Checks a snapshot or template name (both follow one rule): 1 to [`MAX_SNAPSHOT_NAME_BYTES`] bytes of ASCII letters,
/// digits, `.`, `_` and `-`, starting with a letter or digit.
///
/// ```
/// use sessionbox_core::validate_snapshot_name;
/// assert!(validate_snapshot_name("deps-installed.v2").is_ok());
/// assert!(validate_snapshot_name("../x").is_err());
/// assert!(validate_snapshot_name("").is_err());
/// ```
///
/// # Errors
/// [`Error::InvalidRequest`] naming the rule broken.
pub fn validate_snapshot_name(name: &str) -> Result<(), Error> {
    let bad = |why: &str| {
        Err(Error::InvalidRequest(format!(
            "name {name:?} {why} (the rule of snapshot and template names)"
        )))
    };
    if name.is_empty() || name.len() > MAX_SNAPSHOT_NAME_BYTES {
        return bad(&format!(
            "must be 1 to {MAX_SNAPSHOT_NAME_BYTES} bytes long"
        ));
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return bad("must start with a letter or a digit");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return bad("may hold only ASCII letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

/// The error of a runtime that cannot archive or restore its workspaces.
pub fn archive_unsupported(runtime: &str) -> Error {
    Error::RuntimeUnavailable {
        runtime: runtime.to_owned(),
        reason: "this runtime cannot take or restore a snapshot of a workspace".into(),
        hint: "use the isolated, host, aio or opensandbox runtime".into(),
    }
}

/// Where a temporary archive for `purpose` may be written beside `dir`: a name no other
/// writer uses (the process id and a counter), for a rename into place.
pub fn temporary_archive(dir: &Path, purpose: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".{purpose}-{}-{n}.tmp", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_plain_and_start_with_a_letter_or_digit() {
        for ok in ["a", "deps", "v1.2_rc-3", &"x".repeat(64)] {
            assert!(validate_snapshot_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".hidden",
            "-x",
            "a/b",
            "a b",
            "é",
            &"x".repeat(65),
            "a\0",
        ] {
            let e = validate_snapshot_name(bad).unwrap_err();
            assert_eq!(e.code(), "invalid_request", "{bad}");
        }
    }
}
