//! [`AgentLink`]: one HTTP/1 connection to an agent per request, for what a front end relays
//! unchanged (a terminal's WebSocket, a preview, a watch's event stream), upgrades included.
//!
//! [`ExecdClient`](super::ExecdClient) parses what it asks for; a relay does not, so it needs
//! the raw response, and the connection after a `101 Switching Protocols`. Only plain
//! `http://` endpoints and Unix sockets are linked: an `https://` agent endpoint is refused with
//! [`ExecdError::InvalidEndpoint`].

use std::time::Duration;

use http::{HeaderValue, Request, Response, Uri, header};
use hyper::body::{Body, Incoming};
use hyper_util::rt::TokioIo;
use sessionbox_core::{AgentAccess, AgentEndpoint};

use crate::error::ExecdError;
use crate::wire;

/// How long connecting to the agent may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a link connects, parsed once.
#[derive(Debug, Clone)]
enum Target {
    /// A socket path, and the directory the link holds open when the path goes through a
    /// descriptor of this process (`/proc/self/fd/N/...`, the isolated runtime's run
    /// directory): the path is rewritten to the link's own descriptor, so it stays the same
    /// directory however long the link lives, even after the handle that gave it closed
    /// (a later descriptor `N` could be another conversation's).
    Unix {
        /// The socket.
        path: std::path::PathBuf,
        /// The directory held open, for a pinned path.
        _held: Option<std::sync::Arc<std::fs::File>>,
    },
    Tcp {
        /// `HOST:PORT`, for the connection and the `Host` header.
        authority: String,
    },
}

/// A relay's way to the agent of one conversation: its endpoint, path prefix and token.
///
/// Each [`AgentLink::send`] opens a connection of its own, so a long-lived upgrade never
/// holds up another request. `Debug` never prints the token.
#[derive(Debug, Clone)]
pub struct AgentLink {
    target: Target,
    /// The endpoint's path prefix (the OpenSandbox server's proxy path), without a trailing
    /// `/`; empty for none.
    prefix: String,
    access: AgentAccess,
}

impl AgentLink {
    /// A link to the agent `access` names.
    ///
    /// # Errors
    /// [`ExecdError::InvalidEndpoint`] for an endpoint that is not a Unix socket or an
    /// `http://HOST:PORT[/PREFIX]` URL.
    pub fn new(access: AgentAccess) -> Result<Self, ExecdError> {
        let (target, prefix) = match &access.endpoint {
            AgentEndpoint::Unix(path) => (pin(path)?, String::new()),
            AgentEndpoint::Http(url) => {
                let invalid = || ExecdError::InvalidEndpoint(url.clone());
                let uri: Uri = url.parse().map_err(|_| invalid())?;
                if uri.scheme_str() != Some("http") {
                    return Err(invalid());
                }
                let authority = uri.authority().ok_or_else(invalid)?;
                let authority = match authority.port_u16() {
                    Some(_) => authority.as_str().to_owned(),
                    None => format!("{}:80", authority.host()),
                };
                let prefix = uri.path().trim_end_matches('/').to_owned();
                (Target::Tcp { authority }, prefix)
            }
        };
        Ok(AgentLink {
            target,
            prefix,
            access,
        })
    }

    /// Sends `request` to the agent. Its URI is the agent's path and query (such as
    /// `/proxy/8000/index.html?x=1`); the link adds its prefix, `Host` and the access token
    /// (replacing any the caller set). The caller keeps hop-by-hop headers right (see
    /// [`crate::hop`]); an upgrade answered `101` is available with `hyper::upgrade::on` on
    /// the response.
    ///
    /// # Errors
    /// [`ExecdError::Connect`] when the agent cannot be reached or breaks the exchange,
    /// [`ExecdError::Timeout`] when connecting takes longer than 10 s,
    /// [`ExecdError::InvalidRequest`] for a URI that is not a path.
    pub async fn send<B>(&self, mut request: Request<B>) -> Result<Response<Incoming>, ExecdError>
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let path = request
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .filter(|p| p.starts_with('/'))
            .ok_or_else(|| ExecdError::InvalidRequest("a relayed request needs a path".into()))?;
        *request.uri_mut() = format!("{}{path}", self.prefix)
            .parse()
            .map_err(|_| ExecdError::InvalidRequest("the relayed path is not valid".into()))?;
        *request.version_mut() = http::Version::HTTP_11;
        let headers = request.headers_mut();
        headers.remove(wire::ACCESS_TOKEN_HEADER);
        if let Some(token) = self.access.token() {
            let mut value = HeaderValue::from_str(token).map_err(|_| {
                ExecdError::InvalidRequest("the agent token is not a header value".into())
            })?;
            value.set_sensitive(true);
            headers.insert(wire::ACCESS_TOKEN_HEADER, value);
        }
        let host = match &self.target {
            Target::Unix { .. } => "localhost",
            Target::Tcp { authority } => authority.as_str(),
        };
        headers.insert(
            header::HOST,
            HeaderValue::from_str(host)
                .map_err(|_| ExecdError::InvalidEndpoint(host.to_owned()))?,
        );

        let endpoint = self.endpoint_text();
        let connect_error = |e: &dyn std::fmt::Display| ExecdError::Connect {
            endpoint: endpoint.clone(),
            reason: e.to_string(),
        };
        let connecting = async {
            match &self.target {
                Target::Unix { path, .. } => tokio::net::UnixStream::connect(path)
                    .await
                    .map(|s| Box::new(s) as Box<dyn Stream>),
                Target::Tcp { authority } => {
                    let s = tokio::net::TcpStream::connect(authority.as_str()).await?;
                    let _ = s.set_nodelay(true);
                    Ok(Box::new(s) as Box<dyn Stream>)
                }
            }
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| ExecdError::Timeout {
                operation: "relay connect",
                after: CONNECT_TIMEOUT,
            })?
            .map_err(|e| connect_error(&e))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| connect_error(&e))?;
        // The connection's end, with an error or not, reaches the caller through the response
        // body or the upgrade.
        tokio::spawn(async move {
            let _ = connection.with_upgrades().await;
        });
        sender
            .send_request(request)
            .await
            .map_err(|e| connect_error(&e))
    }

    /// `POST /pty`: a new terminal session in the agent (its shell starts when its WebSocket
    /// opens, at [`crate::pty::socket_path`]); its id.
    ///
    /// # Errors
    /// As [`AgentLink::send`]; [`ExecdError::Status`] for the agent's refusal (400 for a
    /// working directory outside the workspace, 429 past the agent's limit of terminals);
    /// [`ExecdError::Protocol`] for an answer without an id.
    pub async fn create_terminal(
        &self,
        request: &crate::pty::CreatePtyRequest,
    ) -> Result<String, ExecdError> {
        const OP: &str = "create terminal";
        let body =
            serde_json::to_vec(request).map_err(|e| ExecdError::InvalidRequest(e.to_string()))?;
        let req = Request::post(crate::pty::PTY)
            .header(header::CONTENT_TYPE, "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .map_err(|e| ExecdError::InvalidRequest(e.to_string()))?;
        let (status, body) = self.exchange(OP, req).await?;
        if !status.is_success() {
            return Err(status_error(OP, status, &body));
        }
        let created: crate::pty::CreatePtyResponse =
            serde_json::from_slice(&body).map_err(|e| ExecdError::Protocol {
                operation: OP,
                reason: e.to_string(),
            })?;
        Ok(created.session_id)
    }

    /// `DELETE /pty/{id}`: ends the terminal's shell and everything it started.
    ///
    /// # Errors
    /// As [`AgentLink::send`]; [`ExecdError::Status`] (404) for an unknown session.
    pub async fn delete_terminal(&self, id: &str) -> Result<(), ExecdError> {
        const OP: &str = "delete terminal";
        let req = Request::delete(crate::pty::session_path(id))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| ExecdError::InvalidRequest(e.to_string()))?;
        let (status, body) = self.exchange(OP, req).await?;
        if !status.is_success() {
            return Err(status_error(OP, status, &body));
        }
        Ok(())
    }

    /// Sends `request` and reads the whole answer (bounded: 1 MiB).
    async fn exchange<B>(
        &self,
        op: &'static str,
        request: Request<B>,
    ) -> Result<(http::StatusCode, bytes::Bytes), ExecdError>
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        use http_body_util::BodyExt;
        let response = self.send(request).await?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), 1 << 20)
            .collect()
            .await
            .map_err(|e| ExecdError::Transport {
                operation: op,
                reason: e.to_string(),
            })?
            .to_bytes();
        Ok((status, body))
    }

    /// The endpoint as an error names it (never the token).
    fn endpoint_text(&self) -> String {
        match &self.access.endpoint {
            AgentEndpoint::Unix(p) => p.display().to_string(),
            AgentEndpoint::Http(u) => u.clone(),
        }
    }
}

/// The target of a Unix socket `path`; one under `/proc/self/fd/N/` is pinned (see
/// [`Target::Unix`]).
fn pin(path: &std::path::Path) -> Result<Target, ExecdError> {
    use std::os::fd::AsRawFd;
    let Ok(rest) = path.strip_prefix("/proc/self/fd") else {
        return Ok(Target::Unix {
            path: path.to_path_buf(),
            _held: None,
        });
    };
    let mut parts = rest.components();
    let (Some(fd), tail) = (parts.next(), parts.as_path()) else {
        return Ok(Target::Unix {
            path: path.to_path_buf(),
            _held: None,
        });
    };
    let dir = std::path::Path::new("/proc/self/fd").join(fd);
    let held = std::fs::File::open(&dir).map_err(|e| ExecdError::Connect {
        endpoint: path.display().to_string(),
        reason: format!("the agent's directory is gone: {e}"),
    })?;
    let pinned = std::path::Path::new("/proc/self/fd")
        .join(held.as_raw_fd().to_string())
        .join(tail);
    Ok(Target::Unix {
        path: pinned,
        _held: Some(std::sync::Arc::new(held)),
    })
}

/// An error answer as [`ExecdError::Status`], with the body's `ErrorResponse` when it has one.
fn status_error(op: &'static str, status: http::StatusCode, body: &[u8]) -> ExecdError {
    let (code, message) = match serde_json::from_slice::<crate::types::ErrorResponse>(body) {
        Ok(e) if !e.message.is_empty() => (e.code, e.message),
        Ok(e) => (e.code, e.error),
        Err(_) => (
            String::new(),
            String::from_utf8_lossy(body).trim().to_owned(),
        ),
    };
    ExecdError::Status {
        operation: op,
        status: status.as_u16(),
        code,
        message,
    }
}

/// What a link's connection is: a Unix or a TCP stream.
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Stream for T {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_and_unix_endpoints_are_linked() {
        let http = |u: &str| AgentLink::new(AgentAccess::new(AgentEndpoint::Http(u.into()), None));
        let l = http("http://127.0.0.1:9000/sandboxes/x/proxy/44772/").unwrap();
        assert_eq!(l.prefix, "/sandboxes/x/proxy/44772");
        assert!(matches!(l.target, Target::Tcp { ref authority } if authority == "127.0.0.1:9000"));
        let l = http("http://agent.local").unwrap();
        assert!(matches!(l.target, Target::Tcp { ref authority } if authority == "agent.local:80"));
        assert!(matches!(
            http("https://h:1"),
            Err(ExecdError::InvalidEndpoint(_))
        ));
        assert!(matches!(
            http("not a url"),
            Err(ExecdError::InvalidEndpoint(_))
        ));
        let u = AgentLink::new(AgentAccess::new(
            AgentEndpoint::Unix("/run/a.sock".into()),
            None,
        ));
        assert!(u.unwrap().prefix.is_empty());
    }

    #[test]
    fn a_socket_through_a_descriptor_stays_in_its_directory_after_the_descriptor_closes() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("marker"), "here").unwrap();
        let held = std::fs::File::open(dir.path()).unwrap();
        let path = format!("/proc/self/fd/{}/agent.sock", held.as_raw_fd());
        let link =
            AgentLink::new(AgentAccess::new(AgentEndpoint::Unix(path.into()), None)).unwrap();
        drop(held);
        // Another directory may take the old number now; the link's path does not move.
        let other = tempfile::tempdir().unwrap();
        let _reused = std::fs::File::open(other.path()).unwrap();
        let Target::Unix {
            path: pinned,
            _held: Some(_),
        } = &link.target
        else {
            panic!("not pinned: {:?}", link.target);
        };
        let marker = pinned.parent().unwrap().join("marker");
        assert_eq!(std::fs::read_to_string(marker).unwrap(), "here");
    }
}
