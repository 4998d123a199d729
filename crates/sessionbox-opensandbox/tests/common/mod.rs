//! Shared by the tests that need a real OpenSandbox server (`eval "$(scripts/opensandbox-up)"`).
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sessionbox_core::{ConversationId, ConversationRef, TenantId};
use sessionbox_opensandbox::{
    ApiKey, ClientConfig, OpenSandboxClient, OpenSandboxConfig, OpenSandboxRuntime,
};
use sessionbox_store::Store;

/// The server from `OPEN_SANDBOX_DOMAIN` / `OPEN_SANDBOX_API_KEY`. Without them: under
/// `CI=true` the test fails; elsewhere it is skipped with a note (run scripts/test, which starts
/// the server, to run it).
pub fn server() -> Option<(String, ApiKey)> {
    let domain = std::env::var("OPEN_SANDBOX_DOMAIN")
        .ok()
        .filter(|s| !s.is_empty());
    let key = std::env::var("OPEN_SANDBOX_API_KEY")
        .ok()
        .filter(|s| !s.is_empty());
    match (domain, key) {
        (Some(d), Some(k)) => Some((d, ApiKey::new(k).unwrap())),
        _ => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(
                !ci,
                "OPEN_SANDBOX_DOMAIN and OPEN_SANDBOX_API_KEY are not set: under CI the \
                 OpenSandbox tests must run (scripts/test starts the server with \
                 scripts/opensandbox-up)"
            );
            eprintln!(
                "SKIPPED: no OpenSandbox server configured (eval \"$(scripts/opensandbox-up)\")"
            );
            None
        }
    }
}

/// A unique instance name per test, so each test sees only its own sandboxes.
pub fn instance(test: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "t{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst),
        test
    )
}

pub fn client_config(domain: &str, key: ApiKey) -> ClientConfig {
    let mut c = ClientConfig::new(domain, Some(key));
    c.create_timeout = Duration::from_secs(180);
    c.request_timeout = Duration::from_secs(60);
    c
}

pub fn client(domain: &str, key: ApiKey) -> OpenSandboxClient {
    OpenSandboxClient::new(client_config(domain, key)).unwrap()
}

pub fn runtime_with(
    domain: &str,
    key: ApiKey,
    test: &str,
    edit: impl FnOnce(&mut OpenSandboxConfig),
) -> (OpenSandboxRuntime, Store) {
    let mut config = OpenSandboxConfig::new(client_config(domain, key), instance(test));
    config.timeout = Duration::from_secs(600);
    config
        .resource_limits
        .insert("memory".into(), "256Mi".into());
    edit(&mut config);
    let store = Store::open_in_memory().unwrap();
    (
        OpenSandboxRuntime::new(config, directory(store.clone())).unwrap(),
        store,
    )
}

/// A runtime with the defaults of [`runtime`] over `store` (a file-backed store, for tests
/// that need the conversation locks: an in-memory store has none).
pub fn runtime_in(domain: &str, key: ApiKey, test: &str, store: Store) -> OpenSandboxRuntime {
    let mut config = OpenSandboxConfig::new(client_config(domain, key), instance(test));
    config.timeout = Duration::from_secs(600);
    config
        .resource_limits
        .insert("memory".into(), "256Mi".into());
    OpenSandboxRuntime::new(config, directory(store)).unwrap()
}

pub fn runtime(domain: &str, key: ApiKey, test: &str) -> (OpenSandboxRuntime, Store) {
    runtime_with(domain, key, test, |_| {})
}

pub fn conv(id: &str) -> ConversationRef {
    ConversationRef::new(
        TenantId::new("default").unwrap(),
        ConversationId::new(id).unwrap(),
    )
}

/// Asserts that the server holds no sandbox of `rt`'s instance.
pub async fn assert_nothing_left(rt: &OpenSandboxRuntime) {
    let left = rt.server_inventory().await.unwrap();
    assert!(
        left.is_empty(),
        "sandboxes of ours left on the server: {:?}",
        left.iter().map(|s| &s.id).collect::<Vec<_>>()
    );
}

/// The runtime's view of `store`: the manager's one `Directory`.
pub fn directory(store: Store) -> std::sync::Arc<dyn sessionbox_core::Directory> {
    std::sync::Arc::new(sessionbox_manager::StoreDirectory::new(store))
}

/// The state directory of the shared server's installation (`scripts/opensandbox-up`:
/// `OPENSANDBOX_STATE`, by default `${XDG_CACHE_HOME:-~/.cache}/sessionbox/opensandbox`).
fn server_state() -> std::path::PathBuf {
    if let Some(s) = std::env::var_os("OPENSANDBOX_STATE").filter(|s| !s.is_empty()) {
        return s.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|s| !s.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache")))
        .expect("HOME or XDG_CACHE_HOME");
    cache.join("sessionbox/opensandbox")
}

/// A private OpenSandbox server, for tests that kill and restart the server: the shared
/// server's installation (its virtual environment and configuration, under
/// [`server_state`]) started on a port of its own with a store of its own, on the same Docker
/// engine, so the shared server keeps serving the other tests. Killed when dropped.
///
/// At its start a server rebuilds the expiry timers of every sandbox on the engine and deletes
/// egress sidecars whose sandbox container does not exist: one being made by another server
/// at that moment would go. Tests that make sidecar sandboxes hold [`SIDECARS`] while they
/// make them, and [`PrivateServer`] holds it while the server starts.
pub struct PrivateServer {
    /// Its base URL.
    pub domain: String,
    exe: std::path::PathBuf,
    config: std::path::PathBuf,
    log: std::path::PathBuf,
    child: Option<std::process::Child>,
    _dir: tempfile::TempDir,
}

/// Held while sandboxes with an egress sidecar are made, and while a [`PrivateServer`]
/// starts (see there).
pub static SIDECARS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl PrivateServer {
    /// Starts one from the shared server's installation; `None` when no server is configured
    /// (see [`server`]: under `CI=true` that fails the test).
    pub async fn start() -> Option<PrivateServer> {
        server()?;
        let state = server_state();
        let exe = state.join("venv/bin/opensandbox-server");
        let shared = std::fs::read_to_string(state.join("config.toml")).unwrap_or_else(|e| {
            panic!(
                "cannot read the shared OpenSandbox server's configuration in {} ({e}): run \
                 scripts/opensandbox-up, with OPENSANDBOX_STATE set as it was then",
                state.display()
            )
        });
        let dir = tempfile::tempdir().unwrap();
        let port = sessionbox_test_support::free_port();
        // The same settings, but its own port and store.
        let config: String = shared
            .lines()
            .map(|l| {
                if l.starts_with("port = ") {
                    format!("port = {port}\n")
                } else if l.starts_with("path = ") {
                    format!("path = {:?}\n", dir.path().join("server.db"))
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        let path = dir.path().join("config.toml");
        {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .create_new(true)
                .write(true)
                .mode(0o600)
                .open(&path)
                .unwrap();
            std::io::Write::write_all(&mut f, config.as_bytes()).unwrap();
        }
        let mut s = PrivateServer {
            domain: format!("http://127.0.0.1:{port}"),
            exe,
            config: path,
            log: dir.path().join("server.log"),
            child: None,
            _dir: dir,
        };
        s.restart().await;
        Some(s)
    }

    /// Starts it again (after [`PrivateServer::kill`]) and waits until it is healthy.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "the private server runs already");
        let _sidecars = SIDECARS.lock().await;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = std::process::Command::new(&self.exe)
            .arg("--config")
            .arg(&self.config)
            .current_dir(self.config.parent().unwrap())
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.exe.display()));
        self.child = Some(child);
        let http = reqwest::Client::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let healthy = http
                .get(format!("{}/health", self.domain))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if healthy {
                return;
            }
            let exited = self.child.as_mut().unwrap().try_wait().unwrap();
            if exited.is_some() || std::time::Instant::now() > deadline {
                panic!(
                    "the private OpenSandbox server did not come up ({exited:?}): {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills it with `SIGKILL` (a crash: nothing of its own shutdown runs) and collects it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A TCP relay on 127.0.0.1 in front of `to` (`HOST:PORT`): every connection is passed on,
/// byte for byte, until [`Relay::cut`] drops all of them at once (as a proxy that gives up
/// does); new connections are relayed again afterwards.
pub struct Relay {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    live: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(to: String) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let live = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let l = live.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let to = to.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(&to).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                let mut live = l.lock().unwrap();
                live.retain(|h: &tokio::task::AbortHandle| !h.is_finished());
                live.push(task.abort_handle());
            }
        });
        Relay { url, live, accept }
    }

    /// Drops every connection it relays now; returns how many.
    pub fn cut(&self) -> usize {
        let live = std::mem::take(&mut *self.live.lock().unwrap());
        let n = live.iter().filter(|h| !h.is_finished()).count();
        for h in live {
            h.abort();
        }
        n
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
