//! The security properties: nothing outside the workspace is read, written, listed, stat'ed,
//! created or removed, whatever links or paths the caller arranges.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use common::{Fixture, ROOT, code};
use serde::Deserialize;
use sessionbox_core::{EditRequest, FileKind, GrepRequest, Limits};
use sessionbox_fs::Workspace;

#[derive(Deserialize)]
struct Cases {
    workspace: String,
    cases: Vec<Case>,
    symlink_cases: Vec<SymlinkCase>,
}
#[derive(Deserialize)]
struct Case {
    path: String,
    expect: String,
}
#[derive(Deserialize)]
struct SymlinkCase {
    setup: String,
    op: String,
}

fn cases() -> Cases {
    serde_json::from_str(include_str!(
        "../../sessionbox-core/tests/cases/workspace-paths.json"
    ))
    .unwrap()
}

fn edit(old: &str, new: &str) -> EditRequest {
    EditRequest {
        old: old.into(),
        new: new.into(),
        replace_all: false,
    }
}

#[test]
fn every_shared_symlink_case_is_refused_and_changes_nothing_outside() {
    let c = cases();
    assert!(!c.symlink_cases.is_empty());
    for case in &c.symlink_cases {
        let f = Fixture::new();
        // Run the set-up, with targets under /tmp moved into this test's own outside directory.
        let mut redirected: Vec<PathBuf> = Vec::new();
        for step in case.setup.split("&&").map(str::trim) {
            let words: Vec<&str> = step.split_whitespace().collect();
            match words.as_slice() {
                ["mkdir", "-p", dir] => std::fs::create_dir_all(f.host(dir)).unwrap(),
                ["ln", "-s", target, name] => {
                    let target = match target.strip_prefix("/tmp/") {
                        Some(rest) => {
                            let t = f.outside(rest);
                            redirected.push(t.clone());
                            t
                        }
                        None => PathBuf::from(target),
                    };
                    f.link(target, name);
                }
                other => panic!("unknown set-up step {other:?} in {:?}", case.setup),
            }
        }
        let before = f.outside_snapshot();
        let (op, arg) = case.op.split_once(' ').unwrap();
        match op {
            "read" => {
                let r = f.ws.read(arg);
                if let Ok(data) = &r {
                    assert!(
                        !String::from_utf8_lossy(data).contains("root:"),
                        "{}: leaked /etc/passwd",
                        case.op
                    );
                }
                assert_eq!(code(r), "outside_workspace", "{}", case.op);
            }
            "write" => {
                let r = f.ws.write(arg, b"PLANTED");
                assert_eq!(code(r), "outside_workspace", "{}", case.op);
                // The same refusal for an edit and a mkdir along the same path.
                assert_eq!(code(f.ws.edit(arg, &edit("a", "b"))), "outside_workspace");
            }
            other => panic!("unknown op {other}"),
        }
        for t in &redirected {
            assert!(!t.exists(), "{}: created {}", case.op, t.display());
        }
        assert_eq!(
            f.outside_snapshot(),
            before,
            "{}: changed the outside",
            case.op
        );
    }
}

#[test]
fn every_shared_path_case_gets_its_class_through_read_and_write() {
    let c = cases();
    assert_eq!(c.workspace, ROOT);
    for case in &c.cases {
        let f = Fixture::new();
        let before = f.outside_snapshot();
        let p = case.path.as_str();
        match case.expect.as_str() {
            "inside" | "not-outside" => {
                f.ws.write(p, b"data")
                    .unwrap_or_else(|e| panic!("{p:?}: {e}"));
                assert_eq!(f.ws.read(p).unwrap(), b"data", "{p:?}");
                let rel = f.ws.resolve(p).unwrap();
                assert_eq!(std::fs::read(f.host(rel.as_str())).unwrap(), b"data");
            }
            "outside" => {
                assert_eq!(code(f.ws.read(p)), "outside_workspace", "{p:?}");
                assert_eq!(code(f.ws.write(p, b"x")), "outside_workspace", "{p:?}");
            }
            "error" => {
                assert_eq!(code(f.ws.read(p)), "invalid_path", "{p:?}");
                assert_eq!(code(f.ws.write(p, b"x")), "invalid_path", "{p:?}");
            }
            other => panic!("unknown expectation {other}"),
        }
        assert_eq!(f.outside_snapshot(), before, "{p:?}");
    }
}

#[test]
fn an_intermediate_link_out_refuses_every_operation() {
    let f = Fixture::new();
    f.link("/", "r");
    f.link(f.outside(""), "o");
    f.put("mine.txt", b"MINE");
    let before = f.outside_snapshot();
    assert_eq!(code(f.ws.read("r/etc/hostname")), "outside_workspace");
    assert_eq!(code(f.ws.read("r/etc/passwd")), "outside_workspace");
    assert_eq!(
        code(f.ws.read_range("r/etc/passwd", 0, 10)),
        "outside_workspace"
    );
    assert_eq!(code(f.ws.read("o/victim.txt")), "outside_workspace");
    assert_eq!(code(f.ws.write("o/victim.txt", b"X")), "outside_workspace");
    assert_eq!(code(f.ws.write("o/new.txt", b"X")), "outside_workspace");
    assert_eq!(code(f.ws.write("o/sub/new.txt", b"X")), "outside_workspace");
    assert_eq!(
        code(f.ws.edit("o/victim.txt", &edit("VICTIM", "X"))),
        "outside_workspace"
    );
    assert_eq!(code(f.ws.stat("r")), "outside_workspace");
    assert_eq!(code(f.ws.stat("r/etc")), "outside_workspace");
    assert_eq!(code(f.ws.stat("o/victim.txt")), "outside_workspace");
    assert_eq!(code(f.ws.list("r")), "outside_workspace");
    assert_eq!(code(f.ws.list("o")), "outside_workspace");
    assert_eq!(code(f.ws.open_dir("o")), "outside_workspace");
    assert_eq!(code(f.ws.open_dir("r/tmp")), "outside_workspace");
    assert_eq!(code(f.ws.mkdir("o/newdir")), "outside_workspace");
    assert_eq!(code(f.ws.mkdir("o/a/b/c")), "outside_workspace");
    assert_eq!(
        code(f.ws.remove("o/victim.txt", false)),
        "outside_workspace"
    );
    assert_eq!(code(f.ws.remove("o/victim.txt", true)), "outside_workspace");
    assert_eq!(
        code(f.ws.rename("o/victim.txt", "stolen.txt")),
        "outside_workspace"
    );
    assert_eq!(
        code(f.ws.rename("mine.txt", "o/planted.txt")),
        "outside_workspace"
    );
    assert_eq!(
        code(f.ws.rename("mine.txt", "o/x/planted.txt")),
        "outside_workspace"
    );
    assert!(f.ws.glob("o/*").unwrap().is_empty());
    assert!(f.ws.glob("r/etc/*").unwrap().is_empty());
    let all = f.ws.glob("**/*").unwrap();
    assert_eq!(
        all,
        ["mine.txt", "o", "r"],
        "links are listed, never entered"
    );
    let mut g = GrepRequest::new("VICTIM|root:");
    assert!(f.ws.grep(&g).unwrap().is_empty());
    g.path = Some("o".into());
    assert_eq!(code(f.ws.grep(&g)), "outside_workspace");
    g.path = Some("r/etc/passwd".into());
    assert_eq!(code(f.ws.grep(&g)), "outside_workspace");
    assert_eq!(f.outside_snapshot(), before);
    assert_eq!(std::fs::read(f.host("mine.txt")).unwrap(), b"MINE");
}

#[test]
fn a_dot_dot_link_in_a_subdirectory_cannot_climb_out() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.host("d")).unwrap();
    f.link("../..", "d/up");
    f.link("../../outside", "d/out");
    let before = f.outside_snapshot();
    assert_eq!(code(f.ws.write("d/up/x.txt", b"X")), "outside_workspace");
    assert_eq!(
        code(f.ws.write("d/up/outside/x.txt", b"X")),
        "outside_workspace"
    );
    assert_eq!(code(f.ws.read("d/out/victim.txt")), "outside_workspace");
    assert_eq!(code(f.ws.mkdir("d/up/newdir")), "outside_workspace");
    assert_eq!(code(f.ws.list("d/up")), "outside_workspace");
    assert_eq!(code(f.ws.stat("d/out/victim.txt")), "outside_workspace");
    assert_eq!(
        code(f.ws.remove("d/out/victim.txt", false)),
        "outside_workspace"
    );
    assert!(!f.base.path().join("x.txt").exists());
    assert!(!f.base.path().join("newdir").exists());
    assert_eq!(f.outside_snapshot(), before);
}

#[test]
fn a_dangling_link_out_is_refused_and_nothing_is_created() {
    let f = Fixture::new();
    let abs = f.outside("abs-new.txt");
    f.link(&abs, "abs.txt");
    f.link("../outside/rel-new.txt", "rel.txt");
    f.link(f.outside("newdir"), "dirlink");
    let before = f.outside_snapshot();
    for p in ["abs.txt", "rel.txt", "/workspace/abs.txt"] {
        assert_eq!(code(f.ws.write(p, b"X")), "outside_workspace", "{p}");
        assert_eq!(
            code(f.ws.edit(p, &edit("a", "b"))),
            "outside_workspace",
            "{p}"
        );
        assert_eq!(code(f.ws.read(p)), "outside_workspace", "{p}");
        assert_eq!(code(f.ws.stat(p)), "outside_workspace", "{p}");
    }
    assert_eq!(code(f.ws.mkdir("dirlink")), "outside_workspace");
    assert_eq!(code(f.ws.mkdir("dirlink/sub")), "outside_workspace");
    assert_eq!(code(f.ws.write("dirlink/a.txt", b"X")), "outside_workspace");
    assert_eq!(
        code(f.ws.rename("abs.txt", "dirlink/moved")),
        "outside_workspace"
    );
    assert!(!abs.exists());
    assert!(!f.outside("rel-new.txt").exists());
    assert!(!f.outside("newdir").exists());
    assert_eq!(f.outside_snapshot(), before);
    // Removing a dangling link removes the link.
    f.ws.remove("abs.txt", false).unwrap();
    assert!(std::fs::symlink_metadata(f.host("abs.txt")).is_err());
}

/// Two workspaces side by side, presented as their host directories (as the `host` runtime
/// does): A reaches nothing of B.
#[test]
fn a_sibling_workspace_is_unreachable_by_link_dot_dot_or_absolute_path() {
    let base = tempfile::tempdir().unwrap();
    let a_dir = base.path().join("A");
    let b_dir = base.path().join("B");
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(b_dir.join("sub")).unwrap();
    std::fs::write(b_dir.join("secret.txt"), b"B-SECRET").unwrap();
    std::fs::write(b_dir.join("sub/deep.txt"), b"B-SECRET deep").unwrap();
    std::fs::write(a_dir.join("mine.txt"), b"MINE").unwrap();
    let link = |t: &std::path::Path, n: &str| std::os::unix::fs::symlink(t, a_dir.join(n)).unwrap();
    link("../B".as_ref(), "toB");
    link(&b_dir, "toBabs");
    link("../B/secret.txt".as_ref(), "toBsecret");
    link(&b_dir.join("secret.txt"), "toBsecretabs");
    let a = Workspace::open(&a_dir, a_dir.to_str().unwrap(), Limits::default()).unwrap();
    let b_host = b_dir.to_str().unwrap();
    let before = common::snapshot(&b_dir);

    // Links as the final component: reading, writing, editing and stat'ing go through them.
    for p in ["toBsecret", "toBsecretabs", "toB", "toBabs"] {
        assert_eq!(code(a.read(p)), "outside_workspace", "read {p}");
        assert_eq!(code(a.write(p, b"X")), "outside_workspace", "write {p}");
        assert_eq!(
            code(a.edit(p, &edit("B", "X"))),
            "outside_workspace",
            "edit {p}"
        );
        assert_eq!(code(a.stat(p)), "outside_workspace", "stat {p}");
    }
    // Paths through a link, or lexically outside.
    let files = [
        "toB/secret.txt".to_owned(),
        "toBabs/secret.txt".to_owned(),
        "toB/sub/deep.txt".to_owned(),
        "toB/sub".to_owned(),
        "../B/secret.txt".to_owned(),
        format!("{b_host}/secret.txt"),
        format!("{}/../B/secret.txt", a_dir.display()),
    ];
    for p in &files {
        assert_eq!(code(a.read(p)), "outside_workspace", "read {p}");
        assert_eq!(code(a.write(p, b"X")), "outside_workspace", "write {p}");
        assert_eq!(
            code(a.edit(p, &edit("B", "X"))),
            "outside_workspace",
            "edit {p}"
        );
        assert_eq!(code(a.stat(p)), "outside_workspace", "stat {p}");
        assert_eq!(code(a.remove(p, true)), "outside_workspace", "remove {p}");
        assert_eq!(
            code(a.rename(p, "got.txt")),
            "outside_workspace",
            "rename {p}"
        );
    }
    for d in ["toB", "toBabs", "toB/sub", "../B", b_host] {
        assert_eq!(code(a.list(d)), "outside_workspace", "list {d}");
        assert_eq!(code(a.open_dir(d)), "outside_workspace", "open_dir {d}");
        assert_eq!(
            code(a.mkdir(&format!("{d}/new"))),
            "outside_workspace",
            "mkdir {d}"
        );
        assert_eq!(
            code(a.rename("mine.txt", &format!("{d}/planted.txt"))),
            "outside_workspace",
            "rename to {d}"
        );
        let mut g = GrepRequest::new("SECRET");
        g.path = Some(d.to_owned());
        assert_eq!(code(a.grep(&g)), "outside_workspace", "grep {d}");
    }
    assert!(a.grep(&GrepRequest::new("SECRET")).unwrap().is_empty());
    assert!(a.glob("toB/**").unwrap().is_empty());
    assert!(a.glob("**/secret.txt").unwrap().is_empty());
    assert_eq!(code(a.glob(&format!("{b_host}/*"))), "outside_workspace");
    assert_eq!(code(a.glob("../B/*")), "outside_workspace");
    // Removing the links removes the links only.
    a.remove("toB", true).unwrap();
    a.remove("toBsecret", false).unwrap();
    assert_eq!(common::snapshot(&b_dir), before);
    assert_eq!(std::fs::read(a_dir.join("mine.txt")).unwrap(), b"MINE");
}

#[test]
fn a_hard_link_to_an_outside_file_is_never_modified() {
    let f = Fixture::new();
    std::fs::hard_link(f.outside("victim.txt"), f.host("hl.txt")).unwrap();
    f.link("hl.txt", "via-link");
    let before = f.outside_snapshot();
    assert_eq!(code(f.ws.write("hl.txt", b"OWNED")), "conflict");
    assert_eq!(
        code(f.ws.edit("hl.txt", &edit("VICTIM", "OWNED"))),
        "conflict"
    );
    assert_eq!(code(f.ws.write("via-link", b"OWNED")), "conflict");
    assert_eq!(
        code(f.ws.edit("via-link", &edit("VICTIM", "OWNED"))),
        "conflict"
    );
    let msg = f.ws.write("hl.txt", b"OWNED").unwrap_err().to_string();
    assert!(msg.contains("hard link"), "{msg}");
    assert_eq!(std::fs::read(f.outside("victim.txt")).unwrap(), b"VICTIM");
    assert_eq!(f.outside_snapshot(), before);
    // Removing the workspace's name of the file leaves the outside name alone.
    f.ws.remove("hl.txt", false).unwrap();
    assert_eq!(std::fs::read(f.outside("victim.txt")).unwrap(), b"VICTIM");
}

#[test]
fn links_that_stay_inside_are_followed() {
    let f = Fixture::new();
    f.put("sub/file.txt", b"hello inside");
    f.link("sub/file.txt", "inside");
    f.link("sub", "subdir");
    f.link("..", "sub/up");
    f.link("../sub/file.txt", "sub/self");
    assert_eq!(f.ws.read("inside").unwrap(), b"hello inside");
    assert_eq!(f.ws.read("subdir/file.txt").unwrap(), b"hello inside");
    assert_eq!(f.ws.read("sub/up/sub/file.txt").unwrap(), b"hello inside");
    assert_eq!(f.ws.read("/workspace/sub/self").unwrap(), b"hello inside");
    let st = f.ws.stat("inside").unwrap();
    assert_eq!(st.kind, FileKind::File);
    assert_eq!(st.path, "/workspace/inside");
    assert_eq!(st.size, 12);
    let names: Vec<String> =
        f.ws.list("subdir")
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
    assert_eq!(names, ["file.txt", "self", "up"]);
    f.ws.open_dir("sub/up").unwrap();
    f.ws.mkdir("subdir/made").unwrap();
    assert!(f.host("sub/made").is_dir());

    // Writing through the link replaces the target's content and keeps the link.
    std::fs::set_permissions(
        f.host("sub/file.txt"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    f.ws.write("inside", b"new content").unwrap();
    assert_eq!(
        std::fs::read(f.host("sub/file.txt")).unwrap(),
        b"new content"
    );
    assert!(
        std::fs::symlink_metadata(f.host("inside"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let mode = std::fs::metadata(f.host("sub/file.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o640);
    f.ws.write("sub/self", b"via relative link").unwrap();
    assert_eq!(
        std::fs::read(f.host("sub/file.txt")).unwrap(),
        b"via relative link"
    );
    let r =
        f.ws.edit("subdir/self", &edit("relative", "RELATIVE"))
            .unwrap();
    assert_eq!(r.replacements, 1);
    assert_eq!(
        std::fs::read(f.host("sub/file.txt")).unwrap(),
        b"via RELATIVE link"
    );
    assert!(
        std::fs::symlink_metadata(f.host("sub/self"))
            .unwrap()
            .file_type()
            .is_symlink()
    );

    // A dangling link inside: reads say not found, writes refuse to guess.
    f.link("missing.txt", "dangling");
    assert_eq!(code(f.ws.read("dangling")), "not_found");
    assert_eq!(code(f.ws.stat("dangling")), "not_found");
    assert_eq!(code(f.ws.write("dangling", b"x")), "conflict");
    assert!(!f.host("missing.txt").exists());
    // A loop of links inside.
    f.link("loop2", "loop1");
    f.link("loop1", "loop2");
    assert_eq!(code(f.ws.read("loop1")), "conflict");
    assert_eq!(code(f.ws.write("loop1", b"x")), "conflict");
    assert_eq!(code(f.ws.mkdir("loop1/x")), "conflict");
    // A link to a directory is not a file.
    assert_eq!(code(f.ws.write("subdir", b"x")), "conflict");
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let f = Fixture::new();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        f.host("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    assert_eq!(code(f.ws.read("fifo")), "conflict");
    assert_eq!(code(f.ws.read_range("fifo", 0, 10)), "conflict");
    assert_eq!(code(f.ws.write("fifo", b"x")), "conflict");
    assert_eq!(code(f.ws.edit("fifo", &edit("a", "b"))), "conflict");
    assert_eq!(f.ws.stat("fifo").unwrap().kind, FileKind::Other);
    let mut g = GrepRequest::new("x");
    assert!(f.ws.grep(&g).unwrap().is_empty());
    g.path = Some("fifo".into());
    assert_eq!(code(f.ws.grep(&g)), "conflict");
}

#[test]
fn the_root_is_never_removed_or_replaced() {
    let f = Fixture::new();
    f.put("a.txt", b"A");
    for p in [".", "/workspace", "/workspace/", "a/..", ""] {
        let want = if p.is_empty() {
            "invalid_path"
        } else {
            "conflict"
        };
        assert_eq!(code(f.ws.remove(p, true)), want, "{p:?}");
        assert_eq!(code(f.ws.write(p, b"x")), want, "{p:?}");
        assert_eq!(code(f.ws.rename(p, "x")), want, "{p:?}");
    }
    assert_eq!(code(f.ws.rename("a.txt", ".")), "conflict");
    assert_eq!(std::fs::read(f.host("a.txt")).unwrap(), b"A");
}

#[test]
fn a_recursive_remove_never_follows_links_out() {
    let f = Fixture::new();
    f.put("tree/a/b/c.txt", b"c");
    f.link(f.outside(""), "tree/out");
    f.link("../../outside", "tree/a/rel-out");
    std::fs::hard_link(f.outside("victim.txt"), f.host("tree/a/hl")).unwrap();
    let before = f.outside_snapshot();
    f.ws.remove("tree", true).unwrap();
    assert!(!f.host("tree").exists());
    assert_eq!(f.outside_snapshot(), before);
}

#[test]
fn errors_never_name_the_host_directory() {
    let f = Fixture::new();
    f.link("/etc/passwd", "leak");
    f.link(f.outside(""), "o");
    f.put("a.txt", b"aaa");
    f.put("d/x", b"x");
    let host = f.base.path().to_str().unwrap().to_owned();
    let errors = [
        f.ws.read("leak").unwrap_err(),
        f.ws.read("missing/file").unwrap_err(),
        f.ws.read("d").unwrap_err(),
        f.ws.write("o/x", b"").unwrap_err(),
        f.ws.write("a.txt/x", b"").unwrap_err(),
        f.ws.write("d", b"").unwrap_err(),
        f.ws.edit("a.txt", &edit("a", "b")).unwrap_err(),
        f.ws.list("a.txt").unwrap_err(),
        f.ws.list("o").unwrap_err(),
        f.ws.stat("nope").unwrap_err(),
        f.ws.remove("d", false).unwrap_err(),
        f.ws.mkdir("a.txt/sub").unwrap_err(),
        f.ws.rename("nope", "x").unwrap_err(),
        f.ws.rename("d", "d/inner").unwrap_err(),
        f.ws.open_dir("a.txt").unwrap_err(),
    ];
    for e in errors {
        let s = e.to_string();
        assert!(!s.contains(&host), "{s}");
        assert!(!s.contains("/tmp"), "{s}");
    }
}

/// A second thread keeps swapping a directory (and a file) for a link out while the workspace
/// reads and writes through it: every operation either works inside or fails; nothing outside
/// is ever read, written or created.
#[test]
fn swapping_components_for_links_mid_operation_never_escapes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let f = Fixture::new();
    f.put("d/victim.txt", b"INSIDE");
    f.put("f.txt", b"INSIDE");
    let before = f.outside_snapshot();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let (d, spare, ff, fspare) = (
                f.host("d"),
                f.host("d-real"),
                f.host("f.txt"),
                f.host("f-real"),
            );
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::rename(&d, &spare);
                let _ = std::os::unix::fs::symlink(f.outside(""), &d);
                let _ = std::fs::rename(&ff, &fspare);
                let _ = std::os::unix::fs::symlink(f.outside("victim.txt"), &ff);
                std::thread::yield_now();
                let _ = std::fs::remove_file(&d);
                let _ = std::fs::rename(&spare, &d);
                let _ = std::fs::remove_file(&ff);
                let _ = std::fs::rename(&fspare, &ff);
            }
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
        while std::time::Instant::now() < deadline {
            if let Ok(data) = f.ws.read("d/victim.txt") {
                assert_eq!(data, b"INSIDE");
            }
            if let Ok(data) = f.ws.read("f.txt") {
                assert_ne!(data, b"VICTIM");
            }
            let _ = f.ws.write("d/new.txt", b"PLANTED");
            let _ = f.ws.write("d/victim.txt", b"INSIDE");
            let _ = f.ws.write("f.txt", b"PLANTED");
            let _ = f.ws.edit("d/victim.txt", &edit("INSIDE", "INSIDE"));
            let _ = f.ws.mkdir("d/sub");
            let _ = f.ws.remove("d/sub", true);
            for p in f.ws.glob("d/*").unwrap_or_default() {
                assert!(p.starts_with("d/"), "{p}");
            }
            let _ = f.ws.list("d");
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(f.outside_snapshot(), before);
}
