//! What the lifecycle API carries: sandboxes, their states, the create request and filters,
//! and the client's configuration.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderValue;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

use super::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_CREATE_TIMEOUT, DEFAULT_REQUEST_TIMEOUT};
use crate::error::OpenSandboxError;
use crate::metadata::Metadata;

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

/// Settings of an [`OpenSandboxClient`](super::OpenSandboxClient).
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
    /// Host directories bound into the sandbox (the server allows only those beneath its
    /// `[storage] allowed_host_paths`).
    pub volumes: Vec<HostVolume>,
}

/// A host directory bound into a sandbox, read-write (the lifecycle API's `volumes[]` entry
/// with a `host` backend).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostVolume {
    /// The volume's name in the sandbox (`[a-z0-9-]`, at most 63).
    pub name: String,
    /// The absolute host path.
    pub host_path: std::path::PathBuf,
    /// Where the sandbox sees it.
    pub mount_path: String,
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
            volumes: Vec::new(),
        }
    }
}

/// Which sandboxes [`OpenSandboxClient::list`](super::OpenSandboxClient::list) returns: all conditions must hold.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Metadata pairs a sandbox must carry.
    pub metadata: Metadata,
    /// States to include (any of them); empty for every state.
    pub states: Vec<SandboxState>,
}

/// The health of a server, from [`OpenSandboxClient::probe`](super::OpenSandboxClient::probe).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// The server's version (`GET /version`), when it reports one.
    pub version: Option<String>,
    /// Sandboxes the key can see (the list's `totalItems`).
    pub sandboxes: u64,
}

#[derive(Deserialize)]
pub(super) struct ListPage {
    #[serde(default)]
    pub(super) items: Vec<Sandbox>,
    #[serde(default)]
    pub(super) pagination: Option<Pagination>,
}

#[derive(Deserialize)]
pub(super) struct Pagination {
    #[serde(default, rename = "totalItems")]
    pub(super) total_items: u64,
    #[serde(default, rename = "hasNextPage")]
    pub(super) has_next_page: bool,
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

pub(super) fn de_time<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
    let s = String::deserialize(d)?;
    parse_time(&s).ok_or_else(|| D::Error::custom(format!("{s:?} is not an RFC 3339 time")))
}

pub(super) fn de_opt_time<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<DateTime<Utc>>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) => parse_time(&s)
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("{s:?} is not an RFC 3339 time"))),
    }
}
