//! Scale-out and crash recovery, end to end: real `sessionbox serve` processes on the `isolated`
//! runtime (the default), a real HTTP client.
//!
//! - Two replicas on different ports share one PostgreSQL store and one data directory (the
//!   isolated runtime's workspaces are local to a node): `verify --via A --via B` passes with
//!   requests for every conversation alternating between them; creation is single-flight and
//!   operations on one conversation run one at a time across the replicas; a session one replica
//!   keeps is not used after the other destroyed its conversation.
//! - `serve` killed with SIGKILL in the middle of concurrent writes and execs, then restarted:
//!   every acknowledged write is there, no record points at nothing, and garbage collection
//!   leaves no orphan.
//!
//! They need root, as the isolated runtime does (CI runs them as root), and PostgreSQL (see
//! `support/pg.rs`; scripts/test installs it).

use crate::pg;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sessionbox_test_support::{serve_command, spawn_serve};

const EXE: &str = env!("CARGO_BIN_EXE_sessionbox");

macro_rules! needs_root {
    () => {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED: isolated runtime tests need root (CI runs them as root)");
            return;
        }
    };
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn setup(data: &Path) {
    std::fs::create_dir_all(data).unwrap();
    let config = data.join("sessionbox.toml");
    if !config.exists() {
        std::fs::write(&config, "[isolated]\nidle_timeout_secs = 5\n").unwrap();
    }
}

fn cli(data: &Path, store_url: Option<&str>, args: &[&str]) -> Output {
    setup(data);
    let mut c = Command::new(EXE);
    c.arg("--data-dir")
        .arg(data)
        .args(args)
        .env_remove("SESSIONBOX_RUNTIME")
        .env_remove("SESSIONBOX_TENANT")
        .env_remove("SESSIONBOX_STORE_URL")
        .stdin(Stdio::null());
    if let Some(u) = store_url {
        c.env("SESSIONBOX_STORE_URL", u);
    }
    c.output().expect("run sessionbox")
}

/// A running `sessionbox serve`, killed when dropped.
struct Served {
    child: Child,
    base: String,
}

impl Served {
    fn start(data: &Path, store_url: Option<&str>, extra: &[&str]) -> Served {
        setup(data);
        let mut c = serve_command(EXE, data, &[]);
        c.args(extra).env_remove("SESSIONBOX_STORE_URL");
        if let Some(u) = store_url {
            c.env("SESSIONBOX_STORE_URL", u);
        }
        let (child, base) = spawn_serve(&mut c);
        Served { child, base }
    }

    fn signal(&self, sig: rustix::process::Signal) {
        rustix::process::kill_process(rustix::process::Pid::from_child(&self.child), sig).unwrap();
    }

    fn wait(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "serve did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn url(base: &str, id: &str, tail: &str) -> String {
    format!("{base}/v1/conversations/{id}{tail}")
}

async fn exec(http: &reqwest::Client, base: &str, id: &str, cmd: &str) -> (StatusCode, Value) {
    let r = post_json(http, &url(base, id, "/exec"), &json!({"command": cmd}))
        .send()
        .await
        .unwrap();
    let st = r.status();
    let body = r.bytes().await.unwrap_or_default();
    (st, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn post_json(http: &reqwest::Client, u: &str, v: &Value) -> reqwest::RequestBuilder {
    http.post(u)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(v).unwrap())
}

/// The garbage collection report of the CLI (`gc --json`), with the grace period off.
fn gc(data: &Path, store_url: Option<&str>, dry_run: bool) -> Value {
    let mut args = vec!["gc", "--json", "--grace-secs", "0"];
    if dry_run {
        args.push("--dry-run");
    }
    let out = cli(data, store_url, &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn found(report: &Value) -> usize {
    ["expired", "stuck", "orphans", "dangling"]
        .iter()
        .map(|k| report[k].as_array().map_or(0, Vec::len))
        .sum()
}

fn records(data: &Path, store_url: Option<&str>) -> Vec<Value> {
    let out = cli(
        data,
        store_url,
        &["conversations", "--all-tenants", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
}

/// Destroys every recorded conversation (ending their sandboxes).
fn destroy_all(data: &Path, store_url: Option<&str>) {
    for r in records(data, store_url) {
        let id = r["id"].as_str().unwrap();
        let out = cli(
            data,
            store_url,
            &[
                "--tenant",
                r["tenant"].as_str().unwrap(),
                "destroy",
                "-c",
                id,
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Requests answered by a server on `route` (summed over methods and statuses), from
/// `/metrics`.
async fn served(http: &reqwest::Client, base: &str, route: &str) -> u64 {
    let body = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    body.lines()
        .filter(|l| {
            l.starts_with("sessionbox_http_requests_total{")
                && l.contains(&format!("route=\"{route}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Runs `verify --via A --via B` with `conversations` x `rounds` and checks its report: it
/// passed on `runtime`, every round was verified and nothing was left.
fn verify_through(
    dir: &Path,
    a: &Served,
    b: &Served,
    runtime: &str,
    conversations: u32,
    rounds: u32,
) {
    let report = dir.join("verify.json");
    let out = Command::new(EXE)
        .args(["verify", "--via", &a.base, "--via", &b.base])
        .args(["--conversations", &conversations.to_string()])
        .args(["--rounds", &rounds.to_string(), "--report-json"])
        .arg(&report)
        .env_remove("SESSIONBOX_API_KEY")
        .env_remove("SESSIONBOX_TENANT")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["ok"], true, "{r:#}");
    assert_eq!(r["runtime"], runtime);
    assert_eq!(
        r["checks"]["concurrency"]["rounds_verified"],
        conversations * rounds
    );
    assert_eq!(r["checks"]["cleanup"]["leftovers"], 0);
}

/// Both replicas served at least `least` of the experiment's exec requests.
async fn both_served_execs(http: &reqwest::Client, a: &Served, b: &Served, least: u64) {
    let exec_route = "/v1/conversations/{id}/exec";
    let (ea, eb) = (
        served(http, &a.base, exec_route).await,
        served(http, &b.base, exec_route).await,
    );
    eprintln!("exec requests: replica A {ea}, replica B {eb}");
    assert!(ea >= least && eb >= least, "A served {ea}, B served {eb}");
}

/// `n` first opens of conversation `id`, alternating replicas, all at once: exactly one
/// answers 201 Created (single-flight creation across replicas), every other one succeeds.
async fn opens_at_once_create_once(
    http: &reqwest::Client,
    a: &Served,
    b: &Served,
    id: &str,
    n: usize,
) {
    let opens: Vec<_> = (0..n)
        .map(|i| {
            let (http, base) = (http.clone(), if i % 2 == 0 { &a.base } else { &b.base });
            let u = url(base, id, "");
            tokio::spawn(async move { http.post(u).send().await.unwrap().status() })
        })
        .collect();
    let mut created = 0;
    for o in opens {
        let st = o.await.unwrap();
        assert!(st.is_success(), "{st}");
        created += usize::from(st == StatusCode::CREATED);
    }
    assert_eq!(created, 1, "more than one replica created the conversation");
}

#[test]
fn two_replicas_sharing_postgres_pass_verify_with_requests_alternating_between_them() {
    needs_root!();
    let Some(db) = pg::database() else { return };
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    let a = Served::start(&data, Some(&db.url), &[]);
    let b = Served::start(&data, Some(&db.url), &[]);
    assert_ne!(a.base, b.base);

    verify_through(d.path(), &a, &b, "isolated", 8, 5);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = http();
        // Both replicas served the experiment's execs and file operations.
        both_served_execs(&http, &a, &b, 20).await;
        // Single-flight creation: 16 opens of a new conversation, half at each replica.
        opens_at_once_create_once(&http, &a, &b, "single-flight", 16).await;

        // Ordering across replicas: a read-sleep-write increment, 12 times, alternating
        // replicas, all at once. Without one-at-a-time per conversation, increments are lost.
        let incr = "n=$(cat n 2>/dev/null || echo 0); sleep 0.05; echo $((n+1)) > n";
        let tasks: Vec<_> = (0..12)
            .map(|i| {
                let (http, base) = (
                    http.clone(),
                    if i % 2 == 0 {
                        a.base.clone()
                    } else {
                        b.base.clone()
                    },
                );
                tokio::spawn(async move { exec(&http, &base, "ordered", incr).await })
            })
            .collect();
        for t in tasks {
            let (st, v) = t.await.unwrap();
            assert_eq!(st, StatusCode::OK, "{v}");
            assert_eq!(v["exit_code"], 0, "{v}");
        }
        let (_, v) = exec(&http, &a.base, "ordered", "cat n").await;
        assert_eq!(v["stdout"], "12\n", "increments were lost: {v}");

        // A session kept by B is not used after A destroyed the conversation.
        let (st, _) = exec(&http, &b.base, "cached", "echo kept > f").await;
        assert_eq!(st, StatusCode::OK);
        let st = http
            .get(url(&b.base, "cached", "/files/f"))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(st, StatusCode::OK);
        let st = http
            .delete(url(&a.base, "cached", ""))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(st, StatusCode::NO_CONTENT);
        let r = http
            .get(url(&b.base, "cached", "/files/f"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::NOT_FOUND,
            "B used a session of a destroyed conversation"
        );
        // Made again through B, it is a new, empty conversation.
        let (_, v) = exec(&http, &b.base, "cached", "ls").await;
        assert_eq!(v["stdout"], "", "{v}");
    });
    drop((a, b));
    destroy_all(&data, Some(&db.url));
    assert_eq!(found(&gc(&data, Some(&db.url), true)), 0);
}

/// The scale-out the isolated runtime cannot give: two replicas, as on two nodes (each its own
/// data directory), share one PostgreSQL store, one real OpenSandbox server (one instance
/// name) and one snapshot directory. `verify --via A --via B` passes with every conversation's requests alternating between
/// them; a conversation opened at both at once gets one sandbox on the server; one replica
/// destroys what the other created; nothing is left on the server.
#[test]
fn two_replicas_on_opensandbox_sharing_postgres_pass_verify_with_one_sandbox_per_conversation() {
    let Some(db) = pg::database() else { return };
    let (Ok(domain), Ok(_)) = (
        std::env::var("OPEN_SANDBOX_DOMAIN"),
        std::env::var("OPEN_SANDBOX_API_KEY"),
    ) else {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        assert!(
            !ci,
            "under CI the OpenSandbox server must be configured (scripts/opensandbox-up)"
        );
        eprintln!("SKIPPED: no OpenSandbox server configured");
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let instance = format!("replicas-{}", std::process::id());
    let nodes: Vec<PathBuf> = ["node-a", "node-b"]
        .iter()
        .map(|n| {
            let data = d.path().join(n);
            std::fs::create_dir_all(&data).unwrap();
            std::fs::write(
                data.join("sessionbox.toml"),
                // Snapshots are files: replicas on two nodes share their directory (as they
                // would a network file system), so one takes what the other forks.
                format!(
                    "runtime = \"opensandbox\"\n[opensandbox]\nendpoint = \"{domain}\"\n\
                     instance = \"{instance}\"\n[snapshots]\ndir = \"{}\"\n",
                    d.path().join("shared-snapshots").display()
                ),
            )
            .unwrap();
            data
        })
        .collect();
    let a = Served::start(&nodes[0], Some(&db.url), &[]);
    let b = Served::start(&nodes[1], Some(&db.url), &[]);

    verify_through(d.path(), &a, &b, "opensandbox", 4, 3);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = http();
        both_served_execs(&http, &a, &b, 6).await;
        // Eight first opens of one conversation, half at each replica, at once: one record,
        // one sandbox on the server.
        opens_at_once_create_once(&http, &a, &b, "shared", 8).await;
        // Written through A, read through B: the same sandbox.
        let (st, v) = exec(&http, &a.base, "shared", "echo from-a > f; hostname").await;
        assert_eq!(st, StatusCode::OK, "{v}");
        let host_a = v["stdout"].as_str().unwrap().to_owned();
        let (_, v) = exec(&http, &b.base, "shared", "cat f; hostname").await;
        assert_eq!(v["stdout"], format!("from-a\n{host_a}"), "{v}");
    });
    // Each node's garbage collection lists the server's sandboxes of this instance: none is an
    // orphan (no second sandbox leaked from the concurrent opens) and no record dangles.
    for node in &nodes {
        assert_eq!(found(&gc(node, Some(&db.url), true)), 0);
    }
    // Destroyed through B (which did not necessarily create it), then nothing is left.
    let out = cli(&nodes[1], Some(&db.url), &["destroy", "-c", "shared"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("destroyed"),
        "{}",
        text(&out.stdout)
    );
    drop((a, b));
    assert!(records(&nodes[0], Some(&db.url)).is_empty());
    let listed = cli(
        &nodes[0],
        Some(&db.url),
        &["gc", "--dry-run", "--json", "--grace-secs", "0"],
    );
    let report: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(found(&report), 0, "{report:#}");
}

/// Kills `serve` with SIGKILL under a load of concurrent writes and execs on 8 conversations,
/// restarts it, and checks what the issue asks: every acknowledged write is present, no record
/// points at nothing, and garbage collection leaves zero orphans. `store_url` picks the store.
fn crash_recovery(store_url: Option<&str>) {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    let first = Served::start(&data, store_url, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    // (conversation, path) -> content, for each write the server acknowledged.
    let acked: Arc<Mutex<BTreeMap<(String, String), String>>> = Arc::default();
    let stats = rt.block_on(async {
        let http = http();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let (http, base, acked, stop) = (
                    http.clone(),
                    first.base.clone(),
                    acked.clone(),
                    stop.clone(),
                );
                tokio::spawn(async move {
                    let id = format!("crash-{i}");
                    let mut n = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        let (path, content) = (format!("w{n}.txt"), format!("write {i} {n}"));
                        let ok = if n.is_multiple_of(2) {
                            http.put(url(&base, &id, &format!("/files/{path}")))
                                .body(content.clone())
                                .send()
                                .await
                                .is_ok_and(|r| r.status().is_success())
                        } else {
                            let cmd = format!("printf '%s' '{content}' > {path}");
                            let req = post_json(
                                &http,
                                &url(&base, &id, "/exec"),
                                &json!({"command": cmd}),
                            );
                            match req.send().await {
                                Ok(r) if r.status().is_success() => r
                                    .bytes()
                                    .await
                                    .ok()
                                    .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                                    .is_some_and(|v| v["exit_code"] == 0),
                                _ => false,
                            }
                        };
                        if ok {
                            acked.lock().unwrap().insert((id.clone(), path), content);
                        }
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        first.signal(rustix::process::Signal::KILL);
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut sent = 0;
        for t in tasks {
            sent += t.await.unwrap();
        }
        sent
    });
    let mut first = first;
    first.wait();
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "{} requests sent, {} acknowledged before SIGKILL",
        stats,
        acked.len()
    );
    assert!(
        acked.len() >= 16,
        "too little load before the kill: {}",
        acked.len()
    );

    let second = Served::start(&data, store_url, &["--gc-interval-secs", "0"]);
    rt.block_on(async {
        let http = http();
        for ((id, path), content) in &acked {
            let r = http
                .get(url(&second.base, id, &format!("/files/{path}")))
                .send()
                .await
                .unwrap();
            assert_eq!(
                r.status(),
                StatusCode::OK,
                "{id}/{path} acknowledged, then lost"
            );
            assert_eq!(&r.text().await.unwrap(), content, "{id}/{path}");
        }
    });
    // Garbage collection, then: no orphan left, and every record points at a workspace.
    let first_gc = gc(&data, store_url, false);
    eprintln!("gc after the crash: {first_gc}");
    let after = gc(&data, store_url, true);
    assert_eq!(found(&after), 0, "orphans after gc: {after:#}");
    for r in records(&data, store_url) {
        let ws = data.join("workspaces").join(r["key"].as_str().unwrap());
        assert!(ws.is_dir(), "record {} points at nothing", r["id"]);
        assert_eq!(r["state"], "active", "{r}");
    }
    // Every acknowledged write is still there after gc too.
    for (id, path) in acked.keys() {
        let key_ws = records(&data, store_url)
            .into_iter()
            .find(|r| r["id"] == id.as_str())
            .map(|r| data.join("workspaces").join(r["key"].as_str().unwrap()))
            .expect("the record of a conversation with acknowledged writes");
        assert!(key_ws.join(path).is_file(), "{id}/{path} gone after gc");
    }
    drop(second);
    destroy_all(&data, store_url);
    assert_eq!(found(&gc(&data, store_url, true)), 0);
    let left: Vec<PathBuf> = std::fs::read_dir(data.join("workspaces"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn serve_killed_mid_load_loses_no_acknowledged_write_and_gc_leaves_no_orphan_sqlite() {
    needs_root!();
    crash_recovery(None);
}

#[test]
fn serve_killed_mid_load_loses_no_acknowledged_write_and_gc_leaves_no_orphan_postgres() {
    needs_root!();
    let Some(db) = pg::database() else { return };
    crash_recovery(Some(&db.url));
}
