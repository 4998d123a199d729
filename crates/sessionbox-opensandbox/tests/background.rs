//! Background commands on the `opensandbox` runtime against the real OpenSandbox server
//! (`eval "$(scripts/opensandbox-up)"`): spawn, list, exact output of each stream, kill; a
//! second runtime over the same store and instance (as after a restart of `serve`) lists, reads
//! and kills a command the first started; and garbage collection leaves a sandbox whose agent
//! runs a background command running past its idle timeout, then pauses it once the command
//! has ended.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use sessionbox_core::{
    BackgroundCommand, ExecRequest, ExitStatus, OutputRequest, Runtime, Session,
};
use sessionbox_manager::{GcOptions, Manager};
use sessionbox_opensandbox::{OpenSandboxConfig, OpenSandboxRuntime, SandboxState};
use sessionbox_store::{Lifecycle, LifecyclePolicy, Store};

/// A runtime of instance `instance` over `store` (two of them are one `serve`, restarted).
fn runtime_of(
    domain: &str,
    key: sessionbox_opensandbox::ApiKey,
    instance: &str,
    store: Store,
) -> OpenSandboxRuntime {
    let mut config = OpenSandboxConfig::new(client_config(domain, key), instance.to_owned());
    config.timeout = Duration::from_secs(600);
    config
        .resource_limits
        .insert("memory".into(), "256Mi".into());
    OpenSandboxRuntime::new(config, common::directory(store)).unwrap()
}

async fn ended(s: &dyn Session, id: &str) -> BackgroundCommand {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = s.command(id).await.unwrap();
        if !c.running {
            return c;
        }
        assert!(Instant::now() < deadline, "{id} did not end: {c:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn background_commands_outlive_the_runtime_that_started_them() {
    let Some((domain, key)) = server() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessionbox.db");
    let inst = instance("bg");
    let first = runtime_of(&domain, key.clone(), &inst, Store::open(&path).unwrap());
    let c = conv("bg-restart");
    let s = first.open(&c).await.unwrap();
    let t = Instant::now();
    let done = s
        .spawn(ExecRequest::new(
            r"printf 'a\000b\377\n'; printf 'e\376' >&2; exit 4",
        ))
        .await
        .unwrap();
    let spawn_ms = t.elapsed().as_millis();
    let long = s
        .spawn(ExecRequest::new("echo started; sleep 300"))
        .await
        .unwrap();
    let end = ended(&*s, &done.id).await;
    assert_eq!(end.status, Some(ExitStatus::Code(4)));
    let o = s
        .command_output(&done.id, OutputRequest::from_start())
        .await
        .unwrap();
    assert_eq!(o.stdout, b"a\0b\xff\n");
    assert_eq!(o.stderr, b"e\xfe");
    assert!(o.complete());
    let listed = s.commands().await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, [done.id.as_str(), long.id.as_str()]);
    drop(s);
    drop(first);

    // As after a restart of `serve`: a new runtime over the same store and instance.
    let second = runtime_of(&domain, key, &inst, Store::open(&path).unwrap());
    let s = second.open(&c).await.unwrap();
    assert!(!s.state_lost());
    let listed = s.commands().await.unwrap();
    assert_eq!(listed.len(), 2);
    let running = listed.iter().find(|x| x.id == long.id).unwrap();
    assert!(running.running, "{running:?}");
    let mut read = OutputRequest::from_start();
    read.wait = Duration::from_secs(10);
    let o = s.command_output(&long.id, read).await.unwrap();
    assert_eq!(o.stdout, b"started\n");
    let t = Instant::now();
    let k = s.kill_command(&long.id).await.unwrap();
    let kill_ms = t.elapsed().as_millis();
    assert!(!k.running && k.killed, "{k:?}");
    assert_eq!(k.status, Some(ExitStatus::Signal(9)));
    // A finished one is answered at once, as it is.
    let again = s.kill_command(&done.id).await.unwrap();
    assert_eq!(again.status, Some(ExitStatus::Code(4)));
    assert!(!again.killed);
    drop(s);
    second.destroy(&c.key).await.unwrap();
    assert_nothing_left(&second).await;
    eprintln!("opensandbox background: spawn {spawn_ms} ms, kill after a restart {kill_ms} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gc_does_not_pause_a_sandbox_whose_agent_runs_a_background_command() {
    let Some((domain, key)) = server() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
    let rt = runtime_in(&domain, key, "bg-idle", store.clone());
    let runtime: Arc<dyn Runtime> = Arc::new(rt.clone());
    let m = Manager::new(store.clone(), runtime).with_lifecycle(LifecyclePolicy {
        default: Lifecycle {
            idle_timeout: Some(Duration::from_secs(1)),
            ttl: None,
            max_lifetime: None,
        },
        tenants: Default::default(),
    });
    let c = conv("bg-idle");
    let s = m.open(&c).await.unwrap();
    let cmd = s.spawn(ExecRequest::new("sleep 300")).await.unwrap();
    Box::new(s).close().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let state = |rt: OpenSandboxRuntime| {
        let k = c.key.clone();
        async move {
            let id = rt.sandbox_id(&k).await.unwrap().unwrap();
            rt.client().get(&id).await.unwrap().status.state
        }
    };

    // Idle past its timeout, but a background command runs: not even a candidate.
    assert!(!rt.can_stop_idle(&c.key).await.unwrap());
    assert_eq!(rt.stop_idle(&c.key).await.unwrap_err().code(), "busy");
    let r = m
        .collect_garbage(GcOptions {
            dry_run: false,
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(r.stopped(), 0, "{r:#?}");
    assert_eq!(state(rt.clone()).await, SandboxState::Running);

    // Once it has ended, the next collection pauses the sandbox.
    let s = rt.open(&c).await.unwrap();
    assert!(s.command(&cmd.id).await.unwrap().running);
    s.kill_command(&cmd.id).await.unwrap();
    drop(s);
    assert!(rt.can_stop_idle(&c.key).await.unwrap());
    let r = m
        .collect_garbage(GcOptions {
            dry_run: false,
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(r.stopped(), 1, "{r:#?}");
    let mut st = state(rt.clone()).await;
    for _ in 0..100 {
        if st == SandboxState::Paused {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        st = state(rt.clone()).await;
    }
    assert_eq!(st, SandboxState::Paused);
    m.destroy(&c).await.unwrap();
    assert_nothing_left(&rt).await;
}
