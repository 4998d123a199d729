//! Issue 22, snapshots, fork and templates, end to end on every runtime (`host`, `isolated`,
//! `aio` against the AIO test server, `opensandbox` against the real OpenSandbox server):
//! through the CLI (`snapshot take/restore/export/import/rm`, `fork`, `template`) and through
//! `serve`'s REST routes. A fork sees its origin as of the snapshot (or as it is, for a live
//! fork) and never a later write of either; links and modes survive; an export imports; a
//! template starts new conversations; deleting everything leaves nothing in `snapshots/`.

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sessionbox_test_support::{serve_command, spawn_serve};

use crate::exact::{self, RuntimeUnderTest};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs the CLI, which must succeed: its stdout.
fn ok(rt: &RuntimeUnderTest, args: &[&str]) -> String {
    let out = rt.run(args, b"");
    assert!(
        out.status.success(),
        "{}: sessionbox {args:?}: {}{}",
        rt.name,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Runs a shell command in a conversation: its stdout.
fn sh(rt: &RuntimeUnderTest, conv: &str, command: &str) -> String {
    ok(rt, &["exec", "-c", conv, "--", command])
}

fn leftover_archives(data: &Path) -> Vec<String> {
    std::fs::read_dir(data.join("snapshots"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_cli_snapshots_forks_restores_and_templates_on_every_runtime() {
    for rt in exact::runtimes("snapshots") {
        let name = rt.name;
        sh(
            &rt,
            "origin",
            "mkdir -p d/deep && printf 'as snapshotted\\n' > d/f && chmod 700 d/f \
             && printf '\\000\\377' > d/deep/bin && ln -s /etc/hostname d/link",
        );
        let took = ok(&rt, &["snapshot", "take", "-c", "origin", "s1"]);
        assert!(
            took.contains("s1") && took.contains("2 file(s)"),
            "{name}: {took}"
        );
        sh(&rt, "origin", "echo later > d/f && rm d/deep/bin");

        ok(&rt, &["fork", "--snapshot", "s1", "--to", "from-s1"]);
        ok(&rt, &["fork", "-c", "origin", "--to", "live"]);
        assert_eq!(rt.read("from-s1", "d/f"), b"as snapshotted\n", "{name}");
        assert_eq!(rt.read("from-s1", "d/deep/bin"), b"\x00\xff", "{name}");
        assert_eq!(rt.read("live", "d/f"), b"later\n", "{name}");
        // The link is a link (never followed into the archive) and the mode is kept.
        assert_eq!(
            sh(&rt, "from-s1", "readlink d/link; stat -c %a d/f"),
            "/etc/hostname\n700\n",
            "{name}"
        );
        // After the fork, no write crosses.
        sh(&rt, "from-s1", "echo fork > d/f");
        sh(&rt, "origin", "echo origin > d/f");
        assert_eq!(rt.read("live", "d/f"), b"later\n", "{name}");
        assert_eq!(rt.read("origin", "d/f"), b"origin\n", "{name}");
        assert_eq!(rt.read("from-s1", "d/f"), b"fork\n", "{name}");
        // Into an existing conversation: refused with its own exit code, left alone.
        let out = rt.run(&["fork", "--snapshot", "s1", "--to", "live"], b"");
        assert!(!out.status.success(), "{name}");
        assert!(
            text(&out.stderr).contains("exists"),
            "{name}: {}",
            text(&out.stderr)
        );
        assert_eq!(rt.read("live", "d/f"), b"later\n", "{name}");

        // Restore puts the snapshot back, removing what came after.
        sh(&rt, "origin", "echo extra > extra.txt");
        ok(&rt, &["snapshot", "restore", "-c", "origin", "s1"]);
        assert_eq!(rt.read("origin", "d/f"), b"as snapshotted\n", "{name}");
        assert_eq!(
            sh(&rt, "origin", "ls extra.txt 2>/dev/null || echo gone"),
            "gone\n",
            "{name}"
        );

        // Export, then import as another snapshot, then start from it as a template.
        let exported = rt.data.join("s1.tar.zst");
        ok(
            &rt,
            &["snapshot", "export", "s1", exported.to_str().unwrap()],
        );
        // It holds the conversation's files: readable by its owner only.
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(
                &std::fs::metadata(&exported).unwrap().permissions()
            ) & 0o777,
            0o600,
            "{name}: the exported archive's mode"
        );
        ok(
            &rt,
            &["snapshot", "import", "s2", exported.to_str().unwrap()],
        );
        ok(&rt, &["template", "set", "default", "s2"]);
        // The first use of an id makes the conversation, from the template.
        assert_eq!(
            sh(&rt, "templated", "cat d/f"),
            "as snapshotted\n",
            "{name}"
        );
        let out = rt.run(&["snapshot", "rm", "s2"], b"");
        assert!(
            !out.status.success(),
            "{name}: a template pins its snapshot"
        );
        ok(&rt, &["template", "rm", "default"]);
        let listed = ok(&rt, &["snapshot", "list", "--json"]);
        let v: Value = serde_json::from_str(&listed).unwrap();
        let names: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["s1", "s2"], "{name}");
        assert_eq!(v[0]["runtime"], name, "{name}");
        assert_eq!(v[1]["runtime"], "import", "{name}");

        for c in ["origin", "from-s1", "live", "templated"] {
            rt.destroy(c);
        }
        ok(&rt, &["snapshot", "rm", "s1"]);
        ok(&rt, &["snapshot", "rm", "s2"]);
        assert!(
            leftover_archives(&rt.data).is_empty(),
            "{name}: {:?}",
            leftover_archives(&rt.data)
        );
        eprintln!("{name}: snapshot, fork, restore, export, import and template: ok");
    }
}

struct Served(Child, String);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn json_of(r: reqwest::Response) -> (StatusCode, Value) {
    let st = r.status();
    let b = r.bytes().await.unwrap();
    (st, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_routes_snapshot_fork_export_and_import_on_every_runtime() {
    for rt in exact::runtimes("snapshots-rest") {
        let name = rt.name;
        let out = rt.run(
            &["--tenant", "default", "keys", "create", "--label", "snap"],
            b"",
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        let key = text(&out.stdout).trim().to_owned();
        let (child, base) = spawn_serve(&mut serve_command(
            env!("CARGO_BIN_EXE_sessionbox"),
            &rt.data,
            &[],
        ));
        let served = Served(child, base);
        let base = served.1.clone();
        let c = reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .unwrap();
        let conv = format!("{base}/v1/conversations");
        let post = |url: String, body: Value| c.post(url).bearer_auth(&key).json(&body).send();

        let (st, v) = json_of(
            post(
                format!("{conv}/rest-origin/exec"),
                json!({"command": "mkdir -p d && echo one > d/f"}),
            )
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{name}: {v}");
        let (st, v) = json_of(
            post(
                format!("{conv}/rest-origin/snapshots"),
                json!({"name": "r1", "keep_seconds": 3600}),
            )
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{name}: {v}");
        assert_eq!(
            (v["name"].as_str(), v["files"].as_u64()),
            (Some("r1"), Some(1))
        );
        assert_eq!(v["origin"], "rest-origin", "{name}");
        // Taken again: 409, typed.
        let (st, v) = json_of(
            post(
                format!("{conv}/rest-origin/snapshots"),
                json!({"name": "r1"}),
            )
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(
            (st, v["code"].as_str()),
            (StatusCode::CONFLICT, Some("already_exists")),
            "{name}: {v}"
        );
        // Malformed: 400/422 and nothing made.
        let (st, _) = json_of(
            post(
                format!("{conv}/rest-origin/snapshots"),
                json!({"name": "../x"}),
            )
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{name}");
        let (st, _) = json_of(
            post(format!("{conv}/rest-origin/snapshots"), json!({"nom": "x"}))
                .await
                .unwrap(),
        )
        .await;
        assert!(st.is_client_error(), "{name}: {st}");

        // Fork the snapshot and the live conversation.
        let (st, v) = json_of(
            post(
                format!("{base}/v1/snapshots/r1/fork"),
                json!({"to": "rest-fork"}),
            )
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{name}: {v}");
        let (st, v) = json_of(
            post(
                format!("{conv}/rest-origin/fork"),
                json!({"to": "rest-live"}),
            )
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{name}: {v}");
        let read = |id: &str| {
            c.get(format!("{conv}/{id}/files/d/f"))
                .bearer_auth(&key)
                .send()
        };
        let body = read("rest-fork").await.unwrap().bytes().await.unwrap();
        assert_eq!(&body[..], b"one\n", "{name}");

        // Export, then import under another name: the same files.
        let r = c
            .get(format!("{base}/v1/snapshots/r1/archive"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{name}");
        assert_eq!(r.headers()["content-type"], "application/zstd");
        let archive = r.bytes().await.unwrap();
        assert_eq!(
            &archive[..4],
            &[0x28, 0xb5, 0x2f, 0xfd],
            "{name}: a zstd frame"
        );
        let (st, v) = json_of(
            c.put(format!("{base}/v1/snapshots/r2/archive?keep_seconds=60"))
                .bearer_auth(&key)
                .body(archive.clone())
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{name}: {v}");
        assert_eq!(v["runtime"], "import");
        // A hostile import: 400, nothing kept.
        let (st, v) = json_of(
            c.put(format!("{base}/v1/snapshots/r3/archive"))
                .bearer_auth(&key)
                .body(vec![0x41u8; 4096])
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            (st, v["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_request")),
            "{name}: {v}"
        );
        let (st, v) = json_of(
            c.get(format!("{base}/v1/snapshots"))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        let names: Vec<&str> = v["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["r1", "r2"], "{name}");

        // A template over REST starts a conversation.
        let r = c
            .put(format!("{base}/v1/templates/base"))
            .bearer_auth(&key)
            .json(&json!({"snapshot": "r2"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{name}");
        let (st, v) = json_of(
            post(
                format!("{base}/v1/templates/base/fork"),
                json!({"to": "rest-templated"}),
            )
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{name}: {v}");
        let body = read("rest-templated").await.unwrap().bytes().await.unwrap();
        assert_eq!(&body[..], b"one\n", "{name}");
        let r = c
            .delete(format!("{base}/v1/templates/base"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);

        // Restore over REST.
        post(
            format!("{conv}/rest-origin/exec"),
            json!({"command": "echo two > d/f"}),
        )
        .await
        .unwrap();
        let (st, v) = json_of(
            post(
                format!("{conv}/rest-origin/restore"),
                json!({"snapshot": "r1"}),
            )
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{name}: {v}");
        let body = read("rest-origin").await.unwrap().bytes().await.unwrap();
        assert_eq!(&body[..], b"one\n", "{name}");

        for id in ["rest-origin", "rest-fork", "rest-live", "rest-templated"] {
            let r = c
                .delete(format!("{conv}/{id}"))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::NO_CONTENT, "{name}");
        }
        for s in ["r1", "r2"] {
            let r = c
                .delete(format!("{base}/v1/snapshots/{s}"))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::NO_CONTENT, "{name}");
        }
        drop(served);
        assert!(
            leftover_archives(&rt.data).is_empty(),
            "{name}: {:?}",
            leftover_archives(&rt.data)
        );
        eprintln!("{name}: REST snapshot, fork, export, import, template, restore: ok");
    }
}

/// A conversation made on a runtime other than the default: `snapshot take`, `snapshot
/// restore` and `fork -c` find its runtime in its record, as every other command on one does.
#[test]
fn snapshot_commands_follow_the_conversations_recorded_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sessionbox"))
            .arg("--data-dir")
            .arg(&data)
            .args(args)
            .env_remove("SESSIONBOX_RUNTIME")
            .env_remove("SESSIONBOX_TENANT")
            .output()
            .unwrap()
    };
    let ok = |args: &[&str]| {
        let out = run(args);
        assert!(
            out.status.success(),
            "sessionbox {args:?}: {}",
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    ok(&["--runtime", "host", "exec", "-c", "h", "--", "echo one > f"]);
    ok(&["snapshot", "take", "-c", "h", "s"]);
    ok(&["--runtime", "host", "exec", "-c", "h", "--", "echo two > f"]);
    ok(&["snapshot", "restore", "-c", "h", "s"]);
    ok(&["fork", "-c", "h", "--to", "h2"]);
    assert_eq!(ok(&["read", "-c", "h2", "f"]), "one\n");
    let listed = ok(&["conversations", "--json"]);
    let v: Value = serde_json::from_str(&listed).unwrap();
    for c in v.as_array().unwrap() {
        assert_eq!(c["runtime"], "host", "{c}");
    }
    for c in ["h", "h2"] {
        ok(&["destroy", "-c", c]);
    }
    ok(&["snapshot", "rm", "s"]);
}
