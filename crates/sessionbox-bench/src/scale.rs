//! Throughput of one runtime at several numbers of concurrent conversations, through the
//! library, for `sessionbox bench`.
//!
//! For each level `c`: `c` new conversations are opened (untimed), then each runs `execs`
//! execs of `true` one after another, all `c` at once. Reported per level: execs per second of
//! wall time and the p50/p95/p99 of one exec. A 1 MiB write plus read of the same file on a warm
//! conversation is measured here too, and the store's operations per second.

use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;
use chrono::Utc;
use serde_json::{Value, json};
use sessionbox_core::{ConversationId, ConversationRef, ExecRequest, Session, TenantId};
use sessionbox_store::{AuditEntry, Store};

use crate::stats::ms;

/// Nearest-rank percentiles (ms, to the microsecond) of `v`.
pub(crate) fn percentiles(mut v: Vec<f64>) -> Value {
    if v.is_empty() {
        return Value::Null;
    }
    v.sort_by(f64::total_cmp);
    let p = |q: f64| (v[((v.len() as f64 - 1.0) * q).round() as usize] * 1000.0).round() / 1000.0;
    json!({"count": v.len(), "p50_ms": p(0.5), "p95_ms": p(0.95), "p99_ms": p(0.99), "max_ms": p(1.0)})
}

/// Fails unless `r` is a successful run of `true`.
pub(crate) fn check_true(r: &sessionbox_core::ExecResult) -> anyhow::Result<()> {
    if !r.success() {
        bail!(
            "`true` failed with {} ({})",
            r.shell_exit_code(),
            String::from_utf8_lossy(&r.stderr).trim()
        );
    }
    Ok(())
}

/// Throughput at each of `levels` concurrent conversations, on sessions that `open` makes from
/// a conversation (through the library or a client). Conversations named `{prefix}-c{level}-{i}`
/// are pushed to `created` before they are opened, so the caller destroys them whatever
/// happens.
pub(crate) async fn throughput<S, F, Fut>(
    tenant: &TenantId,
    prefix: &str,
    levels: &[usize],
    execs: usize,
    created: &mut Vec<ConversationRef>,
    open: F,
) -> anyhow::Result<Value>
where
    S: Session + 'static,
    F: Fn(ConversationRef) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<S>>,
{
    let mut out = Vec::new();
    for &c in levels {
        let mut sessions = Vec::with_capacity(c);
        for i in 0..c {
            let conv = ConversationRef::new(
                tenant.clone(),
                ConversationId::new(format!("{prefix}-c{c}-{i:04}"))?,
            );
            created.push(conv.clone());
            let s = open(conv).await?;
            check_true(&s.exec(ExecRequest::new("true")).await?)?;
            sessions.push(Arc::new(s));
        }
        let t0 = Instant::now();
        let mut tasks = Vec::with_capacity(c);
        for s in &sessions {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(execs);
                for _ in 0..execs {
                    let t = Instant::now();
                    check_true(&s.exec(ExecRequest::new("true")).await?)?;
                    lat.push(ms(t));
                }
                Ok::<_, anyhow::Error>(lat)
            }));
        }
        let mut lat = Vec::with_capacity(c * execs);
        for t in tasks {
            lat.extend(t.await??);
        }
        let wall = t0.elapsed().as_secs_f64();
        for s in sessions {
            if let Ok(s) = Arc::try_unwrap(s) {
                Box::new(s).close().await?;
            }
        }
        out.push(json!({
            "concurrency": c,
            "execs": lat.len(),
            "wall_s": (wall * 1000.0).round() / 1000.0,
            "throughput_execs_per_s": ((lat.len() as f64 / wall) * 10.0).round() / 10.0,
            "latency": percentiles(lat),
        }));
    }
    Ok(Value::Array(out))
}

/// A 1 MiB write followed by a read of it, `n` times, on `session`.
pub(crate) async fn file_mib(session: &dyn Session, n: usize) -> anyhow::Result<Value> {
    let data: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    let (mut write, mut read, mut both) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        session.write("bench-1mib.bin", &data).await?;
        let w = ms(t);
        let t = Instant::now();
        let back = session.read("bench-1mib.bin").await?;
        let r = ms(t);
        if back != data {
            bail!("the 1 MiB file read back differs from what was written");
        }
        write.push(w);
        read.push(r);
        both.push(w + r);
    }
    Ok(
        json!({"write": percentiles(write), "read": percentiles(read), "write_plus_read": percentiles(both)}),
    )
}

/// Store operations per second on `store` (the bench's own store): insert-if-absent of new
/// records, lookups, touches and audit appends, `n` of each, one after another. The records it
/// makes are deleted again.
pub(crate) fn store_ops(
    store: &Store,
    tenant: &TenantId,
    run_id: &str,
    n: usize,
) -> anyhow::Result<Value> {
    let convs: Vec<ConversationRef> = (0..n)
        .map(|i| {
            Ok(ConversationRef::new(
                tenant.clone(),
                ConversationId::new(format!("bench-{run_id}-store-{i:05}"))?,
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let rate = |t: Instant| ((n as f64 / t.elapsed().as_secs_f64()) * 10.0).round() / 10.0;
    let t = Instant::now();
    for c in &convs {
        store.get_or_create(c, "bench", Utc::now())?;
    }
    let create = rate(t);
    let t = Instant::now();
    for c in &convs {
        store.get(&c.key)?;
    }
    let get = rate(t);
    let t = Instant::now();
    for c in &convs {
        store.touch(&c.key, Utc::now())?;
    }
    let touch = rate(t);
    let t = Instant::now();
    for c in &convs {
        store.audit(&AuditEntry {
            at: Utc::now(),
            tenant: tenant.clone(),
            conversation_key: Some(c.key.clone()),
            operation: "bench".into(),
            outcome: "ok".into(),
            detail: None,
        })?;
    }
    let audit = rate(t);
    for c in &convs {
        store.delete(&c.key)?;
    }
    Ok(json!({
        "backend": "sqlite",
        "operations_each": n,
        "create_per_s": create,
        "get_per_s": get,
        "touch_per_s": touch,
        "audit_append_per_s": audit,
    }))
}
