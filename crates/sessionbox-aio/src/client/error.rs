//! [`AioError`]: what went wrong talking to the AIO server, and its mapping to
//! [`sessionbox_core::Error`].

use super::{ENV_AUTH_HEADER, ENV_BASE_URL, ENV_TOKEN};

/// What went wrong talking to the AIO server. Messages never contain the token.
#[derive(Debug, thiserror::Error)]
pub enum AioError {
    /// The configuration is unusable (bad URL, bad header choice).
    #[error("invalid AIO configuration: {0}")]
    Config(String),
    /// The server could not be reached or the connection broke.
    #[error("cannot reach the AIO server at {endpoint} ({route}): {reason}")]
    Unreachable {
        /// The base URL.
        endpoint: String,
        /// The route called.
        route: String,
        /// What the HTTP client said.
        reason: String,
    },
    /// HTTP 401 or 403: the token is missing or wrong.
    #[error(
        "the AIO server refused the request to {route} (HTTP {status}): set {ENV_TOKEN} to a valid token (and {ENV_AUTH_HEADER} if it wants X-AIO-API-Key)"
    )]
    Unauthorized {
        /// The route called.
        route: String,
        /// 401 or 403.
        status: u16,
    },
    /// HTTP 422: the server rejected the request as invalid (either `detail` shape).
    #[error("the AIO server rejected the request to {route} as invalid: {detail}")]
    Rejected {
        /// The route called.
        route: String,
        /// The validation details, joined.
        detail: String,
    },
    /// The operation failed (`success: false`, at HTTP 200 or otherwise).
    #[error("{route} failed: {message}")]
    Failed {
        /// The route called.
        route: String,
        /// HTTP status.
        status: u16,
        /// The server's message.
        message: String,
        /// `FileOperationError.error_type`, when the server gave one (`not_found`, ...).
        error_type: Option<String>,
    },
    /// Another HTTP error status.
    #[error("the AIO server answered {route} with HTTP {status}: {message}")]
    Http {
        /// The route called.
        route: String,
        /// HTTP status.
        status: u16,
        /// The body's message, cut short.
        message: String,
    },
    /// The response did not have the shape the spec gives.
    #[error("unexpected response from {route}: {reason}")]
    Protocol {
        /// The route called.
        route: String,
        /// What was wrong.
        reason: String,
    },
    /// A download was larger than the caller's limit.
    #[error("{route}: the file is larger than {limit} bytes")]
    TooLarge {
        /// The route called.
        route: String,
        /// The limit.
        limit: u64,
    },
}

impl From<AioError> for sessionbox_core::Error {
    fn from(e: AioError) -> Self {
        use sessionbox_core::Error;
        match &e {
            AioError::Unauthorized { .. } => Error::Unauthorized(e.to_string()),
            AioError::Config(_) | AioError::Unreachable { .. } => Error::RuntimeUnavailable {
                runtime: "aio".into(),
                reason: e.to_string(),
                hint: format!(
                    "check the AIO Sandbox server's address ({ENV_BASE_URL}) and token ({ENV_TOKEN}), and that it is running"
                ),
            },
            AioError::Failed {
                error_type: Some(t),
                message,
                ..
            } => match t.as_str() {
                "not_found" | "file_not_found" => Error::NotFound(message.clone()),
                "already_exists" | "file_exists" => Error::AlreadyExists(message.clone()),
                "is_directory" | "not_directory" | "directory_not_empty" => {
                    Error::Conflict(message.clone())
                }
                _ => Error::Backend(e.to_string()),
            },
            AioError::TooLarge { limit, .. } => Error::TooLarge {
                what: "file".into(),
                limit: *limit,
            },
            _ => Error::Backend(e.to_string()),
        }
    }
}
