//! `sessionbox-bench`: how fast sessionbox's runtimes are, and what its egress gateway costs,
//! as ratios against baselines measured in the same run. `sessionbox bench` and
//! `sessionbox bench-egress` run this executable; it is kept out of the `sessionbox` binary
//! with everything only it uses (plotting, an MCP client), as ripgrep keeps its benchsuite out
//! of `rg`.
//!
//! The runtimes are built as the command line builds them ([`sessionbox::runtime`]), with this
//! executable as the one they start again: the sandbox init, a host command's supervisor and
//! the agent (`sessionbox-bench agent …`, as `sessionbox agent …`).

#[macro_use]
extern crate sessionbox;

mod baselines;
mod callgrind;
mod cli;
mod egress;
mod http;
mod live;
mod markdown;
mod mcp;
mod measure;
mod plot;
mod report;
mod run;
mod scale;
mod snapshots;
mod stats;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sessionbox::config::RuntimeKind;

/// Measure the runtimes (cold start, warm exec, files, agent memory) against a bare spawn
/// baseline measured in the same run.
///
/// Both runtimes unless --runtime (or SESSIONBOX_RUNTIME) names one; default runtime settings
/// (no configuration file is read); a temporary data directory unless --data-dir. Exits 0 when
/// a target is missed unless --check. Build with --release: debug numbers are not meaningful.
#[derive(Debug, Parser)]
#[command(name = "sessionbox-bench", version)]
struct Cli {
    /// Data directory [default: a temporary one, removed at the end].
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Tenant whose conversations to use [default: "default"].
    #[arg(long, global = true, env = "SESSIONBOX_TENANT")]
    tenant: Option<String>,
    /// The one runtime to measure [default: isolated and host, and opensandbox when
    /// OPEN_SANDBOX_DOMAIN is set].
    #[arg(long, global = true, env = "SESSIONBOX_RUNTIME", value_enum)]
    runtime: Option<RuntimeKind>,
    #[command(flatten)]
    bench: run::BenchArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure the egress gateway: latency added per CONNECT and throughput, against direct
    /// connections to the same target in the same run (needs root: the target runs in a
    /// network namespace the benchmark creates and removes).
    Egress(egress::BenchEgressArgs),
    /// What the callgrind runs count: warm execs of `true` on a new isolated conversation in a
    /// temporary data directory (see the bench's instruction counts).
    #[command(hide = true)]
    WarmExecs {
        /// Counted execs (after a warm-up of 3).
        #[arg(long)]
        execs: usize,
    },
}

fn main() -> ExitCode {
    // The sandbox init must start in a fresh single-threaded process: before anything else.
    sessionbox::runtime::become_helper_if_started_as_one();
    let mut args = std::env::args_os();
    let _program = args.next();
    let rest: Vec<OsString> = args.collect();
    if rest.first().is_some_and(|a| a == "agent") {
        return sessionbox::runtime::run_agent(rest.into_iter().skip(1));
    }
    let cli = Cli::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        match &cli.command {
            Some(Command::Egress(args)) => egress::run(args).await,
            Some(Command::WarmExecs { execs }) => callgrind::warm_execs(*execs).await,
            None => run::run(&cli.bench, cli.data_dir, cli.runtime, cli.tenant).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
