//! Watching a directory of the workspace: the events and their bounds.
//!
//! A watch reports what changes beneath one directory of the workspace (its subdirectories
//! included), as the conversation sees the paths (`/workspace/src/main.rs`). It never reports
//! anything outside the workspace: it does not descend through symbolic links or into other
//! mounts, and a directory moved out of the watched tree stops being watched.
//!
//! Every part is bounded: [`MAX_WATCH_STREAMS`] watches at once per conversation,
//! [`MAX_WATCHED_DIRS`] directories per watch (past it a [`WatchEvent::Limit`] names what is
//! not watched), and [`MAX_QUEUED_WATCH_EVENTS`] events waiting for a slow reader (past it
//! events are dropped and one [`WatchEvent::Overflow`] says so).

use serde::{Deserialize, Serialize};

/// Most watches open at once in one conversation; one more is refused with
/// [`crate::Error::Busy`].
pub const MAX_WATCH_STREAMS: usize = 4;

/// Most directories one watch follows (inotify watches are a per-user kernel resource).
pub const MAX_WATCHED_DIRS: usize = 1024;

/// Most events one watch keeps for a reader that does not keep up; past it they are dropped
/// and the reader gets one [`WatchEvent::Overflow`].
pub const MAX_QUEUED_WATCH_EVENTS: usize = 1024;

/// One event of a watch. Paths are presented workspace paths (`/workspace/a/b`); `dir` says
/// whether the path is a directory.
///
/// In JSON, the variant is the `kind` field in snake case:
///
/// ```
/// use sessionbox_core::WatchEvent;
/// let e = WatchEvent::Created { path: "/workspace/a.txt".into(), dir: false };
/// assert_eq!(
///     serde_json::to_string(&e).unwrap(),
///     r#"{"kind":"created","path":"/workspace/a.txt","dir":false}"#
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WatchEvent {
    /// The first event: the watch is in place, every later change is reported.
    Ready {
        /// The watched directory.
        path: String,
        /// Directories followed (the watched one and those beneath it).
        watched_dirs: usize,
        /// Directories beneath it not followed, past [`MAX_WATCHED_DIRS`].
        skipped_dirs: usize,
    },
    /// A path appeared (created, or moved in from outside the watched tree).
    Created {
        /// The new path.
        path: String,
        /// It is a directory.
        dir: bool,
    },
    /// A file's contents or metadata changed (written, closed after writing, mode, owner).
    Modified {
        /// The path.
        path: String,
        /// It is a directory.
        dir: bool,
    },
    /// A path went away (removed, or moved out of the watched tree).
    Deleted {
        /// The old path.
        path: String,
        /// It was a directory.
        dir: bool,
    },
    /// A path was renamed within the watched tree.
    Moved {
        /// The old path.
        from: String,
        /// The new path.
        to: String,
        /// It is a directory.
        dir: bool,
    },
    /// Events were lost: the reader did not keep up, or the kernel's queue overflowed. What
    /// changed in between is unknown; list the directory again.
    Overflow,
    /// A new directory is not followed: the watch follows [`MAX_WATCHED_DIRS`] already.
    Limit {
        /// The directory not followed.
        path: String,
        /// The limit reached.
        max_dirs: usize,
    },
    /// The last event: the watched directory was removed or moved away, or the agent stops.
    Ended {
        /// Why.
        reason: String,
    },
}

impl WatchEvent {
    /// The event's `kind` as in JSON.
    pub fn kind(&self) -> &'static str {
        match self {
            WatchEvent::Ready { .. } => "ready",
            WatchEvent::Created { .. } => "created",
            WatchEvent::Modified { .. } => "modified",
            WatchEvent::Deleted { .. } => "deleted",
            WatchEvent::Moved { .. } => "moved",
            WatchEvent::Overflow => "overflow",
            WatchEvent::Limit { .. } => "limit",
            WatchEvent::Ended { .. } => "ended",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_with_their_kind() {
        let all = [
            WatchEvent::Ready {
                path: "/workspace".into(),
                watched_dirs: 3,
                skipped_dirs: 0,
            },
            WatchEvent::Moved {
                from: "/workspace/a".into(),
                to: "/workspace/b".into(),
                dir: true,
            },
            WatchEvent::Overflow,
            WatchEvent::Ended {
                reason: "gone".into(),
            },
        ];
        for e in all {
            let json = serde_json::to_string(&e).unwrap();
            assert!(
                json.contains(&format!(r#""kind":"{}""#, e.kind())),
                "{json}"
            );
            assert_eq!(serde_json::from_str::<WatchEvent>(&json).unwrap(), e);
        }
    }
}
