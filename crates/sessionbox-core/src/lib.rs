//! The vocabulary of sessionbox, shared by every runtime, store and front end.
//!
//! - [`ConversationId`], [`TenantId`] and [`ConversationKey`]: who a conversation is, and the
//!   opaque key under which its record and workspace are kept.
//! - [`WorkspacePath`]: the workspace path policy. Every path a caller gives passes through it
//!   before anything touches a file system.
//! - [`Runtime`] and [`Session`]: what an isolation backend provides.
//! - [`ExecRequest`], [`ExecResult`] and the file types: requests and results.
//! - [`Operation`] and [`OpenMode`]: which operations create a conversation (one rule for
//!   every front end).
//! - [`Directory`]: what a runtime may ask about a recorded conversation.
//! - [`KeyScope`]: what an API key may reach within its tenant.
//! - [`Error`]: the one error type, with a stable [`Error::code`] for wire formats.
//!
//! Architecture invariant: this crate does no I/O and depends on no runtime crate.

mod agent;
mod background;
mod directory;
mod error;
mod exec;
mod files;
mod ids;
mod open;
mod path;
pub mod patterns;
mod runtime;
mod scope;
mod snapshot;
mod watch;

pub use agent::{AgentAccess, AgentEndpoint, no_agent};
pub use background::{
    BackgroundCommand, CommandOutput, MAX_COMMAND_ID_BYTES, MAX_OUTPUT_CHUNK, MAX_OUTPUT_WAIT,
    MAX_RUNNING_COMMANDS, OutputRequest, STDIN_WRITE_WAIT, StdinWrite, background_unsupported,
    live_stdin_unsupported, validate_command_id,
};
pub use directory::{Directory, NetworkPolicy, RemotePoolSlot, RemoteSandbox};
pub use error::{
    DIRECTORY_NOT_EMPTY, EDIT_ABSENT, EDIT_AMBIGUOUS, EDIT_EMPTY, Error, Refusal, Result,
};
pub use exec::{
    BASE_PATH, CappedSink, DEFAULT_OUTPUT_LIMIT, DEFAULT_TIMEOUT, ExecRequest, ExecResult,
    ExecSink, ExitStatus, MAX_COMMAND_BYTES, MAX_ENV_BYTES, MAX_OUTPUT_LIMIT, MAX_STDIN_BYTES,
    MAX_TIMEOUT, OutputStream, base_environment, validate_env_name,
};
pub use files::{
    DirEntry, EditRequest, EditResult, FileKind, FileStat, GrepMatch, GrepRequest, Limits,
};
pub use ids::{ConversationId, ConversationKey, ConversationRef, IdKind, TenantId};
pub use open::{OpenMode, Operation};
pub use path::{MAX_PATH_BYTES, WorkspacePath};
pub use patterns::{check_glob, check_grep};
pub use runtime::{
    DestroyReport, DiskUsage, MemoryMeasure, MemoryUsage, PoolSizes, Runtime, RuntimeConversation,
    RuntimeInfo, Session, WorkspaceClones,
};
pub use scope::{ConversationScope, KeyScope, MAX_ID_PREFIX_BYTES};
pub use snapshot::{
    ArchiveStats, MAX_ARCHIVE_ENTRIES, MAX_SNAPSHOT_NAME_BYTES, archive_unsupported,
    temporary_archive, validate_snapshot_name,
};
pub use watch::{MAX_QUEUED_WATCH_EVENTS, MAX_WATCH_STREAMS, MAX_WATCHED_DIRS, WatchEvent};
