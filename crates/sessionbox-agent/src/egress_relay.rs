//! The egress relay: inside a sandbox whose network namespace has only loopback, the agent
//! listens on a loopback TCP address and relays each connection, byte for byte, over a Unix
//! socket to the conversation's egress gateway outside. Commands get `HTTP_PROXY`,
//! `HTTPS_PROXY` and `ALL_PROXY` (both cases) pointing at it.
//!
//! The relay decides nothing: the gateway sees every byte and enforces the policy. The relay
//! only makes the gateway reachable from a namespace that has no route anywhere else.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Where the relay listens and where it relays to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRelay {
    /// The loopback address commands use as their proxy.
    pub listen: SocketAddr,
    /// The gateway's Unix socket (bound by the runtime, visible read-only in the sandbox).
    pub socket: PathBuf,
}

impl EgressRelay {
    /// The proxy variables every command gets (a request's own variables may override them;
    /// that gives no way out: the sandbox has no other route).
    pub fn proxy_env(&self) -> Vec<(String, String)> {
        let url = format!("http://{}", self.listen);
        let mut env = Vec::new();
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
            env.push((k.to_owned(), url.clone()));
            env.push((k.to_ascii_lowercase(), url.clone()));
        }
        for k in ["NO_PROXY", "no_proxy"] {
            env.push((k.to_owned(), "localhost,127.0.0.1,::1".to_owned()));
        }
        env
    }
}

/// Accepts on `listener` forever, relaying each connection to `socket`.
pub(crate) async fn run(listener: tokio::net::TcpListener, socket: PathBuf) {
    loop {
        let (mut client, _) = match listener.accept().await {
            Ok(c) => c,
            // Out of descriptors (EMFILE) and the like: they clear only when connections
            // close, so wait instead of spinning on the error.
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = client.set_nodelay(true);
        let socket = socket.clone();
        tokio::spawn(async move {
            match tokio::net::UnixStream::connect(&socket).await {
                Ok(mut gw) => {
                    // Large buffers: a bulk download costs few system calls per MiB.
                    let _ = tokio::io::copy_bidirectional_with_sizes(
                        &mut client,
                        &mut gw,
                        256 * 1024,
                        256 * 1024,
                    )
                    .await;
                }
                Err(e) => {
                    tracing::warn!("the egress gateway is unreachable: {e}");
                    refuse(client).await;
                }
            }
        });
    }
}

/// What a client of the relay reads when the gateway cannot be reached (it ended; the runtime
/// starts it again before the conversation's next command): a proxy's `502`, saying so,
/// rather than a connection closed without a word. Nothing is relayed anywhere.
const UNREACHABLE: &str = "sessionbox egress: the conversation's egress gateway is not running, \
     so no connection leaves the sandbox; it is started again before the conversation's next \
     command\n";

/// Answers `client` with [`UNREACHABLE`] after reading (and dropping) the start of its request,
/// so that closing does not reset the connection under the answer.
async fn refuse(mut client: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = [0u8; 8192];
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), client.read(&mut head)).await;
    let answer = format!(
        "HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{UNREACHABLE}",
        UNREACHABLE.len()
    );
    let _ = client.write_all(answer.as_bytes()).await;
    let _ = client.shutdown().await;
}
