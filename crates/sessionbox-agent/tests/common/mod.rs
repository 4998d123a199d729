//! Test support: an agent in this process on a Unix socket in a temporary directory, a client
//! for it, and a raw HTTP/1.1 helper for what the client cannot send.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sessionbox_agent::{Agent, AgentConfig, Listen};
use sessionbox_execd::ExecdClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A running in-process agent.
pub struct TestAgent {
    pub dir: tempfile::TempDir,
    /// The workspace root (also how paths are presented).
    pub root: PathBuf,
    /// A directory next to the workspace: "outside".
    pub outside: PathBuf,
    pub socket: PathBuf,
    pub client: ExecdClient,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<sessionbox_core::Result<()>>>,
}

impl TestAgent {
    /// An agent with the defaults.
    pub async fn start() -> TestAgent {
        Self::start_with(|_| {}).await
    }

    /// An agent whose configuration `tweak` may change.
    pub async fn start_with(tweak: impl FnOnce(&mut AgentConfig)) -> TestAgent {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&outside).unwrap();
        let socket = dir.path().join("agent.sock");
        let mut config = AgentConfig::new(&root);
        config.listen = Listen::Unix(socket.clone());
        tweak(&mut config);
        let token = config.token.clone();
        let agent = Agent::bind(config).await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(agent.run(async {
            let _ = rx.await;
        }));
        let mut b = ExecdClient::builder(sessionbox_execd::Endpoint::Unix(socket.clone()));
        if let Some(t) = token {
            b = b.token(t);
        }
        TestAgent {
            dir,
            root,
            outside,
            socket,
            client: b.build().unwrap(),
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// The presented path of `rel` inside the workspace.
    pub fn path(&self, rel: &str) -> String {
        format!("{}/{rel}", self.root.display())
    }

    /// Stops the agent and waits for it.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap().unwrap();
        }
    }

    /// A raw HTTP/1.1 exchange on the agent's socket.
    pub async fn raw(&self, request: &[u8]) -> RawResponse {
        raw_unix(&self.socket, request).await
    }
}

/// A parsed raw response.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// Header lines, lower-cased names.
    pub headers: Vec<(String, String)>,
    /// The body as sent (not de-chunked).
    pub body: Vec<u8>,
    /// Time from sending to EOF.
    pub elapsed: Duration,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends `request` (which should say `Connection: close`) and reads to EOF.
pub async fn raw_unix(socket: &Path, request: &[u8]) -> RawResponse {
    let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
    let started = Instant::now();
    s.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf))
        .await
        .expect("the agent closes the connection")
        .unwrap();
    let elapsed = started.elapsed();
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    RawResponse {
        status,
        headers,
        body: buf[split + 4..].to_vec(),
        elapsed,
    }
}

/// `METHOD PATH` with a body and extra header lines, `Connection: close`.
pub fn request(method: &str, path: &str, extra_headers: &[&str], body: &[u8]) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n");
    for h in extra_headers {
        r.push_str(h);
        r.push_str("\r\n");
    }
    r.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut out = r.into_bytes();
    out.extend_from_slice(body);
    out
}

/// True while `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s.rsplit(')').next().unwrap_or("").split_whitespace().next();
            state != Some("Z") && state != Some("X")
        }
        Err(_) => false,
    }
}

/// Waits up to `limit` for `f` to hold.
pub async fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

/// Reads pids (one per line) from `path` once it has `n` of them.
pub async fn read_pids(path: &Path, n: usize) -> Vec<u32> {
    let mut pids = Vec::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            pids = std::fs::read_to_string(path)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            pids.len() >= n
        })
        .await,
        "the command wrote {n} pids to {}",
        path.display()
    );
    pids
}
