//! `GET /v1/conversations/{id}/pty` through `sessionbox serve` on every runtime, with a real
//! WebSocket client (tokio-tungstenite): a terminal where the runtime has one (`isolated`,
//! `opensandbox`), a clear refusal where it has none (`host`, `aio`).

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use sessionbox_execd::pty::{self, ClientFrame, ServerFrame, channel};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::{Served, create_key};
use crate::exact;

type Ws = WebSocketStream<tokio::net::TcpStream>;

/// Opens conversation `id`'s terminal with `key`; the HTTP status and body when refused.
async fn open(base: &str, id: &str, key: &str) -> Result<Ws, (u16, String)> {
    let url = format!(
        "{}/v1/conversations/{id}/pty",
        base.replace("http://", "ws://")
    );
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    let stream = tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .unwrap();
    match tokio_tungstenite::client_async(req, stream).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            let body = r
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            Err((r.status().as_u16(), body))
        }
        Err(e) => panic!("websocket handshake: {e}"),
    }
}

#[derive(Default, Debug)]
struct Seen {
    output: Vec<u8>,
    frames: Vec<ServerFrame>,
    closed: bool,
}

impl Seen {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output).into_owned()
    }
}

async fn read_until(ws: &mut Ws, seen: &mut Seen, what: &str, until: impl Fn(&Seen) -> bool) {
    let end = Instant::now() + Duration::from_secs(60);
    while !until(seen) && !seen.closed {
        let left = end.saturating_duration_since(Instant::now());
        let msg = tokio::time::timeout(left, ws.next())
            .await
            .unwrap_or_else(|_| panic!("{what}: timed out; {:?} {:?}", seen.frames, seen.text()));
        match msg {
            None | Some(Err(_)) | Some(Ok(Message::Close(_))) => seen.closed = true,
            Some(Ok(Message::Binary(b))) => {
                let (ch, _, data) = pty::parse_server_binary(&b).unwrap();
                assert!(ch == channel::STDOUT || ch == channel::REPLAY, "{what}");
                seen.output.extend_from_slice(data);
            }
            Some(Ok(Message::Text(t))) => seen.frames.push(serde_json::from_str(&t).unwrap()),
            Some(Ok(_)) => {}
        }
    }
}

async fn type_in(ws: &mut Ws, text: &str) {
    ws.send(Message::Binary(
        pty::binary_frame(channel::STDIN, text.as_bytes()).into(),
    ))
    .await
    .unwrap();
}

/// Issue 21's terminal on every runtime, through `sessionbox serve`: on `isolated` and on a real
/// OpenSandbox server a shell in the conversation's workspace (what it writes the REST API
/// reads), with the window size, its change, Ctrl-C and the exit status; on `host` through the
/// agent its runtime starts; `aio` refuses with 503 `runtime_unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_over_rest_on_every_runtime() {
    for rt in exact::runtimes("pty") {
        let name = rt.name;
        let key = create_key(&rt.data, "default");
        let served = Served::start(&rt.data);
        let base = served.base.clone();
        if name == "aio" {
            let (st, body) = open(&base, "pty", &key).await.err().unwrap();
            assert_eq!(st, 503, "{name}: {body}");
            assert!(body.contains("runtime_unavailable"), "{name}: {body}");
            assert!(body.contains("gives no terminals"), "{name}: {body}");
            continue;
        }
        let started = Instant::now();
        let mut ws = open(&base, "pty", &key).await.unwrap();
        let mut seen = Seen::default();
        read_until(&mut ws, &mut seen, name, |s| {
            s.frames.first().is_some_and(|f| f.kind == "connected")
                // bash's `$ `, or busybox ash's `~ $ ` followed by its cursor query.
                && (s.text().contains("$ ") || s.text().contains("# "))
        })
        .await;
        let first_prompt = started.elapsed();
        type_in(
            &mut ws,
            "echo typed > typed.txt; stty size; echo $((6*7))-done\n",
        )
        .await;
        read_until(&mut ws, &mut seen, name, |s| s.text().contains("42-done")).await;
        assert!(seen.text().contains("24 80"), "{name}: {}", seen.text());
        let r = reqwest::Client::new()
            .get(format!("{base}/v1/conversations/pty/files/typed.txt"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.text().await.unwrap(), "typed\n", "{name}");

        ws.send(Message::Text(
            serde_json::to_string(&ClientFrame::resize(111, 33))
                .unwrap()
                .into(),
        ))
        .await
        .unwrap();
        type_in(&mut ws, "stty size; echo size-$((1+1))\n").await;
        read_until(&mut ws, &mut seen, name, |s| s.text().contains("size-2")).await;
        assert!(seen.text().contains("33 111"), "{name}: {}", seen.text());

        type_in(&mut ws, "sleep 30\n").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let interrupted = Instant::now();
        type_in(&mut ws, "\x03").await;
        type_in(&mut ws, "echo st=$?\n").await;
        read_until(&mut ws, &mut seen, name, |s| s.text().contains("st=130")).await;
        let ctrl_c = interrupted.elapsed();

        type_in(&mut ws, "exit 4\n").await;
        read_until(&mut ws, &mut seen, name, |_| false).await;
        let exit = seen.frames.iter().find(|f| f.kind == "exit");
        assert_eq!(exit.and_then(|f| f.exit_code), Some(4), "{name}: {seen:?}");
        eprintln!(
            "{name}: first prompt after {first_prompt:?} (conversation created), Ctrl-C answered \
             in {ctrl_c:?}"
        );
        drop(served);
        rt.destroy("pty");
    }
}

/// A WebSocket through a preview (issue 21): a program in the sandbox that serves one on a port
/// (here a second agent, whose terminal is a WebSocket) is reached at
/// `/v1/conversations/{id}/ports/{port}/...` with the upgrade tunnelled both ways: a command
/// typed in reaches the program and its output comes back. On `isolated`, the real OpenSandbox
/// server and `host`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_is_previewed_through_serve_on_every_runtime_with_an_agent() {
    for rt in exact::runtimes("preview-ws") {
        let name = rt.name;
        if name == "aio" {
            continue;
        }
        let key = create_key(&rt.data, "default");
        let served = Served::start(&rt.data);
        let base = format!("{}/v1/conversations/wsprev", served.base);
        let client = reqwest::Client::new();
        // The agent program as the conversation's commands see it.
        let program = match name {
            "isolated" => "/.sessionbox/sessionbox agent".to_owned(),
            "opensandbox" => "/opt/opensandbox/execd".to_owned(),
            _ => format!("{} agent", env!("CARGO_BIN_EXE_sessionbox")),
        };
        let port = if name == "host" {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        } else {
            9000
        };
        let r = client
            .post(format!("{base}/exec"))
            .bearer_auth(&key)
            .json(&serde_json::json!({
                "command": format!("exec {program} --listen tcp:127.0.0.1:{port} --root ."),
                "background": true
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202, "{name}");
        let started = Instant::now();
        let session = loop {
            let r = client
                .post(format!("{base}/ports/{port}/pty"))
                .bearer_auth(&key)
                .json(&serde_json::json!({}))
                .send()
                .await
                .unwrap();
            if r.status().is_success() {
                let v: serde_json::Value = r.json().await.unwrap();
                break v["session_id"].as_str().unwrap().to_owned();
            }
            if started.elapsed() > Duration::from_secs(30) {
                panic!(
                    "{name}: the program never listened: {} {}",
                    r.status(),
                    r.text().await.unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let url = format!(
            "{}/ports/{port}/pty/{session}/ws",
            base.replace("http://", "ws://")
        );
        let mut req = url.into_client_request().unwrap();
        req.headers_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
        let stream = tokio::net::TcpStream::connect(served.base.trim_start_matches("http://"))
            .await
            .unwrap();
        let (mut ws, response) = tokio_tungstenite::client_async(req, stream)
            .await
            .unwrap_or_else(|e| panic!("{name}: the upgrade through the preview: {e}"));
        assert_eq!(response.status(), 101, "{name}");
        let mut seen = Seen::default();
        read_until(&mut ws, &mut seen, name, |s| {
            s.frames.first().is_some_and(|f| f.kind == "connected")
        })
        .await;
        type_in(&mut ws, "echo through-$((40+2))\n").await;
        read_until(&mut ws, &mut seen, name, |s| {
            s.text().contains("through-42")
        })
        .await;
        type_in(&mut ws, "exit 6\n").await;
        read_until(&mut ws, &mut seen, name, |_| false).await;
        let exit = seen.frames.iter().find(|f| f.kind == "exit");
        assert_eq!(exit.and_then(|f| f.exit_code), Some(6), "{name}: {seen:?}");
        drop(served);
        rt.destroy("wsprev");
    }
}

/// The attack (from a review of the relays): upgraded connections left the connection cap,
/// since hyper's connection ends at the upgrade, so WebSockets could be opened past
/// `--max-connections-per-source` without bound. Now a terminal's tunnel keeps its connection's
/// place until it closes: with a cap of 4 per source, 4 open terminals leave no room for a
/// fifth connection from that source, and closing them gives the places back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_terminals_stay_counted_in_the_connection_cap() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("sessionbox.toml"),
        "runtime = \"isolated\"\n[isolated]\nidle_timeout_secs = 30\n",
    )
    .unwrap();
    let key = create_key(&data, "default");
    let served = Served::start_with(&data, &[("SESSIONBOX_MAX_CONNECTIONS_PER_SOURCE", "4")]);
    let mut open_ones = Vec::new();
    for i in 0..4 {
        let ws = open(&served.base, "capped", &key)
            .await
            .unwrap_or_else(|e| panic!("terminal {i}: {e:?}"));
        open_ones.push(ws);
    }
    // A fifth connection from the same source is closed as soon as it is accepted.
    let refused = reqwest::Client::new()
        .get(format!("{}/healthz", served.base))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(
        refused.is_err(),
        "a fifth connection was served: {refused:?}"
    );
    for mut ws in open_ones {
        let _ = ws.close(None).await;
    }
    // The places come back once the tunnels close.
    let started = Instant::now();
    loop {
        let r = reqwest::Client::new()
            .get(format!("{}/healthz", served.base))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if r.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the closed terminals kept their places"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = reqwest::Client::new()
        .delete(format!("{}/v1/conversations/capped", served.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    served.stop();
}
