//! `sessionbox`: isolated, resumable workspaces for AI-agent conversations.
//!
//! This binary is wiring: it reads settings, builds the store, runtime and manager, and maps
//! each subcommand onto [`sessionbox_manager::Manager`] and [`sessionbox_core::Session`].

/// `println!` for a command's results: see [`print_out`].
macro_rules! outln {
    () => {
        $crate::print_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::print_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` for a command's results: see [`print_out`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::print_out(format_args!($($arg)*))
    };
}

mod audit;
mod bench;
mod bench_baselines;
mod bench_egress;
mod bench_http;
mod bench_mcp;
mod bench_plot;
mod bench_scale;
mod config;
mod doctor;
mod egress;
mod experiment;
mod opensandbox;
mod serve;
mod verify;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sessionbox_core::{
    ConversationRef, EditRequest, Error, ExecRequest, FileKind, GrepRequest, OutputStream, Refusal,
    Runtime, Session, TenantId,
};
use sessionbox_local::host::{HostConfig, HostRuntime};
use sessionbox_local::isolated::{IsolatedConfig, IsolatedRuntime};
use sessionbox_manager::Manager;
use sessionbox_store::Store;

use crate::config::{FileConfig, RuntimeKind};

/// Isolated, resumable workspaces for AI-agent conversations.
///
/// Each conversation id (within a tenant) maps to its own workspace: the same id resumes its
/// files on the next call, different ids never see each other's files.
#[derive(Debug, Parser)]
#[command(version, propagate_version = true)]
struct Cli {
    /// Data directory [default: $SESSIONBOX_HOME, else the XDG data directory + /sessionbox].
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Configuration file [default: <data dir>/sessionbox.toml].
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Tenant whose conversations to use [default: "default"].
    #[arg(long, global = true, env = "SESSIONBOX_TENANT")]
    tenant: Option<String>,
    /// Isolation runtime [default: isolated].
    #[arg(long, global = true, env = "SESSIONBOX_RUNTIME", value_enum)]
    runtime: Option<RuntimeKind>,
    /// Server of a remote runtime: the OpenSandbox server (opensandbox; default
    /// $OPEN_SANDBOX_DOMAIN, else [opensandbox] endpoint) or the AIO Sandbox server (aio;
    /// default $AIO_SANDBOX_BASE_URL, else [aio] endpoint). Keys and tokens come only from the
    /// environment ($OPEN_SANDBOX_API_KEY, $AIO_SANDBOX_TOKEN), never a flag.
    #[arg(long, global = true, value_name = "URL")]
    endpoint: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Args)]
struct Conv {
    /// The conversation id: 1-128 ASCII letters, digits, '.', '_', '-', starting with a letter or digit.
    #[arg(long, short = 'c', value_name = "ID")]
    conversation: String,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a shell command in a conversation's workspace; exits with its exit code (124 on timeout).
    ///
    /// One argument is a shell command line (`sessionbox exec -c a -- 'ls | wc -l'`); several are
    /// quoted and joined (`sessionbox exec -c a -- ls -la`).
    Exec {
        #[command(flatten)]
        conv: Conv,
        /// Working directory, a workspace path [default: the workspace root].
        #[arg(long)]
        cwd: Option<String>,
        /// Seconds before the command's process group is killed (at most 600).
        #[arg(long, default_value_t = 120.0)]
        timeout: f64,
        /// Extra environment variable for the command, NAME=VALUE (repeatable).
        #[arg(long = "env", short = 'e', value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// Pass this process's stdin to the command.
        #[arg(long)]
        stdin: bool,
        /// Most bytes of each of stdout and stderr passed on (at most 16 MiB); past it the
        /// rest is discarded and the CLI says so. For more, write the output to a file in the
        /// workspace and `read` it.
        #[arg(long, value_name = "BYTES", default_value_t = sessionbox_core::MAX_OUTPUT_LIMIT)]
        output_limit: usize,
        /// Start it in the background and print its id at once (see `commands`, `logs`,
        /// `kill`); it runs on after this process, owned by the runtime.
        #[arg(long)]
        background: bool,
        /// The command.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Write stdin to a file in the workspace (atomically; parent directories are created).
    Write {
        #[command(flatten)]
        conv: Conv,
        path: String,
    },
    /// Print a file of the workspace.
    Read {
        #[command(flatten)]
        conv: Conv,
        path: String,
    },
    /// Replace an exact string in a file; it must occur exactly once unless --all.
    Edit {
        #[command(flatten)]
        conv: Conv,
        path: String,
        #[arg(long)]
        old: String,
        #[arg(long)]
        new: String,
        /// Replace every occurrence.
        #[arg(long)]
        all: bool,
    },
    /// List a directory of the workspace.
    Ls {
        #[command(flatten)]
        conv: Conv,
        #[arg(default_value = ".")]
        path: String,
    },
    /// Show a path's metadata as JSON.
    Stat {
        #[command(flatten)]
        conv: Conv,
        path: String,
    },
    /// Remove a file, link or directory.
    Rm {
        #[command(flatten)]
        conv: Conv,
        path: String,
        /// Remove a directory and everything in it.
        #[arg(long, short = 'r')]
        recursive: bool,
    },
    /// Create a directory and its parents.
    Mkdir {
        #[command(flatten)]
        conv: Conv,
        path: String,
    },
    /// List files matching a glob such as `src/**/*.rs`.
    Glob {
        #[command(flatten)]
        conv: Conv,
        pattern: String,
    },
    /// Search file contents with a regular expression.
    Grep {
        #[command(flatten)]
        conv: Conv,
        pattern: String,
        /// File or directory to search [default: the whole workspace].
        path: Option<String>,
        /// Only files matching this glob.
        #[arg(long)]
        glob: Option<String>,
        /// Case-insensitive.
        #[arg(long, short = 'i')]
        ignore_case: bool,
    },
    /// List this tenant's conversations: state, creation, last use, expiry and lifecycle.
    Conversations {
        /// Every tenant's conversations.
        #[arg(long)]
        all_tenants: bool,
        /// As JSON (times in RFC 3339, durations in seconds).
        #[arg(long)]
        json: bool,
    },
    /// Collect garbage: destroy expired conversations, finish destroys left half-done, and find
    /// orphans (a workspace, sandbox or processes labelled as sessionbox's with no record; a
    /// record whose workspace vanished) and remove them, or with --dry-run only report them.
    ///
    /// Only the runtime's own labelled state is looked at (directories named by a conversation
    /// key under the data directory); nothing else is ever touched. `serve` runs this
    /// periodically.
    Gc {
        /// Report; remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Seconds a record must have been unused before it counts as stuck or dangling.
        #[arg(long, default_value_t = 60)]
        grace_secs: u64,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy the SQLite store to PATH (a new file) with SQLite's online backup API: a
    /// consistent snapshot, safe while a server is writing. Workspaces are not in it.
    Backup {
        /// The backup file to make.
        path: PathBuf,
    },
    /// Replace the SQLite store's contents with a backup made by `sessionbox backup`. Stop
    /// `serve` first; then run `sessionbox gc` to remove workspaces the backup has no record of.
    Restore {
        /// The backup file.
        path: PathBuf,
    },
    /// List a conversation's background commands (running ones and the recent finished ones).
    Commands {
        #[command(flatten)]
        conv: Conv,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a background command's output (stdout and stderr byte for byte, each to its own
    /// stream); with --follow, until it ends, exiting with its exit code.
    Logs {
        #[command(flatten)]
        conv: Conv,
        /// The command id (from `exec --background` or `commands`).
        id: String,
        /// Keep printing output as it comes until the command ends.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Kill a background command's process group; prints its final status as JSON.
    Kill {
        #[command(flatten)]
        conv: Conv,
        /// The command id.
        id: String,
    },
    /// End a conversation: kill its processes, remove its workspace and record. Idempotent.
    Destroy {
        #[command(flatten)]
        conv: Conv,
    },
    /// Run the isolation experiment (resume, isolation, concurrency, cleanup) on the runtime.
    Verify(verify::VerifyArgs),
    /// Measure the runtimes (cold start, warm exec, files, agent memory) against a bare spawn
    /// baseline measured in the same run.
    ///
    /// Both runtimes unless --runtime (or SESSIONBOX_RUNTIME) names one; default runtime
    /// settings (no configuration file is read); a temporary data directory unless --data-dir.
    /// Exits 0 when a target is missed unless --check. Build with --release: debug numbers are
    /// not meaningful.
    Bench(bench::BenchArgs),
    /// Measure the egress gateway: latency added per CONNECT and throughput, against direct
    /// connections to the same target in the same run (needs root: the target runs in a
    /// network namespace the benchmark creates and removes).
    BenchEgress(bench_egress::BenchEgressArgs),
    /// Report which sandbox layers this machine enforces; exits 0 only when the default runtime
    /// can run.
    Doctor,
    /// Serve the HTTP API (REST under /v1; see crates/sessionbox-server) until SIGINT or SIGTERM.
    ///
    /// Requests carry an API key (`Authorization: Bearer KEY` or `X-API-Key`) naming their
    /// tenant. A loopback server with no API key in the store serves requests without a key as
    /// --tenant; any other listen address is refused until a key exists.
    Serve(serve::ServeArgs),
    /// Create, list and revoke API keys of the HTTP server.
    Keys {
        #[command(subcommand)]
        command: serve::KeysCommand,
    },
    /// Serve the MCP tools (bash, read, write, edit, ls, glob, grep, skill, network) on one
    /// conversation over stdin and stdout, for MCP clients that start their servers as
    /// processes.
    ///
    /// For example, in an MCP client's configuration: command `sessionbox`, arguments
    /// `["mcp", "--conversation", "chat-42"]`. Logs go to stderr (SESSIONBOX_LOG).
    Mcp {
        #[command(flatten)]
        conv: Conv,
    },
    /// List the tenant's skills (name and description), or print one skill's SKILL.md body.
    ///
    /// Skills directories come from `[skills.tenants]` in sessionbox.toml, or for the default
    /// tenant from SESSIONBOX_SKILLS_DIR; a skill that breaks a rule is reported with the rule.
    Skills {
        /// The skill to print.
        name: Option<String>,
    },
    /// Print the audit log of the tenant, newest first: operation, outcome, key id and duration
    /// per call; never file contents, commands or secrets.
    Audit(audit::AuditArgs),
    /// Set or show network policies (profile `none`, the default, or an allowlist).
    Policy {
        #[command(subcommand)]
        command: egress::PolicyCommand,
    },
    /// Print the egress gateway's verdicts, newest first: allowed or denied, target, rule or
    /// reason, bytes; never URL paths or queries.
    EgressLog(egress::LogArgs),
    /// Print a short-lived signed proxy token for a conversation on a remote runtime (give it
    /// as the password of the proxy URL: `http://sessionbox:TOKEN@GATEWAY:PORT`).
    EgressToken(egress::TokenArgs),
    /// Run an egress gateway: for remote runtimes on a TCP address (tokens required), or, as
    /// the `isolated` runtime starts it, for one conversation on an inherited socket.
    EgressGateway(egress::GatewayArgs),
    /// Serve the execd API as the in-sandbox agent (see `sessionbox agent --help`). The
    /// `isolated` runtime starts it inside each conversation's sandbox.
    #[command(disable_help_flag = true)]
    Agent {
        /// Arguments of the agent.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

/// Everything a subcommand needs.
pub struct App {
    pub manager: Manager,
    pub tenant: TenantId,
    pub runtime_name: &'static str,
}

fn main() -> ExitCode {
    // The sandbox init must start in a fresh single-threaded process: before anything else.
    if sessionbox_local::sandbox::is_init_invocation() {
        sessionbox_local::sandbox::init_main();
    }
    // A host background command's supervisor, likewise (see `sessionbox_local::supervise`).
    if sessionbox_local::supervise::is_supervisor_invocation() {
        sessionbox_local::supervise::supervisor_main();
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // clap exits 2 for usage errors and 0 for --help/--version.
            e.exit();
        }
    };
    if let Command::Agent { args } = &cli.command {
        let argv = std::iter::once(std::ffi::OsString::from("sessionbox agent"))
            .chain(args.iter().cloned());
        return sessionbox_agent::run_cli(argv);
    }
    // A command's stderr is the command's own, byte for byte: the warning about a skill left
    // out goes to `serve`'s log, the audit and `sessionbox skills`, not into every command.
    let default_filter = match &cli.command {
        Command::Serve(_) => "warn",
        _ => "warn,sessionbox::skills=off",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SESSIONBOX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr())
        .init();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::from(EXIT_BROKEN_PIPE),
        Err(e) => {
            eprintln!("error: {e:#}");
            let invalid = e
                .downcast_ref::<Error>()
                .is_some_and(Error::is_invalid_input)
                || e.downcast_ref::<UsageError>().is_some();
            ExitCode::from(if invalid { 2 } else { 1 })
        }
    }
}

/// True when log lines may carry colour codes: stderr is a terminal and `NO_COLOR` is unset
/// (<https://no-color.org>). A log file or a pipe gets plain text.
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The exit status of a command whose reader went away (`sessionbox ... | head`): 141, what a
/// shell reports for a process ended by SIGPIPE, the way other Unix tools end there.
const EXIT_BROKEN_PIPE: u8 = 141;

/// Writes a command's result to standard output. When the reader has gone away (a broken
/// pipe), the program ends quietly with [`EXIT_BROKEN_PIPE`] instead of panicking as
/// `println!` does; any other write error ends it with status 1 and says so.
pub(crate) fn print_out(args: std::fmt::Arguments<'_>) {
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(EXIT_BROKEN_PIPE.into());
        }
        eprintln!("error: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

/// True when `e` is, or was caused by, a write to a reader that went away.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// A usage error found after parsing (exit code 2).
#[derive(Debug)]
struct UsageError(String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::BenchEgress(args) = &cli.command {
        return bench_egress::run(args).await;
    }
    if let Command::Bench(args) = &cli.command {
        return bench::run(args, cli.data_dir.clone(), cli.runtime, cli.tenant.clone()).await;
    }
    if let Command::Verify(args) = &cli.command
        && !args.via.is_empty()
    {
        // Through a server (or replicas of one): no data directory, store or runtime here.
        let key = std::env::var("SESSIONBOX_API_KEY").ok();
        let client = sessionbox_client::Client::with_replicas(&args.via, key)?;
        let target = verify::Target::Http {
            client,
            base: args.via.join(" "),
        };
        let tenant = TenantId::new(
            cli.tenant
                .clone()
                .unwrap_or_else(|| TenantId::DEFAULT.to_owned()),
        )?;
        let Command::Verify(args) = cli.command else {
            unreachable!("matched above")
        };
        return verify::run(&target, &tenant, args).await;
    }
    let data_dir = config::data_dir(cli.data_dir.clone())?;
    let (config_path, required) = match &cli.config {
        Some(p) => (p.clone(), true),
        None => (data_dir.join("sessionbox.toml"), false),
    };
    let file = FileConfig::load(&config_path, required)?;
    let tenant = cli
        .tenant
        .clone()
        .or(file.tenant.clone())
        .unwrap_or_else(|| TenantId::DEFAULT.to_owned());
    let tenant = TenantId::new(tenant)?;
    let kind = cli
        .runtime
        .or(file.runtime)
        .unwrap_or(RuntimeKind::Isolated);
    if let Command::Doctor = cli.command {
        // --endpoint names the server of the runtime asked for: aio's with --runtime aio,
        // else OpenSandbox's.
        let wants_osb = kind == RuntimeKind::Opensandbox
            || (cli.endpoint.is_some() && kind != RuntimeKind::Aio)
            || std::env::var_os(opensandbox::DOMAIN_ENV).is_some()
            || file.opensandbox.endpoint.is_some();
        let osb_endpoint = cli.endpoint.as_deref().filter(|_| kind != RuntimeKind::Aio);
        let osb = wants_osb.then(|| opensandbox::client_config(osb_endpoint, &file.opensandbox));
        let wants_aio = kind == RuntimeKind::Aio
            || std::env::var_os("AIO_SANDBOX_BASE_URL").is_some_and(|v| !v.is_empty())
            || file.aio.endpoint.is_some();
        let aio = wants_aio.then(|| aio_runtime(&cli, &file));
        return Ok(doctor::run(kind, osb, aio, &file.isolated.sandbox_limits()).await);
    }
    let store_url = file.store_url();
    if let Command::Audit(args) = &cli.command {
        return off_runtime(|| audit::run(args, &data_dir, store_url.as_deref(), &tenant));
    }
    if let Command::Keys { command } = &cli.command {
        let given = cli.tenant.is_some().then_some(&tenant);
        return off_runtime(|| serve::keys(command, &data_dir, store_url.as_deref(), given));
    }
    match &cli.command {
        Command::Policy { command } => {
            return off_runtime(|| {
                egress::policy(command, &data_dir, store_url.as_deref(), &tenant)
            });
        }
        Command::EgressLog(args) => {
            return off_runtime(|| egress::log(args, &data_dir, store_url.as_deref(), &tenant));
        }
        Command::EgressToken(args) => {
            return off_runtime(|| egress::token(args, &data_dir, store_url.as_deref(), &tenant));
        }
        Command::EgressGateway(args) => {
            return egress::gateway(args, &data_dir, store_url.as_deref(), &file.egress).await;
        }
        _ => {}
    }
    if let Command::Backup { path } | Command::Restore { path } = &cli.command {
        let db = data_dir.join("sessionbox.db");
        return off_runtime(|| {
            if store_url.is_some() {
                anyhow::bail!(
                    "the store is PostgreSQL (SESSIONBOX_STORE_URL or [store] url): back it up \
                     with pg_dump and restore it with pg_restore"
                );
            }
            if !db.exists() {
                anyhow::bail!(
                    "there is no store at {} to back up or restore into",
                    db.display()
                );
            }
            if matches!(cli.command, Command::Restore { .. }) {
                serve::refuse_while_serving(&data_dir)?;
            }
            let store = Store::open(&db)?;
            if matches!(cli.command, Command::Backup { .. }) {
                store.backup(path)?;
                outln!("backed up {} to {}", db.display(), path.display());
            } else {
                store.restore(path)?;
                outln!(
                    "restored {} from {}; run `sessionbox gc` to remove workspaces it has no \
                     record of",
                    db.display(),
                    path.display()
                );
                if !store.has_api_keys()? {
                    eprintln!(
                        "sessionbox: warning: the restored store has never had an API key, so a \
                         loopback `serve` on it answers requests without one (open mode); create \
                         a key with `sessionbox keys create --tenant T` to close it"
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        });
    }
    let lifecycle = file.lifecycle()?;

    // Validate every input before anything is created.
    let conversation = match command_conversation(&cli.command) {
        Some(id) => Some(ConversationRef::new(tenant.clone(), id.parse()?)),
        None => None,
    };
    // An existing conversation keeps the runtime that created it: without `--runtime` (or
    // SESSIONBOX_RUNTIME) its record names the runtime, whatever the configured default; a
    // runtime given explicitly that differs is refused by the store. The store is opened here
    // only when it exists, so bad input still creates nothing.
    let db = data_dir.join("sessionbox.db");
    let mut early_store = None;
    let mut kind = kind;
    if let Some(conv) = &conversation
        && cli.runtime.is_none()
        && (store_url.is_some() || db.exists())
    {
        let store = off_runtime(|| Store::open_configured(store_url.as_deref(), &db))?;
        let key = conv.key.clone();
        let recorded = off_runtime(|| store.get(&key))?;
        if let Some(r) = recorded
            && let Ok(k) = <RuntimeKind as clap::ValueEnum>::from_str(&r.runtime, false)
        {
            kind = k;
        }
        early_store = Some(store);
    }
    let prepared = match &conversation {
        Some(conv) if !matches!(cli.command, Command::Destroy { .. } | Command::Mcp { .. }) => {
            let root = match kind {
                RuntimeKind::Isolated => sessionbox_local::isolated::WORKSPACE.to_owned(),
                RuntimeKind::Opensandbox => sessionbox_opensandbox::runtime::WORKSPACE.to_owned(),
                RuntimeKind::Host => HostRuntime::workspace_path(&data_dir, &conv.key)
                    .to_string_lossy()
                    .into_owned(),
                RuntimeKind::Aio => aio_runtime(&cli, &file)?.presented_root(&conv.key),
            };
            Some(prepare(&root, &cli.command)?)
        }
        _ => None,
    };

    let skills = file
        .skills
        .resolve(std::env::var("SESSIONBOX_SKILLS_DIR").ok().as_deref())?;
    let store = match early_store {
        Some(s) => s,
        None => off_runtime(|| Store::open_configured(store_url.as_deref(), &db))?,
    };
    let runtime: Arc<dyn Runtime> = match kind {
        RuntimeKind::Isolated => {
            let iso = &file.isolated;
            let sandbox = iso.sandbox_limits();
            let base = iso.uid_base.unwrap_or(3_000_000);
            let count = iso.uid_count.unwrap_or(65_536);
            let uid_store = store.clone();
            let idle_store = store.clone();
            let exe = std::env::current_exe().context("cannot find the sessionbox executable")?;
            let wiring = egress::wiring(store.clone(), &data_dir, cli.config.as_deref());
            let runtime = IsolatedRuntime::new(IsolatedConfig {
                data_dir: data_dir.clone(),
                limits: file.limits.unwrap_or_default(),
                sandbox,
                idle_timeout: Duration::from_secs(
                    iso.idle_timeout_secs
                        .unwrap_or(config::DEFAULT_IDLE_TIMEOUT_SECS),
                ),
                exe,
                agent_args: vec!["agent".to_owned()],
                allocate_uid: Arc::new(move |key| {
                    uid_store.allocate_uid(key, base..base.saturating_add(count))
                }),
                idle_timeout_of: Some(Arc::new(move |key| {
                    idle_store.get(key).ok().flatten()?.idle_timeout
                })),
            })?
            .with_egress(wiring);
            if skills.is_empty() {
                Arc::new(runtime)
            } else {
                // Skills are bound read-only at /skills/<name>, from snapshots in the data
                // directory; the tenant comes from the conversation's record.
                let (skills, store) = (skills.clone(), store.clone());
                let snapshots = data_dir.join("skills");
                Arc::new(runtime.with_skill_binds(Arc::new(move |key| {
                    let record = store
                        .get(key)?
                        .ok_or_else(|| Error::NotFound(format!("conversation {}", key.short())))?;
                    // A faulty skill is left out (the manager reports it on each open).
                    let (binds, _skipped) = skills.mount_binds(&record.tenant, &snapshots);
                    Ok(binds)
                })))
            }
        }
        RuntimeKind::Host => {
            let mut host = HostConfig::new(&data_dir);
            host.supervisor = std::env::current_exe().ok();
            if let Some(l) = file.limits {
                host.limits = l;
            }
            if let Some(ms) = file.host.kill_grace_ms {
                host.kill_grace = Duration::from_millis(ms);
            }
            Arc::new(HostRuntime::new(host)?)
        }
        RuntimeKind::Aio => {
            let aio = aio_runtime(&cli, &file)?;
            Arc::new(match &file.aio.egress_gateway {
                Some(address) => aio.with_egress(sessionbox_aio::AioEgress {
                    gateway: egress::gateway_access(address, &data_dir)
                        .context("[aio] egress_gateway")?,
                    policy: egress::policy_lookup(store.clone()),
                }),
                None => aio,
            })
        }
        RuntimeKind::Opensandbox => Arc::new(opensandbox::runtime(
            cli.endpoint.as_deref(),
            &file.opensandbox,
            &data_dir,
            store.clone(),
        )?),
    };
    let ctx = App {
        manager: Manager::new(store, runtime)
            .with_lifecycle(lifecycle)
            .with_skills(skills),
        tenant,
        runtime_name: kind.name(),
    };

    match cli.command {
        Command::Verify(args) => verify::run(&verify::Target::Local(&ctx), &ctx.tenant, args).await,
        Command::Serve(args) => serve::run(&ctx, args, &data_dir).await,
        Command::Keys { .. }
        | Command::Audit(_)
        | Command::Policy { .. }
        | Command::EgressLog(_)
        | Command::EgressToken(_)
        | Command::EgressGateway(_)
        | Command::BenchEgress(_) => unreachable!("handled before the runtime"),
        Command::Mcp { .. } => {
            let conv = conversation.expect("mcp names a conversation");
            let state = sessionbox_server::AppState::new(
                ctx.manager,
                sessionbox_server::ServerConfig::default(),
            );
            sessionbox_server::serve_stdio(state, conv).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor | Command::Agent { .. } => unreachable!("handled before the runtime"),
        Command::Skills { name } => {
            let catalog = ctx.manager.skill_catalog(&ctx.tenant).await?;
            for k in &catalog.skipped {
                eprintln!("warning: skill {} is left out: {}", k.name(), k.error);
            }
            match name {
                None => {
                    for s in &catalog.skills {
                        outln!("{}: {}", s.name(), s.doc.description);
                    }
                }
                Some(n) => {
                    let Some(s) = catalog.get(&n) else {
                        return Err(Error::NotFound(format!(
                            "no skill named {n:?} in tenant {}",
                            ctx.tenant
                        ))
                        .into());
                    };
                    out!("{}", s.doc.body);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Conversations { all_tenants, json } => {
            let tenant = (!all_tenants).then_some(&ctx.tenant);
            let records = ctx.manager.list(tenant).await?;
            print_conversations(&records, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Gc {
            dry_run,
            grace_secs,
            json,
        } => {
            let report = ctx
                .manager
                .collect_garbage(sessionbox_manager::GcOptions {
                    dry_run,
                    grace: Duration::from_secs(grace_secs),
                })
                .await?;
            print_gc(&report, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Backup { .. } | Command::Restore { .. } => {
            unreachable!("handled before the runtime")
        }
        Command::Destroy { .. } => {
            let conv = conversation.expect("destroy names a conversation");
            let _held = hold(&ctx, &conv).await?;
            let out = ctx.manager.destroy(&conv).await?;
            if out.nothing_removed() {
                outln!("conversation {} did not exist; nothing removed", conv.id);
            } else {
                outln!(
                    "destroyed conversation {}: {} process(es) killed, workspace {}, record {}",
                    conv.id,
                    out.runtime.processes_killed,
                    if out.runtime.workspace_removed {
                        "removed"
                    } else {
                        "absent"
                    },
                    if out.record_removed {
                        "removed"
                    } else {
                        "absent"
                    },
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        command => {
            let conv = conversation.expect("every other subcommand names a conversation");
            let prepared = prepared.expect("prepared with the conversation");
            session_command(&ctx, &conv, command, prepared).await
        }
    }
}

/// The `aio` runtime from `--endpoint` (or `AIO_SANDBOX_BASE_URL`, or `[aio] endpoint`), the
/// token from `AIO_SANDBOX_TOKEN`. Makes no request.
fn aio_runtime(cli: &Cli, file: &FileConfig) -> anyhow::Result<sessionbox_aio::AioRuntime> {
    let from_env = std::env::var("AIO_SANDBOX_BASE_URL")
        .ok()
        .filter(|v| !v.is_empty());
    let Some(url) = cli
        .endpoint
        .clone()
        .or(from_env)
        .or(file.aio.endpoint.clone())
    else {
        anyhow::bail!(
            "--runtime aio needs the AIO Sandbox server: give --endpoint URL (or set AIO_SANDBOX_BASE_URL, or endpoint in [aio] of sessionbox.toml)"
        );
    };
    let mut endpoint = sessionbox_aio::Endpoint::new(url);
    if let Some(h) = &file.aio.auth_header {
        endpoint.auth = sessionbox_aio::AuthHeader::parse(h)?;
    }
    let endpoint = endpoint.with_env_credentials()?;
    let mut config = sessionbox_aio::AioConfig::new(endpoint);
    if let Some(root) = &file.aio.root {
        config.root = root.clone();
    }
    if let Some(l) = file.limits {
        config.limits = l;
    }
    Ok(sessionbox_aio::AioRuntime::new(config)?)
}

fn command_conversation(c: &Command) -> Option<&str> {
    match c {
        Command::Exec { conv, .. }
        | Command::Write { conv, .. }
        | Command::Read { conv, .. }
        | Command::Edit { conv, .. }
        | Command::Ls { conv, .. }
        | Command::Stat { conv, .. }
        | Command::Rm { conv, .. }
        | Command::Mkdir { conv, .. }
        | Command::Glob { conv, .. }
        | Command::Grep { conv, .. }
        | Command::Commands { conv, .. }
        | Command::Logs { conv, .. }
        | Command::Kill { conv, .. }
        | Command::Destroy { conv }
        | Command::Mcp { conv } => Some(&conv.conversation),
        Command::Conversations { .. }
        | Command::Gc { .. }
        | Command::Backup { .. }
        | Command::Restore { .. }
        | Command::Verify(_)
        | Command::Bench(_)
        | Command::Doctor
        | Command::Serve(_)
        | Command::Keys { .. }
        | Command::Audit(_)
        | Command::Policy { .. }
        | Command::EgressLog(_)
        | Command::EgressToken(_)
        | Command::EgressGateway(_)
        | Command::BenchEgress(_)
        | Command::Skills { .. }
        | Command::Agent { .. } => None,
    }
}

/// Checks every input of `command` that can be checked before the conversation is opened.
/// What a session command needs, built and checked before anything is created.
struct Prepared {
    exec: Option<ExecRequest>,
    write_data: Option<Vec<u8>>,
}

/// Checks every input of `command` against the workspace root as the runtime presents it, and
/// reads what it needs from stdin. Runs before the store or the runtime exists, so bad input
/// creates nothing (not even the data directory).
fn prepare(root: &str, command: &Command) -> anyhow::Result<Prepared> {
    let check = |p: &str| sessionbox_core::WorkspacePath::resolve(root, p).map(|_| ());
    match command {
        Command::Exec { cwd: Some(cwd), .. } => check(cwd)?,
        Command::Write { path, .. }
        | Command::Read { path, .. }
        | Command::Ls { path, .. }
        | Command::Stat { path, .. }
        | Command::Rm { path, .. }
        | Command::Mkdir { path, .. } => check(path)?,
        Command::Edit { path, old, .. } => {
            check(path)?;
            if old.is_empty() {
                return Err(UsageError("--old must not be empty".into()).into());
            }
        }
        Command::Glob { pattern, .. } => sessionbox_fs::check_glob(root, pattern)?,
        Command::Grep { .. } => sessionbox_fs::check_grep(root, &grep_request(command))?,
        _ => {}
    }
    let exec = match command {
        Command::Exec {
            cwd,
            timeout,
            env,
            stdin,
            output_limit,
            command,
            ..
        } => Some(exec_request(
            command,
            cwd.clone(),
            *timeout,
            env,
            *stdin,
            *output_limit,
        )?),
        _ => None,
    };
    let write_data = match command {
        Command::Write { .. } => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read stdin")?;
            Some(buf)
        }
        _ => None,
    };
    Ok(Prepared { exec, write_data })
}

fn grep_request(command: &Command) -> GrepRequest {
    match command {
        Command::Grep {
            pattern,
            path,
            glob,
            ignore_case,
            ..
        } => {
            let mut req = GrepRequest::new(pattern.clone());
            req.path = path.clone();
            req.glob = glob.clone();
            req.case_insensitive = *ignore_case;
            req
        }
        _ => unreachable!("only called for grep"),
    }
}

fn exec_request(
    command: &[String],
    cwd: Option<String>,
    timeout: f64,
    env: &[String],
    stdin: bool,
    output_limit: usize,
) -> anyhow::Result<ExecRequest> {
    let line = match command {
        [one] => one.clone(),
        many => shell_words::join(many),
    };
    let timeout = Duration::try_from_secs_f64(timeout).map_err(|_| {
        UsageError(format!(
            "--timeout {timeout}: give a number of seconds from 0.001 to 600"
        ))
    })?;
    if output_limit == 0 || output_limit > sessionbox_core::MAX_OUTPUT_LIMIT {
        return Err(UsageError(format!(
            "--output-limit {output_limit}: give a number of bytes from 1 to {}",
            sessionbox_core::MAX_OUTPUT_LIMIT
        ))
        .into());
    }
    let mut req = ExecRequest::new(line)
        .timeout(timeout)
        .output_limit(output_limit);
    req.cwd = cwd;
    for kv in env {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(UsageError(format!("--env {kv:?}: expected NAME=VALUE")).into());
        };
        req = req.env(k, v);
    }
    if stdin {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("cannot read stdin")?;
        req = req.stdin(buf);
    }
    req.validate()?;
    Ok(req)
}

async fn session_command(
    ctx: &App,
    conv: &ConversationRef,
    command: Command,
    prepared: Prepared,
) -> anyhow::Result<ExitCode> {
    // Only exec, write and mkdir create a conversation (as in the HTTP API): a typo in an id
    // given to read or ls must not start a sandbox.
    let creates = matches!(
        command,
        Command::Exec { .. } | Command::Write { .. } | Command::Mkdir { .. }
    );
    // Held for the whole operation, as the server does: one operation at a time per
    // conversation across processes (and, with PostgreSQL, machines).
    // Except a read of background output, which may wait long (`logs --follow`): it changes
    // nothing, and the command it reads belongs to the runtime.
    let _held = match command {
        Command::Logs { .. } => None,
        _ => Some(hold(ctx, conv).await?),
    };
    let store = ctx.manager.store().clone();
    let key = conv.key.clone();
    let record = tokio::task::spawn_blocking(move || store.get(&key)).await??;
    if !creates
        && let Some(r) = &record
        && r.is_expired(chrono::Utc::now())
    {
        return Err(Error::NotFound(format!(
            "conversation {} expired at {} and its files are gone; exec, write or mkdir \
             create a new one",
            conv.id,
            r.expires_at
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_default()
        ))
        .into());
    }
    if !creates && record.is_none() {
        return Err(Error::NotFound(format!(
            "conversation {} does not exist in tenant {}; exec, write or mkdir create one",
            conv.id, conv.tenant
        ))
        .into());
    }
    let session = ctx.manager.open(conv).await?;
    if let Some(n) = session.previous_expired() {
        eprintln!(
            "sessionbox: conversation {} expired at {} and its files are gone; this is a new, \
             empty conversation",
            conv.id,
            n.expired_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
    }
    if session.state_lost() {
        eprintln!(
            "warning: the sandbox of conversation {} had vanished (expired or deleted \
             elsewhere); a fresh one replaced it and the files from before are lost",
            conv.id
        );
    }
    let result = run_on_session(&session, command, prepared.exec, prepared.write_data).await;
    let closed = Box::new(session).close().await;
    let code = result?;
    closed?;
    Ok(code)
}

/// A library refusal with what to do in this CLI's flags (the library names none).
fn with_flags(e: Error) -> Error {
    let advice = match e.refusal() {
        Some(Refusal::EditEmpty) => "give the exact text to replace in --old",
        Some(Refusal::EditAbsent) => "read the file and give its exact text in --old",
        Some(Refusal::EditAmbiguous) => {
            "give more context in --old, or pass --all to replace every occurrence"
        }
        Some(Refusal::DirectoryNotEmpty) => {
            "pass --recursive (-r) to remove it and everything in it"
        }
        _ => return e,
    };
    e.with_advice(advice)
}

async fn run_on_session(
    s: &sessionbox_manager::Conversation,
    command: Command,
    exec: Option<ExecRequest>,
    write_data: Option<Vec<u8>>,
) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match command {
        Command::Exec {
            background: true, ..
        } => {
            let c = s.spawn(exec.expect("built above")).await?;
            writeln!(out, "{}", c.id)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Commands { json, .. } => {
            let all = s.commands().await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&all)?)?;
            } else {
                for c in &all {
                    let state = if c.running { "running" } else { "ended" };
                    let code = c
                        .shell_exit_code()
                        .map_or_else(|| "-".to_owned(), |c| c.to_string());
                    writeln!(out, "{}  {state:<7}  {code:>4}  {}", c.id, c.command)?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Logs { id, follow, .. } => {
            drop(out);
            let mut read = sessionbox_core::OutputRequest::from_start();
            if follow {
                read.wait = std::time::Duration::from_secs(20);
            }
            loop {
                let o = s.command_output(&id, read).await?;
                let mut so = std::io::stdout();
                so.write_all(&o.stdout).and_then(|()| so.flush())?;
                std::io::stderr().write_all(&o.stderr)?;
                read.stdout_from = o.stdout_next();
                read.stderr_from = o.stderr_next();
                if o.complete() {
                    let code = o.command.shell_exit_code().unwrap_or(1);
                    return Ok(ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1)));
                }
                let more = o.stdout.len() + o.stderr.len() >= sessionbox_core::MAX_OUTPUT_CHUNK;
                if !follow && !more {
                    return Ok(ExitCode::SUCCESS);
                }
            }
        }
        Command::Kill { id, .. } => {
            let c = s.kill_command(&id).await?;
            writeln!(out, "{}", serde_json::to_string_pretty(&c)?)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Exec { .. } => {
            drop(out);
            // The output as it comes, byte for byte: each chunk is written (and flushed) when
            // the runtime hands it over. The first write error (a reader that went away) is
            // kept and returned once the command has ended.
            let mut failed: Option<std::io::Error> = None;
            let mut sink = |stream: OutputStream, data: &[u8]| {
                if failed.is_some() {
                    return;
                }
                let written = match stream {
                    OutputStream::Stdout => {
                        let mut o = std::io::stdout();
                        o.write_all(data).and_then(|()| o.flush())
                    }
                    OutputStream::Stderr => std::io::stderr().write_all(data),
                };
                if let Err(e) = written {
                    failed = Some(e);
                }
            };
            let exec = exec.expect("built above");
            let r_limit = exec.output_limit;
            let r = s.exec_stream(exec, &mut sink).await?;
            if let Some(e) = failed {
                return Err(e.into());
            }
            for (cut, name) in [
                (r.stdout_truncated, "stdout"),
                (r.stderr_truncated, "stderr"),
            ] {
                if cut {
                    eprintln!(
                        "sessionbox: the command's {name} was cut at {limit} bytes (--output-limit; \
                         at most {max}) and the rest discarded; for more, write it to a file in \
                         the workspace and `sessionbox read` it",
                        limit = r_limit,
                        max = sessionbox_core::MAX_OUTPUT_LIMIT
                    );
                }
            }
            if r.timed_out {
                eprintln!(
                    "sessionbox: the command timed out after {:.1} s and was killed",
                    r.duration.as_secs_f64()
                );
            }
            Ok(ExitCode::from(
                u8::try_from(r.shell_exit_code() & 0xff).unwrap_or(1),
            ))
        }
        Command::Write { path, .. } => {
            let data = write_data.expect("read above");
            s.write(&path, &data).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Read { path, .. } => {
            out.write_all(&s.read(&path).await?)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Edit {
            path,
            old,
            new,
            all,
            ..
        } => {
            let r = s
                .edit(
                    &path,
                    &EditRequest {
                        old,
                        new,
                        replace_all: all,
                    },
                )
                .await
                .map_err(with_flags)?;
            eprintln!("{} replacement(s)", r.replacements);
            Ok(ExitCode::SUCCESS)
        }
        Command::Ls { path, .. } => {
            for e in s.list(&path).await? {
                let kind = match e.kind {
                    FileKind::File => "-",
                    FileKind::Directory => "d",
                    FileKind::Symlink => "l",
                    FileKind::Other => "?",
                };
                writeln!(out, "{kind} {:>12} {}", e.size, e.name)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Stat { path, .. } => {
            writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&s.stat(&path).await?)?
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Rm {
            path, recursive, ..
        } => {
            s.remove(&path, recursive).await.map_err(with_flags)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Mkdir { path, .. } => {
            s.mkdir(&path).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Glob { pattern, .. } => {
            for p in s.glob(&pattern).await? {
                writeln!(out, "{p}")?;
            }
            Ok(ExitCode::SUCCESS)
        }
        command @ Command::Grep { .. } => {
            let req = grep_request(&command);
            let matches = s.grep(&req).await?;
            for m in &matches {
                writeln!(out, "{}:{}:{}", m.path, m.line_number, m.line)?;
            }
            Ok(if matches.is_empty() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Conversations { .. }
        | Command::Gc { .. }
        | Command::Backup { .. }
        | Command::Restore { .. }
        | Command::Destroy { .. }
        | Command::Verify(_)
        | Command::Bench(_)
        | Command::Doctor
        | Command::Serve(_)
        | Command::Keys { .. }
        | Command::Mcp { .. }
        | Command::Audit(_)
        | Command::Policy { .. }
        | Command::EgressLog(_)
        | Command::EgressToken(_)
        | Command::EgressGateway(_)
        | Command::BenchEgress(_)
        | Command::Skills { .. }
        | Command::Agent { .. } => {
            unreachable!("handled without a session")
        }
    }
}

/// Runs `f` on a thread of its own, outside the async runtime: the PostgreSQL store's client
/// blocks its thread and must not run on a thread that drives async tasks.
pub(crate) fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("a store thread panicked"))
}

/// Holds `conv` for one operation (see `Store::lock_conversation`).
async fn hold(
    ctx: &App,
    conv: &ConversationRef,
) -> anyhow::Result<sessionbox_store::ConversationLock> {
    let store = ctx.manager.store().clone();
    let key = conv.key.clone();
    Ok(tokio::task::spawn_blocking(move || store.lock_conversation(&key)).await??)
}

fn print_conversations(
    records: &[sessionbox_store::ConversationRecord],
    json: bool,
) -> anyhow::Result<()> {
    let t = |d: chrono::DateTime<chrono::Utc>| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs());
    // A record past its expiry shows as expired: its files go at the next use or collection.
    let now = chrono::Utc::now();
    if json {
        let v: Vec<_> = records
            .iter()
            .map(|r| {
                serde_json::json!({
                    "tenant": r.tenant.as_str(),
                    "id": r.conversation_id.as_str(),
                    "key": r.key.as_str(),
                    "runtime": r.runtime,
                    "state": r.status(now),
                    "created_at": t(r.created_at),
                    "last_used_at": t(r.last_used_at),
                    "expires_at": r.expires_at.map(t),
                    "idle_timeout_secs": secs(r.idle_timeout),
                    "ttl_secs": secs(r.ttl),
                    "max_lifetime_secs": secs(r.max_lifetime),
                })
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let dur =
        |d: Option<Duration>| d.map_or_else(|| "-".to_owned(), |d| format!("{}s", d.as_secs()));
    outln!(
        "{:<16} {:<28} {:<11} {:<10} {:<20} {:<20} {:<20} {:>7} {:>9} {:>9}",
        "TENANT",
        "CONVERSATION",
        "RUNTIME",
        "STATE",
        "CREATED",
        "LAST USED",
        "EXPIRES",
        "IDLE",
        "TTL",
        "MAX LIFE"
    );
    for r in records {
        outln!(
            "{:<16} {:<28} {:<11} {:<10} {:<20} {:<20} {:<20} {:>7} {:>9} {:>9}",
            r.tenant.as_str(),
            r.conversation_id.as_str(),
            r.runtime,
            r.status(now),
            t(r.created_at),
            t(r.last_used_at),
            r.expires_at.map_or_else(|| "never".to_owned(), t),
            dur(r.idle_timeout),
            dur(r.ttl),
            dur(r.max_lifetime),
        );
    }
    Ok(())
}

fn print_gc(report: &sessionbox_manager::GcReport, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    let verb = if report.dry_run { "found" } else { "removed" };
    outln!(
        "garbage collection on the {} runtime{}: {} expired, {} stuck, {} orphan(s), {} dangling \
         record(s); {} {verb}",
        report.runtime,
        if report.dry_run { " (dry run)" } else { "" },
        report.expired.len(),
        report.stuck.len(),
        report.orphans.len(),
        report.dangling.len(),
        if report.dry_run {
            report.found()
        } else {
            report.removed()
        },
    );
    if !report.idle_stopped.is_empty() {
        outln!(
            "idle sandboxes (the workspace stays; the next use starts it again): {} {}",
            if report.dry_run {
                report.idle_stopped.len()
            } else {
                report.stopped()
            },
            if report.dry_run { "to stop" } else { "stopped" },
        );
    }
    for (kind, items) in [
        ("expired", &report.expired),
        ("stuck", &report.stuck),
        ("orphan", &report.orphans),
        ("dangling", &report.dangling),
        ("idle", &report.idle_stopped),
    ] {
        for i in items {
            outln!(
                "  {kind:<8} {} {}{} processes={}{}",
                &i.key[..16],
                i.tenant
                    .as_deref()
                    .map(|t| format!("{t}/"))
                    .unwrap_or_default(),
                i.conversation.as_deref().unwrap_or("(no record)"),
                i.processes,
                i.note
                    .as_deref()
                    .map(|n| format!(" [{n}]"))
                    .unwrap_or_default(),
            );
        }
    }
    Ok(())
}
