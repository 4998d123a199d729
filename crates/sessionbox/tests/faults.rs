//! Fault injection through the real `sessionbox serve` (and the library where a clock must be
//! moved): a disk that fills during writes (`faults/disk.rs`), a PostgreSQL store restarted
//! under load (`faults/postgres.rs`), and a wall clock that jumps (`faults/clock.rs`). What
//! must hold whatever fails: every request ends (no hang), with success or a typed error (no
//! 500 for a known fault, no panic); nothing is half-made; the server recovers without a
//! restart once the fault is gone. They need root (small file systems are mounted, sandboxes
//! made); without it each prints SKIPPED and passes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sessionbox_test_support::{serve_command, spawn_serve};

#[path = "faults/clock.rs"]
mod clock;
#[path = "faults/disk.rs"]
mod disk;
#[path = "faults/postgres.rs"]
mod postgres;

const EXE: &str = env!("CARGO_BIN_EXE_sessionbox");

macro_rules! needs_root {
    () => {
        sessionbox_test_support::echo_panics_to_stderr();
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED: fault injection tests need root (CI runs them as root)");
            return;
        }
    };
}
pub(crate) use needs_root;

/// `eprintln!` past libtest's capture, straight to file descriptor 2: what these tests measure
/// reaches a CI log that keeps only the lines around a failure.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}
pub(crate) use say;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `sessionbox --data-dir DATA ARGS...` with the store URL `store_url` (else SQLite).
fn cli(data: &Path, store_url: Option<&str>, args: &[&str]) -> Output {
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

/// A running `sessionbox serve` on `data` (whose `sessionbox.toml` the caller wrote), killed
/// when dropped.
struct Served {
    child: Child,
    base: String,
}

impl Served {
    fn start(data: &Path, store_url: Option<&str>) -> Served {
        let mut c = serve_command(EXE, data, &[]);
        c.env_remove("SESSIONBOX_STORE_URL");
        if let Some(u) = store_url {
            c.env("SESSIONBOX_STORE_URL", u);
        }
        let (child, base) = spawn_serve(&mut c);
        Served { child, base }
    }

    fn url(&self, id: &str, tail: &str) -> String {
        format!("{}/v1/conversations/{id}{tail}", self.base)
    }

    /// SIGTERM, and its exit status (a graceful stop exits 0).
    fn stop(mut self) {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "serve exited with {status}");
                return;
            }
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

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Status and JSON body (`Null` when it is not JSON).
async fn json_of(r: reqwest::Response) -> (reqwest::StatusCode, Value) {
    let st = r.status();
    let b = r.bytes().await.unwrap_or_default();
    (st, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

/// A tmpfs of `bytes` mounted at `dir` (made when missing), unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, bytes: u64) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={bytes},mode=0755"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        Tmpfs(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system holding `dir` with the file `dir/NAME` until the kernel refuses.
fn fill(dir: &Path, name: &str) {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join(name)).unwrap();
    for size in [1 << 20, 64 << 10, 4 << 10, 512, 1] {
        let chunk = vec![0xa5u8; size];
        while f.write_all(&chunk).is_ok() {}
    }
    let _ = f.sync_all();
}

/// The garbage collection report of the CLI (`gc --json --grace-secs 0`).
fn gc(data: &Path, store_url: Option<&str>, dry_run: bool) -> Value {
    let mut args = vec!["gc", "--json", "--grace-secs", "0"];
    if dry_run {
        args.push("--dry-run");
    }
    let out = cli(data, store_url, &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What a garbage collection found to remove.
fn found(report: &Value) -> usize {
    ["expired", "stuck", "orphans", "dangling"]
        .iter()
        .map(|k| report[k].as_array().map_or(0, Vec::len))
        .sum()
}

/// The recorded conversations of every tenant (`conversations --all-tenants --json`).
fn records(data: &Path, store_url: Option<&str>) -> Vec<Value> {
    let out = cli(
        data,
        store_url,
        &["conversations", "--all-tenants", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Destroys every recorded conversation.
fn destroy_all(data: &Path, store_url: Option<&str>) {
    for r in records(data, store_url) {
        let out = cli(
            data,
            store_url,
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
}

/// Waits (up to 30 s) until no record is `destroying`: removals the server deferred while the
/// store was unavailable have finished.
async fn settled(data: &Path, store_url: Option<&str>) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let busy: Vec<Value> = records(data, store_url)
            .into_iter()
            .filter(|r| r["state"] != "active")
            .collect();
        if busy.is_empty() {
            return;
        }
        assert!(
            Instant::now() < until,
            "records still being removed: {busy:#?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every record is whole: active, with its workspace on disk; and garbage collection finds
/// nothing to remove (no orphan, no dangling record, nothing stuck half-destroyed).
fn consistent(data: &Path, store_url: Option<&str>) {
    for r in records(data, store_url) {
        assert_eq!(r["state"], "active", "{r}");
        let ws = data.join("workspaces").join(r["key"].as_str().unwrap());
        assert!(ws.is_dir(), "record {} points at no workspace", r["id"]);
    }
    let report = gc(data, store_url, true);
    assert_eq!(found(&report), 0, "garbage collection found: {report:#}");
}
