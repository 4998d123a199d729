//! Delivery into a conversation through the [`Session`] trait alone, so it serves every
//! runtime: `host`, `aio`, `opensandbox` and any later one (a runtime that can write files and
//! run `/bin/sh` needs nothing more).
//!
//! Copies live in the workspace at `.skills/<name>/`. One command per open lists what is there
//! (`find` and `sha256sum` in the conversation); a skill whose copy differs from its source in
//! any file, mode or extra file (edited by the conversation, or the source updated) is removed
//! and written again; a copy whose skill is gone is removed. A conversation can change its copy,
//! never the source, and the change is undone on its next open.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use sessionbox_core::{Error, ExecRequest, ExecResult, Session};

use crate::discover::{Catalog, Skill, SkillError, read_checked};

/// Where copies go, relative to the workspace root.
pub const COPY_DIR: &str = ".skills";
/// Where a runtime that mounts skills presents them (`isolated`).
pub const MOUNT_ROOT: &str = "/skills";

/// How a conversation's runtime receives skills.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The runtime mounts them read-only beneath `root` (`isolated`: `/skills`).
    Mounted {
        /// The mount root inside the sandbox.
        root: String,
    },
    /// They are copied into the workspace, beneath `<workspace_root>/.skills`.
    Copied {
        /// The workspace root as commands see it.
        workspace_root: String,
    },
}

impl Delivery {
    /// The skill's base directory as commands in the conversation see it.
    ///
    /// ```
    /// use sessionbox_skills::Delivery;
    /// let d = Delivery::Copied { workspace_root: "/home/gem/w".into() };
    /// assert_eq!(d.base_path("pdf"), "/home/gem/w/.skills/pdf");
    /// let d = Delivery::Mounted { root: "/skills".into() };
    /// assert_eq!(d.base_path("pdf"), "/skills/pdf");
    /// ```
    pub fn base_path(&self, name: &str) -> String {
        match self {
            Delivery::Mounted { root } => format!("{}/{name}", root.trim_end_matches('/')),
            Delivery::Copied { workspace_root } => {
                format!("{}/{COPY_DIR}/{name}", workspace_root.trim_end_matches('/'))
            }
        }
    }
}

/// What [`sync_copies`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Skills written (first delivery, or their copy differed from the source).
    pub copied: Vec<String>,
    /// Copies whose skill is no longer configured, removed.
    pub removed: Vec<String>,
}

/// Lists every file beneath `.skills` with its hash, executable files and anything that is not
/// a file or directory. Needs `find` and `sha256sum` (coreutils) in the conversation.
const LIST_SCRIPT: &str = r#"export LC_ALL=C
[ -e .skills ] || exit 0
[ -d .skills ] && [ ! -L .skills ] || { echo 'O .skills'; exit 0; }
cd .skills || exit 3
find . -mindepth 1 -maxdepth 1 -print | sed 's/^/T /'
find . -type f -perm -0100 -print | sed 's/^/X /'
find . -mindepth 1 ! -type f ! -type d -print | sed 's/^/O /'
find . -type f -exec sha256sum -- {} + | sed 's/^/H /'
"#;

/// What is beneath `.skills` in the workspace.
#[derive(Default)]
struct Listing {
    /// Names directly beneath `.skills`.
    top: BTreeSet<String>,
    /// skill -> rel -> sha256.
    files: BTreeMap<String, BTreeMap<String, String>>,
    /// skill -> executable rels.
    exec: BTreeMap<String, BTreeSet<String>>,
    /// Skills holding something other than files and directories (links, fifos).
    odd: BTreeSet<String>,
    /// `.skills` itself is not a plain directory, or a line could not be read.
    broken: bool,
}

fn split(path: &str) -> Option<(String, String)> {
    let p = path.strip_prefix("./")?;
    match p.split_once('/') {
        Some((skill, rel)) => Some((skill.to_owned(), rel.to_owned())),
        None => Some((p.to_owned(), String::new())),
    }
}

fn parse_listing(out: &str) -> Listing {
    let mut l = Listing::default();
    for line in out.lines() {
        let (tag, rest) = line.split_at(line.len().min(2));
        match tag {
            "T " => match split(rest) {
                Some((skill, _)) => {
                    l.top.insert(skill);
                }
                None => l.broken = true,
            },
            "X " => match split(rest) {
                Some((skill, rel)) => {
                    l.exec.entry(skill).or_default().insert(rel);
                }
                None => l.broken = true,
            },
            "O " => match split(rest) {
                Some((skill, _)) if rest != ".skills" => {
                    l.odd.insert(skill);
                }
                _ => l.broken = true,
            },
            "H " => {
                // `<64 hex>  ./skill/rel`; sha256sum escapes odd names with a leading `\`.
                let ok = rest.len() > 66 && !rest.starts_with('\\') && &rest[64..66] == "  ";
                match ok.then(|| split(&rest[66..])).flatten() {
                    Some((skill, rel)) => {
                        l.files
                            .entry(skill)
                            .or_default()
                            .insert(rel, rest[..64].to_owned());
                    }
                    None => l.broken = true,
                }
            }
            _ => l.broken = true,
        }
    }
    l
}

fn matches(skill: &Skill, l: &Listing) -> bool {
    let name = skill.name();
    if l.odd.contains(name) {
        return false;
    }
    let empty = BTreeMap::new();
    let have = l.files.get(name).unwrap_or(&empty);
    let no_exec = BTreeSet::new();
    let have_exec = l.exec.get(name).unwrap_or(&no_exec);
    have.len() == skill.files.len()
        && skill.files.iter().all(|f| {
            have.get(&f.rel) == Some(&f.sha256) && have_exec.contains(&f.rel) == f.executable
        })
        && have_exec.len() == skill.files.iter().filter(|f| f.executable).count()
}

fn sh(command: &str) -> ExecRequest {
    ExecRequest::new(command)
        .timeout(Duration::from_secs(120))
        .output_limit(sessionbox_core::MAX_OUTPUT_LIMIT)
}

fn failed(what: &str, r: &ExecResult) -> Error {
    let stderr = String::from_utf8_lossy(&r.stderr);
    let stderr: String = stderr.chars().take(500).collect();
    Error::Backend(format!(
        "skills: {what} failed in the conversation (exit {}): {}; delivery needs /bin/sh, find, sha256sum, chmod and xargs there",
        r.shell_exit_code(),
        stderr.trim()
    ))
}

/// Brings the copies in the workspace to `catalog` (see the module documentation).
///
/// # Errors
/// The session's errors; [`Error::Backend`] when the listing command fails or a source file
/// changed during delivery.
pub async fn sync_copies(session: &dyn Session, catalog: &Catalog) -> Result<SyncReport, Error> {
    let r = session.exec(sh(LIST_SCRIPT)).await?;
    if !r.success() || r.stdout_truncated {
        return Err(failed("listing the skill copies", &r));
    }
    let listing = parse_listing(&String::from_utf8_lossy(&r.stdout));
    let mut report = SyncReport::default();
    if listing.broken {
        // Something odd sits at `.skills` (a link, a file, a name the listing cannot carry):
        // start again from nothing.
        remove(session, COPY_DIR).await?;
    }
    for skill in &catalog.skills {
        if !listing.broken && matches(skill, &listing) {
            continue;
        }
        copy_one(session, skill).await?;
        report.copied.push(skill.doc.name.clone());
    }
    if !listing.broken {
        for name in &listing.top {
            if catalog.get(name).is_none() {
                remove(session, &format!("{COPY_DIR}/{name}")).await?;
                report.removed.push(name.clone());
            }
        }
    }
    Ok(report)
}

async fn remove(session: &dyn Session, path: &str) -> Result<(), Error> {
    match session.remove(path, true).await {
        Ok(()) | Err(Error::NotFound(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

async fn copy_one(session: &dyn Session, skill: &Skill) -> Result<(), Error> {
    let base = format!("{COPY_DIR}/{}", skill.name());
    remove(session, &base).await?;
    for f in &skill.files {
        let data = read_checked(f).map_err(to_error)?;
        session.write(&format!("{base}/{}", f.rel), &data).await?;
    }
    // Fixed modes, as the source says: 0755 for executables, 0644 for the rest. File names
    // hold no control characters (discovery refuses them), so newlines can separate them.
    let exec_list: String = skill
        .files
        .iter()
        .filter(|f| f.executable)
        .map(|f| format!("{}\n", f.rel))
        .collect();
    let plain: Vec<u8> = skill
        .files
        .iter()
        .filter(|f| !f.executable)
        .flat_map(|f| f.rel.bytes().chain([0]))
        .collect();
    let req = sh("cd \"$SKILL_COPY\" && xargs -0r chmod 0644 -- \
         && printf '%s' \"$SKILL_EXEC\" | tr '\\n' '\\0' | xargs -0r chmod 0755 --")
    .env("SKILL_COPY", base.clone())
    .env("SKILL_EXEC", exec_list)
    .stdin(plain);
    let r = session.exec(req).await?;
    if !r.success() {
        return Err(failed(
            &format!("setting the modes of skill {}", skill.name()),
            &r,
        ));
    }
    Ok(())
}

/// Runs `command` (a skill's bootstrap) in the conversation: `/bin/sh -c`, in the workspace
/// root, with `SKILL_DIR` set to the skill's base path, at most 10 minutes.
///
/// # Errors
/// The session's errors (a command that fails is a successful call: see the result).
pub async fn run_bootstrap(
    session: &dyn Session,
    command: &str,
    base_path: &str,
) -> Result<ExecResult, Error> {
    session
        .exec(
            ExecRequest::new(command)
                .timeout(sessionbox_core::MAX_TIMEOUT)
                .env("SKILL_DIR", base_path),
        )
        .await
}

/// A skills problem as the one error type: the operator's configuration is at fault, not the
/// caller, so it is [`Error::Backend`] (with the whole message: which skill, what rule).
pub fn to_error(e: SkillError) -> Error {
    Error::Backend(format!("skills: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_read_per_skill() {
        let h = "a".repeat(64);
        let out = format!(
            "T ./one\nT ./gone\nX ./one/run.sh\nO ./two/link\nH {h}  ./one/SKILL.md\nH {h}  ./one/run.sh\n"
        );
        let l = parse_listing(&out);
        assert!(!l.broken);
        assert_eq!(l.top.len(), 2);
        assert_eq!(l.files["one"].len(), 2);
        assert!(l.exec["one"].contains("run.sh"));
        assert!(l.odd.contains("two"));
        assert!(parse_listing(&format!("H \\{h}  ./a/b\n")).broken);
        assert!(parse_listing("O .skills\n").broken);
        assert!(parse_listing("junk\n").broken);
    }
}
