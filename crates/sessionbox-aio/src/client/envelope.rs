//! The response envelope `{success, message, data, hint}` and its error shapes, decoded into
//! data or a typed [`AioError`].

use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::Value;

use super::AioError;

#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(default = "yes")]
    success: bool,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    data: Value,
}

fn yes() -> bool {
    true
}

pub(super) fn shorten(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() <= 300 {
        s.to_owned()
    } else {
        format!("{}...", s.chars().take(300).collect::<String>())
    }
}

/// Decodes a response: the envelope's `data` on success, a typed error otherwise.
pub(super) fn decode_envelope(
    route: &str,
    status: StatusCode,
    body: &[u8],
) -> Result<Value, AioError> {
    let route = route.to_owned();
    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        return Err(AioError::Unauthorized {
            route,
            status: status.as_u16(),
        });
    }
    let json: Option<Value> = serde_json::from_slice(body).ok();
    if status == StatusCode::UNPROCESSABLE_ENTITY {
        let detail = match json.as_ref().and_then(|j| j.get("detail")) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| {
                    let loc = i
                        .get("loc")
                        .and_then(Value::as_array)
                        .map(|l| {
                            l.iter()
                                .map(|p| match p {
                                    Value::String(s) => s.clone(),
                                    other => other.to_string(),
                                })
                                .collect::<Vec<_>>()
                                .join(".")
                        })
                        .unwrap_or_default();
                    let msg = i.get("msg").and_then(Value::as_str).unwrap_or("invalid");
                    if loc.is_empty() {
                        msg.to_owned()
                    } else {
                        format!("{loc}: {msg}")
                    }
                })
                .collect::<Vec<_>>()
                .join("; "),
            _ => json
                .as_ref()
                .and_then(|j| j.get("message"))
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| shorten(&String::from_utf8_lossy(body))),
        };
        return Err(AioError::Rejected {
            route,
            detail: shorten(&detail),
        });
    }
    let envelope = json
        .as_ref()
        .filter(|j| j.get("success").is_some() || j.get("data").is_some())
        .and_then(|j| serde_json::from_value::<Envelope>(j.clone()).ok());
    match envelope {
        Some(env) if !env.success => {
            let error_type = env
                .data
                .get("error_type")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let message = env
                .message
                .or_else(|| {
                    env.data
                        .get("message")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| "the operation failed".into());
            Err(AioError::Failed {
                route,
                status: status.as_u16(),
                message: shorten(&message),
                error_type,
            })
        }
        Some(env) if status.is_success() => Ok(env.data),
        _ if status.is_success() => Err(AioError::Protocol {
            route,
            reason: "the body is not a {success, message, data} envelope".into(),
        }),
        _ => {
            let message = json
                .as_ref()
                .and_then(|j| j.get("detail").or_else(|| j.get("message")))
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
            Err(AioError::Http {
                route,
                status: status.as_u16(),
                message: shorten(&message),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_200_failure_is_typed_with_its_error_type() {
        let body = br#"{"success":false,"message":"read failed: No such file","data":{"path":"/x","operation":"read","message":"m","error_type":"not_found"},"hint":null}"#;
        let e = decode_envelope("v1/file/read", StatusCode::OK, body).unwrap_err();
        match &e {
            AioError::Failed {
                error_type,
                message,
                status,
                ..
            } => {
                assert_eq!(error_type.as_deref(), Some("not_found"));
                assert_eq!(message, "read failed: No such file");
                assert_eq!(*status, 200);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(sessionbox_core::Error::from(e).code(), "not_found");
    }

    #[test]
    fn both_422_shapes_are_rejections_with_their_details() {
        let list =
            br#"{"detail":[{"type":"missing","loc":["body","command"],"msg":"Field required"}]}"#;
        match decode_envelope("v1/bash/exec", StatusCode::UNPROCESSABLE_ENTITY, list) {
            Err(AioError::Rejected { detail, .. }) => {
                assert_eq!(detail, "body.command: Field required")
            }
            other => panic!("{other:?}"),
        }
        let text = br#"{"detail":"content is not valid base64"}"#;
        match decode_envelope("v1/file/write", StatusCode::UNPROCESSABLE_ENTITY, text) {
            Err(AioError::Rejected { detail, .. }) => {
                assert_eq!(detail, "content is not valid base64")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn success_returns_data_and_non_envelope_is_a_protocol_error() {
        let ok = br#"{"success":true,"message":"Operation successful","data":{"a":1},"hint":null}"#;
        assert_eq!(
            decode_envelope("r", StatusCode::OK, ok).unwrap(),
            serde_json::json!({"a": 1})
        );
        assert!(matches!(
            decode_envelope("r", StatusCode::OK, b"<html>"),
            Err(AioError::Protocol { .. })
        ));
        assert!(matches!(
            decode_envelope("r", StatusCode::BAD_GATEWAY, b"<html>bad gateway</html>"),
            Err(AioError::Http { status: 502, .. })
        ));
        assert!(matches!(
            decode_envelope("r", StatusCode::UNAUTHORIZED, b""),
            Err(AioError::Unauthorized { status: 401, .. })
        ));
    }
}
