//! Background commands through `sessionbox serve`, the real binary, on the `host` runtime (a
//! detached supervisor per command) and the `isolated` one (the sandbox's agent, as root):
//! a command outlives a serve killed with SIGKILL and is listed, read and killed by the next
//! one; finished commands free their slot; kill of a finished command answers at once; logs
//! follow live over SSE; destroy does not wait per command; the running gauge comes back to 0.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use sessionbox_test_support::{serve_command, spawn_serve};

/// A running `sessionbox serve` (open mode on loopback), killed with SIGKILL when dropped.
struct Served {
    child: Child,
    base: String,
}

impl Served {
    fn start(data: &Path, runtime: &str) -> Served {
        std::fs::create_dir_all(data).unwrap();
        let config = data.join("sessionbox.toml");
        if !config.exists() {
            std::fs::write(&config, "[isolated]\nidle_timeout_secs = 5\n").unwrap();
        }
        let (child, base) = spawn_serve(&mut serve_command(
            env!("CARGO_BIN_EXE_sessionbox"),
            data,
            &["--runtime", runtime],
        ));
        Served { child, base }
    }

    /// SIGKILL: no graceful stop, nothing flushed.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn json_of(r: reqwest::Response) -> (StatusCode, Value) {
    let st = r.status();
    let b = r.bytes().await.unwrap();
    (st, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The runtimes to test here: `host` always, `isolated` as root.
fn runtimes() -> Vec<&'static str> {
    let mut r = vec!["host"];
    if is_root() {
        r.push("isolated");
    } else {
        println!("isolated skipped: it needs root (CI runs it as root)");
    }
    r
}

async fn start_bg(c: &Client, base: &str, conv: &str, command: &str) -> (StatusCode, Value) {
    json_of(
        c.post(format!("{base}/v1/conversations/{conv}/exec"))
            .json(&json!({"command": command, "background": true}))
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// Long-polls the logs from the start until the command has ended; returns the last answer.
async fn until_ended(c: &Client, base: &str, conv: &str, id: &str) -> Value {
    for _ in 0..40 {
        let (st, v) = json_of(
            c.get(format!(
                "{base}/v1/conversations/{conv}/commands/{id}/logs?wait_ms=5000"
            ))
            .send()
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        if v["running"] == false {
            return v;
        }
    }
    panic!("command {id} never ended");
}

async fn gauge(c: &Client, base: &str) -> i64 {
    let text = c
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("sessionbox_background_commands_running "))
        .unwrap_or_else(|| panic!("no gauge in {text}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_command_outlives_a_killed_serve_and_the_next_one_lists_reads_and_kills_it() {
    for runtime in runtimes() {
        let d = tempfile::tempdir().unwrap();
        let c = client();
        let served = Served::start(d.path(), runtime);
        let (st, v) = start_bg(&c, &served.base, "r", "echo started; sleep 30; echo done").await;
        assert_eq!(st, StatusCode::ACCEPTED, "{runtime}: {v}");
        let id = v["id"].as_str().unwrap().to_owned();
        // Its first line is there before serve dies.
        let (_, v) = json_of(
            c.get(format!(
                "{}/v1/conversations/r/commands/{id}/logs?wait_ms=10000",
                served.base
            ))
            .send()
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(v["stdout"]["text"], "started\n", "{runtime}: {v}");
        served.kill();

        let served = Served::start(d.path(), runtime);
        let base = &served.base;
        let (st, list) = json_of(
            c.get(format!("{base}/v1/conversations/r/commands"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{runtime}: {list}");
        let all = list["commands"].as_array().unwrap();
        assert_eq!(all.len(), 1, "{runtime}: {list}");
        assert_eq!(
            (all[0]["id"].as_str(), all[0]["running"].clone()),
            (Some(id.as_str()), json!(true)),
            "{runtime}: {list}"
        );
        assert_eq!(all[0]["command"], "echo started; sleep 30; echo done");
        let (_, logs) = json_of(
            c.get(format!("{base}/v1/conversations/r/commands/{id}/logs"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            (logs["stdout"]["text"].clone(), logs["running"].clone()),
            (json!("started\n"), json!(true)),
            "{runtime}: {logs}"
        );
        let t = Instant::now();
        let (st, k) = json_of(
            c.delete(format!("{base}/v1/conversations/r/commands/{id}"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{runtime}: {k}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(
            (
                k["running"].clone(),
                k["killed"].clone(),
                k["exit_code"].clone()
            ),
            (json!(false), json!(true), json!(137)),
            "{runtime}: {k}"
        );
        assert_eq!(k["status"], json!({"signal": 9}), "{runtime}: {k}");
        let (_, again) = json_of(
            c.get(format!("{base}/v1/conversations/r/commands/{id}"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(again["exit_code"], 137, "{runtime}: {again}");
        assert_eq!(
            again["stdout_bytes"], 8,
            "'done' was never written: {again}"
        );
        let r = c
            .delete(format!("{base}/v1/conversations/r"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_free_on_finish_kill_of_a_finished_command_is_at_once_and_destroy_does_not_wait() {
    for runtime in runtimes() {
        let d = tempfile::tempdir().unwrap();
        let c = client();
        let served = Served::start(d.path(), runtime);
        let base = &served.base;
        // Twenty short commands one after another: all accepted (a finished one frees its slot).
        let mut last = String::new();
        for i in 0..20 {
            let (st, v) = start_bg(&c, base, "s", &format!("echo {i}")).await;
            assert_eq!(st, StatusCode::ACCEPTED, "{runtime} #{i}: {v}");
            last = v["id"].as_str().unwrap().to_owned();
            let end = until_ended(&c, base, "s", &last).await;
            assert_eq!(end["stdout"]["text"], format!("{i}\n"), "{runtime}: {end}");
            assert_eq!(end["exit_code"], 0, "{runtime}: {end}");
        }
        // Killing a finished command answers at once, and changes nothing.
        let t = Instant::now();
        let (st, k) = json_of(
            c.delete(format!("{base}/v1/conversations/s/commands/{last}"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{k}");
        assert!(
            t.elapsed() < Duration::from_millis(1000),
            "{runtime}: {:?}",
            t.elapsed()
        );
        assert_eq!(
            (k["killed"].clone(), k["exit_code"].clone()),
            (json!(false), json!(0))
        );

        // The gauge counts running commands and the limit is on running ones.
        for _ in 0..16 {
            let (st, v) = start_bg(&c, base, "s", "sleep 60").await;
            assert_eq!(st, StatusCode::ACCEPTED, "{runtime}: {v}");
        }
        let (st, v) = start_bg(&c, base, "s", "true").await;
        assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{runtime}: {v}");
        assert_eq!(v["code"], "busy");
        // The server's watcher of a command that just finished may count it a moment longer:
        // the gauge settles at the 16 running.
        let settle = Instant::now();
        let mut running = gauge(&c, base).await;
        while running != 16 && settle.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            running = gauge(&c, base).await;
        }
        assert_eq!(running, 16, "{runtime}");

        // Destroy with 16 running and many finished commands: no wait per command.
        let t = Instant::now();
        let r = c
            .delete(format!("{base}/v1/conversations/s"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        let took = t.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "{runtime}: destroy took {took:?}"
        );
        println!("{runtime}: destroy with 16 running and 20 finished commands: {took:?}");
        let t = Instant::now();
        while gauge(&c, base).await != 0 {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{runtime}: the gauge stays up"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_a_command_live_over_sse_with_exact_bytes() {
    for runtime in runtimes() {
        let d = tempfile::tempdir().unwrap();
        let c = client();
        let served = Served::start(d.path(), runtime);
        let base = &served.base;
        let (_, v) = start_bg(
            &c,
            base,
            "f",
            "for i in 1 2 3; do echo $i; sleep 0.6; done; printf '\\377' >&2",
        )
        .await;
        let id = v["id"].as_str().unwrap().to_owned();
        let t = Instant::now();
        let mut r = c
            .get(format!("{base}/v1/conversations/f/commands/{id}/logs"))
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let mut body = String::new();
        let mut first_output_at = None;
        while let Some(chunk) = r.chunk().await.unwrap() {
            body.push_str(&String::from_utf8_lossy(&chunk));
            if first_output_at.is_none() && body.contains("event: stdout") {
                first_output_at = Some(t.elapsed());
            }
        }
        let total = t.elapsed();
        let first = first_output_at.expect("a stdout event");
        // The first line came while the command still ran (it takes 1.8 s).
        assert!(
            first < Duration::from_millis(1200),
            "{runtime}: first after {first:?}"
        );
        assert!(
            total >= Duration::from_millis(1500),
            "{runtime}: ended after {total:?}"
        );
        let events: Vec<(String, Value)> = body
            .split("\n\n")
            .filter_map(|e| {
                let name = e.lines().find_map(|l| l.strip_prefix("event: "))?;
                let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
                Some((name.to_owned(), serde_json::from_str(data).unwrap()))
            })
            .collect();
        let out: String = events
            .iter()
            .filter(|(n, _)| n == "stdout")
            .map(|(_, d)| d["text"].as_str().unwrap())
            .collect();
        assert_eq!(out, "1\n2\n3\n", "{runtime}: {body}");
        let err: Vec<&Value> = events
            .iter()
            .filter(|(n, _)| n == "stderr")
            .map(|(_, d)| d)
            .collect();
        assert_eq!(err.len(), 1, "{runtime}: {body}");
        assert_eq!(err[0]["base64"], "/w==", "{runtime}: {body}");
        let (name, exit) = events.last().unwrap();
        assert_eq!(name, "exit", "{runtime}: {body}");
        assert_eq!(exit["exit_code"], 0);
        assert_eq!(exit["stdout_bytes"], 6);
        // Following from the end of a finished command ends at once with its exit.
        let body = c
            .get(format!(
                "{base}/v1/conversations/f/commands/{id}/logs?stdout_offset=6&stderr_offset=1"
            ))
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            body.contains("event: exit") && !body.contains("event: stdout"),
            "{body}"
        );
    }
}

/// `sessionbox` on the host runtime with `dir` as its data directory.
fn cli(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sessionbox"))
        .arg("--data-dir")
        .arg(dir)
        .args(["--runtime", "host"])
        .args(args)
        .env_remove("SESSIONBOX_RUNTIME")
        .env_remove("SESSIONBOX_TENANT")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn the_cli_starts_lists_follows_and_kills_background_commands() {
    let d = tempfile::tempdir().unwrap();
    let out = cli(
        d.path(),
        &[
            "exec",
            "-c",
            "x",
            "--background",
            "--",
            "printf 'a\\000\\377'; printf e >&2; sleep 0.5; exit 5",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    sessionbox_core::validate_command_id(&id).unwrap();
    // Follow: the exact bytes on each stream, and the command's exit code.
    let out = cli(d.path(), &["logs", "-c", "x", &id, "--follow"]);
    assert_eq!(out.stdout, b"a\0\xff");
    assert_eq!(out.stderr, b"e");
    assert_eq!(out.status.code(), Some(5));
    let slow = cli(
        d.path(),
        &["exec", "-c", "x", "--background", "--", "sleep 30"],
    );
    let slow = String::from_utf8(slow.stdout).unwrap().trim().to_owned();
    let out = cli(d.path(), &["commands", "-c", "x"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with(&format!("{id}  ended")) && lines[0].contains("   5  "),
        "{text}"
    );
    assert!(lines[1].starts_with(&format!("{slow}  running")), "{text}");
    let out = cli(d.path(), &["kill", "-c", "x", &slow]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["killed"].clone(), v["running"].clone()),
        (json!(true), json!(false))
    );
    let out = cli(d.path(), &["commands", "-c", "x", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(v[1]["status"], json!({"signal": 9}));
    // A malformed id is refused as invalid input (exit 2) and an unknown conversation is not
    // created.
    let out = cli(d.path(), &["logs", "-c", "x", "../etc"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(d.path(), &["commands", "-c", "nope"]);
    assert!(!out.status.success());
    assert_eq!(d.path().join("workspaces").read_dir().unwrap().count(), 1);
}
