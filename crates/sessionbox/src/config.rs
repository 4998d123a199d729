//! Settings: command-line flags, then environment variables, then `sessionbox.toml`, then
//! defaults. Secrets are never read from flags or the file; they come from the environment or
//! from files named there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;
use sessionbox_core::Limits;

/// Runtimes this build can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// A Linux sandbox per conversation (namespaces, landlock, seccomp, cgroups, no network).
    Isolated,
    /// A plain directory per conversation; not a security boundary.
    Host,
    /// A directory per conversation in one shared AIO Sandbox container (`--endpoint`);
    /// trusted users only.
    Aio,
    /// An OpenSandbox sandbox (container) per conversation, on a remote OpenSandbox server.
    Opensandbox,
}

impl RuntimeKind {
    /// The name `--runtime` and `sessionbox.toml` spell it with: `isolated`, `host`, `aio` or
    /// `opensandbox`.
    pub fn name(self) -> &'static str {
        match self {
            RuntimeKind::Isolated => "isolated",
            RuntimeKind::Host => "host",
            RuntimeKind::Aio => "aio",
            RuntimeKind::Opensandbox => "opensandbox",
        }
    }
}

/// The contents of `sessionbox.toml`. Unknown keys are an error, so a typo is not ignored.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Default runtime.
    pub runtime: Option<RuntimeKind>,
    /// Default tenant.
    pub tenant: Option<String>,
    /// File operation limits.
    #[serde(default)]
    pub limits: Option<Limits>,
    /// `host` runtime settings.
    #[serde(default)]
    pub host: HostSection,
    /// `isolated` runtime settings.
    #[serde(default)]
    pub isolated: IsolatedSection,
    /// `aio` runtime settings.
    #[serde(default)]
    pub aio: AioSection,
    /// `opensandbox` runtime settings.
    #[serde(default)]
    pub opensandbox: OpenSandboxSection,
    /// Where the store lives.
    #[serde(default)]
    pub store: StoreSection,
    /// How long conversations live, by default and per tenant.
    #[serde(default)]
    pub lifecycle: LifecycleSection,
    /// Egress gateway settings.
    #[serde(default)]
    pub egress: EgressSection,
    /// Audit log retention.
    #[serde(default)]
    pub audit: AuditSection,
    /// Agent Skills: directories per tenant, limits.
    #[serde(default)]
    pub skills: SkillsSection,
    /// `serve` settings: what one tenant, and the whole server, may make it hold.
    #[serde(default)]
    pub serve: ServeSection,
    /// Snapshots: where they are kept and how much they may take.
    #[serde(default)]
    pub snapshots: SnapshotsSection,
}

/// `[snapshots]` settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotsSection {
    /// Where the archives are kept (default: `snapshots/` in the data directory). Replicas
    /// that do not share a data directory must share this one: a snapshot taken through one is
    /// read through another.
    pub dir: Option<PathBuf>,
    /// Days a snapshot is kept when its maker names no time (default 30; 0: until deleted).
    pub retention_days: Option<u64>,
    /// Most bytes of stored (compressed) archives per tenant (default 10 GiB; 0: no cap).
    pub tenant_cap_bytes: Option<u64>,
    /// Largest archive of one snapshot, restore or import, in bytes (default 4 GiB).
    pub max_archive_bytes: Option<u64>,
}

/// `[serve]` settings (the flags of `sessionbox serve` of the same names override them).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeSection {
    /// Most bytes of command output one tenant's running commands and requests may reserve at
    /// once (each reserves twice its `output_limit`); default 256 MiB.
    pub max_output_bytes_per_tenant: Option<u64>,
    /// Most bytes of command output all tenants together may reserve at once; default 1 GiB.
    pub max_output_bytes_total: Option<u64>,
    /// Most MCP sessions one tenant may have open at once; default 256.
    pub max_mcp_sessions_per_tenant: Option<usize>,
    /// Most previews, terminals and watches relayed to one conversation at once; default 32.
    pub max_relays_per_conversation: Option<usize>,
    /// Most connections open at once; default 4096.
    pub max_connections: Option<usize>,
    /// Most connections open at once from one IP address; default 1024.
    pub max_connections_per_source: Option<usize>,
    /// Seconds a request's head may take to arrive; default 15.
    pub header_read_timeout_secs: Option<u64>,
    /// Origins whose pages may call the API from a browser (CORS); default none.
    pub cors_origins: Option<Vec<String>>,
    /// PEM certificate chain for HTTPS (with `tls_key`); reloaded on SIGHUP and on change.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// Allow plain HTTP on an address that is not loopback (TLS ends in front); default false.
    pub insecure_plain_http: Option<bool>,
}

/// `[store]` settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// A PostgreSQL store shared by several replicas: `postgres://USER@HOST:PORT/DB`
    /// (`SESSIONBOX_STORE_URL` overrides it). Unset: the SQLite file `<data dir>/sessionbox.db`.
    /// A password may be in it (keep the file private) or in `PGPASSWORD`-style files that the
    /// URL does not name; it is never logged.
    pub url: Option<String>,
}

/// `[lifecycle]` settings: the default lifecycle, and `[lifecycle.tenants.NAME]` overrides
/// (a field an override leaves out falls back to the default's).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LifecycleSection {
    /// Seconds a sandbox may sit idle before it stops (the workspace stays). Default: `[isolated]
    /// idle_timeout_secs`, else 600.
    pub idle_timeout_secs: Option<u64>,
    /// Seconds a conversation lives after its last use (each use renews it); then it expires
    /// and garbage collection destroys it. Default: never.
    pub ttl_secs: Option<u64>,
    /// Seconds a conversation may live from its creation, however much it is used. Default:
    /// no bound.
    pub max_lifetime_secs: Option<u64>,
    /// Per-tenant overrides.
    #[serde(default)]
    pub tenants: std::collections::BTreeMap<String, TenantLifecycle>,
}

/// `[lifecycle.tenants.NAME]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLifecycle {
    /// As `[lifecycle] idle_timeout_secs`.
    pub idle_timeout_secs: Option<u64>,
    /// As `[lifecycle] ttl_secs`.
    pub ttl_secs: Option<u64>,
    /// As `[lifecycle] max_lifetime_secs`.
    pub max_lifetime_secs: Option<u64>,
}

impl FileConfig {
    /// The lifecycle policy: `[lifecycle]`, its tenant overrides, and `[isolated]
    /// idle_timeout_secs` as the idle default.
    pub fn lifecycle(&self) -> anyhow::Result<sessionbox_store::LifecyclePolicy> {
        use std::time::Duration;
        let secs = |v: Option<u64>| v.map(Duration::from_secs);
        let l = &self.lifecycle;
        let mut policy = sessionbox_store::LifecyclePolicy {
            default: sessionbox_store::Lifecycle {
                idle_timeout: secs(
                    l.idle_timeout_secs
                        .or(self.isolated.idle_timeout_secs)
                        .or(Some(DEFAULT_IDLE_TIMEOUT_SECS)),
                ),
                ttl: secs(l.ttl_secs),
                max_lifetime: secs(l.max_lifetime_secs),
            },
            tenants: Default::default(),
        };
        for (name, t) in &l.tenants {
            let tenant = sessionbox_core::TenantId::new(name.clone())
                .with_context(|| format!("[lifecycle.tenants.{name}]"))?;
            policy.tenants.insert(
                tenant,
                sessionbox_store::Lifecycle {
                    idle_timeout: secs(t.idle_timeout_secs),
                    ttl: secs(t.ttl_secs),
                    max_lifetime: secs(t.max_lifetime_secs),
                },
            );
        }
        Ok(policy)
    }

    /// The snapshot configuration: `[snapshots]` over the defaults, the archives in
    /// `data_dir/snapshots` unless `dir` says otherwise.
    pub fn snapshots(&self, data_dir: &std::path::Path) -> sessionbox_manager::SnapshotConfig {
        use sessionbox_manager::SnapshotConfig;
        let s = &self.snapshots;
        let mut c =
            SnapshotConfig::new(s.dir.clone().unwrap_or_else(|| data_dir.join("snapshots")));
        if let Some(days) = s.retention_days {
            c.retention =
                (days > 0).then(|| std::time::Duration::from_secs(days.saturating_mul(86_400)));
        }
        if let Some(cap) = s.tenant_cap_bytes {
            c.tenant_cap_bytes = (cap > 0).then_some(cap);
        }
        if let Some(max) = s.max_archive_bytes {
            c.max_archive_bytes = max;
        }
        c
    }

    /// How long and how much the egress and audit logs keep: `[egress] log_retention_days`,
    /// `log_max_rows`, `[audit] retention_days`, `max_rows`, defaults for the rest.
    pub fn log_retention(&self) -> sessionbox_store::LogRetention {
        use sessionbox_store::LogRetention;
        let days = |d: Option<u64>, default: u64| {
            std::time::Duration::from_secs(d.unwrap_or(default).saturating_mul(86_400))
        };
        LogRetention {
            egress_max_age: days(
                self.egress.log_retention_days,
                LogRetention::DEFAULT_EGRESS_DAYS,
            ),
            egress_max_rows: self
                .egress
                .log_max_rows
                .unwrap_or(LogRetention::DEFAULT_EGRESS_ROWS),
            audit_max_age: days(self.audit.retention_days, LogRetention::DEFAULT_AUDIT_DAYS),
            audit_max_rows: self
                .audit
                .max_rows
                .unwrap_or(LogRetention::DEFAULT_AUDIT_ROWS),
        }
    }

    /// The store URL: `SESSIONBOX_STORE_URL`, else `[store] url`.
    pub fn store_url(&self) -> Option<String> {
        std::env::var(sessionbox_store::STORE_URL_ENV)
            .ok()
            .filter(|u| !u.is_empty())
            .or_else(|| self.store.url.clone())
    }
}

/// The idle timeout when neither `[lifecycle]` nor `[isolated]` sets one: the isolated
/// runtime's default, 10 minutes.
pub const DEFAULT_IDLE_TIMEOUT_SECS: u64 =
    sessionbox_local::isolated::IsolatedConfig::DEFAULT_IDLE_TIMEOUT.as_secs();

/// `[egress]` settings of the gateway. Policies are not here: they live in the store
/// (`sessionbox policy set`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressSection {
    /// DNS servers the gateway asks (`"192.0.2.53:53"`); empty for the system's.
    #[serde(default)]
    pub nameservers: Vec<std::net::SocketAddr>,
    /// Close a connection after this many seconds with no byte either way (default 300).
    pub idle_timeout_secs: Option<u64>,
    /// Close a connection this many seconds after it was allowed (default 3600).
    pub total_timeout_secs: Option<u64>,
    /// Give up connecting to a target after this many seconds (default 10).
    pub connect_timeout_secs: Option<u64>,
    /// Most connections one conversation's gateway serves at once (default 256, at least 1);
    /// over it a new connection is answered 503 (`--max-connections` of `egress-gateway` wins).
    pub max_connections: Option<std::num::NonZeroU32>,
    /// On the gateway that `egress-gateway --listen` serves to remote sandboxes: most of those
    /// connections from one source address at once (default 32, at most `max_connections`),
    /// so one sandbox cannot hold them all.
    pub max_connections_per_source: Option<std::num::NonZeroU32>,
    /// Most itemized log rows per conversation per second (default 20); identical verdicts
    /// within a second are one row with a count, and verdicts past this are counted in one
    /// row per kind (allowed, denied).
    pub log_rows_per_sec: Option<u64>,
    /// Days verdicts are kept; `gc` removes older ones (default 30).
    pub log_retention_days: Option<u64>,
    /// Most verdict rows kept per tenant; `gc` removes the oldest beyond (default 100000).
    pub log_max_rows: Option<u64>,
}

/// `[audit]` settings: how long and how much of the audit log is kept (`gc` prunes it).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSection {
    /// Days audit records are kept (default 90).
    pub retention_days: Option<u64>,
    /// Most audit records kept per tenant, the oldest removed first (default 1000000).
    pub max_rows: Option<u64>,
}

/// `[skills]` settings: `[skills.tenants]` maps a tenant to its skills directories (absolute
/// paths); `SESSIONBOX_SKILLS_DIR` (`:`-separated) replaces the `default` tenant's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillsSection {
    /// Tenant name to skills directories.
    #[serde(default)]
    pub tenants: BTreeMap<String, Vec<PathBuf>>,
    /// Most bytes of one skill's delivered files (default 16 MiB).
    pub max_skill_bytes: Option<u64>,
    /// Most delivered files in one skill (default 1000).
    pub max_files: Option<u64>,
    /// Most bytes of one SKILL.md (default 256 KiB).
    pub max_skill_md_bytes: Option<u64>,
}

impl SkillsSection {
    /// The skills configuration: the file's, with `env_dirs` (the value of
    /// `SESSIONBOX_SKILLS_DIR`) as the default tenant's directories when set and not empty.
    pub fn resolve(&self, env_dirs: Option<&str>) -> anyhow::Result<sessionbox_skills::Skills> {
        let mut tenants = self.tenants.clone();
        if let Some(v) = env_dirs.filter(|v| !v.is_empty()) {
            tenants.insert(
                sessionbox_core::TenantId::DEFAULT.to_owned(),
                v.split(':')
                    .filter(|p| !p.is_empty())
                    .map(PathBuf::from)
                    .collect(),
            );
        }
        for (tenant, dirs) in &tenants {
            sessionbox_core::TenantId::new(tenant.clone())
                .with_context(|| format!("[skills.tenants] names an invalid tenant {tenant:?}"))?;
            if let Some(d) = dirs.iter().find(|d| !d.is_absolute()) {
                bail!(
                    "skills directory {} of tenant {tenant} is not an absolute path; give the full path",
                    d.display()
                );
            }
        }
        let mut limits = sessionbox_skills::SkillLimits::default();
        if let Some(v) = self.max_skill_bytes {
            limits.max_skill_bytes = v;
        }
        if let Some(v) = self.max_files {
            limits.max_files = v;
        }
        if let Some(v) = self.max_skill_md_bytes {
            limits.max_skill_md_bytes = v;
        }
        Ok(sessionbox_skills::Skills::new(tenants, limits))
    }
}

/// `[aio]` settings. The token is never read from here: it comes from `AIO_SANDBOX_TOKEN`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AioSection {
    /// Base URL of the AIO Sandbox server (`--endpoint` and `AIO_SANDBOX_BASE_URL` override it).
    pub endpoint: Option<String>,
    /// Directory inside the container holding the workspaces
    /// (default `/home/gem/workspace/conversations`).
    pub root: Option<String>,
    /// How the token is sent: `bearer` (default) or `x-aio-api-key`
    /// (`AIO_SANDBOX_AUTH_HEADER` overrides it).
    pub auth_header: Option<String>,
    /// `HOST:PORT` where the container reaches `sessionbox egress-gateway --listen` (sharing
    /// this data directory's `egress.key`): commands of allowlisted conversations get it as
    /// their proxy, with a token per command. Cooperative only: the container is shared.
    pub egress_gateway: Option<String>,
}

/// `[opensandbox]` settings. The API key is never read from here: it comes from the
/// `OPEN_SANDBOX_API_KEY` environment variable.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenSandboxSection {
    /// The lifecycle server, `http://HOST:PORT` (`--endpoint` and `OPEN_SANDBOX_DOMAIN`
    /// override it).
    pub endpoint: Option<String>,
    /// The image sandboxes run (default `sessionbox/sandbox:local`).
    pub image: Option<String>,
    /// Seconds an unused sandbox lives; renewed on use (default 1800, at least 60).
    pub timeout_secs: Option<u64>,
    /// Seconds a new sandbox's execd has to answer (default 60).
    pub ready_timeout_secs: Option<u64>,
    /// CPU limit of each sandbox, as the server reads it (default "1").
    pub cpu: Option<String>,
    /// Memory limit of each sandbox, as the server reads it (default "2Gi").
    pub memory: Option<String>,
    /// Ask for server-proxied execd endpoints (default true).
    pub use_server_proxy: Option<bool>,
    /// Commands and file operations straight to the sandbox's agent: `"auto"` (the default:
    /// at the server's direct endpoint when its host is the lifecycle server's or in
    /// `direct_hosts` and it answers, else through the server's proxy) or `"off"`.
    pub direct: Option<String>,
    /// Hosts a direct endpoint may name besides the lifecycle server's own: host names
    /// (exact), IP addresses or CIDR blocks (`172.17.0.0/16`, matching IP literals only).
    #[serde(default)]
    pub direct_hosts: Vec<String>,
    /// Names this installation in sandbox metadata (default: derived from the data directory).
    pub instance: Option<String>,
    /// Create each sandbox with a `networkPolicy` from the conversation's policy (only the
    /// egress gateway for an allowlist, nothing for `none`), enforced by the server's egress
    /// sidecar (default false: a sandbox's network is the server's, and sessionbox's policy
    /// does not bind it). A server without the sidecar refuses such sandboxes.
    pub network_policy: Option<bool>,
    /// `HOST:PORT` where sandboxes reach `sessionbox egress-gateway --listen` (sharing this
    /// data directory's `egress.key`): commands of allowlisted conversations get it as their
    /// proxy, with a token per command.
    pub egress_gateway: Option<String>,
    /// The PIDs limit the server puts on each sandbox (its `[docker] pids_limit`; the 1.1.1
    /// create request has no field for one, so sessionbox cannot send it): what
    /// `verify --acceptance` holds the sandboxes to. Unset: the check says the limit is not
    /// known to be enforced.
    pub server_pids_limit: Option<u64>,
    /// The disk quota of each sandbox's `/workspace` and `/tmp` together, in bytes (unset or
    /// 0: no quota, the container's layer is unlimited). Needs sessionbox running as root on
    /// the host of the server's Docker engine, and `volumes_dir` allowed by the server
    /// (`[storage] allowed_host_paths`).
    pub disk_bytes: Option<u64>,
    /// Inodes of that quota (default 100 000, or one per KiB of a smaller `disk_bytes`).
    pub disk_inodes: Option<u64>,
    /// Where the volumes live on this host (default `<data dir>/opensandbox-volumes`); the
    /// server must allow it.
    pub volumes_dir: Option<std::path::PathBuf>,
    /// Warm sandboxes kept ready on the server per tenant (default 0: no pool; at most 64). A
    /// new conversation whose sandbox would be made like a pooled one (with `network_policy`,
    /// its policy in force is `none`) takes one: its first exec needs no create. `serve` and
    /// `mcp` refill the pool and renew pooled sandboxes in the background. Not used with
    /// `disk_bytes` (volumes).
    pub pool_size: Option<usize>,
    /// Pool sizes of named tenants, overriding `pool_size` (`[opensandbox.pool_tenants]`,
    /// `tenant = N`).
    #[serde(default)]
    pub pool_tenants: std::collections::BTreeMap<String, usize>,
}

impl OpenSandboxSection {
    /// The warm pool's sizes these settings give.
    ///
    /// # Errors
    /// When a size is above [`PoolSizes::MAX`](sessionbox_core::PoolSizes::MAX).
    pub fn pool_sizes(&self) -> anyhow::Result<sessionbox_core::PoolSizes> {
        pool_sizes("opensandbox", self.pool_size, &self.pool_tenants)
    }
}

/// The pool sizes of section `[name]`, checked against [`PoolSizes::MAX`].
///
/// [`PoolSizes::MAX`]: sessionbox_core::PoolSizes::MAX
fn pool_sizes(
    name: &str,
    pool_size: Option<usize>,
    pool_tenants: &std::collections::BTreeMap<String, usize>,
) -> anyhow::Result<sessionbox_core::PoolSizes> {
    use sessionbox_core::PoolSizes;
    let sizes = PoolSizes {
        default: pool_size.unwrap_or(0),
        tenants: pool_tenants.clone(),
    };
    if let Some((who, n)) = std::iter::once(("pool_size", sizes.default))
        .chain(sizes.tenants.iter().map(|(t, n)| (t.as_str(), *n)))
        .find(|(_, n)| *n > PoolSizes::MAX)
    {
        anyhow::bail!(
            "[{name}] pool size {n} for {who} is above the most, {}",
            PoolSizes::MAX
        );
    }
    Ok(sizes)
}

/// `[isolated]` settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IsolatedSection {
    /// Seconds without a request after which a conversation's agent stops (default 600).
    pub idle_timeout_secs: Option<u64>,
    /// Most processes per conversation (default 512).
    pub pids: Option<u64>,
    /// Memory per conversation in bytes (default 2 GiB).
    pub memory_bytes: Option<u64>,
    /// CPUs per conversation (default 1.0).
    pub cpu: Option<f64>,
    /// First host uid given to conversations (default 3000000); each gets its own.
    pub uid_base: Option<u32>,
    /// How many host uids conversations may use (default 65536).
    pub uid_count: Option<u32>,
    /// How the sandbox limits are enforced: `"cgroup"` (default: memory, processes and CPU for
    /// each sandbox as a whole; needs root or a delegated cgroup, else the runtime does not
    /// start) or `"rlimit"` (per-process rlimits only, chosen explicitly to run without root
    /// and without a delegated cgroup).
    pub limits: Option<sessionbox_sandbox::LimitMode>,
    /// With `limits = "rlimit"`: CPU seconds per process (`RLIMIT_CPU`, default 3600).
    pub cpu_secs: Option<u64>,
    /// Pseudo-terminals per conversation at once (its own devpts instance's `max`, default 16).
    pub ptys: Option<u64>,
    /// Bytes of TCP socket buffers per conversation at once (default 256 MiB, at least 1 MiB;
    /// cgroup v1's `memory.kmem.tcp.limit_in_bytes`: the host's TCP memory is one pool).
    pub tcp_bytes: Option<u64>,
    /// Bytes each conversation's workspace may hold (default 1 GiB; at least 16 MiB; 0 turns
    /// the disk quota off). Enforced by the kernel, as root: the workspace is a loop-mounted
    /// ext4 volume of this size, and a write past it fails with `ENOSPC`.
    pub disk_bytes: Option<u64>,
    /// Files, directories and links each conversation's workspace may hold (default 100000;
    /// at least 64, at most one per KiB of `disk_bytes`).
    pub disk_inodes: Option<u64>,
    /// Bytes at which a conversation's `agent.log` and `egress.log` on the host are rotated
    /// (to `.1`, one kept), so each takes at most twice this (default 8 MiB, at least 64 KiB).
    pub log_max_bytes: Option<u64>,
    /// Warm sandboxes kept ready per tenant (default 0: no pool; at most 64). A new
    /// conversation takes one and starts in a bind rather than a launch; `serve` and `mcp`
    /// refill the pool in the background. Each pooled sandbox holds a uid, a volume and a few
    /// MiB of memory until it is used.
    pub pool_size: Option<usize>,
    /// Pool sizes of named tenants, overriding `pool_size` (`[isolated.pool_tenants]`,
    /// `tenant = N`).
    #[serde(default)]
    pub pool_tenants: std::collections::BTreeMap<String, usize>,
}

impl IsolatedSection {
    /// The disk quota these settings give: the defaults for what they leave out, `None` with
    /// `disk_bytes = 0`.
    ///
    /// # Errors
    /// When `disk_bytes` or `disk_inodes` is out of range (see [`DiskQuota::new`]).
    ///
    /// [`DiskQuota::new`]: sessionbox_local::isolated::DiskQuota::new
    pub fn disk_quota(&self) -> anyhow::Result<Option<sessionbox_local::isolated::DiskQuota>> {
        use sessionbox_local::isolated::DiskQuota;
        if self.disk_bytes == Some(0) {
            return Ok(None);
        }
        let quota = DiskQuota::new(
            self.disk_bytes.unwrap_or(DiskQuota::DEFAULT_BYTES),
            self.disk_inodes.unwrap_or(DiskQuota::DEFAULT_INODES),
        )
        .context("[isolated] disk_bytes, disk_inodes")?;
        Ok(Some(quota))
    }

    /// The warm pool's sizes these settings give.
    ///
    /// # Errors
    /// When a size is above [`PoolSizes::MAX`].
    ///
    /// [`PoolSizes::MAX`]: sessionbox_local::isolated::PoolSizes::MAX
    pub fn pool_sizes(&self) -> anyhow::Result<sessionbox_local::isolated::PoolSizes> {
        pool_sizes("isolated", self.pool_size, &self.pool_tenants)
    }

    /// The sandbox limits these settings give (defaults for what they leave out).
    pub fn sandbox_limits(&self) -> sessionbox_sandbox::SandboxLimits {
        let mut sandbox = sessionbox_sandbox::SandboxLimits::default();
        if let Some(v) = self.pids {
            sandbox.pids = v;
            sandbox.nproc = v;
        }
        if let Some(v) = self.memory_bytes {
            sandbox.memory_bytes = v;
        }
        if let Some(v) = self.cpu {
            sandbox.cpu = v;
        }
        if let Some(v) = self.limits {
            sandbox.mode = v;
        }
        if let Some(v) = self.cpu_secs {
            sandbox.cpu_secs = v;
        }
        if let Some(v) = self.ptys {
            sandbox.ptys = v;
        }
        if let Some(v) = self.tcp_bytes {
            sandbox.tcp_bytes = v;
        }
        sandbox
    }
}

/// `[host]` settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSection {
    /// Milliseconds between SIGTERM and SIGKILL on timeout (default 2000).
    pub kill_grace_ms: Option<u64>,
}

impl FileConfig {
    /// Reads `path`. A missing file is an empty configuration unless `required`.
    pub fn load(path: &Path, required: bool) -> anyhow::Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => Ok(Self::default()),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Parses the text of a configuration file; `path` only names it in an error.
    ///
    /// An error gives the parser's message and the line, never the text of the line: the
    /// parser's own display quotes it, and it could be a secret put where it does not belong.
    pub fn parse(text: &str, path: &Path) -> anyhow::Result<Self> {
        toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            anyhow::anyhow!(
                "invalid configuration file {}{}: {}",
                path.display(),
                line.map(|l| format!(" (line {l})")).unwrap_or_default(),
                without_values(e.message().trim(), text)
            )
        })
    }
}

/// `message` with every string value of the file `text` that it quotes taken out. The parser
/// quotes a value it cannot use (`unknown variant `...``, `invalid type: string "..."`), and
/// that value may be a secret under the wrong key; keys stay, so a typo is still named.
fn without_values(message: &str, text: &str) -> String {
    fn strings(v: &toml::Value, out: &mut Vec<String>) {
        match v {
            toml::Value::String(s) => out.push(s.clone()),
            toml::Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
            toml::Value::Table(t) => t.values().for_each(|v| strings(v, out)),
            _ => {}
        }
    }
    // A file that is not TOML at all fails before any value is read, and no value is quoted.
    let Ok(doc) = text.parse::<toml::Table>() else {
        return message.to_owned();
    };
    let mut values = Vec::new();
    doc.values().for_each(|v| strings(v, &mut values));
    // Longest first, so a value inside another is not taken out of it first.
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    let mut message = message.to_owned();
    for v in values {
        for quoted in [format!("`{v}`"), format!("{v:?}")] {
            message = message.replace(&quoted, "(the value, not shown)");
        }
    }
    message
}

/// The data directory: `--data-dir`, else `$SESSIONBOX_HOME`, else `$XDG_DATA_HOME/sessionbox`
/// (usually `~/.local/share/sessionbox`).
pub fn data_dir(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(d) = flag {
        return Ok(d);
    }
    if let Some(d) = std::env::var_os("SESSIONBOX_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    match dirs::data_dir() {
        Some(d) => Ok(d.join("sessionbox")),
        None => bail!("no data directory: set SESSIONBOX_HOME or pass --data-dir"),
    }
}

#[cfg(test)]
mod tests;
