//! `sessionbox_process` against real processes.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them).
#![allow(clippy::unwrap_used)]

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

use sessionbox_core::{BASE_PATH, ExecRequest, ExecResult, ExitStatus};
use sessionbox_process::{DRAIN_DEADLINE, Spawn, Stream, kill_all, processes_under, run};

/// Runs `req` in `dir` with HOME=/workspace.
async fn run_in(dir: &Path, req: &ExecRequest) -> ExecResult {
    let cwd = File::open(dir).unwrap();
    run(Spawn::new(req, cwd.as_fd(), "/workspace"), None)
        .await
        .unwrap()
}

async fn run_here(req: &ExecRequest) -> (tempfile::TempDir, ExecResult) {
    let dir = tempfile::tempdir().unwrap();
    let r = run_in(dir.path(), req).await;
    (dir, r)
}

fn text(b: &[u8]) -> &str {
    std::str::from_utf8(b).unwrap()
}

/// True when `pid` no longer exists or is a zombie.
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            // "pid (comm) S ...": the state follows the last ')'.
            let state = stat.rsplit(')').next().unwrap().trim_start();
            state.starts_with('Z') || state.starts_with('X')
        }
    }
}

/// Waits up to 3 s for `pid` to die.
async fn gone(pid: u32) -> bool {
    for _ in 0..300 {
        if dead(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

fn vm_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn exit_codes_and_signals_are_reported() {
    let (_d, r) = run_here(&ExecRequest::new("exit 3")).await;
    assert_eq!(r.status, ExitStatus::Code(3));
    assert!(!r.timed_out);
    let (_d, r) = run_here(&ExecRequest::new("true")).await;
    assert!(r.success());
    let (_d, r) = run_here(&ExecRequest::new("kill -9 $$")).await;
    assert_eq!(r.status, ExitStatus::Signal(9));
    assert_eq!(r.shell_exit_code(), 137);
}

#[tokio::test]
async fn stdout_and_stderr_are_kept_apart_and_streamed() {
    let req = ExecRequest::new("echo out; echo err >&2; echo out2");
    let dir = tempfile::tempdir().unwrap();
    let cwd = File::open(dir.path()).unwrap();
    let mut seen: Vec<(Stream, Vec<u8>)> = Vec::new();
    let mut cb = |s: Stream, b: &[u8]| seen.push((s, b.to_vec()));
    let r = run(Spawn::new(&req, cwd.as_fd(), "/workspace"), Some(&mut cb))
        .await
        .unwrap();
    assert_eq!(text(&r.stdout), "out\nout2\n");
    assert_eq!(text(&r.stderr), "err\n");
    assert!(!r.stdout_truncated && !r.stderr_truncated);
    let streamed = |want: Stream| -> Vec<u8> {
        seen.iter()
            .filter(|(s, _)| *s == want)
            .flat_map(|(_, b)| b.clone())
            .collect()
    };
    assert_eq!(streamed(Stream::Stdout), r.stdout);
    assert_eq!(streamed(Stream::Stderr), r.stderr);
}

#[tokio::test]
async fn stdin_is_passed_through_and_a_big_one_does_not_deadlock() {
    let (_d, r) = run_here(&ExecRequest::new("tr a-z A-Z").stdin("hello\n")).await;
    assert_eq!(text(&r.stdout), "HELLO\n");

    // The most stdin a request may carry (1 MiB), echoed out: far more than a pipe buffer
    // (64 KiB) both ways.
    let big: Vec<u8> = (0..sessionbox_core::MAX_STDIN_BYTES)
        .map(|i| b'a' + (i % 26) as u8)
        .collect();
    let req = ExecRequest::new("cat")
        .stdin(big.clone())
        .output_limit(8 * 1024 * 1024)
        .timeout(Duration::from_secs(30));
    let (_d, r) = run_here(&req).await;
    assert!(!r.timed_out);
    assert_eq!(r.stdout.len(), big.len());
    assert!(r.stdout == big);

    // No stdin: /dev/null, so a reader sees EOF at once.
    let (_d, r) = run_here(&ExecRequest::new("wc -c")).await;
    assert_eq!(text(&r.stdout).trim(), "0");

    // A command that ignores its stdin does not make the call fail.
    let (_d, r) = run_here(&ExecRequest::new("exit 0").stdin(big)).await;
    assert!(r.success());
}

#[tokio::test]
async fn the_working_directory_is_the_given_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("sub dir");
    std::fs::create_dir(&sub).unwrap();
    let r = run_in(&sub, &ExecRequest::new("pwd; ls")).await;
    let want = std::fs::canonicalize(&sub).unwrap();
    assert_eq!(text(&r.stdout), format!("{}\n", want.display()));
}

#[tokio::test]
async fn the_environment_is_the_base_one_plus_the_request() {
    // SAFETY: no other test reads or writes the environment concurrently; a variable with this
    // name is set only here.
    unsafe { std::env::set_var("SESSIONBOX_TEST_SECRET", "hunter2") };
    let req = ExecRequest::new("env").env("EXTRA", "yes");
    let (_d, r) = run_here(&req).await;
    let env = text(&r.stdout);
    assert!(!env.contains("SESSIONBOX_TEST_SECRET"), "{env}");
    assert!(!env.contains("hunter2"), "{env}");
    let mut lines: Vec<&str> = env
        .lines()
        // Variables the shell sets itself.
        .filter(|l| !l.starts_with("PWD=") && !l.starts_with("SHLVL=") && !l.starts_with("_="))
        .collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "EXTRA=yes",
            "HOME=/workspace",
            "LANG=C.UTF-8",
            &format!("PATH={BASE_PATH}"),
            "TERM=dumb"
        ]
    );
}

#[tokio::test]
async fn a_timeout_kills_the_whole_group_grandchildren_too() {
    let dir = tempfile::tempdir().unwrap();
    let req = ExecRequest::new("sh -c 'sleep 1000 & echo $! > pidfile; wait'")
        .timeout(Duration::from_secs(1));
    let t = Instant::now();
    let r = run_in(dir.path(), &req).await;
    let took = t.elapsed();
    assert!(r.timed_out);
    assert_eq!(r.shell_exit_code(), 124);
    // SIGTERM ended it, well before the 2 s grace ran out.
    assert_eq!(r.status, ExitStatus::Signal(15));
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(took < Duration::from_millis(2500), "{took:?}");
    let pid: u32 = std::fs::read_to_string(dir.path().join("pidfile"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(gone(pid).await, "grandchild {pid} survived the timeout");
}

#[tokio::test]
async fn sigterm_is_followed_by_sigkill_after_the_grace() {
    // The shell and its sleep ignore SIGTERM (an ignored signal stays ignored across exec).
    let req = ExecRequest::new("trap '' TERM; sleep 1000; echo never")
        .timeout(Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    let cwd = File::open(dir.path()).unwrap();
    let mut spawn = Spawn::new(&req, cwd.as_fd(), "/workspace");
    spawn.kill_grace = Duration::from_millis(700);
    let t = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(10), run(spawn, None))
        .await
        .expect("SIGKILL never came")
        .unwrap();
    let took = t.elapsed();
    assert!(r.timed_out);
    assert_eq!(r.status, ExitStatus::Signal(9));
    assert!(took >= Duration::from_millis(1000), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(r.stdout.is_empty());
}

#[tokio::test]
async fn a_background_child_dies_with_the_shell() {
    let t = Instant::now();
    let (_d, r) = run_here(&ExecRequest::new("sleep 1000 & echo $!")).await;
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(r.success());
    // Killed as soon as the shell exited, not left for the drain deadline to run out.
    assert!(r.duration < DRAIN_DEADLINE, "{:?}", r.duration);
    let pid: u32 = text(&r.stdout).trim().parse().unwrap();
    assert!(gone(pid).await, "background child {pid} outlived the call");
}

#[tokio::test]
async fn a_process_that_left_the_group_cannot_hold_the_call_open() {
    // setsid leaves the group yet keeps stdout open: the call must not wait for it.
    let t = Instant::now();
    let (dir, r) = run_here(&ExecRequest::new(
        "setsid sh -c 'echo $$ > pid; exec sleep 1000' & \
         while [ ! -s pid ]; do sleep 0.01; done; cat pid",
    ))
    .await;
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let pid: u32 = text(&r.stdout).trim().parse().unwrap();
    assert!(!dead(pid), "the escaped process should still be running");
    // It works in the workspace, so the teardown helpers find and kill it.
    assert!(processes_under(dir.path()).contains(&pid));
    assert_eq!(kill_all(&[pid]), 1);
    assert!(gone(pid).await);
}

#[tokio::test]
async fn an_output_bomb_is_capped_and_drained_in_bounded_memory() {
    let before = vm_rss_kib();
    let req = ExecRequest::new("head -c 2G /dev/zero; echo done >&2")
        .output_limit(1024 * 1024)
        .timeout(Duration::from_secs(120));
    let (_d, r) = run_here(&req).await;
    let after = vm_rss_kib();
    assert!(r.success(), "{r:?}");
    assert_eq!(r.stdout.len(), 1024 * 1024);
    assert!(r.stdout.iter().all(|b| *b == 0));
    assert!(r.stdout_truncated);
    // stderr came after 2 GiB of stdout: the stream was drained, not abandoned.
    assert_eq!(text(&r.stderr), "done\n");
    assert!(!r.stderr_truncated);
    assert!(
        after.saturating_sub(before) < 64 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
}

#[tokio::test]
async fn an_inherited_descriptor_is_not_visible_to_the_command() {
    let file = tempfile::tempfile().unwrap();
    // A descriptor at 700 or above without close-on-exec.
    // SAFETY: F_DUPFD on a valid descriptor; the new one is wrapped and closed below.
    let raw = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD, 700) };
    assert!(raw >= 700);
    // SAFETY: `raw` was just returned by fcntl and is owned by nothing else.
    let leaky = unsafe { OwnedFd::from_raw_fd(raw) };
    let flags = rustix::io::fcntl_getfd(leaky.as_fd()).unwrap();
    assert!(!flags.contains(rustix::io::FdFlags::CLOEXEC));

    // Control: a plain spawn does pass it on.
    let plain = std::process::Command::new("ls")
        .arg("/proc/self/fd")
        .output()
        .unwrap();
    assert!(
        text(&plain.stdout).lines().any(|l| l == raw.to_string()),
        "{}",
        text(&plain.stdout)
    );

    let (_d, r) = run_here(&ExecRequest::new("ls /proc/self/fd")).await;
    let fds: Vec<&str> = text(&r.stdout).lines().collect();
    assert!(!fds.contains(&raw.to_string().as_str()), "{fds:?}");
    // 0, 1, 2 and the directory ls itself opened.
    assert_eq!(fds.len(), 4, "{fds:?}");
    assert_eq!(&fds[..3], ["0", "1", "2"]);
    drop(leaky);
}

#[tokio::test]
async fn processes_under_finds_only_processes_inside_and_kill_all_kills_them() {
    let inside = tempfile::tempdir().unwrap();
    let deep = inside.path().join("a/b");
    std::fs::create_dir_all(&deep).unwrap();
    let outside = tempfile::tempdir().unwrap();
    // A sibling whose name extends the directory's: not beneath it.
    let sibling = format!("{}x", inside.path().display());
    std::fs::create_dir(&sibling).unwrap();

    let mut a = std::process::Command::new("sleep")
        .arg("1000")
        .current_dir(&deep)
        .spawn()
        .unwrap();
    let mut b = std::process::Command::new("sleep")
        .arg("1000")
        .current_dir(outside.path())
        .spawn()
        .unwrap();
    let mut c = std::process::Command::new("sleep")
        .arg("1000")
        .current_dir(&sibling)
        .spawn()
        .unwrap();

    let found = processes_under(inside.path());
    assert!(found.contains(&a.id()), "{found:?}");
    assert!(!found.contains(&b.id()), "{found:?}");
    assert!(!found.contains(&c.id()), "{found:?}");
    assert!(!found.contains(&std::process::id()));

    assert_eq!(kill_all(&found), found.len());
    assert_eq!(a.wait().unwrap().signal(), Some(9));
    // Never the caller itself, nor pid 0 (its own group).
    assert_eq!(kill_all(&[0, std::process::id()]), 0);

    for p in [&mut b, &mut c] {
        assert!(p.try_wait().unwrap().is_none(), "killed a process outside");
        p.kill().unwrap();
        p.wait().unwrap();
    }
    std::fs::remove_dir(&sibling).unwrap();
}

#[tokio::test]
async fn bad_requests_and_spawn_failures_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = File::open(dir.path()).unwrap();
    let bad = ExecRequest::new("true").timeout(Duration::ZERO);
    let e = run(Spawn::new(&bad, cwd.as_fd(), "/w"), None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "invalid_request");

    // A regular file as the working directory: fchdir fails in the child, spawn reports it.
    let file = File::create(dir.path().join("f")).unwrap();
    let ok = ExecRequest::new("true");
    let e = run(Spawn::new(&ok, file.as_fd(), "/w"), None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "backend_error");
    assert!(e.to_string().contains("could not start"), "{e}");
}
