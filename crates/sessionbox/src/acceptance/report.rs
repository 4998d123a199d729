//! How `verify --acceptance` reports: the closing section (what the results let one conclude
//! and what they do not) and the Markdown table.

use std::collections::BTreeMap;

use serde_json::json;

use super::Row;
use super::probes::Verdict;

/// The closing section: what a passing checklist lets one conclude, and what it does not.
pub(super) fn conclusions(rows: &[Row]) -> serde_json::Value {
    let names = |v: Verdict| -> Vec<&str> {
        rows.iter()
            .filter(|r| r.verdict == v)
            .map(|r| r.name)
            .collect()
    };
    let (failed, unenforced, unmeasured) = (
        names(Verdict::Fail),
        names(Verdict::NotEnforced),
        names(Verdict::NotMeasured),
    );
    let mut conclude = vec![
        "Each passing row is a control observed holding, from inside a real conversation, on this host, kernel and configuration, at the time of this run.".to_owned(),
    ];
    if failed.is_empty() && unenforced.is_empty() && unmeasured.is_empty() {
        conclude.push("Every control was observed: a command that stays within the kernel's and the runtime's documented behaviour cannot reach another conversation, the host's network directly, or the caller's secrets, nor exceed its limits.".to_owned());
    }
    let mut not = vec![
        "Nothing about a kernel bug: a probe uses the kernel's interfaces as documented; an exploit of the kernel (or of the container runtime) escapes every row at once.".to_owned(),
        "Nothing about a malicious image or root file system: the probes run the tools the sandbox has and trust what they print.".to_owned(),
        "Nothing about a compromised server or host: whoever controls the sessionbox process, the OpenSandbox or AIO server, or the host, controls every conversation.".to_owned(),
        "Nothing about side channels (timing, cache, shared CPU), denial of service by a neighbour below the limits, or egress allowed by a policy.".to_owned(),
        "Limits were measured with bounded probes at the configured values; other settings, a heavier load or another host need their own run.".to_owned(),
    ];
    if !failed.is_empty() {
        not.insert(
            0,
            format!(
                "The runtime claims, but did not show: {}.",
                failed.join(", ")
            ),
        );
    }
    if !unenforced.is_empty() {
        not.insert(0, format!("This runtime does not enforce: {}; treat commands as able to do what those rows describe.", unenforced.join(", ")));
    }
    if !unmeasured.is_empty() {
        not.push(format!(
            "Not measured in this run: {}.",
            unmeasured.join(", ")
        ));
    }
    json!({"lets_you_conclude": conclude, "does_not": not})
}

pub(super) fn markdown(r: &serde_json::Value, rows: &[Row]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let e = &r["environment"];
    let _ = writeln!(
        s,
        "# sessionbox verify --acceptance: {}\n",
        if r["ok"] == true { "PASS" } else { "FAIL" }
    );
    let _ = writeln!(
        s,
        "- runtime `{}`: {}\n- started {} ({} ms); sessionbox {}; kernel {} ({} cores)\n",
        r["runtime"].as_str().unwrap_or(""),
        r["runtime_info"]["boundary"].as_str().unwrap_or(""),
        r["started"].as_str().unwrap_or(""),
        r["duration_ms"],
        e["sessionbox_version"].as_str().unwrap_or(""),
        e["kernel"].as_str().unwrap_or(""),
        e["cores"]
    );
    let _ = writeln!(s, "| row | control | result | measured |");
    let _ = writeln!(s, "|---|---|---|---|");
    for row in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            row.name,
            row.control,
            row.verdict.phrase(),
            row.detail.replace('|', "\\|")
        );
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for row in rows {
        *counts.entry(row.verdict.phrase()).or_default() += 1;
    }
    let _ = writeln!(
        s,
        "\n{}\n",
        counts
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (title, key) in [
        ("What this lets you conclude", "lets_you_conclude"),
        ("What it does not", "does_not"),
    ] {
        let _ = writeln!(s, "## {title}\n");
        for line in r["conclusions"][key].as_array().into_iter().flatten() {
            let _ = writeln!(s, "- {}", line.as_str().unwrap_or(""));
        }
        let _ = writeln!(s);
    }
    s
}
