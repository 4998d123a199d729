//! `sessionbox keys`: create, list and revoke the HTTP server's API keys.

use std::path::Path;
use std::process::ExitCode;

use chrono::Utc;
use sessionbox_core::{ConversationId, ConversationScope, KeyScope, TenantId};
use sessionbox_store::{AuditEntry, KeyOptions, Store};

use crate::UsageError;

/// `sessionbox keys ...`. Keys are never taken on the command line: they are only printed, once,
/// by `create`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum KeysCommand {
    /// Create an API key for the tenant given with --tenant; prints the key once on stdout.
    ///
    /// By default the key reaches every conversation of the tenant and never expires. Narrow
    /// it for a browser, a user or an agent: `--conversation ID` or `--prefix TEXT`,
    /// `--read-only`, `--expires-in 1h`.
    Create {
        /// A note for people: who or what uses the key.
        #[arg(long)]
        label: Option<String>,
        /// Limit the key to this one conversation (also refused: snapshots, policies, the
        /// egress log and metrics, which reach the whole tenant).
        #[arg(long, value_name = "ID", conflicts_with = "prefix")]
        conversation: Option<String>,
        /// Limit the key to conversations whose id starts with this text (1-100 characters);
        /// `/mcp/new` then makes ids that start with it too.
        #[arg(long, value_name = "TEXT")]
        prefix: Option<String>,
        /// Only reading: files, listings, command output, records. Running commands,
        /// writing, making or destroying conversations are refused (403).
        #[arg(long)]
        read_only: bool,
        /// Stop accepting the key after this long (`90s`, `15m`, `12h`, `30d`).
        #[arg(long, value_name = "DURATION")]
        expires_in: Option<String>,
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
        KeysCommand::Create {
            label,
            conversation,
            prefix,
            read_only,
            expires_in,
        } => {
            let Some(tenant) = tenant else {
                return Err(UsageError(
                    "keys create needs --tenant TENANT: the key reaches only that tenant's conversations"
                        .into(),
                )
                .into());
            };
            let conversations = match (conversation, prefix) {
                (Some(id), _) => ConversationScope::One(ConversationId::new(id)?),
                (None, Some(p)) => ConversationScope::prefix(p)?,
                (None, None) => ConversationScope::All,
            };
            // Checked before the store is opened (bad input changes nothing); the expiry is
            // then counted from the store's clock, which decides it.
            let lifetime = match expires_in {
                None => None,
                Some(text) => {
                    let d = humantime::parse_duration(text).map_err(|e| {
                        UsageError(format!(
                            "--expires-in {text:?}: {e}; give a duration such as 90s, 15m, 12h or 30d"
                        ))
                    })?;
                    let d = chrono::Duration::from_std(d)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .filter(|d| Utc::now().checked_add_signed(*d).is_some())
                        .ok_or_else(|| {
                            UsageError(format!("--expires-in {text:?} is zero or too long"))
                        })?;
                    Some((text, d))
                }
            };
            let store = open()?;
            let now = store.now();
            let expires_at = match lifetime {
                None => None,
                Some((text, d)) => Some(now.checked_add_signed(d).ok_or_else(|| {
                    UsageError(format!("--expires-in {text:?} is zero or too long"))
                })?),
            };
            let options = KeyOptions {
                label: label.clone(),
                scope: KeyScope {
                    conversations,
                    read_only: *read_only,
                },
                expires_at,
            };
            let k = store.create_scoped_api_key(tenant, &options, now)?;
            store.audit(&AuditEntry {
                at: now,
                tenant: tenant.clone(),
                conversation_key: None,
                operation: "keys.create".to_owned(),
                outcome: "ok".to_owned(),
                detail: Some(format!(
                    "key={} scope={} expires={}",
                    k.record.id,
                    k.record.scope,
                    k.record.expires_at.map_or_else(
                        || "never".to_owned(),
                        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    )
                )),
            })?;
            eprintln!(
                "created API key {} for tenant {:?} ({}{}); it is shown once, below, and cannot be recovered",
                k.record.id,
                tenant.as_str(),
                k.record.scope,
                k.record.expires_at.map_or_else(String::new, |t| format!(
                    ", expires {}",
                    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ))
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
                    "{:<16} {:<20} {:<24} {:<20} {:<20} {:<20} SCOPE",
                    "ID",
                    "TENANT",
                    "LABEL",
                    "CREATED",
                    "REVOKED",
                    "EXPIRES"
                );
                let t =
                    |d: chrono::DateTime<Utc>| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                for k in keys {
                    outln!(
                        "{:<16} {:<20} {:<24} {:<20} {:<20} {:<20} {}",
                        k.id,
                        k.tenant.as_str(),
                        k.label.as_deref().unwrap_or("-"),
                        t(k.created_at),
                        k.revoked_at.map_or_else(|| "-".to_owned(), t),
                        k.expires_at.map_or_else(|| "-".to_owned(), t),
                        k.scope
                    );
                }
            }
        }
        KeysCommand::Revoke { id } => {
            let store = open()?;
            let now = store.now();
            store.revoke_api_key(id, now)?;
            if let Some(k) = store.list_api_keys()?.into_iter().find(|k| &k.id == id) {
                store.audit(&AuditEntry {
                    at: now,
                    tenant: k.tenant,
                    conversation_key: None,
                    operation: "keys.revoke".to_owned(),
                    outcome: "ok".to_owned(),
                    detail: Some(format!("key={id}")),
                })?;
            }
            outln!("revoked API key {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
