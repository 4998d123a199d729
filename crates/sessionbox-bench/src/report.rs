//! The verdicts against the targets, the machine a run was on, and the plots.

use std::path::Path;

use serde_json::{Value, json};
use sessionbox::config::RuntimeKind;

use crate::stats::Stats;

/// Cold start p50 target, ms.
const COLD_START_P50_MS: f64 = 20.0;
/// Cold start from the warm pool, p50, at most this many times the bare spawn's p50 (issue
/// 20: about 5 ms on a 2-core machine).
const POOLED_COLD_START_RATIO: f64 = 6.0;
/// Warm exec p50 target, ms.
const WARM_EXEC_P50_MS: f64 = 2.0;
/// Warm exec p50 target, as a multiple of the baseline p50 (issue 20).
const WARM_EXEC_RATIO: f64 = 1.5;
/// The opensandbox runtime's warm exec p50 target, ms (issue 20: absolute, since the time is
/// the network's and the server's, which no local baseline measures).
const REMOTE_WARM_EXEC_P50_MS: f64 = 5.0;
/// The opensandbox runtime's cold start from its warm pool, p50 target, ms (issue 20).
const REMOTE_POOLED_COLD_START_P50_MS: f64 = 100.0;
/// Agent resident memory target, MiB.
const AGENT_RSS_MIB: f64 = 10.0;

/// Draws the concurrency plots into `dir`; the Markdown lines that name them (or say why not).
pub(crate) fn plots(r: &Value, dir: &Path) -> String {
    use crate::plot::{Series, plot};
    let mut latency = Vec::new();
    let mut throughput = Vec::new();
    for (rt, v) in r["results"].as_object().into_iter().flatten() {
        let mut add = |label: String, levels: &Value| {
            let pts = |f: &dyn Fn(&Value) -> Option<f64>| -> Vec<(f64, f64)> {
                levels
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|l| Some((l["concurrency"].as_f64()?, f(l)?)))
                    .collect()
            };
            latency.push(Series {
                label: format!("{label} p50"),
                points: pts(&|l| l["latency"]["p50_ms"].as_f64()),
            });
            latency.push(Series {
                label: format!("{label} p99"),
                points: pts(&|l| l["latency"]["p99_ms"].as_f64()),
            });
            throughput.push(Series {
                label,
                points: pts(&|l| l["throughput_execs_per_s"].as_f64()),
            });
        };
        add(format!("{rt} library"), &v["throughput"]);
        if v["http"]["throughput"].is_array() {
            add(format!("{rt} HTTP"), &v["http"]["throughput"]);
        }
    }
    let mut md = String::from("\nPlots:\n");
    for (file, title, y, series) in [
        (
            "latency_vs_concurrency.png",
            "exec `true`: latency against concurrency",
            "ms",
            &latency,
        ),
        (
            "throughput_vs_concurrency.png",
            "exec `true`: throughput against concurrency",
            "execs/s",
            &throughput,
        ),
    ] {
        match plot(&dir.join(file), title, y, series) {
            Ok(()) => md.push_str(&format!("- {file}\n")),
            Err(e) => md.push_str(&format!("- {file} not drawn: {e}\n")),
        }
    }
    md
}

pub(crate) fn judge(kind: RuntimeKind, r: &Value, baseline: &Stats) -> Vec<Value> {
    let name = kind.name();
    let target = |id: &str, what: String, value: f64, limit: f64, unit: &str| {
        json!({
            "id": id,
            "runtime": name,
            "target": what,
            "value": value,
            "limit": limit,
            "unit": unit,
            "pass": value <= limit,
        })
    };
    let mut out = Vec::new();
    if kind == RuntimeKind::Opensandbox {
        // A remote server's targets are absolute (issue 20): its time is the network's and the
        // server's, which no local baseline measures.
        if let Some(v) = r["warm_exec"]["p50_ms"].as_f64() {
            out.push(target(
                "remote_warm_exec_p50",
                format!("warm exec p50 <= {REMOTE_WARM_EXEC_P50_MS} ms"),
                v,
                REMOTE_WARM_EXEC_P50_MS,
                "ms",
            ));
        }
        if let Some(v) = r["cold_start_pooled"]["stats"]["p50_ms"].as_f64() {
            out.push(target(
                "remote_cold_start_pooled_p50",
                format!(
                    "cold start from the warm pool p50 <= {REMOTE_POOLED_COLD_START_P50_MS} ms"
                ),
                v,
                REMOTE_POOLED_COLD_START_P50_MS,
                "ms",
            ));
        }
        return out;
    }
    if let Some(v) = r["cold_start"]["stats"]["p50_ms"].as_f64() {
        out.push(target(
            "cold_start_p50",
            format!("cold start p50 <= {COLD_START_P50_MS} ms"),
            v,
            COLD_START_P50_MS,
            "ms",
        ));
    }
    if let Some(v) = r["cold_start_pooled"]["stats"]["ratio_to_baseline_p50"].as_f64() {
        out.push(target(
            "cold_start_pooled_ratio",
            format!(
                "cold start from the warm pool p50 <= {POOLED_COLD_START_RATIO}x bare spawn p50 ({} ms)",
                baseline.p50_ms
            ),
            v,
            POOLED_COLD_START_RATIO,
            "x",
        ));
    }
    if let Some(v) = r["warm_exec"]["p50_ms"].as_f64() {
        out.push(target(
            "warm_exec_p50",
            format!("warm exec p50 <= {WARM_EXEC_P50_MS} ms"),
            v,
            WARM_EXEC_P50_MS,
            "ms",
        ));
        out.push(target(
            "warm_exec_ratio",
            format!(
                "warm exec p50 <= {WARM_EXEC_RATIO}x bare spawn p50 ({} ms)",
                baseline.p50_ms
            ),
            r["warm_exec"]["ratio_to_baseline_p50"]
                .as_f64()
                .unwrap_or(f64::INFINITY),
            WARM_EXEC_RATIO,
            "x",
        ));
    }
    if let Some(v) = r["http"]["round_trip"]["added_p50_ms"].as_f64() {
        out.push(target(
            "http_added_p50",
            format!(
                "HTTP adds <= {} ms to a warm exec's p50",
                crate::http::ADDED_P50_MS
            ),
            v,
            crate::http::ADDED_P50_MS,
            "ms",
        ));
    }
    if let Some(v) = r["http"]["mcp_round_trip"]["added_p50_ms"].as_f64() {
        out.push(target(
            "mcp_added_p50",
            format!(
                "MCP adds <= {} ms to a warm exec's p50 (`bash` tool)",
                crate::mcp::ADDED_P50_MS
            ),
            v,
            crate::mcp::ADDED_P50_MS,
            "ms",
        ));
    }
    if r["cli_call"].is_object() {
        let v = r["cli_call"]["stats"]["ratio_to_baseline_p50"]
            .as_f64()
            .unwrap_or(f64::INFINITY);
        out.push(target(
            "cli_call_ratio",
            format!(
                "a whole CLI call (`sessionbox exec -- true`) p50 <= {}x bare spawn p50 ({} ms)",
                crate::cli::CALL_RATIO,
                baseline.p50_ms
            ),
            v,
            crate::cli::CALL_RATIO,
            "x",
        ));
    }
    if let Some(v) = r["http"]["load"]["errors"].as_f64() {
        out.push(target(
            "http_load_errors",
            format!(
                "zero errors in {} conversations x {} execs from {} clients over HTTP",
                r["http"]["load"]["conversations"],
                r["http"]["load"]["execs_per_conversation"],
                r["http"]["load"]["clients"]
            ),
            v,
            0.0,
            "errors",
        ));
    }
    let live = &r["live"];
    if let Some(v) = live["per_sandbox"]["charged_mib"]["mean"].as_f64() {
        out.push(target(
            "live_charged_per_sandbox",
            format!(
                "memory charged per live sandbox <= {} MiB ({} live, mean of the cgroups' charge)",
                crate::live::CHARGED_PER_SANDBOX_MIB,
                live["live"]
            ),
            v,
            crate::live::CHARGED_PER_SANDBOX_MIB,
            "MiB",
        ));
    }
    if live.is_object() {
        out.push(target(
            "live_exec_ratio",
            format!(
                "exec p50 with {} live <= {}x exec p50 with 1 live",
                live["live"],
                crate::live::EXEC_P50_RATIO
            ),
            live["exec_p50_ratio_n_to_1"]
                .as_f64()
                .unwrap_or(f64::INFINITY),
            crate::live::EXEC_P50_RATIO,
            "x",
        ));
        out.push(target(
            "live_exec_errors",
            format!(
                "every exec succeeds with {} live ({} execs)",
                live["live"], live["samples"]
            ),
            live["exec_errors"].as_f64().unwrap_or(f64::INFINITY),
            0.0,
            "errors",
        ));
    }
    if let Some(v) = r["memory"]["agent_rss_mib"].as_f64() {
        out.push(target(
            "agent_rss",
            format!("agent RSS <= {AGENT_RSS_MIB} MiB"),
            v,
            AGENT_RSS_MIB,
            "MiB",
        ));
    }
    out
}

/// Where the run was, with the build profile and the load average at the start.
pub(crate) fn environment(profile: &str) -> Value {
    let mut env = sessionbox::experiment::environment();
    env["build_profile"] = json!(profile);
    // Other work on the machine skews every number: kept so a noisy run can be spotted.
    env["loadavg"] = json!(
        std::fs::read_to_string("/proc/loadavg").ok().map(|l| l
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "))
    );
    env
}
