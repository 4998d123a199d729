//! The OpenSandbox lifecycle API client: create, get, list, delete, renew, pause, resume,
//! endpoints and the health probe.
//!
//! The oracle is the released `opensandbox-server==1.1.1`, not the published YAML; where they
//! differ this module follows the server (each such rule says so). This module depends on no
//! other sessionbox crate: it could be published on its own.
//!
//! Trust rules (as hardened OpenSandbox integrations apply them):
//! - the API key is sent only to the lifecycle origin, in `OPEN-SANDBOX-API-KEY`, and never
//!   appears in a `Debug` output or an error;
//! - redirects are never followed (a 3xx is [`OpenSandboxError::Redirect`]);
//! - an execd endpoint returned by the server is used only after [`validate_endpoint`] accepts it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use reqwest::header::{HeaderValue, LOCATION};
use reqwest::{Method, StatusCode, Url};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

use crate::endpoint::{EndpointPolicy, ValidatedEndpoint, validate_endpoint};
use crate::error::OpenSandboxError;
use crate::metadata::Metadata;

/// The header carrying the API key (the server's `SANDBOX_API_KEY_HEADER`).
pub const API_KEY_HEADER: &str = "OPEN-SANDBOX-API-KEY";
/// The port execd listens on inside every sandbox.
pub const EXECD_PORT: u16 = 44772;
/// The least sandbox timeout the server accepts (seconds).
pub const MIN_TIMEOUT_SECS: u64 = 60;
/// Default deadline for opening a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default deadline for a lifecycle request other than create.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default deadline for create, which answers only once the container has started.
pub const DEFAULT_CREATE_TIMEOUT: Duration = Duration::from_secs(120);
/// Most bytes of an error body read.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Most characters of a server message quoted in an error.
const MAX_QUOTED: usize = 300;
/// Page size used when listing every page.
const PAGE_SIZE: u32 = 200;

/// An OpenSandbox API key. Its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    ///
    /// # Errors
    /// [`OpenSandboxError::InvalidInput`] when it is empty or not a valid header value.
    pub fn new(key: impl Into<String>) -> Result<Self, OpenSandboxError> {
        let key = key.into();
        if key.is_empty() || HeaderValue::from_str(&key).is_err() {
            return Err(OpenSandboxError::InvalidInput(
                "the OpenSandbox API key is empty or holds characters a header cannot carry".into(),
            ));
        }
        Ok(ApiKey(key))
    }

    /// The key itself, for the header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Settings of an [`OpenSandboxClient`].
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The lifecycle server: `http(s)://host[:port]`, or `host:port` (then `http`). A path is
    /// not allowed: the client adds `/v1`.
    pub server: String,
    /// The API key; `None` for a server that runs without one.
    pub api_key: Option<ApiKey>,
    /// Deadline for opening a connection.
    pub connect_timeout: Duration,
    /// Deadline for each request other than create.
    pub request_timeout: Duration,
    /// Deadline for create.
    pub create_timeout: Duration,
    /// Ask for server-proxied endpoints (`use_server_proxy=true`), the default. Direct
    /// endpoints are accepted only when their host is in `direct_hosts`.
    pub use_server_proxy: bool,
    /// Hosts a direct endpoint may name.
    pub direct_hosts: Vec<String>,
}

impl ClientConfig {
    /// Defaults for `server` with `api_key`: server proxy on, default deadlines.
    pub fn new(server: impl Into<String>, api_key: Option<ApiKey>) -> Self {
        ClientConfig {
            server: server.into(),
            api_key,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            create_timeout: DEFAULT_CREATE_TIMEOUT,
            use_server_proxy: true,
            direct_hosts: Vec::new(),
        }
    }
}

/// A sandbox's lifecycle state. States this client does not know are kept as
/// [`SandboxState::Other`], never an error.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SandboxState {
    /// Being created.
    Pending,
    /// Running.
    Running,
    /// Being paused.
    Pausing,
    /// Paused.
    Paused,
    /// Being resumed.
    Resuming,
    /// Being stopped or deleted.
    Stopping,
    /// Stopped for good.
    Terminated,
    /// Failed.
    Failed,
    /// A state this client does not know, as the server spelled it.
    Other(String),
}

impl SandboxState {
    /// The state as the server spells it.
    pub fn as_str(&self) -> &str {
        match self {
            SandboxState::Pending => "Pending",
            SandboxState::Running => "Running",
            SandboxState::Pausing => "Pausing",
            SandboxState::Paused => "Paused",
            SandboxState::Resuming => "Resuming",
            SandboxState::Stopping => "Stopping",
            SandboxState::Terminated => "Terminated",
            SandboxState::Failed => "Failed",
            SandboxState::Other(s) => s,
        }
    }

    /// True for states a sandbox never leaves (terminated, failed, stopping).
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            SandboxState::Terminated | SandboxState::Failed | SandboxState::Stopping
        )
    }
}

impl From<&str> for SandboxState {
    fn from(s: &str) -> Self {
        match s.to_ascii_lowercase().as_str() {
            "pending" => SandboxState::Pending,
            "running" => SandboxState::Running,
            "pausing" => SandboxState::Pausing,
            "paused" => SandboxState::Paused,
            "resuming" => SandboxState::Resuming,
            "stopping" => SandboxState::Stopping,
            "terminated" => SandboxState::Terminated,
            "failed" => SandboxState::Failed,
            _ => SandboxState::Other(s.to_owned()),
        }
    }
}

impl<'de> Deserialize<'de> for SandboxState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(SandboxState::from(String::deserialize(d)?.as_str()))
    }
}

impl Serialize for SandboxState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A sandbox's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxStatus {
    /// The state.
    pub state: SandboxState,
    /// A short machine-readable reason, if any.
    #[serde(default)]
    pub reason: Option<String>,
    /// A human-readable message, if any.
    #[serde(default)]
    pub message: Option<String>,
}

/// A sandbox as the server describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sandbox {
    /// The server's id.
    pub id: String,
    /// Its status.
    pub status: SandboxStatus,
    /// The metadata given at creation.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// When it expires; `None` for a sandbox without a timeout.
    #[serde(
        default,
        rename = "expiresAt",
        deserialize_with = "de_opt_time",
        skip_serializing_if = "Option::is_none"
    )]
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was created.
    #[serde(
        default,
        rename = "createdAt",
        deserialize_with = "de_opt_time",
        skip_serializing_if = "Option::is_none"
    )]
    pub created_at: Option<DateTime<Utc>>,
    /// The entry process.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
}

/// What to create.
#[derive(Debug, Clone)]
pub struct CreateSandbox {
    /// The image (`sessionbox/sandbox:local`, `python:3.12`, ...).
    pub image: String,
    /// The entry process (required by the server when an image is given).
    pub entrypoint: Vec<String>,
    /// When the sandbox expires, from creation (at least 60 s); `None` for never.
    pub timeout: Option<Duration>,
    /// Metadata (validated: see [`Metadata`]).
    pub metadata: Metadata,
    /// Resource limits, for example `cpu = "1"`, `memory = "2Gi"`.
    pub resource_limits: BTreeMap<String, String>,
    /// Environment variables of the sandbox.
    pub env: BTreeMap<String, String>,
    /// The `networkPolicy` object (`{"defaultAction": ..., "egress": [...]}`), enforced by the
    /// server's egress sidecar; `None` sends none (the sandbox gets the server's network as
    /// it is). A server that cannot enforce it refuses the create with
    /// [`OpenSandboxError::NetworkPolicyUnsupported`].
    pub network_policy: Option<serde_json::Value>,
}

impl CreateSandbox {
    /// A sandbox of `image` running `entrypoint`, no timeout, no metadata, no limits.
    pub fn new(image: impl Into<String>, entrypoint: Vec<String>) -> Self {
        CreateSandbox {
            image: image.into(),
            entrypoint,
            timeout: None,
            metadata: Metadata::new(),
            resource_limits: BTreeMap::new(),
            env: BTreeMap::new(),
            network_policy: None,
        }
    }
}

/// Which sandboxes [`OpenSandboxClient::list`] returns: all conditions must hold.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Metadata pairs a sandbox must carry.
    pub metadata: Metadata,
    /// States to include (any of them); empty for every state.
    pub states: Vec<SandboxState>,
}

/// The health of a server, from [`OpenSandboxClient::probe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// The server's version (`GET /version`), when it reports one.
    pub version: Option<String>,
    /// Sandboxes the key can see (the list's `totalItems`).
    pub sandboxes: u64,
}

/// A client of one OpenSandbox lifecycle server. Cheap to clone.
#[derive(Clone)]
pub struct OpenSandboxClient {
    http: reqwest::Client,
    /// `scheme://host:port`, no path.
    origin: Url,
    key_header: Option<HeaderValue>,
    config: ClientConfig,
}

impl fmt::Debug for OpenSandboxClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenSandboxClient")
            .field("origin", &self.origin.as_str())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Parses a lifecycle server address into its origin (`scheme://host:port/`).
///
/// # Errors
/// [`OpenSandboxError::InvalidInput`] for anything but `http(s)://host[:port][/]` or
/// `host:port`.
pub fn parse_server(server: &str) -> Result<Url, OpenSandboxError> {
    let bad = |why: &str| {
        OpenSandboxError::InvalidInput(format!(
            "the OpenSandbox server address {:?} is not usable: {why}; give \
             http://HOST:PORT",
            crate::endpoint::printable(server)
        ))
    };
    if server.is_empty()
        || server
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || !c.is_ascii() || c == '\\')
    {
        return Err(bad(
            "it is empty or holds whitespace, control, backslash or non-ASCII characters",
        ));
    }
    let with_scheme = if server.contains("://") {
        server.to_owned()
    } else {
        format!("http://{server}")
    };
    let url = Url::parse(&with_scheme).map_err(|_| bad("it does not parse as a URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("the scheme must be http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("it names no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("it carries credentials"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("it carries a query or fragment"));
    }
    let path = url.path().trim_end_matches('/');
    if !(path.is_empty() || path == "/v1") {
        return Err(bad("it carries a path (the client adds /v1 itself)"));
    }
    let mut origin = url;
    origin.set_path("/");
    Ok(origin)
}

impl OpenSandboxClient {
    /// Builds a client. Nothing is sent until a call.
    ///
    /// # Errors
    /// [`OpenSandboxError::InvalidInput`] for a malformed server address.
    pub fn new(config: ClientConfig) -> Result<Self, OpenSandboxError> {
        let origin = parse_server(&config.server)?;
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .no_proxy()
            .connect_timeout(config.connect_timeout)
            .user_agent(concat!(
                "sessionbox-opensandbox/",
                env!("CARGO_PKG_VERSION")
            ))
            .build()
            .map_err(|e| {
                OpenSandboxError::InvalidInput(format!("cannot build an HTTP client: {e}"))
            })?;
        let key_header = config.api_key.as_ref().map(|k| {
            let mut v = HeaderValue::from_str(k.expose()).expect("ApiKey::new checked it");
            v.set_sensitive(true);
            v
        });
        Ok(OpenSandboxClient {
            http,
            origin,
            key_header,
            config,
        })
    }

    /// The lifecycle origin (`scheme://host:port/`).
    pub fn origin(&self) -> &Url {
        &self.origin
    }

    /// The settings it was built with.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Health probe: `GET /health` must answer exactly `{"status":"healthy"}`, and an
    /// authenticated `GET /v1/sandboxes` must succeed, so that neither an unrelated web server
    /// nor a wrong key passes.
    ///
    /// # Errors
    /// [`OpenSandboxError::Unhealthy`] when `/health` is anything else,
    /// [`OpenSandboxError::Unauthorized`] for a missing or wrong key, transport errors.
    pub async fn probe(&self) -> Result<Health, OpenSandboxError> {
        let op = "health";
        let url = self.origin.join("health").expect("a constant path joins");
        let response = self
            .send(op, self.http.get(url).timeout(self.config.request_timeout))
            .await?;
        let body = read_limited(response, 4096).await;
        let value: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
        if value != Some(serde_json::json!({"status": "healthy"})) {
            return Err(OpenSandboxError::Unhealthy {
                server: self.origin_str(),
                reason: format!(
                    "GET /health answered {:?}, not {{\"status\":\"healthy\"}}: this is not an \
                     OpenSandbox server, or it is unhealthy",
                    crate::endpoint::printable(&truncate(&String::from_utf8_lossy(&body), 80))
                ),
            });
        }
        let page: ListPage = self
            .call_json(
                "list sandboxes",
                Method::GET,
                "sandboxes",
                &[("page", "1".into()), ("pageSize", "1".into())],
                None,
                self.config.request_timeout,
            )
            .await?;
        let version = self.version().await.ok().flatten();
        Ok(Health {
            version,
            sandboxes: page.pagination.map_or(0, |p| p.total_items),
        })
    }

    async fn version(&self) -> Result<Option<String>, OpenSandboxError> {
        let url = self.origin.join("version").expect("a constant path joins");
        let response = self
            .send(
                "version",
                self.http.get(url).timeout(self.config.request_timeout),
            )
            .await?;
        let body = read_limited(response, 4096).await;
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        Ok(value
            .get("version")
            .and_then(|v| v.as_str())
            .map(|s| truncate(s, 40)))
    }

    /// Creates a sandbox. The server answers once the container has started, not when execd
    /// inside answers: poll execd's `/ping` before using it.
    ///
    /// # Errors
    /// [`OpenSandboxError::InvalidInput`] before anything is sent (timeout under 60 s, empty
    /// image or entrypoint); server errors as returned.
    pub async fn create(&self, request: &CreateSandbox) -> Result<Sandbox, OpenSandboxError> {
        if request.image.trim().is_empty() || request.entrypoint.is_empty() {
            return Err(OpenSandboxError::InvalidInput(
                "a sandbox needs an image and an entrypoint".into(),
            ));
        }
        let timeout = match request.timeout {
            None => None,
            Some(t) if t.as_secs() >= MIN_TIMEOUT_SECS => Some(t.as_secs()),
            Some(t) => {
                return Err(OpenSandboxError::InvalidInput(format!(
                    "a sandbox timeout of {} s is below the server's minimum of \
                     {MIN_TIMEOUT_SECS} s",
                    t.as_secs()
                )));
            }
        };
        let mut body = serde_json::json!({
            "image": {"uri": request.image},
            "entrypoint": request.entrypoint,
            "metadata": request.metadata.as_map(),
        });
        if let Some(t) = timeout {
            body["timeout"] = t.into();
        }
        if !request.resource_limits.is_empty() {
            body["resourceLimits"] =
                serde_json::to_value(&request.resource_limits).expect("a string map serializes");
        }
        if !request.env.is_empty() {
            body["env"] = serde_json::to_value(&request.env).expect("a string map serializes");
        }
        if let Some(policy) = &request.network_policy {
            body["networkPolicy"] = policy.clone();
        }
        let created: Sandbox = self
            .call_json(
                "create sandbox",
                Method::POST,
                "sandboxes",
                &[],
                Some(body),
                self.config.create_timeout,
            )
            .await
            .map_err(|e| match &request.network_policy {
                Some(_) => network_policy_refusal(e, &request.image),
                None => e,
            })?;
        check_id(&created.id)?;
        Ok(created)
    }

    /// Describes one sandbox.
    ///
    /// # Errors
    /// [`OpenSandboxError::NotFound`] when the server knows no such sandbox.
    pub async fn get(&self, id: &str) -> Result<Sandbox, OpenSandboxError> {
        check_id(id)?;
        self.call_json(
            "get sandbox",
            Method::GET,
            &format!("sandboxes/{id}"),
            &[],
            None,
            self.config.request_timeout,
        )
        .await
    }

    /// Every sandbox matching `filter`, all pages.
    ///
    /// # Errors
    /// Server and transport errors.
    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<Sandbox>, OpenSandboxError> {
        let mut out = Vec::new();
        let mut page = 1u32;
        loop {
            let mut q: Vec<(&str, String)> = vec![
                ("page", page.to_string()),
                ("pageSize", PAGE_SIZE.to_string()),
            ];
            if !filter.metadata.is_empty() {
                q.push(("metadata", filter.metadata.to_query()));
            }
            for s in &filter.states {
                q.push(("state", s.as_str().to_owned()));
            }
            let body: ListPage = self
                .call_json(
                    "list sandboxes",
                    Method::GET,
                    "sandboxes",
                    &q,
                    None,
                    self.config.request_timeout,
                )
                .await?;
            let more = body.pagination.as_ref().is_some_and(|p| p.has_next_page);
            out.extend(body.items);
            if !more || page >= 10_000 {
                return Ok(out);
            }
            page += 1;
        }
    }

    /// Deletes a sandbox. Returns false when the server did not know it (deleting twice is
    /// fine).
    ///
    /// # Errors
    /// Server and transport errors other than not-found.
    pub async fn delete(&self, id: &str) -> Result<bool, OpenSandboxError> {
        check_id(id)?;
        match self
            .call(
                "delete sandbox",
                Method::DELETE,
                &format!("sandboxes/{id}"),
                &[],
                None,
                self.config.request_timeout,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(OpenSandboxError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Sets the absolute expiry of a sandbox (it may shorten it). Returns the expiry the server
    /// reports.
    ///
    /// # Errors
    /// [`OpenSandboxError::NotFound`] for an unknown sandbox; server and transport errors.
    pub async fn renew(
        &self,
        id: &str,
        expires_at: DateTime<Utc>,
    ) -> Result<DateTime<Utc>, OpenSandboxError> {
        check_id(id)?;
        #[derive(Deserialize)]
        struct Renewed {
            #[serde(rename = "expiresAt", deserialize_with = "de_time")]
            expires_at: DateTime<Utc>,
        }
        let body = serde_json::json!({
            "expiresAt": expires_at.to_rfc3339_opts(SecondsFormat::Millis, true)
        });
        let r: Renewed = self
            .call_json(
                "renew sandbox",
                Method::POST,
                &format!("sandboxes/{id}/renew-expiration"),
                &[],
                Some(body),
                self.config.request_timeout,
            )
            .await?;
        Ok(r.expires_at)
    }

    /// Pauses a sandbox (asynchronous on the server: poll [`Self::get`]).
    ///
    /// # Errors
    /// Server and transport errors.
    pub async fn pause(&self, id: &str) -> Result<(), OpenSandboxError> {
        check_id(id)?;
        self.call(
            "pause sandbox",
            Method::POST,
            &format!("sandboxes/{id}/pause"),
            &[],
            None,
            self.config.request_timeout,
        )
        .await
        .map(drop)
    }

    /// Resumes a paused sandbox (asynchronous on the server: poll [`Self::get`]).
    ///
    /// # Errors
    /// Server and transport errors.
    pub async fn resume(&self, id: &str) -> Result<(), OpenSandboxError> {
        check_id(id)?;
        self.call(
            "resume sandbox",
            Method::POST,
            &format!("sandboxes/{id}/resume"),
            &[],
            None,
            self.config.request_timeout,
        )
        .await
        .map(drop)
    }

    /// The endpoint of `port` in sandbox `id`, server-proxied unless the client was configured
    /// otherwise, validated by [`validate_endpoint`].
    ///
    /// # Errors
    /// [`OpenSandboxError::UntrustedEndpoint`] when the answer fails validation; server and
    /// transport errors.
    pub async fn endpoint(
        &self,
        id: &str,
        port: u16,
    ) -> Result<ValidatedEndpoint, OpenSandboxError> {
        check_id(id)?;
        #[derive(Deserialize)]
        struct Raw {
            endpoint: String,
            #[serde(default)]
            headers: Option<BTreeMap<String, String>>,
        }
        let q = [(
            "use_server_proxy",
            if self.config.use_server_proxy {
                "true"
            } else {
                "false"
            }
            .to_owned(),
        )];
        let raw: Raw = self
            .call_json(
                "get endpoint",
                Method::GET,
                &format!("sandboxes/{id}/endpoints/{port}"),
                &q,
                None,
                self.config.request_timeout,
            )
            .await?;
        let policy = EndpointPolicy {
            lifecycle: self.origin.clone(),
            use_server_proxy: self.config.use_server_proxy,
            direct_hosts: self.config.direct_hosts.clone(),
        };
        validate_endpoint(
            &policy,
            id,
            port,
            &raw.endpoint,
            &raw.headers.unwrap_or_default(),
        )
    }

    // ----- plumbing -----

    fn origin_str(&self) -> String {
        self.origin.as_str().trim_end_matches('/').to_owned()
    }

    async fn call_json<T: serde::de::DeserializeOwned>(
        &self,
        op: &'static str,
        method: Method,
        path: &str,
        q: &[(&str, String)],
        body: Option<serde_json::Value>,
        timeout: Duration,
    ) -> Result<T, OpenSandboxError> {
        let response = self.call(op, method, path, q, body, timeout).await?;
        let bytes = tokio::time::timeout(timeout, response.bytes())
            .await
            .map_err(|_| OpenSandboxError::Timeout {
                operation: op,
                after: timeout,
            })?
            .map_err(|e| OpenSandboxError::InvalidResponse {
                operation: op,
                reason: format!("the body could not be read: {}", error_chain(&e)),
            })?;
        serde_json::from_slice(&bytes).map_err(|e| OpenSandboxError::InvalidResponse {
            operation: op,
            reason: format!("unexpected JSON: {e}"),
        })
    }

    async fn call(
        &self,
        op: &'static str,
        method: Method,
        path: &str,
        q: &[(&str, String)],
        body: Option<serde_json::Value>,
        timeout: Duration,
    ) -> Result<reqwest::Response, OpenSandboxError> {
        let mut url = self.origin.clone();
        url.set_path(&format!("/v1/{path}"));
        if !q.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (k, v) in q {
                pairs.append_pair(k, v);
            }
        }
        let mut rb = self.http.request(method, url).timeout(timeout);
        if let Some(k) = &self.key_header {
            rb = rb.header(API_KEY_HEADER, k.clone());
        }
        if let Some(b) = body {
            rb = rb
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(serde_json::to_vec(&b).expect("a JSON value serializes"));
        }
        self.send(op, rb).await
    }

    async fn send(
        &self,
        op: &'static str,
        rb: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, OpenSandboxError> {
        let response = rb.send().await.map_err(|e| {
            if e.is_timeout() {
                OpenSandboxError::Timeout {
                    operation: op,
                    after: self.config.request_timeout,
                }
            } else {
                OpenSandboxError::Connect {
                    server: self.origin_str(),
                    reason: error_chain(&e),
                }
            }
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        if status.is_redirection() {
            let location = response
                .headers()
                .get(LOCATION)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default();
            return Err(OpenSandboxError::Redirect {
                operation: op,
                status: status.as_u16(),
                location: crate::endpoint::printable(&truncate(&location, MAX_QUOTED)),
            });
        }
        let body = read_limited(response, MAX_ERROR_BODY).await;
        Err(status_error(op, status, &body))
    }
}

#[derive(Deserialize)]
struct ListPage {
    #[serde(default)]
    items: Vec<Sandbox>,
    #[serde(default)]
    pagination: Option<Pagination>,
}

#[derive(Deserialize)]
struct Pagination {
    #[serde(default, rename = "totalItems")]
    total_items: u64,
    #[serde(default, rename = "hasNextPage")]
    has_next_page: bool,
}

/// A create with a `networkPolicy` that failed because the server cannot enforce one becomes
/// [`OpenSandboxError::NetworkPolicyUnsupported`]: a 400 or 422 that names the network policy
/// or the egress sidecar, or a failed pull of an image other than the sandbox's own (the
/// sidecar's). Every other failure is left as it was.
fn network_policy_refusal(e: OpenSandboxError, sandbox_image: &str) -> OpenSandboxError {
    let names_egress = |m: &str| {
        let m = m.to_ascii_lowercase();
        m.contains("networkpolicy") || m.contains("network policy") || m.contains("egress")
    };
    match e {
        OpenSandboxError::Api {
            status,
            code,
            message,
            ..
        } if (status == 400 && names_egress(&message))
            || (code.ends_with("IMAGE_PULL_FAILED")
                && !message.contains(&format!("image {sandbox_image}:"))) =>
        {
            OpenSandboxError::NetworkPolicyUnsupported {
                status,
                code,
                message,
            }
        }
        OpenSandboxError::Validation { message, .. } if names_egress(&message) => {
            OpenSandboxError::NetworkPolicyUnsupported {
                status: 422,
                code: String::new(),
                message,
            }
        }
        e => e,
    }
}

/// Turns an error answer into a typed error. Reads both shapes the server uses: FastAPI's
/// `{"detail": [...]}` for request validation (422), and `{"code", "message"}` (also nested as
/// `{"detail": {"code", "message"}}`).
pub(crate) fn status_error(op: &'static str, status: StatusCode, body: &[u8]) -> OpenSandboxError {
    let value: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let mut code = String::new();
    let mut message = String::new();
    if let Some(v) = &value {
        let obj = match v.get("detail") {
            Some(d @ serde_json::Value::Object(_)) => d,
            _ => v,
        };
        if let Some(c) = obj.get("code").and_then(|c| c.as_str()) {
            code = c.to_owned();
        }
        if let Some(m) = obj.get("message").and_then(|m| m.as_str()) {
            message = m.to_owned();
        }
        if let Some(serde_json::Value::Array(items)) = v.get("detail") {
            // FastAPI validation: [{"loc": [...], "msg": "...", "type": "..."}]
            let parts: Vec<String> = items
                .iter()
                .take(5)
                .map(|item| {
                    let loc = item
                        .get("loc")
                        .and_then(|l| l.as_array())
                        .map(|l| {
                            l.iter()
                                .map(|p| match p {
                                    serde_json::Value::String(s) => s.clone(),
                                    other => other.to_string(),
                                })
                                .collect::<Vec<_>>()
                                .join(".")
                        })
                        .unwrap_or_default();
                    let msg = item
                        .get("msg")
                        .and_then(|m| m.as_str())
                        .unwrap_or("invalid");
                    format!("{loc}: {msg}")
                })
                .collect();
            if !parts.is_empty() {
                message = parts.join("; ");
            }
        } else if let Some(serde_json::Value::String(s)) = v.get("detail") {
            message = s.clone();
        }
    }
    if message.is_empty() {
        message = String::from_utf8_lossy(body).into_owned();
    }
    let message = crate::endpoint::printable(&truncate(message.trim(), MAX_QUOTED));
    let code = crate::endpoint::printable(&truncate(&code, 80));
    match status {
        StatusCode::UNAUTHORIZED => OpenSandboxError::Unauthorized { code, message },
        StatusCode::NOT_FOUND => OpenSandboxError::NotFound {
            operation: op,
            code,
            message,
        },
        StatusCode::UNPROCESSABLE_ENTITY => OpenSandboxError::Validation {
            operation: op,
            message,
        },
        _ => OpenSandboxError::Api {
            operation: op,
            status: status.as_u16(),
            code,
            message,
        },
    }
}

/// Sandbox ids go into URL paths: only `[A-Za-z0-9._-]`, not `.` or `..`.
fn check_id(id: &str) -> Result<(), OpenSandboxError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(OpenSandboxError::InvalidInput(format!(
            "{:?} is not a sandbox id (1-128 of A-Z a-z 0-9 . _ -)",
            crate::endpoint::printable(&truncate(id, 80))
        )))
    }
}

async fn read_limited(mut response: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let read = async {
        while let Ok(Some(chunk)) = response.chunk().await {
            let room = limit - out.len();
            out.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if out.len() >= limit {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), read).await;
    out
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(max).collect();
        t.push('…');
        t
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = inner.source();
    }
    s
}

/// Reads a time the way the server writes them: RFC 3339, with or without an offset (no
/// offset means UTC), with any fraction of a second.
pub(crate) fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.with_timezone(&Utc));
    }
    chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f")
        .ok()
        .map(|n| n.and_utc())
}

fn de_time<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
    let s = String::deserialize(d)?;
    parse_time(&s).ok_or_else(|| D::Error::custom(format!("{s:?} is not an RFC 3339 time")))
}

fn de_opt_time<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) => parse_time(&s)
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("{s:?} is not an RFC 3339 time"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_states_are_kept_not_refused() {
        let s: SandboxStatus =
            serde_json::from_str(r#"{"state":"Hibernating","reason":null}"#).unwrap();
        assert_eq!(s.state, SandboxState::Other("Hibernating".into()));
        assert_eq!(s.state.as_str(), "Hibernating");
        let s: SandboxStatus = serde_json::from_str(r#"{"state":"Running"}"#).unwrap();
        assert_eq!(s.state, SandboxState::Running);
    }

    #[test]
    fn both_error_shapes_are_read() {
        let e = status_error(
            "create sandbox",
            StatusCode::UNPROCESSABLE_ENTITY,
            br#"{"detail":[{"type":"greater_than_equal","loc":["body","timeout"],"msg":"Input should be greater than or equal to 60","input":5}]}"#,
        );
        assert!(matches!(e, OpenSandboxError::Validation { .. }), "{e:?}");
        assert!(
            e.to_string()
                .contains("body.timeout: Input should be greater"),
            "{e}"
        );
        let e = status_error(
            "create sandbox",
            StatusCode::BAD_REQUEST,
            br#"{"detail":{"code":"SANDBOX::INVALID_METADATA_LABEL","message":"bad value"}}"#,
        );
        match &e {
            OpenSandboxError::Api {
                status,
                code,
                message,
                ..
            } => {
                assert_eq!(*status, 400);
                assert_eq!(code, "SANDBOX::INVALID_METADATA_LABEL");
                assert_eq!(message, "bad value");
            }
            other => panic!("{other:?}"),
        }
        let e = status_error(
            "get sandbox",
            StatusCode::UNAUTHORIZED,
            br#"{"code":"INVALID_API_KEY","message":"Authentication credentials are invalid."}"#,
        );
        assert!(matches!(e, OpenSandboxError::Unauthorized { .. }), "{e:?}");
        let e = status_error(
            "get sandbox",
            StatusCode::INTERNAL_SERVER_ERROR,
            b"<html>boom</html>",
        );
        assert!(e.to_string().contains("500"), "{e}");
    }

    #[test]
    fn a_server_that_cannot_enforce_a_network_policy_is_told_apart() {
        // The two answers of a real 1.1.1 server on Docker (see the crate README).
        let no_sidecar = status_error(
            "create sandbox",
            StatusCode::BAD_REQUEST,
            br#"{"code":"SANDBOX::INVALID_PARAMETER","message":"egress.image must be configured when networkPolicy is provided."}"#,
        );
        let e = network_policy_refusal(no_sidecar, "sessionbox/sandbox:local");
        match &e {
            OpenSandboxError::NetworkPolicyUnsupported {
                status,
                code,
                message,
            } => {
                assert_eq!(*status, 400);
                assert_eq!(code, "SANDBOX::INVALID_PARAMETER");
                assert_eq!(
                    message,
                    "egress.image must be configured when networkPolicy is provided."
                );
            }
            other => panic!("{other:?}"),
        }
        let text = e.to_string();
        assert!(text.contains("network_policy setting"), "{text}");
        assert!(text.contains("[egress] image"), "{text}");
        let pull = |image: &str| {
            status_error(
                "create sandbox",
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    r#"{{"code":"DOCKER::SANDBOX_IMAGE_PULL_FAILED","message":"Failed to pull image {image}: 500 Server Error"}}"#
                )
                .as_bytes(),
            )
        };
        assert!(matches!(
            network_policy_refusal(pull("opensandbox/egress:v1"), "sessionbox/sandbox:local"),
            OpenSandboxError::NetworkPolicyUnsupported { status: 500, .. }
        ));
        // The sandbox's own image missing is not the sidecar's fault.
        assert!(matches!(
            network_policy_refusal(pull("sessionbox/sandbox:local"), "sessionbox/sandbox:local"),
            OpenSandboxError::Api { status: 500, .. }
        ));
        // Unrelated refusals stay what they were.
        let other = status_error(
            "create sandbox",
            StatusCode::BAD_REQUEST,
            br#"{"code":"SANDBOX::INVALID_METADATA_LABEL","message":"bad label"}"#,
        );
        assert!(matches!(
            network_policy_refusal(other, "x"),
            OpenSandboxError::Api { status: 400, .. }
        ));
    }

    #[test]
    fn times_with_and_without_offsets_parse() {
        assert!(parse_time("2026-11-29T15:10:00.123456+00:00").is_some());
        assert!(parse_time("2026-11-29T15:10:00Z").is_some());
        assert!(parse_time("2026-11-29T15:10:00.5").is_some());
        assert!(parse_time("yesterday").is_none());
    }

    #[test]
    fn server_addresses_are_checked() {
        assert_eq!(
            parse_server("127.0.0.1:8080").unwrap().as_str(),
            "http://127.0.0.1:8080/"
        );
        assert_eq!(
            parse_server("http://127.0.0.1:8080/v1/").unwrap().as_str(),
            "http://127.0.0.1:8080/"
        );
        for bad in [
            "",
            " http://127.0.0.1:8080",
            "http://u:p@127.0.0.1:8080",
            "ftp://x",
            "http://127.0.0.1:8080/other",
            "http://127.0.0.1:8080/?q",
            "http://a\\b",
        ] {
            assert!(parse_server(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn api_key_never_shows() {
        let k = ApiKey::new("s3cr3t-value").unwrap();
        assert!(!format!("{k:?}").contains("s3cr3t"));
        let c = ClientConfig::new("127.0.0.1:1", Some(k));
        assert!(!format!("{c:?}").contains("s3cr3t"));
        let client = OpenSandboxClient::new(c).unwrap();
        assert!(!format!("{client:?}").contains("s3cr3t"));
    }

    #[test]
    fn sandbox_ids_cannot_reshape_paths() {
        for bad in ["", ".", "..", "a/b", "a?b", "a b", "%2e%2e"] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
        check_id("3f2b8c1e-6d4a-4f1b-9a7e-0c5d2e8f1a36").unwrap();
    }
}
