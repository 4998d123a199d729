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
//!   with `encoding: "base64"`. Workspace archives travel streamed: `GET /v1/file/download`
//!   read chunk by chunk, and `POST /v1/file/upload` (multipart, sent chunked).
//!
//! The token, when there is one, travels only in a header marked sensitive; it never appears in
//! an error, a log line or a URL. The client never sets the API's `sudo` flag.

use std::fmt;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;

use envelope::decode_envelope;

mod bash;
mod envelope;
mod error;
mod files;
mod types;

pub use error::AioError;
pub use files::Download;
pub use types::{
    BashCommandInfo, BashExecRequest, BashExecResult, BashOutputRequest, BashOutputResult,
    BashSessionInfo, CommandStatus, FileGrepMatch, FileGrepRequest, FileGrepResult, FileInfo,
    GlobFileInfo, SandboxContext,
};

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
}

#[cfg(test)]
mod tests {
    use super::*;

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
