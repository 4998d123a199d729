//! The disk fills during writes, through `serve`'s file API: on the `host` runtime (its
//! workspaces on a small tmpfs the test mounts) and on the `isolated` runtime (its workspace a
//! 16 MiB ext4 volume, the conversation's disk quota). An overwrite with larger content, a
//! multipart upload and an `edit` that grows a file are each refused with the typed 413
//! `too_large` saying the workspace is full; the old content is intact byte for byte; no
//! temporary file is left; once space is freed the same write succeeds. And the store's own
//! disk filling up while requests run: they fail with 503 `unavailable` (or 413 for a
//! workspace on the same disk), never 500, nothing half-made; the server keeps answering and
//! recovers when space is freed, without a restart.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::*;

/// Bytes no two writes share, so a mix of old and new would show.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Every name in `dir` and below (dot files too), as the host sees them.
fn names_below(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let path = e.path();
            if e.file_type().unwrap().is_dir() {
                todo.push(path.clone());
            }
            out.push(path.strip_prefix(dir).unwrap().display().to_string());
        }
    }
    out.sort();
    out
}

/// Asserts a 413 `too_large` answer that says the workspace is full and what to do.
fn full(st: StatusCode, v: &Value, what: &str) {
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{what}: {v}");
    assert_eq!(v["code"], "too_large", "{what}: {v}");
    let m = v["message"].as_str().unwrap_or_default();
    assert!(
        m.contains("full") && m.contains("delete files"),
        "{what}: {m}"
    );
}

/// The body of the workspace-full test, on a served conversation whose workspace is on a
/// small file system; `ws` is that workspace as the host sees it.
async fn workspace_full(s: &Served, id: &str, ws_of: impl Fn(&str) -> std::path::PathBuf) {
    let http = http();
    let old = pattern(1, 256 << 10);
    let put = |path: &str, body: Vec<u8>| {
        http.put(s.url(id, &format!("/files/{path}")))
            .body(body)
            .send()
    };
    let r = put("keep.bin", old.clone()).await.unwrap();
    assert!(r.status().is_success(), "{:?}", json_of(r).await);
    let r = put("edit.txt", b"short text to grow\n".to_vec())
        .await
        .unwrap();
    assert!(r.status().is_success());
    let ws = ws_of(id);
    let before = names_below(&ws);

    // Fill the rest of the workspace's file system from inside.
    let r = http
        .post(s.url(id, "/exec"))
        .json(&json!({"command": "for b in 1048576 65536 4096 512 1; do \
            head -c 100000000 /dev/zero | dd of=fill-$b bs=$b 2>/dev/null; done; \
            df -k . | tail -1", "timeout_ms": 120000}))
        .send()
        .await
        .unwrap();
    let (st, v) = json_of(r).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    say!("workspace filled: {}", v["stdout"]);

    // An overwrite with larger content: refused, the old content intact, no temporary file.
    let r = put("keep.bin", pattern(2, 512 << 10)).await.unwrap();
    let (st, v) = json_of(r).await;
    say!("overwrite on a full disk: {st} {v}");
    full(st, &v, "overwrite");
    let got = http.get(s.url(id, "/files/keep.bin")).send().await.unwrap();
    assert_eq!(got.status(), StatusCode::OK);
    assert!(got.bytes().await.unwrap() == old, "the old content changed");
    // A new small file too.
    let r = put("new.bin", pattern(3, 64 << 10)).await.unwrap();
    full(r.status(), &json_of(r).await.1, "new file");

    // A multipart upload: refused; what it wrote before stopping (nothing, here) is named.
    let form = reqwest::multipart::Form::new()
        .part(
            "file",
            reqwest::multipart::Part::bytes(pattern(4, 128 << 10)).file_name("up-a.bin"),
        )
        .part(
            "file",
            reqwest::multipart::Part::bytes(pattern(5, 128 << 10)).file_name("keep.bin"),
        );
    let r = http
        .post(s.url(id, "/files"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    let (st, v) = json_of(r).await;
    say!("upload on a full disk: {st} {v}");
    full(st, &v, "upload");

    // An edit that grows a file.
    let r = http
        .post(s.url(id, "/edit"))
        .json(&json!({"path": "edit.txt", "old": "short", "new": "x".repeat(200_000)}))
        .send()
        .await
        .unwrap();
    let (st, v) = json_of(r).await;
    say!("edit on a full disk: {st} {v}");
    full(st, &v, "edit");
    let got = http.get(s.url(id, "/files/edit.txt")).send().await.unwrap();
    assert_eq!(got.bytes().await.unwrap(), &b"short text to grow\n"[..]);

    // Nothing left behind: the names are those before, plus the fill files.
    let after: Vec<String> = names_below(&ws)
        .into_iter()
        .filter(|n| !n.starts_with("fill-"))
        .collect();
    assert_eq!(after, before, "a refused write left something behind");
    assert!(!after.iter().any(|n| n.contains(".sbx-tmp")), "{after:?}");

    // Space freed: the same writes succeed, the new content whole.
    let r = http
        .post(s.url(id, "/exec"))
        .json(&json!({"command": "rm -f fill-*"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let new = pattern(2, 512 << 10);
    let r = put("keep.bin", new.clone()).await.unwrap();
    assert!(r.status().is_success(), "{:?}", json_of(r).await);
    let got = http.get(s.url(id, "/files/keep.bin")).send().await.unwrap();
    assert!(got.bytes().await.unwrap() == new);
    let r = http
        .post(s.url(id, "/edit"))
        .json(&json!({"path": "edit.txt", "old": "short", "new": "long"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{:?}", json_of(r).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_host_workspace_refuses_overwrite_upload_and_edit_as_too_large_and_keeps_the_old_bytes()
 {
    needs_root!();
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("sessionbox.toml"), "runtime = \"host\"\n").unwrap();
    let _fs = Tmpfs::mount(&data.join("workspaces"), 8 << 20);
    let s = Served::start(&data, None);
    let ws = |id: &str| {
        let key = sessionbox_core::ConversationKey::derive(
            &sessionbox_core::TenantId::new("default").unwrap(),
            &sessionbox_core::ConversationId::new(id).unwrap(),
        );
        data.join("workspaces").join(key.as_str())
    };
    workspace_full(&s, "full-host", ws).await;
    s.stop();
    destroy_all(&data, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_isolated_workspace_refuses_overwrite_upload_and_edit_as_too_large_and_keeps_the_old_bytes()
 {
    needs_root!();
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("sessionbox.toml"),
        "[isolated]\nidle_timeout_secs = 5\ndisk_bytes = 16777216\ndisk_inodes = 2000\n",
    )
    .unwrap();
    let s = Served::start(&data, None);
    let ws = |id: &str| {
        let key = sessionbox_core::ConversationKey::derive(
            &sessionbox_core::TenantId::new("default").unwrap(),
            &sessionbox_core::ConversationId::new(id).unwrap(),
        );
        data.join("workspaces").join(key.as_str())
    };
    workspace_full(&s, "full-isolated", ws).await;
    s.stop();
    destroy_all(&data, None);
    consistent(&data, None);
}

/// A restore replaces the whole workspace: one whose archive cannot fit, even in the room the
/// workspace's own files would free, is refused with 413 `too_large` before anything is removed
/// (the `host` runtime, on a full 8 MiB tmpfs: B's 3 MiB snapshot into A, which holds 256 KiB).
/// A's files are intact, byte for byte; once space is freed, the same restore succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_that_cannot_fit_a_full_workspace_is_refused_before_anything_is_removed() {
    needs_root!();
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("sessionbox.toml"), "runtime = \"host\"\n").unwrap();
    let _fs = Tmpfs::mount(&data.join("workspaces"), 8 << 20);
    let s = Served::start(&data, None);
    let http = http();
    let old = pattern(7, 256 << 10);
    let r = http
        .put(s.url("a", "/files/keep.bin"))
        .body(old.clone())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let big = pattern(8, 3 << 20);
    let r = http
        .put(s.url("b", "/files/big.bin"))
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let r = http
        .post(s.url("b", "/snapshots"))
        .json(&json!({"name": "big"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", json_of(r).await);
    // Full, from B.
    let r = http
        .post(s.url("b", "/exec"))
        .json(&json!({"command": "for b in 1048576 65536 4096 512 1; do \
            head -c 100000000 /dev/zero | dd of=fill-$b bs=$b 2>/dev/null; done; true"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = http
        .post(s.url("a", "/restore"))
        .json(&json!({"snapshot": "big"}))
        .send()
        .await
        .unwrap();
    let (st, v) = json_of(r).await;
    say!("restore that cannot fit: {st} {v}");
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("too_large")),
        "{v}"
    );
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("nothing was changed"),
        "{v}"
    );
    let got = http
        .get(s.url("a", "/files/keep.bin"))
        .send()
        .await
        .unwrap();
    assert!(got.bytes().await.unwrap() == old, "A's file changed");
    // Freed: the same restore replaces A's files with B's.
    let r = http
        .post(s.url("b", "/exec"))
        .json(&json!({"command": "rm -f fill-*"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = http
        .post(s.url("a", "/restore"))
        .json(&json!({"snapshot": "big"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", json_of(r).await);
    let got = http.get(s.url("a", "/files/big.bin")).send().await.unwrap();
    assert!(got.bytes().await.unwrap() == big);
    let r = http
        .get(s.url("a", "/files/keep.bin"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    s.stop();
    destroy_all(&data, None);
}

/// One answer of the load while the store's disk is full: what it was and how it ended.
#[derive(Debug)]
#[allow(dead_code)] // Read through `Debug`, in the failure messages.
struct Answer {
    what: String,
    status: Option<StatusCode>,
    body: Value,
    took: Duration,
}

/// `serve` (host runtime) with its data directory, store included, on a 48 MiB tmpfs that the
/// test fills while eight clients create conversations, run commands and write files (the
/// workspaces are on a file system of their own, with room). Every answer is a success or 503
/// `unavailable` (the store cannot write), within seconds: no 500, no dropped connection.
/// `/healthz` and `/readyz` answer meanwhile. Freed, the same server serves again: new
/// conversations, writes, commands; every acknowledged write is there; every record has its
/// workspace and garbage collection finds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_disk_filling_under_load_fails_requests_cleanly_and_serve_recovers_host() {
    needs_root!();
    store_disk_full("runtime = \"host\"\n", 40).await;
}

/// The same on the `isolated` runtime: sandboxes launched and commands started while the disk
/// holding the store and the sandboxes' run directories is full (the workspaces' volumes are
/// on a file system with room).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_disk_filling_under_load_fails_requests_cleanly_and_serve_recovers_isolated() {
    needs_root!();
    store_disk_full(
        "[isolated]\nidle_timeout_secs = 10\ndisk_bytes = 16777216\ndisk_inodes = 2000\n",
        2,
    )
    .await;
}

/// The body of the store-disk tests, with this configuration; each client makes at most
/// `new_per_client` new conversations while the disk is full.
async fn store_disk_full(config: &str, new_per_client: usize) {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    let _fs = Tmpfs::mount(&data, 48 << 20);
    let _ws = Tmpfs::mount(&data.join("workspaces"), 128 << 20);
    let _disks = Tmpfs::mount(&data.join("disks"), 256 << 20);
    std::fs::write(data.join("sessionbox.toml"), config).unwrap();
    let s = Served::start(&data, None);
    let http = http();
    for i in 0..4 {
        let r = http
            .put(s.url(&format!("warm-{i}"), "/files/a.txt"))
            .body("warm")
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }
    fill(&data, "filler");

    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    // (conversation, path) -> content, for every write the server acknowledged (the warm-up's
    // before the disk filled, and those of the load).
    let acked: Arc<Mutex<BTreeMap<(String, String), String>>> = Arc::new(Mutex::new(
        (0..4)
            .map(|i| ((format!("warm-{i}"), "a.txt".to_owned()), "warm".to_owned()))
            .collect(),
    ));
    let until = Instant::now() + Duration::from_secs(4);
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let (http, base, answers, acked) =
                (http.clone(), s.base.clone(), answers.clone(), acked.clone());
            tokio::spawn(async move {
                let (mut n, mut new) = (0, 0);
                while Instant::now() < until {
                    let id = match n % 3 {
                        0 if new < new_per_client => {
                            new += 1;
                            format!("new-{c}-{n}")
                        }
                        _ => format!("warm-{}", n % 4),
                    };
                    let (what, req) = match n % 5 {
                        0 | 1 => {
                            let content = format!("write {c} {n}");
                            let path = format!("w-{c}-{n}.txt");
                            acked
                                .lock()
                                .unwrap()
                                .insert((id.clone(), path.clone()), content.clone());
                            (
                                format!("PUT {id}/{path}"),
                                http.put(format!("{base}/v1/conversations/{id}/files/{path}"))
                                    .body(content),
                            )
                        }
                        2 => (
                            format!("exec {id}"),
                            http.post(format!("{base}/v1/conversations/{id}/exec"))
                                .json(&json!({"command": "echo ok"})),
                        ),
                        3 => (
                            format!("background {id}"),
                            http.post(format!("{base}/v1/conversations/{id}/exec"))
                                .json(&json!({"command": "echo bg", "background": true})),
                        ),
                        _ => (
                            format!("GET warm-{c}"),
                            http.get(format!("{base}/v1/conversations/warm-{}", c % 4)),
                        ),
                    };
                    let t = Instant::now();
                    let r = req.send().await;
                    let took = t.elapsed();
                    let (status, body) = match r {
                        Ok(r) => {
                            let (st, v) = json_of(r).await;
                            (Some(st), v)
                        }
                        Err(e) => (None, json!(e.to_string())),
                    };
                    // Only what the server acknowledged counts as written.
                    if what.starts_with("PUT") && !status.is_some_and(|s| s.is_success()) {
                        let path = what.rsplit('/').next().unwrap().to_owned();
                        acked.lock().unwrap().remove(&(id.clone(), path));
                    }
                    answers.lock().unwrap().push(Answer {
                        what,
                        status,
                        body,
                        took,
                    });
                    n += 1;
                }
            })
        })
        .collect();
    // The server keeps answering its health checks meanwhile.
    let mut health = Vec::new();
    while Instant::now() < until {
        let h = http
            .get(format!("{}/healthz", s.base))
            .send()
            .await
            .unwrap();
        health.push(h.status());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for c in clients {
        c.await.unwrap();
    }
    assert!(health.iter().all(|h| *h == StatusCode::OK), "{health:?}");

    let answers = std::mem::take(&mut *answers.lock().unwrap());
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    let mut bad = Vec::new();
    for a in &answers {
        let code = a.body["code"].as_str().unwrap_or("");
        let class = match a.status {
            Some(st) if st.is_success() => "ok".to_owned(),
            Some(StatusCode::SERVICE_UNAVAILABLE) if code == "unavailable" => {
                "unavailable".to_owned()
            }
            _ => {
                bad.push(a);
                "bad".to_owned()
            }
        };
        *by.entry(class).or_default() += 1;
        assert!(a.took < Duration::from_secs(20), "{a:?} took too long");
    }
    say!(
        "{} answers while the store's disk was full: {by:?}",
        answers.len()
    );
    for a in bad.iter().take(10) {
        say!("unexpected: {a:?}");
    }
    assert!(
        bad.is_empty(),
        "{} answers were neither success nor a typed refusal",
        bad.len()
    );
    assert!(
        by.get("unavailable").is_some_and(|n| *n > 0),
        "the full disk refused nothing: {by:?}"
    );

    // Freed: the same server serves again.
    std::fs::remove_file(data.join("filler")).unwrap();
    for i in 0..4 {
        let id = format!("after-{i}");
        let r = http
            .put(s.url(&id, "/files/b.txt"))
            .body("after")
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{:?}", json_of(r).await);
        let r = http
            .post(s.url(&id, "/exec"))
            .json(&json!({"command": "cat b.txt"}))
            .send()
            .await
            .unwrap();
        let (st, v) = json_of(r).await;
        assert_eq!(
            (st, v["stdout"].as_str()),
            (StatusCode::OK, Some("after")),
            "{v}"
        );
    }
    let acked = acked.lock().unwrap().clone();
    for ((id, path), content) in &acked {
        let r = http
            .get(s.url(id, &format!("/files/{path}")))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::OK,
            "{id}/{path} acknowledged, then lost"
        );
        assert_eq!(&r.text().await.unwrap(), content);
    }
    say!("{} acknowledged writes, all present", acked.len());
    assert!(acked.len() >= 4, "{}", acked.len());
    // A first open undone while the disk was full finishes removing its record once the store
    // can write again (in the background, within seconds); then nothing is half-made.
    settled(&data, None).await;
    consistent(&data, None);
    s.stop();
    destroy_all(&data, None);
}
