//! One host uid range per installation, claimed host-wide, so that two installations on one
//! host never give the same host uid to two conversations.
//!
//! The kernel keeps many counts per host uid (inotify instances and watches, pending signals,
//! message-queue bytes, processes): two conversations that share a uid share those allowances,
//! and one can take all of the other's. Within an installation the store gives each
//! conversation a uid of its own; across installations (two data directories on one host, each
//! with its own store) only a host-wide claim keeps the ranges apart.
//!
//! How: the installation's range is recorded in its data directory (`uid-range`: `BASE COUNT`),
//! and claimed in a host-wide registry, [`REGISTRY`], by a file named for the base that holds the
//! data directory's path. A data directory without a range takes the lowest free slot
//! (from [`IsolatedConfig::DEFAULT_UID_BASE`] up, overlapping no live claim) under the
//! registry's lock; a claim whose data directory no longer records that range (removed, or moved to
//! another range) is stale and may be taken over. The first installation on a host therefore
//! keeps the historic default range, 3000000 onwards.
//!
//! An explicit `uid_base` is the operator's choice and is not claimed (doctor reports overlaps
//! with [`overlapping_claims`]).

use std::fs::{self, File};
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};

use sessionbox_core::{Error, Result};

use super::IsolatedConfig;
use super::launch::lock_file;

/// The host-wide registry of claimed uid ranges.
pub const REGISTRY: &str = "/var/lib/sessionbox/uid-ranges";
/// The file in a data directory that records its range.
const RECORD: &str = "uid-range";
/// Ranges end below this uid (some tools treat uids from 2^31 on as negative).
const UID_CEILING: u64 = 1 << 31;

fn backend(what: &str, path: &Path, e: &std::io::Error) -> Error {
    Error::Backend(format!("cannot {what} {}: {e}", path.display()))
}

/// The range `data_dir` records, if it records one.
fn recorded(data_dir: &Path) -> Option<Range<u32>> {
    let text = fs::read_to_string(data_dir.join(RECORD)).ok()?;
    let mut words = text.split_whitespace().map(str::parse::<u32>);
    let (Some(Ok(base)), Some(Ok(count))) = (words.next(), words.next()) else {
        return None;
    };
    Some(base..base.checked_add(count)?)
}

/// Writes `contents` to `path` durably: a temporary file, synced, renamed over it.
fn write_durably(path: &Path, contents: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).map_err(|e| backend("create", &tmp, &e))?;
    f.write_all(contents.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| backend("write", &tmp, &e))?;
    fs::rename(&tmp, path).map_err(|e| backend("rename", &tmp, &e))
}

/// Whose claim `claim` is: the data directory it names, if that directory still records the
/// claimed range (else the claim is stale).
fn live_owner(claim: &Path, base: u32) -> Option<PathBuf> {
    let owner = PathBuf::from(fs::read_to_string(claim).ok()?.trim_end_matches('\n'));
    (recorded(&owner)?.start == base).then_some(owner)
}

impl IsolatedConfig {
    /// The range `data_dir` has claimed ([`Self::installation_uids`]), without claiming one.
    pub fn recorded_uids(data_dir: &Path) -> Option<Range<u32>> {
        recorded(&fs::canonicalize(data_dir).ok()?)
    }

    /// The installation's own `count` host uids for `data_dir` (which must exist), claimed in
    /// `registry` ([`REGISTRY`] in production) when the data directory has none yet: see the
    /// module documentation. Idempotent: the same data directory gets the same range again.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when `count` is zero; [`Error::Conflict`] when every slot below
    /// 2^31 is claimed; [`Error::Backend`] when the registry or the data directory cannot be
    /// read or written.
    pub fn installation_uids(data_dir: &Path, count: u32, registry: &Path) -> Result<Range<u32>> {
        if count == 0 {
            return Err(Error::InvalidRequest(
                "the sandbox uid count must be at least 1".into(),
            ));
        }
        let data_dir = fs::canonicalize(data_dir).map_err(|e| backend("resolve", data_dir, &e))?;
        if let Some(range) = recorded(&data_dir) {
            return Ok(range);
        }
        fs::create_dir_all(registry).map_err(|e| backend("create", registry, &e))?;
        let _lock = lock_file(&registry.join(".lock"))?;
        // Another process may have claimed for this data directory while this one waited.
        if let Some(range) = recorded(&data_dir) {
            return Ok(range);
        }
        // The live claims' ranges; stale claims are removed on the way.
        let mut taken: Vec<Range<u64>> = Vec::new();
        for (claim, base) in claims(registry) {
            match live_owner(&claim, base) {
                Some(owner) => {
                    if let Some(r) = recorded(&owner) {
                        taken.push(u64::from(r.start)..u64::from(r.end));
                    }
                }
                None => {
                    let _ = fs::remove_file(&claim);
                }
            }
        }
        taken.sort_by_key(|r| r.start);
        let mut base = u64::from(Self::DEFAULT_UID_BASE);
        for r in &taken {
            if r.start < base + u64::from(count) && base < r.end {
                base = r.end;
            }
        }
        if base + u64::from(count) <= UID_CEILING {
            let b = u32::try_from(base).map_err(Error::backend)?;
            write_durably(
                &registry.join(b.to_string()),
                &format!("{}\n", data_dir.display()),
            )?;
            write_durably(&data_dir.join(RECORD), &format!("{b} {count}\n"))?;
            return Ok(b..b + count);
        }
        Err(Error::Conflict(format!(
            "every host uid range of {count} uids below 2^31 is claimed in {}; remove the claims \
             of installations that no longer exist, or set [isolated] uid_base",
            registry.display()
        )))
    }
}

/// The claim files of `registry`, with the base each names.
fn claims(registry: &Path) -> Vec<(PathBuf, u32)> {
    let Ok(entries) = fs::read_dir(registry) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let base = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((e.path(), base))
        })
        .collect()
}

/// The other installations whose claimed range (in `registry`) overlaps `range`, by data
/// directory: what `doctor` warns about for an explicit `uid_base`.
pub fn overlapping_claims(range: &Range<u32>, data_dir: &Path, registry: &Path) -> Vec<PathBuf> {
    let me = fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let mut out = Vec::new();
    for (claim, base) in claims(registry) {
        let Some(owner) = live_owner(&claim, base) else {
            continue;
        };
        let theirs = recorded(&owner).unwrap_or(base..base);
        if owner != me && theirs.start < range.end && range.start < theirs.end {
            out.push(owner);
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_installations_get_disjoint_ranges_and_keep_them() {
        let root = tempfile::tempdir().unwrap();
        let registry = root.path().join("registry");
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        fs::create_dir_all(&a).unwrap();
        fs::create_dir_all(&b).unwrap();
        let ra = IsolatedConfig::installation_uids(&a, 64, &registry).unwrap();
        let rb = IsolatedConfig::installation_uids(&b, 64, &registry).unwrap();
        assert_eq!(
            ra,
            3_000_000..3_000_064,
            "the first keeps the historic default"
        );
        assert_eq!(rb, 3_000_064..3_000_128);
        assert_eq!(
            IsolatedConfig::installation_uids(&b, 64, &registry).unwrap(),
            rb
        );
        assert!(overlapping_claims(&ra, &a, &registry).is_empty());
        assert_eq!(
            overlapping_claims(&(3_000_100..3_000_101), &a, &registry),
            [fs::canonicalize(&b).unwrap()]
        );
        // A removed installation's claim is stale: the next one takes its range.
        fs::remove_dir_all(&a).unwrap();
        let c = root.path().join("c");
        fs::create_dir_all(&c).unwrap();
        assert_eq!(
            IsolatedConfig::installation_uids(&c, 64, &registry).unwrap(),
            ra
        );
        assert!(IsolatedConfig::installation_uids(&c, 0, &registry).is_err());
        // A range of another size never overlaps a live one.
        let d = root.path().join("d");
        fs::create_dir_all(&d).unwrap();
        assert_eq!(
            IsolatedConfig::installation_uids(&d, 1000, &registry).unwrap(),
            3_000_128..3_001_128
        );
    }
}
