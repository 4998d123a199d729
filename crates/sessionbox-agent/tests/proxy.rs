//! `/proxy/{port}/...`: a reverse proxy to 127.0.0.1 inside the sandbox, behind the agent's
//! token check; the agent's own port (and execd's 44772) served by the agent itself.

use crate::common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::routing::{any, get};
use common::{RawResponse, TestAgent, request};
use futures::StreamExt;
use sessionbox_agent::{AccessToken, Agent, AgentConfig, Listen};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "tok-proxy-5d1e";

/// A target on 127.0.0.1: `/echo` streams the request body back, `/slow` sends three chunks
/// 300 ms apart, `/headers` answers the headers, path and query it received.
async fn target() -> u16 {
    let app = axum::Router::new()
        .route(
            "/echo",
            any(|req: Request| async move {
                let stream = req.into_body().into_data_stream();
                Body::from_stream(stream)
            }),
        )
        .route(
            "/slow",
            get(|| async {
                let s = futures::stream::iter(0..3).then(|i| async move {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    Ok::<_, std::io::Error>(format!("chunk{i};"))
                });
                Body::from_stream(s)
            }),
        )
        .route(
            "/",
            any(|req: Request| async move { describe(req.method().as_str(), &req) }),
        )
        .route(
            "/headers/{*rest}",
            any(|req: Request| async move { describe(req.method().as_str(), &req) }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    port
}

fn describe(method: &str, req: &Request) -> String {
    let h: &HeaderMap = req.headers();
    let mut out = format!("{method} {}\n", req.uri());
    let mut names: Vec<_> = h.keys().map(|k| k.as_str().to_owned()).collect();
    names.sort();
    for n in names {
        out.push_str(&format!("{n}: {}\n", h[n.as_str()].to_str().unwrap_or("?")));
    }
    out
}

/// Undoes chunked transfer coding (the raw helper keeps the body as sent).
fn dechunk(r: &RawResponse) -> Vec<u8> {
    if r.header("transfer-encoding") != Some("chunked") {
        return r.body.clone();
    }
    let (mut out, mut b) = (Vec::new(), &r.body[..]);
    loop {
        let i = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let n = usize::from_str_radix(std::str::from_utf8(&b[..i]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[i + 2 + n + 2..];
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_reach_a_port_inside_with_bodies_streamed() {
    let port = target().await;
    let a = TestAgent::start().await;

    // Method, path, query and headers as sent; the prefix removed.
    let r = a
        .raw(&request(
            "PUT",
            &format!("/proxy/{port}/headers/a/b%20c?x=1&y=two"),
            &["X-Custom: yes"],
            b"",
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = String::from_utf8(dechunk(&r)).unwrap();
    assert!(
        seen.starts_with("PUT /headers/a/b%20c?x=1&y=two\n"),
        "{seen}"
    );
    assert!(seen.contains("x-custom: yes\n"), "{seen}");
    assert!(
        seen.contains("host: agent\n"),
        "Host as the client sent it: {seen}"
    );
    assert!(seen.contains("x-forwarded-proto: http\n"), "{seen}");
    // `/proxy/PORT` and `/proxy/PORT/` are `/`.
    for p in [format!("/proxy/{port}"), format!("/proxy/{port}/")] {
        let r = a.raw(&request("GET", &p, &[], b"")).await;
        assert_eq!(r.status, 200);
        assert!(
            String::from_utf8(dechunk(&r))
                .unwrap()
                .starts_with("GET /\n")
        );
    }

    // A chunked request body is streamed to the target and back.
    let mut body = Vec::new();
    for part in ["hello ", "streamed ", "world"] {
        body.extend_from_slice(format!("{:x}\r\n{part}\r\n", part.len()).as_bytes());
    }
    body.extend_from_slice(b"0\r\n\r\n");
    let mut req = format!(
        "POST /proxy/{port}/echo HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\
         Transfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    req.extend_from_slice(&body);
    let r = a.raw(&req).await;
    assert_eq!(r.status, 200);
    assert_eq!(dechunk(&r), b"hello streamed world");
    // A large body with a length.
    let big = vec![b'z'; 3 * 1024 * 1024 + 7];
    let r = a
        .raw(&request("POST", &format!("/proxy/{port}/echo"), &[], &big))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(dechunk(&r).len(), big.len());

    // The response streams: the first chunk arrives before the target has sent the last one.
    let mut s = tokio::net::UnixStream::connect(&a.socket).await.unwrap();
    s.write_all(&request("GET", &format!("/proxy/{port}/slow"), &[], b""))
        .await
        .unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("chunk0;") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    let first = started.elapsed();
    assert!(
        first < Duration::from_millis(450),
        "first chunk after {first:?}"
    );
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.unwrap();
    got.extend_from_slice(&rest);
    assert!(String::from_utf8_lossy(&got).contains("chunk2;"));
    assert!(started.elapsed() >= Duration::from_millis(550));
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_ports_are_400_and_a_closed_port_is_502() {
    let a = TestAgent::start().await;
    for p in [
        "/proxy/",
        "/proxy/abc/x",
        "/proxy/0/x",
        "/proxy/65536/x",
        "/proxy/-1",
        "/proxy/80a/",
    ] {
        let r = a.raw(&request("GET", p, &[], b"")).await;
        assert_eq!(r.status, 400, "{p}: {}", r.text());
    }
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let r = a
        .raw(&request("POST", &format!("/proxy/{closed}/x"), &[], b"abc"))
        .await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(
        r.text().contains(&format!("127.0.0.1:{closed}")),
        "{}",
        r.text()
    );
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_token_is_checked_first_and_never_passed_on() {
    let port = target().await;
    let a = TestAgent::start_with(|c| c.token = Some(AccessToken::new(TOKEN))).await;
    let path = format!("/proxy/{port}/headers/x");
    let r = a.raw(&request("GET", &path, &[], b"")).await;
    assert_eq!(r.status, 401);
    let r = a
        .raw(&request(
            "GET",
            &path,
            &["X-EXECD-ACCESS-TOKEN: wrong"],
            b"",
        ))
        .await;
    assert_eq!(r.status, 401);
    let r = a.raw(&request("GET", "/proxy/44772/ping", &[], b"")).await;
    assert_eq!(r.status, 401, "the agent itself through the proxy too");
    let h = format!("X-EXECD-ACCESS-TOKEN: {TOKEN}");
    let r = a.raw(&request("GET", &path, &[&h], b"")).await;
    assert_eq!(r.status, 200);
    let seen = String::from_utf8(dechunk(&r)).unwrap();
    assert!(
        !seen.contains(TOKEN),
        "the target never sees the token: {seen}"
    );
    assert!(
        !seen.to_ascii_lowercase().contains("x-execd-access-token"),
        "{seen}"
    );
    let r = a
        .raw(&request("GET", "/proxy/44772/ping", &[&h], b""))
        .await;
    assert_eq!(r.status, 200);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn execd_port_and_own_port_reach_the_agent_itself() {
    // On a Unix socket: 44772 is the agent.
    let a = TestAgent::start().await;
    std::fs::write(a.root.join("f.txt"), "content").unwrap();
    let r = a.raw(&request("GET", "/proxy/44772/ping", &[], b"")).await;
    assert_eq!(r.status, 200);
    let r = a
        .raw(&request(
            "GET",
            "/proxy/44772/files/download?path=f.txt",
            &[],
            b"",
        ))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(dechunk(&r), b"content");
    let r = a
        .raw(&request("GET", "/proxy/44772/no-such-endpoint", &[], b""))
        .await;
    assert_eq!(r.status, 404);
    // Through the name the server gives this agent in bridge mode (`host:mapped/proxy/44772`),
    // a relay to another port nests one proxy path; the agent through itself twice does not.
    let port = target().await;
    let r = a
        .raw(&request(
            "GET",
            &format!("/proxy/44772/proxy/{port}/headers/x"),
            &[],
            b"",
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = a
        .raw(&request("GET", "/proxy/44772/proxy/44772/ping", &[], b""))
        .await;
    assert_eq!(r.status, 404);
    // Routes with path parameters of their own (the SDKs' status and logs of a background
    // command, through `/proxy/44772` on their default settings).
    let o = a
        .client
        .run_command(&sessionbox_execd::RunCommandRequest::shell("echo bg").background(true))
        .await
        .unwrap();
    let id = o.id.unwrap();
    let r = a
        .raw(&request(
            "GET",
            &format!("/proxy/44772/command/status/{id}"),
            &[],
            b"",
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains(&id), "{}", r.text());
    let r = a
        .raw(&request(
            "GET",
            &format!("/proxy/44772/command/{id}/logs?cursor=0"),
            &[],
            b"",
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("execd-commands-tail-cursor").is_some());
    a.stop().await;

    // On TCP: its own port too (what the SDK's readiness check asks in bridge mode).
    let dir = tempfile::tempdir().unwrap();
    let mut config = AgentConfig::new(dir.path());
    config.listen = Listen::Tcp("127.0.0.1:0".parse().unwrap());
    let agent = Agent::bind(config).await.unwrap();
    let addr = agent.local_addr().strip_prefix("tcp:").unwrap().to_owned();
    let own = addr.rsplit(':').next().unwrap().to_owned();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(async {
        let _ = rx.await;
    }));
    for p in [format!("/proxy/{own}/ping"), "/proxy/44772/ping".to_owned()] {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(&request("GET", &p, &[], b"")).await.unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        let head = String::from_utf8_lossy(&buf);
        assert!(head.starts_with("HTTP/1.1 200"), "{p}: {head}");
    }
    let _ = tx.send(());
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upgrade_is_tunnelled_both_ways() {
    // A target that accepts any upgrade and then echoes bytes.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut b).await.unwrap();
            head.push(b[0]);
        }
        let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
        assert!(head.contains("upgrade: echo"), "{head}");
        s.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n",
        )
        .await
        .unwrap();
        let mut buf = [0u8; 1024];
        loop {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            s.write_all(&buf[..n]).await.unwrap();
        }
    });
    let a = TestAgent::start().await;
    let mut s = tokio::net::UnixStream::connect(&a.socket).await.unwrap();
    s.write_all(
        format!(
            "GET /proxy/{port}/ws HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: echo"), "{head}");
    for msg in [&b"ping"[..], b"second message"] {
        s.write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back, msg);
    }
    drop(s);
    a.stop().await;
}
