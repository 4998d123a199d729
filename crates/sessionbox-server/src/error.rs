//! The one error body of the API: `{"code": "...", "message": "..."}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sessionbox_core::Error;

use crate::views::ErrorBody;

/// An error answer: a status, a stable snake_case code and a message for people.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status of the answer.
    pub status: StatusCode,
    /// The stable snake_case code clients match on (`invalid_request`, `unauthorized`, ...).
    pub code: &'static str,
    /// What went wrong, for people; no secret goes in it.
    pub message: String,
}

impl ApiError {
    /// An answer with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// 401 `unauthorized`: no usable API key, or one that is not accepted.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// 400 `invalid_request`: the request itself is malformed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }
}

/// The `Retry-After` of a 503 `unavailable` answer, in seconds.
const RETRY_AFTER_SECS: &str = "1";

/// The HTTP status of each [`Error::code`]. Caller faults are 4xx; only a failing backend is 5xx.
pub fn status_of(e: &Error) -> StatusCode {
    match e.code() {
        "invalid_id" | "invalid_path" | "invalid_request" => StatusCode::BAD_REQUEST,
        "outside_workspace" | "forbidden" => StatusCode::FORBIDDEN,
        "not_found" => StatusCode::NOT_FOUND,
        "already_exists" | "conflict" => StatusCode::CONFLICT,
        "too_large" => StatusCode::PAYLOAD_TOO_LARGE,
        "timed_out" => StatusCode::GATEWAY_TIMEOUT,
        "runtime_unavailable" | "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
        "unauthorized" => StatusCode::UNAUTHORIZED,
        "busy" => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let mut message = e.to_string();
        if let Error::Conflict(m) = &e
            && let Some(owner) = owner_runtime(m)
        {
            // The library says "destroy it with that runtime"; over HTTP that is a dead end
            // unless it says where: a server runs one runtime, the CLI can choose any.
            message.push_str(&format!(
                ". This server runs one runtime; the conversation is reached or destroyed where \
                 the {owner} runtime runs, such as `sessionbox --runtime {owner} --tenant TENANT \
                 destroy -c ID` on this data directory"
            ));
        }
        ApiError::new(status_of(&e), e.code(), message)
    }
}

/// The runtime named by a conflict "conversation X belongs to the R runtime; ...".
fn owner_runtime(message: &str) -> Option<&str> {
    let owner = message
        .split_once("belongs to the ")?
        .1
        .split_once(" runtime")?
        .0;
    (!owner.is_empty() && owner.bytes().all(|b| b.is_ascii_lowercase())).then_some(owner)
}

/// The error code of a response, kept as a response extension for the audit record and the
/// metrics.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ErrorCode(pub &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.code.to_owned(),
            message: self.message,
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.code == "unavailable" {
            // RFC 9110, 10.2.3: when to try again. The store is usually back within seconds
            // (a PostgreSQL restart), or once an operator frees space.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        if self.status == StatusCode::UNAUTHORIZED {
            // RFC 9110, 15.5.2: a 401 names the scheme the server takes.
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"sessionbox\""),
            );
        }
        response.extensions_mut().insert(ErrorCode(self.code));
        response
    }
}

/// Maps an axum extractor rejection (malformed JSON, wrong types, body too large, bad query) to
/// the error body: 413 for size, 422 for well-formed JSON of the wrong shape, 400 otherwise.
pub(crate) fn rejection(status: StatusCode, text: String) -> ApiError {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(status, "too_large", text),
        StatusCode::UNPROCESSABLE_ENTITY => ApiError::new(status, "invalid_request", text),
        _ => ApiError::bad_request(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_of_another_runtime_says_where_it_can_be_destroyed() {
        for m in [
            "conversation acme/c1 belongs to the host runtime; destroy it first to use it with \
             the isolated runtime",
            "conversation c1 belongs to the host runtime; destroy it with that runtime",
        ] {
            let e = ApiError::from(Error::Conflict(m.into()));
            assert_eq!((e.status, e.code), (StatusCode::CONFLICT, "conflict"));
            assert!(
                e.message.starts_with(&format!("conflict: {m}")),
                "{}",
                e.message
            );
            assert!(
                e.message
                    .contains("`sessionbox --runtime host --tenant TENANT destroy -c ID`"),
                "{}",
                e.message
            );
        }
        // Other conflicts are left as they are.
        let e = ApiError::from(Error::Conflict("the file changed".into()));
        assert_eq!(e.message, "conflict: the file changed");
    }
}
