//! The client against a real `sessionbox-server` on loopback (host runtime, real files and
//! processes): every `Session` method, the error codes, and paths that HTTP layers would
//! otherwise rewrite.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use sessionbox_client::Client;
use sessionbox_core::{
    ConversationId, EditRequest, Error, ExecRequest, ExitStatus, FileKind, GrepRequest, Runtime,
    Session, TenantId,
};
use sessionbox_local::host::{HostConfig, HostRuntime};
use sessionbox_manager::Manager;
use sessionbox_server::{AppState, ServerConfig};
use sessionbox_store::Store;

struct Server {
    base: String,
    key: String,
    _dir: tempfile::TempDir,
}

async fn server() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
    let key = store
        .create_api_key(&TenantId::new("acme").unwrap(), None, Utc::now())
        .unwrap()
        .key;
    let runtime: Arc<dyn Runtime> =
        Arc::new(HostRuntime::new(HostConfig::new(dir.path())).unwrap());
    let state = AppState::new(Manager::new(store, runtime), ServerConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(sessionbox_server::serve(
        listener,
        state,
        std::future::pending(),
    ));
    Server {
        base,
        key,
        _dir: dir,
    }
}

fn id(s: &str) -> ConversationId {
    ConversationId::new(s).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_session_method_works_over_http() {
    let s = server().await;
    let c = Client::new(&s.base, Some(s.key.clone())).unwrap();
    let a = c.open(&id("alice")).await.unwrap();
    assert!(a.created());
    assert!(std::path::Path::new(a.workspace_root()).is_dir());

    a.write("dir/a.txt", b"hello\nworld\n").await.unwrap();
    assert_eq!(a.read("dir/a.txt").await.unwrap(), b"hello\nworld\n");
    // Bytes that are not UTF-8 survive exec output (base64 on the wire) and files.
    a.write("bin", &[0, 255, 1]).await.unwrap();
    assert_eq!(a.read("bin").await.unwrap(), [0, 255, 1]);
    let r = a
        .exec(
            ExecRequest::new("cat bin; echo err >&2; cat; exit 3")
                .stdin(b"in".to_vec())
                .timeout(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert_eq!(r.status, ExitStatus::Code(3));
    assert_eq!(r.stdout, [0, 255, 1, b'i', b'n']);
    assert_eq!(r.stderr, b"err\n");
    let r = a
        .exec(ExecRequest::new("sleep 5").timeout(Duration::from_millis(200)))
        .await
        .unwrap();
    assert!(r.timed_out);
    let r = a
        .exec(ExecRequest::new("pwd").cwd("dir").env("X", "1"))
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&r.stdout)
            .trim_end()
            .ends_with("/dir")
    );

    let e = a
        .edit(
            "dir/a.txt",
            &EditRequest {
                old: "world".into(),
                new: "there".into(),
                replace_all: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(e.replacements, 1);
    let names: Vec<_> = a
        .list("dir")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["a.txt"]);
    assert_eq!(a.glob("**/*.txt").await.unwrap(), ["dir/a.txt"]);
    let m = a.grep(&GrepRequest::new("there")).await.unwrap();
    assert_eq!((m[0].path.as_str(), m[0].line_number), ("dir/a.txt", 2));
    assert_eq!(a.stat("dir").await.unwrap().kind, FileKind::Directory);
    a.mkdir("x/y").await.unwrap();
    a.remove("x", true).await.unwrap();
    assert!(matches!(a.stat("x").await, Err(Error::NotFound(_))));

    // The server's typed errors come back as the same errors.
    assert!(matches!(a.read("nope").await, Err(Error::NotFound(_))));
    for path in [
        "../other/x",
        "/etc/passwd",
        "dir/../../x",
        "..",
        "x/../../..",
    ] {
        let e = a.read(path).await.unwrap_err();
        assert_eq!(e.code(), "outside_workspace", "{path}: {e}");
        let e = a.write(path, b"x").await.unwrap_err();
        assert_eq!(e.code(), "outside_workspace", "{path}: {e}");
    }
    let e = a
        .exec(ExecRequest::new("true").cwd("../.."))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "outside_workspace");

    // Resume, list, destroy (idempotent).
    Box::new(a).close().await.unwrap();
    let again = c.open(&id("alice")).await.unwrap();
    assert!(!again.created());
    assert_eq!(again.read("dir/a.txt").await.unwrap(), b"hello\nthere\n");
    let b = c.open(&id("bob")).await.unwrap();
    assert!(matches!(b.read("dir/a.txt").await, Err(Error::NotFound(_))));
    assert_ne!(b.key(), again.key());
    let ids: Vec<_> = c.list().await.unwrap().into_iter().map(|i| i.id).collect();
    assert_eq!(ids, ["alice", "bob"]);
    assert_eq!(c.get(&id("alice")).await.unwrap().unwrap().runtime, "host");
    c.destroy(&id("alice")).await.unwrap();
    c.destroy(&id("alice")).await.unwrap();
    assert!(c.get(&id("alice")).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_and_an_absent_server_are_typed_errors_without_the_key() {
    let s = server().await;
    let c = Client::new(&s.base, Some("sbk_wrong_0000".into())).unwrap();
    let e = c.open(&id("x")).await.unwrap_err();
    assert_eq!(e.code(), "unauthorized", "{e}");
    assert!(!e.to_string().contains("sbk_wrong"));

    // A port nobody listens on.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    let c = Client::new(&dead, Some("sbk_secret_1".into())).unwrap();
    let e = c.open(&id("x")).await.unwrap_err();
    assert!(matches!(e, Error::Backend(_)), "{e}");
    assert!(e.to_string().contains("did not answer"), "{e}");
    assert!(!e.to_string().contains("sbk_secret"));
}
