//! Instruction counts of the warm-exec path, with `valgrind --tool=callgrind`, for
//! `sessionbox bench`: counts repeat from run to run on a noisy machine, where seconds do not.
//!
//! The bench runs itself twice under callgrind in its hidden `warm-execs` mode: a temporary
//! data directory, the isolated runtime with default settings, one conversation opened through
//! the manager, [`WARMUP`] execs of `true`, then K execs of `true` (K, then 2K), the
//! conversation destroyed. The instructions per warm exec are the difference of the two runs'
//! totals divided by K, so start-up, open, warm-up and destroy cancel out. Counted: the process
//! that makes the call (the library path: manager, store, audit, execd client); not the agent
//! on the other side of the socket, nor the sandbox's processes (children are not traced).
//! Skipped (reported with the reason) when valgrind is not installed.

use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use sessionbox::config::{FileConfig, RuntimeKind};
use sessionbox::runtime::{self, BuildOptions};
use sessionbox_core::{ConversationId, ConversationRef, Session, TenantId};
use sessionbox_manager::Manager;
use sessionbox_store::Store;

use crate::stats::exec_true;

/// Execs before the counted ones in each run.
pub(crate) const WARMUP: usize = 3;

/// The hidden `warm-execs` mode: K warm execs of `true` on a new isolated conversation in a
/// temporary data directory (what the callgrind runs count).
pub(crate) async fn warm_execs(execs: usize) -> anyhow::Result<ExitCode> {
    let (temp, data_dir) = crate::run::data_dir(None, &[RuntimeKind::Isolated])?;
    let store = Store::open(&data_dir.join("sessionbox.db"))?;
    let mut file = FileConfig::default();
    file.isolated.idle_timeout_secs = Some(60);
    let exe = std::env::current_exe().context("cannot find the sessionbox-bench executable")?;
    let rt = runtime::isolated_runtime(&file, &store, &data_dir, &BuildOptions::new(exe))?;
    let manager = Manager::new(store, Arc::new(rt));
    let conv = ConversationRef::new(
        TenantId::new(TenantId::DEFAULT)?,
        ConversationId::new(format!(
            "bench-{}-callgrind",
            sessionbox::experiment::run_id()
        ))?,
    );
    let result = async {
        let s = manager.open(&conv).await?;
        for _ in 0..WARMUP + execs {
            exec_true(&s).await?;
        }
        Box::new(s).close().await?;
        anyhow::Ok(())
    }
    .await;
    let destroyed = manager.destroy(&conv).await;
    result?;
    destroyed?;
    if let Some(t) = temp {
        t.close()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Total instructions (`Ir`) of a callgrind output file: its `summary:` (or `totals:`) line.
fn total_ir(out: &Path) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(out)
        .with_context(|| format!("cannot read callgrind's output {}", out.display()))?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .with_context(|| format!("no summary line in {}", out.display()))
}

/// One `warm-execs` run of `execs` under callgrind: its total instructions and wall seconds.
fn counted_run(valgrind: &Path, dir: &Path, execs: usize) -> anyhow::Result<(u64, f64)> {
    let exe = std::env::current_exe().context("cannot find the sessionbox-bench executable")?;
    let out = dir.join(format!("callgrind.{execs}.out"));
    let t = Instant::now();
    let o = Command::new(valgrind)
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&exe)
        .args(["warm-execs", "--execs", &execs.to_string()])
        .env_remove("SESSIONBOX_RUNTIME")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("cannot run valgrind")?;
    let wall = t.elapsed().as_secs_f64();
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        let tail: Vec<&str> = err.lines().rev().take(8).collect();
        bail!(
            "valgrind --tool=callgrind of {execs} warm execs exited with {}: {}",
            o.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        );
    }
    Ok((total_ir(&out)?, wall))
}

/// The instruction counts of `k` warm execs (see the module doc); `{"available": false, ..}`
/// when valgrind is not installed or `k` is 0.
pub(crate) fn measure(k: usize) -> Value {
    if k == 0 {
        return json!({"available": false, "reason": "turned off (--callgrind-execs 0)"});
    }
    let Some(valgrind) = crate::baselines::find_on_path("valgrind") else {
        return json!({"available": false, "reason": "valgrind is not installed (Debian: apt install valgrind)"});
    };
    let version = Command::new(&valgrind)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let run = || -> anyhow::Result<Value> {
        let dir = tempfile::tempdir()?;
        let (small, t1) = counted_run(&valgrind, dir.path(), k)?;
        let (large, t2) = counted_run(&valgrind, dir.path(), 2 * k)?;
        let per = large.saturating_sub(small) as f64 / k as f64;
        Ok(json!({
            "available": true,
            "what": "instructions (callgrind Ir) of the calling process per warm exec `true` through the manager on the isolated runtime: (run of 2K execs - run of K) / K; the agent and sandbox are not counted",
            "valgrind": version,
            "k": k,
            "warmup": WARMUP,
            "runs": [
                {"execs": k, "instructions": small, "wall_s": crate::stats::round3(t1)},
                {"execs": 2 * k, "instructions": large, "wall_s": crate::stats::round3(t2)},
            ],
            "instructions_per_exec": per.round() as u64,
        }))
    };
    run().unwrap_or_else(|e| json!({"available": false, "reason": format!("{e:#}")}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_is_read_from_the_summary_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cg.out");
        std::fs::write(&p, "version: 1\nevents: Ir\nsummary: 123456\nfl=x\n").unwrap();
        assert_eq!(total_ir(&p).unwrap(), 123_456);
        std::fs::write(&p, "events: Ir\ntotals: 42\n").unwrap();
        assert_eq!(total_ir(&p).unwrap(), 42);
        std::fs::write(&p, "events: Ir\n").unwrap();
        assert!(total_ir(&p).is_err());
    }
}
