//! `sessionbox snapshot`, `sessionbox fork` and `sessionbox template`: snapshots of workspaces
//! (take, list, restore, delete, export, import), new conversations from a live one, a
//! snapshot or a template, and the tenant's templates. Snapshots are kept under the data
//! directory (`snapshots/`); see `sessionbox_manager`'s snapshots module.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use sessionbox_core::{ArchiveStats, ConversationId, ConversationRef};
use sessionbox_manager::ForkFrom;
use sessionbox_store::SnapshotRecord;

use crate::app::App;

/// `sessionbox snapshot ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum SnapshotCommand {
    /// Take a snapshot of a conversation's workspace (its background commands are paused
    /// while it is taken).
    Take {
        /// The conversation.
        #[arg(long, short = 'c', value_name = "ID")]
        conversation: String,
        /// The snapshot's name, unique in the tenant: 1-64 ASCII letters, digits, '.', '_',
        /// '-', starting with a letter or digit.
        name: String,
        /// Keep it this many seconds [default: 30 days].
        #[arg(long)]
        keep_secs: Option<u64>,
    },
    /// List the tenant's snapshots, oldest first.
    List {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Replace a conversation's workspace with a snapshot (kill its background commands
    /// first: they are not stopped).
    Restore {
        /// The conversation.
        #[arg(long, short = 'c', value_name = "ID")]
        conversation: String,
        /// The snapshot.
        name: String,
    },
    /// Delete a snapshot (refused while a template names it).
    Rm {
        /// The snapshot.
        name: String,
    },
    /// Write a snapshot's archive (a zstd-compressed POSIX tar) to FILE.
    Export {
        /// The snapshot.
        name: String,
        /// The file to write ('-': stdout).
        file: PathBuf,
    },
    /// Import an archive (a POSIX tar, or one compressed with zstd) as a snapshot, checked
    /// against the archive rules first.
    Import {
        /// The snapshot's name.
        name: String,
        /// The archive.
        file: PathBuf,
        /// Keep it this many seconds [default: 30 days].
        #[arg(long)]
        keep_secs: Option<u64>,
    },
}

/// `sessionbox fork`: a new conversation from a live one (`-c`), a snapshot or a template.
#[derive(Debug, Args)]
pub(crate) struct ForkArgs {
    /// The id of the new conversation (it must not exist).
    #[arg(long, value_name = "ID")]
    to: String,
    /// Fork this live conversation as it is now.
    #[arg(long, short = 'c', value_name = "ID", group = "from")]
    conversation: Option<String>,
    /// Fork this snapshot.
    #[arg(long, value_name = "NAME", group = "from")]
    snapshot: Option<String>,
    /// Start from this template.
    #[arg(long, value_name = "NAME", group = "from")]
    template: Option<String>,
}

/// `sessionbox template ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum TemplateCommand {
    /// Name a snapshot as a template (`default`: restored into every new conversation of the
    /// tenant).
    Set {
        /// The template.
        name: String,
        /// The snapshot it names.
        snapshot: String,
    },
    /// Remove a template (its snapshot stays).
    Rm {
        /// The template.
        name: String,
    },
    /// List the tenant's templates.
    List,
}

/// The conversation whose runtime a command must run on: the one a snapshot is taken of or
/// restored into, the origin of a live fork; `None` for the others.
pub(crate) fn conversation_named(command: &crate::cli::ManagerCommand) -> Option<&str> {
    use crate::cli::ManagerCommand;
    match command {
        ManagerCommand::Snapshot {
            command:
                SnapshotCommand::Take { conversation, .. }
                | SnapshotCommand::Restore { conversation, .. },
        } => Some(conversation),
        ManagerCommand::Fork(ForkArgs {
            conversation: Some(c),
            ..
        }) => Some(c),
        _ => None,
    }
}

fn conversation(app: &App, id: &str) -> anyhow::Result<ConversationRef> {
    Ok(ConversationRef::new(
        app.tenant.clone(),
        ConversationId::new(id)?,
    ))
}

fn print_record(r: &SnapshotRecord) {
    outln!(
        "{}  {} file(s), {} dir(s), {} link(s), {} bytes ({} stored)  from {}  on {}  {}{}",
        r.name,
        r.files,
        r.directories,
        r.links,
        r.bytes,
        r.stored_bytes,
        r.origin.as_ref().map_or("an import", |o| o.as_str()),
        r.runtime,
        r.created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        r.expires_at
            .map(|t| format!(
                "  expires {}",
                t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ))
            .unwrap_or_default()
    );
}

fn print_stats(what: &str, s: &ArchiveStats) {
    let skipped = match s.skipped {
        0 => String::new(),
        n => format!("; {n} left out (sockets, fifos, devices, mounts or paths over 4,095 bytes)"),
    };
    outln!(
        "{what}: {} file(s), {} dir(s), {} link(s), {} bytes{skipped}",
        s.files,
        s.directories,
        s.links,
        s.bytes
    );
}

/// Runs a `snapshot` subcommand.
pub(crate) async fn snapshot(app: &App, command: SnapshotCommand) -> anyhow::Result<ExitCode> {
    let m = &app.manager;
    match command {
        SnapshotCommand::Take {
            conversation: id,
            name,
            keep_secs,
        } => {
            let conv = conversation(app, &id)?;
            let r = m
                .snapshot(&conv, &name, keep_secs.map(Duration::from_secs))
                .await?;
            print_record(&r);
        }
        SnapshotCommand::List { json } => {
            let all = m.snapshots(&app.tenant).await?;
            if json {
                let rows: Vec<serde_json::Value> = all
                    .iter()
                    .map(|r| {
                        serde_json::json!({
                            "name": r.name,
                            "origin": r.origin.as_ref().map(|o| o.as_str()),
                            "runtime": r.runtime,
                            "bytes": r.bytes,
                            "files": r.files,
                            "directories": r.directories,
                            "links": r.links,
                            "stored_bytes": r.stored_bytes,
                            "created_at": r.created_at,
                            "expires_at": r.expires_at,
                        })
                    })
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&rows)?);
            } else if all.is_empty() {
                outln!("no snapshots");
            } else {
                all.iter().for_each(print_record);
            }
        }
        SnapshotCommand::Restore {
            conversation: id,
            name,
        } => {
            let conv = conversation(app, &id)?;
            let s = m.restore(&conv, &name).await?;
            print_stats(&format!("restored {name} into {id}"), &s);
        }
        SnapshotCommand::Rm { name } => {
            if m.delete_snapshot(&app.tenant, &name).await? {
                outln!("deleted snapshot {name}");
            } else {
                outln!("no snapshot named {name}; nothing deleted");
            }
        }
        SnapshotCommand::Export { name, file } => {
            let (record, mut archive) = m.snapshot_archive(&app.tenant, &name).await?;
            let to_stdout = file.as_os_str() == "-";
            tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                if to_stdout {
                    let mut out = std::io::stdout().lock();
                    std::io::copy(&mut archive, &mut out).context("cannot write stdout")?;
                    return Ok(());
                }
                let mut partial = file.clone().into_os_string();
                partial.push(".partial");
                let tmp = PathBuf::from(partial);
                // Owner-only, as `backup` writes and as workspaces are: the archive holds a
                // conversation's files.
                let mut out = {
                    use std::os::unix::fs::OpenOptionsExt as _;
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .mode(0o600)
                        .open(&tmp)
                }
                .with_context(|| format!("cannot create {}", tmp.display()))?;
                std::io::copy(&mut archive, &mut out)
                    .with_context(|| format!("cannot write {}", tmp.display()))?;
                out.sync_all()?;
                std::fs::rename(&tmp, &file)
                    .with_context(|| format!("cannot rename into {}", file.display()))?;
                Ok(())
            })
            .await??;
            if !to_stdout {
                errln_note(&format!(
                    "exported snapshot {} ({} bytes)",
                    record.name, record.stored_bytes
                ));
            }
        }
        SnapshotCommand::Import {
            name,
            file,
            keep_secs,
        } => {
            let r = m
                .import_snapshot(
                    &app.tenant,
                    &name,
                    &file,
                    keep_secs.map(Duration::from_secs),
                )
                .await?;
            print_record(&r);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A note on stderr (stdout may carry an archive).
fn errln_note(message: &str) {
    eprintln!("{message}");
}

/// Runs `fork`.
pub(crate) async fn fork(app: &App, args: ForkArgs) -> anyhow::Result<ExitCode> {
    let to = conversation(app, &args.to)?;
    let (stats, from) = match (args.conversation, args.snapshot, args.template) {
        (Some(c), None, None) => {
            let id = ConversationId::new(&c)?;
            (
                app.manager.fork(&ForkFrom::Conversation(id), &to).await?,
                format!("conversation {c}"),
            )
        }
        (None, Some(s), None) => (
            app.manager
                .fork(&ForkFrom::Snapshot(s.clone()), &to)
                .await?,
            format!("snapshot {s}"),
        ),
        (None, None, Some(t)) => (
            app.manager.create_from_template(&to, &t).await?,
            format!("template {t}"),
        ),
        _ => {
            return Err(crate::UsageError(
                "name what to fork: -c ID, --snapshot NAME or --template NAME".into(),
            )
            .into());
        }
    };
    print_stats(&format!("forked {from} into {}", args.to), &stats);
    Ok(ExitCode::SUCCESS)
}

/// Runs a `template` subcommand.
pub(crate) async fn template(app: &App, command: TemplateCommand) -> anyhow::Result<ExitCode> {
    let m = &app.manager;
    match command {
        TemplateCommand::Set { name, snapshot } => {
            m.set_template(&app.tenant, &name, &snapshot).await?;
            outln!("template {name} names snapshot {snapshot}");
        }
        TemplateCommand::Rm { name } => {
            if m.remove_template(&app.tenant, &name).await? {
                outln!("removed template {name}");
            } else {
                outln!("no template named {name}; nothing removed");
            }
        }
        TemplateCommand::List => {
            let all = m.templates(&app.tenant).await?;
            if all.is_empty() {
                outln!("no templates");
            }
            for (t, s) in all {
                outln!("{t}  -> snapshot {s}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
