//! `/pty`: upstream execd's terminal sessions and their WebSocket, through a real WebSocket
//! client (tokio-tungstenite) on the agent's socket.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestAgent, request};
use futures::{SinkExt, StreamExt};
use sessionbox_execd::pty::{self, ClientFrame, ServerFrame, channel};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

type Ws = WebSocketStream<tokio::net::UnixStream>;

/// `POST /pty` with `body`; the session id.
async fn create(agent: &TestAgent, body: &str) -> String {
    let r = agent
        .raw(&request(
            "POST",
            "/pty",
            &["Content-Type: application/json"],
            body.as_bytes(),
        ))
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    v["session_id"].as_str().unwrap().to_owned()
}

/// Opens the WebSocket at `path_and_query`; the HTTP status when the upgrade is refused.
async fn open(agent: &TestAgent, path_and_query: &str) -> Result<Ws, u16> {
    let stream = tokio::net::UnixStream::connect(&agent.socket)
        .await
        .unwrap();
    match tokio_tungstenite::client_async(format!("ws://agent{path_and_query}"), stream).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("websocket handshake: {e}"),
    }
}

/// What a client saw.
#[derive(Default, Debug)]
struct Seen {
    output: Vec<u8>,
    replay: Option<(u64, Vec<u8>)>,
    frames: Vec<ServerFrame>,
    close: Option<(u16, String)>,
}

impl Seen {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output).into_owned()
    }
    fn exit_code(&self) -> Option<i32> {
        self.frames
            .iter()
            .find(|f| f.kind == "exit")
            .and_then(|f| f.exit_code)
    }
}

/// Reads frames into `seen` until `until` holds or the socket closes (panics after 15 s).
async fn read_until(ws: &mut Ws, seen: &mut Seen, until: impl Fn(&Seen) -> bool) {
    let end = Instant::now() + Duration::from_secs(15);
    while !until(seen) {
        let left = end.saturating_duration_since(Instant::now());
        let msg = tokio::time::timeout(left, ws.next())
            .await
            .unwrap_or_else(|_| panic!("timed out; seen so far: {seen:?} / {:?}", seen.text()));
        match msg {
            None | Some(Err(_)) => return,
            Some(Ok(Message::Binary(b))) => match pty::parse_server_binary(&b).unwrap() {
                (channel::REPLAY, Some(off), data) => seen.replay = Some((off, data.to_vec())),
                (channel::STDOUT, None, data) => seen.output.extend_from_slice(data),
                other => panic!("unexpected binary frame {other:?}"),
            },
            Some(Ok(Message::Text(t))) => seen.frames.push(serde_json::from_str(&t).unwrap()),
            Some(Ok(Message::Close(c))) => {
                seen.close = c.map(|c| (u16::from(c.code), c.reason.to_string()));
                return;
            }
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

async fn control(ws: &mut Ws, f: &ClientFrame) {
    ws.send(Message::Text(serde_json::to_string(f).unwrap().into()))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_terminal_runs_a_shell_with_resize_ctrl_c_and_its_exit_status() {
    let agent = TestAgent::start().await;
    std::fs::create_dir(agent.root.join("sub")).unwrap();
    let id = create(&agent, r#"{"cwd":"sub"}"#).await;
    let mut ws = open(&agent, &pty::socket_path(&id)).await.unwrap();
    let mut seen = Seen::default();
    read_until(&mut ws, &mut seen, |s| !s.frames.is_empty()).await;
    assert_eq!(seen.frames[0], ServerFrame::connected(&id, "pty"));
    assert!(seen.replay.is_none(), "nothing to replay on a new session");

    // A terminal: a tty, the workspace's directory, the terminal's TERM, the window size.
    type_in(
        &mut ws,
        "tty -s && echo is-a-tty; pwd; echo $TERM $HOME; stty size; echo $((6*7))-done\n",
    )
    .await;
    read_until(&mut ws, &mut seen, |s| s.text().contains("42-done")).await;
    let text = seen.text();
    assert!(text.contains("is-a-tty"), "{text}");
    assert!(
        text.contains(&format!("{}/sub", agent.root.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("xterm-256color {}", agent.root.display())),
        "{text}"
    );
    assert!(text.contains("24 80"), "the initial size: {text}");

    // Resize reaches the terminal (and SIGWINCH its foreground job).
    control(&mut ws, &ClientFrame::resize(132, 43)).await;
    type_in(&mut ws, "stty size; echo size-$((1+1))-done\n").await;
    read_until(&mut ws, &mut seen, |s| s.text().contains("size-2-done")).await;
    assert!(seen.text().contains("43 132"), "{}", seen.text());

    // Ctrl-C (the byte, through the line discipline) interrupts the foreground job.
    let started = Instant::now();
    type_in(&mut ws, "sleep 30\n").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    type_in(&mut ws, "\x03").await;
    type_in(&mut ws, "echo status=$?\n").await;
    read_until(&mut ws, &mut seen, |s| s.text().contains("status=130")).await;
    assert!(started.elapsed() < Duration::from_secs(10));

    // A signal frame does the same.
    type_in(&mut ws, "sleep 30\n").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    control(&mut ws, &ClientFrame::signal("SIGINT")).await;
    type_in(&mut ws, "echo again=$?\n").await;
    read_until(&mut ws, &mut seen, |s| s.text().contains("again=130")).await;

    // ping → pong; an unknown frame type is an error frame, the socket stays.
    control(
        &mut ws,
        &ClientFrame {
            kind: "ping".into(),
            ..ClientFrame::default()
        },
    )
    .await;
    read_until(&mut ws, &mut seen, |s| {
        s.frames.iter().any(|f| f.kind == "pong")
    })
    .await;

    // The shell's exit status, then a normal close.
    type_in(&mut ws, "exit 7\n").await;
    read_until(&mut ws, &mut seen, |s| s.close.is_some()).await;
    assert_eq!(seen.exit_code(), Some(7), "{seen:?}");
    assert_eq!(seen.close.as_ref().unwrap().0, 1000);
    let status = agent
        .raw(&request("GET", &pty::session_path(&id), &[], b""))
        .await;
    let v: serde_json::Value = serde_json::from_slice(&status.body).unwrap();
    assert_eq!(v["running"], false);
    assert_eq!(
        v["output_offset"].as_u64().unwrap(),
        seen.output.len() as u64
    );
    agent.stop().await;
}

/// The OpenSandbox server's direct endpoint names the agent as `/proxy/44772/...`: a terminal's
/// WebSocket works that way too.
#[tokio::test]
async fn the_websocket_upgrades_through_the_agents_own_proxy_path() {
    let agent = TestAgent::start().await;
    let id = create(&agent, "").await;
    let mut ws = open(&agent, &format!("/proxy/44772{}", pty::socket_path(&id)))
        .await
        .unwrap();
    let mut seen = Seen::default();
    read_until(&mut ws, &mut seen, |s| !s.frames.is_empty()).await;
    type_in(&mut ws, "echo via-$((40+2))\n").await;
    read_until(&mut ws, &mut seen, |s| s.text().contains("via-42")).await;
    agent.stop().await;
}

#[tokio::test]
async fn ctrl_d_ends_the_shell() {
    let agent = TestAgent::start().await;
    let id = create(&agent, "").await;
    let mut ws = open(&agent, &pty::socket_path(&id)).await.unwrap();
    let mut seen = Seen::default();
    // At the prompt (the shell reads its terminal then).
    read_until(&mut ws, &mut seen, |s| {
        s.text().ends_with("# ") || s.text().ends_with("$ ")
    })
    .await;
    type_in(&mut ws, "\x04").await;
    read_until(&mut ws, &mut seen, |s| s.close.is_some()).await;
    assert_eq!(seen.exit_code(), Some(0), "{seen:?}");
    agent.stop().await;
}

#[tokio::test]
async fn one_client_at_a_time_takeover_and_replay_from_an_offset() {
    let agent = TestAgent::start().await;
    let id = create(&agent, "").await;
    let path = pty::socket_path(&id);
    let mut first = open(&agent, &path).await.unwrap();
    let mut seen1 = Seen::default();
    read_until(&mut first, &mut seen1, |s| !s.frames.is_empty()).await;
    type_in(&mut first, "echo one-$((1+1))\n").await;
    read_until(&mut first, &mut seen1, |s| s.text().contains("one-2")).await;

    // A second client is refused before the upgrade.
    assert_eq!(open(&agent, &path).await.err(), Some(409));

    // Takeover: the holder is closed with 4001, the new one replays everything and attaches
    // to the same shell.
    let mut second = open(&agent, &format!("{path}?takeover=1")).await.unwrap();
    read_until(&mut first, &mut seen1, |s| s.close.is_some()).await;
    assert_eq!(
        seen1.close,
        Some((pty::CLOSE_TAKEN_OVER, pty::code::TAKEN_OVER.to_owned()))
    );
    let mut seen2 = Seen::default();
    read_until(&mut second, &mut seen2, |s| !s.frames.is_empty()).await;
    let (off, data) = seen2.replay.clone().expect("a replay frame");
    assert_eq!(off, 0);
    assert!(String::from_utf8_lossy(&data).contains("one-2"));
    type_in(&mut second, "echo $$-two\n").await;
    read_until(&mut second, &mut seen2, |s| {
        s.text().contains("-two\r\n\u{1b}")
    })
    .await;

    // The client goes; the shell stays; `since` replays only what came after.
    let offset_before = data.len() as u64;
    drop(second);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = open(&agent, &format!("{path}?since={offset_before}"))
        .await
        .unwrap();
    let mut seen3 = Seen::default();
    read_until(&mut third, &mut seen3, |s| !s.frames.is_empty()).await;
    let (off, data) = seen3.replay.clone().expect("a replay frame");
    assert_eq!(off, offset_before);
    let replayed = String::from_utf8_lossy(&data);
    assert!(
        replayed.contains("-two") && !replayed.contains("one-2"),
        "{replayed}"
    );

    // DELETE ends the shell: the client gets the exit frame; the session is gone.
    let r = agent
        .raw(&request("DELETE", &pty::session_path(&id), &[], b""))
        .await;
    assert_eq!(r.status, 200);
    read_until(&mut third, &mut seen3, |s| s.close.is_some()).await;
    assert_eq!(seen3.exit_code(), Some(128 + 9));
    assert_eq!(open(&agent, &path).await.err(), Some(404));
    agent.stop().await;
}

/// Attack: open terminals until the sandbox runs out of them. The agent refuses the one past
/// its limit with 429 before any shell starts, and a closed one frees its place.
#[tokio::test]
async fn the_terminal_past_the_limit_is_refused() {
    let agent = TestAgent::start_with(|c| c.max_terminals = 3).await;
    let mut ids = Vec::new();
    let mut sockets = Vec::new();
    for _ in 0..3 {
        let id = create(&agent, "").await;
        let mut ws = open(&agent, &pty::socket_path(&id)).await.unwrap();
        read_until(&mut ws, &mut Seen::default(), |s| !s.frames.is_empty()).await;
        sockets.push(ws);
        ids.push(id);
    }
    let r = agent.raw(&request("POST", "/pty", &[], b"{}")).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.text().contains("3 terminals"), "{}", r.text());
    // Every shell still answers.
    for ws in &mut sockets {
        type_in(ws, "echo alive-$((2*3))\n").await;
        read_until(ws, &mut Seen::default(), |s| s.text().contains("alive-6")).await;
    }
    // One shell exits: its place is free.
    type_in(&mut sockets[0], "exit\n").await;
    read_until(&mut sockets[0], &mut Seen::default(), |s| s.close.is_some()).await;
    create(&agent, "").await;
    agent.stop().await;
}

/// Attack: leave processes behind a terminal, in other process groups (jobs) than the shell's.
/// Every one of them dies with the terminal.
#[tokio::test]
async fn nothing_the_shell_started_outlives_it() {
    let agent = TestAgent::start().await;
    let id = create(&agent, "").await;
    let mut ws = open(&agent, &pty::socket_path(&id)).await.unwrap();
    let mut seen = Seen::default();
    read_until(&mut ws, &mut seen, |s| !s.frames.is_empty()).await;
    type_in(
        &mut ws,
        "set -m; sleep 600 & echo $! > pids; (sleep 600 &) ; nohup sleep 600 >/dev/null 2>&1 & echo $! >> pids; echo started\n",
    )
    .await;
    read_until(&mut ws, &mut seen, |s| s.text().contains("started\r\n")).await;
    let pids = common::read_pids(&agent.root.join("pids"), 2).await;
    assert!(pids.iter().all(|p| common::alive(*p)));
    type_in(&mut ws, "exit\n").await;
    read_until(&mut ws, &mut seen, |s| s.close.is_some()).await;
    assert!(
        common::eventually(Duration::from_secs(5), || pids
            .iter()
            .all(|p| !common::alive(*p)))
        .await,
        "the shell's jobs outlived it"
    );
    agent.stop().await;
}

#[tokio::test]
async fn an_attached_terminal_keeps_the_agent_up_and_a_detached_one_does_not() {
    let agent = TestAgent::start_with(|c| c.idle_timeout = Some(Duration::from_millis(500))).await;
    let id = create(&agent, "").await;
    let mut ws = open(&agent, &pty::socket_path(&id)).await.unwrap();
    let mut seen = Seen::default();
    read_until(&mut ws, &mut seen, |s| !s.frames.is_empty()).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    type_in(&mut ws, "echo still-$((3*3))\n").await;
    read_until(&mut ws, &mut seen, |s| s.text().contains("still-9")).await;
    // Detached, the shell no longer keeps the agent up: it idles out (and removes its socket).
    drop(ws);
    assert!(
        common::eventually(Duration::from_secs(5), || !agent.socket.exists()).await,
        "a detached terminal kept the agent from idling out"
    );
    agent.stop().await;
}

#[tokio::test]
async fn bad_requests_change_nothing() {
    let agent = TestAgent::start().await;
    let r = agent
        .raw(&request("POST", "/pty", &[], br#"{"cwd":"../outside"}"#))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = agent.raw(&request("POST", "/pty", &[], b"{not json")).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(open(&agent, "/pty/nope/ws").await.err(), Some(404));
    let r = agent.raw(&request("DELETE", "/pty/nope", &[], b"")).await;
    assert_eq!(r.status, 404);
    let id = create(&agent, "").await;
    assert_eq!(
        open(&agent, &format!("{}?pty=0", pty::socket_path(&id)))
            .await
            .err(),
        Some(501)
    );
    agent.stop().await;
}
