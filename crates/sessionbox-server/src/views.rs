//! The server's serialisable counterparts of the core types its JSON carries.
//!
//! `sessionbox-core` knows no wire format, so the HTTP API does not serialise core types: each
//! one it shows or reads has a view here, with its OpenAPI schema (utoipa) and a conversion
//! from or to the core type. The schema is generated from the very type that is serialised,
//! so the document cannot drift from the wire. Field names and shapes are the API's and stay
//! as they are.

use serde::{Deserialize, Serialize};
use sessionbox_core::{
    DirEntry, EditResult, ExitStatus, FileKind, FileStat, GrepMatch, GrepRequest,
};
use utoipa::ToSchema;

/// Every error: a stable code and a message for people (also the data of an `error` event on
/// an exec event stream).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Error)]
pub(crate) struct ErrorBody {
    /// `invalid_id`, `invalid_path`, `invalid_request`, `outside_workspace`, `unauthorized`,
    /// `not_found`, `conflict`, `already_exists`, `too_large`, `busy`, ...
    pub code: String,
    pub message: String,
}

/// Raw bytes.
#[derive(ToSchema)]
#[schema(as = Binary, value_type = String, format = Binary)]
pub(crate) struct Binary(#[allow(dead_code)] Vec<u8>);

/// How a command ended: `{"code": N}` or `{"signal": N}`.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[schema(as = ExitStatus)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ExitStatusView {
    Code(i32),
    Signal(i32),
}

impl From<ExitStatus> for ExitStatusView {
    fn from(status: ExitStatus) -> Self {
        match status {
            ExitStatus::Code(code) => ExitStatusView::Code(code),
            ExitStatus::Signal(signal) => ExitStatusView::Signal(signal),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[schema(as = FileKind)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FileKindView {
    File,
    Directory,
    Symlink,
    Other,
}

impl From<FileKind> for FileKindView {
    fn from(kind: FileKind) -> Self {
        match kind {
            FileKind::File => FileKindView::File,
            FileKind::Directory => FileKindView::Directory,
            FileKind::Symlink => FileKindView::Symlink,
            FileKind::Other => FileKindView::Other,
        }
    }
}

/// One directory entry.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DirEntry)]
pub(crate) struct DirEntryView {
    name: String,
    kind: FileKindView,
    size: u64,
    modified_unix: i64,
}

impl From<DirEntry> for DirEntryView {
    fn from(entry: DirEntry) -> Self {
        DirEntryView {
            name: entry.name,
            kind: entry.kind.into(),
            size: entry.size,
            modified_unix: entry.modified_unix,
        }
    }
}

/// Metadata of one path.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = FileStat)]
pub(crate) struct FileStatView {
    path: String,
    kind: FileKindView,
    size: u64,
    /// Permission bits in octal, at least four digits (`"0644"`).
    #[schema(pattern = "^[0-7]{4,}$", example = "0644")]
    mode: String,
    modified_unix: i64,
}

impl From<FileStat> for FileStatView {
    fn from(stat: FileStat) -> Self {
        FileStatView {
            path: stat.path,
            kind: stat.kind.into(),
            size: stat.size,
            mode: format!("{:04o}", stat.mode),
            modified_unix: stat.modified_unix,
        }
    }
}

/// What an edit did.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = EditResult)]
pub(crate) struct EditResultView {
    replacements: usize,
}

impl From<EditResult> for EditResultView {
    fn from(result: EditResult) -> Self {
        EditResultView {
            replacements: result.replacements,
        }
    }
}

/// A content search.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = GrepRequest)]
pub(crate) struct GrepBody {
    /// A Rust `regex` pattern.
    pattern: String,
    /// File or directory to search; default the whole workspace.
    #[serde(default)]
    path: Option<String>,
    /// Only files whose workspace-relative path matches this glob.
    #[serde(default)]
    glob: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<bool>, default = false)]
    case_insensitive: bool,
    #[serde(default)]
    max_matches: Option<usize>,
}

impl From<GrepBody> for GrepRequest {
    fn from(body: GrepBody) -> Self {
        GrepRequest {
            pattern: body.pattern,
            path: body.path,
            glob: body.glob,
            case_insensitive: body.case_insensitive,
            max_matches: body.max_matches,
        }
    }
}

/// One matching line.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = GrepMatch)]
pub(crate) struct GrepMatchView {
    path: String,
    line_number: u64,
    line: String,
}

impl From<GrepMatch> for GrepMatchView {
    fn from(found: GrepMatch) -> Self {
        GrepMatchView {
            path: found.path,
            line_number: found.line_number,
            line: found.line,
        }
    }
}

/// One event of a watch (`GET /v1/conversations/{id}/watch`): the SSE event's name is `kind`,
/// its data this object. Paths are as the conversation sees them (`/workspace/src/a.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[schema(as = WatchEvent)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum WatchEventView {
    /// First: the watch is in place (`skipped_dirs` past the limit of directories followed).
    Ready {
        path: String,
        watched_dirs: usize,
        skipped_dirs: usize,
    },
    /// A path appeared (created, or moved in from outside the watched directory).
    Created { path: String, dir: bool },
    /// Contents or metadata changed.
    Modified { path: String, dir: bool },
    /// A path went away (removed, or moved out of the watched directory).
    Deleted { path: String, dir: bool },
    /// Renamed within the watched directory.
    Moved { from: String, to: String, dir: bool },
    /// Events were lost (the reader did not keep up): list the directory again.
    Overflow,
    /// A new directory is not followed: the watch follows `max_dirs` already.
    Limit { path: String, max_dirs: usize },
    /// Last: the watched directory went away, or the sandbox stops.
    Ended { reason: String },
}

impl From<sessionbox_core::WatchEvent> for WatchEventView {
    fn from(e: sessionbox_core::WatchEvent) -> Self {
        use sessionbox_core::WatchEvent as W;
        match e {
            W::Ready {
                path,
                watched_dirs,
                skipped_dirs,
            } => WatchEventView::Ready {
                path,
                watched_dirs,
                skipped_dirs,
            },
            W::Created { path, dir } => WatchEventView::Created { path, dir },
            W::Modified { path, dir } => WatchEventView::Modified { path, dir },
            W::Deleted { path, dir } => WatchEventView::Deleted { path, dir },
            W::Moved { from, to, dir } => WatchEventView::Moved { from, to, dir },
            W::Overflow => WatchEventView::Overflow,
            W::Limit { path, max_dirs } => WatchEventView::Limit { path, max_dirs },
            W::Ended { reason } => WatchEventView::Ended { reason },
        }
    }
}

/// One server-sent event of a watch as an event-stream reader sees it: `event` is the kind,
/// `data` a [`WatchEventView`] as JSON text.
#[derive(ToSchema)]
#[schema(as = WatchStreamEvent)]
#[allow(dead_code)] // Only read by the schema generator.
pub(crate) struct WatchStreamEvent {
    /// `ready`, `created`, `modified`, `deleted`, `moved`, `overflow`, `limit`, `ended`, or
    /// `error`.
    event: String,
    /// A WatchEvent (an Error for `error`) as JSON.
    data: String,
}
