//! Containment of the egress gateway (issue #18), through the real `sessionbox` binary: a
//! conversation's gateway runs in its sandbox's cgroups and serves at most `[egress]
//! max_connections` connections at once; a flood of tunnels from inside the sandbox is refused
//! past the cap, logged once, and costs the host and the other conversations nothing.
//!
//! Targets are servers this test starts on a private address in a network namespace it creates
//! (allowed explicitly); never an outside address. Needs root, `ip` (iproute2), `curl` and
//! `python3`; fails, never skips, without them. Its own test binary (see Cargo.toml): it
//! asserts how fast another conversation answers during the attack.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them); a test binary has no public API.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sessionbox_core::{ConversationId, ConversationKey, TenantId};
use sessionbox_egress::GatewayConfig;
use sessionbox_test_support::bind_in_netns;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const EXE: &str = env!("CARGO_BIN_EXE_sessionbox");

/// The cap under test: the default.
const CAP: usize = GatewayConfig::DEFAULT_MAX_CONNECTIONS;
/// Tunnels the attack opens (one after another, holding every one it gets).
const TUNNELS: usize = 1000;
/// Bytes the target sends down each tunnel as soon as it is opened (and the attack uploads
/// 64 KiB up each): every relay buffer of the gateway is filled.
const BURST: usize = 256 * 1024;
/// How slow the other conversation's `exec` and egress may be during the attack.
const BOUND: Duration = Duration::from_secs(3);

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip (install iproute2): {e}"));
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace joined to this one by a veth pair (a /30 of 10.213.0.0/16).
struct TestNet {
    name: String,
    peer: Ipv4Addr,
    cidr: String,
}

impl TestNet {
    /// The `n`th test network of this process.
    fn new(n: usize) -> TestNet {
        let pid = std::process::id();
        let v = ((pid as usize) * 2 + n) % 16384;
        let (a, b) = ((v >> 6) as u8, ((v & 63) << 2) as u8);
        let name = format!("sbegcap-{pid}-{n}");
        let (h, p) = (
            format!("sbk{:x}h{n}", pid % 0xfffff),
            format!("sbk{:x}p{n}", pid % 0xfffff),
        );
        ip(&["netns", "add", &name]);
        let net = TestNet {
            name: name.clone(),
            peer: Ipv4Addr::new(10, 213, a, b + 2),
            cidr: format!("10.213.{a}.{b}/30"),
        };
        ip(&[
            "link", "add", &h, "type", "veth", "peer", "name", &p, "netns", &name,
        ]);
        let host = format!("10.213.{a}.{}/30", b + 1);
        ip(&["addr", "add", &host, "dev", &h]);
        ip(&["link", "set", &h, "up"]);
        let peer = format!("{}/30", net.peer);
        ip(&["-n", &name, "addr", "add", &peer, "dev", &p]);
        ip(&["-n", &name, "link", "set", &p, "up"]);
        net
    }

    fn listen(&self) -> tokio::net::TcpListener {
        let addr = SocketAddr::from((self.peer, 0));
        tokio::net::TcpListener::from_std(bind_in_netns(&self.name, addr)).unwrap()
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// What the holding target saw: connections open now, the most at once, and in all.
#[derive(Default)]
struct Held {
    open: AtomicUsize,
    peak: AtomicUsize,
    total: AtomicUsize,
}

/// A target that sends [`BURST`] bytes on every connection, then holds it open, reading and
/// dropping what comes, until the peer closes.
fn hold_on(l: tokio::net::TcpListener) -> Arc<Held> {
    let held = Arc::new(Held::default());
    let h = held.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let h = h.clone();
            let now = h.open.fetch_add(1, Ordering::SeqCst) + 1;
            h.peak.fetch_max(now, Ordering::SeqCst);
            h.total.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let burst = vec![b'd'; BURST];
                let (mut r, mut w) = s.split();
                let send = async {
                    let _ = w.write_all(&burst).await;
                    std::future::pending::<()>().await;
                };
                let drain = async {
                    let mut buf = vec![0u8; 64 * 1024];
                    while r.read(&mut buf).await.unwrap_or(0) > 0 {}
                };
                tokio::select! {
                    () = send => {}
                    () = drain => {}
                }
                h.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    held
}

/// An HTTP/1.1 server answering `hello from PATH`.
fn http_on(l: tokio::net::TcpListener) {
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut r = BufReader::new(s);
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
                let body = format!("hello from {}\n", path.unwrap_or_default());
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = r.get_mut().write_all(resp.as_bytes()).await;
            });
        }
    });
}

/// A data directory whose configuration gives this test its own uid range.
struct Data {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Data {
    fn new() -> Data {
        Data::with_idle(120)
    }

    /// A data directory whose agents stop after `idle_secs` without a request.
    fn with_idle(idle_secs: u64) -> Data {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::create_dir_all(&path).unwrap();
        // Each data directory of this process its own uids.
        static N: AtomicUsize = AtomicUsize::new(0);
        let slot = N.fetch_add(1, Ordering::SeqCst) as u32 % 4;
        let base = 42_000_000 + (std::process::id() % 50_000) * 256 + slot * 64;
        std::fs::write(
            path.join("sessionbox.toml"),
            format!(
                "[isolated]\nidle_timeout_secs = {idle_secs}\nuid_base = {base}\nuid_count = 64\n\
                 [egress]\nnameservers = [\"127.0.0.1:9\"]\n"
            ),
        )
        .unwrap();
        Data { _dir: dir, path }
    }

    fn cli(&self, args: &[&str]) -> Output {
        Command::new(EXE)
            .arg("--data-dir")
            .arg(&self.path)
            .args(args)
            .env_remove("SESSIONBOX_RUNTIME")
            .env_remove("SESSIONBOX_TENANT")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "sessionbox {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `cmd` in the conversation's sandbox; returns (exit code, stdout + stderr).
    async fn sh(self: &Arc<Self>, conv: &str, cmd: &str) -> (i32, String) {
        let (this, conv, cmd) = (self.clone(), conv.to_owned(), cmd.to_owned());
        tokio::task::spawn_blocking(move || {
            let out = this.cli(&["exec", "-c", &conv, "--timeout", "120", "--", &cmd]);
            (
                out.status.code().unwrap_or(-1),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            )
        })
        .await
        .unwrap()
    }

    fn key(conv: &str) -> ConversationKey {
        ConversationKey::derive(
            &TenantId::new(TenantId::DEFAULT).unwrap(),
            &ConversationId::new(conv).unwrap(),
        )
    }

    fn run_dir(&self, conv: &str) -> PathBuf {
        self.path.join("run").join(Data::key(conv).as_str())
    }

    fn workspace(&self, conv: &str) -> PathBuf {
        self.path.join("workspaces").join(Data::key(conv).as_str())
    }

    /// The gateway's pid and the sandbox's cgroups, from its record.
    fn record(&self, conv: &str) -> (u32, Vec<PathBuf>) {
        let v = self.record_json(conv);
        let pid = v["gateway_pid"].as_u64().expect("a gateway was started") as u32;
        let cgroups = v["cgroups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| PathBuf::from(c.as_str().unwrap()))
            .collect();
        (pid, cgroups)
    }

    fn record_json(&self, conv: &str) -> serde_json::Value {
        let data = std::fs::read(self.run_dir(conv).join("sandbox.json")).unwrap();
        serde_json::from_slice(&data).unwrap()
    }
}

/// True while `pid` is a gateway serving `conv` (a recycled pid is not).
fn gateway_alive(pid: u32, conv: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
        c.split(|b| *b == 0)
            .any(|a| a == Data::key(conv).as_str().as_bytes())
    })
}

impl Drop for Data {
    /// Whatever the test left running is destroyed (a failed assertion included).
    fn drop(&mut self) {
        for c in ["flooder", "bystander", "idler"] {
            let _ = self.cli(&["destroy", "-c", c]);
        }
    }
}

/// A `/proc/PID/status` field in KiB (0 when the process is gone).
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| {
            v.trim_start_matches(':')
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// True when `pid` is listed in the cgroup `dir`.
fn in_cgroup(dir: &std::path::Path, pid: u32) -> bool {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .is_ok_and(|s| s.split_whitespace().any(|p| p == pid.to_string()))
}

/// The attack, run inside the sandbox: `TUNNELS` CONNECTs to the target through the proxy the
/// sandbox is given, one after another, holding every tunnel that is opened; 64 KiB up and the
/// target's burst down each; `flood.ready` in the workspace; held until `flood.stop` appears.
const FLOOD: &str = r#"
import os, socket, sys, time
proxy = os.environ["HTTPS_PROXY"].rsplit("/", 1)[1]
host, port = proxy.rsplit(":", 1)
target, n, burst = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held, refused, other = [], 0, 0
for i in range(n):
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        c = s.recv(1)
        if not c:
            break
        head += c
    status = head.split(b" ")[1] if head.startswith(b"HTTP/1.1 ") else b"closed"
    if status == b"200":
        held.append(s)
    else:
        if status == b"503":
            refused += 1
        else:
            other += 1
        s.close()
up = b"u" * 65536
for s in held:
    s.sendall(up)
down = 0
for s in held:
    got = 0
    while got < burst:
        c = s.recv(65536)
        if not c:
            break
        got += len(c)
    down += got
print("held=%d refused=%d other=%d down=%d" % (len(held), refused, other, down), flush=True)
open("flood.ready", "w").close()
t = time.time()
while not os.path.exists("flood.stop") and time.time() - t < 90:
    time.sleep(0.1)
"#;

/// Attack: from inside conversation A's sandbox, open 1000 tunnels through its gateway to a
/// target that holds every one open (and fill each with 256 KiB down and 64 KiB up). Before,
/// the gateway ran as root in the root cgroup and served them all, growing without bound
/// until `EMFILE` stopped it. Verdict, read on the host: A's gateway runs in A's sandbox
/// cgroups; it holds exactly its cap of 256 tunnels (the target never sees more) and answers
/// every other CONNECT 503; its descriptor limit is what the cap needs and its open
/// descriptors and memory stay bounded; the cap is logged once, not once per refusal, and its
/// end once with the count; conversation B's `exec` and egress each answer within 3 s during
/// the attack; A's gateway serves a new connection after the flood ends; destroying A leaves
/// no gateway and no cgroup.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tunnel_flood_is_held_at_the_cap_in_the_sandboxs_cgroups_while_b_keeps_working() {
    assert!(
        rustix::process::geteuid().is_root(),
        "needs root (network namespaces, cgroups)"
    );
    let result = tokio::time::timeout(Duration::from_secs(300), flood_test()).await;
    assert!(result.is_ok(), "the test did not finish within 300 s");
}

async fn flood_test() {
    let net = TestNet::new(0);
    let hold = net.listen();
    let http = net.listen();
    let (target, hp) = (
        hold.local_addr().unwrap().to_string(),
        http.local_addr().unwrap().port(),
    );
    let held = hold_on(hold);
    http_on(http);
    let data = Arc::new(Data::new());
    data.ok(&["policy", "set", "--allow", &net.cidr]);
    let curl = |path: &str| format!("curl -sS -m 10 http://{}:{hp}/{path}", net.peer);
    let (code, out) = data.sh("bystander", &curl("b0")).await;
    assert_eq!((code, out.as_str()), (0, "hello from /b0\n"));
    // A request through A's gateway first: a gateway sets its descriptor limit before it serves
    // anything (the runtime hands it a socket that is listening already, so a gateway that has
    // not served yet may still be starting).
    let (code, out) = data.sh("flooder", &curl("a0")).await;
    assert_eq!((code, out.as_str()), (0, "hello from /a0\n"));

    // A's gateway: in A's cgroups, with the descriptor limit its cap needs.
    let (gw, cgroups) = data.record("flooder");
    assert!(!cgroups.is_empty());
    for c in &cgroups {
        assert!(
            in_cgroup(c, gw),
            "the gateway {gw} is not in {}",
            c.display()
        );
    }
    let limits = std::fs::read_to_string(format!("/proc/{gw}/limits")).unwrap();
    let nofile = GatewayConfig::descriptors_needed(CAP);
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert_eq!(
        line.split_whitespace().nth(3),
        Some(nofile.to_string().as_str()),
        "{line}"
    );
    let (rss_before, fds_before) = (status_kib(gw, "VmRSS"), open_fds(gw));

    // The flood.
    let ready = data.workspace("flooder").join("flood.ready");
    let stop = data.workspace("flooder").join("flood.stop");
    let script = format!("python3 - {target} {TUNNELS} {BURST} <<'EOF'\n{FLOOD}\nEOF");
    let flood = {
        let data = data.clone();
        tokio::spawn(async move { data.sh("flooder", &script).await })
    };
    let (mut rss_peak, mut fds_peak) = (0u64, 0usize);
    let started = Instant::now();
    while !ready.exists() {
        assert!(
            !flood.is_finished(),
            "the flood ended before it was ready: {:?}",
            flood.await
        );
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the flood never got ready"
        );
        rss_peak = rss_peak.max(status_kib(gw, "VmRSS"));
        fds_peak = fds_peak.max(open_fds(gw));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let flood_secs = started.elapsed().as_secs_f64();
    // B during the attack, while A holds its tunnels.
    let (mut slowest_exec, mut slowest_egress) = (Duration::ZERO, Duration::ZERO);
    for i in 0..5 {
        let t = Instant::now();
        let (code, out) = data.sh("bystander", "echo ok").await;
        assert_eq!((code, out.as_str()), (0, "ok\n"));
        slowest_exec = slowest_exec.max(t.elapsed());
        let t = Instant::now();
        let (code, out) = data.sh("bystander", &curl(&format!("b{}", i + 1))).await;
        assert_eq!((code, out), (0, format!("hello from /b{}\n", i + 1)));
        slowest_egress = slowest_egress.max(t.elapsed());
        rss_peak = rss_peak.max(status_kib(gw, "VmRSS"));
        fds_peak = fds_peak.max(open_fds(gw));
    }
    let (rss_held, fds_held) = (status_kib(gw, "VmRSS"), open_fds(gw));
    let open_held = held.open.load(Ordering::SeqCst);
    let cgroup_still = cgroups.iter().all(|c| in_cgroup(c, gw));
    std::fs::write(&stop, b"").unwrap();
    let (code, out) = flood.await.unwrap();
    eprintln!(
        "tunnel flood: {out:?} in {flood_secs:.1} s; gateway VmRSS {rss_before} KiB before, \
         {rss_held} KiB holding, peak {rss_peak} KiB; fds {fds_before} before, {fds_held} \
         holding, peak {fds_peak} (limit {nofile}); target: {open_held} open, peak {}, {} in \
         all; B slowest exec {slowest_exec:?}, slowest egress {slowest_egress:?}",
        held.peak.load(Ordering::SeqCst),
        held.total.load(Ordering::SeqCst),
    );
    assert_eq!(code, 0, "{out}");
    let down = CAP * BURST;
    assert_eq!(
        out.trim(),
        format!("held={CAP} refused={} other=0 down={down}", TUNNELS - CAP)
    );
    assert_eq!(open_held, CAP, "the target saw {open_held} tunnels held");
    assert_eq!(held.peak.load(Ordering::SeqCst), CAP);
    assert_eq!(held.total.load(Ordering::SeqCst), CAP);
    assert!(cgroup_still, "the gateway left the sandbox's cgroups");
    // Two descriptors per tunnel (the client's, the target's) and the gateway's own.
    assert!(fds_peak <= 2 * CAP + 64, "{fds_peak} descriptors");
    // Relay buffers of 64 KiB per direction: 32 MiB for 256 tunnels, plus the program.
    assert!(
        rss_peak < 128 * 1024,
        "gateway VmRSS peaked at {rss_peak} KiB"
    );
    assert!(slowest_exec < BOUND, "B's exec took {slowest_exec:?}");
    assert!(slowest_egress < BOUND, "B's egress took {slowest_egress:?}");

    // After the flood: A's tunnels are gone and its gateway serves it again.
    let settled = Instant::now();
    while held.open.load(Ordering::SeqCst) > 0 && settled.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(held.open.load(Ordering::SeqCst), 0);
    let (code, out) = data.sh("flooder", &curl("after")).await;
    assert_eq!((code, out.as_str()), (0, "hello from /after\n"));
    let log = std::fs::read_to_string(data.run_dir("flooder").join("egress.log")).unwrap();
    let hit = log.matches("new connections are refused with 503").count();
    let cleared = log.matches("connections were refused while at it").count();
    assert_eq!((hit, cleared), (1, 1), "{log}");
    assert!(
        log.contains(&format!("; {} connections were refused", TUNNELS - CAP)),
        "{log}"
    );
    assert!(log.lines().count() < 10, "one line per refusal? {log}");

    // Destroy: no gateway, no cgroup left.
    data.ok(&["destroy", "-c", "flooder"]);
    data.ok(&["destroy", "-c", "bystander"]);
    assert!(
        !gateway_alive(gw, "flooder"),
        "the gateway outlived its sandbox"
    );
    for c in &cgroups {
        assert!(!c.exists(), "{} was left behind", c.display());
    }
}

/// The gateway in the sandbox's cgroups ends cleanly with it: when the agent stops on its idle
/// timeout the gateway exits and leaves the cgroups without a process; the next use launches a
/// new sandbox whose new gateway is in its (re-created) cgroups and serves; destroy then leaves
/// no gateway and no cgroup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_ends_with_its_sandbox_on_idle_stop_and_on_destroy() {
    assert!(
        rustix::process::geteuid().is_root(),
        "needs root (network namespaces, cgroups)"
    );
    let result = tokio::time::timeout(Duration::from_secs(120), idle_test()).await;
    assert!(result.is_ok(), "the test did not finish within 120 s");
}

async fn idle_test() {
    let net = TestNet::new(1);
    let http = net.listen();
    let hp = http.local_addr().unwrap().port();
    http_on(http);
    let data = Arc::new(Data::with_idle(2));
    data.ok(&["policy", "set", "--allow", &net.cidr]);
    let curl = |path: &str| format!("curl -sS -m 10 http://{}:{hp}/{path}", net.peer);
    let (code, out) = data.sh("idler", &curl("one")).await;
    assert_eq!((code, out.as_str()), (0, "hello from /one\n"));
    let (gw, cgroups) = data.record("idler");
    let monitor = data.record_json("idler")["monitor_pid"].as_u64().unwrap() as u32;
    assert!(cgroups.iter().all(|c| in_cgroup(c, gw)));
    // Idle stop: the monitor ends, and the gateway with it; nothing is left in the cgroups.
    let t = Instant::now();
    while (std::path::Path::new(&format!("/proc/{monitor}")).exists() || gateway_alive(gw, "idler"))
        && t.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !gateway_alive(gw, "idler"),
        "the gateway outlived its idle sandbox"
    );
    for c in &cgroups {
        let procs = std::fs::read_to_string(c.join("cgroup.procs")).unwrap_or_default();
        assert!(procs.trim().is_empty(), "{}: {procs}", c.display());
    }
    // The next use: a new sandbox and gateway, in its cgroups.
    let (code, out) = data.sh("idler", &curl("two")).await;
    assert_eq!((code, out.as_str()), (0, "hello from /two\n"));
    let (gw2, cgroups2) = data.record("idler");
    assert_ne!(gw2, gw);
    assert!(cgroups2.iter().all(|c| in_cgroup(c, gw2)));
    data.ok(&["destroy", "-c", "idler"]);
    assert!(
        !gateway_alive(gw2, "idler"),
        "the gateway outlived its sandbox"
    );
    for c in cgroups.iter().chain(&cgroups2) {
        assert!(!c.exists(), "{} was left behind", c.display());
    }
}
