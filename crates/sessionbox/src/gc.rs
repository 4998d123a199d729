//! `sessionbox gc`: what a garbage collection found and removed.

/// Prints `report` as text, or as JSON.
pub(crate) fn print_gc(report: &sessionbox_manager::GcReport, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    let verb = if report.dry_run { "found" } else { "removed" };
    outln!(
        "garbage collection on the {} runtime{}: {} expired, {} stuck, {} orphan(s), {} dangling \
         record(s); {} {verb}",
        report.runtime,
        if report.dry_run { " (dry run)" } else { "" },
        report.expired.len(),
        report.stuck.len(),
        report.orphans.len(),
        report.dangling.len(),
        if report.dry_run {
            report.found()
        } else {
            report.removed()
        },
    );
    if !report.idle_stopped.is_empty() {
        outln!(
            "idle sandboxes (the workspace stays; the next use starts it again): {} {}",
            if report.dry_run {
                report.idle_stopped.len()
            } else {
                report.stopped()
            },
            if report.dry_run { "to stop" } else { "stopped" },
        );
    }
    if !report.snapshots_expired.is_empty() || report.snapshot_files_removed > 0 {
        outln!(
            "snapshots past retention: {} {} ({}); snapshot files no record names or left \
             temporary: {} {}",
            report.snapshots_expired.len(),
            verb,
            report.snapshots_expired.join(", "),
            report.snapshot_files_removed,
            verb,
        );
    }
    let p = &report.logs_pruned;
    if p.total() > 0 {
        outln!(
            "logs pruned: {} egress verdict row(s) past retention, {} over a tenant's cap; {} \
             audit record(s) past retention, {} over a tenant's cap",
            p.egress_expired,
            p.egress_over_cap,
            p.audit_expired,
            p.audit_over_cap
        );
    }
    for (kind, items) in [
        ("expired", &report.expired),
        ("stuck", &report.stuck),
        ("orphan", &report.orphans),
        ("dangling", &report.dangling),
        ("idle", &report.idle_stopped),
    ] {
        for i in items {
            outln!(
                "  {kind:<8} {} {}{} processes={}{}",
                &i.key[..16],
                i.tenant
                    .as_deref()
                    .map(|t| format!("{t}/"))
                    .unwrap_or_default(),
                i.conversation.as_deref().unwrap_or("(no record)"),
                i.processes,
                i.note
                    .as_deref()
                    .map(|n| format!(" [{n}]"))
                    .unwrap_or_default(),
            );
        }
    }
    Ok(())
}
