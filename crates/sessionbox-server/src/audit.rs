//! The server's own `http.*` audit records: the middleware that writes one per answered call,
//! and the writer that stores them off the request path.
//!
//! A handler says what to record by putting an [`Audited`] in its response's extensions (as it
//! puts the error's [`ErrorCode`] there); [`track`] turns it into the record, with the status,
//! the outcome code and the duration. A response without one (an extractor's rejection, an
//! unknown route, `/mcp`, which audits its tools itself) is not recorded here.
//!
//! A request hands its record to this writer and answers at once; the writer appends what has
//! queued up in one transaction (so a burst of requests costs one commit, not one each).
//! [`AuditWriter::flush`] waits until everything handed over before it is written; `serve`
//! flushes when it stops. The price: a process that is killed can lose the `http.*` records of
//! its last moments. The operation records that the manager writes (`open`, `exec`, `write`,
//! ...) are written before the operation's answer, so no operation goes unrecorded.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sessionbox_core::ConversationKey;
use sessionbox_store::{AuditEntry, Store};
use tokio::sync::{mpsc, oneshot};

use crate::AppState;
use crate::auth::Principal;
use crate::error::{ApiError, ErrorCode};

/// What to record of one call: a response extension read by [`track`].
#[derive(Debug, Clone)]
pub(crate) struct Audited {
    /// The operation, recorded as `http.OPERATION`.
    pub operation: &'static str,
    /// Who called.
    pub principal: Principal,
    /// The conversation, when the call named a valid one.
    pub key: Option<ConversationKey>,
}

impl Audited {
    /// A record of `operation` by `principal`, on the conversation `key` when there is one.
    pub(crate) fn new(
        operation: &'static str,
        principal: &Principal,
        key: Option<ConversationKey>,
    ) -> Self {
        Audited {
            operation,
            principal: principal.clone(),
            key,
        }
    }

    /// `result` as the response, carrying this record for [`track`].
    pub(crate) fn respond(self, result: Result<Response, ApiError>) -> Response {
        let mut response = result.unwrap_or_else(IntoResponse::into_response);
        response.extensions_mut().insert(self);
        response
    }
}

/// Middleware: writes the `http.*` record of every response that carries an [`Audited`].
pub(crate) async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let mut response = next.run(request).await;
    let Some(audited) = response.extensions_mut().remove::<Audited>() else {
        return response;
    };
    let status = response.status();
    let outcome = if status.is_success() {
        "ok".to_owned()
    } else {
        response
            .extensions()
            .get::<ErrorCode>()
            .map_or_else(|| status.as_u16().to_string(), |code| code.0.to_owned())
    };
    state.audit.record(AuditEntry {
        at: state.manager.store().now(),
        tenant: audited.principal.tenant,
        conversation_key: audited.key,
        operation: format!("http.{}", audited.operation),
        outcome,
        detail: Some(format!(
            "key={} status={} duration_ms={}",
            audited.principal.key_id.as_deref().unwrap_or("-"),
            status.as_u16(),
            started.elapsed().as_millis()
        )),
    });
    response
}

/// Most records appended in one transaction.
const MAX_BATCH: usize = 512;

enum Msg {
    Entry(AuditEntry),
    Flush(oneshot::Sender<()>),
}

/// A handle on the writer task. Cloning shares the task.
#[derive(Clone)]
pub(crate) struct AuditWriter {
    tx: mpsc::UnboundedSender<Msg>,
}

impl AuditWriter {
    /// Starts the writer on the current Tokio runtime (panics outside one).
    pub(crate) fn start(store: Store) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
        tokio::spawn(async move {
            let mut batch = Vec::new();
            let mut acks = Vec::new();
            let (mut lost, mut warned) = (0usize, None);
            while let Some(first) = rx.recv().await {
                let mut next = Some(first);
                while let Some(m) = next {
                    match m {
                        Msg::Entry(e) => batch.push(e),
                        Msg::Flush(ack) => acks.push(ack),
                    }
                    next = if batch.len() < MAX_BATCH {
                        rx.try_recv().ok()
                    } else {
                        None
                    };
                }
                if !batch.is_empty() {
                    let entries = std::mem::take(&mut batch);
                    let n = entries.len();
                    // One record (the common case: one request at a time) is one insert; a
                    // batch is one transaction.
                    let written = store
                        .run(move |s| match entries.as_slice() {
                            [one] => s.audit(one),
                            all => s.audit_many(all),
                        })
                        .await;
                    if let Err(e) = written {
                        // While the store is down or full every batch fails: one line per
                        // 10 s says so, counting the records lost since the last one.
                        lost += n;
                        if warned.is_none_or(|t: std::time::Instant| {
                            t.elapsed() >= std::time::Duration::from_secs(10)
                        }) {
                            warned = Some(std::time::Instant::now());
                            tracing::warn!(error = %e, records = lost, "audit records not written");
                            lost = 0;
                        }
                    }
                }
                for ack in acks.drain(..) {
                    let _ = ack.send(());
                }
            }
        });
        AuditWriter { tx }
    }

    /// Queues `entry`; never waits.
    pub(crate) fn record(&self, entry: AuditEntry) {
        if self.tx.send(Msg::Entry(entry)).is_err() {
            tracing::warn!("the audit writer has stopped; a record was dropped");
        }
    }

    /// Waits until every record queued before this call is written (or failed and logged).
    pub(crate) async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Msg::Flush(ack)).is_ok() {
            let _ = done.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use sessionbox_core::TenantId;
    use sessionbox_store::AuditFilter;

    #[tokio::test]
    async fn every_queued_record_is_written_by_the_time_flush_returns() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let w = AuditWriter::start(store.clone());
        for i in 0..1500 {
            w.record(AuditEntry {
                at: Utc::now(),
                tenant: TenantId::new("t").unwrap(),
                conversation_key: None,
                operation: "http.exec".into(),
                outcome: "ok".into(),
                detail: Some(format!("n={i}")),
            });
        }
        w.flush().await;
        let log = store.audit_log(&AuditFilter::default()).unwrap();
        assert_eq!(log.len(), 1500);
        // A flush with nothing queued returns too.
        w.flush().await;
    }
}
