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

type TestFn = fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

const TESTS: &[(&str, TestFn)] = &[
    (
        "event_stream_output_arrives_while_a_sandboxed_command_runs",
        || Box::pin(event_stream_output_arrives_while_a_sandboxed_command_runs()),
    ),
    (
        "background_commands_in_a_sandbox_report_logs_and_are_killed_and_destroyed",
        || Box::pin(background_commands_in_a_sandbox_report_logs_and_are_killed_and_destroyed()),
    ),
];

/// A server over the isolated runtime in a temporary data directory (loopback, open tenant
/// `local`).
struct Server {
    base: String,
    client: Client,
    dir: tempfile::TempDir,
    runtime: Arc<IsolatedRuntime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Server {
    async fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
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
                },
                Arc::new(StoreDirectory::new(store.clone())),
            )
            .unwrap(),
        );
        let config = ServerConfig {
            open_tenant: Some(TenantId::new("local").unwrap()),
            ..ServerConfig::default()
        };
        let state = AppState::new(
            Manager::new(store, runtime.clone() as Arc<dyn Runtime>),
            config,
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(sessionbox_server::serve(listener, state, async {
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
            stop: Some(tx),
        }
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
