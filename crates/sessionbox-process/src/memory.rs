//! How much memory a group of processes holds: a cgroup's charge, or the sum of resident sets.

use std::path::{Path, PathBuf};

use sessionbox_core::{MemoryMeasure, MemoryUsage};

/// The resident memory of `pids` together, in bytes: the sum of each one's `VmRSS`
/// (`/proc/PID/status`). Pages two of them share count twice, so this is an upper bound of
/// what they hold. Pids gone meanwhile, kernel threads and processes not ours to inspect count
/// 0.
#[must_use]
pub fn resident_bytes(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter_map(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib.saturating_mul(1024))
        })
        .fold(0, u64::saturating_add)
}

/// The memory charge of the first of `cgroups` that has a memory controller (a sandbox's
/// cgroup in each hierarchy, as its record lists them; or, inside a container, its own cgroup
/// at `/sys/fs/cgroup` on v2 or `/sys/fs/cgroup/memory` on v1): `memory.usage_in_bytes`
/// against `memory.limit_in_bytes` on cgroups v1, `memory.current` against `memory.max` on v2.
/// `None` when none has one (rlimit-only limits, or the cgroups are gone with the sandbox).
#[must_use]
pub fn memory_charge(cgroups: &[PathBuf]) -> Option<MemoryUsage> {
    let read = |dir: &Path, name: &str| {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .map(|s| s.trim().to_owned())
    };
    cgroups.iter().find_map(|dir| {
        let (used, limit) = match read(dir, "memory.usage_in_bytes") {
            Some(used) => (used, read(dir, "memory.limit_in_bytes")),
            None => (read(dir, "memory.current")?, read(dir, "memory.max")),
        };
        Some(MemoryUsage {
            bytes_used: used.parse().ok()?,
            bytes_limit: limit.as_deref().and_then(parse_limit),
            measured: MemoryMeasure::Cgroup,
        })
    })
}

/// A cgroup memory limit; `max` (v2) and v1's "unlimited" (the largest page-aligned `i64`,
/// 9223372036854771712 with 4 KiB pages) are `None`.
fn parse_limit(text: &str) -> Option<u64> {
    let n: u64 = text.parse().ok()?;
    (n < (1 << 62)).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_bytes_grows_with_a_process_that_holds_memory_and_ignores_the_gone() {
        let me = std::process::id();
        let alone = resident_bytes(&[me]);
        assert!(
            alone > 1 << 20,
            "this test process holds over 1 MiB: {alone}"
        );
        // A child that touches 64 MiB: the pair holds at least that much more.
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import time; b=b\"x\"*(64<<20); print(1,flush=True); time.sleep(30)",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        let both = resident_bytes(&[me, child.id()]);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(both >= alone + (64 << 20), "{both} < {alone} + 64 MiB");
        // A pid that is gone (the child, reaped) and one that never was count nothing.
        let gone = resident_bytes(&[child.id(), u32::MAX]);
        assert_eq!(gone, 0);
    }

    #[test]
    fn a_v1_or_v2_memory_cgroup_is_read_and_unlimited_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let (v1, v2, pids) = (
            dir.path().join("v1"),
            dir.path().join("v2"),
            dir.path().join("pids"),
        );
        for d in [&v1, &v2, &pids] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(v1.join("memory.usage_in_bytes"), "1048576\n").unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        std::fs::write(v2.join("memory.current"), "4096\n").unwrap();
        std::fs::write(v2.join("memory.max"), "268435456\n").unwrap();
        let charge = |used, limit| MemoryUsage {
            bytes_used: used,
            bytes_limit: limit,
            measured: MemoryMeasure::Cgroup,
        };
        // The pids hierarchy comes first in a record; it has no memory files and is passed by.
        assert_eq!(
            memory_charge(&[pids.clone(), v1]),
            Some(charge(1_048_576, None))
        );
        assert_eq!(
            memory_charge(&[pids.clone(), v2.clone()]),
            Some(charge(4096, Some(268_435_456)))
        );
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        assert_eq!(memory_charge(&[v2]), Some(charge(4096, None)));
        assert_eq!(memory_charge(&[pids]), None);
        assert_eq!(memory_charge(&[]), None);
    }
}
