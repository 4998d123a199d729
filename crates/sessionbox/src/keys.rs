//! `sessionbox keys`: create, list and revoke the HTTP server's API keys.

use std::path::Path;
use std::process::ExitCode;

use chrono::Utc;
use sessionbox_core::TenantId;
use sessionbox_store::Store;

use crate::UsageError;

/// `sessionbox keys ...`. Keys are never taken on the command line: they are only printed, once,
/// by `create`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum KeysCommand {
    /// Create an API key for the tenant given with --tenant; prints the key once on stdout.
    Create {
        /// A note for people: who or what uses the key.
        #[arg(long)]
        label: Option<String>,
    },
    /// List the API keys (never their secrets).
    List {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke an API key by its id; it is refused from then on.
    Revoke {
        /// The key's id (the ID column of `keys list`).
        id: String,
    },
}

/// Runs `sessionbox keys ...` on the store in `data_dir`. `tenant` is the tenant given with
/// --tenant (or SESSIONBOX_TENANT), if any.
pub(crate) fn keys(
    command: &KeysCommand,
    data_dir: &Path,
    store_url: Option<&str>,
    tenant: Option<&TenantId>,
) -> anyhow::Result<ExitCode> {
    let open = || Store::open_configured(store_url, &data_dir.join("sessionbox.db"));
    match command {
        KeysCommand::Create { label } => {
            let Some(tenant) = tenant else {
                return Err(UsageError(
                    "keys create needs --tenant TENANT: the key reaches only that tenant's conversations"
                        .into(),
                )
                .into());
            };
            let k = open()?.create_api_key(tenant, label.as_deref(), Utc::now())?;
            eprintln!(
                "created API key {} for tenant {:?}; it is shown once, below, and cannot be recovered",
                k.record.id,
                tenant.as_str()
            );
            outln!("{}", k.key);
        }
        KeysCommand::List { json } => {
            let store = open()?;
            let keys = store.list_api_keys()?;
            if *json {
                outln!("{}", serde_json::to_string_pretty(&keys)?);
            } else {
                outln!(
                    "{:<16} {:<20} {:<24} {:<20} {:<20}",
                    "ID",
                    "TENANT",
                    "LABEL",
                    "CREATED",
                    "REVOKED"
                );
                let t =
                    |d: chrono::DateTime<Utc>| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                for k in keys {
                    outln!(
                        "{:<16} {:<20} {:<24} {:<20} {:<20}",
                        k.id,
                        k.tenant.as_str(),
                        k.label.as_deref().unwrap_or("-"),
                        t(k.created_at),
                        k.revoked_at.map_or_else(|| "-".to_owned(), t)
                    );
                }
            }
        }
        KeysCommand::Revoke { id } => {
            open()?.revoke_api_key(id, Utc::now())?;
            outln!("revoked API key {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
