//! Egress commands: `policy set|show`, `egress-log`, `egress-token`, and `egress-gateway` (the
//! per-conversation gateway the `isolated` runtime starts, or a token-checking gateway for
//! remote runtimes). The store-backed control the gateway runs with is
//! [`sessionbox::runtime::egress`], beside the wiring the `isolated` runtime gets.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use sessionbox_core::{ConversationId, ConversationKey, ConversationRef, TenantId};
use sessionbox_egress::token::TokenKey;
use sessionbox_egress::{Auth, Gateway, GatewayConfig, Policy};
use sessionbox_manager::decode_policy;
use sessionbox_store::{EgressLogFilter, PolicyScope, Store};

use crate::UsageError;
use crate::config::EgressSection;
use crate::runtime::egress::{StoreControl, key_path};

/// `sessionbox policy ...`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum PolicyCommand {
    /// Set the network policy of the tenant (--tenant, or SESSIONBOX_TENANT, or the default
    /// tenant) or, with --conversation, of one conversation (which then wins over the
    /// tenant's).
    ///
    /// Rules: `example.com` (exactly), `*.example.com` (any name beneath, on a dot boundary),
    /// `203.0.113.0/24` or `2001:db8::/32` (a CIDR; an address is a /32 or /128), each
    /// optionally with ports: `:443`, `:8000-8100`, `:80,443` (IPv6 in brackets:
    /// `[2001:db8::/32]:443`). Deny rules win. Private ranges (10/8, 172.16/12, 192.168/16,
    /// 100.64/10, fc00::/7) and IANA special-purpose blocks (documentation, benchmarking
    /// 198.18/15, ...) need an allow rule inside them; cloud fabric addresses
    /// (168.63.129.16, ...) a rule naming exactly them. Loopback, unspecified, link-local
    /// (169.254.169.254), multicast and broadcast can never be allowed.
    #[command(group(clap::ArgGroup::new("profile").required(true).args(["none", "allow"])))]
    Set {
        /// One conversation of the tenant.
        #[arg(long, short = 'c', value_name = "ID")]
        conversation: Option<String>,
        /// No network at all (the default profile).
        #[arg(long, conflicts_with_all = ["allow", "deny"])]
        none: bool,
        /// Allow a rule (repeatable).
        #[arg(long, value_name = "RULE", num_args = 1..)]
        allow: Vec<String>,
        /// Deny a rule (repeatable); deny rules win over allow rules.
        #[arg(long, value_name = "RULE", num_args = 1.., requires = "allow")]
        deny: Vec<String>,
    },
    /// Show the policy in force for a conversation (and where it comes from), or the tenant's
    /// policy and every conversation policy of the tenant.
    Show {
        /// One conversation of the tenant.
        #[arg(long, short = 'c', value_name = "ID")]
        conversation: Option<String>,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Arguments of `sessionbox egress-log`.
#[derive(Debug, clap::Args)]
pub(crate) struct LogArgs {
    /// Only this conversation of the tenant.
    #[arg(long, short = 'c', value_name = "ID")]
    conversation: Option<String>,
    /// Only entries at or after TIME: RFC 3339 or an age such as `15m`, `2h`.
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Every tenant's entries (not with --conversation).
    #[arg(long, conflicts_with = "conversation")]
    all_tenants: bool,
    /// At most this many entries (the newest).
    #[arg(long, default_value_t = 1000)]
    limit: usize,
    /// As a JSON array.
    #[arg(long)]
    json: bool,
}

/// Arguments of `sessionbox egress-token`.
#[derive(Debug, clap::Args)]
pub(crate) struct TokenArgs {
    /// The conversation the token speaks for.
    #[arg(long, short = 'c', value_name = "ID")]
    conversation: String,
    /// How long it is valid, in seconds (at most a day).
    #[arg(long, default_value_t = 900)]
    ttl: u64,
}

/// Arguments of `sessionbox egress-gateway`: defined once in sessionbox-egress, where the
/// `isolated` runtime builds them to start a conversation's gateway.
pub(crate) use sessionbox_egress::GatewayArgs;

fn gateway_config(section: &EgressSection, args: &GatewayArgs) -> GatewayConfig {
    let mut c = GatewayConfig::default();
    if let Some(n) = args
        .max_connections
        .or(section.max_connections.map(std::num::NonZeroU32::get))
    {
        c.max_connections = n.max(1) as usize;
    }
    if let Some(n) = section.max_connections_per_source {
        c.max_connections_per_source = n.get() as usize;
    }
    if !section.nameservers.is_empty() {
        c.nameservers = Some(section.nameservers.clone());
    }
    if let Some(s) = section.idle_timeout_secs {
        c.idle_timeout = Duration::from_secs(s.max(1));
    }
    if let Some(s) = section.total_timeout_secs {
        c.total_timeout = Duration::from_secs(s.max(1));
    }
    if let Some(s) = section.connect_timeout_secs {
        c.connect_timeout = Duration::from_secs(s.max(1));
    }
    c
}

/// How the gateway aggregates its verdicts: `[egress] log_rows_per_sec` itemized rows per
/// conversation per second.
fn verdict_config(section: &EgressSection) -> sessionbox_egress::AggregatorConfig {
    sessionbox_egress::AggregatorConfig {
        max_rows: section
            .log_rows_per_sec
            .map_or(sessionbox_egress::AggregatorConfig::DEFAULT_MAX_ROWS, |n| {
                usize::try_from(n.max(1)).unwrap_or(usize::MAX)
            }),
        ..Default::default()
    }
}

/// `sessionbox egress-gateway`.
pub(crate) async fn gateway(
    args: &GatewayArgs,
    data_dir: &Path,
    store_url: Option<&str>,
    section: &EgressSection,
) -> anyhow::Result<ExitCode> {
    // The descriptor limit first, before anything else is opened.
    let mut config = gateway_config(section, args);
    config.max_connections = limit_descriptors(config.max_connections);
    let (url, db) = (store_url.map(str::to_owned), data_dir.join("sessionbox.db"));
    let store =
        tokio::task::spawn_blocking(move || Store::open_configured(url.as_deref(), &db)).await??;
    let control = Arc::new(StoreControl::new(store, verdict_config(section)));
    if let Some(addr) = args.listen {
        let key = TokenKey::load_or_create(&key_path(data_dir))
            .context("cannot read or create the egress token key")?;
        let gw = Gateway::new(config, control.clone(), Auth::Token(key))?;
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        outln!("sessionbox egress gateway listening on {}", l.local_addr()?);
        let served = tokio::select! {
            r = gw.serve_tcp(l) => r,
            _ = sessionbox_agent::termination_signal() => Ok(()),
        };
        // Nothing logged is lost on a normal stop.
        control.flush().await;
        served?;
        return Ok(ExitCode::SUCCESS);
    }
    let fd = args
        .listen_fd
        .expect("clap requires --listen or --listen-fd");
    let key = args
        .conversation_key
        .clone()
        .expect("clap requires --conversation-key");
    ConversationKey::parse(&key)?;
    if fd < 3 {
        return Err(UsageError(format!("--listen-fd {fd} is a standard stream")).into());
    }
    // SAFETY: the runtime hands this descriptor over (its listening socket, at 3); nothing else
    // in this process uses it. It is checked to be a Unix socket before use.
    let owned = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let addr = rustix::net::getsockname(&owned).context("--listen-fd is not a socket")?;
    anyhow::ensure!(
        addr.address_family() == rustix::net::AddressFamily::UNIX,
        "--listen-fd is not a Unix socket"
    );
    let std_listener = std::os::unix::net::UnixListener::from(owned);
    std_listener.set_nonblocking(true)?;
    let listener = tokio::net::UnixListener::from_std(std_listener)?;
    let gw = Gateway::new(config, control.clone(), Auth::Conversation(key))?;
    let watched = async {
        match args.watch_pid {
            Some(pid) => watch(pid).await,
            None => std::future::pending().await,
        }
    };
    let served = tokio::select! {
        r = gw.serve_unix(listener) => r,
        () = watched => Ok(()),
        _ = sessionbox_agent::termination_signal() => Ok(()),
    };
    // Nothing logged is lost on a normal stop (the sandbox ended, or a termination signal).
    control.flush().await;
    served?;
    Ok(ExitCode::SUCCESS)
}

/// Sets this process's descriptor limit (soft and hard) to what `max_connections` connections
/// need ([`GatewayConfig::descriptors_needed`]), so that the gateway refuses a connection over
/// its cap instead of failing with `EMFILE`; returns the cap to use: `max_connections`, or
/// fewer when the hard limit cannot be raised that far (without root), with a warning.
fn limit_descriptors(max_connections: usize) -> usize {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let want = GatewayConfig::descriptors_needed(max_connections);
    let exact = Rlimit {
        current: Some(want),
        maximum: Some(want),
    };
    if setrlimit(Resource::Nofile, exact).is_ok() {
        return max_connections;
    }
    // Not allowed to raise the hard limit: use all of it, and fit the cap under it.
    let hard = getrlimit(Resource::Nofile).maximum.unwrap_or(want);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(hard),
            maximum: Some(hard),
        },
    );
    let fits = GatewayConfig::connections_within(hard).min(max_connections);
    warn!(
        "egress: {max_connections} connections need {want} descriptors but the hard limit is {hard}: serving at most {fits} at once (raise the limit, or lower [egress] max_connections)"
    );
    fits
}

/// Completes when process `pid` exits (at once if it is gone).
async fn watch(pid: i32) {
    let Some(p) = rustix::process::Pid::from_raw(pid) else {
        return;
    };
    let Ok(fd) = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::NONBLOCK) else {
        return;
    };
    // One blocking thread waits on the pidfd: it becomes readable when the process exits.
    let _ = tokio::task::spawn_blocking(move || {
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        while let Err(rustix::io::Errno::INTR) = rustix::event::poll(&mut fds, None) {}
    })
    .await;
}

/// The store to read from: the PostgreSQL one when a URL is given, else the SQLite file when it
/// exists (`None`: nothing was ever recorded, so there is nothing to show).
fn existing_store(data_dir: &Path, store_url: Option<&str>) -> anyhow::Result<Option<Store>> {
    let db = data_dir.join("sessionbox.db");
    Ok(if store_url.is_some() || db.exists() {
        Some(Store::open_configured(store_url, &db)?)
    } else {
        None
    })
}

fn short(hash: &str) -> &str {
    &hash[..16.min(hash.len())]
}

/// `sessionbox policy set|show`.
pub(crate) fn policy(
    command: &PolicyCommand,
    data_dir: &Path,
    store_url: Option<&str>,
    tenant: &TenantId,
) -> anyhow::Result<ExitCode> {
    let conv = |id: &Option<String>| -> anyhow::Result<Option<ConversationRef>> {
        Ok(match id {
            Some(id) => Some(ConversationRef::new(
                tenant.clone(),
                ConversationId::new(id)?,
            )),
            None => None,
        })
    };
    match command {
        PolicyCommand::Set {
            conversation,
            none,
            allow,
            deny,
        } => {
            let policy = if *none {
                Policy::None
            } else {
                let a: Vec<&str> = allow.iter().map(String::as_str).collect();
                let d: Vec<&str> = deny.iter().map(String::as_str).collect();
                Policy::allowlist(&a, &d).map_err(|e| UsageError(e.to_string()))?
            };
            let scope = match conv(conversation)? {
                Some(c) => PolicyScope::Conversation(c),
                None => PolicyScope::Tenant(tenant.clone()),
            };
            let store = Store::open_configured(store_url, &data_dir.join("sessionbox.db"))?;
            store.set_egress_policy(&scope, &policy.to_json(), &policy.hash(), store.now())?;
            let whose = match &scope {
                PolicyScope::Tenant(t) => format!("tenant {t}"),
                PolicyScope::Conversation(c) => {
                    format!("conversation {} of tenant {}", c.id, c.tenant)
                }
            };
            outln!("policy of {whose} set (hash {})", short(&policy.hash()));
            outln!("{}", policy.describe());
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Show { conversation, json } => {
            let store = existing_store(data_dir, store_url)?;
            let mut shown = Vec::new();
            match conv(conversation)? {
                Some(c) => {
                    let stored = match &store {
                        Some(s) => s.effective_egress_policy(&c)?,
                        None => None,
                    };
                    let from = match &stored {
                        None => "default".to_owned(),
                        Some(s) if s.conversation_id.is_some() => "conversation".to_owned(),
                        Some(_) => format!("tenant {}", c.tenant),
                    };
                    let p = decode_policy(stored.as_ref())?;
                    shown.push((format!("conversation {}", c.id), from, p));
                }
                None => {
                    let all = match &store {
                        Some(s) => s.egress_policies(Some(tenant))?,
                        None => Vec::new(),
                    };
                    if !all.iter().any(|s| s.conversation_id.is_none()) {
                        shown.push((format!("tenant {tenant}"), "default".into(), Policy::None));
                    }
                    for s in all {
                        let who = match &s.conversation_id {
                            Some(id) => format!("conversation {id}"),
                            None => format!("tenant {tenant}"),
                        };
                        shown.push((who, "set".into(), decode_policy(Some(&s))?));
                    }
                }
            }
            if *json {
                let v: Vec<serde_json::Value> = shown
                    .iter()
                    .map(|(who, from, p)| {
                        serde_json::json!({"scope": who, "from": from, "hash": p.hash(), "policy": p})
                    })
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                for (who, from, p) in shown {
                    outln!("{who} ({from}, hash {}):", short(&p.hash()));
                    for line in p.describe().lines() {
                        outln!("  {line}");
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `sessionbox egress-log`.
pub(crate) fn log(
    args: &LogArgs,
    data_dir: &Path,
    store_url: Option<&str>,
    tenant: &TenantId,
) -> anyhow::Result<ExitCode> {
    let key = match &args.conversation {
        Some(id) => Some(ConversationKey::derive(tenant, &ConversationId::new(id)?)),
        None => None,
    };
    let since = match &args.since {
        Some(s) => Some(crate::audit::parse_since(s, Utc::now())?),
        None => None,
    };
    let records = if let Some(store) = existing_store(data_dir, store_url)? {
        store.egress_log(&EgressLogFilter {
            tenant: (!args.all_tenants).then(|| tenant.clone()),
            key,
            since,
            limit: Some(args.limit),
        })?
    } else {
        Vec::new()
    };
    if args.json {
        let v: Vec<serde_json::Value> = records
            .iter()
            .map(|r| {
                let e = &r.entry;
                serde_json::json!({
                    "id": r.id, "at": e.at, "tenant": e.tenant.as_str(),
                    "conversation_key": e.conversation_key.as_str(),
                    "verdict": if e.allowed { "allowed" } else { "denied" },
                    "method": e.method, "target": e.target, "address": e.address,
                    "rule": e.rule, "bytes_up": e.bytes_up, "bytes_down": e.bytes_down,
                    "duration_ms": e.duration_ms, "end": e.end, "count": e.count,
                })
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{:<20} {:<8} {:>7} {:<8} {:<32} {:>10} {:>10}  RULE / REASON",
        "AT",
        "VERDICT",
        "COUNT",
        "METHOD",
        "TARGET",
        "UP",
        "DOWN"
    );
    for r in records {
        let e = &r.entry;
        let mut why = e.rule.clone();
        if let Some(end) = &e.end {
            why.push_str(&format!(" [{end}]"));
        }
        outln!(
            "{:<20} {:<8} {:>7} {:<8} {:<32} {:>10} {:>10}  {}",
            e.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            if e.allowed { "allowed" } else { "denied" },
            e.count,
            e.method,
            e.target,
            e.bytes_up,
            e.bytes_down,
            why
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `sessionbox egress-token`: prints a signed token for a remote runtime's proxy settings.
pub(crate) fn token(
    args: &TokenArgs,
    data_dir: &Path,
    store_url: Option<&str>,
    tenant: &TenantId,
) -> anyhow::Result<ExitCode> {
    if args.ttl == 0 || args.ttl > 86_400 {
        return Err(UsageError("--ttl: give 1 to 86400 seconds".into()).into());
    }
    let conv = ConversationRef::new(tenant.clone(), ConversationId::new(&args.conversation)?);
    let store = Store::open_configured(store_url, &data_dir.join("sessionbox.db"))?;
    let policy = decode_policy(store.effective_egress_policy(&conv)?.as_ref())?;
    let key = TokenKey::load_or_create(&key_path(data_dir))
        .context("cannot read or create the egress token key")?;
    let now = Utc::now().timestamp().max(0) as u64;
    outln!(
        "{}",
        key.issue(conv.key.as_str(), &policy.hash(), now, args.ttl)
    );
    Ok(ExitCode::SUCCESS)
}
