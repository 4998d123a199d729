//! `sessionbox conversations`: the tenant's (or every tenant's) conversations, as a table or
//! JSON.

use std::time::Duration;

/// Prints `records` as a table, or as JSON (times in RFC 3339, durations in seconds).
pub(crate) fn print_conversations(
    records: &[sessionbox_store::ConversationRecord],
    json: bool,
) -> anyhow::Result<()> {
    let t = |d: chrono::DateTime<chrono::Utc>| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs());
    // A record past its expiry shows as expired: its files go at the next use or collection.
    let now = chrono::Utc::now();
    if json {
        let v: Vec<_> = records
            .iter()
            .map(|r| {
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
                })
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let dur =
        |d: Option<Duration>| d.map_or_else(|| "-".to_owned(), |d| format!("{}s", d.as_secs()));
    outln!(
        "{:<16} {:<28} {:<11} {:<10} {:<20} {:<20} {:<20} {:>7} {:>9} {:>9}",
        "TENANT",
        "CONVERSATION",
        "RUNTIME",
        "STATE",
        "CREATED",
        "LAST USED",
        "EXPIRES",
        "IDLE",
        "TTL",
        "MAX LIFE"
    );
    for r in records {
        outln!(
            "{:<16} {:<28} {:<11} {:<10} {:<20} {:<20} {:<20} {:>7} {:>9} {:>9}",
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
        );
    }
    Ok(())
}
