//! `sessionbox-bench`, what `sessionbox bench` runs: how fast the runtimes are, as ratios
//! against a baseline measured in the same run.
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
//!    - for `isolated`, after that runtime's other conversations are destroyed: density
//!      (`--live N`, [`crate::live`]): N conversations live at once, exec p50/p99 on random ones
//!      against the same with 1 live, memory (RSS, PSS, cgroup charge) and processes and
//!      threads per sandbox and host-wide, the time to open them all; destroyed and checked
//!      like the rest.
//! 3. The alternatives, per exec ([`crate::baselines`]): bubblewrap, Anthropic's sandbox
//!    runtime (`srt`), firejail and `docker run`, each skipped with the reason when absent; and
//!    the instructions of one warm exec under callgrind ([`crate::callgrind`]).
//! 4. Targets (printed PASS/FAIL and kept in the JSON): cold start p50 <= 20 ms, warm exec p50
//!    <= 2 ms and <= 2.5x the baseline p50, agent RSS <= 10 MiB; with N live, memory charged per
//!    sandbox <= 3 MiB, exec p50 <= 2x that with 1 live, and no exec failing. A missed target is
//!    reported, not an error, unless `--check`; `--check-margin F` multiplies every limit by F
//!    for that check (a noisy machine; a zero limit stays zero) and `--check-only` names the
//!    targets it considers (`scripts/test` checks the ratios and error counts, with F = 2).
//! 5. Cleanup: every conversation it created is destroyed and the runtimes' inventories, the
//!    store's records and the sandboxes' cgroups are compared with those before; a leftover is
//!    an error (exit 1). Without `--data-dir` everything happens in a temporary data directory,
//!    removed at the end.
//!
//! Runtime settings are the defaults (the configuration file is not read), so numbers from
//! different machines compare.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use sessionbox::config::{FileConfig, RuntimeKind};
use sessionbox::experiment::Inventory;
use sessionbox::runtime::{self, BuildOptions};
use sessionbox_core::{ConversationId, ConversationRef, Runtime, TenantId};
use sessionbox_local::isolated::{IsolatedRuntime, SandboxInfo};
use sessionbox_manager::Manager;
use sessionbox_store::Store;

use crate::measure::{measure, more_measurements};
use crate::stats::{Stats, add_ratios};

/// Idle timeout of the agents the bench starts: if it is killed, they end themselves soon.
const AGENT_IDLE_SECS: u64 = 60;
/// Idle timeout of the agents of the density measurement: longer than opening them all takes.
const LIVE_IDLE_SECS: u64 = 900;
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
pub(crate) struct BenchArgs {
    /// Iterations of each warm operation (one baseline spawn runs before each warm exec).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) iterations: u32,
    /// Cold starts (new conversations) per runtime.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) cold_iterations: u32,
    /// Pause before each cold start, untimed, in milliseconds. New conversations do not arrive
    /// back to back: after a pause the kernel's first cgroup migration waits for an RCU grace
    /// period, which back-to-back cold starts mostly skip (0 measures that best case).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub(crate) cold_pause_ms: u64,
    /// Write the report as JSON here.
    #[arg(long, value_name = "PATH")]
    pub(crate) report_json: Option<PathBuf>,
    /// Write the report as Markdown here.
    #[arg(long, value_name = "PATH")]
    pub(crate) report_md: Option<PathBuf>,
    /// Exit 1 when a target is missed (by default the report exits 0 either way).
    #[arg(long)]
    pub(crate) check: bool,
    /// A smoke run: few iterations of everything (20 warm, 3 cold, concurrency 1 and 8, a
    /// small HTTP load). Proves the harness works; its numbers are rough.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Write report.json, report.md and the PNG plots into this directory (created).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Concurrency levels of the throughput measurement, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256")]
    pub(crate) levels: Vec<u32>,
    /// Workspace sizes of the snapshot measurement, in files of 10 KiB, comma-separated
    /// [default: 100,1000,10000; with --quick 100,1000].
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) snapshot_files: Vec<u32>,
    /// Execs of `true` per conversation at each concurrency level.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) level_execs: u32,
    /// Image for the `docker run --rm` baseline [default: a local sessionbox/sandbox image].
    #[arg(long, value_name = "IMAGE")]
    pub(crate) docker_image: Option<String>,
    /// Skip the `docker run` baseline (when the Docker daemon is busy with something else).
    #[arg(long)]
    pub(crate) no_docker: bool,
    /// Skip the HTTP measurements (round trip against the library, and the load test).
    #[arg(long)]
    pub(crate) no_http: bool,
    /// HTTP load test: new conversations.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) http_conversations: u32,
    /// HTTP load test: execs of `true` per conversation.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) http_execs: u32,
    /// HTTP load test: concurrent clients.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) http_clients: u32,
    /// Isolated conversations kept live at once for the density measurement [default: 1000,
    /// 50 with --quick; 0 skips it].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=20_000))]
    pub(crate) live: Option<u32>,
    /// Warm execs counted under `valgrind --tool=callgrind` (runs of K and 2K) [default: 100,
    /// 20 with --quick; 0 skips it].
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub(crate) callgrind_execs: Option<u32>,
    /// With --check: a target counts as missed only when its value exceeds its limit times
    /// this (for a noisy machine; the report's verdicts stay strict).
    #[arg(long, default_value_t = 1.0, value_name = "FACTOR")]
    pub(crate) check_margin: f64,
    /// With --check: only these targets count, as RUNTIME/ID (comma-separated; e.g.
    /// isolated/warm_exec_ratio) [default: every target].
    #[arg(long, value_delimiter = ',', value_name = "RUNTIME/ID")]
    pub(crate) check_only: Vec<String>,
    /// The opensandbox runtime's `direct` setting: `auto` (the default: straight to each
    /// sandbox's agent when the server's direct endpoint answers) or `off` (always through
    /// the server's proxy, to measure it).
    #[arg(long, default_value = "auto", value_parser = ["auto", "off"])]
    pub(crate) opensandbox_direct: String,
}

/// How much of everything one run measures, from the options (`--quick` or the counts).
struct Plan {
    warm: usize,
    warmup: usize,
    cold: usize,
    levels: Vec<usize>,
    level_execs: usize,
    baseline_runs: usize,
    store_ops: usize,
    /// Isolated conversations live at once (0: not measured).
    live: usize,
    /// Warm execs counted under callgrind (0: not measured).
    callgrind: usize,
    /// Workspace sizes of the snapshot measurement ([`crate::snapshots`]).
    snapshot_sizes: Vec<crate::snapshots::Size>,
}

impl Plan {
    fn of(args: &BenchArgs) -> Plan {
        let (warm, cold) = if args.quick {
            (20, 3)
        } else {
            (args.iterations as usize, args.cold_iterations as usize)
        };
        Plan {
            warm,
            warmup: (warm / 10).clamp(1, 20),
            cold,
            levels: if args.quick {
                vec![1, 8]
            } else {
                args.levels.iter().map(|&l| l.max(1) as usize).collect()
            },
            level_execs: if args.quick {
                5
            } else {
                args.level_execs as usize
            },
            baseline_runs: if args.quick { 3 } else { 20 },
            store_ops: if args.quick { 200 } else { 2000 },
            live: args.live.unwrap_or(if args.quick { 50 } else { 1000 }) as usize,
            callgrind: args
                .callgrind_execs
                .unwrap_or(if args.quick { 20 } else { 100 }) as usize,
            snapshot_sizes: crate::snapshots::sizes(args.quick, &args.snapshot_files),
        }
    }

    /// The concurrency levels for `kind`: a remote server makes a container per conversation,
    /// so at most 8 at once there.
    fn levels_for(&self, kind: RuntimeKind) -> Vec<usize> {
        let remote = kind == RuntimeKind::Opensandbox;
        self.levels
            .iter()
            .copied()
            .filter(|&l| !remote || l <= 8)
            .collect()
    }

    /// The HTTP load for `kind` (a smaller one on a remote server).
    fn http_load(&self, args: &BenchArgs, kind: RuntimeKind) -> crate::http::Load {
        let remote = kind == RuntimeKind::Opensandbox;
        let levels = self.levels_for(kind);
        if args.quick {
            return crate::http::Load {
                levels,
                level_execs: self.level_execs,
                conversations: if remote { 4 } else { 10 },
                execs: 3,
                clients: 4,
            };
        }
        crate::http::Load {
            levels,
            level_execs: self.level_execs,
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
    }
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
pub(crate) struct Bench {
    pub(crate) data_dir: PathBuf,
    pub(crate) store: Store,
    pub(crate) tenant: TenantId,
    pub(crate) id: String,
    pub(crate) warm: usize,
    pub(crate) warmup: usize,
    pub(crate) cold: usize,
    pub(crate) cold_pause: Duration,
    /// `[opensandbox] direct` for the opensandbox runtime.
    pub(crate) opensandbox_direct: String,
    pub(crate) progress: indicatif::ProgressBar,
    /// The runtime being measured when it is `isolated` (its sandboxes are looked at).
    isolated: Option<Arc<IsolatedRuntime>>,
    /// Cgroup directories of every sandbox seen, checked to be gone at the end.
    cgroups: BTreeSet<PathBuf>,
}

impl Bench {
    /// A conversation of this run named `name`.
    pub(crate) fn conversation(&self, name: &str) -> anyhow::Result<ConversationRef> {
        let id = ConversationId::new(format!("bench-{}-{name}", self.id))?;
        Ok(ConversationRef::new(self.tenant.clone(), id))
    }

    /// The runtime of `kind`, built as the command line builds it, with default settings (no
    /// configuration file is read) but a short agent idle timeout, and this executable as the
    /// one the runtime starts again (see `main`). For opensandbox the server comes from
    /// OPEN_SANDBOX_DOMAIN, the key from OPEN_SANDBOX_API_KEY.
    fn runtime(&mut self, kind: RuntimeKind, idle_secs: u64) -> anyhow::Result<Arc<dyn Runtime>> {
        if kind == RuntimeKind::Aio {
            bail!(
                "bench measures the local runtimes (isolated, host); the aio runtime's speed is the remote server's"
            );
        }
        let mut file = FileConfig::default();
        file.isolated.idle_timeout_secs = Some(idle_secs);
        // A pool of one, filled only by the pooled cold starts (nothing refills it on its own:
        // the bench's manager has no background refill), so every other measurement launches
        // as before.
        file.isolated.pool_size = Some(1);
        file.opensandbox.pool_size = Some(1);
        file.opensandbox.direct = Some(self.opensandbox_direct.clone());
        let exe = std::env::current_exe().context("cannot find the sessionbox-bench executable")?;
        let options = BuildOptions::new(exe);
        if kind == RuntimeKind::Isolated {
            let isolated = Arc::new(runtime::isolated_runtime(
                &file,
                &self.store,
                &self.data_dir,
                &options,
            )?);
            self.isolated = Some(isolated.clone());
            return Ok(isolated);
        }
        self.isolated = None;
        runtime::build_runtime(kind, &file, &self.store, &self.data_dir, &options)
    }

    /// What the isolated runtime recorded about `conv`'s sandbox (`None` on other runtimes).
    pub(crate) fn sandbox_info(&self, conv: &ConversationRef) -> Option<SandboxInfo> {
        self.isolated.as_ref()?.sandbox_info(&conv.key)
    }

    /// The path of `conv`'s agent socket (`None` off the isolated runtime).
    pub(crate) fn agent_socket(&self, conv: &ConversationRef) -> Option<PathBuf> {
        Some(self.isolated.as_ref()?.agent_socket(&conv.key))
    }

    /// Notes the cgroups of `conv`'s sandbox (if it has one) for the final check.
    pub(crate) fn note_cgroups(&mut self, conv: &ConversationRef) {
        if let Some(info) = self.sandbox_info(conv) {
            self.cgroups.extend(info.cgroups);
        }
    }
}

/// The runtimes to measure: the one asked for, else the local ones (and opensandbox when a
/// server is configured).
fn runtimes_to_measure(runtime: Option<RuntimeKind>) -> anyhow::Result<Vec<RuntimeKind>> {
    Ok(match runtime {
        Some(RuntimeKind::Aio) => bail!(
            "bench measures the local runtimes (isolated, host); use --runtime isolated or host"
        ),
        Some(k) => vec![k],
        // With an OpenSandbox server configured, it is measured in the same run.
        None if std::env::var_os(runtime::DOMAIN_ENV).is_some_and(|v| !v.is_empty()) => {
            vec![
                RuntimeKind::Isolated,
                RuntimeKind::Host,
                RuntimeKind::Opensandbox,
            ]
        }
        None => vec![RuntimeKind::Isolated, RuntimeKind::Host],
    })
}

/// The data directory: `given`, else a fresh temporary one (returned too: removed when it is
/// dropped). Refused when the isolated runtime's agent sockets would not fit beneath it.
pub(crate) fn data_dir(
    given: Option<PathBuf>,
    kinds: &[RuntimeKind],
) -> anyhow::Result<(Option<tempfile::TempDir>, PathBuf)> {
    let (temp, data_dir) = match given {
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
    Ok((temp, data_dir))
}

/// A progress bar on a terminal, else a hidden one.
fn progress(plan: &Plan, runtimes: usize) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    // Per runtime: cold starts, warm-up, then execs, files, reopens, execs without the
    // manager and pings (N each), spawn loops.
    let per_runtime =
        plan.cold + plan.warmup + 5 * plan.warm + crate::measure::SPAWN_LOOP_REPEATS + plan.live;
    let pb = indicatif::ProgressBar::new((runtimes * per_runtime) as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg:<22} [{bar:40}] {pos}/{len}")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb
}

/// What one runtime's measurements left: its results (or why they stopped) and what its
/// cleanup found wrong.
struct Measured {
    result: anyhow::Result<Value>,
    cleanup_failures: Vec<String>,
}

/// Every measurement of one runtime (library, HTTP, at scale), then the destroy of every
/// conversation it created and the inventory check.
async fn measure_runtime(
    bench: &mut Bench,
    args: &BenchArgs,
    plan: &Plan,
    kind: RuntimeKind,
    base_samples: &mut Vec<f64>,
) -> anyhow::Result<Measured> {
    let manager = Manager::new(bench.store.clone(), bench.runtime(kind, AGENT_IDLE_SECS)?)
        .with_snapshots(sessionbox_manager::SnapshotConfig::new(
            bench.data_dir.join("snapshots"),
        ));
    let before = Inventory::take(&manager)
        .await
        .context("cannot take the inventory before the run")?;
    let mut created = Vec::new();
    let mut measured = measure(bench, kind, &manager, base_samples, &mut created).await;
    if let (Ok(r), false) = (&mut measured, args.no_http) {
        bench
            .progress
            .set_message(format!("{} over HTTP", kind.name()));
        let load = plan.http_load(args, kind);
        match crate::http::measure(
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
        let levels = plan.levels_for(kind);
        match more_measurements(bench, &manager, &levels, plan.level_execs, &mut created).await {
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
    if let (Ok(r), true) = (
        &mut measured,
        matches!(kind, RuntimeKind::Host | RuntimeKind::Isolated),
    ) {
        bench
            .progress
            .set_message(format!("{} snapshots", kind.name()));
        match crate::snapshots::measure(bench, &manager, &plan.snapshot_sizes, &mut created).await {
            Ok(v) => r["snapshots"] = v,
            Err(e) => measured = Err(e.context("snapshots")),
        }
    }
    bench
        .progress
        .set_message(format!("{} cleanup", kind.name()));
    let mut cleanup_failures = Vec::new();
    for c in &created {
        if let Err(e) = manager.destroy(c).await {
            cleanup_failures.push(format!("{}: destroy {}: {e}", kind.name(), c.id));
        }
    }
    let after = Inventory::take(&manager)
        .await
        .context("cannot take the inventory after the run")?;
    cleanup_failures.extend(leftovers(&before, &after, kind.name()));
    if kind == RuntimeKind::Isolated && plan.live > 0 && measured.is_ok() {
        let (live, failures) = measure_live(bench, plan).await?;
        cleanup_failures.extend(failures);
        match (live, &mut measured) {
            (Ok(v), Ok(r)) => r["live"] = v,
            (Err(e), _) => measured = Err(e.context(format!("with {} live", plan.live))),
            _ => {}
        }
    }
    Ok(Measured {
        result: measured,
        cleanup_failures,
    })
}

/// The density measurement ([`crate::live`]) on a runtime of its own (agents that outlast
/// opening them all), with nothing else of the bench live; then the destroy of its
/// conversations and the inventory check.
async fn measure_live(
    bench: &mut Bench,
    plan: &Plan,
) -> anyhow::Result<(anyhow::Result<Value>, Vec<String>)> {
    let manager = Manager::new(
        bench.store.clone(),
        bench.runtime(RuntimeKind::Isolated, LIVE_IDLE_SECS)?,
    );
    let before = Inventory::take(&manager)
        .await
        .context("cannot take the inventory before the density measurement")?;
    let mut created = Vec::new();
    let result = crate::live::live(bench, &manager, plan.live, plan.warm, &mut created).await;
    bench.progress.set_message("isolated live cleanup");
    let mut failures = Vec::new();
    let t = Instant::now();
    for c in &created {
        if let Err(e) = manager.destroy(c).await {
            failures.push(format!("isolated: destroy {}: {e}", c.id));
        }
    }
    let destroy_s = t.elapsed().as_secs_f64();
    let after = Inventory::take(&manager)
        .await
        .context("cannot take the inventory after the density measurement")?;
    failures.extend(leftovers(&before, &after, "isolated (live)"));
    let result = result.map(|mut v| {
        v["destroy_all_s"] = json!(crate::stats::round3(destroy_s));
        v
    });
    Ok((result, failures))
}

/// Whether `--check` fails: the targets it considers (`--check-only`) whose value exceeds
/// their limit times `--check-margin`, as `runtime/id` (a zero limit stays zero).
fn check_failures(margin: f64, only: &[String], targets: &[Value]) -> Vec<String> {
    targets
        .iter()
        .filter_map(|t| {
            let name = format!(
                "{}/{}",
                t["runtime"].as_str().unwrap_or(""),
                t["id"].as_str().unwrap_or("")
            );
            if !only.is_empty() && !only.contains(&name) {
                return None;
            }
            let value = t["value"].as_f64().unwrap_or(f64::INFINITY);
            let limit = t["limit"].as_f64().unwrap_or(0.0) * margin;
            (value > limit).then_some(name)
        })
        .collect()
}

/// Runs the bench.
pub(crate) async fn run(
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
        warn!(
            "this is a DEBUG build: its numbers are NOT meaningful. Run `cargo run --release -p sessionbox-bench`"
        );
    }
    let started = chrono::Utc::now();
    let t0 = Instant::now();
    let env = crate::report::environment(profile);
    let kinds = runtimes_to_measure(runtime)?;
    let tenant = TenantId::new(tenant.unwrap_or_else(|| TenantId::DEFAULT.to_owned()))?;
    // Without --data-dir: a fresh temporary directory, removed when this returns.
    let (temp, data_dir) = self::data_dir(data_dir, &kinds)?;
    let store = Store::open(&data_dir.join("sessionbox.db"))?;
    let plan = Plan::of(args);
    let mut bench = Bench {
        data_dir: data_dir.clone(),
        store,
        tenant,
        id: sessionbox::experiment::run_id(),
        warm: plan.warm,
        warmup: plan.warmup,
        cold: plan.cold,
        cold_pause: Duration::from_millis(args.cold_pause_ms),
        opensandbox_direct: args.opensandbox_direct.clone(),
        progress: progress(&plan, kinds.len()),
        isolated: None,
        cgroups: BTreeSet::new(),
    };

    let mut results = serde_json::Map::new();
    let mut base_samples = Vec::new();
    let mut cleanup_failures = Vec::new();
    let mut error = None;
    for kind in &kinds {
        let measured = measure_runtime(&mut bench, args, &plan, *kind, &mut base_samples).await?;
        cleanup_failures.extend(measured.cleanup_failures);
        match measured.result {
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
            warn!("cleanup: {f}");
        }
        return Err(e);
    }

    bench.progress.set_message("baselines");
    let mut alternatives = json!({
        "bubblewrap": crate::baselines::bubblewrap(plan.baseline_runs),
        "sandbox_runtime": crate::baselines::sandbox_runtime(plan.baseline_runs),
        "firejail": crate::baselines::firejail(plan.baseline_runs),
        "docker_run": if args.no_docker {
            json!({"available": false, "reason": "turned off (--no-docker)"})
        } else {
            crate::baselines::docker_run(plan.baseline_runs, args.docker_image.as_deref())
        },
    });
    bench.progress.set_message("callgrind");
    let instructions = if kinds.contains(&RuntimeKind::Isolated) {
        crate::callgrind::measure(plan.callgrind)
    } else {
        json!({"available": false, "reason": "counted on the isolated runtime, not measured in this run"})
    };
    let store_ops =
        crate::scale::store_ops(&bench.store, &bench.tenant, &bench.id, plan.store_ops)?;

    let baseline = Stats::of(&base_samples);
    add_ratios(&mut alternatives, &baseline);
    let mut results = Value::Object(results);
    add_ratios(&mut results, &baseline);
    let targets: Vec<Value> = kinds
        .iter()
        .flat_map(|k| crate::report::judge(*k, &results[k.name()], &baseline))
        .collect();
    let targets_met = targets.iter().all(|t| t["pass"] == true);
    let check_failed = check_failures(args.check_margin, &args.check_only, &targets);
    let report = json!({
        "kind": "sessionbox-bench",
        "targets_met": targets_met,
        "started": started.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "duration_ms": t0.elapsed().as_millis() as u64,
        "build_profile": profile,
        "environment": env,
        "iterations": {"warm": plan.warm, "warmup": plan.warmup, "cold": plan.cold, "cold_pause_ms": args.cold_pause_ms},
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
        "instructions": instructions,
        "check": {
            "asked": args.check,
            "margin": args.check_margin,
            "only": args.check_only,
            "failed": check_failed,
        },
        "results": results,
        "targets": targets,
        "cleanup": {"ok": cleanup_failures.is_empty(), "failures": cleanup_failures},
    });
    write_reports(args, &report)?;
    if let Some(t) = temp {
        t.close()
            .context("cannot remove the temporary data directory")?;
    }
    if !cleanup_failures.is_empty() {
        bail!("the bench left things behind (see the report)");
    }
    Ok(if args.check && !check_failed.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Writes the report where the options say (JSON, Markdown, a directory with the plots) and
/// prints the Markdown.
fn write_reports(args: &BenchArgs, report: &Value) -> anyhow::Result<()> {
    if let Some(p) = &args.report_json {
        std::fs::write(p, serde_json::to_vec_pretty(report)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    let mut md = crate::markdown::markdown(report);
    if let Some(p) = &args.report_md {
        std::fs::write(p, &md).with_context(|| format!("cannot write {}", p.display()))?;
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        md.push_str(&crate::report::plots(report, dir));
        std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(report)?)
            .with_context(|| format!("cannot write {}", dir.display()))?;
        std::fs::write(dir.join("report.md"), &md)
            .with_context(|| format!("cannot write {}", dir.display()))?;
    }
    out!("{md}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_applies_the_margin_to_the_targets_it_is_given_only() {
        let t = |id: &str, value: f64, limit: f64| json!({"runtime": "isolated", "id": id, "value": value, "limit": limit});
        let targets = [
            t("ratio", 3.0, 2.0),
            t("errors", 1.0, 0.0),
            t("ms", 30.0, 20.0),
        ];
        let all = check_failures(1.0, &[], &targets);
        assert_eq!(all, ["isolated/ratio", "isolated/errors", "isolated/ms"]);
        // A margin of 2 forgives 3 <= 4 and 30 <= 40, never an error (0 x 2 is 0).
        assert_eq!(check_failures(2.0, &[], &targets), ["isolated/errors"]);
        let only = vec!["isolated/ms".to_owned()];
        assert_eq!(check_failures(1.0, &only, &targets), ["isolated/ms"]);
        assert!(check_failures(1.5, &only, &targets).is_empty());
    }
}
