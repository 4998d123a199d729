//! `sessionbox bench`: how fast the runtimes are, as ratios against a baseline measured in the
//! same run.
//!
//! 1. Baseline: a bare spawn of `/bin/sh -c true` from this process (`std::process::Command`,
//!    spawn to wait), one right before each warm exec of each runtime, so that the baseline and
//!    the execs it is compared with see the machine in the same state.
//! 2. For each runtime (`isolated` and `host` unless `--runtime` names one):
//!    - cold start: open a NEW conversation through the manager and run `true` in it (create to
//!      first exec); its close and destroy are not timed, nor a pause before each (100 ms by
//!      default: new conversations do not arrive back to back, and a launch after a pause pays
//!      an RCU grace period in its first cgroup migration that back-to-back launches mostly
//!      skip);
//!    - warm exec: `true` on an open conversation, N times, after a short warm-up;
//!    - warm file write + read of a 4 KiB file, N times;
//!    - for `isolated`, the resident memory of the agent of that warm conversation and of its
//!      whole sandbox (every process of its cgroups, from `run/<key>/sandbox.json`);
//!    - reopening the warm conversation (what every CLI call pays before its operation);
//!    - a breakdown of where the time goes: the same exec on the runtime's own session (no store,
//!      no audit), for `isolated` the execd HTTP round trip (`GET /ping`) and the cost of
//!      building an execd client (every open builds one), and the cost of one fork + exec inside
//!      the workspace (a loop of `/bin/true` in one command).
//! 3. Targets (printed PASS/FAIL and kept in the JSON): cold start p50 <= 20 ms, warm exec p50
//!    <= 2 ms and <= 2.5x the baseline p50, agent RSS <= 10 MiB. A missed target is reported, not
//!    an error, unless `--check`.
//! 4. Cleanup: every conversation it created is destroyed and the runtimes' inventories, the
//!    store's records and the sandboxes' cgroups are compared with those before; a leftover is
//!    an error (exit 1). Without `--data-dir` everything happens in a temporary data directory,
//!    removed at the end.
//!
//! Runtime settings are the defaults (the configuration file is not read), so numbers from
//! different machines compare.

use crate::experiment::Inventory;
use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use serde_json::{Value, json};
use sessionbox_core::{ConversationId, ConversationRef, ExecRequest, Runtime, Session, TenantId};
use sessionbox_local::host::{HostConfig, HostRuntime};
use sessionbox_local::isolated::{IsolatedConfig, IsolatedRuntime};
use sessionbox_local::sandbox::SandboxLimits;
use sessionbox_manager::Manager;
use sessionbox_store::Store;

use crate::config::RuntimeKind;

/// Cold start p50 target, ms.
const COLD_START_P50_MS: f64 = 20.0;
/// Warm exec p50 target, ms.
const WARM_EXEC_P50_MS: f64 = 2.0;
/// Warm exec p50 target, as a multiple of the baseline p50.
const WARM_EXEC_RATIO: f64 = 2.5;
/// Agent resident memory target, MiB.
const AGENT_RSS_MIB: f64 = 10.0;
/// Size of the file written and read back.
const FILE_BYTES: usize = 4096;
/// `/bin/true` runs per command when measuring one fork + exec inside the workspace.
const SPAWN_LOOP: usize = 100;
/// Commands of [`SPAWN_LOOP`] runs each.
const SPAWN_LOOP_REPEATS: usize = 5;
/// Idle timeout of the agents the bench starts: if it is killed, they end themselves soon.
const AGENT_IDLE: Duration = Duration::from_secs(60);
/// Prefix of the temporary data directory's name.
const TEMP_PREFIX: &str = "sbx-bench-";
/// Length of that name (prefix and random part).
const TEMP_NAME_LEN: usize = 16;
/// Longest data directory whose `run/<key>/agent.sock` fits in a Unix socket address (107
/// bytes: `/run/` 5, key 64, `/agent.sock` 11).
const MAX_DATA_DIR_LEN: usize = 107 - 5 - 64 - 11;

/// Options of `sessionbox bench`.
///
/// The runtimes measured are `isolated` and `host`, or only the one named by the global
/// `--runtime` (or `SESSIONBOX_RUNTIME`).
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Iterations of each warm operation (one baseline spawn runs before each warm exec).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    iterations: u32,
    /// Cold starts (new conversations) per runtime.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    cold_iterations: u32,
    /// Pause before each cold start, untimed, in milliseconds. New conversations do not arrive
    /// back to back: after a pause the kernel's first cgroup migration waits for an RCU grace
    /// period, which back-to-back cold starts mostly skip (0 measures that best case).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    cold_pause_ms: u64,
    /// Write the report as JSON here.
    #[arg(long, value_name = "PATH")]
    report_json: Option<PathBuf>,
    /// Write the report as Markdown here.
    #[arg(long, value_name = "PATH")]
    report_md: Option<PathBuf>,
    /// Exit 1 when a target is missed (by default the report exits 0 either way).
    #[arg(long)]
    check: bool,
    /// A smoke run: few iterations of everything (20 warm, 3 cold, concurrency 1 and 8, a
    /// small HTTP load). Proves the harness works; its numbers are rough.
    #[arg(long)]
    quick: bool,
    /// Write report.json, report.md and the PNG plots into this directory (created).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Concurrency levels of the throughput measurement, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256")]
    levels: Vec<u32>,
    /// Execs of `true` per conversation at each concurrency level.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    level_execs: u32,
    /// Image for the `docker run --rm` baseline [default: a local sessionbox/sandbox image].
    #[arg(long, value_name = "IMAGE")]
    docker_image: Option<String>,
    /// Skip the HTTP measurements (round trip against the library, and the load test).
    #[arg(long)]
    no_http: bool,
    /// HTTP load test: new conversations.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    http_conversations: u32,
    /// HTTP load test: execs of `true` per conversation.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    http_execs: u32,
    /// HTTP load test: concurrent clients.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    http_clients: u32,
}

/// Latency summary of one measurement, in milliseconds (rounded to the microsecond).
#[derive(Debug, Clone, Serialize)]
struct Stats {
    count: usize,
    p50_ms: f64,
    p95_ms: f64,
    mean_ms: f64,
    min_ms: f64,
    max_ms: f64,
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

impl Stats {
    /// Nearest-rank percentiles of `samples` (ms). Panics on an empty slice.
    fn of(samples: &[f64]) -> Stats {
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

/// Milliseconds since `since` (for the other bench modules).
pub(crate) fn ms_since(since: Instant) -> f64 {
    ms(since)
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

fn leftovers(before: &Inventory, after: &Inventory, runtime: &str) -> Vec<String> {
    let left = after.added_since(before);
    let removed = after.removed_since(before);
    left.into_iter()
        .map(|x| format!("{runtime}: {x} left behind"))
        .chain(
            removed
                .into_iter()
                .map(|x| format!("{runtime}: {x} removed but not created by the bench")),
        )
        .collect()
}

/// The state of one run.
struct Bench {
    data_dir: PathBuf,
    store: Store,
    tenant: TenantId,
    id: String,
    warm: usize,
    warmup: usize,
    cold: usize,
    cold_pause: Duration,
    progress: indicatif::ProgressBar,
    /// Cgroup directories of every sandbox seen, checked to be gone at the end.
    cgroups: BTreeSet<PathBuf>,
}

impl Bench {
    fn conversation(&self, name: &str) -> anyhow::Result<ConversationRef> {
        let id = ConversationId::new(format!("bench-{}-{name}", self.id))?;
        Ok(ConversationRef::new(self.tenant.clone(), id))
    }

    fn runtime(&self, kind: RuntimeKind) -> anyhow::Result<Arc<dyn Runtime>> {
        Ok(match kind {
            RuntimeKind::Isolated => {
                let uid_store = self.store.clone();
                let exe =
                    std::env::current_exe().context("cannot find the sessionbox executable")?;
                Arc::new(IsolatedRuntime::new(IsolatedConfig {
                    data_dir: self.data_dir.clone(),
                    limits: Default::default(),
                    sandbox: SandboxLimits::default(),
                    idle_timeout: AGENT_IDLE,
                    exe,
                    agent_args: vec!["agent".to_owned()],
                    // The defaults of `[isolated] uid_base` and `uid_count`.
                    allocate_uid: Arc::new(move |key| {
                        uid_store.allocate_uid(key, 3_000_000..3_065_536)
                    }),
                    idle_timeout_of: None,
                })?)
            }
            RuntimeKind::Host => Arc::new(HostRuntime::new(HostConfig::new(&self.data_dir))?),
            RuntimeKind::Aio => anyhow::bail!(
                "bench measures the local runtimes (isolated, host); the aio runtime's speed is the remote server's"
            ),
            // The server comes from OPEN_SANDBOX_DOMAIN, the key from OPEN_SANDBOX_API_KEY.
            RuntimeKind::Opensandbox => Arc::new(crate::opensandbox::runtime(
                None,
                &Default::default(),
                &self.data_dir,
                self.store.clone(),
            )?),
        })
    }

    fn run_dir(&self, conv: &ConversationRef) -> PathBuf {
        self.data_dir.join("run").join(conv.key.as_str())
    }

    /// Notes the cgroups of `conv`'s sandbox (if it has one) for the final check.
    fn note_cgroups(&mut self, conv: &ConversationRef) {
        if let Some(rec) = sandbox_record(&self.run_dir(conv)) {
            self.cgroups.extend(rec.cgroups);
        }
    }
}

/// Runs the bench.
pub async fn run(
    args: &BenchArgs,
    data_dir: Option<PathBuf>,
    runtime: Option<RuntimeKind>,
    tenant: Option<String>,
) -> anyhow::Result<ExitCode> {
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    if profile == "debug" {
        eprintln!(
            "WARNING: this is a DEBUG build: its numbers are NOT meaningful. Run `cargo run --release -- bench`."
        );
    }
    let started = chrono::Utc::now();
    let t0 = Instant::now();
    let env = environment(profile);
    let kinds: Vec<RuntimeKind> = match runtime {
        Some(RuntimeKind::Aio) => anyhow::bail!(
            "bench measures the local runtimes (isolated, host); use --runtime isolated or host"
        ),
        Some(k) => vec![k],
        // With an OpenSandbox server configured, it is measured in the same run.
        None if std::env::var_os(crate::opensandbox::DOMAIN_ENV).is_some_and(|v| !v.is_empty()) => {
            vec![
                RuntimeKind::Isolated,
                RuntimeKind::Host,
                RuntimeKind::Opensandbox,
            ]
        }
        None => vec![RuntimeKind::Isolated, RuntimeKind::Host],
    };
    let tenant = TenantId::new(tenant.unwrap_or_else(|| TenantId::DEFAULT.to_owned()))?;
    // Without --data-dir: a fresh temporary directory, removed when this returns.
    let (temp, data_dir) = match data_dir {
        Some(d) => (None, d),
        None => {
            // The isolated runtime binds `<data>/run/<64 hex>/agent.sock`, and a socket path
            // has at most 107 bytes: keep the directory short.
            let tmp = std::env::temp_dir();
            let base = if tmp.as_os_str().len() + 1 + TEMP_NAME_LEN <= MAX_DATA_DIR_LEN {
                tmp
            } else {
                PathBuf::from("/tmp")
            };
            let t = tempfile::Builder::new()
                .prefix(TEMP_PREFIX)
                .rand_bytes(TEMP_NAME_LEN - TEMP_PREFIX.len())
                .tempdir_in(&base)
                .with_context(|| {
                    format!(
                        "cannot create a temporary data directory in {}",
                        base.display()
                    )
                })?;
            let d = t.path().to_path_buf();
            (Some(t), d)
        }
    };
    if kinds.contains(&RuntimeKind::Isolated) {
        let abs = std::path::absolute(&data_dir).unwrap_or_else(|_| data_dir.clone());
        if abs.as_os_str().len() > MAX_DATA_DIR_LEN {
            bail!(
                "--data-dir {}: the isolated runtime needs a data directory of at most {MAX_DATA_DIR_LEN} bytes (its agent sockets are <data dir>/run/<key>/agent.sock, and a socket path has at most 107); give a shorter one, or --runtime host",
                abs.display()
            );
        }
    }
    let store = Store::open(&data_dir.join("sessionbox.db"))?;

    let (warm, cold) = if args.quick {
        (20, 3)
    } else {
        (args.iterations as usize, args.cold_iterations as usize)
    };
    let levels: Vec<usize> = if args.quick {
        vec![1, 8]
    } else {
        args.levels.iter().map(|&l| l.max(1) as usize).collect()
    };
    let level_execs = if args.quick {
        5
    } else {
        args.level_execs as usize
    };
    let baseline_runs = if args.quick { 3 } else { 20 };
    let warmup = (warm / 10).clamp(1, 20);
    let progress = if std::io::stderr().is_terminal() {
        // Per runtime: cold starts, warm-up, then execs, files, reopens, execs without the
        // manager and pings (N each), spawn loops.
        let per_runtime = cold + warmup + 5 * warm + SPAWN_LOOP_REPEATS;
        let pb = indicatif::ProgressBar::new((kinds.len() * per_runtime) as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg:<22} [{bar:40}] {pos}/{len}")
                .expect("static template")
                .progress_chars("=> "),
        );
        pb
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut bench = Bench {
        data_dir: data_dir.clone(),
        store,
        tenant,
        id: crate::experiment::run_id(),
        warm,
        warmup,
        cold,
        cold_pause: Duration::from_millis(args.cold_pause_ms),
        progress,
        cgroups: BTreeSet::new(),
    };

    let mut results = serde_json::Map::new();
    let mut base_samples = Vec::new();
    let mut cleanup_failures = Vec::new();
    let mut error = None;
    for kind in &kinds {
        let rt = bench.runtime(*kind)?;
        let manager = Manager::new(bench.store.clone(), rt);
        let before = Inventory::take(&manager)
            .await
            .context("cannot take the inventory before the run")?;
        let mut created = Vec::new();
        let mut measured =
            measure(&mut bench, *kind, &manager, &mut base_samples, &mut created).await;
        if let (Ok(r), false) = (&mut measured, args.no_http) {
            bench
                .progress
                .set_message(format!("{} over HTTP", kind.name()));
            let remote = *kind == RuntimeKind::Opensandbox;
            let load = if args.quick {
                crate::bench_http::Load {
                    levels: levels
                        .iter()
                        .copied()
                        .filter(|&l| !remote || l <= 8)
                        .collect(),
                    level_execs,
                    conversations: if remote { 4 } else { 10 },
                    execs: 3,
                    clients: 4,
                }
            } else {
                crate::bench_http::Load {
                    levels: levels
                        .iter()
                        .copied()
                        .filter(|&l| !remote || l <= 8)
                        .collect(),
                    level_execs,
                    // A container per conversation: a smaller load on a remote server.
                    conversations: if remote {
                        (args.http_conversations as usize).min(16)
                    } else {
                        args.http_conversations as usize
                    },
                    execs: args.http_execs as usize,
                    clients: if remote {
                        (args.http_clients as usize).min(8)
                    } else {
                        args.http_clients as usize
                    },
                }
            };
            match crate::bench_http::measure(
                &manager,
                &bench.tenant,
                &bench.id,
                bench.warm,
                load,
                &mut created,
            )
            .await
            {
                Ok(h) => r["http"] = h,
                Err(e) => measured = Err(e.context("over HTTP")),
            }
        }
        if let Ok(r) = &mut measured {
            bench
                .progress
                .set_message(format!("{} at scale", kind.name()));
            // A remote server makes a container per conversation: at most 8 at once here.
            let kind_levels: Vec<usize> = if *kind == RuntimeKind::Opensandbox {
                levels.iter().copied().filter(|&l| l <= 8).collect()
            } else {
                levels.clone()
            };
            match more_measurements(&bench, &manager, &kind_levels, level_execs, &mut created).await
            {
                Ok(m) => {
                    r["throughput"] = m["throughput"].clone();
                    r["file_1mib"] = m["file_1mib"].clone();
                    if let Some(rss) = r["memory"]["sandbox_rss_mib"].as_f64()
                        && rss > 0.0
                    {
                        r["memory"]["sandboxes_per_gib"] = json!((1024.0 / rss).floor());
                    }
                }
                Err(e) => measured = Err(e.context("at scale")),
            }
        }
        bench
            .progress
            .set_message(format!("{} cleanup", kind.name()));
        for c in &created {
            if let Err(e) = manager.destroy(c).await {
                cleanup_failures.push(format!("{}: destroy {}: {e}", kind.name(), c.id));
            }
        }
        let after = Inventory::take(&manager)
            .await
            .context("cannot take the inventory after the run")?;
        cleanup_failures.extend(leftovers(&before, &after, kind.name()));
        match measured {
            Ok(r) => {
                results.insert(kind.name().to_owned(), r);
            }
            Err(e) => {
                error = Some(e.context(format!("measuring the {} runtime", kind.name())));
                break;
            }
        }
    }
    for cg in &bench.cgroups {
        if cg.exists() {
            cleanup_failures.push(format!("cgroup {} left behind", cg.display()));
        }
    }
    bench.progress.finish_and_clear();
    if let Some(e) = error {
        for f in &cleanup_failures {
            eprintln!("cleanup: {f}");
        }
        return Err(e);
    }

    bench.progress.set_message("baselines");
    let alternatives = json!({
        "bubblewrap": crate::bench_baselines::bubblewrap(baseline_runs),
        "docker_run": crate::bench_baselines::docker_run(baseline_runs, args.docker_image.as_deref()),
    });
    let store_ops = crate::bench_scale::store_ops(
        &bench.store,
        &bench.tenant,
        &bench.id,
        if args.quick { 200 } else { 2000 },
    )?;

    let baseline = Stats::of(&base_samples);
    let mut alternatives = alternatives;
    add_ratios(&mut alternatives, &baseline);
    let mut results = Value::Object(results);
    add_ratios(&mut results, &baseline);
    let targets: Vec<Value> = kinds
        .iter()
        .flat_map(|k| judge(*k, &results[k.name()], &baseline))
        .collect();
    let targets_met = targets.iter().all(|t| t["pass"] == true);
    let report = json!({
        "kind": "sessionbox-bench",
        "targets_met": targets_met,
        "started": started.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "duration_ms": t0.elapsed().as_millis() as u64,
        "build_profile": profile,
        "environment": env,
        "iterations": {"warm": warm, "warmup": warmup, "cold": cold, "cold_pause_ms": args.cold_pause_ms},
        "runtimes": kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "data_dir": if temp.is_some() { Value::Null } else { json!(data_dir) },
        "tenant": bench.tenant.as_str(),
        "run_id": bench.id,
        "baseline": {
            "what": "std::process::Command `/bin/sh -c true`, spawn to wait, from the bench process, one before each warm exec",
            "stats": baseline,
        },
        "alternatives": alternatives,
        "store": store_ops,
        "results": results,
        "targets": targets,
        "cleanup": {"ok": cleanup_failures.is_empty(), "failures": cleanup_failures},
    });
    if let Some(p) = &args.report_json {
        std::fs::write(p, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    let mut md = markdown(&report);
    if let Some(p) = &args.report_md {
        std::fs::write(p, &md).with_context(|| format!("cannot write {}", p.display()))?;
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        md.push_str(&plots(&report, dir));
        std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", dir.display()))?;
        std::fs::write(dir.join("report.md"), &md)
            .with_context(|| format!("cannot write {}", dir.display()))?;
    }
    out!("{md}");
    if let Some(t) = temp {
        t.close()
            .context("cannot remove the temporary data directory")?;
    }
    if !cleanup_failures.is_empty() {
        bail!("the bench left things behind (see the report)");
    }
    Ok(if args.check && !targets_met {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One baseline sample: spawn `/bin/sh -c true` from this process and wait for it (ms).
fn spawn_baseline() -> anyhow::Result<f64> {
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
fn add_ratios(v: &mut Value, base: &Stats) {
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

async fn exec_true(s: &dyn Session) -> anyhow::Result<()> {
    let r = s.exec(ExecRequest::new("true")).await?;
    if !r.success() {
        bail!(
            "`true` failed with {} ({})",
            r.shell_exit_code(),
            String::from_utf8_lossy(&r.stderr).trim()
        );
    }
    Ok(())
}

/// Every measurement of one runtime; conversations it creates are pushed to `created` before
/// anything can fail, so the caller destroys them whatever happens. One baseline sample is
/// pushed to `base` before each warm exec, so both see the machine in the same state.
async fn measure(
    b: &mut Bench,
    kind: RuntimeKind,
    manager: &Manager,
    base: &mut Vec<f64>,
    created: &mut Vec<ConversationRef>,
) -> anyhow::Result<Value> {
    let name = kind.name();
    let mut out = serde_json::Map::new();

    // Cold starts.
    b.progress.set_message(format!("{name} cold start"));
    let (mut total, mut open, mut first) = (Vec::new(), Vec::new(), Vec::new());
    let mut destroy = Vec::new();
    for i in 0..b.cold {
        let conv = b.conversation(&format!("cold-{i:05}"))?;
        created.push(conv.clone());
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
    out.insert(
        "cold_start".into(),
        json!({
            "what": "manager open of a new conversation + exec `true` (close and destroy not timed)",
            "stats": Stats::of(&total),
            "phases": {
                "open": Stats::of(&open),
                "first_exec": Stats::of(&first),
            },
            "destroy_untimed": Stats::of(&destroy),
        }),
    );

    // One warm conversation for everything else.
    let conv = b.conversation("warm")?;
    created.push(conv.clone());
    let s = manager.open(&conv).await?;
    b.note_cgroups(&conv);
    b.progress.set_message(format!("{name} warm exec"));
    for _ in 0..b.warmup {
        spawn_baseline()?;
        exec_true(&s).await?;
        b.progress.inc(1);
    }
    let mut execs = Vec::with_capacity(b.warm);
    for _ in 0..b.warm {
        base.push(spawn_baseline()?);
        let t = Instant::now();
        exec_true(&s).await?;
        execs.push(ms(t));
        b.progress.inc(1);
    }
    out.insert("warm_exec".into(), json!(Stats::of(&execs)));

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
    out.insert(
        "file_write_read_4k".into(),
        json!({
            "stats": Stats::of(&wr),
            "write": Stats::of(&w),
            "read": Stats::of(&r),
        }),
    );

    // Reopening the warm conversation: what every CLI call pays before its operation.
    b.progress.set_message(format!("{name} warm open"));
    let mut reopen = Vec::with_capacity(b.warm);
    for _ in 0..b.warm {
        let t = Instant::now();
        let again = manager.open(&conv).await?;
        reopen.push(ms(t));
        Box::new(again).close().await?;
        b.progress.inc(1);
    }
    out.insert(
        "warm_open".into(),
        json!({
            "what": "manager open of an existing conversation whose sandbox is up (close not timed)",
            "stats": Stats::of(&reopen),
        }),
    );

    // Breakdown of a warm exec.
    b.progress.set_message(format!("{name} breakdown"));
    let mut breakdown = serde_json::Map::new();
    let raw = manager.runtime().open(&conv).await?;
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
        let socket = b.run_dir(&conv).join("agent.sock");
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

    if kind == RuntimeKind::Isolated {
        out.insert("memory".into(), memory(&b.run_dir(&conv))?);
    }
    out.insert("breakdown".into(), Value::Object(breakdown));
    Box::new(s).close().await?;
    Ok(Value::Object(out))
}

/// The part of `run/<key>/sandbox.json` the bench reads.
#[derive(Debug, serde::Deserialize)]
struct SandboxRecord {
    monitor_pid: u32,
    init_pid: u32,
    cgroups: Vec<PathBuf>,
}

fn sandbox_record(run_dir: &Path) -> Option<SandboxRecord> {
    let data = std::fs::read(run_dir.join("sandbox.json")).ok()?;
    serde_json::from_slice(&data).ok()
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

fn status_field(text: &str, name: &str) -> Option<u64> {
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

/// Resident memory of the sandbox of the conversation whose run directory is `run_dir`.
fn memory(run_dir: &Path) -> anyhow::Result<Value> {
    let rec = sandbox_record(run_dir)
        .with_context(|| format!("cannot read {}", run_dir.join("sandbox.json").display()))?;
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

/// The targets that apply to one runtime's results.
/// The Markdown of the alternatives, throughput, file and store sections.
fn markdown_more(r: &Value) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let num = |v: &Value| {
        v.as_f64()
            .map_or_else(|| "-".to_owned(), |f| format!("{f}"))
    };
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

/// Throughput at each concurrency level and a 1 MiB write + read, on `manager`'s runtime.
async fn more_measurements(
    b: &Bench,
    manager: &Manager,
    levels: &[usize],
    execs: usize,
    created: &mut Vec<ConversationRef>,
) -> anyhow::Result<Value> {
    let prefix = format!("bench-{}", b.id);
    let throughput = crate::bench_scale::throughput(
        &b.tenant,
        &prefix,
        levels,
        execs,
        created,
        |c| async move { Ok(manager.open(&c).await?) },
    )
    .await?;
    let conv = b.conversation("mib")?;
    created.push(conv.clone());
    let s = manager.open(&conv).await?;
    let file = crate::bench_scale::file_mib(&s, b.warm.clamp(3, 50)).await?;
    Box::new(s).close().await?;
    Ok(json!({"throughput": throughput, "file_1mib": file}))
}

/// Draws the concurrency plots into `dir`; the Markdown lines that name them (or say why not).
fn plots(r: &Value, dir: &Path) -> String {
    use crate::bench_plot::{Series, plot};
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

fn judge(kind: RuntimeKind, r: &Value, baseline: &Stats) -> Vec<Value> {
    if kind == RuntimeKind::Opensandbox {
        // The targets are for local runtimes; a remote server's numbers are reported only.
        return Vec::new();
    }
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
    if let Some(v) = r["cold_start"]["stats"]["p50_ms"].as_f64() {
        out.push(target(
            "cold_start_p50",
            format!("cold start p50 <= {COLD_START_P50_MS} ms"),
            v,
            COLD_START_P50_MS,
            "ms",
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
                crate::bench_http::ADDED_P50_MS
            ),
            v,
            crate::bench_http::ADDED_P50_MS,
            "ms",
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

fn environment(profile: &str) -> Value {
    let mut env = crate::verify::environment();
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

fn markdown(r: &Value) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let num = |v: &Value| match v.as_f64() {
        Some(f) => format!("{f}"),
        None => "-".to_owned(),
    };
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
            "**WARNING: DEBUG BUILD. These numbers are not meaningful; run `cargo run --release -- bench`.**"
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
    let runtimes: Vec<&str> = r["runtimes"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for rt in &runtimes {
        let v = &r["results"][*rt];
        let rows: [(&str, &Value); 11] = [
            ("cold start (open + first exec)", &v["cold_start"]["stats"]),
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
                row(&mut s, format!("{rt}: {label}"), st);
            }
        }
    }
    for rt in &runtimes {
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
    for rt in &runtimes {
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
    s.push_str(&markdown_more(r));
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
    s
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

    #[test]
    fn status_fields_are_read_in_kib() {
        let text = "Name:\tsessionbox\nVmRSS:\t    7340 kB\nRssAnon:\t  2048 kB\n";
        assert_eq!(status_field(text, "VmRSS"), Some(7340));
        assert_eq!(status_field(text, "RssAnon"), Some(2048));
        assert_eq!(status_field(text, "Vm"), None);
        assert_eq!(mib(7340), 7.168);
    }
}
