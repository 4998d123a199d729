//! The accept loop of [`crate::serve`]: what one client may make the server hold before it has
//! said who it is.
//!
//! Before a request is read there is no key, so nothing per tenant applies; what applies is per
//! connection and per source address:
//! - a request's head (request line and headers) must arrive within
//!   [`crate::ServerConfig::header_read_timeout`] of the connection's start or of the previous
//!   response (hyper's `header_read_timeout`), else the connection is closed;
//! - at most [`crate::ServerConfig::max_connections`] connections are open at once, and at most
//!   [`crate::ServerConfig::max_connections_per_source`] from one IP address. A connection past
//!   either is closed as soon as it is accepted, and the refusal is logged once per source per
//!   episode (until that source is under its cap again), not once per connection.
//!
//! Without them one client could open connections that send half a header each until the
//! process ran out of file descriptors, and every other tenant's requests, and the server's own
//! garbage collection, failed.
//!
//! Connections are HTTP/1.1 with upgrades (WebSockets of terminals and previews). On shutdown
//! the listener stops, idle connections close, and requests in flight are answered.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;

/// Connections open now, per source and in all.
#[derive(Debug)]
pub(crate) struct Caps {
    total: usize,
    per_source: usize,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    sources: HashMap<IpAddr, usize>,
    /// Sources refused since they were last under their cap (logged once each).
    refused: std::collections::HashSet<IpAddr>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The server has its most connections open.
    Total,
    /// This source has its most connections open.
    Source,
}

/// One accepted connection's place in the counts, given back when dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    caps: Arc<Caps>,
    source: IpAddr,
}

impl Caps {
    pub(crate) fn new(total: usize, per_source: usize) -> Arc<Self> {
        Arc::new(Caps {
            total: total.max(1),
            per_source: per_source.max(1),
            open: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a connection from `source`, or says why not; `Err` carries whether this refusal
    /// is the first of the source's episode (to be logged).
    pub(crate) fn admit(self: &Arc<Self>, source: IpAddr) -> Result<Admitted, (Refused, bool)> {
        let mut open = self.lock();
        let mine = open.sources.get(&source).copied().unwrap_or(0);
        let why = if open.total >= self.total {
            Some(Refused::Total)
        } else if mine >= self.per_source {
            Some(Refused::Source)
        } else {
            None
        };
        if let Some(why) = why {
            let first = open.refused.insert(source);
            return Err((why, first));
        }
        open.total += 1;
        *open.sources.entry(source).or_default() += 1;
        Ok(Admitted {
            caps: self.clone(),
            source,
        })
    }

    /// Connections open now (all sources).
    #[cfg(test)]
    fn open(&self) -> usize {
        self.lock().total
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.caps.lock();
        open.total = open.total.saturating_sub(1);
        let left = match open.sources.get_mut(&self.source) {
            Some(n) => {
                *n = n.saturating_sub(1);
                *n
            }
            None => 0,
        };
        if left == 0 {
            open.sources.remove(&self.source);
        }
        // Under its cap again: a later refusal is a new episode, logged again.
        if left < self.caps.per_source && open.total < self.caps.total {
            open.refused.remove(&self.source);
        }
    }
}

/// Serves `router` on `listener` with the caps and the header deadline until `shutdown`, then
/// lets the requests in flight finish.
pub(crate) async fn serve<L>(
    mut listener: L,
    router: Router,
    caps: Arc<Caps>,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) where
    L: axum::serve::Listener<Addr = SocketAddr>,
    L::Io: Unpin,
{
    let mut builder = Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let admitted = match caps.admit(source_of(peer.ip())) {
            Ok(a) => a,
            Err((why, first)) => {
                if first {
                    match why {
                        Refused::Total => tracing::warn!(
                            source = %peer.ip(), max = caps.total,
                            "refusing connections: the server has its most connections open"
                        ),
                        Refused::Source => tracing::warn!(
                            source = %peer.ip(), max = caps.per_source,
                            "refusing connections from a source that has its most open"
                        ),
                    }
                }
                drop(io);
                continue;
            }
        };
        let service = TowerToHyperService::new(router.clone());
        // The place goes with the connection's I/O, which an upgrade (a WebSocket) carries
        // on after hyper's connection ends: a tunnel stays counted until it closes.
        let io = Counted {
            io,
            _admitted: admitted,
        };
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(io), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The source a connection is counted under: its IPv4 address, or its IPv6 /64 (one host is
/// usually given a whole /64, so counting single IPv6 addresses would give it a cap per
/// address it cares to use). IPv4 in IPv6 counts as IPv4.
pub(crate) fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(std::net::Ipv6Addr::from(bits))
            }
        },
    }
}

/// A connection's I/O with its place in the counts, given back when the I/O is dropped.
struct Counted<I> {
    io: I,
    _admitted: Admitted,
}

impl<I: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Counted<I> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Counted<I> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_source_gets_its_share_and_the_server_its_total() {
        let caps = Caps::new(3, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = caps.admit(a).unwrap();
        let a2 = caps.admit(a).unwrap();
        // A's third is refused, logged once for the episode.
        assert_eq!(caps.admit(a).unwrap_err(), (Refused::Source, true));
        assert_eq!(caps.admit(a).unwrap_err(), (Refused::Source, false));
        // B is not held back by A's cap, but by the total.
        let b1 = caps.admit(b).unwrap();
        assert_eq!(caps.admit(b).unwrap_err(), (Refused::Total, true));
        drop(a1);
        // A is under its cap again: a new refusal is a new episode.
        let a3 = caps.admit(a).unwrap();
        assert!(caps.admit(a).unwrap_err().1);
        drop((a2, a3, b1));
        assert_eq!(caps.open(), 0);
        assert!(caps.lock().sources.is_empty());
    }

    #[test]
    fn an_ipv6_host_counts_as_its_64_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(source_of(a), source_of(b));
        assert_ne!(source_of(a), source_of(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(source_of(mapped), "10.0.0.1".parse::<IpAddr>().unwrap());
    }
}
