//! `sessionbox doctor`: which sandbox layers this machine enforces, and what to do about a
//! missing one; whether it runs as root, how conversations' uids are mapped, which limits hold
//! and how to delegate a cgroup to a normal user, and whether the disk quota holds (by making,
//! filling and removing a small volume). Never falls back silently: the `isolated`
//! runtime either runs with every layer reported here or fails naming the missing one.

use std::path::Path;
use std::process::ExitCode;

use sessionbox_local::isolated::{DiskQuota, IsolatedConfig, UID_REGISTRY, overlapping_claims};
use sessionbox_sandbox::{self as sandbox, Decision, LayerState, UidMapping};

use crate::config::{FileConfig, RuntimeKind};

/// Prints the report; exit 0 only when `default` can run here. `opensandbox` is the
/// OpenSandbox server to probe, when one is configured (or the default runtime needs one).
/// `file` and `data_dir` give the `isolated` runtime's configured sandbox limits, uids and
/// disk quota.
pub(crate) async fn run(
    default: RuntimeKind,
    opensandbox: Option<anyhow::Result<sessionbox_opensandbox::ClientConfig>>,
    aio: Option<anyhow::Result<sessionbox_aio::AioRuntime>>,
    file: &FileConfig,
    data_dir: &Path,
) -> ExitCode {
    let limits = file.isolated.sandbox_limits();
    let layers = sandbox::probe();
    let report = sandbox::limits_report(&limits);
    let rlimit_only = report.decision == Decision::Rlimits;
    let width = layers.iter().map(|l| l.layer.len()).max().unwrap_or(10);
    outln!("sandbox layers (needed by the isolated runtime):");
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
        outln!("  {:<width$}  {state:<8}  {detail}", l.layer);
        if let Some(hint) = &l.hint
            && l.state == LayerState::Missing
            && !unused
        {
            outln!("  {:<width$}            fix: {hint}", "");
        }
    }
    outln!();
    print_limits(&report);
    // A section of its own: the delegation steps above end at a blank line (scripts/test
    // reads them up to it).
    outln!();
    outln!("what one conversation may take of the host (isolated runtime):");
    if report.mapping == UidMapping::PerConversation {
        print_uids(file, data_dir);
    }
    outln!(
        "  terminals    at most {} open at once per conversation (the agent's --max-terminals), \
         within {} pseudo-terminals ([isolated] ptys; its own devpts instance)",
        u64::try_from(sessionbox_execd::agent_args::DEFAULT_MAX_TERMINALS)
            .unwrap_or(u64::MAX)
            .min(limits.ptys),
        limits.ptys
    );
    let disk_ok = print_disk(file.isolated.disk_quota());
    outln!(
        "  relays       at most {} previews open per conversation through serve ([serve] \
         max_relays_per_conversation)",
        file.serve
            .max_relays_per_conversation
            .unwrap_or(sessionbox_server::DEFAULT_MAX_RELAYS_PER_CONVERSATION)
    );
    outln!();
    let refused = report.decision == Decision::Refuse;
    let isolated_ok = missing == 0 && !refused && disk_ok;
    outln!(
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
    outln!("host runtime: can run (not a security boundary: directory separation only)");
    let aio_ok = match aio {
        None => {
            outln!(
                "aio runtime: not configured (--runtime aio --endpoint URL, AIO_SANDBOX_BASE_URL \
                 or [aio] endpoint); one shared container, trusted users only"
            );
            false
        }
        Some(Err(e)) => {
            outln!("aio runtime: cannot run: {e:#}");
            false
        }
        Some(Ok(rt)) => match rt.client().bash_sessions().await {
            Ok(sessions) => {
                outln!(
                    "aio runtime: can run: {} answers ({} bash session(s)); one shared \
                     container, trusted users only",
                    rt.client().endpoint(),
                    sessions.len()
                );
                true
            }
            Err(e) => {
                outln!("aio runtime: cannot run: {e}");
                false
            }
        },
    };
    let opensandbox_ok = match opensandbox {
        None => {
            outln!(
                "opensandbox runtime: not configured (--endpoint, OPEN_SANDBOX_DOMAIN or \
                 [opensandbox] endpoint; scripts/opensandbox-up starts a local server)"
            );
            false
        }
        Some(Err(e)) => {
            outln!("opensandbox runtime: cannot run: {e:#}");
            false
        }
        Some(Ok(config)) => probe_opensandbox(config).await,
    };
    outln!("default runtime: {}", default.name());
    let ok = match default {
        RuntimeKind::Isolated => isolated_ok,
        RuntimeKind::Host => true,
        RuntimeKind::Aio => aio_ok,
        RuntimeKind::Opensandbox => opensandbox_ok,
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The installation's host uid range, and any other installation on this host it overlaps.
fn print_uids(file: &FileConfig, data_dir: &Path) {
    let registry = Path::new(UID_REGISTRY);
    let iso = &file.isolated;
    let (range, whose) = match iso.uid_base {
        Some(base) => (
            IsolatedConfig::uid_range(Some(base), iso.uid_count),
            "[isolated] uid_base, not claimed".to_owned(),
        ),
        None => match IsolatedConfig::recorded_uids(data_dir) {
            Some(r) => (
                r,
                format!("this installation's own, claimed in {UID_REGISTRY}"),
            ),
            None => {
                outln!(
                    "  uid range    not claimed yet: the first use claims a range no other installation on this host holds ({UID_REGISTRY})"
                );
                return;
            }
        },
    };
    outln!("  uid range    {}..{} ({whose})", range.start, range.end);
    for other in overlapping_claims(&range, data_dir, registry) {
        outln!(
            "  WARNING      overlaps the uids of the installation at {}: conversations of both would share per-uid kernel allowances; give each its own [isolated] uid_base",
            other.display()
        );
    }
}

/// The disk quota: the mechanism and whether it holds here (a real volume is made, written
/// past and removed). False when the settings are invalid or, as root, no volume can be made
/// (sandboxes would not start); without root the runtime runs without a quota, and says so.
fn print_disk(disk: anyhow::Result<Option<DiskQuota>>) -> bool {
    match disk {
        Err(e) => {
            outln!("  disk quota   INVALID: {e:#}");
            false
        }
        Ok(None) => {
            outln!(
                "  disk quota   off ([isolated] disk_bytes = 0): workspaces share the data directory's file system; only 1 GiB per file holds"
            );
            true
        }
        Ok(Some(q)) => {
            let what = format!("{} bytes, {} inodes per conversation", q.bytes, q.inodes);
            match sessionbox_local::isolated::probe_disk_quota(&std::env::temp_dir()) {
                Ok(how) => {
                    outln!("  disk quota   holds: {what}; {how}");
                    true
                }
                Err(why) if !rustix::process::geteuid().is_root() => {
                    outln!(
                        "  disk quota   does NOT hold ({what} configured): {why}. The runtime runs without it; run as root for a quota"
                    );
                    true
                }
                Err(why) => {
                    outln!(
                        "  disk quota   does NOT hold ({what} configured): {why}. Sandboxes cannot start until it does: install e2fsprogs and util-linux, make loop devices available, or set [isolated] disk_bytes = 0"
                    );
                    false
                }
            }
        }
    }
}

/// Root or not, the uid mapping, the limits that hold, and how to delegate a cgroup.
fn print_limits(r: &sandbox::LimitsReport) {
    outln!("privilege and limits (isolated runtime):");
    match r.mapping {
        UidMapping::PerConversation => {
            outln!("  running as   root");
            outln!(
                "  uid mapping  a host uid of its own per conversation ([isolated] uid_base, uid_count), mapped to uid 1000 inside"
            );
        }
        UidMapping::Caller { uid, gid } => {
            outln!("  running as   uid {uid}, gid {gid} (not root)");
            outln!(
                "  uid mapping  every conversation runs as this user's own uid {uid} (an unprivileged user namespace maps only the caller; as root each conversation would get a host uid of its own). Conversations stay apart by namespaces, mounts and landlock, but share this uid and its per-user allowances"
            );
        }
    }
    outln!("  limits       [isolated] limits = \"{}\"", r.mode.name());
    match &r.cgroups {
        Ok(dirs) => outln!(
            "  cgroups      can be made, in {}",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Err(e) => outln!("  cgroups      cannot be made: {e}"),
    }
    match r.decision {
        Decision::Refuse => outln!(
            "  what holds   nothing: the runtime does not start (cgroups asked for, none can be made). Delegate a cgroup (below), or set [isolated] limits = \"rlimit\" for per-process limits only"
        ),
        _ => {
            outln!("  what holds");
            for h in &r.holds {
                outln!("    {h}");
            }
            if r.decision == Decision::Rlimits && r.cgroups.is_ok() {
                outln!(
                    "    (a cgroup can be made here: [isolated] limits = \"cgroup\" bounds each sandbox as a whole)"
                );
            }
        }
    }
    if !r.delegation.is_empty() {
        let ready = r.cgroups.is_ok();
        outln!(
            "  delegate a cgroup to this user{} (as root):",
            if ready {
                " (done: one is usable already; for another user, the same with its uid)"
            } else {
                ""
            }
        );
        for step in &r.delegation {
            outln!("    {step}");
        }
    }
}

/// `/health` must say exactly `{"status":"healthy"}` and an authenticated list must succeed.
async fn probe_opensandbox(config: sessionbox_opensandbox::ClientConfig) -> bool {
    let client = match sessionbox_opensandbox::OpenSandboxClient::new(config) {
        Ok(c) => c,
        Err(e) => {
            outln!("opensandbox runtime: cannot run: {e}");
            return false;
        }
    };
    let server = client.origin().as_str().trim_end_matches('/').to_owned();
    match client.probe().await {
        Ok(h) => {
            outln!(
                "opensandbox runtime: can run: {server} is a healthy OpenSandbox server \
                 (version {}), the API key is accepted ({} sandbox(es) visible)",
                h.version.as_deref().unwrap_or("unknown"),
                h.sandboxes
            );
            true
        }
        Err(e @ sessionbox_opensandbox::OpenSandboxError::Unauthorized { .. }) => {
            outln!("opensandbox runtime: cannot run: wrong or missing API key: {e}");
            false
        }
        Err(e) => {
            outln!("opensandbox runtime: cannot run: {e}");
            false
        }
    }
}
