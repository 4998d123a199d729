//! sessionbox's background-command extension (`/sessionbox/v1/commands`) through the real
//! client against a real agent: exact bytes apart, long polls, the limit on running commands
//! only, kill (at once when finished), and upstream's combined log kept for upstream clients.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestAgent, alive, eventually};
use sessionbox_core::{
    ExecRequest, ExitStatus, MAX_RUNNING_COMMANDS, OutputRequest, validate_command_id,
};
use sessionbox_execd::RunCommandRequest;
use sessionbox_execd::commands_ext::run_request;

fn bg(command: &str) -> RunCommandRequest {
    run_request(&ExecRequest::new(command), ".".into())
}

#[tokio::test(flavor = "multi_thread")]
async fn output_comes_apart_exactly_and_live_and_upstream_keeps_its_combined_log() {
    let a = TestAgent::start().await;
    let c = a
        .client
        .spawn_background(&bg(
            "printf 'o1\\000\\377'; printf 'e1' >&2; sleep 0.4; printf 'o2'; exit 3",
        ))
        .await
        .unwrap();
    assert!(c.running);
    validate_command_id(&c.id).unwrap();
    // A long poll answers as soon as the first bytes are there, well before the wait.
    let mut read = OutputRequest::from_start();
    read.wait = Duration::from_secs(10);
    let t = Instant::now();
    let mut first = a.client.background_output(&c.id, read).await.unwrap();
    if first.stderr.is_empty() {
        read.stdout_from = first.stdout_next();
        let more = a.client.background_output(&c.id, read).await.unwrap();
        first.stderr = more.stderr;
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(first.stdout, b"o1\0\xff");
    assert_eq!(first.stderr, b"e1");
    assert!(first.command.running);
    // From the offsets on: only the rest, then the end.
    read.stdout_from = 4;
    read.stderr_from = 2;
    let rest = a.client.background_output(&c.id, read).await.unwrap();
    assert_eq!(
        (rest.stdout_offset, rest.stdout.as_slice()),
        (4, &b"o2"[..])
    );
    let end = loop {
        let o = a.client.background_output(&c.id, read).await.unwrap();
        if !o.command.running {
            break o.command;
        }
    };
    assert_eq!(end.status, Some(ExitStatus::Code(3)));
    assert_eq!((end.stdout_bytes, end.stderr_bytes), (6, 2));
    assert!(end.finished_at_ms.is_some() && !end.killed);

    // Upstream's route still gives the combined log, as the agent read it, with a byte cursor.
    let logs = a.client.command_logs(&c.id, Some(0)).await.unwrap();
    assert_eq!(logs.cursor, Some(8));
    // Two pipes: which of the first two writes the agent reads first is up to the scheduler,
    // each stream keeps its own order, and `o2` comes last (written after the sleep).
    let merges = ["o1\0\u{fffd}e1o2", "e1o1\0\u{fffd}o2"];
    assert!(
        merges.contains(&logs.content.as_str()),
        "{:?}",
        logs.content
    );
    let tail = a.client.command_logs(&c.id, Some(6)).await.unwrap();
    assert_eq!(tail.content, "o2");

    // Listed; a started upstream background command is in the same registry.
    let upstream = a
        .client
        .run_command(&RunCommandRequest::shell("echo up").background(true))
        .await
        .unwrap();
    let all = a.client.background_commands().await.unwrap();
    let ids: Vec<&str> = all.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, [c.id.as_str(), upstream.id.as_deref().unwrap()]);

    // Typed errors: unknown id, offsets past the output, bad numbers.
    let e: sessionbox_core::Error = a
        .client
        .background_command("feed")
        .await
        .unwrap_err()
        .into();
    assert_eq!(e.code(), "not_found");
    let mut past = OutputRequest::from_start();
    past.stdout_from = 99;
    let e: sessionbox_core::Error = a
        .client
        .background_output(&c.id, past)
        .await
        .unwrap_err()
        .into();
    assert_eq!(e.code(), "invalid_request", "{e}");
    let r = a
        .raw(&common::request(
            "GET",
            &format!("/sessionbox/v1/commands/{}/output?stdout=-1", c.id),
            &[],
            b"",
        ))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_finished_command_frees_its_slot_and_kill_is_at_once_when_finished() {
    let a = TestAgent::start().await;
    // Twenty short commands one after another: each accepted (the old agent-side limit counted
    // finished commands too in serve).
    for i in 0..20 {
        let c = a
            .client
            .spawn_background(&bg(&format!("echo {i}")))
            .await
            .unwrap();
        let mut read = OutputRequest::from_start();
        read.wait = Duration::from_secs(5);
        loop {
            let o = a.client.background_output(&c.id, read).await.unwrap();
            if !o.command.running {
                assert_eq!(o.command.status, Some(ExitStatus::Code(0)));
                break;
            }
        }
    }
    let mut sleepers = Vec::new();
    for _ in 0..MAX_RUNNING_COMMANDS {
        let c = a
            .client
            .spawn_background(&bg("echo $$ >> pids; sleep 30"))
            .await
            .unwrap();
        sleepers.push(c.id);
    }
    let e = a.client.spawn_background(&bg("true")).await.unwrap_err();
    assert_eq!(e.status(), Some(429), "{e}");
    assert_eq!(sessionbox_core::Error::from(e).code(), "busy");
    // Upstream's route counts the same running commands.
    let e = a
        .client
        .run_command(&RunCommandRequest::shell("true").background(true))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(429), "{e}");

    let pids = common::read_pids(&a.root.join("pids"), MAX_RUNNING_COMMANDS).await;
    let t = Instant::now();
    let k = a.client.kill_background(&sleepers[0]).await.unwrap();
    assert!(!k.running && k.killed, "{k:?}");
    assert_eq!(k.status, Some(ExitStatus::Signal(9)));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let t = Instant::now();
    let again = a.client.kill_background(&sleepers[0]).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(again, k);
    assert!(
        eventually(Duration::from_secs(5), || pids
            .iter()
            .filter(|p| alive(**p))
            .count()
            == MAX_RUNNING_COMMANDS - 1)
        .await
    );
    // Its slot is free again.
    a.client.spawn_background(&bg("true")).await.unwrap();
    a.stop().await;
}
