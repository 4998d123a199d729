//! The byte-exactness matrix of issue 15, shared by the front-end tests (`cli.rs`, `serve.rs`,
//! `mcp_stdio.rs`): one data directory per runtime (`host`, `isolated`, `aio` against the AIO
//! test server, `opensandbox` against the real server from `scripts/opensandbox-up`), and the
//! cases every front end must carry byte for byte.
//!
//! The `opensandbox` runtime is left out when `OPEN_SANDBOX_DOMAIN`/`OPEN_SANDBOX_API_KEY` are
//! not set, except under CI, where that is a failure.

#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use sha2::{Digest, Sha256};

/// One runtime's data directory, with the AIO test server it needs (killed on drop).
pub struct RuntimeUnderTest {
    /// `host`, `isolated`, `aio` or `opensandbox`.
    pub name: &'static str,
    /// The data directory; its `sessionbox.toml` selects the runtime.
    pub data: PathBuf,
    _dir: tempfile::TempDir,
    aio: Option<Child>,
}

impl Drop for RuntimeUnderTest {
    fn drop(&mut self) {
        if let Some(c) = &mut self.aio {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl RuntimeUnderTest {
    /// `sessionbox --data-dir DATA ARGS...` with `stdin`.
    pub fn run(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sessionbox"))
            .arg("--data-dir")
            .arg(&self.data)
            .args(args)
            .env_remove("SESSIONBOX_RUNTIME")
            .env_remove("SESSIONBOX_TENANT")
            .env_remove("SESSIONBOX_LISTEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sessionbox");
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().expect("wait sessionbox")
    }

    /// `sessionbox read -c CONV PATH`, which must succeed: the file's bytes.
    pub fn read(&self, conv: &str, path: &str) -> Vec<u8> {
        let out = self.run(&["read", "-c", conv, path], b"");
        assert!(
            out.status.success(),
            "{}: read {path}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// What a case's stdout must be in conversation `conv` (after the case ran there).
    pub fn expected(&self, conv: &str, case: &Case) -> Vec<u8> {
        match &case.stdout {
            Expect::Bytes(b) => b.clone(),
            Expect::File(f) => self.read(conv, f),
        }
    }

    /// Destroys a conversation (remote sandboxes are not left behind).
    pub fn destroy(&self, conv: &str) {
        let out = self.run(&["destroy", "-c", conv], b"");
        assert!(
            out.status.success(),
            "{}: destroy: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Starts the AIO test server (`tests/aio-server/server.py`) with its home in `home`; returns it
/// and its URL.
pub use sessionbox_test_support::start_aio_server;

/// Every runtime this machine can run, each in a data directory of its own. `tag` names the
/// opensandbox instance (one per test).
pub fn runtimes(tag: &str) -> Vec<RuntimeUnderTest> {
    let mut all = Vec::new();
    for name in ["host", "isolated", "aio", "opensandbox"] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let mut aio = None;
        let config = match name {
            "host" => "runtime = \"host\"\n".to_owned(),
            "isolated" => "runtime = \"isolated\"\n[isolated]\nidle_timeout_secs = 3\n".to_owned(),
            "aio" => {
                let home = dir.path().join("aio-home");
                std::fs::create_dir_all(&home).unwrap();
                let (server, url) = start_aio_server(&home);
                aio = Some(server);
                format!(
                    "runtime = \"aio\"\n[aio]\nendpoint = \"{url}\"\nroot = \"{}\"\n",
                    home.join("conversations").display()
                )
            }
            _ => {
                let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.is_empty());
                if !(set("OPEN_SANDBOX_DOMAIN") && set("OPEN_SANDBOX_API_KEY")) {
                    assert!(
                        !ci(),
                        "OPEN_SANDBOX_DOMAIN and OPEN_SANDBOX_API_KEY are not set: under CI the \
                         OpenSandbox tests must run (scripts/test starts the server)"
                    );
                    eprintln!(
                        "SKIPPED opensandbox: no OpenSandbox server configured \
                         (eval \"$(scripts/opensandbox-up)\")"
                    );
                    continue;
                }
                format!(
                    "runtime = \"opensandbox\"\n[opensandbox]\nmemory = \"256Mi\"\n\
                     timeout_secs = 300\ninstance = \"t{}-exact-{tag}\"\n",
                    std::process::id()
                )
            }
        };
        std::fs::write(data.join("sessionbox.toml"), config).unwrap();
        all.push(RuntimeUnderTest {
            name,
            data,
            _dir: dir,
            aio,
        });
    }
    all
}

/// What a case's stdout must be.
pub enum Expect {
    /// These bytes.
    Bytes(Vec<u8>),
    /// The bytes of this workspace file, which the command wrote too.
    File(&'static str),
}

/// One command and the bytes it must give.
pub struct Case {
    pub name: &'static str,
    pub command: String,
    pub stdout: Expect,
    pub stderr: &'static [u8],
    /// True when stdout is valid UTF-8 (the APIs then send no base64).
    pub utf8: bool,
}

/// The cases: `random` bytes of /dev/urandom (compared with the copy the command wrote), NUL
/// and invalid UTF-8 on both streams, a character split across two writes 0.2 s apart, a
/// `tar czf -` archive (compared with the one `tee` wrote; `random` bytes of noise in it), and
/// valid UTF-8 text.
pub fn cases(random: usize) -> Vec<Case> {
    vec![
        Case {
            name: "random",
            command: format!("head -c {random} /dev/urandom > r.bin && cat r.bin"),
            stdout: Expect::File("r.bin"),
            stderr: b"",
            utf8: false,
        },
        Case {
            name: "nul-invalid",
            command: r"printf 'a\000b\377\376c\n'; printf 'e\000\377' >&2".into(),
            stdout: Expect::Bytes(b"a\0b\xff\xfec\n".to_vec()),
            stderr: b"e\0\xff",
            utf8: false,
        },
        Case {
            name: "split",
            command: r"printf '\342\202'; sleep 0.2; printf '\254\000\377'".into(),
            stdout: Expect::Bytes(b"\xe2\x82\xac\x00\xff".to_vec()),
            stderr: b"",
            utf8: false,
        },
        Case {
            name: "tar",
            command: format!(
                "rm -rf d && mkdir -p d/sub && head -c {random} /dev/urandom > d/sub/x && \
                 printf 'h\\342\\202\\254llo\\n' > d/y && tar czf - d | tee d.tgz"
            ),
            stdout: Expect::File("d.tgz"),
            stderr: b"",
            utf8: false,
        },
        Case {
            name: "utf8",
            command: r"printf 'h\342\202\254llo\n'; printf '\342\202\254' >&2".into(),
            stdout: Expect::Bytes("h€llo\n".as_bytes().to_vec()),
            stderr: "€".as_bytes(),
            utf8: true,
        },
    ]
}

/// Hex SHA-256.
pub fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// Asserts `got == want`, comparing SHA-256 (and lengths) so a failure stays readable.
pub fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(
        (got.len(), sha256_hex(got)),
        (want.len(), sha256_hex(want)),
        "{what}: the bytes differ (got {:?}...)",
        &got[..got.len().min(16)]
    );
}

/// Standard base64 (padded) decoded; panics on anything else.
pub fn base64_decode(s: &str) -> Vec<u8> {
    fn val(c: u8) -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c:?}"),
        }
    }
    let s = s.trim().as_bytes();
    assert!(s.len().is_multiple_of(4), "base64 of a bad length");
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for q in s.chunks(4) {
        let pad = q.iter().rev().take_while(|&&c| c == b'=').count();
        let mut n = 0u32;
        for &c in &q[..4 - pad] {
            n = (n << 6) | val(c);
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    out
}
