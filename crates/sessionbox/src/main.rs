//! `sessionbox`: isolated, resumable workspaces for AI-agent conversations.
//!
//! This binary is wiring: it reads settings, builds the store, runtime and manager, and maps
//! each subcommand onto [`sessionbox_manager::Manager`] and [`sessionbox_core::Session`].
//! [`run`] is the dispatcher: one arm per group of subcommands (see [`cli`]), each group
//! getting exactly what it needs (nothing, the settings, the store, or a manager).

#[macro_use]
extern crate sessionbox;

mod acceptance;
mod app;
mod audit;
mod backup;
mod bench;
mod cli;
mod conversations;
mod doctor;
mod egress;
mod gc;
mod hint;
mod keys;
mod serve;
mod session;
mod shell;
mod shown;
mod skills;
mod snapshots;
mod stdin_pass;
mod verify;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sessionbox::config::{self, RuntimeKind};
use sessionbox::messages::EXIT_BROKEN_PIPE;
use sessionbox::runtime;
use sessionbox_core::{ConversationRef, Error};

pub(crate) use crate::app::App;
use crate::app::{Settings, conversation};
use crate::cli::{
    Cli, Command, ConversationCommand, Globals, ManagerCommand, RunCommand, StoreCommand,
};

fn main() -> ExitCode {
    // The sandbox init must start in a fresh single-threaded process: before anything else.
    // A host background command's supervisor, likewise (see `sessionbox_local::supervise`).
    runtime::become_helper_if_started_as_one();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // clap exits 2 for usage errors and 0 for --help/--version.
            e.exit();
        }
    };
    let command = match cli.command {
        Command::Agent { args } => return runtime::run_agent(args),
        Command::Run(command) => command,
    };
    // The acceptance check runs with a stand-in secret in its initial environment.
    if matches!(&command, RunCommand::Manager(ManagerCommand::Verify(a)) if a.acceptance)
        && let Some(code) = acceptance::with_planted_secret()
    {
        return code;
    }
    // A command's stderr is the command's own, byte for byte: the warning about a skill left
    // out goes to `serve`'s log, the audit and `sessionbox skills`, not into every command.
    let default_filter = match &command {
        RunCommand::Manager(ManagerCommand::Serve(_)) => "warn",
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
    // A call on one conversation needs one worker: not a thread per core, nor the look at the
    // cgroup's CPU quota that counting the cores costs. Servers keep one worker per core.
    let one_off = match &command {
        RunCommand::Session(_) => true,
        RunCommand::Conversation(c) => !matches!(c, ConversationCommand::Mcp { .. }),
        _ => false,
    };
    let rt = match if one_off {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Runtime::new()
    } {
        Ok(rt) => rt,
        Err(e) => {
            error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let kind = cli.globals.runtime;
    match rt.block_on(run(cli.globals, command)) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::from(EXIT_BROKEN_PIPE),
        Err(e) => {
            match hint::hint(&e, kind) {
                Some(hint) => error!("{e:#}; {hint}"),
                None => error!("{e:#}"),
            }
            let invalid = e
                .downcast_ref::<Error>()
                .is_some_and(Error::is_invalid_input)
                || e.downcast_ref::<UsageError>().is_some();
            ExitCode::from(if invalid { 2 } else { 1 })
        }
    }
}

/// Runs `command`: one arm per group of subcommands, each given what it needs.
async fn run(globals: Globals, command: RunCommand) -> anyhow::Result<ExitCode> {
    match command {
        RunCommand::Bench { args } => bench::run(&globals, &[], args),
        RunCommand::BenchEgress { args } => bench::run(&globals, &["egress"], args),
        // Through a server (or replicas of one): no data directory, store or runtime here.
        RunCommand::Manager(ManagerCommand::Verify(args)) if !args.via.is_empty() => {
            verify::run_via(&globals, args).await
        }
        RunCommand::Doctor => doctor(&globals, &Settings::load(&globals)?).await,
        RunCommand::Store(command) => store_command(&globals, command).await,
        RunCommand::Manager(command) => {
            let settings = Settings::load(&globals)?;
            let lifecycle = settings.file.lifecycle()?;
            // A snapshot, restore or live fork works on a conversation: on its runtime, as
            // every other command on one does.
            let (kind, store) = match snapshots::conversation_named(&command) {
                Some(id) => {
                    let (_, kind, store) = conversation(&globals, &settings, id).await?;
                    (kind, store)
                }
                None => (settings.kind, None),
            };
            let app = App::build(&globals, &settings, lifecycle, kind, store)?;
            manager_command(&app, &globals, &settings, command).await
        }
        RunCommand::Conversation(command) => {
            let settings = Settings::load(&globals)?;
            let lifecycle = settings.file.lifecycle()?;
            let id = command.conversation_id()?;
            let (conv, kind, store) = conversation(&globals, &settings, &id).await?;
            let app = App::build(&globals, &settings, lifecycle, kind, store)?;
            conversation_command(app, conv, command).await
        }
        RunCommand::Session(command) => {
            let settings = Settings::load(&globals)?;
            let lifecycle = settings.file.lifecycle()?;
            let (conv, kind, store) =
                conversation(&globals, &settings, &command.conv().conversation).await?;
            // Validate every input before anything is created.
            let root = runtime::presented_root(
                kind,
                &settings.file,
                &settings.data_dir,
                globals.endpoint.as_deref(),
                &conv.key,
            )?;
            let max_file_bytes = settings.file.limits.unwrap_or_default().max_file_bytes;
            // Runtimes whose agent keeps a stdin open get `exec --stdin` passed through live;
            // the others read it whole first, before anything is created.
            let live_stdin = matches!(kind, RuntimeKind::Isolated | RuntimeKind::Opensandbox);
            let prepared = session::prepare(&root, &command, max_file_bytes, live_stdin)?;
            let app = App::build(&globals, &settings, lifecycle, kind, store)?;
            session::run(&app, &conv, command, prepared).await
        }
    }
}

/// `sessionbox doctor`.
async fn doctor(globals: &Globals, settings: &Settings) -> anyhow::Result<ExitCode> {
    Ok(doctor::Probe::new(globals, settings).print().await)
}

/// The commands on the store alone.
async fn store_command(globals: &Globals, command: StoreCommand) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(globals)?;
    let (data_dir, url, tenant) = (
        &settings.data_dir,
        settings.store_url.as_deref(),
        &settings.tenant,
    );
    match command {
        StoreCommand::Audit(args) => off_runtime(|| audit::run(&args, data_dir, url, tenant)),
        StoreCommand::Keys { command } => {
            let given = globals.tenant.is_some().then_some(tenant);
            off_runtime(|| keys::keys(&command, data_dir, url, given))
        }
        StoreCommand::Policy { command } => {
            off_runtime(|| egress::policy(&command, data_dir, url, tenant))
        }
        StoreCommand::EgressLog(args) => off_runtime(|| egress::log(&args, data_dir, url, tenant)),
        StoreCommand::EgressToken(args) => {
            off_runtime(|| egress::token(&args, data_dir, url, tenant))
        }
        StoreCommand::EgressGateway(args) => {
            egress::gateway(&args, data_dir, url, &settings.file.egress).await
        }
        StoreCommand::Backup { path } => off_runtime(|| backup::backup(data_dir, url, &path)),
        StoreCommand::Restore { path } => off_runtime(|| backup::restore(data_dir, url, &path)),
    }
}

/// The commands on the manager.
async fn manager_command(
    app: &App,
    globals: &Globals,
    settings: &Settings,
    command: ManagerCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        ManagerCommand::Verify(args) if args.acceptance => {
            acceptance::run(app, settings, args).await
        }
        ManagerCommand::Verify(args) => {
            verify::run(&verify::Target::Local(app), &app.tenant, args).await
        }
        ManagerCommand::Serve(args) => {
            let probe = doctor::Probe::new(globals, settings);
            serve::run(app, *args, &settings.file.serve, &settings.data_dir, probe).await
        }
        ManagerCommand::Skills { name } => skills::run(app, name).await,
        ManagerCommand::Snapshot { command } => snapshots::snapshot(app, command).await,
        ManagerCommand::Fork(args) => snapshots::fork(app, args).await,
        ManagerCommand::Template { command } => snapshots::template(app, command).await,
        ManagerCommand::Conversations { all_tenants, json } => {
            let tenant = (!all_tenants).then_some(&app.tenant);
            let records = app.manager.list(tenant).await?;
            let disks = conversations::disk_usages(app.manager.runtime().as_ref(), &records).await;
            let now = app.manager.store().now();
            conversations::print_conversations(&records, &disks, now, json)?;
            Ok(ExitCode::SUCCESS)
        }
        ManagerCommand::Gc {
            dry_run,
            grace_secs,
            json,
        } => {
            let report = app
                .manager
                .collect_garbage(sessionbox_manager::GcOptions {
                    dry_run,
                    grace: Duration::from_secs(grace_secs),
                })
                .await?;
            gc::print_gc(&report, json)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The commands on one conversation that do not open it as a session.
async fn conversation_command(
    app: App,
    conv: ConversationRef,
    command: ConversationCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        ConversationCommand::Shell { cwd, .. } => shell::run(&app, &conv, cwd).await,
        ConversationCommand::Mcp { new, .. } => {
            if new {
                eprintln!("sessionbox mcp: conversation {}", conv.id);
            }
            let state = sessionbox_server::AppState::new(
                app.manager,
                sessionbox_server::ServerConfig::default(),
            );
            sessionbox_server::serve_stdio(state, conv).await?;
            Ok(ExitCode::SUCCESS)
        }
        ConversationCommand::Destroy { .. } => {
            let _held = app.manager.hold(&conv).await?;
            let out = app.manager.destroy(&conv).await?;
            if out.nothing_removed() {
                outln!("conversation {} did not exist; nothing removed", conv.id);
            } else {
                let removed = |yes: bool| if yes { "removed" } else { "absent" };
                outln!(
                    "destroyed conversation {}: {} process(es) killed, workspace {}, record {}",
                    conv.id,
                    out.runtime.processes_killed,
                    removed(out.runtime.workspace_removed),
                    removed(out.record_removed),
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// True when log lines may carry colour codes: stderr is a terminal and `NO_COLOR` is unset
/// (<https://no-color.org>). A log file or a pipe gets plain text.
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
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

/// Runs `f` on a thread of its own, outside the async runtime: the PostgreSQL store's client
/// blocks its thread and must not run on a thread that drives async tasks.
pub(crate) fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("a store thread panicked"))
}
