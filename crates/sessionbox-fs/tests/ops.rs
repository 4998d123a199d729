//! The operations themselves: results, atomicity, modes, limits.

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::{Fixture, code};
use sessionbox_core::{EditRequest, FileKind, GrepRequest, Limits};
use sessionbox_fs::Workspace;

fn mode(p: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn edit(old: &str, new: &str, replace_all: bool) -> EditRequest {
    EditRequest {
        old: old.into(),
        new: new.into(),
        replace_all,
    }
}

#[test]
fn open_checks_its_arguments() {
    let tmp = tempfile::tempdir().unwrap();
    let l = Limits::default();
    assert_eq!(
        code(Workspace::open(tmp.path(), "workspace", l)),
        "invalid_request"
    );
    assert_eq!(
        code(Workspace::open(&tmp.path().join("nope"), "/w", l)),
        "not_found"
    );
    std::fs::write(tmp.path().join("f"), b"").unwrap();
    assert_eq!(
        code(Workspace::open(&tmp.path().join("f"), "/w", l)),
        "conflict"
    );
    let ws = Workspace::open(tmp.path(), "/w/", l).unwrap();
    assert_eq!(ws.presented_root(), "/w");
    assert_eq!(ws.limits(), &l);
    assert_eq!(ws.resolve("/w/a/../b").unwrap().as_str(), "b");
}

#[test]
fn write_creates_parents_and_replaces_content_entirely() {
    let f = Fixture::new();
    f.ws.write("a/b/c.txt", b"a long first version of the file")
        .unwrap();
    assert_eq!(
        f.ws.read("a/b/c.txt").unwrap(),
        b"a long first version of the file"
    );
    f.ws.write("/workspace/a/b/c.txt", b"short").unwrap();
    assert_eq!(std::fs::read(f.host("a/b/c.txt")).unwrap(), b"short");
    f.ws.write("a/b/c.txt", b"").unwrap();
    assert_eq!(f.ws.read("a/b/c.txt").unwrap(), b"");
    assert_eq!(
        names(&f.host("a/b")),
        ["c.txt"],
        "no temporary file is left"
    );
    assert_eq!(names(&f.host("")), ["a"]);
    assert!(f.host("a/b").is_dir());
}

#[test]
fn write_keeps_permission_bits_and_gives_new_files_0644() {
    let f = Fixture::new();
    f.ws.write("new.txt", b"x").unwrap();
    assert_eq!(mode(&f.host("new.txt")), 0o644);
    f.put("script.sh", b"#!/bin/sh\n");
    std::fs::set_permissions(f.host("script.sh"), std::fs::Permissions::from_mode(0o751)).unwrap();
    f.ws.write("script.sh", b"#!/bin/sh\necho hi\n").unwrap();
    assert_eq!(mode(&f.host("script.sh")), 0o751);
    f.ws.edit("script.sh", &edit("hi", "ho", false)).unwrap();
    assert_eq!(mode(&f.host("script.sh")), 0o751);
    assert_eq!(
        std::fs::read(f.host("script.sh")).unwrap(),
        b"#!/bin/sh\necho ho\n"
    );
}

#[test]
fn write_refuses_directories_and_non_directory_parents() {
    let f = Fixture::new();
    f.put("d/x", b"x");
    f.put("file", b"F");
    assert_eq!(code(f.ws.write("d", b"x")), "conflict");
    assert_eq!(code(f.ws.write("file/x", b"x")), "conflict");
    assert_eq!(code(f.ws.write("file/a/b", b"x")), "conflict");
    assert_eq!(std::fs::read(f.host("file")).unwrap(), b"F");
    assert_eq!(names(&f.host("")), ["d", "file"]);
}

#[test]
fn sizes_above_the_limits_are_too_large() {
    let limits = Limits {
        max_file_bytes: 10,
        max_entries: 3,
        max_matches: 2,
        max_grep_file_bytes: 20,
    };
    let f = Fixture::with_limits(limits);
    f.put("big.txt", b"0123456789X");
    f.put("ok.txt", b"0123456789");
    assert_eq!(code(f.ws.read("big.txt")), "too_large");
    assert_eq!(f.ws.read("ok.txt").unwrap(), b"0123456789");
    assert_eq!(code(f.ws.write("w.txt", b"0123456789X")), "too_large");
    assert!(!f.host("w.txt").exists());
    assert_eq!(
        code(f.ws.edit("ok.txt", &edit("9", "99", false))),
        "too_large"
    );
    assert_eq!(
        code(f.ws.edit("big.txt", &edit("9", "", false))),
        "too_large"
    );
    assert_eq!(std::fs::read(f.host("ok.txt")).unwrap(), b"0123456789");
    // A range read may come from a file above the limit, but returns at most the limit.
    assert_eq!(f.ws.read_range("big.txt", 5, 100).unwrap(), b"56789X");
    f.put("huge.txt", &[b'a'; 50]);
    assert_eq!(f.ws.read_range("huge.txt", 0, 100).unwrap().len(), 10);
    // Entries: 3 allowed.
    f.put("d/a", b"");
    f.put("d/b", b"");
    f.put("d/c", b"");
    assert_eq!(f.ws.list("d").unwrap().len(), 3);
    f.put("d/e", b"");
    let e = f.ws.list("d").unwrap_err();
    assert_eq!(e.code(), "too_large", "{e}");
    assert_eq!(f.ws.glob("d/[abc]").unwrap(), ["d/a", "d/b", "d/c"]);
    assert_eq!(code(f.ws.glob("d/*")), "too_large");
    // Grep: files above 20 bytes are skipped in a walk, refused when named.
    f.put("g/small.txt", b"needle\n");
    f.put("g/large.txt", b"needle\npadding padding padding\n");
    let mut g = GrepRequest::new("needle");
    g.path = Some("g".into());
    let m = f.ws.grep(&g).unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].path, "g/small.txt");
    g.path = Some("g/large.txt".into());
    assert_eq!(code(f.ws.grep(&g)), "too_large");
    // Matches stop at the limit, even when more are asked for.
    f.put("m/x.txt", b"n1\nn2\nn3\nn4\n");
    let mut g = GrepRequest::new("n");
    g.path = Some("m".into());
    g.max_matches = Some(100);
    assert_eq!(f.ws.grep(&g).unwrap().len(), 2);
    g.max_matches = Some(1);
    assert_eq!(f.ws.grep(&g).unwrap().len(), 1);
}

#[test]
fn read_range_reads_the_requested_bytes() {
    let f = Fixture::new();
    f.put("r.bin", b"0123456789");
    assert_eq!(f.ws.read_range("r.bin", 0, 3).unwrap(), b"012");
    assert_eq!(f.ws.read_range("r.bin", 7, 10).unwrap(), b"789");
    assert_eq!(f.ws.read_range("r.bin", 10, 10).unwrap(), b"");
    assert_eq!(f.ws.read_range("r.bin", 1000, 10).unwrap(), b"");
    assert_eq!(f.ws.read_range("r.bin", 3, 0).unwrap(), b"");
    assert_eq!(code(f.ws.read_range("nope", 0, 1)), "not_found");
    f.put("d/x", b"");
    assert_eq!(code(f.ws.read_range("d", 0, 1)), "conflict");
}

#[test]
fn edit_replaces_exactly_once_or_says_how_often_old_occurs() {
    let f = Fixture::new();
    f.put("a.txt", b"one two two three three three\n");
    let r = f.ws.edit("a.txt", &edit("one", "ONE", false)).unwrap();
    assert_eq!(r.replacements, 1);
    assert_eq!(
        f.ws.read("a.txt").unwrap(),
        b"ONE two two three three three\n"
    );

    let e = f.ws.edit("a.txt", &edit("three", "3", false)).unwrap_err();
    assert_eq!(e.code(), "conflict");
    let msg = e.to_string();
    assert!(msg.contains("occurs 3 times in a.txt"), "{msg}");
    // Neutral words: each front end adds its own advice (a flag, a field).
    assert!(
        !msg.contains("replace_all") && !msg.contains("`old`"),
        "{msg}"
    );

    let e = f.ws.edit("a.txt", &edit("four", "4", true)).unwrap_err();
    assert_eq!(e.code(), "conflict");
    assert!(e.to_string().contains("does not occur in a.txt"), "{e}");
    assert_eq!(
        code(f.ws.edit("a.txt", &edit("four", "4", false))),
        "conflict"
    );
    assert_eq!(
        f.ws.read("a.txt").unwrap(),
        b"ONE two two three three three\n"
    );

    let r = f.ws.edit("a.txt", &edit("three", "3", true)).unwrap();
    assert_eq!(r.replacements, 3);
    let r = f.ws.edit("a.txt", &edit("two", "", true)).unwrap();
    assert_eq!(r.replacements, 2);
    assert_eq!(f.ws.read("a.txt").unwrap(), b"ONE   3 3 3\n");
    // Non-overlapping: "aa" occurs twice in "aaaa".
    f.put("aa.txt", b"aaaa");
    assert!(
        f.ws.edit("aa.txt", &edit("aa", "b", false))
            .unwrap_err()
            .to_string()
            .contains("occurs 2 times")
    );
    assert_eq!(
        f.ws.edit("aa.txt", &edit("aa", "b", true))
            .unwrap()
            .replacements,
        2
    );
    assert_eq!(f.ws.read("aa.txt").unwrap(), b"bb");

    assert_eq!(
        code(f.ws.edit("a.txt", &edit("", "x", true))),
        "invalid_request"
    );
    assert_eq!(
        code(f.ws.edit("missing.txt", &edit("a", "b", false))),
        "not_found"
    );
    assert_eq!(
        code(f.ws.edit("nodir/missing.txt", &edit("a", "b", false))),
        "not_found"
    );
    assert!(!f.host("nodir").exists(), "edit creates no directories");
    assert_eq!(names(&f.host("")), ["a.txt", "aa.txt"]);
}

#[test]
fn edit_works_on_non_utf8_files() {
    let f = Fixture::new();
    f.put("bin", b"\xff\xfeabc\xff");
    assert_eq!(
        f.ws.edit("bin", &edit("abc", "XY", false))
            .unwrap()
            .replacements,
        1
    );
    assert_eq!(f.ws.read("bin").unwrap(), b"\xff\xfeXY\xff");
}

#[test]
fn list_is_sorted_and_does_not_follow_links() {
    let f = Fixture::new();
    f.put("d/b.txt", b"bb");
    f.put("d/a.txt", b"a");
    f.put("d/sub/x", b"");
    f.link("../../outside", "d/zlink");
    let entries = f.ws.list("d").unwrap();
    let got: Vec<(&str, FileKind)> = entries.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    assert_eq!(
        got,
        [
            ("a.txt", FileKind::File),
            ("b.txt", FileKind::File),
            ("sub", FileKind::Directory),
            ("zlink", FileKind::Symlink),
        ]
    );
    assert_eq!(entries[1].size, 2);
    assert_eq!(entries[3].size, "../../outside".len() as u64);
    assert!(entries[0].modified_unix > 0);
    assert_eq!(f.ws.list(".").unwrap().len(), 1);
    assert_eq!(f.ws.list("/workspace").unwrap()[0].name, "d");
    assert_eq!(code(f.ws.list("d/a.txt")), "conflict");
    assert_eq!(code(f.ws.list("nope")), "not_found");
    assert!(f.ws.list("d/sub").unwrap().iter().all(|e| e.name == "x"));
}

#[test]
fn glob_matches_workspace_relative_paths_without_entering_links() {
    let f = Fixture::new();
    f.put("src/main.rs", b"");
    f.put("src/lib/mod.rs", b"");
    f.put("src/lib/notes.txt", b"");
    f.put("top.rs", b"");
    f.put(".hidden.rs", b"");
    f.link("src", "srclink");
    assert_eq!(
        f.ws.glob("**/*.rs").unwrap(),
        [".hidden.rs", "src/lib/mod.rs", "src/main.rs", "top.rs"]
    );
    assert_eq!(f.ws.glob("*.rs").unwrap(), [".hidden.rs", "top.rs"]);
    assert_eq!(f.ws.glob("src/*.rs").unwrap(), ["src/main.rs"]);
    assert_eq!(
        f.ws.glob("./src/**/*.rs").unwrap(),
        ["src/lib/mod.rs", "src/main.rs"]
    );
    assert_eq!(f.ws.glob("/workspace/src/*.rs").unwrap(), ["src/main.rs"]);
    assert_eq!(
        f.ws.glob("src/lib/notes.txt").unwrap(),
        ["src/lib/notes.txt"]
    );
    assert_eq!(f.ws.glob("src/{main,nope}.rs").unwrap(), ["src/main.rs"]);
    assert!(f.ws.glob("srclink/*.rs").unwrap().is_empty());
    assert!(f.ws.glob("nope/**").unwrap().is_empty());
    assert_eq!(f.ws.glob("srclink").unwrap(), ["srclink"]);
    assert_eq!(code(f.ws.glob("../*")), "outside_workspace");
    assert_eq!(code(f.ws.glob("src/../../*")), "outside_workspace");
    assert_eq!(code(f.ws.glob("src/../*")), "outside_workspace");
    assert_eq!(code(f.ws.glob("/etc/*")), "outside_workspace");
    assert_eq!(code(f.ws.glob("/workspace-evil/*")), "outside_workspace");
    assert_eq!(code(f.ws.glob("")), "invalid_request");
    assert_eq!(code(f.ws.glob("/workspace")), "invalid_request");
    assert_eq!(code(f.ws.glob("src/[")), "invalid_request");
}

#[test]
fn grep_finds_lines_and_skips_binary_files() {
    let f = Fixture::new();
    f.put("a.txt", b"alpha\nBeta\nbeta gamma\r\nlast");
    f.put("sub/b.rs", b"fn beta() {}\n");
    f.put("bin.dat", b"beta\0beta\n");
    let mut late_nul = b"beta\n".to_vec();
    late_nul.extend(std::iter::repeat_n(b'x', 9000));
    late_nul.push(0);
    f.put("late-nul.txt", &late_nul);
    f.link("a.txt", "alink");
    let m = f.ws.grep(&GrepRequest::new("beta")).unwrap();
    let got: Vec<(&str, u64, &str)> = m
        .iter()
        .map(|m| (m.path.as_str(), m.line_number, m.line.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("a.txt", 3, "beta gamma"),
            ("late-nul.txt", 1, "beta"),
            ("sub/b.rs", 1, "fn beta() {}"),
        ]
    );
    let mut g = GrepRequest::new("^BETA");
    g.case_insensitive = true;
    let m = f.ws.grep(&g).unwrap();
    let got: Vec<(&str, u64)> = m.iter().map(|m| (m.path.as_str(), m.line_number)).collect();
    assert_eq!(got, [("a.txt", 2), ("a.txt", 3), ("late-nul.txt", 1)]);
    let mut g = GrepRequest::new("beta");
    g.glob = Some("**/*.rs".into());
    let m = f.ws.grep(&g).unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].path, "sub/b.rs");
    let mut g = GrepRequest::new("last$");
    g.path = Some("/workspace/alink".into());
    let m = f.ws.grep(&g).unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].path.as_str(), m[0].line_number), ("alink", 4));
    let mut g = GrepRequest::new("beta");
    g.path = Some("sub".into());
    assert_eq!(f.ws.grep(&g).unwrap()[0].path, "sub/b.rs");
    g.path = Some("nope".into());
    assert_eq!(code(f.ws.grep(&g)), "not_found");
    assert_eq!(
        code(f.ws.grep(&GrepRequest::new("(unclosed"))),
        "invalid_request"
    );
    let mut g = GrepRequest::new("x");
    g.glob = Some("../**".into());
    assert_eq!(code(f.ws.grep(&g)), "outside_workspace");
}

#[test]
fn grep_cuts_long_lines_to_4_kib() {
    let f = Fixture::new();
    let mut line = "é".repeat(3000).into_bytes();
    line.extend_from_slice(b"needle\n");
    f.put("long.txt", &line);
    let m = f.ws.grep(&GrepRequest::new("needle")).unwrap();
    assert_eq!(m.len(), 1);
    assert!(
        m[0].line.len() <= 4096 && m[0].line.len() > 4000,
        "{}",
        m[0].line.len()
    );
    assert!(m[0].line.starts_with('é'));
}

#[test]
fn stat_reports_presented_path_kind_size_and_mode() {
    let f = Fixture::new();
    f.put("d/a.txt", b"12345");
    std::fs::set_permissions(f.host("d/a.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let st = f.ws.stat("d/./a.txt").unwrap();
    assert_eq!(st.path, "/workspace/d/a.txt");
    assert_eq!((st.kind, st.size, st.mode), (FileKind::File, 5, 0o600));
    assert!(st.modified_unix > 0);
    let st = f.ws.stat(".").unwrap();
    assert_eq!(
        (st.path.as_str(), st.kind),
        ("/workspace", FileKind::Directory)
    );
    assert_eq!(code(f.ws.stat("d/nope")), "not_found");
    assert_eq!(code(f.ws.stat("d/a.txt/x")), "conflict");
}

#[test]
fn remove_files_links_and_directories() {
    let f = Fixture::new();
    f.put("a.txt", b"");
    f.put("d/e/f.txt", b"");
    std::fs::create_dir(f.host("empty")).unwrap();
    f.put("target.txt", b"T");
    f.link("target.txt", "link");
    f.ws.remove("a.txt", false).unwrap();
    f.ws.remove("empty", false).unwrap();
    f.ws.remove("link", false).unwrap();
    assert_eq!(std::fs::read(f.host("target.txt")).unwrap(), b"T");
    let e = f.ws.remove("d", false).unwrap_err();
    assert_eq!(e.code(), "conflict");
    // Neutral words: each front end says how to ask for a recursive remove.
    assert_eq!(
        e.to_string(),
        "conflict: d is a directory that is not empty"
    );
    assert_eq!(
        e.refusal(),
        Some(sessionbox_core::Refusal::DirectoryNotEmpty)
    );
    f.ws.remove("d", true).unwrap();
    assert_eq!(code(f.ws.remove("a.txt", false)), "not_found");
    assert_eq!(code(f.ws.remove("x/y", false)), "not_found");
    assert_eq!(names(&f.host("")), ["target.txt"]);
    // A deep tree.
    let deep = "x/".repeat(100) + "leaf.txt";
    f.put(&deep, b"leaf");
    f.ws.remove("x", true).unwrap();
    assert!(!f.host("x").exists());
}

#[test]
fn mkdir_creates_parents_and_accepts_existing_directories() {
    let f = Fixture::new();
    f.ws.mkdir("a/b/c").unwrap();
    assert!(f.host("a/b/c").is_dir());
    f.ws.mkdir("a/b/c").unwrap();
    f.ws.mkdir("/workspace/a").unwrap();
    f.ws.mkdir(".").unwrap();
    f.put("file", b"F");
    assert_eq!(code(f.ws.mkdir("file")), "conflict");
    assert_eq!(code(f.ws.mkdir("file/sub")), "conflict");
    assert_eq!(code(f.ws.mkdir("../x")), "outside_workspace");
    assert_eq!(std::fs::read(f.host("file")).unwrap(), b"F");
}

#[test]
fn rename_moves_inside_and_creates_parents() {
    let f = Fixture::new();
    f.put("a.txt", b"A");
    f.put("d/x.txt", b"X");
    f.ws.rename("a.txt", "new/dir/b.txt").unwrap();
    assert_eq!(std::fs::read(f.host("new/dir/b.txt")).unwrap(), b"A");
    assert!(!f.host("a.txt").exists());
    f.ws.rename("/workspace/d", "e").unwrap();
    assert_eq!(std::fs::read(f.host("e/x.txt")).unwrap(), b"X");
    assert_eq!(code(f.ws.rename("nope", "z/y")), "not_found");
    assert!(!f.host("z").exists(), "a failed rename creates no parents");
    assert_eq!(code(f.ws.rename("e", "e/inner")), "conflict");
    f.put("f/g.txt", b"");
    assert_eq!(code(f.ws.rename("e", "f")), "conflict");
    assert_eq!(code(f.ws.rename("e", "../elsewhere")), "outside_workspace");
    // A link is moved as a link.
    f.link("e/x.txt", "l");
    f.ws.rename("l", "l2").unwrap();
    assert_eq!(
        std::fs::read_link(f.host("l2")).unwrap(),
        std::path::Path::new("e/x.txt")
    );
}

#[test]
fn open_dir_opens_directories_only() {
    let f = Fixture::new();
    f.put("d/sub/x.txt", b"");
    let fd = f.ws.open_dir("d/sub").unwrap();
    let st = rustix::fs::fstat(&fd).unwrap();
    assert_eq!(
        rustix::fs::FileType::from_raw_mode(st.st_mode),
        rustix::fs::FileType::Directory
    );
    let meta = std::fs::metadata(f.host("d/sub")).unwrap();
    assert_eq!(st.st_ino, std::os::unix::fs::MetadataExt::ino(&meta));
    f.ws.open_dir(".").unwrap();
    assert_eq!(code(f.ws.open_dir("d/sub/x.txt")), "conflict");
    assert_eq!(code(f.ws.open_dir("d/nope")), "not_found");
    assert_eq!(code(f.ws.open_dir("/tmp")), "outside_workspace");
}

#[test]
fn concurrent_writers_never_leave_a_mix_or_temporary_files() {
    let f = Fixture::new();
    let a = vec![b'a'; 100_000];
    let b = vec![b'b'; 50_000];
    std::thread::scope(|s| {
        for i in 0..4 {
            let (ws, a, b) = (&f.ws, &a, &b);
            s.spawn(move || {
                for _ in 0..20 {
                    ws.write("shared.txt", if i % 2 == 0 { a } else { b })
                        .unwrap();
                    let got = ws.read("shared.txt").unwrap();
                    assert!(got == *a || got == *b, "a mix of two writes");
                }
            });
        }
    });
    assert_eq!(names(&f.host("")), ["shared.txt"]);
}
