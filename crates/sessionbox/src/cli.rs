//! The command line: global options and every subcommand, grouped by what each needs (see
//! `run` in `main.rs`). The groups are flattened, so the command line is one list of
//! subcommands; `display_order` keeps `--help` in its historical order.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use sessionbox::config::RuntimeKind;
use sessionbox_core::Operation;

use crate::{audit, egress, serve, verify};

/// Isolated, resumable workspaces for AI-agent conversations.
///
/// Each conversation id (within a tenant) maps to its own workspace: the same id resumes its
/// files on the next call, different ids never see each other's files.
#[derive(Debug, Parser)]
#[command(version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) globals: Globals,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The options every subcommand takes.
#[derive(Debug, clap::Args)]
pub(crate) struct Globals {
    /// Data directory [default: $SESSIONBOX_HOME, else the XDG data directory + /sessionbox].
    #[arg(long, global = true, value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    /// Configuration file [default: <data dir>/sessionbox.toml].
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Tenant whose conversations to use [default: "default"].
    #[arg(long, global = true, env = "SESSIONBOX_TENANT")]
    pub(crate) tenant: Option<String>,
    /// Isolation runtime [default: isolated].
    #[arg(long, global = true, env = "SESSIONBOX_RUNTIME", value_enum)]
    pub(crate) runtime: Option<RuntimeKind>,
    /// Server of a remote runtime: the OpenSandbox server (opensandbox; default
    /// $OPEN_SANDBOX_DOMAIN, else [opensandbox] endpoint) or the AIO Sandbox server (aio;
    /// default $AIO_SANDBOX_BASE_URL, else [aio] endpoint). Keys and tokens come only from the
    /// environment ($OPEN_SANDBOX_API_KEY, $AIO_SANDBOX_TOKEN), never a flag.
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) endpoint: Option<String>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct Conv {
    /// The conversation id: 1-128 ASCII letters, digits, '.', '_', '-', starting with a letter or digit.
    #[arg(long, short = 'c', value_name = "ID")]
    pub(crate) conversation: String,
}

/// Every subcommand: the agent (which runs without the async runtime), and the rest.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    #[command(flatten)]
    Run(RunCommand),
    /// Serve the execd API as the in-sandbox agent (see `sessionbox agent --help`). The
    /// `isolated` runtime starts it inside each conversation's sandbox. With no flags it
    /// listens on 127.0.0.1:44772 only; another address needs an access token.
    #[command(disable_help_flag = true)]
    #[command(display_order = 32)]
    Agent {
        /// Arguments of the agent.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

/// The subcommands that run on the async runtime, one variant per group.
#[derive(Debug, Subcommand)]
pub(crate) enum RunCommand {
    #[command(flatten)]
    Session(SessionCommand),
    #[command(flatten)]
    Conversation(ConversationCommand),
    #[command(flatten)]
    Manager(ManagerCommand),
    #[command(flatten)]
    Store(StoreCommand),
    /// Measure the runtimes (cold start, warm exec, files, agent memory) against a bare spawn
    /// baseline measured in the same run.
    ///
    /// Both runtimes unless --runtime (or SESSIONBOX_RUNTIME) names one; default runtime
    /// settings (no configuration file is read); a temporary data directory unless --data-dir.
    /// Exits 0 when a target is missed unless --check. Build with --release: debug numbers are
    /// not meaningful.
    ///
    /// Runs `sessionbox-bench` from this executable's directory with these arguments (build
    /// both with `cargo build --release -p sessionbox -p sessionbox-bench`).
    #[command(disable_help_flag = true)]
    #[command(display_order = 20)]
    Bench {
        /// Arguments of `sessionbox-bench` (see `sessionbox bench --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Measure the egress gateway: latency added per CONNECT and throughput, against direct
    /// connections to the same target in the same run (needs root: the target runs in a
    /// network namespace the benchmark creates and removes).
    ///
    /// Runs `sessionbox-bench egress` from this executable's directory with these arguments.
    #[command(disable_help_flag = true)]
    #[command(display_order = 21)]
    BenchEgress {
        /// Arguments of `sessionbox-bench egress` (see `sessionbox bench-egress --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Report which sandbox layers this machine enforces; exits 0 only when the default runtime
    /// can run.
    #[command(display_order = 22)]
    Doctor,
}

/// The commands that run one operation on an open conversation (see [`crate::session`]).
#[derive(Debug, Subcommand)]
pub(crate) enum SessionCommand {
    /// Run a shell command in a conversation's workspace; exits with its exit code (124 on timeout).
    ///
    /// One argument is a shell command line (`sessionbox exec -c a -- 'ls | wc -l'`); several are
    /// quoted and joined (`sessionbox exec -c a -- ls -la`).
    #[command(display_order = 1)]
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
    #[command(display_order = 2)]
    Write {
        #[command(flatten)]
        conv: Conv,
        path: String,
    },
    /// Print a file of the workspace.
    #[command(display_order = 3)]
    Read {
        #[command(flatten)]
        conv: Conv,
        path: String,
    },
    /// Replace an exact string in a file; it must occur exactly once unless --all.
    #[command(display_order = 4)]
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
    #[command(display_order = 5)]
    Ls {
        #[command(flatten)]
        conv: Conv,
        #[arg(default_value = ".")]
        path: String,
    },
    /// Show a path's metadata as JSON.
    #[command(display_order = 6)]
    Stat {
        #[command(flatten)]
        conv: Conv,
        path: String,
    },
    /// Remove a file, link or directory.
    #[command(display_order = 7)]
    Rm {
        #[command(flatten)]
        conv: Conv,
        path: String,
        /// Remove a directory and everything in it.
        #[arg(long, short = 'r')]
        recursive: bool,
    },
    /// Create a directory and its parents.
    #[command(display_order = 8)]
    Mkdir {
        #[command(flatten)]
        conv: Conv,
        path: String,
    },
    /// List files matching a glob such as `src/**/*.rs`.
    #[command(display_order = 9)]
    Glob {
        #[command(flatten)]
        conv: Conv,
        pattern: String,
    },
    /// Search file contents with a regular expression.
    #[command(display_order = 10)]
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
    /// List a conversation's background commands (running ones and the recent finished ones).
    #[command(display_order = 15)]
    Commands {
        #[command(flatten)]
        conv: Conv,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a background command's output (stdout and stderr byte for byte, each to its own
    /// stream); with --follow, until it ends, exiting with its exit code.
    #[command(display_order = 16)]
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
    #[command(display_order = 17)]
    Kill {
        #[command(flatten)]
        conv: Conv,
        /// The command id.
        id: String,
    },
    /// Print what changes beneath a directory of the workspace, one JSON object per line, as
    /// it happens, until interrupted or the directory goes away.
    ///
    /// Each line has a `kind`: `ready` first, then `created`, `modified`, `deleted`, `moved`
    /// (`from`, `to`), `overflow` (events were lost), `limit` (a directory not followed), and
    /// `ended` last; paths as the conversation sees them. Needs a runtime whose sandboxes run
    /// the agent (isolated, opensandbox); at most 4 watches at once per conversation.
    #[command(display_order = 18)]
    Watch {
        #[command(flatten)]
        conv: Conv,
        /// The directory [default: the workspace root].
        #[arg(default_value = ".")]
        path: String,
    },
}

/// The commands on one conversation that do not open it as a session.
#[derive(Debug, Subcommand)]
pub(crate) enum ConversationCommand {
    /// End a conversation: kill its processes, remove its workspace and record. Idempotent.
    #[command(display_order = 18)]
    Destroy {
        #[command(flatten)]
        conv: Conv,
    },
    /// Serve the MCP tools (bash, read, write, edit, ls, glob, grep, skill, network) on one
    /// conversation over stdin and stdout, for MCP clients that start their servers as
    /// processes.
    ///
    /// For example, in an MCP client's configuration: command `sessionbox`, arguments
    /// `["mcp", "--conversation", "chat-42"]`, or `["mcp", "--new"]` so that each chat the
    /// client starts (each process) gets a conversation of its own. Logs go to stderr
    /// (SESSIONBOX_LOG).
    #[command(display_order = 25)]
    Mcp {
        /// The conversation id: 1-128 ASCII letters, digits, '.', '_', '-', starting with a
        /// letter or digit.
        #[arg(long, short = 'c', value_name = "ID", required_unless_present = "new")]
        conversation: Option<String>,
        /// A new conversation of this process's own (`mcp-` and 16 random hex digits), named
        /// on stderr and to the model: a desktop client's chats then never share a workspace.
        #[arg(long, conflicts_with = "conversation")]
        new: bool,
    },
    /// Open an interactive terminal in a conversation's sandbox (creates the conversation);
    /// exits with the shell's exit status.
    ///
    /// The local terminal is put in raw mode (restored on exit): every key, Ctrl-C and Ctrl-D
    /// included, reaches the sandbox's shell, and its window size follows the local one. Leave
    /// with `exit` or Ctrl-D. Whatever the shell left running is killed when it ends. The
    /// `isolated` and `opensandbox` runtimes have terminals; on `host` this starts an agent of
    /// its own on the workspace for the terminal's life; `aio` refuses.
    #[command(display_order = 2)]
    Shell {
        #[command(flatten)]
        conv: Conv,
        /// Working directory, a workspace path [default: the workspace root].
        #[arg(long)]
        cwd: Option<String>,
    },
}

/// The commands on the manager: every conversation of the store and its runtime.
#[derive(Debug, Subcommand)]
pub(crate) enum ManagerCommand {
    /// List this tenant's conversations: state, creation, last use, expiry and lifecycle.
    #[command(display_order = 11)]
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
    #[command(display_order = 12)]
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
    /// Run the isolation experiment (resume, isolation, concurrency, fork, cleanup) on the runtime.
    #[command(display_order = 19)]
    Verify(verify::VerifyArgs),
    /// Serve the HTTP API (REST under /v1; see crates/sessionbox-server) until SIGINT or SIGTERM.
    ///
    /// Requests carry an API key (`Authorization: Bearer KEY` or `X-API-Key`) naming their
    /// tenant. A loopback server with no API key in the store serves requests without a key as
    /// --tenant; any other listen address is refused until a key exists.
    #[command(display_order = 23)]
    Serve(Box<serve::ServeArgs>),
    /// List the tenant's skills (name and description), or print one skill's SKILL.md body.
    ///
    /// Skills directories come from `[skills.tenants]` in sessionbox.toml, or for the default
    /// tenant from SESSIONBOX_SKILLS_DIR; a skill that breaks a rule is reported with the rule.
    #[command(display_order = 26)]
    Skills {
        /// The skill to print.
        name: Option<String>,
    },
    /// Take, list, restore, delete, export and import snapshots of workspaces (kept under the
    /// data directory's `snapshots/`, 30 days unless told otherwise).
    #[command(display_order = 15)]
    Snapshot {
        #[command(subcommand)]
        command: crate::snapshots::SnapshotCommand,
    },
    /// Make a new conversation from a live one (-c), a snapshot (--snapshot) or a template
    /// (--template): its workspace is a copy, sharing nothing writable with the origin.
    #[command(display_order = 16)]
    Fork(crate::snapshots::ForkArgs),
    /// Name snapshots as templates; the template `default` is restored into every new
    /// conversation of the tenant.
    #[command(display_order = 17)]
    Template {
        #[command(subcommand)]
        command: crate::snapshots::TemplateCommand,
    },
}

/// The commands on the store alone: no runtime is built.
#[derive(Debug, Subcommand)]
pub(crate) enum StoreCommand {
    /// Copy the SQLite store to PATH (a new file) with SQLite's online backup API: a
    /// consistent snapshot, safe while a server is writing. Workspaces are not in it.
    #[command(display_order = 13)]
    Backup {
        /// The backup file to make.
        path: PathBuf,
    },
    /// Replace the SQLite store's contents with a backup made by `sessionbox backup` (a
    /// conversation's workspace goes back to a snapshot with `sessionbox snapshot restore`).
    /// Stop `serve` first; then run `sessionbox gc` to remove workspaces the backup has no
    /// record of.
    #[command(display_order = 14)]
    Restore {
        /// The backup file.
        path: PathBuf,
    },
    /// Create, list and revoke API keys of the HTTP server.
    #[command(display_order = 24)]
    Keys {
        #[command(subcommand)]
        command: crate::keys::KeysCommand,
    },
    /// Print the audit log of the tenant, newest first: operation, outcome, key id and duration
    /// per call; never file contents, commands or secrets.
    #[command(display_order = 27)]
    Audit(audit::AuditArgs),
    /// Set or show network policies (profile `none`, the default, or an allowlist).
    #[command(display_order = 28)]
    Policy {
        #[command(subcommand)]
        command: egress::PolicyCommand,
    },
    /// Print the egress gateway's verdicts, newest first: allowed or denied, target, rule or
    /// reason, bytes; never URL paths or queries.
    #[command(display_order = 29)]
    EgressLog(egress::LogArgs),
    /// Print a short-lived signed proxy token for a conversation on a remote runtime (give it
    /// as the password of the proxy URL: `http://sessionbox:TOKEN@GATEWAY:PORT`).
    #[command(display_order = 30)]
    EgressToken(egress::TokenArgs),
    /// Run an egress gateway: for remote runtimes on a TCP address (tokens required), or, as
    /// the `isolated` runtime starts it, for one conversation on an inherited socket.
    #[command(display_order = 31)]
    EgressGateway(egress::GatewayArgs),
}

impl SessionCommand {
    /// The conversation the command runs on.
    pub(crate) fn conv(&self) -> &Conv {
        match self {
            SessionCommand::Exec { conv, .. }
            | SessionCommand::Write { conv, .. }
            | SessionCommand::Read { conv, .. }
            | SessionCommand::Edit { conv, .. }
            | SessionCommand::Ls { conv, .. }
            | SessionCommand::Stat { conv, .. }
            | SessionCommand::Rm { conv, .. }
            | SessionCommand::Mkdir { conv, .. }
            | SessionCommand::Glob { conv, .. }
            | SessionCommand::Grep { conv, .. }
            | SessionCommand::Commands { conv, .. }
            | SessionCommand::Logs { conv, .. }
            | SessionCommand::Kill { conv, .. }
            | SessionCommand::Watch { conv, .. } => conv,
        }
    }

    /// The operation this command is, as every front end names it: what decides whether it
    /// creates its conversation ([`Operation::creates`]; exec, write and mkdir do, so a typo in
    /// an id given to read or ls never starts a sandbox).
    pub(crate) fn operation(&self) -> Operation {
        match self {
            SessionCommand::Exec {
                background: true, ..
            } => Operation::Spawn,
            SessionCommand::Exec { .. } => Operation::Exec,
            SessionCommand::Write { .. } => Operation::Write,
            SessionCommand::Read { .. } => Operation::Read,
            SessionCommand::Edit { .. } => Operation::Edit,
            SessionCommand::Ls { .. } => Operation::List,
            SessionCommand::Stat { .. } => Operation::Stat,
            SessionCommand::Rm { .. } => Operation::Remove,
            SessionCommand::Mkdir { .. } => Operation::Mkdir,
            SessionCommand::Glob { .. } => Operation::Glob,
            SessionCommand::Grep { .. } => Operation::Grep,
            SessionCommand::Commands { .. } => Operation::Commands,
            SessionCommand::Logs { .. } => Operation::CommandOutput,
            SessionCommand::Kill { .. } => Operation::KillCommand,
            SessionCommand::Watch { .. } => Operation::Attach,
        }
    }
}

impl ConversationCommand {
    /// The id of the conversation the command is about (`mcp --new`: a new one).
    pub(crate) fn conversation_id(&self) -> anyhow::Result<String> {
        Ok(match self {
            ConversationCommand::Destroy { conv } | ConversationCommand::Shell { conv, .. } => {
                conv.conversation.clone()
            }
            ConversationCommand::Mcp {
                conversation: Some(id),
                ..
            } => id.clone(),
            ConversationCommand::Mcp {
                conversation: None, ..
            } => new_mcp_conversation_id()?,
        })
    }
}

/// `mcp-` and 16 random hex digits: the conversation of an `mcp --new` process.
fn new_mcp_conversation_id() -> anyhow::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(format!(
        "mcp-{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    ))
}
