//! The soak: a bounded run of mixed traffic from many conversations through a real `sessionbox
//! serve` on the `isolated` runtime with its containment limits on (a 32 MiB disk quota per
//! workspace, 128 processes, 256 MiB of memory, default-deny egress with allowlists set and
//! removed on some conversations, a 15 s idle timeout so sandboxes stop and start again).
//!
//! 10 clients, each with 3 conversations of its own (30 in all), for `SESSIONBOX_SOAK_SECS`
//! seconds (default 120): commands, writes read back, edits, background commands followed to
//! their end, listings, renewals, destroys, network policies, a disk filled from inside to its
//! quota, and bad input (paths that escape, invalid ids, malformed and unknown JSON, an empty
//! edit, a file that does not exist). Every answer is checked against what the client knows of
//! its own conversations; the run ends with **zero unexpected answers**.
//!
//! Memory: the server's resident set is sampled every 5 s; the one after the warm-up (the
//! first fifth of the run, at least 15 s: every kind of request served, the allocator's arenas
//! and tokio's worker and blocking threads made) is the start, and the one after the last
//! request the end. The bound is end <= start * 1.25 + 16 MiB. Measured (debug build, 120 s,
//! about 14 000 rounds): 64 MiB after the warm-up, 67 MiB at the end, a plateau from 30 s on.
//! What legitimately moves is allocator slack (bodies of up to 64 KiB held briefly by up to 10
//! requests at once, in glibc's per-thread arenas), the kept sessions (at most one per
//! conversation, 30) and the threads of tokio's blocking pool, a few MiB together; the bound
//! leaves room for that on a slower machine, where more blocking threads run at once. A leak
//! of 2 KiB per round (a request's body, a session, a task left behind) fails it within the
//! default run.
//!
//! Afterwards every conversation is destroyed and `gc` finds nothing; nothing is left on the
//! host: no workspace, volume image, run directory, mount, loop device, cgroup or process of
//! the data directory.
//!
//! The store is SQLite in the data directory, or the PostgreSQL database that
//! `SESSIONBOX_SOAK_STORE_URL` names (a database of its own: the soak's records go there).
//!
//! Its own binary: it measures memory and answers under load, so no other test shares the
//! machine with it. Needs root (the isolated runtime with cgroups and disk quotas); without it
//! it prints SKIPPED and passes.

#![allow(clippy::unwrap_used, unreachable_pub)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sessionbox_test_support::{serve_command, spawn_serve};

const EXE: &str = env!("CARGO_BIN_EXE_sessionbox");
const CLIENTS: usize = 10;
const SLOTS: usize = 3;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// xorshift64*: a reproducible stream of choices per client.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// The sandboxes' idle timeout in the soak's configuration.
const IDLE: Duration = Duration::from_secs(15);

/// What a client knows of one of its conversations.
#[derive(Default)]
struct Slot {
    exists: bool,
    files: BTreeMap<String, Vec<u8>>,
    /// Background commands running: id and what they print.
    background: Vec<(String, String, Instant)>,
    /// When it was last used (its sandbox may have stopped for idleness since).
    last_used: Option<Instant>,
}

/// One answer that was not what the client expected.
#[derive(Debug)]
#[allow(dead_code)] // Read through `Debug`, in the failure message.
struct Unexpected {
    op: String,
    status: Option<StatusCode>,
    body: String,
}

struct Client {
    n: usize,
    base: String,
    http: reqwest::Client,
    rng: Rng,
    slots: Vec<Slot>,
    unexpected: Arc<Mutex<Vec<Unexpected>>>,
    counts: BTreeMap<&'static str, u64>,
}

/// An answer: status and body bytes (`None` status: no answer at all).
struct Answer {
    status: Option<StatusCode>,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

impl Client {
    fn id(&self, s: usize) -> String {
        format!("soak-{}-{s}", self.n)
    }

    fn url(&self, s: usize, tail: &str) -> String {
        format!("{}/v1/conversations/{}{tail}", self.base, self.id(s))
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Answer {
        match req.send().await {
            Ok(r) => {
                let status = Some(r.status());
                let body = r.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
                Answer { status, body }
            }
            Err(e) => Answer {
                status: None,
                body: e.to_string().into_bytes(),
            },
        }
    }

    /// Records `a` as unexpected unless `ok`.
    fn expect(&self, op: &str, a: &Answer, ok: bool) -> bool {
        if !ok {
            self.unexpected.lock().unwrap().push(Unexpected {
                op: op.to_owned(),
                status: a.status,
                body: text(&a.body[..a.body.len().min(400)]),
            });
        }
        ok
    }

    fn is(a: &Answer, st: StatusCode) -> bool {
        a.status == Some(st)
    }

    fn code(a: &Answer, st: StatusCode, code: &str) -> bool {
        a.status == Some(st) && a.json()["code"] == code
    }

    /// Any use creates the conversation.
    fn used(&mut self, s: usize) {
        self.slots[s].exists = true;
    }

    async fn round(&mut self, round: u64) {
        let s = self.rng.below(SLOTS as u64) as usize;
        self.follow_background(s).await;
        self.slots[s].last_used = Some(Instant::now());
        let pick = self.rng.below(100);
        let op: &'static str = match pick {
            0..=27 => "exec",
            28..=47 => "write",
            48..=52 => "edit",
            53..=60 => "background",
            61..=65 => "ls",
            66..=70 => "renew",
            71..=74 => "destroy",
            75..=77 => "policy",
            78..=79 => "fill",
            80..=84 => "info",
            _ => "bad",
        };
        *self.counts.entry(op).or_default() += 1;
        let http = self.http.clone();
        match op {
            "exec" => {
                let a = self
                    .send(
                        http.post(self.url(s, "/exec"))
                            .json(&json!({"command": format!("printf '%s ' {round}; ls | wc -l")})),
                    )
                    .await;
                let v = a.json();
                let ok = Self::is(&a, StatusCode::OK)
                    && v["exit_code"] == 0
                    && v["stdout"]
                        .as_str()
                        .is_some_and(|o| o.starts_with(&format!("{round} ")));
                self.expect("exec", &a, ok);
                self.used(s);
            }
            "write" => {
                let name = format!("f{}.bin", self.rng.below(6));
                let len = 1 + self.rng.below(64 << 10) as usize;
                let data = self.rng.bytes(len);
                let a = self
                    .send(
                        http.put(self.url(s, &format!("/files/{name}")))
                            .body(data.clone()),
                    )
                    .await;
                self.used(s);
                if self.expect("write", &a, a.status.is_some_and(|s| s.is_success())) {
                    self.slots[s].files.insert(name.clone(), data.clone());
                    let a = self
                        .send(http.get(self.url(s, &format!("/files/{name}"))))
                        .await;
                    let ok = Self::is(&a, StatusCode::OK) && a.body == data;
                    self.expect("read back", &a, ok);
                }
            }
            "edit" => {
                let has = self.slots[s].files.contains_key("e.txt");
                if !has {
                    let a = self
                        .send(http.put(self.url(s, "/files/e.txt")).body("alpha beta\n"))
                        .await;
                    self.used(s);
                    if self.expect("edit setup", &a, a.status.is_some_and(|s| s.is_success())) {
                        self.slots[s]
                            .files
                            .insert("e.txt".into(), b"alpha beta\n".to_vec());
                    }
                    return;
                }
                let new = format!("gamma{round}");
                let a = self
                    .send(http.post(self.url(s, "/edit")).json(
                        &json!({"path": "e.txt", "old": "beta", "new": format!("beta {new}")}),
                    ))
                    .await;
                let ok = Self::is(&a, StatusCode::OK) && a.json()["replacements"] == 1;
                if self.expect("edit", &a, ok) {
                    let f = self.slots[s].files.get_mut("e.txt").unwrap();
                    *f = text(f)
                        .replacen("beta", &format!("beta {new}"), 1)
                        .into_bytes();
                }
            }
            "background" => {
                if self.slots[s].background.len() >= 3 {
                    return;
                }
                let out = format!("bg-{round}");
                let a = self
                    .send(http.post(self.url(s, "/exec")).json(&json!({
                        "command": format!("sleep 0.5; echo {out}"),
                        "background": true
                    })))
                    .await;
                self.used(s);
                let id = a.json()["id"].as_str().map(str::to_owned);
                if self.expect(
                    "background",
                    &a,
                    Self::is(&a, StatusCode::ACCEPTED) && id.is_some(),
                ) {
                    self.slots[s]
                        .background
                        .push((id.unwrap(), out, Instant::now()));
                }
            }
            "ls" => {
                let a = self.send(http.get(self.url(s, "/ls"))).await;
                if !self.slots[s].exists {
                    // A listing does not create: 404 for a conversation not made yet.
                    let ok = Self::code(&a, StatusCode::NOT_FOUND, "not_found");
                    self.expect("ls absent", &a, ok);
                    return;
                }
                let listed: BTreeSet<String> = a.json()["entries"]
                    .as_array()
                    .map(|e| {
                        e.iter()
                            .filter_map(|x| x["name"].as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let ok = Self::is(&a, StatusCode::OK)
                    && self.slots[s].files.keys().all(|f| listed.contains(f));
                self.expect("ls", &a, ok);
            }
            "renew" => {
                let a = self.send(http.post(self.url(s, ""))).await;
                let want = if self.slots[s].exists {
                    StatusCode::OK
                } else {
                    StatusCode::CREATED
                };
                self.expect("renew", &a, Self::is(&a, want));
                self.used(s);
            }
            "destroy" => {
                let a = self.send(http.delete(self.url(s, ""))).await;
                if self.expect("destroy", &a, Self::is(&a, StatusCode::NO_CONTENT)) {
                    self.slots[s] = Slot::default();
                }
            }
            "policy" => {
                let a = if self.rng.below(2) == 0 {
                    self.send(
                        http.put(self.url(s, "/policy"))
                            .json(&json!({"profile": "allowlist", "allow": ["example.invalid"]})),
                    )
                    .await
                } else {
                    self.send(http.delete(self.url(s, "/policy"))).await
                };
                self.expect("policy", &a, a.status.is_some_and(|s| s.is_success()));
                // A switch between `none` and an allowlist starts the sandbox anew (its
                // network namespace changes): background commands do not outlive it.
                self.slots[s].background.clear();
                // A command runs under it.
                let a = self
                    .send(
                        http.post(self.url(s, "/exec"))
                            .json(&json!({"command": "echo under-policy"})),
                    )
                    .await;
                let ok = Self::is(&a, StatusCode::OK) && a.json()["stdout"] == "under-policy\n";
                self.expect("exec under policy", &a, ok);
                self.used(s);
            }
            "fill" => {
                // The disk quota, from inside: the kernel refuses past it; freed after.
                let a = self
                    .send(http.post(self.url(s, "/exec")).json(&json!({
                        "command": "dd if=/dev/zero of=big bs=1M count=64 2>&1 | grep -o 'No space left on device'; rm -f big",
                        "timeout_ms": 60000
                    })))
                    .await;
                let ok = Self::is(&a, StatusCode::OK)
                    && a.json()["stdout"]
                        .as_str()
                        .is_some_and(|o| o.contains("No space left on device"));
                self.expect("fill to the quota", &a, ok);
                self.used(s);
            }
            "info" => {
                let a = self.send(http.get(self.url(s, ""))).await;
                let ok = if self.slots[s].exists {
                    Self::is(&a, StatusCode::OK) && a.json()["id"] == self.id(s)
                } else {
                    Self::code(&a, StatusCode::NOT_FOUND, "not_found")
                };
                self.expect("info", &a, ok);
            }
            _ => self.bad(s).await,
        }
    }

    /// Bad input: refused with the right code, nothing changed.
    async fn bad(&mut self, s: usize) {
        let http = self.http.clone();
        let kind = self.rng.below(6);
        let (op, a, ok): (&str, Answer, fn(&Answer) -> bool) = match kind {
            0 => (
                "escape",
                self.send(http.get(self.url(s, "/files/..%2F..%2Fetc%2Fpasswd")))
                    .await,
                |a| Client::code(a, StatusCode::FORBIDDEN, "outside_workspace"),
            ),
            1 => (
                "invalid id",
                self.send(
                    http.post(format!("{}/v1/conversations/bad%20id!/exec", self.base))
                        .json(&json!({"command": "true"})),
                )
                .await,
                |a| Client::code(a, StatusCode::BAD_REQUEST, "invalid_id"),
            ),
            2 => (
                "malformed json",
                self.send(
                    http.post(self.url(s, "/exec"))
                        .header("content-type", "application/json")
                        .body("{\"command\": "),
                )
                .await,
                |a| Client::code(a, StatusCode::BAD_REQUEST, "invalid_request"),
            ),
            3 => (
                "unknown field",
                self.send(
                    http.post(self.url(s, "/exec"))
                        .json(&json!({"command": "true", "shell": "bash"})),
                )
                .await,
                |a| Client::code(a, StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
            ),
            4 => (
                "empty edit",
                self.send(
                    http.post(self.url(s, "/edit"))
                        .json(&json!({"path": "e.txt", "old": "", "new": "x"})),
                )
                .await,
                |a| Client::code(a, StatusCode::BAD_REQUEST, "invalid_request"),
            ),
            _ => (
                "missing file",
                self.send(http.get(self.url(s, "/files/never-written.txt")))
                    .await,
                |a| Client::code(a, StatusCode::NOT_FOUND, "not_found"),
            ),
        };
        self.expect(op, &a, ok(&a));
    }

    /// Background commands of slot `s` that ran long enough: each has ended, exit 0, its
    /// output whole.
    async fn follow_background(&mut self, s: usize) {
        let due: Vec<(String, String, Instant)> = self.slots[s]
            .background
            .iter()
            .filter(|(_, _, at)| at.elapsed() > Duration::from_secs(3))
            .cloned()
            .collect();
        // Its sandbox stopped for idleness since (a command's record lives in the sandbox).
        let idled = self.slots[s]
            .last_used
            .is_some_and(|t| t.elapsed() >= IDLE - Duration::from_secs(1));
        for (id, out, at) in due {
            let a = self
                .send(self.http.get(self.url(s, &format!("/commands/{id}"))))
                .await;
            let v = a.json();
            if v["running"] == true && at.elapsed() < Duration::from_secs(30) {
                continue;
            }
            if idled && Self::code(&a, StatusCode::NOT_FOUND, "not_found") {
                self.slots[s].background.retain(|(i, _, _)| i != &id);
                continue;
            }
            let ok = Self::is(&a, StatusCode::OK)
                && v["running"] == false
                && v["exit_code"] == 0
                && v["stdout_bytes"] == out.len() + 1;
            self.expect("background ended", &a, ok);
            self.slots[s].background.retain(|(i, _, _)| i != &id);
        }
    }
}

/// A child killed when dropped (a failing test leaves no server behind).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// On a failure, destroys every conversation of the data directory and collects garbage, so a
/// failing soak leaves no sandbox, mount or loop device behind.
struct CleanUp(PathBuf);

impl Drop for CleanUp {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let data = &self.0;
        if let Ok(out) =
            std::panic::catch_unwind(|| cli(data, &["conversations", "--all-tenants", "--json"]))
        {
            let records: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
            for r in records {
                let (Some(t), Some(id)) = (r["tenant"].as_str(), r["id"].as_str()) else {
                    continue;
                };
                let _ = cli(data, &["--tenant", t, "destroy", "-c", id]);
            }
        }
        let _ = cli(data, &["gc", "--grace-secs", "0"]);
    }
}

/// The resident set of process `pid`, bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

fn cli(data: &Path, args: &[&str]) -> std::process::Output {
    let mut c = Command::new(EXE);
    c.arg("--data-dir")
        .arg(data)
        .args(args)
        .env_remove("SESSIONBOX_RUNTIME")
        .env_remove("SESSIONBOX_TENANT")
        .env_remove("SESSIONBOX_STORE_URL")
        .stdin(Stdio::null());
    if let Ok(u) = std::env::var("SESSIONBOX_SOAK_STORE_URL") {
        c.env("SESSIONBOX_STORE_URL", u);
    }
    c.output().unwrap()
}

/// Cgroup directories named in the run directories' `sandbox.json`, as seen so far.
fn cgroups_of(data: &Path, seen: &mut BTreeSet<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(data.join("run")) else {
        return;
    };
    for e in rd.flatten() {
        if let Ok(b) = std::fs::read(e.path().join("sandbox.json"))
            && let Ok(v) = serde_json::from_slice::<Value>(&b)
        {
            for c in v["cgroups"].as_array().into_iter().flatten() {
                if let Some(c) = c.as_str() {
                    seen.insert(PathBuf::from(c));
                }
            }
        }
    }
}

/// What of `data` is left on the host: entries of its per-conversation directories, mounts
/// and loop devices beneath it, processes naming it.
fn leftovers(data: &Path, cgroups: &BTreeSet<PathBuf>, uids: std::ops::Range<u32>) -> Vec<String> {
    let mut left = Vec::new();
    for dir in ["workspaces", "disks", "run"] {
        if let Ok(rd) = std::fs::read_dir(data.join(dir)) {
            left.extend(
                rd.flatten()
                    .map(|e| format!("{dir}/{}", e.file_name().display())),
            );
        }
    }
    let data_s = std::fs::canonicalize(data).unwrap().display().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    left.extend(
        mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| p.starts_with(&data_s))
            .map(|p| format!("mount {p}")),
    );
    if let Ok(out) = Command::new("losetup").arg("-a").output() {
        left.extend(
            text(&out.stdout)
                .lines()
                .filter(|l| l.contains(&data_s))
                .map(|l| format!("loop {l}")),
        );
    }
    left.extend(
        cgroups
            .iter()
            .filter(|c| c.exists())
            .map(|c| format!("cgroup {}", c.display())),
    );
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| text(&b).replace('\0', " "))
            .unwrap_or_default();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|u| u.split_whitespace().next()?.parse::<u32>().ok());
        // A zombie is a process that has ended, waiting to be reaped.
        let zombie = status
            .lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'));
        if !zombie && (cmdline.contains(&data_s) || uid.is_some_and(|u| uids.contains(&u))) {
            left.push(format!("process {pid} {cmdline}"));
        }
    }
    left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_of_mixed_traffic_ends_with_no_unexpected_answer_flat_memory_and_nothing_left() {
    if !rustix::process::geteuid().is_root() {
        eprintln!(
            "SKIPPED: the soak needs root (the isolated runtime's limits; CI runs it as root)"
        );
        return;
    }
    let secs: u64 = std::env::var("SESSIONBOX_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let warm_up = Duration::from_secs((secs / 5).max(15));
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    // A uid range of its own, so that a process left behind is known by its uid.
    let uid_base = 40_000_000 + (std::process::id() % 10_000) * 256;
    let uids = uid_base..uid_base + 256;
    std::fs::write(
        data.join("sessionbox.toml"),
        format!(
            "[isolated]\nidle_timeout_secs = 15\npids = 128\nmemory_bytes = 268435456\n\
             disk_bytes = 33554432\ndisk_inodes = 4000\nuid_base = {uid_base}\nuid_count = 256\n"
        ),
    )
    .unwrap();
    let store_url = std::env::var("SESSIONBOX_SOAK_STORE_URL").ok();
    let mut c = serve_command(EXE, &data, &[]);
    c.env_remove("SESSIONBOX_STORE_URL");
    if let Some(u) = &store_url {
        c.env("SESSIONBOX_STORE_URL", u);
    }
    let (serve, base) = spawn_serve(&mut c);
    // Dropped in reverse: the server is killed first, then what it made is cleaned up.
    let _clean_up = CleanUp(data.clone());
    let mut serve = Killed(serve);
    let pid = serve.0.id();

    let unexpected: Arc<Mutex<Vec<Unexpected>>> = Arc::default();
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(90))
        .build()
        .unwrap();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| {
            let mut client = Client {
                n,
                base: base.clone(),
                http: http.clone(),
                rng: Rng(0x9e37_79b9_7f4a_7c15 ^ ((n as u64 + 1) * 0x1000_0001)),
                slots: (0..SLOTS).map(|_| Slot::default()).collect(),
                unexpected: unexpected.clone(),
                counts: BTreeMap::new(),
            };
            tokio::spawn(async move {
                let mut round = 0;
                while Instant::now() < until {
                    client.round(round).await;
                    round += 1;
                }
                // What each conversation still holds reads back as written.
                for s in 0..SLOTS {
                    let files = std::mem::take(&mut client.slots[s].files);
                    for (name, data) in files {
                        let a = client
                            .send(client.http.get(client.url(s, &format!("/files/{name}"))))
                            .await;
                        let ok = Client::is(&a, StatusCode::OK) && a.body == data;
                        client.expect("final read", &a, ok);
                    }
                }
                (round, client.counts)
            })
        })
        .collect();

    // The server's memory, every 5 s.
    let mut samples = Vec::new();
    let mut start_rss = None;
    let mut cgroups = BTreeSet::new();
    while Instant::now() < until {
        tokio::time::sleep(
            Duration::from_secs(5).min(until.saturating_duration_since(Instant::now())),
        )
        .await;
        let r = rss(pid);
        samples.push((started.elapsed().as_secs(), r >> 20));
        if start_rss.is_none() && started.elapsed() >= warm_up {
            start_rss = Some(r);
        }
        cgroups_of(&data, &mut cgroups);
    }
    let mut requests = 0;
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for c in clients {
        let (rounds, cs) = c.await.unwrap();
        requests += rounds;
        for (k, v) in cs {
            *counts.entry(k).or_default() += v;
        }
    }
    let end_rss = rss(pid);
    let start_rss = start_rss.unwrap_or(end_rss);
    eprintln!(
        "soak: {secs} s, {CLIENTS} clients x {SLOTS} conversations, {requests} rounds ({:.0}/s): {counts:?}",
        requests as f64 / secs as f64
    );
    eprintln!(
        "serve RSS (MiB at s): {samples:?}; start (after {warm_up:?} warm-up) {} MiB, end {} MiB",
        start_rss >> 20,
        end_rss >> 20
    );
    let unexpected = std::mem::take(&mut *unexpected.lock().unwrap());
    for u in unexpected.iter().take(20) {
        eprintln!("unexpected: {u:?}");
    }
    assert!(
        unexpected.is_empty(),
        "{} unexpected answers",
        unexpected.len()
    );
    assert!(requests > 200, "too little traffic: {requests}");
    let bound = start_rss + start_rss / 4 + (16 << 20);
    assert!(
        end_rss <= bound,
        "serve's memory grew from {} to {} MiB (bound {} MiB)",
        start_rss >> 20,
        end_rss >> 20,
        bound >> 20
    );

    // Stopped; everything destroyed; nothing left.
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&serve.0),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(serve.0.wait().unwrap().success());
    let out = cli(&data, &["conversations", "--all-tenants", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let records: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    for r in &records {
        let out = cli(
            &data,
            &[
                "--tenant",
                r["tenant"].as_str().unwrap(),
                "destroy",
                "-c",
                r["id"].as_str().unwrap(),
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let out = cli(&data, &["gc", "--json", "--grace-secs", "0"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let found: usize = ["expired", "stuck", "orphans", "dangling"]
        .iter()
        .map(|k| report[k].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(
        found, 0,
        "gc found leftovers after every destroy: {report:#}"
    );
    // Processes killed by the destroys may take a moment to end.
    let mut left = leftovers(&data, &cgroups, uids.clone());
    let until = Instant::now() + Duration::from_secs(10);
    while !left.is_empty() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = leftovers(&data, &cgroups, uids.clone());
    }
    eprintln!(
        "after destroy and gc: {} records destroyed, {} cgroups seen during the run, nothing left: {}",
        records.len(),
        cgroups.len(),
        left.is_empty()
    );
    assert!(left.is_empty(), "left on the host: {left:#?}");
}
