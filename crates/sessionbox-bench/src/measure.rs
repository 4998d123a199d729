//! The measurements of one runtime: cold starts, warm execs, files, reopens, where a warm
//! exec's time goes, and the resident memory of a sandbox.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use serde_json::{Value, json};
use sessionbox::config::RuntimeKind;
use sessionbox_core::{ConversationRef, ExecRequest, Session};
use sessionbox_local::isolated::SandboxInfo;
use sessionbox_manager::Manager;

use crate::run::Bench;
use crate::stats::{Stats, exec_true, ms, round3, spawn_baseline};

/// Size of the file written and read back.
const FILE_BYTES: usize = 4096;
/// `/bin/true` runs per command when measuring one fork + exec inside the workspace.
const SPAWN_LOOP: usize = 100;
/// Commands of [`SPAWN_LOOP`] runs each.
pub(crate) const SPAWN_LOOP_REPEATS: usize = 5;

/// Every measurement of one runtime; conversations it creates are pushed to `created` before
/// anything can fail, so the caller destroys them whatever happens. One baseline sample is
/// pushed to `base` before each warm exec, so both see the machine in the same state.
pub(crate) async fn measure(
    b: &mut Bench,
    kind: RuntimeKind,
    manager: &Manager,
    base: &mut Vec<f64>,
    created: &mut Vec<ConversationRef>,
) -> anyhow::Result<Value> {
    let name = kind.name();
    let mut out = serde_json::Map::new();
    let cold = cold_starts(b, name, manager, created, false).await?;
    out.insert("cold_start".into(), cold);
    if matches!(kind, RuntimeKind::Isolated | RuntimeKind::Opensandbox) {
        let pooled = cold_starts(b, name, manager, created, true).await?;
        out.insert("cold_start_pooled".into(), pooled);
    }
    if kind == RuntimeKind::Isolated {
        // A failed call is reported (and misses its target), not the end of the run.
        match crate::cli::calls(b, created) {
            Ok(Some(cli)) => {
                out.insert("cli_call".into(), cli);
            }
            Ok(None) => {}
            Err(e) => {
                out.insert("cli_call".into(), json!({"error": format!("{e:#}")}));
            }
        }
    }
    // One warm conversation for everything else.
    let conv = b.conversation("warm")?;
    created.push(conv.clone());
    let s = manager.open(&conv).await?;
    b.note_cgroups(&conv);
    out.insert("warm_exec".into(), warm_exec(b, name, &s, base).await?);
    let files = file_write_read(b, name, &s).await?;
    out.insert("file_write_read_4k".into(), files);
    let reopen = warm_open(b, name, manager, &conv).await?;
    out.insert("warm_open".into(), reopen);
    let breakdown = breakdown(b, name, kind, manager, &conv).await?;

    if kind == RuntimeKind::Isolated {
        let info = b
            .sandbox_info(&conv)
            .context("the isolated runtime recorded no sandbox for the warm conversation")?;
        out.insert("memory".into(), memory(&info)?);
    }
    out.insert("breakdown".into(), breakdown);
    Box::new(s).close().await?;
    Ok(Value::Object(out))
}

/// Cold starts: a new conversation opened and `true` run in it, each after a pause; its close
/// and destroy are not timed.
///
/// From the warm pool (`pooled`): before each (untimed, with the pause), the tenant's pool is
/// refilled to one launched sandbox, which the new conversation then takes. A refill that
/// launches nothing means the last open did not take the pooled sandbox: an error, since the
/// measurement would then be of ordinary launches. The pool is drained at the end. For
/// `opensandbox` (issue 20's target: p50 at most 100 ms) the pooled sandbox is a server-side
/// slot bound in one store transaction.
async fn cold_starts(
    b: &mut Bench,
    name: &str,
    manager: &Manager,
    created: &mut Vec<ConversationRef>,
    pooled: bool,
) -> anyhow::Result<Value> {
    let runtime = manager.runtime().clone();
    let tenant = b.tenant.clone();
    b.progress.set_message(if pooled {
        format!("{name} cold start from the warm pool")
    } else {
        format!("{name} cold start")
    });
    let (mut total, mut open, mut first) = (Vec::new(), Vec::new(), Vec::new());
    let mut destroy = Vec::new();
    for i in 0..b.cold {
        let prefix = if pooled { "pooled" } else { "cold" };
        let conv = b.conversation(&format!("{prefix}-{i:05}"))?;
        created.push(conv.clone());
        if pooled {
            let launched = runtime.refill_pool(&tenant).await?;
            if launched != 1 {
                bail!("the warm pool was not used: a refill launched {launched} sandboxes, not 1");
            }
        }
        tokio::time::sleep(b.cold_pause).await;
        let t = Instant::now();
        let s = manager.open(&conv).await?;
        let opened = ms(t);
        let t1 = Instant::now();
        exec_true(&s).await?;
        let first_exec = ms(t1);
        total.push(ms(t));
        open.push(opened);
        first.push(first_exec);
        if !s.created() {
            bail!("conversation {} existed before the bench", conv.id);
        }
        b.note_cgroups(&conv);
        Box::new(s).close().await?;
        let t = Instant::now();
        manager.destroy(&conv).await?;
        destroy.push(ms(t));
        b.progress.inc(1);
    }
    if pooled {
        runtime.prune_pool(true).await?;
    }
    Ok(json!({
        "what": if pooled {
            "manager open of a new conversation that takes a warm pool's sandbox + exec `true` (refill, close and destroy not timed)"
        } else {
            "manager open of a new conversation + exec `true` (close and destroy not timed)"
        },
        "stats": Stats::of(&total),
        "phases": {
            "open": Stats::of(&open),
            "first_exec": Stats::of(&first),
        },
        "destroy_untimed": Stats::of(&destroy),
    }))
}

/// Warm execs of `true` on `s`, after a warm-up, one baseline sample pushed to `base` before
/// each.
async fn warm_exec(
    b: &Bench,
    name: &str,
    s: &dyn Session,
    base: &mut Vec<f64>,
) -> anyhow::Result<Value> {
    b.progress.set_message(format!("{name} warm exec"));
    for _ in 0..b.warmup {
        spawn_baseline()?;
        exec_true(s).await?;
        b.progress.inc(1);
    }
    let mut execs = Vec::with_capacity(b.warm);
    for _ in 0..b.warm {
        base.push(spawn_baseline()?);
        let t = Instant::now();
        exec_true(s).await?;
        execs.push(ms(t));
        b.progress.inc(1);
    }
    Ok(json!(Stats::of(&execs)))
}

/// A 4 KiB file written and read back on `s`, N times.
async fn file_write_read(b: &Bench, name: &str, s: &dyn Session) -> anyhow::Result<Value> {
    b.progress.set_message(format!("{name} file write+read"));
    let data: Vec<u8> = (0..FILE_BYTES).map(|i| (i % 251) as u8).collect();
    let (mut wr, mut w, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..b.warm {
        let path = format!("bench-{}.bin", i % 4);
        let t = Instant::now();
        s.write(&path, &data).await?;
        let written = ms(t);
        let t1 = Instant::now();
        let got = s.read(&path).await?;
        r.push(ms(t1));
        wr.push(ms(t));
        w.push(written);
        if got != data {
            bail!(
                "read back {} bytes that differ from the 4 KiB written",
                got.len()
            );
        }
        b.progress.inc(1);
    }
    Ok(json!({
        "stats": Stats::of(&wr),
        "write": Stats::of(&w),
        "read": Stats::of(&r),
    }))
}

/// Reopening the warm conversation `conv`: what every CLI call pays before its operation.
async fn warm_open(
    b: &Bench,
    name: &str,
    manager: &Manager,
    conv: &ConversationRef,
) -> anyhow::Result<Value> {
    b.progress.set_message(format!("{name} warm open"));
    let mut reopen = Vec::with_capacity(b.warm);
    for _ in 0..b.warm {
        let t = Instant::now();
        let again = manager.open(conv).await?;
        reopen.push(ms(t));
        Box::new(again).close().await?;
        b.progress.inc(1);
    }
    Ok(json!({
        "what": "manager open of an existing conversation whose sandbox is up (close not timed)",
        "stats": Stats::of(&reopen),
    }))
}

/// Where a warm exec's time goes: the same exec on the runtime's own session, for `isolated`
/// the execd client build and HTTP round trip, and one fork + exec inside the workspace.
async fn breakdown(
    b: &Bench,
    name: &str,
    kind: RuntimeKind,
    manager: &Manager,
    conv: &ConversationRef,
) -> anyhow::Result<Value> {
    b.progress.set_message(format!("{name} breakdown"));
    let mut breakdown = serde_json::Map::new();
    let raw = manager.runtime().open(conv).await?;
    for _ in 0..b.warmup {
        exec_true(raw.as_ref()).await?;
    }
    let mut raw_execs = Vec::with_capacity(b.warm);
    for _ in 0..b.warm {
        let t = Instant::now();
        exec_true(raw.as_ref()).await?;
        raw_execs.push(ms(t));
        b.progress.inc(1);
    }
    breakdown.insert(
        "exec_without_manager".into(),
        json!({
            "what": "warm exec `true` on the runtime's own session: no store, no audit",
            "stats": Stats::of(&raw_execs),
        }),
    );
    if kind == RuntimeKind::Isolated {
        let socket = b
            .agent_socket(conv)
            .context("the isolated runtime has an agent socket")?;
        let mut builds = Vec::with_capacity(b.cold);
        for _ in 0..b.cold {
            let t = Instant::now();
            let c = sessionbox_execd::ExecdClient::unix(&socket)?;
            builds.push(ms(t));
            drop(c);
        }
        breakdown.insert(
            "execd_client_build".into(),
            json!({
                "what": "building an execd client for the agent's socket, as every open does",
                "stats": Stats::of(&builds),
            }),
        );
        let client = sessionbox_execd::ExecdClient::unix(socket)?;
        let mut pings = Vec::with_capacity(b.warm);
        client.ping().await?;
        for _ in 0..b.warm {
            let t = Instant::now();
            client.ping().await?;
            pings.push(ms(t));
            b.progress.inc(1);
        }
        breakdown.insert(
            "http_ping".into(),
            json!({
                "what": "execd HTTP round trip on a kept-alive connection (GET /ping)",
                "stats": Stats::of(&pings),
            }),
        );
    } else {
        b.progress.inc(b.warm as u64);
    }
    let mut per_spawn = Vec::new();
    let loop_cmd = format!("i=0; while [ $i -lt {SPAWN_LOOP} ]; do /bin/true; i=$((i+1)); done");
    for _ in 0..SPAWN_LOOP_REPEATS {
        let t = Instant::now();
        let r = raw
            .exec(ExecRequest::new(loop_cmd.clone()).timeout(Duration::from_secs(120)))
            .await?;
        let elapsed = ms(t);
        if !r.success() {
            bail!(
                "the spawn loop failed: {}",
                String::from_utf8_lossy(&r.stderr)
            );
        }
        per_spawn.push(elapsed / SPAWN_LOOP as f64);
        b.progress.inc(1);
    }
    breakdown.insert(
        "fork_exec_in_workspace".into(),
        json!({
            "what": format!("one /bin/true spawned by a command's shell in the workspace (wall time of a loop of {SPAWN_LOOP}, divided; {SPAWN_LOOP_REPEATS} loops)"),
            "stats": Stats::of(&per_spawn),
        }),
    );
    raw.close().await?;
    Ok(Value::Object(breakdown))
}

/// Throughput at each concurrency level and a 1 MiB write + read, on `manager`'s runtime.
pub(crate) async fn more_measurements(
    b: &Bench,
    manager: &Manager,
    levels: &[usize],
    execs: usize,
    created: &mut Vec<ConversationRef>,
) -> anyhow::Result<Value> {
    let prefix = format!("bench-{}", b.id);
    let throughput =
        crate::scale::throughput(&b.tenant, &prefix, levels, execs, created, |c| async move {
            Ok(manager.open(&c).await?)
        })
        .await?;
    let conv = b.conversation("mib")?;
    created.push(conv.clone());
    let s = manager.open(&conv).await?;
    let file = crate::scale::file_mib(&s, b.warm.clamp(3, 50)).await?;
    Box::new(s).close().await?;
    Ok(json!({"throughput": throughput, "file_1mib": file}))
}

/// Memory of one process, from `/proc/<pid>/status` and `smaps_rollup`, in KiB.
#[derive(Debug, Clone, Serialize)]
struct ProcMem {
    pid: u32,
    role: &'static str,
    cmdline: String,
    rss_kib: u64,
    rss_anon_kib: Option<u64>,
    rss_file_kib: Option<u64>,
    pss_kib: Option<u64>,
    threads: Option<u64>,
}

pub(crate) fn status_field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name)?
            .strip_prefix(':')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

fn mib(kib: u64) -> f64 {
    round3(kib as f64 / 1024.0)
}

/// Resident memory of the sandbox `rec` describes.
fn memory(rec: &SandboxInfo) -> anyhow::Result<Value> {
    let mut pids = BTreeSet::new();
    for cg in &rec.cgroups {
        if let Ok(s) = std::fs::read_to_string(cg.join("cgroup.procs")) {
            pids.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
    }
    let mut procs = Vec::new();
    for pid in pids {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let role = if argv.get(1).is_some_and(|a| a == "agent") {
            "agent"
        } else if pid == rec.init_pid {
            "init"
        } else if pid == rec.monitor_pid {
            "monitor"
        } else {
            "other"
        };
        let pss = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
            .ok()
            .and_then(|s| status_field(&s, "Pss"));
        procs.push(ProcMem {
            pid,
            role,
            cmdline: argv.join(" "),
            rss_kib: status_field(&status, "VmRSS").unwrap_or(0),
            rss_anon_kib: status_field(&status, "RssAnon"),
            rss_file_kib: status_field(&status, "RssFile"),
            pss_kib: pss,
            threads: status_field(&status, "Threads"),
        });
    }
    let agents: Vec<&ProcMem> = procs.iter().filter(|p| p.role == "agent").collect();
    let [agent] = agents.as_slice() else {
        bail!(
            "expected one agent process in the sandbox's cgroups, found {}: {procs:?}",
            agents.len()
        );
    };
    let total: u64 = procs.iter().map(|p| p.rss_kib).sum();
    let cgroup_bytes = rec.cgroups.iter().find_map(|cg| {
        ["memory.current", "memory.usage_in_bytes"]
            .iter()
            .find_map(|f| std::fs::read_to_string(cg.join(f)).ok())
            .and_then(|s| s.trim().parse::<u64>().ok())
    });
    Ok(json!({
        "agent_rss_mib": mib(agent.rss_kib),
        "agent_pss_mib": agent.pss_kib.map(mib),
        "sandbox_rss_mib": mib(total),
        "cgroup_memory_mib": cgroup_bytes.map(|b| round3(b as f64 / (1024.0 * 1024.0))),
        "processes": procs,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_kib() {
        let text = "Name:\tsessionbox\nVmRSS:\t    7340 kB\nRssAnon:\t  2048 kB\n";
        assert_eq!(status_field(text, "VmRSS"), Some(7340));
        assert_eq!(status_field(text, "RssAnon"), Some(2048));
        assert_eq!(status_field(text, "Vm"), None);
        assert_eq!(mib(7340), 7.168);
    }
}
