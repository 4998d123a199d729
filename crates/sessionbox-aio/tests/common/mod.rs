//! Test support: the AIO test server (`tests/aio-server/server.py` at the repository root),
//! started per test on a free port, serving commands and files as this process's user. Tests
//! keep every workspace in a temporary directory they create.
//!
//! To run the scenarios against a live AIO Sandbox instead, set `AIO_SANDBOX_BASE_URL` (and
//! `AIO_SANDBOX_TOKEN` if it wants one); workspaces then go under `AIO_SANDBOX_TEST_ROOT`
//! (default `/tmp/sessionbox-aio-test`) inside the container. Tests that count requests always
//! use the local test server.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use sessionbox_aio::{AioConfig, AioRuntime, Endpoint, Secret};

const INSTALL_HINT: &str = "the AIO test server needs fastapi, uvicorn and python-multipart: run \
    scripts/test (which installs them) or `python3 -m pip install -r tests/aio-server/requirements.txt`";

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A running test server; killed on drop.
pub struct TestServer {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Where the server's own files live (its home).
    pub dir: tempfile::TempDir,
}

impl TestServer {
    /// Starts the server; `token` makes it require that token.
    pub fn start(token: Option<&str>) -> TestServer {
        let check = Command::new("python3")
            .args(["-c", "import fastapi, uvicorn, multipart"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run python3 ({e}); {INSTALL_HINT}"));
        assert!(
            check.status.success(),
            "{INSTALL_HINT}\n{}",
            String::from_utf8_lossy(&check.stderr)
        );
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new("python3");
        cmd.arg(repo().join("tests/aio-server/server.py"))
            .args(["--listen", "127.0.0.1:0", "--home"])
            .arg(dir.path())
            .current_dir(dir.path())
            .env_remove("AIO_TEST_SERVER_TOKEN")
            .stdout(Stdio::piped());
        if let Some(t) = token {
            cmd.env("AIO_TEST_SERVER_TOKEN", t);
        }
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("aio-test-server listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        TestServer { child, url, dir }
    }

    /// How many API requests the server has answered.
    pub async fn requests(&self) -> u64 {
        let body = reqwest::get(format!("{}/__test__/requests", self.url))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["requests"].as_u64().unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the runtime under test points, and what keeps it alive.
pub struct Target {
    /// The local server, unless a live one is configured.
    pub server: Option<TestServer>,
    /// The runtime's root (a temporary directory for the local server).
    pub root: String,
    /// Keeps the local root alive.
    pub _root_dir: Option<tempfile::TempDir>,
    /// The endpoint.
    pub endpoint: Endpoint,
}

impl Target {
    /// The live server when `AIO_SANDBOX_BASE_URL` is set, else a local test server.
    pub fn new() -> Target {
        match std::env::var("AIO_SANDBOX_BASE_URL") {
            Ok(url) if !url.is_empty() => {
                let endpoint = Endpoint::new(url).with_env_credentials().unwrap();
                let base = std::env::var("AIO_SANDBOX_TEST_ROOT")
                    .unwrap_or_else(|_| "/tmp/sessionbox-aio-test".into());
                let root = format!(
                    "{base}/{}-{}",
                    std::process::id(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_nanos()
                );
                Target {
                    server: None,
                    root,
                    _root_dir: None,
                    endpoint,
                }
            }
            _ => Target::local(None),
        }
    }

    /// Always the local test server (for tests that count its requests).
    pub fn local(token: Option<&str>) -> Target {
        let server = TestServer::start(token);
        let dir = tempfile::tempdir().unwrap();
        let root = dir
            .path()
            .join("conversations")
            .to_string_lossy()
            .into_owned();
        let mut endpoint = Endpoint::new(server.url.clone());
        endpoint.token = token.map(Secret::new);
        Target {
            server: Some(server),
            root,
            _root_dir: Some(dir),
            endpoint,
        }
    }

    /// A runtime on this target.
    pub fn runtime(&self) -> AioRuntime {
        let mut c = AioConfig::new(self.endpoint.clone());
        c.root = self.root.clone();
        AioRuntime::new(c).unwrap()
    }

    /// The local server; panics for a live target.
    pub fn server(&self) -> &TestServer {
        self.server.as_ref().expect("a local test server")
    }
}

/// What a byte-exactness case's stdout must be.
pub enum Expect {
    /// These bytes.
    Bytes(&'static [u8]),
    /// The bytes of this workspace file, which the command wrote too.
    File(&'static str),
}

/// The byte-exactness cases (issue 15): `(name, command, stdout, stderr)`. Random bytes
/// (compared with the copy the command wrote), NUL and invalid UTF-8 on both streams, a
/// character split across two writes 0.2 s apart, and a `tar czf -` archive of a directory
/// (compared with the archive `tee` wrote).
pub fn exact_cases() -> Vec<(&'static str, &'static str, Expect, &'static [u8])> {
    vec![
        (
            "random",
            "head -c 65536 /dev/urandom > r.bin && cat r.bin",
            Expect::File("r.bin"),
            b"",
        ),
        (
            "nul-invalid",
            r"printf 'a\000b\377\376c\n'; printf 'e\000\377' >&2",
            Expect::Bytes(b"a\0b\xff\xfec\n"),
            b"e\0\xff",
        ),
        (
            "split",
            r"printf '\342\202'; sleep 0.2; printf '\254\000\377'",
            Expect::Bytes(b"\xe2\x82\xac\x00\xff"),
            b"",
        ),
        (
            "tar",
            "rm -rf d && mkdir -p d/sub && head -c 20000 /dev/urandom > d/sub/x && \
             printf 'h\\342\\202\\254llo\\n' > d/y && tar czf - d | tee d.tgz",
            Expect::File("d.tgz"),
            b"",
        ),
        (
            "utf8",
            r"printf 'h\342\202\254llo\n'",
            Expect::Bytes("h€llo\n".as_bytes()),
            b"",
        ),
    ]
}
