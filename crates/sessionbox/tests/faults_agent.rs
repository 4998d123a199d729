//! Fault injection on the `isolated` runtime (issue 25): the in-sandbox agent of one
//! conversation is killed (`SIGKILL` from the host, the process found through the sandbox's
//! record and `/proc`) while a foreground command streams its output, while a background
//! command runs, and while a large file write or a workspace archive is being uploaded.
//!
//! Each test checks what the caller sees (a typed error within a bound, never a hang), that
//! every write acknowledged before the kill is intact and a partial upload is never visible
//! (the old content or the whole new one, and no temporary file left in the workspace), that
//! the next call on the same session launches a new sandbox that sees the workspace, that a
//! second conversation runs on undisturbed throughout, and that destroy then leaves nothing:
//! no process, cgroup, mount, disk image, run directory, workspace or store record.
//!
//! They need root (CI runs them as root); without it each prints SKIPPED and passes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sessionbox_core::{ConversationKey, ExecRequest, OutputRequest, Session};
use sessionbox_manager::{Conversation, GcOptions};

use crate::support::*;

macro_rules! needs_root {
    () => {
        if !is_root() {
            eprintln!("SKIPPED: isolated runtime tests need root (CI runs them as root)");
            return;
        }
    };
}

/// How long a call may take to report that the agent died under it.
const FAIL_BOUND: Duration = Duration::from_secs(5);

/// Kills the conversation's agent with `SIGKILL`; returns it.
fn kill_agent(env: &Env, key: &ConversationKey) -> Proc {
    let agent = env.record(key).agent().expect("the agent runs");
    signal(agent.pid, rustix::process::Signal::KILL);
    agent
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(pid, sig).unwrap();
}

/// The second conversation's command, run while the first one's agent is killed: it prints
/// `1` to `n`, one every 50 ms, and must finish with all of them.
async fn bystander(other: &Conversation, n: u32) -> (Duration, String) {
    let t = Instant::now();
    let r = other
        .exec(
            ExecRequest::new(format!(
                "for i in $(seq 1 {n}); do echo $i; sleep 0.05; done"
            ))
            .timeout(Duration::from_secs(60)),
        )
        .await
        .expect("the other conversation's command");
    assert!(r.success(), "{r:?}");
    (t.elapsed(), text(&r.stdout))
}

fn seq(n: u32) -> String {
    (1..=n).map(|i| format!("{i}\n")).collect()
}

/// Temporary files of atomic writes (`.NAME.sbx-tmp-*`) anywhere in the workspace, from the
/// host.
fn temporaries(dir: &Path) -> Vec<PathBuf> {
    tree(dir)
        .into_keys()
        .filter(|p| p.to_string_lossy().contains(".sbx-tmp-"))
        .collect()
}

/// True while process `pid` holds a file being written atomically open: an unnamed temporary
/// file (its descriptor's link reads `/dir/#INODE (deleted)`) or a named one (`.sbx-tmp-`).
fn writing_a_file(pid: u32) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|to| {
            let to = to.to_string_lossy();
            to.contains(".sbx-tmp-") || (to.contains("/#") && to.ends_with(" (deleted)"))
        })
    })
}

/// Destroys `id` and checks that nothing of it is left on the host or in the store: no
/// process of any sandbox it had (`records`), no cgroup, no mount of its volume, no disk
/// image, run directory or workspace, no record.
async fn destroy_leaves_nothing(env: &Env, id: &str, records: &[Record]) {
    let key = Env::conv(id).key;
    let uid = env.uid(&key);
    let workspace = env.workspace(&key);
    let out = env.manager.destroy(&Env::conv(id)).await.unwrap();
    assert!(
        out.record_removed && out.runtime.workspace_removed,
        "{out:?}"
    );
    for rec in records {
        assert!(
            eventually(3.0, || rec.members().is_empty()).await,
            "{id}: left running: {:?}",
            rec.members()
        );
        for c in &rec.cgroups {
            assert!(!c.exists(), "{id}: cgroup {} is left", c.display());
        }
    }
    assert!(
        conversation_processes(&records[0].name(), uid).is_empty(),
        "{id}: processes of its uid are left"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&*workspace.to_string_lossy()),
        "{id}: its volume is still mounted"
    );
    assert!(!workspace.exists() && !env.run_dir(&key).exists());
    assert!(!env.data.join("disks").join(format!("{key}.img")).exists());
    assert!(env.manager.store().get(&key).unwrap().is_none());
}

/// A collection over the data directory finds nothing to remove: no orphan, nothing dangling.
async fn gc_finds_nothing(env: &Env) {
    let report = env
        .manager
        .collect_garbage(GcOptions {
            dry_run: true,
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(report.found(), 0, "{report:?}");
}

/// The agent is killed while a foreground command streams its output. The caller's call fails
/// at once with a typed `backend_error` that says the agent ended during the command (after
/// the output it had streamed), the command's processes are gone with the sandbox, the files
/// written before are intact, the same session's next call launches a new sandbox that sees
/// them, and a second conversation's command ran on to its end meanwhile with all its output.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_killed_mid_command_fails_it_typed_and_the_next_call_recovers() {
    needs_root!();
    bounded(90, async {
        let env = Env::new(60);
        let a = env.open("fg-a").await;
        let b = env.open("fg-b").await;
        let key = a.key().clone();
        a.write("acked.txt", b"acknowledged\n").await.unwrap();
        assert!(sh(&a, "mkdir -p d && echo kept > d/f").await.success());
        let rec = env.record(&key);
        let b_rec = env.record(b.key());
        let b_agent = b_rec.agent().unwrap();

        let lines = Arc::new(AtomicUsize::new(0));
        let seen = lines.clone();
        let mut streamed = Vec::new();
        let mut sink = |_: sessionbox_core::OutputStream, bytes: &[u8]| {
            streamed.extend_from_slice(bytes);
            seen.fetch_add(
                bytes.iter().filter(|b| **b == b'\n').count(),
                Ordering::SeqCst,
            );
        };
        let mut killed_at = None;
        let (result, (b_took, b_out), ()) = tokio::join!(
            a.exec_stream(
                ExecRequest::new("i=0; while :; do echo line $i; i=$((i+1)); sleep 0.02; done")
                    .timeout(Duration::from_secs(60)),
                &mut sink,
            ),
            bystander(&b, 40),
            async {
                assert!(eventually(20.0, || lines.load(Ordering::SeqCst) >= 5).await);
                kill_agent(&env, &key);
                killed_at = Some(Instant::now());
            }
        );
        let failed_after = killed_at.unwrap().elapsed();
        let e = result.expect_err("the command cannot have ended normally");
        assert_eq!(e.code(), "backend_error", "{e}");
        let msg = e.to_string();
        assert!(msg.contains("agent") && msg.contains("ended"), "{msg}");
        assert!(failed_after < FAIL_BOUND, "failed after {failed_after:?}");
        let streamed = text(&streamed);
        assert!(streamed.starts_with("line 0\nline 1\n"), "{streamed}");
        // Nothing of the old sandbox runs on: the command went with it.
        assert!(
            eventually(3.0, || rec.members().is_empty()).await,
            "{:?}",
            rec.members()
        );

        // The same session recovers: a new sandbox, the workspace as it was.
        let r = sh(&a, "cat acked.txt d/f").await;
        assert_eq!(text(&r.stdout), "acknowledged\nkept\n");
        let rec2 = env.record(&key);
        assert_ne!(rec2, rec, "no new sandbox was launched");
        // The other conversation never noticed.
        assert_eq!(b_out, seq(40));
        assert!(b_took < Duration::from_secs(10), "{b_took:?}");
        let b_now = env.record(b.key()).agent().unwrap();
        assert_eq!((b_now.pid, b_now.start), (b_agent.pid, b_agent.start));
        gc_finds_nothing(&env).await;
        drop((a, b));
        destroy_leaves_nothing(&env, "fg-a", &[rec, rec2]).await;
        destroy_leaves_nothing(&env, "fg-b", &[b_rec]).await;
    })
    .await;
}

/// The agent is killed while a background command runs. Background commands live as long as
/// their sandbox: the command is gone with it (its processes too), and asking for it afterwards
/// is a typed `not_found`, not a hang or a stale answer; the output already read was the
/// command's, the workspace is intact, and a new background command runs in the new sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_killed_under_a_background_command_ends_it_and_it_is_not_found_after() {
    needs_root!();
    bounded(90, async {
        let env = Env::new(60);
        let a = env.open("bg-a").await;
        let key = a.key().clone();
        a.write("acked.txt", b"acknowledged\n").await.unwrap();
        let cmd = a
            .spawn(
                ExecRequest::new("i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.02; done")
                    .timeout(Duration::from_secs(60)),
            )
            .await
            .unwrap();
        let mut out = Vec::new();
        let until = Instant::now() + Duration::from_secs(20);
        while !text(&out).contains("tick 3\n") && Instant::now() < until {
            let read = OutputRequest {
                stdout_from: out.len() as u64,
                wait: Duration::from_millis(200),
                ..OutputRequest::from_start()
            };
            out.extend(a.command_output(&cmd.id, read).await.unwrap().stdout);
        }
        assert!(text(&out).starts_with("tick 0\ntick 1\ntick 2\ntick 3\n"));
        let rec = env.record(&key);
        let shell = rec
            .members()
            .into_iter()
            .find(|p| p.cmdline.contains("tick"))
            .expect("the background command's shell");
        kill_agent(&env, &key);

        let t = Instant::now();
        let e = a.command(&cmd.id).await.expect_err("the command ended");
        assert!(t.elapsed() < FAIL_BOUND, "{:?}", t.elapsed());
        assert_eq!(e.code(), "not_found", "{e}");
        assert!(e.to_string().contains("end with its agent"), "{e}");
        assert!(
            !shell.alive(),
            "the background command outlived its sandbox"
        );
        assert!(a.commands().await.unwrap().is_empty());
        let e = a
            .command_output(&cmd.id, OutputRequest::from_start())
            .await
            .expect_err("no output of a command the sandbox no longer has");
        assert_eq!(e.code(), "not_found", "{e}");
        assert_eq!(a.read("acked.txt").await.unwrap(), b"acknowledged\n");
        let again = a
            .spawn(ExecRequest::new("echo again").timeout(Duration::from_secs(10)))
            .await
            .unwrap();
        let read = OutputRequest {
            wait: Duration::from_secs(5),
            ..OutputRequest::from_start()
        };
        assert_eq!(
            a.command_output(&again.id, read).await.unwrap().stdout,
            b"again\n"
        );
        let rec2 = env.record(&key);
        assert_ne!(rec2, rec);
        gc_finds_nothing(&env).await;
        drop(a);
        destroy_leaves_nothing(&env, "bg-a", &[rec, rec2]).await;
    })
    .await;
}

/// 32 MiB depending on `seed`: 1 MiB of noise, each copy of it numbered.
fn payload(seed: u8) -> Vec<u8> {
    let block: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed)
        .collect();
    let mut data = Vec::with_capacity(32 << 20);
    for n in 0..32u8 {
        data.extend_from_slice(&block);
        data[(n as usize) << 20] = n;
    }
    data
}

/// The agent is killed while a large file write is in flight, twice: once while the request
/// is still being sent (the agent stopped with `SIGSTOP` first, so the body is still in the
/// socket), once while the agent writes the file to disk (its temporary file seen open in the
/// agent's descriptors, from the host). Either way the file is never seen half written: the call either succeeds (the
/// request never fully reached the dead agent, so it is sent again to the new one) with the
/// whole new content in place, or fails typed with the old content in place; and no
/// temporary file is left in the workspace. A second conversation is not disturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_killed_mid_upload_leaves_the_old_file_or_the_whole_new_one_and_no_temporary() {
    needs_root!();
    bounded(120, async {
        let env = Env::new(60);
        let a = env.open("up-a").await;
        let b = env.open("up-b").await;
        let key = a.key().clone();
        let ws = env.workspace(&key);
        let old = b"the acknowledged old content\n".to_vec();
        let mut records = Vec::new();
        for (round, seed) in [("in the socket", 1u8), ("while written", 2)] {
            a.write("big.bin", &old).await.unwrap();
            let rec = env.record(&key);
            let agent = rec.agent().unwrap();
            let new = payload(seed);
            let mut killed = false;
            let (result, (_, b_out), ()) =
                tokio::join!(a.write("big.bin", &new), bystander(&b, 20), async {
                    if round == "in the socket" {
                        signal(agent.pid, rustix::process::Signal::STOP);
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        signal(agent.pid, rustix::process::Signal::KILL);
                        killed = true;
                    } else {
                        let until = Instant::now() + Duration::from_secs(20);
                        while Instant::now() < until {
                            if writing_a_file(agent.pid) {
                                signal(agent.pid, rustix::process::Signal::KILL);
                                killed = true;
                                break;
                            }
                            tokio::time::sleep(Duration::from_micros(200)).await;
                        }
                    }
                });
            assert!(killed, "{round}: the write was never seen in flight");
            assert_eq!(b_out, seq(20), "{round}");
            let now = a.read("big.bin").await.unwrap();
            match &result {
                Ok(()) => assert!(now == new, "{round}: acknowledged, but not all there"),
                Err(e) => {
                    assert_eq!(e.code(), "backend_error", "{round}: {e}");
                    assert!(now == old, "{round}: failed, but the file changed");
                }
            }
            eprintln!("{round}: {:?}", result.as_ref().map_err(|e| e.to_string()));
            assert_eq!(temporaries(&ws), Vec::<PathBuf>::new(), "{round}");
            assert_ne!(env.record(&key), rec, "{round}: no new sandbox");
            records.push(rec);
        }
        records.push(env.record(&key));
        let b_rec = env.record(b.key());
        gc_finds_nothing(&env).await;
        drop((a, b));
        destroy_leaves_nothing(&env, "up-a", &records).await;
        destroy_leaves_nothing(&env, "up-b", &[b_rec]).await;
    })
    .await;
}

/// The agent is killed while a workspace archive is uploaded into the conversation (a
/// restore, as a snapshot restore or a fork sends it): the body still in the socket. The
/// workspace is then either the archive's whole content (the upload, which never reached the
/// dead agent, was sent again to a new one) or, on a typed error, what it was: never a mix.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_killed_mid_archive_upload_leaves_the_old_workspace_or_the_whole_archive() {
    needs_root!();
    bounded(120, async {
        let env = Env::new(60);
        // The archive: another conversation's workspace, 24 files of 1 MiB.
        let src = env.open("ar-src").await;
        let made = sh(
            &src,
            "for i in $(seq 1 24); do head -c 1048576 /dev/urandom > f$i; done; echo new > marker",
        )
        .await;
        assert!(made.success(), "{made:?}");
        let dir = tempfile::tempdir().unwrap();
        let tar = dir.path().join("ws.tar");
        src.archive_workspace(&tar, 1 << 30).await.unwrap();
        let want = text(&sh(&src, "cat f* marker | md5sum").await.stdout);
        let src_rec = env.record(src.key());
        drop(src);

        let a = env.open("ar-a").await;
        let key = a.key().clone();
        assert!(
            sh(&a, "echo old > marker && echo only-old > old.txt")
                .await
                .success()
        );
        let rec = env.record(&key);
        let agent = rec.agent().unwrap();
        signal(agent.pid, rustix::process::Signal::STOP);
        let killer = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            signal(agent.pid, rustix::process::Signal::KILL);
        };
        let (result, ()) = tokio::join!(a.restore_workspace(&tar), killer);
        let listing = text(&sh(&a, "ls").await.stdout);
        match &result {
            Ok(_) => {
                let got = text(&sh(&a, "cat f* marker | md5sum").await.stdout);
                assert_eq!(got, want, "restored, but not all of it: {listing}");
                assert!(!listing.contains("old.txt"), "{listing}");
            }
            Err(e) => {
                assert_eq!(e.code(), "backend_error", "{e}");
                assert_eq!(listing, "marker\nold.txt\n", "failed, but changed");
            }
        }
        assert_eq!(temporaries(&env.workspace(&key)), Vec::<PathBuf>::new());
        let rec2 = env.record(&key);
        assert_ne!(rec2, rec);
        gc_finds_nothing(&env).await;
        drop(a);
        destroy_leaves_nothing(&env, "ar-a", &[rec, rec2]).await;
        destroy_leaves_nothing(&env, "ar-src", &[src_rec]).await;
    })
    .await;
}
