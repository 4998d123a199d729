//! Conformance with the official OpenSandbox Python SDK (`opensandbox==1.1.1`): starts the agent
//! binary on a free TCP port on 127.0.0.1 and runs `tests/sdk_conformance.py` against it, once
//! without and once with an access token. Fails (never skips) when the SDK is not installed.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

const INSTALL_HINT: &str = "the official OpenSandbox Python SDK is not installed: run scripts/test \
    (which installs it) or `python3 -m pip install opensandbox==1.1.1`";

fn sdk_installed() {
    sessionbox_test_support::require_python_package(
        "opensandbox",
        "opensandbox",
        "1.1.1",
        INSTALL_HINT,
    );
}

fn run_conformance(token: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("workspace");
    std::fs::create_dir(&root).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sessionbox-agent"));
    cmd.args(["--listen", "tcp:127.0.0.1:0", "--idle-timeout", "120"])
        .arg("--root")
        .arg(&root)
        .stdout(Stdio::piped());
    if let Some(t) = token {
        let tf = dir.path().join("token");
        std::fs::write(&tf, t).unwrap();
        cmd.arg("--token-file").arg(tf);
    }
    let mut agent = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(agent.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("sessionbox-agent listening on tcp:")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk_conformance.py");
    let mut py = Command::new("python3");
    py.arg(&script).arg(format!("http://{addr}")).arg(&root);
    if let Some(t) = token {
        py.arg(t);
    }
    let out = py.output().unwrap();
    let _ = agent.kill();
    let _ = agent.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "sdk_conformance.py failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(stdout.contains("sdk conformance: ok"), "{stdout}");
    // Nothing escaped the workspace.
    let siblings: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let mut siblings = siblings;
    siblings.sort();
    let want: Vec<&str> = if token.is_some() {
        vec!["token", "workspace"]
    } else {
        vec!["workspace"]
    };
    assert_eq!(siblings, want);
}

#[test]
fn the_official_python_sdk_drives_the_agent() {
    sdk_installed();
    run_conformance(None);
}

#[test]
fn the_official_python_sdk_drives_the_agent_with_a_token() {
    sdk_installed();
    run_conformance(Some("sdk-token-5c1e"));
}
