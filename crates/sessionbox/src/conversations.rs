//! `sessionbox conversations`: the tenant's (or every tenant's) conversations, as a table or
//! JSON.

use std::time::Duration;

use sessionbox_core::{DiskUsage, Runtime};

/// Each record's disk usage against its quota ([`Runtime::disk_usage`]), for the records of
/// `runtime`; `None` for the others, for conversations without a quota, and where it cannot be
/// read (a listing never fails for it).
pub(crate) async fn disk_usages(
    runtime: &dyn Runtime,
    records: &[sessionbox_store::ConversationRecord],
) -> Vec<Option<DiskUsage>> {
    let name = runtime.info().name;
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        out.push(match r.runtime == name {
            true => runtime.disk_usage(&r.key).await.ok().flatten(),
            false => None,
        });
    }
    out
}

/// `used/limit` in MiB (one decimal), or `-`.
fn disk_cell(d: Option<&DiskUsage>) -> String {
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    d.map_or_else(
        || "-".to_owned(),
        |d| format!("{:.1}/{:.0}M", mib(d.bytes_used), mib(d.bytes_limit)),
    )
}

/// Prints `records` as a table, or as JSON (times in RFC 3339, durations in seconds), with
/// each one's disk usage from `disks` (same order; bytes and inodes used and allowed). A record
/// past its expiry at `now` (the store's clock) shows as expired.
pub(crate) fn print_conversations(
    records: &[sessionbox_store::ConversationRecord],
    disks: &[Option<DiskUsage>],
    now: chrono::DateTime<chrono::Utc>,
    json: bool,
) -> anyhow::Result<()> {
    let disk = |i: usize| disks.get(i).copied().flatten();
    let t = |d: chrono::DateTime<chrono::Utc>| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs());
    // A record past its expiry shows as expired: its files go at the next use or collection.
    if json {
        let v: Vec<_> = records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                serde_json::json!({
                    "tenant": r.tenant.as_str(),
                    "id": r.conversation_id.as_str(),
                    "key": r.key.as_str(),
                    "runtime": r.runtime,
                    "state": r.status(now),
                    "created_at": t(r.created_at),
                    "last_used_at": t(r.last_used_at),
                    "expires_at": r.expires_at.map(t),
                    "idle_timeout_secs": secs(r.idle_timeout),
                    "ttl_secs": secs(r.ttl),
                    "max_lifetime_secs": secs(r.max_lifetime),
                    "disk": disk(i).map(|d| serde_json::json!({
                        "bytes_used": d.bytes_used,
                        "bytes_limit": d.bytes_limit,
                        "inodes_used": d.inodes_used,
                        "inodes_limit": d.inodes_limit,
                    })),
                })
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let dur =
        |d: Option<Duration>| d.map_or_else(|| "-".to_owned(), |d| format!("{}s", d.as_secs()));
    outln!(
        "{:<16} {:<28} {:<11} {:<10} {:<20} {:<20} {:<20} {:>7} {:>9} {:>9} {:>14} {:>13}",
        "TENANT",
        "CONVERSATION",
        "RUNTIME",
        "STATE",
        "CREATED",
        "LAST USED",
        "EXPIRES",
        "IDLE",
        "TTL",
        "MAX LIFE",
        "DISK",
        "FILES"
    );
    for (i, r) in records.iter().enumerate() {
        let d = disk(i);
        outln!(
            "{:<16} {:<28} {:<11} {:<10} {:<20} {:<20} {:<20} {:>7} {:>9} {:>9} {:>14} {:>13}",
            r.tenant.as_str(),
            r.conversation_id.as_str(),
            r.runtime,
            r.status(now),
            t(r.created_at),
            t(r.last_used_at),
            r.expires_at.map_or_else(|| "never".to_owned(), t),
            dur(r.idle_timeout),
            dur(r.ttl),
            dur(r.max_lifetime),
            disk_cell(d.as_ref()),
            d.map_or_else(
                || "-".to_owned(),
                |d| format!("{}/{}", d.inodes_used, d.inodes_limit)
            ),
        );
    }
    Ok(())
}
