//! Fault injection on the egress gateway of an `isolated` conversation (issue 25): the
//! gateway is killed with `SIGKILL` while a transfer runs through it, through `sessionbox
//! serve` (whose session of the conversation is kept between requests) and through the CLI
//! (a new process per command).
//!
//! What must hold: the transfer in the sandbox fails promptly instead of hanging; while the
//! gateway is dead nothing leaves the sandbox (fail closed: no route but loopback, a direct
//! connection goes nowhere, the proxy answers `502` saying why); the conversation's next
//! command starts the gateway again, in the same sandbox, and allowed egress works again,
//! denied egress is still denied; the verdict log holds every connection the gateways
//! decided and finished, once; and destroy leaves no gateway, sandbox or run directory.
//!
//! Needs root, `ip` (iproute2) and `curl`; fails, never skips, without them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sessionbox_core::ConversationRef;
use sessionbox_local::isolated::SandboxInfo;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::egress::{Data, Served, TestNet, dns, json_of};

/// What the slow server saw: the paths asked, and the bytes of `/slow` sent so far.
#[derive(Default)]
struct Seen {
    paths: Mutex<Vec<String>>,
    slow_sent: AtomicU64,
}

/// An HTTP/1.1 server on `l`: `/slow` is 64 MiB sent 16 KiB every 10 ms (far longer than the
/// test waits), anything else `hello from PATH`.
fn slow_http_on(l: tokio::net::TcpListener) -> Arc<Seen> {
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = l.accept().await {
            let seen = s.clone();
            tokio::spawn(async move {
                let mut r = BufReader::new(conn);
                let mut path = None;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    if line == "\r\n" {
                        break;
                    }
                    if path.is_none() {
                        path = line.split_whitespace().nth(1).map(str::to_owned);
                    }
                }
                let path = path.unwrap_or_default();
                seen.paths.lock().unwrap().push(path.clone());
                let conn = r.get_mut();
                if path == "/slow" {
                    let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", 64 << 20);
                    if conn.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunk = vec![b'x'; 16 * 1024];
                    while conn.write_all(&chunk).await.is_ok() {
                        seen.slow_sent
                            .fetch_add(chunk.len() as u64, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                } else {
                    let body = format!("hello from {path}\n");
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = conn.write_all(resp.as_bytes()).await;
                }
            });
        }
    });
    seen
}

/// What the runtime recorded about the conversation's sandbox.
fn record(data: &Data, conv: &ConversationRef) -> SandboxInfo {
    let path = data
        .path
        .join("run")
        .join(conv.key.as_str())
        .join("sandbox.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Kills the recorded gateway with `SIGKILL`; returns its pid.
fn kill_gateway(data: &Data, conv: &ConversationRef) -> u32 {
    let pid = record(data, conv).gateway_pid.expect("a gateway");
    let p = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(p, rustix::process::Signal::KILL).unwrap();
    pid
}

/// Waits until process `pid` is gone or a zombie (killed, not yet collected).
async fn ended(pid: u32) -> bool {
    for _ in 0..250 {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit(") ").next().map(|r| r.starts_with('Z')));
        if state.is_none_or(|zombie| zombie) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Destroys conversation `gw` of tenant `acme` when dropped: a failed test leaves no sandbox,
/// gateway or mounted volume behind either.
struct DestroyOnDrop(Arc<Data>);

impl Drop for DestroyOnDrop {
    fn drop(&mut self) {
        let _ = self.0.cli(&["--tenant", "acme", "destroy", "-c", "gw"]);
    }
}

/// The conversation's verdicts (`egress-log --json`), read again for up to 10 s until their
/// counts add up to at least `want` (the test fails when they never do).
fn verdicts(data: &Data, want: u64) -> Vec<serde_json::Value> {
    let started = Instant::now();
    loop {
        let log: Vec<serde_json::Value> = serde_json::from_str(&data.ok(&[
            "--tenant",
            "acme",
            "egress-log",
            "-c",
            "gw",
            "--json",
        ]))
        .unwrap();
        let n: u64 = log.iter().map(|e| e["count"].as_u64().unwrap()).sum();
        if n >= want {
            return log;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{n} verdicts logged, not {want}: {log:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The gateway is killed mid-transfer, twice: once under a session `serve` keeps, once before
/// a command from a new CLI process. See the module documentation for what must hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_killed_mid_transfer_fails_closed_and_the_next_command_restarts_it() {
    let net = TestNet::new(5);
    let http = net.listen();
    let port = http.local_addr().unwrap().port();
    let seen = slow_http_on(http);
    let dns = dns(HashMap::from([
        ("www.allowed.test".to_owned(), net.peer),
        ("denied.test".to_owned(), net.peer),
    ]))
    .await;
    let data = Arc::new(Data::new(dns.addr));
    // Destroyed whatever happens (`Data` destroys only the default tenant's conversations).
    let _destroy = DestroyOnDrop(data.clone());
    let key = data
        .ok(&["--tenant", "acme", "keys", "create"])
        .trim()
        .to_owned();
    let conv = ConversationRef::parse("acme", "gw").unwrap();
    data.ok(&[
        "--tenant",
        "acme",
        "policy",
        "set",
        "-c",
        "gw",
        "--allow",
        "*.allowed.test",
        "--allow",
        &net.cidr,
        "--deny",
        "denied.test",
    ]);
    let served = Served::start(&data);
    let http = reqwest::Client::new();
    let base = format!("{}/v1/conversations/gw", served.base);
    let exec = |cmd: String| {
        let (http, base, key) = (http.clone(), base.clone(), key.clone());
        async move {
            let r = http
                .post(format!("{base}/exec"))
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .body(serde_json::json!({"command": cmd, "timeout_ms": 60000}).to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let v = json_of(r).await;
            format!(
                "{}{}",
                v["stdout"].as_str().unwrap(),
                v["stderr"].as_str().unwrap()
            )
        }
    };
    let get = |path: &str| format!("curl -sS -m 10 http://www.allowed.test:{port}{path}");

    // Through the gateway, as allowed.
    assert_eq!(exec(get("/first")).await, "hello from /first\n");
    assert_eq!(data.gateways(), 1);
    let before = record(&data, &conv);

    // A long transfer through a CONNECT tunnel; once the gateway is dead, the same command
    // tries the way out without the proxy and through it again, and looks at its routes.
    let script = format!(
        "curl -sS -p -o /dev/null -w 'slow=%{{http_code}} bytes=%{{size_download}}' -m 60 \
           http://www.allowed.test:{port}/slow; echo \" rc=$?\"; \
         curl -sS --noproxy '*' --connect-timeout 3 -m 5 -o /dev/null http://{peer}:{port}/direct; \
           echo \"direct rc=$?\"; \
         curl -sS -m 5 -w ' code=%{{http_code}}' http://www.allowed.test:{port}/while-dead; \
           echo \" proxy rc=$?\"; \
         echo \"routes=$(tail -n +2 /proc/net/route | wc -l) links=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' ')\"",
        peer = net.peer,
    );
    let running = tokio::spawn(exec(script));
    let until = Instant::now() + Duration::from_secs(20);
    while seen.slow_sent.load(Ordering::SeqCst) < 1 << 20 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        seen.slow_sent.load(Ordering::SeqCst) >= 1 << 20,
        "the transfer never ran"
    );
    let killed_at = Instant::now();
    let old = kill_gateway(&data, &conv);
    let out = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the sandbox's command hung after the gateway was killed")
        .unwrap();
    let took = killed_at.elapsed();
    eprintln!("after the kill ({took:?}):\n{out}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    // The transfer broke off, short of its length.
    let slow = out.lines().next().unwrap();
    assert!(slow.starts_with("slow=200 bytes="), "{out}");
    assert!(!slow.ends_with(" rc=0"), "{out}");
    // No way out without the gateway: no route, so no direct connection was even tried on
    // the wire, and the proxy says why.
    assert!(!out.contains("direct rc=0"), "{out}");
    assert!(
        out.contains("egress gateway is not running") && out.contains("code=502"),
        "{out}"
    );
    assert!(out.contains("routes=0 links=lo \n"), "{out}");
    let paths = seen.paths.lock().unwrap().clone();
    assert_eq!(paths, ["/first", "/slow"], "reached the server: {paths:?}");
    assert!(ended(old).await);
    assert_eq!(data.gateways(), 0);

    // The next command (the session `serve` kept) starts it again, in the same sandbox.
    assert_eq!(exec(get("/after")).await, "hello from /after\n");
    let now = record(&data, &conv);
    assert_eq!(
        (now.init_pid, now.monitor_pid),
        (before.init_pid, before.monitor_pid)
    );
    assert_ne!(now.gateway_pid, Some(old));
    assert_eq!(data.gateways(), 1);
    let code = exec(format!(
        "curl -sS -m 10 -o /dev/null -w '%{{http_code}}' http://denied.test:{port}/no"
    ))
    .await;
    assert_eq!(code, "403");
    // The restarted gateway logs what it decides. (Before the next kill: a gateway writes a
    // verdict when its connection ends, and holds those that follow a write by less than a
    // second until the second is over; a `SIGKILL` loses what it holds, and the verdict of
    // every tunnel still open, such as the one cut above.)
    verdicts(&data, 3);

    // Killed again, between commands: a new CLI process's command starts it again too.
    let second = kill_gateway(&data, &conv);
    assert!(ended(second).await);
    drop(served);
    let (d, cmd) = (data.clone(), get("/cli"));
    let out = tokio::task::spawn_blocking(move || {
        d.cli(&[
            "--tenant",
            "acme",
            "exec",
            "-c",
            "gw",
            "--timeout",
            "30",
            "--",
            &cmd,
        ])
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from /cli\n");
    assert_eq!(record(&data, &conv).init_pid, before.init_pid);
    assert_eq!(data.gateways(), 1);
    assert_eq!(
        seen.paths.lock().unwrap().clone(),
        ["/first", "/slow", "/after", "/cli"]
    );

    // The verdicts: each finished connection once (aggregated rows count them), the denied
    // one, and nothing for what never reached a gateway (the attempts while it was dead).
    let log = verdicts(&data, 4);
    let count = |verdict: &str, method: &str, target: &str| -> u64 {
        log.iter()
            .filter(|e| e["verdict"] == verdict && e["method"] == method && e["target"] == target)
            .map(|e| e["count"].as_u64().unwrap())
            .sum()
    };
    let allowed = format!("www.allowed.test:{port}");
    assert_eq!(count("allowed", "GET", &allowed), 3, "{log:#?}");
    assert_eq!(
        count("denied", "GET", &format!("denied.test:{port}")),
        1,
        "{log:#?}"
    );
    assert!(
        !log.iter().any(|e| e["target"]
            .as_str()
            .unwrap()
            .starts_with(&net.peer.to_string())),
        "{log:#?}"
    );

    // Destroy: no gateway, no sandbox process, no run directory or workspace.
    let run: PathBuf = data.path.join("run").join(conv.key.as_str());
    data.ok(&["--tenant", "acme", "destroy", "-c", "gw"]);
    assert_eq!(data.gateways(), 0);
    assert!(!run.exists());
    assert!(
        !data
            .path
            .join("workspaces")
            .join(conv.key.as_str())
            .exists()
    );
    for c in &now.cgroups {
        assert!(!c.exists(), "cgroup {} is left", c.display());
    }
}
