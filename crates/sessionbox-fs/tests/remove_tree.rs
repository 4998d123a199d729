//! `remove_tree`, and recursive `Workspace::remove` which shares its walk: a bounded number of
//! descriptors whatever the depth, links never followed, nothing outside ever removed (also
//! while a second thread swaps directories for links), entries created meanwhile removed too,
//! unreadable and read-only directories removed, mount points not entered.
//!
//! Some checks run in a child process (this test binary again, running the same test selected
//! by name, with [`CHILD`] set, which then runs its `child_*` half): under a lowered descriptor limit, as an
//! unprivileged user, in a private mount namespace.

use crate::common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{ROOT, snapshot};
use rustix::fs::{CWD, Mode, OFlags};
use rustix::io::Errno;
use sessionbox_core::Limits;
use sessionbox_fs::{Workspace, remove_tree};

/// Set in a child process to the directory its checks work on.
const CHILD: &str = "SESSIONBOX_FS_REMOVE_TREE_CHILD";
/// Depth of the deep trees: far beyond the child's descriptor limit.
const DEPTH: usize = 6000;
/// The child's `RLIMIT_NOFILE` soft limit.
const FD_LIMIT: u64 = 256;

/// Runs the test `name` of this binary again in a child process with [`CHILD`] set to
/// `dir`; returns its output, or `None` when the child could not be started (`configure` may
/// add a `pre_exec` step that fails without privileges).
fn run_child(name: &str, dir: &Path, configure: impl FnOnce(&mut Command)) -> Option<String> {
    run_child_exe(&std::env::current_exe().unwrap(), name, dir, configure)
}

/// [`run_child`] with the test binary at `exe`.
fn run_child_exe(
    exe: &Path,
    name: &str,
    dir: &Path,
    configure: impl FnOnce(&mut Command),
) -> Option<String> {
    // The harness names a test by its path below the crate root (`remove_tree::NAME` in
    // tests/all.rs); `--exact` needs that path.
    let name = &match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    };
    let mut cmd = Command::new(exe);
    cmd.args([name.as_str(), "--exact", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD, dir);
    configure(&mut cmd);
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) => {
            eprintln!("child {name} could not start: {e}");
            return None;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child {name} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("1 passed"),
        "child {name} ran no test:\n{stdout}"
    );
    Some(stdout)
}

/// The directory a child works on, or `None` outside a child.
fn child_dir() -> Option<PathBuf> {
    std::env::var_os(CHILD).map(PathBuf::from)
}

/// Creates `top` and `depth` directories `d` nested below it, with a file and a link to
/// `outside` every 500 levels. Built with descriptors (no `chdir`, no path longer than a name).
fn build_deep(top: &Path, depth: usize, outside: &Path) {
    std::fs::create_dir(top).unwrap();
    let mut cur = rustix::fs::open(
        top,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    for level in 0..depth {
        if level % 500 == 0 {
            let f = rustix::fs::openat(
                &cur,
                "file",
                OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
            .unwrap();
            rustix::io::write(&f, b"level").unwrap();
            rustix::fs::symlinkat(outside, &cur, "out").unwrap();
        }
        rustix::fs::mkdirat(&cur, "d", Mode::from_raw_mode(0o755)).unwrap();
        cur = rustix::fs::openat(
            &cur,
            "d",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
    }
}

fn outside_dir(base: &Path) -> PathBuf {
    let outside = base.join("outside");
    std::fs::create_dir_all(outside.join("sub/deeper")).unwrap();
    std::fs::write(outside.join("victim.txt"), b"VICTIM").unwrap();
    std::fs::write(outside.join("sub/victim.txt"), b"VICTIM").unwrap();
    std::fs::write(outside.join("sub/deeper/victim.txt"), b"VICTIM").unwrap();
    outside
}

/// A tree 6000 levels deep is removed by a process whose descriptor limit is 256 (where
/// `std::fs::remove_dir_all` fails with `EMFILE`), by `remove_tree` and by a recursive
/// `Workspace::remove`; the links out that it holds are unlinked, their target untouched.
#[test]
fn a_deep_tree_is_removed_under_a_low_descriptor_limit() {
    if child_dir().is_some() {
        return child_deep_tree_low_fd_limit();
    }
    let base = tempfile::tempdir().unwrap();
    let dir = base.path();
    let outside = outside_dir(dir);
    let before = snapshot(&outside);
    let t = Instant::now();
    build_deep(&dir.join("a"), DEPTH, &outside);
    std::fs::create_dir(dir.join("ws")).unwrap();
    build_deep(&dir.join("ws/b"), DEPTH, &outside);
    println!("built 2 trees {DEPTH} levels deep in {:?}", t.elapsed());

    let out = run_child(
        "a_deep_tree_is_removed_under_a_low_descriptor_limit",
        dir,
        |_| {},
    )
    .unwrap();
    for line in out.lines().filter(|l| l.starts_with("CHILD")) {
        println!("{line}");
    }
    assert!(!dir.join("a").exists());
    assert!(!dir.join("ws/b").exists());
    assert!(dir.join("ws").is_dir());
    assert_eq!(snapshot(&outside), before);
}

/// The child half of [`a_deep_tree_is_removed_under_a_low_descriptor_limit`].
fn child_deep_tree_low_fd_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let Some(dir) = child_dir() else { return };
    println!(); // libtest printed "test NAME ... " without a line break
    let limit = getrlimit(Resource::Nofile);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(FD_LIMIT),
            maximum: limit.maximum,
        },
    )
    .unwrap();
    // The limit bites: opening descriptors fails with EMFILE before 256 more are open.
    let mut held = Vec::new();
    let err = loop {
        match rustix::fs::open("/", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
            Ok(fd) => held.push(fd),
            Err(e) => break e,
        }
        assert!(held.len() <= FD_LIMIT as usize, "the limit is not in force");
    };
    assert_eq!(err, Errno::MFILE);
    drop(held);

    // What the bug looked like (it leaves the directories in place).
    let control = std::fs::remove_dir_all(dir.join("a"));
    println!("CHILD std::fs::remove_dir_all under the limit: {control:?}");

    let t = Instant::now();
    assert!(remove_tree(&dir.join("a")).unwrap());
    println!(
        "CHILD remove_tree: {DEPTH} levels with RLIMIT_NOFILE {FD_LIMIT} in {:?}",
        t.elapsed()
    );
    let ws = Workspace::open(&dir.join("ws"), ROOT, Limits::default()).unwrap();
    let t = Instant::now();
    ws.remove("b", true).unwrap();
    println!(
        "CHILD Workspace::remove(recursive): {DEPTH} levels in {:?}",
        t.elapsed()
    );
}

/// Links inside the tree (to a directory outside, to a file outside, relative, absolute,
/// dangling) are unlinked and their targets untouched; when the path itself is a link, the link
/// is removed, not its target.
#[test]
fn links_are_unlinked_never_followed() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path();
    let outside = outside_dir(dir);
    let before = snapshot(&outside);
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("sub/inner")).unwrap();
    std::fs::write(tree.join("file.txt"), b"x").unwrap();
    std::fs::write(tree.join("sub/inner/file.txt"), b"x").unwrap();
    let link = |target: &Path, at: &str| std::os::unix::fs::symlink(target, tree.join(at)).unwrap();
    link(&outside, "abs-dir");
    link(Path::new("../../outside/sub"), "sub/rel-dir");
    link(&outside.join("victim.txt"), "sub/inner/abs-file");
    link(Path::new("/nonexistent/x"), "sub/dangling");
    link(Path::new("/"), "root");
    assert!(remove_tree(&tree).unwrap());
    assert!(!tree.exists());
    assert_eq!(snapshot(&outside), before);

    // The path itself is a link: the link goes, the target stays.
    let top = dir.join("top-link");
    std::os::unix::fs::symlink(&outside, &top).unwrap();
    assert!(remove_tree(&top).unwrap());
    assert!(std::fs::symlink_metadata(&top).is_err());
    assert_eq!(snapshot(&outside), before);

    // And through a workspace.
    std::fs::create_dir_all(dir.join("ws/t/u")).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("ws/t/u/out")).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("ws/t/out")).unwrap();
    let ws = Workspace::open(&dir.join("ws"), ROOT, Limits::default()).unwrap();
    ws.remove("t", true).unwrap();
    assert!(!dir.join("ws/t").exists());
    assert_eq!(snapshot(&outside), before);
}

/// Nothing at the path: `Ok(false)`; a file: unlinked; `/` or a path ending in `..`: refused.
#[test]
fn missing_paths_files_and_unnameable_paths() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path();
    assert!(!remove_tree(&dir.join("missing")).unwrap());
    assert!(!remove_tree(&dir.join("missing/child")).unwrap());
    std::fs::write(dir.join("file"), b"x").unwrap();
    assert!(remove_tree(&dir.join("file")).unwrap());
    assert!(!dir.join("file").exists());
    std::fs::create_dir(dir.join("empty")).unwrap();
    assert!(remove_tree(&dir.join("empty")).unwrap());
    assert!(!remove_tree(&dir.join("empty")).unwrap());
    // A path ending in `..` names no entry to remove. (Never exercise the refusal of `/` in
    // a test run as root: a regression there would empty the machine.)
    std::fs::create_dir(dir.join("sub")).unwrap();
    let e = remove_tree(&dir.join("sub/..")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(dir.join("sub").is_dir());
    assert!(dir.is_dir());
}

/// Pairs of a directory `x/aN` and a link `x/lN` to `outside` that the racing thread exchanges.
const PAIRS: usize = 8;

/// Builds `tree/x` with [`PAIRS`] directories `aN` (each two levels deep, with files) and links
/// `lN` to `outside` (absolute and relative).
fn build_race_tree(tree: &Path, outside: &Path) {
    for i in 0..PAIRS {
        let a = tree.join(format!("x/a{i}"));
        std::fs::create_dir_all(a.join("sub")).unwrap();
        std::fs::write(a.join("f"), b"x").unwrap();
        std::fs::write(a.join("sub/f"), b"x").unwrap();
        let target = if i % 2 == 0 {
            outside.to_path_buf()
        } else {
            PathBuf::from("../../outside")
        };
        std::os::unix::fs::symlink(target, tree.join(format!("x/l{i}"))).unwrap();
    }
}

/// While the tree is removed, a second thread keeps exchanging directories of it with links to
/// a directory outside (`RENAME_EXCHANGE`, so a name read as a directory is a link an instant
/// later). Nothing outside is ever removed; once the thread stops, the tree goes.
///
/// No thread here *moves* directories (within the tree or out of it) below the levels whose
/// streams stay open: with a regression in the `..` check, such a test would carry the removal
/// up through the test's own parents to `/`.
#[test]
fn directories_swapped_for_links_mid_removal_never_lead_outside() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path();
    let outside = outside_dir(dir);
    let before = snapshot(&outside);
    let tree = dir.join("tree");
    let deadline = Instant::now() + Duration::from_millis(1500);
    let mut rounds = 0;
    while rounds < 20 || Instant::now() < deadline {
        rounds += 1;
        build_race_tree(&tree, &outside);
        let stop = AtomicBool::new(false);
        let swaps = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let exchange = |p: &Path, q: &Path| {
                    rustix::fs::renameat_with(CWD, p, CWD, q, rustix::fs::RenameFlags::EXCHANGE)
                };
                let pairs: Vec<_> = (0..PAIRS)
                    .map(|i| (tree.join(format!("x/a{i}")), tree.join(format!("x/l{i}"))))
                    .collect();
                while !stop.load(Ordering::Relaxed) {
                    for (a, l) in &pairs {
                        if exchange(a, l).is_ok() {
                            swaps.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
            while swaps.load(Ordering::Relaxed) < PAIRS {
                std::thread::yield_now();
            }
            for _ in 0..3 {
                let _ = remove_tree(&tree);
            }
            stop.store(true, Ordering::Relaxed);
        });
        let _ = remove_tree(&tree).unwrap();
        assert!(std::fs::symlink_metadata(&tree).is_err(), "round {rounds}");
        assert_eq!(snapshot(&outside), before, "round {rounds}");
    }
    println!("{rounds} rounds");
}

/// A process still running in the tree keeps creating files and directories while it is
/// removed: they are removed too (the directory is read again), and the removal succeeds.
#[test]
fn entries_created_during_the_removal_are_removed_too() {
    let base = tempfile::tempdir().unwrap();
    let tree = base.path().join("tree");
    for i in 0..50 {
        std::fs::create_dir_all(tree.join(format!("d{i}/e"))).unwrap();
        std::fs::write(tree.join(format!("d{i}/e/f")), b"x").unwrap();
    }
    let created = std::sync::atomic::AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    /// Stops the writer when the removal returns or panics, so a failure fails the test
    /// instead of leaving the scope waiting for a writer that never ends.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            // At most 100 new entries: fewer than the 128 times `remove_tree` reads a directory
            // again, so the removal wins however slow the machine is.
            for i in 0..100 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                match std::fs::create_dir(tree.join(format!("w{i}"))) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    _ => {}
                }
                let _ = std::fs::write(tree.join(format!("w{i}/f")), b"x");
                let _ = std::fs::write(tree.join(format!("g{i}")), b"x");
                created.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(50));
            }
        });
        let _stop = StopOnDrop(&stop);
        std::thread::sleep(Duration::from_millis(20));
        assert!(remove_tree(&tree).unwrap());
    });
    assert!(!tree.exists());
    assert!(created.load(Ordering::Relaxed) > 0);
}

/// Builds `top` with directories that cannot be read, searched or written, `top` itself
/// read-only.
fn build_unfriendly(top: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for d in [
        "zero/zero",
        "ro/sub",
        "noread/sub",
        "nosearch/sub",
        "wo/sub",
        "search-only/x/y",
    ] {
        std::fs::create_dir_all(top.join(d)).unwrap();
        for i in 0..3 {
            std::fs::write(top.join(d).join(format!("f{i}")), b"x").unwrap();
        }
    }
    std::fs::create_dir(top.join("nosearch-empty")).unwrap();
    for (d, mode) in [
        ("zero/zero", 0),
        ("zero", 0),
        ("ro/sub", 0o500),
        ("ro", 0o500),
        ("noread", 0o300),
        ("noread/sub", 0o300),
        ("nosearch/sub", 0o600),
        ("nosearch", 0o600),
        ("wo/sub", 0o200),
        ("wo", 0o200),
        ("search-only/x/y", 0o600),
        ("search-only/x", 0o500),
        ("search-only", 0o100),
        ("nosearch-empty", 0o600),
        ("", 0o500),
    ] {
        std::fs::set_permissions(top.join(d), std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// Directories of mode 0, read-only, unreadable or unsearchable are removed, by `remove_tree`
/// and by `Workspace::remove`. When the tests run as root (which bypasses permission checks),
/// this runs in a child process as user `nobody`.
#[test]
fn unreadable_and_read_only_directories_are_removed() {
    if child_dir().is_some() {
        return child_unfriendly_modes();
    }
    let base = tempfile::tempdir().unwrap();
    if rustix::process::geteuid().is_root() {
        // The test binary may sit where `nobody` cannot reach it (a target directory under
        // /root): run a copy from a directory anybody can enter.
        use std::os::unix::fs::PermissionsExt;
        let bin_dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(bin_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = bin_dir.path().join("remove_tree_test");
        std::fs::copy(std::env::current_exe().unwrap(), &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = run_child_exe(
            &copy,
            "unreadable_and_read_only_directories_are_removed",
            base.path(),
            |cmd| {
                cmd.uid(65534).gid(65534);
            },
        );
        let out = out.expect("the child could not run as nobody");
        for line in out.lines().filter(|l| l.starts_with("CHILD")) {
            println!("{line}");
        }
    } else {
        unfriendly_modes();
    }
}

/// The child half of [`unreadable_and_read_only_directories_are_removed`].
fn child_unfriendly_modes() {
    if child_dir().is_some() {
        unfriendly_modes();
    }
}

fn unfriendly_modes() {
    println!("\nCHILD as uid {}", rustix::process::geteuid().as_raw());
    let base = tempfile::tempdir().unwrap();
    let tree = base.path().join("tree");
    build_unfriendly(&tree);
    if !rustix::process::geteuid().is_root() {
        // The modes are in force.
        assert!(std::fs::read_dir(tree.join("zero")).is_err());
        assert!(std::fs::remove_file(tree.join("ro/f0")).is_err());
        println!("CHILD permissions are enforced for this user");
    }
    assert!(remove_tree(&tree).unwrap());
    assert!(!tree.exists());

    std::fs::create_dir(base.path().join("ws")).unwrap();
    build_unfriendly(&base.path().join("ws/t"));
    let ws = Workspace::open(&base.path().join("ws"), ROOT, Limits::default()).unwrap();
    ws.remove("t", true).unwrap();
    assert!(!base.path().join("ws/t").exists());
}

/// A file system mounted inside the tree is not entered: the removal fails with `EXDEV` and the
/// mounted files stay. Needs a private mount namespace (`CAP_SYS_ADMIN`); skipped without.
#[test]
fn mount_points_inside_are_not_entered() {
    if child_dir().is_some() {
        return child_mount_point();
    }
    let base = tempfile::tempdir().unwrap();
    let tree = base.path().join("tree");
    std::fs::create_dir_all(tree.join("sub/mnt")).unwrap();
    std::fs::write(tree.join("sub/file"), b"x").unwrap();
    let out = run_child("mount_points_inside_are_not_entered", base.path(), |cmd| {
        // SAFETY: unshare is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS)
                    .map_err(Into::into)
            });
        }
    });
    match out {
        None => println!("skipped: no private mount namespace"),
        Some(out) => {
            for line in out.lines().filter(|l| l.starts_with("CHILD")) {
                println!("{line}");
            }
        }
    }
    // The mount lived in the child's namespace only; now the tree is plain.
    assert!(remove_tree(&tree).unwrap());
    assert!(!tree.exists());
}

/// The child half of [`mount_points_inside_are_not_entered`].
fn child_mount_point() {
    use rustix::mount::{MountFlags, MountPropagationFlags, mount, mount_change};
    let Some(dir) = child_dir() else { return };
    println!();
    let tree = dir.join("tree");
    let mnt = tree.join("sub/mnt");
    mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .unwrap();
    if let Err(e) = mount("tmpfs", &mnt, "tmpfs", MountFlags::empty(), None) {
        println!("CHILD skipped: cannot mount a tmpfs: {e}");
        return;
    }
    std::fs::write(mnt.join("keep"), b"mounted").unwrap();
    let e = remove_tree(&tree).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(Errno::XDEV.raw_os_error()), "{e}");
    assert_eq!(std::fs::read(mnt.join("keep")).unwrap(), b"mounted");

    let ws = Workspace::open(&tree, ROOT, Limits::default()).unwrap();
    let e = ws.remove("sub", true).unwrap_err();
    assert_eq!(e.code(), "conflict", "{e}");
    assert_eq!(std::fs::read(mnt.join("keep")).unwrap(), b"mounted");

    // The tree may be the mount point itself: its contents are removed, then EBUSY.
    let e = remove_tree(&mnt).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(Errno::BUSY.raw_os_error()), "{e}");
    assert!(!mnt.join("keep").exists());
    println!("CHILD mount point checks passed");
}
