//! `GET /v1/conversations/{id}/pty` over the isolated runtime, through a real WebSocket client
//! (tokio-tungstenite) on the server's TCP port.

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use reqwest::{Method, StatusCode};
use serde_json::json;
use sessionbox_execd::pty::{self, ClientFrame, ServerFrame, channel};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::{Server, body};

pub(crate) type Ws = WebSocketStream<tokio::net::TcpStream>;

/// Opens conversation `id`'s terminal (`query` appended), with `key` when given; the HTTP
/// status when the upgrade is refused.
pub(crate) async fn open(s: &Server, id: &str, query: &str, key: Option<&str>) -> Result<Ws, u16> {
    let url = format!(
        "{}/v1/conversations/{id}/pty{query}",
        s.base.replace("http://", "ws://")
    );
    let mut req = url.into_client_request().unwrap();
    if let Some(k) = key {
        req.headers_mut()
            .insert("authorization", format!("Bearer {k}").parse().unwrap());
    }
    let addr = s.base.trim_start_matches("http://").to_owned();
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    match tokio_tungstenite::client_async(req, stream).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("websocket handshake: {e}"),
    }
}

/// What a client saw.
#[derive(Default, Debug)]
pub(crate) struct Seen {
    pub(crate) output: Vec<u8>,
    pub(crate) frames: Vec<ServerFrame>,
    pub(crate) close: Option<u16>,
}

impl Seen {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.output).into_owned()
    }
    pub(crate) fn exit_code(&self) -> Option<i32> {
        self.frames
            .iter()
            .find(|f| f.kind == "exit")
            .and_then(|f| f.exit_code)
    }
}

/// Reads frames into `seen` until `until` holds or the socket closes (panics after 20 s).
pub(crate) async fn read_until(ws: &mut Ws, seen: &mut Seen, until: impl Fn(&Seen) -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !until(seen) {
        let left = end.saturating_duration_since(Instant::now());
        let msg = tokio::time::timeout(left, ws.next())
            .await
            .unwrap_or_else(|_| panic!("timed out; seen: {:?} {:?}", seen.frames, seen.text()));
        match msg {
            None | Some(Err(_)) => return,
            Some(Ok(Message::Binary(b))) => {
                let (ch, _, data) = pty::parse_server_binary(&b).unwrap();
                assert!(ch == channel::STDOUT || ch == channel::REPLAY);
                seen.output.extend_from_slice(data);
            }
            Some(Ok(Message::Text(t))) => seen.frames.push(serde_json::from_str(&t).unwrap()),
            Some(Ok(Message::Close(c))) => {
                seen.close = Some(c.map_or(1005, |c| u16::from(c.code)));
                return;
            }
            Some(Ok(_)) => {}
        }
    }
}

pub(crate) async fn type_in(ws: &mut Ws, text: &str) {
    ws.send(Message::Binary(
        pty::binary_frame(channel::STDIN, text.as_bytes()).into(),
    ))
    .await
    .unwrap();
}

/// Opens a terminal and waits for its prompt.
async fn ready(s: &Server, id: &str, key: Option<&str>) -> (Ws, Seen) {
    let mut ws = open(s, id, "", key).await.unwrap();
    let mut seen = Seen::default();
    read_until(&mut ws, &mut seen, |s| {
        s.frames.first().is_some_and(|f| f.kind == "connected")
            && (s.text().ends_with("$ ") || s.text().ends_with("# "))
    })
    .await;
    (ws, seen)
}

/// A terminal in a sandbox is the sandbox's: its user, workspace, window size, Ctrl-C and
/// exit status; what it writes the REST API reads; closing the socket ends what it started.
pub(crate) async fn a_terminal_over_rest_runs_in_the_conversations_sandbox() {
    let s = Server::start().await;
    let (mut ws, mut seen) = ready(&s, "iso-pty", None).await;
    type_in(
        &mut ws,
        "cd sub 2>/dev/null || mkdir sub; echo from-terminal > note.txt; id -u; pwd; stty size; echo $((6*7))-done\n",
    )
    .await;
    read_until(&mut ws, &mut seen, |s| s.text().contains("42-done")).await;
    let text = seen.text();
    assert!(text.contains("/workspace\r\n"), "{text}");
    assert!(text.contains("\r\n24 80\r\n"), "{text}");
    assert!(
        !text.contains("\r\n0\r\n"),
        "the shell runs as the sandbox's user: {text}"
    );
    let (st, v) = body(
        s.req(Method::GET, "/v1/conversations/iso-pty/files/note.txt")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");

    ws.send(Message::Text(
        serde_json::to_string(&ClientFrame::resize(100, 30))
            .unwrap()
            .into(),
    ))
    .await
    .unwrap();
    type_in(&mut ws, "stty size; echo size-$((1+1))\n").await;
    read_until(&mut ws, &mut seen, |s| s.text().contains("size-2")).await;
    assert!(seen.text().contains("30 100"), "{}", seen.text());

    type_in(&mut ws, "sleep 30\n").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    type_in(&mut ws, "\x03").await;
    type_in(&mut ws, "echo status=$?\n").await;
    read_until(&mut ws, &mut seen, |s| s.text().contains("status=130")).await;
    assert!(started.elapsed() < Duration::from_secs(5));

    // Something left running behind the terminal dies with it.
    type_in(&mut ws, "sleep 600 & echo $! > bg.pid; echo bg-$((1+2))\n").await;
    read_until(&mut ws, &mut seen, |s| s.text().contains("bg-3")).await;
    drop(ws);
    let gone = super::until(10, || async {
        let (_, v) = body(
            s.json(
                Method::POST,
                "/v1/conversations/iso-pty/exec",
                &json!({"command": "kill -0 $(cat bg.pid) 2>/dev/null && echo alive || echo gone"}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        v["stdout"].as_str().is_some_and(|o| o.contains("gone"))
    })
    .await;
    assert!(gone, "the terminal's background job outlived its socket");

    // A new terminal; its shell's exit status ends the socket.
    let (mut ws, mut seen) = ready(&s, "iso-pty", None).await;
    type_in(&mut ws, "exit 5\n").await;
    read_until(&mut ws, &mut seen, |s| s.close.is_some()).await;
    assert_eq!(seen.exit_code(), Some(5), "{:?}", seen.frames);
    assert_eq!(seen.close, Some(1000));

    // Not a WebSocket: 426, nothing opened.
    let r = s
        .req(Method::GET, "/v1/conversations/iso-pty/pty")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UPGRADE_REQUIRED);
    // A working directory outside the workspace: 403 or 400, before any upgrade.
    let st = open(&s, "iso-pty", "?cwd=../..", None).await.err().unwrap();
    assert!(st == 400 || st == 403, "{st}");

    // Attack: cross-site WebSocket hijacking. A web page on another origin opens the terminal
    // of this keyless loopback server from the user's browser (which sends its Origin). Refused
    // before anything is opened: no conversation is created.
    let url = format!(
        "{}/v1/conversations/iso-pty-hijack/pty",
        s.base.replace("http://", "ws://")
    );
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("origin", "http://evil.example".parse().unwrap());
    let stream = tokio::net::TcpStream::connect(s.base.trim_start_matches("http://"))
        .await
        .unwrap();
    match tokio_tungstenite::client_async(req, stream).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            assert_eq!(r.status().as_u16(), 403)
        }
        other => panic!("a foreign origin got a terminal: {:?}", other.map(|_| ())),
    }
    let (st, _) = body(
        s.req(Method::GET, "/v1/conversations/iso-pty-hijack")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

/// Attack: a terminal of tenant A's conversation looks for tenant B's files and processes, and
/// tenant A opens terminals until the sandbox runs out. A key is needed, B's terminal sees its
/// own workspace only, the 9th terminal is refused with 429 while the 8 others and B's keep
/// working.
pub(crate) async fn terminals_are_per_tenant_keyed_and_bounded() {
    let s = Server::start_with(Default::default(), &["ta", "tb"]).await;
    let key_a = s.keys[0].1.clone();
    let key_b = s.keys[1].1.clone();
    assert_eq!(open(&s, "iso-pty2", "", None).await.err(), Some(401));
    assert_eq!(
        open(&s, "iso-pty2", "", Some("sb_wrong")).await.err(),
        Some(401)
    );

    let (mut a, mut seen_a) = ready(&s, "iso-pty2", Some(&key_a)).await;
    type_in(
        &mut a,
        "echo secret-a > a.txt; sleep 777 & sleep 0.2; grep -la 'sleep.7\\{3\\}' /proc/[0-9]*/cmdline 2>/dev/null | wc -l; echo started-$((1+1))\n",
    )
    .await;
    read_until(&mut a, &mut seen_a, |s| s.text().contains("started-2")).await;
    assert!(
        seen_a.text().contains("\r\n1\r\n"),
        "the probe finds A's process in A: {}",
        seen_a.text()
    );

    let (mut b, mut seen_b) = ready(&s, "iso-pty2", Some(&key_b)).await;
    type_in(
        &mut b,
        "ls /workspace; cat /workspace/a.txt; grep -la 'sleep.7\\{3\\}' /proc/[0-9]*/cmdline 2>/dev/null | wc -l; echo b-$((2+2))\n",
    )
    .await;
    read_until(&mut b, &mut seen_b, |s| s.text().contains("b-4")).await;
    let text = seen_b.text();
    assert!(!text.contains("secret-a"), "B read A's file: {text}");
    assert!(text.contains("No such file"), "{text}");
    assert!(text.contains("\r\n0\r\n"), "B saw A's process: {text}");

    // Up to 8 terminals in A's conversation (one open already); the 9th is refused.
    let mut more = Vec::new();
    for _ in 0..7 {
        more.push(ready(&s, "iso-pty2", Some(&key_a)).await.0);
    }
    let started = Instant::now();
    assert_eq!(
        open(&s, "iso-pty2", "", Some(&key_a)).await.err(),
        Some(429)
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    // The others still work, B's too.
    type_in(&mut a, "echo still-$((3*3))\n").await;
    read_until(&mut a, &mut seen_a, |s| s.text().contains("still-9")).await;
    type_in(&mut b, "echo b-still-$((3*3))\n").await;
    read_until(&mut b, &mut seen_b, |s| s.text().contains("b-still-9")).await;
    // One closes: its place is free again.
    drop(more.pop());
    let reopened = super::until(10, || async {
        open(&s, "iso-pty2", "", Some(&key_a)).await.is_ok()
    })
    .await;
    assert!(reopened);
}
