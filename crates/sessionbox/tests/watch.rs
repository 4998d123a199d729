//! Issue 21, file watching, end to end on every runtime: `GET /v1/conversations/{id}/watch`
//! through `sessionbox serve`, and `sessionbox watch`. On `isolated` and `opensandbox` (the real
//! OpenSandbox server) the events of a command's changes arrive with the paths the
//! conversation sees, nothing of outside the workspace nor of another conversation arrives, an
//! open watch keeps an idle sandbox up, the limit of watches holds, and a destroy ends the
//! stream; `host` and `aio`, which run no agent, refuse with a clear error.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use sessionbox_test_support::{serve_command, spawn_serve};

use crate::exact::{self, RuntimeUnderTest};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn create_key(rt: &RuntimeUnderTest) -> String {
    let out = rt.run(
        &["--tenant", "default", "keys", "create", "--label", "watch"],
        b"",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

/// A running `sessionbox serve`, killed when dropped.
struct Served {
    child: Child,
    base: String,
}

impl Served {
    fn start(data: &Path) -> Served {
        let (child, base) = spawn_serve(&mut serve_command(
            env!("CARGO_BIN_EXE_sessionbox"),
            data,
            &[],
        ));
        Served { child, base }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server-sent event stream read as it arrives.
struct Sse {
    response: reqwest::Response,
    buf: Vec<u8>,
}

impl Sse {
    /// The next event (name and JSON data) before `deadline`; `None` at the stream's end or
    /// the deadline.
    async fn next(&mut self, deadline: Instant) -> Option<(String, Value)> {
        loop {
            while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                let block = text(&block);
                let mut name = String::new();
                let mut data = None;
                for line in block.lines() {
                    if let Some(n) = line.strip_prefix("event:") {
                        name = n.trim().to_owned();
                    } else if let Some(d) = line.strip_prefix("data:") {
                        data = Some(serde_json::from_str(d.trim()).unwrap());
                    }
                }
                if let Some(data) = data {
                    return Some((name, data));
                }
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            match tokio::time::timeout(left, self.response.chunk()).await {
                Ok(Ok(Some(c))) => self.buf.extend_from_slice(&c),
                _ => return None,
            }
        }
    }

    /// Events until one satisfies `done` (included), or `limit` passes.
    async fn until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&str, &Value) -> bool,
    ) -> Vec<(String, Value)> {
        let deadline = Instant::now() + limit;
        let mut got = Vec::new();
        while let Some((name, data)) = self.next(deadline).await {
            let stop = done(&name, &data);
            got.push((name, data));
            if stop {
                break;
            }
        }
        got
    }
}

fn has(got: &[(String, Value)], kind: &str, data: Value) -> bool {
    got.iter().any(|(n, d)| {
        n == kind
            && data
                .as_object()
                .unwrap()
                .iter()
                .all(|(k, v)| d.get(k) == Some(v))
    })
}

async fn watch(client: &Client, key: &str, base: &str, path: &str) -> reqwest::Response {
    client
        .get(format!("{base}/watch?path={path}"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
}

async fn put(client: &Client, key: &str, base: &str, path: &str, body: &str) {
    let r = client
        .put(format!("{base}/files/{path}"))
        .bearer_auth(key)
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "{path}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_a_conversations_changes_and_nothing_else_on_every_runtime() {
    for rt in exact::runtimes("watch") {
        let name = rt.name;
        let key = create_key(&rt);
        let served = Served::start(&rt.data);
        let base = format!("{}/v1/conversations/watched", served.base);
        let other = format!("{}/v1/conversations/watch-other", served.base);
        let client = Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .unwrap();
        put(&client, &key, &base, "src/keep.txt", "k").await;
        let r = watch(&client, &key, &base, "src").await;
        if name == "host" {
            // The host runtime's own agent on the workspace: its paths are the host
            // directory's (the runtime presents its workspace so); the attacks below are the
            // sandboxes'.
            assert_eq!(r.status(), StatusCode::OK, "{name}");
            let mut sse = Sse {
                response: r,
                buf: Vec::new(),
            };
            let first = sse.until(Duration::from_secs(30), |_, _| true).await;
            assert_eq!(first[0].0, "ready", "{name}: {first:?}");
            assert!(
                first[0].1["path"].as_str().unwrap().ends_with("/src"),
                "{name}: {first:?}"
            );
            put(&client, &key, &base, "src/new.txt", "n").await;
            let got = sse
                .until(Duration::from_secs(30), |_, d| {
                    d["to"]
                        .as_str()
                        .is_some_and(|t| t.ends_with("/src/new.txt"))
                })
                .await;
            assert!(
                got.last().is_some_and(|(_, d)| d["to"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("/src/new.txt"))),
                "{name}: no event for a write: {got:?}"
            );
            drop(sse);
            rt.destroy("watched");
            continue;
        }
        if name == "aio" {
            let st = r.status();
            let v: Value = r.json().await.unwrap();
            assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{name}: {v}");
            assert_eq!(v["code"], "runtime_unavailable", "{name}: {v}");
            assert!(
                v["message"].as_str().unwrap().contains("file watching"),
                "{name}: {v}"
            );
            rt.destroy("watched");
            continue;
        }
        assert_eq!(r.status(), StatusCode::OK, "{name}");
        assert_eq!(
            r.headers()["content-type"].to_str().unwrap(),
            "text/event-stream",
            "{name}"
        );
        let mut sse = Sse {
            response: r,
            buf: Vec::new(),
        };
        let first = sse.until(Duration::from_secs(30), |_, _| true).await;
        assert_eq!(first[0].0, "ready", "{name}: {first:?}");
        assert_eq!(first[0].1["path"], "/workspace/src", "{name}");
        assert_eq!(first[0].1["watched_dirs"], 1, "{name}");

        // A command's changes, and an attack: a link in the workspace to /tmp, then a change
        // there.
        let started = Instant::now();
        let exec = client
            .post(format!("{base}/exec"))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(
                json!({"command": "echo hi > src/a.txt && mv src/a.txt src/b.txt && rm src/b.txt \
                    && mkdir -p src/d/e && ln -s /tmp src/tmp && echo secret > /tmp/outside.txt \
                    && echo more >> /tmp/outside.txt && touch src/done"})
                .to_string(),
            )
            .send();
        let exec = tokio::spawn(exec);
        let mut first_at = None;
        let got = sse
            .until(Duration::from_secs(60), |_, d| {
                first_at.get_or_insert_with(|| started.elapsed());
                d["path"] == "/workspace/src/done"
            })
            .await;
        let all_at = started.elapsed();
        assert_eq!(exec.await.unwrap().unwrap().status(), StatusCode::OK);
        eprintln!(
            "{name}: first event {:?} after the exec was sent, all {} in {all_at:?}",
            first_at.unwrap_or_default(),
            got.len()
        );
        for (kind, data) in [
            (
                "created",
                json!({"path": "/workspace/src/a.txt", "dir": false}),
            ),
            (
                "modified",
                json!({"path": "/workspace/src/a.txt", "dir": false}),
            ),
            (
                "moved",
                json!({"from": "/workspace/src/a.txt", "to": "/workspace/src/b.txt"}),
            ),
            (
                "deleted",
                json!({"path": "/workspace/src/b.txt", "dir": false}),
            ),
            ("created", json!({"path": "/workspace/src/d", "dir": true})),
            (
                "created",
                json!({"path": "/workspace/src/d/e", "dir": true}),
            ),
            (
                "created",
                json!({"path": "/workspace/src/tmp", "dir": false}),
            ),
            (
                "created",
                json!({"path": "/workspace/src/done", "dir": false}),
            ),
        ] {
            assert!(
                has(&got, kind, data.clone()),
                "{name}: no {kind} {data} in {got:#?}"
            );
        }
        for (_, d) in &got {
            let shown = d.to_string();
            assert!(!shown.contains("outside.txt"), "{name}: {shown}");
            for p in [&d["path"], &d["from"], &d["to"]] {
                if let Some(p) = p.as_str() {
                    assert!(p.starts_with("/workspace/src/"), "{name}: {shown}");
                }
            }
        }

        // Another conversation's changes never reach this watch.
        put(&client, &key, &other, "src/b-secret.txt", "b").await;
        // (A write through the file API is atomic: a temporary file moved over the target.)
        put(&client, &key, &base, "src/marker", "m").await;
        let got = sse
            .until(Duration::from_secs(30), |_, d| {
                d["to"] == "/workspace/src/marker"
            })
            .await;
        assert!(
            has(&got, "moved", json!({"to": "/workspace/src/marker"})),
            "{name}: {got:?}"
        );
        assert!(!format!("{got:?}").contains("b-secret"), "{name}: {got:?}");

        // An open watch is activity: the sandbox outlives its idle timeout (3 s on isolated).
        tokio::time::sleep(Duration::from_secs(6)).await;
        put(&client, &key, &base, "src/after-idle", "i").await;
        let got = sse
            .until(Duration::from_secs(30), |_, d| {
                d["to"] == "/workspace/src/after-idle"
            })
            .await;
        assert!(
            has(&got, "moved", json!({"to": "/workspace/src/after-idle"})),
            "{name}: the watch lived through the idle timeout: {got:?}"
        );

        // At most 4 watches at once in one conversation; the 5th is refused.
        let mut more = Vec::new();
        for _ in 0..3 {
            let r = watch(&client, &key, &base, ".").await;
            assert_eq!(r.status(), StatusCode::OK, "{name}");
            more.push(r);
        }
        let r = watch(&client, &key, &base, ".").await;
        let st = r.status();
        let v: Value = r.json().await.unwrap();
        assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{name}: {v}");
        assert_eq!(v["code"], "busy", "{name}: {v}");
        // Paths outside, and not directories, are refused before anything is watched.
        drop(more.pop());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let r = watch(&client, &key, &base, "../etc").await;
        let st = r.status();
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["code"], "outside_workspace", "{name}: {st} {v}");
        let r = watch(&client, &key, &base, "src/keep.txt").await;
        let st = r.status();
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["code"], "conflict", "{name}: {st} {v}");

        // A destroy ends every watch of the conversation.
        let t = Instant::now();
        let r = client.delete(&base).bearer_auth(&key).send().await.unwrap();
        assert!(r.status().is_success(), "{name}: {}", r.status());
        let rest = sse.until(Duration::from_secs(60), |_, _| false).await;
        eprintln!(
            "{name}: the watch ended {:?} after the destroy",
            t.elapsed()
        );
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{name}: the watch outlived the destroy: {rest:?}"
        );
        rt.destroy("watch-other");
        drop(served);
    }
}

/// `sessionbox watch -c ID [PATH]`: one JSON line per event, as they happen.
#[test]
fn the_cli_prints_one_json_line_per_event_on_every_runtime() {
    for rt in exact::runtimes("watch-cli") {
        let name = rt.name;
        let out = rt.run(&["write", "-c", "cliw", "src/keep.txt"], b"k");
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        let mut child = Command::new(env!("CARGO_BIN_EXE_sessionbox"))
            .arg("--data-dir")
            .arg(&rt.data)
            .args(["watch", "-c", "cliw", "src"])
            .env_remove("SESSIONBOX_RUNTIME")
            .env_remove("SESSIONBOX_TENANT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if name == "aio" {
            let out = child.wait_with_output().unwrap();
            assert!(!out.status.success(), "{name}");
            assert!(
                text(&out.stderr).contains("file watching"),
                "{name}: {}",
                text(&out.stderr)
            );
            rt.destroy("cliw");
            continue;
        }
        let (tx, rx) = std::sync::mpsc::channel::<(Instant, String)>();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        let Ok((_, ready)) = rx.recv_timeout(Duration::from_secs(60)) else {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{name}: no ready line: {}", text(&out.stderr));
        };
        let ready: Value = serde_json::from_str(&ready).unwrap();
        assert_eq!(ready["kind"], "ready", "{name}: {ready}");
        // A sandbox presents its workspace at /workspace; the host runtime, as its directory.
        let root = ready["path"]
            .as_str()
            .unwrap()
            .strip_suffix("/src")
            .unwrap_or_else(|| panic!("{name}: {ready}"))
            .to_owned();
        if name != "host" {
            assert_eq!(root, "/workspace", "{name}: {ready}");
        }
        let new_txt = format!("{root}/src/new.txt");
        let sent = Instant::now();
        let out: Output = rt.run(&["write", "-c", "cliw", "src/new.txt"], b"n");
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        let mut lines = Vec::new();
        let mut seen_at = None;
        while let Ok((at, line)) = rx.recv_timeout(Duration::from_secs(30)) {
            let v: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("{name}: {e}: {line}"));
            lines.push(v.clone());
            if v["kind"] == "moved" && v["to"] == new_txt.as_str()
                || v["kind"] == "created" && v["path"] == new_txt.as_str()
            {
                seen_at = Some(at);
                break;
            }
        }
        let seen_at = seen_at.unwrap_or_else(|| panic!("{name}: no event of new.txt: {lines:?}"));
        eprintln!(
            "{name}: sessionbox watch printed new.txt {:?} after the write started",
            seen_at.duration_since(sent)
        );
        let _ = child.kill();
        let _ = child.wait();
        rt.destroy("cliw");
    }
}
