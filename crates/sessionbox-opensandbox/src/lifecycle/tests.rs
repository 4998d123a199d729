//! Unit tests of the lifecycle client's parsing and error mapping (the server itself is in
//! the crate's integration tests).

use super::client::*;
use super::types::*;
use crate::error::*;
use reqwest::StatusCode;

#[test]
fn unknown_states_are_kept_not_refused() {
    let s: SandboxStatus =
        serde_json::from_str(r#"{"state":"Hibernating","reason":null}"#).unwrap();
    assert_eq!(s.state, SandboxState::Other("Hibernating".into()));
    assert_eq!(s.state.as_str(), "Hibernating");
    let s: SandboxStatus = serde_json::from_str(r#"{"state":"Running"}"#).unwrap();
    assert_eq!(s.state, SandboxState::Running);
}

#[test]
fn both_error_shapes_are_read() {
    let e = status_error(
        "create sandbox",
        StatusCode::UNPROCESSABLE_ENTITY,
        br#"{"detail":[{"type":"greater_than_equal","loc":["body","timeout"],"msg":"Input should be greater than or equal to 60","input":5}]}"#,
    );
    assert!(matches!(e, OpenSandboxError::Validation { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("body.timeout: Input should be greater"),
        "{e}"
    );
    let e = status_error(
        "create sandbox",
        StatusCode::BAD_REQUEST,
        br#"{"detail":{"code":"SANDBOX::INVALID_METADATA_LABEL","message":"bad value"}}"#,
    );
    match &e {
        OpenSandboxError::Api {
            status,
            code,
            message,
            ..
        } => {
            assert_eq!(*status, 400);
            assert_eq!(code, "SANDBOX::INVALID_METADATA_LABEL");
            assert_eq!(message, "bad value");
        }
        other => panic!("{other:?}"),
    }
    let e = status_error(
        "get sandbox",
        StatusCode::UNAUTHORIZED,
        br#"{"code":"INVALID_API_KEY","message":"Authentication credentials are invalid."}"#,
    );
    assert!(matches!(e, OpenSandboxError::Unauthorized { .. }), "{e:?}");
    let e = status_error(
        "get sandbox",
        StatusCode::INTERNAL_SERVER_ERROR,
        b"<html>boom</html>",
    );
    assert!(e.to_string().contains("500"), "{e}");
}

#[test]
fn a_server_that_cannot_enforce_a_network_policy_is_told_apart() {
    // The two answers of a real 1.1.1 server on Docker (see the crate README).
    let no_sidecar = status_error(
        "create sandbox",
        StatusCode::BAD_REQUEST,
        br#"{"code":"SANDBOX::INVALID_PARAMETER","message":"egress.image must be configured when networkPolicy is provided."}"#,
    );
    let e = network_policy_refusal(no_sidecar, "sessionbox/sandbox:local");
    match &e {
        OpenSandboxError::NetworkPolicyUnsupported {
            status,
            code,
            message,
        } => {
            assert_eq!(*status, 400);
            assert_eq!(code, "SANDBOX::INVALID_PARAMETER");
            assert_eq!(
                message,
                "egress.image must be configured when networkPolicy is provided."
            );
        }
        other => panic!("{other:?}"),
    }
    let text = e.to_string();
    assert!(text.contains("network_policy setting"), "{text}");
    assert!(text.contains("[egress] image"), "{text}");
    let pull = |image: &str| {
        status_error(
            "create sandbox",
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                r#"{{"code":"DOCKER::SANDBOX_IMAGE_PULL_FAILED","message":"Failed to pull image {image}: 500 Server Error"}}"#
            )
            .as_bytes(),
        )
    };
    assert!(matches!(
        network_policy_refusal(pull("opensandbox/egress:v1"), "sessionbox/sandbox:local"),
        OpenSandboxError::NetworkPolicyUnsupported { status: 500, .. }
    ));
    // The sandbox's own image missing is not the sidecar's fault.
    assert!(matches!(
        network_policy_refusal(pull("sessionbox/sandbox:local"), "sessionbox/sandbox:local"),
        OpenSandboxError::Api { status: 500, .. }
    ));
    // Unrelated refusals stay what they were.
    let other = status_error(
        "create sandbox",
        StatusCode::BAD_REQUEST,
        br#"{"code":"SANDBOX::INVALID_METADATA_LABEL","message":"bad label"}"#,
    );
    assert!(matches!(
        network_policy_refusal(other, "x"),
        OpenSandboxError::Api { status: 400, .. }
    ));
}

#[test]
fn times_with_and_without_offsets_parse() {
    assert!(parse_time("2026-11-29T15:10:00.123456+00:00").is_some());
    assert!(parse_time("2026-11-29T15:10:00Z").is_some());
    assert!(parse_time("2026-11-29T15:10:00.5").is_some());
    assert!(parse_time("yesterday").is_none());
}

#[test]
fn server_addresses_are_checked() {
    assert_eq!(
        parse_server("127.0.0.1:8080").unwrap().as_str(),
        "http://127.0.0.1:8080/"
    );
    assert_eq!(
        parse_server("http://127.0.0.1:8080/v1/").unwrap().as_str(),
        "http://127.0.0.1:8080/"
    );
    for bad in [
        "",
        " http://127.0.0.1:8080",
        "http://u:p@127.0.0.1:8080",
        "ftp://x",
        "http://127.0.0.1:8080/other",
        "http://127.0.0.1:8080/?q",
        "http://a\\b",
    ] {
        assert!(parse_server(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn api_key_never_shows() {
    let k = ApiKey::new("s3cr3t-value").unwrap();
    assert!(!format!("{k:?}").contains("s3cr3t"));
    let c = ClientConfig::new("127.0.0.1:1", Some(k));
    assert!(!format!("{c:?}").contains("s3cr3t"));
    let client = OpenSandboxClient::new(c).unwrap();
    assert!(!format!("{client:?}").contains("s3cr3t"));
}

#[test]
fn sandbox_ids_cannot_reshape_paths() {
    for bad in ["", ".", "..", "a/b", "a?b", "a b", "%2e%2e"] {
        assert!(check_id(bad).is_err(), "{bad:?}");
    }
    check_id("3f2b8c1e-6d4a-4f1b-9a7e-0c5d2e8f1a36").unwrap();
}
