//! Every file and directory endpoint through the real client, and confinement: `..`, absolute
//! paths outside, and links out are refused with nothing created or read outside.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;

use common::{TestAgent, request};
use sessionbox_execd::{
    FileType, Permission, RenameFileItem, ReplaceFileContentItem, RunCommandRequest, UploadFile,
};

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
    assert_eq!(f.mode, 644);
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
        "line2\n"
    );
    assert_eq!(
        c.download_lines("d/one.txt", 2, None).await.unwrap(),
        "line2\nline3\n"
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

    // permissions: not supported, clearly
    let e = c
        .chmod_files(&BTreeMap::from([("m".to_owned(), Permission::mode(700))]))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(501));

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
    assert_eq!(o.stdout, "dollar");
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
