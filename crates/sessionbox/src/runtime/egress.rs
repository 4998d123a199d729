//! The network side of the runtimes: the store-backed [`Control`] an egress gateway runs with,
//! the `isolated` runtime's egress wiring, and what a remote runtime's proxy tokens need.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use chrono::{DateTime, Utc};
use sessionbox_core::{ConversationKey, ConversationRef};
use sessionbox_egress::token::TokenKey;
use sessionbox_egress::{Aggregator, AggregatorConfig, Control, LogEntry, Policy, VerdictRow};
use sessionbox_local::isolated::EgressWiring;
use sessionbox_manager::decode_policy;
use sessionbox_store::Store;

/// The store behind a gateway: the policy in force, read per request, and the verdict log,
/// written through an [`Aggregator`] (a flood of one verdict is one row with a count, at most
/// `max_rows` itemized rows per conversation per second, one transaction per window).
#[derive(Debug)]
pub struct StoreControl {
    /// The store the policies are read from and the verdicts written to.
    pub store: Store,
    verdicts: Aggregator,
}

/// The conversation `key` names, if it is recorded.
fn conversation(store: &Store, key: &str) -> Result<Option<ConversationRef>, String> {
    let key = ConversationKey::parse(key).map_err(|e| e.to_string())?;
    let Some(rec) = store.get(&key).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    Ok(Some(ConversationRef::new(rec.tenant, rec.conversation_id)))
}

/// Writes one window of verdicts in one transaction. Verdicts of a conversation that is no
/// longer recorded (destroyed meanwhile) are dropped: destroy removed its log.
fn write_rows(store: &Store, rows: Vec<VerdictRow>) {
    let mut tenants: HashMap<String, Option<ConversationRef>> = HashMap::new();
    let mut entries = Vec::with_capacity(rows.len());
    for row in rows {
        let conv = tenants
            .entry(row.entry.conversation.clone())
            .or_insert_with(|| conversation(store, &row.entry.conversation).ok().flatten());
        let Some(conv) = conv else {
            continue;
        };
        let e = row.entry;
        entries.push(sessionbox_store::EgressLogEntry {
            at: DateTime::<Utc>::from(row.first),
            tenant: conv.tenant.clone(),
            conversation_key: conv.key.clone(),
            allowed: e.allowed,
            method: e.method,
            target: e.target,
            address: e.address,
            rule: e.rule,
            bytes_up: e.bytes_up,
            bytes_down: e.bytes_down,
            duration_ms: e.duration_ms,
            end: e.end,
            count: row.count,
        });
    }
    if let Err(err) = store.log_egress_many(&entries) {
        tracing::error!(rows = entries.len(), "cannot log egress verdicts: {err}");
    }
}

impl StoreControl {
    /// The control over `store`, its verdicts aggregated as `config` says. Starts the
    /// aggregator's writer on the current Tokio runtime.
    pub fn new(store: Store, config: AggregatorConfig) -> StoreControl {
        let s = store.clone();
        let verdicts = Aggregator::start(
            config,
            Arc::new(move |rows: Vec<VerdictRow>| write_rows(&s, rows)),
        );
        StoreControl { store, verdicts }
    }

    /// Writes the verdicts not written yet, and waits for them (the gateway is stopping).
    pub async fn flush(&self) {
        self.verdicts.close().await;
    }
}

impl Control for StoreControl {
    fn policy(&self, key: &str) -> Result<Policy, String> {
        match conversation(&self.store, key)? {
            // A conversation that no longer exists has no network.
            None => Ok(Policy::None),
            Some(conv) => decode_policy(
                self.store
                    .effective_egress_policy(&conv)
                    .map_err(|e| e.to_string())?
                    .as_ref(),
            )
            .map_err(|e| e.to_string()),
        }
    }

    fn record(&self, e: LogEntry) {
        self.verdicts.add(e);
    }
}

/// Where a remote runtime's commands reach the gateway at `address` (`HOST:PORT`), with the
/// data directory's token key (made on first use, shared with `egress-gateway --listen`).
pub fn gateway_access(
    address: &str,
    data_dir: &Path,
) -> anyhow::Result<sessionbox_egress::token::GatewayAccess> {
    let key = TokenKey::load_or_create(&key_path(data_dir))
        .context("cannot read or create the egress token key")?;
    Ok(sessionbox_egress::token::GatewayAccess::new(address, key)?)
}

/// The `isolated` runtime's egress wiring: a conversation gets the relay and a gateway when its
/// policy in force is an allowlist (the runtime asks its directory); the gateway is this binary
/// (`egress-gateway`) with the same data directory and configuration, and [`gateway_env`].
pub fn wiring(data_dir: &Path, config: Option<&Path>) -> EgressWiring {
    let mut gateway_args = vec![
        "--data-dir".to_owned(),
        data_dir.to_string_lossy().into_owned(),
    ];
    if let Some(c) = config {
        gateway_args.extend(["--config".to_owned(), c.to_string_lossy().into_owned()]);
    }
    gateway_args.push("egress-gateway".to_owned());
    EgressWiring {
        gateway_args,
        gateway_env: gateway_env(),
    }
}

/// The environment an egress gateway started by the `isolated` runtime gets (besides
/// `SESSIONBOX_LOG`): `SESSIONBOX_HOME` and `SESSIONBOX_STORE_URL` as this process has them,
/// so that it reads policies from the same store. The store URL may hold a password: it is
/// passed in the environment, never on the command line.
pub fn gateway_env() -> Vec<(OsString, OsString)> {
    ["SESSIONBOX_HOME", sessionbox_store::STORE_URL_ENV]
        .into_iter()
        .filter_map(|name| std::env::var_os(name).map(|v| (OsString::from(name), v)))
        .collect()
}

/// The egress token key of `data_dir` (made on first use).
pub fn key_path(data_dir: &Path) -> PathBuf {
    data_dir.join("egress.key")
}
