//! sessionbox's `aio` runtime: each conversation is a directory in one shared AIO Sandbox
//! (All-in-One Sandbox) container, reached over its `/v1` HTTP API.
//!
//! - [`client`]: the AIO Sandbox `/v1` client (bash exec and output polling, byte-exact file
//!   transfer, listing and search, the response envelope and its error shapes, auth).
//! - [`AioRuntime`]: [`sessionbox_core::Runtime`] on top of it, workspace archives included
//!   (GNU tar in the container, streamed and rewritten on this side). Boundary: one container
//!   and one OS user for every conversation; for trusted users only (see the crate README).
//!
//! ```no_run
//! # async fn demo() -> sessionbox_core::Result<()> {
//! use sessionbox_aio::{AioConfig, AioRuntime, Endpoint};
//! use sessionbox_core::{ConversationRef, ExecRequest, Runtime};
//! let endpoint = Endpoint::new("http://127.0.0.1:8080").with_env_credentials()?;
//! let runtime = AioRuntime::new(AioConfig::new(endpoint))?;
//! let session = runtime.open(&ConversationRef::parse("default", "chat-42")?).await?;
//! let out = session.exec(ExecRequest::new("echo hi > a.txt && cat a.txt")).await?;
//! assert_eq!(out.stdout, b"hi\n");
//! # Ok(()) }
//! ```

mod background;
pub mod client;
mod runtime;
mod scripts;

pub use background::MAX_FINISHED_COMMANDS;
pub use client::{AioClient, AioError, AuthHeader, Endpoint, Secret};
pub use runtime::{
    AioConfig, AioEgress, AioRuntime, DEFAULT_MAX_ARCHIVE_BYTES, DEFAULT_ROOT, MAX_COMMAND_BYTES,
    MAX_STDIN_BYTES, TOKEN_MARGIN,
};
