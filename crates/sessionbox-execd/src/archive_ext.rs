//! sessionbox's workspace-archive extension of the execd API: the whole workspace as one tar
//! (the snapshot rules of `sessionbox_core`'s snapshot module: [`ArchiveStats`]).
//!
//! - `GET /sessionbox/v1/archive` ([`ARCHIVE_PATH`]) answers `200` with
//!   `Content-Type: application/x-tar` ([`ARCHIVE_CONTENT_TYPE`]) and the archive as the body,
//!   streamed while it is taken. The agent's running background commands are paused
//!   (`SIGSTOP` to their process groups) until the archive is written or the client goes
//!   away, then resumed (`SIGCONT`). A failure after the head was sent cuts the body short:
//!   the client sees a broken transfer, never a well-formed short archive. The counts travel
//!   in the archive itself: a client counts its entries ([`ArchiveStats::skipped`], what the
//!   agent left out, is not known to it and is 0).
//! - `PUT /sessionbox/v1/archive` takes a tar as the body (at most the agent's archive limit:
//!   413 with `SESSIONBOX::too_large` past it), checks every entry, then replaces the
//!   workspace's contents, and answers `200` with the [`ArchiveStats`] as JSON. A refused
//!   archive is `400` `SESSIONBOX::invalid_request` with the workspace unchanged; a workspace
//!   that fills up is `413` `SESSIONBOX::too_large`. Errors are
//!   [`ErrorResponse`](crate::types::ErrorResponse)s whose `code` is
//!   [`FS_ERROR_PREFIX`](crate::fs_ext::FS_ERROR_PREFIX) and a
//!   [`sessionbox_core::Error::code`].

pub use sessionbox_core::ArchiveStats;

/// The extension's route (`GET` takes an archive, `PUT` restores one).
pub const ARCHIVE_PATH: &str = "/sessionbox/v1/archive";

/// The content type of an archive body.
pub const ARCHIVE_CONTENT_TYPE: &str = "application/x-tar";

/// The agent's default limit on a `PUT` archive body: 4 GiB.
pub const DEFAULT_MAX_ARCHIVE_BYTES: u64 = 4 << 30;
