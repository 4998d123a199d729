//! Tests of the check and the rewrite: every rule, the canonical form, hostile input.

use super::*;

/// One raw entry: a GNU header with `name` as given (no checks), then the data.
fn raw(name: &[u8], kind: tar::EntryType, mode: u32, data: &[u8], link: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    {
        let g = h.as_gnu_mut().unwrap();
        g.name[..name.len()].copy_from_slice(name);
        g.linkname[..link.len()].copy_from_slice(link);
    }
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(1000);
    h.set_gid(1000);
    h.set_username("someone").unwrap();
    h.set_mtime(1_700_000_000);
    h.set_size(data.len() as u64);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

fn file(name: &[u8], data: &[u8]) -> Vec<u8> {
    raw(name, tar::EntryType::Regular, 0o644, data, b"")
}
fn dir(name: &[u8]) -> Vec<u8> {
    raw(name, tar::EntryType::Directory, 0o755, b"", b"")
}
fn link(name: &[u8], to: &[u8]) -> Vec<u8> {
    raw(name, tar::EntryType::Symlink, 0o777, b"", to)
}
fn archive(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out: Vec<u8> = entries.concat();
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// Name, type, mode, mtime, link target, data.
type Listed = (Vec<u8>, char, u32, u64, Vec<u8>, Vec<u8>);

fn list(bytes: &[u8]) -> Vec<Listed> {
    let mut a = tar::Archive::new(bytes);
    a.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let h = e.header().clone();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            assert_eq!((h.uid().unwrap(), h.gid().unwrap()), (0, 0));
            assert_eq!(h.username_bytes(), Some(&b""[..]));
            (
                e.path_bytes().into_owned(),
                char::from(h.entry_type().as_byte()),
                h.mode().unwrap(),
                h.mtime().unwrap(),
                e.link_name_bytes()
                    .map(|l| l.into_owned())
                    .unwrap_or_default(),
                data,
            )
        })
        .collect()
}

#[test]
fn a_workspace_tar_is_rewritten_canonically_and_checks_the_same() {
    let long_dir = [b"d/".as_slice(), &[b'n'; 120], b"/\xff\xfe-not-utf8"].concat();
    let long_file = [long_dir.as_slice(), b"/f"].concat();
    let long_target = vec![b'/'; 300];
    let input = archive(&[
        dir(b"./"),
        dir(b"./d/"),
        raw(
            b"./d/run",
            tar::EntryType::Regular,
            0o6755,
            b"#!/bin/sh\n",
            b"",
        ),
        file(b"./d/empty", b""),
        raw(b"./d/sticky", tar::EntryType::Directory, 0o1777, b"", b""),
        link(b"./d/out", b"/etc/passwd"),
        raw(b"./fifo", tar::EntryType::Fifo, 0o644, b"", b""),
        // GNU long names, as GNU tar writes them.
        raw(
            b"././@LongLink",
            tar::EntryType::GNULongName,
            0o644,
            &[long_dir.as_slice(), b"/"].concat(),
            b"",
        ),
        dir(b"placeholder"),
        raw(
            b"././@LongLink",
            tar::EntryType::GNULongName,
            0o644,
            &long_file,
            b"",
        ),
        file(b"placeholder", b"\x00\xff bytes"),
        raw(
            b"././@LongLink",
            tar::EntryType::GNULongLink,
            0o644,
            &long_target,
            b"",
        ),
        link(b"./far", b"x"),
    ]);
    let mut out = Vec::new();
    let stats = rewrite_archive(&input[..], &mut out, ArchiveSource::Workspace).unwrap();
    assert_eq!(
        stats,
        ArchiveStats {
            bytes: 18,
            files: 3,
            directories: 3,
            links: 2,
            skipped: 1
        }
    );
    let entries = list(&out);
    let names: Vec<&[u8]> = entries.iter().map(|e| e.0.as_slice()).collect();
    assert_eq!(
        names,
        [
            &b"d/"[..],
            b"d/run",
            b"d/empty",
            b"d/sticky/",
            b"d/out",
            &[long_dir.as_slice(), b"/"].concat(),
            &long_file,
            b"far",
        ]
    );
    assert_eq!(entries[1].2, 0o755, "set-id bits go");
    assert_eq!(entries[3].2, 0o1777, "the sticky bit stays");
    assert_eq!(
        entries[4].4, b"/etc/passwd",
        "a link's target is kept as it is"
    );
    assert_eq!(entries[6].5, b"\x00\xff bytes");
    assert_eq!(entries[7].4, long_target);
    assert!(entries.iter().all(|e| e.3 == 1_700_000_000));
    // Canonical archives are fixed points, and a restore accepts them.
    assert_eq!(
        check_archive(&out[..]).unwrap(),
        ArchiveStats {
            skipped: 0,
            ..stats
        }
    );
    let mut again = Vec::new();
    rewrite_archive(&out[..], &mut again, ArchiveSource::Restore).unwrap();
    assert_eq!(again, out);
}

#[test]
fn hostile_archives_are_refused_naming_the_entry() {
    let cases: Vec<(&str, Vec<Vec<u8>>, &str)> = vec![
        ("absolute", vec![file(b"/etc/x", b"")], "absolute"),
        ("dotdot", vec![file(b"a/../../x", b"")], "'..'"),
        ("dotdot-link-name", vec![link(b"..", b"x")], "'..'"),
        (
            "through a link",
            vec![link(b"l", b"/outside"), file(b"l/file", b"x")],
            "beneath \"l\", a symbolic link",
        ),
        (
            "through a nested link",
            vec![
                dir(b"d/"),
                link(b"d/l", b"."),
                dir(b"d/l/e/"),
                file(b"d/l/e/f", b""),
            ],
            "symbolic link",
        ),
        (
            "beneath a file",
            vec![file(b"f", b""), file(b"f/g", b"")],
            "a file of the archive",
        ),
        ("twice", vec![file(b"f", b"1"), file(b"./f", b"2")], "twice"),
        (
            "a link over an implied directory",
            vec![
                file(b"a/b", b""),
                link(b"a", b"/outside"),
                file(b"a/c", b""),
            ],
            "earlier entries lie beneath it",
        ),
        (
            "hard link",
            vec![
                file(b"f", b""),
                raw(b"g", tar::EntryType::Link, 0o644, b"", b"f"),
            ],
            "hard link",
        ),
        (
            "fifo",
            vec![raw(b"p", tar::EntryType::Fifo, 0o644, b"", b"")],
            "kind",
        ),
        (
            "device",
            vec![raw(b"c", tar::EntryType::Char, 0o644, b"", b"")],
            "kind",
        ),
        (
            "file named like a dir",
            vec![file(b"f/", b"")],
            "ends with '/'",
        ),
        ("empty target", vec![link(b"l", b"")], "without a target"),
        (
            "empty component",
            vec![file(b"a//b", b"")],
            "empty component",
        ),
        ("dot component", vec![file(b"a/./b", b"")], "'.' component"),
        (
            "long component",
            vec![file(&[b'x'; 99], b""), {
                let mut v = raw(
                    b"././@LongLink",
                    tar::EntryType::GNULongName,
                    0o644,
                    &[b'y'; 256],
                    b"",
                );
                v.extend(file(b"z", b""));
                v
            }],
            "longer than 255",
        ),
    ];
    for (name, entries, why) in cases {
        let e = check_archive(&archive(&entries)[..]).unwrap_err();
        assert_eq!(e.code(), "invalid_request", "{name}: {e}");
        assert!(e.to_string().contains(why), "{name}: {e}");
    }
}

#[test]
fn broken_streams_are_invalid_and_failing_readers_are_backend_errors() {
    let whole = archive(&[file(b"f", &[7u8; 2000])]);
    for cut in [100, 700, 1500] {
        let e = check_archive(&whole[..cut]).unwrap_err();
        assert_eq!(e.code(), "invalid_request", "cut at {cut}: {e}");
    }
    let mut bad_sum = whole.clone();
    bad_sum[0] = b'g';
    assert_eq!(
        check_archive(&bad_sum[..]).unwrap_err().code(),
        "invalid_request"
    );
    struct Broken;
    impl Read for Broken {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::other("disk on fire"))
        }
    }
    let e = check_archive(Broken).unwrap_err();
    assert_eq!(e.code(), "backend_error", "{e}");
    assert!(e.to_string().contains("disk on fire"));
}

#[test]
fn entry_counts_include_implied_directories() {
    let a = archive(&[file(b"a/b/c/d", b"")]);
    let mut sink = io::sink();
    let e = rewrite(&mut &a[..], &mut sink, ArchiveSource::Restore, 3).unwrap_err();
    assert_eq!(e.code(), "invalid_request", "{e}");
    assert!(rewrite(&mut &a[..], &mut sink, ArchiveSource::Restore, 4).is_ok());
    let e = rewrite(&mut &a[..], &mut sink, ArchiveSource::Workspace, 3).unwrap_err();
    assert_eq!(e.code(), "too_large", "{e}");
}

#[test]
fn pax_records_count_their_own_length() {
    for n in [0, 1, 5, 6, 7, 95, 96, 97, 990, 995, 996, 1000] {
        let mut r = Vec::new();
        pax_record(&mut r, "path", &vec![b'a'; n]);
        let len: usize = std::str::from_utf8(&r[..r.iter().position(|b| *b == b' ').unwrap()])
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(len, r.len(), "{n}");
    }
}
