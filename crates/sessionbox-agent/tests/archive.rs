//! The workspace-archive extension (`/sessionbox/v1/archive`) through the real client against
//! real agents: a round trip keeps files, odd bytes, empty files, nested directories, links
//! (one leading out, stored and not followed) and modes; background commands are paused while
//! an archive is taken, also when the client goes away, and resume; every hostile archive is
//! refused with the workspace unchanged and nothing written outside.

use crate::common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{TestAgent, eventually};
use sessionbox_core::{ArchiveStats, Error, ExecRequest};
use sessionbox_execd::commands_ext::run_request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a tree holds, by relative path: kind, mode and contents or link target.
fn snapshot(root: &Path) -> BTreeMap<Vec<u8>, (char, u32, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<Vec<u8>, (char, u32, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p
                .strip_prefix(root)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            if m.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(rel, ('l', 0, t.as_os_str().as_bytes().to_vec()));
            } else if m.is_dir() {
                out.insert(rel, ('d', mode, Vec::new()));
                walk(root, &p, out);
            } else {
                out.insert(rel, ('f', mode, std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A workspace with everything an archive must keep.
fn fill(a: &TestAgent) {
    let r = &a.root;
    std::fs::write(r.join("odd"), b"\0\xff\xfe\r\n\x1b[31m").unwrap();
    std::fs::write(r.join("empty"), b"").unwrap();
    std::fs::create_dir_all(r.join("a/b/c")).unwrap();
    std::fs::write(r.join("a/b/c/deep.txt"), b"deep").unwrap();
    let run = r.join("a/run.sh");
    std::fs::write(&run, b"#!/bin/sh\necho hi\n").unwrap();
    set_mode(&run, 0o755);
    std::fs::write(r.join("a/private"), b"p").unwrap();
    set_mode(&r.join("a/private"), 0o600);
    set_mode(&r.join("a/b"), 0o750);
    // A path past ustar's 100 bytes, and a name that is not UTF-8.
    let long = r.join("l".repeat(80)).join("m".repeat(80));
    std::fs::create_dir_all(long.parent().unwrap()).unwrap();
    std::fs::write(&long, b"long").unwrap();
    std::fs::write(r.join(OsStr::from_bytes(b"n\xe9")), b"latin1").unwrap();
    symlink("a/b/c/deep.txt", r.join("inside-link")).unwrap();
    symlink("does-not-exist", r.join("dangling")).unwrap();
    std::fs::write(a.outside.join("secret"), b"OUTSIDE-SECRET-BYTES").unwrap();
    symlink(a.outside.join("secret"), r.join("out-file")).unwrap();
    symlink(&a.outside, r.join("out-dir")).unwrap();
}

fn temp_file(a: &TestAgent, name: &str) -> PathBuf {
    a.dir.path().join(name)
}

#[tokio::test(flavor = "multi_thread")]
async fn round_trip_keeps_files_links_modes_and_odd_bytes_and_replaces_everything() {
    let a = TestAgent::start().await;
    fill(&a);
    let tar = temp_file(&a, "ws.tar");
    let stats = a.client.download_archive(&tar, u64::MAX).await.unwrap();
    assert_eq!(
        stats,
        ArchiveStats {
            bytes: 10 + 4 + 18 + 1 + 4 + 6,
            files: 7,
            directories: 4,
            links: 4,
            skipped: 0,
        }
    );

    // Another workspace with contents of its own, a read-only directory among them.
    let b = TestAgent::start().await;
    std::fs::create_dir_all(b.root.join("old/ro")).unwrap();
    std::fs::write(b.root.join("old/ro/f"), b"old").unwrap();
    set_mode(&b.root.join("old/ro"), 0o500);
    std::fs::write(b.root.join("odd"), b"old contents").unwrap();
    let restored = b.client.upload_archive(&tar).await.unwrap();
    assert_eq!(restored, stats);
    assert_eq!(snapshot(&b.root), snapshot(&a.root));
    assert_eq!(std::fs::read(b.outside.join("secret")).ok(), None);
    // Restored again over itself: the same.
    b.client.upload_archive(&tar).await.unwrap();
    assert_eq!(snapshot(&b.root), snapshot(&a.root));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_leading_out_is_stored_as_a_link_and_never_followed() {
    let a = TestAgent::start().await;
    fill(&a);
    let tar = temp_file(&a, "ws.tar");
    a.client.download_archive(&tar, u64::MAX).await.unwrap();
    let bytes = std::fs::read(&tar).unwrap();
    assert!(
        !bytes.windows(20).any(|w| w == b"OUTSIDE-SECRET-BYTES"),
        "the outside file's contents are in the archive"
    );
    let mut ar = tar::Archive::new(bytes.as_slice());
    let mut links = BTreeMap::new();
    for e in ar.entries().unwrap() {
        let e = e.unwrap();
        let path = e.path_bytes().into_owned();
        assert!(!path.starts_with(b"out-dir/"), "entered the link out-dir");
        if e.header().entry_type() == tar::EntryType::Symlink {
            links.insert(path, e.link_name_bytes().unwrap().into_owned());
        }
    }
    assert_eq!(
        links.get(&b"out-file"[..]).map(Vec::as_slice),
        Some(a.outside.join("secret").as_os_str().as_bytes())
    );
    assert!(links.contains_key(&b"out-dir"[..]));
}

/// State letter of `pid` in `/proc/PID/stat`.
fn proc_state(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .unwrap_or_default()
}

fn counter(a: &TestAgent) -> String {
    std::fs::read_to_string(a.root.join("counter")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn background_commands_are_paused_while_an_archive_is_taken_and_resume_after() {
    let a = TestAgent::start().await;
    // Enough data that an unread response holds the archive's writer back.
    let big: Vec<u8> = (0..32u32 << 20)
        .map(|i| (i.wrapping_mul(7919) >> 3) as u8)
        .collect();
    std::fs::write(a.root.join("big"), &big).unwrap();
    let cmd = "echo $$ > pid; i=0; while :; do i=$((i+1)); echo $i > counter.tmp; mv counter.tmp counter; done";
    a.client
        .spawn_background(&run_request(&ExecRequest::new(cmd), ".".into()))
        .await
        .unwrap();
    let pid = common::read_pids(&a.root.join("pid"), 1).await[0];
    assert!(eventually(Duration::from_secs(10), || !counter(&a).is_empty()).await);

    // A client that asks for the archive and reads only the head.
    let mut s = tokio::net::UnixStream::connect(&a.socket).await.unwrap();
    s.write_all(b"GET /sessionbox/v1/archive HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 64];
    let _ = s.read(&mut head).await.unwrap();
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&head)
    );
    // A shell blocked in the kernel (state D: a write held back while the disk is busy) takes
    // its SIGSTOP only when the call returns.
    assert!(
        eventually(Duration::from_secs(30), || proc_state(pid) == "T").await,
        "the command's shell is stopped: {}",
        proc_state(pid)
    );
    let before = counter(&a);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(counter(&a), before, "the command wrote while paused");
    // The client goes away: the command resumes.
    drop(s);
    assert!(
        eventually(Duration::from_secs(10), || counter(&a) != before).await,
        "the command resumed after the client left"
    );

    // A whole archive: consistent (one counter file whatever the loop was doing), and the
    // command runs on afterwards.
    let tar = temp_file(&a, "ws.tar");
    a.client.download_archive(&tar, u64::MAX).await.unwrap();
    let after = counter(&a);
    assert!(eventually(Duration::from_secs(10), || counter(&a) != after).await);
    assert_ne!(proc_state(pid), "T");
    let mut ar = tar::Archive::new(std::fs::File::open(&tar).unwrap());
    let mut counters = 0;
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let path = e.path_bytes().into_owned();
        // `counter` is only ever replaced whole (a rename), so the archive holds a whole one;
        // `counter.tmp` may be caught between the shell's truncation and its write (the command
        // is stopped wherever it is), so it may be empty.
        if path == b"counter" {
            counters += 1;
            let mut text = String::new();
            std::io::Read::read_to_string(&mut e, &mut text).unwrap();
            assert!(text.trim().parse::<u64>().is_ok(), "{text:?}");
        }
    }
    assert!(counters >= 1);
}

/// Kind, name and link target of a raw entry.
type RawEntry = (tar::EntryType, Vec<u8>, Vec<u8>);

/// A ustar header with a raw name (no checks), as a hostile archive would have.
fn raw_entry(
    out: &mut tar::Builder<Vec<u8>>,
    kind: tar::EntryType,
    name: &[u8],
    link: &[u8],
    data: &[u8],
) {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.set_cksum();
    out.append(&h, data).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_archives_are_refused_with_the_workspace_unchanged_and_nothing_outside() {
    use tar::EntryType::{Block, Char, Directory, Fifo, Link, Regular, Symlink};
    let a = TestAgent::start().await;
    std::fs::write(a.root.join("keep"), b"kept").unwrap();
    std::fs::create_dir(a.root.join("dir")).unwrap();
    let before = snapshot(&a.root);
    let outside = a.outside.display().to_string();
    let abs = format!("{outside}/abs");
    let cases: Vec<(&str, Vec<RawEntry>)> = vec![
        (
            "an absolute path",
            vec![(Regular, abs.clone().into_bytes(), vec![])],
        ),
        (
            "a '..' path",
            vec![(Regular, b"../outside/dotdot".to_vec(), vec![])],
        ),
        (
            "a '..' inside a path",
            vec![(Regular, b"dir/../../outside/dotdot2".to_vec(), vec![])],
        ),
        (
            "a path through a link of the archive",
            vec![
                (Symlink, b"link".to_vec(), outside.clone().into_bytes()),
                (Regular, b"link/through".to_vec(), vec![]),
            ],
        ),
        (
            "a link then a directory of the same name",
            vec![
                (Symlink, b"l2".to_vec(), outside.clone().into_bytes()),
                (Directory, b"l2/".to_vec(), vec![]),
                (Regular, b"l2/x".to_vec(), vec![]),
            ],
        ),
        (
            "a path through a file of the archive",
            vec![
                (Regular, b"f".to_vec(), vec![]),
                (Regular, b"f/x".to_vec(), vec![]),
            ],
        ),
        (
            "a hard link",
            vec![
                (Regular, b"t".to_vec(), vec![]),
                (Link, b"h".to_vec(), b"t".to_vec()),
            ],
        ),
        ("a character device", vec![(Char, b"dev".to_vec(), vec![])]),
        ("a block device", vec![(Block, b"blk".to_vec(), vec![])]),
        ("a fifo", vec![(Fifo, b"fifo".to_vec(), vec![])]),
    ];
    for (what, entries) in cases {
        let mut b = tar::Builder::new(Vec::new());
        // A good entry first: nothing of it may appear either.
        raw_entry(&mut b, Regular, b"good-first", b"", b"x");
        for (kind, name, link) in &entries {
            raw_entry(&mut b, *kind, name, link, b"");
        }
        let bytes = b.into_inner().unwrap();
        let tar = temp_file(&a, "hostile.tar");
        std::fs::write(&tar, &bytes).unwrap();
        let e = Error::from(a.client.upload_archive(&tar).await.unwrap_err());
        assert_eq!(e.code(), "invalid_request", "{what}: {e}");
        assert_eq!(snapshot(&a.root), before, "{what}: the workspace changed");
        let outside_now: Vec<_> = std::fs::read_dir(&a.outside).unwrap().collect();
        assert!(
            outside_now.is_empty(),
            "{what}: something was written outside"
        );
    }
    // Not a tar at all.
    let tar = temp_file(&a, "junk.tar");
    std::fs::write(&tar, vec![b'x'; 2048]).unwrap();
    let e = Error::from(a.client.upload_archive(&tar).await.unwrap_err());
    assert_eq!(e.code(), "invalid_request", "{e}");
    assert_eq!(snapshot(&a.root), before);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_archive_over_the_agents_limit_is_refused_typed_from_its_declared_length() {
    let a = TestAgent::start_with(|c| c.max_archive_bytes = 4096).await;
    std::fs::write(a.root.join("keep"), b"kept").unwrap();
    let mut b = tar::Builder::new(Vec::new());
    raw_entry(&mut b, tar::EntryType::Regular, b"f", b"", &[1u8; 8192]);
    let body = b.into_inner().unwrap();
    // Raw: a client streaming the body would see the early refusal as a broken pipe.
    let r = a
        .raw(&common::request(
            "PUT",
            "/sessionbox/v1/archive",
            &[],
            &body,
        ))
        .await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.text().contains("SESSIONBOX::too_large"), "{}", r.text());
    assert_eq!(snapshot(&a.root).len(), 1);
    assert_eq!(std::fs::read(a.root.join("keep")).unwrap(), b"kept");
}

/// The attack: a workspace (or an agent) that makes its archive larger than the caller will
/// keep, to fill the host's disk through a snapshot. The download stops at the caller's limit,
/// typed, with no more than the limit written on the host.
#[tokio::test(flavor = "multi_thread")]
async fn a_download_stops_at_the_callers_limit_and_writes_no_more() {
    let a = TestAgent::start().await;
    std::fs::write(a.root.join("big"), vec![7u8; 2 << 20]).unwrap();
    let tar = temp_file(&a, "capped.tar");
    let limit = 256 * 1024;
    let e = Error::from(a.client.download_archive(&tar, limit).await.unwrap_err());
    assert!(
        matches!(e, Error::TooLarge { limit: l, .. } if l == limit),
        "{e:?}"
    );
    let written = std::fs::metadata(&tar).unwrap().len();
    assert!(
        written <= limit,
        "{written} bytes written past a limit of {limit}"
    );
    // The agent is unharmed: the next archive, with room, is whole.
    let stats = a.client.download_archive(&tar, u64::MAX).await.unwrap();
    assert_eq!(stats.bytes, 2 << 20);
    a.stop().await;
}
