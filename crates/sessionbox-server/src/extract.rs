//! Extractors whose rejections are the JSON error body (axum's own answer in plain text): a
//! JSON body, a raw body, path and query arguments.

use axum::Json;
use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::error::{ApiError, rejection};

/// A JSON body of type `T`: 400 when malformed, 422 when of the wrong shape, 413 when too large.
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(JsonBody(v)),
            Err(e) => Err(json_rejection(e)),
        }
    }
}

fn json_rejection(e: JsonRejection) -> ApiError {
    rejection(e.status(), e.body_text())
}

/// The raw body: 413 when too large.
pub(crate) struct RawBody(pub(crate) Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        Bytes::from_request(req, state)
            .await
            .map(RawBody)
            .map_err(|e: BytesRejection| rejection(e.status(), e.body_text()))
    }
}

/// Path arguments: 400 when they do not parse.
pub(crate) struct PathArgs<T>(pub(crate) T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for PathArgs<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| PathArgs(p.0))
            .map_err(|e: PathRejection| ApiError::bad_request(e.body_text()))
    }
}

/// Query arguments: 422 for a parameter the route does not take, 400 for a bad value.
pub(crate) struct QueryArgs<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryArgs<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| QueryArgs(q.0))
            .map_err(|e: QueryRejection| {
                // A parameter this route does not take is the wrong shape (422), as an unknown
                // field of a JSON body is; a value that does not parse is 400.
                let text = e.body_text();
                if text.contains("unknown field") {
                    rejection(StatusCode::UNPROCESSABLE_ENTITY, text)
                } else {
                    ApiError::bad_request(text)
                }
            })
    }
}
