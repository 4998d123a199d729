//! The async execd client, over a Unix socket or HTTP(S).

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::header::{self, HeaderValue};
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::ExecdError;
use crate::stream::EventStreamParser;
use crate::token::AccessToken;
use crate::types::{ErrorResponse, Metrics, ServerStreamEvent};
use crate::wire;

mod archive;
mod background;
mod commands;
mod files;
mod link;
mod watch;

pub use link::AgentLink;
pub use watch::WatchStream;

/// Default deadline for opening a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default deadline for a whole non-streaming request, and for the response head of a stream.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long [`ExecdClient::run_command`] waits past a command's own `timeout` before giving up
/// on the server.
pub const STREAM_GRACE: Duration = Duration::from_secs(30);
/// Default bound on a whole answer read into memory (a JSON answer, a file, a log): 192 MiB,
/// room for a file at the agent's default 64 MiB limit in base64 three times over. The agent
/// runs beside the commands it serves, so what it sends is bounded here too: an answer past
/// the bound fails instead of growing the caller's memory.
pub const DEFAULT_MAX_ANSWER_BYTES: u64 = 192 << 20;
/// Most bytes of an error body read for the message.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Most characters of an error body quoted in a message (the SDK quotes 512).
const MAX_QUOTED: usize = 512;

/// A stream of command events that ends right after the terminal event.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<ServerStreamEvent, ExecdError>> + Send>>;

/// Where execd listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix socket (our `isolated` runtime).
    Unix(PathBuf),
    /// An `http://` or `https://` base URL, possibly with a path prefix such as an OpenSandbox
    /// server-proxy path `/sandboxes/{id}/proxy/44772`.
    Http(String),
}

impl Endpoint {
    /// Reads `unix:PATH`, an absolute or `./` path (a Unix socket), `http(s)://...`, or a bare
    /// `HOST:PORT[/PREFIX]`, which becomes `http://...` (OpenSandbox returns endpoints without a
    /// scheme).
    pub fn parse(s: &str) -> Result<Self, ExecdError> {
        let s = s.trim();
        if let Some(path) = s
            .strip_prefix("unix://")
            .or_else(|| s.strip_prefix("unix:"))
        {
            if path.is_empty() {
                return Err(ExecdError::InvalidEndpoint(s.to_owned()));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        if s.starts_with('/') || s.starts_with("./") {
            return Ok(Endpoint::Unix(PathBuf::from(s)));
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            return Ok(Endpoint::Http(s.to_owned()));
        }
        if s.is_empty() || s.contains("://") {
            return Err(ExecdError::InvalidEndpoint(s.to_owned()));
        }
        Ok(Endpoint::Http(format!("http://{s}")))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Http(u) => f.write_str(u),
        }
    }
}

/// Settings for an [`ExecdClient`].
#[derive(Debug, Clone)]
pub struct ExecdClientBuilder {
    endpoint: Endpoint,
    token: Option<AccessToken>,
    connect_timeout: Duration,
    request_timeout: Option<Duration>,
    max_answer_bytes: u64,
}

impl ExecdClientBuilder {
    /// The most bytes of one answer read into memory ([`DEFAULT_MAX_ANSWER_BYTES`] by
    /// default); a longer one fails with [`ExecdError::Protocol`]. Streams (command output,
    /// archives) have bounds of their own.
    pub fn max_answer_bytes(mut self, bytes: u64) -> Self {
        self.max_answer_bytes = bytes;
        self
    }

    /// Sends `X-EXECD-ACCESS-TOKEN` with every request.
    pub fn token(mut self, token: impl Into<AccessToken>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Deadline for opening a connection ([`DEFAULT_CONNECT_TIMEOUT`] by default).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Deadline for each non-streaming request and for the head of a command stream
    /// ([`DEFAULT_REQUEST_TIMEOUT`] by default; `None` for no deadline).
    pub fn request_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Builds the client. Fails on a malformed URL, a URL with credentials, or a token that
    /// cannot be a header value.
    pub fn build(self) -> Result<ExecdClient, ExecdError> {
        let builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .no_proxy()
            .connect_timeout(self.connect_timeout)
            .user_agent(concat!("sessionbox-execd/", env!("CARGO_PKG_VERSION")));
        let (builder, base) = match &self.endpoint {
            // No TLS over a Unix socket: skip loading the system's root certificates (about
            // 3 ms per client, measured by `sessionbox bench`).
            Endpoint::Unix(path) => (
                builder
                    .unix_socket(path.as_path())
                    .tls_certs_only(std::iter::empty()),
                Url::parse("http://localhost/").expect("a constant URL parses"),
            ),
            Endpoint::Http(s) => {
                let invalid = || ExecdError::InvalidEndpoint(s.clone());
                let url = Url::parse(s).map_err(|_| invalid())?;
                let fine = matches!(url.scheme(), "http" | "https")
                    && url.host().is_some()
                    && url.username().is_empty()
                    && url.password().is_none()
                    && url.query().is_none()
                    && url.fragment().is_none();
                if !fine {
                    return Err(invalid());
                }
                (builder, url)
            }
        };
        let http = builder.build().map_err(|e| ExecdError::Connect {
            endpoint: self.endpoint.to_string(),
            reason: error_chain(&e),
        })?;
        let token_header = match &self.token {
            Some(t) => {
                let mut v = HeaderValue::from_str(t.expose()).map_err(|_| {
                    ExecdError::InvalidRequest(
                        "the access token contains characters not allowed in a header".into(),
                    )
                })?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        Ok(ExecdClient {
            http,
            base,
            endpoint: self.endpoint,
            token: self.token,
            token_header,
            request_timeout: self.request_timeout,
            max_answer_bytes: self.max_answer_bytes,
        })
    }
}

/// An execd client. Cheap to clone; clones share the connection pool.
///
/// It never follows redirects (a 3xx is [`ExecdError::Redirect`]), sends the access token only to
/// the configured endpoint, and never puts the token in an error message.
#[derive(Clone)]
pub struct ExecdClient {
    http: reqwest::Client,
    base: Url,
    endpoint: Endpoint,
    token: Option<AccessToken>,
    token_header: Option<HeaderValue>,
    request_timeout: Option<Duration>,
    max_answer_bytes: u64,
}

impl fmt::Debug for ExecdClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecdClient")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl ExecdClient {
    /// Settings for a client of `endpoint`.
    pub fn builder(endpoint: Endpoint) -> ExecdClientBuilder {
        ExecdClientBuilder {
            endpoint,
            token: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: Some(DEFAULT_REQUEST_TIMEOUT),
            max_answer_bytes: DEFAULT_MAX_ANSWER_BYTES,
        }
    }

    /// A client of the execd at a Unix socket, with default settings.
    pub fn unix(path: impl Into<PathBuf>) -> Result<Self, ExecdError> {
        Self::builder(Endpoint::Unix(path.into())).build()
    }

    /// A client of the execd at an `http(s)://` base URL (or bare `HOST:PORT`), with default
    /// settings.
    pub fn http(base_url: &str) -> Result<Self, ExecdError> {
        match Endpoint::parse(base_url)? {
            e @ Endpoint::Http(_) => Self::builder(e).build(),
            Endpoint::Unix(_) => Err(ExecdError::InvalidEndpoint(base_url.to_owned())),
        }
    }

    /// Where this client connects.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// This client's endpoint and token, for a relay to the same agent ([`AgentLink`]).
    pub fn access(&self) -> sessionbox_core::AgentAccess {
        let endpoint = match &self.endpoint {
            Endpoint::Unix(path) => sessionbox_core::AgentEndpoint::Unix(path.clone()),
            Endpoint::Http(url) => sessionbox_core::AgentEndpoint::Http(url.clone()),
        };
        sessionbox_core::AgentAccess::new(
            endpoint,
            self.token.as_ref().map(|t| t.expose().to_owned()),
        )
    }

    // ----- health -----

    /// `GET /ping`: succeeds when execd answers 2xx.
    pub async fn ping(&self) -> Result<(), ExecdError> {
        self.call("ping", Method::GET, wire::PING, &[], |rb| rb)
            .await
            .map(drop)
    }

    // ----- metrics -----

    /// `GET /metrics`.
    pub async fn metrics(&self) -> Result<Metrics, ExecdError> {
        const OP: &str = "metrics";
        let r = self
            .call(OP, Method::GET, wire::METRICS, &[], |rb| rb)
            .await?;
        self.json(OP, r).await
    }

    /// `GET /sessionbox/v1/memory`: the memory charge of the cgroup the agent runs in, `None`
    /// when it runs in none it can read (see [`crate::memory_ext`]).
    ///
    /// # Errors
    /// A transport failure or the agent's error (404 `not_found` from an agent that predates
    /// the route, or upstream's execd).
    pub async fn memory_usage(&self) -> Result<Option<sessionbox_core::MemoryUsage>, ExecdError> {
        const OP: &str = "memory use";
        let r = self
            .call(OP, Method::GET, crate::memory_ext::MEMORY_PATH, &[], |rb| {
                rb
            })
            .await?;
        self.json(OP, r).await
    }

    // ----- plumbing -----

    fn url(&self, path: &str, q: &[(&str, &str)]) -> Url {
        let mut url = self.base.clone();
        let prefix = self.base.path().trim_end_matches('/').to_owned();
        url.set_path(&format!("{prefix}{path}"));
        if !q.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (k, v) in q {
                pairs.append_pair(k, v);
            }
        }
        url
    }

    fn request(&self, method: Method, url: Url, with_deadline: bool) -> RequestBuilder {
        let mut rb = self.http.request(method, url);
        if let Some(v) = &self.token_header {
            rb = rb.header(wire::ACCESS_TOKEN_HEADER, v.clone());
        }
        if let (true, Some(t)) = (with_deadline, self.request_timeout) {
            rb = rb.timeout(t);
        }
        rb
    }

    /// Sends a non-streaming request, checks the status and returns the response.
    pub(crate) async fn call(
        &self,
        op: &'static str,
        method: Method,
        path: &str,
        q: &[(&str, &str)],
        build: impl FnOnce(RequestBuilder) -> RequestBuilder,
    ) -> Result<Response, ExecdError> {
        let rb = build(self.request(method, self.url(path, q), true));
        self.send(op, rb).await
    }

    pub(crate) async fn post_json<T: Serialize + ?Sized>(
        &self,
        op: &'static str,
        path: &str,
        q: &[(&str, &str)],
        body: &T,
    ) -> Result<Response, ExecdError> {
        let body =
            serde_json::to_vec(body).map_err(|e| ExecdError::InvalidRequest(e.to_string()))?;
        self.call(op, Method::POST, path, q, |rb| {
            rb.header(header::CONTENT_TYPE, "application/json")
                .body(body)
        })
        .await
    }

    async fn send(&self, op: &'static str, rb: RequestBuilder) -> Result<Response, ExecdError> {
        let response = rb.send().await.map_err(|e| self.transport_error(op, e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        if status.is_redirection() {
            let location = response
                .headers()
                .get(header::LOCATION)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default();
            return Err(ExecdError::Redirect {
                operation: op,
                status: status.as_u16(),
                location: self.redact(&truncate(&location, MAX_QUOTED)),
            });
        }
        let body = read_limited(response, MAX_ERROR_BODY).await;
        Err(self.status_error(op, status, &body))
    }

    async fn with_deadline<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, ExecdError>>,
    ) -> Result<T, ExecdError> {
        match self.request_timeout {
            Some(t) => tokio::time::timeout(t, fut)
                .await
                .map_err(|_| ExecdError::Timeout {
                    operation: op,
                    after: t,
                })?,
            None => fut.await,
        }
    }

    fn status_error(&self, op: &'static str, status: StatusCode, body: &[u8]) -> ExecdError {
        let parsed: Option<ErrorResponse> = serde_json::from_slice(body).ok();
        let (code, mut message) = match parsed {
            Some(e) => {
                let message = if !e.message.is_empty() {
                    e.message
                } else {
                    e.error
                };
                (e.code, message)
            }
            None => (
                String::new(),
                String::from_utf8_lossy(body).trim().to_owned(),
            ),
        };
        if message.is_empty() {
            message = status.canonical_reason().unwrap_or("no message").to_owned();
        }
        ExecdError::Status {
            operation: op,
            status: status.as_u16(),
            code: self.redact(&truncate(&code, 80)),
            message: self.redact(&truncate(&message, MAX_QUOTED)),
        }
    }

    fn transport_error(&self, op: &'static str, e: reqwest::Error) -> ExecdError {
        let timed_out = e.is_timeout();
        let connect = e.is_connect();
        let reason = self.redact(&error_chain(&e.without_url()));
        if connect {
            ExecdError::Connect {
                endpoint: self.endpoint.to_string(),
                reason,
            }
        } else if timed_out {
            ExecdError::Timeout {
                operation: op,
                after: self.request_timeout.unwrap_or_default(),
            }
        } else {
            ExecdError::Transport {
                operation: op,
                reason,
            }
        }
    }

    fn redact(&self, text: &str) -> String {
        match &self.token {
            Some(t) => t.redact(text),
            None => text.to_owned(),
        }
    }

    /// The whole body of `r`, at most the client's `max_answer_bytes`.
    async fn body(&self, op: &'static str, mut r: Response) -> Result<Bytes, ExecdError> {
        let max = self.max_answer_bytes;
        let too_long = |len: u64| ExecdError::Protocol {
            operation: op,
            reason: format!(
                "an answer of {len} bytes or more is over this client's bound of {max} bytes"
            ),
        };
        if let Some(len) = r.content_length().filter(|l| *l > max) {
            return Err(too_long(len));
        }
        let mut out = bytes::BytesMut::new();
        while let Some(chunk) = r.chunk().await.map_err(|e| self.transport_error(op, e))? {
            let len = (out.len() + chunk.len()) as u64;
            if len > max {
                return Err(too_long(len));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out.freeze())
    }

    pub(crate) async fn json<T: DeserializeOwned>(
        &self,
        op: &'static str,
        r: Response,
    ) -> Result<T, ExecdError> {
        let body = self.body(op, r).await?;
        serde_json::from_slice(&body).map_err(|e| ExecdError::Protocol {
            operation: op,
            reason: e.to_string(),
        })
    }

    /// Like `json`, reading an empty body or `null` as the default (the SDK does the same:
    /// `if not parsed: return []`).
    async fn json_or_default<T: DeserializeOwned + Default>(
        &self,
        op: &'static str,
        r: Response,
    ) -> Result<T, ExecdError> {
        let body = self.body(op, r).await?;
        let text = body.trim_ascii();
        if text.is_empty() || text == b"null" {
            return Ok(T::default());
        }
        serde_json::from_slice(text).map_err(|e| ExecdError::Protocol {
            operation: op,
            reason: e.to_string(),
        })
    }

    fn event_stream(&self, op: &'static str, response: Response) -> EventStream {
        struct State {
            body: Option<Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>>,
            parser: EventStreamParser,
            pending: VecDeque<ServerStreamEvent>,
            client: ExecdClient,
        }
        let state = State {
            body: Some(Box::pin(response.bytes_stream())),
            parser: EventStreamParser::new(),
            pending: VecDeque::new(),
            client: self.clone(),
        };
        Box::pin(futures::stream::unfold(state, move |mut st| async move {
            loop {
                if let Some(event) = st.pending.pop_front() {
                    return Some((Ok(event), st));
                }
                let body = st.body.as_mut()?;
                let step = match body.next().await {
                    Some(Ok(chunk)) => st.parser.push(&chunk).map_err(ExecdError::from),
                    Some(Err(e)) => Err(st.client.transport_error(op, e)),
                    None => {
                        st.body = None;
                        st.parser.finish().map_err(ExecdError::from)
                    }
                };
                match step {
                    Ok(events) => {
                        st.pending.extend(events);
                        if st.parser.is_done() {
                            // Done. A body whose end has already arrived (sessionbox's agent
                            // ends it with the terminal event) is read to that end without
                            // waiting, which gives its connection back to the pool for the
                            // next call; one still open (upstream keeps it open a while after
                            // the last event) is closed now.
                            if let Some(body) = st.body.take() {
                                finish_if_ended(body).await;
                            }
                        }
                    }
                    Err(e) => {
                        st.body = None;
                        st.pending.clear();
                        return Some((Err(e), st));
                    }
                }
            }
        }))
    }
}

/// Reads what is left of `body` (whose events are all in) while it comes without a wait: a body
/// whose end has arrived is thereby read to that end, so its connection is kept for the next
/// request; one still open is dropped, which closes its connection. The end may still be on
/// its way through the connection's task, so that task gets a few turns (yields, no timer)
/// before the body is given up.
async fn finish_if_ended<S>(mut body: Pin<Box<S>>)
where
    S: Stream<Item = reqwest::Result<Bytes>> + Send + ?Sized,
{
    use futures::FutureExt;
    for _ in 0..FINISH_TURNS {
        match body.next().now_or_never() {
            // The end: the connection goes back to the pool.
            Some(None) | Some(Some(Err(_))) => return,
            // Bytes after the terminal event are ignored (as the parser does).
            Some(Some(Ok(_))) => {}
            None => tokio::task::yield_now().await,
        }
    }
}

/// How many turns [`finish_if_ended`] gives a body's end to arrive.
const FINISH_TURNS: usize = 8;

async fn read_limited(mut response: Response, limit: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => out.extend_from_slice(&chunk),
            _ => break,
        }
    }
    out.truncate(limit);
    out
}

fn truncate(s: &str, max_chars: usize) -> String {
    let mut out: String = s.chars().take(max_chars).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// An error and its sources, joined with `: `, repeated messages left out.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::query;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            Endpoint::parse("/run/execd.sock").unwrap(),
            Endpoint::Unix("/run/execd.sock".into())
        );
        assert_eq!(
            Endpoint::parse("unix:/run/x").unwrap(),
            Endpoint::Unix("/run/x".into())
        );
        assert_eq!(
            Endpoint::parse("unix:///run/x").unwrap(),
            Endpoint::Unix("/run/x".into())
        );
        assert_eq!(
            Endpoint::parse("10.0.0.1:44772").unwrap(),
            Endpoint::Http("http://10.0.0.1:44772".into())
        );
        assert_eq!(
            Endpoint::parse("https://h/sandboxes/s/proxy/44772").unwrap(),
            Endpoint::Http("https://h/sandboxes/s/proxy/44772".into())
        );
        assert!(Endpoint::parse("ftp://x").is_err());
        assert!(Endpoint::parse("").is_err());
        assert!(ExecdClient::http("http://user:pw@h:1").is_err());
        assert!(ExecdClient::http("http://h:1/?q=1").is_err());
    }

    #[test]
    fn urls_keep_the_base_prefix_and_encode_queries() {
        let c = ExecdClient::http("http://h:1/sandboxes/s/proxy/44772/").unwrap();
        let u = c.url(
            wire::FILES_INFO,
            &[(query::PATH, "/w/a b&c"), (query::PATH, "/x")],
        );
        assert_eq!(
            u.as_str(),
            "http://h:1/sandboxes/s/proxy/44772/files/info?path=%2Fw%2Fa+b%26c&path=%2Fx"
        );
        let c = ExecdClient::unix("/tmp/s.sock").unwrap();
        assert_eq!(
            c.url(&wire::command_status_path("a/b"), &[]).as_str(),
            "http://localhost/command/status/a%2Fb"
        );
    }

    #[test]
    fn debug_hides_the_token() {
        let c = ExecdClient::builder(Endpoint::Http("http://h:1".into()))
            .token("top-secret")
            .build()
            .unwrap();
        let d = format!("{c:?}");
        assert!(!d.contains("top-secret"), "{d}");
        assert!(d.contains("***"), "{d}");
        let bad = ExecdClient::builder(Endpoint::Http("http://h:1".into()))
            .token("a\nb")
            .build()
            .unwrap_err();
        assert!(!bad.to_string().contains("a\nb"));
    }
}
