//! The HTTP surface: the access token, body limits, malformed bodies, and the binary itself
//! (token from the environment never reaching commands, idle-timeout exit, an inherited socket).

use crate::common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{TestAgent, raw_unix, request};
use sessionbox_agent::AccessToken;
use sessionbox_execd::{Endpoint, ExecdClient, Permission, RunCommandRequest, UploadFile};

const TOKEN: &str = "tok-3f9a1c77e2";

#[tokio::test(flavor = "multi_thread")]
async fn the_token_is_required_and_never_echoed() {
    let a = TestAgent::start_with(|c| c.token = Some(AccessToken::new(TOKEN))).await;
    // With the token (the client sends it): fine.
    a.client.ping().await.unwrap();
    let o = a
        .client
        .run_command(&RunCommandRequest::shell("echo ok").exact_output())
        .await
        .unwrap();
    assert_eq!(o.stdout_text(), "ok\n");

    // Without it, or with a wrong one: 401 with upstream's body, the presented value not echoed.
    let bare = ExecdClient::unix(&a.socket).unwrap();
    let e = bare.ping().await.unwrap_err();
    assert_eq!(e.status(), Some(401), "{e}");
    let wrong = "wrong-presented-value-8d2e";
    for value in [wrong, &TOKEN[..TOKEN.len() - 1], &format!("{TOKEN}x")] {
        let h = format!("X-EXECD-ACCESS-TOKEN: {value}");
        for (method, path, body) in [
            ("GET", "/ping", &b""[..]),
            ("POST", "/command", &br#"{"command":"touch pwned"}"#[..]),
            ("GET", "/files/download?path=x", &b""[..]),
        ] {
            let r = a.raw(&request(method, path, &[&h], body)).await;
            assert_eq!(r.status, 401, "{method} {path}");
            let text = r.text();
            assert!(!text.contains(value), "{text}");
            assert!(!text.contains(TOKEN), "{text}");
            assert!(r.headers.iter().all(|(_, v)| !v.contains(value)));
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert!(
                v["error"]
                    .as_str()
                    .unwrap()
                    .contains("X-EXECD-ACCESS-TOKEN")
            );
        }
    }
    assert!(!a.root.join("pwned").exists());
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_are_bounded_and_malformed_ones_change_nothing() {
    let a = TestAgent::start_with(|c| {
        c.max_request_bytes = 1024;
        c.max_upload_bytes = 4096;
    })
    .await;
    let json = ["Content-Type: application/json"];

    // Over the limit, declared...
    let mut big = BTreeMap::new();
    for i in 0..100 {
        big.insert(format!("dir-{i:04}"), Permission::default());
    }
    let body = serde_json::to_vec(&big).unwrap();
    assert!(body.len() > 1024);
    let r = a.raw(&request("POST", "/directories", &json, &body)).await;
    assert_eq!(r.status, 413, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert!(v["message"].as_str().unwrap().contains("1024"), "{v}");
    // ...and chunked, without a length.
    let mut chunked = b"POST /directories HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for piece in body.chunks(100) {
        chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend_from_slice(piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let r = a.raw(&chunked).await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(
        std::fs::read_dir(&a.root).unwrap().count(),
        0,
        "nothing was created"
    );

    // An upload over its own limit.
    let e = a
        .client
        .upload(&[UploadFile::new("big.bin", vec![7u8; 8192])])
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(413));
    assert!(!a.root.join("big.bin").exists());
    // A command request over the JSON limit.
    let long = "x".repeat(2000);
    let e = a
        .client
        .run_command(&RunCommandRequest::shell(format!("echo {long}")))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(413));

    // Malformed JSON: 400 with the parser's reason; nothing changes.
    std::fs::write(a.root.join("keep.txt"), "keep").unwrap();
    for (path, body) in [
        ("/directories", &br#"{"made": "#[..]),
        ("/directories", &b"[1,2]"[..]),
        ("/files/mv", &br#"[{"src":"keep.txt"}]"#[..]),
        (
            "/files/mv",
            &br#"{"src":"keep.txt","dest":"moved.txt"}"#[..],
        ),
        (
            "/files/replace?verbose=true",
            &br#"{"keep.txt":{"old":"keep"}}"#[..],
        ),
        (
            "/files/replace",
            &br#"{"keep.txt":{"old":"","new":"x"}}"#[..],
        ),
        ("/command", &br#"{"command": 5}"#[..]),
        ("/command", &b"not json"[..]),
        (
            "/command",
            &br#"{"command":"touch made","argv":["touch","made"]}"#[..],
        ),
    ] {
        let r = a.raw(&request("POST", path, &json, body)).await;
        assert_eq!(
            r.status,
            400,
            "{path} {}: {}",
            String::from_utf8_lossy(body),
            r.text()
        );
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["code"], "INVALID_REQUEST_BODY", "{v}");
        assert!(!v["message"].as_str().unwrap().is_empty());
    }
    let names: Vec<_> = std::fs::read_dir(&a.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["keep.txt"]);
    assert_eq!(
        std::fs::read_to_string(a.root.join("keep.txt")).unwrap(),
        "keep"
    );

    // Malformed uploads.
    let form = ["Content-Type: multipart/form-data; boundary=B"];
    for body in [
        &b"garbage"[..],
        &b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nx\r\n--B--\r\n"[..],
        &b"--B\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n\r\n{bad\r\n--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nx\r\n--B--\r\n"[..],
    ] {
        let r = a.raw(&request("POST", "/files/upload", &form, body)).await;
        assert_eq!(r.status, 400, "{}", r.text());
    }
    let r = a.raw(&request("POST", "/files/upload", &json, b"{}")).await;
    assert_eq!(r.status, 400);
    // Missing query parameters and unknown endpoints.
    for (m, p) in [
        ("GET", "/files/search"),
        ("GET", "/directories/list"),
        ("DELETE", "/command"),
    ] {
        let r = a.raw(&request(m, p, &[], b"")).await;
        assert_eq!(r.status, 400, "{m} {p}");
        assert!(r.text().contains("MISSING_QUERY"));
    }
    let r = a.raw(&request("GET", "/nope", &[], b"")).await;
    assert_eq!(r.status, 404);
    a.stop().await;
}

fn agent_bin() -> &'static str {
    env!("CARGO_BIN_EXE_sessionbox-agent")
}

/// Reads the "listening on" line the binary prints once it accepts connections.
fn wait_listening(child: &mut std::process::Child) -> String {
    let out = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    line.trim()
        .strip_prefix("sessionbox-agent listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned()
}

fn wait_exit(child: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_takes_the_token_from_the_environment_and_hides_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    std::fs::create_dir(&root).unwrap();
    let sock = dir.path().join("a.sock");
    let mut child = Command::new(agent_bin())
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .arg("--root")
        .arg(&root)
        .env("EXECD_ACCESS_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(
        wait_listening(&mut child),
        format!("unix:{}", sock.display())
    );
    let client = ExecdClient::builder(Endpoint::Unix(sock.clone()))
        .token(TOKEN)
        .build()
        .unwrap();
    let o = client
        .run_command(&RunCommandRequest::shell(
            "env; cat /proc/$PPID/cmdline | tr '\\0' ' '",
        ))
        .await
        .unwrap();
    assert_eq!(o.exit_code, Some(0));
    assert!(!o.stdout_text().contains(TOKEN), "{}", o.stdout_text());
    assert!(
        !o.stdout_text().contains("EXECD_ACCESS_TOKEN"),
        "{}",
        o.stdout_text()
    );
    assert!(
        o.stdout_text().contains("sessionbox-agent"),
        "the parent is the agent: {}",
        o.stdout_text()
    );
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains(TOKEN));
    assert_eq!(
        ExecdClient::unix(&sock)
            .unwrap()
            .ping()
            .await
            .unwrap_err()
            .status(),
        Some(401)
    );

    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    );
    let s = wait_exit(&mut child, Duration::from_secs(10)).expect("SIGTERM stops the agent");
    assert!(s.success(), "{s:?}");
    assert!(!sock.exists(), "the socket is removed on exit");

    // A token file works as well; an empty one is refused.
    let tf = dir.path().join("token");
    std::fs::write(&tf, "\n").unwrap();
    let out = Command::new(agent_bin())
        .args(["--listen", "tcp:127.0.0.1:0", "--token-file"])
        .arg(&tf)
        .arg("--root")
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("empty"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_exits_after_the_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    std::fs::create_dir(&root).unwrap();
    let sock = dir.path().join("a.sock");
    let started = Instant::now();
    let mut child = Command::new(agent_bin())
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .arg("--root")
        .arg(&root)
        .args(["--idle-timeout", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_listening(&mut child);
    let client = ExecdClient::unix(&sock).unwrap();
    // A running command keeps it alive past the timeout.
    let o = client
        .run_command(&RunCommandRequest::shell("sleep 1.6; echo done").exact_output())
        .await
        .unwrap();
    assert_eq!(o.stdout_text(), "done\n");
    assert!(
        child.try_wait().unwrap().is_none(),
        "alive while a command ran"
    );
    let status = wait_exit(&mut child, Duration::from_secs(10)).expect("exits when idle");
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
    assert!(!sock.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_serves_an_inherited_socket() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    std::fs::create_dir(&root).unwrap();
    let sock = dir.path().join("inherited.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new(agent_bin());
    cmd.args(["--listen-fd", &fd.to_string(), "--idle-timeout", "30"])
        .arg("--root")
        .arg(&root)
        .stdout(Stdio::piped());
    // SAFETY: runs in the child between fork and exec; fcntl is async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            let fd = std::os::fd::BorrowedFd::borrow_raw(fd);
            rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(listener);
    assert_eq!(
        wait_listening(&mut child),
        format!("unix:{}", sock.display())
    );
    let r = raw_unix(&sock, &request("GET", "/ping", &[], b"")).await;
    assert_eq!(r.status, 200);
    // The inherited descriptor does not leak into commands.
    let client = ExecdClient::unix(&sock).unwrap();
    let o = client
        .run_command(&RunCommandRequest::shell("ls /proc/self/fd | wc -l"))
        .await
        .unwrap();
    assert_eq!(
        o.stdout_text().trim(),
        "4",
        "only 0, 1, 2 and ls's own directory"
    );
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    );
    assert!(
        wait_exit(&mut child, Duration::from_secs(10))
            .unwrap()
            .success()
    );
    assert!(
        Path::new(&sock).exists(),
        "an inherited socket's file is the launcher's"
    );

    // A descriptor that is not a listening socket is refused.
    let out = Command::new(agent_bin())
        .args(["--listen-fd", "1"])
        .arg("--root")
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Attack: `sessionbox agent` started on a host with no flags would offer unauthenticated
/// command execution to the network. With no flags it listens on loopback only; a non-loopback
/// address without a token is refused at start with a message saying what to do (exit 2,
/// nothing listening); with a token it serves, and a request without the token (or with a wrong
/// one) is 401 and runs nothing; `--insecure-no-token` (the OpenSandbox bootstrap's explicit
/// choice) serves without one.
#[tokio::test(flavor = "multi_thread")]
async fn with_no_flags_the_agent_listens_on_loopback_and_the_network_needs_a_token() {
    use clap::Parser;
    // No flags: loopback only, no token.
    let config = sessionbox_agent::Cli::try_parse_from(["sessionbox-agent"])
        .unwrap()
        .into_config()
        .unwrap();
    match config.listen {
        sessionbox_agent::Listen::Tcp(addr) => {
            assert!(addr.ip().is_loopback(), "{addr}");
            assert_eq!(addr.port(), 44772);
        }
        other => panic!("listens on {other}"),
    }
    assert!(config.token.is_none());

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    std::fs::create_dir(&root).unwrap();
    // A network address without a token: refused before anything listens.
    for listen in ["tcp:0.0.0.0:0", "tcp:[::]:0", "0.0.0.0:0"] {
        let out = Command::new(agent_bin())
            .args(["--listen", listen, "--root"])
            .arg(&root)
            .env_remove("EXECD_ACCESS_TOKEN")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{listen}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("not a loopback address, without an access token")
                && err.contains("--token-file")
                && err.contains("--insecure-no-token"),
            "{listen}: {err}"
        );
        assert!(out.stdout.is_empty(), "{listen}: it listened");
    }

    // An explicit network address with a token: served, and the token is required.
    let tf = dir.path().join("token");
    std::fs::write(&tf, format!("{TOKEN}\n")).unwrap();
    let start = |extra: &[&str]| {
        let mut child = Command::new(agent_bin())
            .args(["--listen", "tcp:0.0.0.0:0", "--root"])
            .arg(&root)
            .args(extra)
            .env_remove("EXECD_ACCESS_TOKEN")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let at = wait_listening(&mut child);
        let port: u16 = at.rsplit(':').next().unwrap().parse().unwrap();
        (child, format!("http://127.0.0.1:{port}"))
    };
    let stop = |mut child: std::process::Child| {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
            rustix::process::Signal::TERM,
        );
        wait_exit(&mut child, Duration::from_secs(10)).expect("SIGTERM stops the agent");
    };
    let (child, url) = start(&["--token-file", tf.to_str().unwrap()]);
    let bare = ExecdClient::builder(Endpoint::Http(url.clone()))
        .build()
        .unwrap();
    assert_eq!(bare.ping().await.unwrap_err().status(), Some(401));
    let e = bare
        .run_command(&RunCommandRequest::shell("touch pwned"))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(401), "{e}");
    let wrong = ExecdClient::builder(Endpoint::Http(url.clone()))
        .token("not-the-token")
        .build()
        .unwrap();
    assert_eq!(wrong.ping().await.unwrap_err().status(), Some(401));
    assert!(
        !root.join("pwned").exists(),
        "a request without the token ran"
    );
    let with = ExecdClient::builder(Endpoint::Http(url.clone()))
        .token(TOKEN)
        .build()
        .unwrap();
    let o = with
        .run_command(&RunCommandRequest::shell("echo ok").exact_output())
        .await
        .unwrap();
    assert_eq!(o.stdout_text(), "ok\n");
    stop(child);

    // Explicitly without a token (what the OpenSandbox bootstrap passes): served.
    let (child, url) = start(&["--insecure-no-token"]);
    let open = ExecdClient::builder(Endpoint::Http(url.clone()))
        .build()
        .unwrap();
    open.ping().await.unwrap();
    stop(child);
}
