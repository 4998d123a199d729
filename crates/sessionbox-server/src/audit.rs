//! The writer of the server's own `http.*` audit records, off the request path.
//!
//! A request hands its record to this writer and answers at once; the writer appends what has
//! queued up in one transaction (so a burst of requests costs one commit, not one each).
//! [`AuditWriter::flush`] waits until everything handed over before it is written; `serve`
//! flushes when it stops. The price: a process that is killed can lose the `http.*` records of
//! its last moments. The operation records that the manager writes (`open`, `exec`, `write`,
//! ...) are written before the operation's answer, so no operation goes unrecorded.

use sessionbox_store::{AuditEntry, Store};
use tokio::sync::{mpsc, oneshot};

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
                    let store = store.clone();
                    let entries = std::mem::take(&mut batch);
                    let n = entries.len();
                    match tokio::task::spawn_blocking(move || store.audit_many(&entries)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, records = n, "audit records not written")
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, records = n, "audit writer task failed")
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
