//! `sessionbox serve`: the HTTP API, until SIGINT or SIGTERM, and the data directory's
//! serving lock that `restore` checks.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use sessionbox::config::ServeSection;
use sessionbox_server::{AppState, ServerConfig};

use crate::App;
use sessionbox_core::TenantId;

/// Arguments of `sessionbox serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on. Anything but a loopback address needs an API key to exist
    /// (`sessionbox keys create`). Port 0 picks a free port; the address is printed on stdout.
    #[arg(long, env = "SESSIONBOX_LISTEN", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Most requests holding or waiting for one conversation before the server answers 429.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Most conversation sessions kept open between requests (0: open one per request).
    #[arg(long, default_value_t = 1024)]
    max_open_sessions: usize,
    /// Largest JSON request body in bytes (exec stdin travels in it).
    #[arg(long, default_value_t = 8 * 1024 * 1024)]
    max_json_bytes: usize,
    /// Largest file body of `PUT .../files/{path}` in bytes.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    max_file_bytes: usize,
    /// Seconds between garbage collections (expired conversations, orphans; see `sessionbox
    /// gc`); the first runs at start. 0 turns it off.
    #[arg(long, default_value_t = 60)]
    gc_interval_secs: u64,
    /// Seconds a record must have been unused before garbage collection counts it as stuck or
    /// dangling.
    #[arg(long, default_value_t = 60)]
    gc_grace_secs: u64,
    /// Most bytes of command output one tenant may have reserved at once (each command reserves
    /// twice its output_limit until it ends); past it, 429. Default: `[serve]
    /// max_output_bytes_per_tenant`, else 268435456 (256 MiB).
    #[arg(
        long,
        env = "SESSIONBOX_MAX_OUTPUT_BYTES_PER_TENANT",
        value_name = "BYTES"
    )]
    max_output_bytes_per_tenant: Option<u64>,
    /// Most bytes of command output all tenants may have reserved at once; past it, 429.
    /// Default: `[serve] max_output_bytes_total`, else 1073741824 (1 GiB).
    #[arg(long, env = "SESSIONBOX_MAX_OUTPUT_BYTES_TOTAL", value_name = "BYTES")]
    max_output_bytes_total: Option<u64>,
    /// Most MCP sessions one tenant may have open at once; past it, 429. Default: `[serve]
    /// max_mcp_sessions_per_tenant`, else 256.
    #[arg(long, env = "SESSIONBOX_MAX_MCP_SESSIONS_PER_TENANT", value_name = "N")]
    max_mcp_sessions_per_tenant: Option<usize>,
    /// Most previews, terminals and watches relayed to one conversation at once (each HTTP
    /// request in flight or WebSocket open counts); past it, 429. Default: `[serve]
    /// max_relays_per_conversation`, else 32.
    #[arg(long, env = "SESSIONBOX_MAX_RELAYS_PER_CONVERSATION", value_name = "N")]
    max_relays_per_conversation: Option<usize>,
    /// Most connections open at once; one more is closed as soon as it is accepted. Default:
    /// `[serve] max_connections`, else 4096.
    #[arg(long, env = "SESSIONBOX_MAX_CONNECTIONS", value_name = "N")]
    max_connections: Option<usize>,
    /// Most connections open at once from one IP address (behind a reverse proxy, set it to
    /// --max-connections: every client shares the proxy's address). Default: `[serve]
    /// max_connections_per_source`, else 1024.
    #[arg(long, env = "SESSIONBOX_MAX_CONNECTIONS_PER_SOURCE", value_name = "N")]
    max_connections_per_source: Option<usize>,
    /// Seconds a request's head may take to arrive (from the connection's start or the
    /// previous response); then the connection is closed. Default: `[serve]
    /// header_read_timeout_secs`, else 15.
    #[arg(long, env = "SESSIONBOX_HEADER_READ_TIMEOUT_SECS", value_name = "SECS")]
    header_read_timeout_secs: Option<u64>,
    /// An origin (`https://app.example.com`) whose pages may call the API from a browser
    /// (CORS); repeat for more. None by default: browsers then refuse every other origin's
    /// page. Default: `[serve] cors_origins`.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origins: Vec<String>,
    /// Serve HTTPS with this PEM certificate chain (the server's certificate first); needs
    /// --tls-key. Both files are read again on SIGHUP and when they change; a pair that does
    /// not load is logged and the previous one stays. Default: `[serve] tls_cert`.
    #[arg(long, env = "SESSIONBOX_TLS_CERT", value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1). Default: `[serve] tls_key`.
    #[arg(long, env = "SESSIONBOX_TLS_KEY", value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Allow plain HTTP on an address that is not loopback (when TLS ends in a proxy in front
    /// of this server); without TLS such an address is refused. Default: `[serve]
    /// insecure_plain_http`, else false.
    #[arg(long)]
    insecure_plain_http: bool,
    /// Seconds between looks at the TLS certificate and key files (a change reloads them);
    /// 0: reload on SIGHUP only.
    #[arg(long, default_value_t = 5, value_name = "SECS")]
    tls_poll_secs: u64,
}

/// The certificate and key `serve` presents, from the flags or else `[serve]`; `None` for plain
/// HTTP.
///
/// # Errors
/// [`sessionbox_core::Error::InvalidRequest`] when only one of the two is given.
fn tls_files(args: &ServeArgs, file: &ServeSection) -> anyhow::Result<Option<(PathBuf, PathBuf)>> {
    let cert = args.tls_cert.clone().or_else(|| file.tls_cert.clone());
    let key = args.tls_key.clone().or_else(|| file.tls_key.clone());
    match (cert, key) {
        (Some(c), Some(k)) => Ok(Some((c, k))),
        (None, None) => Ok(None),
        _ => Err(sessionbox_core::Error::InvalidRequest(
            "TLS needs both a certificate and its key: give --tls-cert FILE and --tls-key FILE \
             (or [serve] tls_cert and tls_key)"
                .into(),
        )
        .into()),
    }
}

/// How often a long-lived process refills the warm pools and pings their sandboxes (well
/// under the agents' idle timeout, so pooled sandboxes do not stop).
pub(crate) const POOL_MAINTENANCE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Fills `tenants`' warm pools now, then keeps every pool this process has used filled and
/// alive, every [`POOL_MAINTENANCE_EVERY`] (nothing happens when no pool is configured).
pub(crate) fn spawn_pool_maintenance(
    manager: &sessionbox_manager::Manager,
    tenants: Vec<TenantId>,
) {
    let manager = manager.clone();
    tokio::spawn(async move {
        loop {
            let _ = manager.maintain_pools(&tenants).await;
            tokio::time::sleep(POOL_MAINTENANCE_EVERY).await;
        }
    });
}

/// Runs `sessionbox serve` until SIGINT or SIGTERM.
pub(crate) async fn run(
    ctx: &App,
    args: ServeArgs,
    file: &ServeSection,
    data_dir: &Path,
    doctor: crate::doctor::Probe,
) -> anyhow::Result<ExitCode> {
    // Held (shared) while this server runs, so that `restore` can refuse to replace the store
    // under it.
    let _serving = hold_serving(data_dir)?;
    let tls = tls_files(&args, file)?;
    let insecure_plain_http = args.insecure_plain_http || file.insecure_plain_http == Some(true);
    let listen = args.listen;
    let keyed = ctx
        .manager
        .store()
        .run(move |s| {
            sessionbox_server::check_listen(&listen, s)?;
            s.has_api_keys()
        })
        .await?;
    sessionbox_server::check_transport(&listen, tls.is_some(), insecure_plain_http)?;
    // Read before binding: a bad pair fails the start, not the first handshake.
    let cert = match &tls {
        Some((cert, key)) => Some(sessionbox_server::tls::ReloadingCert::load(cert, key)?),
        None => None,
    };
    let loopback = args.listen.ip().is_loopback();
    let config = ServerConfig {
        max_json_bytes: args.max_json_bytes,
        max_file_bytes: args.max_file_bytes,
        max_queue: args.max_queue.max(1),
        max_open_sessions: args.max_open_sessions,
        open_tenant: loopback.then(|| ctx.tenant.clone()),
        max_output_bytes_per_tenant: args
            .max_output_bytes_per_tenant
            .or(file.max_output_bytes_per_tenant)
            .unwrap_or(sessionbox_server::DEFAULT_MAX_OUTPUT_BYTES_PER_TENANT),
        max_output_bytes_total: args
            .max_output_bytes_total
            .or(file.max_output_bytes_total)
            .unwrap_or(sessionbox_server::DEFAULT_MAX_OUTPUT_BYTES_TOTAL),
        max_mcp_sessions_per_tenant: args
            .max_mcp_sessions_per_tenant
            .or(file.max_mcp_sessions_per_tenant)
            .unwrap_or(sessionbox_server::DEFAULT_MAX_MCP_SESSIONS_PER_TENANT)
            .max(1),
        preview_key: Some(preview_key(data_dir)?),
        max_relays_per_conversation: args
            .max_relays_per_conversation
            .or(file.max_relays_per_conversation)
            .unwrap_or(sessionbox_server::DEFAULT_MAX_RELAYS_PER_CONVERSATION)
            .max(1),
        max_connections: args
            .max_connections
            .or(file.max_connections)
            .unwrap_or(sessionbox_server::DEFAULT_MAX_CONNECTIONS)
            .max(1),
        max_connections_per_source: args
            .max_connections_per_source
            .or(file.max_connections_per_source)
            .unwrap_or(sessionbox_server::DEFAULT_MAX_CONNECTIONS_PER_SOURCE)
            .max(1),
        header_read_timeout: std::time::Duration::from_secs(
            args.header_read_timeout_secs
                .or(file.header_read_timeout_secs)
                .unwrap_or(15)
                .max(1),
        ),
        cors_origins: match args.cors_origins.is_empty() {
            true => file.cors_origins.clone().unwrap_or_default(),
            false => args.cors_origins.clone(),
        },
    };
    for origin in &config.cors_origins {
        sessionbox_server::check_cors_origin(origin)?;
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener
        .local_addr()
        .context("cannot read the listen address")?;
    let scheme = if cert.is_some() { "https" } else { "http" };
    outln!("listening on {scheme}://{addr}");
    eprintln!(
        "sessionbox: serving the HTTP API on {scheme}://{addr} with the {} runtime; {}",
        ctx.runtime_name,
        if keyed {
            "API keys are required".to_owned()
        } else {
            format!(
                "no API key exists, so requests without one act as tenant {:?} until the first \
                 `sessionbox keys create`",
                ctx.tenant.as_str()
            )
        }
    );
    use std::io::Write;
    std::io::stdout().flush().ok();
    let manager = ctx.manager.clone().with_pool_refill();
    spawn_pool_maintenance(&manager, ctx.warm_tenants.clone());
    let state = AppState::new(manager, config);
    state.set_doctor(doctor.for_server());
    if args.gc_interval_secs > 0 {
        let manager = ctx.manager.clone();
        let gc_state = state.clone();
        let every = std::time::Duration::from_secs(args.gc_interval_secs);
        let options = sessionbox_manager::GcOptions {
            dry_run: false,
            grace: std::time::Duration::from_secs(args.gc_grace_secs),
        };
        tokio::spawn(async move {
            loop {
                let result = manager.collect_garbage(options).await;
                gc_state.record_gc(&result);
                match result {
                    Ok(r) => {
                        // Routine work, not a fault: info (failures below are warnings).
                        if r.found() > 0 {
                            tracing::info!(
                                expired = r.expired.len(),
                                stuck = r.stuck.len(),
                                orphans = r.orphans.len(),
                                dangling = r.dangling.len(),
                                removed = r.removed(),
                                "garbage collection"
                            );
                        }
                        if !r.idle_stopped.is_empty() {
                            tracing::info!(
                                idle = r.idle_stopped.len(),
                                stopped = r.stopped(),
                                "garbage collection stopped idle sandboxes"
                            );
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "garbage collection failed"),
                }
                tokio::time::sleep(every).await;
            }
        });
    }
    match cert {
        Some(cert) => {
            let poll = (args.tls_poll_secs > 0)
                .then(|| std::time::Duration::from_secs(args.tls_poll_secs));
            let watcher = sessionbox_server::tls::watch(cert.clone(), poll)
                .context("cannot watch for SIGHUP to reload the TLS certificate")?;
            let listener =
                sessionbox_server::tls::TlsListener::new(listener, cert.server_config()?)
                    .context("cannot read the listen address")?;
            let served = sessionbox_server::serve(listener, state, shutdown_signal()).await;
            watcher.abort();
            served.context("the HTTPS server failed")?;
        }
        None => sessionbox_server::serve(listener, state, shutdown_signal())
            .await
            .context("the HTTP server failed")?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The key that signs preview links: `preview.key` in the data directory (32 random bytes,
/// 0600, made on first use). Replicas that should honour each other's links share the file.
fn preview_key(data_dir: &Path) -> anyhow::Result<sessionbox_egress::token::TokenKey> {
    let path = data_dir.join("preview.key");
    sessionbox_egress::token::TokenKey::load_or_create(&path).with_context(|| {
        format!(
            "cannot read or make the preview link key {}",
            path.display()
        )
    })
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// The file every `serve` on a data directory holds a shared lock on while it runs.
fn serving_lock(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("serve.lock")
}

/// Takes the data directory's serving lock (shared: several replicas may serve one data
/// directory); released when the returned file is dropped or the process ends.
fn hold_serving(data_dir: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let path = serving_lock(data_dir);
    let f =
        std::fs::File::create(&path).with_context(|| format!("cannot open {}", path.display()))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockShared)
        .with_context(|| format!("cannot lock {}", path.display()))?;
    Ok(f)
}

/// Refuses when a `serve` runs on `data_dir` (it holds the serving lock): restoring the store
/// under a running server would mix two histories.
///
/// # Errors
/// When a server holds the lock, saying to stop it first.
pub(crate) fn refuse_while_serving(data_dir: &Path) -> anyhow::Result<()> {
    let path = serving_lock(data_dir);
    let Ok(f) = std::fs::File::open(&path) else {
        return Ok(()); // no server ever ran here
    };
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::WOULDBLOCK) => anyhow::bail!(
            "a `sessionbox serve` is running on {}; stop it (every replica) before restoring",
            data_dir.display()
        ),
        Err(e) => Err(e).with_context(|| format!("cannot lock {}", path.display())),
    }
}
