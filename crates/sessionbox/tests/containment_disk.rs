//! Containment of disk and inodes on the `isolated` runtime: each conversation's workspace is a
//! file system of its own of `[isolated] disk_bytes` and `disk_inodes` (a loop-mounted ext4
//! volume), so the KERNEL refuses a write past the quota. Real sandboxes launched as the CLI
//! launches them, real attacks from inside, verdicts read on the host: the volume's image (what
//! the host spent), the mount table, and a second conversation that must keep answering.
//!
//! Small quotas (64 MiB, 2000 inodes) so each attack runs in seconds. They need root (CI runs
//! them as root); without it each prints SKIPPED and passes.
//!
//! Its own binary (like `isolated_escape`): the attack tests assert how fast another
//! conversation answers while the attack runs, so no other file's tests share the machine.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them); support modules are `pub` for the files that use them,
// and a test binary has no public API.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sessionbox_core::{ConversationKey, Error, ExecRequest, Runtime, Session};
use sessionbox_sandbox::SandboxLimits;

use support::*;

#[allow(dead_code)]
mod support;

macro_rules! needs_root {
    () => {
        if !is_root() {
            eprintln!("SKIPPED: disk quota tests need root (CI runs them as root)");
            return;
        }
    };
}

/// One test at a time: they measure how fast the other conversation answers.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MIB: u64 = 1 << 20;
/// The quota of the tests: 64 MiB and 2000 inodes.
const QUOTA: (u64, u64) = (64 * MIB, 2000);
/// The bound on the other conversation's `echo` while an attack runs.
const B_BOUND: Duration = Duration::from_secs(2);

fn env() -> Env {
    Env::with_disk(3, SandboxLimits::default(), Some(QUOTA))
}

/// The host bytes the conversation's volume takes (its sparse image's allocated blocks, after
/// the volume's dirty pages reach it).
fn image_allocated(env: &Env, key: &ConversationKey) -> u64 {
    if let Ok(dir) = std::fs::File::open(env.workspace(key)) {
        let _ = rustix::fs::syncfs(&dir);
    }
    std::fs::metadata(image_of(env, key))
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}

fn image_of(env: &Env, key: &ConversationKey) -> PathBuf {
    env.data.join("disks").join(format!("{}.img", key.as_str()))
}

fn mounted(dir: &Path) -> bool {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(dir.to_str().unwrap()))
}

/// Free bytes of the file system holding `dir`, as the host sees them.
fn host_free(dir: &Path) -> u64 {
    let s = rustix::fs::statvfs(dir).unwrap();
    s.f_bavail * s.f_frsize
}

/// Runs `attack` in A while B answers `echo ok` again and again; returns the attack's result,
/// B's slowest and median answer, and how many times B answered.
async fn while_attacking(
    a: &dyn Session,
    b: &dyn Session,
    attack: &str,
) -> (sessionbox_core::ExecResult, Duration, Duration, usize) {
    let done = std::sync::atomic::AtomicBool::new(false);
    let attack = async {
        let r = a
            .exec(ExecRequest::new(attack).timeout(Duration::from_secs(90)))
            .await
            .expect("the attack runs");
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        r
    };
    let probe = async {
        let mut times = Vec::new();
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            let t = Instant::now();
            let r = b
                .exec(ExecRequest::new("echo ok").timeout(Duration::from_secs(30)))
                .await
                .expect("B answers");
            assert_eq!(text(&r.stdout), "ok\n", "{r:?}");
            times.push(t.elapsed());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        times
    };
    let (r, mut times) = tokio::join!(attack, probe);
    times.sort();
    let slowest = times.last().copied().unwrap_or_default();
    let median = times.get(times.len() / 2).copied().unwrap_or_default();
    (r, slowest, median, times.len())
}

/// The disk-fill attack (`fallocate` and `dd` of several files, which before the quota wrote
/// 2.9 GB in about a second, bounded only per file by `RLIMIT_FSIZE`): in conversation A,
/// three rounds of filling the workspace with 32 MiB files until the kernel refuses, then
/// deleting them. Every round stops at the quota with `ENOSPC` ("No space left on device");
/// the host spends at most `disk_bytes` on A (its volume's image never allocates more); B
/// answers every `echo` within 2 s during the attack and can still write its own files; after
/// `rm` A writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disk_fill_in_a_stops_at_disk_bytes_with_enospc_while_b_keeps_answering() {
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(180, async {
        let env = env();
        let a = env.open("filler").await;
        let b = env.open("bystander").await;
        let free_before = host_free(&env.data);
        let attack = "for round in 1 2 3; do \
              for i in 1 2 3 4; do fallocate -l 32M f$round-$i 2>>/tmp/err || break; done; \
              for i in 1 2 3 4; do dd if=/dev/zero of=d$round-$i bs=1M count=32 2>>/tmp/err || break; done; \
              du -sk . | cut -f1 >>/tmp/written; rm -f f* d*; \
            done; cat /tmp/written; cat /tmp/err >&2";
        let (r, slowest, median, answers) = while_attacking(&a, &b, attack).await;
        let free_after = host_free(&env.data);
        let stderr = text(&r.stderr);
        let written: Vec<u64> = text(&r.stdout)
            .lines()
            .map(|l| l.trim().parse::<u64>().unwrap() * 1024)
            .collect();
        eprintln!(
            "disk fill: written per round {written:?} bytes (quota {} bytes); B answered {answers} times, median {median:?}, slowest {slowest:?}; host free space {free_before} -> {free_after}; A's image allocates {} bytes",
            QUOTA.0,
            image_allocated(&env, a.key())
        );
        assert_eq!(written.len(), 3, "{r:?}");
        assert!(
            stderr.contains("No space left on device") || stderr.contains("Disk quota exceeded"),
            "the kernel refused with ENOSPC/EDQUOT: {stderr}"
        );
        for w in &written {
            assert!(*w <= QUOTA.0, "a round wrote {w} bytes, past the quota");
            assert!(*w >= QUOTA.0 - 16 * MIB, "a round stopped early: {w}");
        }
        assert!(
            image_allocated(&env, a.key()) <= QUOTA.0,
            "the host spent more than the quota on A"
        );
        assert!(slowest < B_BOUND, "B answered in {slowest:?} during the attack");
        // B's own quota is untouched; A works again after its rm.
        let r = sh(&b, "dd if=/dev/zero of=mine bs=1M count=32 2>&1 && echo wrote").await;
        assert!(text(&r.stdout).contains("wrote"), "{r:?}");
        let r = sh(&a, "dd if=/dev/zero of=again bs=1M count=32 2>&1 && echo wrote").await;
        assert!(text(&r.stdout).contains("wrote"), "{r:?}");
        for id in ["filler", "bystander"] {
            env.manager.destroy(&Env::conv(id)).await.unwrap();
        }
    })
    .await;
}

/// The inode flood (200 000 files in 12 s before the quota): conversation A creates empty
/// files until the kernel refuses. It stops at `disk_inodes` (ext4 rounds the count per block
/// group: at most 128 more here) with `ENOSPC`; B answers every `echo`
/// within 2 s meanwhile and creates its own files; A creates files again after `rm`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inode_flood_in_a_stops_at_disk_inodes_while_b_keeps_answering() {
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(180, async {
        let env = env();
        let a = env.open("flooder").await;
        let b = env.open("bystander").await;
        let attack = "mkdir many && cd many && i=0; \
            while [ $i -lt 10000 ] &&  true > f$i 2>/dev/null; do i=$((i+1)); done; \
            echo $i; touch one-more";
        let (r, slowest, median, answers) = while_attacking(&a, &b, attack).await;
        let made: u64 = text(&r.stdout).trim().parse().unwrap();
        eprintln!(
            "inode flood: {made} files made (quota {} inodes); B answered {answers} times, median {median:?}, slowest {slowest:?}",
            QUOTA.1
        );
        assert!(
            text(&r.stderr).contains("No space left on device"),
            "{r:?}"
        );
        // `many` itself takes one; ext4 adds at most 16 per 8 MiB block group (128 here).
        assert!(made <= QUOTA.1 + 128, "{made} files, past the quota");
        assert!(made + 1 >= QUOTA.1, "stopped early: {made}");
        assert!(slowest < B_BOUND, "B answered in {slowest:?} during the attack");
        let usage = env.runtime.disk_usage(a.key()).await.unwrap().unwrap();
        assert_eq!(usage.inodes_used, usage.inodes_limit, "{usage:?}");
        let r = sh(&b, "mkdir few && for i in $(seq 100); do : > few/$i; done; ls few | wc -l").await;
        assert_eq!(text(&r.stdout).trim(), "100", "{r:?}");
        let r = sh(&a, "rm -rf many && : > back && echo ok").await;
        assert_eq!(text(&r.stdout), "ok\n", "{r:?}");
        for id in ["flooder", "bystander"] {
            env.manager.destroy(&Env::conv(id)).await.unwrap();
        }
    })
    .await;
}

/// The same attack through the file API (the agent's `write`, as REST and MCP write): past the
/// byte quota and past the inode quota, a write is refused with the typed `too_large` error
/// that says what to do (not a backend error), the workspace keeps its earlier files, and after
/// a `remove` the same write succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn file_api_writes_past_the_quota_get_a_typed_too_large_error() {
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(120, async {
        let env = env();
        let a = env.open("writer").await;
        // 8 MiB files until the kernel refuses: the quota (64 MiB, about 59 MiB for files)
        // holds seven.
        let chunk = vec![7u8; 8 * MIB as usize];
        let mut written = 0;
        let e = loop {
            match a.write(&format!("f{written}"), &chunk).await {
                Ok(()) => written += 1,
                Err(e) => break e,
            }
            assert!(
                written <= 8,
                "wrote {written} files of 8 MiB past a 64 MiB quota"
            );
        };
        eprintln!("file API past the byte quota after {written} files of 8 MiB: {e}");
        assert!((6..=7).contains(&written), "{written}");
        assert!(matches!(e, Error::TooLarge { .. }), "{e:?}");
        assert_eq!(e.code(), "too_large");
        assert!(e.to_string().contains("delete files"), "{e}");
        assert_eq!(a.read("f0").await.unwrap().len(), chunk.len());
        let refused = format!("f{written}");
        assert!(a.stat(&refused).await.is_err(), "no partial file is left");
        a.remove("f0", false).await.unwrap();
        a.write(&refused, &chunk).await.unwrap();
        sh(&a, "rm -f f*").await;

        // Inodes: fill them from inside, then one more file through the API.
        let r = sh(
            &a,
            "mkdir m && cd m && i=0; while  true > f$i 2>/dev/null; do i=$((i+1)); done; echo $i",
        )
        .await;
        assert!(
            text(&r.stdout).trim().parse::<u64>().unwrap() >= QUOTA.1 - 8,
            "{r:?}"
        );
        let e = a.write("small", b"x").await.unwrap_err();
        eprintln!("file API past the inode quota: {e}");
        assert!(matches!(e, Error::TooLarge { .. }), "{e:?}");
        sh(&a, "rm -rf m").await;
        a.write("small", b"x").await.unwrap();
        env.manager.destroy(&Env::conv("writer")).await.unwrap();
    })
    .await;
}

/// The measured usage shows in `sessionbox conversations --json` (and its table) and in
/// `GET /v1/conversations/{id}` of `sessionbox serve`, as the kernel counts it: after 10 MiB
/// and 50 files, at least that much is used, against the 64 MiB and 2000-inode limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disk_usage_shows_in_conversations_and_rest() {
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(120, async {
        let env = env();
        let a = env.open("measured").await;
        sh(
            &a,
            "dd if=/dev/zero of=ten bs=1M count=10 2>/dev/null; mkdir d; for i in $(seq 50); do : > d/$i; done",
        )
        .await;
        let check = |d: &serde_json::Value| {
            let n = |k: &str| d[k].as_u64().unwrap_or_else(|| panic!("{k} in {d}"));
            assert!(n("bytes_used") >= 10 * MIB, "{d}");
            assert!(n("bytes_limit") <= QUOTA.0 && n("bytes_limit") >= QUOTA.0 - 16 * MIB, "{d}");
            assert!(n("inodes_used") >= 52 && n("inodes_used") < 60, "{d}");
            assert!(n("inodes_limit") >= QUOTA.1 && n("inodes_limit") <= QUOTA.1 + 128, "{d}");
        };
        let out = env.cli(&["conversations", "--json"], &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        check(&list[0]["disk"]);
        let out = env.cli(&["conversations"], &[]);
        let table = text(&out.stdout);
        assert!(table.contains("DISK") && table.contains("/2"), "{table}");

        let out = env.cli(&["--tenant", "default", "keys", "create", "--label", "disk"], &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let key = text(&out.stdout).trim().to_owned();
        let (mut child, base) = sessionbox_test_support::spawn_serve(
            &mut sessionbox_test_support::serve_command(EXE, &env.data, &[]),
        );
        let got = reqwest::Client::new()
            .get(format!("{base}/v1/conversations/measured"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        let status = got.status();
        let body: serde_json::Value = got.json().await.unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(status.is_success(), "{status} {body}");
        check(&body["disk"]);
        env.manager.destroy(&Env::conv("measured")).await.unwrap();
    })
    .await;
}

/// Destroy frees the quota's volume: the mount is gone from the host's mount table, the image
/// (and its host space) is removed, the workspace directory is gone, and the same conversation
/// id starts again with an empty workspace of its full quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn destroy_unmounts_and_removes_the_volume() {
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(120, async {
        let env = env();
        let a = env.open("doomed").await;
        let key = a.key().clone();
        sh(&a, "dd if=/dev/zero of=big bs=1M count=20 2>/dev/null").await;
        let workspace = env.workspace(&key);
        assert!(mounted(&workspace), "the workspace is its own volume");
        assert!(image_allocated(&env, &key) >= 20 * MIB);
        drop(a);
        let report = env.manager.destroy(&Env::conv("doomed")).await.unwrap();
        assert!(report.runtime.workspace_removed, "{report:?}");
        assert!(!mounted(&workspace), "the volume is unmounted");
        assert!(!image_of(&env, &key).exists(), "the image is removed");
        assert!(!workspace.exists(), "the mount point is removed");
        assert_eq!(env.runtime.disk_usage(&key).await.unwrap(), None);
        let a = env.open("doomed").await;
        let r = sh(&a, "ls -A | wc -l").await;
        assert_eq!(text(&r.stdout).trim(), "0", "a fresh, empty workspace");
        let usage = env.runtime.disk_usage(&key).await.unwrap().unwrap();
        assert!(usage.bytes_used < MIB, "{usage:?}");
        drop(a);
        env.manager.destroy(&Env::conv("doomed")).await.unwrap();
    })
    .await;
}

/// A workspace archived in one conversation (`Session::archive_workspace`) and restored into
/// another (`Session::restore_workspace`) comes back whole (odd bytes, an empty file, nested
/// directories, a link, a mode), every entry owned by the other conversation's uid, and what
/// the target held before is gone. An archive larger than the target's quota is refused with
/// `too_large`, and the target still takes writes afterwards (the spooled archive is freed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_archive_restores_into_another_conversation_as_its_own_and_past_the_quota_is_too_large()
{
    use std::os::unix::fs::MetadataExt;
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(180, async {
        let env = env();
        let src = env.open("archive-source").await;
        let dst = env.open("archive-target").await;
        let r = sh(
            &src,
            "mkdir -p d/e && printf 'x\\000y\\377' > d/e/f && chmod 640 d/e/f && ln -s d/e/f l \
             && : > empty && echo $(id -u)",
        )
        .await;
        assert_eq!(r.status, sessionbox_core::ExitStatus::Code(0), "{r:?}");
        sh(&dst, "echo old > old").await;
        // The runtime's own sessions (the manager's conversation does not forward archives).
        let a = env
            .runtime
            .open(&Env::conv("archive-source"))
            .await
            .unwrap();
        let b = env
            .runtime
            .open(&Env::conv("archive-target"))
            .await
            .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let tar = tmp.path().join("a.tar");
        let stats = a.archive_workspace(&tar, u64::MAX).await.unwrap();
        assert_eq!(
            (stats.files, stats.directories, stats.links, stats.bytes),
            (2, 2, 1, 4),
            "{stats:?}"
        );
        let restored = b.restore_workspace(&tar).await.unwrap();
        assert_eq!(restored, stats);
        assert_eq!(b.read("d/e/f").await.unwrap(), b"x\0y\xff");
        assert_eq!(b.stat("d/e/f").await.unwrap().mode & 0o777, 0o640);
        assert!(
            b.stat("old").await.is_err(),
            "the target's old file is gone"
        );
        let (uid_a, uid_b) = (env.uid(a.key()), env.uid(b.key()));
        assert_ne!(uid_a, uid_b);
        let ws = env.workspace(b.key());
        for p in ["d", "d/e", "d/e/f", "l", "empty"] {
            let m = std::fs::symlink_metadata(ws.join(p)).unwrap();
            assert_eq!(m.uid(), uid_b, "{p} is owned by the target's uid");
        }
        assert_eq!(
            std::fs::read_link(ws.join("l")).unwrap(),
            Path::new("d/e/f")
        );

        // 80 MiB of files against a 64 MiB quota.
        let big = tmp.path().join("big");
        std::fs::create_dir(&big).unwrap();
        std::fs::write(big.join("f"), vec![3u8; 80 * MIB as usize]).unwrap();
        let big_tar = tmp.path().join("big.tar");
        sessionbox_fs::Workspace::open(&big, "/w", sessionbox_core::Limits::default())
            .unwrap()
            .archive(std::fs::File::create(&big_tar).unwrap())
            .unwrap();
        let e = b.restore_workspace(&big_tar).await.unwrap_err();
        assert_eq!(e.code(), "too_large", "{e}");
        assert!(matches!(e, Error::TooLarge { .. }), "{e:?}");
        b.write("after", &vec![1u8; 8 * MIB as usize])
            .await
            .unwrap();
        drop((a, b, src, dst));
        env.manager
            .destroy(&Env::conv("archive-source"))
            .await
            .unwrap();
        env.manager
            .destroy(&Env::conv("archive-target"))
            .await
            .unwrap();
    })
    .await;
}

/// A workspace made before disk quotas (a plain directory) is migrated into its volume on the
/// next launch, its files kept; one holding more than the quota is refused with `too_large`,
/// saying what to do, and left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workspace_from_before_the_quota_is_migrated_or_refused_clearly() {
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(120, async {
        // Made without a quota.
        let old = Env::with_disk(3, SandboxLimits::default(), Some((0, 0)));
        for (id, mib) in [("small", 1), ("large", 80)] {
            let c = old.open(id).await;
            sh(
                &c,
                &format!("dd if=/dev/zero of=data bs=1M count={mib} 2>/dev/null; echo kept > note"),
            )
            .await;
        }
        let small = Env::conv("small").key;
        let large = Env::conv("large").key;
        assert!(!mounted(&old.workspace(&small)));
        // Stop their sandboxes (they would keep the old workspace), then reopen with a quota.
        for r in std::fs::read_dir(old.data.join("run")).unwrap().flatten() {
            if let Some(rec) = Record::read(&r.path()) {
                rec.kill_all();
            }
        }
        let _ = std::fs::remove_file(old.data.join("sessionbox.toml"));
        let (manager, runtime) = {
            let file: sessionbox::config::FileConfig = toml::from_str(&format!(
                "[isolated]\nuid_base = {}\nuid_count = {}\ndisk_bytes = {}\ndisk_inodes = {}\n",
                old.uids.start,
                old.uids.len(),
                QUOTA.0,
                QUOTA.1
            ))
            .unwrap();
            let options = sessionbox::runtime::BuildOptions::new(PathBuf::from(EXE));
            let store = sessionbox_store::Store::open(&old.data.join("sessionbox.db")).unwrap();
            let config =
                sessionbox::runtime::isolated_config(&file, &old.data, &options.exe).unwrap();
            let runtime = std::sync::Arc::new(
                sessionbox::runtime::isolated_with(config, &store, &old.data, &options).unwrap(),
            );
            (
                sessionbox_manager::Manager::new(store, runtime.clone()),
                runtime,
            )
        };
        let c = manager.open(&Env::conv("small")).await.unwrap();
        assert_eq!(text(&sh(&c, "cat note").await.stdout), "kept\n");
        assert!(mounted(&old.workspace(&small)), "migrated into its volume");
        assert!(runtime.disk_usage(&small).await.unwrap().is_some());
        drop(c);
        let e = match manager.open(&Env::conv("large")).await {
            Ok(_) => panic!("a workspace over the quota was migrated"),
            Err(e) => e,
        };
        eprintln!("migration over the quota: {e}");
        assert_eq!(e.code(), "too_large", "{e}");
        assert!(e.to_string().contains("disk_bytes"), "{e}");
        assert!(!mounted(&old.workspace(&large)));
        assert_eq!(
            std::fs::metadata(old.workspace(&large).join("data"))
                .unwrap()
                .len(),
            80 * MIB,
            "left as it was"
        );
        for id in ["small", "large"] {
            manager.destroy(&Env::conv(id)).await.unwrap();
        }
    })
    .await;
}
