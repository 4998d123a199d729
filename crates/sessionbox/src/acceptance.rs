//! `sessionbox verify --acceptance`: the acceptance checklist, on whichever runtime is
//! configured. It opens conversations of its own (fresh random ids) through the manager, runs
//! the shell probes of [`probes`] in them through the ordinary Session API, and computes each
//! row's verdict here from what the probes printed, never from what the runtime says of itself.
//!
//! A row passes when its probe shows the control holding; when it does not, it fails if the
//! runtime claims that control ([`Claims`], from the runtime kind and `sessionbox.toml`), and
//! is "not enforced by this runtime" otherwise. Probes that load the machine (the fork, memory,
//! CPU and disk probes) run only where the runtime claims the limit, bounded by the configured
//! value plus a margin. The TTL row runs a garbage collection only when nothing but its own
//! conversation is garbage, and says "not measured" otherwise. Every conversation it opened is
//! destroyed at the end.

mod limits;
mod probes;
mod report;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::json;
use sessionbox::config::{FileConfig, RuntimeKind};
use sessionbox::experiment::{environment, run_id};
use sessionbox_core::{ConversationId, ConversationRef, ExecRequest, ExecResult, Session};
use sessionbox_manager::GcOptions;
use sessionbox_store::{Lifecycle, LifecyclePolicy};

use crate::App;
use crate::app::Settings;
use crate::verify::VerifyArgs;
use probes::Verdict;

/// The variable the check runs with (a random value, see [`with_planted_secret`]) and then
/// looks for in the sandbox: a stand-in for a caller's secret.
pub(crate) const SECRET_ENV: &str = "SESSIONBOX_ACCEPTANCE_SECRET";

/// The caller's credentials whose names the secrets row also looks for (values are compared in
/// memory and never printed).
const CREDENTIAL_ENVS: [&str; 4] = [
    SECRET_ENV,
    "SESSIONBOX_API_KEY",
    sessionbox::runtime::API_KEY_ENV,
    "AIO_SANDBOX_TOKEN",
];

/// When [`SECRET_ENV`] is not set: runs this command again as a child with it set to a
/// fresh random value, and returns the child's exit status (the caller exits with it). The
/// value is then in the child's initial environment, where `/proc/PID/environ` shows it, as a
/// caller's real secret would be. `None` when it is set already (this is the child, or the
/// caller chose the value): go on.
pub(crate) fn with_planted_secret() -> Option<ExitCode> {
    if std::env::var_os(SECRET_ENV).is_some() {
        return None;
    }
    let value = format!("canary-{}{}", run_id(), run_id());
    let status = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env(SECRET_ENV, value)
            .status()
    });
    Some(match status {
        Ok(s) => ExitCode::from(s.code().map_or(1, |c| c.clamp(0, 255) as u8)),
        Err(e) => {
            error!("cannot start the acceptance check with its planted secret: {e}");
            ExitCode::FAILURE
        }
    })
}

/// What the runtime of a kind, with these settings, claims to enforce, and the limits it
/// is configured with (`None`: no such limit is configured or claimed).
#[derive(Debug, Clone, Default, Serialize)]
struct Claims {
    /// Commands run as a non-root user without capabilities, with `no_new_privs`, under
    /// seccomp, on a read-only root.
    confinement: bool,
    /// Most processes.
    pids: Option<u64>,
    /// Memory in bytes.
    memory_bytes: Option<u64>,
    /// CPUs.
    cpu: Option<f64>,
    /// Workspace bytes.
    disk_bytes: Option<u64>,
    /// No network but through the runtime's egress path.
    no_direct_network: bool,
    /// A conversation cannot reach another's files.
    separate_conversations: bool,
    /// The caller's environment does not reach commands.
    hidden_secrets: bool,
}

impl Claims {
    fn of(kind: RuntimeKind, file: &FileConfig) -> anyhow::Result<Claims> {
        Ok(match kind {
            RuntimeKind::Isolated => {
                let l = file.isolated.sandbox_limits();
                let cgroup = l.mode == sessionbox_sandbox::LimitMode::Cgroup;
                Claims {
                    confinement: true,
                    pids: Some(l.pids),
                    memory_bytes: cgroup.then_some(l.memory_bytes),
                    cpu: cgroup.then_some(l.cpu),
                    disk_bytes: file.isolated.disk_quota()?.map(|q| q.bytes),
                    no_direct_network: true,
                    separate_conversations: true,
                    hidden_secrets: true,
                }
            }
            RuntimeKind::Opensandbox => {
                let s = &file.opensandbox;
                // What the runtime sends when the file says nothing: its own defaults.
                let defaults = sessionbox_opensandbox::OpenSandboxConfig::new(
                    sessionbox_opensandbox::ClientConfig::new("http://127.0.0.1", None),
                    "defaults",
                )
                .resource_limits;
                let q = |v: &Option<String>, name: &str| {
                    v.as_deref()
                        .or(defaults.get(name).map(String::as_str))
                        .and_then(probes::parse_quantity)
                };
                Claims {
                    confinement: true,
                    pids: s.server_pids_limit,
                    memory_bytes: q(&s.memory, "memory").map(|b| b as u64),
                    cpu: q(&s.cpu, "cpu"),
                    disk_bytes: s.disk_bytes.filter(|b| *b > 0),
                    // The gateway alone is a proxy commands may ignore: only the sidecar's
                    // firewall (network_policy) stops a direct connection.
                    no_direct_network: s.network_policy == Some(true),
                    separate_conversations: true,
                    hidden_secrets: true,
                }
            }
            // Commands run as the caller (host) or in one shared container (aio): nothing is
            // claimed; a row still passes where a probe sees the control hold.
            RuntimeKind::Host | RuntimeKind::Aio => Claims::default(),
        })
    }
}

/// One line of the checklist.
#[derive(Debug, Clone, Serialize)]
struct Row {
    /// A stable name (`user`, `capabilities`, ... `ttl_reclaim`).
    name: &'static str,
    /// What it checks, for the table.
    control: &'static str,
    verdict: Verdict,
    /// Whether the runtime claims the control.
    claimed: bool,
    /// What was measured, in words.
    detail: String,
}

/// The conversations the check opens, for cleanup.
struct Opened<'a> {
    app: &'a App,
    created: Vec<ConversationRef>,
    run_id: String,
}

impl Opened<'_> {
    fn conv(&self, tag: &str) -> anyhow::Result<ConversationRef> {
        let id = ConversationId::new(format!("acceptance-{}-{tag}", self.run_id))?;
        Ok(ConversationRef::new(self.app.tenant.clone(), id))
    }

    async fn open(&mut self, tag: &str) -> anyhow::Result<(ConversationRef, Box<dyn Session>)> {
        let c = self.conv(tag)?;
        self.created.push(c.clone());
        let s = self.app.manager.open(&c).await?;
        anyhow::ensure!(
            s.created(),
            "conversation {} existed before this run; refusing to use it",
            c.id
        );
        Ok((c, Box::new(s)))
    }
}

/// Runs `command` in `s` with `timeout` and at most `limit` bytes of each output.
async fn sh(
    s: &dyn Session,
    command: &str,
    timeout: u64,
    limit: usize,
) -> anyhow::Result<ExecResult> {
    let req = ExecRequest::new(command)
        .timeout(Duration::from_secs(timeout))
        .output_limit(limit);
    Ok(s.exec(req).await?)
}

/// A status field as read, or `unreadable`.
fn shown(v: Option<u32>) -> String {
    v.map_or("unreadable".to_owned(), |v| v.to_string())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// True when `s` still runs a command (tried for up to five seconds: processes a probe left
/// may hold the limit for a moment).
async fn answers(s: &dyn Session) -> bool {
    for _ in 0..5 {
        if let Ok(r) = sh(s, "echo alive", 10, 64).await
            && text(&r.stdout).trim() == "alive"
        {
            return true;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    false
}

/// `sessionbox verify --acceptance`: the checklist on the configured runtime; exit 0 when
/// no row fails, 1 when one does.
pub(crate) async fn run(
    app: &App,
    settings: &Settings,
    args: VerifyArgs,
) -> anyhow::Result<ExitCode> {
    let claims = Claims::of(settings.kind, &settings.file)?;
    let started = chrono::Utc::now();
    let t0 = Instant::now();
    let mut opened = Opened {
        app,
        created: Vec::new(),
        run_id: run_id(),
    };
    let mut rows = Vec::new();
    let body = probe_all(&mut opened, &claims, &mut rows).await;
    if let Err(e) = &body {
        rows.push(Row {
            name: "run",
            control: "the check itself ran to the end",
            verdict: Verdict::Fail,
            claimed: true,
            detail: format!("{e:#}"),
        });
    }
    let mut cleanup = Vec::new();
    for c in &opened.created {
        if let Err(e) = app.manager.destroy(c).await {
            cleanup.push(format!("destroy {}: {e}", c.id));
        }
    }
    if !cleanup.is_empty() {
        rows.push(Row {
            name: "cleanup",
            control: "every conversation the check opened is destroyed",
            verdict: Verdict::Fail,
            claimed: true,
            detail: cleanup.join("; "),
        });
    }
    let ok = rows.iter().all(|r| r.verdict != Verdict::Fail);
    let info = app.manager.runtime().info();
    let report = json!({
        "ok": ok,
        "runtime": info.name,
        "runtime_info": info,
        "claims": claims,
        "rows": rows,
        "conclusions": report::conclusions(&rows),
        "tenant": app.tenant.as_str(),
        "run_id": opened.run_id,
        "started": started.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "duration_ms": t0.elapsed().as_millis() as u64,
        "environment": environment(),
    });
    if let Some(p) = &args.report_json {
        std::fs::write(p, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    let md = report::markdown(&report, &rows);
    if let Some(p) = &args.report_md {
        std::fs::write(p, &md).with_context(|| format!("cannot write {}", p.display()))?;
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!("{md}");
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Every probe, in an order where the ones that may kill processes (fork, memory) come last.
async fn probe_all(
    opened: &mut Opened<'_>,
    claims: &Claims,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let (_, a) = opened.open("a").await?;
    let a = a.as_ref();
    let c = claims.confinement;
    identity(a, c, rows).await?;
    root_fs(a, c, &opened.run_id, rows).await?;
    rows.push(secrets(a, claims.hidden_secrets).await?);
    rows.push(timeout(a).await?);
    rows.push(network(a, claims.no_direct_network).await?);
    rows.push(other_conversation(opened, a, claims.separate_conversations).await?);
    rows.push(limits::cpu(a, claims.cpu).await?);
    rows.push(limits::disk(a, claims.disk_bytes, &opened.run_id).await?);
    rows.push(limits::pids(a, claims.pids).await?);
    rows.push(limits::memory(a, claims.memory_bytes).await?);
    rows.push(ttl(opened).await?);
    Ok(())
}

async fn identity(s: &dyn Session, claimed: bool, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let r = sh(s, probes::IDENTITY, 10, 64 << 10).await?;
    let id = probes::parse_identity(&text(&r.stdout));
    let row = |name, control, holds: bool, detail: String| Row {
        name,
        control,
        verdict: Verdict::of(holds, claimed),
        claimed,
        detail,
    };
    let non_root = !id.uids.is_empty() && id.uids.iter().all(|&u| u != 0);
    rows.push(row(
        "user",
        "commands run as a user other than root",
        non_root,
        format!("uids {:?}", id.uids),
    ));
    let hex = |v: Option<u64>| v.map_or("unreadable".to_owned(), |v| format!("{v:#018x}"));
    let (eff, bnd) = (id.cap_eff == Some(0), id.cap_bnd == Some(0));
    let caps_detail = format!(
        "CapEff {}, CapBnd {}{}",
        hex(id.cap_eff),
        hex(id.cap_bnd),
        match (eff, bnd) {
            (true, true) => "; no capability, none can be gained",
            (true, false) => "; none effective, but the bounding set is not empty",
            _ => "",
        }
    );
    rows.push(row(
        "capabilities",
        "no effective capability (the bounding set is reported too)",
        eff,
        caps_detail,
    ));
    rows.push(row(
        "no_new_privs",
        "no_new_privs is set (setuid binaries gain nothing)",
        id.no_new_privs == Some(1),
        format!("NoNewPrivs {}", shown(id.no_new_privs)),
    ));
    rows.push(row(
        "seccomp",
        "a seccomp filter is in force",
        id.seccomp == Some(2),
        format!("Seccomp {} (2 is a filter)", shown(id.seccomp)),
    ));
    Ok(())
}

async fn root_fs(
    s: &dyn Session,
    claimed: bool,
    run_id: &str,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let r = sh(s, &probes::root_fs_script(run_id), 10, 64 << 10).await?;
    let (writable, readonly) = probes::parse_root_fs(&text(&r.stdout));
    let system_ro = ["/", "/etc", "/usr"]
        .iter()
        .all(|d| readonly.iter().any(|r| r == d));
    let scratch_rw = writable.len() == 2
        && writable
            .iter()
            .all(|d| d != "/" && d != "/etc" && d != "/usr");
    rows.push(Row {
        name: "root_fs",
        control: "/, /etc, /usr read-only; the workspace and /tmp writable",
        verdict: Verdict::of(system_ro && scratch_rw, claimed),
        claimed,
        detail: format!("writable {writable:?}, read-only {readonly:?}"),
    });
    Ok(())
}

const SECRETS_CONTROL: &str = "the caller's secrets are not visible (environment, /proc/*/environ)";

async fn secrets(s: &dyn Session, claimed: bool) -> anyhow::Result<Row> {
    let present: Vec<(&str, String)> = CREDENTIAL_ENVS
        .iter()
        .filter_map(|n| Some((*n, std::env::var(n).ok().filter(|v| v.len() >= 8)?)))
        .collect();
    let names: Vec<&str> = present.iter().map(|(n, _)| *n).collect();
    let r = sh(s, &probes::secrets_script(&names), 20, 1 << 20).await?;
    let out = text(&r.stdout);
    let Some((env, environ)) = out.split_once("--environ--") else {
        return Ok(Row {
            name: "caller_secrets",
            control: SECRETS_CONTROL,
            verdict: Verdict::NotMeasured,
            claimed,
            detail: format!(
                "the probe did not run to the end (exit {})",
                r.shell_exit_code()
            ),
        });
    };
    let mut seen: Vec<String> = Vec::new();
    for (n, v) in &present {
        if env.contains(v.as_str()) || env.lines().any(|l| l.starts_with(&format!("{n}="))) {
            seen.push(format!("{n} in the command's environment"));
        }
    }
    let files: Vec<&str> = environ
        .lines()
        .filter(|l| l.starts_with("/proc/"))
        .collect();
    if !files.is_empty() {
        seen.push(format!(
            "a caller's variable in {} visible process environment(s) ({})",
            files.len(),
            files.iter().take(3).copied().collect::<Vec<_>>().join(", ")
        ));
    }
    let holds = seen.is_empty() && !present.is_empty();
    Ok(Row {
        name: "caller_secrets",
        control: SECRETS_CONTROL,
        verdict: Verdict::of(holds, claimed),
        claimed,
        detail: if seen.is_empty() {
            format!(
                "looked for {} (values never printed): none visible",
                names.join(", ")
            )
        } else {
            seen.join("; ")
        },
    })
}

async fn timeout(s: &dyn Session) -> anyhow::Result<Row> {
    let t = Instant::now();
    let r = s
        .exec(ExecRequest::new("sleep 30").timeout(Duration::from_secs(1)))
        .await;
    let wall = t.elapsed().as_secs_f64();
    let (holds, detail) = match r {
        Ok(r) => (
            r.timed_out && wall < 10.0,
            format!(
                "`sleep 30` with a 1 s timeout: timed out {}, ended after {wall:.1} s",
                r.timed_out
            ),
        ),
        Err(e) => (false, format!("`sleep 30` with a 1 s timeout: {e}")),
    };
    let holds = holds && answers(s).await;
    Ok(Row {
        name: "timeout",
        control: "a command past its timeout is killed",
        verdict: Verdict::of(holds, true),
        claimed: true,
        detail,
    })
}

async fn network(s: &dyn Session, claimed: bool) -> anyhow::Result<Row> {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await?;
    let port = listener.local_addr()?.port();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let accept = tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(conn);
        }
    });
    let route = sh(s, "cat /proc/net/route 2>/dev/null", 10, 64 << 10).await?;
    let mut hosts = vec!["127.0.0.1".to_owned()];
    if let Some(g) = probes::parse_gateway(&text(&route.stdout)) {
        hosts.push(g.to_string());
    }
    // The host's own address on its default route (a UDP "connect" sends nothing).
    if let Ok(u) = std::net::UdpSocket::bind("0.0.0.0:0")
        && u.connect("192.0.2.1:9").is_ok()
        && let Ok(a) = u.local_addr()
    {
        hosts.push(a.ip().to_string());
    }
    hosts.sort();
    hosts.dedup();
    let r = sh(s, &probes::network_script(&hosts, port), 60, 64 << 10).await;
    accept.abort();
    let r = r?;
    let tools = probes::parse_tools(&text(&r.stdout));
    let got = seen.load(Ordering::SeqCst);
    let detail = format!(
        "a listener on the host at port {port}; tried {} with {}: {got} connection(s) reached it",
        hosts.join(", "),
        if tools.is_empty() {
            "no client".to_owned()
        } else {
            tools.join(", ")
        }
    );
    let verdict = if tools.is_empty() && got == 0 {
        Verdict::NotMeasured
    } else {
        Verdict::of(got == 0, claimed)
    };
    Ok(Row {
        name: "network_direct",
        control: "no direct connection to a host listener (proxy variables unset)",
        verdict,
        claimed,
        detail,
    })
}

async fn other_conversation(
    opened: &mut Opened<'_>,
    a: &dyn Session,
    claimed: bool,
) -> anyhow::Result<Row> {
    let name = format!("acceptance-marker-{}", opened.run_id);
    let token = format!("only-in-a-{}", run_id());
    a.write(&name, token.as_bytes()).await?;
    let own = text(&a.read(&name).await?);
    let location = opened.app.manager.runtime().workspace_location(a.key());
    let (_, b) = opened.open("b").await?;
    let r = sh(
        b.as_ref(),
        &probes::other_conversation_script(&location, &name),
        20,
        1 << 20,
    )
    .await?;
    let leaked = text(&r.stdout).contains(&token);
    let ran = text(&r.stdout).contains("probe-ran");
    b.close().await?;
    Ok(Row {
        name: "other_conversation",
        control: "another conversation's files are not reachable from a command",
        verdict: if own != token || !(ran || leaked) {
            Verdict::NotMeasured
        } else {
            Verdict::of(!leaked, claimed)
        },
        claimed,
        detail: format!(
            "A wrote a marker; B looked at A's host location {location}, ../*, /proc/*/root, /proc/*/cwd: {}",
            if leaked { "B read it" } else { "not found" }
        ),
    })
}

/// A conversation with a one-second time to live is reclaimed by one garbage collection;
/// measured only when nothing else is garbage (the check never removes what it did not make).
async fn ttl(opened: &mut Opened<'_>) -> anyhow::Result<Row> {
    const CONTROL: &str = "a conversation past its time to live is reclaimed by gc";
    let app = opened.app;
    let c = opened.conv("ttl")?;
    let mut policy: LifecyclePolicy = app.manager.lifecycle().clone();
    let mut short: Lifecycle = policy.for_tenant(&app.tenant);
    short.ttl = Some(Duration::from_secs(1));
    policy.tenants.insert(app.tenant.clone(), short);
    let manager = app.manager.clone().with_lifecycle(policy);
    opened.created.push(c.clone());
    let s = manager.open(&c).await?;
    anyhow::ensure!(s.created(), "conversation {} existed before this run", c.id);
    let s: Box<dyn Session> = Box::new(s);
    sh(s.as_ref(), "echo x > ttl-marker", 10, 64).await?;
    s.close().await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let row = |verdict, detail| Row {
        name: "ttl_reclaim",
        control: CONTROL,
        verdict,
        claimed: true,
        detail,
    };
    let options = GcOptions::default();
    let dry = app
        .manager
        .collect_garbage(GcOptions {
            dry_run: true,
            ..options
        })
        .await?;
    let key = c.key.as_str();
    let others: usize = [
        &dry.expired,
        &dry.stuck,
        &dry.orphans,
        &dry.dangling,
        &dry.idle_stopped,
    ]
    .iter()
    .flat_map(|v| v.iter())
    .filter(|i| i.key != key)
    .count();
    if others > 0 {
        return Ok(row(
            Verdict::NotMeasured,
            format!(
                "not measured in this run: {others} other item(s) are garbage now, and this check removes only what it made (run `sessionbox gc`, then again)"
            ),
        ));
    }
    let t = Instant::now();
    let report = app.manager.collect_garbage(options).await?;
    let reclaimed = report.expired.iter().any(|i| i.key == key && i.removed);
    let k = c.key.clone();
    let record = app.manager.store().run(move |s| s.get(&k)).await?;
    let listed = app
        .manager
        .runtime()
        .list()
        .await?
        .iter()
        .any(|r| r.key == c.key);
    let holds = reclaimed && record.is_none() && !listed;
    Ok(row(
        Verdict::of(holds, true),
        format!(
            "time to live 1 s, collected 1.5 s later in {} ms: record {}, runtime state {}",
            t.elapsed().as_millis(),
            if record.is_none() {
                "gone"
            } else {
                "still there"
            },
            if listed { "still there" } else { "gone" }
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(kind: RuntimeKind, toml_text: &str) -> Claims {
        let file: FileConfig = toml::from_str(toml_text).expect("valid settings");
        Claims::of(kind, &file).expect("claims")
    }

    #[test]
    fn claims_follow_the_runtime_and_its_settings() {
        let iso = claims(RuntimeKind::Isolated, "[isolated]\npids = 48\ncpu = 0.5\n");
        assert!(iso.confinement && iso.no_direct_network && iso.hidden_secrets);
        assert_eq!(iso.pids, Some(48));
        assert_eq!(iso.cpu, Some(0.5));
        assert_eq!(iso.disk_bytes, Some(1 << 30));
        // No disk quota, and rlimits only: those limits are not claimed; PIDs still are.
        let bare = claims(
            RuntimeKind::Isolated,
            "[isolated]\ndisk_bytes = 0\nlimits = \"rlimit\"\n",
        );
        assert_eq!(
            (bare.disk_bytes, bare.memory_bytes, bare.cpu),
            (None, None, None)
        );
        assert_eq!(bare.pids, Some(512));
        // OpenSandbox: the runtime's own resource defaults unless the file sets them.
        let osb = claims(RuntimeKind::Opensandbox, "");
        assert_eq!(osb.memory_bytes, Some(2 << 30));
        assert_eq!(osb.cpu, Some(1.0));
        assert!(!osb.no_direct_network);
        assert_eq!(osb.pids, None);
        let osb = claims(
            RuntimeKind::Opensandbox,
            "[opensandbox]\negress_gateway = \"172.17.0.1:3128\"\n",
        );
        assert!(
            !osb.no_direct_network,
            "a proxy alone does not stop a direct connection"
        );
        let osb = claims(
            RuntimeKind::Opensandbox,
            "[opensandbox]\nmemory = \"512Mi\"\ncpu = \"500m\"\nnetwork_policy = true\n\
             server_pids_limit = 512\n",
        );
        assert_eq!(osb.memory_bytes, Some(512 << 20));
        assert_eq!(osb.cpu, Some(0.5));
        assert_eq!(osb.pids, Some(512));
        assert!(osb.no_direct_network);
        assert_eq!(osb.disk_bytes, None);
        let osb = claims(
            RuntimeKind::Opensandbox,
            "[opensandbox]\ndisk_bytes = 33554432\n",
        );
        assert_eq!(osb.disk_bytes, Some(32 << 20));
        for kind in [RuntimeKind::Host, RuntimeKind::Aio] {
            let c = claims(kind, "");
            assert!(!c.confinement && !c.hidden_secrets && !c.separate_conversations);
            assert_eq!((c.pids, c.memory_bytes, c.disk_bytes), (None, None, None));
        }
    }

    #[test]
    fn the_closing_section_names_the_rows_that_failed_or_are_not_enforced() {
        let row = |name, verdict| Row {
            name,
            control: "",
            verdict,
            claimed: verdict == Verdict::Fail,
            detail: String::new(),
        };
        let all_pass = report::conclusions(&[row("user", Verdict::Pass)]);
        assert_eq!(
            all_pass["lets_you_conclude"].as_array().map(Vec::len),
            Some(2)
        );
        let mixed = report::conclusions(&[
            row("user", Verdict::Fail),
            row("pids", Verdict::NotEnforced),
            row("ttl_reclaim", Verdict::NotMeasured),
        ]);
        let not: Vec<&str> = mixed["does_not"]
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert!(not.iter().any(|l| l.contains("does not enforce: pids")));
        assert!(not.iter().any(|l| l.contains("did not show: user")));
        assert!(
            not.iter()
                .any(|l| l.contains("Not measured in this run: ttl_reclaim"))
        );
        assert!(not.iter().any(|l| l.contains("kernel bug")));
        assert_eq!(mixed["lets_you_conclude"].as_array().map(Vec::len), Some(1));
    }
}
