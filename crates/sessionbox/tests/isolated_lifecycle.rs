//! Lifecycle tests of the `isolated` runtime: real sandboxes, launched the way the CLI launches
//! them, observed from the HOST (`/proc`, the sandbox's cgroups, the data directory). The agent
//! stays warm between opens and stops when idle, concurrent first opens launch one sandbox, a
//! killed sandbox is replaced without orphans, and a restarted manager finds the running agent
//! and reaps it. Each test is bounded in time and destroys what it made.
//!
//! They need root (CI runs them as root); without it each prints SKIPPED and passes.

use std::process::Child;
use std::time::{Duration, Instant};

use sessionbox_core::{ConversationKey, Session};

use support::*;

macro_rules! needs_root {
    () => {
        if !is_root() {
            eprintln!("SKIPPED: isolated runtime tests need root (CI runs them as root)");
            return;
        }
    };
}

/// Starts a daemon that leaves the command's session and process group and waits until it is
/// up: what a conversation may leave running between calls.
const DAEMON: &str = "setsid sh -c 'echo $$ > daemon; exec sleep 1000' > /dev/null 2>&1 < /dev/null & \
                      while [ ! -s daemon ]; do sleep 0.01; done";

/// The agent stays warm between opens: two opens (two sessions) reach the same agent process
/// (same host pid and start time) and `sandbox.json` is unchanged. It is still running 1.5 s
/// after the last call, and stops on its own after the 3 s idle timeout: then no process is in
/// the sandbox's cgroups and the agent, init and monitor have all ended (the monitor is not
/// left as a zombie of the manager's process), while the workspace stays on the host. The next
/// open launches a new agent (new pid or start time) with the workspace intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_agent_stays_warm_between_opens_stops_when_idle_and_restarts_with_the_workspace() {
    needs_root!();
    bounded(60, async {
        let env = Env::new(3);
        let conv = env.open("warm").await;
        let key: ConversationKey = conv.key().clone();
        assert!(sh(&conv, "echo kept > f").await.success());
        let rec = env.record(&key);
        let agent = rec.agent().expect("agent");
        drop(conv);

        let conv = env.open("warm").await;
        let r = sh(&conv, "cat f").await;
        assert_eq!(text(&r.stdout), "kept\n");
        assert_eq!(env.record(&key), rec, "the second open launched a sandbox");
        let again = rec.agent().expect("agent");
        assert_eq!((again.pid, again.start), (agent.pid, agent.start));
        drop(conv);
        let last_use = Instant::now();

        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(agent.alive(), "the agent stopped before its idle timeout");
        let init = proc_info(rec.init).expect("init");
        let monitor = proc_info(rec.monitor).expect("monitor");
        let stopped = eventually(10.0, || {
            rec.procs().is_empty() && rec.members().is_empty() && !agent.alive()
        })
        .await;
        let idle = last_use.elapsed();
        assert!(stopped, "still running after {idle:?}: {:?}", rec.members());
        assert!(
            idle >= Duration::from_millis(2500),
            "stopped after {idle:?}"
        );
        eprintln!("the agent stopped {idle:?} after the last call");
        let reaped = eventually(2.0, || {
            !agent.exists() && !init.exists() && !monitor.exists()
        })
        .await;
        assert!(
            reaped,
            "left behind after the idle stop: {:?}",
            [rec.monitor, rec.init, agent.pid].map(proc_info)
        );
        let ws = env.workspace(&key);
        assert_eq!(std::fs::read_to_string(ws.join("f")).unwrap(), "kept\n");

        let conv = env.open("warm").await;
        let r = sh(&conv, "cat f").await;
        assert_eq!(text(&r.stdout), "kept\n");
        let rec2 = env.record(&key);
        let agent2 = rec2.agent().expect("a new agent");
        assert_ne!((agent2.pid, agent2.start), (agent.pid, agent.start));
        assert_ne!(rec2.init, rec.init);
        drop(conv);
        env.manager.destroy(&Env::conv("warm")).await.unwrap();
        assert!(rec2.members().is_empty() && !ws.exists());
    })
    .await;
}

/// A session held past the idle stop keeps working: after the agent stopped on its own (1 s
/// idle timeout; from the host, nothing left in its cgroups), the same session's next exec
/// launches a new agent and sees the workspace, and so does its next file operation after the
/// next stop. Once the conversation is destroyed, the held session fails and brings nothing
/// back: no workspace, run directory or process on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_held_past_the_idle_stop_relaunches_the_agent_on_its_next_call() {
    needs_root!();
    bounded(60, async {
        let env = Env::new(1);
        let conv = env.open("held").await;
        let key: ConversationKey = conv.key().clone();
        assert!(sh(&conv, "echo kept > f").await.success());
        let rec = env.record(&key);
        let stopped = |rec: &Record| rec.procs().is_empty() && rec.members().is_empty();
        assert!(
            eventually(10.0, || stopped(&rec)).await,
            "{:?}",
            rec.members()
        );

        let r = sh(&conv, "cat f").await;
        assert_eq!(text(&r.stdout), "kept\n");
        let rec2 = env.record(&key);
        assert_ne!(rec2, rec);
        assert!(rec2.agent().is_some());
        assert!(
            eventually(10.0, || stopped(&rec2)).await,
            "{:?}",
            rec2.members()
        );
        assert_eq!(conv.read("f").await.unwrap(), b"kept\n");
        let rec3 = env.record(&key);
        assert_ne!(rec3, rec2);

        env.manager.destroy(&Env::conv("held")).await.unwrap();
        assert!(
            conv.exec(sessionbox_core::ExecRequest::new("true"))
                .await
                .is_err()
        );
        assert!(conv.read("f").await.is_err());
        assert!(!env.workspace(&key).exists());
        assert!(!env.run_dir(&key).exists());
        assert!(rec3.members().is_empty());
    })
    .await;
}

/// Host processes of the sandbox of `key` that run the agent, and its inits (children of a
/// monitor, running the `sessionbox` binary as PID 1 of the sandbox).
fn agents_and_inits(name: &str) -> (Vec<Proc>, Vec<Proc>) {
    let members: Vec<Proc> = processes()
        .into_iter()
        .filter(|p| p.in_cgroup(name))
        .collect();
    let agents = members
        .iter()
        .filter(|p| p.cmdline.contains(" agent "))
        .cloned()
        .collect();
    let inits = members
        .iter()
        .filter(|p| p.cmdline == EXE && p.uid != 0)
        .cloned()
        .collect();
    (agents, inits)
}

/// Six `sessionbox exec` processes started at once on a new conversation launch exactly one
/// sandbox: every command reports the same sandbox init (its start time), and on the host there
/// is one agent process, one init, one monitor in the conversation's cgroup, and the agent
/// serves all six (six lines in the log on the host). A destroy from another process reaps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_opens_from_separate_processes_launch_one_sandbox() {
    needs_root!();
    bounded(90, async {
        let env = Env::new(5);
        let n = 6;
        let children: Vec<Child> = (0..n)
            .map(|i| {
                env.cli_command(&[
                    "exec",
                    "-c",
                    "race",
                    "--",
                    &format!("cut -d' ' -f22 /proc/1/stat; echo {i} >> log"),
                ])
                .spawn()
                .expect("spawn sessionbox")
            })
            .collect();
        let outputs: Vec<_> = tokio::task::spawn_blocking(move || {
            children
                .into_iter()
                .map(|c| c.wait_with_output().expect("wait"))
                .collect()
        })
        .await
        .unwrap();
        let mut starts = std::collections::BTreeSet::new();
        for o in &outputs {
            assert!(o.status.success(), "{}", text(&o.stderr));
            starts.insert(text(&o.stdout).trim().to_owned());
        }
        assert_eq!(starts.len(), 1, "more than one sandbox init: {starts:?}");

        let key = Env::conv("race").key;
        let rec = env.record(&key);
        let init = proc_info(rec.init).expect("init");
        assert_eq!(starts.first().unwrap(), &init.start.to_string());
        let (agents, inits) = agents_and_inits(&rec.name());
        assert_eq!(agents.len(), 1, "{agents:?}");
        assert_eq!(inits.len(), 1, "{inits:?}");
        assert_eq!(inits[0].pid, rec.init);
        let monitors: Vec<Proc> = rec.members().into_iter().filter(|p| p.uid == 0).collect();
        assert_eq!(monitors.len(), 1, "{monitors:?}");
        let uid = env.uid(&key);
        let all_agents = processes()
            .into_iter()
            .filter(|p| p.uid == uid && p.cmdline.contains(" agent "))
            .count();
        assert_eq!(all_agents, 1);
        let log = std::fs::read_to_string(env.workspace(&key).join("log")).unwrap();
        assert_eq!(log.lines().count(), n);
        assert_eq!(env.manager.list(None).await.unwrap().len(), 1);

        let out = env.cli(&["destroy", "-c", "race"], &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(conversation_processes(&rec.name(), uid).is_empty());
        assert!(rec.cgroups.iter().all(|c| !c.exists()));
    })
    .await;
}

/// Two runtime instances (two stores and managers over one data directory, as two server
/// processes would have) opening the same new conversation at the same moment share one
/// sandbox: both sessions reach the same init, and the host has one agent for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_runtime_instances_opening_at_once_share_one_sandbox() {
    needs_root!();
    bounded(60, async {
        let env = Env::new(3);
        let (other, _) = env.another_manager();
        let conv = Env::conv("twin");
        let (x, y) = tokio::join!(env.manager.open(&conv), other.open(&conv));
        let (x, y) = (x.unwrap(), y.unwrap());
        let cmd = "cut -d' ' -f22 /proc/1/stat";
        let (rx, ry) = tokio::join!(sh(&x, cmd), sh(&y, cmd));
        assert_eq!(text(&rx.stdout), text(&ry.stdout));
        let rec = env.record(&conv.key);
        assert_eq!(
            text(&rx.stdout).trim(),
            proc_info(rec.init).unwrap().start.to_string()
        );
        let (agents, inits) = agents_and_inits(&rec.name());
        assert_eq!((agents.len(), inits.len()), (1, 1), "{agents:?} {inits:?}");
        drop((x, y));
        other.destroy(&conv).await.unwrap();
        assert!(rec.members().is_empty());
    })
    .await;
}

/// A sandbox whose agent, init or monitor is killed (`SIGKILL` from the host) is detected and
/// replaced by the next open: that open succeeds promptly, a new agent serves the same
/// workspace, and every process of the old sandbox (monitor, init, agent, and a `setsid`
/// daemon it had left running) is gone from the host: none alive, none a zombie. After the
/// destroy, no cgroup of either sandbox is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_sandbox_is_detected_and_replaced_without_orphans() {
    needs_root!();
    bounded(120, async {
        let env = Env::new(3);
        for target in ["agent", "init", "monitor"] {
            let id = format!("crash-{target}");
            let conv = env.open(&id).await;
            let key = conv.key().clone();
            let r = sh(&conv, &format!("echo {target} > f; {DAEMON}")).await;
            assert!(r.success(), "{r:?}");
            let rec = env.record(&key);
            let agent = rec.agent().expect("agent");
            let old = rec.members();
            assert!(old.iter().any(|p| p.cmdline == "sleep 1000"), "{old:?}");
            assert!(old.len() >= 4, "{old:?}");
            let victim = match target {
                "agent" => agent.pid,
                "init" => rec.init,
                _ => rec.monitor,
            };
            let pid = rustix::process::Pid::from_raw(victim as i32).unwrap();
            rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();

            let t = Instant::now();
            let conv = env.open(&id).await;
            let r = sh(&conv, "cat f").await;
            let took = t.elapsed();
            assert_eq!(text(&r.stdout), format!("{target}\n"), "{target}: {r:?}");
            assert!(took < Duration::from_secs(10), "{target}: took {took:?}");
            let rec2 = env.record(&key);
            assert_ne!(
                rec2, rec,
                "{target}: the old sandbox record is still in use"
            );
            let agent2 = rec2.agent().expect("a new agent");
            assert_ne!((agent2.pid, agent2.start), (agent.pid, agent.start));
            for p in &old {
                assert!(!p.alive(), "{target}: {p:?} of the old sandbox survived");
            }
            let reaped = eventually(3.0, || old.iter().all(|p| !p.exists())).await;
            assert!(
                reaped,
                "{target}: left as zombies: {:?}",
                old.iter().filter(|p| p.exists()).collect::<Vec<_>>()
            );
            let new_members = rec2.members();
            assert!(
                !new_members.iter().any(|p| p.cmdline == "sleep 1000"),
                "{new_members:?}"
            );
            drop(conv);
            env.manager.destroy(&Env::conv(&id)).await.unwrap();
            assert!(rec2.members().is_empty());
            for c in &rec2.cgroups {
                assert!(!c.exists(), "{target}: cgroup {} is left", c.display());
            }
            // Neither sandbox left a cgroup: nothing named for this data directory
            // (`sessionbox-<instance>-`) remains in any hierarchy.
            let prefix = rec2.name()[..24].to_owned();
            for c in &rec2.cgroups {
                let left: Vec<String> = std::fs::read_dir(c.parent().unwrap())
                    .unwrap()
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&prefix))
                    .collect();
                assert!(
                    left.is_empty(),
                    "{target}: left {left:?} beside {}",
                    c.display()
                );
            }
        }
    })
    .await;
}

/// A restarted manager finds the running agent. One `sessionbox` process (the first manager)
/// starts a conversation and leaves a daemon in it, then exits; a new store, runtime and
/// manager over the same data directory open the conversation and reach the very same agent
/// (host pid and start time) without launching anything. Its destroy then reaps everything
/// the first process started: no process alive or left as a zombie, cgroups, run directory,
/// workspace and record removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_manager_finds_the_running_agent_and_its_destroy_reaps_everything() {
    needs_root!();
    bounded(60, async {
        let env = Env::new(10);
        let out = env.cli(
            &[
                "exec",
                "-c",
                "kept",
                "--",
                &format!("echo one > f; {DAEMON}"),
            ],
            &[],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        let key = Env::conv("kept").key;
        let rec = env.record(&key);
        let agent = rec.agent().expect("agent");
        let before = rec.members();
        assert!(
            before.iter().any(|p| p.cmdline == "sleep 1000"),
            "{before:?}"
        );
        let monitor = proc_info(rec.monitor).expect("monitor");
        assert_ne!(
            monitor.ppid,
            std::process::id(),
            "the monitor should belong to the exited CLI process"
        );
        let uid = env.uid(&key);

        let (manager, _) = env.another_manager();
        let conv = manager.open(&Env::conv("kept")).await.unwrap();
        let r = sh(&conv, "cat f").await;
        assert_eq!(text(&r.stdout), "one\n");
        assert_eq!(env.record(&key), rec, "the new manager launched a sandbox");
        let found = rec.agent().expect("agent");
        assert_eq!((found.pid, found.start), (agent.pid, agent.start));
        drop(conv);

        let out = manager.destroy(&Env::conv("kept")).await.unwrap();
        assert!(
            out.record_removed && out.runtime.sandbox_removed && out.runtime.workspace_removed,
            "{out:?}"
        );
        assert!(out.runtime.processes_killed >= 4, "{out:?}");
        assert!(conversation_processes(&rec.name(), uid).is_empty());
        for p in &before {
            assert!(!p.alive(), "survived: {p:?}");
        }
        assert!(
            eventually(3.0, || before.iter().all(|p| !p.exists())).await,
            "not reaped: {:?}",
            before.iter().filter(|p| p.exists()).collect::<Vec<_>>()
        );
        assert!(rec.cgroups.iter().all(|c| !c.exists()));
        assert!(!env.run_dir(&key).exists() && !env.workspace(&key).exists());
        assert!(manager.list(None).await.unwrap().is_empty());
    })
    .await;
}

/// Host-side helpers: a data directory with a store, manager and `isolated` runtime built as the
/// CLI builds them, and readers of `/proc`, cgroups and the runtime's `sandbox.json`. (The same
/// module is in `isolated_escape.rs` and `isolated_lifecycle.rs`: each test file is its own crate.)
#[allow(dead_code)]
mod support {
    use std::collections::{BTreeMap, BTreeSet};
    use std::future::Future;
    use std::ops::Range;
    use std::os::unix::fs::MetadataExt;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output, Stdio};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use sessionbox_core::{ConversationKey, ConversationRef, ExecRequest, ExecResult, Session};
    use sessionbox_local::isolated::{IsolatedConfig, IsolatedRuntime};
    use sessionbox_local::sandbox::SandboxLimits;
    use sessionbox_manager::{Conversation, Manager};
    use sessionbox_store::Store;

    pub const EXE: &str = env!("CARGO_BIN_EXE_sessionbox");

    pub fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    /// A name no other test, run or process uses.
    pub fn unique(tag: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        format!(
            "sbx{tag}{}x{}x{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        )
    }

    /// Host uids for one data directory that no other data directory uses, in this process or
    /// another (the CLI's default range starts at 3 000 000), so that a host process's uid
    /// tells which conversation it belongs to.
    fn uid_range() -> Range<u32> {
        static N: AtomicU32 = AtomicU32::new(0);
        let slot = N.fetch_add(1, Ordering::SeqCst) % 64;
        let base = 20_000_000 + (std::process::id() % 50_000) * 4096 + slot * 64;
        base..base + 64
    }

    /// Fails the test when `f` does not finish within `secs` (dropping it, which cleans up).
    pub async fn bounded<T>(secs: u64, f: impl Future<Output = T>) -> T {
        match tokio::time::timeout(Duration::from_secs(secs), f).await {
            Ok(v) => v,
            Err(_) => panic!("the test did not finish within its bound of {secs} s"),
        }
    }

    /// Waits up to `secs` for `f` to hold.
    pub async fn eventually(secs: f64, mut f: impl FnMut() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs_f64(secs);
        loop {
            if f() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `sh -c CMD` in a session, 60 s at most; panics when the call itself fails.
    pub async fn sh(s: &dyn Session, cmd: &str) -> ExecResult {
        s.exec(ExecRequest::new(cmd).timeout(Duration::from_secs(60)))
            .await
            .unwrap_or_else(|e| panic!("exec {cmd:?} failed: {e}"))
    }

    pub fn text(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    /// One data directory: store, runtime and manager, as `sessionbox` builds them.
    pub struct Env {
        _dir: tempfile::TempDir,
        pub data: PathBuf,
        pub uids: Range<u32>,
        pub idle_secs: u64,
        pub limits: SandboxLimits,
        pub manager: Manager,
        pub runtime: Arc<IsolatedRuntime>,
    }

    impl Env {
        pub fn new(idle_secs: u64) -> Env {
            Env::with_limits(idle_secs, SandboxLimits::default())
        }

        pub fn with_limits(idle_secs: u64, limits: SandboxLimits) -> Env {
            let dir = tempfile::tempdir().expect("tempdir");
            let data = dir.path().join("data");
            let uids = uid_range();
            let (manager, runtime) = build(&data, uids.clone(), idle_secs, limits.clone());
            Env {
                _dir: dir,
                data,
                uids,
                idle_secs,
                limits,
                manager,
                runtime,
            }
        }

        /// Another store, runtime and manager over the same data directory: what a restarted
        /// manager (or a second process) builds.
        pub fn another_manager(&self) -> (Manager, Arc<IsolatedRuntime>) {
            build(
                &self.data,
                self.uids.clone(),
                self.idle_secs,
                self.limits.clone(),
            )
        }

        pub fn conv(id: &str) -> ConversationRef {
            ConversationRef::parse("default", id).expect("valid id")
        }

        pub async fn open(&self, id: &str) -> Conversation {
            self.manager
                .open(&Env::conv(id))
                .await
                .unwrap_or_else(|e| panic!("open {id}: {e}"))
        }

        pub fn run_dir(&self, key: &ConversationKey) -> PathBuf {
            self.data.join("run").join(key.as_str())
        }

        pub fn workspace(&self, key: &ConversationKey) -> PathBuf {
            use sessionbox_core::Runtime;
            PathBuf::from(self.runtime.workspace_location(key))
        }

        pub fn record(&self, key: &ConversationKey) -> Record {
            Record::read(&self.run_dir(key)).expect("the runtime recorded the sandbox")
        }

        /// The conversation's host uid: the owner of its workspace.
        pub fn uid(&self, key: &ConversationKey) -> u32 {
            std::fs::metadata(self.workspace(key))
                .expect("workspace")
                .uid()
        }

        /// Runs the real `sessionbox` binary on this data directory (its configuration gives
        /// the same idle timeout and uid range as this runtime).
        pub fn cli(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
            self.write_config();
            let mut cmd = Command::new(EXE);
            cmd.arg("--data-dir")
                .arg(&self.data)
                .args(args)
                .env_remove("SESSIONBOX_RUNTIME")
                .env_remove("SESSIONBOX_TENANT")
                .stdin(Stdio::null());
            for (k, v) in envs {
                cmd.env(k, v);
            }
            cmd.output().expect("run sessionbox")
        }

        pub fn cli_command(&self, args: &[&str]) -> Command {
            self.write_config();
            let mut cmd = Command::new(EXE);
            cmd.arg("--data-dir")
                .arg(&self.data)
                .args(args)
                .env_remove("SESSIONBOX_RUNTIME")
                .env_remove("SESSIONBOX_TENANT")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            cmd
        }

        fn write_config(&self) {
            let path = self.data.join("sessionbox.toml");
            if !path.exists() {
                std::fs::create_dir_all(&self.data).unwrap();
                std::fs::write(
                    &path,
                    format!(
                        "[isolated]\nidle_timeout_secs = {}\nuid_base = {}\nuid_count = {}\npids = {}\nmemory_bytes = {}\ncpu = {}\n",
                        self.idle_secs,
                        self.uids.start,
                        self.uids.len(),
                        self.limits.pids,
                        self.limits.memory_bytes,
                        self.limits.cpu,
                    ),
                )
                .unwrap();
            }
        }
    }

    fn build(
        data: &Path,
        uids: Range<u32>,
        idle_secs: u64,
        sandbox: SandboxLimits,
    ) -> (Manager, Arc<IsolatedRuntime>) {
        let store = Store::open(&data.join("sessionbox.db")).expect("store");
        let uid_store = store.clone();
        let runtime = Arc::new(
            IsolatedRuntime::new(IsolatedConfig {
                data_dir: data.to_path_buf(),
                limits: sessionbox_core::Limits::default(),
                sandbox,
                idle_timeout: Duration::from_secs(idle_secs),
                exe: PathBuf::from(EXE),
                agent_args: vec!["agent".into()],
                allocate_uid: Arc::new(move |key| uid_store.allocate_uid(key, uids.clone())),
            })
            .expect("runtime"),
        );
        (Manager::new(store, runtime.clone()), runtime)
    }

    impl Drop for Env {
        /// The safety net when a test fails half-way: ends every sandbox recorded here.
        fn drop(&mut self) {
            if let Ok(rd) = std::fs::read_dir(self.data.join("run")) {
                for e in rd.flatten() {
                    if let Some(r) = Record::read(&e.path()) {
                        r.kill_all();
                    }
                }
            }
        }
    }

    /// What the runtime recorded in `run/<key>/sandbox.json`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Record {
        pub monitor: u32,
        pub init: u32,
        pub cgroups: Vec<PathBuf>,
    }

    impl Record {
        pub fn read(run: &Path) -> Option<Record> {
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(run.join("sandbox.json")).ok()?).ok()?;
            Some(Record {
                monitor: v["monitor_pid"].as_u64()? as u32,
                init: v["init_pid"].as_u64()? as u32,
                cgroups: v["cgroups"]
                    .as_array()?
                    .iter()
                    .filter_map(|c| c.as_str().map(PathBuf::from))
                    .collect(),
            })
        }

        /// The cgroup name, the same in every hierarchy.
        pub fn name(&self) -> String {
            self.cgroups[0]
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        }

        /// The directory in the hierarchy of `controller` (`pids`, `memory`, `cpu`).
        pub fn cgroup(&self, controller: &str) -> PathBuf {
            self.cgroups
                .iter()
                .find(|c| {
                    c.components().any(|p| {
                        p.as_os_str()
                            .to_string_lossy()
                            .split(',')
                            .any(|x| x == controller)
                    })
                })
                .or_else(|| (self.cgroups.len() == 1).then(|| &self.cgroups[0]))
                .unwrap_or_else(|| panic!("no {controller} cgroup in {:?}", self.cgroups))
                .clone()
        }

        /// Pids in the cgroups' `cgroup.procs`.
        pub fn procs(&self) -> BTreeSet<u32> {
            self.cgroups
                .iter()
                .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
                .flat_map(|s| {
                    s.split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .collect::<Vec<u32>>()
                })
                .collect()
        }

        /// Live host processes whose `/proc/PID/cgroup` names this sandbox's cgroup.
        pub fn members(&self) -> Vec<Proc> {
            let name = self.name();
            processes()
                .into_iter()
                .filter(|p| p.in_cgroup(&name))
                .collect()
        }

        /// The agent: the init's child running `sessionbox agent`.
        pub fn agent(&self) -> Option<Proc> {
            processes()
                .into_iter()
                .find(|p| p.ppid == self.init && p.cmdline.contains(" agent "))
        }

        pub fn kill_all(&self) {
            let until = Instant::now() + Duration::from_secs(5);
            loop {
                let pids = self.procs();
                if pids.is_empty() || Instant::now() > until {
                    break;
                }
                for p in pids {
                    if let Some(pid) = rustix::process::Pid::from_raw(p as i32) {
                        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            reap(self.monitor);
            for d in &self.cgroups {
                let until = Instant::now() + Duration::from_secs(2);
                while d.exists() && std::fs::remove_dir(d).is_err() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }

    /// Collects `pid` if it is an exited child of this process (a monitor launched here).
    pub fn reap(pid: u32) {
        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::NOHANG);
        }
    }

    /// One host process, from `/proc`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Proc {
        pub pid: u32,
        pub ppid: u32,
        /// Real uid.
        pub uid: u32,
        pub state: char,
        /// Start time in clock ticks after boot: with the pid, names one process for good.
        pub start: u64,
        pub cmdline: String,
        pub cgroup: String,
        pub tracer: u32,
        /// Kernel flags (`PF_*`).
        pub flags: u64,
    }

    impl Proc {
        pub fn in_cgroup(&self, name: &str) -> bool {
            self.cgroup
                .lines()
                .any(|l| l.rsplit('/').next() == Some(name))
        }

        /// The inode of one of its namespaces (`user`, `mnt`, `pid`, ...).
        pub fn ns(&self, kind: &str) -> Option<PathBuf> {
            std::fs::read_link(format!("/proc/{}/ns/{kind}", self.pid)).ok()
        }

        /// True once it has begun to exit (`PF_EXITING`): the kernel has already taken it out
        /// of its cgroups and it runs no more user code.
        pub fn exiting(&self) -> bool {
            self.flags & 0x4 != 0
        }

        /// True while this very process (pid and start time) exists and has not exited.
        pub fn alive(&self) -> bool {
            proc_info(self.pid).is_some_and(|p| p.start == self.start && p.state != 'Z')
        }

        /// True while this very process has an entry in `/proc` (running or a zombie).
        pub fn exists(&self) -> bool {
            proc_info(self.pid).is_some_and(|p| p.start == self.start)
        }
    }

    pub fn proc_info(pid: u32) -> Option<Proc> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = stat.get(stat.rfind(')')? + 2..)?;
        let f: Vec<&str> = rest.split(' ').collect();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u32>().ok())
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        Some(Proc {
            pid,
            ppid: f.get(1)?.parse().ok()?,
            uid: field("Uid:")?,
            state: f.first()?.chars().next()?,
            start: f.get(19)?.parse().ok()?,
            cmdline: String::from_utf8_lossy(&cmdline)
                .replace('\0', " ")
                .trim_end()
                .to_owned(),
            // Unreadable once the process is gone: then it is not reported at all.
            cgroup: std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?,
            tracer: field("TracerPid:").unwrap_or(0),
            flags: f.get(6)?.parse().ok()?,
        })
    }

    /// Every live (not zombie) process on the host.
    pub fn processes() -> Vec<Proc> {
        let Ok(rd) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(proc_info)
            .filter(|p| p.state != 'Z')
            .collect()
    }

    /// Live host processes that belong to a conversation: in its cgroup or running as its uid.
    pub fn conversation_processes(cgroup_name: &str, uid: u32) -> Vec<Proc> {
        processes()
            .into_iter()
            .filter(|p| p.in_cgroup(cgroup_name) || p.uid == uid)
            .collect()
    }

    /// Every path beneath `dir` with what it is (a link's target, a file's contents), for
    /// before/after comparisons.
    pub fn tree(dir: &Path) -> BTreeMap<PathBuf, String> {
        let mut out = BTreeMap::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                let Ok(m) = std::fs::symlink_metadata(&p) else {
                    continue;
                };
                let what = if m.is_symlink() {
                    format!("link -> {:?}", std::fs::read_link(&p).unwrap_or_default())
                } else if m.is_dir() {
                    stack.push(p.clone());
                    "dir".to_owned()
                } else {
                    let data = std::fs::read(&p).unwrap_or_default();
                    format!("file nlink={} {:?}", m.nlink(), text(&data))
                };
                out.insert(p, what);
            }
        }
        out
    }
}
