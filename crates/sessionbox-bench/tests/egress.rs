//! `sessionbox-bench egress` (what `sessionbox bench-egress` runs) end to end: both paths are
//! measured in one run and the benchmark's network namespace is gone afterwards. Needs root.

use std::process::Command;

#[test]
fn bench_egress_measures_both_paths_in_one_run_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("egress.json");
    let out = Command::new(env!("CARGO_BIN_EXE_sessionbox-bench"))
        .args([
            "egress",
            "--connections",
            "20",
            "--mib",
            "4",
            "--report-json",
        ])
        .arg(&report)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    for k in ["connect_direct", "connect_gateway"] {
        assert!(r[k]["p50_ms"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(r["throughput_direct_mib_s"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["throughput_gateway_mib_s"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(r["added_p50_target_ms"], 1.0);
    // Its namespace is gone.
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&ns.stdout).contains("sbbench-"),
        "the benchmark left its namespace"
    );
}
