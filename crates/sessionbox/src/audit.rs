//! `sessionbox audit`: the audit log, newest first.

use std::path::Path;
use std::process::ExitCode;

use chrono::{DateTime, Utc};
use sessionbox_core::{ConversationId, ConversationKey, TenantId};
use sessionbox_store::{AuditFilter, Store};

use crate::UsageError;

/// Arguments of `sessionbox audit`.
#[derive(Debug, clap::Args)]
pub(crate) struct AuditArgs {
    /// Only this conversation of the tenant (--tenant).
    #[arg(long, short = 'c', value_name = "ID")]
    conversation: Option<String>,
    /// Only entries at or after TIME: RFC 3339 (`2026-11-29T15:00:00Z`) or an age such as
    /// `90s`, `15m`, `2h`, `7d`.
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Every tenant's entries (not with --conversation).
    #[arg(long, conflicts_with = "conversation")]
    all_tenants: bool,
    /// At most this many entries (the newest).
    #[arg(long, default_value_t = 1000)]
    limit: usize,
    /// As a JSON array of records (`id`, `at`, `tenant`, `conversation_key`, `operation`,
    /// `outcome`, `detail`).
    #[arg(long)]
    json: bool,
}

/// Parses `--since`: an RFC 3339 time, or an age before `now`.
///
/// # Errors
/// A [`UsageError`] naming both accepted forms.
pub(crate) fn parse_since(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, UsageError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let age = humantime::parse_duration(text).map_err(|e| {
        UsageError(format!(
            "--since {text:?} is neither an RFC 3339 time (2026-11-29T15:00:00Z) nor an age \
             such as 15m, 2h or 7d: {e}"
        ))
    })?;
    let age = chrono::Duration::from_std(age)
        .map_err(|_| UsageError(format!("--since {text:?} is too far back")))?;
    now.checked_sub_signed(age)
        .ok_or_else(|| UsageError(format!("--since {text:?} is too far back")))
}

/// Runs `sessionbox audit` on the store of `data_dir`. Reads only: a data directory without a
/// store prints an empty log and creates nothing.
pub(crate) fn run(
    args: &AuditArgs,
    data_dir: &Path,
    store_url: Option<&str>,
    tenant: &TenantId,
) -> anyhow::Result<ExitCode> {
    let key = match &args.conversation {
        Some(id) => Some(ConversationKey::derive(tenant, &ConversationId::new(id)?)),
        None => None,
    };
    let since = match &args.since {
        Some(s) => Some(parse_since(s, Utc::now())?),
        None => None,
    };
    let db = data_dir.join("sessionbox.db");
    let records = if db.exists() || store_url.is_some() {
        Store::open_configured(store_url, &db)?.audit_log(&AuditFilter {
            tenant: (!args.all_tenants).then(|| tenant.clone()),
            key,
            since,
            limit: Some(args.limit),
        })?
    } else {
        Vec::new()
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&records)?);
        return Ok(ExitCode::SUCCESS);
    }
    // A reader that stops early (`| head`) ends the output, not the program.
    match print_table(records) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r?,
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(records: Vec<sessionbox_store::AuditRecord>) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<24} {:<16} {:<12} {:<14} {:<20} DETAIL",
        "AT", "TENANT", "CONVERSATION", "OPERATION", "OUTCOME"
    )?;
    for r in records {
        let e = r.entry;
        let key = e
            .conversation_key
            .as_ref()
            .map_or("-", |k| &k.as_str()[..12]);
        writeln!(
            out,
            "{:<24} {:<16} {:<12} {:<14} {:<20} {}",
            e.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            e.tenant.as_str(),
            key,
            e.operation,
            e.outcome,
            e.detail.as_deref().unwrap_or("")
        )?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_rfc3339_or_an_age_and_names_both_forms_otherwise() {
        let now = DateTime::parse_from_rfc3339("2026-11-29T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let t = parse_since("2026-11-28T01:02:03+01:00", now).unwrap();
        assert_eq!(t.to_rfc3339(), "2026-11-28T00:02:03+00:00");
        assert_eq!(
            parse_since("90m", now).unwrap().to_rfc3339(),
            "2026-11-29T10:30:00+00:00"
        );
        assert_eq!(
            parse_since("7d", now).unwrap().to_rfc3339(),
            "2026-11-22T12:00:00+00:00"
        );
        for bad in ["", "yesterday", "15", "-5m", "2026-13-01T00:00:00Z"] {
            let e = parse_since(bad, now).unwrap_err().0;
            assert!(e.contains("RFC 3339") && e.contains("15m"), "{bad:?}: {e}");
        }
        assert!(parse_since("100000000000y", now).is_err());
    }
}
