//! `sessionbox serve` and `sessionbox keys` end to end: the real binary with the `isolated`
//! runtime (the default), a real HTTP client (reqwest), keys made by the CLI.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use sessionbox_test_support::{serve_command, spawn_serve};

use crate::exact;

#[path = "serve/pty.rs"]
mod pty;

fn sessionbox(data: &Path, args: &[&str]) -> Output {
    setup(data);
    Command::new(env!("CARGO_BIN_EXE_sessionbox"))
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .env_remove("SESSIONBOX_RUNTIME")
        .env_remove("SESSIONBOX_TENANT")
        .env_remove("SESSIONBOX_LISTEN")
        .stdin(Stdio::null())
        .output()
        .expect("run sessionbox")
}

fn setup(data: &Path) {
    std::fs::create_dir_all(data).unwrap();
    let config = data.join("sessionbox.toml");
    if !config.exists() {
        // Sandboxes left warm by a test stop soon after it.
        std::fs::write(&config, "[isolated]\nidle_timeout_secs = 3\n").unwrap();
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn create_key(data: &Path, tenant: &str) -> String {
    let out = sessionbox(
        data,
        &["--tenant", tenant, "keys", "create", "--label", "e2e"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let key = text(&out.stdout).trim().to_owned();
    assert!(key.starts_with("sbk_"), "{key}");
    key
}

/// A running `sessionbox serve`, killed when dropped.
struct Served {
    child: Child,
    base: String,
}

impl Served {
    fn start(data: &Path) -> Served {
        Self::start_with(data, &[])
    }

    /// A server with these environment variables set (its flags' `env` names).
    fn start_with(data: &Path, env: &[(&str, &str)]) -> Served {
        setup(data);
        let mut command = serve_command(env!("CARGO_BIN_EXE_sessionbox"), data, &[]);
        command.envs(env.iter().copied());
        let (child, base) = spawn_serve(&mut command);
        Served { child, base }
    }

    fn stop(mut self) {
        // SIGTERM: a graceful stop exits 0.
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "{status}");
                return;
            }
            assert!(std::time::Instant::now() < deadline, "serve did not stop");
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

async fn json_of(r: reqwest::Response) -> (StatusCode, Value) {
    let st = r.status();
    let b = r.bytes().await.unwrap();
    (st, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

#[test]
fn serve_refuses_a_public_address_without_a_key_and_keys_are_listed_and_revoked() {
    let d = tempfile::tempdir().unwrap();
    let out = sessionbox(d.path(), &["serve", "--listen", "0.0.0.0:0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("keys create"),
        "{}",
        text(&out.stderr)
    );

    // create needs an explicit tenant.
    let out = sessionbox(d.path(), &["keys", "create"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));

    let key = create_key(d.path(), "acme");
    let out = sessionbox(d.path(), &["keys", "list"]);
    let listing = text(&out.stdout);
    assert!(
        listing.contains("acme") && listing.contains("e2e"),
        "{listing}"
    );
    assert!(!listing.contains(&key[20..]), "the secret is never listed");
    let out = sessionbox(d.path(), &["keys", "list", "--json"]);
    let keys: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = keys[0]["id"].as_str().unwrap().to_owned();
    assert!(key.contains(&id));
    let out = sessionbox(d.path(), &["keys", "revoke", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = sessionbox(d.path(), &["keys", "list", "--json"]);
    let keys: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(keys[0]["revoked_at"].is_string());
    let out = sessionbox(d.path(), &["keys", "revoke", "0123456789abcdef"]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn keys_create_takes_a_scope_and_an_expiry_lists_them_and_audits_them() {
    let d = tempfile::tempdir().unwrap();
    let base = ["--tenant", "acme", "keys", "create"];
    let create = |extra: &[&str]| sessionbox(d.path(), &[&base[..], extra].concat());
    let out = create(&[
        "--conversation",
        "chat-1",
        "--read-only",
        "--expires-in",
        "2h",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("conversation \"chat-1\", read-only, expires "),
        "{}",
        text(&out.stderr)
    );
    let out = create(&["--prefix", "team-a-"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Bad input: clear usage errors, and no key made.
    for (extra, says) in [
        (&["--prefix", "../x"][..], "id prefix"),
        (&["--conversation", "a/b"][..], "conversation id"),
        (&["--expires-in", "soon"][..], "--expires-in"),
        (&["--expires-in", "0s"][..], "zero"),
        (
            &["--conversation", "a", "--prefix", "b"][..],
            "cannot be used with",
        ),
    ] {
        let out = create(extra);
        assert!(!out.status.success(), "{extra:?}");
        assert!(
            text(&out.stderr).contains(says),
            "{extra:?}: {}",
            text(&out.stderr)
        );
    }

    let out = sessionbox(d.path(), &["keys", "list", "--json"]);
    let keys: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(keys.as_array().unwrap().len(), 2, "{keys}");
    assert_eq!(keys[0]["scope"]["conversations"]["kind"], "one", "{keys}");
    assert_eq!(
        keys[0]["scope"]["conversations"]["value"], "chat-1",
        "{keys}"
    );
    assert_eq!(keys[0]["scope"]["read_only"], true, "{keys}");
    assert!(keys[0]["expires_at"].is_string(), "{keys}");
    assert_eq!(
        keys[1]["scope"]["conversations"]["kind"], "prefix",
        "{keys}"
    );
    assert!(keys[1]["expires_at"].is_null(), "{keys}");
    let listing = text(&sessionbox(d.path(), &["keys", "list"]).stdout);
    assert!(
        listing.contains("conversation \"chat-1\", read-only")
            && listing.contains("conversations whose id starts with \"team-a-\""),
        "{listing}"
    );
    let audit = text(&sessionbox(d.path(), &["--tenant", "acme", "audit", "--json"]).stdout);
    assert_eq!(audit.matches("keys.create").count(), 2, "{audit}");
    assert!(audit.contains("read-only"), "{audit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_conversations_in_sandboxes_per_tenant_over_http() {
    let d = tempfile::tempdir().unwrap();
    let acme = create_key(d.path(), "acme");
    let globex = create_key(d.path(), "globex");
    let served = Served::start(d.path());
    let base = served.base.clone();
    let client = Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let run = async {
        let exec = |key: &str, conv: &str, cmd: &str| {
            client
                .post(format!("{base}/v1/conversations/{conv}/exec"))
                .bearer_auth(key)
                .header("content-type", "application/json")
                .body(json!({ "command": cmd }).to_string())
                .send()
        };
        // A wrong key is refused and creates nothing.
        let r = exec("sbk_0000000000000000_00", "one", "true")
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

        // Two tenants, one conversation id: two sandboxes.
        let (st, v) = json_of(
            exec(&acme, "one", "echo acme > f; pwd; id -u")
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert!(
            v["stdout"].as_str().unwrap().starts_with("/workspace\n"),
            "{v}"
        );
        let r = client
            .put(format!("{base}/v1/conversations/one/files/f"))
            .bearer_auth(&globex)
            .body("globex\n")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        let (_, v) = json_of(exec(&acme, "one", "cat f").await.unwrap()).await;
        assert_eq!(v["stdout"], "acme\n");
        let body = client
            .get(format!("{base}/v1/conversations/one/files/f"))
            .bearer_auth(&globex)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(body, "globex\n");

        // Edit and grep through the sandbox's agent.
        let r = client
            .post(format!("{base}/v1/conversations/one/edit"))
            .bearer_auth(&acme)
            .header("content-type", "application/json")
            .body(r#"{"path":"f","old":"acme","new":"ACME"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let (_, v) = json_of(
            client
                .post(format!("{base}/v1/conversations/one/grep"))
                .bearer_auth(&acme)
                .header("content-type", "application/json")
                .body(r#"{"pattern":"ACME"}"#)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(v["matches"][0]["path"], "f", "{v}");

        // Escapes are refused before the sandbox is asked.
        let r = client
            .get(format!(
                "{base}/v1/conversations/one/files/..%2F..%2Fetc%2Fshadow"
            ))
            .bearer_auth(&acme)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);

        let (st, v) = json_of(
            client
                .get(format!("{base}/v1/conversations/one"))
                .bearer_auth(&acme)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(v["runtime"], "isolated");

        let (st, v) = json_of(client.get(format!("{base}/readyz")).send().await.unwrap()).await;
        assert_eq!(st, StatusCode::OK, "{v}");

        for key in [&acme, &globex] {
            for _ in 0..2 {
                let r = client
                    .delete(format!("{base}/v1/conversations/one"))
                    .bearer_auth(key)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::NO_CONTENT);
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the test finished in time");
    served.stop();
    let out = sessionbox(d.path(), &["conversations", "--all-tenants"]);
    assert_eq!(
        text(&out.stdout).lines().count(),
        1,
        "{}",
        text(&out.stdout)
    );
}

/// `GET /v1/installation/doctor` of a real `serve` is `sessionbox doctor`'s report on the same
/// data directory: the same lines (but the OpenSandbox server's count of sandboxes, which other
/// tests change), `ok` as its exit status, the problems among its lines; a key limited to one
/// conversation is refused it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_shows_the_doctor_report_the_cli_prints() {
    let d = tempfile::tempdir().unwrap();
    let key = create_key(d.path(), "default");
    let out = sessionbox(
        d.path(),
        &[
            "--tenant",
            "default",
            "keys",
            "create",
            "--label",
            "one",
            "--conversation",
            "one",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let narrow = text(&out.stdout).trim().to_owned();
    let served = Served::start(d.path());
    let client = Client::new();
    let get = |k: &str| {
        client
            .get(format!("{}/v1/installation/doctor", served.base))
            .bearer_auth(k)
            .send()
    };
    let (status, v) = json_of(get(&key).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let cli = sessionbox(d.path(), &["doctor"]);
    let stable = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.starts_with("opensandbox runtime:"))
            .map(str::to_owned)
            .collect()
    };
    let report = v["report"].as_str().unwrap();
    assert!(report.starts_with("sandbox layers"), "{v}");
    assert_eq!(stable(report), stable(&text(&cli.stdout)), "{v}");
    assert_eq!(v["available"], true, "{v}");
    assert_eq!(v["ok"], cli.status.success(), "{v}");
    for problem in v["problems"].as_array().unwrap() {
        let problem = problem.as_str().unwrap();
        assert!(
            report.lines().any(|l| l.trim() == problem),
            "{problem} in {v}"
        );
    }
    let (status, refused) = json_of(get(&narrow).await.unwrap()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    served.stop();
}

fn verify_via(base: &str, key: Option<&str>, report: &Path) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sessionbox"));
    cmd.args([
        "verify",
        "--via",
        base,
        "--conversations",
        "6",
        "--rounds",
        "3",
    ])
    .arg("--report-json")
    .arg(report)
    .env_remove("SESSIONBOX_API_KEY")
    .env_remove("SESSIONBOX_TENANT")
    .stdin(Stdio::null());
    if let Some(k) = key {
        cmd.env("SESSIONBOX_API_KEY", k);
    }
    cmd.output().expect("run sessionbox verify --via")
}

#[test]
fn verify_via_http_passes_on_the_isolated_runtime_with_a_key_and_fails_without() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    let key = create_key(&data, "acme");
    let served = Served::start(&data);

    // The isolation experiment through the API: resume, isolation, 6 x 3 concurrency, cleanup.
    let report = d.path().join("verify.json");
    let out = verify_via(&served.base, Some(&key), &report);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["ok"], true, "{r:#}");
    assert_eq!(r["runtime"], "isolated", "{r:#}");
    assert_eq!(r["via"], served.base.as_str());
    assert_eq!(r["checks"]["concurrency"]["rounds_verified"], 18);
    assert_eq!(r["checks"]["cleanup"]["leftovers"], 0);
    // The key never reaches the report or the output.
    assert!(!std::fs::read_to_string(&report).unwrap().contains(&key));
    assert!(!text(&out.stdout).contains(&key) && !text(&out.stderr).contains(&key));
    // Nothing of the run is left on the server: no records of tenant acme.
    let list = sessionbox(&data, &["conversations", "--all-tenants"]);
    assert_eq!(
        text(&list.stdout).lines().count(),
        1,
        "{}",
        text(&list.stdout)
    );

    // Without the key the server refuses, and verify says so (exit 1, no panic).
    let out = verify_via(&served.base, None, &d.path().join("nokey.json"));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("unauthorized"),
        "{}",
        text(&out.stderr)
    );
    served.stop();
}

#[test]
fn verify_via_rejects_a_bad_url_before_any_request() {
    for url in [
        "ftp://127.0.0.1:1",
        "http://user:pw@127.0.0.1:1",
        "nonsense",
    ] {
        let out = verify_via(url, None, Path::new("/nonexistent/never-written.json"));
        assert_eq!(out.status.code(), Some(2), "{url}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("must be http"),
            "{url}: {}",
            text(&out.stderr)
        );
    }
}

/// schemathesis (PyPI, installed by scripts/test) generates requests from `/v1/openapi.json`
/// for every operation, valid and invalid, against a real server on the isolated runtime, and
/// checks that no answer is a 5xx and every answer matches the document (status, content type,
/// body schema). The key reaches it through the environment, never argv.
#[test]
fn schemathesis_finds_no_5xx_and_no_answer_off_the_schema() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    let key = create_key(&data, "fuzz");
    let served = Served::start(&data);
    let config = d.path().join("schemathesis.toml");
    std::fs::write(
        &config,
        "headers = { Authorization = \"Bearer ${SESSIONBOX_FUZZ_KEY}\" }\n",
    )
    .unwrap();
    let out = Command::new("schemathesis")
        .arg("--config-file")
        .arg(&config)
        .args(["run", &format!("{}/v1/openapi.json", served.base)])
        .args([
            "--checks",
            "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance",
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            "10",
            "--workers",
            "1",
            "--seed",
            "20261129",
            // A preview answers whatever the program on the port answers (any status, any
            // body): there is no schema to conform to. The link route is fuzzed.
            "--exclude-operation-id",
            "preview",
            "--exclude-operation-id",
            "preview_by_link",
        ])
        .env("SESSIONBOX_FUZZ_KEY", &key)
        .env("SCHEMATHESIS_HOOKS", "")
        .current_dir(d.path())
        .stdin(Stdio::null())
        .output()
        .expect("schemathesis runs (scripts/test installs it)");
    let report = text(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{report}\n{}",
        text(&out.stderr)
    );
    // It really exercised the API: many cases, all passed, and the key was accepted (the
    // conversations it made are in the audit log as the fuzz tenant's).
    // Its summary line reads "N generated, N passed" (other counts are named when present).
    let generated = report
        .lines()
        .map(str::trim)
        .find(|l| l.contains(" generated, "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0);
    assert!(generated >= 300, "too few cases:\n{report}");
    // Stopped gracefully, the server has written all its audit records.
    served.stop();
    let audit = sessionbox(
        &data,
        &["--tenant", "fuzz", "audit", "--json", "--limit", "100000"],
    );
    let entries: Value = serde_json::from_slice(&audit.stdout).unwrap();
    let entries = entries.as_array().unwrap();
    // The key was accepted (calls answered ok for the fuzz tenant) and conversations were
    // really opened by the generated requests.
    let ok = |op: &str| {
        entries
            .iter()
            .filter(|e| e["operation"] == op && e["outcome"] == "ok")
            .count()
    };
    let http_ok = entries
        .iter()
        .filter(|e| {
            e["operation"]
                .as_str()
                .is_some_and(|o| o.starts_with("http."))
                && e["outcome"] == "ok"
        })
        .count();
    assert!(
        http_ok > 0 && ok("open") > 0,
        "no call got through among {} records",
        entries.len()
    );
}

/// The text of one output field: `base64` decoded when present (it must be, exactly when the
/// bytes are not UTF-8), else `text`.
fn field_bytes(v: &Value, text_key: &str, b64_key: &str, utf8: bool, what: &str) -> Vec<u8> {
    match v.get(b64_key) {
        Some(b) => {
            assert!(!utf8, "{what}: valid UTF-8 came with {b64_key}: {v}");
            exact::base64_decode(b.as_str().unwrap())
        }
        None => {
            let t = v[text_key]
                .as_str()
                .unwrap_or_else(|| panic!("{what}: {v}"));
            t.as_bytes().to_vec()
        }
    }
}

/// Issue 15 on every runtime, through `sessionbox serve`: REST JSON gives text when the bytes
/// are UTF-8 (no base64 field) and `stdout_base64`/`stderr_base64` holding them exactly
/// otherwise; the SSE `stdout`/`stderr` chunks concatenated (base64 where present, else text)
/// are the bytes, a character split across writes included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_json_and_sse_carry_the_exact_bytes_on_every_runtime() {
    for rt in exact::runtimes("serve") {
        let key = create_key(&rt.data, "default");
        let served = Served::start(&rt.data);
        let base = served.base.clone();
        let client = Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let exec = |cmd: &str, sse: bool| {
            let mut r = client
                .post(format!("{base}/v1/conversations/exact/exec"))
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .body(json!({ "command": cmd }).to_string());
            if sse {
                r = r.header("accept", "text/event-stream");
            }
            r.send()
        };
        for case in exact::cases(65536) {
            let what = format!("{} {}", rt.name, case.name);
            let (st, v) = json_of(exec(&case.command, false).await.unwrap()).await;
            assert_eq!(
                (st, &v["exit_code"]),
                (StatusCode::OK, &json!(0)),
                "{what}: {v}"
            );
            let want = match &case.stdout {
                exact::Expect::Bytes(b) => b.clone(),
                exact::Expect::File(f) => {
                    let r = client
                        .get(format!("{base}/v1/conversations/exact/files/{f}"))
                        .bearer_auth(&key)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), StatusCode::OK, "{what}");
                    r.bytes().await.unwrap().to_vec()
                }
            };
            let got = field_bytes(&v, "stdout", "stdout_base64", case.utf8, &what);
            exact::assert_same(&format!("{what} json stdout"), &got, &want);
            let stderr_utf8 = std::str::from_utf8(case.stderr).is_ok();
            let got = field_bytes(&v, "stderr", "stderr_base64", stderr_utf8, &what);
            exact::assert_same(&format!("{what} json stderr"), &got, case.stderr);

            // SSE: the same command again (it writes the same file; compare with the new one).
            let r = exec(&case.command, true).await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{what}");
            let body = r.text().await.unwrap();
            let (mut out, mut err, mut exit) = (Vec::new(), Vec::new(), None);
            for event in body.split("\n\n") {
                let mut name = "";
                let mut data = String::new();
                for line in event.lines() {
                    if let Some(n) = line.strip_prefix("event:") {
                        name = n.trim();
                    } else if let Some(d) = line.strip_prefix("data:") {
                        data.push_str(d.strip_prefix(' ').unwrap_or(d));
                    }
                }
                match name {
                    "stdout" | "stderr" => {
                        let chunk: Value = serde_json::from_str(&data).unwrap();
                        let valid = chunk.get("base64").is_none();
                        let bytes = field_bytes(&chunk, "text", "base64", valid, &what);
                        if chunk.get("base64").is_some() {
                            assert!(
                                std::str::from_utf8(&bytes).is_err(),
                                "{what}: base64 on UTF-8: {chunk}"
                            );
                        }
                        if name == "stdout" {
                            out.extend(bytes)
                        } else {
                            err.extend(bytes)
                        }
                    }
                    "exit" => exit = Some(serde_json::from_str::<Value>(&data).unwrap()),
                    "error" => panic!("{what}: {data}"),
                    _ => {}
                }
            }
            assert_eq!(
                exit.as_ref().map(|e| &e["exit_code"]),
                Some(&json!(0)),
                "{what}: {body}"
            );
            let want = match &case.stdout {
                exact::Expect::Bytes(b) => b.clone(),
                exact::Expect::File(f) => client
                    .get(format!("{base}/v1/conversations/exact/files/{f}"))
                    .bearer_auth(&key)
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap()
                    .to_vec(),
            };
            exact::assert_same(&format!("{what} sse stdout"), &out, &want);
            exact::assert_same(&format!("{what} sse stderr"), &err, case.stderr);
        }
        let r = client
            .delete(format!("{base}/v1/conversations/exact"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success(),
            "{}: destroy {}",
            rt.name,
            r.status()
        );
        served.stop();
    }
}

/// Issue 21 on every runtime, through `sessionbox serve`: a read, a listing, a stat, a glob
/// and a grep of a conversation answer while a foreground command of it runs (4 s here; in
/// practice minutes), seeing what it wrote so far; a write sent meanwhile keeps its place
/// after the command (the command's last append comes before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_answer_beside_a_running_command_on_every_runtime() {
    for rt in exact::runtimes("overlap") {
        let key = create_key(&rt.data, "default");
        let served = Served::start(&rt.data);
        let base = format!("{}/v1/conversations/overlap", served.base);
        let client = Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let name = rt.name;
        let r = client
            .put(format!("{base}/files/notes.txt"))
            .bearer_auth(&key)
            .body("before\n")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT, "{name}");
        let started = std::time::Instant::now();
        let exec = client
            .post(format!("{base}/exec"))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(
                json!({"command": "echo progress > progress.txt; sleep 4; echo done >> notes.txt"})
                    .to_string(),
            )
            .send();
        let exec = tokio::spawn(async move {
            let (st, v) = json_of(exec.await.unwrap()).await;
            (st, v, started.elapsed())
        });
        let get = |path: String| {
            client
                .get(format!("{base}/{path}"))
                .bearer_auth(&key)
                .send()
        };
        // Once the command has written its progress (the file is read beside it)...
        let mut seen = false;
        while started.elapsed() < Duration::from_secs(30) && !seen {
            seen = get("files/progress.txt".into()).await.unwrap().status() == StatusCode::OK;
            if !seen {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        assert!(seen, "{name}: the progress file was never read");
        // ... every read answers while it still runs.
        let (st, v) = json_of(get("ls".into()).await.unwrap()).await;
        assert_eq!(st, StatusCode::OK, "{name}: {v}");
        assert!(v.to_string().contains("progress.txt"), "{name}: {v}");
        let (st, v) = json_of(get("stat?path=notes.txt".into()).await.unwrap()).await;
        assert_eq!(st, StatusCode::OK, "{name}: {v}");
        let (st, v) = json_of(get("glob?pattern=*.txt".into()).await.unwrap()).await;
        assert_eq!(st, StatusCode::OK, "{name}: {v}");
        let (st, v) = json_of(
            client
                .post(format!("{base}/grep"))
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .body(json!({"pattern": "progress"}).to_string())
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{name}: {v}");
        assert_eq!(v["matches"][0]["path"], "progress.txt", "{name}: {v}");
        let r = get("files/notes.txt".into()).await.unwrap();
        assert_eq!(r.text().await.unwrap(), "before\n", "{name}");
        let reads_done = started.elapsed();
        assert!(
            !exec.is_finished(),
            "{name}: the command ended before the reads did ({reads_done:?}): nothing proven"
        );
        // A write waits for the command.
        let r = client
            .put(format!("{base}/files/notes.txt"))
            .bearer_auth(&key)
            .body("replaced\n")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT, "{name}");
        let (st, v, ended) = exec.await.unwrap();
        assert_eq!(
            (st, &v["exit_code"]),
            (StatusCode::OK, &json!(0)),
            "{name}: {v}"
        );
        assert!(
            reads_done < ended,
            "{name}: reads done at {reads_done:?}, the command ended at {ended:?}"
        );
        let r = get("files/notes.txt".into()).await.unwrap();
        assert_eq!(
            r.text().await.unwrap(),
            "replaced\n",
            "{name}: the write overtook the command"
        );
        let r = client.delete(&base).bearer_auth(&key).send().await.unwrap();
        assert!(r.status().is_success(), "{name}: destroy {}", r.status());
        served.stop();
    }
}

/// The static busybox `scripts/opensandbox-up` keeps (its sandbox image is made of it): the
/// web server the preview test starts in a sandbox, uploaded where the sandbox has none.
fn static_busybox() -> Option<Vec<u8>> {
    let state = std::env::var_os("OPENSANDBOX_STATE").map_or_else(
        || {
            let cache = std::env::var_os("XDG_CACHE_HOME").map_or_else(
                || Path::new(&std::env::var_os("HOME").unwrap_or_default()).join(".cache"),
                std::path::PathBuf::from,
            );
            cache.join("sessionbox/opensandbox")
        },
        std::path::PathBuf::from,
    );
    std::fs::read(state.join("busybox")).ok()
}

/// Issue 21, previews, through `sessionbox serve` on every runtime. A web server started by a
/// command in the sandbox (busybox httpd on 127.0.0.1:8000, CGI on) is reached through
/// `/v1/conversations/{id}/ports/8000/...` with the caller's key and through a signed link
/// with none. Attacks and limits:
/// - the program in the sandbox never sees the caller's key or the link's token (a CGI script
///   prints every header it was sent);
/// - another tenant's key, a tampered link and a link whose conversation was destroyed reach
///   nothing;
/// - a conversation's relays are capped (`--max-relays-per-conversation 3`): with 3 slow
///   requests in flight the 4th is refused 429 at once, and the next after them is served;
/// - a port nothing listens on is 502, a port out of range 400.
///
/// On `host` the runtime's own agent relays to the host's loopback; `aio`, which has no agent,
/// refuses both routes with 503 `runtime_unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_the_sandbox_is_previewed_through_serve_with_a_key_or_a_signed_link() {
    let busybox = static_busybox();
    for rt in exact::runtimes("preview") {
        let name = rt.name;
        let relays = name != "aio";
        // Inside a sandbox any port is free; on the host's own loopback, one that is now.
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let (port, closed) = if name == "host" {
            (free(), free())
        } else {
            (8000, 8001)
        };
        let key = create_key(&rt.data, "default");
        let stranger = create_key(&rt.data, "stranger");
        let served =
            Served::start_with(&rt.data, &[("SESSIONBOX_MAX_RELAYS_PER_CONVERSATION", "3")]);
        let base = format!("{}/v1/conversations/web", served.base);
        let client = Client::builder()
            .timeout(Duration::from_secs(60))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let put = async |path: &str, body: Vec<u8>| {
            let r = client
                .put(format!("{base}/files/{path}"))
                .bearer_auth(&key)
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::NO_CONTENT, "{name}: put {path}");
        };
        let marker = format!("preview of {name} {}", std::process::id());
        put("site/index.html", marker.clone().into_bytes()).await;
        put(
            "site/cgi-bin/env",
            b"#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n'\nenv\n".to_vec(),
        )
        .await;
        put(
            "site/cgi-bin/cookie",
            b"#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\nSet-Cookie: stolen=1; Path=/\\r\\nClear-Site-Data: \"cookies\"\\r\\n\\r\\nset\\n'\n".to_vec(),
        )
        .await;
        put(
            "site/cgi-bin/slow",
            b"#!/bin/sh\nsleep 3\nprintf 'Content-Type: text/plain\\r\\n\\r\\nslow\\n'\n".to_vec(),
        )
        .await;
        if !relays {
            let r = client
                .get(format!("{base}/ports/{port}/index.html"))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap();
            let (st, v) = json_of(r).await;
            assert_eq!(
                (st, v["code"].as_str()),
                (StatusCode::SERVICE_UNAVAILABLE, Some("runtime_unavailable")),
                "{name}: {v}"
            );
            let r = client
                .post(format!("{base}/previews"))
                .bearer_auth(&key)
                .json(&json!({"port": port}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "{name}");
            let r = client.delete(&base).bearer_auth(&key).send().await.unwrap();
            assert!(r.status().is_success(), "{name}: destroy {}", r.status());
            served.stop();
            continue;
        }
        let Some(busybox) = &busybox else {
            panic!("{name}: no static busybox (scripts/opensandbox-up keeps one)");
        };
        put(".bin/busybox", busybox.clone()).await;
        let r = client
            .post(format!("{base}/exec"))
            .bearer_auth(&key)
            .json(&json!({
                "command": format!("chmod +x .bin/busybox site/cgi-bin/*; \
                            exec ./.bin/busybox httpd -f -p 127.0.0.1:{port} -h site"),
                "background": true
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED, "{name}");

        // With the key: the page, once the server listens.
        let page = format!("{base}/ports/{port}/index.html");
        let started = std::time::Instant::now();
        let response = loop {
            let r = client.get(&page).bearer_auth(&key).send().await.unwrap();
            if r.status() == StatusCode::OK || started.elapsed() > Duration::from_secs(30) {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let status = response.status();
        if status != StatusCode::OK {
            panic!("{name}: {status}: {}", response.text().await.unwrap());
        }
        let csp = response
            .headers()
            .get("content-security-policy")
            .map(|v| v.to_str().unwrap().to_owned());
        assert!(
            csp.as_deref()
                .is_some_and(|c| c.starts_with("sandbox ") && !c.contains("allow-same-origin")),
            "{name}: a preview runs in an opaque origin: {csp:?}"
        );
        assert_eq!(response.text().await.unwrap(), marker, "{name}");
        // Without its slash the prefix redirects, so relative links resolve under it.
        let r = client
            .get(format!("{base}/ports/{port}"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT, "{name}");
        assert_eq!(
            r.headers()["location"],
            format!("/v1/conversations/web/ports/{port}/"),
            "{name}"
        );
        // The program sees the request, never the key.
        let env = client
            .get(format!("{base}/ports/{port}/cgi-bin/env?q=1"))
            .bearer_auth(&key)
            .header("x-custom", "passed")
            .header("cookie", "session=browser-state")
            .header("referer", "http://example.test/v1/previews/secret-token/")
            .header("x-forwarded-for", "203.0.113.9")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(env.contains("QUERY_STRING=q=1"), "{name}: {env}");
        assert!(env.contains("HTTP_X_CUSTOM=passed"), "{name}: {env}");
        assert!(
            !env.contains(&key),
            "{name}: the key reached the sandbox: {env}"
        );
        assert!(!env.contains("HTTP_AUTHORIZATION"), "{name}: {env}");
        // Nor the browser's cookies and referrer (shared by every preview on the API's
        // origin; a link's referrer holds its token), nor an address a client may forge.
        for withheld in ["browser-state", "secret-token", "203.0.113.9"] {
            assert!(
                !env.contains(withheld),
                "{name}: {withheld} reached the sandbox: {env}"
            );
        }
        // And a page cannot set state on the API's origin.
        let r = client
            .get(format!("{base}/ports/{port}/cgi-bin/cookie"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{name}");
        assert!(r.headers().get("set-cookie").is_none(), "{name}");
        assert!(r.headers().get("clear-site-data").is_none(), "{name}");
        assert_eq!(r.headers()["referrer-policy"], "no-referrer", "{name}");
        assert!(
            env.contains(&format!(
                "HTTP_X_FORWARDED_PREFIX=/v1/conversations/web/ports/{port}"
            )),
            "{name}: {env}"
        );
        // Another tenant's key reaches nothing: its conversation "web" does not exist.
        let r = client
            .get(&page)
            .bearer_auth(&stranger)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{name}");
        // Ports nothing listens on, and ports that are not ports.
        let r = client
            .get(format!("{base}/ports/{closed}/"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY, "{name}");
        // 44772 is the sandbox's agent itself, whose API runs commands: never a preview.
        for bad in ["0", "65536", "http", "44772"] {
            let r = client
                .get(format!("{base}/ports/{bad}/"))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{name}: port {bad}");
        }

        // A signed link: no key needed, the token never reaches the program.
        let (st, link) = json_of(
            client
                .post(format!("{base}/previews"))
                .bearer_auth(&key)
                .json(&json!({"port": port, "ttl_secs": 600}))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{name}: {link}");
        let path = link["path"].as_str().unwrap().to_owned();
        assert!(
            path.starts_with("/v1/previews/") && path.ends_with('/'),
            "{path}"
        );
        let token = path
            .trim_start_matches("/v1/previews/")
            .trim_end_matches('/');
        let r = client
            .get(format!("{}{path}index.html", served.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{name}");
        assert_eq!(r.text().await.unwrap(), marker, "{name}");
        let env = client
            .get(format!("{}{path}cgi-bin/env", served.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(env.contains("REQUEST_METHOD=GET"), "{name}: {env}");
        assert!(
            !env.contains(token),
            "{name}: the link's token reached the sandbox"
        );
        // A link works only while the key that made it does: made by a key that expires in
        // 90 s, it expires with it (not in the 600 s asked for), and once that key is revoked
        // it reaches nothing.
        let out = sessionbox(
            &rt.data,
            &[
                "--tenant",
                "default",
                "keys",
                "create",
                "--conversation",
                "web",
                "--expires-in",
                "90s",
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        let brief = text(&out.stdout).trim().to_owned();
        let (st, short) = json_of(
            client
                .post(format!("{base}/previews"))
                .bearer_auth(&brief)
                .json(&json!({"port": port, "ttl_secs": 600}))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{name}: {short}");
        let until: chrono::DateTime<chrono::Utc> =
            short["expires_at"].as_str().unwrap().parse().unwrap();
        assert!(
            until <= chrono::Utc::now() + chrono::Duration::seconds(91),
            "{name}: the link outlives its key: {short}"
        );
        let short_path = short["path"].as_str().unwrap().to_owned();
        let r = client
            .get(format!("{}{short_path}index.html", served.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{name}");
        let listed = sessionbox(&rt.data, &["keys", "list", "--json"]);
        let keys: Value = serde_json::from_slice(&listed.stdout).unwrap();
        let id = keys
            .as_array()
            .unwrap()
            .iter()
            .find(|k| brief.contains(k["id"].as_str().unwrap()))
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            sessionbox(&rt.data, &["keys", "revoke", &id])
                .status
                .success()
        );
        let r = client
            .get(format!("{}{short_path}index.html", served.base))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::UNAUTHORIZED,
            "{name}: revoked key's link"
        );

        // A tampered link, and a link the stranger asks for this conversation, reach nothing.
        let mut forged = token.to_owned();
        let last = forged.pop().unwrap();
        forged.push(if last == 'A' { 'B' } else { 'A' });
        let r = client
            .get(format!("{}/v1/previews/{forged}/index.html", served.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{name}");
        let r = client
            .post(format!("{base}/previews"))
            .bearer_auth(&stranger)
            .json(&json!({"port": port}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{name}");
        let r = client
            .post(format!("{base}/previews"))
            .bearer_auth(&key)
            .json(&json!({"port": port, "ttl_secs": 100_000}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{name}");

        // The relay cap: three slow requests hold the conversation's three slots; a fourth is
        // refused at once; once they end, the next is served.
        let slow = format!("{base}/ports/{port}/cgi-bin/slow");
        let mut held = Vec::new();
        for _ in 0..3 {
            let request = client.get(&slow).bearer_auth(&key).send();
            held.push(tokio::spawn(async move {
                let r = request.await.unwrap();
                (r.status(), r.text().await.unwrap())
            }));
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let refused_at = std::time::Instant::now();
        let (st, v) = json_of(client.get(&page).bearer_auth(&key).send().await.unwrap()).await;
        assert_eq!(
            (st, v["code"].as_str()),
            (StatusCode::TOO_MANY_REQUESTS, Some("busy")),
            "{name}: {v}"
        );
        assert!(
            refused_at.elapsed() < Duration::from_secs(1),
            "{name}: not refused at once"
        );
        for h in held {
            let (st, body) = h.await.unwrap();
            assert_eq!((st, body.as_str()), (StatusCode::OK, "slow\n"), "{name}");
        }
        let r = client.get(&page).bearer_auth(&key).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{name}: the slots came back");

        // Destroyed, the conversation's link reaches nothing; nor once a conversation is made
        // again under its id, serving the same port.
        let r = client.delete(&base).bearer_auth(&key).send().await.unwrap();
        assert!(r.status().is_success(), "{name}: destroy {}", r.status());
        let r = client
            .get(format!("{}{path}index.html", served.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{name}");
        put("site/index.html", b"the new one".to_vec()).await;
        put(".bin/busybox", busybox.clone()).await;
        let r = client
            .post(format!("{base}/exec"))
            .bearer_auth(&key)
            .json(&json!({
                "command": format!("chmod +x .bin/busybox; exec ./.bin/busybox httpd -f -p 127.0.0.1:{port} -h site"),
                "background": true
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED, "{name}");
        let started = std::time::Instant::now();
        loop {
            let r = client.get(&page).bearer_auth(&key).send().await.unwrap();
            if r.status() == StatusCode::OK || started.elapsed() > Duration::from_secs(30) {
                assert_eq!(r.text().await.unwrap(), "the new one", "{name}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let r = client
            .get(format!("{}{path}index.html", served.base))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::NOT_FOUND,
            "{name}: an old link reached the conversation made again under its id"
        );
        let r = client.delete(&base).bearer_auth(&key).send().await.unwrap();
        assert!(r.status().is_success(), "{name}: destroy {}", r.status());
        served.stop();
    }
}

/// Open file descriptors of process `pid`.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// A data directory whose conversations run on the `host` runtime (what these tests attack is
/// the server, not a sandbox).
fn host_data(dir: &Path) -> std::path::PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("sessionbox.toml"), "runtime = \"host\"\n").unwrap();
    data
}

/// The attack (found by issue 19's review): open connections that send half a request head
/// and never the rest, until `serve` runs out of file descriptors and every other client (and
/// its own garbage collection) fails. Now one source holds at most
/// `--max-connections-per-source` (20 here) connections, the rest are closed as soon as they are
/// accepted, a head that does not arrive within `--header-read-timeout-secs` (6 here) ends its
/// connection, and another source is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_request_heads_cannot_take_every_connection_of_serve() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let d = tempfile::tempdir().unwrap();
    let data = host_data(d.path());
    let served = Served::start_with(
        &data,
        &[
            ("SESSIONBOX_MAX_CONNECTIONS_PER_SOURCE", "20"),
            // Long enough that the kept ones are still open when counted on a loaded machine.
            ("SESSIONBOX_HEADER_READ_TIMEOUT_SECS", "6"),
        ],
    );
    let pid = served.child.id();
    let addr = served.base.trim_start_matches("http://").to_owned();
    let fds_before = open_fds(pid);
    // 200 connections from 127.0.0.1, each with half a head.
    let mut held = Vec::new();
    for _ in 0..200 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await;
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Those past the cap were closed at once: a read ends (EOF or reset) without waiting.
    let mut closed = 0;
    let mut open = Vec::new();
    for mut s in held {
        let mut b = [0u8; 64];
        match tokio::time::timeout(Duration::from_millis(50), s.read(&mut b)).await {
            Ok(Ok(0) | Err(_)) => closed += 1,
            Ok(Ok(_)) => panic!("a half-sent head got an answer"),
            Err(_) => open.push(s),
        }
    }
    assert_eq!(
        open.len(),
        20,
        "one source keeps exactly its cap ({closed} closed)"
    );
    let fds_during = open_fds(pid);
    assert!(
        fds_during < fds_before + 40,
        "serve holds {fds_during} descriptors during the attack ({fds_before} before)"
    );
    // Another source is served meanwhile.
    let other = Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let r = other
        .get(format!("{}/healthz", served.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // The held ones end when their head's time is up.
    let started = std::time::Instant::now();
    for mut s in open {
        let mut b = [0u8; 256];
        let ended = tokio::time::timeout(Duration::from_secs(12), s.read(&mut b)).await;
        assert!(
            matches!(ended, Ok(Ok(_) | Err(_))),
            "a half-sent head outlived the header timeout"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(12));
    // And the attacking source is served again once it behaves.
    let r = Client::new()
        .get(format!("{}/healthz", served.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    served.stop();
}

/// The attack (found by issue 19's review): many requests for a large file whose responses are
/// never read, so `serve` holds each whole file in memory for as long as the client waits (30
/// readers of a 64 MiB file made it hold 2 GB). Now a file being sent holds its bytes in the
/// tenant's output budget (`SESSIONBOX_MAX_OUTPUT_BYTES_PER_TENANT`, 64 MiB here) until the
/// client has taken them: with four 16 MiB reads unread, the fifth is 429 `busy`; another
/// tenant still reads; once one reader drains its body, a read is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_cannot_make_serve_hold_files_without_bound() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let d = tempfile::tempdir().unwrap();
    let data = host_data(d.path());
    let key = create_key(&data, "default");
    let other_key = create_key(&data, "other");
    let served = Served::start_with(
        &data,
        &[("SESSIONBOX_MAX_OUTPUT_BYTES_PER_TENANT", "67108864")],
    );
    let addr = served.base.trim_start_matches("http://").to_owned();
    let client = Client::new();
    let big: Vec<u8> = (0..16 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    for k in [&key, &other_key] {
        let r = client
            .put(format!(
                "{}/v1/conversations/big/files/big.bin",
                served.base
            ))
            .bearer_auth(k)
            .body(big.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
    // A reader that sends its request and reads only the status line.
    let slow = async |k: &str| {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "GET /v1/conversations/big/files/big.bin HTTP/1.1\r\nHost: x\r\n\
             Authorization: Bearer {k}\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let mut b = [0u8; 12];
        s.read_exact(&mut b).await.unwrap();
        (String::from_utf8_lossy(&b[9..12]).into_owned(), s)
    };
    let mut readers = Vec::new();
    for i in 0..4 {
        let (status, s) = slow(&key).await;
        assert_eq!(status, "200", "reader {i} fits the budget");
        readers.push(s);
    }
    let (status, _refused) = slow(&key).await;
    assert_eq!(
        status, "429",
        "a fifth 16 MiB body is past the tenant's 64 MiB"
    );
    // Another tenant's budget is its own.
    let r = client
        .get(format!(
            "{}/v1/conversations/big/files/big.bin",
            served.base
        ))
        .bearer_auth(&other_key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.bytes().await.unwrap().len(), big.len());
    // One reader drains its body: its bytes leave the budget, and a read fits again.
    let mut first = readers.remove(0);
    let mut sink = vec![0u8; 1 << 20];
    let mut got = 0usize;
    while got < big.len() {
        let n = first.read(&mut sink).await.unwrap();
        assert!(n > 0, "the body ended early");
        got += n;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, _) = slow(&key).await;
    assert_eq!(status, "200", "the drained body gave its bytes back");
    drop(readers);
    served.stop();
}

/// The attacks (from a review of the output budget): answers that the server builds and then
/// holds for a client that does not read them, counted only until they were built. Now an
/// exec's JSON answer keeps its output reserved until the client has taken it: with a 64 MiB
/// budget, two unread 16 MiB-output execs (32 MiB reserved each) leave no room for a third. A
/// range of a file is counted as the whole file the server reads for it, before the read, and
/// given back once its bytes are sent: four one-byte ranges of a 16 MiB file, then a fifth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_exec_answers_and_ranges_stay_in_the_budget() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let d = tempfile::tempdir().unwrap();
    let data = host_data(d.path());
    let key = create_key(&data, "default");
    let served = Served::start_with(
        &data,
        &[("SESSIONBOX_MAX_OUTPUT_BYTES_PER_TENANT", "67108864")],
    );
    let addr = served.base.trim_start_matches("http://").to_owned();
    // Sends `request` (a whole HTTP/1.1 request) and reads the status code only.
    let send = async |request: String| {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut b = [0u8; 12];
        s.read_exact(&mut b).await.unwrap();
        (String::from_utf8_lossy(&b[9..12]).into_owned(), s)
    };
    let exec = || {
        let body = json!({
            "command": "head -c 16000000 /dev/zero | tr '\\0' x",
            "output_limit": 16_777_216
        })
        .to_string();
        format!(
            "POST /v1/conversations/big/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let (first, _a) = send(exec()).await;
    let (second, _b) = send(exec()).await;
    assert_eq!((first.as_str(), second.as_str()), ("200", "200"));
    let (third, _c) = send(exec()).await;
    assert_eq!(third, "429", "the unread answers' output left the budget");
    drop((_a, _b));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let big: Vec<u8> = vec![7u8; 16 * 1024 * 1024];
    let r = Client::new()
        .put(format!(
            "{}/v1/conversations/big/files/big.bin",
            served.base
        ))
        .bearer_auth(&key)
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let range = || {
        format!(
            "GET /v1/conversations/big/files/big.bin HTTP/1.1\r\nHost: x\r\n\
             Authorization: Bearer {key}\r\nRange: bytes=0-0\r\n\r\n"
        )
    };
    let mut held = Vec::new();
    for i in 0..4 {
        let (status, s) = send(range()).await;
        assert_eq!(status, "206", "range {i}");
        held.push(s);
    }
    // A one-byte answer is sent at once; the whole file read for it stays counted until then,
    // so the ranges above already gave their places back.
    let (fifth, _e) = send(range()).await;
    assert_eq!(fifth, "206");
    drop(held);
    served.stop();
}
