//! What can fail when talking to an OpenSandbox server.

use std::time::Duration;

use reqwest::StatusCode;

use crate::lifecycle::{MAX_QUOTED, truncate};

/// An OpenSandbox lifecycle failure. Messages never carry the API key.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum OpenSandboxError {
    /// The input was refused before anything was sent.
    #[error("{0}")]
    InvalidInput(String),
    /// The server could not be reached.
    #[error("cannot reach the OpenSandbox server at {server}: {reason}; is it running?")]
    Connect {
        /// The server's origin.
        server: String,
        /// Why.
        reason: String,
    },
    /// The server did not answer in time.
    #[error("the OpenSandbox server did not answer {operation} within {after:?}")]
    Timeout {
        /// What was asked.
        operation: &'static str,
        /// The deadline.
        after: Duration,
    },
    /// 401: the API key is missing or wrong.
    #[error(
        "the OpenSandbox server refused the API key ({code}: {message}); set \
         OPEN_SANDBOX_API_KEY to the server's key"
    )]
    Unauthorized {
        /// The server's error code.
        code: String,
        /// The server's message.
        message: String,
    },
    /// 404.
    #[error("{operation}: not found ({code}: {message})")]
    NotFound {
        /// What was asked.
        operation: &'static str,
        /// The server's error code.
        code: String,
        /// The server's message.
        message: String,
    },
    /// 422: the server's request validation (FastAPI `detail`).
    #[error("{operation}: the OpenSandbox server rejected the request: {message}")]
    Validation {
        /// What was asked.
        operation: &'static str,
        /// The validation messages, joined.
        message: String,
    },
    /// Any other error status, with the `{code, message}` body.
    #[error("{operation}: the OpenSandbox server answered {status} ({code}: {message})")]
    Api {
        /// What was asked.
        operation: &'static str,
        /// The HTTP status.
        status: u16,
        /// The server's error code (empty when the body had none).
        code: String,
        /// The server's message.
        message: String,
    },
    /// A 3xx: redirects are never followed.
    #[error(
        "{operation}: the OpenSandbox server answered {status} redirecting to {location:?}; \
         redirects are not followed: point the client at the server itself"
    )]
    Redirect {
        /// What was asked.
        operation: &'static str,
        /// The HTTP status.
        status: u16,
        /// The `Location` header, escaped.
        location: String,
    },
    /// A 2xx whose body is not what the API says.
    #[error("{operation}: the OpenSandbox server's answer is not understood: {reason}")]
    InvalidResponse {
        /// What was asked.
        operation: &'static str,
        /// Why.
        reason: String,
    },
    /// An endpoint the server returned failed validation; it is not used.
    #[error(
        "the execd endpoint {endpoint:?} returned by the OpenSandbox server is not trusted: {reason}"
    )]
    UntrustedEndpoint {
        /// The endpoint, escaped and cut.
        endpoint: String,
        /// The rule it broke.
        reason: String,
    },
    /// A create that carried a `networkPolicy` was refused because the server cannot enforce
    /// one: the 1.1.1 server answers 400 `SANDBOX::INVALID_PARAMETER` "egress.image must be
    /// configured when networkPolicy is provided." without an egress sidecar image in its
    /// configuration, and 500 `DOCKER::SANDBOX_IMAGE_PULL_FAILED` when that image is
    /// configured but cannot be had. No sandbox is left behind either way.
    #[error(
        "the OpenSandbox server cannot enforce a network policy (it answered {status} {code}: \
         {message}); install OpenSandbox's egress sidecar image on the server and name it in \
         the server's configuration ([egress] image, with the Docker runtime's network_mode = \
         \"bridge\"), or turn off the opensandbox network_policy setting (then \
         sandboxes get the server's network as it is and sessionbox's policy does not bind \
         them)"
    )]
    NetworkPolicyUnsupported {
        /// The HTTP status.
        status: u16,
        /// The server's error code.
        code: String,
        /// The server's message.
        message: String,
    },
    /// `/health` did not say `{"status":"healthy"}`.
    #[error("{server} is not a healthy OpenSandbox server: {reason}")]
    Unhealthy {
        /// The server's origin.
        server: String,
        /// Why.
        reason: String,
    },
}

impl OpenSandboxError {
    /// True when the server said the sandbox does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, OpenSandboxError::NotFound { .. })
    }
}

/// A create with a `networkPolicy` that failed because the server cannot enforce one becomes
/// [`OpenSandboxError::NetworkPolicyUnsupported`]: a 400 or 422 that names the network policy
/// or the egress sidecar, or a failed pull of an image other than the sandbox's own (the
/// sidecar's). Every other failure is left as it was.
pub(crate) fn network_policy_refusal(e: OpenSandboxError, sandbox_image: &str) -> OpenSandboxError {
    let names_egress = |m: &str| {
        let m = m.to_ascii_lowercase();
        m.contains("networkpolicy") || m.contains("network policy") || m.contains("egress")
    };
    match e {
        OpenSandboxError::Api {
            status,
            code,
            message,
            ..
        } if (status == 400 && names_egress(&message))
            || (code.ends_with("IMAGE_PULL_FAILED")
                && !message.contains(&format!("image {sandbox_image}:"))) =>
        {
            OpenSandboxError::NetworkPolicyUnsupported {
                status,
                code,
                message,
            }
        }
        OpenSandboxError::Validation { message, .. } if names_egress(&message) => {
            OpenSandboxError::NetworkPolicyUnsupported {
                status: 422,
                code: String::new(),
                message,
            }
        }
        e => e,
    }
}

/// Turns an error answer into a typed error. Reads both shapes the server uses: FastAPI's
/// `{"detail": [...]}` for request validation (422), and `{"code", "message"}` (also nested as
/// `{"detail": {"code", "message"}}`).
pub(crate) fn status_error(op: &'static str, status: StatusCode, body: &[u8]) -> OpenSandboxError {
    let value: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let mut code = String::new();
    let mut message = String::new();
    if let Some(v) = &value {
        let obj = match v.get("detail") {
            Some(d @ serde_json::Value::Object(_)) => d,
            _ => v,
        };
        if let Some(c) = obj.get("code").and_then(|c| c.as_str()) {
            code = c.to_owned();
        }
        if let Some(m) = obj.get("message").and_then(|m| m.as_str()) {
            message = m.to_owned();
        }
        if let Some(serde_json::Value::Array(items)) = v.get("detail") {
            // FastAPI validation: [{"loc": [...], "msg": "...", "type": "..."}]
            let parts: Vec<String> = items
                .iter()
                .take(5)
                .map(|item| {
                    let loc = item
                        .get("loc")
                        .and_then(|l| l.as_array())
                        .map(|l| {
                            l.iter()
                                .map(|p| match p {
                                    serde_json::Value::String(s) => s.clone(),
                                    other => other.to_string(),
                                })
                                .collect::<Vec<_>>()
                                .join(".")
                        })
                        .unwrap_or_default();
                    let msg = item
                        .get("msg")
                        .and_then(|m| m.as_str())
                        .unwrap_or("invalid");
                    format!("{loc}: {msg}")
                })
                .collect();
            if !parts.is_empty() {
                message = parts.join("; ");
            }
        } else if let Some(serde_json::Value::String(s)) = v.get("detail") {
            message = s.clone();
        }
    }
    if message.is_empty() {
        message = String::from_utf8_lossy(body).into_owned();
    }
    let message = crate::endpoint::printable(&truncate(message.trim(), MAX_QUOTED));
    let code = crate::endpoint::printable(&truncate(&code, 80));
    match status {
        StatusCode::UNAUTHORIZED => OpenSandboxError::Unauthorized { code, message },
        StatusCode::NOT_FOUND => OpenSandboxError::NotFound {
            operation: op,
            code,
            message,
        },
        StatusCode::UNPROCESSABLE_ENTITY => OpenSandboxError::Validation {
            operation: op,
            message,
        },
        _ => OpenSandboxError::Api {
            operation: op,
            status: status.as_u16(),
            code,
            message,
        },
    }
}
