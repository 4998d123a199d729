//! Workspace archives on the `aio` runtime against the AIO test server (started per test):
//! a round trip of odd bytes, empty files, nested and read-only directories, links (one
//! pointing out of the workspace, one dangling), modes, a fifo, a hard link and long and
//! non-UTF-8 names, restored into the same and into another conversation; hostile archives
//! refused with the workspace unchanged and nothing written outside it; the size limit; and
//! background commands paused while an archive is taken.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them); support modules are `pub` for the files that use them,
// and a test binary has no public API.
#![allow(clippy::unwrap_used, unreachable_pub)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Target;
use sessionbox_aio::{AioConfig, AioRuntime};
use sessionbox_core::{
    ArchiveStats, ConversationRef, Error, ExecRequest, ExitStatus, Runtime, Session,
};

fn conv(id: &str) -> ConversationRef {
    ConversationRef::parse("default", id).unwrap()
}

async fn sh(s: &dyn Session, cmd: &str) -> Vec<u8> {
    let r = s.exec(ExecRequest::new(cmd)).await.unwrap();
    assert_eq!(
        r.status,
        ExitStatus::Code(0),
        "{cmd}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    r.stdout
}

/// Every entry of the workspace: kind, mode, size and contents' hash of files, link targets,
/// byte for byte (names may not be UTF-8), sorted.
const INVENTORY: &str = r"LC_ALL=C find . -mindepth 1 \( -type d -printf 'd %m|%P\n' \) -o \
    \( -type l -printf 'l %l|%P\n' \) -o \( -type f -printf 'f %m %s|%P\n' \) -o -printf '? %y|%P\n' \
    | LC_ALL=C sort; LC_ALL=C find . -type f -exec sha256sum -- {} + | LC_ALL=C sort; \
    LC_ALL=C find . -type f -exec stat -c '%Y %n' -- {} + | LC_ALL=C sort";

/// A workspace with everything an archive must carry (and a fifo it must skip).
const POPULATE: &str = r#"set -e
mkdir -p a/b/c empty-dir ro
printf 'x' > a/b/c/deep.txt
: > empty.txt
i=0; while [ $i -lt 256 ]; do printf "\\$(printf %o $i)"; i=$((i+1)); done > all-bytes.bin
head -c 300000 /dev/urandom > random.bin
printf '#!/bin/sh\necho hi\n' > run.sh; chmod 755 run.sh
printf 'secret' > private.txt; chmod 600 private.txt
printf 's' > setid; chmod 6755 setid
printf 'in a read-only dir' > ro/inside.txt; chmod 555 ro
mkdir sticky; chmod 1777 sticky
ln -s a/b/c/deep.txt rel-link
ln -s /etc/passwd outside-link
ln -s does/not/exist dangling
mkfifo pipe
printf 'shared' > hard1; ln hard1 hard2
printf 'odd' > "$(printf 'n\377\376-not-utf8')"
long=$(printf 'd%.0s' $(seq 1 120))
mkdir -p "deep/$long/$(printf '\351t\351')"
printf 'long' > "deep/$long/$(printf '\351t\351')/$(printf 'f%.0s' $(seq 1 150)).txt"
"#;

/// The lines of `text`, sorted.
fn sorted(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text.lines().map(str::to_owned).collect();
    v.sort();
    v
}

fn runtime_with_limit(target: &Target, max_archive_bytes: u64) -> AioRuntime {
    let mut c = AioConfig::new(target.endpoint.clone());
    c.root = target.root.clone();
    c.max_archive_bytes = max_archive_bytes;
    AioRuntime::new(c).unwrap()
}

/// Leftovers of archive operations in the container (none expected).
async fn leftovers(s: &dyn Session) -> String {
    let out = sh(
        s,
        "ls -A ../.sessionbox-archives 2>/dev/null | grep -v '^$' || true",
    )
    .await;
    String::from_utf8(out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workspace_round_trips_into_itself_and_into_another_conversation() {
    let target = Target::new();
    let rt = target.runtime();
    let s = rt.open(&conv("archive-source")).await.unwrap();
    sh(&*s, POPULATE).await;
    let before = sh(&*s, INVENTORY).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ws.tar");
    let stats = s.archive_workspace(&file, u64::MAX).await.unwrap();
    assert_eq!(
        stats,
        ArchiveStats {
            // 1 + 0 + 256 + 300000 + 18 + 6 + 1 + 18 + 6 + 6 + 3 + 4
            bytes: 300_319,
            // deep.txt empty.txt all-bytes random run.sh private setid inside hard1 hard2
            // n\xff\xfe long
            files: 12,
            // a a/b a/b/c empty-dir ro sticky deep deep/ddd.. deep/ddd../ete
            directories: 9,
            links: 3,
            skipped: 1,
        }
    );
    // The archive on this side is in the canonical form.
    let mut names = Vec::new();
    let mut a = tar::Archive::new(std::fs::File::open(&file).unwrap());
    for e in a.entries().unwrap() {
        let e = e.unwrap();
        let h = e.header();
        assert_eq!((h.uid().unwrap(), h.gid().unwrap()), (0, 0));
        assert_eq!(h.mode().unwrap() & 0o6000, 0, "no set-id bits");
        let name = e.path_bytes().into_owned();
        assert!(!name.starts_with(b"/") && !name.starts_with(b"./"));
        if name == b"outside-link" {
            assert_eq!(e.link_name_bytes().unwrap().as_ref(), b"/etc/passwd");
        }
        names.push(name);
    }
    assert!(names.contains(&b"setid".to_vec()) && !names.contains(&b"pipe".to_vec()));
    assert_eq!(
        sessionbox_archive::check_archive(std::fs::File::open(&file).unwrap()).unwrap(),
        ArchiveStats {
            skipped: 0,
            ..stats
        }
    );

    // Into the same conversation, changed meanwhile: back to what it was (set-id bits gone,
    // the fifo gone, the hard links two files).
    sh(
        &*s,
        "chmod 755 ro && rm -rf a ro && echo new > added.txt && chmod 644 run.sh",
    )
    .await;
    let restored = s.restore_workspace(&file).await.unwrap();
    assert_eq!(
        restored,
        ArchiveStats {
            skipped: 0,
            ..stats
        }
    );
    let expected =
        sorted(&String::from_utf8_lossy(&before).replace("f 6755 1|setid", "f 755 1|setid"))
            .into_iter()
            .filter(|l| !l.ends_with("|pipe"))
            .collect::<Vec<_>>();
    let after = sh(&*s, INVENTORY).await;
    assert_eq!(sorted(&String::from_utf8_lossy(&after)), expected);
    assert_eq!(sh(&*s, "stat -c %h hard1 hard2").await, b"1\n1\n");
    assert_eq!(sh(&*s, "cat rel-link").await, b"x");

    // Into another conversation: the same contents.
    let other = rt.open(&conv("archive-target")).await.unwrap();
    sh(&*other, "echo old > gone.txt && mkdir -p old/dir").await;
    assert_eq!(other.restore_workspace(&file).await.unwrap(), restored);
    assert_eq!(sh(&*other, INVENTORY).await, after);
    assert_eq!(leftovers(&*s).await, "");
    // What the restore wrote is the conversation's own: commands work on it as before.
    assert_eq!(
        sh(&*other, "./run.sh && cat all-bytes.bin | wc -c").await,
        b"hi\n256\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_empty_workspace_round_trips() {
    let target = Target::new();
    let rt = target.runtime();
    let s = rt.open(&conv("archive-empty")).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("empty.tar");
    assert_eq!(
        s.archive_workspace(&file, u64::MAX).await.unwrap(),
        ArchiveStats::default()
    );
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 1024);
    sh(&*s, "echo x > f && mkdir d").await;
    assert_eq!(
        s.restore_workspace(&file).await.unwrap(),
        ArchiveStats::default()
    );
    assert_eq!(sh(&*s, "ls -A").await, b"");
}

/// One raw tar entry, its name written as given (no checks).
fn raw(name: &[u8], kind: tar::EntryType, data: &[u8], link: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    {
        let g = h.as_gnu_mut().unwrap();
        g.name[..name.len()].copy_from_slice(name);
        g.linkname[..link.len()].copy_from_slice(link);
    }
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

fn archive(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out = entries.concat();
    out.extend_from_slice(&[0u8; 1024]);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_archives_are_refused_with_the_workspace_unchanged_and_nothing_outside() {
    let target = Target::new();
    let rt = target.runtime();
    let s = rt.open(&conv("archive-hostile")).await.unwrap();
    // A directory outside the workspace, beside the conversations root.
    let outside = String::from_utf8(
        sh(
            &*s,
            "o=$(realpath ../..)/outside-$$; mkdir -p \"$o\" && printf %s \"$o\"",
        )
        .await,
    )
    .unwrap();
    sh(
        &*s,
        "echo keep > keep.txt && mkdir -p sub && echo deep > sub/x",
    )
    .await;
    let before = sh(&*s, INVENTORY).await;
    let big = vec![b'z'; 700_000];
    let f = |name: &[u8], data: &[u8]| raw(name, tar::EntryType::Regular, data, b"");
    let link = |name: &[u8], to: &[u8]| raw(name, tar::EntryType::Symlink, b"", to);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "absolute",
            archive(&[
                f(b"ok.txt", b"1"),
                f(format!("{outside}/abs").as_bytes(), b"x"),
            ]),
            "absolute",
        ),
        ("dotdot", archive(&[f(b"a/../../escape", b"x")]), "'..'"),
        (
            "through a link out of the workspace",
            archive(&[link(b"l", outside.as_bytes()), f(b"l/pwned", b"x")]),
            "symbolic link",
        ),
        (
            "through a relative link",
            archive(&[link(b"up", b"../.."), f(b"up/pwned", b"x")]),
            "symbolic link",
        ),
        (
            // The refusal comes after 700 kB were uploaded: the upload is stopped and removed.
            "a hard link after a large file",
            archive(&[
                f(b"big.bin", &big),
                raw(b"h", tar::EntryType::Link, b"", b"big.bin"),
            ]),
            "hard link",
        ),
        (
            "fifo",
            archive(&[raw(b"p", tar::EntryType::Fifo, b"", b"")]),
            "kind",
        ),
        (
            "device",
            archive(&[raw(b"dev", tar::EntryType::Block, b"", b"")]),
            "kind",
        ),
        (
            "a link over a directory of earlier entries",
            archive(&[
                f(b"d/a", b""),
                link(b"d", outside.as_bytes()),
                f(b"d/b", b""),
            ]),
            "earlier entries",
        ),
        ("not a tar", b"hello, world".repeat(100), "cannot be read"),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes, why) in cases {
        let file = dir.path().join("hostile.tar");
        std::fs::write(&file, &bytes).unwrap();
        let e = s.restore_workspace(&file).await.unwrap_err();
        assert!(matches!(e, Error::InvalidRequest(_)), "{name}: {e}");
        assert!(e.to_string().contains(why), "{name}: {e}");
        assert_eq!(
            sh(&*s, INVENTORY).await,
            before,
            "{name}: the workspace changed"
        );
        let out = sh(&*s, &format!("ls -A '{outside}'")).await;
        assert_eq!(out, b"", "{name}: something was written outside");
        assert_eq!(leftovers(&*s).await, "", "{name}: a temporary was left");
    }
    sh(&*s, &format!("rmdir '{outside}'")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn archives_past_the_limit_are_refused_with_a_typed_error() {
    let target = Target::local(None);
    let rt = runtime_with_limit(&target, 64 * 1024);
    let s = rt.open(&conv("archive-limit")).await.unwrap();
    sh(&*s, "head -c 100000 /dev/urandom > big.bin").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ws.tar");
    let e = s.archive_workspace(&file, u64::MAX).await.unwrap_err();
    assert!(matches!(e, Error::TooLarge { limit: 65536, .. }), "{e}");
    assert!(!file.exists(), "nothing is left at the destination");
    assert_eq!(leftovers(&*s).await, "");

    // A local archive past the limit is refused before any request.
    std::fs::write(&file, vec![0u8; 70_000]).unwrap();
    let server = target.server();
    let n = server.requests().await;
    let e = s.restore_workspace(&file).await.unwrap_err();
    assert!(matches!(e, Error::TooLarge { limit: 65536, .. }), "{e}");
    assert_eq!(
        server.requests().await,
        n,
        "no request for a refused archive"
    );
    let e = s
        .restore_workspace(&dir.path().join("missing.tar"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "not_found", "{e}");
    assert_eq!(sh(&*s, "ls").await, b"big.bin\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn background_commands_are_paused_while_an_archive_is_taken_and_resumed_after() {
    let target = Target::new();
    let rt = target.runtime();
    let s = rt.open(&conv("archive-background")).await.unwrap();
    // Rewrites a 2 MB file without pause: GNU tar reading it meanwhile would see it change
    // (and the archive would be refused as inconsistent) unless the command is stopped.
    let c = s
        .spawn(
            ExecRequest::new(
                "while :; do head -c 2000000 /dev/zero > churn.bin; echo . >> ticks; done",
            )
            .timeout(Duration::from_secs(120)),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while sh(&*s, "[ -s ticks ] && echo y || true").await != b"y\n" {
        assert!(Instant::now() < deadline, "the command did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    for i in 0..3 {
        let file = dir.path().join(format!("ws{i}.tar"));
        let stats = s.archive_workspace(&file, u64::MAX).await.unwrap();
        assert_eq!(stats.files, 2, "{stats:?}");
    }
    // A restore while it runs: it is paused while the contents are swapped, then goes on.
    let restored = s
        .restore_workspace(&dir.path().join("ws0.tar"))
        .await
        .unwrap();
    assert_eq!(restored.files, 2, "{restored:?}");
    // Still running, and writing again.
    let ticks = sh(&*s, "wc -l < ticks").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_ne!(
        sh(&*s, "wc -l < ticks").await,
        ticks,
        "the command was resumed"
    );
    assert!(s.command(&c.id).await.unwrap().running);

    // A running command whose process group is not recorded cannot be paused: refused,
    // naming it.
    let pid = format!("../.sessionbox-commands/{}/{}/pid", s.key().as_str(), c.id);
    sh(&*s, &format!("mv {pid} {pid}.aside")).await;
    let e = s
        .archive_workspace(&dir.path().join("busy.tar"), u64::MAX)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Conflict(_)), "{e}");
    assert!(e.to_string().contains(&c.id), "{e}");
    sh(&*s, &format!("mv {pid}.aside {pid}")).await;
    let ticks = sh(&*s, "wc -l < ticks").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_ne!(
        sh(&*s, "wc -l < ticks").await,
        ticks,
        "a refusal leaves the command running"
    );
    let k = s.kill_command(&c.id).await.unwrap();
    assert!(!k.running && k.killed, "{k:?}");
    assert!(!Path::new(&dir.path().join("busy.tar")).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn destroy_removes_what_a_failed_archive_left() {
    let target = Target::new();
    let rt = target.runtime();
    let c = conv("archive-destroy");
    let s = rt.open(&c).await.unwrap();
    let key = s.key().as_str().to_owned();
    sh(
        &*s,
        &format!(
            "mkdir -p ../.sessionbox-archives/{key}.x.d/ro && chmod 555 ../.sessionbox-archives/{key}.x.d/ro \
             && : > ../.sessionbox-archives/{key}.x.tar && : > ../.sessionbox-archives/other.tar"
        ),
    )
    .await;
    let other = rt.open(&conv("archive-destroy-other")).await.unwrap();
    assert!(rt.destroy(&c.key).await.unwrap().workspace_removed);
    assert_eq!(leftovers(&*other).await, "other.tar\n");
}
