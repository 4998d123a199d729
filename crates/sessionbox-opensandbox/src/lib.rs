//! OpenSandbox for sessionbox: a lifecycle client, and the `opensandbox` runtime.
//!
//! - [`OpenSandboxClient`] ([`lifecycle`]): the OpenSandbox server's sandbox lifecycle API —
//!   create, get, list by metadata, delete, renew (absolute `expiresAt`), pause, resume,
//!   endpoints — and a health probe. It depends on no other sessionbox crate and could be used
//!   on its own: there is no other Rust client for OpenSandbox. The oracle is the released
//!   `opensandbox-server==1.1.1`.
//! - [`endpoint`]: which execd endpoints the server may hand back (same-origin server proxy of
//!   the same sandbox and port, or an allowlisted direct host), and which headers.
//! - [`Metadata`]: metadata the real server accepts (63-character values).
//! - [`OpenSandboxRuntime`] ([`runtime`]): one sandbox per conversation, running sessionbox's
//!   agent as execd, reached with `sessionbox-execd`'s client straight at the server's direct
//!   endpoint when it is allowlisted and answers, else through the server proxy; the
//!   conversation-to-sandbox map and each sandbox's expiry are kept through a
//!   [`sessionbox_core::Directory`] (the store, through the manager's `StoreDirectory`). Network
//!   ([`EgressOptions`]): an optional `networkPolicy` allowing only the egress gateway, and
//!   per-command proxy variables with a short-lived token; by default sessionbox's policy
//!   does not bind these sandboxes (see the crate README).
//!
//! ```no_run
//! # async fn demo() -> Result<(), sessionbox_opensandbox::OpenSandboxError> {
//! use sessionbox_opensandbox::{ApiKey, ClientConfig, CreateSandbox, OpenSandboxClient};
//! let key = ApiKey::new(std::env::var("OPEN_SANDBOX_API_KEY").unwrap())?;
//! let client = OpenSandboxClient::new(ClientConfig::new("http://127.0.0.1:8080", Some(key)))?;
//! client.probe().await?;
//! let sandbox = client
//!     .create(&CreateSandbox::new("sessionbox/sandbox:local", vec!["tail".into(), "-f".into(), "/dev/null".into()]))
//!     .await?;
//! let execd = client.endpoint(&sandbox.id, sessionbox_opensandbox::EXECD_PORT).await?;
//! println!("execd at {}", execd.url);
//! client.delete(&sandbox.id).await?;
//! # Ok(()) }
//! ```

pub mod endpoint;
mod error;
pub mod lifecycle;
mod metadata;
pub mod runtime;

pub use error::OpenSandboxError;
pub use lifecycle::{
    API_KEY_HEADER, ApiKey, ClientConfig, CreateSandbox, EXECD_PORT, Health, HostVolume,
    ListFilter, OpenSandboxClient, Sandbox, SandboxState, SandboxStatus,
};
pub use metadata::{MAX_VALUE_LEN, Metadata, is_valid_key, is_valid_value};
pub use runtime::{
    AgentPath, DEFAULT_POOL_UNRECORDED_GRACE, DirectMode, EgressOptions, GatewayAccess,
    LABEL_NETWORK, LABEL_POOL, OpenSandboxConfig, OpenSandboxRuntime, WorkspaceVolumes,
};
