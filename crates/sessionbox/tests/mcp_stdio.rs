//! `sessionbox mcp --conversation ID` (MCP over stdio) driven by the official MCP Python SDK
//! (`mcp` from PyPI, installed by scripts/test), on the host and the default isolated runtime;
//! then `sessionbox audit` reads back what the calls recorded.

use std::path::Path;
use std::process::Command;

use crate::exact;

fn drive(runtime: &str, data: &Path) {
    std::fs::write(
        data.join("sessionbox.toml"),
        "[isolated]\nidle_timeout_secs = 3\n",
    )
    .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_stdio.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_sessionbox"))
        .arg(data)
        .arg(runtime)
        .output()
        .expect("python3 runs (scripts/test installs the mcp package)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("OK"),
        "the MCP stdio client failed on {runtime}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn audit(data: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_sessionbox"))
        .arg("--data-dir")
        .arg(data)
        .args(["audit", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn operations(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r["operation"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn stdio_mcp_on_the_host_runtime_keeps_conversations_apart_and_is_audited() {
    let d = tempfile::tempdir().unwrap();
    drive("host", d.path());

    // Alice's calls are in the audit log, oldest last, and bob's are not among hers.
    let alice = audit(d.path(), &["--conversation", "alice"]);
    let ops = operations(&alice);
    for op in ["mcp.write", "mcp.bash", "mcp.edit", "mcp.read", "mcp.glob"] {
        assert!(ops.contains(&op.to_owned()), "{op} missing from {ops:?}");
    }
    assert!(!ops.contains(&"mcp.ls".to_owned()));
    let refused = alice
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["operation"] == "mcp.read" && r["outcome"] == "outside_workspace");
    assert!(refused.is_some(), "the refused read is audited: {alice:#}");
    // Never contents: alice's text is nowhere in the log.
    assert!(!alice.to_string().contains("secret"), "{alice:#}");
    let bob = operations(&audit(d.path(), &["--conversation", "bob"]));
    assert!(bob.contains(&"mcp.bash".to_owned()) && !bob.contains(&"mcp.edit".to_owned()));

    // --since in the future keeps nothing; a bad --since is a usage error (exit 2).
    assert!(
        audit(d.path(), &["--since", "2999-01-01T00:00:00Z"])
            .as_array()
            .unwrap()
            .is_empty()
    );
    let bad = Command::new(env!("CARGO_BIN_EXE_sessionbox"))
        .arg("--data-dir")
        .arg(d.path())
        .args(["audit", "--since", "yesterday"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("RFC 3339"));
}

#[test]
fn stdio_mcp_on_the_isolated_runtime_keeps_conversations_apart() {
    let d = tempfile::tempdir().unwrap();
    drive("isolated", d.path());
    let ops = operations(&audit(d.path(), &["--conversation", "bob"]));
    assert!(ops.contains(&"mcp.bash".to_owned()), "{ops:?}");
}

#[test]
fn audit_of_a_data_directory_without_a_store_is_empty_and_creates_nothing() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("never-used");
    let v = {
        let out = Command::new(env!("CARGO_BIN_EXE_sessionbox"))
            .arg("--data-dir")
            .arg(&data)
            .args(["audit", "--json"])
            .output()
            .unwrap();
        assert!(out.status.success());
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    assert_eq!(v, serde_json::json!([]));
    assert!(!data.exists(), "audit created the data directory");
}

/// Issue 15 on every runtime through the MCP `bash` tool, driven by the official Python SDK: a
/// stream that is not UTF-8 comes as a marker line and base64 that decodes to the exact bytes
/// (random bytes, NUL, invalid UTF-8, a split character, a tar archive compared with the one on
/// disk); UTF-8 comes as text. Cases of 8 KiB: the base64 must fit in one tool result.
#[test]
fn the_bash_tool_carries_the_exact_bytes_on_every_runtime() {
    for rt in exact::runtimes("mcp") {
        let work = tempfile::tempdir().unwrap();
        let cases = exact::cases(8192);
        let list: Vec<serde_json::Value> = cases
            .iter()
            .map(|c| serde_json::json!({"name": c.name, "command": c.command}))
            .collect();
        let cases_json = work.path().join("cases.json");
        std::fs::write(&cases_json, serde_json::to_vec(&list).unwrap()).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_stdio.py");
        let out = Command::new("python3")
            .arg(script)
            .arg(env!("CARGO_BIN_EXE_sessionbox"))
            .arg(&rt.data)
            .arg(rt.name)
            .arg("--exact")
            .arg(&cases_json)
            .arg(work.path())
            .output()
            .expect("python3 runs (scripts/test installs the mcp package)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.trim_end().ends_with("OK"),
            "the MCP stdio client failed on {}:\n{stdout}\n{}",
            rt.name,
            String::from_utf8_lossy(&out.stderr)
        );
        for case in &cases {
            let what = format!("{} {}", rt.name, case.name);
            let got_out = std::fs::read(work.path().join(format!("{}.out", case.name))).unwrap();
            let got_err = std::fs::read(work.path().join(format!("{}.err", case.name))).unwrap();
            let want = rt.expected("exact", case);
            if case.utf8 {
                // Text streams reach the model run together, ending in a newline.
                let mut all = want.clone();
                all.extend_from_slice(case.stderr);
                if !all.ends_with(b"\n") {
                    all.push(b'\n');
                }
                exact::assert_same(&what, &got_out, &all);
            } else {
                exact::assert_same(&what, &got_out, &want);
                exact::assert_same(&format!("{what} stderr"), &got_err, case.stderr);
            }
        }
        rt.destroy("exact");
    }
}
