//! Faults give clear typed errors and leak no sandbox: server down, a wrong key (401), a 422,
//! a 500, a server that never answers, a slow create, a redirect, a web page that is not an
//! OpenSandbox server. The real server is used wherever it can produce the fault; a few
//! one-shot local listeners stand in for servers that misbehave in ways it never does.

use crate::common;

use std::time::Duration;

use common::*;
use sessionbox_core::Runtime;
use sessionbox_opensandbox::{ApiKey, ClientConfig, OpenSandboxClient, OpenSandboxError};
use sessionbox_test_support::free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A local HTTP listener answering every request with `response` (or never, for `None`).
async fn fake_server(response: Option<&'static str>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = sock.read(&mut buf).await;
                match response {
                    Some(r) => {
                        let _ = sock.write_all(r.as_bytes()).await;
                        let _ = sock.shutdown().await;
                    }
                    None => tokio::time::sleep(Duration::from_secs(3600)).await,
                }
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn server_down_is_a_typed_unavailable_error() {
    let server = format!("http://127.0.0.1:{}", free_port());
    let key = ApiKey::new("k-secret-value").unwrap();
    let client = OpenSandboxClient::new(ClientConfig::new(&server, Some(key.clone()))).unwrap();
    let e = client.probe().await.unwrap_err();
    assert!(matches!(e, OpenSandboxError::Connect { .. }), "{e:?}");
    assert!(!e.to_string().contains("k-secret-value"));

    let mut config = sessionbox_opensandbox::OpenSandboxConfig::new(
        ClientConfig::new(&server, Some(key)),
        "faults",
    );
    config.timeout = Duration::from_secs(60);
    let directory =
        sessionbox_manager::StoreDirectory::new(sessionbox_store::Store::open_in_memory().unwrap());
    let rt =
        sessionbox_opensandbox::OpenSandboxRuntime::new(config, std::sync::Arc::new(directory))
            .unwrap();
    let e = rt.open(&conv("down")).await.err().unwrap();
    assert_eq!(e.code(), "runtime_unavailable", "{e}");
    assert!(e.to_string().contains("start an OpenSandbox server"), "{e}");
    assert!(!e.to_string().contains("k-secret-value"));
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let server = fake_server(None).await;
    let mut config = ClientConfig::new(&server, Some(ApiKey::new("k").unwrap()));
    config.request_timeout = Duration::from_millis(300);
    let client = OpenSandboxClient::new(config).unwrap();
    let t = std::time::Instant::now();
    let e = client.get("abc").await.unwrap_err();
    assert!(matches!(e, OpenSandboxError::Timeout { .. }), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let server = fake_server(Some(
        "HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/latest/meta-data/\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n",
    ))
    .await;
    let client =
        OpenSandboxClient::new(ClientConfig::new(&server, Some(ApiKey::new("k").unwrap())))
            .unwrap();
    let e = client.get("abc").await.unwrap_err();
    match &e {
        OpenSandboxError::Redirect {
            status, location, ..
        } => {
            assert_eq!(*status, 302);
            assert!(location.contains("169.254.169.254"));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_web_page_answering_200_is_not_a_healthy_server() {
    let server = fake_server(Some(
        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 13\r\n\
         Connection: close\r\n\r\n<html>hi</html",
    ))
    .await;
    let client =
        OpenSandboxClient::new(ClientConfig::new(&server, Some(ApiKey::new("k").unwrap())))
            .unwrap();
    let e = client.probe().await.unwrap_err();
    assert!(matches!(e, OpenSandboxError::Unhealthy { .. }), "{e:?}");
    let server = fake_server(Some(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 39\r\n\
         Connection: close\r\n\r\n{\"status\":\"healthy\",\"really\":\"no, I am\"}",
    ))
    .await;
    let client =
        OpenSandboxClient::new(ClientConfig::new(&server, Some(ApiKey::new("k").unwrap())))
            .unwrap();
    let e = client.probe().await.unwrap_err();
    assert!(matches!(e, OpenSandboxError::Unhealthy { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_is_reported_as_such_by_the_real_server() {
    let Some((domain, key)) = server() else {
        return;
    };
    let wrong = ApiKey::new(format!("{}-wrong", key.expose())).unwrap();
    let client = OpenSandboxClient::new(ClientConfig::new(&domain, Some(wrong.clone()))).unwrap();
    let e = client.probe().await.unwrap_err();
    assert!(matches!(e, OpenSandboxError::Unauthorized { .. }), "{e:?}");
    assert!(e.to_string().contains("OPEN_SANDBOX_API_KEY"), "{e}");
    assert!(!e.to_string().contains(wrong.expose()));
    let e = OpenSandboxClient::new(ClientConfig::new(&domain, None))
        .unwrap()
        .probe()
        .await
        .unwrap_err();
    assert!(matches!(e, OpenSandboxError::Unauthorized { .. }), "{e:?}");

    let (rt, _store) = runtime(&domain, wrong.clone(), "wrongkey");
    let e = rt.open(&conv("k")).await.err().unwrap();
    assert_eq!(e.code(), "unauthorized", "{e}");
    assert!(!e.to_string().contains(wrong.expose()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_422_from_the_real_server_is_typed_and_leaks_nothing() {
    let Some((domain, key)) = server() else {
        return;
    };
    // The 1.1.1 server requires resourceLimits: without them, create is a 422.
    let (rt, _store) = runtime_with(&domain, key, "e422", |c| c.resource_limits.clear());
    let e = rt.open(&conv("v")).await.err().unwrap();
    assert_eq!(e.code(), "backend_error", "{e}");
    assert!(e.to_string().contains("resourceLimits is required"), "{e}");
    assert_nothing_left(&rt).await;
    assert!(rt.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_from_the_real_server_is_typed_and_leaks_nothing() {
    let Some((domain, key)) = server() else {
        return;
    };
    // No registry is reachable: an image that is not local fails to pull, a 500.
    let (rt, _store) = runtime_with(&domain, key, "e500", |c| {
        c.image = "sessionbox/no-such-image:local".into();
    });
    let e = rt.open(&conv("v")).await.err().unwrap();
    assert_eq!(e.code(), "backend_error", "{e}");
    assert!(e.to_string().contains("500"), "{e}");
    assert_nothing_left(&rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_create_times_out_and_the_late_sandbox_is_deleted() {
    let Some((domain, key)) = server() else {
        return;
    };
    let (rt, _store) = runtime_with(&domain, key, "slow", |c| {
        c.client.create_timeout = Duration::from_millis(50);
    });
    let e = rt.open(&conv("slow")).await.err().unwrap();
    assert_eq!(e.code(), "timed_out", "{e}");
    // The server finished the create after we gave up; the runtime swept it.
    assert_nothing_left(&rt).await;
    assert!(rt.list().await.unwrap().is_empty());
}
