//! The command line of `sessionbox-agent` (and of `sessionbox agent`, which calls [`run_cli`]).

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sessionbox_core::{Error, Result};
use sessionbox_execd::AccessToken;
use sessionbox_execd::agent_args::AgentArgs;

use crate::{Agent, AgentConfig, DEFAULT_LISTEN, Listen, termination_signal};

/// Environment variable the access token may come from (removed from the environment once
/// read). A token file is preferred: see the README.
pub(crate) const TOKEN_ENV: &str = "EXECD_ACCESS_TOKEN";

/// `sessionbox-agent`: serve the OpenSandbox execd API for one workspace.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "sessionbox-agent",
    version,
    about = "Serve the OpenSandbox execd HTTP API for one workspace (the sessionbox in-sandbox agent).",
    after_help = "The access token is read from --token-file or the EXECD_ACCESS_TOKEN environment \
                  variable (which is then removed), never from the command line. With no flags \
                  the agent listens on loopback only (tcp:127.0.0.1:44772); a non-loopback TCP \
                  address needs a token, or --insecure-no-token. Logging: SESSIONBOX_LOG \
                  (default warn)."
)]
pub struct Cli {
    /// The options, defined once in [`sessionbox_execd::agent_args`] (the isolated runtime
    /// builds the same struct to launch the agent).
    #[command(flatten)]
    pub args: AgentArgs,
}

impl Cli {
    /// The configuration these options give. Reads the token file, or takes the token from
    /// `EXECD_ACCESS_TOKEN` and removes that variable from this process's environment.
    ///
    /// Call it before any other thread is started (removing an environment variable is not
    /// thread-safe).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad listen address, an unreadable or empty token file,
    /// an empty token, or a non-loopback TCP address without a token (unless
    /// `--insecure-no-token`).
    pub fn into_config(self) -> Result<AgentConfig> {
        let args = self.args;
        let from_env = std::env::var_os(TOKEN_ENV);
        if from_env.is_some() {
            // SAFETY: documented precondition: no other thread runs yet, so nothing reads the
            // environment concurrently.
            unsafe { std::env::remove_var(TOKEN_ENV) };
        }
        let token =
            match (&args.token_file, from_env) {
                (Some(path), _) => {
                    let text = std::fs::read_to_string(path).map_err(|e| {
                        Error::InvalidRequest(format!(
                            "cannot read the token file {}: {e}",
                            path.display()
                        ))
                    })?;
                    Some(text.trim_end_matches(['\r', '\n']).to_owned())
                }
                (None, Some(v)) => Some(v.into_string().map_err(|_| {
                    Error::InvalidRequest(format!("{TOKEN_ENV} is not valid UTF-8"))
                })?),
                (None, None) => None,
            };
        if token.as_deref() == Some("") {
            return Err(Error::InvalidRequest(
                "the access token is empty; give a non-empty token or none".into(),
            ));
        }
        let mut config = AgentConfig::new(args.root);
        config.listen = match args.listen_fd {
            Some(fd) => Listen::Fd(fd),
            None => Listen::parse(&args.listen)?,
        };
        if let Listen::Tcp(addr) = &config.listen
            && !addr.ip().is_loopback()
            && token.is_none()
            && !args.insecure_no_token
        {
            // Anyone who reaches the address could run commands: never by default.
            return Err(Error::InvalidRequest(format!(
                "refusing to listen on {addr}, which is not a loopback address, without an \
                 access token: anyone who reaches it could run commands; give a token \
                 (--token-file or {TOKEN_ENV}), listen on loopback (the default is \
                 {DEFAULT_LISTEN}), or pass --insecure-no-token where something else guards \
                 the address"
            )));
        }
        config.token = token.map(AccessToken::new);
        config.idle_timeout =
            (args.idle_timeout > 0).then(|| Duration::from_secs(args.idle_timeout));
        config.max_terminals = args.max_terminals;
        if let (Some(listen), Some(socket)) = (args.egress_listen, &args.egress_socket) {
            if !listen.ip().is_loopback() {
                return Err(Error::InvalidRequest(format!(
                    "--egress-listen {listen}: the relay listens on loopback only"
                )));
            }
            config.egress_relay = Some(crate::EgressRelay {
                listen,
                socket: socket.clone(),
            });
        }
        if let Some(limits) = args.limits {
            config.limits = limits;
        }
        Ok(config)
    }
}

/// Runs the agent as a program: parses `args` (the first is the program name), sets up
/// logging (`SESSIONBOX_LOG`, default `warn`, to stderr), makes the process non-dumpable (so
/// commands running as the same user cannot read its memory or environment through `/proc`),
/// serves until SIGTERM, SIGINT or the idle timeout, and returns the exit code: 0 after a clean
/// stop, 2 for invalid options, 1 for other failures. Prints `sessionbox-agent listening on
/// ADDR` on stdout once it accepts connections.
///
/// Call it from the main thread before starting any other thread (it may remove
/// `EXECD_ACCESS_TOKEN` from the environment); it builds its own tokio runtime.
pub fn run_cli(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SESSIONBOX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: the agent's stderr is usually a log file or a pipe.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .try_init();
    let confinement = crate::confine::Confinement {
        user: cli.args.user,
        writable: cli.args.writable.clone(),
    };
    let config = match cli.into_config() {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    // Still one thread: the confinement's system calls act on the calling thread only, and
    // every thread and command started from here inherits them.
    if confinement.user.is_some() || !confinement.writable.is_empty() {
        match crate::confine::apply(&confinement) {
            Ok(line) => tracing::info!("confined: {line}"),
            Err(e) => return fail(&e),
        }
    }
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(
            std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .min(4),
        )
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(&Error::Backend(format!("cannot start the runtime: {e}"))),
    };
    let result = runtime.block_on(async {
        let agent = Agent::bind(config).await?;
        let mut out = std::io::stdout();
        let _ = writeln!(out, "sessionbox-agent listening on {}", agent.local_addr());
        let _ = out.flush();
        agent.run(termination_signal()).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &Error) -> ExitCode {
    eprintln!("sessionbox-agent: {e}");
    if e.is_invalid_input() {
        ExitCode::from(2)
    } else {
        ExitCode::FAILURE
    }
}
