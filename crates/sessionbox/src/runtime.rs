//! The runtime a command runs on, built in one place: [`build_runtime`] turns a runtime kind,
//! the settings of `sessionbox.toml` and the store into the [`Runtime`] that `run`, `serve`,
//! `verify`, the bench and the tests use, so every one of them runs the same runtime with the
//! same defaults.
//!
//! Also here: where a remote runtime's server is (`--endpoint`, then the environment, then the
//! file), the workspace root each runtime presents, and the helper roles this executable plays
//! for the runtimes it starts (sandbox init, a host command's supervisor, the agent).

pub mod egress;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use sessionbox_aio::{AioConfig, AioEgress, AioRuntime, AuthHeader, Endpoint};
use sessionbox_core::{ConversationKey, Runtime};
use sessionbox_local::host::{HostConfig, HostRuntime};
use sessionbox_local::isolated::{IsolatedConfig, IsolatedRuntime};
use sessionbox_manager::StoreDirectory;
use sessionbox_opensandbox::{ApiKey, ClientConfig, OpenSandboxConfig, OpenSandboxRuntime};
use sessionbox_skills::Skills;
use sessionbox_store::Store;

use crate::config::{FileConfig, OpenSandboxSection, RuntimeKind};

/// The environment variable holding the OpenSandbox server's address (as OpenSandbox users
/// already set it).
pub const DOMAIN_ENV: &str = "OPEN_SANDBOX_DOMAIN";
/// The environment variable holding the OpenSandbox API key.
pub const API_KEY_ENV: &str = "OPEN_SANDBOX_API_KEY";
/// The environment variable holding the AIO Sandbox server's address.
pub const AIO_URL_ENV: &str = "AIO_SANDBOX_BASE_URL";

/// What a runtime is built with besides `sessionbox.toml` and the store.
#[derive(Debug, Clone)]
pub struct BuildOptions<'a> {
    /// The executable the local runtimes start again as the sandbox init, the agent (its
    /// `agent` subcommand), a host command's supervisor and the egress gateway: the running
    /// `sessionbox`, normally.
    pub exe: PathBuf,
    /// `--endpoint`: the server of a remote runtime.
    pub endpoint: Option<&'a str>,
    /// `--config`, handed on to the egress gateways the `isolated` runtime starts.
    pub config_path: Option<&'a Path>,
    /// The skills bound into `isolated` sandboxes (none: nothing is bound).
    pub skills: Skills,
}

impl BuildOptions<'_> {
    /// Options for `exe`, with no endpoint, configuration path or skills.
    pub fn new(exe: PathBuf) -> Self {
        BuildOptions {
            exe,
            endpoint: None,
            config_path: None,
            skills: Skills::default(),
        }
    }
}

/// The runtime of `kind` for the data directory `data_dir` and its `store`, with the settings
/// of `file` (defaults for what it leaves out). Makes no request to a remote server.
pub fn build_runtime(
    kind: RuntimeKind,
    file: &FileConfig,
    store: &Store,
    data_dir: &Path,
    options: &BuildOptions<'_>,
) -> anyhow::Result<Arc<dyn Runtime>> {
    Ok(match kind {
        RuntimeKind::Isolated => Arc::new(isolated_runtime(file, store, data_dir, options)?),
        RuntimeKind::Host => Arc::new(host_runtime(file, data_dir, options)?),
        RuntimeKind::Aio => {
            let aio = aio_runtime(options.endpoint, file)?;
            Arc::new(match &file.aio.egress_gateway {
                Some(address) => aio.with_egress(AioEgress {
                    gateway: egress::gateway_access(address, data_dir)
                        .context("[aio] egress_gateway")?,
                    directory: Arc::new(StoreDirectory::new(store.clone())),
                }),
                None => aio,
            })
        }
        RuntimeKind::Opensandbox => Arc::new(opensandbox_runtime(
            options.endpoint,
            &file.opensandbox,
            data_dir,
            store.clone(),
        )?),
    })
}

/// The `isolated` runtime, as [`build_runtime`] builds it (for callers that need its own
/// methods): [`isolated_config`] with the installation's own uids ([`installation_uids`])
/// started with [`isolated_with`].
pub fn isolated_runtime(
    file: &FileConfig,
    store: &Store,
    data_dir: &Path,
    options: &BuildOptions<'_>,
) -> anyhow::Result<IsolatedRuntime> {
    let mut config = isolated_config(file, data_dir, &options.exe)?;
    if let Some(uids) = installation_uids(file, data_dir)? {
        config = config.with_uids(uids);
    }
    isolated_with(config, store, data_dir, options)
}

/// The host uids of this installation when `[isolated] uid_base` is not set and this process
/// is root (only root gives each conversation a uid of its own): the range claimed host-wide
/// for `data_dir` ([`IsolatedConfig::installation_uids`] in
/// [`sessionbox_local::isolated::UID_REGISTRY`]), so that two installations on one host never
/// share a uid. `None` when `uid_base` is set (the operator's choice) or without root.
///
/// # Errors
/// When the data directory or the registry cannot be written, or every range is claimed.
pub fn installation_uids(
    file: &FileConfig,
    data_dir: &Path,
) -> anyhow::Result<Option<std::ops::Range<u32>>> {
    let iso = &file.isolated;
    if iso.uid_base.is_some() || !rustix::process::geteuid().is_root() {
        return Ok(None);
    }
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
    let count = iso.uid_count.unwrap_or(IsolatedConfig::DEFAULT_UID_COUNT);
    Ok(Some(IsolatedConfig::installation_uids(
        data_dir,
        count,
        Path::new(sessionbox_local::isolated::UID_REGISTRY),
    )?))
}

/// The `isolated` runtime's settings from `[isolated]` and `limits` of `file`, defaults for
/// the rest: uids from `uid_base`/`uid_count`, `exe` as the sandbox init and agent. (Each
/// conversation's uid and own idle timeout come from the store, through the runtime's
/// directory: see [`isolated_with`].)
///
/// # Errors
/// When `disk_bytes` or `disk_inodes` is out of range.
pub fn isolated_config(
    file: &FileConfig,
    data_dir: &Path,
    exe: &Path,
) -> anyhow::Result<IsolatedConfig> {
    let iso = &file.isolated;
    let mut config = IsolatedConfig::new(data_dir, exe)
        .with_uids(IsolatedConfig::uid_range(iso.uid_base, iso.uid_count))
        .with_limits(file.limits.unwrap_or_default())
        .with_sandbox(iso.sandbox_limits())
        .with_disk(iso.disk_quota()?)
        .with_pool(iso.pool_sizes()?);
    if let Some(secs) = iso.idle_timeout_secs {
        config = config.with_idle_timeout(Duration::from_secs(secs));
    }
    if let Some(bytes) = iso.log_max_bytes {
        config.log_max_bytes = bytes;
    }
    Ok(config)
}

/// The `isolated` runtime with `config`, asking `store` about recorded conversations (through
/// [`StoreDirectory`]): egress through a gateway started as `options.exe egress-gateway` (with
/// [`egress::gateway_env`]) for a conversation whose policy lets it out, and the skills of
/// `options` bound read-only at `/skills/<name>` from snapshots in the data directory.
pub fn isolated_with(
    config: IsolatedConfig,
    store: &Store,
    data_dir: &Path,
    options: &BuildOptions<'_>,
) -> anyhow::Result<IsolatedRuntime> {
    let mut directory = StoreDirectory::new(store.clone());
    let skills = !options.skills.is_empty();
    if skills {
        directory = directory.with_skills(options.skills.clone(), data_dir.join("skills"));
    }
    let runtime = IsolatedRuntime::new(config, Arc::new(directory))?
        .with_egress(egress::wiring(data_dir, options.config_path));
    Ok(if skills {
        runtime.with_skills()
    } else {
        runtime
    })
}

fn host_runtime(
    file: &FileConfig,
    data_dir: &Path,
    options: &BuildOptions<'_>,
) -> anyhow::Result<HostRuntime> {
    let mut host = HostConfig::new(data_dir);
    host.supervisor = Some(options.exe.clone());
    host.agent = Some(vec![options.exe.clone().into_os_string(), "agent".into()]);
    if let Some(l) = file.limits {
        host.limits = l;
    }
    if let Some(ms) = file.host.kill_grace_ms {
        host.kill_grace = Duration::from_millis(ms);
    }
    Ok(HostRuntime::new(host)?)
}

/// The `aio` runtime from `endpoint` (`--endpoint`), else `AIO_SANDBOX_BASE_URL`, else
/// `[aio] endpoint`; the token from `AIO_SANDBOX_TOKEN`. Makes no request.
pub fn aio_runtime(endpoint: Option<&str>, file: &FileConfig) -> anyhow::Result<AioRuntime> {
    let from_env = std::env::var(AIO_URL_ENV).ok().filter(|v| !v.is_empty());
    let Some(url) = endpoint
        .map(str::to_owned)
        .or(from_env)
        .or(file.aio.endpoint.clone())
    else {
        bail!(
            "--runtime aio needs the AIO Sandbox server: give --endpoint URL (or set AIO_SANDBOX_BASE_URL, or endpoint in [aio] of sessionbox.toml)"
        );
    };
    let mut endpoint = Endpoint::new(url);
    if let Some(h) = &file.aio.auth_header {
        endpoint.auth = AuthHeader::parse(h)?;
    }
    let endpoint = endpoint.with_env_credentials()?;
    let mut config = AioConfig::new(endpoint);
    if let Some(root) = &file.aio.root {
        config.root = root.clone();
    }
    if let Some(l) = file.limits {
        config.limits = l;
    }
    Ok(AioRuntime::new(config)?)
}

/// The workspace root of conversation `key` as the runtime of `kind` presents it to commands
/// (what workspace paths are checked against before anything is created).
pub fn presented_root(
    kind: RuntimeKind,
    file: &FileConfig,
    data_dir: &Path,
    endpoint: Option<&str>,
    key: &ConversationKey,
) -> anyhow::Result<String> {
    Ok(match kind {
        RuntimeKind::Isolated => sessionbox_local::isolated::WORKSPACE.to_owned(),
        RuntimeKind::Opensandbox => sessionbox_opensandbox::runtime::WORKSPACE.to_owned(),
        RuntimeKind::Host => HostRuntime::workspace_path(data_dir, key)
            .to_string_lossy()
            .into_owned(),
        RuntimeKind::Aio => aio_runtime(endpoint, file)?.presented_root(key),
    })
}

/// The OpenSandbox lifecycle client's settings: the server from `endpoint` (`--endpoint`),
/// else `OPEN_SANDBOX_DOMAIN`, else `[opensandbox] endpoint`; the API key only from
/// `OPEN_SANDBOX_API_KEY` (never a flag or the file).
pub fn opensandbox_client(
    endpoint: Option<&str>,
    section: &OpenSandboxSection,
) -> anyhow::Result<ClientConfig> {
    let endpoint = endpoint
        .map(str::to_owned)
        .or_else(|| std::env::var(DOMAIN_ENV).ok().filter(|s| !s.is_empty()))
        .or_else(|| section.endpoint.clone());
    let Some(endpoint) = endpoint else {
        bail!(
            "the opensandbox runtime needs a server: pass --endpoint http://HOST:PORT, set \
             {DOMAIN_ENV}, or set endpoint in [opensandbox] of sessionbox.toml \
             (scripts/opensandbox-up starts a local one)"
        );
    };
    let key = match std::env::var(API_KEY_ENV) {
        Ok(k) if !k.is_empty() => {
            Some(ApiKey::new(k).map_err(|e| anyhow::anyhow!("{API_KEY_ENV}: {e}"))?)
        }
        _ => None,
    };
    let mut config = ClientConfig::new(endpoint, key);
    if let Some(p) = section.use_server_proxy {
        config.use_server_proxy = p;
    }
    config.direct_hosts = section.direct_hosts.clone();
    Ok(config)
}

/// The `opensandbox` runtime for `data_dir`'s store, network included (`network_policy`,
/// `egress_gateway` with the data directory's `egress.key`).
fn opensandbox_runtime(
    endpoint: Option<&str>,
    section: &OpenSandboxSection,
    data_dir: &Path,
    store: Store,
) -> anyhow::Result<OpenSandboxRuntime> {
    let client = opensandbox_client(endpoint, section)?;
    let instance = match &section.instance {
        Some(i) => i.clone(),
        None => default_instance(data_dir)?,
    };
    let mut config = OpenSandboxConfig::new(client, instance);
    if let Some(direct) = &section.direct {
        config.direct = direct
            .parse()
            .map_err(|e| anyhow::anyhow!("[opensandbox] direct: {e}"))?;
    }
    if let Some(image) = &section.image {
        config.image = image.clone();
    }
    if let Some(t) = section.timeout_secs {
        config.timeout = Duration::from_secs(t);
    }
    if let Some(t) = section.ready_timeout_secs {
        config.ready_timeout = Duration::from_secs(t);
    }
    if let Some(cpu) = &section.cpu {
        config.resource_limits.insert("cpu".into(), cpu.clone());
    }
    if let Some(memory) = &section.memory {
        config
            .resource_limits
            .insert("memory".into(), memory.clone());
    }
    config.egress.network_policy = section.network_policy.unwrap_or(false);
    if let Some(address) = &section.egress_gateway {
        config.egress.gateway = Some(
            egress::gateway_access(address, data_dir).context("[opensandbox] egress_gateway")?,
        );
    }
    // Every sandbox's agent takes requests with its conversation's token only. The tokens
    // derive from the server's API key (SHA-256 of it as the HMAC key): every replica of this
    // installation holds it, and whoever holds it controls every sandbox anyway; no token
    // reveals it. A server without an API key gives no token (its network is the only guard).
    config.agent_key = config.client.api_key.as_ref().map(|k| {
        use sha2::Digest;
        let digest: [u8; 32] = sha2::Sha256::digest(k.expose().as_bytes()).into();
        sessionbox_egress::token::TokenKey::from_bytes(digest)
    });
    if let Some(bytes) = section.disk_bytes.filter(|b| *b > 0) {
        use sessionbox_local::isolated::DiskQuota;
        let quota = DiskQuota::new(
            bytes,
            // Unset: the default, or one per KiB of a smaller volume.
            section
                .disk_inodes
                .unwrap_or(DiskQuota::DEFAULT_INODES.min(bytes / 1024)),
        )
        .context("[opensandbox] disk_bytes, disk_inodes")?;
        let dir = match &section.volumes_dir {
            Some(d) => d.clone(),
            None => data_dir.join("opensandbox-volumes"),
        };
        let volumes = sessionbox_local::host_volumes::HostVolumes::new(dir, quota, SANDBOX_UID)
            .context("[opensandbox] volumes_dir")?;
        config.volumes = Some(Arc::new(Volumes(volumes)));
    }
    config.pool = section.pool_sizes()?;
    if config.volumes.is_some() && !config.pool.is_off() {
        tracing::warn!(
            "[opensandbox] pool_size is not used with disk_bytes (volumes): every sandbox is \
             created for its conversation's volume"
        );
    }
    Ok(OpenSandboxRuntime::new(
        config,
        Arc::new(StoreDirectory::new(store)),
    )?)
}

/// The uid commands run as in an `opensandbox` sandbox (`scripts/opensandbox/bootstrap.sh`'s
/// default `SESSIONBOX_SANDBOX_USER`): the owner of a volume's `workspace/`.
const SANDBOX_UID: u32 = 1000;

/// This host's volumes as the `opensandbox` runtime asks for them.
#[derive(Debug)]
struct Volumes(sessionbox_local::host_volumes::HostVolumes);

impl sessionbox_opensandbox::WorkspaceVolumes for Volumes {
    fn prepare(
        &self,
        key: &sessionbox_core::ConversationKey,
    ) -> sessionbox_core::Result<(std::path::PathBuf, std::path::PathBuf)> {
        self.0.prepare(key).map(|p| (p.workspace, p.tmp))
    }

    fn remove(&self, key: &sessionbox_core::ConversationKey) -> sessionbox_core::Result<bool> {
        self.0.remove(key)
    }

    fn usage(&self, key: &sessionbox_core::ConversationKey) -> Option<sessionbox_core::DiskUsage> {
        self.0.usage(key)
    }
}

/// `sb-` and 12 hex digits of the SHA-256 of the data directory's canonical path: one instance
/// per store, so two installations sharing a server never touch each other's sandboxes.
fn default_instance(data_dir: &Path) -> anyhow::Result<String> {
    use sha2::Digest;
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let canon = std::fs::canonicalize(data_dir)
        .with_context(|| format!("cannot resolve {}", data_dir.display()))?;
    let digest = sha2::Sha256::digest(canon.as_os_str().as_encoded_bytes());
    Ok(format!(
        "sb-{}",
        digest[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ))
}

/// Becomes what the local runtimes start this executable as, when this process was started so:
/// the sandbox init (which must start in a fresh single-threaded process, so call this first
/// thing in `main`), a host background command's supervisor, or the log relay of a sandbox's
/// host log (`sessionbox_local::log_relay`). None returns; otherwise this
/// returns at once.
pub fn become_helper_if_started_as_one() {
    if sessionbox_sandbox::is_init_invocation() {
        sessionbox_sandbox::init_main();
    }
    if sessionbox_local::supervise::is_supervisor_invocation() {
        sessionbox_local::supervise::supervisor_main();
    }
    if sessionbox_local::log_relay::is_log_relay_invocation() {
        sessionbox_local::log_relay::log_relay_main();
    }
}

/// Serves the execd API as the in-sandbox agent with `args` (what follows `agent` on the
/// command line), as the `isolated` runtime starts it.
pub fn run_agent(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let argv = std::iter::once(OsString::from("sessionbox agent")).chain(args);
    sessionbox_agent::run_cli(argv)
}
