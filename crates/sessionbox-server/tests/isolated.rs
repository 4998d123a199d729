//! The REST API over the `isolated` runtime: event-stream exec and background commands against
//! real sandboxes, through a real server on 127.0.0.1:0 and a real HTTP client.
//!
//! The runtime re-executes its `exe` as the sandbox init and runs it inside as the agent. Here
//! that executable is this test binary, so it has its own `main` (`harness = false`): it
//! becomes the init or the agent when started as one, and otherwise runs the tests below, each
//! bounded in time. They need root (CI runs them as root); without it they print SKIPPED.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them).
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::{Client, Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};
use sessionbox_core::{ConversationId, ConversationRef, Runtime, TenantId};
use sessionbox_local::isolated::{IsolatedConfig, IsolatedRuntime};
use sessionbox_manager::{Manager, StoreDirectory};
use sessionbox_sandbox::SandboxLimits;
use sessionbox_server::{AppState, ServerConfig};
use sessionbox_store::Store;

fn main() -> ExitCode {
    // The sandbox init must start in a fresh single-threaded process: before anything else.
    if sessionbox_sandbox::is_init_invocation() {
        sessionbox_sandbox::init_main();
    }
    // The agent's host log goes through a relay, a re-execution of this binary.
    if sessionbox_local::log_relay::is_log_relay_invocation() {
        sessionbox_local::log_relay::log_relay_main();
    }
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "agent") {
        let argv = std::iter::once(std::ffi::OsString::from("sessionbox agent"))
            .chain(args[2..].iter().cloned());
        return sessionbox_agent::run_cli(argv);
    }
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED: isolated runtime tests need root (CI runs them as root)");
        return ExitCode::SUCCESS;
    }
    // `cargo test -- --list` and filters, the little the runner needs.
    let filter = args
        .iter()
        .skip(1)
        .filter_map(|a| a.to_str())
        .find(|a| !a.starts_with('-'))
        .map(str::to_owned);
    if args.iter().any(|a| a == "--list") {
        for (name, _) in TESTS {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let (mut passed, mut failed) = (0, 0);
    for (name, test) in TESTS {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let started = Instant::now();
        let result = rt.block_on(async {
            let task = tokio::spawn(tokio::time::timeout(Duration::from_secs(120), test()));
            task.await
        });
        match result {
            Ok(Ok(())) => {
                passed += 1;
                println!(
                    "test {name} ... ok ({:.1} s)",
                    started.elapsed().as_secs_f64()
                );
            }
            Ok(Err(_)) => {
                failed += 1;
                println!("test {name} ... FAILED (timed out)");
            }
            Err(e) => {
                failed += 1;
                println!("test {name} ... FAILED ({e})");
            }
        }
    }
    println!("\ntest result: {passed} passed; {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[path = "isolated/memory.rs"]
mod memory;
#[path = "isolated/pty.rs"]
mod pty;

type TestFn = fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

const TESTS: &[(&str, TestFn)] = &[
    (
        "memory_use_is_the_sandboxs_cgroup_charge_against_its_limit",
        || Box::pin(memory::memory_use_is_the_sandboxs_cgroup_charge_against_its_limit()),
    ),
    (
        "a_terminal_over_rest_runs_in_the_conversations_sandbox",
        || Box::pin(pty::a_terminal_over_rest_runs_in_the_conversations_sandbox()),
    ),
    ("terminals_are_per_tenant_keyed_and_bounded", || {
        Box::pin(pty::terminals_are_per_tenant_keyed_and_bounded())
    }),
    (
        "a_command_whose_client_goes_away_gives_its_turn_back_with_reads_beside_it",
        || Box::pin(a_command_whose_client_goes_away_gives_its_turn_back_with_reads_beside_it()),
    ),
    (
        "reads_answer_while_a_long_command_runs_and_writes_keep_their_order",
        || Box::pin(reads_answer_while_a_long_command_runs_and_writes_keep_their_order()),
    ),
    (
        "event_stream_output_arrives_while_a_sandboxed_command_runs",
        || Box::pin(event_stream_output_arrives_while_a_sandboxed_command_runs()),
    ),
    (
        "background_commands_in_a_sandbox_report_logs_and_are_killed_and_destroyed",
        || Box::pin(background_commands_in_a_sandbox_report_logs_and_are_killed_and_destroyed()),
    ),
    (
        "an_output_flood_from_one_key_is_refused_at_its_budget_and_spares_another_tenant",
        || {
            Box::pin(
                an_output_flood_from_one_key_is_refused_at_its_budget_and_spares_another_tenant(),
            )
        },
    ),
];

/// A server over the isolated runtime in a temporary data directory (loopback, open tenant
/// `local`).
struct Server {
    base: String,
    client: Client,
    dir: tempfile::TempDir,
    runtime: Arc<IsolatedRuntime>,
    state: AppState,
    /// API keys by tenant, when the server was started with keys.
    keys: Vec<(TenantId, String)>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Server {
    async fn start() -> Server {
        Server::start_with(ServerConfig::default(), &[]).await
    }

    /// A server with `config`; with `tenants`, a key for each (then every request needs one).
    async fn start_with(config: ServerConfig, tenants: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
        let keys: Vec<(TenantId, String)> = tenants
            .iter()
            .map(|t| {
                let tenant = TenantId::new(*t).unwrap();
                let key = store
                    .create_api_key(&tenant, Some("test"), chrono::Utc::now())
                    .unwrap()
                    .key;
                (tenant, key)
            })
            .collect();
        // Host uids no other test process uses.
        let base = 21_000_000 + (std::process::id() % 50_000) * 64;
        let runtime = Arc::new(
            IsolatedRuntime::new(
                IsolatedConfig {
                    data_dir: dir.path().to_path_buf(),
                    limits: sessionbox_core::Limits::default(),
                    sandbox: SandboxLimits::default(),
                    idle_timeout: Duration::from_secs(30),
                    exe: std::env::current_exe().unwrap(),
                    agent_args: vec!["agent".into()],
                    log_max_bytes: IsolatedConfig::DEFAULT_LOG_MAX_BYTES,
                    uids: base..base + 64,
                    // The disk quota is tested in crates/sessionbox/tests/containment_disk.rs;
                    // these workspaces stay plain directories of the temporary directory.
                    disk: None,
                    pool: Default::default(),
                },
                Arc::new(StoreDirectory::new(store.clone())),
            )
            .unwrap(),
        );
        let config = ServerConfig {
            open_tenant: Some(TenantId::new("local").unwrap()),
            ..config
        };
        let state = AppState::new(
            Manager::new(store, runtime.clone() as Arc<dyn Runtime>),
            config,
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(sessionbox_server::serve(listener, state.clone(), async {
            let _ = rx.await;
        }));
        Server {
            base: format!("http://{addr}"),
            client: Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            dir,
            runtime,
            state,
            keys,
            stop: Some(tx),
        }
    }

    /// A request of `tenant` (with its key).
    fn req_as(&self, tenant: &str, method: Method, path: &str) -> RequestBuilder {
        let key = &self
            .keys
            .iter()
            .find(|(t, _)| t.as_str() == tenant)
            .unwrap()
            .1;
        self.req(method, path).bearer_auth(key)
    }

    fn json_as(&self, tenant: &str, method: Method, path: &str, body: &Value) -> RequestBuilder {
        self.req_as(tenant, method, path)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap())
    }

    fn req(&self, method: Method, path: &str) -> RequestBuilder {
        self.client.request(method, format!("{}{path}", self.base))
    }

    fn json(&self, method: Method, path: &str, body: &Value) -> RequestBuilder {
        self.req(method, path)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap())
    }

    /// The host directory of conversation `id`'s workspace.
    fn workspace(&self, id: &str) -> PathBuf {
        let conv = ConversationRef::new(
            TenantId::new("local").unwrap(),
            ConversationId::new(id).unwrap(),
        );
        PathBuf::from(self.runtime.workspace_location(&conv.key))
    }
}

impl Drop for Server {
    /// Ends every sandbox left (a test that failed half-way), then the server.
    fn drop(&mut self) {
        if let Ok(list) = std::fs::read_dir(self.dir.path().join("workspaces")) {
            let rt = tokio::runtime::Handle::try_current();
            for e in list.flatten() {
                if let (Some(key), Ok(rt)) = (
                    e.file_name()
                        .to_str()
                        .and_then(|k| sessionbox_core::ConversationKey::parse(k).ok()),
                    &rt,
                ) {
                    let runtime = self.runtime.clone();
                    let _ = std::thread::scope(|s| {
                        s.spawn(|| rt.block_on(runtime.destroy(&key))).join()
                    });
                }
            }
        }
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

async fn body(r: reqwest::Response) -> (StatusCode, Value) {
    let status = r.status();
    let bytes = r.bytes().await.unwrap();
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, v)
}

/// Reads server-sent events; returns `(name, data, arrival since the request)` of each.
async fn events(r: reqwest::Response, started: Instant) -> Vec<(String, Value, Duration)> {
    let mut r = r;
    let mut buf = Vec::new();
    let mut out = Vec::new();
    while let Some(chunk) = r.chunk().await.unwrap() {
        buf.extend_from_slice(&chunk);
        while let Some(i) = buf.windows(2).position(|w| w == b"\n\n") {
            let block = String::from_utf8(buf.drain(..i + 2).collect()).unwrap();
            let mut name = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if !data.is_empty() {
                out.push((
                    name,
                    serde_json::from_str(&data).unwrap(),
                    started.elapsed(),
                ));
            }
        }
    }
    out
}

async fn until<F: Future<Output = bool>>(secs: u64, mut f: impl FnMut() -> F) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The `a` event arrives a second before the `b` event: output streams out of the sandbox as
/// it is written, then `exit` carries the code.
async fn event_stream_output_arrives_while_a_sandboxed_command_runs() {
    let s = Server::start().await;
    let started = Instant::now();
    let r = s
        .json(
            Method::POST,
            "/v1/conversations/iso-sse/exec",
            &json!({"command": "echo a; sleep 1; echo b >&2; exit 5"}),
        )
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let all = events(r, started).await;
    let names: Vec<&str> = all.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names, ["stdout", "stderr", "exit"], "{all:?}");
    assert_eq!(all[0].1["text"], "a\n");
    assert_eq!(all[1].1["text"], "b\n");
    assert!(
        all[1].2 >= all[0].2 + Duration::from_millis(700),
        "a at {:?}, b at {:?}",
        all[0].2,
        all[1].2
    );
    assert_eq!(all[2].1["exit_code"], 5);
    let r = s
        .req(Method::DELETE, "/v1/conversations/iso-sse")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}

/// A background command in a sandbox: its logs come in pieces while it runs, other calls go on
/// meanwhile; a killed one stops writing; destroying the conversation ends the rest.
async fn background_commands_in_a_sandbox_report_logs_and_are_killed_and_destroyed() {
    let s = Server::start().await;
    let c = "/v1/conversations/iso-bg";
    let (st, v) = body(
        s.json(
            Method::POST,
            &format!("{c}/exec"),
            &json!({"command": "for i in 1 2 3; do echo $i; sleep 0.4; done; exit 2", "background": true}),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    let (st, v) = body(
        s.json(
            Method::POST,
            &format!("{c}/exec"),
            &json!({"command": "echo meanwhile"}),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        (st, v["stdout"].clone()),
        (StatusCode::OK, json!("meanwhile\n"))
    );
    let (mut out, mut offset, mut pieces) = (String::new(), 0, 0);
    loop {
        let (_, l) = body(
            s.req(
                Method::GET,
                &format!("{c}/commands/{id}/logs?stdout_offset={offset}"),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        let piece = l["stdout"]["text"].as_str().unwrap();
        pieces += usize::from(!piece.is_empty());
        out.push_str(piece);
        offset = l["stdout_next_offset"].as_u64().unwrap();
        if l["running"] == false {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(out, "1\n2\n3\n");
    assert!(pieces >= 2, "the output came in {pieces} piece(s)");
    let (_, v) = body(
        s.req(Method::GET, &format!("{c}/commands/{id}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(v["exit_code"], 2, "{v}");

    // Kill: the marker in the workspace (seen from the host) stops growing.
    let grow = s.workspace("iso-bg").join("grow");
    let size = || std::fs::metadata(&grow).map_or(0, |m| m.len());
    let start = |s: &Server| {
        s.json(
            Method::POST,
            &format!("{c}/exec"),
            &json!({"command": "while :; do echo x >> grow; sleep 0.05; done", "background": true}),
        )
        .send()
    };
    let (_, v) = body(start(&s).await.unwrap()).await;
    let id = v["id"].as_str().unwrap().to_owned();
    assert!(until(20, || async { size() > 4 }).await, "it never ran");
    let (st, v) = body(
        s.req(Method::DELETE, &format!("{c}/commands/{id}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["killed"], true, "{v}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = size();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(a, size(), "the killed command still writes");
    // Nothing of it is left in the sandbox: only the agent (and its init) remain.
    let (_, v) = body(
        s.json(
            Method::POST,
            &format!("{c}/exec"),
            &json!({"command": "cat /proc/[0-9]*/comm"}),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    let ps = v["stdout"].as_str().unwrap_or_default().to_owned();
    assert!(
        ps.lines().any(|l| l == "sh") && !ps.contains("sleep"),
        "{ps}"
    );

    // Destroy ends the conversation's background commands.
    std::fs::remove_file(&grow).unwrap();
    let (_, v) = body(start(&s).await.unwrap()).await;
    let id = v["id"].as_str().unwrap().to_owned();
    assert!(until(20, || async { size() > 4 }).await, "it never ran");
    let r = s.req(Method::DELETE, c).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(!grow.exists());
    let list = s.runtime.list().await.unwrap();
    assert!(
        list.iter().all(|c| c.processes.is_empty()),
        "processes left: {list:?}"
    );
    let (st, _) = body(
        s.req(Method::GET, &format!("{c}/commands/{id}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

/// This process's resident memory (the server runs in it), in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// Attack: one key makes the server hold command output of its choosing: background commands
/// and JSON execs at the largest `output_limit` (16 MB of each stream), in many conversations at
/// once (before the budget, 16 background commands a conversation and any number of execs,
/// each answer several times its output in the server's memory). With a budget of 48 MiB per
/// tenant (80 MiB in total; one such command reserves 32 MB), what passes it is refused at once with 429 `busy` naming the limit
/// (in any conversation of the tenant, creating nothing); meanwhile another tenant's exec
/// answers within 2 s and it starts work of its own; when the first tenant's commands end its
/// budget is back; and a flood of 8 concurrent JSON execs of 16 MB each is held to what the
/// budget admits, the server's resident memory growing by less than 512 MiB (stated bound;
/// unbounded, the same flood held every answer at once).
async fn an_output_flood_from_one_key_is_refused_at_its_budget_and_spares_another_tenant() {
    const MIB: u64 = 1024 * 1024;
    let s = Server::start_with(
        ServerConfig {
            max_output_bytes_per_tenant: 48 * MIB,
            max_output_bytes_total: 80 * MIB,
            ..ServerConfig::default()
        },
        &["alice", "bob"],
    )
    .await;
    let alice = TenantId::new("alice").unwrap();
    let exec_bob = async || {
        let t = Instant::now();
        let (st, v) = body(
            s.json_as(
                "bob",
                Method::POST,
                "/v1/conversations/bob-1/exec",
                &json!({"command": "echo hi"}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(
            (st, v["stdout"].clone()),
            (StatusCode::OK, json!("hi\n")),
            "{v}"
        );
        t.elapsed()
    };
    exec_bob().await; // bob's sandbox, before the attack
    let big = |command: &str, background: bool| json!({"command": command, "output_limit": 16_000_000, "background": background});
    let refused = |st: StatusCode, v: &Value| {
        assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
        assert_eq!(v["code"], "busy", "{v}");
        let m = v["message"].as_str().unwrap();
        assert!(
            m.contains("[serve] max_output_bytes_per_tenant = 50331648"),
            "{m}"
        );
    };

    // 1. Background commands at the largest output_limit: one fits alice's budget, the next is
    // refused, in the same conversation or another, as is a JSON exec.
    let flood = "head -c 16000000 /dev/zero; sleep 3";
    let (st, v) = body(
        s.json_as(
            "alice",
            Method::POST,
            "/v1/conversations/flood-bg/exec",
            &big(flood, true),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{v}");
    assert_eq!(s.state.output_bytes_reserved_by(&alice), 32_000_000);
    for (conv, background) in [
        ("flood-bg", true),
        ("flood-other", true),
        ("flood-other", false),
    ] {
        let (st, v) = body(
            s.json_as(
                "alice",
                Method::POST,
                &format!("/v1/conversations/{conv}/exec"),
                &big(flood, background),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        refused(st, &v);
    }
    let (st, _) = body(
        s.req_as("alice", Method::GET, "/v1/conversations/flood-other")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        st,
        StatusCode::NOT_FOUND,
        "a refused exec created its conversation"
    );

    // 2. bob meanwhile: his exec answers within 2 s, and he starts a command of his own.
    let latency = exec_bob().await;
    assert!(latency < Duration::from_secs(2), "{latency:?}");
    let (st, v) = body(
        s.json_as(
            "bob",
            Method::POST,
            "/v1/conversations/bob-1/exec",
            &json!({"command": "echo mine", "background": true}),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{v}");
    println!("  bob's exec during the background flood: {latency:?}");

    // 3. alice's budget is back once her commands have ended.
    assert!(
        until(30, || async {
            s.state.output_bytes_reserved_by(&alice) == 0
        })
        .await,
        "still reserved: {}",
        s.state.output_bytes_reserved_by(&alice)
    );

    // 4. A flood of JSON execs, 8 conversations at once, each 16 MB of output: what the budget
    // admits runs, the rest is 429, and the server's memory stays bounded.
    let baseline = rss();
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(baseline));
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        tokio::spawn(async move {
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(rss(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let started = Instant::now();
    let answers = futures::future::join_all((0..8).map(|i| {
        let r = s
            .json_as(
                "alice",
                Method::POST,
                &format!("/v1/conversations/flood-json-{i}/exec"),
                &big("head -c 16000000 /dev/zero", false),
            )
            .send();
        async move {
            let mut r = r.await.unwrap();
            let status = r.status();
            // Read and drop (this client shares the server's process).
            let (mut len, mut head) = (0usize, Vec::new());
            while let Some(chunk) = r.chunk().await.unwrap() {
                if head.len() < 512 {
                    head.extend_from_slice(&chunk[..chunk.len().min(512)]);
                }
                len += chunk.len();
            }
            (status, len, String::from_utf8_lossy(&head).into_owned())
        }
    }))
    .await;
    let took = started.elapsed();
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    sampler.await.unwrap();
    let grew = peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(baseline);
    let ok = answers.iter().filter(|a| a.0 == StatusCode::OK).count();
    let busy = answers
        .iter()
        .filter(|a| {
            a.0 == StatusCode::TOO_MANY_REQUESTS && a.2.contains("max_output_bytes_per_tenant")
        })
        .count();
    println!(
        "  JSON flood: {ok} answered, {busy} refused in {took:?}; resident memory +{} MiB",
        grew / MIB
    );
    assert_eq!(ok + busy, 8, "{answers:?}");
    assert!(ok >= 1 && busy >= 4, "{ok} answered, {busy} refused");
    assert!(
        answers
            .iter()
            .filter(|a| a.0 == StatusCode::OK)
            .all(|a| a.1 >= 16_000_000),
        "an answer lacks its output"
    );
    assert!(
        grew < 512 * MIB,
        "resident memory grew by {} MiB",
        grew / MIB
    );
    assert!(
        until(10, || async { s.state.output_bytes_reserved() == 0 }).await,
        "still reserved after the flood: {}",
        s.state.output_bytes_reserved()
    );
    for conv in (0..8)
        .map(|i| format!("flood-json-{i}"))
        .chain(["flood-bg".to_owned(), "bob-1".to_owned()])
    {
        let tenant = if conv == "bob-1" { "bob" } else { "alice" };
        let _ = s
            .req_as(tenant, Method::DELETE, &format!("/v1/conversations/{conv}"))
            .send()
            .await;
    }
}

/// A read, a listing, a stat, a glob and a grep of a conversation answer while a foreground
/// command of it runs (a JSON exec, then an event-stream exec), and see the files as the
/// command leaves them so far; a write sent meanwhile waits for the command (writes,
/// edits and commands keep their arrival order), so the command's last write comes before it.
async fn reads_answer_while_a_long_command_runs_and_writes_keep_their_order() {
    let s = Server::start().await;
    let c = "/v1/conversations/iso-overlap";
    let r = s
        .req(Method::PUT, &format!("{c}/files/notes.txt"))
        .body("before\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    for stream in [false, true] {
        // The command writes progress, runs on, then writes its last line.
        let started = Instant::now();
        let mut exec = s.json(
            Method::POST,
            &format!("{c}/exec"),
            &json!({"command": "echo progress > progress.txt; sleep 4; echo done >> notes.txt"}),
        );
        if stream {
            exec = exec.header("accept", "text/event-stream");
        }
        let exec = tokio::spawn(async move {
            let r = exec.send().await.unwrap();
            let status = r.status();
            let text = r.text().await.unwrap();
            (status, text, started.elapsed())
        });
        // Once the command has written its progress, every read answers at once.
        assert!(
            until(10, || async {
                s.req(Method::GET, &format!("{c}/files/progress.txt"))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    == StatusCode::OK
            })
            .await,
            "the progress file was never read"
        );
        let reads_started = started.elapsed();
        let (st, v) = body(s.req(Method::GET, &format!("{c}/ls")).send().await.unwrap()).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        let names: Vec<&str> = v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert!(names.contains(&"progress.txt"), "{v}");
        let (st, v) = body(
            s.req(Method::GET, &format!("{c}/stat?path=notes.txt"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        let (st, v) = body(
            s.req(Method::GET, &format!("{c}/glob?pattern=*.txt"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        let (st, v) = body(
            s.json(
                Method::POST,
                &format!("{c}/grep"),
                &json!({"pattern": "progress"}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["matches"][0]["path"], "progress.txt", "{v}");
        let r = s
            .req(Method::GET, &format!("{c}/files/notes.txt"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.text().await.unwrap(), "before\n");
        let reads_done = started.elapsed();
        assert!(
            !exec.is_finished(),
            "the command ended before the reads did: the test proves nothing"
        );
        // A write now waits for the command: the command's `done` comes first.
        let r = s
            .req(Method::PUT, &format!("{c}/files/notes.txt"))
            .body("replaced\n")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        let (status, text, ended) = exec.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{text}");
        assert!(
            reads_done < Duration::from_secs(4),
            "reads from {reads_started:?} to {reads_done:?}, the command ended at {ended:?}"
        );
        // The command's `done` was appended before the write replaced the file: had the
        // write gone first, `done` would follow `replaced`.
        let r = s
            .req(Method::GET, &format!("{c}/files/notes.txt"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.text().await.unwrap(), "replaced\n");
        // And back for the next round.
        let r = s
            .req(Method::PUT, &format!("{c}/files/notes.txt"))
            .body("before\n")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        s.req(Method::DELETE, &format!("{c}/files/progress.txt"))
            .send()
            .await
            .unwrap();
    }
    let r = s.req(Method::DELETE, c).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}

/// A foreground command that shared its session with reads, and whose client then goes away
/// (the client's 1.5 s timeout), is killed, and its turn and hold come back: a write sent
/// afterwards is served at once, and the command's last step never ran. (The turn and hold
/// are shared with the reads through the published session: were one leaked with it, the
/// write would wait forever.)
async fn a_command_whose_client_goes_away_gives_its_turn_back_with_reads_beside_it() {
    let s = Server::start().await;
    let c = "/v1/conversations/iso-gone";
    let impatient = Client::builder()
        .timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    let base = s.base.clone();
    let exec = tokio::spawn(async move {
        impatient
            .post(format!("{base}{c}/exec"))
            .header("content-type", "application/json")
            .body(
                json!({"command": "echo started > started.txt; sleep 5; echo late > late.txt"})
                    .to_string(),
            )
            .send()
            .await
    });
    assert!(
        until(10, || async {
            s.req(Method::GET, &format!("{c}/files/started.txt"))
                .send()
                .await
                .unwrap()
                .status()
                == StatusCode::OK
        })
        .await,
        "the command never started"
    );
    // Reads beside it, then its client gives up.
    let mut reads = Vec::new();
    for _ in 0..4 {
        let r = s.req(Method::GET, &format!("{c}/ls"));
        reads.push(tokio::spawn(
            async move { r.send().await.unwrap().status() },
        ));
    }
    assert!(
        exec.await.unwrap().is_err(),
        "the impatient client got an answer"
    );
    for r in reads {
        let st = r.await.unwrap();
        assert!(
            st == StatusCode::OK || st == StatusCode::TOO_MANY_REQUESTS,
            "{st}"
        );
    }
    // The turn is back: a write is served at once, long before the command would have ended.
    let started = Instant::now();
    let r = s
        .req(Method::PUT, &format!("{c}/files/after.txt"))
        .body("after\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let r = s
        .req(Method::GET, &format!("{c}/files/late.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "the cancelled command ran on"
    );
    let r = s.req(Method::DELETE, c).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}
