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
//! - redirects are never followed (a 3xx is [`crate::OpenSandboxError::Redirect`]);
//! - an execd endpoint returned by the server is used only after [`crate::endpoint::validate_endpoint`] accepts it.
//!
//! `types.rs` holds what goes over the wire (sandboxes, their states, the create request, the
//! client's configuration); `client.rs` the client itself; the mapping of error answers to
//! [`crate::OpenSandboxError`] lives in `crate::error`.

use std::time::Duration;

mod client;
mod types;

#[cfg(test)]
mod tests;

pub use client::{OpenSandboxClient, parse_server};
pub use types::{
    ApiKey, ClientConfig, CreateSandbox, Health, HostVolume, ListFilter, Sandbox, SandboxState,
    SandboxStatus,
};

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
pub(crate) const MAX_ERROR_BODY: usize = 64 * 1024;
/// Most characters of a server message quoted in an error.
pub(crate) const MAX_QUOTED: usize = 300;
/// Page size used when listing every page.
pub(crate) const PAGE_SIZE: u32 = 200;

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(max).collect();
        t.push('…');
        t
    }
}
