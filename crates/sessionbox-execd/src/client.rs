//! The async execd client, over a Unix socket or HTTP(S).

use std::collections::{BTreeMap, VecDeque};
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
use crate::multipart;
use crate::outcome::{CommandOutcome, OutcomeCollector};
use crate::stream::EventStreamParser;
use crate::token::AccessToken;
use crate::types::{
    CommandLogs, CommandStatus, ErrorResponse, FileInfo, Metrics, Permission, RenameFileItem,
    ReplaceFileContentItem, ReplaceFileContentResult, RunCommandRequest, ServerStreamEvent,
    UploadFile,
};
use crate::wire::{self, query};

/// Default deadline for opening a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default deadline for a whole non-streaming request, and for the response head of a stream.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long [`ExecdClient::run_command`] waits past a command's own `timeout` before giving up
/// on the server.
pub const STREAM_GRACE: Duration = Duration::from_secs(30);
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
}

impl ExecdClientBuilder {
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

    // ----- health -----

    /// `GET /ping`: succeeds when execd answers 2xx.
    pub async fn ping(&self) -> Result<(), ExecdError> {
        self.call("ping", Method::GET, wire::PING, &[], |rb| rb)
            .await
            .map(drop)
    }

    // ----- commands -----

    /// `POST /command`, collecting the whole outcome. Returns at the terminal event, not at the
    /// end of the body. When the request has a `timeout`, gives up [`STREAM_GRACE`] after it.
    pub async fn run_command(
        &self,
        request: &RunCommandRequest,
    ) -> Result<CommandOutcome, ExecdError> {
        self.run_command_with(request, |_| {}).await
    }

    /// Like [`run_command`](Self::run_command), also handing every event to `on_event` as it
    /// arrives (for live output).
    pub async fn run_command_with(
        &self,
        request: &RunCommandRequest,
        mut on_event: impl FnMut(&ServerStreamEvent) + Send,
    ) -> Result<CommandOutcome, ExecdError> {
        let mut collector = OutcomeCollector::new(request);
        let run = async {
            let mut events = self.run_command_stream(request).await?;
            while let Some(event) = events.next().await {
                let event = event?;
                collector.apply(&event);
                on_event(&event);
            }
            Ok::<(), ExecdError>(())
        };
        match request.timeout_ms {
            Some(ms) => {
                let limit = Duration::from_millis(ms).saturating_add(STREAM_GRACE);
                tokio::time::timeout(limit, run)
                    .await
                    .map_err(|_| ExecdError::Timeout {
                        operation: "run command",
                        after: limit,
                    })??
            }
            None => run.await?,
        }
        Ok(collector.finish())
    }

    /// `POST /command`, as a stream of events that ends right after the terminal event (the
    /// connection is dropped then, although upstream would keep it open about a second more).
    /// A body that ends before the terminal event yields a final
    /// [`StreamError::MissingTerminal`](crate::StreamError::MissingTerminal).
    ///
    /// Dropping the stream closes the connection; upstream then kills a foreground command.
    pub async fn run_command_stream(
        &self,
        request: &RunCommandRequest,
    ) -> Result<EventStream, ExecdError> {
        const OP: &str = "run command";
        request.validate().map_err(ExecdError::InvalidRequest)?;
        let body =
            serde_json::to_vec(request).map_err(|e| ExecdError::InvalidRequest(e.to_string()))?;
        let rb = self
            .request(Method::POST, self.url(wire::COMMAND, &[]), false)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, wire::EVENT_STREAM_CONTENT_TYPE)
            .header(header::CACHE_CONTROL, "no-cache")
            .body(body);
        let response = self.with_deadline(OP, self.send(OP, rb)).await?;
        Ok(self.event_stream(OP, response))
    }

    /// `DELETE /command?id=`: interrupts a running command.
    pub async fn interrupt_command(&self, id: &str) -> Result<(), ExecdError> {
        self.call(
            "interrupt command",
            Method::DELETE,
            wire::COMMAND,
            &[(query::ID, id)],
            |rb| rb,
        )
        .await
        .map(drop)
    }

    /// `GET /command/status/{id}`.
    pub async fn command_status(&self, id: &str) -> Result<CommandStatus, ExecdError> {
        const OP: &str = "command status";
        let path = wire::command_status_path(id);
        let r = self.call(OP, Method::GET, &path, &[], |rb| rb).await?;
        self.json(OP, r).await
    }

    /// `GET /command/{id}/logs?cursor=`: output of a background command after line `cursor`
    /// (all of it when `None`), and the cursor for the next call.
    pub async fn command_logs(
        &self,
        id: &str,
        cursor: Option<u64>,
    ) -> Result<CommandLogs, ExecdError> {
        const OP: &str = "command logs";
        let path = wire::command_logs_path(id);
        let cursor_text = cursor.map(|c| c.to_string());
        let q: Vec<(&str, &str)> = cursor_text
            .as_deref()
            .map(|c| vec![(query::CURSOR, c)])
            .unwrap_or_default();
        let r = self.call(OP, Method::GET, &path, &q, |rb| rb).await?;
        let next = r
            .headers()
            .get(wire::TAIL_CURSOR_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let body = self.body(OP, r).await?;
        Ok(CommandLogs {
            content: String::from_utf8_lossy(&body).into_owned(),
            cursor: next,
        })
    }

    // ----- files -----

    /// `GET /files/info?path=...`: metadata by path.
    pub async fn files_info<I, S>(&self, paths: I) -> Result<BTreeMap<String, FileInfo>, ExecdError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        const OP: &str = "files info";
        let paths = collect_paths(paths)?;
        let q = path_query(&paths);
        let r = self
            .call(OP, Method::GET, wire::FILES_INFO, &q, |rb| rb)
            .await?;
        self.json_or_default(OP, r).await
    }

    /// `DELETE /files?path=...`: removes files (not directories).
    pub async fn remove_files<I, S>(&self, paths: I) -> Result<(), ExecdError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let paths = collect_paths(paths)?;
        let q = path_query(&paths);
        self.call("remove files", Method::DELETE, wire::FILES, &q, |rb| rb)
            .await
            .map(drop)
    }

    /// `POST /files/mv`: renames or moves files.
    pub async fn move_files(&self, items: &[RenameFileItem]) -> Result<(), ExecdError> {
        self.post_json("move files", wire::FILES_MOVE, &[], items)
            .await
            .map(drop)
    }

    /// `POST /files/permissions`: sets owner, group and mode by path.
    pub async fn chmod_files(
        &self,
        permissions: &BTreeMap<String, Permission>,
    ) -> Result<(), ExecdError> {
        self.post_json("set permissions", wire::FILES_PERMISSIONS, &[], permissions)
            .await
            .map(drop)
    }

    /// `GET /files/search?path=&pattern=`: files below `dir` matching a glob (`**` when `None`,
    /// which the SDK sends explicitly too).
    pub async fn search_files(
        &self,
        dir: &str,
        pattern: Option<&str>,
    ) -> Result<Vec<FileInfo>, ExecdError> {
        const OP: &str = "search files";
        let q = [
            (query::PATH, dir),
            (query::PATTERN, pattern.unwrap_or("**")),
        ];
        let r = self
            .call(OP, Method::GET, wire::FILES_SEARCH, &q, |rb| rb)
            .await?;
        self.json_or_default(OP, r).await
    }

    /// `POST /files/replace?verbose=true`: replaces text in files; returns the count per file
    /// (an empty map from a server that ignores `verbose`).
    pub async fn replace_content(
        &self,
        items: &BTreeMap<String, ReplaceFileContentItem>,
    ) -> Result<BTreeMap<String, ReplaceFileContentResult>, ExecdError> {
        const OP: &str = "replace content";
        if items.values().any(|i| i.old.is_empty()) {
            return Err(ExecdError::InvalidRequest(
                "the text to replace must not be empty".into(),
            ));
        }
        let r = self
            .post_json(OP, wire::FILES_REPLACE, &[(query::VERBOSE, "true")], items)
            .await?;
        self.json_or_default(OP, r).await
    }

    /// `POST /files/upload`: writes files (multipart, metadata and data parts paired by order,
    /// sent with a `Content-Length` so it also passes the OpenSandbox server proxy). Does
    /// nothing for an empty list, as the SDK.
    pub async fn upload(&self, files: &[UploadFile]) -> Result<(), ExecdError> {
        if files.is_empty() {
            return Ok(());
        }
        if files.iter().any(|f| f.metadata.path.is_empty()) {
            return Err(ExecdError::InvalidRequest("an upload path is empty".into()));
        }
        let body = multipart::encode_upload(files);
        let content_type = body.content_type();
        self.call(
            "upload files",
            Method::POST,
            wire::FILES_UPLOAD,
            &[],
            move |rb| {
                rb.header(header::CONTENT_TYPE, content_type)
                    .body(body.body)
            },
        )
        .await
        .map(drop)
    }

    /// `GET /files/download?path=`: the whole file.
    pub async fn download(&self, path: &str) -> Result<Bytes, ExecdError> {
        const OP: &str = "download file";
        let r = self
            .call(
                OP,
                Method::GET,
                wire::FILES_DOWNLOAD,
                &[(query::PATH, path)],
                |rb| rb,
            )
            .await?;
        self.body(OP, r).await
    }

    /// `GET /files/download?path=` with `Range: bytes=START-[END]` (`end` inclusive). A server
    /// that ignores the range and answers 200 with the whole file is cut down here.
    pub async fn download_range(
        &self,
        path: &str,
        start: u64,
        end: Option<u64>,
    ) -> Result<Bytes, ExecdError> {
        const OP: &str = "download range";
        if end.is_some_and(|e| e < start) {
            return Err(ExecdError::InvalidRequest(format!(
                "range end {} is before its start {start}",
                end.unwrap_or_default()
            )));
        }
        let range = match end {
            Some(e) => format!("bytes={start}-{e}"),
            None => format!("bytes={start}-"),
        };
        let r = self
            .call(
                OP,
                Method::GET,
                wire::FILES_DOWNLOAD,
                &[(query::PATH, path)],
                |rb| rb.header(header::RANGE, range),
            )
            .await?;
        let partial = r.status() == StatusCode::PARTIAL_CONTENT;
        let body = self.body(OP, r).await?;
        if partial {
            return Ok(body);
        }
        let len = body.len() as u64;
        let from = start.min(len) as usize;
        let to = end.map_or(len, |e| e.saturating_add(1).min(len)) as usize;
        Ok(body.slice(from..to))
    }

    /// `GET /files/download?path=&offset=&limit=`: `limit` lines (all when `None`) from line
    /// `offset` (1-based), as text.
    pub async fn download_lines(
        &self,
        path: &str,
        offset: u64,
        limit: Option<u64>,
    ) -> Result<String, ExecdError> {
        const OP: &str = "download lines";
        let offset = offset.max(1).to_string();
        let limit = limit.map(|l| l.to_string());
        let mut q = vec![(query::PATH, path), (query::OFFSET, offset.as_str())];
        if let Some(l) = &limit {
            q.push((query::LIMIT, l));
        }
        let r = self
            .call(OP, Method::GET, wire::FILES_DOWNLOAD, &q, |rb| rb)
            .await?;
        let body = self.body(OP, r).await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    // ----- directories -----

    /// `GET /directories/list?path=&depth=`: entries below `dir`, down to `depth` levels (the
    /// server's default, 1 = immediate children, when `None`; the SDK then sends no `depth`).
    pub async fn list_directory(
        &self,
        dir: &str,
        depth: Option<u32>,
    ) -> Result<Vec<FileInfo>, ExecdError> {
        const OP: &str = "list directory";
        let depth = depth.map(|d| d.to_string());
        let mut q = vec![(query::PATH, dir)];
        if let Some(d) = &depth {
            q.push((query::DEPTH, d.as_str()));
        }
        let r = self
            .call(OP, Method::GET, wire::DIRECTORIES_LIST, &q, |rb| rb)
            .await?;
        self.json_or_default(OP, r).await
    }

    /// `POST /directories`: creates directories with parents (`mkdir -p`).
    pub async fn make_dirs(&self, dirs: &BTreeMap<String, Permission>) -> Result<(), ExecdError> {
        self.post_json("make directories", wire::DIRECTORIES, &[], dirs)
            .await
            .map(drop)
    }

    /// `DELETE /directories?path=...`: removes directories recursively.
    pub async fn remove_dirs<I, S>(&self, paths: I) -> Result<(), ExecdError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let paths = collect_paths(paths)?;
        let q = path_query(&paths);
        self.call(
            "remove directories",
            Method::DELETE,
            wire::DIRECTORIES,
            &q,
            |rb| rb,
        )
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

    async fn body(&self, op: &'static str, r: Response) -> Result<Bytes, ExecdError> {
        r.bytes().await.map_err(|e| self.transport_error(op, e))
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
                            // Close now: upstream keeps the response open after the last event.
                            st.body = None;
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

fn collect_paths<I, S>(paths: I) -> Result<Vec<String>, ExecdError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let paths: Vec<String> = paths.into_iter().map(|p| p.as_ref().to_owned()).collect();
    if paths.is_empty() {
        return Err(ExecdError::InvalidRequest(
            "at least one path is required".into(),
        ));
    }
    Ok(paths)
}

fn path_query(paths: &[String]) -> Vec<(&'static str, &str)> {
    paths.iter().map(|p| (query::PATH, p.as_str())).collect()
}

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
