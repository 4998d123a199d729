//! A client for the subset of the AIO Sandbox `/v1` API that the `aio` runtime uses.
//!
//! Wire facts (from `shared/specs/aio/openapi.json`, AIO Sandbox 1.9.4, and the official
//! `agent-sandbox` Python SDK):
//! - Most responses are an envelope `{success, message, data, hint}`. File operations report
//!   failure as HTTP 200 with `success: false` and a `FileOperationError` in `data`.
//! - Request validation failures are HTTP 422 with `{"detail": [{loc, msg, type}]}`; other
//!   rejections of a well-formed request come back as 422 with `{"detail": "text"}`. Both are
//!   [`AioError::Rejected`].
//! - Commands go through `POST /v1/bash/exec` (separate stdout and stderr, an exit code, a
//!   status) and `POST /v1/bash/output` (polling by byte offset); never through `/v1/shell`,
//!   a shared interactive terminal that corrupts under concurrent callers.
//! - Byte-exact reads use `GET /v1/file/download`; byte-exact writes use `POST /v1/file/write`
//!   with `encoding: "base64"`.
//!
//! The token, when there is one, travels only in a header marked sensitive; it never appears in
//! an error, a log line or a URL. The client never sets the API's `sudo` flag.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Environment variable naming the AIO Sandbox base URL.
pub const ENV_BASE_URL: &str = "AIO_SANDBOX_BASE_URL";
/// Environment variable holding the API token (optional).
pub const ENV_TOKEN: &str = "AIO_SANDBOX_TOKEN";
/// Environment variable choosing the auth header: `bearer` (default) or `x-aio-api-key`.
pub const ENV_AUTH_HEADER: &str = "AIO_SANDBOX_AUTH_HEADER";

/// A secret string whose `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself; use it only to build the header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// How the token is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthHeader {
    /// `Authorization: Bearer TOKEN` (the default).
    #[default]
    Bearer,
    /// `X-AIO-API-Key: TOKEN`.
    ApiKey,
}

impl AuthHeader {
    /// Parses `bearer` or `x-aio-api-key` (case-insensitive).
    ///
    /// # Errors
    /// [`AioError::Config`] for anything else.
    pub fn parse(s: &str) -> Result<Self, AioError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bearer" | "authorization" => Ok(AuthHeader::Bearer),
            "x-aio-api-key" | "api-key" => Ok(AuthHeader::ApiKey),
            other => Err(AioError::Config(format!(
                "{ENV_AUTH_HEADER} must be \"bearer\" or \"x-aio-api-key\", not {other:?}"
            ))),
        }
    }
}

/// Where and how to reach an AIO Sandbox server.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The base URL, for example `http://127.0.0.1:8080` (the `/v1/...` routes hang off it).
    pub base_url: String,
    /// The API token, if the server wants one.
    pub token: Option<Secret>,
    /// How the token is sent.
    pub auth: AuthHeader,
    /// Time limit for one HTTP request that is not a long poll.
    pub request_timeout: Duration,
}

impl Endpoint {
    /// An endpoint without a token.
    pub fn new(base_url: impl Into<String>) -> Self {
        Endpoint {
            base_url: base_url.into(),
            token: None,
            auth: AuthHeader::Bearer,
            request_timeout: Duration::from_secs(60),
        }
    }

    /// The token and auth header from the environment ([`ENV_TOKEN`], [`ENV_AUTH_HEADER`]),
    /// added to `self`.
    ///
    /// # Errors
    /// [`AioError::Config`] for a bad [`ENV_AUTH_HEADER`].
    pub fn with_env_credentials(mut self) -> Result<Self, AioError> {
        if let Ok(t) = std::env::var(ENV_TOKEN)
            && !t.is_empty()
        {
            self.token = Some(Secret::new(t));
        }
        if let Ok(h) = std::env::var(ENV_AUTH_HEADER)
            && !h.is_empty()
        {
            self.auth = AuthHeader::parse(&h)?;
        }
        Ok(self)
    }
}

/// What went wrong talking to the AIO server. Messages never contain the token.
#[derive(Debug, thiserror::Error)]
pub enum AioError {
    /// The configuration is unusable (bad URL, bad header choice).
    #[error("invalid AIO configuration: {0}")]
    Config(String),
    /// The server could not be reached or the connection broke.
    #[error("cannot reach the AIO server at {endpoint} ({route}): {reason}")]
    Unreachable {
        /// The base URL.
        endpoint: String,
        /// The route called.
        route: String,
        /// What the HTTP client said.
        reason: String,
    },
    /// HTTP 401 or 403: the token is missing or wrong.
    #[error(
        "the AIO server refused the request to {route} (HTTP {status}): set {ENV_TOKEN} to a valid token (and {ENV_AUTH_HEADER} if it wants X-AIO-API-Key)"
    )]
    Unauthorized {
        /// The route called.
        route: String,
        /// 401 or 403.
        status: u16,
    },
    /// HTTP 422: the server rejected the request as invalid (either `detail` shape).
    #[error("the AIO server rejected the request to {route} as invalid: {detail}")]
    Rejected {
        /// The route called.
        route: String,
        /// The validation details, joined.
        detail: String,
    },
    /// The operation failed (`success: false`, at HTTP 200 or otherwise).
    #[error("{route} failed: {message}")]
    Failed {
        /// The route called.
        route: String,
        /// HTTP status.
        status: u16,
        /// The server's message.
        message: String,
        /// `FileOperationError.error_type`, when the server gave one (`not_found`, ...).
        error_type: Option<String>,
    },
    /// Another HTTP error status.
    #[error("the AIO server answered {route} with HTTP {status}: {message}")]
    Http {
        /// The route called.
        route: String,
        /// HTTP status.
        status: u16,
        /// The body's message, cut short.
        message: String,
    },
    /// The response did not have the shape the spec gives.
    #[error("unexpected response from {route}: {reason}")]
    Protocol {
        /// The route called.
        route: String,
        /// What was wrong.
        reason: String,
    },
    /// A download was larger than the caller's limit.
    #[error("{route}: the file is larger than {limit} bytes")]
    TooLarge {
        /// The route called.
        route: String,
        /// The limit.
        limit: u64,
    },
}

impl From<AioError> for sessionbox_core::Error {
    fn from(e: AioError) -> Self {
        use sessionbox_core::Error;
        match &e {
            AioError::Unauthorized { .. } => Error::Unauthorized(e.to_string()),
            AioError::Config(_) | AioError::Unreachable { .. } => Error::RuntimeUnavailable {
                runtime: "aio".into(),
                reason: e.to_string(),
                hint: format!(
                    "check the AIO Sandbox server's address ({ENV_BASE_URL}) and token ({ENV_TOKEN}), and that it is running"
                ),
            },
            AioError::Failed {
                error_type: Some(t),
                message,
                ..
            } => match t.as_str() {
                "not_found" | "file_not_found" => Error::NotFound(message.clone()),
                "already_exists" | "file_exists" => Error::AlreadyExists(message.clone()),
                "is_directory" | "not_directory" | "directory_not_empty" => {
                    Error::Conflict(message.clone())
                }
                _ => Error::Backend(e.to_string()),
            },
            AioError::TooLarge { limit, .. } => Error::TooLarge {
                what: "file".into(),
                limit: *limit,
            },
            _ => Error::Backend(e.to_string()),
        }
    }
}

/// `POST /v1/bash/exec` request body.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BashExecRequest {
    /// Shell command.
    pub command: String,
    /// Session to run in; a new one is made when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Absolute working directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec_dir: Option<String>,
    /// Extra environment variables for this command.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<std::collections::BTreeMap<String, String>>,
    /// Return at once with status `running`.
    pub async_mode: bool,
    /// Seconds to wait before answering `running` (sync mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// Seconds after which the server kills the command (`timed_out`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hard_timeout: Option<f64>,
    /// Characters per stream before middle truncation; 0 disables it.
    pub max_output_length: u64,
}

/// Lifecycle of a command (`data.status`). Not success or failure: see `exit_code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandStatus {
    /// Accepted, not started.
    Pending,
    /// Still executing.
    Running,
    /// Exited; `exit_code` is set.
    Completed,
    /// Killed after `hard_timeout`.
    TimedOut,
    /// Killed by `/v1/bash/kill`, session cleanup or an internal failure.
    Killed,
}

/// `data` of `POST /v1/bash/exec`.
#[derive(Debug, Clone, Deserialize)]
pub struct BashExecResult {
    /// The session it ran in.
    pub session_id: String,
    /// The command's id.
    pub command_id: String,
    /// Its status.
    pub status: CommandStatus,
    /// Stdout so far.
    #[serde(default)]
    pub stdout: Option<String>,
    /// Stderr so far.
    #[serde(default)]
    pub stderr: Option<String>,
    /// Exit code, once completed.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// Stdout byte offset for the next `/v1/bash/output`.
    #[serde(default)]
    pub offset: u64,
    /// Stderr byte offset for the next `/v1/bash/output`.
    #[serde(default)]
    pub stderr_offset: u64,
}

/// `POST /v1/bash/output` request body.
#[derive(Debug, Clone, Serialize)]
pub struct BashOutputRequest {
    /// The session.
    pub session_id: String,
    /// The command.
    pub command_id: Option<String>,
    /// Stdout byte offset to read from.
    pub offset: u64,
    /// Stderr byte offset to read from.
    pub stderr_offset: u64,
    /// Long-poll until there is news.
    pub wait: bool,
    /// Longest wait, in seconds.
    pub wait_timeout: f64,
}

/// `data.command` of `/v1/bash/output`.
#[derive(Debug, Clone, Deserialize)]
pub struct BashCommandInfo {
    /// The command's id.
    pub command_id: String,
    /// Its status.
    pub status: CommandStatus,
    /// Exit code, once completed.
    #[serde(default)]
    pub exit_code: Option<i32>,
}

/// `data` of `POST /v1/bash/output`.
#[derive(Debug, Clone, Deserialize)]
pub struct BashOutputResult {
    /// New stdout since the offset.
    #[serde(default)]
    pub stdout: String,
    /// New stderr since the offset.
    #[serde(default)]
    pub stderr: String,
    /// Next stdout offset.
    #[serde(default)]
    pub offset: u64,
    /// Next stderr offset.
    #[serde(default)]
    pub stderr_offset: u64,
    /// The command's status.
    #[serde(default)]
    pub command: Option<BashCommandInfo>,
}

/// One entry of `GET /v1/bash/sessions`.
#[derive(Debug, Clone, Deserialize)]
pub struct BashSessionInfo {
    /// Its id.
    pub session_id: String,
    /// `ready` or `closed`.
    #[serde(default)]
    pub status: String,
}

/// One entry of `/v1/file/list`.
#[derive(Debug, Clone, Deserialize)]
pub struct FileInfo {
    /// Name.
    pub name: String,
    /// Full path.
    #[serde(default)]
    pub path: String,
    /// Whether it is a directory.
    #[serde(default)]
    pub is_directory: bool,
    /// Size in bytes.
    #[serde(default)]
    pub size: Option<u64>,
    /// ISO 8601 modification time.
    #[serde(default)]
    pub modified_time: Option<String>,
}

#[derive(Debug, Deserialize)]
struct FileListResult {
    #[serde(default)]
    files: Vec<FileInfo>,
}

/// One match of `/v1/file/glob`.
#[derive(Debug, Clone, Deserialize)]
pub struct GlobFileInfo {
    /// Full path.
    pub path: String,
    /// Whether it is a directory.
    #[serde(default)]
    pub is_directory: bool,
}

#[derive(Debug, Deserialize)]
struct FileGlobResult {
    #[serde(default)]
    files: Vec<GlobFileInfo>,
    #[serde(default)]
    truncated: bool,
}

/// One match of `/v1/file/grep`.
#[derive(Debug, Clone, Deserialize)]
pub struct FileGrepMatch {
    /// File path.
    pub file: String,
    /// 1-based line number.
    pub line_number: u64,
    /// The line.
    pub line_content: String,
}

/// `data` of `/v1/file/grep`.
#[derive(Debug, Clone, Deserialize)]
pub struct FileGrepResult {
    /// Matches in order.
    #[serde(default)]
    pub matches: Vec<FileGrepMatch>,
    /// True when `max_results` cut the list.
    #[serde(default)]
    pub truncated: bool,
}

/// `/v1/file/grep` parameters sessionbox uses.
#[derive(Debug, Clone, Serialize)]
pub struct FileGrepRequest {
    /// File or directory (absolute).
    pub path: String,
    /// Regular expression.
    pub pattern: String,
    /// Case-insensitive.
    pub case_insensitive: bool,
    /// Most matches.
    pub max_results: u64,
    /// Skip larger files (`8M`, `500K`).
    pub max_file_size: String,
}

/// The server's context (`GET /v1/sandbox`).
#[derive(Debug, Clone, Deserialize)]
pub struct SandboxContext {
    /// Server version.
    #[serde(default)]
    pub version: String,
    /// Home directory of the sandbox user.
    #[serde(default)]
    pub home_dir: String,
}

#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(default = "yes")]
    success: bool,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    data: Value,
}

fn yes() -> bool {
    true
}

/// A client of one AIO Sandbox server. Cheap to clone.
#[derive(Clone)]
pub struct AioClient {
    http: reqwest::Client,
    base: Url,
    shown: String,
    request_timeout: Duration,
}

impl fmt::Debug for AioClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AioClient")
            .field("endpoint", &self.shown)
            .finish_non_exhaustive()
    }
}

impl AioClient {
    /// A client for `endpoint`. Makes no request.
    ///
    /// # Errors
    /// [`AioError::Config`] for a URL that is not `http(s)://host[:port][/prefix]`, or one that
    /// carries credentials (put the token in [`ENV_TOKEN`]).
    ///
    /// ```
    /// use sessionbox_aio::{AioClient, Endpoint};
    /// assert!(AioClient::new(&Endpoint::new("http://127.0.0.1:8080")).is_ok());
    /// assert!(AioClient::new(&Endpoint::new("http://user:pw@host/")).is_err());
    /// ```
    pub fn new(endpoint: &Endpoint) -> Result<Self, AioError> {
        let mut base = Url::parse(endpoint.base_url.trim()).map_err(|e| {
            AioError::Config(format!(
                "the endpoint is not a URL ({e}); give for example http://127.0.0.1:8080"
            ))
        })?;
        if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none() {
            return Err(AioError::Config(
                "the endpoint must be an http:// or https:// URL with a host".into(),
            ));
        }
        if !base.username().is_empty() || base.password().is_some() {
            return Err(AioError::Config(format!(
                "the endpoint URL must not carry credentials; put the token in {ENV_TOKEN}"
            )));
        }
        base.set_query(None);
        base.set_fragment(None);
        if !base.path().ends_with('/') {
            let p = format!("{}/", base.path());
            base.set_path(&p);
        }
        let mut headers = HeaderMap::new();
        if let Some(token) = &endpoint.token {
            let (name, value) = match endpoint.auth {
                AuthHeader::Bearer => ("authorization", format!("Bearer {}", token.expose())),
                AuthHeader::ApiKey => ("x-aio-api-key", token.expose().to_owned()),
            };
            let mut value = HeaderValue::from_str(&value).map_err(|_| {
                AioError::Config(format!(
                    "{ENV_TOKEN} contains characters not allowed in an HTTP header"
                ))
            })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| AioError::Config(format!("cannot build the HTTP client: {e}")))?;
        let shown = base.as_str().trim_end_matches('/').to_owned();
        Ok(AioClient {
            http,
            base,
            shown,
            request_timeout: endpoint.request_timeout,
        })
    }

    /// The base URL, for reports.
    pub fn endpoint(&self) -> &str {
        &self.shown
    }

    fn url(&self, route: &str) -> Url {
        // `route` is a fixed relative path such as "v1/bash/exec".
        self.base
            .join(route)
            .expect("fixed routes join onto the base")
    }

    fn unreachable(&self, route: &str, e: reqwest::Error) -> AioError {
        // reqwest's message names the URL (no credentials: those are refused in `new`).
        let mut reason = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            reason.push_str(": ");
            reason.push_str(&s.to_string());
            src = s.source();
        }
        AioError::Unreachable {
            endpoint: self.shown.clone(),
            route: route.to_owned(),
            reason,
        }
    }

    async fn send(
        &self,
        method: Method,
        route: &str,
        body: Option<&impl Serialize>,
        timeout: Duration,
    ) -> Result<reqwest::Response, AioError> {
        let mut req = self.http.request(method, self.url(route)).timeout(timeout);
        if let Some(b) = body {
            let json = serde_json::to_vec(b).map_err(|e| AioError::Protocol {
                route: route.into(),
                reason: format!("cannot encode the request: {e}"),
            })?;
            req = req.header("content-type", "application/json").body(json);
        }
        req.send().await.map_err(|e| self.unreachable(route, e))
    }

    /// Calls a JSON route and returns the envelope's `data`.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        route: &str,
        body: Option<&impl Serialize>,
        timeout: Duration,
    ) -> Result<T, AioError> {
        let resp = self.send(method, route, body, timeout).await?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| self.unreachable(route, e))?;
        let data = decode_envelope(route, status, &bytes)?;
        serde_json::from_value(data).map_err(|e| AioError::Protocol {
            route: route.into(),
            reason: format!("the data does not match the spec: {e}"),
        })
    }

    /// `GET /v1/sandbox`: version and home directory.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn context(&self) -> Result<SandboxContext, AioError> {
        let route = "v1/sandbox";
        let resp = self
            .send(Method::GET, route, None::<&()>, self.request_timeout)
            .await?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| self.unreachable(route, e))?;
        // This one is not wrapped: version and home_dir sit beside the envelope's fields.
        decode_envelope(route, status, &bytes)?;
        serde_json::from_slice(&bytes).map_err(|e| AioError::Protocol {
            route: route.into(),
            reason: e.to_string(),
        })
    }

    /// `POST /v1/bash/exec`.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn bash_exec(&self, req: &BashExecRequest) -> Result<BashExecResult, AioError> {
        let wait = req.timeout.unwrap_or(0.0).max(0.0);
        let timeout = self.request_timeout + Duration::from_secs_f64(wait.min(3600.0));
        self.call(Method::POST, "v1/bash/exec", Some(req), timeout)
            .await
    }

    /// `POST /v1/bash/output`.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn bash_output(&self, req: &BashOutputRequest) -> Result<BashOutputResult, AioError> {
        let timeout = self.request_timeout + Duration::from_secs_f64(req.wait_timeout.max(0.0));
        self.call(Method::POST, "v1/bash/output", Some(req), timeout)
            .await
    }

    /// `POST /v1/bash/kill` with `signal` (`SIGTERM`, `SIGKILL`, `SIGINT`).
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn bash_kill(&self, session_id: &str, signal: &str) -> Result<(), AioError> {
        let body = serde_json::json!({"session_id": session_id, "signal": signal});
        self.call::<Value>(
            Method::POST,
            "v1/bash/kill",
            Some(&body),
            self.request_timeout,
        )
        .await
        .map(drop)
    }

    /// `GET /v1/bash/sessions`.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn bash_sessions(&self) -> Result<Vec<BashSessionInfo>, AioError> {
        let v: Option<Vec<BashSessionInfo>> = self
            .call(
                Method::GET,
                "v1/bash/sessions",
                None::<&()>,
                self.request_timeout,
            )
            .await?;
        Ok(v.unwrap_or_default())
    }

    /// `POST /v1/bash/sessions/{id}/close`.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn bash_close(&self, session_id: &str) -> Result<(), AioError> {
        if session_id.is_empty()
            || !session_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(AioError::Config(format!(
                "session id {session_id:?} is not [A-Za-z0-9_-]+"
            )));
        }
        let route = format!("v1/bash/sessions/{session_id}/close");
        self.call::<Value>(Method::POST, &route, None::<&()>, self.request_timeout)
            .await
            .map(drop)
    }

    /// `POST /v1/file/write` with base64: writes `data` to `path` byte for byte.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn write_file(&self, path: &str, data: &[u8]) -> Result<(), AioError> {
        let body = serde_json::json!({
            "file": path,
            "content": base64::engine::general_purpose::STANDARD.encode(data),
            "encoding": "base64",
        });
        #[derive(Deserialize)]
        struct Written {
            #[serde(default)]
            bytes_written: Option<u64>,
        }
        let w: Written = self
            .call(
                Method::POST,
                "v1/file/write",
                Some(&body),
                self.request_timeout,
            )
            .await?;
        match w.bytes_written {
            Some(n) if n != data.len() as u64 => Err(AioError::Protocol {
                route: "v1/file/write".into(),
                reason: format!("{n} bytes written of {}", data.len()),
            }),
            _ => Ok(()),
        }
    }

    /// `GET /v1/file/download`: the file's bytes, refusing more than `limit`.
    ///
    /// # Errors
    /// [`AioError::TooLarge`] past `limit`; see [`AioError`].
    pub async fn download(&self, path: &str, limit: u64) -> Result<Vec<u8>, AioError> {
        let route = "v1/file/download";
        let mut url = self.url(route);
        url.query_pairs_mut().append_pair("path", path);
        let mut resp = self
            .http
            .get(url)
            .timeout(self.request_timeout)
            .send()
            .await
            .map_err(|e| self.unreachable(route, e))?;
        let status = resp.status();
        if !status.is_success() {
            let bytes = resp.bytes().await.map_err(|e| self.unreachable(route, e))?;
            decode_envelope(route, status, &bytes)?;
            return Err(AioError::Http {
                route: route.into(),
                status: status.as_u16(),
                message: shorten(&String::from_utf8_lossy(&bytes)),
            });
        }
        let mut out = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.unreachable(route, e))? {
            if (out.len() + chunk.len()) as u64 > limit {
                return Err(AioError::TooLarge {
                    route: route.into(),
                    limit,
                });
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    /// `POST /v1/file/list` of one directory (not recursive, hidden files included).
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn list(&self, path: &str) -> Result<Vec<FileInfo>, AioError> {
        let body = serde_json::json!({"path": path, "recursive": false, "show_hidden": true,
            "include_size": true, "sort_by": "name"});
        let r: FileListResult = self
            .call(
                Method::POST,
                "v1/file/list",
                Some(&body),
                self.request_timeout,
            )
            .await?;
        Ok(r.files)
    }

    /// `POST /v1/file/glob` under `path`; hidden files included, files only. Returns the
    /// matches and whether `max` cut them.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn glob(
        &self,
        path: &str,
        pattern: &str,
        max: u64,
    ) -> Result<(Vec<GlobFileInfo>, bool), AioError> {
        let body = serde_json::json!({"path": path, "pattern": pattern, "include_hidden": true,
            "files_only": true, "include_metadata": false, "max_results": max.clamp(1, 50_000),
            "sort_by": "path"});
        let r: FileGlobResult = self
            .call(
                Method::POST,
                "v1/file/glob",
                Some(&body),
                self.request_timeout,
            )
            .await?;
        Ok((r.files, r.truncated))
    }

    /// `POST /v1/file/grep`.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn grep(&self, req: &FileGrepRequest) -> Result<FileGrepResult, AioError> {
        self.call(
            Method::POST,
            "v1/file/grep",
            Some(req),
            self.request_timeout,
        )
        .await
    }
}

fn shorten(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() <= 300 {
        s.to_owned()
    } else {
        format!("{}...", s.chars().take(300).collect::<String>())
    }
}

/// Decodes a response: the envelope's `data` on success, a typed error otherwise.
fn decode_envelope(route: &str, status: StatusCode, body: &[u8]) -> Result<Value, AioError> {
    let route = route.to_owned();
    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        return Err(AioError::Unauthorized {
            route,
            status: status.as_u16(),
        });
    }
    let json: Option<Value> = serde_json::from_slice(body).ok();
    if status == StatusCode::UNPROCESSABLE_ENTITY {
        let detail = match json.as_ref().and_then(|j| j.get("detail")) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| {
                    let loc = i
                        .get("loc")
                        .and_then(Value::as_array)
                        .map(|l| {
                            l.iter()
                                .map(|p| match p {
                                    Value::String(s) => s.clone(),
                                    other => other.to_string(),
                                })
                                .collect::<Vec<_>>()
                                .join(".")
                        })
                        .unwrap_or_default();
                    let msg = i.get("msg").and_then(Value::as_str).unwrap_or("invalid");
                    if loc.is_empty() {
                        msg.to_owned()
                    } else {
                        format!("{loc}: {msg}")
                    }
                })
                .collect::<Vec<_>>()
                .join("; "),
            _ => json
                .as_ref()
                .and_then(|j| j.get("message"))
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| shorten(&String::from_utf8_lossy(body))),
        };
        return Err(AioError::Rejected {
            route,
            detail: shorten(&detail),
        });
    }
    let envelope = json
        .as_ref()
        .filter(|j| j.get("success").is_some() || j.get("data").is_some())
        .and_then(|j| serde_json::from_value::<Envelope>(j.clone()).ok());
    match envelope {
        Some(env) if !env.success => {
            let error_type = env
                .data
                .get("error_type")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let message = env
                .message
                .or_else(|| {
                    env.data
                        .get("message")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| "the operation failed".into());
            Err(AioError::Failed {
                route,
                status: status.as_u16(),
                message: shorten(&message),
                error_type,
            })
        }
        Some(env) if status.is_success() => Ok(env.data),
        _ if status.is_success() => Err(AioError::Protocol {
            route,
            reason: "the body is not a {success, message, data} envelope".into(),
        }),
        _ => {
            let message = json
                .as_ref()
                .and_then(|j| j.get("detail").or_else(|| j.get("message")))
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
            Err(AioError::Http {
                route,
                status: status.as_u16(),
                message: shorten(&message),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_200_failure_is_typed_with_its_error_type() {
        let body = br#"{"success":false,"message":"read failed: No such file","data":{"path":"/x","operation":"read","message":"m","error_type":"not_found"},"hint":null}"#;
        let e = decode_envelope("v1/file/read", StatusCode::OK, body).unwrap_err();
        match &e {
            AioError::Failed {
                error_type,
                message,
                status,
                ..
            } => {
                assert_eq!(error_type.as_deref(), Some("not_found"));
                assert_eq!(message, "read failed: No such file");
                assert_eq!(*status, 200);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(sessionbox_core::Error::from(e).code(), "not_found");
    }

    #[test]
    fn both_422_shapes_are_rejections_with_their_details() {
        let list =
            br#"{"detail":[{"type":"missing","loc":["body","command"],"msg":"Field required"}]}"#;
        match decode_envelope("v1/bash/exec", StatusCode::UNPROCESSABLE_ENTITY, list) {
            Err(AioError::Rejected { detail, .. }) => {
                assert_eq!(detail, "body.command: Field required")
            }
            other => panic!("{other:?}"),
        }
        let text = br#"{"detail":"content is not valid base64"}"#;
        match decode_envelope("v1/file/write", StatusCode::UNPROCESSABLE_ENTITY, text) {
            Err(AioError::Rejected { detail, .. }) => {
                assert_eq!(detail, "content is not valid base64")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn success_returns_data_and_non_envelope_is_a_protocol_error() {
        let ok = br#"{"success":true,"message":"Operation successful","data":{"a":1},"hint":null}"#;
        assert_eq!(
            decode_envelope("r", StatusCode::OK, ok).unwrap(),
            serde_json::json!({"a": 1})
        );
        assert!(matches!(
            decode_envelope("r", StatusCode::OK, b"<html>"),
            Err(AioError::Protocol { .. })
        ));
        assert!(matches!(
            decode_envelope("r", StatusCode::BAD_GATEWAY, b"<html>bad gateway</html>"),
            Err(AioError::Http { status: 502, .. })
        ));
        assert!(matches!(
            decode_envelope("r", StatusCode::UNAUTHORIZED, b""),
            Err(AioError::Unauthorized { status: 401, .. })
        ));
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let mut ep = Endpoint::new("http://127.0.0.1:1");
        ep.token = Some(Secret::new("hunter2-token"));
        assert!(!format!("{ep:?}").contains("hunter2"));
        let c = AioClient::new(&ep).unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn endpoint_urls_are_checked() {
        for bad in ["ftp://x", "not a url", "http://u:p@h:1/", "http://tok@h/"] {
            assert!(AioClient::new(&Endpoint::new(bad)).is_err(), "{bad}");
        }
        let c = AioClient::new(&Endpoint::new("http://h:1/prefix")).unwrap();
        assert_eq!(
            c.url("v1/bash/exec").as_str(),
            "http://h:1/prefix/v1/bash/exec"
        );
    }
}
