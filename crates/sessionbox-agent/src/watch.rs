//! `GET /sessionbox/v1/watch?path=DIR`: an event stream of what changes beneath a directory of
//! the workspace (see [`sessionbox_execd::watch_ext`]), from Linux inotify.
//!
//! What keeps it inside the workspace:
//!
//! - The watched directory is opened through [`Workspace::open_dir`] (the path policy, then
//!   `openat2(RESOLVE_BENEATH)`), and must be on the workspace's own mount.
//! - Every directory beneath it is opened from that descriptor with `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)`: a symbolic link is an entry that is reported, never
//!   a directory that is followed, and another mount (a bind) is never entered. inotify is given
//!   `/proc/self/fd/N` of that descriptor, so the inode watched is the one opened, whatever
//!   happens to the names meanwhile.
//! - A directory moved away stops being watched with everything beneath it (its events after
//!   the move would be about a place outside); one moved in is watched from then on.
//! - Paths are built from the watched directory's presented path and the names inotify gives,
//!   never read back from the host.
//!
//! Bounds: [`MAX_WATCH_STREAMS`] watches at once (429 `busy` past it), [`MAX_WATCHED_DIRS`]
//! directories per watch (a `limit` event names each one not followed), and
//! [`MAX_QUEUED_WATCH_EVENTS`] frames waiting for a slow reader (then events are dropped and one
//! `overflow` follows). A watch counts as activity for the agent's idle timeout, and ends with
//! an `ended` event when the agent stops or the watched directory goes away.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, StatxFlags};
use rustix::io::Errno;
use sessionbox_core::{
    Error, MAX_QUEUED_WATCH_EVENTS, MAX_WATCH_STREAMS, MAX_WATCHED_DIRS, WatchEvent,
};
use sessionbox_execd::watch_ext::{KEEPALIVE_FRAME, KEEPALIVE_INTERVAL, PATH_QUERY, frame};
use sessionbox_fs::Workspace;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::fs_ext::typed_error;
use crate::server::{AppState, query_one, query_pairs};

/// The agent's open watches: how many, and the signal that ends them all.
#[derive(Default)]
pub(crate) struct Watches {
    open: AtomicUsize,
    stop: CancellationToken,
}

impl Watches {
    /// Watches open now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Ends every watch (each sends `ended` first).
    pub(crate) fn stop_all(&self) {
        self.stop.cancel();
    }

    /// One more watch, unless [`MAX_WATCH_STREAMS`] are open.
    fn take(state: &Arc<AppState>) -> Result<Slot, Error> {
        let w = &state.watches;
        let taken = w
            .open
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_WATCH_STREAMS).then_some(n + 1)
            })
            .is_ok();
        if !taken {
            return Err(Error::Busy(format!(
                "{MAX_WATCH_STREAMS} watches are already open in this sandbox; close one first"
            )));
        }
        Ok(Slot(state.clone()))
    }
}

/// One open watch; dropping it gives the place back.
struct Slot(Arc<AppState>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.watches.open.fetch_sub(1, Ordering::SeqCst);
        self.0.activity.touch();
    }
}

/// `GET /sessionbox/v1/watch?path=DIR`.
pub(crate) async fn watch(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let pairs = query_pairs(&req);
    let path = query_one(&pairs, PATH_QUERY).unwrap_or(".").to_owned();
    let slot = match Watches::take(&state) {
        Ok(s) => s,
        Err(e) => return typed_error(&e),
    };
    let ws = state.ws.clone();
    let opened = tokio::task::spawn_blocking(move || Tree::open(&ws, &path)).await;
    let (ino, tree, ready) = match opened {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return typed_error(&e),
        Err(e) => return typed_error(&Error::Backend(format!("starting a watch failed: {e}"))),
    };
    // SAFETY: an `OwnedFd` is an open descriptor that stays the same until it is dropped,
    // which only the `AsyncFd` does.
    let ino = match unsafe { AsyncFd::register(ino) } {
        Ok(fd) => fd,
        Err(e) => {
            let (_, e) = e.into_parts();
            return typed_error(&Error::Backend(format!(
                "cannot register the inotify descriptor: {e}"
            )));
        }
    };
    let (tx, rx) = mpsc::channel::<Bytes>(MAX_QUEUED_WATCH_EVENTS);
    let stop = state.watches.stop.clone();
    tokio::spawn(run(ino, tree, ready, Out::new(tx), slot, stop));
    let mut keepalive = tokio::time::interval(KEEPALIVE_INTERVAL);
    keepalive.reset();
    let body = Body::from_stream(WatchBody { rx, keepalive });
    let mut response = (StatusCode::OK, body).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The response body: frames as the watch task queues them, a keepalive comment when quiet.
/// Dropping it (the client went away) closes the queue, which ends the task.
struct WatchBody {
    rx: mpsc::Receiver<Bytes>,
    keepalive: tokio::time::Interval,
}

impl Stream for WatchBody {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(f)) => {
                self.keepalive.reset();
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.keepalive.poll_tick(cx) {
                Poll::Ready(_) => Poll::Ready(Some(Ok(Bytes::from_static(KEEPALIVE_FRAME)))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

/// The bounded queue to the body, and what was lost to it.
struct Out {
    tx: mpsc::Sender<Bytes>,
    /// Events were dropped since the last frame queued: an `overflow` goes first.
    overflowed: bool,
    /// The last event queued, to fold repeated `modified` events of one path.
    last: Option<WatchEvent>,
}

impl Out {
    fn new(tx: mpsc::Sender<Bytes>) -> Self {
        Out {
            tx,
            overflowed: false,
            last: None,
        }
    }

    /// Queues `event` unless the queue is full (then it is dropped and an `overflow` owed).
    /// False once the reader has gone.
    fn send(&mut self, event: WatchEvent) -> bool {
        if matches!(event, WatchEvent::Modified { .. }) && self.last.as_ref() == Some(&event) {
            return true;
        }
        if self.overflowed && !self.try_queue(&WatchEvent::Overflow) {
            return !self.tx.is_closed();
        }
        self.overflowed = false;
        if self.try_queue(&event) {
            self.last = Some(event);
        } else {
            self.overflowed = true;
        }
        !self.tx.is_closed()
    }

    fn try_queue(&mut self, event: &WatchEvent) -> bool {
        self.tx.try_send(Bytes::from(frame(event))).is_ok()
    }
}

/// Reads inotify until the reader goes away, the agent stops or the watched directory goes.
async fn run(
    ino: AsyncFd<OwnedFd>,
    mut tree: Tree,
    ready: WatchEvent,
    mut out: Out,
    _slot: Slot,
    stop: CancellationToken,
) {
    out.send(ready);
    let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 * 1024];
    loop {
        let owed = out.overflowed;
        let tx = out.tx.clone();
        tokio::select! {
            () = tx.closed() => return,
            () = stop.cancelled() => {
                out.send(WatchEvent::Ended { reason: "the agent is stopping".into() });
                return;
            }
            permit = tx.reserve(), if owed => {
                if let Ok(p) = permit {
                    p.send(Bytes::from(frame(&WatchEvent::Overflow)));
                    out.overflowed = false;
                    out.last = None;
                }
            }
            readable = ino.readable() => {
                let Ok(mut guard) = readable else { return };
                let mut raw = Vec::new();
                let mut reader = inotify::Reader::new(ino.get_ref(), &mut buf);
                let failed = loop {
                    match reader.next() {
                        Ok(e) => raw.push(RawEvent {
                            wd: e.wd(),
                            mask: e.events(),
                            cookie: e.cookie(),
                            name: e.file_name().map(|n| n.to_string_lossy().into_owned()),
                        }),
                        Err(Errno::AGAIN) => {
                            guard.clear_ready();
                            break None;
                        }
                        Err(Errno::INTR) => {}
                        Err(e) => break Some(e),
                    }
                };
                let mut events = Vec::new();
                let ended = tree.translate(ino.get_ref().as_fd(), raw, &mut events);
                for e in events {
                    if !out.send(e) {
                        return;
                    }
                }
                if let Some(e) = failed {
                    out.send(WatchEvent::Ended { reason: format!("reading inotify failed: {e}") });
                    return;
                }
                if ended {
                    return;
                }
            }
        }
    }
}

/// Where a walk reports what it finds: nowhere (the first walk), or events up to
/// [`MAX_QUEUED_WATCH_EVENTS`], then one `overflow`.
struct Announce<'a> {
    events: Option<&'a mut Vec<WatchEvent>>,
    sent: usize,
}

impl Announce<'_> {
    fn push(&mut self, event: WatchEvent) {
        let Some(events) = self.events.as_deref_mut() else {
            return;
        };
        self.sent += 1;
        if self.sent < MAX_QUEUED_WATCH_EVENTS {
            events.push(event);
        } else if self.sent == MAX_QUEUED_WATCH_EVENTS {
            events.push(WatchEvent::Overflow);
        }
    }
}

/// One inotify event, owned.
struct RawEvent {
    wd: i32,
    mask: ReadFlags,
    cookie: u32,
    name: Option<String>,
}

/// What inotify is asked to report of each directory.
fn watch_mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MODIFY
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::ATTRIB
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::ONLYDIR
        | WatchFlags::EXCL_UNLINK
}

/// The directories a watch follows.
struct Tree {
    /// The workspace root (`O_PATH`), which every watched directory is opened from. (Not the
    /// watched directory itself: a descriptor of it would keep the kernel from reporting its
    /// removal.)
    root: OwnedFd,
    /// The watched directory's real path below the root, links resolved (`""`: the root).
    top_rel: String,
    /// Its presented path (`/workspace/src`).
    shown: String,
    /// Watch descriptor to path below the top (`""` for the top itself).
    dirs: HashMap<i32, String>,
    top_wd: i32,
    /// A `moved_from` waiting for its `moved_to`: cookie, path below the top, directory.
    pending: Option<(u32, String, bool)>,
}

impl Tree {
    /// Opens `path` and watches it and the directories beneath it; answers the inotify
    /// descriptor, the tree and the `ready` event.
    fn open(ws: &Workspace, path: &str) -> Result<(OwnedFd, Tree, WatchEvent), Error> {
        let rel = ws.resolve(path)?;
        let shown = rel.presented(ws.presented_root());
        let top = ws.open_dir(path)?;
        let root = ws.open_dir(".")?;
        if mount_of(&top)? != mount_of(&root)? {
            return Err(Error::OutsideWorkspace {
                path: shown,
                reason: "it is on another mount than the workspace".into(),
            });
        }
        // Where the kernel found it below the root (inside links resolved); only used to open
        // it again beneath the root, never shown.
        let real = |fd: &OwnedFd| {
            std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|e| {
                Error::Backend(format!(
                    "cannot start watching {shown} (/proc/self/fd): {e}"
                ))
            })
        };
        let top_rel = match real(&top)?.strip_prefix(real(&root)?) {
            Ok(p) => p.to_str().map(str::to_owned),
            Err(_) => None,
        }
        .ok_or_else(|| Error::OutsideWorkspace {
            path: shown.clone(),
            reason: "it does not lie beneath the workspace root".into(),
        })?;
        drop(top);
        let ino = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
            .map_err(|e| Error::Backend(format!("cannot start watching (inotify_init1): {e}")))?;
        let mut tree = Tree {
            root,
            top_rel,
            shown,
            dirs: HashMap::new(),
            top_wd: -1,
            pending: None,
        };
        let mut skipped = 0;
        tree.add(ino.as_fd(), String::new(), None, &mut skipped)?;
        tree.top_wd = tree
            .dirs
            .iter()
            .find(|(_, p)| p.is_empty())
            .map(|(wd, _)| *wd)
            .ok_or_else(|| Error::Backend(format!("cannot watch {}", tree.shown)))?;
        let ready = WatchEvent::Ready {
            path: tree.shown.clone(),
            watched_dirs: tree.dirs.len(),
            skipped_dirs: skipped,
        };
        Ok((ino, tree, ready))
    }

    /// Opens `rel` (below the top) for reading, beneath the root.
    fn open_dir(&self, rel: &str) -> rustix::io::Result<OwnedFd> {
        match (self.top_rel.is_empty(), rel.is_empty()) {
            (true, _) => open_below(&self.root, rel),
            (false, true) => open_below(&self.root, &self.top_rel),
            (false, false) => open_below(&self.root, &format!("{}/{rel}", self.top_rel)),
        }
    }

    /// The presented path of `rel` (below the top).
    fn show(&self, rel: &str) -> String {
        match (rel.is_empty(), self.shown.as_str()) {
            (true, s) => s.to_owned(),
            (false, "/") => format!("/{rel}"),
            (false, s) => format!("{s}/{rel}"),
        }
    }

    /// Watches `rel` and every directory beneath it, breadth first, up to the limit. Without
    /// `events` (the first walk) a directory past the limit is only counted in `skipped`; with
    /// them, it is a `limit` event, and every entry found is a `created` event (what was made
    /// in a new directory before its watch was in place).
    fn add(
        &mut self,
        ino: std::os::fd::BorrowedFd<'_>,
        rel: String,
        mut events: Option<&mut Vec<WatchEvent>>,
        skipped: &mut usize,
    ) -> Result<(), Error> {
        // What one walk reports is bounded like the queue it goes to: past
        // MAX_QUEUED_WATCH_EVENTS entries (a large directory moved in), one `overflow` instead.
        let mut announce = Announce {
            events: events.take(),
            sent: 0,
        };
        let mut queue = VecDeque::from([rel]);
        while let Some(rel) = queue.pop_front() {
            if self.dirs.len() >= MAX_WATCHED_DIRS {
                *skipped += 1;
                announce.push(WatchEvent::Limit {
                    path: self.show(&rel),
                    max_dirs: MAX_WATCHED_DIRS,
                });
                continue;
            }
            let Ok(dir) = self.open_dir(&rel) else {
                continue;
            };
            let wd = match inotify::add_watch(
                ino,
                format!("/proc/self/fd/{}", dir.as_raw_fd()),
                watch_mask(),
            ) {
                Ok(wd) => wd,
                Err(e) if rel.is_empty() => {
                    return Err(Error::Backend(format!(
                        "cannot watch {} (inotify_add_watch): {e}",
                        self.shown
                    )));
                }
                Err(Errno::NOSPC) => {
                    // The kernel's per-user allowance of watches is spent.
                    *skipped += 1;
                    announce.push(WatchEvent::Limit {
                        path: self.show(&rel),
                        max_dirs: self.dirs.len(),
                    });
                    continue;
                }
                Err(_) => continue,
            };
            self.dirs.insert(wd, rel.clone());
            let Ok(entries) = rustix::fs::Dir::read_from(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_bytes();
                if name == b"." || name == b".." {
                    continue;
                }
                let name = String::from_utf8_lossy(name);
                let child = if rel.is_empty() {
                    name.into_owned()
                } else {
                    format!("{rel}/{name}")
                };
                let is_dir = match entry.file_type() {
                    rustix::fs::FileType::Directory => true,
                    rustix::fs::FileType::Unknown => self.open_dir(&child).is_ok(),
                    _ => false,
                };
                announce.push(WatchEvent::Created {
                    path: self.show(&child),
                    dir: is_dir,
                });
                if !is_dir {
                    continue;
                }
                // The walk's own queue never holds more than the directories it may watch.
                if self.dirs.len() + queue.len() < MAX_WATCHED_DIRS {
                    queue.push_back(child);
                } else {
                    *skipped += 1;
                    announce.push(WatchEvent::Limit {
                        path: self.show(&child),
                        max_dirs: MAX_WATCHED_DIRS,
                    });
                }
            }
        }
        Ok(())
    }

    /// Stops watching `rel` and everything beneath it.
    fn remove(&mut self, ino: std::os::fd::BorrowedFd<'_>, rel: &str) {
        let prefix = format!("{rel}/");
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(_, p)| p.as_str() == rel || p.starts_with(&prefix))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            self.dirs.remove(&wd);
            let _ = inotify::remove_watch(ino, wd);
        }
    }

    /// Turns raw events into watch events (into `out`); true when the watch has ended.
    fn translate(
        &mut self,
        ino: std::os::fd::BorrowedFd<'_>,
        raw: Vec<RawEvent>,
        out: &mut Vec<WatchEvent>,
    ) -> bool {
        for e in raw {
            let pairs_pending = e.mask.contains(ReadFlags::MOVED_TO)
                && self
                    .pending
                    .as_ref()
                    .is_some_and(|(c, _, _)| *c == e.cookie);
            if !pairs_pending {
                self.flush_pending(ino, out);
            }
            if e.mask.contains(ReadFlags::QUEUE_OVERFLOW) {
                out.push(WatchEvent::Overflow);
                continue;
            }
            if e.wd == self.top_wd
                && e.mask
                    .intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF | ReadFlags::IGNORED)
            {
                let reason = if e.mask.contains(ReadFlags::MOVE_SELF) {
                    "the watched directory was moved away"
                } else {
                    "the watched directory was removed"
                };
                out.push(WatchEvent::Ended {
                    reason: reason.into(),
                });
                return true;
            }
            if e.mask.contains(ReadFlags::IGNORED) {
                self.dirs.remove(&e.wd);
                continue;
            }
            let Some(base) = self.dirs.get(&e.wd).cloned() else {
                continue;
            };
            let Some(name) = e.name else {
                // An event of a directory itself: its parent reports what matters, except a
                // change of its own metadata.
                if e.mask.contains(ReadFlags::ATTRIB) {
                    out.push(WatchEvent::Modified {
                        path: self.show(&base),
                        dir: true,
                    });
                }
                continue;
            };
            let rel = if base.is_empty() {
                name
            } else {
                format!("{base}/{name}")
            };
            let dir = e.mask.contains(ReadFlags::ISDIR);
            if e.mask.contains(ReadFlags::CREATE) {
                out.push(WatchEvent::Created {
                    path: self.show(&rel),
                    dir,
                });
                if dir {
                    let mut skipped = 0;
                    let _ = self.add(ino, rel, Some(out), &mut skipped);
                }
            } else if e.mask.contains(ReadFlags::DELETE) {
                out.push(WatchEvent::Deleted {
                    path: self.show(&rel),
                    dir,
                });
            } else if e.mask.contains(ReadFlags::MOVED_FROM) {
                self.pending = Some((e.cookie, rel, dir));
            } else if e.mask.contains(ReadFlags::MOVED_TO) {
                match self.pending.take() {
                    Some((c, from, _)) if c == e.cookie => {
                        // Within the tree: the watches beneath stay, under the new name.
                        if dir {
                            self.rename(&from, &rel);
                        }
                        out.push(WatchEvent::Moved {
                            from: self.show(&from),
                            to: self.show(&rel),
                            dir,
                        });
                    }
                    _ => {
                        // In from outside: followed from now on, its contents new here.
                        out.push(WatchEvent::Created {
                            path: self.show(&rel),
                            dir,
                        });
                        if dir {
                            let mut skipped = 0;
                            let _ = self.add(ino, rel, Some(out), &mut skipped);
                        }
                    }
                }
            } else if e
                .mask
                .intersects(ReadFlags::MODIFY | ReadFlags::CLOSE_WRITE | ReadFlags::ATTRIB)
            {
                out.push(WatchEvent::Modified {
                    path: self.show(&rel),
                    dir,
                });
            }
        }
        self.flush_pending(ino, out);
        false
    }

    /// Renames the watched paths `from` and beneath to `to`.
    fn rename(&mut self, from: &str, to: &str) {
        let prefix = format!("{from}/");
        for p in self.dirs.values_mut() {
            if p == from {
                *p = to.to_owned();
            } else if let Some(rest) = p.strip_prefix(&prefix) {
                *p = format!("{to}/{rest}");
            }
        }
    }

    /// A `moved_from` without its `moved_to`: moved out of the watched tree, whose watches
    /// beneath end here (what happens to it next happens outside).
    fn flush_pending(&mut self, ino: std::os::fd::BorrowedFd<'_>, out: &mut Vec<WatchEvent>) {
        if let Some((_, rel, dir)) = self.pending.take() {
            if dir {
                self.remove(ino, &rel);
            }
            out.push(WatchEvent::Deleted {
                path: self.show(&rel),
                dir,
            });
        }
    }
}

/// Opens directory `rel` below `root` (the root itself for `""`) for reading: no link
/// followed, no mount crossed, nothing above `root`.
fn open_below(root: &OwnedFd, rel: &str) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat2(
        root,
        if rel.is_empty() { "." } else { rel },
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV,
    )
}

/// The mount a descriptor's inode is on.
fn mount_of(fd: &OwnedFd) -> Result<u64, Error> {
    rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)
        .map(|s| s.stx_mnt_id)
        .map_err(|e| Error::Backend(format!("cannot stat a watched directory: {e}")))
}
