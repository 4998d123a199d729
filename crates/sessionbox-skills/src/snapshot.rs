//! Read-only snapshots for runtimes that mount skills (`isolated`): each skill version is
//! written once, filtered and with fixed modes, to `<dir>/<digest>/`, and that directory is
//! what the runtime binds read-only at `/skills/<name>`.
//!
//! Why a snapshot rather than the skill directory itself: the sandbox then sees exactly the files
//! that were validated and hashed (no `.git`, `.env*` or `credentials*`, no links, no files added
//! after discovery), with modes its unprivileged user can read (directories 0755, files 0644 or
//! 0755) whatever the modes of the source.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::discover::{Skill, SkillError, read_checked};

/// The snapshot of `skill` in `store`, written if it is not there yet, as a canonical path.
/// Concurrent callers agree: the snapshot is built in a temporary directory and renamed into
/// place.
///
/// # Errors
/// [`SkillError::Io`] when it cannot be written; the errors of [`read_checked`].
pub fn snapshot(skill: &Skill, store: &Path) -> Result<PathBuf, SkillError> {
    let io = |p: &Path, e: std::io::Error| SkillError::Io {
        path: p.to_owned(),
        reason: e.to_string(),
    };
    let target = store.join(&skill.digest);
    if target.is_dir() {
        return std::fs::canonicalize(&target).map_err(|e| io(&target, e));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(store)
        .map_err(|e| io(store, e))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = store.join(format!(
        ".tmp-{}-{}-{nanos}",
        skill.digest,
        std::process::id()
    ));
    let build = || -> Result<(), SkillError> {
        mkdir(&tmp).map_err(|e| io(&tmp, e))?;
        for f in &skill.files {
            let data = read_checked(f)?;
            let dest = tmp.join(&f.rel);
            if let Some(parent) = dest.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(parent)
                    .map_err(|e| io(parent, e))?;
            }
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(if f.executable { 0o755 } else { 0o644 })
                .open(&dest)
                .map_err(|e| io(&dest, e))?;
            out.write_all(&data).map_err(|e| io(&dest, e))?;
        }
        // The umask may have narrowed the modes asked for above.
        fix_modes(&tmp).map_err(|e| io(&tmp, e))
    };
    if let Err(e) = build() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if let Err(e) = std::fs::rename(&tmp, &target) {
        let _ = std::fs::remove_dir_all(&tmp);
        if !target.is_dir() {
            return Err(io(&target, e));
        }
    }
    std::fs::canonicalize(&target).map_err(|e| io(&target, e))
}

fn mkdir(p: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().mode(0o755).create(p)
}

fn fix_modes(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let ft = entry.file_type()?;
        if ft.is_dir() {
            fix_modes(&entry.path())?;
        } else {
            let exec = entry.metadata()?.permissions().mode() & 0o100 != 0;
            let mode = if exec { 0o755 } else { 0o644 };
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
}
