//! Latency summaries and the baseline every measurement is compared with.

use std::time::Instant;

use anyhow::{Context, bail};
use serde::Serialize;
use serde_json::{Value, json};
use sessionbox_core::{ExecRequest, Session};

/// Latency summary of one measurement, in milliseconds (rounded to the microsecond).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Stats {
    pub(crate) count: usize,
    pub(crate) p50_ms: f64,
    p95_ms: f64,
    mean_ms: f64,
    min_ms: f64,
    max_ms: f64,
}

pub(crate) fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

impl Stats {
    /// Nearest-rank percentiles of `samples` (ms). Panics on an empty slice.
    pub(crate) fn of(samples: &[f64]) -> Stats {
        assert!(!samples.is_empty(), "no samples");
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let pct = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
        Stats {
            count: v.len(),
            p50_ms: round3(pct(0.5)),
            p95_ms: round3(pct(0.95)),
            mean_ms: round3(v.iter().sum::<f64>() / v.len() as f64),
            min_ms: round3(v[0]),
            max_ms: round3(v[v.len() - 1]),
        }
    }
}

/// Milliseconds since `since`.
pub(crate) fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// One baseline sample: spawn `/bin/sh -c true` from this process and wait for it (ms).
pub(crate) fn spawn_baseline() -> anyhow::Result<f64> {
    let t = Instant::now();
    let st = std::process::Command::new("/bin/sh")
        .args(["-c", "true"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .context("cannot run /bin/sh -c true")?;
    let elapsed = ms(t);
    if !st.success() {
        bail!("/bin/sh -c true failed: {st}");
    }
    Ok(elapsed)
}

/// `p50` (ms, as reported) as a multiple of the baseline's p50, rounded like the reports.
fn ratio(p50: f64, base: &Stats) -> f64 {
    round3(p50 / base.p50_ms)
}

/// Adds `ratio_to_baseline_p50` to every latency summary (an object with `p50_ms`) in `v`.
pub(crate) fn add_ratios(v: &mut Value, base: &Stats) {
    match v {
        Value::Object(m) => {
            if let Some(p50) = m.get("p50_ms").and_then(Value::as_f64)
                && m.contains_key("count")
            {
                m.insert("ratio_to_baseline_p50".into(), json!(ratio(p50, base)));
            }
            for (_, child) in m.iter_mut() {
                add_ratios(child, base);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|c| add_ratios(c, base)),
        _ => {}
    }
}

/// Runs `true` in `s`; an error unless it succeeds.
pub(crate) async fn exec_true(s: &dyn Session) -> anyhow::Result<()> {
    crate::scale::check_true(&s.exec(ExecRequest::new("true")).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Stats::of(&v);
        assert_eq!(s.count, 100);
        assert_eq!(s.p50_ms, 51.0);
        assert_eq!(s.p95_ms, 95.0);
        assert_eq!(s.min_ms, 1.0);
        assert_eq!(s.max_ms, 100.0);
        assert_eq!(s.mean_ms, 50.5);
        let base = Stats::of(&[2.0]);
        assert_eq!(ratio(s.p50_ms, &base), 25.5);
        let mut v = json!({"a": {"count": 1, "p50_ms": 3.0}, "b": [{"count": 2, "p50_ms": 1.0}], "c": {"p50_ms": 1.0}});
        add_ratios(&mut v, &base);
        assert_eq!(v["a"]["ratio_to_baseline_p50"], 1.5);
        assert_eq!(v["b"][0]["ratio_to_baseline_p50"], 0.5);
        assert!(v["c"].get("ratio_to_baseline_p50").is_none());
    }
}
