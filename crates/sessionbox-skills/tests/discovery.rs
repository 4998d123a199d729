//! Discovery and validation on real directories: every rule's failure is its own typed error
//! naming the skill, and the content address covers exactly what is delivered.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sessionbox_skills::{SkillError, SkillLimits, discover, scan};

fn skill(root: &Path, name: &str, front: &str, body: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("SKILL.md"), format!("---\n{front}---\n{body}")).unwrap();
    dir
}

fn named(root: &Path, name: &str) -> PathBuf {
    skill(
        root,
        name,
        &format!("name: {name}\ndescription: Does {name}.\n"),
        "Body.\n",
    )
}

fn run(root: &Path) -> Result<sessionbox_skills::Catalog, SkillError> {
    discover(&[root.to_owned()], &SkillLimits::default())
}

#[test]
fn skills_are_found_sorted_with_their_files_and_dot_dirs_and_plain_dirs_are_passed_over() {
    let root = tempfile::tempdir().unwrap();
    let b = named(root.path(), "beta");
    named(root.path(), "alpha");
    std::fs::create_dir_all(b.join("scripts")).unwrap();
    std::fs::write(b.join("scripts/run.sh"), "echo run\n").unwrap();
    std::fs::set_permissions(
        b.join("scripts/run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::create_dir_all(root.path().join("not-a-skill")).unwrap();
    named(root.path(), ".hidden");
    let c = run(root.path()).unwrap();
    let names: Vec<&str> = c.skills.iter().map(|s| s.name()).collect();
    assert_eq!(names, ["alpha", "beta"]);
    let beta = c.get("beta").unwrap();
    let files: Vec<(&str, bool)> = beta
        .files
        .iter()
        .map(|f| (f.rel.as_str(), f.executable))
        .collect();
    assert_eq!(files, [("SKILL.md", false), ("scripts/run.sh", true)]);
    assert_eq!(beta.doc.description, "Does beta.");
}

#[test]
fn secrets_and_git_are_left_out_of_the_files_and_the_digest() {
    let root = tempfile::tempdir().unwrap();
    let dir = named(root.path(), "s");
    let before = run(root.path()).unwrap().get("s").unwrap().digest.clone();
    for f in [
        ".env",
        ".env.local",
        "credentials.json",
        "Credentials",
        "sub/.ENV",
    ] {
        let p = dir.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "SECRET=1\n").unwrap();
    }
    std::fs::create_dir_all(dir.join(".git/objects")).unwrap();
    std::fs::write(dir.join(".git/config"), "[core]\n").unwrap();
    let s = run(root.path()).unwrap();
    let s = s.get("s").unwrap();
    assert_eq!(s.digest, before);
    assert!(
        s.files
            .iter()
            .all(|f| !f.rel.contains("env") && !f.rel.contains("git"))
    );
}

#[test]
fn the_digest_changes_with_content_and_with_the_executable_bit() {
    let root = tempfile::tempdir().unwrap();
    let dir = named(root.path(), "s");
    std::fs::write(dir.join("a.sh"), "x\n").unwrap();
    let d1 = run(root.path()).unwrap().skills[0].digest.clone();
    std::fs::write(dir.join("a.sh"), "y\n").unwrap();
    let d2 = run(root.path()).unwrap().skills[0].digest.clone();
    std::fs::set_permissions(dir.join("a.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let d3 = run(root.path()).unwrap().skills[0].digest.clone();
    assert!(d1 != d2 && d2 != d3 && d1 != d3);
    assert_eq!(d3, run(root.path()).unwrap().skills[0].digest, "stable");
}

#[test]
fn two_skills_with_one_name_across_roots_are_a_duplicate() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    named(a.path(), "same");
    named(b.path(), "same");
    let e = discover(
        &[a.path().to_owned(), b.path().to_owned()],
        &SkillLimits::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&e, SkillError::DuplicateName { name, .. } if name == "same"),
        "{e}"
    );
    assert!(e.to_string().contains("unique"), "{e}");
}

#[test]
fn bad_front_matter_and_a_name_unlike_the_directory_are_refused() {
    for (front, want) in [
        ("description: d\n", "no `name`"),
        ("name: Bad_Name\ndescription: d\n", "invalid name"),
        ("name: x\n", "no `description`"),
        ("name: x\ndescription: [unclosed\n", "not valid YAML"),
    ] {
        let root = tempfile::tempdir().unwrap();
        skill(root.path(), "x", front, "");
        let e = run(root.path()).unwrap_err();
        assert!(
            matches!(e, SkillError::BadFrontMatter { .. }),
            "{front}: {e}"
        );
        assert!(e.to_string().contains(want), "{front}: {e}");
        assert!(e.to_string().contains("SKILL.md"), "names the file: {e}");
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("x")).unwrap();
    std::fs::write(root.path().join("x/SKILL.md"), "no front matter\n").unwrap();
    assert!(matches!(
        run(root.path()),
        Err(SkillError::BadFrontMatter { .. })
    ));
    let root = tempfile::tempdir().unwrap();
    skill(root.path(), "dir-name", "name: other\ndescription: d\n", "");
    assert!(matches!(
        run(root.path()),
        Err(SkillError::NameMismatch { .. })
    ));
}

#[test]
fn oversize_skills_are_refused_by_total_bytes_file_count_and_skill_md_size() {
    let root = tempfile::tempdir().unwrap();
    let dir = named(root.path(), "big");
    std::fs::write(dir.join("blob"), vec![b'x'; 5000]).unwrap();
    for f in 0..5 {
        std::fs::write(dir.join(format!("f{f}")), "x").unwrap();
    }
    let limits = |b: u64, f: u64, m: u64| SkillLimits {
        max_skill_bytes: b,
        max_files: f,
        max_skill_md_bytes: m,
    };
    let roots = [root.path().to_owned()];
    for (l, what) in [
        (limits(4000, 100, 1000), "total size in bytes"),
        (limits(100_000, 3, 1000), "file count"),
        (limits(100_000, 100, 10), "SKILL.md size in bytes"),
    ] {
        let e = discover(&roots, &l).unwrap_err();
        assert!(
            matches!(&e, SkillError::TooLarge { what: w, .. } if *w == what),
            "{e}"
        );
    }
    assert!(discover(&roots, &limits(100_000, 100, 1000)).is_ok());
}

#[test]
fn links_that_leave_the_skill_are_absolute_dangle_or_name_a_directory_are_refused() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "s").unwrap();
    let cases: Vec<(String, &str)> = vec![
        (format!("{}/secret", outside.path().display()), "absolute"),
        ("../../../../../../../etc/hostname".into(), "leads out"),
        ("missing".into(), "dangles"),
        ("sub".into(), "directory"),
    ];
    for (target, want) in cases {
        let root = tempfile::tempdir().unwrap();
        let dir = named(root.path(), "s");
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::os::unix::fs::symlink(&target, dir.join("link")).unwrap();
        let e = run(root.path()).unwrap_err();
        assert!(
            matches!(e, SkillError::SymlinkEscape { .. }),
            "{target}: {e}"
        );
        assert!(e.to_string().contains(want), "{target}: {e}");
    }
    // A relative link to a file inside the skill is delivered as that file.
    let root = tempfile::tempdir().unwrap();
    let dir = named(root.path(), "s");
    std::fs::write(dir.join("real.txt"), "real").unwrap();
    std::os::unix::fs::symlink("real.txt", dir.join("alias.txt")).unwrap();
    let c = run(root.path()).unwrap();
    let alias = c.skills[0]
        .files
        .iter()
        .find(|f| f.rel == "alias.txt")
        .unwrap();
    assert!(alias.source.ends_with("real.txt"));
    // A skill directory that is itself a link (to a checkout elsewhere) is followed.
    let elsewhere = tempfile::tempdir().unwrap();
    let target = named(elsewhere.path(), "linked");
    let root = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&target, root.path().join("linked")).unwrap();
    assert_eq!(run(root.path()).unwrap().skills[0].name(), "linked");
}

#[test]
fn names_the_delivery_cannot_carry_and_a_missing_root_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let dir = named(root.path(), "s");
    std::fs::write(dir.join("a\nb"), "x").unwrap();
    assert!(matches!(run(root.path()), Err(SkillError::BadEntry { .. })));
    let e = discover(&[root.path().join("nope")], &SkillLimits::default()).unwrap_err();
    assert!(matches!(e, SkillError::Io { .. }), "{e}");
}

#[test]
fn scan_leaves_out_each_faulty_skill_and_root_and_keeps_the_rest() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    named(a.path(), "good");
    named(a.path(), "same");
    skill(a.path(), "bad-name", "name: other\ndescription: d\n", "");
    skill(a.path(), "no-desc", "name: no-desc\n", "");
    named(b.path(), "same");
    named(b.path(), "also-good");
    let roots = [
        a.path().to_owned(),
        a.path().join("missing"),
        b.path().to_owned(),
    ];
    let c = scan(&roots, &SkillLimits::default());
    let names: Vec<&str> = c.skills.iter().map(|s| s.name()).collect();
    assert_eq!(names, ["also-good", "good", "same"]);
    assert_eq!(
        c.get("same").unwrap().dir,
        a.path().join("same").canonicalize().unwrap()
    );
    let skipped: Vec<(String, &SkillError)> =
        c.skipped.iter().map(|k| (k.name(), &k.error)).collect();
    assert_eq!(skipped.len(), 4, "{skipped:?}");
    assert!(matches!(skipped[0], (ref n, SkillError::NameMismatch { .. }) if n == "bad-name"));
    assert!(matches!(skipped[1], (ref n, SkillError::BadFrontMatter { .. }) if n == "no-desc"));
    assert!(matches!(skipped[2], (ref n, SkillError::Io { .. }) if n == "missing"));
    assert!(matches!(skipped[3], (ref n, SkillError::DuplicateName { .. }) if n == "same"));
    // discover still fails on the first fault.
    assert!(discover(&roots, &SkillLimits::default()).is_err());
}
