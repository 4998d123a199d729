//! `sessionbox doctor`: which sandbox layers this machine enforces, and what to do about a
//! missing one; whether it runs as root, how conversations' uids are mapped, which limits hold
//! and how to delegate a cgroup to a normal user, and whether the disk quota holds (by making,
//! filling and removing a small volume). Never falls back silently: the `isolated`
//! runtime either runs with every layer reported here or fails naming the missing one.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sessionbox_local::isolated::{DiskQuota, IsolatedConfig, UID_REGISTRY, overlapping_claims};
use sessionbox_sandbox::{self as sandbox, Decision, LayerState, UidMapping};

use crate::app::Settings;
use crate::cli::Globals;
use crate::config::{FileConfig, RuntimeKind};
use crate::runtime;

/// What `doctor` found: the report as it prints it, whether the default runtime can run here,
/// and the lines that name a problem (a missing layer, a disk quota that does not hold, a uid
/// range shared with another installation, a configured runtime that cannot run).
#[derive(Debug, Clone, Default)]
pub(crate) struct Report {
    /// The report, a line each.
    pub(crate) lines: Vec<String>,
    /// The lines of `lines` that name a problem, trimmed.
    pub(crate) problems: Vec<String>,
    /// True when the default runtime can run here (`doctor`'s exit status 0).
    pub(crate) ok: bool,
}

impl Report {
    fn line(&mut self, text: String) {
        self.lines.push(text);
    }

    /// A line that names a problem.
    fn problem(&mut self, text: String) {
        self.problems.push(text.trim().to_owned());
        self.lines.push(text);
    }
}

/// A line of the report (`say!(r)` for a blank one).
macro_rules! say {
    ($r:expr) => {
        $r.line(String::new())
    };
    ($r:expr, $($arg:tt)*) => {
        $r.line(format!($($arg)*))
    };
}

/// A line of the report that names a problem.
macro_rules! flag {
    ($r:expr, $($arg:tt)*) => {
        $r.problem(format!($($arg)*))
    };
}

/// What `doctor` checks: the settings it reads, kept so that `serve` can run it again.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    default: RuntimeKind,
    /// `--endpoint`: the server of the runtime asked for, aio's with `--runtime aio`, else
    /// OpenSandbox's.
    endpoint: Option<String>,
    file: FileConfig,
    data_dir: PathBuf,
}

impl Probe {
    pub(crate) fn new(globals: &Globals, settings: &Settings) -> Probe {
        Probe {
            default: settings.kind,
            endpoint: globals.endpoint.clone(),
            file: settings.file.clone(),
            data_dir: settings.data_dir.clone(),
        }
    }

    /// Runs the checks: the runtimes asked for, configured, or named by the environment.
    pub(crate) async fn run(&self) -> Report {
        let (kind, file) = (self.default, &self.file);
        let endpoint = self.endpoint.as_deref();
        let wants_osb = kind == RuntimeKind::Opensandbox
            || (endpoint.is_some() && kind != RuntimeKind::Aio)
            || std::env::var_os(runtime::DOMAIN_ENV).is_some()
            || file.opensandbox.endpoint.is_some();
        let osb_endpoint = endpoint.filter(|_| kind != RuntimeKind::Aio);
        let osb = wants_osb.then(|| runtime::opensandbox_client(osb_endpoint, &file.opensandbox));
        let wants_aio = kind == RuntimeKind::Aio
            || std::env::var_os(runtime::AIO_URL_ENV).is_some_and(|v| !v.is_empty())
            || file.aio.endpoint.is_some();
        let aio = wants_aio.then(|| runtime::aio_runtime(endpoint, file));
        run(kind, osb, aio, file, &self.data_dir).await
    }

    /// Prints the report; exit 0 only when the default runtime can run here.
    pub(crate) async fn print(&self) -> ExitCode {
        let r = self.run().await;
        for line in &r.lines {
            outln!("{line}");
        }
        if r.ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }

    /// The probe `serve` hands its server, for `GET /v1/installation/doctor`.
    pub(crate) fn for_server(self) -> sessionbox_server::DoctorProbe {
        let probe = std::sync::Arc::new(self);
        std::sync::Arc::new(move || {
            let probe = probe.clone();
            Box::pin(async move {
                let r = probe.run().await;
                sessionbox_server::DoctorReport {
                    ok: r.ok,
                    problems: r.problems,
                    text: r.lines.join("\n"),
                }
            })
        })
    }
}

/// Checks this machine and the configured runtimes. `opensandbox` is the OpenSandbox server to
/// probe, when one is configured (or the default runtime needs one). `file` and `data_dir`
/// give the `isolated` runtime's configured sandbox limits, uids and disk quota. Makes, fills
/// and removes a small volume when a disk quota is configured.
async fn run(
    default: RuntimeKind,
    opensandbox: Option<anyhow::Result<sessionbox_opensandbox::ClientConfig>>,
    aio: Option<anyhow::Result<sessionbox_aio::AioRuntime>>,
    file: &FileConfig,
    data_dir: &Path,
) -> Report {
    let mut r = Report::default();
    let limits = file.isolated.sandbox_limits();
    let layers = sandbox::probe();
    let report = sandbox::limits_report(&limits);
    let rlimit_only = report.decision == Decision::Rlimits;
    let width = layers.iter().map(|l| l.layer.len()).max().unwrap_or(10);
    say!(r, "sandbox layers (needed by the isolated runtime):");
    let mut missing = 0;
    for l in &layers {
        // With rlimit-only limits chosen, no cgroup is made: its layers are not needed.
        let unused = rlimit_only && l.layer.starts_with("cgroup ");
        let state = match l.state {
            _ if unused => "unused",
            LayerState::Enforced => "enforced",
            LayerState::Missing => {
                missing += 1;
                "MISSING"
            }
        };
        let detail = if unused {
            "rlimit-only limits chosen ([isolated] limits = \"rlimit\"): no cgroup is made"
                .to_owned()
        } else {
            l.detail.clone()
        };
        let line = format!("  {:<width$}  {state:<8}  {detail}", l.layer);
        match state {
            "MISSING" => r.problem(line),
            _ => r.line(line),
        }
        if let Some(hint) = &l.hint
            && l.state == LayerState::Missing
            && !unused
        {
            say!(r, "  {:<width$}            fix: {hint}", "");
        }
    }
    say!(r);
    print_limits(&mut r, &report);
    // A section of its own: the delegation steps above end at a blank line (scripts/test
    // reads them up to it).
    say!(r);
    say!(
        r,
        "what one conversation may take of the host (isolated runtime):"
    );
    if report.mapping == UidMapping::PerConversation {
        print_uids(&mut r, file, data_dir);
    }
    say!(
        r,
        "  terminals    at most {} open at once per conversation (the agent's --max-terminals), \
         within {} pseudo-terminals ([isolated] ptys; its own devpts instance)",
        u64::try_from(sessionbox_execd::agent_args::DEFAULT_MAX_TERMINALS)
            .unwrap_or(u64::MAX)
            .min(limits.ptys),
        limits.ptys
    );
    let disk_ok = print_disk(&mut r, file.isolated.disk_quota());
    say!(
        r,
        "  relays       at most {} previews open per conversation through serve ([serve] \
         max_relays_per_conversation)",
        file.serve
            .max_relays_per_conversation
            .unwrap_or(sessionbox_server::DEFAULT_MAX_RELAYS_PER_CONVERSATION)
    );
    say!(r);
    let refused = report.decision == Decision::Refuse;
    let isolated_ok = missing == 0 && !refused && disk_ok;
    let isolated_line = format!(
        "isolated runtime: {}",
        if isolated_ok {
            format!(
                "can run (every layer enforced; {})",
                if rlimit_only {
                    "rlimit-only limits"
                } else {
                    "cgroup limits"
                }
            )
        } else if !disk_ok {
            "cannot run: its disk quota is invalid or cannot be made (above)".to_owned()
        } else if missing > 0 {
            format!("cannot run: {missing} layer(s) missing; see the fixes above")
        } else {
            "cannot run: its limits are cgroups and none can be made; delegate one (above) or set [isolated] limits = \"rlimit\"".to_owned()
        }
    );
    // Another runtime's installation does not need the isolated one.
    match !isolated_ok && default == RuntimeKind::Isolated {
        true => r.problem(isolated_line),
        false => r.line(isolated_line),
    }
    say!(
        r,
        "host runtime: can run (not a security boundary: directory separation only)"
    );
    let aio_ok = match aio {
        None => {
            say!(
                r,
                "aio runtime: not configured (--runtime aio --endpoint URL, AIO_SANDBOX_BASE_URL \
                 or [aio] endpoint); one shared container, trusted users only"
            );
            false
        }
        Some(Err(e)) => {
            flag!(r, "aio runtime: cannot run: {e:#}");
            false
        }
        Some(Ok(rt)) => match rt.client().bash_sessions().await {
            Ok(sessions) => {
                say!(
                    r,
                    "aio runtime: can run: {} answers ({} bash session(s)); one shared \
                     container, trusted users only",
                    rt.client().endpoint(),
                    sessions.len()
                );
                true
            }
            Err(e) => {
                flag!(r, "aio runtime: cannot run: {e}");
                false
            }
        },
    };
    let opensandbox_ok = match opensandbox {
        None => {
            say!(
                r,
                "opensandbox runtime: not configured (--endpoint, OPEN_SANDBOX_DOMAIN or \
                 [opensandbox] endpoint; scripts/opensandbox-up starts a local server)"
            );
            false
        }
        Some(Err(e)) => {
            flag!(r, "opensandbox runtime: cannot run: {e:#}");
            false
        }
        Some(Ok(config)) => probe_opensandbox(&mut r, config).await,
    };
    say!(r, "default runtime: {}", default.name());
    r.ok = match default {
        RuntimeKind::Isolated => isolated_ok,
        RuntimeKind::Host => true,
        RuntimeKind::Aio => aio_ok,
        RuntimeKind::Opensandbox => opensandbox_ok,
    };
    r
}

/// The installation's host uid range, and any other installation on this host it overlaps.
fn print_uids(r: &mut Report, file: &FileConfig, data_dir: &Path) {
    let registry = Path::new(UID_REGISTRY);
    let iso = &file.isolated;
    let (range, whose) = match iso.uid_base {
        Some(base) => (
            IsolatedConfig::uid_range(Some(base), iso.uid_count),
            "[isolated] uid_base, not claimed".to_owned(),
        ),
        None => match IsolatedConfig::recorded_uids(data_dir) {
            Some(claimed) => (
                claimed,
                format!("this installation's own, claimed in {UID_REGISTRY}"),
            ),
            None => {
                say!(
                    r,
                    "  uid range    not claimed yet: the first use claims a range no other installation on this host holds ({UID_REGISTRY})"
                );
                return;
            }
        },
    };
    say!(r, "  uid range    {}..{} ({whose})", range.start, range.end);
    for other in overlapping_claims(&range, data_dir, registry) {
        flag!(
            r,
            "  WARNING      overlaps the uids of the installation at {}: conversations of both would share per-uid kernel allowances; give each its own [isolated] uid_base",
            other.display()
        );
    }
}

/// The disk quota: the mechanism and whether it holds here (a real volume is made, written
/// past and removed). False when the settings are invalid or, as root, no volume can be made
/// (sandboxes would not start); without root the runtime runs without a quota, and says so.
fn print_disk(r: &mut Report, disk: anyhow::Result<Option<DiskQuota>>) -> bool {
    match disk {
        Err(e) => {
            flag!(r, "  disk quota   INVALID: {e:#}");
            false
        }
        Ok(None) => {
            say!(
                r,
                "  disk quota   off ([isolated] disk_bytes = 0): workspaces share the data directory's file system; only 1 GiB per file holds"
            );
            true
        }
        Ok(Some(q)) => {
            let what = format!("{} bytes, {} inodes per conversation", q.bytes, q.inodes);
            match sessionbox_local::isolated::probe_disk_quota(&std::env::temp_dir()) {
                Ok(how) => {
                    say!(r, "  disk quota   holds: {what}; {how}");
                    true
                }
                Err(why) if !rustix::process::geteuid().is_root() => {
                    flag!(
                        r,
                        "  disk quota   does NOT hold ({what} configured): {why}. The runtime runs without it; run as root for a quota"
                    );
                    true
                }
                Err(why) => {
                    flag!(
                        r,
                        "  disk quota   does NOT hold ({what} configured): {why}. Sandboxes cannot start until it does: install e2fsprogs and util-linux, make loop devices available, or set [isolated] disk_bytes = 0"
                    );
                    false
                }
            }
        }
    }
}

/// Root or not, the uid mapping, the limits that hold, and how to delegate a cgroup.
fn print_limits(r: &mut Report, lim: &sandbox::LimitsReport) {
    say!(r, "privilege and limits (isolated runtime):");
    match lim.mapping {
        UidMapping::PerConversation => {
            say!(r, "  running as   root");
            say!(
                r,
                "  uid mapping  a host uid of its own per conversation ([isolated] uid_base, uid_count), mapped to uid 1000 inside"
            );
        }
        UidMapping::Caller { uid, gid } => {
            say!(r, "  running as   uid {uid}, gid {gid} (not root)");
            say!(
                r,
                "  uid mapping  every conversation runs as this user's own uid {uid} (an unprivileged user namespace maps only the caller; as root each conversation would get a host uid of its own). Conversations stay apart by namespaces, mounts and landlock, but share this uid and its per-user allowances"
            );
        }
    }
    say!(
        r,
        "  limits       [isolated] limits = \"{}\"",
        lim.mode.name()
    );
    match &lim.cgroups {
        Ok(dirs) => say!(
            r,
            "  cgroups      can be made, in {}",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Err(e) => say!(r, "  cgroups      cannot be made: {e}"),
    }
    match lim.decision {
        Decision::Refuse => flag!(
            r,
            "  what holds   nothing: the runtime does not start (cgroups asked for, none can be made). Delegate a cgroup (below), or set [isolated] limits = \"rlimit\" for per-process limits only"
        ),
        _ => {
            say!(r, "  what holds");
            for h in &lim.holds {
                say!(r, "    {h}");
            }
            if lim.decision == Decision::Rlimits && lim.cgroups.is_ok() {
                say!(
                    r,
                    "    (a cgroup can be made here: [isolated] limits = \"cgroup\" bounds each sandbox as a whole)"
                );
            }
        }
    }
    if !lim.delegation.is_empty() {
        let ready = lim.cgroups.is_ok();
        say!(
            r,
            "  delegate a cgroup to this user{} (as root):",
            if ready {
                " (done: one is usable already; for another user, the same with its uid)"
            } else {
                ""
            }
        );
        for step in &lim.delegation {
            say!(r, "    {step}");
        }
    }
}

/// `/health` must say exactly `{"status":"healthy"}` and an authenticated list must succeed.
async fn probe_opensandbox(r: &mut Report, config: sessionbox_opensandbox::ClientConfig) -> bool {
    let client = match sessionbox_opensandbox::OpenSandboxClient::new(config) {
        Ok(c) => c,
        Err(e) => {
            flag!(r, "opensandbox runtime: cannot run: {e}");
            return false;
        }
    };
    let server = client.origin().as_str().trim_end_matches('/').to_owned();
    match client.probe().await {
        Ok(h) => {
            say!(
                r,
                "opensandbox runtime: can run: {server} is a healthy OpenSandbox server \
                 (version {}), the API key is accepted ({} sandbox(es) visible)",
                h.version.as_deref().unwrap_or("unknown"),
                h.sandboxes
            );
            true
        }
        Err(e @ sessionbox_opensandbox::OpenSandboxError::Unauthorized { .. }) => {
            flag!(
                r,
                "opensandbox runtime: cannot run: wrong or missing API key: {e}"
            );
            false
        }
        Err(e) => {
            flag!(r, "opensandbox runtime: cannot run: {e}");
            false
        }
    }
}
