//! `GET /sessionbox/v1/watch`: what changes beneath a workspace directory, read through the
//! real client (`AgentLink::watch`) from a real agent; paths as the workspace presents them,
//! nothing from outside it, and every bound tried past its limit.

use crate::common;

use std::time::{Duration, Instant};

use common::TestAgent;
use sessionbox_core::{
    AgentAccess, AgentEndpoint, Error, MAX_WATCH_STREAMS, MAX_WATCHED_DIRS, WatchEvent,
};
use sessionbox_execd::{AgentLink, WatchStream};

fn link(a: &TestAgent) -> AgentLink {
    AgentLink::new(AgentAccess::new(
        AgentEndpoint::Unix(a.socket.clone()),
        None,
    ))
    .unwrap()
}

/// Opens a watch of `dir` and checks its `ready` event; answers the stream and that event.
async fn open(a: &TestAgent, dir: &str) -> (WatchStream, WatchEvent) {
    let mut w = link(a).watch(dir).await.unwrap();
    let ready = w.next().await.unwrap().unwrap();
    assert!(matches!(ready, WatchEvent::Ready { .. }), "{ready:?}");
    (w, ready)
}

/// Events until `done` holds for one of them (included) or `limit` passes.
async fn until(
    w: &mut WatchStream,
    limit: Duration,
    mut done: impl FnMut(&WatchEvent) -> bool,
) -> Vec<WatchEvent> {
    let mut got = Vec::new();
    let end = Instant::now() + limit;
    while let Ok(next) = tokio::time::timeout_at(end.into(), w.next()).await {
        match next.unwrap() {
            Some(e) => {
                let stop = done(&e);
                got.push(e);
                if stop {
                    break;
                }
            }
            None => break,
        }
    }
    got
}

/// Everything that arrives within `quiet`.
async fn drain(w: &mut WatchStream, quiet: Duration) -> Vec<WatchEvent> {
    until(w, quiet, |_| false).await
}

fn created(path: String, dir: bool) -> WatchEvent {
    WatchEvent::Created { path, dir }
}

#[tokio::test(flavor = "multi_thread")]
async fn changes_are_reported_with_presented_paths_in_order() {
    let a = TestAgent::start().await;
    std::fs::create_dir(a.root.join("src")).unwrap();
    let (mut w, ready) = open(&a, ".").await;
    assert_eq!(
        ready,
        WatchEvent::Ready {
            path: a.root.display().to_string(),
            watched_dirs: 2,
            skipped_dirs: 0
        }
    );
    let f = a.root.join("src/main.rs");
    std::fs::write(&f, b"fn main() {}").unwrap();
    std::fs::rename(&f, a.root.join("src/lib.rs")).unwrap();
    std::fs::remove_file(a.root.join("src/lib.rs")).unwrap();
    // A new directory is followed at once, and what was made in it before its watch was in
    // place is reported too.
    std::fs::create_dir_all(a.root.join("new/deep/er")).unwrap();
    std::fs::write(a.root.join("new/deep/er/x.txt"), b"x").unwrap();
    let got = until(
        &mut w,
        Duration::from_secs(10),
        |e| matches!(e, WatchEvent::Modified { path, .. } if path.ends_with("x.txt")),
    )
    .await;
    let want = [
        created(a.path("src/main.rs"), false),
        WatchEvent::Modified {
            path: a.path("src/main.rs"),
            dir: false,
        },
        WatchEvent::Moved {
            from: a.path("src/main.rs"),
            to: a.path("src/lib.rs"),
            dir: false,
        },
        WatchEvent::Deleted {
            path: a.path("src/lib.rs"),
            dir: false,
        },
        created(a.path("new"), true),
    ];
    for e in &want {
        assert!(got.contains(e), "missing {e:?} in {got:#?}");
    }
    let order: Vec<usize> = want
        .iter()
        .map(|e| got.iter().position(|g| g == e).unwrap())
        .collect();
    assert!(order.is_sorted(), "{got:#?}");
    for p in ["new/deep", "new/deep/er", "new/deep/er/x.txt"] {
        assert!(
            got.iter()
                .any(|e| matches!(e, WatchEvent::Created { path, .. } if *path == a.path(p))),
            "{p} created: {got:#?}"
        );
    }
    // A watch of a subdirectory presents the same paths.
    let (mut sub, ready) = open(&a, "new/deep").await;
    assert!(
        matches!(ready, WatchEvent::Ready { ref path, watched_dirs: 2, .. } if *path == a.path("new/deep"))
    );
    std::fs::write(a.root.join("new/deep/er/y"), b"").unwrap();
    let got = until(&mut sub, Duration::from_secs(5), |e| {
        matches!(e, WatchEvent::Created { .. })
    })
    .await;
    assert_eq!(got.last(), Some(&created(a.path("new/deep/er/y"), false)));
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_to_outside_is_never_followed_and_its_target_changes_are_never_reported() {
    let a = TestAgent::start().await;
    // The attack: a link in the workspace to a directory outside (as /etc would be), then
    // changes there.
    std::os::unix::fs::symlink(&a.outside, a.root.join("etc")).unwrap();
    std::fs::create_dir(a.outside.join("sub")).unwrap();
    let (mut w, ready) = open(&a, ".").await;
    assert!(
        matches!(
            ready,
            WatchEvent::Ready {
                watched_dirs: 1,
                ..
            }
        ),
        "{ready:?}"
    );
    std::fs::write(a.outside.join("passwd"), b"root::0:0").unwrap();
    std::fs::write(a.outside.join("sub/shadow"), b"x").unwrap();
    std::fs::remove_file(a.outside.join("passwd")).unwrap();
    let got = drain(&mut w, Duration::from_millis(800)).await;
    assert!(
        got.is_empty(),
        "nothing of outside reaches the watch: {got:?}"
    );
    // Watching through the link itself is refused, naming the path.
    let err = Error::from(link(&a).watch("etc").await.unwrap_err());
    assert!(matches!(err, Error::OutsideWorkspace { .. }), "{err:?}");
    let err = Error::from(link(&a).watch("../outside").await.unwrap_err());
    assert!(matches!(err, Error::OutsideWorkspace { .. }), "{err:?}");
    let err = Error::from(link(&a).watch("missing").await.unwrap_err());
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    std::fs::write(a.root.join("file"), b"").unwrap();
    let err = Error::from(link(&a).watch("file").await.unwrap_err());
    assert!(matches!(err, Error::Conflict(_)), "{err:?}");
    // The link's own creation and removal are entries of the workspace, and reported as such.
    std::fs::remove_file(a.root.join("etc")).unwrap();
    let got = until(&mut w, Duration::from_secs(5), |e| {
        matches!(e, WatchEvent::Deleted { .. })
    })
    .await;
    assert!(got.contains(&WatchEvent::Deleted {
        path: a.path("etc"),
        dir: false
    }));
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_directory_moved_out_is_no_longer_watched_and_one_moved_in_is() {
    let a = TestAgent::start().await;
    std::fs::create_dir_all(a.root.join("d/inner")).unwrap();
    std::fs::create_dir(a.outside.join("incoming")).unwrap();
    let (mut w, _) = open(&a, ".").await;
    // Out: reported as gone, and what happens to it afterwards (outside) is not reported.
    std::fs::rename(a.root.join("d"), a.outside.join("d")).unwrap();
    let got = until(&mut w, Duration::from_secs(5), |e| {
        matches!(e, WatchEvent::Deleted { .. })
    })
    .await;
    assert_eq!(
        got.last(),
        Some(&WatchEvent::Deleted {
            path: a.path("d"),
            dir: true
        })
    );
    std::fs::write(a.outside.join("d/secret"), b"s").unwrap();
    std::fs::write(a.outside.join("d/inner/secret"), b"s").unwrap();
    let got = drain(&mut w, Duration::from_millis(800)).await;
    assert!(got.is_empty(), "{got:?}");
    // In: reported as created, and followed from then on.
    std::fs::rename(a.outside.join("incoming"), a.root.join("in")).unwrap();
    std::fs::write(a.root.join("in/f"), b"").unwrap();
    let got = until(
        &mut w,
        Duration::from_secs(5),
        |e| matches!(e, WatchEvent::Created { path, .. } if path.ends_with("in/f")),
    )
    .await;
    assert!(got.contains(&created(a.path("in"), true)), "{got:?}");
    assert!(got.contains(&created(a.path("in/f"), false)), "{got:?}");
    // Within: a move, and the directory's contents are reported under its new name.
    std::fs::rename(a.root.join("in"), a.root.join("renamed")).unwrap();
    std::fs::write(a.root.join("renamed/g"), b"").unwrap();
    let got = until(
        &mut w,
        Duration::from_secs(5),
        |e| matches!(e, WatchEvent::Created { path, .. } if path.ends_with("/g")),
    )
    .await;
    assert!(got.contains(&WatchEvent::Moved {
        from: a.path("in"),
        to: a.path("renamed"),
        dir: true
    }));
    assert_eq!(got.last(), Some(&created(a.path("renamed/g"), false)));
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_watch_ends_when_its_directory_goes_and_when_the_agent_stops() {
    let a = TestAgent::start().await;
    std::fs::create_dir_all(a.root.join("gone/sub")).unwrap();
    let (mut w, _) = open(&a, "gone").await;
    std::fs::remove_dir_all(a.root.join("gone")).unwrap();
    let got = until(&mut w, Duration::from_secs(5), |e| {
        matches!(e, WatchEvent::Ended { .. })
    })
    .await;
    assert!(
        matches!(got.last(), Some(WatchEvent::Ended { reason }) if reason.contains("removed")),
        "{got:?}"
    );
    assert_eq!(
        w.next().await.unwrap(),
        None,
        "the stream ends after `ended`"
    );
    // The agent stopping ends an open watch (and does not wait for it).
    let (mut w, _) = open(&a, ".").await;
    let t = Instant::now();
    a.stop().await;
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let got = drain(&mut w, Duration::from_secs(2)).await;
    assert!(
        matches!(got.last(), Some(WatchEvent::Ended { reason }) if reason.contains("stopping")),
        "{got:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn watches_past_the_limit_are_refused_until_one_closes() {
    let a = TestAgent::start().await;
    let mut open_now = Vec::new();
    for _ in 0..MAX_WATCH_STREAMS {
        open_now.push(open(&a, ".").await.0);
    }
    let err = link(&a).watch(".").await.unwrap_err();
    assert!(err.to_string().contains("429"), "{err}");
    assert!(matches!(Error::from(err), Error::Busy(_)));
    drop(open_now.pop());
    // The slot comes back once the agent sees the client gone.
    let mut again = None;
    for _ in 0..50 {
        if let Ok(w) = link(&a).watch(".").await {
            again = Some(w);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(again.is_some(), "a closed watch gives its place back");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn directories_past_the_limit_are_counted_and_named_not_watched() {
    let a = TestAgent::start().await;
    let extra = 5;
    for i in 0..MAX_WATCHED_DIRS - 1 + extra {
        std::fs::create_dir(a.root.join(format!("d{i}"))).unwrap();
    }
    let (mut w, ready) = open(&a, ".").await;
    assert_eq!(
        ready,
        WatchEvent::Ready {
            path: a.root.display().to_string(),
            watched_dirs: MAX_WATCHED_DIRS,
            skipped_dirs: extra
        }
    );
    std::fs::create_dir(a.root.join("one-more")).unwrap();
    let got = until(&mut w, Duration::from_secs(5), |e| {
        matches!(e, WatchEvent::Limit { .. })
    })
    .await;
    assert_eq!(
        got.last(),
        Some(&WatchEvent::Limit {
            path: a.path("one-more"),
            max_dirs: MAX_WATCHED_DIRS
        })
    );
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reader_that_does_not_keep_up_gets_overflow_not_unbounded_memory() {
    let a = TestAgent::start().await;
    let (mut w, _) = open(&a, ".").await;
    // 40 000 events (create and delete of 20 000 names) while nobody reads.
    let root = a.root.clone();
    let made = 20_000;
    tokio::task::spawn_blocking(move || {
        for i in 0..made {
            let p = root.join(format!("f{i}"));
            std::fs::write(&p, b"").unwrap();
            std::fs::remove_file(&p).unwrap();
        }
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = drain(&mut w, Duration::from_secs(2)).await;
    let overflows = got
        .iter()
        .filter(|e| matches!(e, WatchEvent::Overflow))
        .count();
    eprintln!(
        "{} events of {} arrived, {overflows} overflow events",
        got.len(),
        made * 3
    );
    assert!(overflows >= 1, "the loss is said");
    assert!(got.len() < made * 3, "events were dropped, not kept");
    // The watch goes on after an overflow.
    std::fs::write(a.root.join("after"), b"").unwrap();
    let got = until(
        &mut w,
        Duration::from_secs(5),
        |e| matches!(e, WatchEvent::Created { path, .. } if path.ends_with("after")),
    )
    .await;
    assert!(!got.is_empty());
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_watch_keeps_an_idle_agent_alive() {
    let a = TestAgent::start_with(|c| c.idle_timeout = Some(Duration::from_millis(300))).await;
    let (mut w, _) = open(&a, ".").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        a.socket.exists(),
        "the agent still serves while a watch is open"
    );
    std::fs::write(a.root.join("late"), b"").unwrap();
    let got = until(&mut w, Duration::from_secs(5), |e| {
        matches!(e, WatchEvent::Created { .. })
    })
    .await;
    assert!(!got.is_empty());
    drop(w);
    assert!(
        common::eventually(Duration::from_secs(5), || !a.socket.exists()).await,
        "the agent stops once the watch is closed and it is idle"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_large_directory_moved_in_is_announced_up_to_the_queue_bound_then_overflow() {
    let a = TestAgent::start().await;
    // The attack: 3000 files and 2000 directories made outside, then moved in at once.
    let big = a.outside.join("big");
    for i in 0..3000 {
        if i < 2000 {
            std::fs::create_dir_all(big.join(format!("d{i}"))).unwrap();
        }
        std::fs::write(big.join(format!("f{i}")), b"").unwrap();
    }
    let (mut w, _) = open(&a, ".").await;
    std::fs::rename(&big, a.root.join("big")).unwrap();
    std::fs::write(a.root.join("after"), b"").unwrap();
    let got = until(
        &mut w,
        Duration::from_secs(10),
        |e| matches!(e, WatchEvent::Created { path, .. } if path.ends_with("/after")),
    )
    .await;
    let news = got
        .iter()
        .filter(|e| matches!(e, WatchEvent::Created { .. }))
        .count();
    let overflow = got.iter().filter(|e| **e == WatchEvent::Overflow).count();
    eprintln!(
        "5000 entries moved in: {} events, {news} created, {overflow} overflow",
        got.len()
    );
    assert!(
        got.contains(&created(a.path("big"), true)),
        "{:?}",
        &got[..3]
    );
    assert!(overflow >= 1, "the rest is said to be lost");
    assert!(
        got.len() <= sessionbox_core::MAX_QUEUED_WATCH_EVENTS + 8,
        "{}",
        got.len()
    );
    // It goes on, and follows what it could watch.
    std::fs::write(a.root.join("big/d0/x"), b"").unwrap();
    let got = until(
        &mut w,
        Duration::from_secs(5),
        |e| matches!(e, WatchEvent::Created { path, .. } if path.ends_with("big/d0/x")),
    )
    .await;
    assert!(!got.is_empty());
    a.stop().await;
}
