//! Background commands on the `aio` runtime against the AIO test server (started per test):
//! spawn, list, exact output of each stream from byte offsets, a long poll, kill of a running
//! and of a finished command, the output cap, the timeout, the limit on running commands, a
//! second runtime (as after a restart of `serve`) that lists and kills a command the first one
//! started, and destroy.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them); support modules are `pub` for the files that use them,
// and a test binary has no public API.
#![allow(clippy::unwrap_used, unreachable_pub)]

mod common;

use std::time::{Duration, Instant};

use common::Target;
use sessionbox_core::{
    BackgroundCommand, ConversationRef, ExecRequest, ExitStatus, MAX_RUNNING_COMMANDS,
    OutputRequest, Runtime, Session,
};

fn conv(id: &str) -> ConversationRef {
    ConversationRef::parse("default", id).unwrap()
}

/// Waits for a command to end (polling its status).
async fn ended(s: &dyn Session, id: &str) -> BackgroundCommand {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = s.command(id).await.unwrap();
        if !c.running {
            return c;
        }
        assert!(Instant::now() < deadline, "{id} did not end: {c:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Follows a command from the start until its output is complete, with long polls.
async fn follow(s: &dyn Session, id: &str) -> (Vec<u8>, Vec<u8>, BackgroundCommand, usize) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut read = OutputRequest::from_start();
    read.wait = Duration::from_secs(5);
    let mut calls = 0;
    loop {
        let o = s.command_output(id, read).await.unwrap();
        calls += 1;
        assert_eq!(o.stdout_offset, read.stdout_from);
        assert_eq!(o.stderr_offset, read.stderr_from);
        out.extend_from_slice(&o.stdout);
        err.extend_from_slice(&o.stderr);
        read.stdout_from = o.stdout_next();
        read.stderr_from = o.stderr_next();
        if o.complete() {
            return (out, err, o.command, calls);
        }
        assert!(calls < 200, "no end");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spawn_list_and_read_each_stream_exactly_from_offsets() {
    let target = Target::new();
    let rt = target.runtime();
    let s = rt.open(&conv("bg-exact")).await.unwrap();
    s.exec(ExecRequest::new("mkdir -p sub")).await.unwrap();
    let started = Instant::now();
    let c = s
        .spawn(
            ExecRequest::new(
                r"printf 'a\000b\377'; printf 'e\000\376' >&2; sleep 0.5; printf 'c\n'; pwd; \
                  printf 'tail\342\202' >&2; printf '\254' >&2; exit 3",
            )
            .cwd("sub"),
        )
        .await
        .unwrap();
    let spawn_ms = started.elapsed().as_millis();
    assert!(c.running && c.status.is_none(), "{c:?}");
    assert!(c.id.len() == 32, "{}", c.id);
    let listed = s.commands().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, c.id);
    assert!(listed[0].running);
    assert!(listed[0].command.contains("exit 3"));

    let (out, err, end, calls) = follow(&*s, &c.id).await;
    let mut want = b"a\0b\xffc\n".to_vec();
    want.extend_from_slice(format!("{}/sub\n", s.workspace_root()).as_bytes());
    // The workspace's real path is what pwd prints; the test root has no links.
    assert_eq!(out, want, "{:?}", String::from_utf8_lossy(&out));
    assert_eq!(err, b"e\0\xfetail\xe2\x82\xac");
    assert_eq!(end.status, Some(ExitStatus::Code(3)));
    assert_eq!(end.shell_exit_code(), Some(3));
    assert!(!end.killed && !end.timed_out && end.error.is_none());
    assert!(end.finished_at_ms.unwrap() >= end.started_at_ms + 400);
    assert!(calls >= 2, "the first read came before the end: {calls}");

    // Reads from offsets in the middle, and a bounded read.
    let o = s
        .command_output(
            &c.id,
            OutputRequest {
                stdout_from: 2,
                stderr_from: 4,
                max_bytes: 2,
                wait: Duration::ZERO,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (o.stdout.as_slice(), o.stderr.as_slice()),
        (&b"b\xff"[..], &b"ai"[..])
    );
    assert!(!o.complete());
    // An offset past the output is refused at once.
    let t = Instant::now();
    let e = s
        .command_output(
            &c.id,
            OutputRequest {
                stdout_from: 999,
                stderr_from: 0,
                max_bytes: 10,
                wait: Duration::from_secs(5),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "invalid_request", "{e}");
    assert!(t.elapsed() < Duration::from_secs(3));
    // Unknown and malformed ids.
    assert_eq!(
        s.command("0123456789abcdef0123456789abcdef")
            .await
            .unwrap_err()
            .code(),
        "not_found"
    );
    assert_eq!(
        s.command("../x").await.unwrap_err().code(),
        "invalid_request"
    );
    eprintln!("aio background: spawn {spawn_ms} ms, follow in {calls} reads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_poll_answers_when_output_comes_and_kill_ends_a_running_command() {
    let target = Target::new();
    let rt = target.runtime();
    let s = rt.open(&conv("bg-kill")).await.unwrap();
    let c = s
        .spawn(ExecRequest::new(
            "sleep 1; echo tick; sleep 300 & sleep 300; echo never",
        ))
        .await
        .unwrap();
    // Nothing yet: the read waits for "tick" (about 1 s), not for its whole wait.
    let t = Instant::now();
    let mut read = OutputRequest::from_start();
    read.wait = Duration::from_secs(10);
    let o = s.command_output(&c.id, read).await.unwrap();
    let waited = t.elapsed();
    assert_eq!(o.stdout, b"tick\n");
    assert!(o.command.running);
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    // A short wait with nothing new answers after about that wait.
    read.stdout_from = o.stdout_next();
    read.wait = Duration::from_millis(400);
    let t = Instant::now();
    let o = s.command_output(&c.id, read).await.unwrap();
    assert!(o.stdout.is_empty() && o.command.running);
    assert!(
        t.elapsed() >= Duration::from_millis(350),
        "{:?}",
        t.elapsed()
    );

    let t = Instant::now();
    let k = s.kill_command(&c.id).await.unwrap();
    let kill_ms = t.elapsed().as_millis();
    assert!(!k.running, "{k:?}");
    assert!(k.killed);
    assert_eq!(k.status, Some(ExitStatus::Signal(9)));
    assert_eq!(k.shell_exit_code(), Some(137));
    // Its whole group went (the `sleep 300 &` too): no process is left in the workspace.
    let inv = rt.list().await.unwrap();
    let key = &s.key().clone();
    let procs: Vec<u32> = inv
        .iter()
        .filter(|c| &c.key == key)
        .flat_map(|c| c.processes.clone())
        .collect();
    assert!(procs.is_empty(), "left behind: {procs:?}");
    // Killing it again answers at once with the same status.
    let t = Instant::now();
    let again = s.kill_command(&c.id).await.unwrap();
    assert_eq!(again, k);
    let again_ms = t.elapsed().as_millis();

    // A finished command: kill answers at once, unchanged.
    let f = s.spawn(ExecRequest::new("echo done")).await.unwrap();
    let f = ended(&*s, &f.id).await;
    let t = Instant::now();
    let fk = s.kill_command(&f.id).await.unwrap();
    assert_eq!(fk, f);
    assert!(!fk.killed);
    assert_eq!(fk.status, Some(ExitStatus::Code(0)));
    eprintln!(
        "aio background: kill of a running command {kill_ms} ms, again {again_ms} ms, of a \
         finished one {} ms",
        t.elapsed().as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_output_cap_the_timeout_and_stdin() {
    let target = Target::new();
    let rt = target.runtime();
    let s = rt.open(&conv("bg-cap")).await.unwrap();
    let mut r = ExecRequest::new("head -c 100000 /dev/zero; echo ok >&2");
    r.output_limit = 1000;
    let c = s.spawn(r).await.unwrap();
    let (out, err, end, _) = follow(&*s, &c.id).await;
    assert_eq!(out.len(), 1000);
    assert!(end.stdout_truncated && !end.stderr_truncated);
    assert_eq!(end.stdout_bytes, 1000);
    assert_eq!(err, b"ok\n");
    assert_eq!(
        end.status,
        Some(ExitStatus::Code(0)),
        "the command ran to its end"
    );

    // Exactly at the limit is not cut.
    let mut r = ExecRequest::new("head -c 1000 /dev/zero");
    r.output_limit = 1000;
    let c = s.spawn(r).await.unwrap();
    let end = ended(&*s, &c.id).await;
    assert!(!end.stdout_truncated);
    assert_eq!(end.stdout_bytes, 1000);

    let mut r = ExecRequest::new("echo before; sleep 30");
    r.timeout = Duration::from_secs(1);
    let c = s.spawn(r).await.unwrap();
    let end = ended(&*s, &c.id).await;
    assert!(end.timed_out && !end.killed, "{end:?}");
    assert_eq!(end.shell_exit_code(), Some(124));
    assert!(end.duration_ms(0) < 10_000);

    let mut r = ExecRequest::new("cat; printf x");
    r.stdin = Some(b"in\0\xff".to_vec());
    let c = s.spawn(r).await.unwrap();
    let (out, _, _, _) = follow(&*s, &c.id).await;
    assert_eq!(out, b"in\0\xffx");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_running_commands_count_towards_the_limit() {
    let target = Target::new();
    let rt = target.runtime();
    let s = rt.open(&conv("bg-limit")).await.unwrap();
    // Twenty finished ones first: none of them takes a slot.
    for i in 0..20 {
        let c = s
            .spawn(ExecRequest::new(format!("echo {i}")))
            .await
            .unwrap();
        ended(&*s, &c.id).await;
    }
    let t = Instant::now();
    let mut running = Vec::new();
    for _ in 0..MAX_RUNNING_COMMANDS {
        running.push(s.spawn(ExecRequest::new("sleep 317")).await.unwrap());
    }
    let spawn_each = t.elapsed().as_millis() / MAX_RUNNING_COMMANDS as u128;
    let e = s.spawn(ExecRequest::new("true")).await.unwrap_err();
    assert_eq!(e.code(), "busy", "{e}");
    let all = s.commands().await.unwrap();
    assert_eq!(all.len(), 20 + MAX_RUNNING_COMMANDS);
    assert_eq!(
        all.iter().filter(|c| c.running).count(),
        MAX_RUNNING_COMMANDS
    );
    assert!(
        all.windows(2)
            .all(|w| w[0].started_at_ms <= w[1].started_at_ms),
        "oldest first"
    );
    // One ends: a slot is free again.
    s.kill_command(&running[0].id).await.unwrap();
    s.spawn(ExecRequest::new("sleep 317")).await.unwrap();
    assert_eq!(
        s.spawn(ExecRequest::new("true")).await.unwrap_err().code(),
        "busy"
    );
    // Destroy with 16 running and 22 finished: at once, everything gone.
    let key = s.key().clone();
    drop(s);
    let t = Instant::now();
    let report = rt.destroy(&key).await.unwrap();
    let destroy_ms = t.elapsed().as_millis();
    assert!(report.workspace_removed);
    assert!(
        report.processes_killed >= MAX_RUNNING_COMMANDS,
        "{report:?}"
    );
    let dir = std::path::Path::new(rt.root())
        .join(".sessionbox-commands")
        .join(key.as_str());
    if target.server.is_some() {
        assert!(!dir.exists(), "{} is left", dir.display());
        // No runner or command of the conversation is left.
        let out = std::process::Command::new("sh")
            .args(["-c", "ps -eo args | grep -c '[s]leep 317' || true"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
    }
    let s = rt.open(&conv("bg-limit")).await.unwrap();
    assert!(s.commands().await.unwrap().is_empty());
    eprintln!(
        "aio background: spawn {spawn_each} ms each; destroy with 16 running {destroy_ms} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_runtime_sees_reads_and_kills_a_command_the_first_started() {
    let target = Target::new();
    let first = target.runtime();
    let s = first.open(&conv("bg-restart")).await.unwrap();
    let c = s
        .spawn(ExecRequest::new("echo started; sleep 300"))
        .await
        .unwrap();
    let done = s.spawn(ExecRequest::new("printf 'x\\377'")).await.unwrap();
    ended(&*s, &done.id).await;
    drop(s);
    drop(first);

    // As after a restart of `serve`: a new runtime, nothing shared but the container.
    let second = target.runtime();
    let s = second.open(&conv("bg-restart")).await.unwrap();
    let all = s.commands().await.unwrap();
    let ids: Vec<&str> = all.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, [c.id.as_str(), done.id.as_str()]);
    assert!(all[0].running && !all[1].running);
    let mut read = OutputRequest::from_start();
    read.wait = Duration::from_secs(5);
    let o = s.command_output(&c.id, read).await.unwrap();
    assert_eq!(o.stdout, b"started\n");
    let o = s.command_output(&done.id, read).await.unwrap();
    assert_eq!(o.stdout, b"x\xff");
    assert!(o.complete());
    let k = s.kill_command(&c.id).await.unwrap();
    assert!(k.killed && !k.running);
    assert_eq!(k.status, Some(ExitStatus::Signal(9)));
    assert!(
        s.commands().await.unwrap().iter().all(|c| !c.running),
        "nothing runs"
    );
}
