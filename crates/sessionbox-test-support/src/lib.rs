//! Helpers the integration tests of several sessionbox crates share (codex's `*_test_support`
//! crates): processes that announce their address on their first line of stdout, a
//! `sessionbox serve` on a free port, the AIO test server, checks that an official Python SDK is
//! installed, a free TCP port, and a listener inside a network namespace. Only std and rustix,
//! so it adds next to nothing to a test binary's link.
//!
//! Every helper panics on failure, with a message saying what to install or run: these are
//! test helpers, and a panic is a test failure.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The workspace root (the directory of the root `Cargo.toml`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Reads the first line `child` writes to its (piped) stdout and returns what follows
/// `prefix` on it, trimmed: the address a server announces once it accepts connections.
/// Panics when the line does not start with `prefix`, adding `hint` (what the server needs).
pub fn announced(child: &mut Child, prefix: &str, hint: &str) -> String {
    let stdout = child
        .stdout
        .take()
        .expect("the child's stdout is piped (Stdio::piped())");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the first line of the child's stdout");
    line.trim()
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("unexpected first line {line:?}, not {prefix:?}...{hint}"))
        .to_owned()
}

/// Spawns `cmd` with stdout piped and returns the child and the address it announced after
/// `prefix` (see [`announced`]). Panics, with `hint`, when it cannot be spawned.
pub fn spawn_announced(cmd: &mut Command, prefix: &str, hint: &str) -> (Child, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}{hint}"));
    let address = announced(&mut child, prefix, hint);
    (child, address)
}

/// `EXE --data-dir DATA GLOBAL_ARGS... serve --listen 127.0.0.1:0`, with the environment
/// variables that would override the data directory's settings (`SESSIONBOX_RUNTIME`,
/// `SESSIONBOX_TENANT`, `SESSIONBOX_LISTEN`) removed, stdin empty and stderr inherited. `exe`
/// is the test's `env!("CARGO_BIN_EXE_sessionbox")`. Add environment variables, then start it
/// with [`spawn_serve`].
pub fn serve_command(exe: &str, data: &Path, global_args: &[&str]) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg("--data-dir")
        .arg(data)
        .args(global_args)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("SESSIONBOX_RUNTIME")
        .env_remove("SESSIONBOX_TENANT")
        .env_remove("SESSIONBOX_LISTEN")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    cmd
}

/// Starts a [`serve_command`] and returns it with its base URL, read from its
/// `listening on URL` line.
pub fn spawn_serve(cmd: &mut Command) -> (Child, String) {
    spawn_announced(cmd, "listening on ", "")
}

/// What the AIO test server needs, for its failure messages.
const AIO_HINT: &str = " (python3 needs fastapi, uvicorn and python-multipart: scripts/test \
    installs them)";

/// `python3 tests/aio-server/server.py --listen 127.0.0.1:0 --home HOME`, run in `home`, without
/// `AIO_TEST_SERVER_TOKEN` (set it on the command for a server that wants a token). Start it with
/// [`spawn_aio_server`].
pub fn aio_server_command(home: &Path) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(repo_root().join("tests/aio-server/server.py"))
        .args(["--listen", "127.0.0.1:0", "--home"])
        .arg(home)
        .current_dir(home)
        .env_remove("AIO_TEST_SERVER_TOKEN");
    cmd
}

/// Starts `cmd`, an [`aio_server_command`], and returns the server and its URL (from its
/// `aio-test-server listening on URL` line). The caller kills it.
pub fn spawn_aio_server(cmd: &mut Command) -> (Child, String) {
    spawn_announced(cmd, "aio-test-server listening on ", AIO_HINT)
}

/// The AIO test server (`tests/aio-server/server.py`, built from the AIO spec) on a free port
/// with its home in `home`, without a token: the server and its URL. The caller kills it.
pub fn start_aio_server(home: &Path) -> (Child, String) {
    spawn_aio_server(&mut aio_server_command(home))
}

/// Asserts that python3 can import `module` and that the installed distribution `dist` is at
/// `version` (the official SDK a conformance test drives); otherwise panics with `hint` (how to
/// install it). Never skips: a missing SDK is a failure.
pub fn require_python_package(module: &str, dist: &str, version: &str, hint: &str) {
    let check = format!("import {module}, importlib.metadata as m; print(m.version('{dist}'))");
    let out = Command::new("python3")
        .args(["-c", &check])
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 ({e}); {hint}"));
    assert!(
        out.status.success(),
        "{hint}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let installed = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(
        installed, version,
        "{dist} {installed} is installed; {hint}"
    );
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bound, then released): for a server
/// that must be given a port, or an address where nothing listens.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// A non-blocking TCP listener on `addr` inside the network namespace `/run/netns/NETNS` (made
/// with `ip netns add`; needs root). It is bound on a thread of its own that enters the
/// namespace, so the caller's threads stay where they are; a socket stays in the namespace it
/// was made in, whichever thread uses it later (`tokio::net::TcpListener::from_std` takes it).
pub fn bind_in_netns(netns: &str, addr: SocketAddr) -> TcpListener {
    let path = format!("/run/netns/{netns}");
    let listener = std::thread::spawn(move || {
        use std::os::fd::AsFd;
        let f = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        rustix::thread::move_into_link_name_space(
            f.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .unwrap_or_else(|e| panic!("enter {path}: {e}"));
        TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr} in {path}: {e}"))
    })
    .join()
    .expect("the thread binding in the namespace panicked");
    listener
        .set_nonblocking(true)
        .expect("make the listener non-blocking");
    listener
}

/// The address of the Docker bridge on this host (`docker0`), which containers reach.
///
/// # Panics
/// Without a `docker0` address (dockerd is not running).
pub fn docker_bridge() -> std::net::Ipv4Addr {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "docker0"])
        .output()
        .expect("run ip");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no docker0 address (is dockerd running?): {text}"))
}

/// Makes every later panic of this test process print its message and place to the process's
/// own standard error as well, once per process.
///
/// libtest captures what a test prints, and a CI log that keeps only part of a long run loses
/// the failure section at its end; a line written straight to file descriptor 2 lands next to
/// the `FAILED` line instead. The default hook still runs after it.
pub fn echo_panics_to_stderr() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            use std::io::Write as _;
            let thread = std::thread::current();
            let _ = writeln!(
                std::io::stderr().lock(),
                "PANIC in {}: {info}",
                thread.name().unwrap_or("a test thread")
            );
            previous(info);
        }));
    });
}
