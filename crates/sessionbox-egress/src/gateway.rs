//! The gateway: an HTTP/1.1 forward proxy (hyper) that lets a conversation out only where its
//! policy says.
//!
//! Per request, in this order:
//! 1. Who is asking: the conversation the listening socket belongs to ([`Auth::Conversation`],
//!    the isolated runtime's per-conversation socket), or the conversation a signed token in
//!    `Proxy-Authorization` names ([`Auth::Token`], remote runtimes; checked on every request).
//! 2. The policy in force *now* ([`Control::policy`], read per request: a change applies to the
//!    next connection).
//! 3. The target: `CONNECT host:port`, or an absolute-form `http://` URL. Numeric hosts become
//!    the address they denote ([`crate::target`]).
//! 4. A name is matched before any DNS lookup ([`Policy::check_name`]): a denied name is never
//!    resolved. An allowed name is resolved once, by the gateway; *every* answer is checked
//!    ([`Policy::check_addr`]) and one bad answer refuses the request (DNS rebinding).
//! 5. The gateway connects to the checked address itself: no second lookup anywhere.
//! 6. Bytes are relayed with idle and total timeouts, counted, and the verdict (allowed or
//!    denied, target, rule or reason, address, bytes, how it ended) goes to [`Control::record`].
//!    The URL path and query are never logged (they may carry secrets).
//!
//! What one gateway may spend is bounded ([`GatewayConfig::max_connections`], and on a token
//! gateway shared by many sandboxes [`GatewayConfig::max_connections_per_source`] of them from
//! one address, taken before the request is authenticated): a client
//! connection, with the tunnel or forwarded request it carries, holds one of
//! `max_connections` permits from its accept to its end. A connection accepted when none is
//! free is answered `503` at once and closed, and nothing else happens: no policy read, no
//! lookup, no verdict in the log. The first refusal of an episode is logged once (a warning),
//! and the next admitted connection logs how many were refused meanwhile; the gateway keeps
//! serving the connections it holds and every later one. An error from `accept` (such as
//! `EMFILE`) is logged the same way, once per episode, and the loop waits briefly and goes on:
//! it never ends the gateway. Buffers are bounded per connection ([`RELAY_BUF`] per direction
//! of a tunnel, [`HTTP_BUF`] for a request's or response's head), so the gateway's memory is
//! bounded by `max_connections` times a constant.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::accept::{Admission, Hold};
use crate::policy::{Policy, Verdict};
use crate::target::{Host, Target, absolute_target, parse_authority};
use crate::token::{TokenKey, from_proxy_authorization};

/// Gateway settings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// DNS servers to ask (plain DNS over UDP, then TCP); `None` for the system's
    /// (`/etc/resolv.conf`).
    pub nameservers: Option<Vec<SocketAddr>>,
    /// How long one lookup may take.
    pub dns_timeout: Duration,
    /// How long connecting to the target may take.
    pub connect_timeout: Duration,
    /// A connection with no byte in either direction for this long is closed.
    pub idle_timeout: Duration,
    /// A connection is closed this long after it was allowed, whatever it is doing.
    pub total_timeout: Duration,
    /// Most client connections served at once (each with the tunnel or the forwarded request
    /// it carries); one more is answered `503` and closed. At least 1. The per-conversation
    /// gateway of the `isolated` runtime serves one conversation, so this is that
    /// conversation's cap; a `--listen` gateway shares it among every token's conversation.
    pub max_connections: usize,
    /// On a token gateway ([`Auth::Token`], served with [`Gateway::serve_tcp`]): most of those
    /// connections held at once from one source address, authenticated or not, so that one
    /// sandbox (each has its own address) cannot take every permit from the others. At least
    /// 1, at most `max_connections`; a conversation's own gateway has no such cap.
    pub max_connections_per_source: usize,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            nameservers: None,
            dns_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            total_timeout: Duration::from_secs(3600),
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            max_connections_per_source: Self::DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
        }
    }
}

/// One verdict, as logged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// The conversation key.
    pub conversation: String,
    /// Allowed (a connection was attempted) or denied.
    pub allowed: bool,
    /// `CONNECT`, or the method of an absolute-form request.
    pub method: String,
    /// The target as asked, normalized (`host:port`; never a path or query).
    pub target: String,
    /// The address connected to, when one was.
    pub address: Option<String>,
    /// The rule that allowed it, or why it was denied.
    pub rule: String,
    /// Bytes sent to the target.
    pub bytes_up: u64,
    /// Bytes received from the target.
    pub bytes_down: u64,
    /// From the request to the end of the connection, in milliseconds.
    pub duration_ms: u64,
    /// How an allowed connection ended (`closed`, `idle timeout`, `total timeout`,
    /// `connect failed: ...`).
    pub end: Option<String>,
}

/// What the gateway needs from its host: the policy in force and somewhere to log.
pub trait Control: Send + Sync + 'static {
    /// The policy in force now for `conversation` (a key). Called for every request.
    ///
    /// # Errors
    /// A message (logged; the request gets 503).
    fn policy(&self, conversation: &str) -> Result<Policy, String>;
    /// Records a verdict. Must not block for long (it runs on the gateway's tasks): a host
    /// that writes verdicts to a store aggregates them first ([`crate::verdicts::Aggregator`]).
    fn record(&self, entry: LogEntry);
}

/// How the gateway knows which conversation a request belongs to.
#[derive(Debug, Clone)]
pub enum Auth {
    /// Everything on this listener is this conversation's (the per-conversation socket).
    Conversation(String),
    /// A signed token in `Proxy-Authorization` names it; checked on every request.
    Token(TokenKey),
}

/// The gateway. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Gateway {
    /// Shows the settings and the auth mode; the resolver and the control hooks are opaque.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("config", &self.inner.config)
            .field("auth", &self.inner.auth)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    config: GatewayConfig,
    resolver: hickory_resolver::TokioResolver,
    control: Arc<dyn Control>,
    auth: Auth,
    host_addrs: crate::host::HostAddrs,
    pub(crate) admission: Admission,
}

type Body = BoxBody<Bytes, hyper::Error>;

/// Buffer per direction of a tunnel: large enough that a bulk transfer costs few system calls,
/// small enough that `max_connections` tunnels stay cheap (two per tunnel).
pub const RELAY_BUF: usize = 64 * 1024;

/// Most bytes hyper buffers for one connection's HTTP head (a request's, or a forwarded
/// response's); a larger head is refused.
pub const HTTP_BUF: usize = 64 * 1024;

fn text(status: StatusCode, msg: impl Into<String>) -> Response<Body> {
    let mut msg = msg.into();
    msg.push('\n');
    let mut r = Response::new(Full::new(Bytes::from(msg)).map_err(|n| match n {}).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// What the checks decided.
enum Decision {
    Allow {
        addrs: Vec<SocketAddr>,
        rule: String,
    },
    Deny {
        status: StatusCode,
        reason: String,
    },
}

impl Gateway {
    /// A gateway with these settings, asking `control` for policies and logging to it.
    ///
    /// # Errors
    /// When the system's DNS configuration cannot be read (with `nameservers: None`).
    pub fn new(
        config: GatewayConfig,
        control: Arc<dyn Control>,
        auth: Auth,
    ) -> std::io::Result<Gateway> {
        use hickory_resolver::config::{
            NameServerConfig, NameServerConfigGroup, ResolveHosts, ResolverConfig,
        };
        use hickory_resolver::name_server::TokioConnectionProvider;
        let mut builder = match &config.nameservers {
            Some(servers) => {
                let mut group = NameServerConfigGroup::new();
                for s in servers {
                    group.push(NameServerConfig::new(
                        *s,
                        hickory_resolver::proto::xfer::Protocol::Udp,
                    ));
                    group.push(NameServerConfig::new(
                        *s,
                        hickory_resolver::proto::xfer::Protocol::Tcp,
                    ));
                }
                hickory_resolver::Resolver::builder_with_config(
                    ResolverConfig::from_parts(None, vec![], group),
                    TokioConnectionProvider::default(),
                )
            }
            None => hickory_resolver::Resolver::builder_tokio().map_err(|e| {
                std::io::Error::other(format!("cannot read the DNS configuration: {e}"))
            })?,
        };
        let opts = builder.options_mut();
        opts.timeout = config.dns_timeout;
        opts.attempts = 1;
        // The gateway checks every answer each time; a cache would only hide changes.
        opts.cache_size = 0;
        // Names come from the sandbox; the host's own /etc/hosts is not theirs to use.
        opts.use_hosts_file = ResolveHosts::Never;
        opts.ip_strategy = hickory_resolver::config::LookupIpStrategy::Ipv4AndIpv6;
        let resolver = builder.build();
        let admission = Admission::new(
            config.max_connections,
            config.max_connections_per_source,
            &auth,
        );
        Ok(Gateway {
            inner: Arc::new(Inner {
                config,
                resolver,
                control,
                auth,
                host_addrs: crate::host::HostAddrs::default(),
                admission,
            }),
        })
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Hop-by-hop headers, and any the `Connection` header names, are not forwarded; neither is
/// `Proxy-Authorization` (the token stays with the gateway).
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<String> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .collect();
    for n in named {
        h.remove(n.as_str());
    }
    for n in [
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
    ] {
        h.remove(n);
    }
}

impl Inner {
    pub(crate) async fn handle(
        self: &Arc<Self>,
        req: Request<Incoming>,
        hold: Hold,
    ) -> Response<Body> {
        let started = Instant::now();
        // 1. Who.
        let (conversation, token_hash) = match &self.auth {
            Auth::Conversation(c) => (c.clone(), None),
            Auth::Token(key) => {
                let token = req
                    .headers()
                    .get(header::PROXY_AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(from_proxy_authorization);
                let claims = match token.map(|t| key.verify(&t, now_secs())) {
                    Some(Ok(c)) => c,
                    Some(Err(e)) => return proxy_auth_required(&e.to_string()),
                    None => return proxy_auth_required("a proxy token is required"),
                };
                (claims.conversation, Some(claims.policy_hash))
            }
        };
        // 2. The policy in force now.
        let policy = match self.control.policy(&conversation) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("egress: cannot read the policy: {e}");
                return text(StatusCode::SERVICE_UNAVAILABLE, "the policy cannot be read");
            }
        };
        if token_hash.is_some_and(|h| h != policy.hash()) {
            return proxy_auth_required(
                "the policy changed since the token was issued; ask for a new token",
            );
        }
        // 3. The target.
        let method = req.method().clone();
        let parsed = if method == Method::CONNECT {
            match req.uri().authority() {
                Some(a) => parse_authority(a.as_str()),
                None => Err(crate::policy::PolicyError("CONNECT needs host:port".into())),
            }
        } else {
            absolute_target(req.uri())
        };
        let deny = |target: String, status: StatusCode, reason: String| {
            self.control.record(LogEntry {
                conversation: conversation.clone(),
                allowed: false,
                method: method.to_string(),
                target,
                address: None,
                rule: reason.clone(),
                bytes_up: 0,
                bytes_down: 0,
                duration_ms: started.elapsed().as_millis() as u64,
                end: None,
            });
            text(status, format!("sessionbox egress: refused: {reason}"))
        };
        let target = match parsed {
            Ok(t) => t,
            Err(e) => {
                let shown = req
                    .uri()
                    .authority()
                    .map_or_else(|| "?".to_owned(), |a| a.as_str().to_owned());
                return deny(shown, StatusCode::BAD_REQUEST, e.0);
            }
        };
        // 4. Check the name, resolve once, check every answer.
        let (addrs, rule) = match self.decide(&policy, &target).await {
            Decision::Allow { addrs, rule } => (addrs, rule),
            Decision::Deny { status, reason } => return deny(target.to_string(), status, reason),
        };
        let log = LogEntry {
            conversation,
            allowed: true,
            method: method.to_string(),
            target: target.to_string(),
            address: None,
            rule,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            end: None,
        };
        // 5. Connect to the checked address.
        let (upstream, addr) = match self.connect(&addrs).await {
            Ok(x) => x,
            Err(e) => {
                self.finish(log, None, started, format!("connect failed: {e}"));
                return text(
                    StatusCode::BAD_GATEWAY,
                    format!("sessionbox egress: cannot connect to {target}: {e}"),
                );
            }
        };
        let meter = Arc::new(Meter::new());
        let upstream = Metered {
            inner: upstream,
            meter: meter.clone(),
        };
        if method == Method::CONNECT {
            self.tunnel(req, upstream, meter, addr, log, started, hold)
        } else {
            self.forward(req, upstream, meter, addr, log, started, &target, hold)
                .await
        }
    }

    async fn decide(&self, policy: &Policy, target: &Target) -> Decision {
        let deny = |reason: String| Decision::Deny {
            status: StatusCode::FORBIDDEN,
            reason,
        };
        match &target.host {
            Host::Ip(ip) => {
                match policy.check_addr_from(*ip, target.port, None, self.host_addrs.contains(*ip))
                {
                    Verdict::Allow { rule } => Decision::Allow {
                        addrs: vec![SocketAddr::new(*ip, target.port)],
                        rule,
                    },
                    Verdict::Deny { reason } => deny(reason),
                }
            }
            Host::Name(name) => {
                let rule = match policy.check_name(name, target.port) {
                    Verdict::Allow { rule } => rule,
                    Verdict::Deny { reason } => return deny(reason),
                };
                // Fully qualified: no search domain is appended.
                let lookup = tokio::time::timeout(
                    self.config.dns_timeout + Duration::from_millis(500),
                    self.resolver.lookup_ip(format!("{name}.")),
                )
                .await;
                let answers: Vec<IpAddr> = match lookup {
                    Ok(Ok(l)) => l.iter().collect(),
                    Ok(Err(e)) => {
                        return Decision::Deny {
                            status: StatusCode::BAD_GATEWAY,
                            reason: format!("cannot resolve {name}: {e}"),
                        };
                    }
                    Err(_) => {
                        return Decision::Deny {
                            status: StatusCode::GATEWAY_TIMEOUT,
                            reason: format!("resolving {name} timed out"),
                        };
                    }
                };
                if answers.is_empty() {
                    return Decision::Deny {
                        status: StatusCode::BAD_GATEWAY,
                        reason: format!("{name} has no address"),
                    };
                }
                let mut addrs = Vec::new();
                for ip in answers {
                    let local = self.host_addrs.contains(ip);
                    match policy.check_addr_from(ip, target.port, Some(&rule), local) {
                        Verdict::Allow { .. } => addrs.push(SocketAddr::new(ip, target.port)),
                        Verdict::Deny { reason } => {
                            return deny(format!("{name} resolves to {ip}: {reason}"));
                        }
                    }
                }
                Decision::Allow { addrs, rule }
            }
        }
    }

    async fn connect(&self, addrs: &[SocketAddr]) -> std::io::Result<(TcpStream, SocketAddr)> {
        let mut last = std::io::Error::other("no address");
        for a in addrs {
            match tokio::time::timeout(self.config.connect_timeout, TcpStream::connect(a)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok((s, *a));
                }
                Ok(Err(e)) => last = e,
                Err(_) => last = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"),
            }
        }
        Err(last)
    }

    fn finish(&self, mut log: LogEntry, meter: Option<&Meter>, started: Instant, end: String) {
        if let Some(m) = meter {
            log.bytes_up = m.up.load(Ordering::Relaxed);
            log.bytes_down = m.down.load(Ordering::Relaxed);
        }
        log.duration_ms = started.elapsed().as_millis() as u64;
        log.end = Some(end);
        self.control.record(log);
    }

    /// CONNECT: answer 200, then relay bytes both ways until either side closes or a timeout
    /// (the tunnel keeps the connection's permit, `hold`, until then).
    #[allow(clippy::too_many_arguments)]
    fn tunnel(
        self: &Arc<Self>,
        req: Request<Incoming>,
        mut upstream: Metered<TcpStream>,
        meter: Arc<Meter>,
        addr: SocketAddr,
        mut log: LogEntry,
        started: Instant,
        hold: Hold,
    ) -> Response<Body> {
        log.address = Some(addr.to_string());
        let this = self.clone();
        tokio::spawn(async move {
            let _hold = hold;
            let end = match hyper::upgrade::on(req).await {
                Ok(up) => {
                    let mut client = TokioIo::new(up);
                    tokio::select! {
                        r = tokio::io::copy_bidirectional_with_sizes(
                            &mut client,
                            &mut upstream,
                            RELAY_BUF,
                            RELAY_BUF,
                        ) => match r {
                            Ok(_) => "closed".to_owned(),
                            Err(e) => format!("closed: {e}"),
                        },
                        why = meter.watchdog(this.config.idle_timeout, this.config.total_timeout) => why.to_owned(),
                    }
                }
                Err(e) => format!("the client went away: {e}"),
            };
            this.finish(log, Some(&meter), started, end);
        });
        Response::new(Full::new(Bytes::new()).map_err(|n| match n {}).boxed())
    }

    /// Absolute-form: send the request on to the checked address (origin-form, hop-by-hop
    /// headers and `Proxy-Authorization` removed) and stream the answer back.
    #[allow(clippy::too_many_arguments)]
    async fn forward(
        self: &Arc<Self>,
        req: Request<Incoming>,
        upstream: Metered<TcpStream>,
        meter: Arc<Meter>,
        addr: SocketAddr,
        mut log: LogEntry,
        started: Instant,
        target: &Target,
        hold: Hold,
    ) -> Response<Body> {
        log.address = Some(addr.to_string());
        let handshake = hyper::client::conn::http1::Builder::new()
            .max_buf_size(HTTP_BUF)
            .handshake(TokioIo::new(upstream));
        let (mut sender, conn) = match handshake.await {
            Ok(x) => x,
            Err(e) => {
                self.finish(log, Some(&meter), started, format!("handshake failed: {e}"));
                return text(
                    StatusCode::BAD_GATEWAY,
                    "sessionbox egress: the target failed",
                );
            }
        };
        let this = self.clone();
        let m = meter.clone();
        tokio::spawn(async move {
            // The target connection counts against the cap until it closes.
            let _hold = hold;
            let end = tokio::select! {
                r = conn => match r {
                    Ok(()) => "closed".to_owned(),
                    Err(e) => format!("closed: {e}"),
                },
                why = m.watchdog(this.config.idle_timeout, this.config.total_timeout) => why.to_owned(),
            };
            this.finish(log, Some(&m), started, end);
        });
        let (mut parts, body) = req.into_parts();
        let pq = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        parts.uri = match pq.parse() {
            Ok(u) => u,
            Err(_) => return text(StatusCode::BAD_REQUEST, "bad request target"),
        };
        strip_hop_by_hop(&mut parts.headers);
        let host = match (&target.host, target.port) {
            (Host::Name(n), 80) => n.clone(),
            _ => target.to_string(),
        };
        if let Ok(v) = HeaderValue::from_str(&host) {
            parts.headers.insert(header::HOST, v);
        }
        let out = Request::from_parts(parts, body);
        match tokio::time::timeout(self.config.total_timeout, sender.send_request(out)).await {
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, body.boxed())
            }
            Ok(Err(e)) => text(
                StatusCode::BAD_GATEWAY,
                format!("sessionbox egress: the target failed: {e}"),
            ),
            Err(_) => text(StatusCode::GATEWAY_TIMEOUT, "sessionbox egress: timed out"),
        }
    }
}

fn proxy_auth_required(why: &str) -> Response<Body> {
    let mut r = text(
        StatusCode::PROXY_AUTHENTICATION_REQUIRED,
        format!("sessionbox egress: {why}"),
    );
    r.headers_mut().insert(
        header::PROXY_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"sessionbox egress\""),
    );
    r
}

/// Byte counters and the time of the last byte, shared by a connection's relay and watchdog.
struct Meter {
    up: AtomicU64,
    down: AtomicU64,
    last_ms: AtomicU64,
    start: Instant,
}

impl Meter {
    fn new() -> Self {
        Meter {
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
            start: Instant::now(),
        }
    }

    fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Returns when the connection has been idle for `idle`, or has lived for `total`.
    async fn watchdog(&self, idle: Duration, total: Duration) -> &'static str {
        loop {
            let now = self.start.elapsed();
            if now >= total {
                return "total timeout";
            }
            let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let idle_for = now.saturating_sub(last);
            if idle_for >= idle {
                return "idle timeout";
            }
            let wait = (idle - idle_for).min(total - now);
            tokio::time::sleep(wait + Duration::from_millis(1)).await;
        }
    }
}

/// The upstream stream, counting what goes up (writes) and down (reads).
struct Metered<S> {
    inner: S,
    meter: Arc<Meter>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.meter.down.fetch_add(n as u64, Ordering::Relaxed);
            self.meter.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n @ 1..)) = r {
            self.meter.up.fetch_add(n as u64, Ordering::Relaxed);
            self.meter.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
