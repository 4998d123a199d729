//! Snapshots for mounting runtimes: exactly the delivered files, with modes an unprivileged
//! sandbox user can read, one directory per content digest, written once.

use std::os::unix::fs::PermissionsExt;

use sessionbox_skills::{SkillLimits, discover, snapshot};

fn mode(p: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_snapshot_holds_the_delivered_files_readable_by_all_and_is_written_once_per_digest() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("s");
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    std::fs::write(dir.join("SKILL.md"), "---\nname: s\ndescription: d\n---\n").unwrap();
    std::fs::write(dir.join("scripts/run"), "echo\n").unwrap();
    std::fs::write(dir.join("real"), "r").unwrap();
    std::os::unix::fs::symlink("real", dir.join("alias")).unwrap();
    std::fs::write(dir.join(".env"), "SECRET").unwrap();
    std::fs::set_permissions(dir.join("SKILL.md"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(
        dir.join("scripts/run"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    std::fs::set_permissions(dir.join("scripts"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let store = tempfile::tempdir().unwrap();
    let roots = [root.path().to_owned()];
    let skill = discover(&roots, &SkillLimits::default()).unwrap().skills[0].clone();

    let snap = snapshot(&skill, store.path()).unwrap();
    assert_eq!(
        snap.file_name().unwrap().to_str(),
        Some(skill.digest.as_str())
    );
    let mut names: Vec<String> = walk(&snap);
    names.sort();
    assert_eq!(
        names,
        ["SKILL.md", "alias", "real", "scripts", "scripts/run"]
    );
    assert_eq!(mode(&snap), 0o755);
    assert_eq!(mode(&snap.join("SKILL.md")), 0o644);
    assert_eq!(mode(&snap.join("scripts")), 0o755);
    assert_eq!(mode(&snap.join("scripts/run")), 0o755);
    assert!(snap.join("alias").is_file() && !snap.join("alias").is_symlink());
    assert_eq!(std::fs::read(snap.join("alias")).unwrap(), b"r");

    // Written once: a second call returns it untouched; a changed skill gets another one.
    let stamp = std::fs::metadata(snap.join("SKILL.md"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(snapshot(&skill, store.path()).unwrap(), snap);
    let again = std::fs::metadata(snap.join("SKILL.md"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(stamp, again);
    std::fs::write(dir.join("real"), "changed").unwrap();
    let changed = discover(&roots, &SkillLimits::default()).unwrap().skills[0].clone();
    let snap2 = snapshot(&changed, store.path()).unwrap();
    assert_ne!(snap2, snap);
    assert_eq!(std::fs::read(snap2.join("real")).unwrap(), b"changed");

    // A file changed between discovery and snapshot is refused, and nothing is left behind.
    std::fs::write(dir.join("real"), "changed again").unwrap();
    let store2 = tempfile::tempdir().unwrap();
    assert!(snapshot(&changed, store2.path()).is_err());
    assert_eq!(std::fs::read_dir(store2.path()).unwrap().count(), 0);
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()).into_iter().map(|n| format!("{name}/{n}")));
        }
        out.push(name);
    }
    out
}
