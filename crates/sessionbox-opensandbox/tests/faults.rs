//! Faults give clear typed errors and leak no sandbox: server down, a wrong key (401), a 422,
//! a 500, a server that never answers, a slow create, a redirect, a web page that is not an
//! OpenSandbox server; and (issue 25) the server killed and started again while commands run
//! and between them, and a proxy that drops a command's stream mid-way. The real server is
//! used wherever it can produce the fault (a private one, for the restarts); a few one-shot
//! local listeners stand in for servers that misbehave in ways it never does.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use sessionbox_core::{ExecRequest, OutputRequest, Runtime, Session};
use sessionbox_opensandbox::{
    AgentPath, ApiKey, ClientConfig, DirectMode, OpenSandboxClient, OpenSandboxError,
};
use sessionbox_test_support::free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A local HTTP listener answering every request with `response` (or never, for `None`).
async fn fake_server(response: Option<&'static str>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = sock.read(&mut buf).await;
                match response {
                    Some(r) => {
                        let _ = sock.write_all(r.as_bytes()).await;
                        let _ = sock.shutdown().await;
                    }
                    None => tokio::time::sleep(Duration::from_secs(3600)).await,
                }
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn server_down_is_a_typed_unavailable_error() {
    let server = format!("http://127.0.0.1:{}", free_port());
    let key = ApiKey::new("k-secret-value").unwrap();
    let client = OpenSandboxClient::new(ClientConfig::new(&server, Some(key.clone()))).unwrap();
    let e = client.probe().await.unwrap_err();
    assert!(matches!(e, OpenSandboxError::Connect { .. }), "{e:?}");
    assert!(!e.to_string().contains("k-secret-value"));

    let mut config = sessionbox_opensandbox::OpenSandboxConfig::new(
        ClientConfig::new(&server, Some(key)),
        "faults",
    );
    config.timeout = Duration::from_secs(60);
    let directory =
        sessionbox_manager::StoreDirectory::new(sessionbox_store::Store::open_in_memory().unwrap());
    let rt =
        sessionbox_opensandbox::OpenSandboxRuntime::new(config, std::sync::Arc::new(directory))
            .unwrap();
    let e = rt.open(&conv("down")).await.err().unwrap();
    assert_eq!(e.code(), "runtime_unavailable", "{e}");
    assert!(e.to_string().contains("start an OpenSandbox server"), "{e}");
    assert!(!e.to_string().contains("k-secret-value"));
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let server = fake_server(None).await;
    let mut config = ClientConfig::new(&server, Some(ApiKey::new("k").unwrap()));
    config.request_timeout = Duration::from_millis(300);
    let client = OpenSandboxClient::new(config).unwrap();
    let t = std::time::Instant::now();
    let e = client.get("abc").await.unwrap_err();
    assert!(matches!(e, OpenSandboxError::Timeout { .. }), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let server = fake_server(Some(
        "HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/latest/meta-data/\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n",
    ))
    .await;
    let client =
        OpenSandboxClient::new(ClientConfig::new(&server, Some(ApiKey::new("k").unwrap())))
            .unwrap();
    let e = client.get("abc").await.unwrap_err();
    match &e {
        OpenSandboxError::Redirect {
            status, location, ..
        } => {
            assert_eq!(*status, 302);
            assert!(location.contains("169.254.169.254"));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_web_page_answering_200_is_not_a_healthy_server() {
    let server = fake_server(Some(
        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 13\r\n\
         Connection: close\r\n\r\n<html>hi</html",
    ))
    .await;
    let client =
        OpenSandboxClient::new(ClientConfig::new(&server, Some(ApiKey::new("k").unwrap())))
            .unwrap();
    let e = client.probe().await.unwrap_err();
    assert!(matches!(e, OpenSandboxError::Unhealthy { .. }), "{e:?}");
    let server = fake_server(Some(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 39\r\n\
         Connection: close\r\n\r\n{\"status\":\"healthy\",\"really\":\"no, I am\"}",
    ))
    .await;
    let client =
        OpenSandboxClient::new(ClientConfig::new(&server, Some(ApiKey::new("k").unwrap())))
            .unwrap();
    let e = client.probe().await.unwrap_err();
    assert!(matches!(e, OpenSandboxError::Unhealthy { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_is_reported_as_such_by_the_real_server() {
    let Some((domain, key)) = server() else {
        return;
    };
    let wrong = ApiKey::new(format!("{}-wrong", key.expose())).unwrap();
    let client = OpenSandboxClient::new(ClientConfig::new(&domain, Some(wrong.clone()))).unwrap();
    let e = client.probe().await.unwrap_err();
    assert!(matches!(e, OpenSandboxError::Unauthorized { .. }), "{e:?}");
    assert!(e.to_string().contains("OPEN_SANDBOX_API_KEY"), "{e}");
    assert!(!e.to_string().contains(wrong.expose()));
    let e = OpenSandboxClient::new(ClientConfig::new(&domain, None))
        .unwrap()
        .probe()
        .await
        .unwrap_err();
    assert!(matches!(e, OpenSandboxError::Unauthorized { .. }), "{e:?}");

    let (rt, _store) = runtime(&domain, wrong.clone(), "wrongkey");
    let e = rt.open(&conv("k")).await.err().unwrap();
    assert_eq!(e.code(), "unauthorized", "{e}");
    assert!(!e.to_string().contains(wrong.expose()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_422_from_the_real_server_is_typed_and_leaks_nothing() {
    let Some((domain, key)) = server() else {
        return;
    };
    // The 1.1.1 server requires resourceLimits: without them, create is a 422.
    let (rt, _store) = runtime_with(&domain, key, "e422", |c| c.resource_limits.clear());
    let e = rt.open(&conv("v")).await.err().unwrap();
    assert_eq!(e.code(), "backend_error", "{e}");
    assert!(e.to_string().contains("resourceLimits is required"), "{e}");
    assert_nothing_left(&rt).await;
    assert!(rt.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_from_the_real_server_is_typed_and_leaks_nothing() {
    let Some((domain, key)) = server() else {
        return;
    };
    // No registry is reachable: an image that is not local fails to pull, a 500.
    let (rt, _store) = runtime_with(&domain, key, "e500", |c| {
        c.image = "sessionbox/no-such-image:local".into();
    });
    let e = rt.open(&conv("v")).await.err().unwrap();
    assert_eq!(e.code(), "backend_error", "{e}");
    assert!(e.to_string().contains("500"), "{e}");
    assert_nothing_left(&rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_create_times_out_and_the_late_sandbox_is_deleted() {
    let Some((domain, key)) = server() else {
        return;
    };
    let (rt, _store) = runtime_with(&domain, key, "slow", |c| {
        c.client.create_timeout = Duration::from_millis(50);
    });
    let e = rt.open(&conv("slow")).await.err().unwrap();
    assert_eq!(e.code(), "timed_out", "{e}");
    // The server finished the create after we gave up; the runtime swept it.
    assert_nothing_left(&rt).await;
    assert!(rt.list().await.unwrap().is_empty());
}

/// A command that prints `fg 0` to `fg 49`, one every 100 ms, and writes its count to
/// `/workspace/hb` each time: a heartbeat to tell from outside whether it still runs.
const FOREGROUND: &str =
    "i=0; while [ $i -lt 50 ]; do echo fg $i; echo $i > hb; i=$((i+1)); sleep 0.1; done";

/// A background command printing `bg 0` to `bg {n-1}`, one every 100 ms.
fn background(n: u32) -> ExecRequest {
    ExecRequest::new(format!(
        "i=0; while [ $i -lt {n} ]; do echo bg $i; i=$((i+1)); sleep 0.1; done"
    ))
    .timeout(Duration::from_secs(60))
}

fn lines(prefix: &str, n: u32) -> String {
    (0..n).map(|i| format!("{prefix} {i}\n")).collect()
}

/// Runs [`FOREGROUND`] through `s`, counting its output lines in `seen`; returns its result
/// and when it came back.
async fn foreground(
    s: &dyn Session,
    seen: &AtomicUsize,
) -> (
    sessionbox_core::Result<sessionbox_core::ExecResult>,
    Instant,
) {
    let mut sink = |_: sessionbox_core::OutputStream, b: &[u8]| {
        seen.fetch_add(b.iter().filter(|c| **c == b'\n').count(), Ordering::SeqCst);
    };
    let r = s
        .exec_stream(
            ExecRequest::new(FOREGROUND).timeout(Duration::from_secs(60)),
            &mut sink,
        )
        .await;
    (r, Instant::now())
}

/// Waits until `seen` counts `n` lines (20 s at most).
async fn until_lines(seen: &AtomicUsize, n: usize) {
    let until = Instant::now() + Duration::from_secs(20);
    while seen.load(Ordering::SeqCst) < n {
        assert!(Instant::now() < until, "no output from the command");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The command that wrote the heartbeat has stopped: it stays the same for a second, short
/// of the last count.
async fn stopped(s: &dyn Session) {
    let a = s.read("hb").await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let b = s.read("hb").await.unwrap();
    assert_eq!(
        a, b,
        "the command still runs after its caller's stream was cut"
    );
    assert_ne!(b, b"49\n", "the command ran to its end");
}

/// Reads all of background command `id`'s stdout through `s`, from the start, until it has
/// ended: what a client that follows a command's output gets.
async fn all_output(s: &dyn Session, id: &str) -> String {
    let mut out = Vec::new();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let read = OutputRequest {
            stdout_from: out.len() as u64,
            wait: Duration::from_millis(500),
            ..OutputRequest::from_start()
        };
        let chunk = s
            .command_output(id, read)
            .await
            .unwrap_or_else(|e| panic!("reading the output of {id}: {e}"));
        out.extend(chunk.stdout);
        if !chunk.command.running {
            return String::from_utf8(out).unwrap();
        }
        assert!(Instant::now() < until, "{id} did not end");
    }
}

/// The server is killed (`SIGKILL`, a crash) while two conversations run a command, and
/// started again; then killed and started again between commands. Its sandboxes are
/// containers and survive it: the command that streams straight from its sandbox's agent
/// (the direct endpoint) runs to its end with all its output; the one that streams through
/// the server's proxy fails at once with a typed error that says what happened, and its
/// agent, whose caller went away, stops it. While the server is down an open is a typed
/// `runtime_unavailable`. Once it is back, a session held across the restart and a new open
/// both reach the same sandbox (no state lost), the files written before are there, and a
/// background command started before the crash has run on, its output whole. Destroy leaves
/// nothing on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_restart_keeps_the_sandboxes_and_fails_a_proxied_command_typed() {
    let Some(mut private) = PrivateServer::start().await else {
        return;
    };
    let (_, key) = server().unwrap();
    let (proxied, _s1) = runtime_with(&private.domain, key.clone(), "rs-proxy", |c| {
        c.direct = DirectMode::Off;
    });
    let (direct, _s2) = runtime_with(&private.domain, key, "rs-direct", |_| {});
    let (p, d) = (conv("restart-proxied"), conv("restart-direct"));
    let sp = proxied.open(&p).await.unwrap();
    let sd = direct.open(&d).await.unwrap();
    let pid = proxied.sandbox_id(&p.key).await.unwrap().unwrap();
    let did = direct.sandbox_id(&d.key).await.unwrap().unwrap();
    assert!(matches!(
        direct.agent_path(&did),
        Some(AgentPath::Direct { .. })
    ));
    sp.write("acked.txt", b"acknowledged\n").await.unwrap();
    let bg = sp.spawn(background(40)).await.unwrap();

    let (seen_p, seen_d) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let mut killed_at = None;
    let ((rp, p_back), (rd, _), ()) = tokio::join!(
        foreground(&*sp, &seen_p),
        foreground(&*sd, &seen_d),
        async {
            until_lines(&seen_p, 3).await;
            until_lines(&seen_d, 3).await;
            private.kill();
            killed_at = Some(Instant::now());
            // Down: an open says so, typed.
            let e = proxied.open(&p).await.err().expect("the server is down");
            assert_eq!(e.code(), "runtime_unavailable", "{e}");
            private.restart().await;
        }
    );
    let killed_at = killed_at.unwrap();
    let e = rp.expect_err("the proxied stream was cut");
    assert!(
        p_back.duration_since(killed_at) < Duration::from_secs(5),
        "{:?}",
        p_back.duration_since(killed_at)
    );
    assert_eq!(e.code(), "backend_error", "{e}");
    assert!(e.to_string().contains("broke while the command ran"), "{e}");
    let rd = rd.expect("the direct stream does not go through the server");
    assert_eq!(String::from_utf8_lossy(&rd.stdout), lines("fg", 50));

    // Back: the held session and a new open reach the same sandbox, files intact.
    stopped(&*sp).await;
    assert_eq!(sp.read("acked.txt").await.unwrap(), b"acknowledged\n");
    let again = proxied.open(&p).await.unwrap();
    assert!(!again.state_lost());
    assert_eq!(proxied.sandbox_id(&p.key).await.unwrap().unwrap(), pid);
    assert_eq!(all_output(&*again, &bg.id).await, lines("bg", 40));

    // Killed and started again between commands: nothing to notice.
    private.kill();
    private.restart().await;
    let r = sp
        .exec(ExecRequest::new("cat acked.txt").timeout(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(r.stdout, b"acknowledged\n");
    let again = direct.open(&d).await.unwrap();
    assert_eq!(direct.sandbox_id(&d.key).await.unwrap().unwrap(), did);
    assert!(!again.state_lost());
    drop((sp, sd, again));

    proxied.destroy(&p.key).await.unwrap();
    direct.destroy(&d.key).await.unwrap();
    assert_nothing_left(&proxied).await;
    assert_nothing_left(&direct).await;
}

/// A proxy between the client and the server drops every connection while a command streams
/// its output through the server's proxy (a relay this test controls; the server stays up).
/// The command's caller gets a typed error at once; the server passes the cut on to the
/// sandbox's agent, which stops the command. A background command's output does not depend on
/// any connection: read again, it is whole; a read of a quiet one's, cut while it waited for
/// output, is sent again (it changes nothing) and gets the output. The next calls go through,
/// and the files are intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_cut_mid_command_fails_it_typed_and_loses_no_background_output() {
    let Some((domain, key)) = server() else {
        return;
    };
    let relay = Relay::start(domain.trim_start_matches("http://").to_owned()).await;
    let (rt, _store) = runtime_with(&relay.url, key, "cut", |c| c.direct = DirectMode::Off);
    let c = conv("stream-cut");
    let s = rt.open(&c).await.unwrap();
    s.write("acked.txt", b"acknowledged\n").await.unwrap();
    let bg = s.spawn(background(30)).await.unwrap();

    let seen = AtomicUsize::new(0);
    let mut cut_at = None;
    let ((r, back), ()) = tokio::join!(foreground(&*s, &seen), async {
        until_lines(&seen, 3).await;
        assert!(
            relay.cut() >= 1,
            "the command's stream does not cross the relay"
        );
        cut_at = Some(Instant::now());
    });
    let e = r.expect_err("the stream was cut");
    assert!(back.duration_since(cut_at.unwrap()) < Duration::from_secs(5));
    assert_eq!(e.code(), "backend_error", "{e}");
    assert!(e.to_string().contains("broke while the command ran"), "{e}");
    stopped(&*s).await;

    assert_eq!(all_output(&*s, &bg.id).await, lines("bg", 30));

    // A read that waits for a quiet command's output, cut while it waits: it changes nothing,
    // so the runtime sends it again on a new connection, and it gets the output.
    let quiet = s
        .spawn(ExecRequest::new("sleep 3; echo late").timeout(Duration::from_secs(30)))
        .await
        .unwrap();
    let wait = OutputRequest {
        wait: Duration::from_secs(10),
        ..OutputRequest::from_start()
    };
    let (read, ()) = tokio::join!(s.command_output(&quiet.id, wait), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(relay.cut() >= 1, "the read does not cross the relay");
    });
    let read = read.expect("the cut read is sent again");
    assert_eq!(read.stdout, b"late\n");
    assert_eq!(all_output(&*s, &quiet.id).await, "late\n");
    assert_eq!(s.read("acked.txt").await.unwrap(), b"acknowledged\n");
    drop(s);
    rt.destroy(&c.key).await.unwrap();
    assert_nothing_left(&rt).await;
}
