//! Background commands of the `host` runtime, with real supervisors (this test binary is also
//! a supervisor, through [`supervisor_entry`], as the `sessionbox` binary is) and real
//! processes: exact output kept apart, the limit on running commands only, kill, a second
//! runtime over the same data directory (a restarted server) that finds a command still
//! running, and destroy.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them).
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use sessionbox_core::{
    ConversationId, ConversationRef, Error, ExecRequest, ExitStatus, MAX_RUNNING_COMMANDS,
    OutputRequest, Runtime, Session, TenantId,
};
use sessionbox_local::host::{HostConfig, HostRuntime};

fn runtime(dir: &std::path::Path) -> HostRuntime {
    let mut c = HostConfig::new(dir);
    c.supervisor = Some(std::env::current_exe().unwrap());
    c.supervisor_args = ["supervisor_entry", "--exact", "--test-threads=1", "-q"]
        .map(String::from)
        .to_vec();
    HostRuntime::new(c).unwrap()
}

/// Not a test: the entry of the host runtime's command supervisor (see [`runtime`]); run by
/// the test runner, it does nothing.
#[test]
fn supervisor_entry() {
    if sessionbox_local::supervise::is_supervisor_invocation() {
        sessionbox_local::supervise::supervisor_main();
    }
}

fn conversation(id: &str) -> ConversationRef {
    ConversationRef::new(
        TenantId::new("t").unwrap(),
        ConversationId::new(id).unwrap(),
    )
}

/// Reads everything until the command has ended, following it with long polls.
async fn follow(
    s: &dyn Session,
    id: &str,
) -> (Vec<u8>, Vec<u8>, sessionbox_core::BackgroundCommand) {
    let mut read = OutputRequest::from_start();
    read.wait = Duration::from_secs(5);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        let o = s.command_output(id, read).await.unwrap();
        out.extend_from_slice(&o.stdout);
        err.extend_from_slice(&o.stderr);
        read.stdout_from = o.stdout_next();
        read.stderr_from = o.stderr_next();
        if o.complete() {
            return (out, err, o.command);
        }
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

async fn wait_until(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_exact_and_apart_and_the_exit_status_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path());
    let s = rt.open(&conversation("exact")).await.unwrap();
    let c = s
        .spawn(ExecRequest::new(
            "printf 'a\\000\\377\\n'; sleep 0.3; printf 'err\\342\\202' >&2; printf z; exit 7",
        ))
        .await
        .unwrap();
    assert!(c.running);
    let (out, err, end) = follow(s.as_ref(), &c.id).await;
    assert_eq!(out, b"a\0\xff\nz");
    assert_eq!(err, b"err\xe2\x82");
    assert_eq!(
        (end.status, end.shell_exit_code()),
        (Some(ExitStatus::Code(7)), Some(7))
    );
    assert!(
        !end.killed && !end.timed_out && end.error.is_none(),
        "{end:?}"
    );
    assert_eq!((end.stdout_bytes, end.stderr_bytes), (5, 5));
    let listed = s.commands().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, c.id);

    // The output limit holds while it streams, and is said to.
    let c = s
        .spawn(ExecRequest::new("head -c 100000 /dev/zero").output_limit(10))
        .await
        .unwrap();
    let (out, _, end) = follow(s.as_ref(), &c.id).await;
    assert_eq!((out.len(), end.stdout_truncated), (10, true));

    // Bad input is a typed error, and creates nothing.
    for bad in ["../x", "", "a/b"] {
        assert_eq!(s.command(bad).await.unwrap_err().code(), "invalid_request");
    }
    assert!(matches!(
        s.command("feedface").await,
        Err(Error::NotFound(_))
    ));
    let mut read = OutputRequest::from_start();
    read.stdout_from = 99;
    assert_eq!(
        s.command_output(&c.id, read).await.unwrap_err().code(),
        "invalid_request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_running_commands_count_against_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path());
    let s = rt.open(&conversation("slots")).await.unwrap();
    // 20 short commands one after another: every one is accepted.
    for i in 0..20 {
        let c = s
            .spawn(ExecRequest::new(format!("echo {i}")))
            .await
            .unwrap();
        let (out, _, end) = follow(s.as_ref(), &c.id).await;
        assert_eq!(
            (out, end.shell_exit_code()),
            (format!("{i}\n").into_bytes(), Some(0))
        );
    }
    // The limit is on running ones.
    let mut sleepers = Vec::new();
    for _ in 0..MAX_RUNNING_COMMANDS {
        sleepers.push(s.spawn(ExecRequest::new("sleep 30")).await.unwrap().id);
    }
    let e = s.spawn(ExecRequest::new("true")).await.unwrap_err();
    assert_eq!(e.code(), "busy", "{e}");
    // A killed one frees its slot; killing it again (finished) answers at once.
    let killed = s.kill_command(&sleepers[0]).await.unwrap();
    assert!(!killed.running && killed.killed, "{killed:?}");
    assert_eq!(killed.status, Some(ExitStatus::Signal(9)));
    let t = Instant::now();
    let again = s.kill_command(&sleepers[0]).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(again.finished_at_ms, killed.finished_at_ms);
    s.spawn(ExecRequest::new("true")).await.unwrap();
    // Destroy with many commands, finished and running, does not wait for each.
    let t = Instant::now();
    let report = rt.destroy(&conversation("slots").key).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(
        report.processes_killed >= MAX_RUNNING_COMMANDS - 1,
        "{report:?}"
    );
    assert!(
        !dir.path()
            .join("run")
            .join(conversation("slots").key.as_str())
            .exists()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_outlives_its_runtime_and_a_new_one_reads_and_kills_it() {
    let dir = tempfile::tempdir().unwrap();
    let conv = conversation("restart");
    let id = {
        let rt = runtime(dir.path());
        let s = rt.open(&conv).await.unwrap();
        let c = s
            .spawn(ExecRequest::new(
                "echo $$ > pid; echo started; sleep 30; echo done",
            ))
            .await
            .unwrap();
        // Wait for its first line, then drop everything of this runtime.
        let mut read = OutputRequest::from_start();
        read.wait = Duration::from_secs(5);
        let o = s.command_output(&c.id, read).await.unwrap();
        assert_eq!(o.stdout, b"started\n");
        c.id
    };
    let rt = runtime(dir.path());
    let s = rt.open(&conv).await.unwrap();
    let listed = s.commands().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].running, "{:?}", listed[0]);
    let pid: u32 = String::from_utf8(s.read("pid").await.unwrap())
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(pid));
    // A long poll from the end returns when the command ends (killed meanwhile), not later.
    let t = Instant::now();
    let killer = {
        let s2 = rt.open(&conv).await.unwrap();
        let id = id.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            s2.kill_command(&id).await.unwrap()
        })
    };
    let mut read = OutputRequest::from_start();
    read.stdout_from = 8;
    read.wait = Duration::from_secs(20);
    let o = s.command_output(&id, read).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(!o.command.running && o.command.killed, "{:?}", o.command);
    assert!(o.stdout.is_empty(), "'done' was never written");
    let end = killer.await.unwrap();
    assert_eq!(end.shell_exit_code(), Some(137));
    assert!(wait_until(5, || !alive(pid)).await, "pid {pid} lives");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_supervisor_background_commands_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let rt = HostRuntime::new(HostConfig::new(dir.path())).unwrap();
    let s = rt.open(&conversation("plain")).await.unwrap();
    let e = s.spawn(ExecRequest::new("true")).await.unwrap_err();
    assert_eq!(e.code(), "runtime_unavailable");
    assert!(e.to_string().contains("supervisor"), "{e}");
}

/// State letter of `pid` in `/proc/PID/stat` (`T` when stopped).
fn proc_state(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(str::to_owned))
        })
        .unwrap_or_default()
}

/// The host runtime archives in-process (`sessionbox-fs`): its background commands (each run
/// by a supervisor) are stopped while the archive is written and continue after; the archive
/// restores into another conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archiving_pauses_background_commands_and_restores_into_another_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path());
    let s = rt.open(&conversation("archive-src")).await.unwrap();
    s.write("d/f", b"x\0y").await.unwrap();
    s.write("big", &vec![5u8; 4 << 20]).await.unwrap();
    let c = s
        .spawn(
            ExecRequest::new("echo $$ > pid; i=0; while :; do i=$((i+1)); echo $i > tick; done")
                .timeout(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    let mut pid = 0;
    assert!(
        wait_until(10, || {
            pid = std::fs::read_to_string(
                dir.path()
                    .join("workspaces")
                    .join(s.key().as_str())
                    .join("pid"),
            )
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
            pid != 0
        })
        .await
    );
    let tick = |s: &std::path::Path| std::fs::read_to_string(s.join("tick")).unwrap_or_default();
    let ws = dir.path().join("workspaces").join(s.key().as_str());

    // The archive goes into a FIFO this test reads slowly: it is held while the pipe is full.
    let fifo = dir.path().join("archive.fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let reader = {
        let fifo = fifo.clone();
        tokio::task::spawn_blocking(move || std::fs::File::open(fifo).unwrap())
    };
    // What is seen while paused is asserted after the pipe was drained: a failed look must
    // not leave the archive's writer blocked on a pipe nobody reads (the test would hang).
    let ((paused, archived), written) = tokio::join!(
        async {
            let mut reader = reader.await.unwrap();
            let paused = async {
                if !wait_until(10, || proc_state(pid) == "T").await {
                    return Err(format!(
                        "the command's shell is not stopped while the archive is written: {}",
                        proc_state(pid)
                    ));
                }
                let before = tick(&ws);
                tokio::time::sleep(Duration::from_millis(300)).await;
                if tick(&ws) != before {
                    return Err("the command ran while paused".to_owned());
                }
                Ok(())
            }
            .await;
            let all = tokio::task::spawn_blocking(move || {
                let mut all = Vec::new();
                let _ = std::io::Read::read_to_end(&mut reader, &mut all);
                all
            })
            .await
            .unwrap();
            (paused, all)
        },
        s.archive_workspace(&fifo, u64::MAX)
    );
    paused.unwrap();
    written.unwrap();
    assert!(archived.len() > 4 << 20);
    let before = tick(&ws);
    assert!(
        wait_until(10, || tick(&ws) != before).await,
        "the command continues after the archive"
    );

    let tar = dir.path().join("a.tar");
    std::fs::write(&tar, &archived).unwrap();
    let other = rt.open(&conversation("archive-dst")).await.unwrap();
    other.write("old", b"old").await.unwrap();
    let stats = other.restore_workspace(&tar).await.unwrap();
    assert_eq!(
        (stats.files >= 3, stats.directories),
        (true, 1),
        "{stats:?}"
    );
    assert_eq!(other.read("d/f").await.unwrap(), b"x\0y");
    assert!(other.stat("old").await.is_err());
    s.kill_command(&c.id).await.unwrap();
}
