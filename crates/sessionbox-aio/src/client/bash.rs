//! Commands: `/v1/bash/exec`, `/v1/bash/output` and the session routes.

use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use super::{
    AioClient, AioError, BashExecRequest, BashExecResult, BashOutputRequest, BashOutputResult,
    BashSessionInfo,
};

impl AioClient {
    /// `POST /v1/bash/exec`.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn bash_exec(&self, req: &BashExecRequest) -> Result<BashExecResult, AioError> {
        let wait = req.timeout.unwrap_or(0.0).max(0.0);
        let timeout = self.request_timeout + Duration::from_secs_f64(wait.min(3600.0));
        self.call(Method::POST, "v1/bash/exec", Some(req), timeout)
            .await
    }

    /// `POST /v1/bash/output`.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn bash_output(&self, req: &BashOutputRequest) -> Result<BashOutputResult, AioError> {
        let timeout = self.request_timeout + Duration::from_secs_f64(req.wait_timeout.max(0.0));
        self.call(Method::POST, "v1/bash/output", Some(req), timeout)
            .await
    }

    /// `POST /v1/bash/kill` with `signal` (`SIGTERM`, `SIGKILL`, `SIGINT`).
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn bash_kill(&self, session_id: &str, signal: &str) -> Result<(), AioError> {
        let body = serde_json::json!({"session_id": session_id, "signal": signal});
        self.call::<Value>(
            Method::POST,
            "v1/bash/kill",
            Some(&body),
            self.request_timeout,
        )
        .await
        .map(drop)
    }

    /// `GET /v1/bash/sessions`.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn bash_sessions(&self) -> Result<Vec<BashSessionInfo>, AioError> {
        let v: Option<Vec<BashSessionInfo>> = self
            .call(
                Method::GET,
                "v1/bash/sessions",
                None::<&()>,
                self.request_timeout,
            )
            .await?;
        Ok(v.unwrap_or_default())
    }

    /// `POST /v1/bash/sessions/{id}/close`.
    ///
    /// # Errors
    /// See [`AioError`].
    pub async fn bash_close(&self, session_id: &str) -> Result<(), AioError> {
        if session_id.is_empty()
            || !session_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(AioError::Config(format!(
                "session id {session_id:?} is not [A-Za-z0-9_-]+"
            )));
        }
        let route = format!("v1/bash/sessions/{session_id}/close");
        self.call::<Value>(Method::POST, &route, None::<&()>, self.request_timeout)
            .await
            .map(drop)
    }
}
