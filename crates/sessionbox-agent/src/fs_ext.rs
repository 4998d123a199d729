//! `POST /sessionbox/v1/fs`: sessionbox's file-operation extension (see
//! [`sessionbox_execd::fs_ext`]). One [`FsRequest`] in, one [`FsResponse`] out, every operation
//! through the confined [`Workspace`]; errors keep their [`sessionbox_core::Error::code`] so the
//! caller rebuilds the same typed error.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sessionbox_core::Error;
use sessionbox_execd::fs_ext::{FS_ERROR_PREFIX, FsRequest, FsResponse};
use sessionbox_execd::types::ErrorResponse;
use sessionbox_fs::Workspace;

use crate::server::{AppState, parse_json, read_body};

pub(crate) async fn fs(State(state): State<Arc<AppState>>, req: Request) -> Response {
    // A write carries a whole file, base64: allow the largest file the limits allow.
    let limit = usize::try_from(state.config.limits.max_file_bytes)
        .unwrap_or(usize::MAX)
        .saturating_mul(4)
        / 3
        + 64 * 1024;
    let request: FsRequest = match read_body(req, limit.max(state.config.max_request_bytes))
        .await
        .and_then(|b| parse_json(&b))
    {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let ws = state.ws.clone();
    match tokio::task::spawn_blocking(move || apply(&ws, request)).await {
        Ok(Ok(r)) => axum::Json(r).into_response(),
        Ok(Err(e)) => typed_error(&e),
        Err(e) => typed_error(&Error::Backend(format!("a file operation failed: {e}"))),
    }
}

/// Runs one operation on the workspace.
fn apply(ws: &Workspace, request: FsRequest) -> Result<FsResponse, Error> {
    Ok(match request {
        FsRequest::Read { path } => FsResponse::Data(ws.read(&path)?),
        FsRequest::Write { path, data } => {
            ws.write(&path, &data)?;
            FsResponse::Done
        }
        FsRequest::Edit { path, edit } => FsResponse::Edited(ws.edit(&path, &edit)?),
        FsRequest::List { path } => FsResponse::Entries(ws.list(&path)?),
        FsRequest::Glob { pattern } => FsResponse::Paths(ws.glob(&pattern)?),
        FsRequest::Grep { request } => FsResponse::Matches(ws.grep(&request)?),
        FsRequest::Stat { path } => FsResponse::Stat(ws.stat(&path)?),
        FsRequest::Remove { path, recursive } => {
            ws.remove(&path, recursive)?;
            FsResponse::Done
        }
        FsRequest::Mkdir { path } => {
            ws.mkdir(&path)?;
            FsResponse::Done
        }
    })
}

/// The status of each kind, and `SESSIONBOX::<code>` as the body's code.
pub(crate) fn typed_error(e: &Error) -> Response {
    let status = match e {
        Error::NotFound(_) => StatusCode::NOT_FOUND,
        Error::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
        Error::AlreadyExists(_) | Error::Conflict(_) => StatusCode::CONFLICT,
        Error::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        Error::TimedOut(_) => StatusCode::GATEWAY_TIMEOUT,
        Error::OutsideWorkspace { .. } => StatusCode::FORBIDDEN,
        e if e.is_invalid_input() => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = ErrorResponse::new(format!("{FS_ERROR_PREFIX}{}", e.code()), e.to_string());
    (status, axum::Json(body)).into_response()
}
