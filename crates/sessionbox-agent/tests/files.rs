//! Every file and directory endpoint through the real client, and confinement: `..`, absolute
//! paths outside, and links out are refused with nothing created or read outside.

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;

use common::{TestAgent, request};
use sessionbox_execd::{
    FileType, Permission, RenameFileItem, ReplaceFileContentItem, RunCommandRequest, UploadFile,
};

fn mode_of(p: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn replace(path: &str, old: &str, new: &str) -> BTreeMap<String, ReplaceFileContentItem> {
    BTreeMap::from([(
        path.to_owned(),
        ReplaceFileContentItem {
            old: old.into(),
            new: new.into(),
        },
    )])
}

#[tokio::test(flavor = "multi_thread")]
async fn every_file_endpoint() {
    let a = TestAgent::start().await;
    let c = &a.client;
    c.ping().await.unwrap();

    // upload (several files, parents created), download, info
    c.upload(&[
        UploadFile::new(a.path("d/one.txt"), &b"line1\nline2\nline3\n"[..]),
        UploadFile::new("d/e/two.bin", vec![0u8, 1, 2, 255]),
    ])
    .await
    .unwrap();
    assert_eq!(
        &c.download(&a.path("d/one.txt")).await.unwrap()[..],
        b"line1\nline2\nline3\n"
    );
    assert_eq!(
        &c.download("d/e/two.bin").await.unwrap()[..],
        &[0u8, 1, 2, 255]
    );
    assert_eq!(
        std::fs::read(a.root.join("d/one.txt")).unwrap(),
        b"line1\nline2\nline3\n"
    );
    let info = c
        .files_info([a.path("d/one.txt"), a.path("d")])
        .await
        .unwrap();
    let f = &info[&a.path("d/one.txt")];
    assert_eq!(f.path, a.path("d/one.txt"));
    assert_eq!(f.kind, Some(FileType::File));
    assert_eq!(f.size, 18);
    assert_eq!(
        f.mode, 755,
        "the client sends the SDK's default mode, 755, which is applied"
    );
    assert!(!f.owner.is_empty() && !f.group.is_empty() && f.modified_at.ends_with('Z'));
    assert_eq!(info[&a.path("d")].kind, Some(FileType::Directory));
    let e = c.files_info([a.path("missing")]).await.unwrap_err();
    assert_eq!(e.status(), Some(404));

    // ranges and lines
    assert_eq!(
        &c.download_range("d/one.txt", 6, Some(10)).await.unwrap()[..],
        b"line2"
    );
    assert_eq!(
        &c.download_range("d/one.txt", 12, None).await.unwrap()[..],
        b"line3\n"
    );
    assert_eq!(
        c.download_lines("d/one.txt", 2, Some(1)).await.unwrap(),
        "line2"
    );
    assert_eq!(
        c.download_lines("d/one.txt", 2, None).await.unwrap(),
        "line2\nline3"
    );
    let r = a
        .raw(&request(
            "GET",
            "/files/download?path=d/one.txt",
            &["Range: bytes=-6"],
            b"",
        ))
        .await;
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 12-17/18"));
    assert_eq!(r.body, b"line3\n");
    for bad in ["bytes=18-", "bytes=100-200"] {
        let h = format!("Range: {bad}");
        let r = a
            .raw(&request(
                "GET",
                "/files/download?path=d/one.txt",
                &[&h],
                b"",
            ))
            .await;
        assert_eq!(r.status, 416, "{bad}");
        assert_eq!(r.header("content-range"), Some("bytes */18"));
    }
    let r = a
        .raw(&request(
            "GET",
            "/files/download?path=d/one.txt",
            &["Range: pages=1"],
            b"",
        ))
        .await;
    assert_eq!(r.status, 416);
    let r = a
        .raw(&request("GET", "/files/download?path=d/one.txt", &[], b""))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-disposition"),
        Some("attachment; filename=\"one.txt\"")
    );

    // search: base names at any depth, or a path pattern
    let found = c.search_files(&a.path("d"), Some("*.bin")).await.unwrap();
    assert_eq!(
        found.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
        [a.path("d/e/two.bin")]
    );
    let all = c.search_files("d", None).await.unwrap();
    assert_eq!(all.len(), 2);
    let top = c.search_files("d", Some("e/*")).await.unwrap();
    assert_eq!(top.len(), 1);
    assert_eq!(
        c.search_files("missing", None).await.unwrap_err().status(),
        Some(404)
    );

    // replace: verbose counts; a file without the text is untouched
    let counts = c
        .replace_content(&replace(&a.path("d/one.txt"), "line", "row"))
        .await
        .unwrap();
    assert_eq!(counts[&a.path("d/one.txt")].replaced_count, 3);
    assert_eq!(
        std::fs::read_to_string(a.root.join("d/one.txt")).unwrap(),
        "row1\nrow2\nrow3\n"
    );
    let counts = c
        .replace_content(&replace("d/one.txt", "absent", "x"))
        .await
        .unwrap();
    assert_eq!(counts["d/one.txt"].replaced_count, 0);
    let r = a
        .raw(&request(
            "POST",
            "/files/replace",
            &["Content-Type: application/json"],
            br#"{"d/one.txt":{"old":"row1","new":"first"}}"#,
        ))
        .await;
    assert_eq!(
        (r.status, r.body.len()),
        (200, 0),
        "not verbose: empty body"
    );
    assert!(
        std::fs::read_to_string(a.root.join("d/one.txt"))
            .unwrap()
            .starts_with("first\n")
    );
    let e = c
        .replace_content(&replace("d/missing.txt", "a", "b"))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(404));

    // move: parents created; an existing destination is refused
    c.move_files(&[RenameFileItem {
        src: "d/one.txt".into(),
        dest: a.path("m/n/one.txt"),
    }])
    .await
    .unwrap();
    assert!(a.root.join("m/n/one.txt").is_file() && !a.root.join("d/one.txt").exists());
    std::fs::write(a.root.join("taken"), "x").unwrap();
    let e = c
        .move_files(&[RenameFileItem {
            src: "m/n/one.txt".into(),
            dest: "taken".into(),
        }])
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409));
    assert_eq!(std::fs::read_to_string(a.root.join("taken")).unwrap(), "x");

    // directories: make, list with depth, remove
    let dirs = BTreeMap::from([
        (a.path("p/q/r"), Permission::mode(755)),
        ("p/s".to_owned(), Permission::default()),
    ]);
    c.make_dirs(&dirs).await.unwrap();
    c.make_dirs(&dirs).await.unwrap(); // mkdir -p: existing is fine
    std::fs::write(a.root.join("p/q/file"), "f").unwrap();
    symlink("q", a.root.join("p/link")).unwrap();
    let one = c.list_directory("p", None).await.unwrap();
    let names: Vec<_> = one.iter().map(|f| f.path.clone()).collect();
    assert_eq!(names, [a.path("p/link"), a.path("p/q"), a.path("p/s")]);
    assert_eq!(one[0].kind, Some(FileType::Symlink));
    let two = c.list_directory(&a.path("p"), Some(2)).await.unwrap();
    let names: Vec<_> = two.iter().map(|f| f.path.clone()).collect();
    assert_eq!(
        names,
        [
            a.path("p/link"),
            a.path("p/q"),
            a.path("p/q/file"),
            a.path("p/q/r"),
            a.path("p/s")
        ],
        "descendants follow their parent; the link is not entered"
    );
    assert!(c.list_directory("p", Some(0)).await.unwrap().is_empty());
    assert_eq!(
        c.list_directory("p/link", None).await.unwrap_err().status(),
        Some(400)
    );
    assert_eq!(
        c.list_directory("taken", None).await.unwrap_err().status(),
        Some(400)
    );
    c.remove_dirs(["p", "never-existed"]).await.unwrap();
    assert!(!a.root.join("p").exists());

    // delete files: links and files; missing is fine; directories are refused
    c.remove_files(["taken", "also-missing"]).await.unwrap();
    assert!(!a.root.join("taken").exists());
    assert_eq!(c.remove_files(["m"]).await.unwrap_err().status(), Some(409));
    assert!(a.root.join("m/n/one.txt").exists());
    // The root itself cannot be removed.
    assert!(c.remove_dirs([a.root.display().to_string()]).await.is_err());
    assert!(a.root.is_dir());

    // permissions: chmod through the workspace
    c.chmod_files(&BTreeMap::from([("m".to_owned(), Permission::mode(700))]))
        .await
        .unwrap();
    assert_eq!(mode_of(&a.root.join("m")), 0o700);

    // metrics
    let m = c.metrics().await.unwrap();
    assert!(m.cpu_count >= 1.0 && m.mem_total_mib > 0.0 && m.timestamp > 0);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dollar_names_are_literal() {
    let a = TestAgent::start().await;
    let c = &a.client;
    c.upload(&[UploadFile::new(a.path("$HOME/x$1.txt"), &b"dollar"[..])])
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(a.root.join("$HOME/x$1.txt")).unwrap(),
        b"dollar"
    );
    assert_eq!(&c.download("$HOME/x$1.txt").await.unwrap()[..], b"dollar");
    let info = c.files_info(["$HOME/x$1.txt"]).await.unwrap();
    assert_eq!(info["$HOME/x$1.txt"].path, a.path("$HOME/x$1.txt"));
    let o = c
        .run_command(&RunCommandRequest::shell("cat 'x$1.txt'").cwd("$HOME"))
        .await
        .unwrap();
    assert_eq!(o.stdout_text(), "dollar");
    c.move_files(&[RenameFileItem {
        src: "$HOME/x$1.txt".into(),
        dest: "${PATH}".into(),
    }])
    .await
    .unwrap();
    assert!(a.root.join("${PATH}").is_file());
    c.remove_files(["${PATH}"]).await.unwrap();
    c.remove_dirs(["$HOME"]).await.unwrap();
    assert_eq!(std::fs::read_dir(&a.root).unwrap().count(), 0);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn escapes_are_refused_and_nothing_outside_is_touched() {
    let a = TestAgent::start().await;
    let c = &a.client;
    let secret = a.outside.join("secret.txt");
    std::fs::write(&secret, "TOP-SECRET-CONTENT").unwrap();
    symlink(&a.outside, a.root.join("out")).unwrap(); // absolute link out
    symlink("../outside/secret.txt", a.root.join("sneaky")).unwrap(); // relative link out
    let outside_abs = a.outside.display().to_string();

    let bad_paths = [
        "../outside/new.txt".to_owned(),
        "a/../../outside/new.txt".to_owned(),
        format!("{outside_abs}/new.txt"),
        "/etc/passwd".to_owned(),
        "out/new.txt".to_owned(),
        "out/secret.txt".to_owned(),
        "sneaky".to_owned(),
    ];
    for p in &bad_paths {
        let e = c
            .upload(&[UploadFile::new(p.clone(), &b"pwned"[..])])
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(400), "upload {p}: {e}");
        let e = c.download(p).await.unwrap_err();
        assert!(matches!(e.status(), Some(400 | 404)), "download {p}: {e}");
        assert!(!e.to_string().contains("TOP-SECRET"), "{e}");
        let e = c.download_range(p, 0, Some(5)).await.unwrap_err();
        assert!(!e.to_string().contains("TOP-SECRET"), "{e}");
        let e = c
            .replace_content(&replace(p, "TOP", "MINE"))
            .await
            .unwrap_err();
        assert!(matches!(e.status(), Some(400 | 404)), "replace {p}: {e}");
        let dirs = BTreeMap::from([(format!("{p}/d"), Permission::default())]);
        assert!(c.make_dirs(&dirs).await.is_err(), "mkdir {p}");
        assert!(
            c.move_files(&[RenameFileItem {
                src: "victim".into(),
                dest: p.clone()
            }])
            .await
            .is_err(),
            "move to {p}"
        );
        assert!(
            c.run_command(&RunCommandRequest::shell("touch made-here").cwd(p.clone()))
                .await
                .is_err(),
            "cwd {p}"
        );
    }
    // `..` in a search or a listing is refused, and a listing never enters the link.
    assert!(c.search_files("..", None).await.is_err());
    assert!(c.list_directory("../outside", None).await.is_err());
    assert_eq!(
        c.list_directory("out", None).await.unwrap_err().status(),
        Some(400)
    );
    let found = c.search_files(".", Some("*")).await.unwrap();
    assert!(
        found.iter().all(|f| !f.path.contains("secret")),
        "{found:?}"
    );
    // Info of a link reports the link itself.
    let info = c.files_info(["out"]).await.unwrap();
    assert_eq!(info["out"].kind, Some(FileType::Symlink));
    // Removing the links removes them, never their targets.
    c.remove_files(["sneaky"]).await.unwrap();
    c.remove_dirs(["out"]).await.unwrap();

    // The host is unchanged: only the secret is outside, with its content.
    let outside: Vec<_> = std::fs::read_dir(&a.outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(outside, ["secret.txt"]);
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "TOP-SECRET-CONTENT"
    );
    assert!(!a.dir.path().join("new.txt").exists());
    assert!(!a.root.join("made-here").exists());
    a.stop().await;
}

/// The expectations of upstream's own e2e tests and execd's behaviour for line reads, modes,
/// ownership and `~`, through the real client and raw HTTP.
#[tokio::test(flavor = "multi_thread")]
async fn upstream_lines_modes_and_home() {
    let a = TestAgent::start().await;
    let c = &a.client;

    // Line reads: 1-based, no trailing newline, text/plain; 400 with Range or a bad number.
    c.upload(&[UploadFile::new(
        a.path("lines.txt"),
        &b"line1\nline2\nline3\nline4\nline5"[..],
    )])
    .await
    .unwrap();
    assert_eq!(
        c.download_lines("lines.txt", 2, Some(2)).await.unwrap(),
        "line2\nline3"
    );
    assert_eq!(
        c.download_lines("lines.txt", 4, None).await.unwrap(),
        "line4\nline5"
    );
    assert_eq!(
        c.download_lines("lines.txt", 1, Some(2)).await.unwrap(),
        "line1\nline2"
    );
    assert_eq!(c.download_lines("lines.txt", 9, None).await.unwrap(), "");
    std::fs::write(a.root.join("crlf.txt"), "a\r\n\r\nb\r\n").unwrap();
    assert_eq!(
        c.download_lines("crlf.txt", 1, None).await.unwrap(),
        "a\n\nb"
    );
    let r = a
        .raw(&request(
            "GET",
            "/files/download?path=lines.txt&limit=2",
            &[],
            b"",
        ))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(r.body, b"line1\nline2");
    for q in ["offset=0", "limit=0", "offset=x", "limit=-1", "offset=1.5"] {
        let r = a
            .raw(&request(
                "GET",
                &format!("/files/download?path=lines.txt&{q}"),
                &[],
                b"",
            ))
            .await;
        assert_eq!(r.status, 400, "{q}");
    }
    let r = a
        .raw(&request(
            "GET",
            "/files/download?path=lines.txt&offset=2",
            &["Range: bytes=0-3"],
            b"",
        ))
        .await;
    assert_eq!(r.status, 400, "offset/limit with Range");
    // Range alone: the first range only, 206.
    let r = a
        .raw(&request(
            "GET",
            "/files/download?path=lines.txt",
            &["Range: bytes=0-4, 6-10"],
            b"",
        ))
        .await;
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 0-4/29"));
    assert_eq!(r.body, b"line1");

    // Upload modes (the Python SDK always sends one) round trip through /files/info.
    c.upload(&[
        UploadFile::new(a.path("m/f644"), &b"a"[..]).mode(644),
        UploadFile::new(a.path("m/f755"), &b"b"[..]).mode(755),
        UploadFile::new(a.path("m/f600"), &b"c"[..]).mode(600),
    ])
    .await
    .unwrap();
    let info = c
        .files_info([a.path("m/f644"), a.path("m/f755"), a.path("m/f600")])
        .await
        .unwrap();
    for (p, m, bits) in [
        ("m/f644", 644, 0o644),
        ("m/f755", 755, 0o755),
        ("m/f600", 600, 0o600),
    ] {
        assert_eq!(info[&a.path(p)].mode, m, "{p}");
        assert_eq!(mode_of(&a.root.join(p)), bits, "{p}");
    }
    // Search and list report the same int form.
    let found = c.search_files(&a.path("m"), Some("*")).await.unwrap();
    let mut modes: Vec<_> = found.iter().map(|f| f.mode).collect();
    modes.sort();
    assert_eq!(modes, [600, 644, 755]);
    let listed = c.list_directory(&a.path("m"), None).await.unwrap();
    assert!(listed.iter().any(|f| f.mode == 600));

    // POST /directories: the mode applies to a new leaf only.
    c.make_dirs(&BTreeMap::from([
        (a.path("d1"), Permission::mode(755)),
        (a.path("d2"), Permission::mode(644)),
        (a.path("p/leaf"), Permission::mode(700)),
    ]))
    .await
    .unwrap();
    let info = c
        .files_info([a.path("d1"), a.path("d2"), a.path("p/leaf"), a.path("p")])
        .await
        .unwrap();
    assert_eq!(info[&a.path("d1")].mode, 755);
    assert_eq!(info[&a.path("d2")].mode, 644);
    assert_eq!(info[&a.path("p/leaf")].mode, 700);
    assert_eq!(info[&a.path("p")].mode, 755, "a parent keeps the default");
    c.make_dirs(&BTreeMap::from([(a.path("p/leaf"), Permission::mode(777))]))
        .await
        .unwrap();
    assert_eq!(
        mode_of(&a.root.join("p/leaf")),
        0o700,
        "existing: untouched"
    );

    // POST /files/permissions, 0 = unchanged.
    c.chmod_files(&BTreeMap::from([
        (a.path("m/f644"), Permission::mode(755)),
        ("m/f755".to_owned(), Permission::mode(600)),
    ]))
    .await
    .unwrap();
    assert_eq!(mode_of(&a.root.join("m/f644")), 0o755);
    assert_eq!(mode_of(&a.root.join("m/f755")), 0o600);
    c.chmod_files(&BTreeMap::from([(
        "m/f755".to_owned(),
        Permission::mode(0),
    )]))
    .await
    .unwrap();
    assert_eq!(mode_of(&a.root.join("m/f755")), 0o600);

    // setuid, setgid, sticky, non-octal digits and a string mode: 400, nothing changed.
    for body in [
        r#"{"m/f600": {"mode": 4755}}"#,
        r#"{"m/f600": {"mode": 2755}}"#,
        r#"{"m/f600": {"mode": 1777}}"#,
        r#"{"m/f600": {"mode": 789}}"#,
        r#"{"m/f600": {"mode": "755"}}"#,
        r#"{"m/f600": {"mode": 755, "owner": "no-such-user-here"}}"#,
    ] {
        let r = a
            .raw(&request(
                "POST",
                "/files/permissions",
                &["Content-Type: application/json"],
                body.as_bytes(),
            ))
            .await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(mode_of(&a.root.join("m/f600")), 0o600, "{body}");
    }
    let r = a
        .raw(&request(
            "POST",
            "/files/permissions",
            &["Content-Type: application/json"],
            br#"{"m/f600": {"mode": 4755}}"#,
        ))
        .await;
    assert!(r.text().contains("setuid"), "{}", r.text());
    let e = c
        .upload(&[UploadFile::new(a.path("suid"), &b"x"[..]).mode(4755)])
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400));
    assert!(!a.root.join("suid").exists());
    let e = c
        .make_dirs(&BTreeMap::from([(
            a.path("sticky"),
            Permission::mode(1777),
        )]))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400));
    assert!(!a.root.join("sticky").exists());
    // Missing: 404.
    let e = c
        .chmod_files(&BTreeMap::from([(
            "nope".to_owned(),
            Permission::mode(644),
        )]))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(404));

    // Owner and group by name: our own user always works; `nobody`/`nogroup` as root (as in an
    // OpenSandbox container), a clear 400 otherwise.
    let me = rustix::process::geteuid().as_raw();
    let my_name = std::fs::read_to_string("/etc/passwd")
        .unwrap()
        .lines()
        .find_map(|l| {
            let f: Vec<_> = l.split(':').collect();
            (f.get(2) == Some(&me.to_string().as_str())).then(|| f[0].to_owned())
        });
    if let Some(name) = my_name {
        let mut p = Permission::mode(644);
        p.owner = Some(name.clone());
        c.chmod_files(&BTreeMap::from([("m/f600".to_owned(), p)]))
            .await
            .unwrap();
        assert_eq!(
            c.files_info([a.path("m/f600")]).await.unwrap()[&a.path("m/f600")].owner,
            name
        );
    }
    let has = |file: &str, name: &str| {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .any(|l| l.split(':').next() == Some(name))
    };
    if has("/etc/passwd", "nobody") && has("/etc/group", "nogroup") {
        let mut up = UploadFile::new(a.path("owned.txt"), &b"o"[..]).mode(755);
        up.metadata.owner = Some("nobody".into());
        up.metadata.group = Some("nogroup".into());
        let r = c.upload(&[up]).await;
        let mut p = Permission::mode(600);
        p.owner = Some("nobody".into());
        p.group = Some("nogroup".into());
        let r2 = c
            .chmod_files(&BTreeMap::from([(a.path("m/f644"), p)]))
            .await;
        if rustix::process::geteuid().is_root() {
            r.unwrap();
            r2.unwrap();
            let info = c
                .files_info([a.path("owned.txt"), a.path("m/f644")])
                .await
                .unwrap();
            for p in ["owned.txt", "m/f644"] {
                assert_eq!(info[&a.path(p)].owner, "nobody");
                assert_eq!(info[&a.path(p)].group, "nogroup");
            }
            assert_eq!(info[&a.path("owned.txt")].mode, 755);
            assert_eq!(info[&a.path("m/f644")].mode, 600);
        } else {
            assert_eq!(r.unwrap_err().status(), Some(400));
            let e = r2.unwrap_err();
            assert_eq!(e.status(), Some(400));
            assert!(e.to_string().contains("not permitted"), "{e}");
        }
    }

    // `~` is the root, for every path parameter and a command's cwd; it cannot escape.
    c.upload(&[UploadFile::new("~/home.txt", &b"h"[..])])
        .await
        .unwrap();
    assert_eq!(std::fs::read(a.root.join("home.txt")).unwrap(), b"h");
    assert_eq!(&c.download("~/home.txt").await.unwrap()[..], b"h");
    let info = c.files_info(["~/home.txt", "~"]).await.unwrap();
    assert_eq!(info["~/home.txt"].path, a.path("home.txt"));
    assert_eq!(info["~"].path, a.root.display().to_string());
    c.make_dirs(&BTreeMap::from([(
        "~/hd".to_owned(),
        Permission::mode(711),
    )]))
    .await
    .unwrap();
    assert_eq!(mode_of(&a.root.join("hd")), 0o711);
    c.move_files(&[RenameFileItem {
        src: "~/home.txt".into(),
        dest: "~/hd/moved.txt".into(),
    }])
    .await
    .unwrap();
    assert!(a.root.join("hd/moved.txt").exists());
    let o = c
        .run_command(&RunCommandRequest::shell("pwd > pwd.txt").cwd("~/hd"))
        .await
        .unwrap();
    assert_eq!(o.exit_code, Some(0));
    assert_eq!(
        std::fs::read_to_string(a.root.join("hd/pwd.txt"))
            .unwrap()
            .trim(),
        a.root.join("hd").display().to_string()
    );
    // A literal `~` elsewhere is an ordinary name, and one made at the top stays reachable.
    c.upload(&[UploadFile::new(a.path("~/lit.txt"), &b"l"[..])])
        .await
        .unwrap();
    assert!(a.root.join("~/lit.txt").exists());
    assert_eq!(&c.download(&a.path("~/lit.txt")).await.unwrap()[..], b"l");
    c.remove_files([a.path("~/lit.txt")]).await.unwrap();
    assert!(!a.root.join("~/lit.txt").exists());
    assert!(a.root.join("hd/moved.txt").exists());
    for p in ["~/..", "~/../..", "~/../outside/x"] {
        let e = c.download(p).await.unwrap_err();
        assert_eq!(e.status(), Some(400), "{p}");
        let e = c
            .upload(&[UploadFile::new(format!("{p}/escaped.txt"), &b"x"[..])])
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(400), "{p}");
        let e = c
            .run_command(&RunCommandRequest::shell("pwd").cwd(p))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("outside"), "{p}: {e}");
    }
    assert!(std::fs::read_dir(&a.outside).unwrap().next().is_none());
    a.stop().await;
}
