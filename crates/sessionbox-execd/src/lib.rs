//! The OpenSandbox execd wire protocol: types, the command event-stream parser, and an async
//! client (cargo feature `client`, on by default). Only this crate knows the execd wire format.
//!
//! sessionbox runs an in-sandbox agent that serves the OpenSandbox execd HTTP API, so one protocol
//! serves every runtime: our own `isolated` runtime over a Unix socket, and real OpenSandbox
//! sandboxes over HTTP. The server side (another crate) takes its paths, headers and bodies from
//! here as well.
//!
//! - [`wire`]: every path, header, query name and fixed string.
//! - `agent_args` (feature `args`): the agent's command line, parsed by the agent and built by
//!   the runtime that launches it.
//! - [`types`]: serde bodies ([`RunCommandRequest`], [`ServerStreamEvent`], [`FileInfo`], ...).
//! - [`EventStreamParser`]: the body of `POST /command` as events, tolerant of upstream quirks.
//! - [`archive_ext`]: the workspace as one tar (`/sessionbox/v1/archive`).
//! - [`bash_session`]: upstream's bash sessions (`/session`).
//! - [`pty`]: interactive terminals (upstream's `/pty` routes and WebSocket frames).
//! - [`multipart`]: the upload body, laid out as the SDK lays it out, and read back.
//! - `ExecdClient` (feature `client`): every endpoint, over a Unix socket or `http(s)://`. The
//!   agent (the server side) builds this crate without it, so it links no HTTP client.
//! - [`ExecdError`]: what can fail; converts into [`sessionbox_core::Error`].
//!
//! Sources, in order of authority: the released `opensandbox==1.1.1` Python SDK and the upstream
//! daemon it talks to, then `execd-api.yaml` (spec 1.0.0). Each rule's doc comment names its
//! source; the crate's README lists the upstream quirks tolerated.
//!
//! ```no_run
//! # #[cfg(feature = "client")]
//! # async fn demo() -> Result<(), sessionbox_execd::ExecdError> {
//! use sessionbox_execd::{ExecdClient, RunCommandRequest};
//! let client = ExecdClient::unix("/run/sessionbox/execd.sock")?;
//! // Exact output: every byte as the command wrote it (a sessionbox extension; an upstream
//! // daemon frames output as one event per line instead).
//! let request = RunCommandRequest::shell("echo hi").exact_output();
//! let outcome = client.run_command(&request).await?;
//! assert_eq!(outcome.stdout, b"hi\n");
//! # Ok(()) }
//! ```

#[cfg(feature = "args")]
pub mod agent_args;
pub mod archive_ext;
mod b64;
pub mod bash_session;
#[cfg(feature = "client")]
mod client;
pub mod commands_ext;
mod error;
pub mod fs_ext;
pub mod hop;
pub mod memory_ext;
pub mod multipart;
mod outcome;
pub mod pty;
mod stream;
mod token;
pub mod types;
pub mod watch_ext;
pub mod wire;

#[cfg(feature = "client")]
pub use client::{
    AgentLink, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_ANSWER_BYTES, DEFAULT_REQUEST_TIMEOUT,
    Endpoint, EventStream, ExecdClient, ExecdClientBuilder, STREAM_GRACE, WatchStream,
};
pub use error::ExecdError;
pub use outcome::{CommandOutcome, OutcomeCollector};
pub use stream::{DEFAULT_MAX_EVENT_BYTES, EventStreamParser, StreamError};
pub use token::AccessToken;
pub use types::{
    CommandEndExtension, CommandLogs, CommandStatus, ErrorResponse, EventError, EventType,
    FileInfo, FileMetadata, FileType, Metrics, OutputEncoding, Permission, RenameFileItem,
    ReplaceFileContentItem, ReplaceFileContentResult, RunCommandRequest, ServerStreamEvent,
    UploadFile, mode_from_wire, mode_to_wire,
};
