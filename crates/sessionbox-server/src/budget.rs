//! Output budgets: the bytes of command output this server lets requests and background commands
//! make it (or the runtime) hold, counted per tenant and in total.
//!
//! A command's output is capped per stream by its `output_limit`, so a command may hold up to
//! twice that (stdout and stderr). Before a command runs, that many bytes are reserved: a JSON
//! or streamed exec (REST or the MCP `bash` tool) holds its reservation until its answer is
//! built or its stream ends; a background command until it ends (its watcher sees the end, it
//! is killed, or its conversation is destroyed). A reservation that would take a tenant past
//! [`ServerConfig::max_output_bytes_per_tenant`](crate::ServerConfig::max_output_bytes_per_tenant),
//! or the server past
//! [`ServerConfig::max_output_bytes_total`](crate::ServerConfig::max_output_bytes_total), is
//! refused at once with `busy` (429) naming the limit: the server refuses new work instead of
//! growing. A command that could never fit (twice its `output_limit` above a limit) is
//! `too_large` (413). Nothing is opened or created before the reservation is made.
//!
//! A file read's body is counted in the same budget, from the moment it is read until the
//! client has taken its last byte ([`OutputBudget::reserve_body`]): a client that reads slowly
//! or not at all keeps the file in the server's memory that long, so a tenant's slow readers
//! are refused (429) before they can make the server hold more than its limit.
//!
//! A file upload's body is counted too ([`received`]): the file routes read a body whole
//! before writing it (up to `max_file_bytes` each), so without it one key sending many uploads
//! at once (or sending each slowly) made the server hold them all: 20 uploads of 60 MiB took
//! its memory from 57 MiB to 3 GiB.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sessionbox_core::{Error, TenantId};

/// The configuration key of the per-tenant limit, as the errors name it.
const PER_TENANT_KEY: &str = "[serve] max_output_bytes_per_tenant";
/// The configuration key of the server-wide limit, as the errors name it.
const TOTAL_KEY: &str = "[serve] max_output_bytes_total";

/// Reserved bytes per tenant and in total, against the two limits.
#[derive(Debug)]
pub(crate) struct OutputBudget {
    per_tenant: u64,
    total: u64,
    used: Mutex<Used>,
}

#[derive(Debug, Default)]
struct Used {
    tenants: HashMap<TenantId, u64>,
    total: u64,
}

/// Bytes reserved for one command; dropping it gives them back.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<OutputBudget>,
    tenant: TenantId,
    bytes: u64,
}

impl OutputBudget {
    /// A budget of `per_tenant` bytes for each tenant and `total` bytes for the server.
    pub(crate) fn new(per_tenant: u64, total: u64) -> Self {
        OutputBudget {
            per_tenant,
            total,
            used: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Used> {
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves the output of one command of `tenant` capped at `output_limit` bytes per
    /// stream: `2 × output_limit` bytes.
    ///
    /// # Errors
    /// [`Error::TooLarge`] when the command alone is above a limit (lower `output_limit`);
    /// [`Error::Busy`] naming the limit that the reservation would pass (wait for a command to
    /// end, kill one, or ask for less).
    pub(crate) fn reserve(
        self: &Arc<Self>,
        tenant: &TenantId,
        output_limit: usize,
    ) -> Result<Reservation, Error> {
        let bytes = u64::try_from(output_limit)
            .unwrap_or(u64::MAX)
            .saturating_mul(2);
        for (limit, key) in [(self.per_tenant, PER_TENANT_KEY), (self.total, TOTAL_KEY)] {
            if bytes > limit {
                return Err(Error::TooLarge {
                    what: format!(
                        "the output of this command (output_limit {output_limit} for each of \
                         stdout and stderr, {bytes} bytes) is above {key} = {limit} bytes; ask \
                         for a smaller output_limit"
                    ),
                    limit: u64::MAX,
                });
            }
        }
        self.take(
            tenant,
            bytes,
            "(2 × output_limit)",
            "or ask for a smaller output_limit",
        )
    }

    /// Reserves the `bytes` of a response body of `tenant` (a file being sent), until the
    /// reservation is dropped.
    ///
    /// # Errors
    /// [`Error::Busy`] naming the limit the reservation would pass (wait for a transfer or a
    /// command to end, or read the file in ranges).
    pub(crate) fn reserve_body(
        self: &Arc<Self>,
        tenant: &TenantId,
        bytes: usize,
    ) -> Result<Reservation, Error> {
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        self.take(
            tenant,
            bytes,
            "(a file being sent)",
            "or read the file in ranges (Range: bytes=A-B)",
        )
    }

    /// Reserves the `bytes` of a request body of `tenant` (a file being received), until the
    /// reservation is dropped.
    ///
    /// # Errors
    /// [`Error::Busy`] naming the limit the reservation would pass (wait for an upload or a
    /// command to end).
    pub(crate) fn reserve_upload(
        self: &Arc<Self>,
        tenant: &TenantId,
        bytes: u64,
    ) -> Result<Reservation, Error> {
        // Never refused for its size alone (the body limit decides that): at most the budget.
        let bytes = bytes.min(self.per_tenant).min(self.total);
        self.take(
            tenant,
            bytes,
            "(a file being received)",
            "or send fewer files at once",
        )
    }

    /// Takes `bytes` for `tenant` if both limits allow; `what` and `instead` finish the refusal.
    fn take(
        self: &Arc<Self>,
        tenant: &TenantId,
        bytes: u64,
        what: &str,
        instead: &str,
    ) -> Result<Reservation, Error> {
        let mut used = self.lock();
        let mine = used.tenants.get(tenant).copied().unwrap_or(0);
        if mine.saturating_add(bytes) > self.per_tenant {
            return Err(Error::Busy(format!(
                "{PER_TENANT_KEY} = {} bytes reached: this tenant's running commands and \
                 requests already reserve {mine} bytes of output and this one needs {bytes} \
                 {what}; wait for one to end or kill a background command, {instead}",
                self.per_tenant
            )));
        }
        if used.total.saturating_add(bytes) > self.total {
            return Err(Error::Busy(format!(
                "{TOTAL_KEY} = {} bytes reached: the server's running commands and requests \
                 already reserve {} bytes of output and this one needs {bytes} {what}; retry \
                 later, {instead}",
                self.total, used.total
            )));
        }
        *used.tenants.entry(tenant.clone()).or_default() += bytes;
        used.total += bytes;
        Ok(Reservation {
            budget: self.clone(),
            tenant: tenant.clone(),
            bytes,
        })
    }

    /// Bytes reserved now by `tenant`.
    pub(crate) fn reserved_by(&self, tenant: &TenantId) -> u64 {
        self.lock().tenants.get(tenant).copied().unwrap_or(0)
    }

    /// Bytes reserved now in the whole server.
    pub(crate) fn reserved(&self) -> u64 {
        self.lock().total
    }
}

/// `data` as a body whose `held` reservations are given back only when the client has taken
/// its last byte (hyper drops the buffer then), not when the handler returns.
pub(crate) fn held_body(data: Vec<u8>, held: Vec<Reservation>) -> bytes::Bytes {
    bytes::Bytes::from_owner(Held { data, _held: held })
}

/// Bytes and their places in the budget, released together.
struct Held {
    data: Vec<u8>,
    _held: Vec<Reservation>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// A JSON answer of `value` whose bytes stay counted until the client has taken them: held in
/// `reservation` (a command's, made before it ran), and, for what serialising made beyond it
/// (JSON escapes a control byte as six), in a reservation of its own when the budget allows
/// one. The output exists already, so a budget without room for the excess still sends it.
pub(crate) fn held_json(
    budget: &Arc<OutputBudget>,
    tenant: &TenantId,
    value: &impl serde::Serialize,
    reservation: Option<Reservation>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let data = match serde_json::to_vec(value) {
        Ok(d) => d,
        Err(e) => return crate::error::ApiError::from(Error::backend(e)).into_response(),
    };
    let covered = reservation.as_ref().map_or(0, |r| r.bytes);
    let mut held: Vec<Reservation> = reservation.into_iter().collect();
    let excess = u64::try_from(data.len())
        .unwrap_or(u64::MAX)
        .saturating_sub(covered);
    if excess > 0
        && let Ok(more) = budget.reserve_body(tenant, usize::try_from(excess).unwrap_or(usize::MAX))
    {
        held.push(more);
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        held_body(data, held),
    )
        .into_response()
}

/// Middleware of the routes that read a file body whole (`PUT .../files/{path}`, `POST
/// .../files`): reserves the body's declared length (or, without one, the most the route takes,
/// `max_file_bytes`) before a byte of it is read, until the answer is made. Over the budget the
/// request is refused (429) unread. Runs after `scope::authorize`, which leaves the caller.
pub(crate) async fn received(
    axum::extract::State(state): axum::extract::State<crate::AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let reads_body = matches!(
        *req.method(),
        axum::http::Method::PUT | axum::http::Method::POST
    );
    let tenant = req
        .extensions()
        .get::<crate::auth::Principal>()
        .map(|p| p.tenant.clone());
    let (true, Some(tenant)) = (reads_body, tenant) else {
        return next.run(req).await;
    };
    let limit = u64::try_from(state.config.max_file_bytes).unwrap_or(u64::MAX);
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // A declared length past the limit is refused by the body limit, unread: nothing to hold.
    let bytes = declared.unwrap_or(limit).min(limit);
    let held = match state.budget.reserve_upload(&tenant, bytes) {
        Ok(r) => r,
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    let response = next.run(req).await;
    drop(held);
    response
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut used = self.budget.lock();
        used.total = used.total.saturating_sub(self.bytes);
        if let Some(n) = used.tenants.get_mut(&self.tenant) {
            *n = n.saturating_sub(self.bytes);
            if *n == 0 {
                used.tenants.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sessionbox_core::TenantId;

    use super::OutputBudget;

    #[test]
    fn reservations_count_per_tenant_and_in_total_and_come_back_when_dropped() {
        let budget = Arc::new(OutputBudget::new(100, 150));
        let (a, b) = (TenantId::new("a").unwrap(), TenantId::new("b").unwrap());
        let a1 = budget.reserve(&a, 25).unwrap();
        let a2 = budget.reserve(&a, 25).unwrap();
        let e = budget.reserve(&a, 1).unwrap_err();
        assert_eq!(e.code(), "busy");
        assert!(
            e.to_string().contains("max_output_bytes_per_tenant = 100"),
            "{e}"
        );
        let b1 = budget.reserve(&b, 25).unwrap();
        let e = budget.reserve(&b, 1).unwrap_err();
        assert!(
            e.to_string().contains("max_output_bytes_total = 150"),
            "{e}"
        );
        assert_eq!((budget.reserved_by(&a), budget.reserved()), (100, 150));
        drop(a1);
        assert_eq!((budget.reserved_by(&a), budget.reserved()), (50, 100));
        let e = budget.reserve(&b, 51).unwrap_err();
        assert_eq!(e.code(), "too_large");
        assert!(e.to_string().contains("smaller output_limit"), "{e}");
        drop((a2, b1));
        assert_eq!((budget.reserved_by(&a), budget.reserved()), (0, 0));
        assert!(budget.reserve(&a, 50).is_ok());
    }
}
