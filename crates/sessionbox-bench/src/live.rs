//! Density: N isolated conversations kept live at once (`--live N`), for `sessionbox bench`.
//!
//! Measured with nothing else of the bench live (after the runtime's other measurements were
//! cleaned up):
//! 1. at 1 live: one conversation opened, then `samples` times: open it through the manager
//!    (as every CLI call does) and run `true` (the open and the exec timed apart);
//! 2. the other N - 1 opened one after another (each open launches its sandbox; timed one by
//!    one and in all);
//! 3. at N live: the same open + exec on a conversation picked at random among the N,
//!    `samples` times; every exec must succeed (errors are counted, and a target);
//! 4. the host's memory and process table with N live: per sandbox, the RSS and PSS of its
//!    processes (`/proc/PID/status` `VmRSS`, `/proc/PID/smaps_rollup` `Pss`) and its memory
//!    cgroup's charge (`memory.usage_in_bytes` on cgroups v1, `memory.current` on v2), and
//!    its processes and threads (`/proc/PID/status` `Threads`); host-wide, the processes and
//!    threads in `/proc` and `MemAvailable` in `/proc/meminfo`, before and with N live;
//! 5. that all N sandboxes are still up at the end (none timed out or was relaunched).
//!
//! The caller destroys the conversations and checks that nothing is left.

use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use sessionbox_core::{ConversationRef, Session};
use sessionbox_local::isolated::SandboxInfo;
use sessionbox_manager::Manager;

use crate::run::Bench;
use crate::scale::percentiles;
use crate::stats::{exec_true, ms, round3};

/// Target: memory charged to one live sandbox's cgroup, MiB.
pub(crate) const CHARGED_PER_SANDBOX_MIB: f64 = 3.0;
/// Target: exec p50 with N live, as a multiple of exec p50 with 1 live.
pub(crate) const EXEC_P50_RATIO: f64 = 2.0;

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (one execd client per live
/// conversation may be kept); returns the limits as they are afterwards.
fn raise_nofile() -> Value {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    let before = l.current;
    if l.current < l.maximum {
        l.current = l.maximum;
        let _ = setrlimit(Resource::Nofile, l);
    }
    let after = getrlimit(Resource::Nofile);
    json!({"soft_before": before, "soft": after.current, "hard": after.maximum})
}

/// A small xorshift generator: which conversation to exec on (no need for a crate).
struct Pick(u64);

impl Pick {
    fn new() -> Pick {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9, |d| d.as_nanos() as u64);
        Pick(seed | 1)
    }
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Open + exec `true` on `conv`, timed apart (ms); `Err` when the exec did not succeed.
async fn open_exec(manager: &Manager, conv: &ConversationRef) -> anyhow::Result<(f64, f64)> {
    let t = Instant::now();
    let s = manager.open(conv).await?;
    let opened = ms(t);
    let t = Instant::now();
    let r = exec_true(&s).await;
    let exec = ms(t);
    Box::new(s).close().await?;
    r?;
    Ok((opened, exec))
}

/// `samples` open + execs on conversations `pick` chooses: (open ms, exec ms, errors).
async fn sample(
    manager: &Manager,
    convs: &[ConversationRef],
    samples: usize,
    pick: &mut Pick,
) -> (Vec<f64>, Vec<f64>, Vec<String>) {
    let (mut open, mut exec, mut errors) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..samples {
        let c = &convs[pick.below(convs.len())];
        match open_exec(manager, c).await {
            Ok((o, e)) => {
                open.push(o);
                exec.push(e);
            }
            Err(e) => errors.push(format!("{}: {e:#}", c.id)),
        }
    }
    (open, exec, errors)
}

/// Processes and threads in the host's `/proc`.
fn host_tasks() -> Value {
    let (mut procs, mut threads) = (0u64, 0u64);
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        procs += 1;
        threads += std::fs::read_dir(e.path().join("task"))
            .map(|d| d.count() as u64)
            .unwrap_or(1);
    }
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    json!({"processes": procs, "threads": threads, "pid_max": pid_max})
}

/// `MemAvailable` from `/proc/meminfo`, KiB.
fn mem_available_kib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    crate::measure::status_field(&text, "MemAvailable")
}

/// What one sandbox holds: RSS and PSS summed over its processes (KiB), its cgroup's charge
/// (bytes) and where it was read, processes, threads, and the agent's threads.
struct SandboxMem {
    rss_kib: u64,
    pss_kib: u64,
    charged: Option<(u64, String)>,
    processes: u64,
    threads: u64,
    agent_threads: Option<u64>,
}

fn sandbox_mem(info: &SandboxInfo) -> SandboxMem {
    let mut m = SandboxMem {
        rss_kib: 0,
        pss_kib: 0,
        charged: None,
        processes: 0,
        threads: 0,
        agent_threads: None,
    };
    for pid in info.processes() {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        m.processes += 1;
        m.rss_kib += crate::measure::status_field(&status, "VmRSS").unwrap_or(0);
        let threads = crate::measure::status_field(&status, "Threads").unwrap_or(1);
        m.threads += threads;
        m.pss_kib += std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
            .ok()
            .and_then(|s| crate::measure::status_field(&s, "Pss"))
            .unwrap_or(0);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline.split(|b| *b == 0).nth(1) == Some(b"agent".as_slice()) {
            m.agent_threads = Some(threads);
        }
    }
    m.charged = info.cgroups.iter().find_map(|cg| {
        ["memory.usage_in_bytes", "memory.current"]
            .iter()
            .find_map(|f| {
                let p = cg.join(f);
                let v = std::fs::read_to_string(&p)
                    .ok()?
                    .trim()
                    .parse::<u64>()
                    .ok()?;
                Some((v, p.display().to_string()))
            })
    });
    m
}

/// Mean and nearest-rank p50 / max of `v` (rounded to 0.001).
fn spread(v: &mut [f64]) -> Value {
    if v.is_empty() {
        return Value::Null;
    }
    v.sort_by(f64::total_cmp);
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    json!({
        "mean": round3(mean),
        "p50": round3(v[(v.len() - 1) / 2]),
        "max": round3(v[v.len() - 1]),
    })
}

/// The memory and processes of every live sandbox of `convs`, per sandbox.
fn density(b: &Bench, convs: &[ConversationRef]) -> anyhow::Result<Value> {
    let (mut rss, mut pss, mut charged) = (Vec::new(), Vec::new(), Vec::new());
    let (mut procs, mut threads, mut agent_threads) = (Vec::new(), Vec::new(), Vec::new());
    let mut charged_from = None;
    let mut up = 0usize;
    for c in convs {
        let info = b
            .sandbox_info(c)
            .with_context(|| format!("no sandbox recorded for live conversation {}", c.id))?;
        let m = sandbox_mem(&info);
        if m.processes == 0 {
            continue;
        }
        up += 1;
        rss.push(m.rss_kib as f64 / 1024.0);
        pss.push(m.pss_kib as f64 / 1024.0);
        if let Some((bytes, from)) = m.charged {
            charged.push(bytes as f64 / (1024.0 * 1024.0));
            // The hierarchy's file, with this sandbox's cgroup name taken out.
            charged_from.get_or_insert_with(|| {
                let p = std::path::Path::new(&from);
                let file = p.file_name().map(|f| f.to_string_lossy().into_owned());
                let root = p
                    .parent()
                    .and_then(|d| d.parent())
                    .map(|d| d.display().to_string());
                format!(
                    "{}/<sandbox>/{}",
                    root.unwrap_or_default(),
                    file.unwrap_or_default()
                )
            });
        }
        procs.push(m.processes as f64);
        threads.push(m.threads as f64);
        if let Some(t) = m.agent_threads {
            agent_threads.push(t as f64);
        }
    }
    Ok(json!({
        "sandboxes_up": up,
        "rss_mib": spread(&mut rss),
        "pss_mib": spread(&mut pss),
        "charged_mib": spread(&mut charged),
        "processes": spread(&mut procs),
        "threads": spread(&mut threads),
        "agent_threads": spread(&mut agent_threads),
        "read_from": {
            "rss": "/proc/PID/status VmRSS, summed over the sandbox's processes",
            "pss": "/proc/PID/smaps_rollup Pss, summed over the sandbox's processes",
            "charged": charged_from,
            "threads": "/proc/PID/status Threads, summed over the sandbox's processes",
        },
    }))
}

/// The density measurement with `n` conversations live (see the module doc). Conversations
/// are pushed to `created` before they are opened.
pub(crate) async fn live(
    b: &mut Bench,
    manager: &Manager,
    n: usize,
    samples: usize,
    created: &mut Vec<ConversationRef>,
) -> anyhow::Result<Value> {
    let nofile = raise_nofile();
    b.progress.set_message(format!("isolated {n} live"));
    let host_before = host_tasks();
    let mem_before = mem_available_kib();
    let mut convs = Vec::with_capacity(n);
    for i in 0..n {
        let c = b.conversation(&format!("live-{i:05}"))?;
        created.push(c.clone());
        convs.push(c);
    }
    let mut pick = Pick::new();
    // 1 live.
    open_exec(manager, &convs[0])
        .await
        .context("opening the first live conversation")?;
    b.note_cgroups(&convs[0]);
    let (open1, exec1, errors1) = sample(manager, &convs[..1], samples, &mut pick).await;
    if !errors1.is_empty() {
        bail!("execs failed with 1 live: {errors1:?}");
    }
    // Open the rest.
    let mut opens = Vec::with_capacity(n);
    let t0 = Instant::now();
    for c in &convs[1..] {
        let t = Instant::now();
        let s = manager
            .open(c)
            .await
            .with_context(|| format!("opening live conversation {} of {n}", opens.len() + 2))?;
        opens.push(ms(t));
        Box::new(s).close().await?;
        b.note_cgroups(c);
        b.progress.inc(1);
    }
    let open_all_s = t0.elapsed().as_secs_f64();
    // N live.
    let (open_n, exec_n, errors_n) = sample(manager, &convs, samples, &mut pick).await;
    let host_live = host_tasks();
    let mem_live = mem_available_kib();
    let per_sandbox = density(b, &convs)?;
    let p50 = |v: &[f64]| percentiles(v.to_vec())["p50_ms"].as_f64();
    let ratio = match (p50(&exec_n), p50(&exec1)) {
        (Some(a), Some(b)) if b > 0.0 => Some(round3(a / b)),
        _ => None,
    };
    let host_mem_per_sandbox = match (mem_before, mem_live) {
        (Some(a), Some(l)) => Some(round3(
            (a.saturating_sub(l)) as f64 / 1024.0 / n.max(1) as f64,
        )),
        _ => None,
    };
    let per_task = |k: &str| {
        let (a, l) = (host_before[k].as_u64(), host_live[k].as_u64());
        match (a, l) {
            (Some(a), Some(l)) => Some(round3(l.saturating_sub(a) as f64 / n.max(1) as f64)),
            _ => None,
        }
    };
    Ok(json!({
        "what": "N isolated conversations live at once; open + exec `true` on random ones through the manager",
        "live": n,
        "samples": samples,
        "rlimit_nofile": nofile,
        "one_live": {"open": percentiles(open1), "exec": percentiles(exec1)},
        "open_all": {"count": opens.len(), "wall_s": round3(open_all_s), "each": percentiles(opens)},
        "n_live": {"open": percentiles(open_n), "exec": percentiles(exec_n)},
        "exec_p50_ratio_n_to_1": ratio,
        "exec_errors": errors_n.len(),
        "exec_error_examples": errors_n.iter().take(5).collect::<Vec<_>>(),
        "per_sandbox": per_sandbox,
        "host": {
            "before": host_before,
            "live": host_live,
            "processes_per_sandbox": per_task("processes"),
            "threads_per_sandbox": per_task("threads"),
            "mem_available_drop_per_sandbox_mib": host_mem_per_sandbox,
            "mem_available_from": "/proc/meminfo MemAvailable, before the first open and with N live",
        },
    }))
}
