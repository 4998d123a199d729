//! `sessionbox`: isolated, resumable workspaces for AI-agent conversations.
//!
//! This binary is wiring: it reads settings, builds the store, runtime and manager, and maps
//! each subcommand onto [`sessionbox_manager::Manager`] and [`sessionbox_core::Session`].
//! [`run`] is the dispatcher: one arm per group of subcommands (see [`cli`]), each group
//! getting exactly what it needs (nothing, the settings, the store, or a manager).

#[macro_use]
extern crate sessionbox;

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
mod skills;
mod verify;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use sessionbox::config::{self, FileConfig, RuntimeKind};
use sessionbox::messages::EXIT_BROKEN_PIPE;
use sessionbox::runtime::{self, BuildOptions};
use sessionbox_core::{ConversationRef, Error, TenantId};
use sessionbox_manager::Manager;
use sessionbox_store::{LifecyclePolicy, Store};

use crate::cli::{
    Cli, Command, ConversationCommand, Globals, ManagerCommand, RunCommand, StoreCommand,
};

/// Everything a subcommand on the manager needs.
pub struct App {
    /// The manager of the store and the runtime.
    pub manager: Manager,
    /// The tenant the command acts for.
    pub tenant: TenantId,
    /// The runtime's name.
    pub runtime_name: &'static str,
}

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
    let rt = match tokio::runtime::Runtime::new() {
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
            let app = App::build(&globals, &settings, lifecycle, settings.kind, None)?;
            manager_command(&app, &settings, command).await
        }
        RunCommand::Conversation(command) => {
            let settings = Settings::load(&globals)?;
            let lifecycle = settings.file.lifecycle()?;
            let (conv, kind, store) =
                conversation(&globals, &settings, &command.conv().conversation)?;
            let app = App::build(&globals, &settings, lifecycle, kind, store)?;
            conversation_command(app, conv, command).await
        }
        RunCommand::Session(command) => {
            let settings = Settings::load(&globals)?;
            let lifecycle = settings.file.lifecycle()?;
            let (conv, kind, store) =
                conversation(&globals, &settings, &command.conv().conversation)?;
            // Validate every input before anything is created.
            let root = runtime::presented_root(
                kind,
                &settings.file,
                &settings.data_dir,
                globals.endpoint.as_deref(),
                &conv.key,
            )?;
            let prepared = session::prepare(&root, &command)?;
            let app = App::build(&globals, &settings, lifecycle, kind, store)?;
            session::run(&app, &conv, command, prepared).await
        }
    }
}

/// The settings every command past the first ones reads: the data directory, the
/// configuration file, the tenant and the runtime asked for (flag, file, default).
struct Settings {
    data_dir: std::path::PathBuf,
    file: FileConfig,
    tenant: TenantId,
    kind: RuntimeKind,
    store_url: Option<String>,
}

impl Settings {
    fn load(globals: &Globals) -> anyhow::Result<Settings> {
        let data_dir = config::data_dir(globals.data_dir.clone())?;
        let (config_path, required) = match &globals.config {
            Some(p) => (p.clone(), true),
            None => (data_dir.join("sessionbox.toml"), false),
        };
        let file = FileConfig::load(&config_path, required)?;
        let tenant = globals
            .tenant
            .clone()
            .or(file.tenant.clone())
            .unwrap_or_else(|| TenantId::DEFAULT.to_owned());
        let tenant = TenantId::new(tenant)?;
        let kind = globals
            .runtime
            .or(file.runtime)
            .unwrap_or(RuntimeKind::Isolated);
        let store_url = file.store_url();
        Ok(Settings {
            data_dir,
            file,
            tenant,
            kind,
            store_url,
        })
    }

    fn db(&self) -> std::path::PathBuf {
        self.data_dir.join("sessionbox.db")
    }

    fn open_store(&self) -> anyhow::Result<Store> {
        let (url, db) = (self.store_url.as_deref(), self.db());
        Ok(off_runtime(|| Store::open_configured(url, &db))?)
    }
}

/// The conversation `id` names in the tenant, and the runtime it runs on. An existing
/// conversation keeps the runtime that created it: without `--runtime` (or SESSIONBOX_RUNTIME)
/// its record names the runtime, whatever the configured default; a runtime given explicitly
/// that differs is refused by the store. The store is opened here only when it exists (and
/// returned, to be used again), so bad input still creates nothing.
fn conversation(
    globals: &Globals,
    settings: &Settings,
    id: &str,
) -> anyhow::Result<(ConversationRef, RuntimeKind, Option<Store>)> {
    let conv = ConversationRef::new(settings.tenant.clone(), id.parse()?);
    let mut kind = settings.kind;
    let mut store = None;
    if globals.runtime.is_none() && (settings.store_url.is_some() || settings.db().exists()) {
        let opened = settings.open_store()?;
        let key = conv.key.clone();
        let recorded = off_runtime(|| opened.get(&key))?;
        if let Some(r) = recorded
            && let Ok(k) = <RuntimeKind as clap::ValueEnum>::from_str(&r.runtime, false)
        {
            kind = k;
        }
        store = Some(opened);
    }
    Ok((conv, kind, store))
}

impl App {
    /// The manager on `kind`'s runtime over the store (`store` if already open).
    fn build(
        globals: &Globals,
        settings: &Settings,
        lifecycle: LifecyclePolicy,
        kind: RuntimeKind,
        store: Option<Store>,
    ) -> anyhow::Result<App> {
        let skills = settings
            .file
            .skills
            .resolve(std::env::var("SESSIONBOX_SKILLS_DIR").ok().as_deref())?;
        let store = match store {
            Some(s) => s,
            None => settings.open_store()?,
        };
        let options = BuildOptions {
            exe: std::env::current_exe().context("cannot find the sessionbox executable")?,
            endpoint: globals.endpoint.as_deref(),
            config_path: globals.config.as_deref(),
            skills: skills.clone(),
        };
        let runtime =
            runtime::build_runtime(kind, &settings.file, &store, &settings.data_dir, &options)?;
        Ok(App {
            manager: Manager::new(store, runtime)
                .with_lifecycle(lifecycle)
                .with_skills(skills),
            tenant: settings.tenant.clone(),
            runtime_name: kind.name(),
        })
    }
}

/// `sessionbox doctor`. `--endpoint` names the server of the runtime asked for: aio's with
/// `--runtime aio`, else OpenSandbox's.
async fn doctor(globals: &Globals, settings: &Settings) -> anyhow::Result<ExitCode> {
    let (kind, file) = (settings.kind, &settings.file);
    let endpoint = globals.endpoint.as_deref();
    let wants_osb = kind == RuntimeKind::Opensandbox
        || (endpoint.is_some() && kind != RuntimeKind::Aio)
        || std::env::var_os(runtime::DOMAIN_ENV).is_some()
        || file.opensandbox.endpoint.is_some();
    let osb_endpoint = endpoint.filter(|_| kind != RuntimeKind::Aio);
    let osb = wants_osb.then(|| runtime::opensandbox_client(osb_endpoint, &file.opensandbox));
    let wants_aio = kind == RuntimeKind::Aio
        || std::env::var_os(runtime::AIO_URL_ENV).is_some_and(|v| !v.is_empty())
        || file.aio.endpoint.is_some();
    let aio = wants_aio.then(|| runtime::aio_runtime(endpoint, file));
    Ok(doctor::run(kind, osb, aio, &file.isolated.sandbox_limits()).await)
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
    settings: &Settings,
    command: ManagerCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        ManagerCommand::Verify(args) => {
            verify::run(&verify::Target::Local(app), &app.tenant, args).await
        }
        ManagerCommand::Serve(args) => serve::run(app, args, &settings.data_dir).await,
        ManagerCommand::Skills { name } => skills::run(app, name).await,
        ManagerCommand::Conversations { all_tenants, json } => {
            let tenant = (!all_tenants).then_some(&app.tenant);
            let records = app.manager.list(tenant).await?;
            conversations::print_conversations(&records, json)?;
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
        ConversationCommand::Mcp { .. } => {
            let state = sessionbox_server::AppState::new(
                app.manager,
                sessionbox_server::ServerConfig::default(),
            );
            sessionbox_server::serve_stdio(state, conv).await?;
            Ok(ExitCode::SUCCESS)
        }
        ConversationCommand::Destroy { .. } => {
            let _held = session::hold(&app, &conv).await?;
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
