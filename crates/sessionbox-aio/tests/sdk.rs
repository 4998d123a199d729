//! Conformance of the AIO test server with the official AIO Sandbox Python SDK
//! (`agent-sandbox==0.0.30`): runs `tests/aio-server/sdk_conformance.py` against the server,
//! once without and once with a token. Fails (never skips) when the SDK is not installed.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them); support modules are `pub` for the files that use them,
// and a test binary has no public API.
#![allow(clippy::unwrap_used, unreachable_pub)]

mod common;

use std::process::Command;

const INSTALL_HINT: &str = "the official AIO Sandbox Python SDK is not installed: run scripts/test \
    (which installs it) or `python3 -m pip install -r tests/aio-server/requirements.txt`";

fn sdk_installed() {
    let out = Command::new("python3")
        .args([
            "-c",
            "import agent_sandbox, importlib.metadata as m; print(m.version('agent-sandbox'))",
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 ({e}); {INSTALL_HINT}"));
    assert!(
        out.status.success(),
        "{INSTALL_HINT}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(
        version, "0.0.30",
        "agent-sandbox {version} is installed; {INSTALL_HINT}"
    );
}

fn run(token: Option<&str>) {
    sdk_installed();
    let server = common::TestServer::start(token);
    let scratch = tempfile::tempdir().unwrap();
    let mut py = Command::new("python3");
    py.arg(common::repo().join("tests/aio-server/sdk_conformance.py"))
        .arg(&server.url)
        .arg(scratch.path());
    if let Some(t) = token {
        py.arg(t);
    }
    let out = py.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "sdk_conformance.py failed ({:?})\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("sdk conformance: ok"), "{stdout}");
}

#[test]
fn official_sdk_runs_bash_and_file_calls_against_the_test_server() {
    run(None);
}

#[test]
fn official_sdk_authenticates_with_bearer_and_api_key_headers() {
    run(Some("conformance-token"));
}
