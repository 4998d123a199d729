//! Live stdin of background commands (`keep_stdin_open`, `/sessionbox/v1/commands/{id}/stdin`)
//! through the real client against a real agent: lines reach the command as they are written,
//! a command that does not read makes a write time out with what the pipe took (never block
//! forever, never buffer without bound), and every refusal is typed.

use crate::common;

use std::time::{Duration, Instant};

use common::TestAgent;
use sessionbox_core::{
    Error, ExecRequest, MAX_STDIN_BYTES, OutputRequest, STDIN_WRITE_WAIT, validate_command_id,
};
use sessionbox_execd::RunCommandRequest;
use sessionbox_execd::commands_ext::run_request;

fn live(command: &str) -> RunCommandRequest {
    run_request(&ExecRequest::new(command).keep_stdin_open(), ".".into())
}

/// stdout of `id` once it contains `want` (within 10 s).
async fn stdout_with(a: &TestAgent, id: &str, want: &str) -> String {
    let end = Instant::now() + Duration::from_secs(10);
    let mut read = OutputRequest::from_start();
    read.wait = Duration::from_millis(500);
    loop {
        let o = a.client.background_output(id, read).await.unwrap();
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        if text.contains(want) || Instant::now() > end {
            return text;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lines_reach_the_command_as_they_are_written_and_close_ends_its_input() {
    let a = TestAgent::start().await;
    let c = a
        .client
        .spawn_background(&live(
            "while read l; do echo \"got $l\"; done; echo \"eof\"; exit 3",
        ))
        .await
        .unwrap();
    validate_command_id(&c.id).unwrap();
    let t = Instant::now();
    let w = a.client.write_stdin(&c.id, b"a\n").await.unwrap();
    assert_eq!((w.written, w.timed_out), (2, false));
    let out = stdout_with(&a, &c.id, "got a").await;
    let first = t.elapsed();
    assert_eq!(out, "got a\n", "the line arrived before stdin closed");
    assert!(first < Duration::from_secs(2), "{first:?}");
    eprintln!("\"got a\" {first:?} after the write");
    // Exact bytes, in order.
    a.client.write_stdin(&c.id, b"b \x01\xff\n").await.unwrap();
    a.client.write_stdin(&c.id, b"c").await.unwrap();
    a.client.write_stdin(&c.id, b"\n").await.unwrap();
    a.client.close_stdin(&c.id).await.unwrap();
    let out = stdout_with(&a, &c.id, "eof").await;
    assert!(out.ends_with("eof\n"), "{out:?}");
    let mut read = OutputRequest::from_start();
    read.wait = Duration::from_secs(10);
    let o = a.client.background_output(&c.id, read).await.unwrap();
    assert_eq!(o.stdout, b"got a\ngot b \x01\xff\ngot c\neof\n");
    assert_eq!(o.command.status, Some(sessionbox_core::ExitStatus::Code(3)));
    // Closed and ended: writes are refused, closing again does nothing.
    let e = Error::from(a.client.write_stdin(&c.id, b"late").await.unwrap_err());
    assert!(matches!(e, Error::Conflict(_)), "{e:?}");
    a.client.close_stdin(&c.id).await.unwrap();
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_that_does_not_read_makes_a_write_time_out_with_what_the_pipe_took() {
    let a = TestAgent::start().await;
    let c = a.client.spawn_background(&live("sleep 60")).await.unwrap();
    let t = Instant::now();
    let w = a
        .client
        .write_stdin(&c.id, &vec![b'x'; MAX_STDIN_BYTES])
        .await
        .unwrap();
    let took = t.elapsed();
    eprintln!("a 1 MiB write to a command that does not read: {w:?} after {took:?}");
    assert!(w.timed_out);
    assert!(w.written > 0 && w.written < MAX_STDIN_BYTES as u64, "{w:?}");
    assert!(
        took >= STDIN_WRITE_WAIT && took < STDIN_WRITE_WAIT + Duration::from_secs(3),
        "{took:?}"
    );
    // One byte over the limit of one write is refused before anything is written: by the
    // client before sending (a peer refusing a body early closes the connection under the
    // sender, who would see a broken pipe)...
    let e = Error::from(
        a.client
            .write_stdin(&c.id, &vec![b'y'; MAX_STDIN_BYTES + 1])
            .await
            .unwrap_err(),
    );
    assert!(matches!(e, Error::TooLarge { .. }), "{e:?}");
    // ...and by the agent, from the declared length, before reading any of it.
    let over = format!("Content-Length: {}", MAX_STDIN_BYTES + 1);
    let head = format!(
        "POST /sessionbox/v1/commands/{}/stdin HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n{over}\r\n\r\n",
        c.id
    );
    let r = a.raw(head.as_bytes()).await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.text().contains("too_large"), "{}", r.text());
    a.client.kill_background(&c.id).await.unwrap();
    let e = Error::from(a.client.write_stdin(&c.id, b"x").await.unwrap_err());
    assert!(matches!(e, Error::Conflict(_)), "{e:?}");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stdin_refusals_are_typed() {
    let a = TestAgent::start().await;
    // Not kept open.
    let c = a
        .client
        .spawn_background(&run_request(&ExecRequest::new("sleep 5"), ".".into()))
        .await
        .unwrap();
    let e = Error::from(a.client.write_stdin(&c.id, b"x").await.unwrap_err());
    assert!(
        matches!(e, Error::Conflict(ref m) if m.contains("keep_stdin_open")),
        "{e:?}"
    );
    let e = Error::from(a.client.close_stdin(&c.id).await.unwrap_err());
    assert!(matches!(e, Error::Conflict(_)), "{e:?}");
    // Unknown.
    let e = Error::from(a.client.write_stdin("0123abcd", b"x").await.unwrap_err());
    assert!(matches!(e, Error::NotFound(_)), "{e:?}");
    // A command that stops reading: the next write says so.
    let c2 = a
        .client
        .spawn_background(&live("exec 0<&-; sleep 5"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let e = Error::from(a.client.write_stdin(&c2.id, b"x\n").await.unwrap_err());
    assert!(
        matches!(e, Error::Conflict(ref m) if m.contains("stopped reading")),
        "{e:?}"
    );
    // Foreground with keep_stdin_open, and both stdin bytes and keep_stdin_open: 400.
    let mut fg = RunCommandRequest::shell("cat");
    fg.keep_stdin_open = true;
    let r = a.client.run_command(&fg).await;
    assert!(r.is_err(), "{r:?}");
    let mut both = live("cat");
    both.stdin = Some(b"x".to_vec());
    let e = Error::from(a.client.spawn_background(&both).await.unwrap_err());
    assert!(matches!(e, Error::InvalidRequest(_)), "{e:?}");
    for id in [&c.id, &c2.id] {
        a.client.kill_background(id).await.unwrap();
    }
    a.stop().await;
}
