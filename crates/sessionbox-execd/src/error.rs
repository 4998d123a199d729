//! The crate's error type and its mapping onto [`sessionbox_core::Error`].

use std::time::Duration;

use sessionbox_core::Error;

use crate::stream::StreamError;
use crate::wire::error_code;

/// Everything that can go wrong talking to execd. Messages never contain the access token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExecdError {
    /// The endpoint could not be understood.
    #[error(
        "invalid execd endpoint {0:?}: expected a Unix socket path, unix:PATH, http://HOST[:PORT][/PREFIX], https://... or HOST:PORT"
    )]
    InvalidEndpoint(String),
    /// The request was refused before sending.
    #[error("invalid execd request: {0}")]
    InvalidRequest(String),
    /// A body was over the agent's limit for it, so it was refused before sending: a peer that
    /// refuses a body early closes the connection while it is still being written, and the
    /// sender then sees a broken pipe instead of the refusal.
    #[error("{what} is larger than {limit} bytes")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// The limit in bytes.
        limit: u64,
    },
    /// No connection could be made.
    #[error("cannot connect to execd at {endpoint}: {reason}")]
    Connect {
        /// Where we tried (a socket path or a base URL).
        endpoint: String,
        /// What failed.
        reason: String,
    },
    /// A deadline passed.
    #[error("execd {operation} timed out after {} ms", .after.as_millis())]
    Timeout {
        /// What was being done.
        operation: &'static str,
        /// The deadline.
        after: Duration,
    },
    /// execd answered with a redirect, which this client never follows.
    #[error(
        "execd {operation} answered HTTP {status} redirecting to {location:?}; redirects are \
         never followed: configure the final execd address instead"
    )]
    Redirect {
        /// What was being done.
        operation: &'static str,
        /// The 3xx status.
        status: u16,
        /// The `Location` header (empty when missing).
        location: String,
    },
    /// execd answered with an error status.
    #[error("execd {operation} failed with HTTP {status}{}: {message}", code_suffix(.code))]
    Status {
        /// What was being done.
        operation: &'static str,
        /// The HTTP status.
        status: u16,
        /// `ErrorResponse.code`, empty when the body had none.
        code: String,
        /// `ErrorResponse.message`, or the body's text.
        message: String,
    },
    /// The connection failed mid-request.
    #[error("execd {operation} failed: {reason}")]
    Transport {
        /// What was being done.
        operation: &'static str,
        /// What failed.
        reason: String,
    },
    /// execd answered 2xx with a body this crate cannot read.
    #[error("execd {operation} sent an unreadable answer: {reason}")]
    Protocol {
        /// What was being done.
        operation: &'static str,
        /// What was wrong with it.
        reason: String,
    },
    /// The command event stream was broken.
    #[error(transparent)]
    Stream(#[from] StreamError),
}

fn code_suffix(code: &str) -> String {
    if code.is_empty() {
        String::new()
    } else {
        format!(" ({code})")
    }
}

impl ExecdError {
    /// The HTTP status, for [`ExecdError::Status`] and [`ExecdError::Redirect`].
    pub fn status(&self) -> Option<u16> {
        match self {
            ExecdError::Status { status, .. } | ExecdError::Redirect { status, .. } => {
                Some(*status)
            }
            _ => None,
        }
    }
}

impl From<ExecdError> for Error {
    /// 404 and `FILE_NOT_FOUND`/`CONTEXT_NOT_FOUND` become [`Error::NotFound`]; 400, 416 and 422
    /// [`Error::InvalidRequest`]; 409 [`Error::Conflict`]; deadlines [`Error::TimedOut`]; a refused
    /// request [`Error::InvalidRequest`], a refused body [`Error::TooLarge`]; everything else [`Error::Backend`] with the full message.
    fn from(e: ExecdError) -> Self {
        match &e {
            ExecdError::InvalidRequest(m) => Error::InvalidRequest(m.clone()),
            ExecdError::TooLarge { what, limit } => Error::TooLarge {
                what: (*what).into(),
                limit: *limit,
            },
            ExecdError::Timeout { after, .. } => Error::TimedOut(*after),
            ExecdError::Status {
                status,
                code,
                message,
                ..
            } => {
                let message = if message.is_empty() {
                    e.to_string()
                } else {
                    message.clone()
                };
                if let Some(typed) = code.strip_prefix(crate::fs_ext::FS_ERROR_PREFIX) {
                    return Error::from_code(typed, &message);
                }
                // `from_code` keeps a kind the message already starts with once ("not found:
                // x", not "not found: not found: x"): the agent's messages are core errors'
                // display text.
                if *status == 404
                    || code == error_code::FILE_NOT_FOUND
                    || code == error_code::CONTEXT_NOT_FOUND
                {
                    Error::from_code("not_found", &message)
                } else {
                    match status {
                        400 | 416 | 422 => Error::from_code("invalid_request", &message),
                        409 => Error::from_code("conflict", &message),
                        _ => Error::Backend(e.to_string()),
                    }
                }
            }
            _ => Error::Backend(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sessionbox_agent_error_keeps_its_type() {
        let e: Error = status(403, "SESSIONBOX::outside_workspace", "a link leads out").into();
        assert_eq!(e.code(), "outside_workspace");
        assert_eq!(e.to_string(), "a link leads out");
    }

    fn status(status: u16, code: &str, message: &str) -> ExecdError {
        ExecdError::Status {
            operation: "files info",
            status,
            code: code.into(),
            message: message.into(),
        }
    }

    #[test]
    fn a_message_that_already_names_its_kind_keeps_it_once() {
        for (status, code, message, shown) in [
            (404, "", "not found: nodir", "not found: nodir"),
            (
                400,
                "INVALID_REQUEST_BODY",
                "invalid request: bad",
                "invalid request: bad",
            ),
            (
                409,
                "",
                "conflict: d is a directory",
                "conflict: d is a directory",
            ),
        ] {
            let e = Error::from(self::status(status, code, message));
            assert_eq!(e.to_string(), shown);
        }
    }

    #[test]
    fn maps_onto_core_errors() {
        assert_eq!(
            Error::from(status(404, "FILE_NOT_FOUND", "file not found: /a")),
            Error::NotFound("file not found: /a".into())
        );
        assert_eq!(
            Error::from(status(500, "FILE_NOT_FOUND", "gone")),
            Error::NotFound("gone".into())
        );
        assert_eq!(
            Error::from(status(400, "INVALID_REQUEST_BODY", "bad")),
            Error::InvalidRequest("bad".into())
        );
        assert_eq!(
            Error::from(status(409, "", "exists")),
            Error::Conflict("exists".into())
        );
        let e = Error::from(status(500, "RUNTIME_ERROR", "disk full"));
        assert_eq!(e.code(), "backend_error");
        assert!(
            e.to_string()
                .contains("HTTP 500 (RUNTIME_ERROR): disk full"),
            "{e}"
        );
        assert_eq!(
            Error::from(ExecdError::Timeout {
                operation: "ping",
                after: Duration::from_secs(1)
            }),
            Error::TimedOut(Duration::from_secs(1))
        );
        let e = Error::from(ExecdError::Stream(StreamError::MissingTerminal {
            events: 1,
        }));
        assert_eq!(e.code(), "backend_error");
        assert!(e.to_string().contains("terminal event"));
    }
}
