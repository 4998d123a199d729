//! Commands through the real client: output, exit codes, prompt stream end, background status
//! and logs, interrupt, timeout, signals, output caps, client disconnect.

mod common;

use std::time::{Duration, Instant};

use common::{TestAgent, alive, eventually, read_pids, request};
use futures::StreamExt;
use sessionbox_execd::{EventType, ExecdError, RunCommandRequest};

#[tokio::test(flavor = "multi_thread")]
async fn foreground_output_and_exit_codes() {
    let a = TestAgent::start().await;
    let o = a
        .client
        .run_command(&RunCommandRequest::shell("echo out; echo err >&2"))
        .await
        .unwrap();
    assert_eq!(o.exit_code, Some(0));
    assert_eq!((o.stdout.as_str(), o.stderr.as_str()), ("out\n", "err\n"));
    assert!(o.id.is_some());
    assert!(!o.timed_out && o.signal.is_none() && !o.stdout_truncated);

    let o = a
        .client
        .run_command(&RunCommandRequest::shell("exit 42"))
        .await
        .unwrap();
    assert_eq!(o.exit_code, Some(42));
    assert!(!o.timed_out);

    // Environment: the base environment plus the request's, nothing of the agent's own.
    let o = a
        .client
        .run_command(&RunCommandRequest::shell("env | sort").env("EXTRA", "v 1"))
        .await
        .unwrap();
    let vars: Vec<&str> = o
        .stdout
        .lines()
        .map(|l| l.split('=').next().unwrap())
        .collect();
    assert_eq!(
        vars,
        ["EXTRA", "HOME", "LANG", "PATH", "PWD", "TERM"],
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("EXTRA=v 1\n"));
    assert!(o.stdout.contains(&format!("HOME={}\n", a.root.display())));

    // cwd beneath the root; argv runs literally; non-UTF-8 output is replaced, not fatal.
    std::fs::create_dir(a.root.join("sub")).unwrap();
    let o = a
        .client
        .run_command(&RunCommandRequest::shell("pwd").cwd("sub"))
        .await
        .unwrap();
    assert_eq!(o.stdout, format!("{}/sub\n", a.root.display()));
    let o = a
        .client
        .run_command(&RunCommandRequest::argv(["printf", "%s", "$HOME ' \""]))
        .await
        .unwrap();
    assert_eq!(o.stdout, "$HOME ' \"");
    let o = a
        .client
        .run_command(&RunCommandRequest::shell("printf 'a\\377b'"))
        .await
        .unwrap();
    assert_eq!(o.stdout, "a\u{fffd}b");

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
    assert_eq!(o.stdout, "0123");
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
