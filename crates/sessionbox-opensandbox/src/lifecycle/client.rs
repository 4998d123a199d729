//! [`OpenSandboxClient`]: one lifecycle server's API, with the trust rules of the module
//! documentation.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use reqwest::header::{HeaderValue, LOCATION};
use reqwest::{Method, Url};
use serde::Deserialize;

use super::types::{ListPage, de_time};
use super::{
    API_KEY_HEADER, ClientConfig, CreateSandbox, Health, ListFilter, MAX_ERROR_BODY, MAX_QUOTED,
    MIN_TIMEOUT_SECS, PAGE_SIZE, Sandbox, truncate,
};
use crate::endpoint::{EndpointPolicy, ValidatedEndpoint, validate_endpoint};
use crate::error::{OpenSandboxError, network_policy_refusal, status_error};

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
        if !request.volumes.is_empty() {
            body["volumes"] = request
                .volumes
                .iter()
                .map(|v| {
                    serde_json::json!({
                        "name": v.name,
                        "host": {"path": v.host_path.to_string_lossy()},
                        "mountPath": v.mount_path,
                        "readOnly": false,
                    })
                })
                .collect();
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
        self.endpoint_as(id, port, self.config.use_server_proxy, false)
            .await
    }

    /// The direct endpoint of `port` in sandbox `id` (`use_server_proxy=false`), validated by
    /// [`validate_endpoint`] against `direct_hosts` and, with `lifecycle_host`, the lifecycle
    /// server's own host (see [`crate::endpoint`] for why that one may be trusted).
    ///
    /// # Errors
    /// [`OpenSandboxError::UntrustedEndpoint`] when the answer names a host outside the
    /// allowlist or breaks another rule (nothing is contacted then); server and transport
    /// errors.
    pub async fn direct_endpoint(
        &self,
        id: &str,
        port: u16,
        lifecycle_host: bool,
    ) -> Result<ValidatedEndpoint, OpenSandboxError> {
        self.endpoint_as(id, port, false, lifecycle_host).await
    }

    async fn endpoint_as(
        &self,
        id: &str,
        port: u16,
        use_server_proxy: bool,
        lifecycle_host: bool,
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
            if use_server_proxy { "true" } else { "false" }.to_owned(),
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
            use_server_proxy,
            direct_hosts: self.config.direct_hosts.clone(),
            direct_lifecycle_host: lifecycle_host,
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

/// Sandbox ids go into URL paths: only `[A-Za-z0-9._-]`, not `.` or `..`.
pub(super) fn check_id(id: &str) -> Result<(), OpenSandboxError> {
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
