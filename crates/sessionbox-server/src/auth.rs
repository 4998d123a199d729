//! Who is calling: an API key (its tenant) or, on a loopback server with no key at all, the
//! server's open tenant.

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use sessionbox_core::TenantId;

use crate::error::ApiError;
use crate::{AppState, blocking};

/// The caller of a request: the tenant it acts in and the id of the key it showed.
#[derive(Debug, Clone)]
pub struct Principal {
    pub tenant: TenantId,
    /// `None` when the server runs open (loopback, no key configured).
    pub key_id: Option<String>,
}

/// The key a request carries: `Authorization: Bearer KEY` or `X-API-Key: KEY`. `Err` when a
/// header is there but unusable.
fn presented_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let bad = || ApiError::unauthorized("the API key header is malformed");
    if let Some(v) = headers.get(axum::http::header::AUTHORIZATION) {
        let v = v.to_str().map_err(|_| bad())?;
        let (scheme, key) = v.split_once(' ').ok_or_else(bad)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(ApiError::unauthorized(
                "only `Authorization: Bearer KEY` is accepted",
            ));
        }
        return Ok(Some(key.trim().to_owned()));
    }
    if let Some(v) = headers.get("x-api-key") {
        return Ok(Some(v.to_str().map_err(|_| bad())?.trim().to_owned()));
    }
    Ok(None)
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let store = state.manager.store().clone();
        match presented_key(&parts.headers)? {
            Some(key) => {
                let found = blocking(move || store.verify_api_key(&key)).await?;
                match found {
                    Some(record) => Ok(Principal {
                        tenant: record.tenant,
                        key_id: Some(record.id),
                    }),
                    None => Err(ApiError::unauthorized(
                        "the API key is not valid (unknown or revoked)",
                    )),
                }
            }
            None => {
                let Some(tenant) = state.config.open_tenant.clone() else {
                    return Err(ApiError::unauthorized(
                        "an API key is required: send `Authorization: Bearer KEY` or `X-API-Key: KEY`",
                    ));
                };
                // Open only while no key exists: the first key created closes it.
                if blocking(move || store.has_api_keys()).await? {
                    return Err(ApiError::unauthorized(
                        "an API key is required: send `Authorization: Bearer KEY` or `X-API-Key: KEY`",
                    ));
                }
                Ok(Principal {
                    tenant,
                    key_id: None,
                })
            }
        }
    }
}
