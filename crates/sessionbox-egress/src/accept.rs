//! The gateway's accept loops and its connection caps ([`GatewayConfig::max_connections`], and
//! on a token gateway [`GatewayConfig::max_connections_per_source`]): permits, the answer to a
//! connection over a cap, the once-per-episode log of refusals and of accept errors, and the
//! descriptor limit that keeps `EMFILE` away.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::gateway::{Auth, Gateway, GatewayConfig, HTTP_BUF};

/// The connection cap and what is logged about it: once when it is first hit, once when a
/// connection is admitted again; the same for accept errors.
pub(crate) struct Admission {
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) max: usize,
    /// Who is served, for the log: `conversation <key prefix>` or `the token gateway`.
    who: String,
    /// At the cap since the last admitted connection.
    saturated: AtomicBool,
    /// Connections refused in the current episode.
    refused: AtomicU64,
    /// `accept` failing since the last connection accepted.
    accept_failing: AtomicBool,
    /// Over-cap connections being answered ([`REFUSALS_IN_FLIGHT`]).
    refusals: Arc<Semaphore>,
    /// The per-source cap of a token gateway (`None` on a conversation's own gateway, whose
    /// every connection comes from its one sandbox).
    sources: Option<Arc<Sources>>,
}

/// Connections held per source address, against [`GatewayConfig::max_connections_per_source`].
/// A token gateway serves many sandboxes, each from its own address: without this one sandbox
/// could hold every permit, unauthenticated even, and the others would get `503`.
struct Sources {
    max: usize,
    held: Mutex<HashMap<IpAddr, Source>>,
}

/// One source's connections, and whether its refusal at the cap has been logged since it was
/// last below it (one line per source per episode, whatever other sources do).
#[derive(Default)]
struct Source {
    connections: usize,
    warned: bool,
}

/// What [`Sources::take`] says of a connection from one address.
enum Taken {
    Admitted,
    /// At the cap: `true` the first time in this episode (to be logged).
    Refused(bool),
}

impl Sources {
    /// Counts one more connection from `ip`, unless it is at the cap.
    fn take(&self, ip: IpAddr) -> Taken {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let source = held.entry(ip).or_default();
        if source.connections >= self.max {
            return Taken::Refused(!std::mem::replace(&mut source.warned, true));
        }
        source.connections += 1;
        Taken::Admitted
    }

    fn give_back(&self, ip: IpAddr) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(source) = held.get_mut(&ip) {
            source.connections -= 1;
            source.warned = false;
            if source.connections == 0 {
                held.remove(&ip);
            }
        }
    }
}

/// What one admitted connection holds: a permit of the gateway's cap, and its place under its
/// source's cap (given back on drop).
pub(crate) struct Permit {
    _permit: OwnedSemaphorePermit,
    source: Option<(Arc<Sources>, IpAddr)>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some((sources, ip)) = &self.source {
            sources.give_back(*ip);
        }
    }
}

/// What a connection holds while it is served: its permit, shared by the tasks that serve
/// it (the client connection, then its tunnel or the forwarded request's target connection).
pub(crate) type Hold = Arc<Permit>;

/// What a connection over the cap is told before it is closed.
pub(crate) const OVER_CAP: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\ncontent-length: 75\r\n\r\nsessionbox egress: refused: too many connections at once; close some first\n";

/// Most over-cap connections being answered at once; past it one is closed without an answer.
const REFUSALS_IN_FLIGHT: usize = 64;

/// How long an over-cap connection is kept to be answered: the `503` is written, the write
/// side shut, and what the client sends is read and dropped until it closes (so that its
/// request never meets a closed socket: no `EPIPE`, no TCP reset eating the answer).
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// How long the accept loop waits after an error before accepting again (`EMFILE` and the
/// like clear only when connections close).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

impl Admission {
    /// `max` connections at once; on a token gateway at most `max_per_source` of them from one
    /// address (at least 1, at most `max`).
    pub(crate) fn new(max: usize, max_per_source: usize, auth: &Auth) -> Admission {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        let sources = matches!(auth, Auth::Token(_)).then(|| {
            Arc::new(Sources {
                max: max_per_source.clamp(1, max),
                held: Mutex::default(),
            })
        });
        Admission {
            permits: Arc::new(Semaphore::new(max)),
            max,
            who: match auth {
                Auth::Conversation(key) => {
                    format!("conversation {}", key.get(..12).unwrap_or(key))
                }
                Auth::Token(_) => "the token gateway".to_owned(),
            },
            saturated: AtomicBool::new(false),
            refused: AtomicU64::new(0),
            accept_failing: AtomicBool::new(false),
            refusals: Arc::new(Semaphore::new(REFUSALS_IN_FLIGHT)),
            sources,
        }
    }

    /// A permit for a connection from `source` (`None`: a Unix socket), or `None` at the
    /// gateway's cap or at the source's (counted, and logged when it starts an episode).
    pub(crate) fn admit(&self, source: Option<IpAddr>) -> Option<Hold> {
        let source = match (&self.sources, source) {
            (Some(sources), Some(ip)) => match sources.take(ip) {
                Taken::Admitted => Some((sources.clone(), ip)),
                Taken::Refused(first) => {
                    if first {
                        tracing::warn!(
                            "egress: {}: {ip} holds {} connections, the cap for one source ([egress] max_connections_per_source): its new connections are refused with 503 until one of its own closes (logged once until then)",
                            self.who,
                            sources.max
                        );
                    }
                    return None;
                }
            },
            _ => None,
        };
        match self.permits.clone().try_acquire_owned() {
            Ok(p) => {
                if self.saturated.swap(false, Ordering::SeqCst) {
                    let n = self.refused.swap(0, Ordering::SeqCst);
                    tracing::warn!(
                        "egress: {}: below the cap of {} connections again; {n} connections were refused while at it",
                        self.who,
                        self.max
                    );
                }
                Some(Arc::new(Permit { _permit: p, source }))
            }
            Err(_) => {
                if let Some((sources, ip)) = source {
                    sources.give_back(ip);
                }
                self.refused.fetch_add(1, Ordering::SeqCst);
                if !self.saturated.swap(true, Ordering::SeqCst) {
                    tracing::warn!(
                        "egress: {}: {} connections at once, the cap ([egress] max_connections): new connections are refused with 503 until some close (logged once until then)",
                        self.who,
                        self.max
                    );
                }
                None
            }
        }
    }

    /// An accept error: logged once per episode; the loop waits a little and goes on.
    pub(crate) async fn accept_failed(&self, e: &std::io::Error) {
        if !self.accept_failing.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                "egress: {}: cannot accept connections ({e}); retrying every {} ms (logged once until it recovers)",
                self.who,
                ACCEPT_BACKOFF.as_millis()
            );
        }
        tokio::time::sleep(ACCEPT_BACKOFF).await;
    }

    pub(crate) fn accepted(&self) {
        if self.accept_failing.swap(false, Ordering::SeqCst) {
            tracing::warn!("egress: {}: accepting connections again", self.who);
        }
    }
}

/// Writes the `503`, shuts the write side and reads until the client closes.
async fn answer_over_cap<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> std::io::Result<()> {
    s.write_all(OVER_CAP).await?;
    s.shutdown().await?;
    let mut sink = [0u8; 1024];
    while s.read(&mut sink).await? > 0 {}
    Ok(())
}

impl GatewayConfig {
    /// [`GatewayConfig::max_connections`] by default (`[egress] max_connections`).
    pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
    /// [`GatewayConfig::max_connections_per_source`] by default
    /// (`[egress] max_connections_per_source`): an eighth of the default cap, so that at
    /// least eight sandboxes must each hold all of theirs to fill it.
    pub const DEFAULT_MAX_CONNECTIONS_PER_SOURCE: usize = 32;
    /// Descriptors one admitted connection can hold at once: the client's, the target's, and
    /// a DNS socket or a second target connection while one closes and the next opens.
    pub const DESCRIPTORS_PER_CONNECTION: u64 = 3;
    /// Descriptors beyond those of the connections: the listener, the store, the resolver's,
    /// the runtime's, and the connections accepted only to be refused (at most 64 at once).
    pub const DESCRIPTOR_HEADROOM: u64 = 256;

    /// The descriptor limit (`RLIMIT_NOFILE`) under which a gateway serving `max_connections`
    /// connections cannot run out of descriptors:
    /// `max_connections * DESCRIPTORS_PER_CONNECTION + DESCRIPTOR_HEADROOM`.
    #[must_use]
    pub fn descriptors_needed(max_connections: usize) -> u64 {
        (max_connections as u64)
            .saturating_mul(Self::DESCRIPTORS_PER_CONNECTION)
            .saturating_add(Self::DESCRIPTOR_HEADROOM)
    }

    /// The most connections a descriptor limit of `nofile` leaves room for (the inverse of
    /// [`Self::descriptors_needed`], at least 1).
    #[must_use]
    pub fn connections_within(nofile: u64) -> usize {
        let n = nofile.saturating_sub(Self::DESCRIPTOR_HEADROOM) / Self::DESCRIPTORS_PER_CONNECTION;
        usize::try_from(n).unwrap_or(usize::MAX).max(1)
    }
}

impl Gateway {
    /// Connections being served now (at most [`GatewayConfig::max_connections`]).
    #[must_use]
    pub fn connections(&self) -> usize {
        let a = &self.inner.admission;
        a.max - a.permits.available_permits()
    }

    /// Serves one client connection (HTTP/1.1, with CONNECT upgrades) until it closes, counted
    /// against [`GatewayConfig::max_connections`]: at the cap it is answered `503` and closed.
    /// (Its source address is unknown here: the per-source cap applies to [`Gateway::serve_tcp`].)
    pub async fn serve_connection<IO>(&self, io: IO)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match self.inner.admission.admit(None) {
            Some(hold) => self.serve_held(io, hold).await,
            None => {
                let _ = tokio::time::timeout(REFUSAL_LINGER, answer_over_cap(io)).await;
            }
        }
    }

    async fn serve_held<IO>(&self, io: IO, hold: Hold)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let inner = self.inner.clone();
        let service = hyper::service::service_fn(move |req| {
            let (inner, hold) = (inner.clone(), hold.clone());
            async move { Ok::<_, Infallible>(inner.handle(req, hold).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(30))
            .max_buf_size(HTTP_BUF)
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        if let Err(e) = conn.await {
            tracing::debug!("egress client connection ended: {e}");
        }
    }

    /// Admits a stream accepted from `source` (a task serves it), or answers it `503` and
    /// closes it (at most [`REFUSALS_IN_FLIGHT`] at once, for at most [`REFUSAL_LINGER`] each;
    /// past that it is closed at once).
    fn admit<S>(&self, s: S, source: Option<IpAddr>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let a = &self.inner.admission;
        match a.admit(source) {
            Some(hold) => {
                let g = self.clone();
                tokio::spawn(async move { g.serve_held(s, hold).await });
            }
            None => {
                if let Ok(p) = a.refusals.clone().try_acquire_owned() {
                    tokio::spawn(async move {
                        let _p = p;
                        let _ = tokio::time::timeout(REFUSAL_LINGER, answer_over_cap(s)).await;
                    });
                }
            }
        }
    }

    /// Accepts on a TCP listener forever, one task per admitted connection (on a token gateway,
    /// at most [`GatewayConfig::max_connections_per_source`] from one address). Accept errors
    /// are logged once per episode and retried; this returns only if the task is cancelled.
    ///
    /// # Errors
    /// None today: the `Result` is kept for callers that `?` it.
    pub async fn serve_tcp(&self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        loop {
            match listener.accept().await {
                Ok((s, peer)) => {
                    self.inner.admission.accepted();
                    let _ = s.set_nodelay(true);
                    self.admit(s, Some(peer.ip().to_canonical()));
                }
                Err(e) => self.inner.admission.accept_failed(&e).await,
            }
        }
    }

    /// Accepts on a Unix listener forever, one task per admitted connection; accept errors as
    /// [`Gateway::serve_tcp`].
    ///
    /// # Errors
    /// None today: the `Result` is kept for callers that `?` it.
    pub async fn serve_unix(&self, listener: tokio::net::UnixListener) -> std::io::Result<()> {
        loop {
            match listener.accept().await {
                Ok((s, _)) => {
                    self.inner.admission.accepted();
                    self.admit(s, None);
                }
                Err(e) => self.inner.admission.accept_failed(&e).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_over_cap_answer_is_a_complete_503() {
        let text = std::str::from_utf8(OVER_CAP).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
    }

    #[test]
    fn permits_run_out_at_the_cap_and_come_back() {
        let a = Admission::new(2, 1, &Auth::Conversation("k".repeat(64)));
        // A conversation's own gateway has no per-source cap.
        let ip = Some(IpAddr::from([127, 0, 0, 1]));
        let (p1, p2) = (a.admit(ip).unwrap(), a.admit(ip).unwrap());
        assert!(a.admit(None).is_none() && a.admit(ip).is_none());
        assert_eq!(a.refused.load(Ordering::SeqCst), 2);
        assert!(a.saturated.load(Ordering::SeqCst));
        // A permit shared by a connection's tasks is released when the last of them ends.
        let shared = p1.clone();
        drop(p1);
        assert!(a.admit(None).is_none());
        drop(shared);
        let p3 = a.admit(None).unwrap();
        assert!(!a.saturated.load(Ordering::SeqCst));
        assert_eq!(a.refused.load(Ordering::SeqCst), 0);
        drop((p2, p3));
        assert_eq!(a.permits.available_permits(), 2);
        // A cap of 0 would refuse everything: it is raised to 1.
        assert_eq!(Admission::new(0, 0, &Auth::Conversation("k".into())).max, 1);
    }

    #[test]
    fn a_token_gateway_caps_each_source_and_gives_its_places_back() {
        let key = crate::token::TokenKey::from_bytes([7; 32]);
        let a = Admission::new(4, 2, &Auth::Token(key));
        let (x, y) = (
            Some(IpAddr::from([172, 17, 0, 2])),
            Some(IpAddr::from([172, 17, 0, 3])),
        );
        let (x1, x2) = (a.admit(x).unwrap(), a.admit(x).unwrap());
        assert!(a.admit(x).is_none(), "a third from one source");
        // A refusal at a source's cap is not one of the gateway's cap.
        assert_eq!(a.refused.load(Ordering::SeqCst), 0);
        assert!(!a.saturated.load(Ordering::SeqCst));
        // Another source still gets in, up to the gateway's cap.
        let (y1, y2) = (a.admit(y).unwrap(), a.admit(y).unwrap());
        assert_eq!(a.permits.available_permits(), 0);
        assert!(a.admit(Some(IpAddr::from([172, 17, 0, 4]))).is_none());
        // A refusal at the gateway's cap gives the source's place back.
        drop(y1);
        let z = a.admit(Some(IpAddr::from([172, 17, 0, 4]))).unwrap();
        drop(x1);
        let x3 = a.admit(x).unwrap();
        drop((x2, x3, y2, z));
        assert!(a.sources.as_ref().unwrap().held.lock().unwrap().is_empty());
        assert_eq!(a.permits.available_permits(), 4);
        // A cap per source above the gateway's is the gateway's.
        let key = crate::token::TokenKey::from_bytes([7; 32]);
        assert_eq!(
            Admission::new(3, 99, &Auth::Token(key))
                .sources
                .unwrap()
                .max,
            3
        );
    }
}
