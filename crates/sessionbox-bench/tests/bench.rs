//! `sessionbox-bench` (what `sessionbox bench` runs) end to end, with tiny iteration counts: the report's shape, that every
//! number is a positive measurement and every ratio and verdict is computed from the numbers
//! next to it, and that the bench cleans up after itself. Nothing here asserts how fast anything
//! is: timing assertions in tests are forbidden (they fail on a busy machine).

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

const WARM: u64 = 3;
const COLD: u64 = 2;
/// Conversations live at once in the density measurement.
const LIVE: u64 = 3;
/// Warm execs counted under callgrind (runs of K and 2K).
const CALLGRIND_K: u64 = 2;

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sessionbox-bench"))
        .args(["--iterations", &WARM.to_string()])
        .args(["--cold-iterations", &COLD.to_string()])
        .args([
            "--http-conversations",
            "3",
            "--http-execs",
            "2",
            "--http-clients",
            "2",
        ])
        .args(["--levels", "1,3", "--level-execs", "2"])
        .args(["--snapshot-files", "20,40"])
        .args(["--live", &LIVE.to_string()])
        .args(["--callgrind-execs", &CALLGRIND_K.to_string()])
        // The Docker daemon is not the bench harness's to test (scripts/test's run measures it).
        .arg("--no-docker")
        .args(args)
        .env_remove("SESSIONBOX_RUNTIME")
        .env_remove("SESSIONBOX_TENANT")
        // With a server configured the bench measures opensandbox too; these tests are about
        // the local runtimes.
        .env_remove("OPEN_SANDBOX_DOMAIN")
        .output()
        .expect("run sessionbox-bench")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn report(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("the JSON report was written"))
        .expect("the JSON report parses")
}

fn num(v: &Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

/// A latency summary: positive, ordered, counted, and its ratio computed from its p50 and the
/// baseline's p50 (both as reported, rounded to the microsecond).
fn check_stats(st: &Value, count: u64, base_p50: Option<f64>, what: &str) {
    assert_eq!(st["count"].as_u64(), Some(count), "{what}: {st}");
    let min = num(&st["min_ms"], what);
    let p50 = num(&st["p50_ms"], what);
    let p95 = num(&st["p95_ms"], what);
    let max = num(&st["max_ms"], what);
    let mean = num(&st["mean_ms"], what);
    assert!(min > 0.0, "{what}: {st}");
    assert!(min <= p50 && p50 <= p95 && p95 <= max, "{what}: {st}");
    assert!(min <= mean && mean <= max, "{what}: {st}");
    if let Some(base) = base_p50 {
        let ratio = num(&st["ratio_to_baseline_p50"], what);
        let want = p50 / base;
        assert!(
            (ratio - want).abs() <= 0.0005 + want * 1e-9,
            "{what}: ratio {ratio} is not p50 {p50} / baseline p50 {base}"
        );
    }
}

fn check_report(r: &Value, runtimes: &[&str], stdout: &str) {
    assert_eq!(r["kind"], "sessionbox-bench");
    let profile = r["build_profile"].as_str().expect("build_profile");
    assert!(matches!(profile, "debug" | "release"), "{profile}");
    let env = &r["environment"];
    assert_eq!(env["build_profile"], profile);
    for k in ["os", "kernel", "arch", "sessionbox_version"] {
        assert!(
            env[k].as_str().is_some_and(|s| !s.is_empty()),
            "environment.{k}: {env}"
        );
    }
    assert!(env["cores"].as_u64().is_some_and(|n| n >= 1), "{env}");
    assert!(
        chrono::DateTime::parse_from_rfc3339(r["started"].as_str().expect("started")).is_ok(),
        "{}",
        r["started"]
    );
    assert_eq!(r["iterations"]["warm"].as_u64(), Some(WARM));
    assert_eq!(r["iterations"]["cold"].as_u64(), Some(COLD));
    assert!(
        r["iterations"]["cold_pause_ms"].as_u64().is_some(),
        "{}",
        r["iterations"]
    );
    let listed: Vec<&str> = r["runtimes"]
        .as_array()
        .expect("runtimes")
        .iter()
        .map(|v| v.as_str().expect("runtime name"))
        .collect();
    assert_eq!(listed, runtimes);

    // The baseline: one sample before each warm exec of each runtime.
    let base = &r["baseline"]["stats"];
    check_stats(base, WARM * runtimes.len() as u64, None, "baseline");
    let base_p50 = num(&base["p50_ms"], "baseline p50");

    let results = r["results"].as_object().expect("results");
    assert_eq!(results.len(), runtimes.len(), "{results:?}");
    for rt in runtimes {
        let v = &r["results"][*rt];
        let b = Some(base_p50);
        check_stats(&v["cold_start"]["stats"], COLD, b, "cold start");
        check_stats(
            &v["cold_start"]["phases"]["open"],
            COLD,
            b,
            "cold start open",
        );
        check_stats(
            &v["cold_start"]["phases"]["first_exec"],
            COLD,
            b,
            "cold start first exec",
        );
        check_stats(&v["cold_start"]["destroy_untimed"], COLD, b, "destroy");
        // The whole cold start contains its two phases.
        assert!(
            num(&v["cold_start"]["stats"]["max_ms"], "cold max")
                >= num(&v["cold_start"]["phases"]["open"]["min_ms"], "open min")
        );
        check_stats(&v["warm_exec"], WARM, b, "warm exec");
        check_stats(&v["file_write_read_4k"]["stats"], WARM, b, "write+read");
        check_stats(&v["file_write_read_4k"]["write"], WARM, b, "write");
        check_stats(&v["file_write_read_4k"]["read"], WARM, b, "read");
        check_stats(&v["warm_open"]["stats"], WARM, b, "warm open");
        let bd = &v["breakdown"];
        check_stats(
            &bd["exec_without_manager"]["stats"],
            WARM,
            b,
            "exec without manager",
        );
        check_stats(
            &bd["fork_exec_in_workspace"]["stats"],
            5,
            b,
            "fork+exec in workspace",
        );
        // Over HTTP: as many library and HTTP execs as warm iterations, the added p50 computed
        // from the two, and the load's every exec accounted for (3 conversations x 2 execs).
        let h = &v["http"];
        let rtt = &h["round_trip"];
        assert_eq!(rtt["library"]["count"].as_u64(), Some(WARM), "{h}");
        assert_eq!(rtt["http"]["count"].as_u64(), Some(WARM), "{h}");
        let added = num(&rtt["added_p50_ms"], "added p50");
        let want =
            num(&rtt["http"]["p50_ms"], "http p50") - num(&rtt["library"]["p50_ms"], "lib p50");
        assert!((added - want).abs() < 0.0015, "{h}");
        let mcp = &h["mcp_round_trip"];
        assert_eq!(mcp["mcp"]["count"].as_u64(), Some(WARM), "{h}");
        assert_eq!(mcp["library"]["count"].as_u64(), Some(WARM), "{h}");
        let load = &h["load"];
        assert_eq!(load["execs_ok"].as_u64(), Some(6), "{h}");
        assert_eq!(load["errors"].as_u64(), Some(0), "{h}");
        assert_eq!(
            load["first_exec_with_create"]["count"].as_u64(),
            Some(3),
            "{h}"
        );
        assert_eq!(load["later_execs"]["count"].as_u64(), Some(3), "{h}");
        assert!(
            num(&load["throughput_execs_per_s"], "throughput") > 0.0,
            "{h}"
        );
        // Throughput at levels 1 and 3 (2 execs each), through the library and HTTP.
        for levels in [&v["throughput"], &h["throughput"]] {
            let levels = levels.as_array().expect("throughput levels");
            let got: Vec<(u64, u64)> = levels
                .iter()
                .map(|l| {
                    (
                        l["concurrency"].as_u64().expect("level concurrency"),
                        l["execs"].as_u64().expect("level execs"),
                    )
                })
                .collect();
            assert_eq!(got, [(1, 2), (3, 6)], "{levels:?}");
            for l in levels {
                assert_eq!(l["latency"]["count"], l["execs"], "{l}");
                let wall = num(&l["wall_s"], "wall");
                let want = num(&l["execs"], "execs") / wall;
                let tp = num(&l["throughput_execs_per_s"], "throughput");
                // Both are rounded: wall to the ms (so up to 0.5 ms off), throughput to 0.1.
                assert!((tp - want).abs() <= 0.05 + want * (0.0006 / wall), "{l}");
            }
        }
        let f = &v["file_1mib"];
        for part in ["write", "read", "write_plus_read"] {
            assert_eq!(f[part]["count"].as_u64(), Some(WARM.max(3)), "{f}");
        }
        if *rt == "isolated" {
            let per_gib = num(&v["memory"]["sandboxes_per_gib"], "per GiB");
            let rss = num(&v["memory"]["sandbox_rss_mib"], "rss");
            assert_eq!(per_gib, (1024.0 / rss).floor(), "{}", v["memory"]);
            check_stats(&bd["http_ping"]["stats"], WARM, b, "ping");
            check_stats(&bd["execd_client_build"]["stats"], COLD, b, "client build");
            let m = &v["memory"];
            let agent = num(&m["agent_rss_mib"], "agent rss");
            let total = num(&m["sandbox_rss_mib"], "sandbox rss");
            assert!(agent > 0.0 && total >= agent, "{m}");
            let procs = m["processes"].as_array().expect("processes");
            let agents: Vec<&Value> = procs.iter().filter(|p| p["role"] == "agent").collect();
            assert_eq!(agents.len(), 1, "{m}");
            assert!(
                agents[0]["cmdline"]
                    .as_str()
                    .is_some_and(|c| c.contains(" agent")),
                "{m}"
            );
            let sum: u64 = procs
                .iter()
                .map(|p| p["rss_kib"].as_u64().expect("process rss_kib"))
                .sum();
            assert!(
                (total - sum as f64 / 1024.0).abs() < 0.001,
                "sandbox RSS {total} MiB is not the sum of {sum} KiB"
            );
            let agent_kib = agents[0]["rss_kib"].as_u64().expect("agent rss_kib");
            assert!((agent - agent_kib as f64 / 1024.0).abs() < 0.001, "{m}");
            check_live(&v["live"]);
        } else {
            assert!(v.get("memory").is_none(), "{v}");
            assert!(v.get("live").is_none(), "{v}");
        }
    }

    // Every target: its verdict follows from its value and limit, and its value is the
    // measurement it names.
    let targets = r["targets"].as_array().expect("targets");
    let mut seen = Vec::new();
    for t in targets {
        let rt = t["runtime"].as_str().expect("runtime");
        let id = t["id"].as_str().expect("id");
        let value = num(&t["value"], id);
        let limit = num(&t["limit"], id);
        assert_eq!(t["pass"].as_bool(), Some(value <= limit), "{t}");
        let v = &r["results"][rt];
        let measured = match id {
            "cold_start_p50" => &v["cold_start"]["stats"]["p50_ms"],
            "cold_start_pooled_ratio" => &v["cold_start_pooled"]["stats"]["ratio_to_baseline_p50"],
            "warm_exec_p50" => &v["warm_exec"]["p50_ms"],
            "warm_exec_ratio" => &v["warm_exec"]["ratio_to_baseline_p50"],
            "agent_rss" => &v["memory"]["agent_rss_mib"],
            "http_added_p50" => &v["http"]["round_trip"]["added_p50_ms"],
            "mcp_added_p50" => &v["http"]["mcp_round_trip"]["added_p50_ms"],
            "cli_call_ratio" => &v["cli_call"]["stats"]["ratio_to_baseline_p50"],
            "remote_warm_exec_p50" => &v["warm_exec"]["p50_ms"],
            "remote_cold_start_pooled_p50" => &v["cold_start_pooled"]["stats"]["p50_ms"],
            "http_load_errors" => &v["http"]["load"]["errors"],
            "live_charged_per_sandbox" => &v["live"]["per_sandbox"]["charged_mib"]["mean"],
            "live_exec_ratio" => &v["live"]["exec_p50_ratio_n_to_1"],
            "live_exec_errors" => &v["live"]["exec_errors"],
            other => panic!("unknown target {other}"),
        };
        assert_eq!(value, num(measured, id), "{t}");
        let verdict = if t["pass"] == true { "PASS" } else { "FAIL" };
        let target = t["target"].as_str().expect("target text");
        assert!(
            stdout.contains(&format!("{verdict} {rt}: {target}")),
            "{verdict} {rt}: {target} not printed:\n{stdout}"
        );
        seen.push(format!("{rt}/{id}"));
    }
    let mut want = Vec::new();
    for rt in runtimes {
        want.extend(
            [
                "cold_start_p50",
                "warm_exec_p50",
                "warm_exec_ratio",
                "http_added_p50",
                "mcp_added_p50",
                "http_load_errors",
            ]
            .map(|i| format!("{rt}/{i}")),
        );
        if *rt == "isolated" {
            want.push(format!("{rt}/agent_rss"));
            want.push(format!("{rt}/cold_start_pooled_ratio"));
            want.push(format!("{rt}/live_exec_ratio"));
            want.push(format!("{rt}/live_exec_errors"));
            // The whole CLI call is measured when the `sessionbox` executable is beside the
            // bench's (in a workspace build it is).
            if r["results"][*rt]["cli_call"].is_object() {
                let c = &r["results"][*rt]["cli_call"];
                assert!(c.get("error").is_none(), "the CLI call failed: {c}");
                check_stats(&c["stats"], WARM.min(200), Some(base_p50), "cli call");
                want.push(format!("{rt}/cli_call_ratio"));
            }
            if r["results"][*rt]["live"]["per_sandbox"]["charged_mib"].is_object() {
                want.push(format!("{rt}/live_charged_per_sandbox"));
            }
        }
    }
    seen.sort();
    want.sort();
    assert_eq!(seen, want);
    let all = targets.iter().all(|t| t["pass"] == true);
    assert_eq!(r["targets_met"].as_bool(), Some(all));
    // Alternatives: each measured or said why not; store operations counted.
    for (name, a) in r["alternatives"].as_object().expect("alternatives") {
        match a["available"].as_bool() {
            Some(true) => assert!(num(&a["stats"]["p50_ms"], name) > 0.0, "{a}"),
            Some(false) => assert!(a["reason"].as_str().is_some_and(|r| !r.is_empty()), "{a}"),
            None => panic!("{name}: {a}"),
        }
    }
    for k in [
        "create_per_s",
        "get_per_s",
        "touch_per_s",
        "audit_append_per_s",
    ] {
        assert!(num(&r["store"][k], k) > 0.0, "{}", r["store"]);
    }
    // Instruction counts: on the isolated runtime, from two runs of K and 2K execs, when
    // valgrind is here; otherwise the reason.
    let i = &r["instructions"];
    if i["available"] == true {
        assert_eq!(i["k"].as_u64(), Some(CALLGRIND_K), "{i}");
        let small = num(&i["runs"][0]["instructions"], "K run");
        let large = num(&i["runs"][1]["instructions"], "2K run");
        assert!(small > 0.0 && large > small, "{i}");
        let per = num(&i["instructions_per_exec"], "per exec");
        assert!(
            (per - (large - small) / CALLGRIND_K as f64).abs() <= 1.0,
            "{i}"
        );
        assert!(
            stdout.contains("Instructions per warm exec `true`"),
            "{stdout}"
        );
    } else {
        assert!(i["reason"].as_str().is_some_and(|r| !r.is_empty()), "{i}");
        if runtimes.contains(&"isolated") && std::path::Path::new("/usr/bin/valgrind").exists() {
            panic!("valgrind is installed but nothing was counted: {i}");
        }
    }
    assert_eq!(r["cleanup"]["ok"], true, "{}", r["cleanup"]);
}

/// The density measurement: LIVE sandboxes up, every exec sampled and successful, the ratio
/// computed from the two p50s, memory and threads per sandbox read.
fn check_live(l: &Value) {
    assert_eq!(l["live"].as_u64(), Some(LIVE), "{l}");
    assert_eq!(l["one_live"]["exec"]["count"].as_u64(), Some(WARM), "{l}");
    assert_eq!(l["n_live"]["exec"]["count"].as_u64(), Some(WARM), "{l}");
    assert_eq!(l["exec_errors"].as_u64(), Some(0), "{l}");
    assert_eq!(l["open_all"]["count"].as_u64(), Some(LIVE - 1), "{l}");
    let ratio = num(&l["exec_p50_ratio_n_to_1"], "live ratio");
    let want = num(&l["n_live"]["exec"]["p50_ms"], "n p50")
        / num(&l["one_live"]["exec"]["p50_ms"], "1 p50");
    assert!((ratio - want).abs() <= 0.0005 + want * 1e-3, "{l}");
    let p = &l["per_sandbox"];
    assert_eq!(p["sandboxes_up"].as_u64(), Some(LIVE), "{l}");
    for k in [
        "rss_mib",
        "pss_mib",
        "processes",
        "threads",
        "agent_threads",
    ] {
        let m = &p[k];
        let (mean, p50, max) = (num(&m["mean"], k), num(&m["p50"], k), num(&m["max"], k));
        assert!(
            mean > 0.0 && p50 > 0.0 && mean <= max && p50 <= max,
            "{k}: {m}"
        );
    }
    assert!(
        num(&p["threads"]["mean"], "threads") >= num(&p["processes"]["mean"], "procs"),
        "{p}"
    );
    let host = &l["host"]["live"];
    assert!(
        num(&host["threads"], "host threads") >= num(&host["processes"], "host procs"),
        "{host}"
    );
}

#[test]
fn bench_reports_every_runtime_and_cleans_up_its_temporary_data_dir() {
    let out_dir = tempfile::tempdir().unwrap();
    let json = out_dir.path().join("bench.json");
    let md = out_dir.path().join("bench.md");
    let dir = out_dir.path().join("out");
    let out = bench(&[
        "--report-json",
        json.to_str().unwrap(),
        "--report-md",
        md.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    // A report, not a check: exit 0 whether or not the targets are met.
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let r = report(&json);
    check_report(&r, &["isolated", "host"], &stdout);
    // Snapshots against the workspace's size, with the copy measured in the same run.
    for rt in ["isolated", "host"] {
        let rows = r["results"][rt]["snapshots"].as_array().expect("snapshots");
        let files: Vec<u64> = rows.iter().map(|x| x["files"].as_u64().unwrap()).collect();
        assert_eq!(files, [20, 40], "{rt}");
        for row in rows {
            for k in [
                "copy_ms",
                "snapshot_ms",
                "fork_ms",
                "template_open_ms",
                "live_fork_ms",
            ] {
                assert!(row[k].as_f64().is_some_and(|v| v > 0.0), "{rt} {k}: {row}");
            }
            assert!(
                row["fork_x_copy"].as_f64().is_some_and(|v| v > 0.0),
                "{row}"
            );
            assert!(row["stored_bytes"].as_u64().is_some_and(|v| v > 0), "{row}");
        }
    }
    assert!(
        stdout.contains("snapshots against the workspace's size"),
        "{stdout}"
    );
    // The temporary data directory is not named (it is gone).
    assert!(r["data_dir"].is_null(), "{}", r["data_dir"]);
    // --out: the same report, plus the plots (PNG) named at the end of the Markdown.
    let md_out = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert_eq!(md_out, stdout);
    assert!(md_out.starts_with(&std::fs::read_to_string(&md).unwrap()));
    let r_out: Value =
        serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(r_out["run_id"], r["run_id"]);
    for png in [
        "latency_vs_concurrency.png",
        "throughput_vs_concurrency.png",
    ] {
        if stdout.contains(&format!("- {png}\n")) {
            let bytes = std::fs::read(dir.join(png)).unwrap();
            assert_eq!(&bytes[..4], b"\x89PNG", "{png}");
        } else {
            assert!(stdout.contains(&format!("- {png} not drawn: ")), "{stdout}");
        }
    }
    assert!(
        stdout.contains("baseline: spawn `/bin/sh -c true`"),
        "{stdout}"
    );
    if r["build_profile"] == "debug" {
        assert!(stderr.contains("DEBUG build"), "{stderr}");
        assert!(stdout.contains("DEBUG BUILD"), "{stdout}");
    }
}

#[test]
fn bench_in_a_given_data_dir_leaves_nothing_and_check_follows_the_targets() {
    // Short: the isolated runtime's socket paths must fit in 107 bytes.
    let data = tempfile::Builder::new()
        .prefix("sbt")
        .tempdir_in("/tmp")
        .unwrap();
    let json = data.path().join("r.json");
    let out = bench(&[
        "--runtime",
        "host",
        "--check-margin",
        "1",
        "--cold-pause-ms",
        "0",
        "--check",
        "--report-json",
        json.to_str().unwrap(),
        "--data-dir",
        data.path().to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    let r = report(&json);
    check_report(&r, &["host"], &stdout);
    assert_eq!(r["data_dir"].as_str(), data.path().to_str());
    assert_eq!(r["iterations"]["cold_pause_ms"].as_u64(), Some(0));
    // --check: exit 1 exactly when a target was missed.
    let want = if r["targets_met"] == true { 0 } else { 1 };
    assert_eq!(
        out.status.code(),
        Some(want),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    // Nothing of the bench is left in the data directory: no workspace, no record.
    let left: Vec<_> = std::fs::read_dir(data.path().join("workspaces"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // No record is left in the store (what `sessionbox conversations --all-tenants` lists).
    let store = sessionbox_store::Store::open(&data.path().join("sessionbox.db")).unwrap();
    let records = store.list(None).unwrap();
    assert!(records.is_empty(), "{records:?}");
}

#[test]
fn a_data_dir_too_long_for_the_isolated_runtime_is_refused_up_front() {
    let data = tempfile::tempdir().unwrap();
    let long = data.path().join("a".repeat(40));
    let out = bench(&[
        "--runtime",
        "isolated",
        "--data-dir",
        long.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("at most 27 bytes"),
        "{}",
        text(&out.stderr)
    );
    assert!(!long.exists(), "the bench created {}", long.display());
}
