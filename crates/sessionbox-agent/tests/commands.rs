//! Commands through the real client: output, exit codes, prompt stream end, background status
//! and logs, interrupt, timeout, signals, output caps, client disconnect.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestAgent, alive, eventually, read_pids, request};
use futures::StreamExt;
use sessionbox_execd::{EventType, ExecdError, RunCommandRequest};

/// A request for exact output (what sessionbox's own runtimes send).
fn exact(command: &str) -> RunCommandRequest {
    RunCommandRequest::shell(command).exact_output()
}

#[tokio::test(flavor = "multi_thread")]
async fn foreground_output_and_exit_codes() {
    let a = TestAgent::start().await;
    let o = a
        .client
        .run_command(&exact("echo out; echo err >&2"))
        .await
        .unwrap();
    assert_eq!(o.exit_code, Some(0));
    assert_eq!(
        (o.stdout.as_slice(), o.stderr.as_slice()),
        (&b"out\n"[..], &b"err\n"[..])
    );
    assert!(o.id.is_some());
    assert!(!o.timed_out && o.signal.is_none() && !o.stdout_truncated);

    let o = a.client.run_command(&exact("exit 42")).await.unwrap();
    assert_eq!(o.exit_code, Some(42));
    assert!(!o.timed_out);

    // Environment: the base environment plus the request's, nothing of the agent's own.
    let o = a
        .client
        .run_command(&exact("env | sort").env("EXTRA", "v 1"))
        .await
        .unwrap();
    let stdout = o.stdout_text();
    let vars: Vec<&str> = stdout
        .lines()
        .map(|l| l.split('=').next().unwrap())
        .collect();
    assert_eq!(
        vars,
        ["EXTRA", "HOME", "LANG", "PATH", "PWD", "TERM"],
        "{stdout}"
    );
    assert!(stdout.contains("EXTRA=v 1\n"));
    assert!(stdout.contains(&format!("HOME={}\n", a.root.display())));

    // cwd beneath the root; argv runs literally.
    std::fs::create_dir(a.root.join("sub")).unwrap();
    let o = a
        .client
        .run_command(&exact("pwd").cwd("sub"))
        .await
        .unwrap();
    assert_eq!(o.stdout_text(), format!("{}/sub\n", a.root.display()));
    let o = a
        .client
        .run_command(&RunCommandRequest::argv(["printf", "%s", "$HOME ' \""]).exact_output())
        .await
        .unwrap();
    assert_eq!(o.stdout_text(), "$HOME ' \"");

    // A missing cwd, or a bad environment name, is refused before anything runs.
    for bad in [
        RunCommandRequest::shell("true").cwd("nope"),
        RunCommandRequest::shell("true").env("1BAD", "x"),
    ] {
        let e = a.client.run_command(&bad).await.unwrap_err();
        assert!(matches!(e.status(), Some(400 | 404)), "{e}");
    }
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_stream_ends_right_after_the_terminal_event() {
    let a = TestAgent::start().await;
    // Warm up once, then time whole exchanges to EOF (not just to the terminal event).
    for i in 0..3 {
        let r = a
            .raw(&request(
                "POST",
                "/command",
                &["Content-Type: application/json"],
                br#"{"command":"true"}"#,
            ))
            .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("text/event-stream"));
        let text = r.text();
        assert!(text.contains(r#""type":"init""#), "{text}");
        assert!(text.contains(r#""type":"execution_complete""#), "{text}");
        if i > 0 {
            assert!(
                r.elapsed < Duration::from_millis(500),
                "the body ended {:?} after the request",
                r.elapsed
            );
        }
    }
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn background_status_and_logs_with_a_cursor() {
    let a = TestAgent::start().await;
    let req = RunCommandRequest::shell("echo one; sleep 0.1; echo two >&2; sleep 0.3; echo three")
        .background(true);
    let started = Instant::now();
    let o = a.client.run_command(&req).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "the start returns at once"
    );
    assert!(o.background && o.exit_code.is_none());
    let id = o.id.unwrap();

    let s = a.client.command_status(&id).await.unwrap();
    assert!(s.running, "{s:?}");
    assert_eq!(
        s.content.as_deref(),
        Some("echo one; sleep 0.1; echo two >&2; sleep 0.3; echo three")
    );
    assert!(s.finished_at.is_none());

    let client = a.client.clone();
    let mut s = s;
    for _ in 0..200 {
        if !s.running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        s = client.command_status(&id).await.unwrap();
    }
    assert!(!s.running && s.exit_code == Some(0), "{s:?}");
    assert!(s.finished_at.is_some() && s.started_at.is_some());

    let all = a.client.command_logs(&id, None).await.unwrap();
    assert_eq!(all.content, "one\ntwo\nthree\n");
    assert_eq!(all.cursor, Some(all.content.len() as i64));
    let tail = a.client.command_logs(&id, Some(4)).await.unwrap();
    assert_eq!(tail.content, "two\nthree\n");
    assert_eq!(tail.cursor, all.cursor);
    let none = a
        .client
        .command_logs(&id, Some(all.content.len() as u64 + 50))
        .await
        .unwrap();
    assert_eq!(none.content, "");

    // Unknown ids are 404; a foreground command has no logs.
    let e = a.client.command_status("nope").await.unwrap_err();
    assert_eq!(e.status(), Some(404));
    let fg = a
        .client
        .run_command(&RunCommandRequest::shell("true"))
        .await
        .unwrap();
    let fg_id = fg.id.unwrap();
    assert_eq!(
        a.client.command_status(&fg_id).await.unwrap().exit_code,
        Some(0)
    );
    let e = a.client.command_logs(&fg_id, None).await.unwrap_err();
    assert_eq!(e.status(), Some(400));
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupt_kills_the_whole_process_group() {
    let a = TestAgent::start().await;
    let pidfile = a.root.join("pids");
    let req = RunCommandRequest::shell(
        "echo $$ > pids; sleep 1000 & echo $! >> pids; (sleep 1000; true) & echo $! >> pids; wait",
    )
    .background(true);
    let id = a.client.run_command(&req).await.unwrap().id.unwrap();
    let pids = read_pids(&pidfile, 3).await;
    assert!(pids.iter().all(|p| alive(*p)), "{pids:?}");

    a.client.interrupt_command(&id).await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || pids.iter().all(|p| !alive(*p))).await,
        "processes left: {:?}",
        pids.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
    );
    let mut s = a.client.command_status(&id).await.unwrap();
    for _ in 0..100 {
        if !s.running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        s = a.client.command_status(&id).await.unwrap();
    }
    assert!(!s.running);
    assert_eq!(s.exit_code, Some(-1));
    assert!(s.error.unwrap_or_default().contains("interrupted"));
    // Interrupting again, or a finished command, is fine; an unknown id is 404.
    a.client.interrupt_command(&id).await.unwrap();
    let e = a.client.interrupt_command("no-such-id").await.unwrap_err();
    assert_eq!(e.status(), Some(404));

    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupting_a_foreground_stream_reports_it() {
    let a = TestAgent::start().await;
    let mut events = a
        .client
        .run_command_stream(&RunCommandRequest::shell(
            "echo $$ > fgpids; sleep 1000 & echo $! >> fgpids; wait",
        ))
        .await
        .unwrap();
    let init = events.next().await.unwrap().unwrap();
    assert_eq!(init.kind, EventType::Init);
    let id = init.text.unwrap();
    let pids = read_pids(&a.root.join("fgpids"), 2).await;
    a.client.interrupt_command(&id).await.unwrap();
    let mut last = None;
    while let Some(e) = events.next().await {
        last = Some(e.unwrap());
    }
    let last = last.unwrap();
    assert_eq!(last.kind, EventType::Error);
    assert_eq!(last.error.as_ref().unwrap().evalue, "-1");
    let ext = last.extension.unwrap();
    assert!(ext.interrupted && ext.signal == Some(9), "{ext:?}");
    assert!(eventually(Duration::from_secs(5), || pids.iter().all(|p| !alive(*p))).await);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_goes_away_kills_its_foreground_command() {
    let a = TestAgent::start().await;
    let mut events = a
        .client
        .run_command_stream(&RunCommandRequest::shell(
            "echo $$ > gone; sleep 1000 & echo $! >> gone; wait",
        ))
        .await
        .unwrap();
    let id = events.next().await.unwrap().unwrap().text.unwrap();
    let pids = read_pids(&a.root.join("gone"), 2).await;
    drop(events);
    assert!(
        eventually(Duration::from_secs(5), || pids.iter().all(|p| !alive(*p))).await,
        "the group outlived its client"
    );
    let s = a.client.command_status(&id).await.unwrap();
    assert!(!s.running);
    assert!(s.error.unwrap().contains("client disconnected"));
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn timeouts_and_signals_are_told_apart() {
    let a = TestAgent::start().await;
    let started = Instant::now();
    let o = a
        .client
        .run_command(&RunCommandRequest::shell("sleep 30").timeout(Duration::from_millis(300)))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(o.timed_out);
    assert_eq!(o.exit_code, Some(-1));
    assert_eq!(o.error.as_ref().unwrap().ename, "CommandTimeoutError");
    assert!(o.signal.is_some());

    let o = a
        .client
        .run_command(&RunCommandRequest::shell("kill -9 $$"))
        .await
        .unwrap();
    assert_eq!(o.exit_code, Some(-1));
    assert_eq!(o.signal, Some(9));
    assert!(!o.timed_out && !o.interrupted);

    // A timeout above the agent's limit is refused up front.
    let e = a
        .client
        .run_command(&RunCommandRequest::shell("true").timeout(Duration::from_secs(3600)))
        .await
        .unwrap_err();
    assert!(matches!(e, ExecdError::Status { status: 400, .. }), "{e}");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn output_is_capped_per_stream() {
    let a = TestAgent::start_with(|c| c.output_cap = 4096).await;
    let o = a
        .client
        .run_command(&RunCommandRequest::shell(
            "head -c 10000 /dev/zero | tr '\\0' a; head -c 100 /dev/zero | tr '\\0' b >&2",
        ))
        .await
        .unwrap();
    assert_eq!(o.exit_code, Some(0));
    assert_eq!(o.stdout.len(), 4096);
    assert_eq!(o.stderr.len(), 100);
    assert!(o.stdout_truncated && !o.stderr_truncated);

    // The request's own cap (a sessionbox extension).
    let o = a
        .client
        .run_command(&RunCommandRequest::shell("echo 0123456789").max_output_bytes(4))
        .await
        .unwrap();
    assert_eq!(o.stdout_text(), "0123");
    assert!(o.stdout_truncated);

    // Background logs keep at most the cap of each stream too.
    let id = a
        .client
        .run_command(
            &RunCommandRequest::shell("head -c 10000 /dev/zero | tr '\\0' a").background(true),
        )
        .await
        .unwrap()
        .id
        .unwrap();
    let client = a.client.clone();
    let mut done = false;
    for _ in 0..200 {
        if !client.command_status(&id).await.unwrap().running {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(done);
    assert_eq!(
        a.client
            .command_logs(&id, None)
            .await
            .unwrap()
            .content
            .len(),
        4096
    );
    let e = a
        .client
        .run_command(&RunCommandRequest::shell("true").max_output_bytes(0))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400));
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_kills_background_commands() {
    let a = TestAgent::start().await;
    let pidfile = a.root.join("bg");
    a.client
        .run_command(
            &RunCommandRequest::shell("echo $$ > bg; sleep 1000 & echo $! >> bg; wait")
                .background(true),
        )
        .await
        .unwrap();
    let pids = read_pids(&pidfile, 2).await;
    a.stop().await;
    assert!(eventually(Duration::from_secs(5), || pids.iter().all(|p| !alive(*p))).await);
}

/// Prints the warm latency of `POST /command` for `true` (p50 and p90 over 200 calls).
#[tokio::test(flavor = "multi_thread")]
async fn warm_command_latency() {
    let a = TestAgent::start().await;
    let req = RunCommandRequest::shell("true");
    for _ in 0..10 {
        a.client.run_command(&req).await.unwrap();
    }
    let mut times = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let o = a.client.run_command(&req).await.unwrap();
        times.push(t.elapsed());
        assert!(o.success());
    }
    times.sort();
    let p50 = times[100];
    let p90 = times[180];
    println!(
        "warm POST /command `true` over a Unix socket: p50 {:.2} ms, p90 {:.2} ms",
        p50.as_secs_f64() * 1000.0,
        p90.as_secs_f64() * 1000.0
    );
    assert!(p50 < Duration::from_millis(200), "p50 {p50:?}");
    a.stop().await;
}

/// Upstream execd's framing for clients that did not ask for bytes (the official SDKs): one
/// event per line without its terminator, `"\n"` for an empty line, `\r` ending a line too,
/// the last unterminated line at exit, U+FFFD for bytes that are not UTF-8.
#[tokio::test(flavor = "multi_thread")]
async fn upstream_clients_get_one_event_per_line() {
    let a = TestAgent::start().await;
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("printf 'a\\n\\nb\\n'", &["a", "\n", "b"], &[]),
        ("printf 'x'", &["x"], &[]),
        ("printf 'a\\r\\nb'; printf 'e\\n' >&2", &["a", "b"], &["e"]),
        ("printf '10%%\\r20%%\\r'", &["10%", "20%"], &[]),
        ("printf 'a\\377b\\n'", &["a\u{fffd}b"], &[]),
        (
            "printf 'half'; sleep 0.3; printf 'way\\nnext'",
            &["halfway", "next"],
            &[],
        ),
        ("true", &[], &[]),
    ];
    for (command, stdout, stderr) in cases {
        let mut events = a
            .client
            .run_command_stream(&RunCommandRequest::shell(*command))
            .await
            .unwrap();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        while let Some(e) = events.next().await {
            let e = e.unwrap();
            assert!(e.bytes.is_none(), "no bytes unless asked for");
            match e.kind {
                EventType::Stdout => out.push(e.text.unwrap()),
                EventType::Stderr => err.push(e.text.unwrap()),
                _ => {}
            }
        }
        assert_eq!(out, *stdout, "stdout of {command}");
        assert_eq!(err, *stderr, "stderr of {command}");
    }
    a.stop().await;
}

/// What sessionbox's own client asks for: every byte as the command wrote it, including NUL,
/// bytes that are not UTF-8, and characters split across the agent's reads.
#[tokio::test(flavor = "multi_thread")]
async fn exact_output_carries_every_byte() {
    let a = TestAgent::start().await;
    // Random bytes, compared with the same bytes written to a file by the command.
    let o = a
        .client
        .run_command(&exact(
            "head -c 65536 /dev/urandom | tee r.bin; cat r.bin >&2",
        ))
        .await
        .unwrap();
    let on_disk = std::fs::read(a.root.join("r.bin")).unwrap();
    assert_eq!(on_disk.len(), 65536);
    assert_eq!(o.stdout, on_disk);
    assert_eq!(o.stderr, on_disk);
    // A character split between two writes (and so two reads), NUL, an invalid byte.
    let o = a
        .client
        .run_command(&exact(
            "printf '\\342\\202'; sleep 0.2; printf '\\254\\000\\377\\n'",
        ))
        .await
        .unwrap();
    assert_eq!(o.stdout, b"\xe2\x82\xac\x00\xff\n");
    // A gzip stream, compared by hash with the archive the command wrote.
    std::fs::create_dir_all(a.root.join("d/e")).unwrap();
    std::fs::write(a.root.join("d/e/f"), b"tar me").unwrap();
    let o = a
        .client
        .run_command(&exact("tar czf - d | tee d.tgz"))
        .await
        .unwrap();
    assert_eq!(o.exit_code, Some(0), "{}", o.stderr_text());
    assert_eq!(o.stdout, std::fs::read(a.root.join("d.tgz")).unwrap());
    assert_eq!(&o.stdout[..2], b"\x1f\x8b", "a gzip stream");
    a.stop().await;
}

/// A quiet command's stream carries `ping` events (right after `init`, then every 3 s, as
/// upstream), so that a proxy in front never sees a silent response.
#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_command_stream_carries_keepalives() {
    let a = TestAgent::start().await;
    let mut events = a
        .client
        .run_command_stream(&RunCommandRequest::shell("sleep 7; echo done"))
        .await
        .unwrap();
    let mut kinds = Vec::new();
    while let Some(e) = events.next().await {
        let e = e.unwrap();
        if e.kind == EventType::Ping {
            assert_eq!(e.text.as_deref(), Some("pong"));
            assert!(e.timestamp.is_some());
        }
        kinds.push(e.kind);
    }
    assert_eq!(kinds[0], EventType::Init);
    assert_eq!(kinds[1], EventType::Ping, "{kinds:?}");
    let pings = kinds.iter().filter(|k| **k == EventType::Ping).count();
    assert!((3..=4).contains(&pings), "{pings} pings in 7 s: {kinds:?}");
    assert_eq!(kinds.last(), Some(&EventType::ExecutionComplete));
    a.stop().await;
}
