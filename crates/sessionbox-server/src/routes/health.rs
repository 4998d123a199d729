//! `GET /healthz` and `GET /readyz`: no key, no audit record.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::error::ApiError;
use crate::views::ErrorBody;

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", security(),
    responses((status = 200, description = "alive", body = Object)))]
pub(crate) async fn healthz() -> Response {
    Json(serde_json::json!({ "status": "ok" })).into_response()
}

/// Readiness: the store and the runtime answer.
#[utoipa::path(get, path = "/readyz", tag = "health", security(),
    responses((status = 200, description = "ready", body = Object),
              (status = 503, description = "not ready", body = ErrorBody)))]
pub(crate) async fn readyz(State(state): State<AppState>) -> Response {
    let store_ok = state.manager.store().run(|s| s.schema_version()).await;
    let runtime_ok = state.manager.runtime().list().await;
    match (store_ok, runtime_ok) {
        (Ok(_), Ok(_)) => Json(serde_json::json!({
            "status": "ready",
            "runtime": state.manager.runtime().info().name,
        }))
        .into_response(),
        (Err(error), _) | (_, Err(error)) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            error.to_string(),
        )
        .into_response(),
    }
}
