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

/// Every file beneath `dir` (its root included) with an owner other than `uid`, as `find`
/// sees them (it walks paths longer than 4,096 bytes).
fn not_owned_by(dir: &Path, uid: u32) -> Vec<String> {
    let out = std::process::Command::new("find")
        .arg(dir)
        .args([
            "(",
            "!",
            "-uid",
            &uid.to_string(),
            "-o",
            "!",
            "-gid",
            &uid.to_string(),
            ")",
            "-print",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "find: {}", text(&out.stderr));
    text(&out.stdout).lines().map(str::to_owned).collect()
}

/// The UUID of the ext4 file system in `image` (16 bytes at 0x468: the superblock starts at
/// 1024, its `s_uuid` at 0x68): a clone of an image keeps it, a file system made anew does not.
fn fs_uuid(image: &Path) -> [u8; 16] {
    use std::os::unix::fs::FileExt;
    let mut uuid = [0u8; 16];
    std::fs::File::open(image)
        .unwrap()
        .read_exact_at(&mut uuid, 0x468)
        .unwrap();
    uuid
}

/// The names in `dir` (empty when it is absent).
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Forks and template starts on `isolated` are clones of the workspace's volume (no archive):
/// a live fork freezes its origin only while its blocks are copied (the origin takes writes
/// right after), a snapshot becomes a layer once and every later fork or template start clones
/// it. Each clone is a volume of its own: its files are its own uid's, a write in one is never
/// seen in another, and the quota holds in it (a fill past it fails with ENOSPC and the host
/// spends no more than the quota). A manager with another quota does not clone (the old limit
/// would come along) and falls back to an archive. Deleting the snapshot removes its layer;
/// destroy leaves no image, mount or layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forks_and_template_starts_are_clones_of_the_volume_that_keep_the_quota_and_share_nothing()
{
    use sessionbox_manager::{DEFAULT_TEMPLATE, ForkFrom, SnapshotConfig};
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(240, async {
        let env = env();
        let m = env
            .manager
            .clone()
            .with_snapshots(SnapshotConfig::new(env.data.join("snapshots")));
        let tenant = sessionbox_core::TenantId::new("default").unwrap();
        let origin = Env::conv("clone-origin");
        let o = m.open(&origin).await.unwrap();
        let r = sh(
            &o,
            "mkdir -p d/e && for i in $(seq 1 200); do printf 'file %s\\n' $i > d/e/f$i; done \
             && printf 'x\\000y\\377' > bin && chmod 640 bin && ln -s d/e/f1 link \
             && head -c 3000000 /dev/urandom > big \
             && python3 -c \"import os
for i in range(30): os.mkdir('n' * 200); os.chdir('n' * 200)
open('leaf', 'w').write('leaf')\" && sha256sum big",
        )
        .await;
        assert_eq!(r.status, sessionbox_core::ExitStatus::Code(0), "{r:?}");
        let big_sum = text(&r.stdout);
        drop(o);

        // A live fork: a clone.
        let live = Env::conv("clone-live");
        let stats = m
            .fork(&ForkFrom::Conversation(origin.id.clone()), &live)
            .await
            .unwrap();
        // Counted whole, past a path of 4,096 bytes (30 directories of 200-byte names).
        assert_eq!(
            (stats.files, stats.links, stats.directories),
            (203, 1, 32),
            "{stats:?}"
        );
        let (ok, lk) = (origin.key.clone(), live.key.clone());
        assert_ne!(image_of(&env, &ok), image_of(&env, &lk));
        assert!(
            mounted(&env.workspace(&lk)),
            "the fork has a volume of its own"
        );
        assert_eq!(
            fs_uuid(&image_of(&env, &ok)),
            fs_uuid(&image_of(&env, &lk)),
            "the fork's volume is a clone of the origin's"
        );
        // Its files are its own uid's, not the origin's.
        let l = m.open(&live).await.unwrap();
        let uid_live = env.uid(&lk);
        assert_ne!(uid_live, env.uid(&ok));
        let wrong = not_owned_by(&env.workspace(&lk), uid_live);
        assert!(wrong.is_empty(), "owned by another uid: {wrong:?}");
        assert_eq!(text(&sh(&l, "sha256sum big").await.stdout), big_sum);
        assert_eq!(l.read("bin").await.unwrap(), b"x\0y\xff");
        assert_eq!(l.stat("bin").await.unwrap().mode & 0o777, 0o640);
        // The origin was thawed: it takes writes at once.
        let o = m.open(&origin).await.unwrap();
        let started = Instant::now();
        let r = sh(&o, "echo origin-after > d/e/f1 && sync").await;
        assert_eq!(r.status, sessionbox_core::ExitStatus::Code(0), "{r:?}");
        assert!(
            started.elapsed() < B_BOUND,
            "the origin waited {:?}",
            started.elapsed()
        );
        sh(&l, "echo live-after > d/e/f2").await;
        assert_eq!(l.read("d/e/f1").await.unwrap(), b"file 1\n");
        assert_eq!(o.read("d/e/f2").await.unwrap(), b"file 2\n");
        // The quota holds in the clone: a fill past it fails, and its image stays within it.
        let r = sh(&l, "head -c 80000000 /dev/zero > fill; echo $?").await;
        assert_ne!(
            text(&r.stdout).trim(),
            "0",
            "a fill past the quota succeeded"
        );
        assert!(
            image_allocated(&env, &lk) <= QUOTA.0,
            "the clone's image took {} bytes",
            image_allocated(&env, &lk)
        );
        sh(&l, "rm -f fill").await;
        drop((l, o));

        // A snapshot becomes a layer on its first fork; the next fork and a template start
        // clone the same layer.
        let record = m.snapshot(&origin, "s1", None).await.unwrap();
        let layers = env.data.join("layers");
        assert!(
            names_in(&layers).is_empty(),
            "no layer before a fork needs one"
        );
        m.fork(&ForkFrom::Snapshot("s1".into()), &Env::conv("clone-s1"))
            .await
            .unwrap();
        assert_eq!(names_in(&layers), [format!("{}.img", record.id)]);
        let layer_uuid = fs_uuid(&layers.join(format!("{}.img", record.id)));
        assert_eq!(
            fs_uuid(&image_of(&env, &Env::conv("clone-s1").key)),
            layer_uuid,
            "the fork is a clone of the layer"
        );
        m.set_template(&tenant, DEFAULT_TEMPLATE, "s1")
            .await
            .unwrap();
        let t = m.open(&Env::conv("clone-templated")).await.unwrap();
        assert_eq!(t.read("d/e/f1").await.unwrap(), b"origin-after\n");
        let tk = t.key().clone();
        assert!(not_owned_by(&env.workspace(&tk), env.uid(&tk)).is_empty());
        assert_eq!(
            fs_uuid(&image_of(&env, &tk)),
            layer_uuid,
            "a clone of the layer"
        );
        drop(t);
        assert_eq!(
            names_in(&layers).len(),
            1,
            "one layer serves every clone of s1"
        );

        // Another quota: no clone (the fork gets the new quota from an archive).
        let (other, _) = env.another_manager_with_disk(Some((80 * MIB, 2000)));
        let other = other.with_snapshots(SnapshotConfig::new(env.data.join("snapshots")));
        let resized = Env::conv("clone-resized");
        other
            .fork(&ForkFrom::Conversation(origin.id.clone()), &resized)
            .await
            .unwrap();
        assert_eq!(
            std::fs::metadata(image_of(&env, &resized.key))
                .unwrap()
                .len(),
            80 * MIB,
            "the fork has the quota of the manager that made it"
        );
        assert_ne!(
            fs_uuid(&image_of(&env, &resized.key)),
            fs_uuid(&image_of(&env, &origin.key)),
            "made anew, not cloned"
        );

        // The same bytes but fewer inodes: no clone either (the image records its quota).
        let (fewer, _) = env.another_manager_with_disk(Some((QUOTA.0, QUOTA.1 / 2)));
        let fewer = fewer.with_snapshots(SnapshotConfig::new(env.data.join("snapshots")));
        let thin = Env::conv("clone-fewer-inodes");
        fewer
            .fork(&ForkFrom::Conversation(origin.id.clone()), &thin)
            .await
            .unwrap();
        assert_ne!(
            fs_uuid(&image_of(&env, &thin.key)),
            fs_uuid(&image_of(&env, &origin.key)),
            "made anew with the new inode count, not cloned"
        );
        let usage = fewer
            .runtime()
            .disk_usage(&thin.key)
            .await
            .unwrap()
            .unwrap();
        assert!(usage.inodes_limit < QUOTA.1, "{usage:?}");
        fewer.destroy(&thin).await.unwrap();

        // The snapshot's layer goes with it; destroy leaves nothing behind.
        m.remove_template(&tenant, DEFAULT_TEMPLATE).await.unwrap();
        assert!(m.delete_snapshot(&tenant, "s1").await.unwrap());
        assert!(names_in(&layers).is_empty(), "{:?}", names_in(&layers));
        for id in [
            "clone-origin",
            "clone-live",
            "clone-s1",
            "clone-templated",
            "clone-resized",
        ] {
            m.destroy(&Env::conv(id)).await.unwrap();
        }
        assert!(
            names_in(&env.data.join("disks")).is_empty(),
            "{:?}",
            names_in(&env.data.join("disks"))
        );
        assert!(names_in(&env.data.join("workspaces")).is_empty());
    })
    .await;
}

/// A layer whose snapshot is gone (a crash between the record's removal and the layer's) is
/// removed by garbage collection; one whose snapshot exists is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn garbage_collection_removes_layers_whose_snapshot_is_gone() {
    use sessionbox_core::WorkspaceClones;
    use sessionbox_manager::{ForkFrom, GcOptions, SnapshotConfig};
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(180, async {
        let env = env();
        let m = env
            .manager
            .clone()
            .with_snapshots(SnapshotConfig::new(env.data.join("snapshots")));
        let origin = Env::conv("layer-origin");
        let o = m.open(&origin).await.unwrap();
        sh(&o, "echo kept > kept").await;
        drop(o);
        let record = m.snapshot(&origin, "s1", None).await.unwrap();
        m.fork(&ForkFrom::Snapshot("s1".into()), &Env::conv("layer-fork"))
            .await
            .unwrap();
        // An orphan: a layer made for a snapshot id no record has.
        let tmp = tempfile::tempdir().unwrap();
        let tar = tmp.path().join("a.tar");
        let empty = tmp.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        sessionbox_fs::Workspace::open(&empty, "/w", sessionbox_core::Limits::default())
            .unwrap()
            .archive(std::fs::File::create(&tar).unwrap())
            .unwrap();
        assert!(env.runtime.make_layer("orphan", &tar).await.unwrap());
        let layers = env.data.join("layers");
        assert_eq!(
            names_in(&layers),
            [format!("{}.img", record.id), "orphan.img".to_owned()]
        );
        let bad = env.runtime.make_layer("../escape", &tar).await.unwrap_err();
        assert_eq!(bad.code(), "invalid_request", "{bad}");
        m.collect_garbage(GcOptions::default()).await.unwrap();
        assert_eq!(names_in(&layers), [format!("{}.img", record.id)]);
        for id in ["layer-origin", "layer-fork"] {
            m.destroy(&Env::conv(id)).await.unwrap();
        }
        assert!(m.delete_snapshot(&record.tenant, "s1").await.unwrap());
        assert!(names_in(&layers).is_empty());
    })
    .await;
}

/// Attack: a background command in the origin holds a write open for as long as it likes (a
/// `splice` from a pipe nobody writes to, into a workspace file), which would keep a freeze of
/// the origin's file system waiting forever, and with it every snapshot slot of the host. The
/// fork stops the origin's processes first (a signal ends that wait), so it finishes at once,
/// and afterwards the origin takes writes and its command is still there, continued.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_held_open_in_the_origin_does_not_hold_a_live_fork() {
    use sessionbox_manager::{ForkFrom, SnapshotConfig};
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(120, async {
        let env = env();
        let m = env
            .manager
            .clone()
            .with_snapshots(SnapshotConfig::new(env.data.join("snapshots")));
        let origin = Env::conv("held-origin");
        let o = m.open(&origin).await.unwrap();
        sh(&o, "echo before > kept").await;
        let spawned = o
            .spawn(ExecRequest::new(
                "exec python3 -c \"import os; r, w = os.pipe(); \
                 f = os.open('held', os.O_WRONLY | os.O_CREAT); os.splice(r, f, 4096)\"",
            ))
            .await
            .unwrap();
        // Until the splice is waiting in the kernel.
        let record = env.record(&origin.key);
        assert!(
            eventually(10.0, || record
                .members()
                .iter()
                .any(|p| p.cmdline.contains("splice") && p.state == 'S'))
            .await,
            "the splice never started"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(o);
        let started = Instant::now();
        let stats = bounded(
            30,
            m.fork(
                &ForkFrom::Conversation(origin.id.clone()),
                &Env::conv("held-fork"),
            ),
        )
        .await
        .unwrap();
        assert!(stats.files >= 2, "{stats:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "took {:?}",
            started.elapsed()
        );
        let o = m.open(&origin).await.unwrap();
        let r = bounded(10, sh(&o, "echo after > kept && cat kept")).await;
        assert_eq!(text(&r.stdout), "after\n");
        // The command was continued, not killed: still running.
        let c = o.command(&spawned.id).await.unwrap();
        assert!(c.running, "{c:?}");
        assert!(
            !env.data
                .join("run")
                .join(origin.key.as_str())
                .join("paused")
                .exists(),
            "the record of the pause is gone"
        );
        drop(o);
        for id in ["held-origin", "held-fork"] {
            m.destroy(&Env::conv(id)).await.unwrap();
        }
    })
    .await;
}

/// A fork killed while it had its origin stopped and frozen (SIGKILL, the OOM killer, Ctrl-C of
/// the CLI) leaves a record of what it stopped: the next open of the origin thaws it and
/// continues its processes, and a destroy does the same before unmounting, so no frozen file
/// system keeps its loop device (and its deleted image's space) forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fork_that_died_mid_clone_leaves_its_origin_usable_and_destroyable() {
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(120, async {
        let env = env();
        let freeze = |ws: &Path, pids: &std::collections::BTreeSet<u32>, run: &Path| {
            // What the dead fork left: its record, the processes stopped, the volume frozen.
            let list: Vec<String> = pids.iter().map(u32::to_string).collect();
            std::fs::write(run.join("paused"), list.join("\n")).unwrap();
            for p in pids {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(*p as i32).unwrap(),
                    rustix::process::Signal::STOP,
                );
            }
            let ok = std::process::Command::new("fsfreeze")
                .arg("-f")
                .arg(ws)
                .status()
                .unwrap()
                .success();
            assert!(ok, "fsfreeze");
        };
        let a = Env::conv("dead-fork-a");
        let s = env.open("dead-fork-a").await;
        sh(&s, "echo one > f").await;
        drop(s);
        let (ws, run) = (env.workspace(&a.key), env.run_dir(&a.key));
        freeze(&ws, &env.record(&a.key).procs(), &run);
        let s = bounded(20, env.manager.open(&a)).await.unwrap();
        let r = bounded(10, sh(&s, "echo two > f && cat f")).await;
        assert_eq!(text(&r.stdout), "two\n");
        assert!(!run.join("paused").exists());
        drop(s);

        // Frozen again, then destroyed: thawed first, so the volume and its loop device go.
        freeze(&ws, &env.record(&a.key).procs(), &run);
        let image = image_of(&env, &a.key);
        bounded(30, env.manager.destroy(&a)).await.unwrap();
        assert!(!image.exists());
        let image_name = image.file_name().unwrap().to_string_lossy().into_owned();
        let gone = eventually(10.0, || {
            let out = std::process::Command::new("losetup")
                .arg("-l")
                .output()
                .unwrap();
            !text(&out.stdout).contains(&image_name)
        })
        .await;
        assert!(gone, "a loop device still holds the destroyed volume");
    })
    .await;
}
