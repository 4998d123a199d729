//! `sessionbox verify`: the isolation experiment, on whichever runtime is configured.
//!
//! 1. Resume: conversation A writes `marker.txt` = `alpha`, closes, reopens with the same id, and
//!    reads `alpha` back (through the file API and through a shell command).
//! 2. Isolation: B writes `beta` to the same name; A still reads `alpha`, B `beta`. A's attempts
//!    to reach B's file by a relative traversal and by B's absolute location are refused before
//!    anything runs, and nothing is written anywhere by them.
//! 3. Concurrency: N conversations x M rounds, each round released together by a barrier; each
//!    conversation runs a shell command that writes its own value to `marker.txt`, then reads it
//!    back through the file API. At the end every conversation is read once more.
//! 4. Cleanup: every conversation it created is destroyed; the runtime's inventory (workspaces,
//!    processes) and the store's records are compared with those taken before it started.
//!
//! It only ever uses conversations it created itself (fresh random ids, checked to be new).

use sessionbox::experiment::{Inventory, environment};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use serde_json::json;
use sessionbox_core::{ConversationId, ConversationRef, ExecRequest, Session, TenantId};
use tokio::sync::Barrier;

use crate::App;

/// Options of `sessionbox verify`.
#[derive(Debug, clap::Args)]
pub(crate) struct VerifyArgs {
    /// Conversations run at once (at least 2).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=4096))]
    conversations: u32,
    /// Rounds each conversation runs (at least 1).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=10000))]
    rounds: u32,
    /// Write the experiment record as JSON here.
    #[arg(long, value_name = "PATH")]
    pub report_json: Option<PathBuf>,
    /// Write the experiment record as Markdown here.
    #[arg(long, value_name = "PATH")]
    pub report_md: Option<PathBuf>,
    /// Run the acceptance checklist instead: probes inside real conversations (user,
    /// capabilities, seccomp, no_new_privs, read-only root, the PIDs, memory, CPU, disk and
    /// timeout limits, direct network, another conversation's files, the caller's secrets, TTL
    /// reclaim), each row pass, fail or not enforced by this runtime. Exit 1 when a row fails.
    #[arg(long, conflicts_with = "via")]
    pub acceptance: bool,
    /// With --acceptance: print the record as JSON instead of the Markdown table.
    #[arg(long, requires = "acceptance")]
    pub json: bool,
    /// Run the experiment through a sessionbox server's HTTP API at this URL
    /// (`http://127.0.0.1:7070`) instead of the runtime in this process. The API key, if the
    /// server needs one, comes from SESSIONBOX_API_KEY (never the command line). Repeat it to
    /// name several replicas sharing one store: requests go to each in turn, so every
    /// conversation is served by all of them.
    #[arg(long, value_name = "URL")]
    pub via: Vec<String>,
    /// With --via https://...: also trust the CA certificates in this PEM file (a server whose
    /// certificate a private CA signed).
    #[arg(
        long,
        env = "SESSIONBOX_CA_FILE",
        value_name = "PATH",
        requires = "via"
    )]
    pub ca_file: Option<PathBuf>,
}

/// Where the experiment runs: the configured runtime in this process, or a server over HTTP.
pub(crate) enum Target<'a> {
    /// The runtime and store of this process.
    Local(&'a App),
    /// A `sessionbox serve` at `base`.
    Http {
        /// The client, holding the key.
        client: sessionbox_client::Client,
        /// The server URL, for the record.
        base: String,
    },
}

/// An open conversation of either target.
struct Opened {
    session: Box<dyn Session>,
    created: bool,
}

impl Target<'_> {
    async fn open(&self, conv: &ConversationRef) -> anyhow::Result<Opened> {
        Ok(match self {
            Target::Local(app) => {
                let c = app.manager.open(conv).await?;
                let created = c.created();
                Opened {
                    session: Box::new(c),
                    created,
                }
            }
            Target::Http { client, .. } => {
                let c = client.open(&conv.id).await?;
                let created = c.created();
                Opened {
                    session: Box::new(c),
                    created,
                }
            }
        })
    }

    async fn destroy(&self, conv: &ConversationRef) -> anyhow::Result<()> {
        match self {
            Target::Local(app) => {
                app.manager.destroy(conv).await?;
            }
            Target::Http { client, .. } => client.destroy(&conv.id).await?,
        }
        Ok(())
    }

    /// The inventory: the runtime's and the store's locally; the tenant's records (by id)
    /// through a server, which shows nothing else.
    async fn inventory(&self) -> anyhow::Result<Inventory> {
        match self {
            Target::Local(app) => Inventory::take(&app.manager).await,
            Target::Http { client, .. } => Ok(Inventory::of_records(
                client.list().await?.into_iter().map(|c| c.id),
            )),
        }
    }

    /// How the inventory names `conv`.
    fn name_of<'c>(&self, conv: &'c ConversationRef) -> &'c str {
        match self {
            Target::Local(_) => conv.key.as_str(),
            Target::Http { .. } => conv.id.as_str(),
        }
    }

    /// Absolute paths at which `a` might reach `b`'s workspace: `b`'s location as the runtime
    /// knows it locally; through a server, `b`'s presented root when it differs from `a`'s,
    /// and `a`'s root joined with `..` and `b`'s key.
    fn locations_of(&self, a: &dyn Session, b: &dyn Session) -> Vec<String> {
        match self {
            Target::Local(app) => vec![app.manager.runtime().workspace_location(b.key())],
            Target::Http { .. } => {
                let mut v = vec![format!("{}/../{}", a.workspace_root(), b.key())];
                if b.workspace_root() != a.workspace_root() {
                    v.push(b.workspace_root().to_owned());
                }
                v
            }
        }
    }

    fn tenant(&self) -> String {
        match self {
            Target::Local(app) => app.tenant.as_str().to_owned(),
            Target::Http { .. } => "set by the API key".to_owned(),
        }
    }

    async fn snapshot(&self, conv: &ConversationRef, name: &str) -> anyhow::Result<()> {
        match self {
            Target::Local(app) => drop(app.manager.snapshot(conv, name, None).await?),
            Target::Http { client, .. } => drop(client.snapshot(&conv.id, name).await?),
        }
        Ok(())
    }

    async fn fork_snapshot(&self, name: &str, to: &ConversationRef) -> anyhow::Result<()> {
        match self {
            Target::Local(app) => drop(
                app.manager
                    .fork(&sessionbox_manager::ForkFrom::Snapshot(name.to_owned()), to)
                    .await?,
            ),
            Target::Http { client, .. } => drop(client.fork_snapshot(name, &to.id).await?),
        }
        Ok(())
    }

    async fn fork_live(&self, from: &ConversationRef, to: &ConversationRef) -> anyhow::Result<()> {
        match self {
            Target::Local(app) => drop(
                app.manager
                    .fork(
                        &sessionbox_manager::ForkFrom::Conversation(from.id.clone()),
                        to,
                    )
                    .await?,
            ),
            Target::Http { client, .. } => drop(client.fork(&from.id, &to.id).await?),
        }
        Ok(())
    }

    async fn delete_snapshot(&self, tenant: &TenantId, name: &str) -> anyhow::Result<()> {
        match self {
            Target::Local(app) => drop(app.manager.delete_snapshot(tenant, name).await?),
            Target::Http { client, .. } => client.delete_snapshot(name).await?,
        }
        Ok(())
    }
}

#[derive(Debug, Default, Clone, Serialize)]
struct Check {
    ok: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    failures: Vec<String>,
}

impl Check {
    fn expect(&mut self, cond: bool, what: impl FnOnce() -> String) {
        if !cond {
            self.failures.push(what());
        }
    }
    fn finish(&mut self) {
        self.ok = self.failures.is_empty();
    }
}

/// Wall times of each operation, in milliseconds.
#[derive(Default)]
struct Timings(Mutex<BTreeMap<&'static str, Vec<f64>>>);

impl Timings {
    fn add(&self, op: &'static str, since: Instant) {
        let ms = since.elapsed().as_secs_f64() * 1000.0;
        self.0
            .lock()
            .expect("timings lock")
            .entry(op)
            .or_default()
            .push(ms);
    }

    fn summary(&self) -> BTreeMap<&'static str, serde_json::Value> {
        let map = self.0.lock().expect("timings lock");
        map.iter()
            .map(|(op, v)| {
                let mut v = v.clone();
                v.sort_by(f64::total_cmp);
                let pct = |p: f64| {
                    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
                    (v[i] * 1000.0).round() / 1000.0
                };
                (
                    *op,
                    json!({"count": v.len(), "p50_ms": pct(0.5), "p95_ms": pct(0.95)}),
                )
            })
            .collect()
    }
}

struct Run<'a> {
    target: &'a Target<'a>,
    timings: Arc<Timings>,
    progress: indicatif::ProgressBar,
}

impl Run<'_> {
    async fn open(&self, conv: &ConversationRef) -> anyhow::Result<Opened> {
        let t = Instant::now();
        let c = self.target.open(conv).await?;
        self.timings.add("open", t);
        Ok(c)
    }

    async fn write(&self, s: &dyn Session, path: &str, data: &str) -> anyhow::Result<()> {
        let t = Instant::now();
        s.write(path, data.as_bytes()).await?;
        self.timings.add("write", t);
        Ok(())
    }

    async fn read(&self, s: &dyn Session, path: &str) -> anyhow::Result<String> {
        let t = Instant::now();
        let data = s.read(path).await?;
        self.timings.add("read", t);
        Ok(String::from_utf8_lossy(&data).into_owned())
    }

    async fn exec(
        &self,
        s: &dyn Session,
        req: ExecRequest,
    ) -> anyhow::Result<sessionbox_core::ExecResult> {
        let t = Instant::now();
        let r = s.exec(req).await?;
        self.timings.add("exec", t);
        Ok(r)
    }

    async fn close(&self, s: Box<dyn Session>) -> anyhow::Result<()> {
        let t = Instant::now();
        s.close().await?;
        self.timings.add("close", t);
        Ok(())
    }
}

/// Runs the experiment on `target` for `tenant`; exit 0 only when every check passes.
/// `verify --via URL...`: the experiment through a server (or replicas of one), with the API
/// key from SESSIONBOX_API_KEY; no data directory, store or runtime here.
pub(crate) async fn run_via(
    globals: &crate::cli::Globals,
    args: VerifyArgs,
) -> anyhow::Result<ExitCode> {
    let key = std::env::var("SESSIONBOX_API_KEY").ok();
    let mut client = sessionbox_client::Client::with_replicas(&args.via, key)?;
    if let Some(ca) = &args.ca_file {
        client = client.with_root_ca_file(ca)?;
    }
    let target = Target::Http {
        client,
        base: args.via.join(" "),
    };
    let tenant = TenantId::new(
        globals
            .tenant
            .clone()
            .unwrap_or_else(|| TenantId::DEFAULT.to_owned()),
    )?;
    run(&target, &tenant, args).await
}

/// Runs the experiment on `target` for `tenant`.
pub(crate) async fn run(
    target: &Target<'_>,
    tenant: &TenantId,
    args: VerifyArgs,
) -> anyhow::Result<ExitCode> {
    let n = args.conversations as usize;
    let m = args.rounds as usize;
    let started = chrono::Utc::now();
    let t0 = Instant::now();
    let progress = if std::io::stderr().is_terminal() {
        let pb = indicatif::ProgressBar::new((2 + n * m + 2 * n) as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg:<12} [{bar:40}] {pos}/{len}")
                .expect("static template")
                .progress_chars("=> "),
        );
        pb
    } else {
        indicatif::ProgressBar::hidden()
    };
    let run = Run {
        target,
        timings: Arc::new(Timings::default()),
        progress,
    };

    let before = target.inventory().await.map_err(|e| {
        let unauthorized = e.chain().any(|c| {
            matches!(
                c.downcast_ref(),
                Some(sessionbox_core::Error::Unauthorized(_))
            )
        });
        let hint = if unauthorized {
            " (through a server: give its API key in SESSIONBOX_API_KEY)"
        } else {
            ""
        };
        e.context(format!("cannot take the inventory before the run{hint}"))
    })?;
    let id = sessionbox::experiment::run_id();
    let convs: Vec<ConversationRef> = (0..n)
        .map(|i| {
            let cid = ConversationId::new(format!("verify-{id}-{i:04}"))?;
            Ok(ConversationRef::new(tenant.clone(), cid))
        })
        .collect::<anyhow::Result<_>>()?;
    for c in &convs {
        if before.holds(target.name_of(c)) {
            bail!(
                "conversation {} already exists; verify never reuses a conversation it did not create",
                c.id
            );
        }
    }

    let mut created: Vec<ConversationRef> = Vec::new();
    let body = experiment(&run, &convs, m, &mut created).await;
    // Which runtime the server used, from its description of the first conversation.
    let runtime_seen = match target {
        Target::Http { client, .. } => match client.get(&convs[0].id).await {
            Ok(Some(c)) => Some(c.runtime),
            _ => None,
        },
        Target::Local(_) => None,
    };
    let (mut resume, mut isolation, mut concurrency, rounds_verified) = match body {
        Ok(r) => r,
        Err(e) => {
            let mut c = Check::default();
            c.failures.push(format!("{e:#}"));
            (c.clone(), c.clone(), c, 0)
        }
    };
    resume.finish();
    isolation.finish();
    concurrency.finish();

    // Fork: a snapshot and a live fork of the first conversation, if it was made.
    run.progress.set_message("fork");
    let mut fork = Check::default();
    if created.contains(&convs[0]) {
        if let Err(e) = fork_check(&run, tenant, &convs[0], &id, &mut fork, &mut created).await {
            fork.failures.push(format!("{e:#}"));
        }
    } else {
        fork.failures
            .push("the first conversation was never made; nothing to fork".into());
    }
    fork.finish();

    // Cleanup: destroy every conversation created, whatever happened above.
    run.progress.set_message("cleanup");
    let mut cleanup = Check::default();
    for c in &created {
        let t = Instant::now();
        match target.destroy(c).await {
            Ok(_) => run.timings.add("destroy", t),
            Err(e) => cleanup.failures.push(format!("destroy {}: {e}", c.id)),
        }
        run.progress.inc(1);
    }
    let after = target
        .inventory()
        .await
        .context("cannot take the inventory after the run")?;
    let leftover = after.added_since(&before);
    let touched = after.removed_since(&before);
    for l in &leftover {
        cleanup.failures.push(format!("left behind: {l}"));
    }
    for t in &touched {
        cleanup
            .failures
            .push(format!("removed something it did not create: {t}"));
    }
    cleanup.finish();
    run.progress.finish_and_clear();

    let ok = resume.ok && isolation.ok && concurrency.ok && fork.ok && cleanup.ok;
    let (runtime, info, via) = match target {
        Target::Local(app) => {
            let info = app.manager.runtime().info();
            (info.name.to_string(), json!(info), None)
        }
        Target::Http { base, .. } => (
            runtime_seen.unwrap_or_else(|| "unknown".to_owned()),
            json!({"boundary": "as the server's runtime enforces it; checked through its HTTP API"}),
            Some(base.clone()),
        ),
    };
    let report = json!({
        "ok": ok,
        "runtime": runtime,
        "via": via,
        "conversations": n,
        "rounds": m,
        "checks": {
            "resume": resume,
            "isolation": isolation,
            "concurrency": {"ok": concurrency.ok, "rounds_verified": rounds_verified, "failures": concurrency.failures},
            "fork": fork,
            "cleanup": {"ok": cleanup.ok, "leftovers": leftover.len(), "touched": touched.len(), "failures": cleanup.failures},
        },
        "runtime_info": info,
        "tenant": target.tenant(),
        "run_id": id,
        "started": started.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "duration_ms": t0.elapsed().as_millis() as u64,
        "timings": run.timings.summary(),
        "environment": environment(),
    });

    if let Some(p) = &args.report_json {
        std::fs::write(p, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    let md = markdown(&report);
    if let Some(p) = &args.report_md {
        std::fs::write(p, &md).with_context(|| format!("cannot write {}", p.display()))?;
    }
    out!("{md}");
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

type Checks = (Check, Check, Check, usize);

mod fork;
use fork::fork_check;

async fn experiment(
    run: &Run<'_>,
    convs: &[ConversationRef],
    m: usize,
    created: &mut Vec<ConversationRef>,
) -> anyhow::Result<Checks> {
    let mut resume = Check::default();
    let mut isolation = Check::default();
    let mut concurrency = Check::default();

    // Open every conversation once; each must be new.
    run.progress.set_message("open");
    let mut sessions = Vec::with_capacity(convs.len());
    for c in convs {
        // Recorded first: an open that fails half-way is cleaned up too (the id is new, checked
        // against the inventory above, so this never destroys anybody else's conversation).
        created.push(c.clone());
        let s = run.open(c).await?;
        if !s.created {
            bail!(
                "conversation {} existed before this run; refusing to use it",
                c.id
            );
        }
        sessions.push(s.session);
    }

    // 1. Resume.
    run.progress.set_message("resume");
    let a_ref = &convs[0];
    let a = sessions.remove(0);
    run.write(a.as_ref(), "marker.txt", "alpha").await?;
    run.close(a).await?;
    let a = run.open(a_ref).await?;
    resume.expect(!a.created, || {
        "reopening A created a new conversation".into()
    });
    let a = a.session;
    let got = run.read(a.as_ref(), "marker.txt").await?;
    resume.expect(got == "alpha", || {
        format!("A read {got:?} after reopening, expected \"alpha\"")
    });
    let r = run
        .exec(a.as_ref(), ExecRequest::new("cat marker.txt"))
        .await?;
    resume.expect(r.stdout == b"alpha", || {
        format!(
            "`cat marker.txt` in A printed {:?}",
            String::from_utf8_lossy(&r.stdout)
        )
    });
    sessions.insert(0, a);
    run.progress.inc(1);

    // 2. Isolation.
    run.progress.set_message("isolation");
    run.write(sessions[1].as_ref(), "marker.txt", "beta")
        .await?;
    let a = sessions[0].as_ref();
    let b = sessions[1].as_ref();
    let b_key = b.key().clone();
    let got_a = run.read(a, "marker.txt").await?;
    let got_b = run.read(b, "marker.txt").await?;
    isolation.expect(got_a == "alpha", || {
        format!("A read {got_a:?}, expected \"alpha\"")
    });
    isolation.expect(got_b == "beta", || {
        format!("B read {got_b:?}, expected \"beta\"")
    });
    let b_locations = run.target.locations_of(a, b);
    let mut attacks = vec![format!("../{b_key}/marker.txt")];
    attacks.extend(b_locations.iter().map(|l| format!("{l}/marker.txt")));
    for path in &attacks {
        let r = a.read(path).await;
        isolation.expect(
            matches!(&r, Err(e) if e.code() == "outside_workspace"),
            || format!("A reading {path:?} was not refused as outside the workspace: {r:?}"),
        );
        let w = a.write(path, b"pwned").await;
        isolation.expect(
            matches!(&w, Err(e) if e.code() == "outside_workspace"),
            || format!("A writing {path:?} was not refused as outside the workspace: {w:?}"),
        );
    }
    for cwd in std::iter::once(format!("../{b_key}")).chain(b_locations.iter().cloned()) {
        let req = ExecRequest::new("echo ran > ran-by-a.txt").cwd(cwd.clone());
        let r = a.exec(req).await;
        isolation.expect(
            matches!(&r, Err(e) if e.code() == "outside_workspace"),
            || format!("A's command with cwd {cwd:?} was not refused before running: {r:?}"),
        );
    }
    for (name, s) in [("A", a), ("B", b)] {
        let s: &dyn Session = s;
        let st = s.stat("ran-by-a.txt").await;
        isolation.expect(matches!(&st, Err(e) if e.code() == "not_found"), || {
            format!("a refused command left ran-by-a.txt in {name}: {st:?}")
        });
    }
    let got_b = run.read(b, "marker.txt").await?;
    isolation.expect(got_b == "beta", || {
        format!("after A's attempts B reads {got_b:?}")
    });
    run.progress.inc(1);

    // 3. Concurrency.
    run.progress.set_message("concurrency");
    let sessions: Vec<Arc<Box<dyn Session>>> = sessions.into_iter().map(Arc::new).collect();
    let verified = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    for round in 0..m {
        let barrier = Arc::new(Barrier::new(sessions.len()));
        let mut tasks = Vec::with_capacity(sessions.len());
        for (i, s) in sessions.iter().enumerate() {
            let s = s.clone();
            let barrier = barrier.clone();
            let verified = verified.clone();
            let failures = failures.clone();
            let value = value_of(i, round);
            let timings = run.timings.clone();
            let fut = async move {
                barrier.wait().await;
                let cmd = format!("printf '%s' '{value}' > marker.txt");
                let t = Instant::now();
                let r = s
                    .exec(ExecRequest::new(cmd).timeout(Duration::from_secs(60)))
                    .await;
                timings.add("exec", t);
                let failure = match r {
                    Ok(r) if r.success() => {
                        let t = Instant::now();
                        let read = s.read("marker.txt").await;
                        timings.add("read", t);
                        match read {
                            Ok(data) if data == value.as_bytes() => None,
                            Ok(data) => Some(format!(
                                "conversation {i} round {round}: read {:?}, expected {value:?}",
                                String::from_utf8_lossy(&data)
                            )),
                            Err(e) => Some(format!("conversation {i} round {round}: read: {e}")),
                        }
                    }
                    Ok(r) => Some(format!(
                        "conversation {i} round {round}: command failed with {} ({})",
                        r.shell_exit_code(),
                        String::from_utf8_lossy(&r.stderr).trim()
                    )),
                    Err(e) => Some(format!("conversation {i} round {round}: exec: {e}")),
                };
                match failure {
                    None => {
                        verified.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Some(msg) => failures.lock().expect("lock").push(msg),
                }
            };
            tasks.push(tokio::spawn(fut));
        }
        for t in futures::future::join_all(tasks).await {
            t.context("a round task panicked")?;
            run.progress.inc(1);
        }
    }
    let rounds_verified = verified.load(std::sync::atomic::Ordering::Relaxed);
    concurrency
        .failures
        .extend(failures.lock().expect("lock").drain(..));
    concurrency.expect(rounds_verified == sessions.len() * m, || {
        format!(
            "{rounds_verified} of {} rounds verified",
            sessions.len() * m
        )
    });
    // Final read of every conversation.
    for (i, s) in sessions.iter().enumerate() {
        let got = run.read(s.as_ref().as_ref(), "marker.txt").await?;
        let want = value_of(i, m - 1);
        concurrency.expect(got == want, || {
            format!("final read of conversation {i}: {got:?}, expected {want:?}")
        });
        run.progress.inc(1);
    }
    for s in sessions {
        match Arc::try_unwrap(s) {
            Ok(s) => run.close(s).await?,
            Err(_) => bail!("a session is still shared after the rounds"),
        }
    }
    Ok((resume, isolation, concurrency, rounds_verified))
}

fn value_of(i: usize, round: usize) -> String {
    format!("conversation-{i}-round-{round}")
}

fn markdown(r: &serde_json::Value) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let yes = |v: &serde_json::Value| {
        if v.as_bool() == Some(true) {
            "pass"
        } else {
            "FAIL"
        }
    };
    let _ = writeln!(
        s,
        "# sessionbox verify: {}",
        if r["ok"] == true { "PASS" } else { "FAIL" }
    );
    let _ = writeln!(s);
    let e = &r["environment"];
    let _ = writeln!(
        s,
        "- started {} ({} ms); sessionbox {}; {} / kernel {} / {} ({} cores)",
        r["started"].as_str().unwrap_or(""),
        r["duration_ms"],
        e["sessionbox_version"].as_str().unwrap_or(""),
        e["os"].as_str().unwrap_or(""),
        e["kernel"].as_str().unwrap_or(""),
        e["arch"].as_str().unwrap_or(""),
        e["cores"]
    );
    let _ = writeln!(
        s,
        "- runtime `{}`: {}",
        r["runtime"].as_str().unwrap_or(""),
        r["runtime_info"]["boundary"].as_str().unwrap_or("")
    );
    let _ = writeln!(
        s,
        "- {} conversations x {} rounds, tenant `{}`",
        r["conversations"],
        r["rounds"],
        r["tenant"].as_str().unwrap_or("")
    );
    let _ = writeln!(s);
    let _ = writeln!(s, "| check | result | detail |");
    let _ = writeln!(s, "|---|---|---|");
    let c = &r["checks"];
    let _ = writeln!(s, "| resume | {} | |", yes(&c["resume"]["ok"]));
    let _ = writeln!(s, "| isolation | {} | |", yes(&c["isolation"]["ok"]));
    let _ = writeln!(
        s,
        "| concurrency | {} | {} rounds verified |",
        yes(&c["concurrency"]["ok"]),
        c["concurrency"]["rounds_verified"]
    );
    let _ = writeln!(
        s,
        "| fork | {} | a snapshot and a live fork see the origin as it was, and no later write of either |",
        yes(&c["fork"]["ok"])
    );
    let _ = writeln!(
        s,
        "| cleanup | {} | {} leftovers |",
        yes(&c["cleanup"]["ok"]),
        c["cleanup"]["leftovers"]
    );
    let _ = writeln!(s);
    let _ = writeln!(s, "| operation | count | p50 ms | p95 ms |");
    let _ = writeln!(s, "|---|---|---|---|");
    if let Some(t) = r["timings"].as_object() {
        for (op, v) in t {
            let _ = writeln!(
                s,
                "| {op} | {} | {} | {} |",
                v["count"], v["p50_ms"], v["p95_ms"]
            );
        }
    }
    let mut failures = Vec::new();
    for name in ["resume", "isolation", "concurrency", "fork", "cleanup"] {
        if let Some(f) = c[name]["failures"].as_array() {
            failures.extend(
                f.iter()
                    .filter_map(|v| v.as_str())
                    .map(|v| format!("{name}: {v}")),
            );
        }
    }
    if !failures.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(s, "Failures:");
        for f in failures.iter().take(50) {
            let _ = writeln!(s, "- {f}");
        }
    }
    s
}
