//! The Markdown report, from the JSON one.

use std::fmt::Write;

use serde_json::Value;

/// The Markdown report of the JSON report `r`.
pub(crate) fn markdown(r: &Value) -> String {
    let mut s = String::new();
    header(&mut s, r);
    latency_table(&mut s, r);
    http_sections(&mut s, r);
    memory_sections(&mut s, r);
    live_sections(&mut s, r);
    instructions(&mut s, r);
    s.push_str(&markdown_more(r));
    targets(&mut s, r);
    s
}

/// A number as reported, or `-` when there is none.
fn num(v: &Value) -> String {
    match v.as_f64() {
        Some(f) => format!("{f}"),
        None => "-".to_owned(),
    }
}

/// The runtimes the report measured, in order.
fn runtimes(r: &Value) -> Vec<&str> {
    r["runtimes"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The title (every target met or not), the build and the machine.
fn header(s: &mut String, r: &Value) {
    let _ = writeln!(
        s,
        "# sessionbox bench: {}",
        if r["targets_met"] == true {
            "every target met"
        } else {
            "TARGETS MISSED"
        }
    );
    let _ = writeln!(s);
    if r["build_profile"] != "release" {
        let _ = writeln!(
            s,
            "**WARNING: DEBUG BUILD. These numbers are not meaningful; run `cargo run --release -p sessionbox-bench`.**"
        );
        let _ = writeln!(s);
    }
    let e = &r["environment"];
    let it = &r["iterations"];
    let _ = writeln!(
        s,
        "- started {} ({} ms); sessionbox {} ({} build)",
        r["started"].as_str().unwrap_or(""),
        r["duration_ms"],
        e["sessionbox_version"].as_str().unwrap_or(""),
        r["build_profile"].as_str().unwrap_or(""),
    );
    let _ = writeln!(
        s,
        "- {} / kernel {} / {} / {} ({} cores); load average at start {}",
        e["os"].as_str().unwrap_or(""),
        e["kernel"].as_str().unwrap_or(""),
        e["arch"].as_str().unwrap_or(""),
        e["cpu"].as_str().unwrap_or("unknown CPU"),
        e["cores"],
        e["loadavg"].as_str().unwrap_or("unknown"),
    );
    let _ = writeln!(
        s,
        "- {} warm iterations (after {} warm-up), {} cold starts per runtime {} ms apart; runtimes: {}",
        it["warm"],
        it["warmup"],
        it["cold"],
        it["cold_pause_ms"],
        r["runtimes"]
            .as_array()
            .map(|a| a
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
    );
}

/// The latency of every measurement of every runtime against the baseline.
fn latency_table(s: &mut String, r: &Value) {
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| measurement | count | p50 ms | p95 ms | x baseline p50 |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|");
    let b = &r["baseline"]["stats"];
    let _ = writeln!(
        s,
        "| baseline: spawn `/bin/sh -c true` | {} | {} | {} | 1 |",
        b["count"],
        num(&b["p50_ms"]),
        num(&b["p95_ms"])
    );
    let row = |s: &mut String, label: String, st: &Value| {
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {} |",
            st["count"],
            num(&st["p50_ms"]),
            num(&st["p95_ms"]),
            num(&st["ratio_to_baseline_p50"]),
        );
    };
    for rt in &runtimes(r) {
        let v = &r["results"][*rt];
        let rows: [(&str, &Value); 13] = [
            ("cold start (open + first exec)", &v["cold_start"]["stats"]),
            (
                "cold start from the warm pool",
                &v["cold_start_pooled"]["stats"],
            ),
            (
                "whole CLI call `sessionbox exec -- true`",
                &v["cli_call"]["stats"],
            ),
            ("cold start: open", &v["cold_start"]["phases"]["open"]),
            (
                "cold start: first exec",
                &v["cold_start"]["phases"]["first_exec"],
            ),
            ("warm exec `true`", &v["warm_exec"]),
            ("warm 4 KiB write + read", &v["file_write_read_4k"]["stats"]),
            (
                "warm open (existing conversation)",
                &v["warm_open"]["stats"],
            ),
            (
                "breakdown: exec without manager/audit",
                &v["breakdown"]["exec_without_manager"]["stats"],
            ),
            (
                "breakdown: execd HTTP round trip (ping)",
                &v["breakdown"]["http_ping"]["stats"],
            ),
            (
                "breakdown: execd client build",
                &v["breakdown"]["execd_client_build"]["stats"],
            ),
            (
                "breakdown: one fork+exec in the workspace",
                &v["breakdown"]["fork_exec_in_workspace"]["stats"],
            ),
            (
                "destroy (not part of cold start)",
                &v["cold_start"]["destroy_untimed"],
            ),
        ];
        for (label, st) in rows {
            if st.is_object() {
                row(s, format!("{rt}: {label}"), st);
            }
        }
    }
}

/// Each runtime over HTTP and MCP: the round trip and the load test.
fn http_sections(s: &mut String, r: &Value) {
    for rt in &runtimes(r) {
        let h = &r["results"][*rt]["http"];
        if h.is_object() {
            let rt_ = &h["round_trip"];
            let l = &h["load"];
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "{rt} over HTTP: warm exec `true` p50 {} ms through the library, {} ms through HTTP: {} ms added (target <= {} ms)",
                num(&rt_["library"]["p50_ms"]),
                num(&rt_["http"]["p50_ms"]),
                num(&rt_["added_p50_ms"]),
                num(&rt_["target_added_p50_ms"]),
            );
            let m = &h["mcp_round_trip"];
            if m.is_object() {
                let _ = writeln!(s);
                let _ = writeln!(
                    s,
                    "{rt} over MCP (`bash` tool, streamable HTTP): p50 {} ms, p99 {} ms; library p50 {} ms in the same iterations: {} ms added",
                    num(&m["mcp"]["p50_ms"]),
                    num(&m["mcp"]["p99_ms"]),
                    num(&m["library"]["p50_ms"]),
                    num(&m["added_p50_ms"]),
                );
            }
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "{rt} HTTP load: {} conversations x {} execs from {} clients: {} ok, {} errors, {} execs/s over {} s",
                l["conversations"],
                l["execs_per_conversation"],
                l["clients"],
                l["execs_ok"],
                l["errors"],
                num(&l["throughput_execs_per_s"]),
                num(&l["wall_s"]),
            );
            let _ = writeln!(s);
            let _ = writeln!(s, "| HTTP exec | count | p50 ms | p95 ms | p99 ms |");
            let _ = writeln!(s, "|---|---|---|---|---|");
            for (label, st) in [
                ("round trip, library", &rt_["library"]),
                ("round trip, HTTP", &rt_["http"]),
                ("load: every exec", &l["all"]),
                ("load: first exec (creates)", &l["first_exec_with_create"]),
                ("load: later execs", &l["later_execs"]),
            ] {
                if st.is_object() {
                    let _ = writeln!(
                        s,
                        "| {label} | {} | {} | {} | {} |",
                        st["count"],
                        num(&st["p50_ms"]),
                        num(&st["p95_ms"]),
                        num(&st["p99_ms"]),
                    );
                }
            }
        }
    }
}

/// The memory of each runtime's sandbox, per process.
fn memory_sections(s: &mut String, r: &Value) {
    for rt in &runtimes(r) {
        let m = &r["results"][*rt]["memory"];
        if m.is_object() {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "{rt} memory: agent RSS {} MiB (PSS {}), sandbox total RSS {} MiB, cgroup memory {} MiB",
                num(&m["agent_rss_mib"]),
                num(&m["agent_pss_mib"]),
                num(&m["sandbox_rss_mib"]),
                num(&m["cgroup_memory_mib"]),
            );
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "| process | pid | RSS KiB | anon KiB | file KiB | threads |"
            );
            let _ = writeln!(s, "|---|---|---|---|---|---|");
            for p in m["processes"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} |",
                    p["role"].as_str().unwrap_or(""),
                    p["pid"],
                    p["rss_kib"],
                    p["rss_anon_kib"],
                    p["rss_file_kib"],
                    p["threads"],
                );
            }
        }
    }
}

/// The density measurement of each runtime that has one: N live at once.
fn live_sections(s: &mut String, r: &Value) {
    for rt in &runtimes(r) {
        let l = &r["results"][*rt]["live"];
        if !l.is_object() {
            continue;
        }
        let p = &l["per_sandbox"];
        let h = &l["host"];
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{rt}: {} conversations live at once, opened one after another in {} s (open p50 {} ms, p99 {} ms), destroyed in {} s; {} sandboxes still up at the end",
            l["live"],
            num(&l["open_all"]["wall_s"]),
            num(&l["open_all"]["each"]["p50_ms"]),
            num(&l["open_all"]["each"]["p99_ms"]),
            num(&l["destroy_all_s"]),
            p["sandboxes_up"],
        );
        let _ = writeln!(s);
        let _ = writeln!(s, "| {rt} live | count | p50 ms | p95 ms | p99 ms |");
        let _ = writeln!(s, "|---|---|---|---|---|");
        for (label, st) in [
            ("1 live: open", &l["one_live"]["open"]),
            ("1 live: exec `true`", &l["one_live"]["exec"]),
            ("N live: open (random one)", &l["n_live"]["open"]),
            ("N live: exec `true` (random one)", &l["n_live"]["exec"]),
        ] {
            let _ = writeln!(
                s,
                "| {label} | {} | {} | {} | {} |",
                st["count"],
                num(&st["p50_ms"]),
                num(&st["p95_ms"]),
                num(&st["p99_ms"]),
            );
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "Exec p50 with N live / with 1 live: {}x; exec errors: {}",
            num(&l["exec_p50_ratio_n_to_1"]),
            l["exec_errors"],
        );
        let _ = writeln!(s);
        let _ = writeln!(s, "| per live sandbox | mean | p50 | max | read from |");
        let _ = writeln!(s, "|---|---|---|---|---|");
        for (label, k, from) in [
            ("RSS MiB", "rss_mib", "rss"),
            ("PSS MiB", "pss_mib", "pss"),
            ("cgroup charge MiB", "charged_mib", "charged"),
            ("processes", "processes", ""),
            ("threads (all its processes)", "threads", "threads"),
            ("agent threads", "agent_threads", "threads"),
        ] {
            let _ = writeln!(
                s,
                "| {label} | {} | {} | {} | {} |",
                num(&p[k]["mean"]),
                num(&p[k]["p50"]),
                num(&p[k]["max"]),
                p["read_from"][from].as_str().unwrap_or(""),
            );
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "Host with N live: {} processes, {} threads (pid_max {}; before: {} and {}): {} processes and {} threads per sandbox; MemAvailable dropped {} MiB per sandbox",
            h["live"]["processes"],
            h["live"]["threads"],
            h["live"]["pid_max"],
            h["before"]["processes"],
            h["before"]["threads"],
            num(&h["processes_per_sandbox"]),
            num(&h["threads_per_sandbox"]),
            num(&h["mem_available_drop_per_sandbox_mib"]),
        );
    }
}

/// The instruction counts of the warm-exec path (callgrind), or why they are missing.
fn instructions(s: &mut String, r: &Value) {
    let i = &r["instructions"];
    let _ = writeln!(s);
    if i["available"] == true {
        let _ = writeln!(
            s,
            "Instructions per warm exec `true` (isolated, calling process, callgrind, K = {}): {} ({} and {} instructions in runs of {} and {} execs)",
            i["k"],
            i["instructions_per_exec"],
            i["runs"][0]["instructions"],
            i["runs"][1]["instructions"],
            i["runs"][0]["execs"],
            i["runs"][1]["execs"],
        );
    } else {
        let _ = writeln!(
            s,
            "Instructions per warm exec: not counted ({})",
            i["reason"].as_str().unwrap_or("")
        );
    }
}

/// The verdict on every target, and what the cleanup found.
fn targets(s: &mut String, r: &Value) {
    let _ = writeln!(s);
    let _ = writeln!(s, "Targets:");
    for t in r["targets"].as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "- {} {}: {} (measured {} {})",
            if t["pass"] == true { "PASS" } else { "FAIL" },
            t["runtime"].as_str().unwrap_or(""),
            t["target"].as_str().unwrap_or(""),
            num(&t["value"]),
            t["unit"].as_str().unwrap_or(""),
        );
    }
    if r["cleanup"]["ok"] != true {
        let _ = writeln!(s);
        let _ = writeln!(s, "Cleanup FAILED:");
        for f in r["cleanup"]["failures"].as_array().into_iter().flatten() {
            let _ = writeln!(s, "- {}", f.as_str().unwrap_or(""));
        }
    }
}

/// The Markdown of the alternatives, throughput, file and store sections.
fn markdown_more(r: &Value) -> String {
    let mut s = String::new();
    let _ = writeln!(s);
    let _ = writeln!(s, "What users would pick instead, same run:");
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| alternative | count | p50 ms | p95 ms | p99 ms | x baseline p50 |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for (name, v) in r["alternatives"].as_object().into_iter().flatten() {
        if v["available"] == true {
            let st = &v["stats"];
            let _ = writeln!(
                s,
                "| {name}: {} | {} | {} | {} | {} | {} |",
                v["what"].as_str().unwrap_or(""),
                st["count"],
                num(&st["p50_ms"]),
                num(&st["p95_ms"]),
                num(&st["p99_ms"]),
                num(&st["ratio_to_baseline_p50"]),
            );
        } else {
            let _ = writeln!(
                s,
                "| {name}: not measured ({}) | | | | | |",
                v["reason"].as_str().unwrap_or("")
            );
        }
    }
    for (rt, v) in r["results"].as_object().into_iter().flatten() {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{rt}: exec `true` throughput by concurrent conversations"
        );
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "| path | conversations | execs | execs/s | p50 ms | p95 ms | p99 ms | x baseline p50 |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        for (path, levels) in [
            ("library", &v["throughput"]),
            ("HTTP", &v["http"]["throughput"]),
        ] {
            for l in levels.as_array().into_iter().flatten() {
                let st = &l["latency"];
                let _ = writeln!(
                    s,
                    "| {path} | {} | {} | {} | {} | {} | {} | {} |",
                    l["concurrency"],
                    l["execs"],
                    num(&l["throughput_execs_per_s"]),
                    num(&st["p50_ms"]),
                    num(&st["p95_ms"]),
                    num(&st["p99_ms"]),
                    num(&st["ratio_to_baseline_p50"]),
                );
            }
        }
        let f = &v["file_1mib"];
        if f.is_object() {
            let _ = writeln!(
                s,
                "\n{rt}: 1 MiB write p50 {} ms, read p50 {} ms, write + read p50 {} ms (p99 {} ms)",
                num(&f["write"]["p50_ms"]),
                num(&f["read"]["p50_ms"]),
                num(&f["write_plus_read"]["p50_ms"]),
                num(&f["write_plus_read"]["p99_ms"]),
            );
        }
        if let Some(rows) = v["snapshots"].as_array().filter(|r| !r.is_empty()) {
            let _ = writeln!(
                s,
                "\n{rt}: snapshots against the workspace's size (x: against `cp -a` of the same files, measured in the same run)\n"
            );
            let _ = writeln!(
                s,
                "| files | MiB | stored MiB | cp -a ms | snapshot ms (x) | fork ms (x) | fork again ms (x) | template open ms (x) | live fork ms (x) |"
            );
            let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
            let mib = |v: &Value| {
                v.as_f64()
                    .map_or("-".into(), |b| format!("{:.1}", b / 1048576.0))
            };
            for row in rows {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} ({}) | {} ({}) | {} ({}) | {} ({}) | {} ({}) |",
                    row["files"],
                    mib(&row["bytes"]),
                    mib(&row["stored_bytes"]),
                    num(&row["copy_ms"]),
                    num(&row["snapshot_ms"]),
                    num(&row["snapshot_x_copy"]),
                    num(&row["fork_ms"]),
                    num(&row["fork_x_copy"]),
                    num(&row["fork_again_ms"]),
                    num(&row["fork_again_x_copy"]),
                    num(&row["template_open_ms"]),
                    num(&row["template_open_x_copy"]),
                    num(&row["live_fork_ms"]),
                    num(&row["live_fork_x_copy"]),
                );
            }
            if let Some(how) = rows[0]["clones"].as_str() {
                let _ = writeln!(s, "\nForks and template starts are clones ({how}).");
            }
        }
        if let Some(n) = v["memory"]["sandboxes_per_gib"].as_f64() {
            let _ = writeln!(
                s,
                "\n{rt}: {n} live sandboxes per GiB (1024 MiB / the whole sandbox's RSS of {} MiB)",
                num(&v["memory"]["sandbox_rss_mib"])
            );
        }
    }
    let st = &r["store"];
    if st.is_object() {
        let _ = writeln!(
            s,
            "\nStore ({}): {} creates/s, {} lookups/s, {} touches/s, {} audit appends/s ({} of each)",
            st["backend"].as_str().unwrap_or(""),
            num(&st["create_per_s"]),
            num(&st["get_per_s"]),
            num(&st["touch_per_s"]),
            num(&st["audit_append_per_s"]),
            st["operations_each"],
        );
    }
    s
}
