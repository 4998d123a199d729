//! `sessionbox verify --acceptance` end to end: the real binary on a real data directory, its
//! JSON record read back. On `isolated` (root) every row passes with small configured limits,
//! each measured by its probe; on `host` the rows it does not enforce say so, and the planted
//! secret is found but never printed.
//!
//! Its own binary: the fork, memory and CPU probes measure the machine, so no other file's
//! tests share it with them.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

const ROWS: [&str; 14] = [
    "user",
    "capabilities",
    "no_new_privs",
    "seccomp",
    "root_fs",
    "caller_secrets",
    "timeout",
    "network_direct",
    "other_conversation",
    "cpu",
    "disk",
    "pids",
    "memory",
    "ttl_reclaim",
];

/// The value the tests hand the check as the caller's secret.
const SECRET: &str = "acceptance-test-secret-0123456789abcdef";

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn acceptance(data: &Path, config: &str, runtime: &str) -> (Output, serde_json::Value) {
    std::fs::write(data.join("sessionbox.toml"), config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sessionbox"))
        .arg("--data-dir")
        .arg(data)
        .args(["--runtime", runtime, "verify", "--acceptance", "--json"])
        .env_remove("SESSIONBOX_TENANT")
        .env("SESSIONBOX_ACCEPTANCE_SECRET", SECRET)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.contains(SECRET) && !stderr.contains(SECRET),
        "the secret's value was printed"
    );
    let report: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}\n{stderr}"));
    (out, report)
}

fn row<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no row {name} in {report:#}"))
}

fn verdict<'a>(report: &'a serde_json::Value, name: &str) -> &'a str {
    row(report, name)["verdict"].as_str().unwrap()
}

/// The conversations left in the store (the check destroys every one it opened).
fn conversations_left(data: &Path) -> usize {
    let out = Command::new(env!("CARGO_BIN_EXE_sessionbox"))
        .arg("--data-dir")
        .arg(data)
        .args(["conversations", "--all-tenants", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array().map_or(0, Vec::len)
}

#[test]
fn isolated_passes_every_row_each_measured_against_the_configured_limit() {
    if !is_root() {
        eprintln!("SKIPPED: the isolated runtime's limits and disk quota need root");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let config = "[isolated]\nidle_timeout_secs = 30\npids = 48\nmemory_bytes = 201326592\n\
                  cpu = 0.5\ndisk_bytes = 50331648\ndisk_inodes = 4096\n";
    let (out, report) = acceptance(d.path(), config, "isolated");
    assert!(out.status.success(), "{report:#}");
    assert_eq!(report["ok"], true);
    assert_eq!(report["runtime"], "isolated");
    let names: Vec<&str> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ROWS);
    for name in ROWS {
        let r = row(&report, name);
        assert_eq!(r["verdict"], "pass", "{r:#}");
        assert_eq!(r["claimed"], true, "{r:#}");
        assert!(!r["detail"].as_str().unwrap().is_empty());
    }
    // The limits measured are the configured ones.
    let detail = |n| row(&report, n)["detail"].as_str().unwrap().to_owned();
    assert!(
        detail("pids").starts_with("limit 48; tried 80,"),
        "{}",
        detail("pids")
    );
    assert!(
        detail("memory").starts_with("limit 192 MiB"),
        "{}",
        detail("memory")
    );
    assert!(
        detail("disk").starts_with("limit 48 MiB; refused"),
        "{}",
        detail("disk")
    );
    assert!(detail("cpu").contains("(limit 0.5)"), "{}", detail("cpu"));
    assert_eq!(report["claims"]["pids"], 48);
    assert!(
        report["conclusions"]["lets_you_conclude"]
            .as_array()
            .unwrap()
            .len()
            >= 2
    );
    assert!(
        report["conclusions"]["does_not"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().contains("kernel bug"))
    );
    assert_eq!(conversations_left(d.path()), 0);
}

#[test]
fn host_says_what_it_does_not_enforce_and_finds_the_callers_secret() {
    let d = tempfile::tempdir().unwrap();
    let (out, report) = acceptance(d.path(), "", "host");
    // Nothing the host claims fails: exit 0, with the rows it does not enforce said so.
    assert!(out.status.success(), "{report:#}");
    assert_eq!(report["runtime"], "host");
    for name in [
        "caller_secrets",
        "network_direct",
        "other_conversation",
        "cpu",
        "disk",
        "pids",
        "memory",
    ] {
        assert_eq!(
            verdict(&report, name),
            "not_enforced",
            "{:#}",
            row(&report, name)
        );
        assert_eq!(row(&report, name)["claimed"], false);
    }
    assert!(
        row(&report, "caller_secrets")["detail"]
            .as_str()
            .unwrap()
            .contains("/proc/")
    );
    assert!(
        row(&report, "other_conversation")["detail"]
            .as_str()
            .unwrap()
            .contains("B read it")
    );
    if is_root() {
        for name in ["user", "capabilities", "root_fs"] {
            assert_eq!(
                verdict(&report, name),
                "not_enforced",
                "{:#}",
                row(&report, name)
            );
        }
    }
    assert_eq!(verdict(&report, "timeout"), "pass");
    assert_eq!(verdict(&report, "ttl_reclaim"), "pass");
    let not = report["conclusions"]["does_not"][0].as_str().unwrap();
    assert!(not.starts_with("This runtime does not enforce:"), "{not}");
    assert_eq!(conversations_left(d.path()), 0);
}

#[test]
fn isolated_with_rlimits_only_and_no_quota_says_which_limits_it_no_longer_enforces() {
    if !is_root() {
        eprintln!("SKIPPED: the isolated runtime's uid per conversation needs root");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let config =
        "[isolated]\nidle_timeout_secs = 30\nlimits = \"rlimit\"\npids = 40\ndisk_bytes = 0\n";
    let (out, report) = acceptance(d.path(), config, "isolated");
    assert!(out.status.success(), "{report:#}");
    for name in ["cpu", "memory", "disk"] {
        assert_eq!(
            verdict(&report, name),
            "not_enforced",
            "{:#}",
            row(&report, name)
        );
    }
    // The PIDs limit is still in force (RLIMIT_NPROC of the conversation's own uid), and
    // measured against the value configured here.
    assert_eq!(verdict(&report, "pids"), "pass");
    let pids = row(&report, "pids")["detail"].as_str().unwrap();
    assert!(pids.starts_with("limit 40; tried 72,"), "{pids}");
    let not = report["conclusions"]["does_not"][0].as_str().unwrap();
    assert!(not.contains("cpu, disk"), "{not}");
    assert_eq!(conversations_left(d.path()), 0);
}
