//! TLS for [`crate::serve`]: a listener that completes each TLS handshake on a task of its
//! own and hands axum finished streams, and a certificate that can be replaced while the server
//! runs.
//!
//! The certificate chain and private key are PEM files. [`ReloadingCert`] holds the pair in use;
//! [`ReloadingCert::reload`] reads the files again and swaps the new pair in only when it
//! parses and its key matches its certificate, so a bad or half-written pair is reported and the
//! old one keeps serving. Each new handshake asks for the pair in use, so new connections get
//! the new certificate and open connections keep theirs. [`watch`] reloads on SIGHUP and when
//! either file's size, modification time or inode changes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sessionbox_core::{Error, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

/// How long a client has to finish its TLS handshake before its connection is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Most TLS handshakes in progress at once; further connections wait to be accepted.
pub const MAX_HANDSHAKES: usize = 256;

/// How often `sessionbox serve` has [`watch`] look at the certificate and key files by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);

/// The crypto provider of every TLS server here: ring.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A size, modification time and inode of a file, to notice that it was replaced.
type Stamp = Option<(u64, SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?, m.ino()))
}

/// The certificate chain and key a TLS server presents, read from two PEM files and replaceable
/// while it serves (see the module documentation).
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' stamps when they were last read (successfully or not).
    seen: Mutex<(Stamp, Stamp)>,
    provider: Arc<CryptoProvider>,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// Reads the certificate chain (`cert`: one or more PEM `CERTIFICATE` blocks, the server's
    /// own first) and its private key (`key`: PEM PKCS#8, PKCS#1 or SEC1).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the file that cannot be read or parsed, or saying that
    /// the key does not belong to the certificate. Key material never appears in it.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<ReloadingCert>> {
        let provider = provider();
        let seen = (stamp(cert), stamp(key));
        let pair = read_pair(cert, key, &provider)?;
        Ok(Arc::new(ReloadingCert {
            cert_path: cert.to_owned(),
            key_path: key.to_owned(),
            current: RwLock::new(Arc::new(pair)),
            seen: Mutex::new(seen),
            provider,
        }))
    }

    /// Reads both files again and puts the new pair in use for new connections.
    ///
    /// # Errors
    /// As [`ReloadingCert::load`]; the pair in use then stays.
    pub fn reload(&self) -> Result<()> {
        let seen = (stamp(&self.cert_path), stamp(&self.key_path));
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = seen;
        let pair = read_pair(&self.cert_path, &self.key_path, &self.provider)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(pair);
        Ok(())
    }

    /// Whether either file changed (size, modification time or inode) since it was last read.
    pub fn changed_on_disk(&self) -> bool {
        let now = (stamp(&self.cert_path), stamp(&self.key_path));
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) != now
    }

    /// The DER of the certificate served now (the chain's first).
    pub fn served_certificate(&self) -> Vec<u8> {
        let pair = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        pair.cert.first().map(|c| c.to_vec()).unwrap_or_default()
    }

    /// A rustls server configuration that presents this certificate (whatever it is at each
    /// handshake), speaks HTTP/1.1 only (ALPN `http/1.1`) and asks no client certificate.
    ///
    /// # Errors
    /// [`Error::Backend`] if the provider supports no TLS version (it does).
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Backend(format!("cannot configure TLS: {e}")))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

fn read_file(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        Error::InvalidRequest(format!(
            "cannot read the TLS {what} file {}: {e}",
            path.display()
        ))
    })
}

fn read_pair(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey> {
    let cert_pem = read_file(cert, "certificate")?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| {
            Error::InvalidRequest(format!(
                "the TLS certificate file {} is not PEM: {e}",
                cert.display()
            ))
        })?;
    if chain.is_empty() {
        return Err(Error::InvalidRequest(format!(
            "the TLS certificate file {} holds no CERTIFICATE block",
            cert.display()
        )));
    }
    let key_pem = read_file(key, "key")?;
    // Not the parser's message: it may quote a line of the file.
    let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        let why = match e {
            rustls::pki_types::pem::Error::NoItemsFound => "holds no PEM private key",
            _ => "is not valid PEM",
        };
        Error::InvalidRequest(format!("the TLS key file {} {why}", key.display()))
    })?;
    CertifiedKey::from_der(chain, private, provider).map_err(|e| {
        Error::InvalidRequest(format!(
            "the TLS key {} does not fit the certificate {}: {e}",
            key.display(),
            cert.display()
        ))
    })
}

/// Reloads `cert` on every SIGHUP and, with `poll` (say [`DEFAULT_POLL_INTERVAL`]), whenever
/// its files change (looked at every `poll`), until the returned task is aborted. A reload that
/// fails is logged as a warning and the pair in use stays; one that succeeds is logged at info.
///
/// # Errors
/// When the SIGHUP handler cannot be installed.
pub fn watch(
    cert: Arc<ReloadingCert>,
    poll: Option<Duration>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        // Without polling, a tick that never comes.
        let mut tick = tokio::time::interval(poll.unwrap_or(Duration::from_secs(86_400 * 365)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is at once: the files were just read
        loop {
            let why = tokio::select! {
                _ = hup.recv() => "SIGHUP",
                _ = tick.tick(), if poll.is_some() => {
                    if !cert.changed_on_disk() {
                        continue;
                    }
                    "a changed file"
                }
            };
            let c = cert.clone();
            let done = tokio::task::spawn_blocking(move || c.reload()).await;
            match done {
                Ok(Ok(())) => tracing::info!(
                    cert = %cert.cert_path.display(),
                    reason = why,
                    "reloaded the TLS certificate"
                ),
                Ok(Err(e)) => tracing::warn!(
                    reason = why,
                    error = %e,
                    "the new TLS certificate was not loaded; the previous one stays in use"
                ),
                Err(e) => tracing::warn!(error = %e, "reloading the TLS certificate failed"),
            }
        }
    }))
}

/// A TCP listener whose connections are TLS streams, for [`axum::serve()`]. Handshakes run on
/// tasks of their own (at most [`MAX_HANDSHAKES`] at once, each within
/// [`HANDSHAKE_TIMEOUT`], at most [`MAX_HANDSHAKES_PER_SOURCE`] from one source), so a slow
/// client holds up no other; failed handshakes are logged at
/// debug and dropped.
#[derive(Debug)]
pub struct TlsListener {
    ready: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    acceptor: tokio::task::JoinHandle<()>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl TlsListener {
    /// Serves TLS with `config` on `listener`.
    ///
    /// # Errors
    /// When the listener's address cannot be read.
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, ready) = tokio::sync::mpsc::channel(64);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        let handshaking = Arc::new(Handshaking::default());
        let acceptor = tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        accept_error(e).await;
                        continue;
                    }
                };
                // One source gets a few handshakes at once, not the whole pool: a client that
                // opens connections and never says hello would hold every slot for their
                // timeout, and no one else could connect.
                let Some(place) = handshaking.enter(crate::connections::source_of(peer.ip()))
                else {
                    drop(tcp);
                    continue;
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _place = place;
                    let _ = tcp.set_nodelay(true);
                    let shake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                    let stream = match shake.await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                    drop(slot);
                    let _ = tx.send((stream, peer)).await;
                });
            }
        });
        Ok(TlsListener {
            ready,
            local,
            acceptor,
        })
    }
}

/// Most TLS handshakes one source (an IPv4 address, an IPv6 /64) may have in flight at once.
pub const MAX_HANDSHAKES_PER_SOURCE: usize = 16;

/// Handshakes in flight per source.
#[derive(Debug, Default)]
struct Handshaking {
    sources: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

/// One handshake's place in its source's count, given back when dropped.
struct HandshakePlace {
    of: Arc<Handshaking>,
    source: std::net::IpAddr,
}

impl Handshaking {
    fn enter(self: &Arc<Self>, source: std::net::IpAddr) -> Option<HandshakePlace> {
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        let n = sources.entry(source).or_default();
        if *n >= MAX_HANDSHAKES_PER_SOURCE {
            return None;
        }
        *n += 1;
        Some(HandshakePlace {
            of: self.clone(),
            source,
        })
    }
}

impl Drop for HandshakePlace {
    fn drop(&mut self) {
        let mut sources = self.of.sources.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = sources.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                sources.remove(&self.source);
            }
        }
    }
}

/// What axum's own listener does with an accept error: a connection's error is the client's
/// business; anything else (out of file descriptors) waits a second before the next try.
async fn accept_error(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accepting a connection failed");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task ended (only when the runtime shuts down): no more connections.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
