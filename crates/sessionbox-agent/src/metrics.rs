//! `GET /metrics`: CPU and memory of the machine (or container) the agent runs in, from
//! `/proc/stat` and `/proc/meminfo`.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sessionbox_execd::Metrics;
use sessionbox_execd::types::now_millis;
use sessionbox_execd::wire::error_code;

use crate::server::{ApiError, AppState};

/// CPU use is measured between two calls (the first call: since boot).
pub(crate) struct CpuSampler {
    last: Mutex<Option<(u64, u64)>>,
}

impl CpuSampler {
    pub(crate) fn new() -> Self {
        CpuSampler {
            last: Mutex::new(None),
        }
    }

    /// Percent of CPU time busy since the previous call.
    fn percent(&self) -> Option<f64> {
        let (busy, total) = read_cpu_times()?;
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let (b0, t0) = last.replace((busy, total)).unwrap_or((0, 0));
        let (db, dt) = (busy.saturating_sub(b0), total.saturating_sub(t0));
        Some(if dt == 0 {
            0.0
        } else {
            100.0 * db as f64 / dt as f64
        })
    }
}

/// `(busy, total)` jiffies of the `cpu` line of `/proc/stat`.
fn read_cpu_times() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// `(total, available)` memory in KiB from `/proc/meminfo`.
fn read_memory() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

pub(crate) async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let (Some(cpu), Some((total, avail))) = (state.cpu.percent(), read_memory()) else {
        return ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            error_code::RUNTIME_ERROR,
            "error reading runtime metrics: /proc/stat or /proc/meminfo is unreadable",
        )
        .into_response();
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    axum::Json(Metrics {
        cpu_count: cpus as f64,
        cpu_used_pct: cpu,
        mem_total_mib: total as f64 / 1024.0,
        mem_used_mib: total.saturating_sub(avail) as f64 / 1024.0,
        timestamp: now_millis(),
    })
    .into_response()
}

/// `GET /sessionbox/v1/memory` ([`sessionbox_execd::memory_ext`]): the charge of the cgroup the
/// agent runs in, seen at the root of the cgroup file system as a container sees its own
/// (cgroup v2 at `/sys/fs/cgroup`, v1's memory hierarchy at `/sys/fs/cgroup/memory`); `null`
/// when neither can be read.
pub(crate) async fn memory() -> Response {
    let own = [
        std::path::PathBuf::from("/sys/fs/cgroup"),
        std::path::PathBuf::from("/sys/fs/cgroup/memory"),
    ];
    axum::Json(sessionbox_process::memory_charge(&own)).into_response()
}
