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

use crate::support;
