//! Discovery and validation: every `<root>/<dir>/SKILL.md` of a tenant's skills directories,
//! with each skill's files listed, checked and hashed.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::frontmatter::{SkillDoc, parse_skill_md};

/// What goes wrong with a tenant's skills. Each names the skill directory and says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkillError {
    /// A skills directory or a file in a skill cannot be read.
    #[error("cannot read {path}: {reason}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The system's reason.
        reason: String,
    },
    /// `SKILL.md` is not valid: front matter missing or malformed, a field breaking its rule.
    #[error("{path}: {reason}")]
    BadFrontMatter {
        /// The `SKILL.md` file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The name in the front matter is not the name of the skill's directory (the Agent Skills
    /// specification requires them equal).
    #[error(
        "{dir}: the skill is named {name:?} but its directory is {dir_name:?}; rename one so they match"
    )]
    NameMismatch {
        /// The skill directory.
        dir: PathBuf,
        /// The name in `SKILL.md`.
        name: String,
        /// The directory's own name.
        dir_name: String,
    },
    /// Two skills of one tenant share a name.
    #[error("two skills are named {name:?}: {first} and {second}; names must be unique per tenant")]
    DuplicateName {
        /// The name.
        name: String,
        /// The first skill directory.
        first: PathBuf,
        /// The second.
        second: PathBuf,
    },
    /// A skill is larger than a limit.
    #[error("{dir}: {what} is {actual}, over the limit of {limit} (set in the skills settings)")]
    TooLarge {
        /// The skill directory.
        dir: PathBuf,
        /// What is measured ("total size in bytes", "file count", "SKILL.md size in bytes").
        what: &'static str,
        /// The measured value.
        actual: u64,
        /// The limit.
        limit: u64,
    },
    /// A symbolic link in a skill leads out of it (or is absolute, or dangles, or names a
    /// directory).
    #[error(
        "{link}: {reason}; a link in a skill must be relative and name a file inside the skill"
    )]
    SymlinkEscape {
        /// The link.
        link: PathBuf,
        /// How it leaves.
        reason: String,
    },
    /// A file in a skill has a name that cannot be delivered (not UTF-8, a control character or
    /// a backslash), or is not a regular file, directory or link (a socket, a device).
    #[error("{path}: {reason}")]
    BadEntry {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Size limits of one skill. `[skills]` in `sessionbox.toml` overrides them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SkillLimits {
    /// Most bytes of all delivered files of one skill together (default 16 MiB).
    pub max_skill_bytes: u64,
    /// Most delivered files in one skill (default 1000).
    pub max_files: u64,
    /// Most bytes of one `SKILL.md` (default 256 KiB).
    pub max_skill_md_bytes: u64,
}

impl Default for SkillLimits {
    fn default() -> Self {
        SkillLimits {
            max_skill_bytes: 16 << 20,
            max_files: 1000,
            max_skill_md_bytes: 256 << 10,
        }
    }
}

/// One file of a skill, as delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillFile {
    /// Path relative to the skill directory, `/`-separated.
    pub rel: String,
    /// The host file it is read from (a link's target, resolved).
    pub source: PathBuf,
    /// True when the owner may execute it (delivered as mode 0755, else 0644).
    pub executable: bool,
    /// Its size in bytes.
    pub size: u64,
    /// Hex SHA-256 of its content.
    pub sha256: String,
}

/// A discovered, valid skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    /// The parsed `SKILL.md`.
    pub doc: SkillDoc,
    /// The skill's directory on the host, canonical.
    pub dir: PathBuf,
    /// The files delivered, sorted by `rel` (leaving out `.git`, `.env*` and `credentials*`).
    pub files: Vec<SkillFile>,
    /// Hex SHA-256 over every delivered file's path, mode and content hash: the skill's content
    /// address. Equal digests mean equal deliveries.
    pub digest: String,
}

impl Skill {
    /// The skill's name.
    pub fn name(&self) -> &str {
        &self.doc.name
    }
}

/// A tenant's skills, sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    /// The skills.
    pub skills: Vec<Skill>,
    /// What [`scan`] left out, in the order found: a skill that breaks a rule, or a skills
    /// directory that cannot be read. Empty from [`discover`], which fails instead.
    pub skipped: Vec<SkippedSkill>,
}

/// A skill (or a skills directory) left out of a [`Catalog`] because it breaks a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedSkill {
    /// The skill's directory, or the skills directory that could not be read.
    pub dir: PathBuf,
    /// The rule it broke.
    pub error: SkillError,
}

impl SkippedSkill {
    /// The directory's last component (the skill's name, when it follows the rules).
    pub fn name(&self) -> String {
        self.dir.file_name().map_or_else(
            || self.dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }
}

impl Catalog {
    /// The skill named `name`.
    pub fn get(&self, name: &str) -> Option<&Skill> {
        self.skills.iter().find(|s| s.name() == name)
    }

    /// True when there are no skills.
    pub fn is_empty(&self) -> bool {
        self.skills.is_empty()
    }
}

/// True for a name that is never delivered: `.git`, `.env*` and `credentials*` (any case), at
/// any depth. They are left out of copies, snapshots and digests.
pub fn is_excluded(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == ".git" || lower.starts_with(".env") || lower.starts_with("credentials")
}

/// Finds the skills in `roots`: every directory directly inside a root (not starting with `.`)
/// that holds a `SKILL.md`. A root that does not exist is an error (a typo must not silently
/// hide a tenant's skills); a directory without `SKILL.md` is not a skill and is passed over.
///
/// # Errors
/// The first [`SkillError`] found, in root order then name order.
pub fn discover(roots: &[PathBuf], limits: &SkillLimits) -> Result<Catalog, SkillError> {
    collect(roots, limits, true)
}

/// Finds the skills in `roots` as [`discover`] does, but leaves out each skill that breaks a
/// rule (and each root that cannot be read), listing it in [`Catalog::skipped`] with the rule:
/// one faulty skill costs only itself. Of two skills with one name, the first (in root order)
/// is kept.
pub fn scan(roots: &[PathBuf], limits: &SkillLimits) -> Catalog {
    collect(roots, limits, false).unwrap_or_else(|error| Catalog {
        skills: Vec::new(),
        skipped: vec![SkippedSkill {
            dir: PathBuf::new(),
            error,
        }],
    })
}

fn collect(roots: &[PathBuf], limits: &SkillLimits, strict: bool) -> Result<Catalog, SkillError> {
    let mut by_name: BTreeMap<String, Skill> = BTreeMap::new();
    let mut skipped = Vec::new();
    let mut skip = |dir: &Path, error: SkillError| {
        if strict {
            return Err(error);
        }
        skipped.push(SkippedSkill {
            dir: dir.to_owned(),
            error,
        });
        Ok(())
    };
    for root in roots {
        let entries = match std::fs::read_dir(root) {
            Ok(e) => e,
            Err(e) => {
                skip(root, io(root, &e))?;
                continue;
            }
        };
        let mut dirs = Vec::new();
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    skip(root, io(root, &e))?;
                    continue;
                }
            };
            let name = entry.file_name();
            if name.as_encoded_bytes().starts_with(b".") {
                continue;
            }
            let path = entry.path();
            // A skill directory may itself be a link (to a checkout elsewhere): its target is
            // the skill, and links inside it are confined to that target.
            if path.join("SKILL.md").is_file() {
                dirs.push(path);
            }
        }
        dirs.sort();
        for dir in dirs {
            let skill = match load_skill(&dir, limits) {
                Ok(s) => s,
                Err(e) => {
                    skip(&dir, e)?;
                    continue;
                }
            };
            if let Some(first) = by_name.get(skill.name()) {
                let e = SkillError::DuplicateName {
                    name: skill.doc.name.clone(),
                    first: first.dir.clone(),
                    second: skill.dir,
                };
                skip(&dir, e)?;
                continue;
            }
            by_name.insert(skill.doc.name.clone(), skill);
        }
    }
    Ok(Catalog {
        skills: by_name.into_values().collect(),
        skipped,
    })
}

/// Loads and checks one skill directory.
///
/// # Errors
/// A [`SkillError`] naming what is wrong.
pub fn load_skill(dir: &Path, limits: &SkillLimits) -> Result<Skill, SkillError> {
    let canonical = std::fs::canonicalize(dir).map_err(|e| io(dir, &e))?;
    let skill_md = canonical.join("SKILL.md");
    let md_meta = std::fs::symlink_metadata(&skill_md).map_err(|e| io(&skill_md, &e))?;
    if !md_meta.is_file() {
        return Err(SkillError::BadEntry {
            path: skill_md,
            reason: "SKILL.md must be a regular file, not a link".into(),
        });
    }
    if md_meta.len() > limits.max_skill_md_bytes {
        return Err(SkillError::TooLarge {
            dir: dir.to_owned(),
            what: "SKILL.md size in bytes",
            actual: md_meta.len(),
            limit: limits.max_skill_md_bytes,
        });
    }
    let text = std::fs::read(&skill_md).map_err(|e| io(&skill_md, &e))?;
    let text = String::from_utf8(text).map_err(|_| SkillError::BadFrontMatter {
        path: skill_md.clone(),
        reason: "SKILL.md is not UTF-8".into(),
    })?;
    let doc = parse_skill_md(&text).map_err(|reason| SkillError::BadFrontMatter {
        path: skill_md.clone(),
        reason,
    })?;
    let dir_name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if doc.name != dir_name {
        return Err(SkillError::NameMismatch {
            dir: dir.to_owned(),
            name: doc.name,
            dir_name,
        });
    }
    let mut files = Vec::new();
    let mut total = 0u64;
    walk(&canonical, &canonical, "", limits, &mut files, &mut total)?;
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    let digest = digest_of(&files);
    Ok(Skill {
        doc,
        dir: canonical,
        files,
        digest,
    })
}

fn walk(
    skill: &Path,
    dir: &Path,
    prefix: &str,
    limits: &SkillLimits,
    files: &mut Vec<SkillFile>,
    total: &mut u64,
) -> Result<(), SkillError> {
    let entries = std::fs::read_dir(dir).map_err(|e| io(dir, &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io(dir, &e))?;
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            return Err(SkillError::BadEntry {
                path,
                reason: "the file name is not UTF-8".into(),
            });
        };
        if is_excluded(&name) {
            continue;
        }
        if name.chars().any(|c| c.is_control() || c == '\\') {
            return Err(SkillError::BadEntry {
                path,
                reason: "the file name holds a control character or a backslash".into(),
            });
        }
        let rel = format!("{prefix}{name}");
        let meta = std::fs::symlink_metadata(&path).map_err(|e| io(&path, &e))?;
        let ft = meta.file_type();
        if ft.is_dir() {
            walk(skill, &path, &format!("{rel}/"), limits, files, total)?;
            continue;
        }
        let (source, meta) = if ft.is_symlink() {
            let target = std::fs::read_link(&path).map_err(|e| io(&path, &e))?;
            if target.is_absolute() {
                return Err(SkillError::SymlinkEscape {
                    link: path,
                    reason: format!("it is absolute ({})", target.display()),
                });
            }
            let resolved = std::fs::canonicalize(&path).map_err(|_| SkillError::SymlinkEscape {
                link: path.clone(),
                reason: "it dangles".into(),
            })?;
            if !resolved.starts_with(skill) {
                return Err(SkillError::SymlinkEscape {
                    link: path,
                    reason: format!("it leads out of the skill ({})", target.display()),
                });
            }
            let m = std::fs::metadata(&resolved).map_err(|e| io(&resolved, &e))?;
            if !m.is_file() {
                return Err(SkillError::SymlinkEscape {
                    link: path,
                    reason: "it names a directory or special file".into(),
                });
            }
            (resolved, m)
        } else if ft.is_file() {
            (path.clone(), meta)
        } else {
            return Err(SkillError::BadEntry {
                path,
                reason: "not a regular file, directory or link".into(),
            });
        };
        if files.len() as u64 >= limits.max_files {
            return Err(SkillError::TooLarge {
                dir: skill.to_owned(),
                what: "file count",
                actual: files.len() as u64 + 1,
                limit: limits.max_files,
            });
        }
        *total += meta.len();
        if *total > limits.max_skill_bytes {
            return Err(SkillError::TooLarge {
                dir: skill.to_owned(),
                what: "total size in bytes",
                actual: *total,
                limit: limits.max_skill_bytes,
            });
        }
        let (sha256, size) = hash_file(&source)?;
        files.push(SkillFile {
            rel,
            source,
            executable: meta.permissions().mode() & 0o100 != 0,
            size,
            sha256,
        });
    }
    Ok(())
}

/// Reads `path` whole, checking it still has `file`'s hash (a skill edited between discovery
/// and delivery is refused, never delivered half old, half new).
///
/// # Errors
/// [`SkillError::Io`], or [`SkillError::BadEntry`] when the content changed.
pub fn read_checked(file: &SkillFile) -> Result<Vec<u8>, SkillError> {
    let data = std::fs::read(&file.source).map_err(|e| io(&file.source, &e))?;
    if hex(&Sha256::digest(&data)) != file.sha256 {
        return Err(SkillError::BadEntry {
            path: file.source.clone(),
            reason: "the file changed while it was being delivered; retry".into(),
        });
    }
    Ok(data)
}

fn hash_file(path: &Path) -> Result<(String, u64), SkillError> {
    let mut f = std::fs::File::open(path).map_err(|e| io(path, &e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| io(path, &e))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        h.update(&buf[..n]);
    }
    Ok((hex(&h.finalize()), size))
}

/// The content address of a file list: SHA-256 over `mode path\0sha256\n` per file, in order.
fn digest_of(files: &[SkillFile]) -> String {
    let mut h = Sha256::new();
    for f in files {
        h.update(if f.executable { b"755 " } else { b"644 " });
        h.update(f.rel.as_bytes());
        h.update(b"\0");
        h.update(f.sha256.as_bytes());
        h.update(b"\n");
    }
    hex(&h.finalize())
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn io(path: &Path, e: &std::io::Error) -> SkillError {
    SkillError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}
