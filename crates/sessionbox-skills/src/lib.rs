//! Agent Skills for sessionbox: a tenant's `SKILL.md` skills, found, checked, hashed and
//! delivered into every conversation of that tenant.
//!
//! - [`discover`]: every `<root>/<name>/SKILL.md` of the tenant's skills directories; the front
//!   matter is parsed ([`parse_skill_md`]) and checked against the Agent Skills specification
//!   (name 1-64 lowercase letters, digits and hyphens, equal to the directory's name;
//!   description 1-1024 characters); names are unique per tenant, sizes are limited
//!   ([`SkillLimits`]), links must stay inside their skill. Failures are typed ([`SkillError`]).
//!   [`scan`] (what front ends use) leaves a faulty skill out and lists it with its rule in
//!   [`Catalog::skipped`], so one bad skill never costs its tenant the others.
//! - Each skill has a content address ([`Skill::digest`]): SHA-256 over its delivered files'
//!   paths, modes and contents, leaving out `.git`, `.env*` and `credentials*`.
//! - Delivery: a runtime that mounts skills (`isolated`) binds a [`snapshot`] of each read-only
//!   at `/skills/<name>` ([`Skills::mount_binds`]); every other runtime gets copies in the
//!   workspace at `.skills/<name>`, through the [`Session`](sessionbox_core::Session) trait alone
//!   ([`sync_copies`]), checked by hash on each open and written again when they differ.
//! - Bootstrap: `metadata.sessionbox-bootstrap` in the front matter is a shell command run once
//!   per conversation ([`run_bootstrap`]); the caller records the run (the manager keeps it in the
//!   store). It sits in `metadata` because the specification allows no other extra field: a
//!   skill with it stays valid for every other agent.
//!
//! ```
//! use sessionbox_skills::{SkillLimits, discover};
//! let root = tempfile::tempdir().unwrap();
//! let dir = root.path().join("hello");
//! std::fs::create_dir(&dir).unwrap();
//! std::fs::write(dir.join("SKILL.md"), "---\nname: hello\ndescription: Greets.\n---\nSay hi.\n").unwrap();
//! std::fs::write(dir.join(".env"), "TOKEN=secret\n").unwrap();
//! let catalog = discover(&[root.path().to_owned()], &SkillLimits::default()).unwrap();
//! let skill = catalog.get("hello").unwrap();
//! assert_eq!(skill.doc.body, "Say hi.\n");
//! assert_eq!(skill.files.len(), 1); // .env is never delivered
//! ```
//!
//! Architecture invariant: this crate knows no store, no wire format and no runtime in
//! particular. It reads the host's skills directories and reaches a conversation only through
//! `Session` (write, remove, exec); whether a runtime mounts or copies is the caller's choice.

mod deliver;
mod discover;
mod frontmatter;
mod snapshot;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sessionbox_core::TenantId;

pub use deliver::{
    COPY_DIR, Delivery, MOUNT_ROOT, SyncReport, run_bootstrap, sync_copies, to_error,
};
pub use discover::{
    Catalog, Skill, SkillError, SkillFile, SkillLimits, SkippedSkill, discover, is_excluded,
    load_skill, read_checked, scan,
};
pub use frontmatter::{
    BOOTSTRAP_KEY, MAX_DESCRIPTION_CHARS, MAX_NAME_CHARS, SkillDoc, check_name, parse_skill_md,
};
pub use snapshot::snapshot;

/// The skills directories of each tenant, and the limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skills {
    tenants: BTreeMap<String, Vec<PathBuf>>,
    limits: SkillLimits,
}

impl Skills {
    /// Skills directories per tenant name.
    pub fn new(tenants: BTreeMap<String, Vec<PathBuf>>, limits: SkillLimits) -> Self {
        Skills { tenants, limits }
    }

    /// True when no tenant has a skills directory.
    pub fn is_empty(&self) -> bool {
        self.tenants.values().all(Vec::is_empty)
    }

    /// The skills directories of `tenant`.
    pub fn roots(&self, tenant: &TenantId) -> &[PathBuf] {
        self.tenants.get(tenant.as_str()).map_or(&[], Vec::as_slice)
    }

    /// The limits.
    pub fn limits(&self) -> &SkillLimits {
        &self.limits
    }

    /// Discovers `tenant`'s skills now (no caching: a changed skill is seen on the next call).
    /// A skill that breaks a rule is left out and listed in [`Catalog::skipped`] (see
    /// [`scan`]); the others are there.
    pub fn catalog(&self, tenant: &TenantId) -> Catalog {
        scan(self.roots(tenant), &self.limits)
    }

    /// The read-only binds that present `tenant`'s skills at `/skills/<name>`: a snapshot of each
    /// (written beneath `snapshots` if new) and its inside path. A skill left out of the
    /// catalog, or whose snapshot cannot be written, is not bound (and is reported with the
    /// rule or the reason in the second list).
    pub fn mount_binds(
        &self,
        tenant: &TenantId,
        snapshots: &Path,
    ) -> (Vec<(PathBuf, PathBuf)>, Vec<SkippedSkill>) {
        let catalog = self.catalog(tenant);
        let mut skipped = catalog.skipped;
        let mut binds = Vec::new();
        for s in &catalog.skills {
            match snapshot(s, snapshots) {
                Ok(dir) => binds.push((dir, PathBuf::from(format!("{MOUNT_ROOT}/{}", s.name())))),
                Err(error) => skipped.push(SkippedSkill {
                    dir: s.dir.clone(),
                    error,
                }),
            }
        }
        (binds, skipped)
    }
}
