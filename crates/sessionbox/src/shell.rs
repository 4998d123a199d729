//! `sessionbox shell`: an interactive terminal in a conversation's sandbox.
//!
//! The conversation is opened for [`Operation::Terminal`] (created when absent; beside a
//! running command) only to learn where its agent is, then released: the terminal holds no
//! turn. The agent gets a terminal session (`POST /pty`) and this process speaks its
//! WebSocket (upstream execd's frames, [`sessionbox_execd::pty`]) over an
//! [`AgentLink`]: the local terminal in raw mode (restored on every way out, a panic
//! included), its size sent first and at every `SIGWINCH`, every key byte (Ctrl-C, Ctrl-D
//! included) passed to the sandbox's terminal, every output byte written unchanged. The exit
//! status is the shell's. The agent's session is deleted at the end, which kills whatever the
//! shell left running. On the `host` runtime the agent is one the runtime starts on the
//! workspace (it stops itself a minute after its last use).

use std::io::Write;
use std::os::fd::AsFd;
use std::process::ExitCode;

use anyhow::Context;
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use sessionbox_core::{ConversationRef, Error, Operation, Session};
use sessionbox_execd::AgentLink;
use sessionbox_execd::pty::{self, ClientFrame, CreatePtyRequest, ServerFrame, channel};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::app::App;

/// Most bytes read from the local terminal in one go.
const INPUT_CHUNK: usize = 16 * 1024;

/// Runs the terminal; the exit status is the shell's (255 past 255).
pub(crate) async fn run(
    app: &App,
    conv: &ConversationRef,
    cwd: Option<String>,
) -> anyhow::Result<ExitCode> {
    let cwd = match cwd {
        Some(c) => Some(app.manager.check_path(conv, &c)?.as_relative().to_owned()),
        None => None,
    };
    let held = app
        .manager
        .open_for(conv, Operation::Terminal.open_mode())
        .await?;
    // The turn goes back at once; the handle stays open, as the agent's endpoint may be a
    // path through a descriptor it holds (the isolated runtime's run directory).
    let (handle, lock) = held.into_parts();
    drop(lock);
    // Every runtime with an agent gives it here (the host runtime starts one on the
    // workspace).
    let access = handle.agent().await?;
    let result = on_agent(app, access, cwd).await;
    let closed = Box::new(handle).close().await;
    let code = result?;
    closed?;
    Ok(code)
}

async fn on_agent(
    app: &App,
    access: Option<sessionbox_core::AgentAccess>,
    cwd: Option<String>,
) -> anyhow::Result<ExitCode> {
    let Some(access) = access else {
        let runtime = app.manager.runtime().info().name;
        return Err(sessionbox_core::no_agent(&runtime, "terminals").into());
    };
    let link = AgentLink::new(access).map_err(Error::from)?;
    let session = link
        .create_terminal(&CreatePtyRequest { cwd, command: None })
        .await
        .map_err(Error::from)?;
    let result = converse(&link, &session).await;
    if let Err(e) = link.delete_terminal(&session).await
        && e.status() != Some(404)
    {
        tracing::debug!(error = %e, "could not delete the terminal's session");
    }
    let code = result?;
    Ok(ExitCode::from(
        u8::try_from(code.clamp(0, 255)).unwrap_or(255),
    ))
}

/// Opens the WebSocket of agent session `session` over `link`.
async fn open_socket(
    link: &AgentLink,
    session: &str,
) -> anyhow::Result<WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>> {
    let request = http::Request::get(pty::socket_path(session))
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "websocket")
        .header(http::header::SEC_WEBSOCKET_VERSION, "13")
        .header(
            http::header::SEC_WEBSOCKET_KEY,
            tokio_tungstenite::tungstenite::handshake::client::generate_key(),
        )
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let mut response = link.send(request).await.map_err(Error::from)?;
    if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        return Err(Error::Backend(format!(
            "the sandbox's agent refused the terminal's WebSocket (HTTP {})",
            response.status()
        ))
        .into());
    }
    let upgraded = hyper::upgrade::on(&mut response)
        .await
        .context("the terminal's WebSocket upgrade failed")?;
    Ok(WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await)
}

/// The terminal's life; the shell's exit code.
async fn converse(link: &AgentLink, session: &str) -> anyhow::Result<i32> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut ws = open_socket(link, session).await?;
    let stdin = std::io::stdin();
    let _raw = RawMode::enter(stdin.as_fd());
    let mut winch = signal(SignalKind::window_change()).ok();
    let mut hangup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    if let Some((cols, rows)) = window_size() {
        send_control(&mut ws, &ClientFrame::resize(cols, rows)).await?;
    }
    // A thread of its own, not the runtime's blocking pool: a read of the terminal cannot be
    // cancelled, and the process must be able to exit while one waits.
    let (tx, mut input) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut buf = vec![0u8; INPUT_CHUNK];
        let mut stdin = std::io::stdin().lock();
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut stdout = std::io::stdout();
    let mut input_open = true;
    loop {
        tokio::select! {
            msg = ws.next() => {
                let Some(msg) = msg else {
                    return Err(Error::Backend("the terminal's connection ended before its shell".into()).into());
                };
                match msg.context("the terminal's connection failed")? {
                    Message::Binary(b) => {
                        if let Some((channel::STDOUT | channel::STDERR | channel::REPLAY, _, data)) = pty::parse_server_binary(&b) {
                            stdout.write_all(data)?;
                            stdout.flush()?;
                        }
                    }
                    Message::Text(t) => {
                        let Ok(f) = serde_json::from_str::<ServerFrame>(t.as_str()) else { continue };
                        match f.kind.as_str() {
                            "exit" => return Ok(f.exit_code.unwrap_or(-1)),
                            "error" => {
                                return Err(Error::Backend(format!(
                                    "the terminal failed: {}",
                                    f.error.unwrap_or_default()
                                ))
                                .into());
                            }
                            _ => {}
                        }
                    }
                    Message::Close(_) => {
                        return Err(Error::Backend("the terminal's connection closed before its shell ended".into()).into());
                    }
                    _ => {}
                }
            }
            bytes = input.recv(), if input_open => {
                match bytes {
                    Some(b) => {
                        ws.send(Message::Binary(pty::binary_frame(channel::STDIN, &b).into())).await?;
                    }
                    // The local input ended (not a terminal, at its end): the shell reads EOF.
                    None => {
                        input_open = false;
                        ws.send(Message::Binary(pty::binary_frame(channel::STDIN, b"\x04").into())).await?;
                    }
                }
            }
            Some(()) = async { match winch.as_mut() { Some(w) => w.recv().await, None => std::future::pending().await } } => {
                if let Some((cols, rows)) = window_size() {
                    send_control(&mut ws, &ClientFrame::resize(cols, rows)).await?;
                }
            }
            _ = hangup.recv() => return Ok(128 + 1),
            _ = term.recv() => return Ok(128 + 15),
        }
    }
}

async fn send_control(
    ws: &mut WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>,
    f: &ClientFrame,
) -> anyhow::Result<()> {
    ws.send(Message::Text(serde_json::to_string(f)?.into()))
        .await?;
    Ok(())
}

/// The local terminal's size (stdout's, else stdin's), when there is one.
fn window_size() -> Option<(u16, u16)> {
    let w = rustix::termios::tcgetwinsize(std::io::stdout())
        .or_else(|_| rustix::termios::tcgetwinsize(std::io::stdin()))
        .ok()?;
    (w.ws_col > 0 && w.ws_row > 0).then_some((w.ws_col, w.ws_row))
}

/// The local terminal in raw mode while this lives; its settings restored on drop (also on
/// a panic's unwinding). Nothing when stdin is not a terminal.
struct RawMode {
    saved: Option<rustix::termios::Termios>,
}

impl RawMode {
    fn enter(fd: std::os::fd::BorrowedFd<'_>) -> RawMode {
        let Ok(saved) = rustix::termios::tcgetattr(fd) else {
            return RawMode { saved: None };
        };
        let mut raw = saved.clone();
        raw.make_raw();
        if rustix::termios::tcsetattr(fd, rustix::termios::OptionalActions::Flush, &raw).is_err() {
            return RawMode { saved: None };
        }
        RawMode { saved: Some(saved) }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = rustix::termios::tcsetattr(
                std::io::stdin(),
                rustix::termios::OptionalActions::Now,
                saved,
            );
        }
    }
}
