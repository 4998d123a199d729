//! [`AgentLink::watch`]: a watch's events read from the agent (see [`crate::watch_ext`]).

use std::pin::Pin;

use http::{Method, Request, StatusCode};
use hyper::body::{Body, Incoming};
use sessionbox_core::WatchEvent;

use super::AgentLink;
use crate::error::ExecdError;
use crate::types::ErrorResponse;
use crate::watch_ext::{WatchParser, watch_target};

/// Most bytes of an error answer read.
const MAX_ERROR_BYTES: usize = 64 * 1024;

/// The events of one watch, in order, as the agent sends them.
#[derive(Debug)]
pub struct WatchStream {
    body: Incoming,
    parser: WatchParser,
    ready: std::collections::VecDeque<WatchEvent>,
}

impl AgentLink {
    /// `GET /sessionbox/v1/watch?path=DIR`: starts watching `dir` (a workspace path) on a
    /// connection of its own. The first event is `ready`.
    ///
    /// # Errors
    /// The agent's refusal as [`ExecdError::Status`] (its typed error through `From`: `busy`
    /// past the agent's watch limit, `not_found`, `outside_workspace`, `conflict`), or the
    /// link's.
    pub async fn watch(&self, dir: &str) -> Result<WatchStream, ExecdError> {
        const OP: &str = "watch";
        let request = Request::builder()
            .method(Method::GET)
            .uri(watch_target(dir))
            .body(http_body_empty())
            .map_err(|e| {
                ExecdError::InvalidRequest(format!("cannot build a watch request: {e}"))
            })?;
        let response = self.send(request).await?;
        let status = response.status();
        let mut body = response.into_body();
        if status != StatusCode::OK {
            let mut bytes = Vec::new();
            while let Some(chunk) = next_data(&mut body).await? {
                bytes.extend_from_slice(&chunk);
                if bytes.len() > MAX_ERROR_BYTES {
                    break;
                }
            }
            let (code, message) = match serde_json::from_slice::<ErrorResponse>(&bytes) {
                Ok(e) => (e.code, e.message),
                Err(_) => (String::new(), String::from_utf8_lossy(&bytes).into_owned()),
            };
            return Err(ExecdError::Status {
                operation: OP,
                status: status.as_u16(),
                code,
                message,
            });
        }
        Ok(WatchStream {
            body,
            parser: WatchParser::default(),
            ready: Default::default(),
        })
    }
}

impl WatchStream {
    /// The next event; `None` once the stream has ended (after `ended`, or when the agent went
    /// away).
    ///
    /// # Errors
    /// [`ExecdError::Transport`] when the connection breaks, [`ExecdError::Protocol`] for
    /// bytes that are not watch events.
    pub async fn next(&mut self) -> Result<Option<WatchEvent>, ExecdError> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Ok(Some(e));
            }
            let Some(chunk) = next_data(&mut self.body).await? else {
                return Ok(None);
            };
            let events = self.parser.push(&chunk).map_err(|m| ExecdError::Protocol {
                operation: "watch",
                reason: m,
            })?;
            self.ready.extend(events);
        }
    }
}

/// The next data chunk of `body` (trailers skipped); `None` at its end.
async fn next_data(body: &mut Incoming) -> Result<Option<bytes::Bytes>, ExecdError> {
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await;
        match frame {
            None => return Ok(None),
            Some(Err(e)) => {
                return Err(ExecdError::Transport {
                    operation: "watch",
                    reason: format!("the stream broke: {e}"),
                });
            }
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// An empty request body.
fn http_body_empty() -> http_body_util_empty::Empty {
    http_body_util_empty::Empty
}

/// A body with no bytes (hyper's `Body` for `()` would need `http-body-util`).
mod http_body_util_empty {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use hyper::body::{Body, Frame};

    #[derive(Debug)]
    pub(super) struct Empty;

    impl Body for Empty {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
            Poll::Ready(None)
        }

        fn is_end_stream(&self) -> bool {
            true
        }
    }
}
